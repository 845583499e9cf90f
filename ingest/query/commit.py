"""A binlog batch committed (`commit_prepared`), every commit tagged with the batch's end offset in its snapshot
summary, so that each table says itself which batches it holds.

Where the catalog can (a JDBC catalog, a REST catalog with the transactions endpoint: ingest/sink/atomic.py), the
batch is one commit: each table's part is staged (a small target's change by pyiceberg; Spark's MERGE or changelog
append into the table's stage branch), then every target, changelog and the offset with its cut land together, or
none does. Elsewhere (and for a batch whose foreign key actions act in turn), each table commits on its own, its
target then its changelog, then the offset is recorded in the state table. A crash anywhere replays the batch; each
table skips what it already holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from ingest import metrics
from ingest.config import StreamConfig, Targets
from ingest.errors import CommitConflictError
from ingest.faults import crash_point
from ingest.model.position import BinlogPosition, Watermark
from ingest.query.batch import TableBatch, TableStream
from ingest.query.chains import settle_chains
from ingest.sink.atomic import (
    Staged,
    can_commit_together,
    commit_together,
    publish_stage,
    staged,
    start_stage,
)
from ingest.sink.catalog import cached_pyiceberg_catalog
from ingest.sink.changelog import append_changelog, with_acted_rows
from ingest.sink.driver_apply import apply_in_driver, driver_target, stage_in_driver
from ingest.sink.key_actions import act_on_target
from ingest.sink.maintenance import maintain
from ingest.sink.merge import MAX_ATTEMPTS, committed_offset, merge_arrow, stream_offset_properties
from ingest.sink.rejected import ensure_rejected, merge_rejected
from ingest.sink.summary import snapshot_properties
from ingest.sink.targets import on_stage_branch, qualified, table_of
from ingest.state.table import CutTables, StateTable

log = logging.getLogger(__name__)


def commit_prepared(
    spark: Any,
    targets: Targets,
    stream: StreamConfig,
    state: StateTable,
    tables: dict[str, TableStream],
    prepared: Sequence[TableBatch],
    end: Watermark,
    source_time: int | None = None,
    started: float | None = None,
    settle: bool = False,
) -> None:
    """Commit a batch made ready by `prepare_batch`: per table its rejected values, its target, its changelog
    (each skipped when it holds the batch already), all tagged with `end`; then `end` as the job's offset.
    `settle`: a commit of this batch was cut off before (the sink away): what each table holds is looked at first,
    as at a run's start, so that a commit that landed unknown to the job is not applied twice."""
    started = time.monotonic() if started is None else started
    if settle:
        _look_at_tables(targets, tables, prepared, end)

    # Foreign key actions that act in turn are worked out from the rows they reached, read before any commit.
    chained = any(p.pending is not None for p in prepared)
    prepared = settle_chains(spark, targets, stream, tables, prepared, end.position)
    batch = _Batch(spark, targets, stream, state, tables, end, source_time)
    if not chained and _together(targets):
        results = _commit_together(batch, prepared)
    else:
        results = _commit_table_by_table(batch, prepared, chained)
    applied_to = {p.table_id: p.applied for p, ok in zip(prepared, results, strict=True) if ok and p.applied}
    metrics.current().batch_committed(applied_to, time.monotonic() - started, end.position, source_time)
    log.info(
        "binlog: committed %d changes to %d tables up to %s",
        sum(p.applied for p in prepared),
        sum(results),
        end.position,
    )
    _maintain_due(spark, targets, [tables[p.table_id] for p in prepared], end)


def _together(targets: Targets) -> bool:
    """A batch lands in one commit: asked (`sink.one_commit`), of format 2 targets (pyiceberg, which makes that
    commit, writes no format 3 metadata), on a catalog that can."""
    sink = targets.sink
    return sink.one_commit and sink.format_version == 2 and can_commit_together(cached_pyiceberg_catalog(sink))


@dataclass(frozen=True)
class _Batch:
    """A batch being committed: where to, and up to which offset."""

    spark: Any
    targets: Targets
    stream: StreamConfig
    state: StateTable
    tables: dict[str, TableStream]
    end: Watermark
    source_time: int | None


def _commit_table_by_table(batch: _Batch, prepared: Sequence[TableBatch], chained: bool) -> list[bool]:
    """Each table committed on its own, then the offset: where the catalog cannot commit tables together, and for a
    batch whose foreign key actions act in turn (those tables commit in order, ingest.query.chains)."""
    spark, targets, stream, tables, end = batch.spark, batch.targets, batch.stream, batch.tables, batch.end
    # Every commit of the batch, whatever its table, carries the same summary: set it once for all threads.
    with snapshot_properties(spark, stream_offset_properties(targets.pipeline, end)):
        results = _each_part(
            stream,
            prepared,
            1 if chained else None,
            lambda p: _commit_part(spark, targets, stream, tables[p.table_id], p, end),
        )
    crash_point("stream.before_state")
    batch.state.record_offset(end, batch.source_time, table_cut(targets, tables, end.position))
    crash_point("stream.after_state")
    return results


