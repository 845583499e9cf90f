"""How chunks are grouped into Spark input partitions, and how their reports are merged on the driver."""

from __future__ import annotations

from typing import Any

from ingest.model.position import BinlogPosition, Watermark
from ingest.source.snapshot.snapshot_source import ChunkReports, group_tasks


def _report(file: str, pos: int, rows: int) -> dict[str, Any]:
    return {"high": Watermark(BinlogPosition(file, pos), None).to_json(), "rows": rows}


def test_chunks_are_dealt_round_robin_into_at_most_one_partition_per_core() -> None:
    tasks: list[Any] = list(range(7))
    assert group_tasks(tasks, 2) == [[0, 2, 4, 6], [1, 3, 5]]
    assert group_tasks(tasks, 16) == [[i] for i in range(7)]
    assert group_tasks(tasks[:1], 2) == [[0]]
    assert sorted(i for g in group_tasks(tasks, 3) for i in g) == tasks


def test_reports_merge_per_chunk_and_keep_the_earlier_high_watermark() -> None:
    param = ChunkReports()
    merged = param.zero({})
    merged = param.addInPlace(merged, {0: _report("mysql-bin.000002", 10, 5)})
    merged = param.addInPlace(merged, {1: _report("mysql-bin.000002", 50, 7)})
    # A second report of chunk 0 (a re-executed task): the earlier high watermark is the safe one.
    merged = param.addInPlace(merged, {0: _report("mysql-bin.000001", 900, 5)})
    merged = param.addInPlace(merged, {1: _report("mysql-bin.000010", 4, 7)})
    assert merged[0]["high"]["file"] == "mysql-bin.000001"
    assert merged[1]["high"] == {"file": "mysql-bin.000002", "pos": 50, "gtid_flavor": None, "gtid": None}
    assert sorted(merged) == [0, 1]


def test_the_jobs_own_error_from_an_executor_comes_back_as_itself() -> None:
    from ingest.errors import SchemaChangeError
    from ingest.query.snapshot import executor_error

    wrapped = RuntimeError(
        "An error occurred while calling o123.append.\n: org.apache.spark.SparkException: Job aborted due to stage "
        'failure: ... PythonException: Traceback (most recent call last):\n  File "chunk_reader.py", line 1\n'
        "ingest.errors.SchemaChangeError: db.t: a column the snapshot reads is gone (chunk 2)\n\tat org.apache..."
    )
    found = executor_error(wrapped)
    assert isinstance(found, SchemaChangeError) and str(found) == "db.t: a column the snapshot reads is gone (chunk 2)"
    assert executor_error(RuntimeError("java.lang.OutOfMemoryError: Java heap space")) is None
    assert executor_error(RuntimeError("ingest.errors.Nonsense: x")) is None
