"""The binlog phase: after the snapshot, every committed transaction lands in Iceberg exactly once.

Loop: read whole transactions from the last offset every target committed, filter what a table
already holds (its own committed offset, and the chunk high-watermark filter of Flink CDC 2.0 for
changes inside the snapshot's window), materialize per table, MERGE each table with the batch's end
offset in its snapshot summary, then record the offset in the state table. A crash anywhere in
between replays the batch; each table skips what it already committed.
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

from ingest.changes.materializer import Change, materialize
from ingest.config import PipelineConfig
from ingest.faults import crash_point
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.merge import committed_offset, merge_into
from ingest.sink.targets import qualified
from ingest.source.binlog import BinlogReader, RowChange, SchemaChangeError, Transaction, check_not_purged
from ingest.source.chunk_reader import in_chunk
from ingest.source.chunks import Chunk, Key
from ingest.source.mysql import TableSchema, connect
from ingest.source.position import BinlogPosition, Watermark
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
        out.append(
            TableStream(schema, qualified(config, namespace, name), plan, highs, committed_offset(table, config.name))
        )
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
        pending: list[Transaction] = []
        last_flush = time.monotonic()
        committed = start

        def flush(end: BinlogPosition) -> None:
            nonlocal committed, last_flush, pending
            if end > committed or pending:
                _commit(spark, config, state, by_id, filters, pending, end)
                committed = end
            pending = []
            last_flush = time.monotonic()

        def should_stop() -> bool:
            return stop is not None and stop.event.is_set()

        def idle() -> bool:
            # Heartbeat while captured tables are idle: move the offset, and look at the stop flag.
            if time.monotonic() - last_flush >= config.stream.batch_interval_seconds:
                flush(reader.position)
            return should_stop()

        try:
            try:
                for tx in reader.transactions(idle=idle):
                    pending.append(tx)
                    size = sum(len(t.changes) for t in pending)
                    if (
                        size >= config.stream.batch_max_changes
                        or time.monotonic() - last_flush >= config.stream.batch_interval_seconds
                    ):
                        flush(tx.end)
                    if goal is not None and tx.end >= goal and not pending:
                        break
                    if should_stop():
                        break
            except SchemaChangeError:
                # Everything before the DDL is committed; the job stops at the statement.
                flush(reader.position)
                raise
            flush(reader.position)
        finally:
            reader.close()
    return committed


def _commit(
    spark: Any,
    config: PipelineConfig,
    state: StateTable,
    tables: dict[str, TableStream],
    filters: dict[str, HighWatermarkFilter],
    batch: list[Transaction],
    end: BinlogPosition,
) -> None:
    per_table: dict[str, list[RowChange]] = defaultdict(list)
    for tx in batch:
        for change in tx.changes:
            per_table[change.table_id].append(change)
    merged = applied = 0
    for table_id, changes in sorted(per_table.items()):
        table = tables[table_id]
        if table.committed is not None:
            changes = [c for c in changes if c.position > table.committed]  # this table has them already
        changes = filters[table_id].keep(changes)
        if not changes:
            continue
        finals = materialize(
            (Change((c.position.file_number, c.position.pos, c.row_index), c.before, c.after) for c in changes),
            table.schema.primary_key_positions(),
        )

        def read_offset(t: TableStream = table) -> BinlogPosition | None:
            # The batch is known to be newer than anything this run committed; only a commit of this very
            # batch whose outcome was unknown needs a look at the table itself.
            if t.committed is not None and t.committed >= end:
                return t.committed
            namespace, name = config.target_for(t.schema.database, t.schema.table)
            return committed_offset(_catalog(config).load_table((namespace, name)), config.name)

        applied += len(changes)
        if merge_into(spark, table.target, table.schema, finals, config.name, end, read_offset):
            merged += 1
        table.committed = end
        crash_point("stream.after_table_commit")
    crash_point("stream.before_state")
    state.record_offset(Watermark(end, None))
    crash_point("stream.after_state")
    log.info("binlog: committed %d changes to %d tables up to %s", applied, merged, end)


_catalogs: dict[str, Any] = {}


def _catalog(config: PipelineConfig) -> Any:
    """One pyiceberg catalog per sink for the whole run (loading one opens a database connection)."""
    key = repr((config.sink.catalog_name, sorted((k, repr(v)) for k, v in config.sink.catalog.items())))
    if key not in _catalogs:
        _catalogs[key] = load_pyiceberg_catalog(config.sink)
    return _catalogs[key]
