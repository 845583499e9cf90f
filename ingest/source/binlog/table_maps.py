"""Table-map events: parsed once per distinct content, and completed from the job's schema where the
server logs no column names.

Every transaction logs a table-map event before its row events, and python-mysql-replication parses it
in full each time: column types, metadata and, with binlog_row_metadata=FULL, the column names. For a
stream of small transactions that is close to half of the reader's CPU. The result depends only on the
event's bytes (the library is never asked to look names up in information_schema), so an event whose bytes
were seen before (same table id, same columns, same names) takes the earlier parse.

A server at its default binlog_row_metadata (MariaDB NO_LOG, MySQL MINIMAL) logs no column names, and the
library then also knows no signedness, character set or ENUM/SET members (it reads even MINIMAL's only
when the server is FULL). `by_position` completes such a table map from the schema the job decodes the
table with at that binlog position (it follows DDL in binlog order), column by column in ordinal order,
so the library and `row_events` decode it exactly as they decode a FULL one. Never with today's
information_schema: after an `ADD COLUMN ... FIRST` older rows would shift into the wrong columns.

`install()` wraps the library's `TableMapEvent.__init__` (python-mysql-replication is pinned): the class
stays the same, so every filter of the library that names it still matches.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pymysqlreplication.constants import CHARSET, FIELD_TYPE
from pymysqlreplication.row_event import TableMapEvent

from ingest.errors import SchemaChangeError
from ingest.model.columns import SourceColumn

MAX_ENTRIES = 4096
"""Distinct table-map contents kept (a few hundred bytes each); the cache starts over when full."""

# Attributes of a parsed event that belong to the stream reading it, not to the event's bytes.
_PER_STREAM = frozenset({"packet", "table_map", "_ctl_connection", "timestamp", "event_type", "event_size"})

_parse = TableMapEvent.__init__
_parsed: dict[tuple[bytes, tuple[Any, ...]], dict[str, Any]] = {}
stats = {"parsed": 0, "reused": 0}


def _init(
    self: Any, from_packet: Any, event_size: int, table_map: dict[int, Any], ctl_connection: Any, **kwargs: Any
) -> None:
    raw = _body(from_packet, event_size)
    key = None if raw is None else (raw, _options(kwargs))
    state = None if key is None else _parsed.get(key)
    if state is None:
        _parse(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
        stats["parsed"] += 1
        if key is not None and self._processed:
            if len(_parsed) >= MAX_ENTRIES:
                _parsed.clear()
            _parsed[key] = {k: v for k, v in self.__dict__.items() if k not in _PER_STREAM}
        return
    stats["reused"] += 1
    self.__dict__.update(state)
    self.packet = from_packet
    self.table_map = table_map
    self._ctl_connection = ctl_connection
    self.timestamp = from_packet.timestamp
    self.event_type = from_packet.event_type
    self.event_size = event_size
    from_packet.advance(event_size)
    table_map[self.table_id] = self.table_obj


_options_of: dict[tuple[Any, ...], tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
"""A stream's options by the identity of its option values (the same objects at every event of a stream): the
hashable value, and the objects, kept so that their ids are not reused while they are cached."""


def _options(kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The stream's parse options (filters, versions) as a hashable value: part of what decides the parse.
    Computed once per stream, not per event (it was a tenth of a small transaction's table-map cost)."""
    identity = (*kwargs, *map(id, kwargs.values()))  # the names, then the objects' ids: no generator per event
    known = _options_of.get(identity)
    if known is None:
        if len(_options_of) >= MAX_ENTRIES:
            _options_of.clear()
        value = tuple((k, tuple(v) if isinstance(v, list | set) else v) for k, v in kwargs.items())
        known = _options_of[identity] = (value, tuple(kwargs.values()))
    return known[0]


