"""The binlog as a Spark Structured Streaming source: a Python Data Source simple stream reader.

Offsets are watermarks in JSON (`Watermark.to_json`: binlog file and position, MariaDB GTID position, server
id), always at a transaction boundary. Spark runs the reader in a Python process of its own on the driver,
for the whole query: a thread there parses the binlog ahead (`Prefetch`), and `read(start)` decides
the batches as the loop engine does: it hands over the whole transactions parsed since `start` once they hold
`stream.batch_max_changes` row changes, or once `stream.batch_interval_seconds` have passed since the last
batch was handed over and nothing more is parsed yet, and says where they end. Until then it keeps what it
took and returns no new offset (after at most `READ_WAIT_SECONDS`, so that a query being stopped is not kept
waiting); the query runs with a zero trigger interval, so a batch starts as soon as the source has one and
a backlog is read batch after batch without waiting for a trigger. A DDL statement on a captured table always
begins a batch: the rows before it are decoded with the schema the target mirrors when the batch starts, the
rows after it with the schema right after it.

`readBetweenOffsets(start, end)`, which Spark calls to run a batch of its checkpoint again after a crash,
reads the same range from the server again: the same transactions, the same rows, the same end.

A batch is rows of (seq, kind, payload): kind "items" (up to ITEMS_PER_ROW `Transaction`s and `DdlStatement`s in
pickles one after the other: a large transaction pickled on its own by the parsing thread as soon as it is read,
runs of small ones pickled together as a list when the batch is handed over), in binlog order, then one "end" row: the
batch's end offset and the source time it is current to. Events before the point every target holds (the start
the job computed from Iceberg) are never read: Iceberg, not Spark's checkpoint, says what is done, so a
checkpoint may be lost or behind (the job refuses one that is ahead, see `ingest.structured`).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import pickle
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ingest.config import PipelineConfig
from ingest.model.changes import DdlStatement, TablesNamed, Transaction, changes_in
from ingest.model.position import BinlogPosition, MariadbGtidPos, Watermark
from ingest.model.schema import TableSchema
from ingest.runtime.python_gc import raise_gc_threshold
from ingest.source.binlog import BinlogReader, dump_server_id
from ingest.source.prefetch import End, Idle, Prefetch

log = logging.getLogger(__name__)

SCHEMA = "seq LONG, kind STRING, payload BINARY"


@dataclass(frozen=True)
class BinlogSourceSpec:
    """What the source process needs (pickled into it with the DataSource class)."""

    config: PipelineConfig
    flavor: str
    schemas: tuple[TableSchema, ...]
    """Each table's schema at `resume`: the one its target mirrors."""
    resume: Watermark
    """Every target holds every change before this point (computed from Iceberg by the job)."""
    contained_until: dict[tuple[str, str], BinlogPosition]
    planned_at: dict[tuple[str, str], BinlogPosition] = field(default_factory=dict)
    """Per table, a position before its snapshot's schema was loaded (see BinlogReader)."""
    goal: BinlogPosition | None = None
    """With "stop when caught up": the binlog end when the phase started; a batch reaching it is handed over at
    once."""


@dataclass(frozen=True)
class BatchEnd:
    """The last row of a batch: where it ends, and the source time (epoch seconds) that point is current to
    when the batch ends on an idle report (None when its transactions' commit times say it)."""

    offset: dict[str, Any]
    at: float | None = None


ITEMS_PER_ROW = 1000
"""Transactions pickled together into one row: Spark moves a few large rows much faster than many small."""

READ_WAIT_SECONDS = 0.5
"""The longest one `read` waits for the batch to fill or fall due; Spark asks again right after."""

FIRST_READ_WAIT_SECONDS = 5.0
"""The longest the query's first `read` waits (see `BinlogStreamReader.read`)."""


ENCODE_AHEAD_CHANGES = 100
"""A transaction of at least this many row changes is pickled by the parsing thread, while the previous batch
commits; smaller items are pickled together when their batch is handed over (one pickle per item would cost
more in the job's process to load than the list does)."""


def encode(item: Transaction | DdlStatement) -> bytes:
    """One item pickled on its own."""
    return pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)


def decode_batch(rows: list[Any]) -> tuple[list[Transaction | DdlStatement], BatchEnd]:
    """The items and the end of one micro-batch, from the rows of its DataFrame (in any order)."""
    ordered = sorted(rows, key=lambda r: r[0])
    if not ordered or ordered[-1][1] != "end":
        raise RuntimeError(f"a binlog batch without its end row ({len(ordered)} rows)")
    end = pickle.loads(bytes(ordered[-1][2]))
    items: list[Transaction | DdlStatement] = []
    for row in ordered[:-1]:
        payload = bytes(row[2])
        stream = io.BytesIO(payload)
        while stream.tell() < len(payload):
            part = pickle.load(stream)  # each pickle has a memo of its own
            if isinstance(part, list):
                items.extend(part)
            else:
                items.append(part)
    return items, end


