"""Reading the binlog as whole transactions, from a position that is always a transaction boundary.

The FlinkX/Canal lesson (seed 002): a position is only ever handed out at the end of a complete
transaction, so a batch that stops there and is committed downstream can be resumed without losing or
repeating a row. Row values are brought to the driver's form (binlog_values.py) so snapshot and binlog
rows go through the same converters.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import closing
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    ExecuteLoadQueryEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, PartialUpdateRowsEvent, UpdateRowsEvent, WriteRowsEvent

from ingest.config import SourceConfig, TableSelection
from ingest.errors import BinlogPurgedError, SchemaChangeError, SourceError
from ingest.model.changes import (
    AlterColumns,
    DdlStatement,
    ForeignKey,
    TablesNamed,
    Transaction,
)
from ingest.model.position import BinlogPosition, MariadbGtid, MariadbGtidPos
from ingest.model.schema import TableSchema
from ingest.source.binlog import compressed_events, quick_events, row_events, table_maps
from ingest.source.binlog.captured_rows import CapturedRows
from ingest.source.binlog.ddl import (
    OnlineSchemaChanges,
    Swap,
    created_table,
    ddl_kind,
    ddl_tables,
    is_ddl,
    statement_tables,
)
from ingest.source.binlog.event_groups import (
    XaId,
    control_statement,
    group_flags,
    refuse_event,
    refuse_rolled_back,
)
from ingest.source.binlog.schema_statements import SchemaStatements
from ingest.source.binlog.xa import Prepared, XaHold
from ingest.source.mysql import binlog_files, connect, connection_refused, require_tls, tls_context, tls_failure
from ingest.source.reconnect import Reconnect, lost_connection, stall_timeout

log = logging.getLogger(__name__)

__all__ = [
    "BinlogReader",
    "SchemaChangeError",
    "ddl_tables",
    "query_of",
    "refuse_statement",
    "statement_tables",
]


READ_BUFFER_BYTES = 1 << 18
"""The binlog stream's read buffer (256 KiB): `quick_events` reads the events wholly in it in place."""


def refuse_statement(table_id: str, position: BinlogPosition, query: str) -> SourceError:
    """The error of a change to `table_id` logged as a statement: it cannot be applied, nor skipped."""
    return SourceError(
        f"{table_id}: the change at binlog position {position} was logged as SQL text, not as row events "
        f"({query[:200]!r}): the session that made it used binlog_format STATEMENT or MIXED, and the job cannot "
        "know which rows it changed. Nothing from it on was applied. Make every writer log rows (binlog_format "
        "ROW, without a session override), then snapshot the table again: "
        f"`ingest resnapshot --config ... --table {table_id}`"
    )


def check_not_purged(conn: pymysql.connections.Connection[Any], start: BinlogPosition) -> None:
    """A purged start position is an error with the way out, never a silent gap."""
    files = binlog_files(conn)
    if start.file not in files:
        raise BinlogPurgedError(
            f"the binlog position to resume from, {start}, is no longer on the server (oldest binlog: "
            f"{files[0] if files else 'none'}); changes made since then cannot be read. Snapshot every table "
            "again (`ingest resnapshot --config ... --table DB.T --table ...`, then `ingest run`), "
            "and keep binlogs longer than the job may be down (expire_logs_days / binlog_expire_logs_seconds)"
        )


def stream_connection(source: SourceConfig, read_timeout: float | None = None) -> dict[str, Any]:
    """How a replication stream connects (BinLogStreamReader options): as the CDC user, with TLS as its other
    sessions, and refusing a server that does not take it. `read_timeout`: a read that waits longer fails as a lost
    connection (a stalled stream, see ingest.source.reconnect)."""

    def connect_checked(**settings: Any) -> pymysql.connections.Connection[Any]:
        try:
            conn = pymysql.connect(**settings)
        except pymysql.err.OperationalError as e:
            if tls_failure(e) is None:
                raise  # the library's own handling (a lost connection is retried)
            raise connection_refused(source, e) from None
        return with_read_buffer(require_tls(conn, source))

    settings = {
        "host": source.host,
        "port": source.port,
        "user": source.user,
        "passwd": source.password.reveal(),
        "charset": "utf8mb4",
        "connect_timeout": source.connect_timeout,
        "ssl": tls_context(source),
    }
    if read_timeout is not None:
        settings["read_timeout"] = read_timeout
    return {"connection_settings": settings, "pymysql_wrapper": connect_checked}


