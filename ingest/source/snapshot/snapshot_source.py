"""The chunks of one commit as a Spark Python Data Source: one input partition per Spark core.

Each partition runs the lock-free chunk read of its chunks, one after another, on an executor, and
yields each chunk's rows as Arrow batches. What the driver must learn about each chunk (its
watermarks and row count) travels in a Spark accumulator filled by the same computation that
produced the rows, so the rows are read once and written once, with nothing cached in between
(see ingest/query/snapshot.py for what the commit does when a chunk's report is missing). The exception: a table with
`on_unrepresentable: dead_letter`, whose rows carry one more column and are kept between the two writes.

Where the target allows (ingest/sink/data_files.py), `write_chunk_files` is run instead, as a Spark RDD task: it
writes the rows to the target's data files itself and returns only the files and the chunks' reports, so Spark's JVM
never converts the rows.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam

from ingest.changes.rejects import chunk_rejected
from ingest.model.columns import TargetColumn, quote_identifier
from ingest.model.position import Watermark
from ingest.runtime.python_gc import raise_gc_threshold
from ingest.source.snapshot.chunk_reader import ChunkConnections, ChunkResult, ChunkTask, read_chunk

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 8192

ChunkReport = Callable[[int, dict[str, Any]], None]


REJECTED_COLUMN = "__ingest_rejected"
"""With `on_unrepresentable: dead_letter`, a last column: null, or the row's rejected values as JSON (a list of
`RejectedValue` fields); the driver writes those to the rejected table and the others to the target."""


def source_schema(targets: Sequence[TargetColumn], dead_letter: bool = False) -> tuple[str, Any]:
    """(Spark DDL, arrow schema) of the rows; NOT NULL is checked when rows are converted, not by Spark."""
    ddl = ", ".join(f"{quote_identifier(t.name)} {t.spark_type}" for t in targets)
    fields = [pa.field(t.name, t.arrow_type, nullable=True) for t in targets]
    if dead_letter:
        ddl += f", {quote_identifier(REJECTED_COLUMN)} STRING"
        fields.append(pa.field(REJECTED_COLUMN, pa.string(), nullable=True))
    return ddl, pa.schema(fields)


def _rejected_json(task: ChunkTask, result: ChunkResult) -> Any:
    """The chunk's `REJECTED_COLUMN`: per row, null or its rejected values as JSON."""
    positions = task.schema.key_positions()
    names = [task.schema.column_names[i] for i in positions]
    keys = zip(*(result.table.column(i).to_pylist() for i in positions), strict=True)
    out: list[str | None] = []
    for key in keys:
        found = result.unrepresentable.get(tuple(key))
        if not found:
            out.append(None)
            continue
        rows = chunk_rejected(names, key, found, task.chunk.index, result.high)
        out.append(json.dumps([dataclasses.asdict(r) for r in rows], ensure_ascii=False))
    return pa.array(out, pa.string())


def chunk_batches(
    task: ChunkTask,
    targets: Sequence[TargetColumn],
    arrow_schema: Any,
    report: ChunkReport,
    connections: ChunkConnections | None = None,
) -> Iterator[Any]:
    """Read one chunk and yield its rows; once all are yielded, report the chunk's watermarks and row count."""
    result = read_chunk(task, connections)
    table = result.table
    if task.on_unrepresentable == "dead_letter":
        table = table.append_column(REJECTED_COLUMN, _rejected_json(task, result))
    for data in table.to_batches(max_chunksize=ROWS_PER_BATCH):
        yield pa.RecordBatch.from_arrays(data.columns, schema=arrow_schema)
    report(task.chunk.index, chunk_report(result))


def chunk_report(result: ChunkResult) -> dict[str, Any]:
    """What the driver records of a chunk read: its watermarks and row count (and timings, for the log)."""
    return {
        "low": result.low.to_json(),
        "high": result.high.to_json(),
        "rows": result.table.num_rows,
        "window_events": result.window_events,
        "seconds": round(result.seconds, 4),
        "timings": result.timings,
    }


Reports = dict[int, dict[str, Any]]


class ChunkReports(AccumulatorParam[Reports]):
    """Chunk index -> report. Should a chunk be reported twice, the earlier high watermark wins: replaying
    the binlog from before a chunk's true high watermark only repeats changes the chunk already holds."""

    def zero(self, value: Reports) -> Reports:
        return {}

    def addInPlace(self, value1: Reports, value2: Reports) -> Reports:
        for index, meta in value2.items():
            old = value1.get(index)
            if old is None or _high(meta) < _high(old):
                value1[index] = meta
        return value1


def _high(meta: dict[str, Any]) -> Any:
    return Watermark.from_json(meta["high"]).position


def chunk_reports(spark: Any) -> Any:
    """A fresh accumulator for the reports of one batch of chunks."""
    return spark.sparkContext.accumulator({}, ChunkReports())


def group_tasks(tasks: Sequence[ChunkTask], partitions: int) -> list[list[ChunkTask]]:
    """Chunks dealt round-robin into at most `partitions` input partitions (each read one chunk after another).

    One Spark input partition per chunk would cost a Python task start each (PySpark re-reads the
    directory of its zip archives for every task, tens of milliseconds); one per Spark core does not.
    """
    count = max(1, min(partitions, len(tasks)))
    return [list(tasks[i::count]) for i in range(count)]


def make_chunk_source(
    name: str, tasks: Sequence[ChunkTask], targets: Sequence[TargetColumn], partitions: int, reports: Any
) -> Any:
    """A DataSource class bound to these chunks (pickled by value to the Python workers); `reports` is
    the accumulator of `chunk_reports`."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    ddl, arrow_schema = source_schema(targets, any(t.on_unrepresentable == "dead_letter" for t in tasks))
    groups = group_tasks(tasks, partitions)
    target_list = list(targets)

    class ChunkReader(DataSourceReader):
        def partitions(self) -> list[Any]:
            return [InputPartition(group) for group in groups]

        def read(self, partition: Any) -> Iterator[Any]:
            tasks = partition.value
            if not tasks:
                return
            raise_gc_threshold()  # in the Python worker
            # The chunks of one partition come from one batch: one source, one driver, one pair of sessions.
            with ChunkConnections(tasks[0].source, tasks[0].driver) as connections:
                for task in tasks:
                    yield from chunk_batches(
                        task, target_list, arrow_schema, lambda i, m: reports.add({i: m}), connections
                    )

    class ChunkSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return ddl

        def reader(self, schema: Any) -> Any:
            return ChunkReader()

    return ChunkSource


class FileWriter(Protocol):
    def write(self, tables: Iterable[Any], rows_per_batch: int) -> list[Any]: ...


def write_chunk_files(tasks: list[ChunkTask], writer: FileWriter) -> tuple[str, bytes]:
    """Read `tasks` (one input partition's chunks, one after another, with one pair of sessions) and write their
    rows to data files with `writer` (e.g. ingest/sink/data_files.DataFileWriter), on a Python worker. Returns the
    chunks' reports (JSON pairs of chunk index and `chunk_report`) and the files (pickled)."""
    reports: list[tuple[int, dict[str, Any]]] = []
    raise_gc_threshold()  # in the Python worker
    with ChunkConnections(tasks[0].source, tasks[0].driver) as connections:

        def tables() -> Iterator[Any]:
            for task in tasks:
                result = read_chunk(task, connections)
                yield result.table
                reports.append((task.chunk.index, chunk_report(result)))

        files = writer.write(tables(), ROWS_PER_BATCH)
    return json.dumps(reports), pickle.dumps(files)
