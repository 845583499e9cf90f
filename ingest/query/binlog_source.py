"""The binlog as a Spark Structured Streaming source: a Python Data Source simple stream reader.

Offsets are watermarks in JSON (`Watermark.to_json`: binlog file and position, MariaDB GTID position, server
id), always at a transaction boundary. Spark runs the reader in a Python process of its own on the driver,
for the whole query: a thread there parses the binlog ahead (`Prefetch`), and `read(start)` decides
the batches: it hands over the whole transactions parsed since `start` once they hold
`stream.batch_max_changes` row changes, or once `stream.batch_interval_seconds` have passed since the last
batch was handed over and nothing more is parsed yet, and says where they end. Until then it keeps what it
took and returns no new offset (after at most `READ_WAIT_SECONDS`, so that a query being stopped is not kept
waiting); the query runs with a zero trigger interval, so a batch starts as soon as the source has one and
a backlog is read batch after batch without waiting for a trigger. A DDL statement on a captured table always
begins a batch: the rows before it are decoded with the schema the target mirrors when the batch starts, the
rows after it with the schema right after it.

`readBetweenOffsets(start, end)`, which Spark calls to run a batch of its checkpoint again after a crash,
reads the same range from the server again: the same transactions, the same rows, the same end.

Tables whose chunks are not all read (a snapshot asked of the running job, a table created or copied again) are
read in the same query: between binlog batches the source hands over a chunk batch, one commit of one table's
chunks not read yet; its end offset is the binlog offset it started at plus those chunks (`source_offset`), so
that it is replayed as the same chunks. The sink reads them on the executors and records their high
watermarks in the state table, where the source learns them before it prepares the next binlog batch (whose
changes to a chunk's keys it then filters by that watermark). A binlog batch due
goes first; while none is, chunk batches follow each other. Tables paused (`ingest snapshot --pause`) are
left out (looked up every `stream.signal_poll_seconds`); when the sink reads none of a chunk batch (the
source's load, a DDL not followed yet), the next is offered after the next binlog batch, or
`stream.batch_interval_seconds` later.

A batch is rows of (seq, kind, payload), each payload a pickle: kind "ddl", the DDL statement the batch begins
with, if any; kind "table", one table's part of the batch made ready to commit in this process
(`binlog_batch.prepare_batch`: filtered, folded to one final row per key, as Arrow tables), so that the driver only
commits; kind "chunks", a chunk batch's chunks (`ChunkBatch`); kind "named", a statement that named tables to
capture, which ends its batch (see `BinlogSourceSpec.new_tables`); then one "end" row: the batch's end offset and
the source time it is current to. Events before the point every target holds (the start the job computed from
Iceberg) are never read: Iceberg, not Spark's checkpoint, says what is done, so a checkpoint may be lost or behind
(the job refuses one that is ahead, see `ingest.query.structured`).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from ingest.config import SourceConfig, TableSelection
from ingest.errors import SchemaChangeError
from ingest.model.changes import DdlStatement, ForeignKey, TablesNamed, Transaction, changes_in
from ingest.model.position import BinlogPosition, MariadbGtidPos, Watermark
from ingest.query.batch import HighWatermarkFilter, Streaming, TableBatch, TableStream, catch_up_end, prepare_batch
from ingest.runtime.python_gc import raise_gc_threshold
from ingest.source.binlog.prefetch import End, Idle, Prefetch
from ingest.source.binlog.reader import BinlogReader, dump_server_id
from ingest.source.binlog.schema_statements import FOLLOWED
from ingest.source.mysql import connect
from ingest.source.reconnect import publish
from ingest.source.snapshot.chunks import Chunk
from ingest.state.table import StateTable

log = logging.getLogger(__name__)

SCHEMA = "seq LONG, kind STRING, payload BINARY, changes LONG"
"""A micro-batch's rows: one per part (`_rows`), the part pickled; `changes` is the row changes a table's part
applies (0 for the other parts), which the query observes for Spark's progress (`OBSERVED`)."""
SourceRow = tuple[int, str, bytes, int]
OBSERVED = "ingest"
"""The name of the query's observed metrics (`observedMetrics` of its progress): `changes` per micro-batch."""


