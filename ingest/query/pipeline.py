"""The job: discover the tables, plan their chunks (`ingest.query.snapshot`), then run one Structured Streaming query
(`ingest.query.structured`) that reads the chunks not read yet in chunk batches between its binlog batches, taking
`ingest snapshot` requests on the way (`ingest.query.adhoc`). `snapshot_only` copies the chunks without a query."""

from __future__ import annotations

import itertools
import logging
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from ingest.config import BINLOG_START_MODES, PipelineConfig
from ingest.errors import BinlogPurgedError, ConfigError
from ingest.faults import crash_point
from ingest.metrics import JobMetrics, MetricsServer, recording
from ingest.model.position import Watermark
from ingest.model.schema import TableSchema
from ingest.query.adhoc import copy_all_again, stream_taking_requests, take_requests
from ingest.query.batch import Streaming
from ingest.query.ddl import gone_tables
from ingest.query.snapshot import Copying, ready_table, snapshot_table
from ingest.query.stop import StopSignal
from ingest.runtime.python_gc import raise_gc_threshold
from ingest.runtime.spark import EarlySession
from ingest.runtime.warm_up import start_executor_warm_up, start_warm_up
from ingest.sink.catalog import cached_pyiceberg_catalog
from ingest.sink.changelog import ensure_changelog
from ingest.sink.outage import OutageWaitStopped
from ingest.sink.targets import check_targets, ensure_target_created
from ingest.source.binlog.startup import resolve_start
from ingest.source.discovery import SourceInfo, discover
from ingest.source.mysql import connect
from ingest.source.reconnect import read_published
from ingest.source.snapshot.chunk_reader import ChunkHook
from ingest.source.snapshot.chunks import Chunk
from ingest.source.snapshot.throttle import check_load_probe
from ingest.source.watermark import bytes_behind_now
from ingest.state.table import StateTable, pipeline_is_new

log = logging.getLogger(__name__)

RECORDS_HELD_S = 10.0
"""How long `--snapshot-only` holds chunk records back to write them in one state commit (`_snapshot`)."""


def run(
    config: PipelineConfig,
    *,
    snapshot_only: bool = False,
    until_caught_up: bool = False,
    hook: ChunkHook | None = None,
    spark: Any = None,
    early: EarlySession | None = None,
) -> None:
    """`ingest run`: the snapshot, then the binlog (until stopped, or until caught up). The run's own Spark session
    is `early`'s, if given (started as the pipeline file was read), else started when the run needs it; `spark`:
    the caller's session instead."""
    from ingest.runtime.jars import check_spark, installed_spark

    raise_gc_threshold()
    if spark is None:  # before anything connects: a Spark the job cannot run on is one line, not a JVM trace
        check_spark(installed_spark())
    log.debug("pipeline %s: %r", config.name, config)  # secrets print as Secret(..., ***)
    info = discover(config.source, config.tables, config.table_options)
    check_targets(config.targets, info.schemas)
    if config.snapshot.max_source_load is not None:  # a bound the CDC user cannot sample is refused, not ignored
        with connect(config.source) as conn:
            check_load_probe(conn, config.snapshot.max_source_load, info.flavor)
    job_metrics = JobMetrics(config.name)
    job_metrics.bytes_behind_probe = lambda committed: bytes_behind_now(config.source, info.flavor, committed)
    with tempfile.TemporaryDirectory(prefix="ingest-") as scratch, recording(job_metrics):
        _watch_reconnects(job_metrics, Path(scratch) / "reconnecting.json")
        with _metrics_server(config, job_metrics):
            _run(config, info, config.snapshot_only(snapshot_only), until_caught_up, hook, spark, early)


def _watch_reconnects(job_metrics: JobMetrics, file: Path) -> None:
    """The binlog reader (in Spark's Python process on this host) says in `file` when it is reconnecting; the
    metrics and the progress line read it there."""
    job_metrics.reconnect_file = str(file)
    job_metrics.reconnecting_probe = lambda: read_published(file)