def _rows(parts: Sequence[bytes | Transaction | DdlStatement], end: BatchEnd) -> list[tuple[int, str, bytes]]:
    """The rows of a batch: ITEMS_PER_ROW items to a row, each item already pickled or pickled here with the
    items next to it, then the end row."""
    rows = []
    for i, start in enumerate(range(0, len(parts), ITEMS_PER_ROW)):
        pickles: list[bytes] = []
        run: list[Transaction | DdlStatement] = []
        for part in parts[start : start + ITEMS_PER_ROW]:
            if isinstance(part, bytes):
                if run:
                    pickles.append(pickle.dumps(run, protocol=pickle.HIGHEST_PROTOCOL))
                    run = []
                pickles.append(part)
            else:
                run.append(part)
        if run:
            pickles.append(pickle.dumps(run, protocol=pickle.HIGHEST_PROTOCOL))
        rows.append((i, "items", b"".join(pickles)))
    rows.append((len(rows), "end", pickle.dumps(end)))
    return rows


class BinlogStreamReader:
    """The simple stream reader (the pyspark base class is added by `make_binlog_source`, so that this module
    imports without pyspark's data source machinery)."""

    def __init__(self, spec: BinlogSourceSpec) -> None:
        raise_gc_threshold()  # in Spark's Python process that runs the source
        self.spec = spec
        self._schemas = {(s.database, s.table): s for s in spec.schemas}
        self._reader: BinlogReader | None = None
        self._prefetch: Prefetch | None = None
        self._next: _Read | None = None
        """An item taken from the prefetch but left for the next batch (a DDL after other items)."""
        self._failure: Exception | None = None
        """The reader's error, raised once what it read before is handed over."""
        self._positioned = False
        """Whether the schemas are those at the start of the next read (see `_open`)."""
        self._batch: _Batch | None = None
        """What the prefetch handed over since the last batch's end, kept until the batch is due."""
        self._last_batch = time.monotonic()
        """When the last batch was handed over (the interval counts from there, as the loop's from a commit's
        start)."""

    # -- the Spark interface

    def initialOffset(self) -> dict[str, Any]:
        return self.spec.resume.to_json()

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[int, str, bytes]], dict[str, Any]]:
        begin = self._begin(start)
        if self._prefetch is None or self._batch is None or self._batch.begin != begin:
            self._open(begin)
        assert self._batch is not None
        # The first read waits for a due batch (up to FIRST_READ_WAIT_SECONDS, so that a stop is not held up
        # long): an offset that did not move would make Spark run an empty first batch (from no offset to the
        # initial one), a whole micro-batch for nothing.
        first = self._batch.begin == self.spec.resume and not self._batch.moved
        interval = self.spec.config.stream.batch_interval_seconds
        wait = min(interval, FIRST_READ_WAIT_SECONDS) if first else READ_WAIT_SECONDS
        batch = self._take(time.monotonic() + wait)
        if batch is None or not batch.moved:
            return iter(()), start
        self._batch = _Batch(batch.end)
        self._last_batch = time.monotonic()
        return iter(_rows(batch.parts, BatchEnd(batch.end.to_json(), batch.at))), batch.end.to_json()

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[tuple[int, str, bytes]]:
        begin, stop = self._begin(start), Watermark.from_json(end)
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
                    assert not isinstance(item, TablesNamed)  # reported only to readers that ask (the loop engine)
                    if isinstance(item, DdlStatement):
                        self._follow(reader, item)
                    items.append(item)
                    if position == stop.position:
                        break
            finally:
                reader.close()
        log.info("binlog source: replayed %d transactions from %s to %s", len(items), begin.position, stop.position)
        return iter(_rows(items, BatchEnd(end)))

    def commit(self, end: dict[str, Any]) -> None:
        pass

    def stop(self) -> None:
        self._close()

    # -- reading

    def _begin(self, start: dict[str, Any]) -> Watermark:
        """Where to read from for a batch starting at `start`: never before what every target holds."""
        mark = Watermark.from_json(start)
        resume = self.spec.resume
        if mark.server_id == resume.server_id and mark.position < resume.position:
            return resume
        return mark

    def _new_reader(self, begin: Watermark, blocking: bool, server_id: int | None = None) -> BinlogReader:
        stream, source = self.spec.config.stream, self.spec.config.source
        gtid = begin.gtid if isinstance(begin.gtid, MariadbGtidPos) else None
        return BinlogReader(
            source if server_id is None else dataclasses.replace(source, server_id=server_id),
            list(self._schemas.values()),
            begin.position,
            blocking=blocking,
            heartbeat_seconds=stream.heartbeat_seconds,
            on_ddl=stream.on_schema_change,
            start_gtid=gtid,
            contained_until=self.spec.contained_until,
            planned_at=self.spec.planned_at,
        )

    def _open(self, begin: Watermark) -> None:
        resume = self.spec.resume
        if not self._positioned and begin.server_id == resume.server_id and begin.position > resume.position:
            # Spark continues a kept checkpoint after the batch it planned last (which it runs again elsewhere).
            # The schemas are those at `resume`: follow the DDLs between there and `begin`, dropping the rows.
            for _ in self.readBetweenOffsets(resume.to_json(), begin.to_json()):
                pass
        self._positioned = True
        self._close()
        self._reader = self._new_reader(begin, blocking=True)
        self._prefetch = Prefetch(
            self._reader,
            self.spec.config.stream.batch_max_changes,
            lambda read: changes_in(read.item),
            pause_after=lambda read: isinstance(read.item, DdlStatement),
            prepare=lambda item: _Read(item, encode(item) if changes_in(item) >= ENCODE_AHEAD_CHANGES else None),
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

        Due, as in the loop engine: `batch_max_changes` changes taken, or the interval passed since the last
        batch and nothing more is ready; at once for a DDL (it ends the batch before it, or begins its own), at
        the goal of a catch-up, and when the reader failed after items were taken (they are handed over first).
        """
        assert self._prefetch is not None and self._reader is not None and self._batch is not None
        if self._failure is not None:
            raise self._failure
        stream = self.spec.config.stream
        batch, here, goal = self._batch, self.spec.resume.server_id, self.spec.goal
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
                # What was read before the failure is handed over first (the job commits it, as the loop does).
                self._failure = e
                return batch
            if item is None:
                if due and batch.moved:
                    return batch
                if time.monotonic() >= deadline:
                    return None
                continue
            if isinstance(item, Idle):
                batch.end, batch.at = Watermark(item.position, item.gtid, here), item.at
                continue
            if isinstance(item, End):
                return batch  # only when the reader was closed
            read: _Read = item
            if isinstance(read.item, DdlStatement):
                if batch.moved:
                    self._next = read
                    return batch
                self._follow(self._reader, read.item)
                self._prefetch.resume()
            batch.add(read, Watermark(read.item.end, read.item.gtid_after, here))
        return batch

    def _follow(self, reader: BinlogReader, ddl: DdlStatement) -> None:
        """Decode the rows after `ddl` with the schema right after it (the sink evolves the targets)."""
        from ingest.source.mysql import connect
        from ingest.source.schema_after import schema_after

        config = self.spec.config
        if ddl.kind == "drop":
            for key in ddl.tables:
                reader.forget(key)
            return
        with connect(config.source) as conn:
            for key in ddl.tables:
                live = schema_after(config, conn, self.spec.flavor, self._schemas[key], ddl)
                self._schemas[key] = live
                reader.set_schema(live)


@dataclass(frozen=True)
class _Read:
    """An item of the binlog as the parsing thread hands it over: with its encoding."""

    item: Transaction | DdlStatement
    payload: bytes | None
    """The item pickled, for a large transaction (ENCODE_AHEAD_CHANGES)."""


@dataclass
class _Batch:
    """The items taken for the next batch: they start at `begin` and end at `end`."""

    begin: Watermark
    parts: list[bytes | Transaction | DdlStatement] = field(default_factory=list)
    """Each item, pickled already or as it is (see `_rows`)."""
    changes: int = 0
    end: Watermark = field(init=False)
    at: float | None = None
    """The source time `end` is current to, when it was moved by an idle report."""

    def __post_init__(self) -> None:
        self.end = self.begin

    @property
    def moved(self) -> bool:
        return self.end != self.begin

    def add(self, read: _Read, end: Watermark) -> None:
        self.parts.append(read.item if read.payload is None else read.payload)
        self.changes += changes_in(read.item)
        self.end, self.at = end, None


def make_binlog_source(name: str, spec: BinlogSourceSpec) -> Any:
    """A DataSource class named `name` reading the binlog as `spec` says (pickled by value to Spark's Python
    process)."""
    from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

    class Reader(BinlogStreamReader, SimpleDataSourceStreamReader):
        pass

    class BinlogSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return SCHEMA

        def simpleStreamReader(self, schema: Any) -> Any:
            return Reader(spec)

    return BinlogSource
