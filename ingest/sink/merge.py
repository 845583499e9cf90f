"""Applying one materialized batch to one target with MERGE INTO, tagged with the batch's end offset.

The offset goes into the Iceberg snapshot summary of the same commit (`spark.sql.iceberg.snapshot-
property.*`), so "has this table committed this batch?" is answered by the table itself: a replayed
batch is skipped (zero new snapshots), and a commit whose outcome is unknown is checked, not repeated.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import pyarrow as pa

from ingest import metrics
from ingest.errors import CommitConflictError
from ingest.model.columns import quote_identifier, rows_to_record_batch
from ingest.model.position import BinlogPosition, Watermark, parse_gtid_set
from ingest.model.schema import OCCURRENCE_COLUMN, TableSchema, source_targets
from ingest.sink.pruning import target_predicate
from ingest.sink.summary import SUMMARY_CHUNKS_DONE, SUMMARY_PIPELINE, SUMMARY_STREAM_OFFSET
from ingest.sink.targets import lineage, table_of

log = logging.getLogger(__name__)

OP_COLUMN = "__ingest_op"
MAX_ATTEMPTS = 4


def offset_summary(end: Watermark) -> str:
    """The summary value of a batch end: its position, and its GTIDs and server id where known."""
    data: dict[str, object] = {"position": str(end.position)}
    if end.gtid is not None:
        data["gtid_flavor"], data["gtid"] = end.gtid.flavor, str(end.gtid)
    if end.server_id is not None:
        data["server_id"] = end.server_id
    return json.dumps(data)


def offset_from_summary(text: str) -> Watermark:
    data = json.loads(text)
    flavor, gtid = data.get("gtid_flavor"), data.get("gtid")
    return Watermark(
        BinlogPosition.parse(data["position"]),
        None if gtid is None else parse_gtid_set(gtid, "mysql" if flavor == "mysql" else "mariadb"),
        data.get("server_id"),
    )


def committed_offset(iceberg_table: Any, pipeline: str) -> Watermark | None:
    """The newest stream offset this pipeline committed to the table, from its snapshot summaries."""
    return stream_history(iceberg_table, pipeline).offset


@dataclasses.dataclass(frozen=True)
class StreamHistory:
    offset: Watermark | None
    """The newest stream offset of this pipeline in the table's current lineage."""
    complete: bool
    """True when `offset` is surely the newest the table holds: found, or the lineage was read back to the
    snapshot phase's commits (or the table's first snapshot) with no stream commit after them. False when
    snapshot expiry cut the walk short: a stream commit may have been expired with the snapshots above it."""


def stream_history(iceberg_table: Any, pipeline: str) -> StreamHistory:
    """What the table says about this pipeline's stream commits, walking back from the job's head of it (the
    copy branch's while the table is copied again, see targets.job_head).

    Walks parent ids and stops at the first snapshot of this pipeline carrying an offset: our MERGEs commit
    strictly increasing offsets (a batch not newer than the table's offset is skipped), so the newest ancestor
    of ours holds the largest one. Commits on top by other writers (compaction, another pipeline, a user's
    DELETE) carry no offset of ours and are passed over. Only the current lineage counts: a snapshot rolled
    back or on another branch no longer holds its data, so its offset must not count. Expiry cuts the walk
    short where it removed a parent; then the answer is None and not complete: MERGE, which carries final
    row images, is idempotent over a batch the table may hold, an append is not.
    """
    last = None
    for snapshot in lineage(iceberg_table):
        last = snapshot
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        if props.get(SUMMARY_PIPELINE) == pipeline:
            if SUMMARY_STREAM_OFFSET in props:
                return StreamHistory(offset_from_summary(props[SUMMARY_STREAM_OFFSET]), True)
            if SUMMARY_CHUNKS_DONE in props:
                return StreamHistory(None, True)  # the snapshot phase's commit: the stream came after it
    # Complete when the walk reached the table's first snapshot (or the table has none), not an expired parent.
    return StreamHistory(None, last is None or last.parent_snapshot_id is None)


def stream_offset_properties(pipeline: str, end: Watermark) -> dict[str, str]:
    """The summary entries that say "this table holds everything up to `end`"."""
    return {SUMMARY_PIPELINE: pipeline, SUMMARY_STREAM_OFFSET: offset_summary(end)}