@dataclass(frozen=True)
class BinlogSourceSpec:
    """What the source process needs (pickled into it with the DataSource class)."""

    streaming: Streaming
    flavor: str
    tables: tuple[TableStream, ...]
    """What each table holds at `resume`; its schema is the one its target mirrors."""
    resume: Watermark
    """Every target holds every change before this point (computed from Iceberg by the job)."""
    contained_until: dict[tuple[str, str], BinlogPosition]
    planned_at: dict[tuple[str, str], BinlogPosition] = field(default_factory=dict)
    """Per table, a position before its snapshot's schema was loaded (see BinlogReader)."""
    goal: BinlogPosition | None = None
    """With "stop when caught up": the binlog end when the phase started; a batch reaching it is handed over at
    once."""
    new_tables: TableSelection | None = None
    """When given, a DDL statement that names a table these patterns match but the phase does not capture ends
    a batch of its own (`SourceBatch.named`): the job ends the phase there and copies the table."""
    read_chunks: bool = False
    """Whether the sink reads chunk batches: the source then hands over the chunks of `tables` not read yet."""
    reconnect_file: str | None = None
    """A file on the driver's host where the reader says it is reconnecting to the source, for the job's metrics
    (ingest.source.reconnect.publish)."""


@dataclass(frozen=True)
class ChunkBatch:
    """A micro-batch of chunks to read: one commit of one table's chunks not read yet; or, of tables with one chunk
    left each (small tables, mostly), that chunk of each, a commit per table. A micro-batch costs the query far
    more than reading and committing one small chunk does."""

    parts: tuple[tuple[str, tuple[Chunk, ...]], ...]
    """(table id, its chunks to read), in the order they are read."""


CHUNKS_KEY = "chunks"
"""The key of a chunk batch's end offset that names its chunks."""


def source_offset(mark: Watermark, chunks: ChunkBatch | None = None) -> dict[str, Any]:
    """The source's offset: the binlog watermark, and for a chunk batch the chunks it reads."""
    offset: dict[str, Any] = mark.to_json()
    if chunks is not None:
        offset[CHUNKS_KEY] = {"parts": [[table_id, [c.index for c in part]] for table_id, part in chunks.parts]}
    return offset


def offset_parts(chunks: Mapping[str, Any]) -> list[tuple[str, list[int]]]:
    """The (table id, chunk indices) an offset's `CHUNKS_KEY` names; also as versions before several tables'
    chunks shared a batch wrote it (one table), which a kept checkpoint may hold."""
    if "parts" in chunks:
        return [(str(table_id), [int(i) for i in indices]) for table_id, indices in chunks["parts"]]
    return [(str(chunks["table"]), [int(i) for i in chunks["indices"]])]


def offset_mark(offset: Mapping[str, Any]) -> Watermark:
    """The binlog watermark of a source offset."""
    return Watermark.from_json({k: v for k, v in offset.items() if k != CHUNKS_KEY})


@dataclass(frozen=True)
class BatchEnd:
    """The last row of a batch: where it ends, and the source time (epoch seconds) that point is current to
    when the batch ends on an idle report (None when its transactions' commit times say it)."""

    offset: dict[str, Any]
    at: float | None = None
    last_commit: int | None = None
    """The newest commit time of the batch's transactions (None: it has none)."""


READ_WAIT_SECONDS = 0.5
"""The longest one `read` waits for the batch to fill or fall due; Spark asks again right after."""

FIRST_READ_WAIT_SECONDS = 5.0
"""The longest the query's first `read` waits (see `BinlogStreamReader.read`)."""


@dataclass(frozen=True)
class SourceBatch:
    """A micro-batch as the sink takes it: the DDL it begins with, if any, then its tables' parts."""

    ddl: DdlStatement | None
    tables: list[TableBatch]
    end: BatchEnd
    named: TablesNamed | None = None
    """The statement the batch ends with, that named tables to capture (see `BinlogSourceSpec.new_tables`)."""
    chunks: ChunkBatch | None = None
    """A chunk batch's chunks (it has no DDL and no tables' parts)."""