def with_read_buffer(conn: pymysql.connections.Connection[Any]) -> pymysql.connections.Connection[Any]:
    """The stream's connection reading through a buffer of READ_BUFFER_BYTES, not the 8 KiB a socket's file has:
    `quick_events` reads only the packets wholly in it, and a row event is about 8 KiB (the server's
    binlog_row_event_max_size) or longer, so a packet split at the buffer's end went through the library one time
    in a few (bench.reader), and a longer event every time. Swapped right after the handshake (and the TLS one),
    when the server has sent nothing the old buffer could hold: it asks before it answers."""
    old = conn._rfile  # type: ignore[attr-defined]
    conn._rfile = conn._sock.makefile("rb", buffering=READ_BUFFER_BYTES)  # type: ignore[attr-defined]
    old.close()
    return conn


def dump_server_id() -> int:
    """A server id for a dump connection of the job's own: the server drops an older one with the same id."""
    return random.randint(1 << 20, (1 << 31) - 1)


def first_ddl_between(
    source: SourceConfig, tables: Sequence[tuple[str, str]], start: BinlogPosition, end: BinlogPosition
) -> tuple[BinlogPosition, str, list[tuple[str, str]]] | None:
    """The first DDL statement that may change the columns of one of `tables` (a TRUNCATE does not) in the binlog
    from `start` up to `end`: where it ends, its text and the tables it touches; None when there is none."""
    return next(iter(ddl_between(source, tables, start, end, first_only=True)), None)


def ddl_between(
    source: SourceConfig,
    tables: Sequence[tuple[str, str]],
    start: BinlogPosition,
    end: BinlogPosition,
    first_only: bool = False,
) -> list[tuple[BinlogPosition, str, list[tuple[str, str]]]]:
    """Every DDL statement that may change the columns of one of `tables` (a TRUNCATE does not) in the binlog from
    `start` up to `end`, in binlog order: where each ends, its text and the tables it touches."""
    found = []
    stream = open_stream(source, start, dump_server_id(), only_events=[QueryEvent])
    try:
        for event in stream:
            at = BinlogPosition(stream.log_file, event.packet.log_pos)
            if at > end:
                break
            query, schema = query_of(event)
            touched = ddl_tables(query, schema, tables)
            if touched and ddl_kind(query) != "truncate":
                found.append((at, query, touched))
                if first_only:
                    break
    finally:
        stream.close()
    return found


def helper_history(source: SourceConfig, swap: Swap, end: BinlogPosition) -> AlterColumns | None:
    """What the ALTERs of an online schema change's helper table said of columns, read back from the binlog up
    to the swap ending at `end`; None when its CREATE is no longer on the server.

    For a swap met by a job that did not read the migration from its start (it started, or resumed after a
    crash, during it). The binlog files up to the swap's are read from the newest back, each once, until one
    holds the helper's CREATE; the DDL statements from there to the swap are then followed as the reader would.
    """
    with connect(source) as conn:
        files = [f for f in binlog_files(conn) if BinlogPosition(f, 4) <= end]
    later: list[tuple[str, str]] = []
    """The DDL statements of the files read so far, in binlog order."""
    for file in reversed(files):
        here = _ddl_statements(source, file, end)
        statements = here + later
        if any(created_table(query, db) == swap.helper for query, db in here):
            osc = OnlineSchemaChanges()
            for query, db in statements:
                result = osc.read(query, db, [swap.table])
                if isinstance(result, Swap) and result.helper == swap.helper:
                    return result.said
            return None
        later = statements
    return None


