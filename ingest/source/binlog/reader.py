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
    KeyAction,
    RowChange,
    TablesNamed,
    Transaction,
)
from ingest.model.position import BinlogPosition, MariadbGtid, MariadbGtidPos
from ingest.model.schema import TableSchema
from ingest.source.binlog import compressed_events, row_events, table_maps
from ingest.source.binlog.binlog_values import RowDecoder, row_images
from ingest.source.binlog.ddl import (
    CUT_OVER,
    OnlineSchemaChanges,
    Swap,
    alter_columns,
    created_table,
    ddl_kind,
    ddl_tables,
    is_ddl,
    named_tables,
    partition_tables,
    renamed_tables,
    statement_tables,
)
from ingest.source.binlog.event_groups import (
    XaId,
    control_statement,
    group_flags,
    refuse_event,
    refuse_rolled_back,
)
from ingest.source.binlog.foreign_keys import Actions, load_actions, named_parent_rows, update_changed
from ingest.source.binlog.row_events import RowEvents, event_kind
from ingest.source.binlog.xa import Prepared, XaHold
from ingest.source.mysql import binlog_files, connect, connection_refused, require_tls, tls_context, tls_failure
from ingest.source.reconnect import Reconnect, lost_connection, stall_timeout

log = logging.getLogger(__name__)

FOLLOWED = ("alter", "truncate", "swap", "drop", "partition")
"""The kinds of DDL statement `on_ddl="evolve"` yields as a `DdlStatement` to follow: `ddl.ddl_kind`'s "alter" and
"truncate"; "swap", an online schema change tool's helper table renamed to a captured table's name (`ddl.Swap`);
"drop", a captured table dropped or renamed away (its capture ends: `forget`); "partition", a partition statement
that removes or moves rows without row events (`ddl.partition_tables`: followed when it drops or truncates
partitions whose bounds the job knows, else refused or copied again)."""

__all__ = [
    "BinlogReader",
    "SchemaChangeError",
    "ddl_tables",
    "query_of",
    "refuse_statement",
    "statement_tables",
]


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
        return require_tls(conn, source)

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


