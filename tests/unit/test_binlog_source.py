"""The pure parts of the binlog Structured Streaming source and its sink: batch rows and error mapping."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from ingest.binlog_batch import TableBatch
from ingest.binlog_source import BatchEnd, SourceBatch, _rows, decode_batch
from ingest.errors import BinlogPurgedError, SchemaChangeError
from ingest.model.changes import DdlStatement, TablesNamed
from ingest.model.position import BinlogPosition, Watermark
from ingest.structured import _as_ingest_error, checkpoint_problem


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
