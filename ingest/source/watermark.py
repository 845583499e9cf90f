"""Reading watermarks: where the binlog is, as file/position plus the executed GTID set.

The chunk reader takes one before its SELECT (low) and one after (high); see MISSION.md
"Lock-free chunk read".
"""

from __future__ import annotations

from typing import Any

import pymysql

from ingest.errors import SourceError
from ingest.source.position import BinlogPosition, GtidSet, MariadbGtidPos, MysqlGtidSet, Watermark


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
                cur.execute("SELECT @@gtid_binlog_pos")
                gtid_text = str(cur.fetchone()[0] or "")
                row = _master_status(cur)
                gtid: GtidSet = MariadbGtidPos.parse(gtid_text)
            else:
                row = _master_status(cur)
                gtid = MysqlGtidSet.parse(str(row[4] or "")) if len(row) > 4 else MysqlGtidSet()
        except pymysql.err.OperationalError as e:
            if e.args and e.args[0] in (1227, 1045):
                grant = "BINLOG MONITOR" if flavor == "mariadb" else "REPLICATION CLIENT"
                raise SourceError(f"cannot read the binlog position: the CDC user needs {grant}") from None
            raise
    return Watermark(BinlogPosition(str(row[0]), int(row[1])), gtid)


def start_consistent_snapshot(conn: pymysql.connections.Connection[Any], flavor: str) -> Watermark | None:
    """Open a consistent-snapshot transaction; on MariaDB also return the binlog position it corresponds to.

    MariaDB reports `binlog_snapshot_file/position`, the exact binlog point of the read view. A position
    taken with SHOW MASTER STATUS before the SELECT can include a transaction that is in the binlog
    but not yet committed in InnoDB (two-phase commit), which the SELECT would then miss for good.
    """
    with conn.cursor() as cur:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        if flavor != "mariadb":
            return None
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {str(k).lower(): v for k, v in cur.fetchall()}
    file = status.get("binlog_snapshot_file")
    pos = status.get("binlog_snapshot_position")
    if not file or pos is None:
        return None
    return Watermark(BinlogPosition(str(file), int(pos)), None)