def _key_changed(images: list[Any], schema: TableSchema) -> Callable[[Sequence[str]], bool]:
    """For `Actions.act`: whether an update's rows, decoded with the schema the job follows, changed any of the
    columns asked about (True when one is not in the schema)."""
    names = schema.column_names

    def changed(columns: Sequence[str]) -> bool:
        spots = [names.index(c) for c in columns if c in names]
        return len(spots) < len(columns) or any(
            b is None or a is None or any(b[p] != a[p] for p in spots) for b, a in images
        )

    return changed


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
    """Transactions of the captured tables, in commit order, starting at a transaction boundary."""

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
        self.new_tables = new_tables
        """When set, a DDL statement naming a table it matches that is not captured is reported (TablesNamed)."""
        self.schemas = {(s.database, s.table): s for s in schemas}
        self._decoders = {k: RowDecoder(s.columns) for k, s in self.schemas.items()}
        self._row_events = RowEvents()
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
        self._planned_at = dict(planned_at or {})
        """Per table, a position before its snapshot's schema was loaded: a DDL up to here is in that schema."""
        self._unfollowed: dict[tuple[str, str], tuple[str, BinlogPosition]] = {}
        """Per table, the first DDL passed over as contained in its chunks that came after its schema was loaded:
        it changed the table during its snapshot, so the rows after its chunks may have columns the schema the
        job decodes with has not."""
        self.on_ddl = on_ddl
        self.recopy = recopy
        """With `on_ddl="evolve"`, a DDL it cannot follow is yielded too (its table is copied again)."""
        self.heartbeat_seconds = heartbeat_seconds
        self._last_idle = time.monotonic()
        self.idle_at_end = False
        """Whether the idle report being made comes at a heartbeat (the server sent all it had), not after another
        table's transaction."""
        self.blocking = blocking
        self._stream = self._open(start)
        self._reconnect = Reconnect(source.reconnect_seconds, f"{source.host}:{source.port}")
        self.on_reconnect: Callable[[Reconnect], None] | None = None
        """Told of each reconnect attempt, and of the recovery (ingest.source.reconnect.publish)."""
        self._interrupted = threading.Event()
        self._tables = {(s.database, s.table) for s in schemas}
        self._osc = OnlineSchemaChanges()
        self._actions = self._load_actions()

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
        return {f"{db}.{table}": keys for (db, table), keys in self._actions.chained.items()}

    def set_schema(self, schema: TableSchema) -> None:
        """Decode the table's rows with `schema` from here on (after its DDL was applied downstream)."""
        key = (schema.database, schema.table)
        self.schemas[key] = schema
        self._decoders[key] = RowDecoder(schema.columns)

    def forget(self, key: tuple[str, str]) -> None:
        """Capture the table no more (it was dropped or renamed away): its name's later rows are another table's."""
        self._tables.discard(key)
        self.schemas.pop(key, None)
        self._decoders.pop(key, None)

    def _refuse_unfollowed(self, key: tuple[str, str], event: Any) -> None:
        """A row after a DDL passed over during the table's snapshot: refused when matched by position."""
        query, at = self._unfollowed[key]
        table_maps.refuse_by_position_after_ddl(
            event, self.schemas[key].table_id, query, at, "before the high watermark of the first of its chunks read"
        )

    def _library_row(
        self, key: tuple[str, str], kind: str, row: dict[str, Any]
    ) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]:
        before, after = row_images(kind, row)
        return (None if before is None else self._row(key, before), None if after is None else self._row(key, after))

    def _row(self, key: tuple[str, str], values: dict[str, Any]) -> tuple[Any, ...]:
        decode = self._decoders[key]
        if not decode.matches(values):
            # Rows are matched by the names the server logs (binlog_row_metadata=FULL), or by position with the
            # schema in force (table_maps.by_position): a row of other columns is never misread.
            schema = self.schemas[key]
            raise SchemaChangeError(
                f"a binlog row of {schema.table_id} at {self.position} has columns {sorted(values)}, but the job "
                f"expects {sorted(schema.column_names)}: its schema changed without a DDL statement the job could "
                f"follow. Snapshot the table again: `ingest resnapshot --config ... --table {schema.table_id}`"
            )
        return decode(values)

    def transactions(
        self, idle: Callable[[float], bool] | None = None
    ) -> Iterator[Transaction | DdlStatement | TablesNamed]:
        """`_read`'s items; a lost connection (a restarted server, a killed or stalled stream) is opened again at
        the last transaction boundary, with backoff, for at most `source.reconnect_seconds` (ingest.source.reconnect):
        the part of a transaction read before the loss is read again whole, nothing is handed over twice."""
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
        try:
            for event in self._stream:
                if self._reconnect.since is not None:
                    self._recovered()
                log_pos = event.packet.log_pos
                end = BinlogPosition(self._stream.log_file, log_pos) if log_pos else self.position
                if isinstance(event, HeartbeatLogEvent):
                    if idle is not None and current is None and self._idle_heartbeat(idle):
                        return
                    continue
                if isinstance(event, MariadbGtidEvent):
                    current = self._group_began(event, end)
                    continue
                if isinstance(event, PartialUpdateRowsEvent | NotImplementedEvent | ExecuteLoadQueryEvent):
                    refuse_event(event, end, self._tables)
                    continue
                if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                    current = self._rows(event, end, current)
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
                if (yield from self._completed(event, end, current, idle)):
                    return
                current = None
        except pymysql.err.OperationalError as e:
            if e.args and e.args[0] == 1236:
                raise BinlogPurgedError(f"the binlog at {self.position} is gone from the server: {e.args[1]}") from None
            raise

    def _idle_heartbeat(self, idle: Callable[[float], bool]) -> bool:
        """A server heartbeat outside a transaction: the binlog is idle now. True: `idle` ends the reading."""
        self._last_idle = time.monotonic()
        self.idle_at_end = True
        return idle(time.time())

    def _group_began(self, event: MariadbGtidEvent, end: BinlogPosition) -> Transaction:
        self._group_gtid = MariadbGtid.parse(str(event.gtid))
        self._in_group, self._xa_group = group_flags(event.flags)
        return Transaction(end, gtid=str(event.gtid))

    def _rows(self, event: Any, end: BinlogPosition, current: Transaction | None) -> Transaction | None:
        """A row event: its changes of captured tables, and the foreign key actions it sets off, added to the
        transaction under way (begun here if need be). Returns that transaction."""
        key = (event.schema, event.table)
        images = None
        if key in self._actions.watched:
            images, acted = self._key_actions(key, event_kind(event), event, end)
            if acted:
                current = current if current is not None else Transaction(end)
                current.actions.extend(acted)
        if key not in self._tables:
            return current
        contained = self._contained_until.get(key)
        # An XA transaction's rows count at its commit, which a chunk may or may not have seen: they are held, and
        # compared with the chunks at XA COMMIT (`_decided`).
        if contained is not None and not self._xa_group:
            if end <= contained:
                return current
            del self._contained_until[key]  # positions only grow: no more lookups for this table
        if key in self._unfollowed:
            self._refuse_unfollowed(key, event)
        if current is None:
            current = Transaction(end)
        table_id = f"{key[0]}.{key[1]}"
        if images is None:
            images = self._images(key, event_kind(event), event, end)
        current.changes.extend(RowChange(table_id, end, i, before, after) for i, (before, after) in enumerate(images))
        return current

    def _xa_prepared(self, event: XAPrepareEvent, end: BinlogPosition, current: Transaction | None) -> bool:
        """XA PREPARE ends the first half of an XA transaction: its changes are held until it is decided. True:
        the reader was only to read back this one (`read_prepared`)."""
        self._boundary(end)
        return self._xa.prepare(XaId.of(event), current)

    def _contained_at(self, table_id: str) -> BinlogPosition | None:
        """Up to where the snapshot's chunks hold every row change of a captured table (None: no bound)."""
        key = next((key for key, schema in self.schemas.items() if schema.table_id == table_id), None)
        return None if key is None else self._contained_until.get(key)

    def _completed(
        self, event: Any, end: BinlogPosition, current: Transaction | None, idle: Callable[[float], bool] | None
    ) -> Generator[Transaction, None, bool]:
        """The event group ends at `end`: its transaction is yielded, or, without captured changes, the idle
        report may be due. Returns True when `idle` ends the reading."""
        self._boundary(end)
        if current is None:
            return self._report_idle(idle, float(event.timestamp))
        current.end = end
        current.gtid_after = self.gtid
        current.commit_time = int(event.timestamp)
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
        named = self._new_tables_named(query, default_db)
        if named:
            yield TablesNamed(named, end, self.gtid)
            return None, _NEXT
        return None, _STOP if self._report_idle(idle, float(event.timestamp)) else _NEXT

    def _schema_statement(
        self, event: QueryEvent, query: str, default_db: str, end: BinlogPosition
    ) -> Generator[DdlStatement | TablesNamed, None, bool]:
        """A statement that changes captured tables' schemas or partitions: refused, or recorded, and with
        `on_ddl="evolve"` yielded as a `DdlStatement` (True: the caller reads on after it)."""
        touched = []
        for t in ddl_tables(query, default_db, self._tables):
            # A table snapshotted after the statement already has what it did.
            if (contained := self._contained_until.get(t)) is None or end > contained:
                touched.append(t)
            elif (planned := self._planned_at.get(t)) is None or end > planned:
                self._unfollowed.setdefault(t, (query, end))
        partitions = [
            t
            for t in partition_tables(query, default_db, self._tables)
            if (contained := self._contained_until.get(t)) is None or end > contained
        ]
        if partitions and self.on_ddl != "evolve":  # followed, copied again or refused downstream
            self._refuse_partition_change(query, partitions, end)
        touched += [t for t in partitions if t not in touched]
        osc = self._osc.read(query, default_db, self._tables)
        if not touched:
            return False
        if osc == CUT_OVER and self.on_ddl == "evolve":
            log.info("%s: renamed away for an online schema change's cut-over: %s", touched, query[:200])
            return False
        start = self.position
        kind = "swap" if isinstance(osc, Swap) else "partition" if partitions else ddl_kind(query)
        if kind == "rename":
            # Renamed away: gone under its name; unless another table takes the name (not a swap).
            into = {new for _, new in renamed_tables(query, default_db)}
            kind = "replace" if any(t in into for t in touched) else "drop"
        self._schema_change(query, touched, end, kind)
        if self.on_ddl != "evolve":
            return False
        said = osc.said if isinstance(osc, Swap) else alter_columns(query, default_db, getattr(event, "sql_mode", None))
        if isinstance(osc, Swap) and said is None:
            said = helper_history(self.source, osc, end)
        self._boundary(end)
        yield DdlStatement(query, tuple(touched), start, end, self.gtid, kind, said)
        # A table renamed into the patterns by the same statement is copied (see TablesNamed).
        named = self._new_tables_named(query, default_db) if kind == "drop" else ()
        if named:
            yield TablesNamed(named, end, self.gtid)
        return True

    def _new_tables_named(self, query: str, default_db: str) -> tuple[tuple[str, str], ...]:
        if self.new_tables is None:
            return ()
        named = named_tables(query, default_db)
        return tuple(
            t
            for t in named
            if t not in self._tables and self.new_tables.matches(*t) and self._osc.helper(t, self._tables) is None
        )

    def _report_idle(self, idle: Callable[[float], bool] | None, at: float) -> bool:
        """A transaction of other tables ended: tell `idle` at most once per heartbeat period (see transactions);
        its answer, whether to stop."""
        now = time.monotonic()
        if idle is None or now - self._last_idle < self.heartbeat_seconds:
            return False
        self._last_idle = now
        self.idle_at_end = False
        return idle(at)

    def _load_actions(self) -> Actions:
        """The foreign key actions that can reach the captured tables, as the server shows them now."""
        with connect(self.source) as conn:
            actions = load_actions(conn, self._tables)
        if actions:
            log.info(
                "foreign keys with ON DELETE / ON UPDATE actions reach captured tables from %s; the server does not "
                "log what they change, so a change of these tables that may act stops the job",
                ", ".join(sorted(f"{db}.{t}" for db, t in actions.watched)),
            )
        return actions

    def _images(self, key: tuple[str, str], kind: str, event: Any, end: BinlogPosition) -> list[Any]:
        """(before, after) per row of a captured table's row event, decoded with the schema in force."""
        images = self._row_events.rows(key, kind, event, self.schemas[key].columns, end)
        if images is None:  # an event only the library reads
            images = [self._library_row(key, kind, row) for row in event.rows]
        return images

    def _key_actions(
        self, key: tuple[str, str], kind: str, event: Any, end: BinlogPosition
    ) -> tuple[list[Any] | None, list[KeyAction]]:
        """What the foreign key actions of a parent table's row event did to captured tables (a stop where the
        job cannot apply them), and the event's rows when they were decoded for that (a captured parent)."""

        def copied_after(table: tuple[str, str]) -> bool:
            # An XA transaction's first half counts at its commit, later than `end`: its actions are kept, and
            # judged against the chunks at commit like its changes (ingest.query.batch).
            contained = self._contained_until.get(table)
            return contained is not None and end <= contained and not self._xa_group

        images, schemas = None, self.schemas
        if key in self._tables and key not in self._unfollowed and kind != "insert":
            images = self._images(key, kind, event, end)
        elif key not in self._tables and kind != "insert" and (named := named_parent_rows(event, kind)) is not None:
            parent, images = named  # a parent not captured, its columns named by the server
            schemas = {**self.schemas, key: parent}
        changed = update_changed(event, kind) if images is None else _key_changed(images, schemas[key])
        acted = self._actions.act(key, kind, event.flags, end, changed, copied_after, images, schemas)
        return (images if key in self._tables else None), acted

    def _refuse_partition_change(self, query: str, touched: list[tuple[str, str]], end: BinlogPosition) -> None:
        """A partition or tablespace statement that deletes, moves or brings in rows without row events (DROP,
        TRUNCATE, EXCHANGE, CONVERT PARTITION; DISCARD, IMPORT TABLESPACE) stops the job: the rows it removed would
        stay in Iceberg, and those it brought would be missing."""
        names = ", ".join(f"{db}.{t}" for db, t in touched)
        raise SchemaChangeError(
            f"{names}: the statement at binlog position {end} removes, moves or brings in rows of whole partitions "
            f"or tablespaces without logging them ({query[:200]!r}); the job does not know which rows they were, "
            f"and none was applied. Everything before the statement is committed. Snapshot the table again "
            f"(`ingest resnapshot --config ... --table {touched[0][0]}.{touched[0][1]}`)"
        )

    def _boundary(self, end: BinlogPosition) -> None:
        """An event group ends at `end`: the position and the GTID position move past it together."""
        self._in_group = self._xa_group = False
        self.position = end
        if self.gtid is not None and self._group_gtid is not None:
            g = self._group_gtid
            self.gtid = self.gtid.advance(g.domain_id, g.server_id, g.seq_no)
        self._group_gtid = None

    def _schema_change(self, query: str, touched: list[tuple[str, str]], end: BinlogPosition, kind: str) -> None:
        """Apply the policy's refusals; returns when the statement is to be ignored or evolved."""
        names = ", ".join(f"{db}.{t}" for db, t in touched)
        if self.on_ddl == "ignore":
            log.warning("ignoring schema change of %s at %s: %s", names, end, query[:200])
            return
        if self.on_ddl == "evolve" and (kind in FOLLOWED or self.recopy):
            return
        if self.on_ddl == "evolve":
            why = (
                "a table replaced by another (CREATE OR REPLACE, a RENAME that gives its name to a table that is no "
                "online schema change tool's helper) cannot be followed"
            )
            way_out = "Snapshot the table again"
        else:
            why = "`stream.on_schema_change` is `fail`"
            way_out = (
                "Set `stream.on_schema_change: evolve` to follow the DDL Iceberg can follow (docs/config.md, "
                '"Schema changes"), or snapshot the table again'
            )
        raise SchemaChangeError(
            f"the schema of {names} changed at binlog position {end}: {query[:200]!r}; {why}. Everything before "
            f"the statement is committed. {way_out} "
            f"(`ingest resnapshot --config ... --table {touched[0][0]}.{touched[0][1]}`)"
        )


def _text(value: Any) -> str:
    return str(value.decode() if isinstance(value, bytes) else value)


def query_of(event: QueryEvent) -> tuple[str, str]:
    """A query event's SQL text and the default database it ran in."""
    query = event.query if isinstance(event.query, str) else event.query.decode("utf-8", "replace")
    return query, _text(event.schema)
