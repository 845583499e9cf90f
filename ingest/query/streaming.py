"""The binlog phase's commit side, which the job's query (`ingest.query.structured`) drives: where a phase starts
(`prepare`: each table's committed offset, the chunk high watermarks), DDL statements followed (`follow_ddl`:
targets evolved, truncated, ended), and a batch committed (`commit_prepared`): per table its target MERGEd
with the batch's end offset in its snapshot summary (then its changelog appended, tagged the same way), then
the offset recorded in the state table. A crash anywhere in between replays the batch; each target and each
changelog skips what it already committed.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors
from pyiceberg.exceptions import NoSuchTableError

from ingest import metrics
from ingest.config import PipelineConfig
from ingest.faults import crash_point
from ingest.model.changes import DdlStatement
from ingest.model.position import BinlogPosition, MariadbGtidPos, Watermark
from ingest.model.schema import TableSchema, quote
from ingest.query.batch import HighWatermarkFilter, TableBatch, TableStream
from ingest.sink.catalog import cached_pyiceberg_catalog
from ingest.sink.changelog import append_changelog
from ingest.sink.evolution import (
    SOURCE_SCHEMA_PROPERTY,
    SchemaPlan,
    apply_plan,
    backfill,
    default_kind,
    implicit_default,
    plan_schema_change,
    schema_from_json,
    spark_string,
    store_source_schema,
)
from ingest.sink.maintenance import commits_since_compaction, maintain
from ingest.sink.merge import committed_offset, merge_arrow, stream_history, stream_offset_properties
from ingest.sink.rejected import ensure_rejected, merge_rejected
from ingest.sink.summary import snapshot_properties
from ingest.sink.targets import (
    copy_under_way,
    delete_every_row,
    on_copy_branch,
    partition_source_columns,
    qualified,
    table_of,
)
from ingest.source.binlog import FOLLOWED, BinlogReader, SchemaChangeError, check_not_purged
from ingest.source.failover import gtid_at, server_id, to_this_server
from ingest.source.schema_after import schema_after
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable

log = logging.getLogger(__name__)


def _table_streams(
    config: PipelineConfig,
    state: StateTable,
    schemas: Sequence[TableSchema],
    recorded: Watermark | None,
    conn: Any,
    flavor: str,
) -> tuple[list[TableStream], BinlogPosition | None]:
    """What each table holds, and the job's recorded offset, as positions of the server read now.

    Points recorded on another server (before a failover) are found again by their GTIDs, all at once.
    """
    catalog = cached_pyiceberg_catalog(config.sink)
    found: list[tuple[TableStream, list[Watermark | None], Watermark | None, Watermark | None, Watermark | None]] = []
    for schema in schemas:
        done = state.done(schema.table_id)
        plan = state.plan(schema.table_id) or []
        # A chunk not read yet (a snapshot asked of the running job) has none.
        highs = [record.high_watermark if (record := done.get(chunk.index)) else None for chunk in plan]
        namespace, name = config.target_for(schema.database, schema.table)
        table = catalog.load_table((namespace, name))
        stored = table.properties.get(SOURCE_SCHEMA_PROPERTY)
        if stored and config.stream.on_schema_change != "ignore":
            # Rows between the committed offset and a DDL not yet followed were written with the schema the
            # target mirrors, not with the live one (which may already be past that DDL).
            schema = schema_from_json(schema.database, schema.table, stored)
        changelog = config.changelog_for(schema.database, schema.table)
        log_table = None if changelog is None else catalog.load_table(changelog)
        logged = None if log_table is None else committed_offset(log_table, config.name)
        history = stream_history(table, config.name)
        target = qualified(config, namespace, name)
        if copy_under_way(table):  # copied again: written to its branch, main left to readers until the swap
            target = on_copy_branch(target)
        stream = TableStream(schema, target, plan, [], None, changelog)
        stream.committed_known = history.complete
        stream.partition_columns = partition_source_columns(table, schema)
        every = config.sink.maintenance.every_commits
        stream.since_compaction[stream.target] = commits_since_compaction(table, every)
        if changelog is not None and log_table is not None:
            stream.since_compaction[qualified(config, *changelog)] = commits_since_compaction(log_table, every)
        found.append((stream, highs, history.offset, logged, state.planned_at(schema.table_id)))
    marks = [recorded, *(m for _, highs, *others in found for m in (*highs, *others))]
    points = [m for m in marks if m is not None]
    here = dict(zip(map(id, points), to_this_server(conn, config.source, flavor, points), strict=True))

    def at(mark: Watermark | None) -> BinlogPosition | None:
        return None if mark is None else here[id(mark)]

    for stream, highs, held, logged, planned in found:
        stream.chunk_highs = [at(h) for h in highs]
        stream.committed, stream.changelog_committed, stream.planned_at = at(held), at(logged), at(planned)
    return [stream for stream, *_ in found], at(recorded)


def _resume_at(tables: Sequence[TableStream], recorded: BinlogPosition | None) -> BinlogPosition | None:
    """Where the binlog phase starts: the earliest point some table still needs.

    Every table holds what the job's recorded offset says, and what its chunks hold: every change up to its
    lowest chunk high watermark. So a table snapshotted again (`ingest resnapshot`) does not make the job read
    from an older offset, and once every table was, the job starts at their new chunks even if the old
    offset's binlog is purged. A table's own committed offset is not used even when it is further: a crash
    inside a schema change step leaves the target committed past its DDL while the schema it decodes with is
    still the old one, so the DDL must be read again; changes a target already holds are skipped per table.
    """
    needed = [t.min_high if recorded is None else max(recorded, t.min_high) for t in tables if t.min_high is not None]
    # With no chunk read yet (snapshots asked of the running job), the chunks will hold every change up to when
    # they are read: the recorded offset, or else any point from now on, is as good as another.
    return min(needed) if needed else recorded


class StopSignal:
    """SIGTERM/SIGINT ask for a stop after the current commit (graceful, never mid-batch)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, lambda *_: self.event.set())

    def uninstall(self) -> None:
        """Give the process its own handlers back (the job may run inside a longer-lived process)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


@dataclass
class StreamStart:
    """Where the binlog phase starts and what each table holds there: what the query begins with."""

    tables: list[TableStream]
    by_id: dict[str, TableStream]
    filters: dict[str, HighWatermarkFilter]
    start: BinlogPosition
    start_gtid: MariadbGtidPos | None
    """MariaDB's GTID position at `start` (None for MySQL)."""
    here: int | None
    """The server id of the source read now."""
    goal: BinlogPosition | None
    """With "stop when caught up": the binlog end when the phase started."""

    @property
    def contained_until(self) -> dict[tuple[str, str], BinlogPosition]:
        """Per table, the position up to which its chunks hold every change (see BinlogReader)."""
        return {
            (t.schema.database, t.schema.table): until for t in self.tables if (until := t.contained_until) is not None
        }

    @property
    def planned_at(self) -> dict[tuple[str, str], BinlogPosition]:
        """Per table, a position before its snapshot's schema was loaded (see BinlogReader)."""
        return {(t.schema.database, t.schema.table): at for t in self.tables if (at := t.planned_at) is not None}

    @property
    def mark(self) -> Watermark:
        return Watermark(self.start, self.start_gtid, self.here)


