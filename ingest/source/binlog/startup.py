"""Where a startup mode that copies nothing starts reading the binlog, found and checked on the server.

`latest`, `binlog_position`, `gtid` and `timestamp` (Flink CDC's startup modes) create the targets empty and
read the binlog from one point: the server's end, a file/position, right after a GTID position, or the first
transaction committed at or after a time (found by reading event headers, never guessed). The point is
checked before anything is written: one the server no longer holds, one past its binlog's end, one inside an
event group, or one followed by a DDL statement on a captured table (the schema the job reads now would not
be the one its rows were written with) is refused, naming the position. Only a pipeline's first run asks
this; what it finds is recorded in the state table before the binlog is read (`StateTable.record_start`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any

import pymysql
from pymysqlreplication.event import FormatDescriptionEvent, GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent

from ingest.config import SourceConfig, StartupConfig, StartupMode
from ingest.errors import BinlogPurgedError, ConfigError
from ingest.model.position import BinlogPosition, MariadbGtidPos, Watermark
from ingest.source.binlog.event_groups import control_statement
from ingest.source.binlog.failover import gtid_at, locate
from ingest.source.binlog.reader import dump_server_id, first_ddl_between, open_stream, query_of, scan
from ingest.source.mysql import binlog_sizes, connect
from ingest.source.watermark import read_watermark

log = logging.getLogger(__name__)

__all__ = ["group_start_event", "resolve_start", "start_file_for"]

# Event types (as SHOW BINLOG EVENTS names them) that never begin an event group: a reader started at one
# would see rows without their table map, or a commit without its transaction.
_INSIDE_GROUP = frozenset(
    {
        "Table_map",
        "Write_rows",
        "Update_rows",
        "Delete_rows",
        "Write_rows_v1",
        "Update_rows_v1",
        "Delete_rows_v1",
        "Write_rows_compressed_v1",
        "Update_rows_compressed_v1",
        "Delete_rows_compressed_v1",
        "Partial_update_rows",
        "Annotate_rows",
        "Rows_query",
        "Xid",
        "XA_prepare",
        "Intvar",
        "Rand",
        "User var",
        "Begin_load_query",
        "Append_block",
        "Execute_load_query",
        "Delete_file",
        "Transaction_payload",
    }
)


def group_start_event(event_type: str, info: str) -> bool:
    """Whether a binlog event (type and info as SHOW BINLOG EVENTS shows them) may be the first a reader
    reads: a group's first event (GTID, BEGIN, a DDL statement) or a file's header events, not one inside a
    transaction or its commit."""
    if event_type in _INSIDE_GROUP:
        return False
    if event_type == "Query":
        return info.strip().upper() not in ("COMMIT", "ROLLBACK") and not info.strip().upper().startswith("XA ")
    return True


def start_file_for(starts: Sequence[tuple[str, int]], at: int) -> str | None:
    """The binlog file to look for the first transaction at or after epoch second `at` from: the newest opened
    before `at` (its first event, the format description, is stamped when the file was opened, and every event
    of the files before it no later); None when every file was opened at `at` or later, so that a transaction
    of that very second may be in a file before them. `starts` is (file, first event's epoch second) in binlog
    order."""
    found = None
    for file, began in starts:
        if began >= at:
            break
        found = file
    return found


def resolve_start(
    source: SourceConfig,
    mode: StartupMode,
    startup: StartupConfig,
    flavor: str,
    tables: Sequence[tuple[str, str]],
    *,
    ddl_refused: bool,
) -> Watermark:
    """The point of the server's binlog where the first run of startup `mode` starts, checked; `ddl_refused`: a DDL
    on a captured table between there and the binlog's end is refused (unless `stream.on_schema_change` ignores
    DDL)."""
    resolver = _RESOLVERS[mode]
    with connect(source) as conn:
        end = read_watermark(conn, flavor)
        position = resolver(conn, source, startup, flavor, end)
        if mode == "latest":
            start = end  # as a chunk's watermark is read: the GTIDs before the position
        else:
            if ddl_refused:
                _refuse_ddl_between(source, tables, position, end.position)
            start = Watermark(position, gtid_at(conn, position) if flavor == "mariadb" else None, end.server_id)
    log.info("startup mode %s: the binlog is read from %s (the binlog ends at %s)", mode, start, end)
    return start


def _latest(conn: Any, source: SourceConfig, startup: StartupConfig, flavor: str, end: Watermark) -> BinlogPosition:
    return end.position


def _at_position(
    conn: Any, source: SourceConfig, startup: StartupConfig, flavor: str, end: Watermark
) -> BinlogPosition:
    wanted = startup.position
    assert wanted is not None  # required by the config for this mode
    key = "`startup.binlog_file`/`startup.binlog_position`"
    sizes = binlog_sizes(conn)
    files = [BinlogPosition(f, 4) for f in sizes]
    if wanted.file not in sizes:
        same = [f for f in files if f.base_name == wanted.base_name]
        if not same:
            raise ConfigError(
                f"{key} {wanted}: the server has no binlog of that name (its binlogs: {files[0].file} to "
                f"{files[-1].file})"
            )
        if wanted.file_number > same[-1].file_number:
            raise ConfigError(
                f"{key} {wanted} is past the end of the server's binlog ({end.position}): a future position"
            )
        raise _purged(key, wanted, files[0].file)
    if wanted.pos > sizes[wanted.file]:
        raise ConfigError(
            f"{key} {wanted} is past the end of {wanted.file} ({sizes[wanted.file]} bytes; the binlog ends at "
            f"{end.position}): a future position"
        )
    with conn.cursor() as cur:
        try:
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s LIMIT 1", (wanted.file, int(wanted.pos)))
        except pymysql.err.MySQLError as e:
            raise ConfigError(
                f"{key} {wanted} is not where an event of {wanted.file} begins ({e.args[-1]}); give the position of "
                "a transaction's first event (its GTID event) or the end of the one before it"
            ) from None
        row = cur.fetchone()
    if row is not None and not group_start_event(str(row[2]), str(row[5] or "")):
        raise ConfigError(
            f"{key} {wanted} is inside a transaction (a {row[2]} event); give the position of a transaction's "
            "first event (its GTID event) or the end of the one before it"
        )
    return wanted


def _at_gtid(conn: Any, source: SourceConfig, startup: StartupConfig, flavor: str, end: Watermark) -> BinlogPosition:
    wanted = startup.gtid
    assert wanted is not None
    key = f"`startup.gtid` {wanted}"
    if flavor != "mariadb" or not isinstance(end.gtid, MariadbGtidPos):
        raise ConfigError(
            f"{key}: `startup_mode: gtid` takes a MariaDB GTID position; use binlog_position or timestamp"
        )
    domains = sorted({g.domain_id for p in (wanted, end.gtid) for g in p.entries})
    if len(wanted.entries) > 1 or len(end.gtid.entries) > 1:
        raise ConfigError(
            f"{key}: `startup_mode: gtid` is built for one replication domain, but the position and the server use "
            f"domains {domains}; use binlog_position or timestamp"
        )
    (asked,) = wanted.entries
    have = end.gtid.get(asked.domain_id)
    if have is None or asked.seq_no > have.seq_no:
        raise ConfigError(
            f"{key} is past the end of the server's binlog (GTID position {end.gtid or 'empty'}): a future position"
        )
    oldest = next(iter(binlog_sizes(conn)))
    before = gtid_at(conn, BinlogPosition(oldest, 4)) or MariadbGtidPos()
    first = before.get(asked.domain_id)
    if first is not None and asked.seq_no < first.seq_no:
        why = f"which begins after GTID {first}; the transactions after {asked} are gone"
        raise _purged("`startup.gtid`", wanted, oldest, why)
    return locate(conn, source, [wanted])[0]


def _at_time(conn: Any, source: SourceConfig, startup: StartupConfig, flavor: str, end: Watermark) -> BinlogPosition:
    wanted = startup.timestamp
    assert wanted is not None
    at = int(wanted.timestamp())  # the binlog stamps whole seconds: a transaction in that second is included
    key = f"`startup.timestamp` {wanted.isoformat()}"
    with conn.cursor() as cur:
        cur.execute("SELECT UNIX_TIMESTAMP()")
        now = int(cur.fetchone()[0])
    if at > now:
        raise ConfigError(f"{key} is later than the server's clock ({_iso(now)}): a future position")
    files = list(binlog_sizes(conn))
    starts: list[tuple[str, int]] = []
    for file in reversed(files):  # newest first: usually one or two files are read
        starts.insert(0, (file, _file_began(source, file)))
        if starts[0][1] < at:
            break
    first = start_file_for(starts, at)
    if first is None:
        raise _purged("`startup.timestamp`", wanted.isoformat(), files[0], f"which begins at {_iso(starts[0][1])}")
    found = _first_commit_at_or_after(source, BinlogPosition(first, 4), at, end.position)
    log.info("%s: the first transaction at or after it begins at %s", key, found or f"the binlog's end, {end.position}")
    return end.position if found is None else found


_RESOLVERS: dict[str, Callable[[Any, SourceConfig, StartupConfig, str, Watermark], BinlogPosition]] = {
    "latest": _latest,
    "binlog_position": _at_position,
    "gtid": _at_gtid,
    "timestamp": _at_time,
}


def _file_began(source: SourceConfig, file: str) -> int:
    """The epoch second of a binlog file's format description event: when the server opened it."""
    stream = open_stream(source, BinlogPosition(file, 4), dump_server_id(), only_events=[FormatDescriptionEvent])
    try:
        for event in stream:
            return int(event.timestamp)
    finally:
        stream.close()
    raise BinlogPurgedError(f"the binlog {file} could not be read from the server (purged while the job started?)")


