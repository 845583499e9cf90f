"""The job as one Spark Structured Streaming query: the snapshot's chunks and the binlog.

The source is the binlog Python data source (`ingest.query.binlog_source`); the sink is `foreachBatch`. A binlog batch
is committed by `ingest.query.commit.commit_prepared`: per table, skip what the target already holds and what its
chunks hold, materialize, MERGE with the batch's end offset in the snapshot summary, append the changelog, then
record the offset in the state table. A DDL begins its batch and is followed first. A chunk batch names chunks
of one table: the sink reads them on the executors and appends them to the target in one commit, recording
their watermarks in the state table (`PhaseHooks.read_chunks`).

Iceberg stays the only durable state. Without `stream.checkpoint_location` every run starts a fresh query
at the point the targets hold; with one, Spark replays the batch a crash interrupted from its offset log
(`readBetweenOffsets`: the same events, or the same chunks), and the targets skip what they already hold.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingest import errors, metrics
from ingest.errors import ConfigError
from ingest.model.changes import TablesNamed
from ingest.model.position import BinlogPosition, Watermark
from ingest.model.schema import TableSchema
from ingest.query.batch import Streaming, TableStream, catch_up_end
from ingest.query.binlog_source import (
    OBSERVED,
    BinlogSourceSpec,
    ChunkBatch,
    decode_batch,
    make_binlog_source,
    offset_mark,
)
from ingest.query.commit import batch_source_time, commit_prepared
from ingest.query.ddl import Following, follow_ddl
from ingest.query.start import StreamStart, prepare
from ingest.query.stop import StopPoint, StopSignal
from ingest.runtime.jars import spark_minor
from ingest.runtime.spark import callback_connection, close_callback_connection
from ingest.sink.outage import OutageWaitStopped, SinkOutage
from ingest.source.mysql import connect
from ingest.source.reconnect import LOST_CONNECTION_CODES
from ingest.source.snapshot.chunks import Chunk
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PhaseHooks:
    """What the phase calls on the way: to read a chunk batch, and to learn whether it ends before its goal or a
    stop, after the batch just committed."""

    between: Callable[[], bool] | None = None
    """Asked after each batch: True ends the phase (requests to take, `ingest snapshot`)."""
    on_tables_named: Callable[[TablesNamed], None] | None = None
    """Given a statement that named tables the patterns match but the phase does not capture; the phase ends
    after it. None: such statements are not looked for (the tables are copied at the next start)."""
    on_recopy: Callable[[list[str]], None] | None = None
    """Given the tables a DDL statement makes copy again (`stream.on_unfollowable: recopy`); the phase ends at
    the statement."""
    read_chunks: Callable[[TableStream, Sequence[Chunk], Any], object] | None = None
    """Reads the chunks of a chunk batch (`adhoc.LiveCopy.copy`): given the table, its chunks and a source
    connection. None: the source hands over no chunk batch (the chunks not read are read at the next start)."""
    paused: Callable[[], Collection[str]] = field(default=frozenset)
    """The tables whose chunks `ingest snapshot --pause` holds: "stop when caught up" does not wait for them."""


class _Closing(Exception):
    """A batch started after the job decided to stop, or the rest of a batch after a DDL that ends the phase: not
    committed, so a kept checkpoint replays it."""


class _Sink:
    """`foreachBatch`: commits each micro-batch; the job's thread waits on `done` and stops between batches."""

    def __init__(
        self,
        following: Following,
        state: StateTable,
        begin: StreamStart,
        hooks: PhaseHooks,
        stopping: Callable[[], bool],
    ) -> None:
        self.following, self.state = following, state
        self.spark, self.streaming, self.conn = following.spark, following.streaming, following.conn
        self.outage = SinkOutage(self.streaming.targets.sink.reconnect_seconds, stopping)
        """Waits out a catalog or object store that cannot be reached while a batch commits."""
        self.begin, self.hooks = begin, hooks
        self.committed = begin.start
        self.source_time = state.offset_source_time()
        self.lock = threading.Lock()
        self.closing = False
        self.done = threading.Event()
        """The goal is committed (with "stop when caught up"), or the phase ends to take requests or new tables."""
        self.error: BaseException | None = None
        self.last_batch: int | None = None
        """The id of the last micro-batch committed to the targets."""
        self.callback: Any | None = None
        """The py4j connection the query's thread calls this sink on, closed when the query has stopped."""

    def __call__(self, frame: Any, batch_id: int) -> None:
        with self.lock:
            if self.callback is None:
                self.callback = callback_connection(self.spark)
            try:
                if self.closing:
                    raise _Closing(f"batch {batch_id} after the stop")
                started = time.monotonic()
                # Through Arrow: the payloads come over as a few large buffers, not row by row.
                table = frame.toArrow()
                rows = list(zip(*(table.column(name).to_pylist() for name in ("seq", "kind", "payload")), strict=True))
                log.debug("batch %d: %d rows in %.3f s", batch_id, len(rows), time.monotonic() - started)
                if rows or self.last_batch is not None:
                    try:
                        self._apply(rows)
                    except OutageWaitStopped as e:  # nothing of the batch is known committed: the next run replays it
                        raise _Closing(str(e)) from None
                # else: Spark 4.0 runs a new query's first batch from the initial offset to the same offset, with
                # the empty rows the reader returned for it (4.1 reads that range again and gets its end row).
                # Nothing moved; any later batch without its end row is still refused by `decode_batch`.
                self.last_batch = batch_id
            except BaseException as e:
                self.error = e
                raise

    def _apply(self, rows: list[Any]) -> None:
        batch = decode_batch(rows)
        end = offset_mark(batch.end.offset)
        begin = self.begin
        if batch.chunks is not None:
            self._read_chunks(batch.chunks)
        if batch.ddl is not None:
            # The source begins a batch with a DDL: every change before it is committed already.
            recopy = follow_ddl(self.following, self.state, begin, batch.ddl, None)
            self.committed = batch.ddl.end
            if recopy:
                # The phase ends at the statement; the rest of the batch is read again by the next one.
                assert self.hooks.on_recopy is not None  # recopy is configured only with the job's request handling
                self.hooks.on_recopy(recopy)
                self._end_phase()
                raise _Closing(f"batch after the DDL at {batch.ddl.end}, which ends the phase to copy tables again")
        if end.position > self.committed or batch.tables:
            self.source_time = batch_source_time(self.source_time, batch.end.last_commit, batch.end.at)
            source_time = self.source_time

            def commit(again: bool) -> None:
                commit_prepared(
                    self.spark,
                    self.streaming.targets,
                    self.streaming.stream,
                    self.state,
                    begin.by_id,
                    batch.tables,
                    end,
                    source_time,
                    settle=again,
                )

            self.outage.run(f"committing the batch up to {end.position}", commit)
            self.committed = end.position
        if batch.named is not None:
            assert self.hooks.on_tables_named is not None  # the source reports them only then
            self.hooks.on_tables_named(batch.named)
        if batch.named is not None or self._phase_over():
            self._end_phase()

    def _phase_over(self) -> bool:
        """Caught up (with "stop when caught up": the goal committed, and every chunk the phase reads read), or
        requests wait (`PhaseHooks.between`)."""
        begin = self.begin
        goal = begin.goal
        if (
            goal is not None
            and self.committed >= catch_up_end(goal, begin.tables)
            and not chunks_left(begin, self.hooks)
        ):
            return True
        return self.hooks.between is not None and self.hooks.between()

    def _end_phase(self) -> None:
        self.closing = True
        self.done.set()

    def settle(self) -> None:
        """Between batches: end the phase if it is caught up, or requests wait (after the goal, a table paused, or
        one whose chunks are all read, leaves no batch to end it)."""
        if not self.lock.acquire(blocking=False):
            return  # a batch is being committed: it looks itself
        try:
            if self.closing or self.error is not None:
                return
            if self._phase_over():
                self._end_phase()
        finally:
            self.lock.release()

    def _read_chunks(self, chunks: ChunkBatch) -> None:
        """A chunk batch: its chunks read and committed, their high watermarks recorded in the state table (where
        the source learns them), unless the source's load or a DDL not followed yet holds them back."""
        # Several small tables: their records in one state commit (a table's own costs as much as its copy).
        with self.state.one_commit() if len(chunks.parts) > 1 else nullcontext():
            for table_id, part in chunks.parts:
                table = self.begin.by_id.get(table_id)
                if table is not None and self.hooks.read_chunks is not None:
                    self.hooks.read_chunks(table, part, self.conn)

    def close(self) -> None:
        """Wait for the batch being committed, and refuse later ones."""
        with self.lock:
            self.closing = True