def batch_arrow(schema: TableSchema, finals: Mapping[tuple[Any, ...], tuple[Any, ...] | None]) -> pa.Table:
    """The batch's rows for the target, as Arrow: per key its final image (op U) or, for a delete, its key (op D)."""
    targets = [dataclasses.replace(t, nullable=True) for t in source_targets(schema)]
    positions = schema.primary_key_positions()
    width = len(targets)
    rows, ops = [], []
    for key, row in finals.items():
        if row is None:
            image: list[Any] = [None] * width
            for p, v in zip(positions, key, strict=True):
                image[p] = v
            rows.append(tuple(image))
            ops.append("D")
        else:
            rows.append(row)
            ops.append("U")
    batch = rows_to_record_batch(targets, rows)
    return pa.Table.from_batches([batch]).append_column(OP_COLUMN, pa.array(ops, pa.string()))


COUNT_COLUMN = "__ingest_count"


Image = tuple[Any, ...]


def alike_arrow(schema: TableSchema, changes: Iterable[tuple[Image | None, Image | None]]) -> pa.Table:
    """A batch of a table without a key, for `alike_merge_statement`: each image of its (before, after) changes, the
    after images counted +1 and the before images -1 (`COUNT_COLUMN`)."""
    targets = [dataclasses.replace(t, nullable=True) for t in source_targets(schema)]
    images: list[tuple[Any, ...]] = []
    counts: list[int] = []
    for before, after in changes:
        for image, count in ((before, -1), (after, 1)):
            if image is not None:
                images.append(image)
                counts.append(count)
    batch = rows_to_record_batch(targets, images)
    return pa.Table.from_batches([batch]).append_column(COUNT_COLUMN, pa.array(counts, pa.int64()))


def alike_merge_statement(target: str, view: str, schema: TableSchema) -> str:
    """The MERGE of a batch of a table without a key (`alike_arrow` in `view`) into `target`, whose alike rows are
    numbered 1..n in `OCCURRENCE_COLUMN`.

    Per row value, the batch's counts are summed (so in Iceberg's values, as the target compares them) and the
    target's highest number of that value is read: a value that gains k rows gets rows n+1..n+k, one that loses
    k has its rows n-k+1..n deleted, so that the numbers stay 1..n. Each value is matched null-safe in every column.
    """
    columns = [quote_identifier(c) for c in schema.column_names]
    occurrence, delta, held = (quote_identifier(n) for n in (OCCURRENCE_COLUMN, "__ingest_delta", "__ingest_held"))
    listed = ", ".join(columns)

    def alike(a: str, b: str) -> str:
        return " AND ".join(f"{a}.{c} <=> {b}.{c}" for c in columns)

    netted = f"(SELECT {listed}, SUM({COUNT_COLUMN}) AS {delta} FROM {view} GROUP BY {listed})"
    # Only the values the batch changes are read of the target (a semi join), then their highest numbers.
    highest = (
        f"(SELECT {', '.join(f'h.{c}' for c in columns)}, MAX(h.{occurrence}) AS {held} FROM {target} h "
        f"LEFT SEMI JOIN {netted} d ON {alike('h', 'd')} GROUP BY {', '.join(f'h.{c}' for c in columns)})"
    )
    counted = (
        f"(SELECT {', '.join(f'd.{c}' for c in columns)}, d.{delta}, COALESCE(h.{held}, 0) AS {held} "
        f"FROM {netted} d LEFT JOIN {highest} h ON {alike('d', 'h')} WHERE d.{delta} <> 0)"
    )
    first, last = (f"c.{held} + c.{delta} + 1", f"c.{held}"), (f"c.{held} + 1", f"c.{held} + c.{delta}")
    numbers = f"IF(c.{delta} < 0, sequence({', '.join(first)}), sequence({', '.join(last)}))"
    number = quote_identifier("__ingest_number")
    source = (
        f"(SELECT {', '.join(f'c.{c}' for c in columns)}, e.{number} AS {occurrence}, "
        f"IF(c.{delta} < 0, 'D', 'I') AS {OP_COLUMN} FROM {counted} c LATERAL VIEW explode({numbers}) e AS {number})"
    )
    return (
        f"MERGE INTO {target} t USING {source} s ON {alike('t', 's')} AND t.{occurrence} = s.{occurrence} "
        f"WHEN MATCHED AND s.{OP_COLUMN} = 'D' THEN DELETE "
        f"WHEN NOT MATCHED AND s.{OP_COLUMN} = 'I' THEN INSERT ({listed}, {occurrence}) "
        f"VALUES ({', '.join(f's.{c}' for c in columns)}, s.{occurrence})"
    )