def _body(from_packet: Any, size: int) -> bytes | None:
    """The event's bytes after its header, without consuming them (None when they cannot be seen)."""
    mysql_packet = getattr(from_packet, "packet", None)
    data, position = getattr(mysql_packet, "_data", None), getattr(mysql_packet, "_position", None)
    if not isinstance(data, bytes | bytearray) or not isinstance(position, int):
        return None
    body = bytes(data[position : position + size])
    return body if len(body) == size else None


def _not_advice_to_log_names(record: logging.LogRecord) -> bool:
    """The library warns at every stream of a server not at binlog_row_metadata FULL; the job reads such a server
    by position (`by_position`), so the advice is noise in its log. So is its line at a lost connection: the
    binlog reader's own says which server, what error and from where it reads again (ingest.source.reconnect)."""
    message = record.getMessage()
    return "BINLOG_ROW_METADATA = FULL" not in message and "Re-request the connection" not in message


_CODECS = {"ucs2": "utf-16-be", "utf16": "utf-16-be", "utf16le": "utf-16-le", "utf32": "utf-32-be"}
"""MySQL's character sets whose library encoding is no Python codec of theirs: `ucs2` is none at all, and
Python's `utf16` / `utf32` read a byte order mark, and without one this machine's order (little-endian), while
MySQL stores both big-endian and without a mark."""
_library_encoding = CHARSET.Charset.encoding


def _encoding(charset: Any) -> str:
    return _CODECS.get(charset.name) or str(_library_encoding.fget(charset))


def install() -> None:
    """Parse table maps through the cache in every stream of this process, and decode the UTF-16 and UTF-32
    character sets with their byte order (idempotent)."""
    TableMapEvent.__init__ = _init
    CHARSET.Charset.encoding = property(_encoding)
    library_log = logging.getLogger("pymysqlreplication")
    if _not_advice_to_log_names not in library_log.filters:
        library_log.addFilter(_not_advice_to_log_names)


# information_schema's DATA_TYPE -> the binlog column types it is logged as. A type not listed is not checked.
_LOGGED_AS: dict[str, frozenset[int]] = {
    name: frozenset(types)
    for names, types in (
        (("tinyint",), (FIELD_TYPE.TINY,)),
        (("smallint",), (FIELD_TYPE.SHORT,)),
        (("mediumint",), (FIELD_TYPE.INT24,)),
        (("int", "integer"), (FIELD_TYPE.LONG,)),
        (("bigint",), (FIELD_TYPE.LONGLONG,)),
        (("float",), (FIELD_TYPE.FLOAT,)),
        (("double", "real"), (FIELD_TYPE.DOUBLE,)),
        (("decimal", "numeric"), (FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.DECIMAL)),
        (("char", "binary", "uuid", "inet4", "inet6"), (FIELD_TYPE.STRING,)),
        (("varchar", "varbinary"), (FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING)),
        (
            ("tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob", "mediumblob", "longblob"),
            (FIELD_TYPE.BLOB,),
        ),
        (("json",), (FIELD_TYPE.JSON, FIELD_TYPE.BLOB)),
        (("date",), (FIELD_TYPE.DATE, FIELD_TYPE.NEWDATE)),
        (("time",), (FIELD_TYPE.TIME, FIELD_TYPE.TIME2)),
        (("datetime",), (FIELD_TYPE.DATETIME, FIELD_TYPE.DATETIME2)),
        (("timestamp",), (FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIMESTAMP2)),
        (("year",), (FIELD_TYPE.YEAR,)),
        (("enum",), (FIELD_TYPE.ENUM,)),
        (("set",), (FIELD_TYPE.SET,)),
        (("bit",), (FIELD_TYPE.BIT,)),
    )
    for name in names
}
_TYPE_NAMES = {v: k for k, v in vars(FIELD_TYPE).items() if k.isupper() and isinstance(v, int)}


def logged_data_type(field_type: int) -> str | None:
    """The `information_schema` data type a table map's column type stands for (the first, where several share
    it: `int` for LONG, `blob` for BLOB), or None for one the job does not know."""
    return next((name for name, types in _LOGGED_AS.items() if field_type in types), None)


