"""The chunk SELECT inside a consistent-snapshot transaction, as Arrow, with the fastest driver available.

Two drivers read the same rows into the same Arrow table:

* ``mysqlclient`` (C, libmariadb) with no result converters: every value arrives as the server's text
  bytes and whole columns are parsed by Arrow (``TargetColumn.text_to_array``). No Python object per
  value: about ten times less CPU than PyMySQL (bench/README.md).
* ``pymysql`` (pure Python) with its default converters and ``rows_to_record_batch``: always
  installed, used when mysqlclient cannot be imported (a cluster without libmariadb/libmysqlclient), and
  under a ``tls.mode`` mysqlclient cannot keep to (``MYSQLCLIENT_TLS_MODES``).

``snapshot.driver`` chooses; ``auto`` takes mysqlclient when it imports and can keep to ``tls.mode``. Both
run as the CDC user with the session settings of ``ingest.source.mysql.connect`` (UTC, utf8mb4, TLS as
configured).
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
from ingest.model.columns import TargetColumn, arrow_schema, rows_to_record_batch, text_rows_to_record_batch
from ingest.model.position import BinlogPosition, Watermark
from ingest.source.mysql import connect, connection_refused

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


MYSQLCLIENT_TLS_MODES = ("disabled", "verify_identity")
"""The `tls.mode`s mysqlclient keeps to. Linked to MariaDB Connector/C (3.3), it refuses a server without TLS
only when it also checks the certificate's host name: under `required` it goes on in plaintext, under
`verify_ca` it checks the name too."""


def open_select(source: SourceConfig, driver: str) -> ChunkSelect:
    if resolve_driver(driver) == "mysqlclient" and _mysqlclient_keeps_to(source, driver):
        return _MysqlclientSelect(source)
    return _PymysqlSelect(source)


def _mysqlclient_keeps_to(source: SourceConfig, driver: str) -> bool:
    if source.tls.mode in MYSQLCLIENT_TLS_MODES:
        return True
    if driver == "mysqlclient":  # parse_config refuses this; a config built in code may not have been parsed
        raise SourceError(
            f"snapshot.driver is mysqlclient but source.tls.mode is {source.tls.mode}, which it cannot keep to "
            "(it would read in plaintext, or check the host name); use snapshot.driver: pymysql or auto, or "
            "tls.mode verify_identity"
        )
    _warn_pymysql_for_tls(source.tls.mode)
    return False


@functools.cache
def _warn_pymysql_for_tls(mode: str) -> None:
    log.warning(
        "tls.mode %s: the snapshot reads with PyMySQL (mysqlclient cannot keep to it), several times slower",
        mode,
    )


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


class _MysqlclientSelect:
    def __init__(self, source: SourceConfig) -> None:
        mysqldb = _mysqlclient()
        conversions = importlib.import_module("MySQLdb.converters").conversions
        # Keep the encoders (Python type -> SQL literal, for the bound key values) and drop every decoder
        # (MySQL field type -> Python): results stay bytes, which Arrow parses a column at a time.
        encoders = {k: v for k, v in conversions.items() if not isinstance(k, int)}
        tls: dict[str, Any] = {}
        if source.tls.mode == "verify_identity":  # the only TLS mode it is opened for (MYSQLCLIENT_TLS_MODES)
            tls = {"ssl_mode": "VERIFY_IDENTITY", "ssl": {"ca": source.tls.ca_file}}
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
            raise connection_refused(source, e) from None
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
