"""A binlog batch made ready to commit (`prepare_batch`): what each table holds is skipped, each key folded to its
final row, and the rows turned into the Arrow tables the commits write. Integer keys: no server needed."""

from __future__ import annotations

from typing import Any

import pytest

from ingest.config import PipelineConfig, parse_config
from ingest.model.changes import RowChange, Transaction
from ingest.model.columns import SourceColumn
from ingest.model.position import BinlogPosition
from ingest.model.schema import TableSchema
from ingest.query.batch import HighWatermarkFilter, TableStream, prepare_batch
from ingest.source.snapshot.chunks import Chunk

SCHEMA = TableSchema(
    "db",
    "t",
    (SourceColumn("id", "int", "int(11)", False), SourceColumn("v", "varchar", "varchar(10)", True)),
    ("id",),
    ("id",),
    (None,),
)
CHUNKS = [Chunk("db.t", 0, None, (10,)), Chunk("db.t", 1, (10,), None)]
"""Keys below 10 read at position 100, the others at 200."""


PW_ENV = "INGEST_UT_BATCH_PASSWORD"


@pytest.fixture(autouse=True)
def _password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PW_ENV, "pw")


def _config(**stream: Any) -> PipelineConfig:
    return parse_config(
        {
            "source": {"host": "db.example", "user": "cdc", "password": {"env": PW_ENV}},
            "tables": {"include": [r"db\..*"]},
            "sink": {"catalog": {"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db"}},
            "stream": stream,
        }
    )


def _table(committed: int | None = None, changelog: bool = False) -> TableStream:
    highs = [BinlogPosition("b.000001", 100), BinlogPosition("b.000001", 200)]
    at = None if committed is None else BinlogPosition("b.000001", committed)
    return TableStream(SCHEMA, "lake.db.t", CHUNKS, highs, at, ("db", "t__changelog") if changelog else None)


def _tx(pos: int, *changes: tuple[Any, Any]) -> Transaction:
    at = BinlogPosition("b.000001", pos)
    return Transaction(
        at, f"0-1-{pos}", [RowChange("db.t", at, i, b, a) for i, (b, a) in enumerate(changes)], 1_700_000_000 + pos
    )


def _prepare(table: TableStream, *batch: Transaction, **stream: Any) -> list[Any]:
    tables = {"db.t": table}
    config = _config(**stream)
    filters = {"db.t": HighWatermarkFilter(None, table)}
    return prepare_batch(config.targets, config.stream, tables, filters, list(batch))


def test_each_key_is_folded_to_its_final_row_and_a_delete_to_its_key() -> None:
    (part,) = _prepare(
        _table(committed=250),
        _tx(300, (None, (1, "a")), ((5, "x"), (5, "y"))),
        _tx(310, ((1, "a"), (1, "b")), ((12, "z"), None)),
    )
    assert part.table_id == "db.t" and part.applied == 4 and not part.append
    assert part.rows is not None
    assert sorted(part.rows.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "v": "b", "__ingest_op": "U"},
        {"id": 5, "v": "y", "__ingest_op": "U"},
        {"id": 12, "v": None, "__ingest_op": "D"},
    ]
    assert part.where is not None and "`id`" in part.where  # the MERGE reads only where the keys can be
    assert part.changelog is None and part.rejected == []


def test_a_batch_that_only_creates_keys_is_appended_and_reads_nothing() -> None:
    (part,) = _prepare(_table(committed=250), _tx(300, (None, (1, "a"))), _tx(310, (None, (2, "b"))))
    assert part.append and part.where is None
    assert part.rows is not None and part.rows.column("id").to_pylist() == [1, 2]


def test_under_the_ignore_ddl_policy_nothing_is_appended() -> None:
    (part,) = _prepare(_table(committed=250), _tx(300, (None, (1, "a"))), on_schema_change="ignore")
    assert not part.append


def test_what_the_target_holds_and_what_its_chunks_hold_are_skipped() -> None:
    # Held by the target up to 300; key 12's chunk was read at 200, so its change at 150 is in the chunk.
    assert _prepare(_table(committed=300), _tx(300, (None, (1, "a")))) == []
    (part,) = _prepare(_table(), _tx(150, (None, (12, "a"))), _tx(350, (None, (13, "b"))))
    assert part.rows is not None and part.rows.column("id").to_pylist() == [13] and part.applied == 1


def test_the_changelog_gets_every_change_the_target_gets_one_row_per_key() -> None:
    (part,) = _prepare(
        _table(committed=250, changelog=True), _tx(300, (None, (1, "a"))), _tx(310, ((1, "a"), (1, "b")))
    )
    assert part.rows is not None and part.rows.num_rows == 1
    assert part.changelog is not None
    assert part.changelog.column("id").to_pylist() == [1, 1, 1]  # +I, then -U and +U
    assert part.changelog.num_rows == 3


@pytest.mark.parametrize("held", [None, 305])
def test_a_changelog_behind_its_target_gets_the_changes_the_target_holds(held: int | None) -> None:
    table = _table(committed=310, changelog=True)
    table.changelog_committed = None if held is None else BinlogPosition("b.000001", held)
    (part,) = _prepare(table, _tx(300, (None, (1, "a"))), _tx(310, ((1, "a"), (1, "b"))))
    assert part.rows is None and part.applied == 0  # the target holds both
    assert part.changelog is not None and part.changelog.num_rows == (3 if held is None else 2)


def test_while_no_chunk_is_read_every_change_is_left_to_the_chunks_without_asking_the_server() -> None:
    """A table whose copy has not read a chunk yet (the query reads chunks in chunk batches): its chunks,
    read later, hold every change. A string key would need the server to place it in a chunk; none is asked."""
    schema = TableSchema(
        "db", "s", (SourceColumn("k", "varchar", "varchar(10)", False),), ("k",), ("k",), ("utf8mb4_general_ci",)
    )
    chunks = [Chunk("db.s", 0, None, ("m",)), Chunk("db.s", 1, ("m",), None)]
    table = TableStream(schema, "lake.db.s", chunks, [None, None], None)
    at = BinlogPosition("b.000001", 300)
    changes = [RowChange("db.s", at, 0, None, ("a",)), RowChange("db.s", at, 1, ("z",), None)]
    assert HighWatermarkFilter(_NoServer(), table).keep(changes) == []
    table.chunk_highs = [BinlogPosition("b.000001", 100), None]  # one read: the server places the keys
    with pytest.raises(AssertionError, match="asked the server"):
        HighWatermarkFilter(_NoServer(), table).keep(changes)


class _NoServer:
    def cursor(self, *args: Any) -> Any:
        raise AssertionError("asked the server")