_TEXT_TYPES = (FIELD_TYPE.STRING, FIELD_TYPE.VAR_STRING, FIELD_TYPE.VARCHAR, FIELD_TYPE.BLOB)


_NAMED = object()
"""`_ingest_schema` of a table map whose columns the server named; otherwise the schema that completed it."""


def names_logged(table: Any) -> bool:
    """The server named the columns of this table map (binlog_row_metadata FULL): rows are matched by name.
    Known once per table map (shared by the events of the same bytes), not looked for per event."""
    seen = getattr(table, "_ingest_schema", None)
    if seen is None and all(c.name for c in table.columns):
        table._ingest_schema = seen = _NAMED
    return seen is _NAMED


def by_position(table: Any, key: tuple[str, str], schema: Sequence[SourceColumn], dbms: str, at: object) -> bool:
    """Complete a table map that names no columns from `schema`, the table's columns in ordinal order at this
    binlog position; True when the table map's columns are matched to the schema by position.

    A table map whose columns the server named is left as it is (False). One completed earlier with the same
    schema is not touched again (table maps are shared between events of the same bytes, see `_init`).
    """
    columns = table.columns
    if getattr(table, "_ingest_schema", None) is schema:
        return True
    if names_logged(table):
        return False
    table_id = f"{key[0]}.{key[1]}"  # (for the message: a table map completed before returns above, per event)
    logged = [c.type for c in columns]
    expected = [_LOGGED_AS.get(c.data_type) for c in schema]
    if len(logged) != len(schema) or any(e is not None and t not in e for t, e in zip(logged, expected, strict=False)):
        raise SchemaChangeError(
            f"a binlog row of {table_id} at {at} has {len(logged)} columns of types "
            f"{[_TYPE_NAMES.get(t, t) for t in logged]}, but the schema the job decodes it with has {len(schema)}: "
            f"{[f'{c.name} {c.column_type}' for c in schema]}. The server logs no column names "
            "(binlog_row_metadata is not FULL), so columns are matched by position, and these do not match: the "
            "table's schema changed without a DDL statement the job could follow. Snapshot the table again: "
            f"`ingest resnapshot --config ... --table {table_id}`"
        )
    for column, source in zip(columns, schema, strict=True):
        column.name = source.name
        column.unsigned = source.unsigned
        if column.type in _TEXT_TYPES or column.type in (FIELD_TYPE.ENUM, FIELD_TYPE.SET):
            # The library's form with FULL metadata: the Python encoding of the column's character set.
            charset = CHARSET.charset_by_name(source.character_set or "binary", dbms)
            column.character_set_name = charset.encoding if charset else source.character_set
        if column.type == FIELD_TYPE.ENUM:
            column.enum_values = ["", *source.members]
        elif column.type == FIELD_TYPE.SET:
            column.set_values = source.members
    table._ingest_schema = schema
    return True


def refuse_by_position_after_ddl(event: Any, table_id: str, query: str, at: object, where: str) -> None:
    """A row event after a DDL of its table that the schema the job decodes with predates (the DDL came during
    the table's snapshot, `where` says where): refused when the server logs no column names.

    With names, a row whose columns the DDL changed no longer matches the schema and is refused by name, and
    one it left alone is read right. By position a renamed or reordered column of the same type cannot be told
    apart, so this case needs binlog_row_metadata=FULL or the table snapshotted again.
    """
    table = event.table_map.get(event.table_id)
    if table is None or names_logged(table):
        return
    raise SchemaChangeError(
        f"{table_id}: its schema changed during its snapshot, at binlog position {at} ({query[:200]!r}), {where}, "
        "and the server logs no column names (binlog_row_metadata is not FULL): the rows after it cannot be "
        "matched to columns with certainty, and none was applied. Re-snapshot the table: `ingest resnapshot "
        f"--config ... --table {table_id}`, then `ingest run` (with binlog_row_metadata=FULL, a DDL that leaves "
        "the columns alone would not stop the job)"
    )
