"""Reconnecting to the source after a lost connection: which errors are a lost connection, and how long to wait.

A streaming job runs for weeks; a restarted server, a failover, a proxy closing an idle connection or a killed
replication thread are routine there (issue 53). The binlog reader reopens its stream at its last transaction
boundary (`binlog.BinlogReader.transactions`), so what it hands over stays whole and in order, with backoff, for
at most `source.reconnect_seconds`; then it gives up with `SourceUnreachableError` (exit 4). Pure: no sockets.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pymysql

from ingest.backoff import next_wait
from ingest.errors import SourceConnectError, SourceUnreachableError

log = logging.getLogger(__name__)

LOST_CONNECTION_CODES = frozenset({1053, 1927, 2003, 2006, 2013, 2055})
"""Server shutdown in progress, connection killed, cannot connect, server gone away, connection lost (also a read
that timed out: a stalled stream), lost at a system call."""


def lost_connection(error: BaseException) -> bool:
    """The error says the connection to the server was lost or could not be made: retrying may succeed. PyMySQL's
    errors and mysqlclient's (the snapshot's fast driver) are told by their class name and the client's code."""
    if isinstance(error, SourceConnectError):
        return error.lost
    if isinstance(error, pymysql.err.InterfaceError):
        return True  # a closed connection used again
    if type(error).__name__ == "OperationalError":
        return bool(error.args) and error.args[0] in LOST_CONNECTION_CODES
    return isinstance(error, ConnectionError | TimeoutError | EOFError)


def stall_timeout(heartbeat_seconds: float) -> float:
    """The read timeout that notices a stalled stream: the server sends a heartbeat every `heartbeat_seconds` when
    it has nothing else to send, so three missed heartbeats (at least 5 s) mean the connection is dead."""
    return max(3 * heartbeat_seconds, 5.0)


@dataclass
class Reconnect:
    """The reconnects of one reader: a streak of failures begins at the first and ends when data flows again."""

    budget_seconds: float
    where: str
    """The server, as `host:port`."""
    lost: str = "the binlog connection"
    """What was lost, for the message that gives up."""
    clock: Callable[[], float] = time.monotonic
    since: float | None = None
    since_wall: float | None = None
    """When the streak began, in seconds since the epoch (for other processes: `publish`)."""
    attempts: int = 0
    last_error: str = ""
    _jitter: random.Random = field(default_factory=random.Random)

    def recovered(self) -> None:
        """Data flowed again: a later failure starts a new streak with the whole budget."""
        self.since, self.since_wall, self.attempts = None, None, 0

    def next_wait(self, error: BaseException, kept: str) -> float:
        """The seconds to wait before the next attempt after `error`; SourceUnreachableError once the budget is
        spent, its message ending with `kept` (what stays, and where the next run resumes). See ingest.backoff."""
        now = self.clock()
        if self.since is None:
            self.since, self.since_wall = now, time.time()
        self.attempts += 1
        self.last_error = _one_line(error)
        spent = now - self.since
        if spent >= self.budget_seconds:
            raise SourceUnreachableError(
                f"lost {self.lost} to the source at {self.where} and could not read it again for "
                f"{spent:.0f} s ({self.attempts - 1} reconnect attempts, `source.reconnect_seconds` is "
                f"{self.budget_seconds:g}): {self.last_error}. {kept}"
            )
        return next_wait(self.attempts, self.budget_seconds - spent, self._jitter)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:300]


def publish(path: Path, reconnect: Reconnect) -> None:
    """Write `reconnect`'s streak to `path` for the job's other process (the binlog source runs in a Python process
    of Spark's own, on the driver's host); remove it once the streak is over. Replaced whole: a reader never sees
    half a file."""
    status = {"since": reconnect.since_wall, "attempts": reconnect.attempts, "last_error": reconnect.last_error}
    part = path.with_name(path.name + ".part")
    try:
        if reconnect.since_wall is None:
            path.unlink(missing_ok=True)
            return
        part.write_text(json.dumps(status))
        os.replace(part, path)
    except OSError as e:  # the run's scratch directory is gone (the job is ending): only the metrics miss it
        log.debug("cannot say the reader is reconnecting in %s: %s", path, e)


def read_published(path: Path) -> tuple[float, int, str] | None:
    """The streak `publish` wrote at `path` (since when, in seconds since the epoch; attempts; the last error), as
    ingest.metrics reads it, or None when none is under way."""
    try:
        status = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return float(status["since"]), int(status["attempts"]), str(status["last_error"])
