"""The snapshot: plan each table into chunks, read them on executors, commit each batch to Iceberg exactly once.

Crash safety: a batch of chunks is one Iceberg commit to the target whose snapshot summary carries the
cumulative set of chunks done and this batch's watermarks; the state table is written strictly after. On
restart, a chunk counts as done if either says so, so no committed chunk is read again and no uncommitted one
is skipped.
"""

from __future__ import annotations

import itertools
import json
import logging
import pickle
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ingest import errors, metrics
from ingest.config import SnapshotConfig, SourceConfig, Targets
from ingest.errors import IngestError, SinkError
from ingest.faults import crash_point
from ingest.model.changes import RejectedValue
from ingest.model.position import Watermark
from ingest.model.schema import TableSchema, target_columns
from ingest.sink.catalog import cached_pyiceberg_catalog
from ingest.sink.changelog import ensure_changelog
from ingest.sink.data_files import DataFileWriter, append_files, writable_from_arrow
from ingest.sink.recopy import finish_branch_copy
from ingest.sink.rejected import ensure_rejected, merge_rejected
from ingest.sink.summary import SUMMARY_CHUNKS_DONE, SUMMARY_PIPELINE
from ingest.sink.targets import (
    COPY_BRANCH,
    chunks_done_in_target,
    copy_snapshots,
    copy_under_way,
    encode_ranges,
    ensure_target_created,
    job_head,
    on_copy_branch,
    table_of,
)
from ingest.source.binlog.partitions import read_layout
from ingest.source.mysql import connect
from ingest.source.snapshot.chunk_reader import ChunkHook, ChunkTask, read_chunk
from ingest.source.snapshot.chunks import Chunk, split_table
from ingest.source.snapshot.snapshot_source import (
    REJECTED_COLUMN,
    ROWS_PER_BATCH,
    chunk_reports,
    group_tasks,
    make_chunk_source,
    write_chunk_files,
)
from ingest.source.snapshot.throttle import source_throttle
from ingest.source.watermark import read_watermark
from ingest.state.table import ChunkRecord, StateTable
from ingest.text import counted

log = logging.getLogger(__name__)

SUMMARY_BATCH = "ingest.snapshot.batch"


_source_counter = itertools.count()


@dataclass(frozen=True)
class Copying:
    """What the snapshot's copy takes from the pipeline file: where it reads (`source`), how (`snapshot`), and
    the tables it writes (`targets`)."""

    source: SourceConfig
    snapshot: SnapshotConfig
    targets: Targets