def _commit_together(batch: _Batch, prepared: Sequence[TableBatch]) -> list[bool]:
    """The batch in one commit of the catalog (ingest.sink.atomic): every table's part staged (pyiceberg's changes
    of small targets; Spark's writes into each table's stage branch), then every target, changelog and the offset
    (with its cut) land together, or none does. Readers of main never see part of a batch. When another writer
    committed to one of the tables meanwhile, the batch is staged again from fresh metadata."""
    from pyiceberg.exceptions import CommitFailedException

    catalog, end = cached_pyiceberg_catalog(batch.targets.sink), batch.end
    for attempt in range(1, MAX_ATTEMPTS + 1):
        with snapshot_properties(batch.spark, stream_offset_properties(batch.targets.pipeline, end)):
            parts = _each_part(batch.stream, prepared, None, lambda p: _stage_part(batch, catalog, p))
        cut = table_cut(batch.targets, batch.tables, end.position)
        offset, recorded = batch.state.offset_change(end, batch.source_time, cut)
        crash_point("stream.before_state")
        try:
            commit_together(catalog, [*(c for part in parts for c in part.changes), offset])
        except CommitFailedException as e:
            metrics.current().commit_retried("the batch's tables")
            log.warning("batch up to %s: commit conflict at attempt %d, staging again: %s", end.position, attempt, e)
            batch.state.refresh()
            for p in prepared:
                batch.tables[p.table_id].forget_heads()
            time.sleep(0.2 * attempt)
            continue
        recorded()
        crash_point("stream.after_state")
        for p, part in zip(prepared, parts, strict=True):
            table = batch.tables[p.table_id]
            if part.target:
                table.committed, table.committed_known = end.position, True
            if part.changelog:
                table.changelog_committed = end.position
        return [part.target for part in parts]
    raise CommitConflictError(f"the batch up to {end.position} kept conflicting with other writers")


def _each_part(stream: StreamConfig, prepared: Sequence[TableBatch], workers: int | None, run: Any) -> list[Any]:
    """`run` of every part, `stream.concurrent_merges` at a time (or `workers`); the first failure is raised."""
    workers = min(len(prepared), stream.concurrent_merges) if workers is None else workers
    if workers <= 1:
        return [run(p) for p in prepared]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="merge") as pool:
        futures = [pool.submit(run, part) for part in prepared]
        wait(futures)
        return [f.result() for f in futures]


@dataclass
class _StagedPart:
    changes: list[Staged] = field(default_factory=list)
    target: bool = False
    """The target takes the batch in the batch's commit."""
    changelog: bool = False
    """The changelog table takes it."""


def _stage_part(batch: _Batch, catalog: Any, part: TableBatch) -> _StagedPart:
    """One table's part of a batch staged for the batch's one commit (its rejected values committed now: a replay
    adds none twice). A target copied again into its copy branch commits there now, outside the cut."""
    spark, targets, stream, end = batch.spark, batch.targets, batch.stream, batch.end
    table = batch.tables[part.table_id]
    staged_part = _StagedPart()
    rows, where, changelog = _part_rows(spark, targets, table, part, end)
    if changelog is not None and not _holds(table.changelog_committed, end):
        assert table.changelog is not None
        crash_point("stream.before_changelog_commit")
        base = start_stage(catalog, table.changelog)
        _append_changelog(spark, targets, table, changelog, end, on_stage=True)
        published = publish_stage(catalog, table.changelog, base)
        if published is not None:
            staged_part.changes.append(published[0])
            table.changelog_head, table.changelog_head_known, staged_part.changelog = published[1], True, True
        crash_point("stream.after_changelog_commit")
    if rows is None or _holds(table.committed, end):
        return staged_part
    if table.target != table_of(table.target):  # its copy branch, which readers do not see
        staged_part.target = _merge_table(spark, targets, stream, table, rows, where, part.append, end)
        return staged_part
    names = targets.target_for(table.schema.database, table.schema.table)
    driver = driver_target(catalog, names, table.target, table.schema, stream, rows, part.append)
    if driver is not None:
        properties = stream_offset_properties(targets.pipeline, end)
        transaction = stage_in_driver(driver, table.schema, rows, properties)
        head = transaction.table_metadata.current_snapshot()
        staged_part.changes.append(staged(driver.table, transaction))
        table.head, table.head_known, staged_part.target = head.snapshot_id, True, True
    else:
        base = start_stage(catalog, names)
        target = on_stage_branch(table.target)
        merge_arrow(spark, target, table.schema, rows, where, end, lambda: table.committed, part.append)
        published = publish_stage(catalog, names, base)
        if published is not None:
            staged_part.changes.append(published[0])
            table.head, table.head_known, staged_part.target = published[1], True, True
    crash_point("stream.after_table_commit")
    return staged_part