def stream_structured(
    spark: Any,
    streaming: Streaming,
    state: StateTable,
    schemas: Sequence[TableSchema],
    flavor: str,
    until_caught_up: bool,
    stop: StopSignal | None = None,
    hooks: PhaseHooks | None = None,
) -> BinlogPosition:
    """Run the job's query: the chunks not read yet and the binlog; return the offset committed last. `hooks` read
    the chunk batches and say when the phase ends early, after a batch (a request found, a table named by a
    DDL, a table to copy again)."""
    hooks = hooks or PhaseHooks()
    with connect(streaming.source) as conn:
        begin = prepare(streaming, state, schemas, conn, flavor, until_caught_up)
        if begin.goal is not None and begin.start >= begin.goal and not chunks_left(begin, hooks):
            return begin.start
        spec = BinlogSourceSpec(
            streaming,
            flavor,
            tuple(begin.tables),
            begin.mark,
            begin.contained_until,
            begin.planned_at,
            begin.goal,
            streaming.tables if hooks.on_tables_named is not None else None,
            hooks.read_chunks is not None,
            reconnect_file=metrics.current().reconnect_file,
        )
        name = f"ingest_binlog_{uuid.uuid4().hex[:12]}"
        spark.dataSource.register(make_binlog_source(name, spec))
        following = Following(spark, streaming, conn, flavor)
        sink = _Sink(following, state, begin, hooks, stop.event.is_set if stop else lambda: False)
        with _checkpoint(spark, streaming, begin) as (checkpoint, logs):
            with _query_conf(spark, checkpoint):
                query = (
                    _observed(spark.readStream.format(name).load())
                    .writeStream.queryName(query_name(streaming.targets.pipeline))
                    .foreachBatch(sink)
                    # The source says when a batch is due (batch_max_changes, batch_interval_seconds); a trigger
                    # interval would hold a ready batch back until its next tick.
                    .trigger(processingTime="0 seconds")
                    .option("checkpointLocation", checkpoint)
                    .start()
                )
            _run_until_done(query, sink, stop, lambda: _source_position(streaming, flavor), logs)
        return sink.committed


