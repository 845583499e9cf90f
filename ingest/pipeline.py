"""The job: discover tables, plan chunks, read them on executors, commit each batch to Iceberg exactly once.

Crash safety of the snapshot phase: a batch of chunks is one Iceberg commit to the target whose snapshot
summary carries the cumulative set of chunks done and this batch's watermarks; the state table is
written strictly after. On restart, a chunk counts as done if either says so, so no committed chunk is
read again and no uncommitted one is skipped.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ingest import errors, metrics
from ingest.changes.rejects import RejectedValue
from ingest.config import BINLOG_START_MODES, PipelineConfig
from ingest.errors import BinlogPurgedError, ConfigError, IngestError, SinkError
from ingest.faults import crash_point
from ingest.metrics import JobMetrics, MetricsServer, recording
from ingest.runtime.python_gc import raise_gc_threshold
from ingest.sink.catalog import cached_pyiceberg_catalog, load_pyiceberg_catalog
from ingest.sink.changelog import ensure_changelog
from ingest.sink.recopy import finish_branch_copy
from ingest.sink.rejected import ensure_rejected, merge_rejected
from ingest.sink.summary import SUMMARY_CHUNKS_DONE, SUMMARY_PIPELINE
from ingest.sink.targets import (
    chunks_done_in_target,
    copy_snapshots,
    copy_under_way,
    encode_ranges,
    ensure_target_created,
    job_head,
    on_copy_branch,
    partition_clause,
    table_of,
    target_columns,
)
from ingest.source.chunk_reader import ChunkHook, ChunkTask
from ingest.source.chunks import Chunk, split_table
from ingest.source.mysql import (
    TableSchema,
    check_binlog_settings,
    check_privileges,
    connect,
    list_tables,
    load_schema,
    server_flavor,
)
from ingest.source.position import Watermark
from ingest.source.snapshot_source import REJECTED_COLUMN, chunk_reports, make_chunk_source, start_warm_up
from ingest.source.startup import resolve_start
from ingest.source.throttle import check_load_probe, source_throttle
from ingest.source.watermark import read_watermark
from ingest.state.table import ChunkRecord, StateTable
from ingest.status import bytes_behind_now, print_status, table_status

__all__ = ["discover", "print_status", "run", "snapshot_table", "table_status"]

log = logging.getLogger(__name__)

SUMMARY_BATCH = "ingest.snapshot.batch"
_source_counter = itertools.count()


@dataclass(frozen=True)
class SourceInfo:
    flavor: str
    schemas: tuple[TableSchema, ...]


def discover(config: PipelineConfig) -> SourceInfo:
    """Check the source can be captured and load the schema of every selected table."""
    log.debug("pipeline %s: %r", config.name, config)  # secrets print as Secret(..., ***)
    with connect(config.source) as conn:
        flavor = config.source.flavor if config.source.flavor != "auto" else server_flavor(conn)
        check_binlog_settings(conn)
        check_privileges(conn, flavor)
        tables = list_tables(conn, config.tables)
        if not tables:
            raise ConfigError(
                "`tables.include` matched no table the CDC user can see "
                f"(patterns: {[p.pattern for p in config.tables.include]}); patterns match `database.table`"
            )
        schemas = tuple(load_schema(conn, db, t, config.options_for(db, t)) for db, t in tables)
    _check_target_names(config, tables)
    for schema in schemas:  # a partition spec naming no column of its table is refused before anything is written
        partition_clause(schema, config.options_for(schema.database, schema.table).partition_by)
    return SourceInfo(flavor, schemas)


def _check_target_names(config: PipelineConfig, tables: Sequence[tuple[str, str]]) -> None:
    """Two source tables must never write one Iceberg table (a target, or a changelog table)."""
    owner: dict[tuple[str, str], str] = {}
    for db, t in tables:
        names = [config.target_for(db, t), config.changelog_for(db, t)]
        for name in (n for n in names if n is not None):
            other = owner.setdefault(name, f"{db}.{t}")
            if other != f"{db}.{t}":
                raise ConfigError(
                    f"`{other}` and `{db}.{t}` would both write the Iceberg table {'.'.join(name)}; give one of "
                    "them another `table_options.<table>.target`, or change `sink.table_name`"
                )


def run(
    config: PipelineConfig,
    *,
    snapshot_only: bool = False,
    until_caught_up: bool = False,
    hook: ChunkHook | None = None,
    spark: Any = None,
) -> None:
    """`ingest run`: the snapshot, then the binlog (until stopped, or until caught up)."""
    from ingest.runtime.jars import check_spark, installed_spark

    raise_gc_threshold()
    if spark is None:  # before anything connects: a Spark the job cannot run on is one line, not a JVM trace
        check_spark(installed_spark())
    info = discover(config)
    if config.snapshot.max_source_load is not None:  # a bound the CDC user cannot sample is refused, not ignored
        with connect(config.source) as conn:
            check_load_probe(conn, config.snapshot.max_source_load, info.flavor)
    job_metrics = JobMetrics(config.name, config.stream.engine)
    job_metrics.bytes_behind_probe = lambda committed: bytes_behind_now(config, info.flavor, committed)
    with recording(job_metrics), _metrics_server(config, job_metrics):
        _run(config, info, snapshot_only, until_caught_up, hook, spark)


@contextmanager
def _metrics_server(config: PipelineConfig, job_metrics: JobMetrics) -> Iterator[None]:
    """The `metrics.port` endpoint for the block, if the pipeline has one (before Spark starts: a port taken is
    named at once)."""
    port, host = config.metrics.port, config.metrics.host
    if port is None:
        yield
        return
    try:
        server = MetricsServer(job_metrics, host, port)
    except OSError as e:
        raise ConfigError(
            f"`metrics.port`: cannot serve metrics on {host}:{port} ({e.strerror or e}); choose a free port, or "
            "another `metrics.host`"
        ) from None
    with server:
        yield


def _run(
    config: PipelineConfig,
    info: SourceInfo,
    snapshot_only: bool,
    until_caught_up: bool,
    hook: ChunkHook | None,
    spark: Any,
) -> None:
    from ingest.adhoc import copy_all_again, take_requests
    from ingest.runtime.spark import attach_catalog, spark_session
    from ingest.streaming import StopSignal, gone_tables

    # Before Spark starts: an unreachable catalog is named at once, and nothing is written.
    cached_pyiceberg_catalog(config.sink)
    start: Watermark | None = None
    if config.startup_mode in BINLOG_START_MODES and StateTable.is_new(config):
        # The first run of a mode that copies nothing: its start point is found and checked before any write.
        start = resolve_start(config, info.flavor, [(s.database, s.table) for s in info.schemas])
    stop = StopSignal()
    stop.install()
    warm_up = None
    try:
        spark = spark_session(config) if spark is None else attach_catalog(spark, config)
        # Before the state table is open, to overlap that too; a binlog-only restart wastes one empty job
        # on a side thread (started after the state said whether chunks remain, it saved nothing measurable).
        warm_up = start_warm_up(spark)
        state = StateTable.open(config)
        schemas = list(info.schemas)
        gone = gone_tables(config, state, schemas)  # read in the binlog phase only, up to their DROP or RENAME
        if start is not None:
            start_empty(spark, config, state, schemas, start)
        requests = state.requests()
        if requests.snapshot:  # `ingest snapshot` asked while no job ran: those tables are copied below
            schemas = take_requests(spark, config, state, info.flavor, schemas, schemas, requests.snapshot)
        paused = requests.paused
        while True:
            # A table paused (`ingest snapshot --pause`) keeps its chunks unread, and the loop engine's binlog phase
            # holds back its keys' changes; the structured engine cannot read chunks between batches, so reads all.
            loop = config.stream.engine == "loop"
            if not _snapshot(
                spark, config, state, info.flavor, _not_paused(paused, schemas) if loop else schemas, stop, hook
            ):
                return
            if snapshot_only or config.startup_mode == "snapshot_only":
                return
            try:
                _stream(spark, config, state, info.flavor, [*schemas, *gone], until_caught_up, stop, hook)
                return
            except BinlogPurgedError as e:
                if config.stream.on_purged != "resnapshot":
                    raise
                log.warning("%s. With `stream.on_purged: resnapshot`, every table is copied again", e)
                schemas = copy_all_again(spark, config, state, discover(config).schemas)
                paused = state.requests().paused
    finally:
        stop.uninstall()
        if warm_up is not None:
            warm_up.join(timeout=60)  # not left running into a caller's spark.stop()


def _stream(
    spark: Any,
    config: PipelineConfig,
    state: StateTable,
    flavor: str,
    schemas: list[TableSchema],
    until_caught_up: bool,
    stop: Any,
    hook: ChunkHook | None,
) -> None:
    """The binlog phase of either engine (the loop engine's takes `ingest snapshot` requests as it goes)."""
    from ingest.adhoc import stream_taking_requests
    from ingest.structured import stream_structured

    if config.stream.engine == "structured":
        end = stream_structured(spark, config, state, schemas, flavor, until_caught_up, stop)
        log.info("binlog phase stopped at %s", end)
        return
    schemas = stream_taking_requests(spark, config, state, flavor, schemas, until_caught_up, stop, hook)
    if not stop.event.is_set():
        # Caught up: tables asked while the job ran are copied to the end (their chunks hold every change up to
        # when they are read, later than the offset just committed).
        unread = [s for s in _not_paused(state.requests().paused, schemas) if unfinished(state, s.table_id)]
        _snapshot(spark, config, state, flavor, unread, stop, hook)


def _snapshot(
    spark: Any,
    config: PipelineConfig,
    state: StateTable,
    flavor: str,
    schemas: Sequence[TableSchema],
    stop: Any,
    hook: ChunkHook | None,
) -> bool:
    """Copy every chunk not copied yet, table by table; False if asked to stop (after the current commit)."""
    for schema in schemas:
        snapshot_table(spark, config, state, flavor, schema, hook=hook, stop=stop.event)
        if stop.event.is_set():
            log.info("stopping after the current commit, as asked")
            return False
    return True


def start_empty(
    spark: Any, config: PipelineConfig, state: StateTable, schemas: Sequence[TableSchema], start: Watermark
) -> None:
    """A startup mode that copies nothing: create each target (and changelog table) empty, then record in one
    state-table commit that every table holds every change up to `start`. The record comes after the targets
    (a target missing under a recorded table is taken for one dropped by hand) and before the binlog is read:
    from then on every run resumes by the state table, starting at `start` until its first binlog commit."""
    for schema in schemas:
        ensure_target_created(spark, config, schema)
        ensure_changelog(spark, config, schema)
    crash_point("startup.before_record")
    state.record_start([s.table_id for s in schemas], start)
    crash_point("startup.after_record")
    log.info(
        "startup mode %s: %d tables created empty; their binlog is read from %s",
        config.startup_mode,
        len(schemas),
        start.position,
    )


def _not_paused(paused: frozenset[str], schemas: Sequence[TableSchema]) -> list[TableSchema]:
    for schema in schemas:
        if schema.table_id in paused:
            log.info("%s: its snapshot is paused (`ingest snapshot --resume` goes on)", schema.table_id)
    return [s for s in schemas if s.table_id not in paused]


def unfinished(state: StateTable, table_id: str) -> bool:
    """The table is planned and some of its chunks are not copied yet."""
    return len(state.done(table_id)) < len(state.plan(table_id) or [])


def _batched(items: Sequence[Chunk], size: int) -> Iterator[list[Chunk]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def snapshot_table(
    spark: Any,
    config: PipelineConfig,
    state: StateTable,
    flavor: str,
    schema: TableSchema,
    hook: ChunkHook | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Copy the table's chunks not copied yet, one commit of `snapshot.chunks_per_commit` chunks after another;
    before each, wait while the source is above `snapshot.max_source_load`. Once `stop` is set (during a pause
    too), return after the current commit."""
    table_id = schema.table_id
    target = plan_table(spark, config, state, flavor, schema)
    plan = state.plan(table_id) or []
    done = reconcile(config, state, schema)
    todo = [c for c in plan if c.index not in done]
    metrics.current().snapshot_progress(table_id, len(done), len(plan))
    if not todo:
        log.info("%s: snapshot complete (%d chunks)", table_id, len(plan))
        finish_copy(spark, config, schema, target)  # a run that stopped between the last chunk and the swap
        return
    started = time.monotonic()
    rows_done = 0
    throttle = source_throttle(config)
    stop = stop or threading.Event()
    for batch in _batched(todo, config.snapshot.chunks_per_commit):
        # Between commits only: a pause delays the next read, never a commit or its watermarks.
        if stop.is_set() or (throttle and not throttle.wait(stop, f"{table_id}: chunks {len(done)}/{len(plan)}")):
            log.info("%s: stopping at chunks %d/%d, as asked", table_id, len(done), len(plan))
            return
        records = copy_chunks(spark, config, state, flavor, schema, target, batch, done, hook)
        done.update(r.chunk.index for r in records)
        rows_done += sum(r.row_count for r in records)
        metrics.current().snapshot_progress(table_id, len(done), len(plan))
        elapsed = max(time.monotonic() - started, 1e-6)
        paused = f", paused {throttle.seconds():.1f} s for source load" if throttle and throttle.seconds() else ""
        log.info(
            "%s: chunks %d/%d, %d rows, %.0f rows/s%s",
            table_id,
            len(done),
            len(plan),
            rows_done,
            rows_done / elapsed,
            paused,
        )
    finish_copy(spark, config, schema, target)


def plan_table(
    spark: Any,
    config: PipelineConfig,
    state: StateTable,
    flavor: str,
    schema: TableSchema,
    schema_read_after: Watermark | None = None,
) -> str:
    """Create the target (and changelog table) if missing, and split the table into chunks unless it was.

    The plan records a binlog position earlier than every chunk: `schema_read_after`, a position read before
    `schema` was loaded, when given, else the position now. With it, a DDL statement before that position is
    known to be in the target already (see streaming.TableStream.contained_until).

    Returns the Spark name the table's chunks are written to: the target's copy branch while one exists."""
    table_id = schema.table_id
    target, created = ensure_target_created(spark, config, schema)
    if _copying_into_branch(config, state, schema):
        target = on_copy_branch(target)
    if created and state.done(table_id):
        raise SinkError(
            f"{table_id}: the state table records {len(state.done(table_id))} chunks copied, but the target {target} "
            f"did not exist (dropped?): the rows they hold are gone. Snapshot the table again: `ingest resnapshot "
            f"--config ... --table {table_id}`, then `ingest run`"
        )
    ensure_changelog(spark, config, schema)  # the changelog starts with the binlog phase (docs/config.md)
    if state.plan(table_id) is None:
        chunk_size = config.options_for(schema.database, schema.table).chunk_size or config.snapshot.chunk_size
        with connect(config.source) as conn:
            planned_at = schema_read_after or read_watermark(conn, flavor)
            plan = split_table(conn, schema, chunk_size)
        state.save_plan(table_id, plan, planned_at)
        crash_point("snapshot.after_plan")
        log.info("%s: planned %d chunks of up to %d rows", table_id, len(plan), chunk_size)
    return target


def _copying_into_branch(config: PipelineConfig, state: StateTable, schema: TableSchema) -> bool:
    """Whether the target is being copied again into its branch. A branch that lacks chunks the state table
    records was started over (`ingest resnapshot` stopped between its two steps, see resnapshot.py): those
    records describe the old copy, so they are forgotten here and the caller plans the table again."""
    table_id = schema.table_id
    table = cached_pyiceberg_catalog(config.sink).load_table(config.target_for(schema.database, schema.table))
    if not copy_under_way(table):
        return False
    stale = set(state.done(table_id)) - chunks_done_in_target(table, config.name)
    if stale:
        log.info("%s: the copy branch was started over; forgetting %d chunks of the old copy", table_id, len(stale))
        state.forget(table_id)
    return True


def finish_copy(spark: Any, config: PipelineConfig, schema: TableSchema, target: str) -> None:
    """Every chunk is in the target: if it was copied into its branch, let readers see the copy (the swap).

    `target` is the name the chunks were written to (`plan_table`'s): only a branch name can need the swap, so
    a table copied into main costs no look at the catalog."""
    if target == table_of(target):
        return
    names = config.target_for(schema.database, schema.table)
    finish_branch_copy(cached_pyiceberg_catalog(config.sink), names, spark, target)


def copy_chunks(
    spark: Any,
    config: PipelineConfig,
    state: StateTable,
    flavor: str,
    schema: TableSchema,
    target: str,
    chunks: list[Chunk],
    done: set[int],
    hook: ChunkHook | None = None,
) -> list[ChunkRecord]:
    """Read `chunks` on the executors, append them to the target in one commit, then record them (`done`: the
    table's chunks committed before)."""
    policy = config.options_for(schema.database, schema.table).on_unrepresentable
    tasks = [ChunkTask(config.source, flavor, schema, c, hook, config.snapshot.driver, policy) for c in chunks]
    with connect(config.source) as conn:
        floor = read_watermark(conn, flavor)
    records = _commit_batch(spark, config, target, tasks, target_columns(schema), set(done), floor)
    crash_point("snapshot.after_commit")  # data committed, state table not yet written
    state.record_chunks(records)
    crash_point("snapshot.after_state")
    metrics.current().rows_copied(schema.table_id, sum(r.row_count for r in records))
    return records


_EXECUTOR_ERROR = re.compile(r"ingest\.errors\.(\w+): (.+)")


def executor_error(error: BaseException) -> IngestError | None:
    """The job's own error raised in a chunk read on an executor, as that error again (Spark wraps it in a
    Java exception whose text holds the Python traceback), so it ends the job with its message and exit code."""
    match = _EXECUTOR_ERROR.search(str(error))
    found = getattr(errors, match[1], None) if match else None
    if match and isinstance(found, type) and issubclass(found, IngestError):
        return found(match[2].strip())
    return None


def reconcile(config: PipelineConfig, state: StateTable, schema: TableSchema) -> set[int]:
    """Chunks done = recorded in the state table, or committed to the target by a run that died before
    recording them (those are recorded now, from the target's snapshot summaries)."""
    table_id = schema.table_id
    recorded = set(state.done(table_id))
    namespace, name = config.target_for(schema.database, schema.table)
    table = load_pyiceberg_catalog(config.sink).load_table((namespace, name))
    committed = chunks_done_in_target(table, config.name)
    missing = committed - recorded
    if missing:
        plan = {c.index: c for c in state.plan(table_id) or []}
        batches = _batch_records_in_target(table, config.name)
        records = []
        for index in sorted(missing):
            record = batches.get(index)
            if record is None:
                # The snapshot holding this batch's watermarks was expired: the plan-time watermark is
                # earlier than the chunk's real one, which only makes the binlog phase replay more.
                record = ChunkRecord(plan[index], state.planned_at(table_id))
            records.append(
                ChunkRecord(
                    plan[index],
                    record.high_watermark,
                    record.low_watermark,
                    record.row_count,
                    record.window_events,
                    record.target_snapshot_id,
                )
            )
        log.info(
            "%s: recording %d chunks committed by an earlier run that stopped before recording them",
            table_id,
            len(records),
        )
        state.record_chunks(records)
    return recorded | committed


def _batch_records_in_target(table: Any, pipeline: str) -> dict[int, ChunkRecord]:
    out: dict[int, ChunkRecord] = {}
    for snapshot in copy_snapshots(table):
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        if props.get(SUMMARY_PIPELINE) != pipeline or SUMMARY_BATCH not in props:
            continue
        batch = json.loads(props[SUMMARY_BATCH])
        if isinstance(batch, dict):  # the batch's floor: earlier than its chunks' watermarks (see _commit_batch)
            floor = Watermark.from_json(batch["floor"])
            for index in batch["chunks"]:
                out[int(index)] = ChunkRecord(
                    Chunk("", int(index), None, None), floor, floor, 0, 0, snapshot.snapshot_id
                )
            continue
        for item in batch:  # written by versions that took each chunk's own watermarks before the commit
            out[int(item["i"])] = ChunkRecord(
                Chunk("", int(item["i"]), None, None),
                Watermark.from_json(item["high"]),
                Watermark.from_json(item["low"]),
                int(item["rows"]),
                int(item["events"]),
                snapshot.snapshot_id,
            )
    return out


def _commit_batch(
    spark: Any,
    config: PipelineConfig,
    target: str,
    tasks: list[ChunkTask],
    targets: list[Any],
    done_before: set[int],
    floor: Watermark,
) -> list[ChunkRecord]:
    """Read a batch of chunks on the executors and append them to the target in one commit.

    `floor` is a binlog position read before any chunk of the batch: earlier than every chunk's low (so
    high) watermark. The commit's summary carries it, because the chunks' own watermarks are known only
    once the rows are written (they come back in an accumulator); a run that dies between the commit
    and the state table's record takes the floor as their high watermark, which is safe: the binlog
    phase then replays a little more, and replaying changes a chunk already holds repeats upserts.
    """
    reports = chunk_reports(spark)
    source = make_chunk_source(
        f"ingest_chunks_{next(_source_counter)}", tasks, targets, config.snapshot.parallelism, reports
    )
    spark.dataSource.register(source)
    data = spark.read.format(source.name()).load()
    by_index = {t.chunk.index: t.chunk for t in tasks}
    batch_info = {"floor": floor.to_json(), "chunks": sorted(by_index)}
    try:
        if tasks[0].on_unrepresentable == "dead_letter":
            data = _commit_rejected(spark, config, tasks[0].schema, data)
        crash_point("snapshot.before_commit")
        (
            data.writeTo(target)
            .option(f"snapshot-property.{SUMMARY_PIPELINE}", config.name)
            .option(f"snapshot-property.{SUMMARY_CHUNKS_DONE}", encode_ranges(done_before | set(by_index)))
            .option(f"snapshot-property.{SUMMARY_BATCH}", json.dumps(batch_info, separators=(",", ":")))
            .append()
        )
    except Exception as e:
        ours = executor_error(e)
        if ours is None:
            raise
        raise ours from None
    metas: dict[int, dict[str, Any]] = reports.value
    snapshot_id = _current_snapshot_id(config, tasks[0].schema)
    records = []
    for index, chunk in sorted(by_index.items()):
        m = metas.get(index)
        if m is None:
            log.warning(
                "%s: chunk %d sent no report; recording the batch floor %s as its watermark", target, index, floor
            )
            records.append(ChunkRecord(chunk, floor, floor, 0, 0, snapshot_id))
            continue
        high, low = Watermark.from_json(m["high"]), Watermark.from_json(m["low"])
        records.append(ChunkRecord(chunk, high, low, m["rows"], m["window_events"], snapshot_id))
    return records


def _commit_rejected(spark: Any, config: PipelineConfig, schema: TableSchema, data: Any) -> Any:
    """`on_unrepresentable: dead_letter`: read the chunks once (kept on the executors), MERGE their rejected values
    into the rejected table, and return the other rows, for the target. The rejected rows commit first, as in the
    binlog phase: a target that holds a chunk holds its rejected values too, and a chunk read again after a crash
    adds none twice (their `seq` names the chunk and the key)."""
    from pyspark.sql import functions as F

    # Kept, not read again: a second read would see the table later, and the two halves could disagree.
    data = data.localCheckpoint(eager=True)
    found = data.where(F.col(REJECTED_COLUMN).isNotNull()).select(REJECTED_COLUMN).collect()
    rows = [RejectedValue(**item) for (text,) in found for item in json.loads(text)]
    if rows:
        name = ensure_rejected(spark, config, schema.database, schema.table)
        assert name is not None, "dead_letter tables have a rejected table"
        merge_rejected(spark, name, rows)
        crash_point("snapshot.after_rejected_commit")
    return data.where(F.col(REJECTED_COLUMN).isNull()).drop(REJECTED_COLUMN)


def _current_snapshot_id(config: PipelineConfig, schema: TableSchema) -> int | None:
    """The target's head the job writes (its copy branch's while one exists), read with pyiceberg (a Spark query of
    `.snapshots` costs a Spark job)."""
    namespace, name = config.target_for(schema.database, schema.table)
    snapshot = job_head(cached_pyiceberg_catalog(config.sink).load_table((namespace, name)))
    return None if snapshot is None else int(snapshot.snapshot_id)
