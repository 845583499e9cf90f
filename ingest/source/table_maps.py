"""Parsing each distinct table-map event once.

Every transaction logs a table-map event before its row events, and python-mysql-replication parses it
in full each time: column types, metadata and, with binlog_row_metadata=FULL, the column names. For a
stream of small transactions that is close to half of the reader's CPU. The result depends only on the
event's bytes when the names come from the event itself, so an event whose bytes were seen before (same
table id, same columns, same names) takes the earlier parse. An event without column names (the library
then reads them from information_schema at that moment) is parsed every time, as before.

`install()` wraps the library's `TableMapEvent.__init__` (python-mysql-replication is pinned): the class
stays the same, so every filter of the library that names it still matches.
"""

from __future__ import annotations

from typing import Any

from pymysqlreplication.row_event import TableMapEvent

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
        names = getattr(getattr(self, "optional_metadata", None), "column_name_list", None)
        if key is not None and self._processed and names:
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


def _options(kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The stream's parse options (filters, versions) as a hashable value: part of what decides the parse."""
    return tuple((k, tuple(v) if isinstance(v, list | set) else v) for k, v in kwargs.items())


def _body(from_packet: Any, size: int) -> bytes | None:
    """The event's bytes after its header, without consuming them (None when they cannot be seen)."""
    mysql_packet = getattr(from_packet, "packet", None)
    data, position = getattr(mysql_packet, "_data", None), getattr(mysql_packet, "_position", None)
    if not isinstance(data, bytes | bytearray) or not isinstance(position, int):
        return None
    body = bytes(data[position : position + size])
    return body if len(body) == size else None


def install() -> None:
    """Parse table maps through the cache in every stream of this process (idempotent)."""
    TableMapEvent.__init__ = _init