def decode_batch(rows: list[Any]) -> SourceBatch:
    """One micro-batch, from the rows of its DataFrame (in any order)."""
    ordered = sorted(rows, key=lambda r: r[0])
    if not ordered or ordered[-1][1] != "end":
        raise RuntimeError(f"a binlog batch without its end row ({len(ordered)} rows)")
    ddl = pickle.loads(bytes(ordered[0][2])) if ordered[0][1] == "ddl" else None
    tables = [pickle.loads(bytes(row[2])) for row in ordered if row[1] == "table"]
    named = next((pickle.loads(bytes(row[2])) for row in ordered if row[1] == "named"), None)
    chunks = next((pickle.loads(bytes(row[2])) for row in ordered if row[1] == "chunks"), None)
    return SourceBatch(ddl, tables, pickle.loads(bytes(ordered[-1][2])), named, chunks)


def _rows(batch: SourceBatch) -> list[SourceRow]:
    """The rows of a batch: its DDL, each table's part (Arrow tables pickle as their buffers), then its end."""
    parts: list[tuple[str, Any]] = [("ddl", batch.ddl)] if batch.ddl is not None else []
    parts += [("table", part) for part in batch.tables]
    parts += [("named", batch.named)] if batch.named is not None else []
    parts += [("chunks", batch.chunks)] if batch.chunks is not None else []
    parts.append(("end", batch.end))
    return [
        (i, kind, pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL), part.applied if kind == "table" else 0)
        for i, (kind, part) in enumerate(parts)
    ]


class ChunkOffers:
    """The chunk batches the binlog source offers between its binlog batches: the chunks not read yet of the
    tables still being copied, and, after each, their high watermarks learnt from the state table (the sink
    records them when it reads the chunks)."""

    def __init__(self, tables: dict[str, TableStream], streaming: Streaming, enabled: bool) -> None:
        self._tables = tables
        """The source's tables (shared): a chunk read gets its high watermark here."""
        self.streaming = streaming
        self.enabled = enabled
        self.offered: ChunkBatch | None = None
        """The chunk batch handed over last, when it is the last batch: its chunks' watermarks are learnt next."""
        self.held_until = 0.0
        """When the sink read none of the last chunk batch, when the next may be offered (a binlog batch handed
        over ends the wait too)."""
        self._state: StateTable | None = None
        self._paused: frozenset[str] = frozenset()
        self._paused_looked = -float("inf")

    def next(self) -> ChunkBatch | None:
        """One commit of the chunks not read yet of the first table not paused that has some; when that table has
        one left, the one left of each table not paused that has one left (up to `snapshot.chunks_per_commit`
        tables). None: none to offer now."""
        if not self.enabled or time.monotonic() < self.held_until:
            return None
        unread = {t: table.unread for t, table in self._tables.items() if table.unread}
        if not unread:
            return None
        paused = self._paused_tables()
        ready = [(table_id, tuple(chunks)) for table_id, chunks in sorted(unread.items()) if table_id not in paused]
        if not ready:
            return None
        per_commit = self.streaming.chunks_per_commit
        first_id, first = ready[0]
        if len(first) > 1:
            return ChunkBatch(((first_id, first[:per_commit]),))
        return ChunkBatch(tuple(part for part in ready if len(part[1]) == 1)[:per_commit])

    def learn(self) -> bool:
        """After a chunk batch (True), the high watermarks of the chunks the sink read, from the state table; the
        binlog batches after it keep the changes to their keys past those (`HighWatermarkFilter`)."""
        offered, self.offered = self.offered, None
        if offered is None:
            return False
        state = self._state_table()
        state.reload()
        read = 0
        for table_id, chunks in offered.parts:
            table = self._tables.get(table_id)
            if table is None:
                continue
            records = state.done(table_id)
            slot = {c.index: i for i, c in enumerate(table.chunks)}
            for chunk in chunks:
                record = records.get(chunk.index)
                if record is not None and record.high_watermark is not None:
                    table.chunk_highs[slot[chunk.index]] = record.high_watermark.position
                    read += 1
        if read == 0:
            self.held_until = time.monotonic() + self.streaming.stream.batch_interval_seconds
        return True

    def _paused_tables(self) -> frozenset[str]:
        """The tables `ingest snapshot --pause` holds (looked up at most every `stream.signal_poll_seconds`)."""
        now = time.monotonic()
        if now - self._paused_looked >= self.streaming.stream.signal_poll_seconds:
            self._paused_looked = now
            try:
                self._paused = self._state_table().requests().paused
            except Exception as e:  # noqa: BLE001 - looked up again later; the binlog goes on meanwhile
                log.warning("could not look for paused snapshots (looking again later): %s", e)
        return self._paused

    def _state_table(self) -> StateTable:
        if self._state is None:
            self._state = StateTable.open(self.streaming.targets.sink, self.streaming.targets.pipeline)
        return self._state