_INSIDE_A_GROUP = frozenset({"begin", "savepoint", "rollback to savepoint", "xa start", "xa end"})


def _first_commit_at_or_after(
    source: SourceConfig, begin: BinlogPosition, at: int, end: BinlogPosition
) -> BinlogPosition | None:
    """Where the first event group (in binlog order) whose commit event is stamped `at` or later begins, reading
    from `begin` up to `end`; None when there is none yet."""
    group: BinlogPosition | None = None
    """Where the event group being read began (its first event read)."""
    with closing(scan(source, begin, [MariadbGtidEvent, GtidEvent, QueryEvent, XidEvent])) as events:
        for event, begins, ends in events:
            if ends > end:
                return None
            if group is None:
                group = begins
            if isinstance(event, QueryEvent) and control_statement(query_of(event)[0]) in _INSIDE_A_GROUP:
                continue  # a SAVEPOINT is no commit: a start after it would split its transaction
            if isinstance(event, XidEvent | QueryEvent):  # a commit, or a statement that is a group of its own
                if int(event.timestamp) >= at:
                    return group
                group = None
    return None


def _refuse_ddl_between(
    source: SourceConfig, tables: Sequence[tuple[str, str]], start: BinlogPosition, end: BinlogPosition
) -> None:
    """A DDL statement on a captured table between the start and the binlog's end is refused: the schema read
    now is the one after it, and the rows before it would be decoded with the wrong columns."""
    found = first_ddl_between(source, tables, start, end)
    if found is None:
        return
    at, query, ((db, t), *_) = found
    raise ConfigError(
        f"the startup position {start} is before a schema change of {db}.{t} at {at} "
        f"({query[:120]!r}): the rows between were written with columns the server no longer shows. "
        "Start after that statement, or use `startup_mode: initial`"
    )


def _purged(key: str, wanted: object, oldest: str, why: str = "") -> BinlogPurgedError:
    return BinlogPurgedError(
        f"{key} {wanted} is no longer on the server: its oldest binlog is {oldest}{', ' + why if why else ''}. "
        "Give a later start, or use `startup_mode: initial` to copy the tables"
    )


def _iso(epoch: int) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat()
