"""Where the binlog phase starts (`prepare`): per table what its target and its chunks hold, as positions of the
server read now, and the earliest point some table still needs. The job's query (`ingest.query.structured`) begins
there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ingest import metrics
from ingest.model.position import BinlogPosition, MariadbGtidPos, Watermark
from ingest.model.schema import TableSchema
from ingest.query.batch import HighWatermarkFilter, Streaming, TableStream
from ingest.query.commit import table_cut
from ingest.sink.catalog import cached_pyiceberg_catalog
from ingest.sink.evolution import SOURCE_SCHEMA_PROPERTY, schema_from_json
from ingest.sink.maintenance import commits_since_compaction
from ingest.sink.merge import committed_offset, stream_history
from ingest.sink.targets import copy_under_way, on_copy_branch, partition_source_columns, qualified
from ingest.source.binlog.failover import gtid_at, server_id, to_this_server
from ingest.source.binlog.reader import check_not_purged
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable

log = logging.getLogger(__name__)


def _table_streams(
    streaming: Streaming,
    state: StateTable,
    schemas: Sequence[TableSchema],
    recorded: Watermark | None,
    conn: Any,
    flavor: str,
) -> tuple[list[TableStream], BinlogPosition | None]:
    """What each table holds, and the job's recorded offset, as positions of the server read now.

    Points recorded on another server (before a failover) are found again by their GTIDs, all at once.
    """
    catalog = cached_pyiceberg_catalog(streaming.targets.sink)
    found: list[tuple[TableStream, list[Watermark | None], Watermark | None, Watermark | None, Watermark | None]] = []
    for schema in schemas:
        done = state.done(schema.table_id)
        plan = state.plan(schema.table_id) or []
        # A chunk not read yet (a snapshot asked of the running job) has none.
        highs = [record.high_watermark if (record := done.get(chunk.index)) else None for chunk in plan]
        namespace, name = streaming.targets.target_for(schema.database, schema.table)
        table = catalog.load_table((namespace, name))
        stored = table.properties.get(SOURCE_SCHEMA_PROPERTY)
        if stored and streaming.stream.on_schema_change != "ignore":
            # Rows between the committed offset and a DDL not yet followed were written with the schema the
            # target mirrors, not with the live one (which may already be past that DDL).
            schema = schema_from_json(schema.database, schema.table, stored)
        changelog = streaming.targets.changelog_for(schema.database, schema.table)
        log_table = None if changelog is None else catalog.load_table(changelog)
        logged = None if log_table is None else committed_offset(log_table, streaming.targets.pipeline)
        history = stream_history(table, streaming.targets.pipeline)
        target = qualified(streaming.targets, namespace, name)
        if copy_under_way(table):  # copied again: written to its branch, main left to readers until the swap
            target = on_copy_branch(target)
        stream = TableStream(schema, target, plan, [], None, changelog)
        stream.committed_known = history.complete
        head = table.current_snapshot()
        stream.head, stream.head_known = (None if head is None else head.snapshot_id), True
        stream.partition_columns = partition_source_columns(table, schema)
        every = streaming.targets.sink.maintenance.every_commits
        stream.since_compaction[stream.target] = commits_since_compaction(table, every)
        if changelog is not None and log_table is not None:
            stream.since_compaction[qualified(streaming.targets, *changelog)] = commits_since_compaction(
                log_table, every
            )
        found.append((stream, highs, history.offset, logged, state.planned_at(schema.table_id)))
    marks = [recorded, *(m for _, highs, *others in found for m in (*highs, *others))]
    points = [m for m in marks if m is not None]
    here = dict(zip(map(id, points), to_this_server(conn, streaming.source, flavor, points), strict=True))

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
    streaming: Streaming,
    state: StateTable,
    schemas: Sequence[TableSchema],
    conn: Any,
    flavor: str,
    until_caught_up: bool,
) -> StreamStart:
    """Read what every table and the state table hold, and where on the server read now that is."""
    recorded = state.stream_offset()
    tables, resumed = _table_streams(streaming, state, schemas, recorded, conn, flavor)
    start = _resume_at(tables, resumed) or read_watermark(conn, flavor).position
    check_not_purged(conn, start)
    here = server_id(conn)
    start_gtid: MariadbGtidPos | None = None
    if flavor == "mariadb":
        # The recorded offset's own GTIDs when it is this server's point; else the server maps the point.
        exact = recorded is not None and recorded.server_id == here and recorded.position == start
        known = recorded.gtid if recorded is not None and exact else None
        start_gtid = known if isinstance(known, MariadbGtidPos) else gtid_at(conn, start)
    goal_at = int(time.time())
    goal = read_watermark(conn, flavor).position if until_caught_up else None
    by_id = {t.schema.table_id: t for t in tables}
    filters = {t.schema.table_id: HighWatermarkFilter(conn, t) for t in tables}
    source_time = state.offset_source_time()
    if goal is not None and start >= goal:
        # Nothing to stream: the source was at `start` when the goal was read. Recorded, so that the run's end and
        # `ingest status` say the targets are caught up rather than that their lag is unknown.
        source_time = goal_at
        if recorded is None or recorded.position != start:
            state.record_offset(
                Watermark(start, start_gtid, here), source_time, table_cut(streaming.targets, by_id, start)
            )
    metrics.current().offset_committed(start, source_time)
    log.info("binlog phase from %s%s", start, f" until {goal}" if goal else "")
    return StreamStart(tables, by_id, filters, start, start_gtid, here, goal)
