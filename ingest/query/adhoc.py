"""Snapshots asked of a running job (`ingest snapshot`, MISSION.md seed 004): a table created after the job
started, or one to copy again, is copied while the binlog keeps flowing for every other table.

The request is a row in the state table (Iceberg, like all the job's state: nothing is written to MySQL).
The job's query looks for requests between batches, at most every `stream.signal_poll_seconds`. On one it
ends after the batch that found it; the job starts a table to copy again over (into a branch of its target
that readers do not see until the copy is complete, or by dropping it, see sink/recopy.py), splits the new
tables into chunks, and starts the query again from its committed offset, now with those tables, whose chunks
it reads in chunk batches between its binlog batches. Until a chunk is read, the query drops every change to
its keys: the chunk is read later and holds them. Once it is read, the query applies its keys' changes newer
than its high watermark (binlog_batch.HighWatermarkFilter). That is the Flink CDC 2.0 rule the snapshot
relies on. A crash anywhere resumes like any run: the next `ingest run` reads the chunks still unread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Literal

from ingest import metrics
from ingest.config import Targets
from ingest.faults import crash_point
from ingest.model.changes import TablesNamed
from ingest.model.position import Watermark
from ingest.model.schema import TableSchema
from ingest.query.batch import Streaming, TableStream
from ingest.query.snapshot import Copying, copy_chunks, finish_copy, plan_table
from ingest.query.stop import StopSignal
from ingest.query.structured import PhaseHooks, stream_structured
from ingest.sink.catalog import cached_pyiceberg_catalog
from ingest.sink.recopy import start_branch_copy
from ingest.sink.targets import check_targets, qualified, table_of
from ingest.source.discovery import discover
from ingest.source.mysql import connect, load_schema
from ingest.source.snapshot.chunk_reader import ChunkHook
from ingest.source.snapshot.chunks import Chunk
from ingest.source.snapshot.throttle import source_throttle
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable

log = logging.getLogger(__name__)


class SignalWatch:
    """Looks for requests in the state table at most every `every` seconds (a scan of its request rows)."""

    def __init__(self, state: StateTable, every: float) -> None:
        self.state = state
        self.every = every
        self.asked: dict[str, bool] = {}
        self.paused: frozenset[str] = state.requests().paused
        self._next = time.monotonic() + every

    def look(self) -> bool:
        """Whether a request to copy a table is waiting (looked up again once the interval has passed)."""
        if time.monotonic() >= self._next:
            self._next = time.monotonic() + self.every
            try:
                requests = self.state.requests()
            except Exception as e:  # noqa: BLE001 - a failed look must not fail a committed batch
                log.warning("could not look for snapshot requests (looking again later): %s", e)
            else:
                self.asked, self.paused = requests.snapshot, requests.paused
        return bool(self.asked)


def stream_taking_requests(
    spark: Any,
    streaming: Streaming,
    copying: Copying,
    state: StateTable,
    flavor: str,
    schemas: list[TableSchema],
    until_caught_up: bool,
    stop: StopSignal,
    hook: ChunkHook | None = None,
) -> list[TableSchema]:
    """The job's query, started again after each request with the tables it adds; return the tables of the last
    query. It reads the chunks of the tables added in chunk batches between its binlog batches."""
    watch = SignalWatch(state, streaming.stream.signal_poll_seconds)
    copy = LiveCopy(spark, copying, streaming.stream.on_schema_change != "ignore", state, flavor, hook)
    named: list[TablesNamed] = []
    recopied: list[str] = []
    while True:
        hooks = PhaseHooks(watch.look, named.append, recopied.extend, copy.copy, lambda: watch.paused)
        end = stream_structured(spark, streaming, state, schemas, flavor, until_caught_up, stop, hooks)
        log.info("binlog phase stopped at %s", end)
        if stop.event.is_set() or not (watch.asked or named or recopied):
            return schemas
        for item in named:
            log.info("%s: named by a DDL statement at %s", ", ".join(f"{d}.{t}" for d, t in item.tables), item.end)
        asked = {**watch.asked, **dict.fromkeys(recopied, True)}
        watch.asked, named[:], recopied[:] = {}, [], []
        with connect(streaming.source) as conn:
            before = read_watermark(conn, flavor)  # before the schemas are loaded (see plan_table)
        found = discover(streaming.source, streaming.tables, streaming.targets.table_options).schemas
        check_targets(streaming.targets, found)
        schemas = take_requests(spark, copying, state, flavor, schemas, found, asked, before)


def take_requests(
    spark: Any,
    copying: Copying,
    state: StateTable,
    flavor: str,
    running: Sequence[TableSchema],
    found: Sequence[TableSchema],
    asked: dict[str, bool],
    schemas_read_after: Watermark | None = None,
) -> list[TableSchema]:
    """Act on `asked` (table id: copy again?) between two binlog phases, or before the first; return the
    tables of the next phase: `running` plus any table of `found` (the tables the pipeline matches now) not
    captured yet, split into chunks (unread: the next phase reads them between its batches)."""
    by_id = {s.table_id: s for s in running}
    live = {s.table_id: s for s in found}
    for table_id, again in sorted(asked.items()):
        if table_id not in live:
            log.warning(
                "%s: asked to snapshot it, but the pipeline does not match it (or it is gone): request dropped",
                table_id,
            )
            state.drop_signals(table_id)
        elif again and state.plan(table_id) is not None:
            start_copy_again(spark, copying.targets, live[table_id])
            crash_point("adhoc.after_drop")  # the request stays until forget: a restart starts (nothing) over
            state.forget(table_id)  # its requests go with its plan and chunks, in one commit
            log.info("%s: copying it again", table_id)
            by_id.pop(table_id, None)
        else:
            state.drop_signals(table_id)
    for table_id, schema in sorted(live.items()):
        if state.plan(table_id) is None:
            plan_table(spark, copying, state, flavor, schema, schemas_read_after)
            log.info("%s: its chunks are read between binlog batches", table_id)
            by_id[table_id] = schema
    return [by_id[t] for t in sorted(by_id)]


def start_copy_again(spark: Any, targets: Targets, schema: TableSchema) -> None:
    """Start copying a table again: into a branch of its target when its schema fits (readers keep the old rows,
    see sink/recopy.py), else by dropping the target. The changelog table is dropped either way (its history
    goes, as it always did); it starts again with the binlog phase."""
    target = targets.target_for(schema.database, schema.table)
    branched = start_branch_copy(cached_pyiceberg_catalog(targets.sink), target, schema, targets.pipeline)
    if branched:
        spark.sql(f"REFRESH TABLE {qualified(targets, *target)}")
    _drop_targets(spark, targets, schema, target=not branched)


def copy_all_again(
    spark: Any, targets: Targets, state: StateTable, schemas: Sequence[TableSchema]
) -> list[TableSchema]:
    """`stream.on_purged: resnapshot`: start the copy of every table over and forget the job's offset, as `ingest
    resnapshot` of every table does (the caller then copies them); return `schemas`."""
    for schema in schemas:
        if state.plan(schema.table_id) is not None:
            start_copy_again(spark, targets, schema)
            crash_point("purged.after_start_over")
            state.forget(schema.table_id)
    state.forget_offset()  # every table starts over from its new chunks: the purged offset describes none
    return list(schemas)


def _drop_targets(spark: Any, targets: Targets, schema: TableSchema, target: bool = True) -> None:
    """Drop the target (unless `target` is False) and changelog table with their files, through Spark so that its
    catalog cache forgets them too (the same names are created again at once)."""
    names = [targets.changelog_for(schema.database, schema.table)]
    if target:
        names.append(targets.target_for(schema.database, schema.table))
    for name in names:
        if name is not None:
            spark.sql(f"DROP TABLE IF EXISTS {qualified(targets, *name)} PURGE")


class LiveCopy:
    """Reads chunks of tables still being copied while the binlog phase runs, in the chunk batches of the query."""

    def __init__(
        self,
        spark: Any,
        copying: Copying,
        follows_ddl: bool,
        state: StateTable,
        flavor: str,
        hook: ChunkHook | None = None,
    ) -> None:
        self.spark, self.copying, self.state, self.flavor, self.hook = spark, copying, state, flavor, hook
        self.follows_ddl = follows_ddl
        """Not under `stream.on_schema_change: ignore`: chunks wait for the binlog phase to follow a DDL."""
        self.throttle = source_throttle(copying.source, copying.snapshot.max_source_load)
        """`snapshot.max_source_load`: asked without waiting, so a busy source holds back chunks, not the binlog."""

    def copy(self, table: TableStream, chunks: Sequence[Chunk], conn: Any) -> Literal["load", "schema"] | None:
        """Read those of `chunks` not read yet in one commit, and record their high watermarks in `table`; or say
        what holds them back: the source's load ("load", sampled again after the next batch), or a DDL the binlog
        phase has not followed yet ("schema": chunks read now would hold columns the target does not have)."""
        schema = table.schema
        if self.throttle is not None and not self.throttle.ready(f"{schema.table_id}: chunks read while streaming"):
            return "load"
        options = self.copying.targets.options_for(schema.database, schema.table)
        if self.follows_ddl and load_schema(conn, schema.database, schema.table, options).columns != schema.columns:
            log.info("%s: chunks wait until the binlog phase has followed a schema change", schema.table_id)
            return "schema"
        slot = {c.index: i for i, c in enumerate(table.chunks)}
        unread = [c for c in chunks if table.chunk_highs[slot[c.index]] is None]  # a batch replayed: read already
        if not unread:
            return None
        crash_point("adhoc.before_copy")
        done = {c.index for c, h in zip(table.chunks, table.chunk_highs, strict=True) if h is not None}
        records = copy_chunks(
            self.spark, self.copying, self.state, self.flavor, schema, table.target, unread, done, self.hook
        )
        table.head_known = False  # chunks committed: a new snapshot, looked up for the cut
        for record in records:
            assert record.high_watermark is not None
            table.chunk_highs[slot[record.chunk.index]] = record.high_watermark.position
        if not table.unread:  # the last chunk: readers see the copy now, and the phase writes main again
            finish_copy(self.spark, self.copying.targets, schema, table.target)
            table.target = table_of(table.target)
        read = len(table.chunks) - len(table.unread)
        metrics.current().snapshot_progress(schema.table_id, read, len(table.chunks))
        waited = self.throttle.seconds() if self.throttle is not None else 0.0
        log.info(
            "%s: chunks %d/%d read while streaming%s",
            schema.table_id,
            read,
            len(table.chunks),
            f", paused {waited:.1f} s for source load" if waited else "",
        )
        return None