class BinlogStreamReader:
    """The simple stream reader, behind the stand-in `make_binlog_source` gives Spark (so that this module imports
    without pyspark's data source machinery, and only where the binlog is read)."""

    def __init__(self, spec: BinlogSourceSpec) -> None:
        raise_gc_threshold()  # in Spark's Python process that runs the source
        self.spec = spec
        self._tables = {t.schema.table_id: dataclasses.replace(t) for t in spec.tables}
        """What each table holds, as of the batches handed over (each is committed before the next is asked)."""
        self._conn = _LazyConnection(spec.streaming.source)
        self._filters = {table_id: HighWatermarkFilter(self._conn, t) for table_id, t in self._tables.items()}
        self._reader: BinlogReader | None = None
        self._chained: dict[str, list[ForeignKey]] = {}
        """The foreign keys whose actions act in turn on captured tables, as the newest reader loaded them."""
        self._prefetch: Prefetch | None = None
        self._next: Transaction | DdlStatement | TablesNamed | None = None
        """An item taken from the prefetch but left for the next batch (a DDL after other items)."""
        self._failure: Exception | None = None
        """The reader's error, raised once what it read before is handed over."""
        self._positioned = False
        """Whether the schemas are those at the start of the next read (see `_open`)."""
        self._batch: _Batch | None = None
        """What the prefetch handed over since the last batch's end, kept until the batch is due."""
        self._last_batch = time.monotonic()
        """When the last batch was handed over (the interval counts from there)."""
        self._chunks = ChunkOffers(self._tables, spec.streaming, spec.read_chunks)

    # -- the Spark interface

    def initialOffset(self) -> dict[str, Any]:
        return self.spec.resume.to_json()

    def read(self, start: dict[str, Any]) -> tuple[Iterator[SourceRow], dict[str, Any]]:
        begin = self._begin(start)
        if self._prefetch is None or self._batch is None or self._batch.begin != begin:
            self._open(begin)
        assert self._batch is not None
        after_chunks = self._chunks.learn()
        if not after_chunks and (chunks := self._chunks.next()) is not None:
            return self._hand_chunks(begin, chunks)
        # The first read waits for a due batch (up to FIRST_READ_WAIT_SECONDS, so that a stop is not held up
        # long): an offset that did not move would make Spark run an empty first batch (from no offset to the
        # initial one), a whole micro-batch for nothing. With chunks to read, only a batch due now goes first.
        first = self._batch.begin == self.spec.resume and not self._batch.moved
        interval = self.spec.streaming.stream.batch_interval_seconds
        wait = min(interval, FIRST_READ_WAIT_SECONDS) if first else READ_WAIT_SECONDS
        batch = self._take(time.monotonic() + (0.0 if after_chunks else wait))
        if batch is None or not batch.moved:
            if after_chunks and (chunks := self._chunks.next()) is not None:
                return self._hand_chunks(begin, chunks)
            return iter(()), start
        self._batch = _Batch(batch.end)
        self._last_batch = time.monotonic()
        self._chunks.held_until = 0.0  # a binlog batch handed over ends the wait
        rows = _rows(self._prepare(batch.items, batch.end, batch.at, batch.named))
        return iter(rows), source_offset(batch.end)

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[SourceRow]:
        mark = offset_mark(end)
        if CHUNKS_KEY in end:  # the same chunks (the sink skips those read already)
            parts = []
            for table_id, indices in offset_parts(end[CHUNKS_KEY]):
                by_index = {c.index: c for c in self._tables[table_id].chunks}
                parts.append((table_id, tuple(by_index[i] for i in indices)))
            chunks = ChunkBatch(tuple(parts))
            return iter(_rows(SourceBatch(None, [], BatchEnd(end), chunks=chunks)))
        items = self._replay(self._begin(start), mark)
        return iter(_rows(self._prepare(items, mark, None)))

    def commit(self, end: dict[str, Any]) -> None:
        pass

    def stop(self) -> None:
        self._close()
        self._conn.close()
        quiet_closed_socket_exit()

    def _hand_chunks(self, begin: Watermark, chunks: ChunkBatch) -> tuple[Iterator[SourceRow], dict[str, Any]]:
        self._chunks.offered = chunks
        end = source_offset(begin, chunks)
        return iter(_rows(SourceBatch(None, [], BatchEnd(end), chunks=chunks))), end

    # -- reading

    def _replay(self, begin: Watermark, stop: Watermark) -> list[Transaction | DdlStatement]:
        """The items from `begin` to `stop` read again, each DDL among them followed."""
        items: list[Transaction | DdlStatement] = []
        if stop.position > begin.position:
            # Its own replication server id: the source's process may be reading the binlog at the same time, and
            # the server drops the older of two dump connections with one id.
            reader = self._new_reader(begin, blocking=False, server_id=dump_server_id())
            try:
                # Other tables' transactions past `stop` end the read (at most a heartbeat period later).
                for item in reader.transactions(idle=lambda at: reader.position >= stop.position):
                    position = item.end
                    if position > stop.position:
                        break
                    assert not isinstance(item, TablesNamed)  # reported only to readers that ask (not this replay)
                    if isinstance(item, DdlStatement):
                        _follow(self.spec, self._tables, self._filters, reader, item)
                    items.append(item)
                    if position == stop.position:
                        break
            finally:
                reader.close()
        log.info("binlog source: replayed %d transactions from %s to %s", len(items), begin.position, stop.position)
        return items

    def _prepare(
        self,
        items: Sequence[Transaction | DdlStatement],
        end: Watermark,
        at: float | None,
        named: TablesNamed | None = None,
    ) -> SourceBatch:
        """The batch as the sink commits it; from then on the tables hold it (the sink commits each batch before
        Spark asks for the next, or the query ends)."""
        ddl = items[0] if items and isinstance(items[0], DdlStatement) else None
        batch = [item for item in items if isinstance(item, Transaction)]
        assert len(batch) + (ddl is not None) == len(items), "a DDL begins its batch"
        tables = prepare_batch(
            self.spec.streaming.targets, self.spec.streaming.stream, self._tables, self._filters, batch, self._chained
        )
        for part in tables:
            table = self._tables[part.table_id]
            if part.rows is not None or part.pending is not None:
                table.committed, table.committed_known = end.position, True
            if part.changelog is not None or (part.pending is not None and table.changelog is not None):
                table.changelog_committed = end.position
        last_commit = max((tx.commit_time for tx in batch), default=None)
        return SourceBatch(ddl, tables, BatchEnd(end.to_json(), at, last_commit), named)

    def _begin(self, start: dict[str, Any]) -> Watermark:
        """Where to read from for a batch starting at `start`: never before what every target holds."""
        mark = offset_mark(start)
        resume = self.spec.resume
        if mark.server_id == resume.server_id and mark.position < resume.position:
            return resume
        return mark

    def _new_reader(
        self,
        begin: Watermark,
        blocking: bool,
        server_id: int | None = None,
        new_tables: TableSelection | None = None,
    ) -> BinlogReader:
        reader = _binlog_reader(self.spec, self._tables.values(), begin, blocking, server_id, new_tables)
        self._chained = reader.chained
        return reader

    def _open(self, begin: Watermark) -> None:
        resume = self.spec.resume
        if not self._positioned and begin.server_id == resume.server_id and begin.position > resume.position:
            # Spark continues a kept checkpoint after the batch it planned last (which it runs again elsewhere).
            # The schemas are those at `resume`: follow the DDLs between there and `begin`, dropping the rows.
            self._replay(resume, begin)
        self._positioned = True
        self._close()
        self._reader = self._new_reader(begin, blocking=True, new_tables=self.spec.new_tables)
        self._prefetch = Prefetch(
            self._reader,
            self.spec.streaming.stream.batch_max_changes,
            changes_in,
            pause_after=lambda item: isinstance(item, DdlStatement),
        )
        self._batch = _Batch(begin)

    def _close(self) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
        if self._reader is not None:
            self._reader.close()
        self._prefetch = self._reader = self._next = self._batch = self._failure = None

    def _take(self, deadline: float) -> _Batch | None:
        """The batch, once it is due; None when it is not due by `deadline` (what was taken is kept).

        Due: `batch_max_changes` changes taken, or the interval passed since the last
        batch and nothing more is ready; at once for a DDL (it ends the batch before it, or begins its own), at
        the goal of a catch-up, and when the reader failed after items were taken (they are handed over first).
        """
        assert self._prefetch is not None and self._reader is not None and self._batch is not None
        if self._failure is not None:
            raise self._failure
        stream = self.spec.streaming.stream
        batch, here, read_end = self._batch, self.spec.resume.server_id, self.spec.goal
        goal = None if read_end is None else catch_up_end(read_end, self._tables.values())
        due_at = self._last_batch + stream.batch_interval_seconds
        while batch.changes < stream.batch_max_changes:
            if goal is not None and batch.end.position >= goal:
                return batch
            due = time.monotonic() >= due_at
            if due and batch.moved:
                wait = 0.0  # what is ready right now joins the batch
            else:  # until the batch falls due, or until something comes to hand over
                wait = (deadline if due else min(deadline, due_at)) - time.monotonic()
            item, self._next = self._next, None
            try:
                if item is None:
                    item = self._prefetch.poll(max(0.0, wait))
            except Exception as e:
                if not batch.moved:
                    raise
                # What was read before the failure is handed over first (the job commits it).
                self._failure = e
                return batch
            if item is None:
                if due and batch.moved:
                    return batch
                if time.monotonic() >= deadline:
                    return None
                continue
            if self._place(batch, item, here, read_end):
                return batch
        return batch

    def _place(self, batch: _Batch, item: Any, here: int | None, read_end: BinlogPosition | None) -> bool:
        """Put an item the prefetch handed over into `batch`; True when the batch ends with it or before it (then
        it is kept for the next batch)."""
        assert self._prefetch is not None and self._reader is not None
        if isinstance(item, Idle):
            position = item.position
            if item.at_end and read_end is not None and position < read_end:
                # Everything the server had written is read, so the binlog's end read before the query began is
                # reached: what lies between holds no transaction (a binlog that ends in a MariaDB binlog
                # checkpoint, say). Not so a chunk's high watermark read since: the heartbeat may be older.
                position = read_end
            batch.end, batch.at = Watermark(position, item.gtid, here), item.at
            return False
        if isinstance(item, End):
            return True  # only when the reader was closed
        if isinstance(item, TablesNamed):
            # It ends a batch of its own: the job ends the phase after committing it.
            if batch.moved:
                self._next = item
            else:
                batch.named, batch.end = item, Watermark(item.end, item.gtid_after, here)
            return True
        if isinstance(item, DdlStatement):
            if batch.moved:
                self._next = item
                return True
            _follow(self.spec, self._tables, self._filters, self._reader, item)
            self._prefetch.resume()
        batch.add(item, Watermark(item.end, item.gtid_after, here))
        return False


