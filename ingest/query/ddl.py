"""DDL statements the binlog phase follows (`follow_ddl`): a target's schema evolved with its added columns'
defaults backfilled, a TRUNCATE turned into one commit deleting every row, a dropped or renamed-away table's capture
ended. Each step looks at the target before acting, so a crash anywhere in between replays the statement once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors
from pyiceberg.exceptions import NoSuchTableError

from ingest import metrics
from ingest.config import Targets
from ingest.faults import crash_point
from ingest.model.changes import DdlStatement
from ingest.model.columns import quote_identifier
from ingest.model.position import Watermark
from ingest.model.schema import TableSchema, quote
from ingest.query.batch import Streaming, TableStream
from ingest.query.commit import committed_in, table_cut
from ingest.query.start import StreamStart
from ingest.sink.catalog import cached_pyiceberg_catalog
from ingest.sink.evolution import (
    SOURCE_SCHEMA_PROPERTY,
    SchemaPlan,
    apply_plan,
    backfill,
    computed_per_row,
    default_kind,
    iceberg_columns,
    implicit_default,
    plan_schema_change,
    schema_from_json,
    spark_string,
    store_source_schema,
)
from ingest.sink.merge import stream_offset_properties
from ingest.sink.targets import (
    PARTITIONS_PROPERTY,
    delete_every_row,
    delete_where,
    qualified,
    row_identity,
    store_partitions,
    table_of,
)
from ingest.source.binlog.partitions import (
    PartitionLayout,
    after_statement,
    partition_statement,
    read_layout,
    removed_rows,
)
from ingest.source.binlog.reader import BinlogReader, SchemaChangeError, ddl_between
from ingest.source.binlog.schema_after import schema_after
from ingest.source.binlog.schema_statements import FOLLOWED
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Following:
    """What following a DDL statement works with: the session that writes the targets, the binlog phase's settings,
    and a connection to the source (of `flavor`)."""

    spark: Any
    streaming: Streaming
    conn: Any
    flavor: str


def follow_ddl(
    following: Following, state: StateTable, begin: StreamStart, ddl: DdlStatement, reader: BinlogReader | None
) -> list[str]:
    """Follow `ddl` on every table it touches, then record its end as the job's offset (every change before it
    is committed by then). Returns the tables to copy again (`stream.on_unfollowable: recopy`), whose capture
    ends here: a request to copy each again is recorded before the offset, so a restart copies them too."""
    recopy: list[str] = []
    for db, t in ddl.tables:
        table = begin.by_id[f"{db}.{t}"]
        try:
            if ddl.kind not in FOLLOWED:
                raise SchemaChangeError(
                    f"{table.schema.table_id}: replaced at binlog position {ddl.end} ({ddl.query[:200]!r}), a change "
                    "no schema change can mirror"
                )
            if ddl.kind == "drop":
                end_capture(following, table, ddl)
                state.forget(table.schema.table_id)  # a restart before the offset takes it as gone (gone_tables)
            elif ddl.kind == "partition":
                remove_partition_rows(following, table, ddl, begin.here)
                continue
            else:
                evolve_table(following, table, ddl, reader, begin.here)
                continue
        except SchemaChangeError as e:
            if following.streaming.stream.on_unfollowable != "recopy":
                raise
            log.warning("%s. With `stream.on_unfollowable: recopy` it is copied again; the other tables stream on", e)
            state.ask_snapshot([table.schema.table_id], again=True)
            recopy.append(table.schema.table_id)
        if reader is not None:
            reader.forget((db, t))
        begin.tables.remove(table)
        del begin.by_id[table.schema.table_id], begin.filters[table.schema.table_id]
    crash_point("stream.before_schema_state")
    for db, t in ddl.tables:  # evolved, backfilled or truncated: their snapshots are looked up for the cut
        if (kept := begin.by_id.get(f"{db}.{t}")) is not None:
            kept.forget_heads()
    cut = table_cut(following.streaming.targets, begin.by_id, ddl.end)
    state.record_offset(Watermark(ddl.end, ddl.gtid_after, begin.here), cut=cut)
    metrics.current().offset_committed(ddl.end, None)
    return recopy


SOURCE_DROPPED_PROPERTY = "ingest.source-dropped"
"""Table property of a target kept after its source table was dropped or renamed away: the statement's position."""