@contextmanager
def _metrics_server(config: PipelineConfig, job_metrics: JobMetrics) -> Iterator[None]:
    """The `metrics.port` endpoint for the block, if the pipeline has one (before Spark is used: a port taken is
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


def _first_start(config: PipelineConfig, info: SourceInfo) -> Watermark | None:
    """The first run of a mode that copies nothing: its start point, found and checked before any write."""
    if config.startup_mode in BINLOG_START_MODES and pipeline_is_new(config.sink, config.name):
        tables = [(s.database, s.table) for s in info.schemas]
        refuse = config.stream.on_schema_change != "ignore"
        return resolve_start(
            config.source, config.startup_mode, config.startup, info.flavor, tables, ddl_refused=refuse
        )
    return None


def _run(
    config: PipelineConfig,
    info: SourceInfo,
    snapshot_only: bool,
    until_caught_up: bool,
    hook: ChunkHook | None,
    spark: Any,
    early: EarlySession | None,
) -> None:
    """The run on `spark`, or on a session of its own (`early`'s, if given). The warm-up read (a head start for
    Spark's Python processes) is joined before returning into a caller's session; a session of the job's own ends
    with its process, warm-up and all, so a run with little to do (a restart that finds nothing new) does not wait
    for it."""
    # Before the run takes its Spark session: an unreachable catalog is named at once, and nothing is written (a
    # session started early writes nothing either, and ends with the job).
    cached_pyiceberg_catalog(config.sink)
    start = _first_start(config, info)
    stop = StopSignal()
    stop.install()
    warm_ups: list[threading.Thread] = []
    own_session = spark is None
    try:
        spark = _session(config, spark, early)
        # The query's Python processes (a snapshot-only run starts no query), before the state table is open, to
        # overlap that too; an early session started them itself.
        if not snapshot_only and not (early is not None and early.warm_up):
            warm_ups.append(start_warm_up(spark))
        state = StateTable.open(config.sink, config.name, stopping=stop.event.is_set)
        if snapshot_only or _copies(state, info.schemas):
            warm_ups.append(start_executor_warm_up(spark))
        copying, streaming = copying_of(config), streaming_of(config)
        schemas, gone, paused = _tables_to_read(spark, config, streaming, copying, state, info, start)
        while True:
            if snapshot_only:
                # A table paused (`ingest snapshot --pause`) keeps its chunks unread.
                _snapshot(spark, copying, state, info.flavor, _not_paused(paused, schemas), stop, hook)
                return
            # The query reads the chunks, in chunk batches between its binlog batches (a paused table's chunks stay
            # unread, and its keys' changes are held back until they are read).
            with state.one_commit():  # every table's plan in one state commit
                for schema in schemas:
                    ready_table(spark, copying, state, info.flavor, schema)
            try:
                stream_taking_requests(
                    spark, streaming, copying, state, info.flavor, [*schemas, *gone], until_caught_up, stop, hook
                )
                return
            except BinlogPurgedError as e:
                schemas, paused = _copy_after_purge(e, spark, config, state)
    except OutageWaitStopped as e:  # what was committed before stays; the rest comes with the next run
        log.info("%s; stopping", e)
    finally:
        stop.uninstall()
        if not own_session:
            for warm_up in warm_ups:  # not left running into a caller's spark.stop() (see _run's docstring)
                warm_up.join(timeout=60)


def _copy_after_purge(
    purged: BinlogPurgedError, spark: Any, config: PipelineConfig, state: StateTable
) -> tuple[list[TableSchema], frozenset[str]]:
    """With `stream.on_purged: resnapshot`, every table copied again (the tables, and those paused); else the error
    stands."""
    if config.stream.on_purged != "resnapshot":
        raise purged
    log.warning("%s. With `stream.on_purged: resnapshot`, every table is copied again", purged)
    found = discover(config.source, config.tables, config.table_options).schemas
    check_targets(config.targets, found)
    return copy_all_again(spark, config.targets, state, found), state.requests().paused


def _session(config: PipelineConfig, spark: Any, early: EarlySession | None) -> Any:
    """The job's own Spark session (`early`'s, if started already), or the caller's `spark` with the sink's catalog
    attached."""
    from ingest.runtime.spark import attach_catalog, spark_session

    if spark is None and early is not None:
        return early.session()
    if spark is None:
        return spark_session(config.spark, config.sink, f"ingest-{config.name}")
    return attach_catalog(spark, config.sink)


def copying_of(config: PipelineConfig) -> Copying:
    """The snapshot's copy's part of the pipeline file."""
    return Copying(config.source, config.snapshot, config.targets)


def streaming_of(config: PipelineConfig) -> Streaming:
    """The binlog phase's part of the pipeline file."""
    return Streaming(config.source, config.tables, config.stream, config.snapshot.chunks_per_commit, config.targets)


