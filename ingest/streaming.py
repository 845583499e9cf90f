"""The binlog phase: after the snapshot, every committed transaction lands in Iceberg exactly once.

Loop: read whole transactions from the last offset every target committed, filter what a table
already holds (its own committed offset, and the chunk high-watermark filter of Flink CDC 2.0 for
changes inside the snapshot's window), materialize per table, MERGE each table with the batch's end
offset in its snapshot summary (then append the uncollapsed changes to its changelog table, if it has
one, tagged the same way), then record the offset in the state table. A crash anywhere in between
replays the batch; each target and each changelog skips what it already committed.
"""

from __future__ import annotations

import bisect
import logging
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ingest.changes.changelog import SourceChange, changelog_rows
from ingest.changes.materializer import Change, materialize
from ingest.config import PipelineConfig
from ingest.faults import crash_point
from ingest.sink.catalog import cached_pyiceberg_catalog, load_pyiceberg_catalog
from ingest.sink.changelog import append_changelog
from ingest.sink.merge import committed_offset, merge_into
from ingest.sink.targets import qualified
from ingest.source.binlog import BinlogReader, RowChange, SchemaChangeError, Transaction, check_not_purged
from ingest.source.chunk_reader import in_chunk
from ingest.source.chunks import Chunk, Key
from ingest.source.mysql import TableSchema, connect
from ingest.source.position import BinlogPosition, Watermark
from ingest.source.prefetch import End, Idle, Prefetch, Tick
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable

log = logging.getLogger(__name__)


@dataclass
class TableStream:
    """What the binlog phase knows about one captured table."""

    schema: TableSchema
    target: str
    chunks: list[Chunk]
    chunk_highs: list[BinlogPosition]
    committed: BinlogPosition | None
    """The newest batch end this table's target holds (from its snapshot summaries)."""
    changelog: tuple[str, str] | None = None
    """(namespace, name) of the table's changelog table, when it has one."""
    changelog_committed: BinlogPosition | None = None
    """The newest batch end the changelog table holds."""

    @property
    def max_high(self) -> BinlogPosition:
        return max(self.chunk_highs)

    @property
    def min_high(self) -> BinlogPosition:
        return min(self.chunk_highs)


class HighWatermarkFilter:
    """Drops a change already contained in its key's chunk: position <= that chunk's high watermark.

    Past the table's highest chunk watermark every change passes without a lookup (the "pure binlog"
    flag). Chunk membership of string keys is decided by the server, as in the chunk reader.
    """

    def __init__(self, conn: Any, table: TableStream) -> None:
        self.conn = conn
        self.table = table
        self.numeric = all(c is None for c in table.schema.collations)
        self._lowers: list[Key] = [c.lower for c in table.chunks[1:] if c.lower is not None]

    def keep(self, changes: Sequence[RowChange]) -> list[RowChange]:
        table = self.table
        late = [c for c in changes if c.position > table.max_high]
        early = [c for c in changes if c.position <= table.max_high]
        if not early:
            return late
        positions = table.schema.key_positions()
        keys = [tuple(img[i] for i in positions) for c in early for img in (c.before, c.after) if img is not None]
        index = self._chunk_index(keys)
        kept = []
        for change in early:
            # A change is kept when any image's chunk was read before it happened.
            images = [img for img in (change.before, change.after) if img is not None]
            if any(change.position > table.chunk_highs[index[tuple(img[i] for i in positions)]] for img in images):
                kept.append(change)
        return kept + late

    def _chunk_index(self, keys: list[Key]) -> dict[Key, int]:
        unique = list(dict.fromkeys(keys))
        if self.numeric:
            return {k: bisect.bisect_right(self._lowers, k) for k in unique}
        result = {}
        for k in unique:
            for i, chunk in enumerate(self.table.chunks):
                if in_chunk(self.conn, self.table.schema, chunk, [k])[k]:
                    result[k] = i
                    break
        return result