def _ddl_statements(source: SourceConfig, file: str, end: BinlogPosition) -> list[tuple[str, str]]:
    """(statement, default database) of the DDL in binlog file `file`, up to `end`."""
    found = []
    stream = open_stream(source, BinlogPosition(file, 4), dump_server_id(), only_events=[QueryEvent])
    try:
        for event in stream:
            at = BinlogPosition(stream.log_file, event.packet.log_pos)
            if at > end or stream.log_file != file:
                break
            query, schema = query_of(event)
            if is_ddl(query):
                found.append((query, schema))
    finally:
        stream.close()
    return found


def find_prepared(source: SourceConfig, xid: XaId, before: BinlogPosition) -> BinlogPosition | None:
    """Where the event group of XA transaction `xid`'s XA PREPARE begins, searched in the binlog before `before`
    from the newest file back; None when no binlog on the server holds it."""
    with connect(source) as conn:
        files = [f for f in binlog_files(conn) if BinlogPosition(f, 4) <= before]
    for file in reversed(files):
        group: BinlogPosition | None = None
        with closing(scan(source, BinlogPosition(file, 4), [MariadbGtidEvent, QueryEvent, XAPrepareEvent])) as events:
            for event, begins, ends in events:
                if ends > before or ends.file != file:
                    break
                opens = isinstance(event, MariadbGtidEvent) or (
                    isinstance(event, QueryEvent) and control_statement(query_of(event)[0]) == "xa start"
                )
                if opens and (group is None or isinstance(event, MariadbGtidEvent)):
                    group = begins
                if isinstance(event, XAPrepareEvent) and not event.one_phase:
                    if XaId.of(event) == xid:
                        return group
                    group = None
    return None


def scan(
    source: SourceConfig, start: BinlogPosition, only_events: Sequence[type]
) -> Generator[tuple[Any, BinlogPosition, BinlogPosition], None, None]:
    """A side stream's events from `start` (a dump connection of its own), each with where it begins and ends;
    the artificial events a server sends ahead of a file are left out. Close it to end the stream early."""
    stream = open_stream(source, start, dump_server_id(), only_events=list(only_events))
    try:
        for event in stream:
            if event.packet.log_pos:
                end = event.packet.log_pos
                yield (
                    event,
                    BinlogPosition(stream.log_file, end - event.packet.event_size),
                    BinlogPosition(stream.log_file, end),
                )
    finally:
        stream.close()


def read_prepared(
    source: SourceConfig, schemas: Iterable[TableSchema], xid: XaId, before: BinlogPosition, end: BinlogPosition
) -> Prepared:
    """The changes to `schemas`' tables of XA transaction `xid`, and its foreign key actions that reach them,
    prepared before `before` and committed at `end`, read back from the binlog. The prepared transaction held its
    rows' locks (and its tables' metadata locks) until the commit, so the schemas of the commit decode them."""
    found = find_prepared(source, xid, before)
    if found is None:
        raise SourceError(
            f"XA COMMIT {xid} at binlog position {end} commits a transaction prepared before {before}, and its XA "
            "PREPARE is no longer in the binlog: its changes cannot be read. Nothing from the commit on was "
            "applied. Snapshot the captured tables it may have changed again (`ingest resnapshot --config ... "
            "--table DB.T`)"
        )
    # A dump connection of its own: the server would drop the running reader's, which has the pipeline's id.
    reader = BinlogReader(dataclasses.replace(source, server_id=dump_server_id()), list(schemas), found)
    reader._xa.stop_after = xid
    try:
        for _ in reader.transactions():
            pass
    finally:
        reader.close()
    return reader._xa.held(xid)


