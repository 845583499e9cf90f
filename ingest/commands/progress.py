"""Progress a person can follow while `ingest run` works: per table the snapshot's chunks, rows, rows/s and ETA,
then the binlog phase's lag, changes/s and last commit.

On a terminal it is a block of lines at the bottom of the screen, drawn again every second; the job's log lines
scroll above it (the handlers writing to the same terminal go through `LiveProgress.write_above`). Anywhere else
(a file, a pipe, a cluster's step log) the same lines are logged every `plain_every` seconds, beside the job's
per-commit log lines. Everything it shows comes from the run's `JobMetrics` (ingest.metrics); it asks nothing of
the source or the catalog, so it costs the job nothing it would notice.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, TextIO

from ingest import metrics
from ingest.metrics import Progress

log = logging.getLogger(__name__)

ProgressMode = Literal["auto", "live", "plain", "off"]
RATE_WINDOW_SECONDS = 10.0
"""Changes/s is measured over about this many seconds (a binlog batch commits at once, every few seconds)."""
_UP_AND_CLEAR = "\r\x1b[{n}A\x1b[J"  # to the block's first line, then clear to the end of the screen
_CLEAR_LINE = "\r\x1b[J"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


@dataclass
class TableRate:
    """Where a table's snapshot stood when this run first saw it copying (rates and ETA count from there)."""

    at: float
    chunks: int
    rows: int


@dataclass
class ProgressView:
    """Turns successive `Progress` readings into the lines shown: pure, so it is tested without a terminal."""

    history: deque[Progress] = field(default_factory=deque)
    started: dict[str, TableRate] = field(default_factory=dict)

    def lines(self, now: Progress) -> list[str]:
        self.history.append(now)
        while len(self.history) > 2 and now.at - self.history[1].at >= RATE_WINDOW_SECONDS:
            self.history.popleft()
        width = max((len(t) for t in now.chunks), default=0)
        out = [self._snapshot_line(table.ljust(width), table, now) for table in sorted(now.chunks)]
        if now.committed is not None:
            out.append(self._binlog_line(now))
        return out

    def _snapshot_line(self, label: str, table: str, now: Progress) -> str:
        done, planned = now.chunks[table]
        rows = now.rows.get(table, 0)
        if done >= planned:
            return f"snapshot {label}  complete, {planned} chunks" + (f", {rows:,} rows copied" if rows else "")
        first = self.started.setdefault(table, TableRate(now.at, done, rows))
        elapsed = now.at - first.at
        chunks_now, rows_now = done - first.chunks, rows - first.rows
        text = f"snapshot {label}  chunks {done}/{planned} ({100 * done // max(planned, 1)}%), {rows:,} rows"
        if elapsed > 0 and chunks_now > 0:
            eta = (planned - done) * elapsed / chunks_now
            text += f", {rows_now / elapsed:,.0f} rows/s, ETA {_duration(eta)}"
        else:
            text += ", starting"
        return text + (", paused: the source is busy" if now.paused else "")

    def _binlog_line(self, now: Progress) -> str:
        oldest = self.history[0]
        elapsed = now.at - oldest.at
        applied = sum(now.changes.values()) - sum(oldest.changes.values())
        parts = [f"binlog   lag {now.lag:.1f} s" if now.lag is not None else "binlog   lag unknown"]
        parts.append(f"{applied / elapsed:,.0f} changes/s" if elapsed > 0 else "0 changes/s")
        if now.last_commit_age is not None:
            parts.append(f"last commit {now.last_commit_age:.0f} s ago")
        parts.append(f"at {now.committed}")
        if now.reconnecting is not None:
            seconds, attempts, error = now.reconnecting
            parts.append(f"reconnecting to the source for {_duration(seconds)} (attempt {attempts}: {error})")
        return ", ".join(parts)


class LiveProgress:
    """The block of progress lines at the bottom of a terminal, drawn again every `every` seconds on a thread."""

    def __init__(
        self,
        stream: TextIO,
        read: Callable[[], Progress] | None = None,
        every: float = 1.0,
    ) -> None:
        self.stream = stream
        self.read = read or (lambda: metrics.latest().progress())
        self.every = every
        self.view = ProgressView()
        self._lines: list[str] = []
        self._drawn = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest-progress", daemon=True)

    def start(self) -> LiveProgress:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.refresh()

    def refresh(self) -> None:
        lines = self.view.lines(self.read())
        with self._lock:
            self._lines = lines
            self._erase()
            self._draw()

    def write_above(self, text: str) -> None:
        """Write log output above the block (which is drawn again under it)."""
        with self._lock:
            self._erase()
            self.stream.write(text)
            self._draw()

    def stop(self) -> None:
        """Stop drawing; the last lines stay on the screen, followed by a new line."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.refresh()
        with self._lock:
            self._erase()
            self._draw(final=True)

    def _erase(self) -> None:
        # The cursor is at the end of the block's last line: up to its first, then clear to the screen's end.
        if self._drawn:
            self.stream.write(_UP_AND_CLEAR.format(n=self._drawn - 1) if self._drawn > 1 else _CLEAR_LINE)
            self._drawn = 0

    def _draw(self, final: bool = False) -> None:
        if self._lines:
            self.stream.write("\n".join(self._lines) + ("\n" if final else ""))
            self._drawn = 0 if final else len(self._lines)
        self.stream.flush()


class _AboveProgress(logging.Handler):
    """A stream handler's records, written above the live block."""

    def __init__(self, inner: logging.Handler, live: LiveProgress) -> None:
        super().__init__(inner.level)
        self.inner, self.live = inner, live
        self.setFormatter(inner.formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.live.write_above(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never fail the job
            self.handleError(record)


def is_terminal(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("TERM", "") not in ("", "dumb")


def _plain(every: float, stop: threading.Event) -> None:
    view = ProgressView()
    while not stop.wait(every):
        for line in view.lines(metrics.current().progress()):
            log.info("progress: %s", line)


@contextmanager
def showing_progress(mode: ProgressMode, stream: TextIO, plain_every: float = 30.0) -> Iterator[None]:
    """Show the run's progress for the block: `live` on the terminal `stream`, `plain` as log lines, `auto` live
    where `stream` is a terminal and plain elsewhere, `off` not at all."""
    if mode == "auto":
        mode = "live" if is_terminal(stream) else "plain"
    if mode == "off":
        yield
        return
    if mode == "plain":
        stop = threading.Event()
        thread = threading.Thread(target=_plain, args=(plain_every, stop), name="ingest-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)
        return
    live = LiveProgress(stream)
    root = logging.getLogger()
    swapped = _route_above(root.handlers, stream, live)
    root.handlers = swapped
    live.start()
    try:
        yield
    finally:
        live.stop()
        root.handlers = [h.inner if isinstance(h, _AboveProgress) else h for h in root.handlers]


def _route_above(handlers: Sequence[logging.Handler], stream: TextIO, live: LiveProgress) -> list[logging.Handler]:
    return [
        _AboveProgress(h, live) if isinstance(h, logging.StreamHandler) and h.stream is stream else h for h in handlers
    ]
