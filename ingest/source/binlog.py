"""Reading the binlog as whole transactions, from a position that is always a transaction boundary.

The FlinkX/Canal lesson (seed 002): a position is only ever handed out at the end of a complete
transaction, so a batch that stops there and is committed downstream can be resumed without losing or
repeating a row. Row values are brought to the driver's form (binlog_values.py) so snapshot and binlog
rows go through the same converters.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import HeartbeatLogEvent, MariadbGtidEvent, QueryEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from ingest.config import SourceConfig
from ingest.errors import BinlogPurgedError, SourceError
from ingest.source.binlog_values import driver_form, row_images
from ingest.source.mysql import TableSchema
from ingest.source.position import BinlogPosition

log = logging.getLogger(__name__)

_DDL = re.compile(r"^\s*(ALTER|RENAME|DROP|TRUNCATE|CREATE\s+OR\s+REPLACE)\b", re.IGNORECASE)


class SchemaChangeError(SourceError):
    """A captured table's schema changed in the binlog and the policy is to stop."""


@dataclass(frozen=True)
class RowChange:
    table_id: str
    position: BinlogPosition
    """End of the row event that carried this change."""
    row_index: int
    before: tuple[Any, ...] | None
    after: tuple[Any, ...] | None


@dataclass
class Transaction:
    """The row changes of one committed transaction to captured tables, and where it ends."""

    end: BinlogPosition
    gtid: str | None = None
    changes: list[RowChange] = field(default_factory=list)
    commit_time: int = 0
    """Seconds since the epoch, from the commit event's header."""


def binlog_files(conn: pymysql.connections.Connection[Any]) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return [str(row[0]) for row in cur.fetchall()]


def binlog_sizes(conn: pymysql.connections.Connection[Any]) -> dict[str, int]:
    """Each binlog file on the server and its size in bytes (`SHOW BINARY LOGS`)."""
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return {str(row[0]): int(row[1]) for row in cur.fetchall()}


def check_not_purged(conn: pymysql.connections.Connection[Any], start: BinlogPosition) -> None:
    """A purged start position is an error with the way out, never a silent gap."""
    files = binlog_files(conn)
    if start.file not in files:
        raise BinlogPurgedError(
            f"the binlog position to resume from, {start}, is no longer on the server (oldest binlog: "
            f"{files[0] if files else 'none'}); changes made since then cannot be read. Re-snapshot: drop the "
            "target tables and this pipeline's rows of the state table, then run `ingest run` again; "
            "and keep binlogs longer than the job may be down (expire_logs_days / binlog_expire_logs_seconds)"
        )


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
    return BinLogStreamReader(
        connection_settings={
            "host": source.host,
            "port": source.port,
            "user": source.user,
            "passwd": source.password.reveal(),
            "charset": "utf8mb4",
        },
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
    ) -> None:
        self.source = source
        self.schemas = {(s.database, s.table): s for s in schemas}
        self._to_driver = {k: driver_form(s.columns) for k, s in self.schemas.items()}
        self.start = start
        self.position = start
        self.on_ddl = on_ddl
        self._stream = open_stream(
            source,
            start,
            source.server_id,
            blocking=blocking,
            heartbeat_seconds=heartbeat_seconds,
            only_events=[
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
                XidEvent,
                QueryEvent,
                MariadbGtidEvent,
                HeartbeatLogEvent,
            ],
        )
        self._tables = {(s.database, s.table) for s in schemas}

    def close(self) -> None:
        self._stream.close()

    def _row(self, key: tuple[str, str], values: dict[str, Any]) -> tuple[Any, ...]:
        schema = self.schemas[key]
        if len(values) != len(schema.column_names) or any(c not in values for c in schema.column_names):
            raise SchemaChangeError(
                f"a binlog row of {schema.table_id} at {self.position} has columns {sorted(values)}, but the table "
                f"now has {sorted(schema.column_names)}: its schema changed after this change was written. Schema "
                "evolution is not applied yet; re-snapshot the table (drop its target and state rows)"
            )
        return tuple(fn(values[c]) for fn, c in zip(self._to_driver[key], schema.column_names, strict=True))

    def transactions(self, idle: Callable[[], bool] | None = None) -> Iterator[Transaction]:
        """Complete transactions; with `idle`, heartbeats ask whether to stop while nothing happens."""
        current: Transaction | None = None
        try:
            for event in self._stream:
                file = self._stream.log_file
                end = BinlogPosition(file, event.packet.log_pos) if event.packet.log_pos else self.position
                if isinstance(event, HeartbeatLogEvent):
                    if idle is not None and current is None and idle():
                        return
                    continue
                if isinstance(event, MariadbGtidEvent):
                    current = Transaction(end, gtid=str(event.gtid))
                    continue
                if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                    key = (event.schema, event.table)
                    if key not in self._tables:
                        continue
                    if current is None:
                        current = Transaction(end)
                    table_id = f"{key[0]}.{key[1]}"
                    kind = (
                        "insert"
                        if isinstance(event, WriteRowsEvent)
                        else ("delete" if isinstance(event, DeleteRowsEvent) else "update")
                    )
                    for i, row in enumerate(event.rows):
                        before_values, after_values = row_images(kind, row)
                        before = None if before_values is None else self._row(key, before_values)
                        after = None if after_values is None else self._row(key, after_values)
                        current.changes.append(RowChange(table_id, end, i, before, after))
                    continue
                if isinstance(event, QueryEvent):
                    query = event.query if isinstance(event.query, str) else event.query.decode("utf-8", "replace")
                    if query.strip().upper() == "BEGIN":
                        continue
                    if _DDL.match(query) and self._touches_captured(event, query):
                        self._schema_change(query, end)
                    if query.strip().upper() != "COMMIT":
                        # A DDL statement is a transaction of its own: its end is a boundary.
                        self.position = end
                        current = None
                        continue
                # XidEvent, or COMMIT of a non-transactional engine: the transaction is complete here.
                self.position = end
                if current is not None:
                    current.end = end
                    current.commit_time = int(event.timestamp)
                    yield current
                current = None
        except pymysql.err.OperationalError as e:
            if e.args and e.args[0] == 1236:
                raise BinlogPurgedError(f"the binlog at {self.position} is gone from the server: {e.args[1]}") from None
            raise

    def _touches_captured(self, event: Any, query: str) -> bool:
        schema = str(event.schema.decode() if isinstance(event.schema, bytes) else event.schema)
        lowered = query.lower().replace("`", "")
        return any(t.lower() in lowered and (db == schema or db.lower() in lowered) for db, t in self._tables)

    def _schema_change(self, query: str, end: BinlogPosition) -> None:
        if self.on_ddl == "ignore":
            log.warning("ignoring schema change at %s: %s", end, query[:200])
            return
        raise SchemaChangeError(
            f"a captured table's schema changed at {end}: {query[:200]!r}. Schema evolution is not applied yet; "
            "set `stream.on_schema_change: ignore` only if the change does not affect captured columns, or "
            "re-snapshot the table"
        )
