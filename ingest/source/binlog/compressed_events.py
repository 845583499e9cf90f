"""MariaDB's compressed binlog events (`log_bin_compress=ON`), inflated before python-mysql-replication reads them.

A server with `log_bin_compress` writes a query or row event longer than `log_bin_compress_min_len` as a
compressed event of its own type: QUERY_COMPRESSED_EVENT and WRITE/UPDATE/DELETE_ROWS_COMPRESSED_EVENT (V1 and
V2). The library knows none of these types, and a stream filtered by event class passes them over: every change
they carry would be lost without a word. Only the variable part is compressed: a query event's SQL text, and a
row event's rows after the column bitmaps. That part begins with one header byte (bit 7 set, bits 0-2 the
number of bytes that follow it, big-endian, holding the inflated length) and then a zlib stream.

`inflate` turns such a packet into the packet of the plain event it stands for: same position, the plain type,
the inflated body and its size. The library then reads it as it reads any other event. `install()` wraps the
library's packet wrapper so that every stream of this process sees the plain events.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from pymysqlreplication import binlogstream

from ingest.errors import SourceError

QUERY_COMPRESSED = 0xA5
PLAIN_TYPE = {
    QUERY_COMPRESSED: 0x02,  # QUERY_EVENT
    0xA6: 0x17,  # WRITE_ROWS_COMPRESSED_EVENT_V1 -> WRITE_ROWS_EVENT_V1
    0xA7: 0x18,  # UPDATE_ROWS_COMPRESSED_EVENT_V1
    0xA8: 0x19,  # DELETE_ROWS_COMPRESSED_EVENT_V1
    0xA9: 0x1E,  # WRITE_ROWS_COMPRESSED_EVENT -> WRITE_ROWS_EVENT_V2
    0xAA: 0x1F,  # UPDATE_ROWS_COMPRESSED_EVENT
    0xAB: 0x20,  # DELETE_ROWS_COMPRESSED_EVENT
}
_UPDATES = frozenset({0xA7, 0xAA})
_V2 = frozenset({0xA9, 0xAA, 0xAB})
_HEADER = 20
"""The packet's OK byte and the event's common header (19 bytes): timestamp, type, server id, size, end, flags."""
_TYPE, _SIZE, _END = 5, 10, 14
_ROWS_POST_HEADER = 8
"""Table id (6 bytes) and flags (2) of a row event."""
_QUERY_POST_HEADER = 13
"""Thread id (4), execution time (4), database name length (1), error code (2), status variables length (2)."""


def inflate(packet: bytes, checksum: bool) -> bytes | None:
    """The packet of the plain event a compressed event's packet stands for; None for any other event."""
    if len(packet) <= _TYPE or packet[_TYPE] not in PLAIN_TYPE:
        return None
    kind = packet[_TYPE]
    tail = 4 if checksum else 0
    body = packet[_HEADER : len(packet) - tail]
    start = _query_text(body) if kind == QUERY_COMPRESSED else _rows(body, kind)
    inflated = body[:start] + _uncompress(body[start:], packet)
    size = 19 + len(inflated) + tail
    header = bytearray(packet[:_HEADER])
    header[_TYPE] = PLAIN_TYPE[kind]
    struct.pack_into("<I", header, _SIZE, size)
    # The checksum (if any) stays the compressed event's: streams do not verify it.
    return bytes(header) + inflated + packet[len(packet) - tail :]


def _query_text(body: bytes) -> int:
    """Where a query event's SQL text begins: after the post-header, the status variables and the database name."""
    db_length = body[8]
    status_length: int = struct.unpack_from("<H", body, 11)[0]
    return _QUERY_POST_HEADER + status_length + db_length + 1


def _rows(body: bytes, kind: int) -> int:
    """Where a row event's rows begin: after the post-header, a V2 event's extra data, the column count and the
    column bitmaps (two for an update)."""
    at = _ROWS_POST_HEADER
    if kind in _V2:
        extra: int = struct.unpack_from("<H", body, at)[0]
        at += extra  # the extra data's length counts its own two bytes
    width, at = packed_integer(body, at)
    return at + (width + 7) // 8 * (2 if kind in _UPDATES else 1)


def packed_integer(data: bytes, at: int) -> tuple[int, int]:
    """A length-encoded integer of the protocol at `at`: its value and the offset after it (KeyError: its first byte
    begins none)."""
    first = data[at]
    if first < 251:
        return first, at + 1
    size = {252: 2, 253: 3, 254: 8}[first]
    return int.from_bytes(data[at + 1 : at + 1 + size], "little"), at + 1 + size


def _uncompress(part: bytes, packet: bytes) -> bytes:
    header = part[0] if part else 0
    length_bytes = header & 0x07
    if not header & 0x80 or not 1 <= length_bytes <= 4:
        raise _unreadable(packet, f"its compressed part begins with {header:#04x}")
    length = int.from_bytes(part[1 : 1 + length_bytes], "big")
    try:
        data = zlib.decompress(part[1 + length_bytes :])
    except zlib.error as e:
        raise _unreadable(packet, str(e)) from None
    if len(data) != length:
        raise _unreadable(packet, f"it inflates to {len(data)} bytes, not the {length} it says")
    return data


def _unreadable(packet: bytes, why: str) -> SourceError:
    end = struct.unpack_from("<I", packet, _END)[0]
    return SourceError(
        f"the compressed binlog event (type {packet[_TYPE]:#04x}) ending at log position {end} cannot be "
        f"inflated: {why}. Nothing from it on was applied"
    )


_Wrapper = binlogstream.BinLogPacketWrapper


class _InflatingWrapper(_Wrapper):  # type: ignore[misc, valid-type]
    """The library's packet wrapper, given the plain packet of a compressed event."""

    def __init__(self, from_packet: Any, *args: Any, **kwargs: Any) -> None:
        data = getattr(from_packet, "_data", None)
        # The type byte first: the copy and the parse are for compressed events only, not for every event.
        if (
            isinstance(data, bytes | bytearray)
            and len(data) > _TYPE
            and data[_TYPE] in PLAIN_TYPE
            and getattr(from_packet, "_position", None) == 0
        ):
            plain = inflate(bytes(data), _checksum(args, kwargs))
            if plain is not None:
                from_packet._data = plain
        super().__init__(from_packet, *args, **kwargs)


def _checksum(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The wrapper's `use_checksum` argument (its fifth, after the packet)."""
    return bool(kwargs["use_checksum"] if "use_checksum" in kwargs else args[3])


def install() -> None:
    """Inflate compressed events in every stream of this process (idempotent)."""
    binlogstream.BinLogPacketWrapper = _InflatingWrapper
