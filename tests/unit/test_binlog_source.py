"""The pure parts of the binlog Structured Streaming source and its sink: batch rows and error mapping."""

from __future__ import annotations

import pickle

import pytest

from ingest.errors import BinlogPurgedError, SchemaChangeError
from ingest.source.binlog import DdlStatement, RowChange, Transaction
from ingest.source.binlog_source import BatchEnd, _rows, decode_batch
from ingest.source.position import BinlogPosition
from ingest.structured import _as_ingest_error


def _tx(pos: int) -> Transaction:
    at = BinlogPosition("mysql-bin.000002", pos)
    return Transaction(at, "0-1-7", [RowChange("d.t", at, 0, None, (1, "x"))], 1_700_000_000)


def test_a_batch_decodes_to_its_items_in_binlog_order_whatever_order_spark_returns_its_rows() -> None:
    ddl = DdlStatement(
        "ALTER TABLE t ADD c INT",
        (("d", "t"),),
        BinlogPosition("mysql-bin.000002", 90),
        BinlogPosition("mysql-bin.000002", 120),
    )
    items = [ddl, _tx(200), _tx(300)]
    end = BatchEnd({"file": "mysql-bin.000002", "pos": 300}, None)
    rows = _rows(items, end)
    assert [r[1] for r in rows] == ["ddl", "tx", "tx", "end"]
    assert decode_batch(list(reversed(rows))) == (items, end)


def test_a_batch_without_its_end_row_is_refused() -> None:
    rows = _rows([_tx(200)], BatchEnd({"file": "f", "pos": 1}))[:-1]
    with pytest.raises(RuntimeError, match="without its end row"):
        decode_batch(rows)
    assert pickle.loads(_rows([], BatchEnd({"pos": 1}))[0][2]) == BatchEnd({"pos": 1})


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