def _binlog_reader(
    spec: BinlogSourceSpec,
    tables: Iterable[TableStream],
    begin: Watermark,
    blocking: bool,
    server_id: int | None,
    new_tables: TableSelection | None,
) -> BinlogReader:
    """A reader of the source's tables from `begin` (`server_id`: a replication id of its own, for a side read);
    its reconnects are published where the job's metrics read them."""
    stream, source = spec.streaming.stream, spec.streaming.source
    gtid = begin.gtid if isinstance(begin.gtid, MariadbGtidPos) else None
    reader = BinlogReader(
        source if server_id is None else dataclasses.replace(source, server_id=server_id),
        [t.schema for t in tables],
        begin.position,
        blocking=blocking,
        heartbeat_seconds=stream.heartbeat_seconds,
        on_ddl=stream.on_schema_change,
        start_gtid=gtid,
        contained_until=spec.contained_until,
        planned_at=spec.planned_at,
        new_tables=new_tables,
        recopy=stream.on_unfollowable == "recopy",
    )
    if spec.reconnect_file is not None:
        file = Path(spec.reconnect_file)
        reader.on_reconnect = lambda reconnect: publish(file, reconnect)
    return reader


def _follow(
    spec: BinlogSourceSpec,
    tables: dict[str, TableStream],
    filters: dict[str, HighWatermarkFilter],
    reader: BinlogReader,
    ddl: DdlStatement,
) -> None:
    """In the source's process: decode the rows after `ddl` with the schema right after it (the sink evolves the
    targets). A table dropped, or one the sink copies again (`stream.on_unfollowable: recopy`, which ends the query
    at the statement), is no longer read."""
    from ingest.source.binlog.schema_after import schema_after

    streaming = spec.streaming
    recopy = streaming.stream.on_unfollowable == "recopy"
    with connect(streaming.source) as conn:
        for key in ddl.tables:
            table_id = ".".join(key)
            if ddl.kind != "drop" and (ddl.kind in FOLLOWED or not recopy):
                table = tables[table_id]
                try:
                    table.schema = schema_after(
                        streaming.source,
                        streaming.targets.options_for(table.schema.database, table.schema.table),
                        conn,
                        spec.flavor,
                        table.schema,
                        ddl,
                    )
                    reader.set_schema(table.schema)
                    continue
                except SchemaChangeError:
                    if not recopy:
                        raise
            reader.forget(key)
            del tables[table_id], filters[table_id]