def _copies(state: StateTable, schemas: Sequence[TableSchema]) -> bool:
    """Whether a captured table's copy is not complete: the run reads chunks, on executors (the job's Python daemon
    is started ahead for them). Copies asked for or begun later start it when they need it."""
    return any(state.plan(s.table_id) is None or state.unfinished(s.table_id) for s in schemas)


def _tables_to_read(
    spark: Any,
    config: PipelineConfig,
    streaming: Streaming,
    copying: Copying,
    state: StateTable,
    info: SourceInfo,
    start: Watermark | None,
) -> tuple[list[TableSchema], list[TableSchema], frozenset[str]]:
    """The tables the run reads: those captured (with the snapshots `ingest snapshot` asked while no job ran taken
    first), those gone that the binlog phase reads up to their DROP or RENAME, and those paused."""
    schemas = list(info.schemas)
    gone = gone_tables(streaming, state, schemas)
    if start is not None:  # a startup mode that copies nothing
        start_empty(spark, config, state, schemas, start)
    requests = state.requests()
    if requests.snapshot:
        schemas = take_requests(spark, copying, state, info.flavor, schemas, schemas, requests.snapshot)
    return schemas, gone, requests.paused


def _snapshot(
    spark: Any,
    copying: Copying,
    state: StateTable,
    flavor: str,
    schemas: Sequence[TableSchema],
    stop: Any,
    hook: ChunkHook | None,
) -> None:
    """`snapshot_only`: copy every chunk not copied yet, table by table, until asked to stop (after the current
    commit). Every table's plan is one state commit. Tables left with one chunk each (most small tables) share
    a state commit for their records, one per `RECORDS_HELD_S` seconds: it costs more than their copy."""
    with state.one_commit():
        ready = [(schema, ready_table(spark, copying, state, flavor, schema)) for schema in schemas]
    for small, tables in itertools.groupby(ready, key=lambda r: _chunks_left(r[1]) == 1):
        with state.one_commit(hold_s=RECORDS_HELD_S) if small else nullcontext():
            for schema, table in tables:
                snapshot_table(spark, copying, state, flavor, schema, table, hook=hook, stop=stop.event)
                if stop.event.is_set():
                    log.info("stopping after the current commit, as asked")
                    return


def _chunks_left(ready: tuple[str, list[Chunk], set[int]]) -> int:
    _, plan, done = ready
    return sum(c.index not in done for c in plan)


def start_empty(
    spark: Any, config: PipelineConfig, state: StateTable, schemas: Sequence[TableSchema], start: Watermark
) -> None:
    """A startup mode that copies nothing: create each target (and changelog table) empty, then record in one
    state-table commit that every table holds every change up to `start`. The record comes after the targets
    (a target missing under a recorded table is taken for one dropped by hand) and before the binlog is read:
    from then on every run resumes by the state table, starting at `start` until its first binlog commit."""
    for schema in schemas:
        ensure_target_created(spark, config.targets, schema)
        ensure_changelog(spark, config.targets, schema)
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