def prepare(
    config: PipelineConfig,
    state: StateTable,
    schemas: Sequence[TableSchema],
    conn: Any,
    flavor: str,
    until_caught_up: bool,
) -> StreamStart:
    """Read what every table and the state table hold, and where on the server read now that is."""
    recorded = state.stream_offset()
    tables, resumed = _table_streams(config, state, schemas, recorded, conn, flavor)
    start = _resume_at(tables, resumed) or read_watermark(conn, flavor).position
    check_not_purged(conn, start)
    here = server_id(conn)
    start_gtid: MariadbGtidPos | None = None
    if flavor == "mariadb":
        # The recorded offset's own GTIDs when it is this server's point; else the server maps the point.
        exact = recorded is not None and recorded.server_id == here and recorded.position == start
        known = recorded.gtid if recorded is not None and exact else None
        start_gtid = known if isinstance(known, MariadbGtidPos) else gtid_at(conn, start)
    goal = read_watermark(conn, flavor).position if until_caught_up else None
    by_id = {t.schema.table_id: t for t in tables}
    filters = {t.schema.table_id: HighWatermarkFilter(conn, t) for t in tables}
    metrics.current().offset_committed(start, state.offset_source_time())
    log.info("binlog phase from %s%s", start, f" until {goal}" if goal else "")
    return StreamStart(tables, by_id, filters, start, start_gtid, here, goal)


