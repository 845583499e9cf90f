"""Changelog tables: an append-only Iceberg table per source table, one row per change (+I/-U/+U/-D).

Exactly once the same way as MERGE (merge.py): each append carries the batch's end offset in its
snapshot summary (`ingest.stream.offset`), a batch the table already holds is skipped, and changes at or
before the table's own committed offset are never appended again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from ingest.changes.changelog import SourceChange, changelog_rows
from ingest.config import Targets
from ingest.errors import UnsupportedTableError
from ingest.model.changes import ChangelogRow
from ingest.model.columns import TargetColumn, arrow_schema, quote_identifier, rows_to_record_batch
from ingest.model.position import BinlogPosition, Watermark
from ingest.model.schema import TableSchema, source_targets
from ingest.sink.key_actions import ActedRow
from ingest.sink.merge import offset_summary
from ingest.sink.summary import SUMMARY_PIPELINE, SUMMARY_STREAM_OFFSET
from ingest.sink.targets import OLD_METADATA_DELETED, qualified

log = logging.getLogger(__name__)

OP, SEQ, POSITION, GTID, COMMIT_TS = "_op", "_seq", "_position", "_gtid", "_commit_ts"
# (name, Spark DDL type, arrow type, nullable) of the columns after the source columns.
META_COLUMNS: tuple[tuple[str, str, Any, bool], ...] = (
    (OP, "STRING", pa.string(), False),
    (SEQ, "STRING", pa.string(), False),
    (POSITION, "STRING", pa.string(), False),
    (GTID, "STRING", pa.string(), True),
    (COMMIT_TS, "TIMESTAMP", pa.timestamp("us", tz="UTC"), False),
)


def source_columns(schema: TableSchema) -> list[TargetColumn]:
    """The source columns, all optional: a delete's image of a NOT NULL column is still a full row, but
    optional columns let a later schema change add or drop columns without rewriting history."""
    names = {c[0] for c in META_COLUMNS}
    clash = [t.name for t in source_targets(schema) if t.name in names]
    if clash:
        raise UnsupportedTableError(
            f"{schema.table_id}: column {clash[0]!r} has the name of a changelog column; turn `changelog` off "
            "for this table in `table_options`"
        )
    return [TargetColumn(t.name, t.spark_type, t.arrow_type, True, t.convert) for t in source_targets(schema)]


def ensure_changelog(spark: Any, targets: Targets, schema: TableSchema) -> str | None:
    """Create the changelog table if the table has one configured and it is missing; return its name."""
    names = targets.changelog_for(schema.database, schema.table)
    if names is None:
        return None
    namespace, name = names
    table = qualified(targets, namespace, name)
    if not spark.catalog.tableExists(table):
        columns = [f"{quote_identifier(t.name)} {t.spark_type}" for t in source_columns(schema)]
        columns += [
            f"{quote_identifier(n)} {ddl}{'' if nullable else ' NOT NULL'}" for n, ddl, _, nullable in META_COLUMNS
        ]
        props = {
            "format-version": str(targets.sink.format_version),
            **OLD_METADATA_DELETED,
            **targets.sink.table_properties,
        }
        tblprops = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())
        spark.sql(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(columns)}) USING iceberg TBLPROPERTIES ({tblprops})")
        log.info("created changelog %s for %s", table, schema.table_id)
    return table


def changelog_arrow(schema: TableSchema, rows: Sequence[ChangelogRow], converted: bool = False) -> Any:
    """The `pyarrow.Table` of changelog rows: converted source columns, then the change columns. With `converted`,
    the images hold the values Iceberg does already (read from a target)."""
    columns = source_columns(schema)
    images = [r.image for r in rows]
    if converted:
        arrays = [pa.array([image[i] for image in images], c.arrow_type) for i, c in enumerate(columns)]
        batch = pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(columns))
    else:
        batch = rows_to_record_batch(columns, images)
    table = pa.Table.from_batches([batch])
    values: dict[str, list[Any]] = {
        OP: [r.op for r in rows],
        SEQ: [r.seq for r in rows],
        POSITION: [r.position for r in rows],
        GTID: [r.gtid for r in rows],
        COMMIT_TS: [r.commit_time * 1_000_000 for r in rows],
    }
    for name, _, arrow_type, nullable in META_COLUMNS:
        array = pa.array(values[name], pa.int64()).cast(arrow_type) if name == COMMIT_TS else pa.array(values[name])
        table = table.append_column(pa.field(name, arrow_type, nullable=nullable), array)
    return table


def with_acted_rows(
    schema: TableSchema,
    changelog: pa.Table | None,
    acted: Sequence[ActedRow],
    origins: Mapping[BinlogPosition, tuple[str | None, int]],
) -> pa.Table:
    """A batch's changelog rows (`changelog_arrow`, or None) and the rows of what foreign key actions did to target
    rows the batch does not change (`act_on_target`): -D, or -U and +U, at the parent's row event, with its
    transaction's GTID and commit time (`origins`)."""
    rows = changelog_rows(
        SourceChange(
            a.action.position.file,
            a.action.position.file_number,
            a.action.position.pos,
            a.action.row_index,
            a.before,
            a.after,
            *origins[a.action.position],
        )
        for a in acted
    )
    more = changelog_arrow(schema, rows, converted=True)
    return more if changelog is None else pa.concat_tables([changelog, more.cast(changelog.schema)])


def append_changelog(
    spark: Any,
    table: str,
    rows: pa.Table,
    pipeline: str,
    end: Watermark,
    read_offset: Callable[[], BinlogPosition | None],
) -> bool:
    """Append one batch's changelog rows (`changelog_arrow`); False when the table already holds the batch.

    Appends never conflict with other writers in Iceberg (the commit is retried by Iceberg itself), so
    the only check is whether an earlier attempt, whose outcome was unknown, committed already.
    """
    done = read_offset()
    if done is not None and done >= end.position:
        return False
    frame = spark.createDataFrame(rows)
    (
        frame.writeTo(table)
        .option(f"snapshot-property.{SUMMARY_PIPELINE}", pipeline)
        .option(f"snapshot-property.{SUMMARY_STREAM_OFFSET}", offset_summary(end))
        .append()
    )
    return True