def end_capture(following: Following, table: TableStream, ddl: DdlStatement) -> None:
    """The table was dropped or renamed away: by `stream.on_drop_table`, its target is kept as it was at the
    statement (marked with SOURCE_DROPPED_PROPERTY) or dropped. Either step can be run again after a crash."""
    spark, streaming = following.spark, following.streaming
    target = table_of(table.target)
    if streaming.stream.on_drop_table == "drop":
        spark.sql(f"DROP TABLE IF EXISTS {target}")
        done = f"its target {target} dropped"
    else:
        spark.sql(
            f"ALTER TABLE {target} SET TBLPROPERTIES ({spark_string(SOURCE_DROPPED_PROPERTY)} = "
            f"{spark_string(str(ddl.end))})"
        )
        done = f"its target {target} kept as it was"
    crash_point("stream.after_end_capture")
    log.info(
        "%s: dropped or renamed away at %s (%r): capture ended, %s",
        table.schema.table_id,
        ddl.end,
        ddl.query[:200],
        done,
    )


def gone_tables(streaming: Streaming, state: StateTable, found: Sequence[TableSchema]) -> list[TableSchema]:
    """Tables the job captures that are no longer on the source: dropped or renamed away while no job ran (or
    before the job recorded it had followed that). Their changes up to that statement are read with the schema
    their target mirrors, and the statement ends their capture (`end_capture`)."""
    catalog = cached_pyiceberg_catalog(streaming.targets.sink)
    present = {s.table_id for s in found}
    gone = []
    for table_id in state.tables():
        db, name = table_id.split(".", 1)
        if table_id in present or not streaming.tables.matches(db, name):
            continue  # there, or left out of the pipeline by its patterns (its target is left as it is)
        try:
            target = catalog.load_table(streaming.targets.target_for(db, name))
        except NoSuchTableError:
            continue  # dropped by `on_drop_table: drop`
        if SOURCE_DROPPED_PROPERTY in target.properties or SOURCE_SCHEMA_PROPERTY not in target.properties:
            continue
        log.info(
            "%s: gone from the source: its changes up to its DROP or RENAME are read with its target's schema", table_id
        )
        gone.append(schema_from_json(db, name, target.properties[SOURCE_SCHEMA_PROPERTY]))
    return gone


def _refuse_during_snapshot(
    table: TableStream, ddl: DdlStatement, what: str = "its schema changed", why: str = "lack the change"
) -> None:
    """A chunk whose high watermark is past the statement may have been read after it: for an ALTER, with the
    columns the snapshot started with (the binlog drops that chunk's later changes as contained in it, so the new
    columns' values of its rows would be lost, or a widened value fail the write); for a statement that removes rows
    without logging them, holding rows it must not remove. Refused, never guessed."""
    last_read = table.last_read
    if last_read is not None and last_read > ddl.start:
        raise SchemaChangeError(
            f"{table.schema.table_id}: {what} during its snapshot, at binlog position {ddl.end} "
            f"({ddl.query[:200]!r}), before the high watermark {last_read} of its last chunk: chunks read after "
            f"the statement {why}. Everything before it is committed. Re-snapshot the table: "
            f"`ingest resnapshot --config ... --table {table.schema.table_id}`, then `ingest run`"
        )