@contextmanager
def _checkpoint(spark: Any, streaming: Streaming, begin: StreamStart) -> Iterator[tuple[str, _CheckpointLogs]]:
    """The query's checkpoint location and its logs: `stream.checkpoint_location` (refused when it is ahead of the
    Iceberg tables), else a scratch directory removed afterwards."""
    kept = streaming.stream.checkpoint_location
    scratch: Path | None = None
    if kept:
        checkpoint = kept
    else:
        scratch = Path(tempfile.mkdtemp(prefix="ingest-checkpoint-"))
        # Without a scheme, the path would be on the cluster's default file system (HDFS on EMR).
        checkpoint = scratch.as_uri()
    # A scratch checkpoint's logs are read too: the query stops after Spark has written its last commit log entry.
    logs = _CheckpointLogs(spark, checkpoint)
    if kept:
        _refuse_checkpoint_ahead(logs, kept, begin)
    try:
        yield checkpoint, logs
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _observed(frame: Any) -> Any:
    """The source's rows, observed: each micro-batch's progress carries the row changes it applied
    (`observedMetrics["ingest"].changes`), and `numInputRows` counts its parts (a table's part, its end, ...)."""
    from pyspark.sql import functions as F

    return frame.observe(OBSERVED, F.coalesce(F.sum("changes"), F.lit(0)).alias("changes"))