def _table_streams(config: PipelineConfig, state: StateTable, schemas: Sequence[TableSchema]) -> list[TableStream]:
    catalog = load_pyiceberg_catalog(config.sink)
    out = []
    for schema in schemas:
        done = state.done(schema.table_id)
        plan = state.plan(schema.table_id) or []
        highs = []
        for chunk in plan:
            record = done.get(chunk.index)
            high = record.high_watermark if record else None
            if high is None:
                raise RuntimeError(f"{schema.table_id}: chunk {chunk.index} has no high watermark")
            highs.append(high.position)
        namespace, name = config.target_for(schema.database, schema.table)
        table = catalog.load_table((namespace, name))
        stream = TableStream(
            schema, qualified(config, namespace, name), plan, highs, committed_offset(table, config.name)
        )
        stream.changelog = config.changelog_for(schema.database, schema.table)
        if stream.changelog is not None:
            stream.changelog_committed = committed_offset(catalog.load_table(stream.changelog), config.name)
        out.append(stream)
    return out


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


def stream(
    spark: Any,
    config: PipelineConfig,
    state: StateTable,
    schemas: Sequence[TableSchema],
    flavor: str,
    until_caught_up: bool,
    stop: StopSignal | None = None,
) -> BinlogPosition:
    """Run the binlog phase; return the offset committed last."""
    tables = _table_streams(config, state, schemas)
    by_id = {t.schema.table_id: t for t in tables}
    recorded = state.stream_offset()
    start = recorded.position if recorded is not None else min(t.min_high for t in tables)
    with connect(config.source) as conn:
        check_not_purged(conn, start)
        goal = read_watermark(conn, flavor).position if until_caught_up else None
        filters = {t.schema.table_id: HighWatermarkFilter(conn, t) for t in tables}
        log.info("binlog phase from %s%s", start, f" until {goal}" if goal else "")
        reader = BinlogReader(
            config.source,
            schemas,
            start,
            blocking=not until_caught_up,
            heartbeat_seconds=config.stream.heartbeat_seconds,
            on_ddl=config.stream.on_schema_change,
        )
        # Parsing runs on a thread of its own, up to one batch ahead, while the previous batch commits.
        prefetch = Prefetch(reader, config.stream.batch_max_changes, _changes_in)
        pending: list[Transaction] = []
        pending_changes = 0
        last_flush = time.monotonic()
        committed = start
        taken = start
        """Every captured change before this position has been taken from the reader (commits stop here)."""

        source_time = state.offset_source_time()

        def flush(end: BinlogPosition, caught_up_at: float | None = None) -> None:
            nonlocal committed, last_flush, pending, pending_changes, source_time
            if end > committed or pending:
                if pending:
                    source_time = max(tx.commit_time for tx in pending)
                if caught_up_at is not None:
                    # A heartbeat: the source had nothing newer than `end` at that time.
                    source_time = int(caught_up_at)
                _commit(spark, config, state, by_id, filters, pending, end, source_time)
                committed = end
            pending = []
            pending_changes = 0
            last_flush = time.monotonic()

        def should_stop() -> bool:
            return stop is not None and stop.event.is_set()

        def batch_due() -> bool:
            return time.monotonic() - last_flush >= config.stream.batch_interval_seconds

        try:
            try:
                for item in prefetch:
                    if isinstance(item, Tick):
                        if should_stop():
                            break
                        continue
                    if isinstance(item, Idle):
                        # Captured tables idle at a heartbeat: move the offset, and look at the stop flag.
                        taken = item.position
                        if batch_due():
                            flush(taken, caught_up_at=item.at)
                        if should_stop():
                            break
                        continue
                    if isinstance(item, End):
                        taken = item.position
                        break
                    tx = item
                    pending.append(tx)
                    pending_changes += len(tx.changes)
                    taken = tx.end
                    if pending_changes >= config.stream.batch_max_changes or batch_due():
                        flush(tx.end)
                    if goal is not None and tx.end >= goal and not pending:
                        break
                    if should_stop():
                        break
            except SchemaChangeError:
                # Everything before the DDL is committed; the job stops at the statement.
                flush(taken)
                raise
            flush(taken)
        finally:
            prefetch.close()
            reader.close()
    return committed