def follow_ddl(
    spark: Any,
    config: PipelineConfig,
    state: StateTable,
    conn: Any,
    flavor: str,
    begin: StreamStart,
    ddl: DdlStatement,
    reader: BinlogReader | None,
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
                end_capture(spark, config, table, ddl)
                state.forget(table.schema.table_id)  # a restart before the offset takes it as gone (gone_tables)
            else:
                evolve_table(spark, config, conn, flavor, table, ddl, reader, begin.here)
                continue
        except SchemaChangeError as e:
            if config.stream.on_unfollowable != "recopy":
                raise
            log.warning("%s. With `stream.on_unfollowable: recopy` it is copied again; the other tables stream on", e)
            state.ask_snapshot([table.schema.table_id], again=True)
            recopy.append(table.schema.table_id)
        if reader is not None:
            reader.forget((db, t))
        begin.tables.remove(table)
        del begin.by_id[table.schema.table_id], begin.filters[table.schema.table_id]
    crash_point("stream.before_schema_state")
    state.record_offset(Watermark(ddl.end, ddl.gtid_after, begin.here))
    metrics.current().offset_committed(ddl.end, None)
    return recopy


SOURCE_DROPPED_PROPERTY = "ingest.source-dropped"
"""Table property of a target kept after its source table was dropped or renamed away: the statement's position."""


def end_capture(spark: Any, config: PipelineConfig, table: TableStream, ddl: DdlStatement) -> None:
    """The table was dropped or renamed away: by `stream.on_drop_table`, its target is kept as it was at the
    statement (marked with SOURCE_DROPPED_PROPERTY) or dropped. Either step can be run again after a crash."""
    target = table_of(table.target)
    if config.stream.on_drop_table == "drop":
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


def gone_tables(config: PipelineConfig, state: StateTable, found: Sequence[TableSchema]) -> list[TableSchema]:
    """Tables the job captures that are no longer on the source: dropped or renamed away while no job ran (or
    before the job recorded it had followed that). Their changes up to that statement are read with the schema
    their target mirrors, and the statement ends their capture (`end_capture`)."""
    catalog = cached_pyiceberg_catalog(config.sink)
    present = {s.table_id for s in found}
    gone = []
    for table_id in state.tables():
        db, name = table_id.split(".", 1)
        if table_id in present or not config.tables.matches(db, name):
            continue  # there, or left out of the pipeline by its patterns (its target is left as it is)
        try:
            target = catalog.load_table(config.target_for(db, name))
        except NoSuchTableError:
            continue  # dropped by `on_drop_table: drop`
        if SOURCE_DROPPED_PROPERTY in target.properties or SOURCE_SCHEMA_PROPERTY not in target.properties:
            continue
        log.info(
            "%s: gone from the source: its changes up to its DROP or RENAME are read with its target's schema", table_id
        )
        gone.append(schema_from_json(db, name, target.properties[SOURCE_SCHEMA_PROPERTY]))
    return gone


def batch_source_time(previous: int | None, last_commit: int | None, idle_at: float | None) -> int | None:
    """When the source was at a batch's end: at the idle report's time when the batch ends on one, else at its
    last transaction's commit, else as before it."""
    if idle_at is not None:
        return int(idle_at)
    return previous if last_commit is None else last_commit


def evolve_table(
    spark: Any,
    config: PipelineConfig,
    conn: Any,
    flavor: str,
    table: TableStream,
    ddl: DdlStatement,
    reader: BinlogReader | None,
    here: int | None = None,
) -> None:
    """Follow one ALTER TABLE: evolve the target, backfill added columns' defaults, decode with the new schema.

    Exactly once across a crash at any point: every step looks at the target before acting (a column that
    exists is not added again, a type already wide is not altered), the backfill runs only while the target
    holds nothing newer than the DDL and its commit records the DDL's position as the table's offset, and
    the source schema the target mirrors is stored last, so a restart replays the DDL with the old one.
    `reader` (None when another process reads the binlog) is told to decode later rows with the new schema.
    """
    old = table.schema
    if ddl.kind == "truncate":
        truncate_table(spark, config, table, ddl, here)
        return
    live = schema_after(config, conn, flavor, old, ddl)
    said = ddl.said
    renamed, dropped = (None, ()) if said is None else (said.renamed, said.dropped)
    plan = plan_schema_change(old, live, ddl.query, str(ddl.end), renamed, dropped)
    _refuse_partition_source_change(table, plan, ddl)
    last_read = table.last_read
    if not plan.empty and last_read is not None and last_read > ddl.start:
        # A chunk whose high watermark is past the statement may have been read after it, with the columns the
        # snapshot started with: the binlog drops that chunk's later changes as contained in it, so the new
        # columns' values of its rows would be lost (or a widened value fail the write). Refused, never guessed.
        raise SchemaChangeError(
            f"{old.table_id}: its schema changed during its snapshot, at binlog position {ddl.end} "
            f"({ddl.query[:200]!r}), before the high watermark {last_read} of its last chunk: chunks read after "
            f"the statement lack the change. Everything before it is committed. Re-snapshot the table: "
            f"`ingest resnapshot --config ... --table {old.table_id}`, then `ingest run`"
        )
    values = _old_row_values(conn, flavor, live, plan, ddl)
    done = apply_plan(spark, table_of(table.target), old.table_id, plan)  # the schema is table-wide
    if table.changelog is not None:
        # Its rows are written with the columns of their moment: it follows the same renames, drops and additions
        # (a dropped column's history stays in the snapshots before the drop), with no backfill of old changes.
        done += apply_plan(spark, qualified(config, *table.changelog), old.table_id, plan)
    crash_point("stream.after_schema_change")
    if values:
        props = _statement_commit(config, table, ddl, here)
        if props is not None:
            backfill(spark, table.target, old.table_id, values, live.columns, props)
            done.append(f"backfill of {sorted(values)}")
            table.committed = ddl.end
    crash_point("stream.after_backfill")
    store_source_schema(spark, table_of(table.target), live)
    table.schema = live
    if reader is not None:
        reader.set_schema(live)
    log.info("%s: followed the schema change at %s: %s", old.table_id, ddl.end, "; ".join(done) or "nothing to do")


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


def truncate_table(
    spark: Any, config: PipelineConfig, table: TableStream, ddl: DdlStatement, here: int | None = None
) -> None:
    """Follow a TRUNCATE: every row of the target is deleted in one commit carrying the statement's end as its
    offset (Iceberg drops whole files, a metadata-only commit). A target that holds it already is left alone."""
    last_read = table.last_read
    if last_read is not None and last_read > ddl.start:
        raise SchemaChangeError(
            f"{table.schema.table_id}: it was truncated during its snapshot, at binlog position {ddl.end}, before the "
            f"high watermark {last_read} of its last chunk: chunks read after the statement hold rows the "
            "truncate must not delete. Everything before it is committed. Re-snapshot the table: "
            f"`ingest resnapshot --config ... --table {table.schema.table_id}`, then `ingest run`"
        )
    props = _statement_commit(config, table, ddl, here)
    if props is None:
        return
    delete_every_row(spark, table.target, props)
    table.committed = ddl.end
    crash_point("stream.after_truncate")
    log.info("%s: followed the TRUNCATE at %s: every row of the target deleted", table.schema.table_id, ddl.end)


def _statement_commit(
    config: PipelineConfig, table: TableStream, ddl: DdlStatement, here: int | None
) -> dict[str, str] | None:
    """The snapshot properties of the one commit that applies `ddl` to the target's rows (a backfill, a TRUNCATE):
    the statement's end as the table's offset, and SUMMARY_SCHEMA_CHANGE. None when the target holds it already
    (the commit was made before a crash)."""
    mark = Watermark(ddl.end, ddl.gtid_after, here)
    held = _committed_in(config, config.target_for(table.schema.database, table.schema.table), mark, table.committed)
    if held is not None and held >= ddl.end:
        return None
    return {**stream_offset_properties(config.name, mark), SUMMARY_SCHEMA_CHANGE: str(ddl.end)}


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
        row = info[col.name]
        default = None if row["COLUMN_DEFAULT"] is None else str(row["COLUMN_DEFAULT"])
        kind = default_kind(flavor, col, default, str(row["EXTRA"] or ""))
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


STOP_GRACE_SECONDS = 10.0
"""How long a stop (SIGTERM) waits at most for the reader to catch up before the last commit."""


class StopPoint:
    """Where a stop asked by SIGTERM ends.

    At the first look after the signal the source's position is read: the stop comes once everything up to it
    is taken (a transaction or an idle heartbeat at or past it), and at the latest STOP_GRACE_SECONDS later,
    so that a job far behind does not hold the stop up.
    """

    def __init__(self, source_position: Callable[[], BinlogPosition]) -> None:
        self.deadline = time.monotonic() + STOP_GRACE_SECONDS
        self.position: BinlogPosition | None = None
        try:
            self.position = source_position()
            log.info("asked to stop: reading up to %s, the source's position now", self.position)
        except Exception as e:  # noqa: BLE001 - the source being gone must not turn a stop into a failure
            log.warning("asked to stop; cannot read the source's position (%s)", e)

    def reached(self, taken: BinlogPosition) -> bool:
        if self.position is not None and taken >= self.position:
            log.info("stopping: everything up to %s is read", self.position)
            return True
        if time.monotonic() >= self.deadline:
            log.info("stopping: %.0f s after the signal, before reaching %s", STOP_GRACE_SECONDS, self.position)
            return True
        return False


def commit_prepared(
    spark: Any,
    config: PipelineConfig,
    state: StateTable,
    tables: dict[str, TableStream],
    prepared: Sequence[TableBatch],
    end: Watermark,
    source_time: int | None = None,
    started: float | None = None,
) -> None:
    """Commit a batch made ready by `prepare_batch`: per table its rejected values, its target, its changelog
    (each skipped when it holds the batch already), all tagged with `end`; then `end` as the job's offset."""
    started = time.monotonic() if started is None else started

    def apply(part: TableBatch) -> bool:
        table = tables[part.table_id]
        merged = False
        if part.rejected:  # before the target: a target holding the batch implies its rejected rows are held
            name = ensure_rejected(spark, config, table.schema.database, table.schema.table)
            assert name is not None
            merge_rejected(spark, name, part.rejected)
            crash_point("stream.after_rejected_commit")
        if part.rows is not None:
            merged = _merge_table(spark, config, table, part, end)
            crash_point("stream.after_table_commit")
        if part.changelog is not None:
            crash_point("stream.before_changelog_commit")
            _append_changelog(spark, config, table, part.changelog, end)
            crash_point("stream.after_changelog_commit")
        return merged

    # Every commit of the batch, whatever its table, carries the same summary: set it once for all threads.
    with snapshot_properties(spark, stream_offset_properties(config.name, end)):
        workers = min(len(prepared), config.stream.concurrent_merges)
        if workers <= 1:
            results = [apply(part) for part in prepared]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="merge") as pool:
                futures = [pool.submit(apply, part) for part in prepared]
                wait(futures)
                results = [f.result() for f in futures]  # the first failure is raised; the state is not written
    crash_point("stream.before_state")
    state.record_offset(end, source_time)
    crash_point("stream.after_state")
    applied_to = {p.table_id: p.applied for p, ok in zip(prepared, results, strict=True) if ok and p.applied}
    metrics.current().batch_committed(applied_to, time.monotonic() - started, end.position, source_time)
    log.info(
        "binlog: committed %d changes to %d tables up to %s",
        sum(p.applied for p in prepared),
        sum(results),
        end.position,
    )
    _maintain_due(spark, config, [tables[p.table_id] for p in prepared], end)


