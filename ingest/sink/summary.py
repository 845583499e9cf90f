"""What the job's Iceberg commits say in their snapshot summary: "Iceberg snapshots are the checkpoint boundary"
(MISSION.md). The keys, and the block that tags Spark's commits with them.

Below every other sink module (it imports none of them): targets, MERGE, schema evolution and maintenance all
tag commits or read tags.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

SUMMARY_PIPELINE = "ingest.pipeline"
SUMMARY_CHUNKS_DONE = "ingest.snapshot.chunks-done"
SUMMARY_STREAM_OFFSET = "ingest.stream.offset"
_SNAPSHOT_PROPERTY = "spark.sql.iceberg.snapshot-property."


@contextmanager
def snapshot_properties(spark: Any, props: Mapping[str, str]) -> Iterator[None]:
    """Iceberg commits made by Spark inside this block carry `props` in their snapshot summary."""
    for k, v in props.items():
        spark.conf.set(_SNAPSHOT_PROPERTY + k, v)
    try:
        yield
    finally:
        for k in props:
            spark.conf.unset(_SNAPSHOT_PROPERTY + k)
