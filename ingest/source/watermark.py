"""Reading watermarks: where the binlog is, as file/position plus the executed GTID set; and how far a committed
offset is behind it, in binlog bytes.

The chunk reader takes one before its SELECT (low) and one after (high); see MISSION.md
"Lock-free chunk read".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pymysql

from ingest.config import SourceConfig
from ingest.errors import SourceError
from ingest.model.position import BinlogPosition, GtidSet, MariadbGtidPos, MysqlGtidSet, Watermark
from ingest.source.mysql import binlog_sizes, connect


def _master_status(cur: Any) -> tuple[Any, ...]:
    try:
        cur.execute("SHOW MASTER STATUS")
    except pymysql.err.ProgrammingError:
        cur.execute("SHOW BINARY LOG STATUS")  # MySQL 8.4 removed the old name
    row = cur.fetchone()
    if row is None:
        raise SourceError("SHOW MASTER STATUS returned nothing: the binary log is off on the source")
    return tuple(row)


def read_watermark(conn: pymysql.connections.Connection[Any], flavor: str) -> Watermark:
    """The current end of the binlog. Needs BINLOG MONITOR (MariaDB) / REPLICATION CLIENT (MySQL)."""
    with conn.cursor() as cur:
        try:
            if flavor == "mariadb":
                # The GTIDs are read before the position, so they never name a transaction past it: a point
                # found again by its GTIDs on another server (after a failover) is at or before this one.
                cur.execute("SELECT @@gtid_binlog_pos, @@server_id")
                gtid_text, server_id = cur.fetchone()
                row = _master_status(cur)
                gtid: GtidSet = MariadbGtidPos.parse(str(gtid_text or ""))
            else:
                cur.execute("SELECT @@server_id")
                (server_id,) = cur.fetchone()
                row = _master_status(cur)
                gtid = MysqlGtidSet.parse(str(row[4] or "")) if len(row) > 4 else MysqlGtidSet()
        except pymysql.err.OperationalError as e:
            if e.args and e.args[0] in (1227, 1045):
                grant = "BINLOG MONITOR" if flavor == "mariadb" else "REPLICATION CLIENT"
                raise SourceError(f"cannot read the binlog position: the CDC user needs {grant}") from None
            raise
    return Watermark(BinlogPosition(str(row[0]), int(row[1])), gtid, int(server_id))


def bytes_behind(committed: BinlogPosition, current: BinlogPosition, sizes: Mapping[str, int]) -> int | None:
    """Binlog bytes from `committed` to `current`: the rest of the committed file, the whole files in
    between, and the current file up to `current`. None when a file size is unknown or the binlogs are
    not comparable (another base name, e.g. after a failover)."""
    if committed.base_name != current.base_name:
        return None
    if committed >= current:
        return 0
    if committed.file == current.file:
        return current.pos - committed.pos
    between = [
        f
        for f in sizes
        if BinlogPosition(f, 0).base_name == committed.base_name
        and committed.file_number < BinlogPosition(f, 0).file_number < current.file_number
    ]
    if committed.file not in sizes or len(between) != current.file_number - committed.file_number - 1:
        return None
    return sizes[committed.file] - committed.pos + sum(sizes[f] for f in between) + current.pos


def bytes_behind_now(source: SourceConfig, flavor: str, committed: BinlogPosition) -> int | None:
    """Binlog bytes from `committed` to the source's binlog end now (the `ingest_binlog_bytes_behind` metric)."""
    with connect(source) as conn:
        return bytes_behind(committed, read_watermark(conn, flavor).position, binlog_sizes(conn))