def _holds(committed: BinlogPosition | None, end: Watermark) -> bool:
    return committed is not None and committed >= end.position


def _part_rows(
    spark: Any, targets: Targets, table: TableStream, part: TableBatch, end: Watermark
) -> tuple[Any, str | None, Any]:
    """A part's rejected values committed, and its target's rows, read filter and changelog rows, with what its
    foreign key actions do to the target's rows."""
    if part.rejected:  # before the target: a target holding the batch implies its rejected rows are held
        name = ensure_rejected(spark, targets, table.schema.database, table.schema.table)
        assert name is not None
        merge_rejected(spark, name, part.rejected)
        crash_point("stream.after_rejected_commit")
    rows, where, changelog = part.rows, part.where, part.changelog
    if part.actions and not part.target_acted and not _holds(table.committed, end):
        # The target's rows the batch's foreign key actions reach, as they are before the batch (it holds none
        # of it), acted on; and what each action did to them, for the changelog.
        assert rows is not None
        read_at = table.read_at() if table.chunks_by_value else None  # else no action straddles chunk reads
        rows, where, acted = act_on_target(spark, table.target, table.schema, rows, part.actions, read_at)
        if table.changelog is not None and acted:
            changelog = with_acted_rows(table.schema, changelog, acted, part.action_origins)
    return rows, where, changelog


def _commit_part(
    spark: Any, targets: Targets, stream: StreamConfig, table: TableStream, part: TableBatch, end: Watermark
) -> bool:
    """One table's part of a batch: its rejected values, its target, its changelog (each skipped when it holds the
    batch already). True when the target was committed now."""
    merged = False
    rows, where, changelog = _part_rows(spark, targets, table, part, end)
    # With foreign key actions the changelog commits first: what they did to rows the batch does not change is
    # read from the target, which holds the rows as they were before the batch only until its own commit.
    log_first = bool(part.actions)

    def commit_changelog() -> None:
        if changelog is not None:
            crash_point("stream.before_changelog_commit")
            _append_changelog(spark, targets, table, changelog, end)
            table.changelog_head_known = False  # committed through Spark: looked up for the cut
            crash_point("stream.after_changelog_commit")

    if log_first:
        commit_changelog()
    if rows is not None:
        merged = _merge_table(spark, targets, stream, table, rows, where, part.append, end)
        crash_point("stream.after_table_commit")
    if not log_first:
        commit_changelog()
    return merged


def _look_at_tables(
    targets: Targets, tables: dict[str, TableStream], prepared: Sequence[TableBatch], end: Watermark
) -> None:
    for part in prepared:
        table = tables[part.table_id]
        names = targets.target_for(table.schema.database, table.schema.table)
        table.committed = committed_in(targets, names, end, table.committed)
        table.forget_heads()
        if table.changelog is not None:
            table.changelog_committed = committed_in(targets, table.changelog, end, table.changelog_committed)


def _maintain_due(spark: Any, targets: Targets, tables: list[TableStream], end: Watermark) -> None:
    """Compact (and expire) each target and changelog table of the batch that reached its commit count."""
    every = targets.sink.maintenance.every_commits
    if every == 0:
        return
    for table in tables:
        changelog = None if table.changelog is None else qualified(targets, *table.changelog)
        for name, held in ((table.target, table.committed), (changelog, table.changelog_committed)):
            if name is None or held != end.position:
                continue  # no changelog, or nothing of this batch committed to it
            if name != table_of(name):
                continue  # copied into its branch: main is what readers see, and expiry must keep the branch
            table.since_compaction[name] = table.since_compaction.get(name, 0) + 1
            if table.since_compaction[name] >= every:
                maintain(spark, name, targets.pipeline, end, targets.sink.maintenance)
                table.since_compaction[name] = 0
                # compacted: a new snapshot, looked up for the cut
                if name == table.target:
                    table.head_known = False
                else:
                    table.changelog_head_known = False


