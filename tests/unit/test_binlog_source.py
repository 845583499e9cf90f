"""The pure parts of the binlog Structured Streaming source and its sink: batch rows, offsets, the chunk batches the
source offers, and error mapping."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ingest.config import parse_config
from ingest.errors import BinlogPurgedError, SchemaChangeError
from ingest.model.changes import DdlStatement, TablesNamed
from ingest.model.columns import SourceColumn
from ingest.model.position import BinlogPosition, Watermark
from ingest.model.schema import TableSchema
from ingest.query.batch import TableBatch, TableStream
from ingest.query.binlog_source import (
    CHUNKS_KEY,
    BatchEnd,
    BinlogSourceSpec,
    BinlogStreamReader,
    ChunkBatch,
    SourceBatch,
    _Batch,
    _rows,
    decode_batch,
    make_binlog_source,
    offset_mark,
    offset_parts,
    source_offset,
)
from ingest.query.pipeline import _copies, streaming_of
from ingest.query.structured import _as_ingest_error, checkpoint_problem
from ingest.source.binlog.prefetch import Idle
from ingest.source.snapshot.chunks import Chunk
from ingest.state.table import ChunkRecord, Requests


def _part(table_id: str, ids: list[int]) -> TableBatch:
    rows = pa.table({"id": pa.array(ids, pa.int64()), "__ingest_op": pa.array(["U"] * len(ids))})
    return TableBatch(table_id, rows, False, "t.`id` IN (1)", len(ids), None, [])


def test_a_batch_decodes_to_its_ddl_its_tables_and_its_end_whatever_order_spark_returns_its_rows() -> None:
    ddl = DdlStatement(
        "ALTER TABLE t ADD c INT",
        (("d", "t"),),
        BinlogPosition("mysql-bin.000002", 90),
        BinlogPosition("mysql-bin.000002", 120),
    )
    end = BatchEnd({"file": "mysql-bin.000002", "pos": 300}, None, 1_700_000_000)
    batch = SourceBatch(ddl, [_part("d.a", [1, 2]), _part("d.t", [3])], end)
    rows = _rows(batch)
    assert [r[1] for r in rows] == ["ddl", "table", "table", "end"]
    decoded = decode_batch(list(reversed(rows)))
    assert (decoded.ddl, decoded.end) == (ddl, end)
    assert [(t.table_id, t.rows.to_pylist() if t.rows is not None else None) for t in decoded.tables] == [
        ("d.a", [{"id": 1, "__ingest_op": "U"}, {"id": 2, "__ingest_op": "U"}]),
        ("d.t", [{"id": 3, "__ingest_op": "U"}]),
    ]
    assert decode_batch(_rows(SourceBatch(None, [], end))) == SourceBatch(None, [], end)
    named = TablesNamed((("d", "new"),), BinlogPosition("mysql-bin.000002", 400))
    rows = _rows(SourceBatch(None, [_part("d.t", [4])], end, named))
    assert [r[1] for r in rows] == ["table", "named", "end"]
    assert decode_batch(rows[::-1]).named == named


def test_a_batch_without_its_end_row_is_refused() -> None:
    rows = _rows(SourceBatch(None, [_part("d.t", [1])], BatchEnd({"file": "f", "pos": 1})))[:-1]
    with pytest.raises(RuntimeError, match="without its end row"):
        decode_batch(rows)
    assert pickle.loads(_rows(SourceBatch(None, [], BatchEnd({"pos": 1})))[0][2]) == BatchEnd({"pos": 1})


def test_the_source_processes_error_text_becomes_the_jobs_own_error_class() -> None:
    text = (
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform latestOffset: "
        'Traceback (most recent call last):\n  File "x.py", line 1, in read\n'
        "ingest.errors.SchemaChangeError: the schema of d.t changed at binlog position mysql-bin.000002:120\n"
        " SQLSTATE: 38000"
    )
    error = _as_ingest_error(RuntimeError(text))
    assert isinstance(error, SchemaChangeError)
    assert str(error) == "the schema of d.t changed at binlog position mysql-bin.000002:120"
    purged = _as_ingest_error(RuntimeError("...\nBinlogPurgedError: the binlog at f:4 is gone\n"))
    assert isinstance(purged, BinlogPurgedError)
    other = RuntimeError("java.lang.OutOfMemoryError: Java heap space")
    assert _as_ingest_error(other) is other


def test_a_kept_checkpoint_is_continued_only_when_it_is_not_ahead_of_the_targets_and_from_this_server() -> None:
    def mark(pos: int, server: int = 1) -> Watermark:
        return Watermark(BinlogPosition("mysql-bin.000003", pos), None, server)

    start = BinlogPosition("mysql-bin.000003", 500)
    assert checkpoint_problem("ck", None, None, start, 1) is None  # a new checkpoint
    assert checkpoint_problem("ck", mark(400), mark(900), start, 1) is None  # behind; its last batch is replayed
    assert checkpoint_problem("ck", mark(500), mark(500), start, 1) is None
    ahead = checkpoint_problem("ck", mark(501), mark(700), start, 1)
    assert ahead is not None and "has committed the binlog up to mysql-bin.000003:501" in ahead
    assert "hold the source only up to mysql-bin.000003:500" in ahead and "delete the checkpoint directory" in ahead
    moved = checkpoint_problem("ck", mark(100, 7), mark(200, 7), start, 1)
    assert moved is not None and "server_id 7" in moved and "source now is server_id 1" in moved


class _State:
    """The state table as the source reads it: chunk records and pauses (the sink writes them)."""

    def __init__(self) -> None:
        self.records: dict[str, dict[int, ChunkRecord]] = {}
        self.plans: dict[str, list[Chunk]] = {}
        self.paused: frozenset[str] = frozenset()
        self.reloads = 0

    def plan(self, table_id: str) -> list[Chunk] | None:
        return self.plans.get(table_id)

    def unfinished(self, table_id: str) -> bool:  # as StateTable says it
        return len(self.records.get(table_id, {})) < len(self.plans.get(table_id) or [])

    def reload(self) -> None:
        self.reloads += 1

    def done(self, table_id: str) -> dict[int, ChunkRecord]:
        return dict(self.records.get(table_id, {}))

    def requests(self) -> Requests:
        return Requests({}, self.paused)


def _reader(monkeypatch: pytest.MonkeyPatch) -> tuple[BinlogStreamReader, _State]:
    monkeypatch.setenv("INGEST_UT_SOURCE_PASSWORD", "pw")
    config = parse_config(
        {
            "source": {"host": "db.example", "user": "cdc", "password": {"env": "INGEST_UT_SOURCE_PASSWORD"}},
            "tables": {"include": [r"db\..*"]},
            "sink": {"catalog": {"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db"}},
            "snapshot": {"chunks_per_commit": 2},
        }
    )
    tables = []
    for name, read in (("a", 3), ("b", 0), ("c", 0)):
        schema = TableSchema("db", name, (SourceColumn("id", "int", "int(11)", False),), ("id",), ("id",), (None,))
        chunks = [Chunk(f"db.{name}", i, None if i == 0 else (10 * i,), (10 * i + 10,)) for i in range(3)]
        highs = [BinlogPosition("b.000001", 100)] * read + [None] * (3 - read)
        tables.append(TableStream(schema, f"lake.db.{name}", chunks, highs, None))
    mark = Watermark(BinlogPosition("b.000001", 50), None, 1)
    reader = BinlogStreamReader(
        BinlogSourceSpec(streaming_of(config), "mariadb", tuple(tables), mark, {}, read_chunks=True)
    )
    state = _State()
    reader._chunks._state = state  # type: ignore[assignment]
    return reader, state


def test_the_source_offers_one_commit_of_chunks_of_the_first_table_not_paused_and_learns_what_was_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader, state = _reader(monkeypatch)
    state.paused = frozenset({"db.b"})
    offered = reader._chunks.next()
    assert offered is not None and [t for t, _ in offered.parts] == ["db.c"]  # db.a is read, db.b paused
    assert [c.index for c in offered.parts[0][1]] == [0, 1]  # snapshot.chunks_per_commit
    mark = Watermark(BinlogPosition("b.000001", 70), None, 1)
    rows, end = reader._hand_chunks(mark, offered)
    assert offset_mark(end) == mark and end[CHUNKS_KEY] == {"parts": [["db.c", [0, 1]]]}
    assert reader._begin(end) == mark  # the next batch reads the binlog from where the chunk batch began
    assert decode_batch(list(rows)).chunks == offered
    assert list(reader.readBetweenOffsets(mark.to_json(), end)) == _rows(
        SourceBatch(None, [], BatchEnd(end), chunks=offered)
    )  # a replay is the same chunks
    state.records["db.c"] = {0: ChunkRecord(offered.parts[0][1][0], Watermark(BinlogPosition("b.000001", 90), None, 1))}
    assert reader._chunks.learn() and state.reloads == 1
    assert reader._tables["db.c"].chunk_highs == [BinlogPosition("b.000001", 90), None, None]
    assert not reader._chunks.learn()  # only right after a chunk batch
    state.paused = frozenset()
    reader._chunks._paused_looked = -float("inf")  # `stream.signal_poll_seconds` later
    again = reader._chunks.next()
    assert again is not None and [t for t, _ in again.parts] == ["db.b"]


def test_a_chunk_batch_the_sink_read_none_of_is_offered_again_only_after_a_binlog_batch_or_an_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader, _ = _reader(monkeypatch)
    offered = reader._chunks.next()
    assert offered is not None
    reader._hand_chunks(Watermark(BinlogPosition("b.000001", 70), None, 1), offered)
    assert reader._chunks.learn()  # the sink read none: the source's load, or a DDL not followed yet
    assert reader._chunks.next() is None
    reader._chunks.held_until -= reader.spec.streaming.stream.batch_interval_seconds  # the interval passed
    assert reader._chunks.next() == offered


def test_a_source_offset_is_a_watermark_and_only_a_chunk_batch_adds_its_chunks() -> None:
    mark = Watermark(BinlogPosition("b.000002", 4), None, 7)
    assert source_offset(mark) == mark.to_json() and offset_mark(source_offset(mark)) == mark
    chunks = ChunkBatch((("db.t", (Chunk("db.t", 3, (1,), (2,)),)),))
    assert offset_mark(source_offset(mark, chunks)) == mark
    assert source_offset(mark, chunks)[CHUNKS_KEY] == {"parts": [["db.t", [3]]]}
    assert offset_parts(source_offset(mark, chunks)[CHUNKS_KEY]) == [("db.t", [3])]
    # as a kept checkpoint of a version that gave one table's chunks per batch holds it
    assert offset_parts({"table": "db.t", "indices": [3, 4]}) == [("db.t", [3, 4])]


def test_tables_with_one_chunk_left_share_a_chunk_batch_and_a_table_with_more_has_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader, state = _reader(monkeypatch)  # db.a read; db.b and db.c have 3 chunks left each
    for table_id in ("db.b", "db.c"):
        reader._tables[table_id].chunk_highs[:2] = [BinlogPosition("b.000001", 100)] * 2  # one left each
    offered = reader._chunks.next()
    assert offered is not None
    assert [(t, [c.index for c in part]) for t, part in offered.parts] == [("db.b", [2]), ("db.c", [2])]
    mark = Watermark(BinlogPosition("b.000001", 70), None, 1)
    rows, end = reader._hand_chunks(mark, offered)
    assert decode_batch(list(rows)).chunks == offered
    assert list(reader.readBetweenOffsets(mark.to_json(), end)) == _rows(
        SourceBatch(None, [], BatchEnd(end), chunks=offered)
    )  # a replay is the same chunks of the same tables
    high = Watermark(BinlogPosition("b.000001", 90), None, 1)
    state.records["db.c"] = {2: ChunkRecord(offered.parts[1][1][0], high)}  # the sink read db.c's, not db.b's
    assert reader._chunks.learn()
    assert reader._tables["db.c"].unread == [] and len(reader._tables["db.b"].unread) == 1
    reader._tables["db.b"].chunk_highs[1] = None  # db.b with two left: a batch of its own, before db.c's one
    reader._tables["db.c"].chunk_highs[2] = None
    alone = reader._chunks.next()
    assert alone is not None and [(t, [c.index for c in part]) for t, part in alone.parts] == [("db.b", [1, 2])]


class _Polled:
    """The prefetch as the source polls it: the items given, then nothing."""

    def __init__(self, *items: Any) -> None:
        self.items = list(items)

    def poll(self, wait: float) -> Any:
        return self.items.pop(0) if self.items else None


def test_a_catch_up_whose_binlog_ends_past_its_last_transaction_reaches_its_goal_at_a_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MariaDB may write a binlog checkpoint after the last transaction: the goal (the binlog's end when the catch-up
    began) lies past every transaction's end. Another table's transaction does not say the binlog is read to its
    end; a heartbeat does, and the batch then ends at the goal."""
    reader, _ = _reader(monkeypatch)
    last_tx, goal = BinlogPosition("b.000002", 1541), BinlogPosition("b.000002", 1584)
    reader.spec = dataclasses.replace(reader.spec, goal=goal)
    begin = Watermark(BinlogPosition("b.000002", 4), None, 1)
    reader._reader, reader._batch = object(), _Batch(begin)  # type: ignore[assignment]
    reader._prefetch = _Polled(Idle(last_tx, 10.0))  # type: ignore[assignment]
    assert reader._take(time.monotonic()) is None  # not due, and the goal not reached
    assert reader._batch.end.position == last_tx
    reader._prefetch = _Polled(Idle(last_tx, 11.0, at_end=True))  # type: ignore[assignment]
    batch = reader._take(time.monotonic() + 5)
    assert batch is not None and batch.end == Watermark(goal, None, 1) and batch.at == 11.0