@contextmanager
def _query_conf(spark: Any, checkpoint: str) -> Iterator[None]:
    """Start the query with the settings it reads at its start; the session the sink MERGEs with keeps its own:
    - adaptive execution off, as Spark runs every streaming query (it would switch it off itself, with a warning);
    - a checkpoint on the local file system (the scratch one) written through Hadoop's `FileSystem`, not its
      `FileContext`: that asks for each path's link status, which Hadoop's local file system answers by running
      `readlink` in a new process (pyspark ships no Hadoop native library): 16 processes per micro-batch, 0.03 of a
      core at 500 changes/s (bench.steady). A rename on the local file system is atomic either way."""
    settings = {"spark.sql.adaptive.enabled": "false"}
    if checkpoint.startswith("file:"):
        settings[CHECKPOINT_MANAGER] = _file_system_checkpoints(spark.version)
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"


def _file_system_checkpoints(spark_version: str) -> str:
    """Spark's checkpoint file manager on Hadoop's `FileSystem` API (its package moved in Spark 4.1)."""
    package = "org.apache.spark.sql.execution.streaming"
    if spark_minor(spark_version) != "4.0":
        package += ".checkpointing"
    return f"{package}.FileSystemBasedCheckpointFileManager"


def query_name(pipeline: str) -> str:
    """The job's query as Spark names it (its UI, `spark.streams`, a StreamingQueryListener's events)."""
    return f"ingest_{pipeline}"


def chunks_left(begin: StreamStart, hooks: PhaseHooks) -> bool:
    """Whether the phase has chunks to read (in chunk batches): of a table not paused."""
    if hooks.read_chunks is None:
        return False
    paused = hooks.paused()
    return any(t.unread for t in begin.tables if t.schema.table_id not in paused)


def _refuse_checkpoint_ahead(logs: _CheckpointLogs, location: str, begin: StreamStart) -> None:
    committed, planned = logs.end_of(logs.last_batch("commits")), logs.end_of(logs.last_batch("offsets"))
    problem = checkpoint_problem(location, committed, planned, begin.start, begin.here)
    if problem:
        raise ConfigError(problem)


def checkpoint_problem(
    location: str, committed: Watermark | None, planned: Watermark | None, start: BinlogPosition, here: int | None
) -> str | None:
    """Why a kept checkpoint cannot be continued (None when it can).

    Spark runs the batch it planned last again, then continues after it. Each batch is committed to the targets
    and the state table before Spark records it as done, so its last committed batch never ends past where the
    targets hold the source (`start`), unless the checkpoint is not theirs: other tables, or tables restored or
    dropped under it; the changes in between would be skipped. Positions recorded on another server (before a
    failover) mean nothing on this one: the job finds its offsets there by GTID, from Iceberg, not from Spark.
    """
    if planned is not None and planned.server_id != here:
        return (
            f"the Spark checkpoint at {location} (`stream.checkpoint_location`) holds binlog positions of the server "
            f"with server_id {planned.server_id}, but the source now is server_id {here} (a failover?): delete the "
            "checkpoint directory; the job finds its offsets on this server from the Iceberg tables"
        )
    if committed is not None and committed.server_id == here and committed.position > start:
        return (
            f"the Spark checkpoint at {location} (`stream.checkpoint_location`) has committed the binlog up to "
            f"{committed.position}, but the Iceberg tables hold the source only up to {start}: the checkpoint belongs "
            "to other tables, or the tables were restored or dropped under it. Iceberg is what says what is done: "
            "delete the checkpoint directory and run again"
        )
    return None


class _CheckpointLogs:
    """A checkpoint's offset and commit logs, read through Hadoop's file system API as Spark reads them (local,
    HDFS, S3 or GCS alike)."""

    def __init__(self, spark: Any, location: str) -> None:
        self.jvm = spark.sparkContext._jvm
        self.path = self.jvm.org.apache.hadoop.fs.Path
        self.root = self.path(location)
        self.fs = self.root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def last_batch(self, log: str) -> int | None:
        """The highest batch id in `log` (`offsets`: planned, `commits`: recorded as done)."""
        folder = self.path(self.root, log)
        if not self.fs.exists(folder):
            return None
        names = [s.getPath().getName() for s in self.fs.listStatus(folder)]
        return max((int(n) for n in names if n.isdigit()), default=None)

    def end_of(self, batch: int | None) -> Watermark | None:
        """The end offset of a batch: the source line of its offset log entry."""
        if batch is None:
            return None
        stream = self.fs.open(self.path(self.root, f"offsets/{batch}"))
        try:
            text = self.jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        return offset_mark(json.loads(text.strip().splitlines()[-1]))


