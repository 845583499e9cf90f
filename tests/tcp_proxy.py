"""A TCP proxy on loopback for fault tests (issue 53): the job connects to a server through it, and a test stalls
the connections open at a moment (no byte passes either way, nothing is closed) or resets them; new connections
pass as before. In front of an HTTP server (MinIO), it can also answer every new request with 503, as an object
store's front end does when it sheds load, until told to pass again."""

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


def _answer_unavailable(client: socket.socket) -> None:
    """Reads one HTTP request's head (and a body sent with it) and answers it with S3's 503 Slow Down, then closes."""
    try:
        client.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            chunk = client.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        fields = dict(
            (name.strip().lower(), value.strip())
            for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
        )
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
    except OSError:
        pass
    finally:
        client.close()


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
        self._unavailable = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcp-proxy")
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._unavailable.is_set():
                threading.Thread(target=_answer_unavailable, args=(client,), daemon=True, name="tcp-proxy-503").start()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
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

    def unavailable(self) -> int:
        """From now on every new HTTP request is answered 503 Slow Down, and every connection open now is reset (a
        client's pooled connections come back as new ones). Returns how many were reset."""
        self._unavailable.set()
        return self.reset()

    def available(self) -> None:
        """New connections pass again."""
        self._unavailable.clear()

    def close(self) -> None:
        self._listener.close()
        self.reset()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