def evolve_table(
    following: Following, table: TableStream, ddl: DdlStatement, reader: BinlogReader | None, here: int | None = None
) -> None:
    """Follow one ALTER TABLE: evolve the target, backfill added columns' defaults, decode with the new schema.

    Exactly once across a crash at any point: every step looks at the target before acting (a column that
    exists is not added again, a type already wide is not altered), the backfill runs only while the target
    holds nothing newer than the DDL and its commit records the DDL's position as the table's offset, and
    the source schema the target mirrors is stored last, so a restart replays the DDL with the old one.
    `reader` (None when another process reads the binlog) is told to decode later rows with the new schema.
    """
    spark, streaming, conn, flavor = following.spark, following.streaming, following.conn, following.flavor
    old = table.schema
    if ddl.kind == "truncate":
        truncate_table(following, table, ddl, here)
        return
    live = schema_after(
        streaming.source, streaming.targets.options_for(old.database, old.table), conn, flavor, old, ddl
    )
    said = ddl.said
    if said is not None and said.reads_again:
        raise _values_not_derived(old, ddl, said.reads_again)
    renamed, dropped = (None, ()) if said is None else (said.renamed, said.dropped)
    plan = plan_schema_change(old, live, ddl.query, str(ddl.end), renamed, dropped, said is not None and said.strict)
    _refuse_partition_source_change(table, plan, ddl)
    if not plan.empty:
        _refuse_during_snapshot(table, ddl)
    if said is not None and said.numbered:
        _refuse_numbered(spark, table, ddl, [renamed_back(said.renamed, n) for n in said.numbered])
    values = _old_row_values(conn, flavor, live, plan, ddl)
    done = apply_plan(spark, table_of(table.target), old.table_id, plan)  # the schema is table-wide
    if table.changelog is not None:
        # Its rows are written with the columns of their moment: it follows the same renames, drops and additions
        # (a dropped column's history stays in the snapshots before the drop), with no backfill of old changes.
        done += apply_plan(spark, qualified(streaming.targets, *table.changelog), old.table_id, plan)
    crash_point("stream.after_schema_change")
    if values:
        props = _statement_commit(streaming.targets, table, ddl, here)
        if props is not None:
            backfill(spark, table.target, old.table_id, values, live.columns, props)
            done.append(f"backfill of {sorted(values)}")
            table.committed = ddl.end
    crash_point("stream.after_backfill")
    _follow_partitions(following, table, ddl)
    store_source_schema(spark, table_of(table.target), live)
    table.schema = live
    if reader is not None:
        reader.set_schema(live)
    log.info("%s: followed the schema change at %s: %s", old.table_id, ddl.end, "; ".join(done) or "nothing to do")


def _values_not_derived(schema: TableSchema, ddl: DdlStatement, reasons: Sequence[str]) -> SchemaChangeError:
    """The error for an ALTER whose old rows' values the server computed itself (`ingest.source.binlog.alter_rule`)."""
    return SchemaChangeError(
        f"{schema.table_id}: the ALTER at binlog position {ddl.end} ({ddl.query[:200]!r}) gave old rows values the "
        f"binlog does not hold: {'; '.join(reasons)}. Everything before it is committed. Set "
        "`stream.on_unfollowable: recopy` to read the table again while the others stream, or snapshot it again "
        f"(`ingest resnapshot --config ... --table {schema.table_id}`)"
    )


def renamed_back(renamed: Mapping[str, str], name: str) -> str:
    """A column's name before the statement that renamed it (`renamed`: old -> new)."""
    return next((old for old, new in renamed.items() if new == name), name)


def _refuse_numbered(spark: Any, table: TableStream, ddl: DdlStatement, columns: Sequence[str]) -> None:
    """Columns made AUTO_INCREMENT: the server numbered the old rows holding 0 or NULL in them and logged nothing.
    The target holds the rows as they were right before the statement, so it says whether there were any."""
    target = table_of(table.target)
    existing = iceberg_columns(spark, target)
    for name in columns:
        if name not in existing:
            continue
        column = quote_identifier(name)
        found = spark.sql(f"SELECT count(*) FROM {target} WHERE {column} = 0 OR {column} IS NULL").collect()[0][0]
        if found:
            raise _values_not_derived(
                table.schema,
                ddl,
                [f"column {name!r} is made AUTO_INCREMENT and {found} old row(s) held 0 or NULL in it, which the "
                 "server numbered"],
            )  # fmt: skip


def _refuse_partition_source_change(table: TableStream, plan: SchemaPlan, ddl: DdlStatement) -> None:
    """A column the target's partition spec takes values from is neither dropped nor renamed: Iceberg keeps the
    spec by field id, but `partition_by` names it, and the next start would not find it."""
    touched = sorted(set(table.partition_columns) & {*plan.dropped, *(old for old, _ in plan.renamed)})
    if touched:
        raise SchemaChangeError(
            f"{table.schema.table_id}: the DDL at {ddl.end} ({ddl.query[:200]!r}) drops or renames {touched}, which "
            "the target is partitioned by (`table_options.<table>.partition_by`). Everything before it is "
            "committed. Change `partition_by` and snapshot the table again: `ingest resnapshot --config ... "
            f"--table {table.schema.table_id}`"
        )