def _source_position(streaming: Streaming, flavor: str) -> BinlogPosition:
    # A connection of its own: the sink's is in use on Spark's callback thread.
    with connect(streaming.source) as conn:
        return read_watermark(conn, flavor).position


def _run_until_done(
    query: Any,
    sink: _Sink,
    stop: StopSignal | None,
    source_position: Callable[[], BinlogPosition],
    logs: _CheckpointLogs,
) -> None:
    """Wait until the goal is committed, the query fails, or a stop comes: after SIGTERM, once the batches
    have committed what the source wrote before the signal (StopPoint), then after the batch being committed."""
    failure: BaseException | None = None
    stop_point: StopPoint | None = None
    try:
        # Woken by the sink as soon as the goal is committed; the query's own end is looked at between waits.
        while not sink.done.wait(0.25):
            sink.settle()
            if stop is not None and stop.event.is_set():
                stop_point = stop_point or StopPoint(source_position)
                if stop_point.reached(sink.committed):
                    break
            if query.awaitTermination(0.01):
                break
    except Exception as e:  # noqa: BLE001 - the query's own failure, raised below as what it was
        failure = e
    sink.close()
    if stop_point is not None and not sink.done.is_set():
        log.info("stopping after the current commit, as asked (committed up to %s)", sink.committed)
    if failure is None and sink.error is None:
        _wait_recorded(query, logs, sink.last_batch)
    query.stop()  # returns once the query's thread has ended
    close_callback_connection(sink.callback)
    if isinstance(sink.error, _Closing):
        return  # the query ended on a batch that came after the stop: nothing of it was committed
    if sink.error is not None:
        raise sink.error
    if failure is not None:
        raise _as_ingest_error(failure) from None


def _wait_recorded(query: Any, logs: _CheckpointLogs, batch: int | None, timeout: float = 30.0) -> None:
    """Let Spark record the last committed batch in the checkpoint's commit log before the query stops, so that a
    kept checkpoint continues after it instead of running it again (the targets would skip it, but a checkpoint
    behind the targets could no longer tell a checkpoint of other tables, `checkpoint_problem`), and so that the
    stop does not interrupt Spark's thread in the middle of that write; then its progress (which Spark reports
    right after): a listener, the UI and `lastProgress` see every batch, the last one too."""
    deadline = time.monotonic() + timeout
    while batch is not None and query.isActive and time.monotonic() < deadline:
        recorded = logs.last_batch("commits")
        if recorded is not None and recorded >= batch and _progress_batch(query) >= batch:
            return
        time.sleep(0.05)


def _progress_batch(query: Any) -> int:
    """The id of the newest batch the query reported progress of (-1 before any)."""
    progress = query.lastProgress
    return -1 if progress is None else int(progress["batchId"])


_ERROR = re.compile(r"\b(?:ingest\.errors\.)?([A-Z]\w*Error): (.+)")
_LOST = re.compile(rf"OperationalError: \((?:{'|'.join(map(str, sorted(LOST_CONNECTION_CODES)))}), [^\n]*")


def _as_ingest_error(failure: BaseException) -> BaseException:
    """The error the binlog source raised in Spark's Python process, as the job's own error class (the query
    reports it as text)."""
    text = str(failure)
    for match in reversed(list(_ERROR.finditer(text))):
        cls = getattr(errors, match.group(1), None)
        if isinstance(cls, type) and issubclass(cls, errors.IngestError):
            return cls(match.group(2).strip())
    if lost := _LOST.search(text):  # a connection the source's process could not get back (not the binlog's)
        return errors.TransientError(f"lost the connection to the source: {lost.group(0)}")
    return failure
