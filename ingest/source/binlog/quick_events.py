"""The binlog's everyday events read in place from the stream connection's buffer, without the library's objects.

A single-row transaction is five events: GTID, ANNOTATE_ROWS, a table map, a row event and XID. For each one
python-mysql-replication makes a packet object, a wrapper and an event object, reads every field through a
method call, and sets the socket's timeout twice (two system calls). At 5,000 transactions/s that was most of
the core the reader runs on (bench.steady, issue 65).

`Buffer` looks at the packets the connection has already received, in place and without waiting for more, and
takes one only when it is whole, in sequence, and one of:

- a MariaDB GTID event: its domain, server id, sequence number and flags;
- ANNOTATE_ROWS: the statement's text, which nothing reads (the library's event filter passes it over too);
- a table map whose bytes the library parsed before for the same table id: that parse again;
- a row event (V1 or V2) of a table whose table map is known: its rows' bytes, for the reader to decode;
- an XID event: a commit.

Everything else, and whatever is not yet wholly received, the library reads as before (`fetchone`); it keeps the
connection too (registration, reconnects, rotations, heartbeats). A packet taken is read out of the buffer, the
connection's packet sequence moves past it and the library's position and table ids are kept as if it had read
it, so its next read, or its reconnect, starts right after it.
"""

from __future__ import annotations

import select
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ingest.source.binlog.compressed_events import packed_integer

GTID, XID, ANNOTATE_ROWS, TABLE_MAP = 0xA2, 0x10, 0xA0, 0x13
ROW_EVENTS = {
    0x17: ("insert", 8),  # WRITE_ROWS_EVENT_V1: table id (6 bytes) and flags (2)
    0x18: ("update", 8),
    0x19: ("delete", 8),
    0x1E: ("insert", 10),  # WRITE_ROWS_EVENT (V2): then the length of its extra data (2)
    0x1F: ("update", 10),
    0x20: ("delete", 10),
}
"""Row event types: what their rows are, and their post-header's length."""
TAKEN = frozenset({GTID, XID, ANNOTATE_ROWS, TABLE_MAP, *ROW_EVENTS})

_PACKET_HEADER = 4
"""The packet's length (3 bytes) and its sequence number (1)."""
_EVENT_HEADER = struct.Struct("<xIBIIIH")
"""After the packet header: the OK byte, then the event's header: timestamp, type, server id, size, end, flags."""
_BODY = _PACKET_HEADER + _EVENT_HEADER.size
_GTID = struct.Struct("<QIB")
"""A MariaDB GTID event's sequence number, domain id and flags."""
GATHER_SECONDS = 0.005
"""A drained buffer waits this long before it looks again (`Buffer.wait`)."""
_LARGEST = 0xFFFFFF
"""A packet this long continues in the next one: the library joins them."""


@dataclass(slots=True)
class Event:
    """An event of the buffer, not yet taken: its header, and where its body lies in `Buffer.data`."""

    type: int
    timestamp: int
    server_id: int
    log_pos: int
    start: int
    """The first byte of the event's body."""
    stop: int
    """The byte after the event's body (its checksum, if any, excluded)."""
    size: int
    """The whole packet's bytes, its header included."""


@dataclass(slots=True)
class Rows:
    """A row event's table id and rows: `start` to `stop` of the buffer; `full`: every column is in its images."""

    table_id: int
    kind: str
    columns: int
    full: bool
    start: int
    stop: int


