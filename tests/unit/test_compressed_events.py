"""Inflating MariaDB's compressed binlog events into the plain events they stand for (no server)."""

from __future__ import annotations

import struct
import zlib

import pytest

from ingest.errors import SourceError
from ingest.source.binlog.compressed_events import inflate

CHECKSUM = b"\x01\x02\x03\x04"


def _packet(kind: int, body: bytes, end: int = 4242, checksum: bytes = CHECKSUM) -> bytes:
    """An OK byte, the common header, the body and a checksum, as the server sends an event."""
    header = struct.pack("<IBIIIH", 1_700_000_000, kind, 1, 19 + len(body) + len(checksum), end, 0)
    return b"\x00" + header + body + checksum


def _compressed(data: bytes, length_bytes: int = 2) -> bytes:
    return bytes([0x80 | length_bytes]) + len(data).to_bytes(length_bytes, "big") + zlib.compress(data)


def _rows_head(width: int, bitmaps: int, extra: bytes = b"") -> bytes:
    return b"\x12\x00\x00\x00\x00\x00" + b"\x01\x00" + extra + bytes([width]) + b"\xff" * ((width + 7) // 8 * bitmaps)


ROWS = b"\xfc\x01\x00\x00\x00\x02\x00x1" * 40


@pytest.mark.parametrize(
    ("compressed_type", "plain_type", "bitmaps", "extra"),
    [
        (0xA6, 0x17, 1, b""),  # WRITE_ROWS_COMPRESSED_EVENT_V1
        (0xA7, 0x18, 2, b""),  # UPDATE_ROWS_COMPRESSED_EVENT_V1: before and after bitmaps
        (0xA8, 0x19, 1, b""),
        (0xA9, 0x1E, 1, b"\x02\x00"),  # V2: extra data, its length counting its own two bytes
        (0xAA, 0x1F, 2, b"\x04\x00\xaa\xbb"),
        (0xAB, 0x20, 1, b"\x02\x00"),
    ],
)
def test_a_compressed_row_event_becomes_the_plain_event_with_the_same_rows(
    compressed_type: int, plain_type: int, bitmaps: int, extra: bytes
) -> None:
    head = _rows_head(10, bitmaps, extra)
    plain = inflate(_packet(compressed_type, head + _compressed(ROWS)), checksum=True)
    assert plain == _packet(plain_type, head + ROWS)


def test_a_compressed_query_event_inflates_only_its_sql_text() -> None:
    status = b"\x00\x00\x00\x00\x00\x03std"
    head = struct.pack("<IIBHH", 7, 0, 2, 0, len(status)) + status + b"db\x00"
    sql = b"ALTER TABLE t DROP PARTITION p0, p1 /* long enough to be compressed */"
    plain = inflate(_packet(0xA5, head + _compressed(sql, length_bytes=3)), checksum=True)
    assert plain == _packet(0x02, head + sql)


def test_a_stream_without_checksums_keeps_no_tail() -> None:
    head = _rows_head(2, 1)
    packet = _packet(0xA6, head + _compressed(ROWS), checksum=b"")
    assert inflate(packet, checksum=False) == _packet(0x17, head + ROWS, checksum=b"")


def test_other_events_are_left_alone() -> None:
    assert inflate(_packet(0x17, _rows_head(2, 1) + ROWS), checksum=True) is None
    assert inflate(b"\x00\x01", checksum=True) is None


@pytest.mark.parametrize(
    "part",
    [
        b"\x01" + zlib.compress(ROWS),  # no compressed flag
        bytes([0x81, 200]) + zlib.compress(ROWS),  # says 200 bytes, inflates to 400
        bytes([0x81, 10]) + b"not zlib at all",
    ],
)
def test_a_compressed_part_that_does_not_inflate_stops_the_reader_by_its_position(part: bytes) -> None:
    with pytest.raises(SourceError, match="ending at log position 4242 cannot be inflated"):
        inflate(_packet(0xA6, _rows_head(2, 1) + part), checksum=True)