def _batched(items: Sequence[Chunk], size: int) -> Iterator[list[Chunk]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def snapshot_table(
    spark: Any,
    copying: Copying,
    state: StateTable,
    flavor: str,
    schema: TableSchema,
    ready: tuple[str, list[Chunk], set[int]],
    hook: ChunkHook | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Copy the table's chunks not copied yet (`ready`: what `ready_table` returned), one commit of
    `snapshot.chunks_per_commit` chunks after another; before each, wait while the source is above
    `snapshot.max_source_load`. Once `stop` is set (during a pause too), return after the current commit."""
    table_id = schema.table_id
    target, plan, done = ready
    todo = [c for c in plan if c.index not in done]
    if not todo:
        return
    started = time.monotonic()
    rows_done = 0
    throttle = source_throttle(copying.source, copying.snapshot.max_source_load)
    stop = stop or threading.Event()
    for batch in _batched(todo, copying.snapshot.chunks_per_commit):
        # Between commits only: a pause delays the next read, never a commit or its watermarks.
        if stop.is_set() or (throttle and not throttle.wait(stop, f"{table_id}: chunks {len(done)}/{len(plan)}")):
            log.info("%s: stopping at chunks %d/%d, as asked", table_id, len(done), len(plan))
            return
        records = copy_chunks(spark, copying, state, flavor, schema, target, batch, done, hook)
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
    finish_copy(spark, copying.targets, schema, target)


def ready_table(
    spark: Any, copying: Copying, state: StateTable, flavor: str, schema: TableSchema
) -> tuple[str, list[Chunk], set[int]]:
    """Make a table ready for its chunks to be read: planned (`plan_table`), the chunks a run that died committed
    recorded (`reconcile`), and, when every chunk is read, its copy made visible (a run that stopped between the
    last chunk and the swap). Returns where its chunks go, its plan, and the chunks done."""
    table_id = schema.table_id
    target = plan_table(spark, copying, state, flavor, schema)
    plan = state.plan(table_id) or []
    done = reconcile(copying.targets, state, schema)
    metrics.current().snapshot_progress(table_id, len(done), len(plan))
    if len(done) == len(plan):
        log.info("%s: snapshot complete (%s)", table_id, counted(len(plan), "chunk"))
        finish_copy(spark, copying.targets, schema, target)
    return target, plan, done


def plan_table(
    spark: Any,
    copying: Copying,
    state: StateTable,
    flavor: str,
    schema: TableSchema,
    schema_read_after: Watermark | None = None,
) -> str:
    """Create the target (and changelog table) if missing, and split the table into chunks unless it was.

    The plan records a binlog position earlier than every chunk: `schema_read_after`, a position read before
    `schema` was loaded, when given, else the position now. With it, a DDL statement before that position is
    known to be in the target already (see binlog_batch.TableStream.contained_until).

    Returns the Spark name the table's chunks are written to: the target's copy branch while one exists."""
    table_id = schema.table_id

    def partitions() -> str | None:  # kept for the rows a later DROP or TRUNCATE PARTITION removes
        with connect(copying.source) as conn:
            layout = read_layout(conn, schema.database, schema.table)
        return None if layout is None else layout.to_json()

    target, created = ensure_target_created(spark, copying.targets, schema, partitions)
    if _copying_into_branch(copying.targets, state, schema):
        target = on_copy_branch(target)
    if created and state.done(table_id):
        raise SinkError(
            f"{table_id}: the state table records {len(state.done(table_id))} chunks copied, but the target {target} "
            f"did not exist (dropped?): the rows they hold are gone. Snapshot the table again: `ingest resnapshot "
            f"--config ... --table {table_id}`, then `ingest run`"
        )
    ensure_changelog(spark, copying.targets, schema)  # the changelog starts with the binlog phase (docs/config.md)
    if state.plan(table_id) is None:
        chunk_size = (
            copying.targets.options_for(schema.database, schema.table).chunk_size or copying.snapshot.chunk_size
        )
        with connect(copying.source) as conn:
            planned_at = schema_read_after or read_watermark(conn, flavor)
            plan = split_table(conn, schema, chunk_size)
        state.save_plan(table_id, plan, planned_at)
        crash_point("snapshot.after_plan")
        log.info("%s: planned %s of up to %d rows", table_id, counted(len(plan), "chunk"), chunk_size)
    return target


def _copying_into_branch(targets: Targets, state: StateTable, schema: TableSchema) -> bool:
    """Whether the target is being copied again into its branch. A branch that lacks chunks the state table
    records was started over (`ingest resnapshot` stopped between its two steps, see resnapshot.py): those
    records describe the old copy, so they are forgotten here and the caller plans the table again."""
    table_id = schema.table_id
    table = cached_pyiceberg_catalog(targets.sink).load_table(targets.target_for(schema.database, schema.table))
    if not copy_under_way(table):
        return False
    stale = set(state.done(table_id)) - chunks_done_in_target(table, targets.pipeline)
    if stale:
        log.info("%s: the copy branch was started over; forgetting %d chunks of the old copy", table_id, len(stale))
        state.forget(table_id)
    return True


def finish_copy(spark: Any, targets: Targets, schema: TableSchema, target: str) -> None:
    """Every chunk is in the target: if it was copied into its branch, let readers see the copy (the swap).

    `target` is the name the chunks were written to (`plan_table`'s): only a branch name can need the swap, so
    a table copied into main costs no look at the catalog."""
    if target == table_of(target):
        return
    names = targets.target_for(schema.database, schema.table)
    finish_branch_copy(cached_pyiceberg_catalog(targets.sink), names, spark, target)


def copy_chunks(
    spark: Any,
    copying: Copying,
    state: StateTable,
    flavor: str,
    schema: TableSchema,
    target: str,
    chunks: list[Chunk],
    done: set[int],
    hook: ChunkHook | None = None,
) -> list[ChunkRecord]:
    """Read `chunks` on the executors, append them to the target in one commit, then record them (`done`: the
    table's chunks committed before). While the sink cannot be reached the commit waits (`state.outage`), and a
    commit cut off is looked for in the target before the chunks are read and committed again."""
    policy = copying.targets.options_for(schema.database, schema.table).on_unrepresentable
    tasks = [ChunkTask(copying.source, flavor, schema, c, hook, copying.snapshot.driver, policy) for c in chunks]

    def commit(again: bool) -> list[ChunkRecord]:
        landed = _landed(copying.targets, state, schema, chunks) if again else []
        return landed or _commit_chunks(spark, copying, flavor, schema, target, tasks, done)

    records = state.outage.run(f"committing {schema.table_id}'s {counted(len(chunks), 'chunk')}", commit)
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


@contextmanager
def _executor_errors() -> Iterator[None]:
    """A Spark job's failure from the job's own error on an executor is raised as that error (`executor_error`)."""
    try:
        yield
    except Exception as e:
        ours = executor_error(e)
        if ours is None:
            raise
        raise ours from None


def reconcile(targets: Targets, state: StateTable, schema: TableSchema) -> set[int]:
    """Chunks done = recorded in the state table, or committed to the target by a run that died before
    recording them (those are recorded now, from the target's snapshot summaries)."""
    table_id = schema.table_id
    recorded = set(state.done(table_id))
    namespace, name = targets.target_for(schema.database, schema.table)
    table = cached_pyiceberg_catalog(targets.sink).load_table((namespace, name))
    committed = chunks_done_in_target(table, targets.pipeline)
    missing = committed - recorded
    if missing:
        plan = {c.index: c for c in state.plan(table_id) or []}
        records = _records_in_target(table, targets.pipeline, {i: plan[i] for i in missing}, state.planned_at(table_id))
        log.info(
            "%s: recording %d chunks committed by an earlier run that stopped before recording them",
            table_id,
            len(records),
        )
        state.record_chunks(records)
    return recorded | committed


def _records_in_target(
    table: Any, pipeline: str, chunks: dict[int, Chunk], planned_at: Watermark | None
) -> list[ChunkRecord]:
    """The records of `chunks`, committed to `table`, from its snapshot summaries."""
    batches = _batch_records_in_target(table, pipeline)
    records = []
    for index in sorted(chunks):
        # Without its batch's snapshot (expired), the plan-time watermark: earlier than the chunk's real one, which
        # only makes the binlog phase replay more.
        record = batches.get(index) or ChunkRecord(chunks[index], planned_at)
        records.append(
            ChunkRecord(
                chunks[index],
                record.high_watermark,
                record.low_watermark,
                record.row_count,
                record.window_events,
                record.target_snapshot_id,
            )
        )
    return records


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


def _commit_chunks(
    spark: Any,
    copying: Copying,
    flavor: str,
    schema: TableSchema,
    target: str,
    tasks: list[ChunkTask],
    done: set[int],
) -> list[ChunkRecord]:
    """The chunks of `tasks` read and appended to `target` in one commit, on the path their types allow."""
    table = _arrow_writable(copying.targets, schema, tasks[0])
    if table is not None and len(tasks) == 1:
        return [_commit_in_driver(copying.targets, table, target, tasks[0], set(done))]
    if table is not None:
        return _commit_files(spark, copying, table, target, tasks, set(done))
    with connect(copying.source) as conn:
        floor = read_watermark(conn, flavor)
    return _commit_batch(spark, copying, target, tasks, target_columns(schema), set(done), floor)


def _landed(targets: Targets, state: StateTable, schema: TableSchema, chunks: list[Chunk]) -> list[ChunkRecord]:
    """The records of `chunks` if the target holds them (one commit has them all, or none): a commit whose outcome
    the sink's outage hid."""
    table = cached_pyiceberg_catalog(targets.sink).load_table(targets.target_for(schema.database, schema.table))
    if not {c.index for c in chunks} & chunks_done_in_target(table, targets.pipeline):
        return []
    log.info("%s: the commit cut off by the sink landed; its chunks are not read again", schema.table_id)
    return _records_in_target(table, targets.pipeline, {c.index: c for c in chunks}, state.planned_at(schema.table_id))


def _commit_batch(
    spark: Any,
    copying: Copying,
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
        f"ingest_chunks_{next(_source_counter)}", tasks, targets, copying.snapshot.parallelism, reports
    )
    spark.dataSource.register(source)
    data = spark.read.format(source.name()).load()
    by_index = {t.chunk.index: t.chunk for t in tasks}
    with _executor_errors():
        if tasks[0].on_unrepresentable == "dead_letter":
            data = _commit_rejected(spark, copying.targets, tasks[0].schema, data)
        crash_point("snapshot.before_commit")
        writer = data.writeTo(target)
        for key, value in _batch_properties(copying.targets, done_before, sorted(by_index), floor).items():
            writer = writer.option(f"snapshot-property.{key}", value)
        writer.append()
    metas: dict[int, dict[str, Any]] = reports.value
    snapshot_id = _current_snapshot_id(copying.targets, tasks[0].schema)
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


def _arrow_writable(targets: Targets, schema: TableSchema, task: ChunkTask) -> Any:
    """The target's pyiceberg table when the chunks' Arrow may go to its data files without Spark's writer
    (`writable_from_arrow`), else None: also where rejected values are kept (`dead_letter`), which Spark splits
    from the rows."""
    if task.on_unrepresentable == "dead_letter":
        return None
    table = cached_pyiceberg_catalog(targets.sink).load_table(targets.target_for(schema.database, schema.table))
    return table if writable_from_arrow(table) else None


def _commit_in_driver(targets: Targets, table: Any, target: str, task: ChunkTask, done_before: set[int]) -> ChunkRecord:
    """Read one chunk here, in the driver, and append it to the target with pyiceberg: a commit of one chunk has
    nothing to read in parallel, and a Spark job would cost it seconds (a Python data source, its workers, a
    Spark job) where the read and the append take milliseconds. Most small tables are one chunk. The commit
    carries what `_commit_batch`'s does, so a run that dies before the state table's record finds the chunk in
    the target's summaries the same way."""
    chunk = task.chunk
    result = read_chunk(task)
    files = DataFileWriter(table).write([result.table], ROWS_PER_BATCH)
    crash_point("snapshot.before_commit")
    append_files(table, files, _batch_properties(targets, done_before, [chunk.index], result.low), _branch(target))
    return ChunkRecord(chunk, result.high, result.low, result.table.num_rows, result.window_events, _head_id(table))


def _commit_files(
    spark: Any, copying: Copying, table: Any, target: str, tasks: list[ChunkTask], done_before: set[int]
) -> list[ChunkRecord]:
    """Read a batch of chunks on the executors, which write their rows to data files of the target themselves
    (ingest/sink/data_files.py), and append the files in one commit from here: Spark's JVM never converts the rows.
    The commit carries what `_commit_batch`'s does. The chunks' watermarks come back with the files, before the
    commit; the floor in its summary is the earliest low watermark among them."""
    # Spark's RDD API, not a Python data source: a data source costs a creation and a planning in Python
    # processes of their own before the read, and the rows returned here are only the partitions' files. The RDD
    # holds the groups' numbers; the tasks, which hold the source's password, travel in the function, as a data
    # source's partitions do (PySpark writes the elements of `parallelize` to a temporary file).
    groups = group_tasks(tasks, copying.snapshot.parallelism)
    writer = DataFileWriter(table)
    with _executor_errors():
        written = (
            spark.sparkContext.parallelize(range(len(groups)), len(groups))
            .map(lambda i: write_chunk_files(groups[i], writer))
            .collect()
        )
    reports = {int(index): meta for text, _ in written for index, meta in json.loads(text)}
    files = [f for _, blob in written for f in pickle.loads(blob)]
    by_index = {t.chunk.index: t.chunk for t in tasks}
    lows = [Watermark.from_json(m["low"]) for m in reports.values()]
    floor = min(lows, key=lambda w: w.position)
    crash_point("snapshot.before_commit")
    append_files(
        table, files, _batch_properties(copying.targets, done_before, sorted(by_index), floor), _branch(target)
    )
    snapshot_id = _head_id(table)
    return [
        ChunkRecord(
            chunk,
            Watermark.from_json(reports[index]["high"]),
            Watermark.from_json(reports[index]["low"]),
            reports[index]["rows"],
            reports[index]["window_events"],
            snapshot_id,
        )
        for index, chunk in sorted(by_index.items())
    ]


def _batch_properties(targets: Targets, done_before: set[int], chunks: list[int], floor: Watermark) -> dict[str, str]:
    """The summary of a commit of chunks: the pipeline, every chunk done with these, and the floor of their
    watermarks (what `reconcile` reads back)."""
    batch_info = {"floor": floor.to_json(), "chunks": chunks}
    return {
        SUMMARY_PIPELINE: targets.pipeline,
        SUMMARY_CHUNKS_DONE: encode_ranges(done_before | set(chunks)),
        SUMMARY_BATCH: json.dumps(batch_info, separators=(",", ":")),
    }


def _branch(target: str) -> str:
    """The branch of the Spark name `target`: the copy branch, or main."""
    from pyiceberg.table.refs import MAIN_BRANCH

    return COPY_BRANCH if table_of(target) != target else MAIN_BRANCH


def _head_id(table: Any) -> int | None:
    """The id of the head the job writes, of a table a commit left at the metadata it committed."""
    head = job_head(table)
    return None if head is None else int(head.snapshot_id)


def _commit_rejected(spark: Any, targets: Targets, schema: TableSchema, data: Any) -> Any:
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
        name = ensure_rejected(spark, targets, schema.database, schema.table)
        assert name is not None, "dead_letter tables have a rejected table"
        merge_rejected(spark, name, rows)
        crash_point("snapshot.after_rejected_commit")
    return data.where(F.col(REJECTED_COLUMN).isNull()).drop(REJECTED_COLUMN)


def _current_snapshot_id(targets: Targets, schema: TableSchema) -> int | None:
    """The target's head the job writes (its copy branch's while one exists), read with pyiceberg (a Spark query of
    `.snapshots` costs a Spark job)."""
    namespace, name = targets.target_for(schema.database, schema.table)
    snapshot = job_head(cached_pyiceberg_catalog(targets.sink).load_table((namespace, name)))
    return None if snapshot is None else int(snapshot.snapshot_id)