def _merge_table(
    spark: Any,
    targets: Targets,
    stream: StreamConfig,
    table: TableStream,
    rows: Any,
    where: str | None,
    append: bool,
    end: Watermark,
) -> bool:
    attempts = 0
    names = targets.target_for(table.schema.database, table.schema.table)

    def read_offset() -> BinlogPosition | None:
        # This run knows what the table holds (read from it at start, then kept by its own commits): only a
        # retry, after a commit of this very batch whose outcome was unknown, needs a look at the table.
        nonlocal attempts
        attempts += 1
        if attempts == 1 or (table.committed is not None and table.committed >= end.position):
            return table.committed
        return committed_in(targets, names, end, table.committed)

    catalog = cached_pyiceberg_catalog(targets.sink)
    driver = driver_target(catalog, names, table.target, table.schema, stream, rows, append)
    if driver is not None:
        properties = stream_offset_properties(targets.pipeline, end)
        done = apply_in_driver(driver, table.target, table.schema, rows, end, properties, read_offset)
        head = driver.table.current_snapshot()
        table.head, table.head_known = (None if head is None else head.snapshot_id), True
    else:
        done = merge_arrow(spark, table.target, table.schema, rows, where, end, read_offset, append)
        table.head_known = False  # committed through Spark: looked up for the cut
    table.committed, table.committed_known = end.position, True
    return done


def table_cut(targets: Targets, tables: Mapping[str, TableStream], at: BinlogPosition) -> CutTables:
    """The cut at the offset `at` about to be recorded: per table whose copy is complete and whose main branch the
    binlog phase writes, its Iceberg table and the snapshot that holds it (looked up where the job's last commit of
    it went through Spark; None: empty), and the same of its changelog table. A table still being copied, into its
    branch or chunk by chunk, is whole only once its last chunk is read, and joins the cut then. A table (or
    changelog) that holds more than `at` (a batch committed table by table, cut off by a crash, is replayed in other
    batches) joins it once the offset has caught up with it. So does a table whose last chunk was read after `at`
    (a chunk read while the binlog phase streams holds its rows as of its high watermark, which a batch committed
    meanwhile can end before)."""
    cut: dict[str, tuple[str, int | None]] = {}
    changelogs: dict[str, tuple[str, int | None]] = {}
    for table_id, table in sorted(tables.items()):
        if table.unread or table.target != table_of(table.target):
            continue
        if _ahead(table.committed, at) or _ahead(table.last_read, at):
            continue
        names = targets.target_for(table.schema.database, table.schema.table)
        if not table.head_known:
            table.head, table.head_known = _head(targets, names), True
        cut[table_id] = (".".join(names), table.head)
        if table.changelog is None or _ahead(table.changelog_committed, at):
            continue
        if not table.changelog_head_known:
            table.changelog_head, table.changelog_head_known = _head(targets, table.changelog), True
        changelogs[table_id] = (".".join(table.changelog), table.changelog_head)
    return CutTables(cut, changelogs)


def _ahead(committed: BinlogPosition | None, at: BinlogPosition) -> bool:
    return committed is not None and committed > at


def _head(targets: Targets, names: tuple[str, str]) -> int | None:
    head = cached_pyiceberg_catalog(targets.sink).load_table(names).current_snapshot()
    return None if head is None else int(head.snapshot_id)


def _append_changelog(
    spark: Any, targets: Targets, table: TableStream, rows: Any, end: Watermark, on_stage: bool = False
) -> None:
    """Append the part's changelog rows (to the changelog table's stage branch with `on_stage`, published by the
    batch's one commit)."""
    assert table.changelog is not None
    names = table.changelog
    attempts = 0

    def read_offset() -> BinlogPosition | None:
        nonlocal attempts  # as for the target: only a retry needs a look at the table
        attempts += 1
        done = table.changelog_committed
        if attempts == 1 or (done is not None and done >= end.position):
            return done
        return committed_in(targets, names, end, done)

    name = qualified(targets, *names)
    if on_stage:
        append_changelog(spark, on_stage_branch(name), rows, targets.pipeline, end, lambda: table.changelog_committed)
        return
    append_changelog(spark, name, rows, targets.pipeline, end, read_offset)
    table.changelog_committed = end.position


def committed_in(
    targets: Targets, names: tuple[str, str], now: Watermark, known: BinlogPosition | None
) -> BinlogPosition | None:
    """The newest batch end the Iceberg table `names` holds, read from its current metadata.

    `now` is a point of this run (its server id is the server read now); `known` is what the table held at
    the start of the run, as a position of this server: a newest commit made on another server (before a
    failover) is that one, since a commit of this run would carry this server's id.
    """
    held = committed_offset(cached_pyiceberg_catalog(targets.sink).load_table(names), targets.pipeline)
    if held is None or (held.server_id is not None and held.server_id != now.server_id):
        return known if held is not None else None
    return held.position


def batch_source_time(previous: int | None, last_commit: int | None, idle_at: float | None) -> int | None:
    """When the source was at a batch's end: at the idle report's time when the batch ends on one, else at its
    last transaction's commit, else as before it."""
    if idle_at is not None:
        return int(idle_at)
    return previous if last_commit is None else last_commit