class Buffer:
    """The whole packets a replication stream's connection holds, looked at in place.

    `look(stream)` takes a fresh look (False: nothing whole there); `event()` is the next packet's event if it
    is one `Buffer` reads, else None (the library reads it); `take(event)` takes it, and `settle(stream)`
    reads what was taken out of the connection's buffer and moves the connection's sequence and the stream's
    position past it, before the library reads on.
    """

    def __init__(self) -> None:
        self.data = b""
        self._at = self._settled = 0
        """Where the next packet begins in `data`, and up to where the packets taken are read out of it."""
        self._maps: dict[int, tuple[bytes, Any]] = {}
        """Per table id, the body of the table map the library parsed last, and its parse."""
        self._socket: Any = None
        """The connection's socket, where the last look could look (`wait` waits on it)."""
        self._declined: tuple[int, bytes] | None = None
        """A table map left to the library: recorded with its parse once the library has read it."""
        self.taken = dict.fromkeys(sorted(TAKEN), 0)
        """Events taken, by type."""
        self._seq = 0
        self._log_pos = 0
        """The connection's next sequence number and the stream's position past what was taken (`settle` sets
        them): an event costs no attribute of the library's objects."""
        self._checksum = 0
        self._kinds: frozenset[int] = frozenset()
        """As the stream said at the look: the bytes of each event's checksum, and the types read here."""

    def look(self, stream: Any) -> bool:
        """Look at what the stream's connection has received; True when a whole packet is there."""
        self.data, self._at, self._settled, self._declined = b"", 0, 0, None  # a map declined is read, or never
        self._socket = None
        conn = getattr(stream, "_stream_connection", None)
        if (
            conn is None
            or not getattr(stream, "_BinLogStreamReader__connected_stream", False)
            or getattr(stream, "_BinLogStreamReader__verify_checksum", True)
            or stream.dbms is None
        ):
            return False
        rfile, sock = getattr(conn, "_rfile", None), getattr(conn, "_sock", None)
        if rfile is None or sock is None:
            return False
        self._socket = sock
        self._seq, self._log_pos = conn._next_seq_id, 0
        self._checksum = 4 if stream._BinLogStreamReader__use_checksum else 0
        self._kinds = frozenset(kind for kind in TAKEN if _declared(stream, kind))
        try:
            if sock.gettimeout() != 0.0:  # (a system call each time it is set, even to what it is)
                sock.settimeout(0.0)  # no wait: an empty buffer stays empty (`wait`, or the library, waits)
            data = rfile.peek()
        except OSError:  # nothing received yet (TLS says so with an error), or a lost connection: the library's
            return False
        self.data = data
        return len(data) >= _BODY

    @property
    def drained(self) -> bool:
        """Every packet of the last look was taken, or it saw nothing: what comes next is yet to be received."""
        return self._at >= len(self.data)

    def wait(self, stream: Any, seconds: float, before: Callable[[], None]) -> bool:
        """After a look that left the buffer `drained`: wait up to `seconds` for the server to send more, and look
        at it (True: something is there to read in place). False after the time, for nothing whole, or for a
        connection that says it is readable with nothing to read (closed): the library reads, and raises, then.
        `before()` is told when nothing has come yet, before the wait.

        Without it, the first event after the buffer ran dry went through the library whole: at a steady load
        of single-row transactions that was one library event in every few (bench.steady)."""
        sock = self._socket
        if sock is None:
            return False
        try:
            poll = select.poll()
            poll.register(sock, select.POLLIN)
            if not poll.poll(0):  # (a catch-up finds the next bytes there: it reads on at once)
                before()
                # What the server sends in the next moment is read at once: at a steady load a wake-up per
                # transaction (a poll, a look, their system calls) cost more than the transaction.
                time.sleep(GATHER_SECONDS)
                if not poll.poll(seconds * 1000):
                    return False
        except (OSError, ValueError):  # closed meanwhile (a stop): the library's read says so
            return False
        return self.look(stream)

    def event(self) -> Event | None:
        """The next packet's event when it is whole, next in sequence and of a type read here; else None."""
        data, at = self.data, self._at
        if at + _BODY > len(data):
            return None
        length = data[at] | data[at + 1] << 8 | data[at + 2] << 16
        size = _PACKET_HEADER + length
        if (
            length >= _LARGEST
            or at + size > len(data)
            or data[at + 3] != self._seq
            or data[at + 4] != 0  # not an OK packet: an EOF or an error, for the library to raise
        ):
            return None
        timestamp, kind, server_id, event_size, log_pos, _flags = _EVENT_HEADER.unpack_from(data, at + _PACKET_HEADER)
        if kind not in self._kinds or event_size != length - 1:
            return None
        return Event(kind, timestamp, server_id, log_pos, at + _BODY, at + size - self._checksum, size)

    def next_event(self, stream: Any) -> Event | None:
        """The next event the reader acts on, as `event`; ANNOTATE_ROWS and the table maps the library parsed before
        are taken on the way (a table map returned is one the library must parse)."""
        while (event := self.event()) is not None:
            kind = event.type
            if kind == ANNOTATE_ROWS or (kind == TABLE_MAP and self.known_map(stream, event)):
                self.take(event)
                continue
            return event
        return None

    def take(self, event: Event) -> None:
        """Take `event`'s packet: it leaves the connection's buffer at `settle`, before the library reads again."""
        self._seq = (self._seq + 1) % 256
        if event.log_pos:
            self._log_pos = event.log_pos
        self._at += event.size
        self.taken[event.type] += 1

    def settle(self, stream: Any) -> None:
        """Read the packets taken since `look` out of the connection's buffer, at once, and move the connection's
        sequence and the stream's position past them: the library's next read starts after them."""
        if self._at > self._settled:
            conn = stream._stream_connection
            conn._rfile.read(self._at - self._settled)
            conn._next_seq_id = self._seq
            if self._log_pos:
                stream.log_pos = self._log_pos
            self._settled = self._at

    def gtid(self, event: Event) -> tuple[int, int, int]:
        """A MariaDB GTID event's (domain id, sequence number, flags)."""
        seq_no, domain_id, flags = _GTID.unpack_from(self.data, event.start)
        return domain_id, seq_no, flags

    def known_map(self, stream: Any, event: Event) -> bool:
        """A table map the library parsed before, byte for byte: its parse is the stream's for the table id again
        (True). Else it is left to the library, and its parse recorded after (`after_library`)."""
        body = self.data[event.start : event.stop]
        table_id = int.from_bytes(body[:6], "little")
        known = self._maps.get(table_id)
        if known is not None and known[0] == body:
            stream.table_map[table_id] = known[1]
            return True
        self._declined = (table_id, body)
        return False

    def after_library(self, stream: Any) -> None:
        """The library has read on: the table map left to it is parsed now."""
        if self._declined is not None:
            table_id, body = self._declined
            self._declined = None
            table = stream.table_map.get(table_id)
            if table is not None:
                self._maps[table_id] = (body, table)

    def rows(self, event: Event) -> Rows | None:
        """A row event's table id, column count and rows (its post-header's length checked by `event`); None when
        its column count is no length-encoded integer (the library reads it, and says what is wrong)."""
        data, at = self.data, event.start
        kind, post_header = ROW_EVENTS[event.type]
        table_id = int.from_bytes(data[at : at + 6], "little")
        at += 8
        if post_header == 10:
            at += int.from_bytes(data[at : at + 2], "little")  # the extra data's length counts its own two bytes
        try:
            columns, at = packed_integer(data, at)
        except KeyError:
            return None
        width = (columns + 7) // 8
        every = (1 << columns) - 1
        full = int.from_bytes(data[at : at + width], "little") == every
        at += width
        if kind == "update":
            full = full and int.from_bytes(data[at : at + width], "little") == every
            at += width
        return Rows(table_id, kind, columns, full, at, event.stop)


def _declared(stream: Any, kind: int) -> bool:
    """The format description event declares the post-header length read here for a row event (or none)."""
    if kind not in ROW_EVENTS:
        return True
    lengths = stream._BinLogStreamReader__post_header_lengths
    if not lengths:
        return True
    return len(lengths) >= kind and lengths[kind - 1] == ROW_EVENTS[kind][1]