def truncate_table(following: Following, table: TableStream, ddl: DdlStatement, here: int | None = None) -> None:
    """Follow a TRUNCATE: every row of the target is deleted in one commit carrying the statement's end as its
    offset (Iceberg drops whole files, a metadata-only commit). A target that holds it already is left alone."""
    _refuse_during_snapshot(table, ddl, "it was truncated", "hold rows the truncate must not delete")
    props = _statement_commit(following.streaming.targets, table, ddl, here)
    if props is None:
        return
    delete_every_row(following.spark, table.target, props)
    table.committed = ddl.end
    crash_point("stream.after_truncate")
    log.info("%s: followed the TRUNCATE at %s: every row of the target deleted", table.schema.table_id, ddl.end)


def remove_partition_rows(following: Following, table: TableStream, ddl: DdlStatement, here: int | None = None) -> None:
    """Follow a DROP or TRUNCATE PARTITION, which logs no row events: the rows of those partitions, by the bounds
    the job kept for the table (ingest.source.binlog.partitions), are deleted from the target in one commit carrying the
    statement's end as its offset; then the kept bounds follow the statement. Any other partition statement that
    moves rows (EXCHANGE, CONVERT, DISCARD or IMPORT TABLESPACE), or bounds not kept, stop by name."""
    spark, streaming, schema = following.spark, following.streaming, table.schema
    found = partition_statement(ddl.query)
    if found is None:
        raise SchemaChangeError(
            f"{schema.table_id}: the statement at binlog position {ddl.end} ({ddl.query[:200]!r}) moves rows between "
            "tables, partitions or tablespaces without logging them, and the job does not know which"
        )
    layout = _kept_partitions(streaming.targets, schema)
    if layout is None and found[0] == "truncate":
        layout = _partitions_now(following, schema, ddl)  # a TRUNCATE leaves the bounds as they were
    if layout is None:
        raise SchemaChangeError(
            f"{schema.table_id}: the statement at binlog position {ddl.end} ({ddl.query[:200]!r}) removes the rows "
            "of whole partitions without logging them, and the job did not keep the table's partition bounds (its "
            "target was copied before the job kept them, or a partition statement it could not follow came since)"
        )
    _refuse_during_snapshot(table, ddl, "partitions were dropped or truncated", "hold rows it must not delete")
    props = _statement_commit(streaming.targets, table, ddl, here)
    if props is not None:
        try:
            where = removed_rows(layout, found[1], lambda column: f"t.{quote_identifier(column)}")
        except ValueError as e:
            raise SchemaChangeError(
                f"{schema.table_id}: the statement at binlog position {ddl.end} ({ddl.query[:200]!r}) removes the "
                f"rows of whole partitions without logging them, and the job cannot tell which: {e}"
            ) from None
        delete_where(spark, table.target, row_identity(schema), where, props)
        table.committed = ddl.end
    crash_point("stream.after_partition_delete")
    store_partitions(spark, table_of(table.target), after_statement(layout, ddl.query))
    log.info("%s: followed the partition statement at %s: %s", schema.table_id, ddl.end, ddl.query[:200])


def _partitions_now(following: Following, schema: TableSchema, ddl: DdlStatement) -> PartitionLayout | None:
    """The server's partitions now, when no partition statement on the table came after `ddl`: they are then the
    bounds right after it (None otherwise)."""
    conn = following.conn
    end = read_watermark(conn, following.flavor).position  # read before the layout: a later statement is in the range
    later = ddl_between(following.streaming.source, [(schema.database, schema.table)], ddl.end, end)
    if any(re.search(r"\bPARTITION", query, re.I) for _, query, _ in later):
        return None
    return read_layout(conn, schema.database, schema.table)


def _kept_partitions(targets: Targets, schema: TableSchema) -> PartitionLayout | None:
    target = cached_pyiceberg_catalog(targets.sink).load_table(targets.target_for(schema.database, schema.table))
    kept = target.properties.get(PARTITIONS_PROPERTY)
    return None if kept is None else PartitionLayout.from_json(kept)