def quiet_closed_socket_exit() -> None:
    """In the source's process, once its reader is stopped: the query is ending, and Spark closes the process's
    socket. pyspark's runner, reading the next call or writing its answer, then dies of the closed socket with a
    traceback on the job's terminal after a clean stop. That death, and only it, leaves no traceback; any other
    error still prints one."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if not isinstance(error, (EOFError, BrokenPipeError, ConnectionResetError)):
            previous(kind, error, trace)

    sys.excepthook = hook


@dataclass
class _Batch:
    """The items taken for the next batch: they start at `begin` and end at `end`."""

    begin: Watermark
    items: list[Transaction | DdlStatement] = field(default_factory=list)
    changes: int = 0
    named: TablesNamed | None = None
    end: Watermark = field(init=False)
    at: float | None = None
    """The source time `end` is current to, when it was moved by an idle report."""

    def __post_init__(self) -> None:
        self.end = self.begin

    @property
    def moved(self) -> bool:
        return self.end != self.begin

    def add(self, item: Transaction | DdlStatement, end: Watermark) -> None:
        self.items.append(item)
        self.changes += changes_in(item)
        self.end, self.at = end, None


class _LazyConnection:
    """A source connection opened when first used (the high-watermark filter needs one only for string keys
    inside a snapshot's window)."""

    def __init__(self, source: SourceConfig) -> None:
        self.source = source
        self.conn: Any = None

    def cursor(self, *args: Any) -> Any:
        if self.conn is None:
            self.conn = connect(self.source)
        return self.conn.cursor(*args)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def make_binlog_source(name: str, spec: BinlogSourceSpec) -> Any:
    """A DataSource class named `name` reading the binlog as `spec` says, pickled by value to Spark's Python
    processes, `spec` pickled inside it.

    Spark makes the source, and its reader, in more processes than the one that reads: one creates the source for
    its schema, one plans the query's read function (the reader pickled into it, for executors that read only a
    batch not cached by the reading process). Each is a new Python process on the way to a query's first batch.
    So the reader here is a stand-in that builds the binlog reader, and imports this module (about 0.5 CPU-s), at
    its first call: only the process that reads does."""
    from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

    spec_bytes = pickle.dumps(spec)

    class Reader(SimpleDataSourceStreamReader):
        def __init__(self) -> None:
            self.binlog: Any = None

        def _binlog(self) -> Any:
            if self.binlog is None:
                from ingest.query.binlog_source import BinlogStreamReader

                self.binlog = BinlogStreamReader(pickle.loads(spec_bytes))
            return self.binlog

        def initialOffset(self) -> dict[str, Any]:
            return self._binlog().initialOffset()  # type: ignore[no-any-return]

        def read(self, start: dict[str, Any]) -> tuple[Iterator[SourceRow], dict[str, Any]]:
            return self._binlog().read(start)  # type: ignore[no-any-return]

        def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[SourceRow]:
            return self._binlog().readBetweenOffsets(start, end)  # type: ignore[no-any-return]

        def commit(self, end: dict[str, Any]) -> None:
            if self.binlog is not None:
                self.binlog.commit(end)

        def stop(self) -> None:
            if self.binlog is not None:
                self.binlog.stop()

    class BinlogSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return SCHEMA

        def simpleStreamReader(self, schema: Any) -> Any:
            return Reader()

    return BinlogSource
