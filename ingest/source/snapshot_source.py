"""The chunks of one commit as a Spark Python Data Source: one input partition per Spark core.

Each partition runs the lock-free chunk read of its chunks, one after another, on an executor. Per
chunk it yields the rows as Arrow batches, then one marker row carrying the chunk's watermarks and
row count, so the driver learns them from the same computation that produced the rows (see
pipeline.py for how the two are split).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from ingest.sink.types import TargetColumn, quote_identifier
from ingest.source.chunk_reader import ChunkTask, read_chunk

CHUNK_COLUMN = "__ingest_chunk"
META_COLUMN = "__ingest_meta"
ROWS_PER_BATCH = 8192


def source_schema(targets: Sequence[TargetColumn]) -> tuple[str, Any]:
    """(Spark DDL, arrow schema): every column nullable because marker rows carry no data."""
    ddl = ", ".join(f"{quote_identifier(t.name)} {t.spark_type}" for t in targets)
    ddl += f", {CHUNK_COLUMN} INT, {META_COLUMN} STRING"
    fields = [pa.field(t.name, t.arrow_type, nullable=True) for t in targets]
    fields += [pa.field(CHUNK_COLUMN, pa.int32()), pa.field(META_COLUMN, pa.string())]
    return ddl, pa.schema(fields)


def chunk_batches(task: ChunkTask, targets: Sequence[TargetColumn], arrow_schema: Any) -> Iterator[Any]:
    """Read one chunk; yield its rows, then its marker row."""
    result = read_chunk(task)
    for data in result.table.to_batches(max_chunksize=ROWS_PER_BATCH):
        n = data.num_rows
        yield pa.RecordBatch.from_arrays(
            [*data.columns, pa.nulls(n, pa.int32()), pa.nulls(n, pa.string())], schema=arrow_schema
        )
    meta = {
        "low": result.low.to_json(),
        "high": result.high.to_json(),
        "rows": result.table.num_rows,
        "window_events": result.window_events,
        "seconds": round(result.seconds, 4),
        "timings": result.timings,
    }
    marker = [pa.nulls(1, t.arrow_type) for t in targets]
    marker += [pa.array([task.chunk.index], pa.int32()), pa.array([json.dumps(meta)], pa.string())]
    yield pa.RecordBatch.from_arrays(marker, schema=arrow_schema)


def group_tasks(tasks: Sequence[ChunkTask], partitions: int) -> list[list[ChunkTask]]:
    """Chunks dealt round-robin into at most `partitions` input partitions (each read one chunk after another).

    One Spark input partition per chunk would cost a Python task start each (PySpark re-reads the
    directory of its zip archives for every task, tens of milliseconds); one per Spark core does not.
    """
    count = max(1, min(partitions, len(tasks)))
    return [list(tasks[i::count]) for i in range(count)]


def make_chunk_source(name: str, tasks: Sequence[ChunkTask], targets: Sequence[TargetColumn], partitions: int) -> Any:
    """A DataSource class bound to these chunks (pickled by value to the Python workers)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    ddl, arrow_schema = source_schema(targets)
    groups = group_tasks(tasks, partitions)
    target_list = list(targets)

    class ChunkReader(DataSourceReader):
        def partitions(self) -> list[Any]:
            return [InputPartition(group) for group in groups]

        def read(self, partition: Any) -> Iterator[Any]:
            for task in partition.value:
                yield from chunk_batches(task, target_list, arrow_schema)

    class ChunkSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return ddl

        def reader(self, schema: Any) -> Any:
            return ChunkReader()

    return ChunkSource