def _follow_partitions(following: Following, table: TableStream, ddl: DdlStatement) -> None:
    """Carry the partition bounds the job keeps through an ALTER that may change partitions (ADD PARTITION adds
    bounds; any other partition clause makes them unknown)."""
    if not re.search(r"\bPARTITION", ddl.query, re.I):
        return
    kept = _kept_partitions(following.streaming.targets, table.schema)
    after = after_statement(kept, ddl.query)
    if after != kept:
        store_partitions(following.spark, table_of(table.target), after)


def _statement_commit(
    targets: Targets, table: TableStream, ddl: DdlStatement, here: int | None
) -> dict[str, str] | None:
    """The snapshot properties of the one commit that applies `ddl` to the target's rows (a backfill, a TRUNCATE):
    the statement's end as the table's offset, and SUMMARY_SCHEMA_CHANGE. None when the target holds it already
    (the commit was made before a crash)."""
    mark = Watermark(ddl.end, ddl.gtid_after, here)
    held = committed_in(targets, targets.target_for(table.schema.database, table.schema.table), mark, table.committed)
    if held is not None and held >= ddl.end:
        return None
    return {**stream_offset_properties(targets.pipeline, mark), SUMMARY_SCHEMA_CHANGE: str(ddl.end)}


SUMMARY_SCHEMA_CHANGE = "ingest.schema-change"
"""Snapshot summary key of a default backfill: the binlog position of its DDL."""


def _old_row_values(conn: Any, flavor: str, schema: TableSchema, plan: SchemaPlan, ddl: DdlStatement) -> dict[str, Any]:
    """The value MySQL gave rows that existed before the DDL, per added column (NULL ones left out).

    Old rows get no binlog events, so a constant default is read back from the server (`DEFAULT(col)`, in
    the driver's form) and backfilled. A non-constant default (CURRENT_TIMESTAMP, an expression) was
    evaluated during the ALTER and is not in the binlog: refused rather than guessed.
    """
    if not plan.added:
        return {}
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(
            "SELECT COLUMN_NAME, COLUMN_DEFAULT, EXTRA FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (schema.database, schema.table),
        )
        info = {str(r["COLUMN_NAME"]): r for r in cur.fetchall()}
    values: dict[str, Any] = {}
    for added in plan.added:
        col = added.column
        row = info.get(col.name)
        if row is None:  # renamed by a later statement (ingest.source.binlog.schema_history)
            raise SchemaChangeError(
                f"{schema.table_id}: the DDL at {ddl.end} ({ddl.query[:200]!r}) adds column {col.name!r}, which a "
                "later statement renamed: its value in existing rows is read from the server by its name. Snapshot the "
                f"table again (`ingest resnapshot --config ... --table {schema.table_id}`)"
            )
        extra = str(row["EXTRA"] or "")
        if computed := computed_per_row(extra):
            raise _values_not_derived(schema, ddl, [f"column {col.name!r} is added {computed}"])
        default = None if row["COLUMN_DEFAULT"] is None else str(row["COLUMN_DEFAULT"])
        kind = default_kind(flavor, col, default, extra)
        if kind == "null":
            continue
        if kind == "implicit":
            values[col.name] = implicit_default(col)
            if values[col.name] is None:
                kind = "expression"
        if kind == "expression":
            what = f"DEFAULT {default}" if default else f"the implicit default of {col.column_type}"
            raise SchemaChangeError(
                f"{schema.table_id}: the DDL at {ddl.end} ({ddl.query[:200]!r}) adds column {col.name!r} whose value "
                f"in existing rows ({what}) "
                "was computed by the server during the ALTER and is not in the binlog. Re-snapshot the table, or "
                "add such columns as NULL (or with a constant default) and fill them with an UPDATE"
            )
        if kind == "constant":
            with conn.cursor() as cur:
                cur.execute(f"SELECT DEFAULT({quote(col.name)}) FROM {schema.quoted} LIMIT 1")
                found = cur.fetchone()
            if found is None:
                continue  # the table is empty now: every old row is deleted by a later event anyway
            values[col.name] = found[0]
    return {k: v for k, v in values.items() if v is not None}
