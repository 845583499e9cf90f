"""Reading the binlog's everyday events in place from a connection's buffer (no server): what is taken, what is
left to python-mysql-replication, and that a packet taken moves the connection exactly past it."""

from __future__ import annotations

import contextlib
import io
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ingest.source.binlog import quick_events
from ingest.source.binlog.quick_events import Buffer
from ingest.source.binlog.reader import with_read_buffer

CHECKSUM = b"\x01\x02\x03\x04"


def _packet(kind: int, body: bytes, seq: int, end: int = 4242, checksum: bytes = CHECKSUM) -> bytes:
    """The wire form of one event: the packet header (length, sequence number), the OK byte, the common
    header, the body and a checksum."""
    header = struct.pack("<IBIIIH", 1_700_000_000, kind, 7, 19 + len(body) + len(checksum), end, 0)
    payload = b"\x00" + header + body + checksum
    return len(payload).to_bytes(3, "little") + bytes([seq]) + payload


class _Socket:
    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    def settimeout(self, value: float | None) -> None:
        self.timeouts.append(value)

    def gettimeout(self) -> float | None:
        return self.timeouts[-1] if self.timeouts else None


class _Connection:
    def __init__(self, wire: bytes, seq: int) -> None:
        self._rfile = io.BufferedReader(io.BytesIO(wire))
        self._sock = _Socket()
        self._next_seq_id = seq


class _Stream:
    """The attributes of python-mysql-replication's BinLogStreamReader that `Buffer` reads and keeps."""

    def __init__(self, wire: bytes, seq: int = 1, checksum: bool = True, post_header: list[int] | None = None):
        self._stream_connection = _Connection(wire, seq)
        self._BinLogStreamReader__connected_stream = True
        self._BinLogStreamReader__verify_checksum = False
        self._BinLogStreamReader__use_checksum = checksum
        self._BinLogStreamReader__post_header_lengths = post_header
        self.dbms = "mariadb"
        self.log_pos = 4
        self.table_map: dict[int, Any] = {}


GTID_BODY = struct.pack("<QIB", 981, 0, 0x01) + b"\x00" * 6


def test_whole_packets_are_taken_in_order_and_the_connection_moves_past_each() -> None:
    wire = _packet(quick_events.GTID, GTID_BODY, 1, end=500) + _packet(quick_events.XID, b"\x09" * 8, 2, end=531)
    stream, buffer = _Stream(wire + b"\x05\x00"), Buffer()
    assert buffer.look(stream)
    gtid = buffer.event()
    assert gtid is not None and (gtid.type, gtid.server_id, gtid.log_pos, gtid.timestamp) == (0xA2, 7, 500, 1.7e9)
    assert buffer.gtid(gtid) == (0, 981, 0x01)
    buffer.take(gtid)
    xid = buffer.event()
    assert xid is not None and xid.type == quick_events.XID
    buffer.take(xid)
    assert buffer.event() is None  # two bytes of the next packet only: the library reads it
    rfile = stream._stream_connection._rfile
    assert rfile.peek().startswith(wire)  # taken, but still in the connection's buffer
    assert (stream.log_pos, stream._stream_connection._next_seq_id) == (4, 1)  # moved at `settle`
    buffer.settle(stream)
    assert stream.log_pos == 531 and stream._stream_connection._next_seq_id == 3
    buffer.settle(stream)  # once only
    assert rfile.read() == b"\x05\x00"  # exactly the two packets were read out
    assert stream._stream_connection._sock.timeouts == [0.0]  # one look, without waiting


@pytest.mark.parametrize(
    ("wire", "why"),
    [
        (_packet(quick_events.GTID, GTID_BODY, 5), "out of sequence: the library raises its error"),
        (_packet(0x02, b"\x00" * 30, 1), "a query event: the library's"),
        (_packet(0x04, b"\x00" * 30, 1), "a rotation: the library's, which moves its file"),
        (_packet(quick_events.XID, b"\x09" * 8, 1)[:-3], "not wholly received"),
        (b"\x05\x00\x00\x01\xfe\x00\x00\x02\x00", "an EOF packet"),
        (b"\xff\xff\xff\x01\x00" + b"\x00" * 40, "a packet continued in the next one"),
    ],
)
def test_other_packets_are_left_to_the_library_untouched(wire: bytes, why: str) -> None:
    stream, buffer = _Stream(wire), Buffer()
    if buffer.look(stream):
        assert buffer.event() is None, why
    assert stream._stream_connection._rfile.read() == wire and stream._stream_connection._next_seq_id == 1


