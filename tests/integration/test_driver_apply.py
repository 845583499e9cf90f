"""A batch applied to a small target by the driver (ingest/sink/driver_apply.py): what it leaves is what a MERGE
leaves, its commit carries the batch's offset, a replay commits nothing, and the targets it must not take go to
Spark. The end-to-end tests (kills between two tables' commits, chaos) run through it too: their tables are small.

pyiceberg on a real SQLite catalog and local warehouse; no Spark needed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.types import StringType

from ingest.config import PipelineConfig, StreamConfig, parse_config
from ingest.model.columns import SourceColumn
from ingest.model.position import BinlogPosition, Watermark
from ingest.model.schema import TableSchema
from ingest.sink import position_deletes
from ingest.sink.catalog import cached_pyiceberg_catalog
from ingest.sink.driver_apply import MAX_KEYS, apply_in_driver, driver_target
from ingest.sink.merge import batch_arrow, committed_offset, stream_offset_properties
from ingest.sink.summary import SUMMARY_STREAM_OFFSET
from ingest.sink.targets import ensure_target_created, on_copy_branch
from tests.conftest import embedded_sink

pytestmark = pytest.mark.integration


def _schema(table: str, key: tuple[str, ...] = ("id",), key_type: str = "int") -> TableSchema:
    columns = (
        SourceColumn("id", key_type, key_type, False),
        SourceColumn("k2", "int", "int", False),
        SourceColumn("v", "varchar", "varchar(20)", True, character_set="utf8mb4"),
    )
    return TableSchema("db", table, columns, key, key, (None,) * len(key))


def _config(base: Path, **stream: Any) -> PipelineConfig:
    return parse_config(
        {
            "name": "small",
            "source": {"host": "h", "user": "u", "password": {"env": "HOME"}},
            "tables": {"include": [r"db\..*"]},
            "sink": embedded_sink(base),
            "stream": stream,
        }
    )


def _at(pos: int) -> Watermark:
    return Watermark(BinlogPosition("mysql-bin.000001", pos), None)


def _rows(table: Any) -> dict[int, tuple[Any, ...]]:
    data = table.refresh().scan().to_arrow().to_pylist()
    return {r["id"]: (r["k2"], r["v"]) for r in data}


def _stream(config: PipelineConfig, max_rows: int = 100, position_deletes: bool = True) -> StreamConfig:
    return dataclasses.replace(config.stream, driver_apply_max_rows=max_rows, position_deletes=position_deletes)


def _apply(
    config: PipelineConfig,
    schema: TableSchema,
    finals: dict[Any, Any],
    end: Watermark,
    append: bool,
    how: str = "rewrite",
) -> bool:
    names = config.target_for(schema.database, schema.table)
    rows = batch_arrow(schema, finals)
    catalog = cached_pyiceberg_catalog(config.sink)
    how = "append" if append else how
    stream = _stream(config, max_rows=1 if how == "position" else 100)
    driver = driver_target(catalog, names, "lake.db.t", schema, stream, rows, append)
    assert driver is not None and driver.how == how
    properties = stream_offset_properties(config.name, end)
    held = committed_offset(driver.table, config.name)
    return apply_in_driver(driver, "lake.db.t", schema, rows, end, properties, lambda: held and held.position)


@pytest.mark.parametrize("how", ["rewrite", "position"])
def test_a_batch_leaves_per_key_its_final_row_or_nothing_tagged_with_its_offset_and_a_replay_commits_nothing(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(position_deletes, "TAIL_BYTES", 0)  # by position, no file is small enough to write again
    config = _config(tmp_path)
    schema = _schema("t")
    ensure_target_created(None, config.targets, schema)
    table = cached_pyiceberg_catalog(config.sink).load_table(config.target_for("db", "t"))
    first = {(i,): (i, i * 10, f"r{i}") for i in range(1, 21)}
    assert _apply(config, schema, first, _at(100), append=True)
    # Updates, deletes (one of a key never held), and inserts of new keys, in one batch.
    second: dict[Any, Any] = {(i,): (i, i * 10, "changed") for i in (2, 3, 4)}
    second |= {(5,): None, (6,): None, (99,): None, (21,): (21, 210, "new"), (22,): (22, None, None)}
    with pytest.raises(Exception):  # noqa: B017 - a NULL in a required column fails the batch, commits nothing
        _apply(config, schema, second, _at(200), append=False, how=how)
    second[(22,)] = (22, 220, None)
    assert _apply(config, schema, second, _at(200), append=False, how=how)
    expected = {i: (i * 10, f"r{i}") for i in range(1, 21) if i not in (5, 6)}
    expected |= {2: (20, "changed"), 3: (30, "changed"), 4: (40, "changed"), 21: (210, "new"), 22: (220, None)}
    assert _rows(table) == expected
    offset = committed_offset(table.refresh(), config.name)
    assert offset is not None and offset.position == _at(200).position
    snapshots = len(table.snapshots())
    summary = table.current_snapshot().summary.additional_properties
    # By position, the rows of keys 2-6 are deleted by a position delete file; a rewrite replaces the data file,
    # its updated and new rows in the same one: a small target does not gain a file per batch.
    assert summary.get("added-position-deletes") == ("5" if how == "position" else None)
    assert len(table.scan().plan_files()) == (2 if how == "position" else 1)
    assert not _apply(config, schema, second, _at(200), append=False, how=how)  # a replay of the batch
    assert not _apply(config, schema, first, _at(100), append=True)  # and of an older one
    assert len(table.refresh().snapshots()) == snapshots and _rows(table) == expected
    # Each batch's offset on one snapshot: the batch's delete and append are one commit, as a MERGE is.
    tagged = [s for s in table.snapshots() if s.summary and SUMMARY_STREAM_OFFSET in s.summary.additional_properties]
    assert len(tagged) == 2


def test_appended_batches_join_the_last_small_file_until_it_is_big_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path)
    schema = _schema("t")
    ensure_target_created(None, config.targets, schema)
    table = cached_pyiceberg_catalog(config.sink).load_table(config.target_for("db", "t"))
    for n in range(4):
        assert _apply(config, schema, {(i,): (i, i, f"r{i}") for i in range(n * 10, n * 10 + 10)}, _at(n), True)
    assert _rows(table) == {i: (i, f"r{i}") for i in range(40)}
    (only,) = table.scan().plan_files()  # one file, written again with each batch's rows
    monkeypatch.setattr(position_deletes, "TAIL_BYTES", only.file.file_size_in_bytes)  # it is big enough now
    assert _apply(config, schema, {(40,): (40, 40, "r40")}, _at(4), True)
    assert sorted(t.file.record_count for t in table.refresh().scan().plan_files()) == [1, 40]


def test_targets_the_driver_must_not_take_are_left_to_spark(tmp_path: Path) -> None:
    config = _config(tmp_path)
    catalog = cached_pyiceberg_catalog(config.sink)

    def taken(
        schema: TableSchema,
        target: str = "lake.db.t",
        max_rows: int = 100,
        append: bool = False,
        keys: int = 0,
        position_deletes: bool = True,
    ) -> str | None:
        ensure_target_created(None, config.targets, schema)
        names = config.target_for(schema.database, schema.table)
        rows = batch_arrow(schema, {(i,): (i, i, None) for i in range(keys)})  # integer keys only
        driver = driver_target(
            catalog, names, target, schema, _stream(config, max_rows, position_deletes), rows, append
        )
        return None if driver is None else driver.how

    assert taken(_schema("ints")) == taken(_schema("strings", key_type="varchar")) == "rewrite"
    assert taken(_schema("ints"), max_rows=0) is None  # turned off: every batch is MERGEd by Spark
    # Where a rewrite would cost what the table holds, or the delete filter is not plainly exact: by position.
    assert taken(_schema("ints"), keys=MAX_KEYS + 1) == "position"  # a catch-up's batch
    assert taken(_schema("two", key=("id", "k2"))) == "position"  # a key of two columns
    assert taken(_schema("dated", key_type="date")) == "position"
    assert taken(_schema("dated", key_type="date"), position_deletes=False) is None  # turned off: Spark's MERGE
    assert taken(_schema("two", key=("id", "k2")), append=True) == "append"  # an append deletes nothing
    assert taken(_schema("dated", key_type="date"), append=True, position_deletes=False) == "append"
    assert taken(dataclasses.replace(_schema("keyless"), primary_key=(), chunk_key=(), collations=())) is None
    assert taken(_schema("ints"), target=on_copy_branch("lake.db.ints")) is None  # copied again into its branch
    big = _schema("big")
    ensure_target_created(None, config.targets, big)
    _apply(config, big, {(i,): (i, i, None) for i in range(101)}, _at(100), append=True)
    assert taken(big) == "position"  # more rows than driver_apply_max_rows
    assert taken(big, position_deletes=False) is None
    assert taken(big, append=True) == "append"  # an append costs the same whatever the target's size
    ensure_target_created(None, config.targets, _schema("partitioned"))
    with catalog.load_table(config.target_for("db", "partitioned")).update_spec() as spec:
        spec.add_identity("k2")
    assert taken(_schema("partitioned")) is None  # pyiceberg would have to compute the partitions
    with catalog.load_table(config.target_for("db", "ints")).update_schema() as update:
        update.add_column("by_hand", StringType())
    assert taken(_schema("ints")) is None  # a column the batch does not set: an update must keep its value