def test_a_catch_up_goes_on_to_the_high_watermark_of_a_chunk_read_since_it_began(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chunk read during a catch-up holds its rows as of its high watermark: the catch-up goes on to there, so that
    the other chunks' keys get the changes up to it too. A heartbeat from before that chunk was read says nothing of
    the changes since: they are still to come."""
    reader, _ = _reader(monkeypatch)
    began, high = BinlogPosition("b.000001", 1926), BinlogPosition("b.000001", 3183)
    reader.spec = dataclasses.replace(reader.spec, goal=began)
    reader._tables["db.c"].chunk_highs[0] = high  # read since the catch-up began
    begin = Watermark(BinlogPosition("b.000001", 1000), None, 1)
    reader._reader, reader._batch = object(), _Batch(begin)  # type: ignore[assignment]
    reader._prefetch = _Polled(Idle(began, 10.0, at_end=True))  # type: ignore[assignment]
    assert reader._take(time.monotonic()) is None  # at the old end, not at the chunk's
    assert reader._batch.end.position == began
    reader._prefetch = _Polled(Idle(high, 12.0))  # type: ignore[assignment]
    batch = reader._take(time.monotonic() + 5)
    assert batch is not None and batch.end.position == high


STAND_IN = """
import pickle, sys
from pyspark import cloudpickle
source = pickle.loads(open(sys.argv[1], "rb").read())
assert source({}).schema().startswith("seq LONG")
reader = source({}).simpleStreamReader(schema=None)
cloudpickle.dumps(reader)  # as the planning process pickles it into the read function
loaded = sorted(m for m in sys.modules if m.startswith("ingest"))
assert "ingest.query.binlog_source" not in loaded and "ingest.config" not in loaded, loaded
print(reader.initialOffset())
assert "ingest.query.binlog_source" in sys.modules
"""


def test_the_processes_that_create_the_source_and_plan_its_read_import_pyspark_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The source class as Spark pickles it, in a new interpreter: its schema, and its reader made and pickled (what
    Spark's creating and planning processes do) import none of the binlog reader; the reader's first call does."""
    from pyspark import cloudpickle

    reader, _ = _reader(monkeypatch)
    pickled = tmp_path / "source.pickle"
    pickled.write_bytes(cloudpickle.dumps(make_binlog_source("ingest_binlog_t", reader.spec)))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", STAND_IN, str(pickled)],
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(reader.initialOffset())


def test_only_a_run_that_copies_a_table_starts_the_executors_python_ahead() -> None:
    state = _State()
    schema = TableSchema("db", "a", (SourceColumn("id", "int", "int(11)", False),), ("id",), ("id",), (None,))
    assert _copies(state, [schema])  # type: ignore[arg-type]  # not planned yet: a first run
    chunks = [Chunk("db.a", i, None, None) for i in range(2)]
    state.plans["db.a"] = chunks
    state.records["db.a"] = {0: ChunkRecord(chunks[0], Watermark(BinlogPosition("b.000001", 90), None, 1))}
    assert _copies(state, [schema])  # one chunk left
    state.records["db.a"][1] = ChunkRecord(chunks[1], Watermark(BinlogPosition("b.000001", 95), None, 1))
    assert not _copies(state, [schema])  # copied: a binlog-only run
    assert not _copies(state, [])