def _changes_in(item: Any) -> int:
    return len(item.changes) if isinstance(item, Transaction) else 0


def _commit(
    spark: Any,
    config: PipelineConfig,
    state: StateTable,
    tables: dict[str, TableStream],
    filters: dict[str, HighWatermarkFilter],
    batch: list[Transaction],
    end: BinlogPosition,
    source_time: int | None = None,
) -> None:
    per_table: dict[str, list[RowChange]] = defaultdict(list)
    transaction_of: dict[int, Transaction] = {}
    for tx in batch:
        for change in tx.changes:
            per_table[change.table_id].append(change)
            transaction_of[id(change)] = tx
    merged = applied = 0
    for table_id, changes in sorted(per_table.items()):
        table = tables[table_id]
        # What the target (and the changelog) hold already is skipped, each by its own committed offset.
        floor = _older(table.committed, table.changelog_committed) if table.changelog else table.committed
        if floor is not None:
            changes = [c for c in changes if c.position > floor]
        changes = filters[table_id].keep(changes)
        to_merge = [c for c in changes if table.committed is None or c.position > table.committed]
        if to_merge:
            merged += _merge_table(spark, config, table, to_merge, end)
            applied += len(to_merge)
            crash_point("stream.after_table_commit")
        if table.changelog is not None:
            done = table.changelog_committed
            to_log = [c for c in changes if done is None or c.position > done]
            if to_log:
                crash_point("stream.before_changelog_commit")
                _append_changelog(spark, config, table, to_log, transaction_of, end)
                crash_point("stream.after_changelog_commit")
    crash_point("stream.before_state")
    state.record_offset(Watermark(end, None), source_time)
    crash_point("stream.after_state")
    log.info("binlog: committed %d changes to %d tables up to %s", applied, merged, end)


def _older(a: BinlogPosition | None, b: BinlogPosition | None) -> BinlogPosition | None:
    return None if a is None or b is None else min(a, b)


def _merge_table(
    spark: Any, config: PipelineConfig, table: TableStream, changes: list[RowChange], end: BinlogPosition
) -> bool:
    finals = materialize(
        (Change((c.position.file_number, c.position.pos, c.row_index), c.before, c.after) for c in changes),
        table.schema.primary_key_positions(),
    )

    attempts = 0

    def read_offset() -> BinlogPosition | None:
        # This run knows what the table holds (read from it at start, then kept by its own commits): only a
        # retry, after a commit of this very batch whose outcome was unknown, needs a look at the table.
        nonlocal attempts
        attempts += 1
        if attempts == 1 or (table.committed is not None and table.committed >= end):
            return table.committed
        namespace, name = config.target_for(table.schema.database, table.schema.table)
        return committed_offset(_catalog(config).load_table((namespace, name)), config.name)

    done = merge_into(spark, table.target, table.schema, finals, config.name, end, read_offset)
    table.committed = end
    return done


def _append_changelog(
    spark: Any,
    config: PipelineConfig,
    table: TableStream,
    changes: list[RowChange],
    transaction_of: dict[int, Transaction],
    end: BinlogPosition,
) -> None:
    assert table.changelog is not None
    names = table.changelog
    rows = changelog_rows(
        SourceChange(
            c.position.file,
            c.position.file_number,
            c.position.pos,
            c.row_index,
            c.before,
            c.after,
            transaction_of[id(c)].gtid,
            transaction_of[id(c)].commit_time,
        )
        for c in changes
    )

    attempts = 0

    def read_offset() -> BinlogPosition | None:
        nonlocal attempts  # as for the target: only a retry needs a look at the table
        attempts += 1
        done = table.changelog_committed
        if attempts == 1 or (done is not None and done >= end):
            return done
        return committed_offset(_catalog(config).load_table(names), config.name)

    append_changelog(spark, qualified(config, *names), table.schema, rows, config.name, end, read_offset)
    table.changelog_committed = end


def _catalog(config: PipelineConfig) -> Any:
    return cached_pyiceberg_catalog(config.sink)