def test_a_stream_that_verifies_checksums_or_is_not_connected_is_not_looked_at() -> None:
    stream = _Stream(_packet(quick_events.XID, b"\x09" * 8, 1))
    stream._BinLogStreamReader__verify_checksum = True
    assert not Buffer().look(stream)
    stream._BinLogStreamReader__verify_checksum = False
    stream._BinLogStreamReader__connected_stream = False
    assert not Buffer().look(stream)


def test_an_empty_buffer_is_looked_at_without_waiting() -> None:
    stream = _Stream(b"")
    assert not Buffer().look(stream)


def _rows_body(width: int, bitmaps: int, rows: bytes, extra: bytes = b"", present: int = 0xFF) -> bytes:
    bitmap = ((1 << width) - 1 if present == 0xFF else present).to_bytes((width + 7) // 8, "little")
    return (18).to_bytes(6, "little") + b"\x01\x00" + extra + bytes([width]) + bitmap * bitmaps + rows


@pytest.mark.parametrize(
    ("kind", "bitmaps", "extra", "expected"),
    [
        (0x17, 1, b"", "insert"),
        (0x18, 2, b"", "update"),
        (0x19, 1, b"", "delete"),
        (0x1E, 1, b"\x02\x00", "insert"),  # V2: the extra data's length counts its own two bytes
        (0x1F, 2, b"\x04\x00\xaa\xbb", "update"),
        (0x20, 1, b"\x02\x00", "delete"),
    ],
)
def test_a_row_events_rows_are_found_after_its_bitmaps(kind: int, bitmaps: int, extra: bytes, expected: str) -> None:
    rows = b"\x00\x2a\x00\x00\x00" * 3
    for checksum in (CHECKSUM, b""):
        wire = _packet(kind, _rows_body(10, bitmaps, rows, extra), 1, checksum=checksum)
        stream, buffer = _Stream(wire, checksum=bool(checksum)), Buffer()
        assert buffer.look(stream)
        event = buffer.event()
        assert event is not None
        found = buffer.rows(event)
        assert (found.table_id, found.kind, found.columns, found.full) == (18, expected, 10, True)
        assert buffer.data[found.start : found.stop] == rows


def test_rows_without_every_column_are_not_full() -> None:
    wire = _packet(0x17, _rows_body(10, 1, b"\x00", present=0b1111111011), 1)
    stream, buffer = _Stream(wire), Buffer()
    assert buffer.look(stream)
    event = buffer.event()
    assert event is not None and not buffer.rows(event).full


def test_a_row_event_of_another_declared_post_header_length_is_left_to_the_library() -> None:
    lengths = [0] * 40
    lengths[0x17 - 1] = 6  # an old server's 4-byte table ids
    stream = _Stream(_packet(0x17, _rows_body(2, 1, b"\x00\x01\x02"), 1), post_header=lengths)
    buffer = Buffer()
    assert buffer.look(stream) and buffer.event() is None
    lengths[0x17 - 1] = 8
    assert buffer.look(stream) and buffer.event() is not None


MAP_BODY = (18).to_bytes(6, "little") + b"\x00\x00\x04shop\x00\x01t\x00\x01\x03\x00\x00"


def _parsed_by_the_library(buffer: Buffer) -> tuple[_Stream, object]:
    """A stream whose table map 18 (`MAP_BODY`) `buffer` left to the library, and the library's parse of it."""
    stream = _Stream(_packet(quick_events.TABLE_MAP, MAP_BODY, 1))
    assert buffer.look(stream)
    event = buffer.event()
    assert event is not None and not buffer.known_map(stream, event)  # never seen: the library parses it
    parsed = object()
    stream.table_map[18] = parsed  # what the library's read leaves
    buffer.after_library(stream)
    return stream, parsed


def test_a_table_map_is_taken_only_as_the_library_parsed_the_same_bytes_before() -> None:
    body, buffer = MAP_BODY, Buffer()
    stream, parsed = _parsed_by_the_library(buffer)
    stream.table_map = {}  # a rotation starts the library's map over
    assert buffer.look(stream)
    event = buffer.event()
    assert event is not None and buffer.known_map(stream, event)
    assert stream.table_map == {18: parsed}
    other = _Stream(_packet(quick_events.TABLE_MAP, body[:-1] + b"\x01", 1))  # the same id, other bytes
    assert buffer.look(other)
    event = buffer.event()
    assert event is not None and not buffer.known_map(other, event)


def test_the_next_event_acted_on_takes_annotations_and_known_table_maps_on_the_way() -> None:
    body, buffer = MAP_BODY, Buffer()
    _, parsed = _parsed_by_the_library(buffer)
    unknown = _packet(quick_events.TABLE_MAP, (19).to_bytes(6, "little") + body[6:], 4)
    wire = (
        _packet(quick_events.ANNOTATE_ROWS, b"UPDATE t SET c = 1", 1)
        + _packet(quick_events.TABLE_MAP, body, 2)
        + _packet(quick_events.XID, b"\x09" * 8, 3, end=900)
        + unknown
    )
    stream = _Stream(wire)
    assert buffer.look(stream)
    xid = buffer.next_event(stream)
    assert xid is not None and xid.type == quick_events.XID and stream.table_map == {18: parsed}
    buffer.take(xid)
    left = buffer.next_event(stream)  # a table map never parsed: returned, not taken
    assert left is not None and left.type == quick_events.TABLE_MAP and left.size == len(unknown)
    assert buffer.next_event(stream) is not None  # still there
    buffer.settle(stream)
    assert stream._stream_connection._rfile.read() == unknown and stream._stream_connection._next_seq_id == 4
    assert buffer.taken[quick_events.ANNOTATE_ROWS] == buffer.taken[quick_events.TABLE_MAP] == 1


def test_a_declined_table_map_is_not_recorded_after_a_fresh_look() -> None:
    stream, buffer = _Stream(_packet(quick_events.TABLE_MAP, MAP_BODY, 1)), Buffer()
    assert buffer.look(stream)
    event = buffer.event()
    assert event is not None and not buffer.known_map(stream, event)
    buffer.look(stream)  # the stream was lost and read again: what the library parses now is not that one
    stream.table_map[18] = object()
    buffer.after_library(stream)
    assert buffer.look(stream)
    event = buffer.event()
    assert event is not None and not buffer.known_map(stream, event)


def test_a_row_event_longer_than_a_sockets_own_buffer_is_read_in_place_through_the_streams_buffer() -> None:
    """A socket's file buffers 8 KiB, about the length of one row event: the stream's connection reads through a
    larger buffer (`with_read_buffer`), so that long events are whole in it."""
    rows = b"\x00\x2a\x00\x00\x00" * 12_000  # 60 kB of rows
    wire = _packet(0x17, _rows_body(10, 1, rows), 1)
    with _over_a_socket() as (stream, server):
        conn = stream._stream_connection
        server.sendall(wire)
        buffer = Buffer()
        for _ in range(100):  # one look sees what the socket delivered so far, up to the buffer's size
            if buffer.look(stream) and len(buffer.data) >= len(wire):
                break
            time.sleep(0.01)
        assert len(buffer.data) == len(wire)
        event = buffer.event()
        assert (
            event is not None and event.size == len(wire) and buffer.data[buffer.rows(event).start :] == rows + CHECKSUM
        )
        buffer.take(event)
        buffer.settle(stream)
        server.sendall(b"\x01\x02")
        assert conn._rfile.read(2) == b"\x01\x02"  # the event was read out whole, nothing after it


def test_a_drained_buffer_waits_for_the_server_and_reads_what_came_in_place() -> None:
    """The first event after the buffer ran dry is read in place too, once it has come (`wait`); the caller is
    told before a wait, and not when the bytes are there already; a connection closed meanwhile is left to the
    library, which raises."""
    wire = _packet(quick_events.GTID, GTID_BODY, 1, end=500)
    told: list[str] = []

    def before() -> None:
        told.append("waiting")

    with _over_a_socket() as (stream, server):
        buffer = Buffer()
        assert not buffer.look(stream) and buffer.drained
        assert not buffer.wait(stream, 0.05, before)  # nothing came
        assert told == ["waiting"]
        threading.Timer(0.05, server.sendall, (wire,)).start()
        assert buffer.wait(stream, 5.0, before)
        assert told == ["waiting", "waiting"]
        event = buffer.event()
        assert event is not None and event.type == quick_events.GTID and event.size == len(wire)
        buffer.take(event)
        buffer.settle(stream)
        assert not buffer.look(stream) and buffer.drained
        server.sendall(_packet(quick_events.GTID, GTID_BODY, 2, end=600))
        assert select.select([stream._stream_connection._sock], [], [], 5.0)[0]  # it has come
        assert buffer.wait(stream, 5.0, before)  # there already: read at once, nobody told
        assert told == ["waiting", "waiting"]
        event = buffer.event()
        assert event is not None and event.log_pos == 600
        buffer.take(event)
        buffer.settle(stream)
        server.close()
        assert not buffer.wait(stream, 5.0, before)  # readable, with nothing to read: closed


@contextlib.contextmanager
def _over_a_socket() -> Iterator[tuple[_Stream, socket.socket]]:
    """A stream whose connection reads a real socket through the stream's buffer; the server's end."""
    ours, server = socket.socketpair()
    with ours, server:
        stream = _Stream(b"")
        conn = stream._stream_connection
        conn._sock, conn._rfile = ours, ours.makefile("rb")  # type: ignore[assignment]
        with_read_buffer(conn)  # type: ignore[arg-type]
        yield stream, server