def batch_where(
    schema: TableSchema, keys: Collection[tuple[Any, ...]], located: Mapping[str, Collection[Any]] | None = None
) -> str | None:
    """What of the target a MERGE of `keys` reads (ingest/sink/pruning.py): None for all of it."""
    return target_predicate(source_targets(schema), schema.primary_key, keys, located)


def merge_statement(target: str, view: str, schema: TableSchema, where: str | None) -> str:
    """The MERGE of the batch in `view` (`batch_arrow`) into `target`, reading of the target only `where` (the
    batch's `batch_where`: what the batch can change)."""
    columns = [quote_identifier(c) for c in schema.column_names]
    on = " AND ".join(f"t.{quote_identifier(k)} = s.{quote_identifier(k)}" for k in schema.primary_key)
    if where is not None:
        on = f"{on} AND {where}"
    # A filter that keeps every row: Spark builds a Bloom filter of the batch's keys for the target's scan only
    # from a filtered side (InjectRuntimeFilter; ingest/sink/pruning.py, session_conf.py).
    source = f"(SELECT * FROM {view} WHERE {OP_COLUMN} IN ('U', 'D'))"
    return (
        f"MERGE INTO {target} t USING {source} s ON {on} "
        f"WHEN MATCHED AND s.{OP_COLUMN} = 'D' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {', '.join(f't.{c} = s.{c}' for c in columns)} "
        f"WHEN NOT MATCHED AND s.{OP_COLUMN} = 'U' THEN INSERT ({', '.join(columns)}) "
        f"VALUES ({', '.join(f's.{c}' for c in columns)})"
    )


def merge_into(
    spark: Any,
    target: str,
    schema: TableSchema,
    finals: Mapping[tuple[Any, ...], tuple[Any, ...] | None],
    end: Watermark,
    read_offset: Any,
    append: bool = False,
    located: Mapping[str, Collection[Any]] | None = None,
) -> bool:
    """MERGE the batch `finals` (per key its final image, None for a delete): `merge_arrow` of its `batch_arrow`.

    The target is read only where the batch's keys can be (ingest/sink/pruning.py), and where `located` says the
    rows live: every value each of these target columns may hold in the rows the batch changes.

    With `append`, every row of `finals` has a key the target cannot hold (the batch created it, see
    `created_keys`): the rows are appended, with no scan of the target and no conflict with its rewrites.
    """
    if append:
        assert all(row is not None for row in finals.values()), "only new rows are appended"
    where = None if append else batch_where(schema, finals.keys(), located)
    return merge_arrow(spark, target, schema, batch_arrow(schema, finals), where, end, read_offset, append)


def merge_arrow(
    spark: Any,
    target: str,
    schema: TableSchema,
    rows: pa.Table,
    where: str | None,
    end: Watermark,
    read_offset: Any,
    append: bool = False,
) -> bool:
    """MERGE the batch `rows` (`batch_arrow`), reading of the target only `where`; False when the table already
    holds it. Conflicts are retried from fresh state. With `append`, the rows are inserted.

    The caller sets the batch's summary around it (`snapshot_properties` with `stream_offset_properties`),
    once for the MERGEs of several tables running at the same time: the session's settings are shared.
    """
    view = f"ingest_batch_{abs(hash((target, str(end.position))))}"
    spark.createDataFrame(rows).createOrReplaceTempView(view)
    if append:
        columns = ", ".join(quote_identifier(c) for c in schema.column_names)
        sql = f"INSERT INTO {target} ({columns}) SELECT {columns} FROM {view}"
    elif schema.keyless:
        sql = alike_merge_statement(target, view, schema)
    else:
        sql = merge_statement(target, view, schema, where)
    try:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            done = read_offset()
            if done is not None and done >= end.position:
                return False  # committed before (a replay, or a commit that raised after succeeding)
            try:
                spark.sql(sql)
                return True
            except Exception as e:  # noqa: BLE001 - Spark surfaces Iceberg's conflicts as generic errors
                text = str(e)
                if (
                    "CommitFailedException" not in text
                    and "ValidationException" not in text
                    and "conflict" not in text.lower()
                ):
                    raise
                metrics.current().commit_retried(target)
                log.warning(
                    "%s: commit conflict at attempt %d, retrying from fresh state: %s",
                    target,
                    attempt,
                    text.splitlines()[0][:200],
                )
                spark.sql(f"REFRESH TABLE {table_of(target)}")
                time.sleep(0.2 * attempt)
        raise CommitConflictError(f"{target}: MERGE kept conflicting with other writers after {MAX_ATTEMPTS} tries")
    finally:
        spark.catalog.dropTempView(view)