def _maintain_due(spark: Any, config: PipelineConfig, tables: list[TableStream], end: Watermark) -> None:
    """Compact (and expire) each target and changelog table of the batch that reached its commit count."""
    every = config.sink.maintenance.every_commits
    if every == 0:
        return
    for table in tables:
        changelog = None if table.changelog is None else qualified(config, *table.changelog)
        for name, held in ((table.target, table.committed), (changelog, table.changelog_committed)):
            if name is None or held != end.position:
                continue  # no changelog, or nothing of this batch committed to it
            if name != table_of(name):
                continue  # copied into its branch: main is what readers see, and expiry must keep the branch
            table.since_compaction[name] = table.since_compaction.get(name, 0) + 1
            if table.since_compaction[name] >= every:
                maintain(spark, name, config.name, end, config.sink.maintenance)
                table.since_compaction[name] = 0


def _merge_table(spark: Any, config: PipelineConfig, table: TableStream, part: TableBatch, end: Watermark) -> bool:
    assert part.rows is not None
    attempts = 0

    def read_offset() -> BinlogPosition | None:
        # This run knows what the table holds (read from it at start, then kept by its own commits): only a
        # retry, after a commit of this very batch whose outcome was unknown, needs a look at the table.
        nonlocal attempts
        attempts += 1
        if attempts == 1 or (table.committed is not None and table.committed >= end.position):
            return table.committed
        return _committed_in(config, config.target_for(table.schema.database, table.schema.table), end, table.committed)

    done = merge_arrow(spark, table.target, table.schema, part.rows, part.where, end, read_offset, part.append)
    table.committed, table.committed_known = end.position, True
    return done


def _append_changelog(spark: Any, config: PipelineConfig, table: TableStream, rows: Any, end: Watermark) -> None:
    assert table.changelog is not None
    names = table.changelog
    attempts = 0

    def read_offset() -> BinlogPosition | None:
        nonlocal attempts  # as for the target: only a retry needs a look at the table
        attempts += 1
        done = table.changelog_committed
        if attempts == 1 or (done is not None and done >= end.position):
            return done
        return _committed_in(config, names, end, done)

    append_changelog(spark, qualified(config, *names), rows, config.name, end, read_offset)
    table.changelog_committed = end.position


def _committed_in(
    config: PipelineConfig, names: tuple[str, str], now: Watermark, known: BinlogPosition | None
) -> BinlogPosition | None:
    """The newest batch end the Iceberg table `names` holds, read from its current metadata.

    `now` is a point of this run (its server id is the server read now); `known` is what the table held at
    the start of the run, as a position of this server: a newest commit made on another server (before a
    failover) is that one, since a commit of this run would carry this server's id.
    """
    held = committed_offset(cached_pyiceberg_catalog(config.sink).load_table(names), config.name)
    if held is None or (held.server_id is not None and held.server_id != now.server_id):
        return known if held is not None else None
    return held.position
