"""A TCP proxy on loopback for fault tests (issue 53): the job connects to a server through it, and a test stalls
the connections open at a moment (no byte passes either way, nothing is closed) or resets them; new connections
pass as before. In front of an HTTP server (MinIO), it can also answer every new request with 503, as an object
store's front end does when it sheds load (all of them, or those for some keys), until told to pass again."""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.stalled = threading.Event()
        self.closed = threading.Event()

    def pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self.closed.is_set():
                data = src.recv(65536)
                if not data:
                    break
                while self.stalled.is_set() and not self.closed.is_set():
                    self.closed.wait(0.1)  # held: neither sent on nor closed
                if self.closed.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self.close()

    def close(self, reset: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.server):
            try:
                if reset:  # RST, not FIN: as a proxy or a firewall that drops a connection does
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
            except OSError:
                pass


_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
)


def _read_head(client: socket.socket) -> tuple[bytes, bytes] | None:
    """One HTTP request's head (request line and fields) and the bytes of its body read with it."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = client.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body


def _fields(head: bytes) -> dict[bytes, bytes]:
    pairs = (line.partition(b":") for line in head.split(b"\r\n")[1:])
    return {name.strip().lower(): value.strip() for name, _, value in pairs}


def _answer_slow_down(client: socket.socket, head: bytes, body: bytes) -> None:
    """Answer the request with S3's 503 Slow Down and close, after reading the body a client sends with it."""
    fields = _fields(head)
    if fields.get(b"expect", b"").lower() != b"100-continue":  # else the client waits for our answer first
        left = int(fields.get(b"content-length", b"0") or 0) - len(body)
        client.settimeout(1)
        while left > 0:
            chunk = client.recv(min(left, 65536))
            if not chunk:
                break
            left -= len(chunk)
    client.sendall(
        b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
        + f"Content-Length: {len(_SLOW_DOWN)}\r\n\r\n".encode()
        + _SLOW_DOWN
    )


def _one_request_only(head: bytes) -> bytes:
    """The request's head asking the server to close the connection after answering it (`Connection` is a
    hop-by-hop field, outside the request's signature): the client's next request comes on a new connection."""
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"


class TcpProxy:
    """127.0.0.1:`port` forwards to 127.0.0.1:`target_port`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._shed: bytes | None = None
        """While set: requests whose path holds it are answered 503 (`unavailable`)."""
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcp-proxy")
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True, name="tcp-proxy-serve").start()

    def _serve(self, client: socket.socket) -> None:
        first = b""
        try:
            shed = self._shed
            if shed is not None:  # one request per connection, each looked at
                client.settimeout(5)
                request = _read_head(client)
                if request is None:
                    client.close()
                    return
                head, body = request
                if shed in head.split(b"\r\n", 1)[0]:
                    try:
                        _answer_slow_down(client, head, body)
                    finally:
                        client.close()
                    return
                first = _one_request_only(head) + body
                client.settimeout(None)
            server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            server.settimeout(None)
            server.sendall(first)
        except OSError:
            client.close()
            return
        pair = _Pair(client, server)
        with self._lock:
            self._pairs = [p for p in self._pairs if not p.closed.is_set()] + [pair]
        for src, dst in ((client, server), (server, client)):
            threading.Thread(target=pair.pump, args=(src, dst), daemon=True, name="tcp-proxy-pump").start()

    def open_connections(self) -> int:
        with self._lock:
            return sum(not p.closed.is_set() for p in self._pairs)

    def stall(self) -> int:
        """Hold every connection open now: no byte passes, none is closed. Returns how many."""
        with self._lock:
            pairs = [p for p in self._pairs if not p.closed.is_set()]
        for pair in pairs:
            pair.stalled.set()
        return len(pairs)

    def reset(self) -> int:
        """Reset every connection open now. Returns how many."""
        with self._lock:
            pairs = [p for p in self._pairs if not p.closed.is_set()]
        for pair in pairs:
            pair.close(reset=True)
        return len(pairs)

    def unavailable(self, path_part: str = "/") -> int:
        """From now on an HTTP server's front end shedding load: every request whose path holds `path_part` is
        answered 503 Slow Down, the others pass, one per connection. Every connection open now is reset (a
        client's pooled connections come back as new ones). Returns how many were reset."""
        self._shed = path_part.encode()
        return self.reset()

    def available(self) -> None:
        """Requests pass again."""
        self._shed = None

    def close(self) -> None:
        self._listener.close()
        self.reset()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
