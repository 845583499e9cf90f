"""The chunk SELECT inside a consistent-snapshot transaction, as Arrow, with the fastest driver available.

Two drivers read the same rows into the same Arrow table:

* ``mysqlclient`` (C, libmariadb) with no result converters: every value arrives as the server's text
  bytes and whole columns are parsed by Arrow (``TargetColumn.text_to_array``). No Python object per
  value: about ten times less CPU than PyMySQL (bench/README.md).
* ``pymysql`` (pure Python) with its default converters and ``rows_to_record_batch``: always
  installed, used when mysqlclient cannot be imported (a cluster without libmariadb/libmysqlclient).

``snapshot.driver`` chooses; ``auto`` takes mysqlclient when it imports. Both run as the CDC user with
the session settings of ``ingest.source.mysql.connect`` (UTC, utf8mb4, TLS as configured).
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Sequence
from typing import Any, Protocol

import pyarrow as pa

from ingest.config import SourceConfig
from ingest.errors import SourceError
from ingest.sink.types import TargetColumn, arrow_schema, rows_to_record_batch, text_rows_to_record_batch
from ingest.source.mysql import connect
from ingest.source.position import BinlogPosition, Watermark

log = logging.getLogger(__name__)

DRIVERS = ("auto", "mysqlclient", "pymysql")
FETCH_ROWS = 8192


class ChunkSelect(Protocol):
    """One connection that opens a read view, SELECTs chunks as Arrow and ends the read view."""

    def begin(self, flavor: str) -> Watermark | None: ...

    def select(self, sql: str, params: Sequence[Any], targets: Sequence[TargetColumn]) -> Any: ...

    def end(self) -> None: ...

    def close(self) -> None: ...


def _mysqlclient() -> Any:
    return importlib.import_module("MySQLdb")


@functools.cache
def resolve_driver(driver: str) -> str:
    """The driver `auto` stands for on this machine; `mysqlclient` must import when asked for by name.

    Once per process (an executor reads many chunks): the import is tried, and a fallback warned, once."""
    if driver == "pymysql":
        return driver
    try:
        _mysqlclient()
    except ImportError as e:
        if driver == "mysqlclient":
            raise SourceError(
                f"snapshot.driver is mysqlclient but it cannot be imported ({e}); install the `fast` extra "
                "(needs libmariadb or libmysqlclient) or set snapshot.driver: pymysql"
            ) from None
        log.warning("mysqlclient is not importable (%s): the snapshot reads with PyMySQL, several times slower", e)
        return "pymysql"
    return "mysqlclient"


def open_select(source: SourceConfig, driver: str) -> ChunkSelect:
    if resolve_driver(driver) == "mysqlclient":
        return _MysqlclientSelect(source)
    return _PymysqlSelect(source)


_BEGIN = "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"
_SNAPSHOT_STATUS = "SHOW STATUS LIKE 'binlog_snapshot_%'"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def _snapshot_point(status_rows: Sequence[Sequence[Any]]) -> Watermark | None:
    """MariaDB's `binlog_snapshot_file/position`: the exact binlog point of the read view.

    A position taken with SHOW MASTER STATUS before the SELECT can include a transaction that is in the
    binlog but not yet committed in InnoDB (two-phase commit), which the SELECT would then miss for good.
    """
    status = {_text(k).lower(): _text(v) for k, v in status_rows}
    file, pos = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
    if not file or not pos:
        return None
    return Watermark(BinlogPosition(file, int(pos)), None)


class _PymysqlSelect:
    def __init__(self, source: SourceConfig) -> None:
        self.conn = connect(source)

    def begin(self, flavor: str) -> Watermark | None:
        with self.conn.cursor() as cur:
            cur.execute(_BEGIN)
            if flavor != "mariadb":
                return None
            cur.execute(_SNAPSHOT_STATUS)
            return _snapshot_point(cur.fetchall())

    def select(self, sql: str, params: Sequence[Any], targets: Sequence[TargetColumn]) -> Any:
        import pymysql

        batches = []
        with self.conn.cursor(pymysql.cursors.SSCursor) as cur:
            cur.execute(sql, list(params))
            while rows := cur.fetchmany(FETCH_ROWS):
                batches.append(rows_to_record_batch(targets, rows))
        return pa.Table.from_batches(batches, schema=arrow_schema(targets))

    def end(self) -> None:
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


_TLS_MODES = {"required": "REQUIRED", "verify_ca": "VERIFY_CA", "verify_identity": "VERIFY_IDENTITY"}


class _MysqlclientSelect:
    def __init__(self, source: SourceConfig) -> None:
        mysqldb = _mysqlclient()
        conversions = importlib.import_module("MySQLdb.converters").conversions
        # Keep the encoders (Python type -> SQL literal, for the bound key values) and drop every decoder
        # (MySQL field type -> Python): results stay bytes, which Arrow parses a column at a time.
        encoders = {k: v for k, v in conversions.items() if not isinstance(k, int)}
        tls: dict[str, Any] = {}
        if source.tls.mode != "disabled":
            tls["ssl_mode"] = _TLS_MODES[source.tls.mode]
            if source.tls.ca_file:
                tls["ssl"] = {"ca": source.tls.ca_file}
        try:
            self.conn = mysqldb.connect(
                host=source.host,
                port=source.port,
                user=source.user,
                password=source.password.reveal(),
                charset="utf8mb4",
                connect_timeout=source.connect_timeout,
                init_command="SET time_zone = '+00:00'",
                conv=encoders,
                autocommit=True,
                **tls,
            )
        except mysqldb.OperationalError as e:
            # The driver's message never contains the password; keep host and port so the user can act.
            raise SourceError(
                f"cannot connect to MySQL at {source.host}:{source.port} as {source.user}: {e.args[-1]}"
            ) from None
        self._cursors = importlib.import_module("MySQLdb.cursors")

    def begin(self, flavor: str) -> Watermark | None:
        cur = self.conn.cursor()
        try:
            cur.execute(_BEGIN)
            if flavor != "mariadb":
                return None
            cur.execute(_SNAPSHOT_STATUS)
            return _snapshot_point(cur.fetchall())
        finally:
            cur.close()

    def select(self, sql: str, params: Sequence[Any], targets: Sequence[TargetColumn]) -> Any:
        batches = []
        cur = self.conn.cursor(self._cursors.SSCursor)
        try:
            cur.execute(sql, tuple(params))
            while rows := cur.fetchmany(FETCH_ROWS):
                batches.append(text_rows_to_record_batch(targets, rows))
        finally:
            cur.close()
        return pa.Table.from_batches(batches, schema=arrow_schema(targets))

    def end(self) -> None:
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()