def open_stream(
    source: SourceConfig,
    start: BinlogPosition,
    server_id: int,
    *,
    blocking: bool = False,
    heartbeat_seconds: float | None = None,
    **filters: Any,
) -> BinLogStreamReader:
    """A replication stream from a file/position as the CDC user; `filters` are the library's only_* options."""
    table_maps.install()
    compressed_events.install()
    row_events.install()
    stalled = stall_timeout(heartbeat_seconds) if blocking and heartbeat_seconds else None
    return BinLogStreamReader(
        **stream_connection(source, stalled),
        server_id=server_id,
        log_file=start.file,
        log_pos=start.pos,
        resume_stream=True,
        blocking=blocking,
        slave_heartbeat=heartbeat_seconds if blocking else None,
        # File/position streaming; with is_mariadb=True the library would start at the file's head.
        is_mariadb=False,
        **filters,
    )


_NEXT, _END, _STOP = "next", "end", "stop"
"""What comes after a statement event (`BinlogReader._statement`): read on; the group is complete at it; stop."""


class BinlogReader:
    """Transactions of the captured tables, in commit order, starting at a transaction boundary.

    About 380 lines, on purpose: its steps (reading events, grouping them into transactions, reconnecting) share
    one event group's state, the position, the GTID position and the group's flags, which every kind of event reads
    and moves. What holds state of its own is apart: the rows and the foreign key actions (`captured_rows`), the
    schema statements (`schema_statements`), the XA transactions held (`xa`), the table maps (`table_maps`), the
    everyday events read in place from the connection's buffer (`quick_events`; the rest are the library's)."""

    def __init__(
        self,
        source: SourceConfig,
        schemas: Sequence[TableSchema],
        start: BinlogPosition,
        blocking: bool = False,
        heartbeat_seconds: float = 1.0,
        on_ddl: str = "fail",
        start_gtid: MariadbGtidPos | None = None,
        contained_until: dict[tuple[str, str], BinlogPosition] | None = None,
        new_tables: TableSelection | None = None,
        planned_at: dict[tuple[str, str], BinlogPosition] | None = None,
        recopy: bool = False,
    ) -> None:
        self.source = source
        self.start = start
        self.position = start
        self.gtid = start_gtid
        """MariaDB's GTID position at `position`, kept by the GTID of every event group that ends (when the
        start's is known): it is what finds `position` again on another server after a failover."""
        self._group_gtid: MariadbGtid | None = None
        self._in_group = False
        """An event group that a BEGIN opened (MariaDB: its GTID event is not standalone) is being read: its
        statements (SAVEPOINT, XA END, DML of tables not captured) belong to it until its commit."""
        self._xa_group = False
        """The group being read is an XA transaction's first half, which ends at XA PREPARE."""
        self._xa = XaHold(lambda xid, end: read_prepared(self.source, self.schemas.values(), xid, self.start, end))
        self._contained_until = dict(contained_until or {})
        """Per table, a position up to which every row change is already in the snapshot's chunks (the lowest
        chunk high watermark): such rows are not decoded at all. They may predate the schema the table is
        decoded with, when the table was snapshotted again after a schema change."""
        self.heartbeat_seconds = heartbeat_seconds
        self._last_idle = time.monotonic()
        self.idle_at_end = False
        """Whether the idle report being made comes at a heartbeat (the server sent all it had), not after another
        table's transaction."""
        self.blocking = blocking
        self._buffer = quick_events.Buffer()
        self._file = start
        """A position in the stream's binlog file: events' ends are made from it (`_end`)."""
        self._stream = self._open(start)
        self._reconnect = Reconnect(source.reconnect_seconds, f"{source.host}:{source.port}")
        self.on_reconnect: Callable[[Reconnect], None] | None = None
        """Told of each reconnect attempt, and of the recovery (ingest.source.reconnect.publish)."""
        self._interrupted = threading.Event()
        self._waiting: Callable[[], None] = _nothing
        """Told before the reader may wait for the server (`transactions`)."""
        self._tables = {(s.database, s.table) for s in schemas}
        self._ddl = SchemaStatements(
            self._tables, self._contained_until, dict(planned_at or {}), on_ddl, recopy, new_tables
        )
        self._rows = CapturedRows(source, schemas, self._tables, self._contained_until, self._ddl.unfollowed)

    def _open(self, start: BinlogPosition) -> BinLogStreamReader:
        return open_stream(
            self.source,
            start,
            self.source.server_id,
            blocking=self.blocking,
            heartbeat_seconds=self.heartbeat_seconds,
            # Every event that can carry a change is read, and what the reader does not apply stops it
            # (`refuse_event`): a filter on event classes would pass over the kinds it does not name.
            only_events=[
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
                XidEvent,
                QueryEvent,
                MariadbGtidEvent,
                HeartbeatLogEvent,
                XAPrepareEvent,
                NotImplementedEvent,
                ExecuteLoadQueryEvent,
                PartialUpdateRowsEvent,
            ],
        )

    def close(self) -> None:
        self._stream.close()

    def interrupt(self) -> None:
        """End a wait between reconnects at once (the consumer stops): `transactions` returns instead of reading
        again. Called from another thread."""
        self._interrupted.set()

    @property
    def reconnecting(self) -> Reconnect:
        """The reader's reconnects: since when the current streak of failures runs, its attempts, its last error."""
        return self._reconnect

    @property
    def chained(self) -> dict[str, list[ForeignKey]]:
        """Per captured table (by id): its foreign keys whose actions act on captured tables, itself too."""
        return self._rows.chained

    @property
    def schemas(self) -> dict[tuple[str, str], TableSchema]:
        """The schema each captured table's rows are decoded with now."""
        return self._rows.schemas

    def set_schema(self, schema: TableSchema) -> None:
        """Decode the table's rows with `schema` from here on (after its DDL was applied downstream)."""
        self._rows.set_schema(schema)

    def forget(self, key: tuple[str, str]) -> None:
        """Capture the table no more (it was dropped or renamed away): its name's later rows are another table's."""
        self._tables.discard(key)
        self._rows.forget(key)

    def transactions(
        self, idle: Callable[[float], bool] | None = None, waiting: Callable[[], None] | None = None
    ) -> Iterator[Transaction | DdlStatement | TablesNamed]:
        """`_read`'s items; a lost connection (a restarted server, a killed or stalled stream) is opened again at
        the last transaction boundary, with backoff, for at most `source.reconnect_seconds` (ingest.source.reconnect):
        the part of a transaction read before the loss is read again whole, nothing is handed over twice.

        `waiting()` is told each time the reader may wait for the server (or for a reconnect) before its next item:
        a consumer that gathers items hands over what it has then."""
        self._waiting = waiting or _nothing
        while True:
            try:
                yield from self._read(idle)
                return
            except Exception as e:
                if not lost_connection(e):
                    raise
                wait = self._reconnect.next_wait(
                    e,
                    f"Everything before binlog position {self.position} that the job committed stays; `ingest run` "
                    "resumes there once the server is back",
                )
                log.warning(
                    "lost the binlog connection to %s (%s); reading again from %s in %.1f s (attempt %d)",
                    self._reconnect.where,
                    self._reconnect.last_error,
                    self.position,
                    wait,
                    self._reconnect.attempts,
                )
                if self.on_reconnect is not None:
                    self.on_reconnect(self._reconnect)
                self._waiting()
                if self._interrupted.wait(wait):
                    return  # the consumer is gone (a stop): no more reading
                self._reopen()

    def _recovered(self) -> None:
        # A warning, as the loss was: the source's process logs nothing below that (Spark's worker).
        log.warning(
            "the binlog connection to %s is back after %d attempt(s); reading from %s",
            self._reconnect.where,
            self._reconnect.attempts,
            self.position,
        )
        self._reconnect.recovered()
        if self.on_reconnect is not None:
            self.on_reconnect(self._reconnect)

    def _reopen(self) -> None:
        """A new stream at the last transaction boundary; what was read of the group after it is forgotten."""
        try:
            self._stream.close()
        except Exception:  # noqa: BLE001 - the old connection is dead already
            pass
        self._in_group = self._xa_group = False
        self._group_gtid = None
        self._stream = self._open(self.position)

    def _read(self, idle: Callable[[float], bool] | None) -> Iterator[Transaction | DdlStatement | TablesNamed]:
        """Complete transactions; `idle(at)` is told when the captured tables have nothing new up to `position`.

        It is called at server heartbeats (the binlog is idle: `at` is now) and, while only other tables
        change (a busy binlog brings no heartbeats), at the end of such a transaction at most once per
        heartbeat period (`at` is its commit time): so the offset moves and the job can stop. A true return
        ends the iteration.

        With `on_ddl="evolve"` an ALTER TABLE of a captured table is yielded as a `DdlStatement` between
        the transactions before and after it: the caller commits what came before, evolves the target and
        calls `set_schema`, and the rows after it (whose table-map events carry the new column names) are
        decoded with the new schema.
        """
        current: Transaction | None = None
        stream = self._stream
        try:
            while True:
                current, stop = yield from self._quick(stream, current, idle)
                if stop:
                    return
                if self._buffer.drained and self._buffer.wait(stream, self.heartbeat_seconds, self._waiting):
                    continue  # more came: read in place (what comes before a heartbeat, or nothing, is the library's)
                event = self._library_event(stream)
                if event is None:
                    return
                log_pos = event.packet.log_pos
                end = self._end(stream, log_pos)
                if isinstance(event, HeartbeatLogEvent):
                    if idle is not None and current is None and self._idle_heartbeat(idle):
                        return
                    continue
                if isinstance(event, MariadbGtidEvent):
                    current = self._group_began(event.domain_id, event.server_id, event.gtid_seq_no, event.flags, end)
                    continue
                if isinstance(event, PartialUpdateRowsEvent | NotImplementedEvent | ExecuteLoadQueryEvent):
                    refuse_event(event, end, self._tables)
                    continue
                if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                    current = self._rows.add(event, end, current, self._xa_group, self.position)
                    continue
                if isinstance(event, XAPrepareEvent) and not event.one_phase:
                    if self._xa_prepared(event, end, current) or self._report_idle(idle, float(event.timestamp)):
                        return
                    current = None
                    continue
                if isinstance(event, QueryEvent):
                    current, then = yield from self._statement(event, end, current, idle)
                    if then == _STOP:
                        return
                    if then == _NEXT:
                        continue
                # XidEvent, COMMIT of a non-transactional engine, XA COMMIT (or ONE PHASE), XA ROLLBACK, or a ROLLBACK
                # of a group without captured changes: the group is complete here.
                if (yield from self._completed(event.timestamp, end, current, idle)):
                    return
                current = None
        except pymysql.err.OperationalError as e:
            if e.args and e.args[0] == 1236:
                raise BinlogPurgedError(f"the binlog at {self.position} is gone from the server: {e.args[1]}") from None
            raise

    def _quick(
        self, stream: BinLogStreamReader, current: Transaction | None, idle: Callable[[float], bool] | None
    ) -> Generator[Transaction, None, tuple[Transaction | None, bool]]:
        """The events the connection's buffer holds whole and `quick_events` reads (a GTID, ANNOTATE_ROWS, a table
        map parsed before, a row event decoded here, an XID), as `_read` reads the library's; up to the first the
        library must read. Returns the transaction under way, and whether `idle` ends the reading."""
        buffer = self._buffer
        if not buffer.look(stream):
            return current, False
        self._read_again()
        file = self._in_file(stream)  # (the library reads a rotation: the file stays while events are read here)
        while (event := buffer.next_event(stream)) is not None:
            kind = event.type
            if kind == quick_events.TABLE_MAP:
                break  # one the library parses
            end = file.moved_to(event.log_pos) if event.log_pos else self.position
            if kind == quick_events.GTID:
                domain_id, seq_no, flags = buffer.gtid(event)
                buffer.take(event)
                current = self._group_began(domain_id, event.server_id, seq_no, flags, end)
            elif kind == quick_events.XID:
                buffer.take(event)
                buffer.settle(stream)  # the transaction is handed over whole: the buffer is as the library left it
                if (yield from self._completed(event.timestamp, end, current, idle)):
                    return None, True
                current = None
            else:
                rows = buffer.rows(event)
                table = None if rows is None else stream.table_map.get(rows.table_id)
                if rows is None or table is None:
                    break
                taken, current = self._rows.add_quick(
                    table, rows, buffer.data, stream.dbms, end, current, self._xa_group
                )
                if not taken:
                    break
                buffer.take(event)
        buffer.settle(stream)
        return current, False

    def _library_event(self, stream: BinLogStreamReader) -> Any:
        """The next event python-mysql-replication reads (None: the stream's end)."""
        self._waiting()  # its read may wait for the server
        event = stream.fetchone()
        if event is not None:
            self._buffer.after_library(stream)
            self._read_again()
        return event

    def _end(self, stream: BinLogStreamReader, log_pos: int) -> BinlogPosition:
        """Where an event ends, from its header: in the stream's file (none given: where the reader is)."""
        return self._in_file(stream).moved_to(log_pos) if log_pos else self.position

    def _in_file(self, stream: BinLogStreamReader) -> BinlogPosition:
        """A position in the stream's binlog file (events' ends are made from it)."""
        if self._file.file != stream.log_file:
            self._file = BinlogPosition(stream.log_file, 4)
        return self._file

    def _read_again(self) -> None:
        """An event came: a reconnect under way has succeeded."""
        if self._reconnect.since is not None:
            self._recovered()

    def _idle_heartbeat(self, idle: Callable[[float], bool]) -> bool:
        """A server heartbeat outside a transaction: the binlog is idle now. True: `idle` ends the reading."""
        self._last_idle = time.monotonic()
        self.idle_at_end = True
        return idle(time.time())

    def _group_began(self, domain_id: int, server_id: int, seq_no: int, flags: int, end: BinlogPosition) -> Transaction:
        # From the event's numbers, not its text: parsing it back cost a regex per transaction.
        self._group_gtid = MariadbGtid.of_event(domain_id, server_id, seq_no)
        self._in_group, self._xa_group = group_flags(flags)
        return Transaction(end, gtid=f"{domain_id}-{server_id}-{seq_no}")

    def _xa_prepared(self, event: XAPrepareEvent, end: BinlogPosition, current: Transaction | None) -> bool:
        """XA PREPARE ends the first half of an XA transaction: its changes are held until it is decided. True:
        the reader was only to read back this one (`read_prepared`)."""
        self._boundary(end)
        return self._xa.prepare(XaId.of(event), current)

    def _contained_at(self, table_id: str) -> BinlogPosition | None:
        """Up to where the snapshot's chunks hold every row change of a captured table (None: no bound)."""
        database, _, table = table_id.partition(".")  # MySQL names hold no '.'
        return self._contained_until.get((database, table)) if (database, table) in self.schemas else None

    def _completed(
        self, timestamp: int, end: BinlogPosition, current: Transaction | None, idle: Callable[[float], bool] | None
    ) -> Generator[Transaction, None, bool]:
        """The event group ends at `end`, logged at `timestamp`: its transaction is yielded, or, without captured
        changes, the idle report may be due. Returns True when `idle` ends the reading."""
        self._boundary(end)
        if current is None:
            return self._report_idle(idle, float(timestamp))
        current.end = end
        current.gtid_after = self.gtid
        current.commit_time = int(timestamp)
        yield current
        return False

    def _statement(
        self, event: QueryEvent, end: BinlogPosition, current: Transaction | None, idle: Callable[[float], bool] | None
    ) -> Generator[DdlStatement | TablesNamed, None, tuple[Transaction | None, str]]:
        """A statement logged as text: a group's control statement (BEGIN, SAVEPOINT, COMMIT, the XA ones), or a
        statement of its own (DDL), followed or refused. Returns the transaction under way, and what comes next:
        `_NEXT` (read on), `_END` (the group is complete at this event) or `_STOP` (`idle` ends the reading)."""
        query, default_db = query_of(event)
        control = control_statement(query)
        if control in ("begin", "xa start"):
            self._in_group, self._xa_group = True, control == "xa start"
            return current, _NEXT
        if control in ("savepoint", "xa end"):
            # The server cuts what a ROLLBACK TO SAVEPOINT undid out of the group before logging it.
            return current, _NEXT
        if control in ("rollback", "rollback to savepoint"):
            if current is not None and current.changes:
                raise refuse_rolled_back(query, end, current.changes[0].table_id)
            if control == "rollback to savepoint":
                return current, _NEXT
        for t in statement_tables(query, default_db, self._tables):
            # A table snapshotted after the statement already has what it did.
            if (contained := self._contained_until.get(t)) is None or end > contained:
                raise refuse_statement(f"{t[0]}.{t[1]}", end, query)
        if control in ("xa commit", "xa rollback"):
            current = self._xa.decide(query, control, current, end, self._contained_at)
        elif self._in_group and control not in ("commit", "rollback"):
            return current, _NEXT  # a statement inside the group (DML of other tables logged as text): not its end
        if (yield from self._schema_statement(event, query, default_db, end)):
            return None, _NEXT
        if control in ("commit", "rollback", "xa commit", "xa rollback"):
            return current, _END
        # A DDL statement is a transaction of its own: its end is a boundary.
        self._boundary(end)
        named = self._ddl.named(query, default_db)
        if named:
            yield TablesNamed(named, end, self.gtid)
            return None, _NEXT
        return None, _STOP if self._report_idle(idle, float(event.timestamp)) else _NEXT

    def _schema_statement(
        self, event: QueryEvent, query: str, default_db: str, end: BinlogPosition
    ) -> Generator[DdlStatement | TablesNamed, None, bool]:
        """A statement that changes captured tables' schemas or partitions: refused, or recorded, and with
        `on_ddl="evolve"` yielded as a `DdlStatement` (True: the caller reads on after it)."""
        followed = self._ddl.read(query, default_db, end, getattr(event, "sql_mode", None))
        if followed is None:
            return False
        said = followed.said
        if followed.swap is not None and said is None:
            said = helper_history(self.source, followed.swap, end)
        start = self.position
        self._boundary(end)
        yield DdlStatement(query, followed.tables, start, end, self.gtid, followed.kind, said)
        # A table renamed into the patterns by the same statement is copied (see TablesNamed).
        named = self._ddl.named(query, default_db) if followed.kind == "drop" else ()
        if named:
            yield TablesNamed(named, end, self.gtid)
        return True

    def _report_idle(self, idle: Callable[[float], bool] | None, at: float) -> bool:
        """A transaction of other tables ended: tell `idle` at most once per heartbeat period (see transactions);
        its answer, whether to stop."""
        now = time.monotonic()
        if idle is None or now - self._last_idle < self.heartbeat_seconds:
            return False
        self._last_idle = now
        self.idle_at_end = False
        return idle(at)

    def _boundary(self, end: BinlogPosition) -> None:
        """An event group ends at `end`: the position and the GTID position move past it together."""
        self._in_group = self._xa_group = False
        self.position = end
        if self.gtid is not None and self._group_gtid is not None:
            self.gtid = self.gtid.advance(self._group_gtid)
        self._group_gtid = None


def _nothing() -> None:
    pass


def _text(value: Any) -> str:
    return str(value.decode() if isinstance(value, bytes) else value)


def query_of(event: QueryEvent) -> tuple[str, str]:
    """A query event's SQL text and the default database it ran in."""
    query = event.query if isinstance(event.query, str) else event.query.decode("utf-8", "replace")
    return query, _text(event.schema)
