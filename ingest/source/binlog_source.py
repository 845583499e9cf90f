"""The binlog as a Spark Structured Streaming source: a Python Data Source simple stream reader.

Offsets are watermarks in JSON (`Watermark.to_json`: binlog file and position, MariaDB GTID position, server
id), always at a transaction boundary. Spark runs the reader in a Python process of its own on the driver,
for the whole query: a thread there parses the binlog ahead (`Prefetch`), and `read(start)` hands over the
whole transactions parsed since `start`, up to `stream.batch_max_changes` row changes, and says where they
end. A DDL statement on a captured table always begins a batch: the rows before it are decoded with the
schema the target mirrors when the batch starts, the rows after it with the schema right after it.

`readBetweenOffsets(start, end)`, which Spark calls to run a batch of its checkpoint again after a crash,
reads the same range from the server again: the same transactions, the same rows, the same end.

A batch is rows of (seq, kind, payload): kind "items" (a list of up to ITEMS_PER_ROW `Transaction`s and
`DdlStatement`s, pickled), in binlog order, then one "end" row: the batch's end offset and the source time
it is current to. Events before the point every target holds (the start the job computed from Iceberg)
are never read: Iceberg, not Spark's checkpoint, says what is done, so a checkpoint may be lost or behind
(the job refuses one that is ahead, see `ingest.structured`).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ingest.config import PipelineConfig
from ingest.source.binlog import BinlogReader, DdlStatement, TablesNamed, Transaction, changes_in, dump_server_id
from ingest.source.mysql import TableSchema
from ingest.source.position import BinlogPosition, MariadbGtidPos, Watermark
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


@dataclass(frozen=True)
class BatchEnd:
    """The last row of a batch: where it ends, and the source time (epoch seconds) that point is current to
    when the batch ends on an idle report (None when its transactions' commit times say it)."""

    offset: dict[str, Any]
    at: float | None = None


ITEMS_PER_ROW = 1000
"""Transactions pickled together into one row: Spark moves a few large rows much faster than many small."""


def decode_batch(rows: list[Any]) -> tuple[list[Transaction | DdlStatement], BatchEnd]:
    """The items and the end of one micro-batch, from the rows of its DataFrame (in any order)."""
    ordered = sorted(rows, key=lambda r: r[0])
    if not ordered or ordered[-1][1] != "end":
        raise RuntimeError(f"a binlog batch without its end row ({len(ordered)} rows)")
    end = pickle.loads(bytes(ordered[-1][2]))
    return [item for r in ordered[:-1] for item in pickle.loads(bytes(r[2]))], end


def _rows(items: list[Transaction | DdlStatement], end: BatchEnd) -> list[tuple[int, str, bytes]]:
    rows = [
        (i, "items", pickle.dumps(items[start : start + ITEMS_PER_ROW], protocol=pickle.HIGHEST_PROTOCOL))
        for i, start in enumerate(range(0, len(items), ITEMS_PER_ROW))
    ]
    rows.append((len(rows), "end", pickle.dumps(end)))
    return rows


class BinlogStreamReader:
    """The simple stream reader (the pyspark base class is added by `make_binlog_source`, so that this module
    imports without pyspark's data source machinery)."""

    def __init__(self, spec: BinlogSourceSpec) -> None:
        self.spec = spec
        self._schemas = {(s.database, s.table): s for s in spec.schemas}
        self._reader: BinlogReader | None = None
        self._prefetch: Prefetch | None = None
        self._next: Any = None
        """An item taken from the prefetch but left for the next batch (a DDL after other items)."""
        self._at: Watermark | None = None
        """Where the prefetch's next item starts."""
        self._failure: Exception | None = None
        """The reader's error, raised once what it read before is handed over."""
        self._positioned = False
        """Whether the schemas are those at the start of the next read (see `_open`)."""

    # -- the Spark interface

    def initialOffset(self) -> dict[str, Any]:
        return self.spec.resume.to_json()

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[int, str, bytes]], dict[str, Any]]:
        begin = self._begin(start)
        if self._prefetch is None or self._at != begin:
            self._open(begin)
        items, end, at = self._take(begin)
        if end.to_json() == start:
            return iter(()), start
        return iter(_rows(items, BatchEnd(end.to_json(), at))), end.to_json()

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
            changes_in,
            pause_after=lambda item: isinstance(item, DdlStatement),
        )
        self._at = begin

    def _close(self) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
        if self._reader is not None:
            self._reader.close()
        self._prefetch = self._reader = self._next = self._at = self._failure = None

    def _take(self, begin: Watermark) -> tuple[list[Transaction | DdlStatement], Watermark, float | None]:
        """What the prefetch has ready, whole transactions up to the batch size; a DDL only first."""
        assert self._prefetch is not None and self._reader is not None
        if self._failure is not None:
            raise self._failure
        here = self.spec.resume.server_id
        items: list[Transaction | DdlStatement] = []
        changes = 0
        end, at = begin, None
        while changes < self.spec.config.stream.batch_max_changes:
            item, self._next = self._next, None
            try:
                if item is None:
                    item = self._prefetch.poll()
            except Exception as e:
                if end == begin:
                    raise
                # What was read before the failure is handed over first (the job commits it, as the loop does).
                self._failure = e
                break
            if item is None:
                break
            if isinstance(item, Idle):
                end, at = Watermark(item.position, item.gtid, here), item.at
                continue
            if isinstance(item, End):
                break  # only when the reader was closed
            if isinstance(item, DdlStatement):
                if items or end != begin:
                    self._next = item
                    break
                self._follow(self._reader, item)
                self._prefetch.resume()
                items.append(item)
                end, at = Watermark(item.end, item.gtid_after, here), None
                continue
            items.append(item)
            changes += len(item.changes)
            end, at = Watermark(item.end, item.gtid_after, here), None
        self._at = end
        return items, end, at

    def _follow(self, reader: BinlogReader, ddl: DdlStatement) -> None:
        """Decode the rows after `ddl` with the schema right after it (the sink evolves the targets)."""
        from ingest.source.mysql import connect
        from ingest.streaming import schema_after

        config = self.spec.config
        with connect(config.source) as conn:
            for key in ddl.tables:
                live = schema_after(config, conn, self.spec.flavor, self._schemas[key], ddl)
                self._schemas[key] = live
                reader.set_schema(live)


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
