"""Waiting out an outage of the sink: the catalog's database, the REST catalog server or the object store
restarted, refusing connections or answering 503 while a binlog batch commits (issue 53).

Whether an error says the sink could not be reached is read from its type and text: the same outage reaches the
job as a pyarrow `OSError` (S3), a SQLAlchemy or requests error (pyiceberg's catalogs), or a Java exception
through Spark (Iceberg's `S3FileIO`, `JdbcCatalog`, `RESTCatalog`). A batch's commit may be run again whole: each
target skips a batch it already holds (its offset in the snapshot summary), as after a crash, so a commit whose
outcome was unknown is settled by looking, never applied twice. Pure: no I/O of its own.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ingest.backoff import next_wait
from ingest.errors import IngestError, SinkUnreachableError

log = logging.getLogger(__name__)

T = TypeVar("T")

_UNREACHABLE = re.compile(
    "|".join(
        [
            r"Connection refused",
            r"Connection reset",
            r"Broken pipe",
            r"Could not connect to server",
            r"Failed to connect to",
            r"NETWORK_CONNECTION",  # the AWS SDK for C++ (pyarrow's S3)
            r"Unable to execute HTTP request",  # the AWS SDK for Java (S3FileIO)
            r"Service ?Unavailable|SERVICE_UNAVAILABLE|Slow ?Down|SLOW_DOWN|Status Code: 50[0234]\b",
            r"HTTP status 50[0234]\b",  # pyarrow S3, a HEAD answered 503 (no body to name the code)
            r"server closed the connection unexpectedly",  # PostgreSQL, through psycopg2
            r"terminating connection due to administrator command",
            r"the database system is (?:shutting down|starting up|in recovery mode)",
            r"This connection has been closed",  # PostgreSQL, through its JDBC driver
            r"An I/O error occurred while sending to the backend",
            r"Connection to \S+ refused",
            r"Remote end closed connection|RemoteDisconnected|Max retries exceeded with url",  # requests (REST)
            r"CommitStateUnknownException",  # the commit may have landed: the retry looks first
        ]
    ),
    re.IGNORECASE,
)


def sink_unreachable(error: BaseException) -> bool:
    """The error says a server of the sink could not be reached, or answered that it is unavailable for now."""
    if isinstance(error, IngestError):
        return False  # the job's own verdicts are never retried here
    if isinstance(error, ConnectionError):
        return True
    return bool(_UNREACHABLE.search(f"{type(error).__name__}: {error}"))


class OutageWaitStopped(Exception):
    """The job was asked to stop while it waited for the sink: the batch is left for the next run."""


@dataclass
class SinkOutage:
    """Runs a commit again while the sink cannot be reached, with backoff, for at most `budget_seconds`."""

    budget_seconds: float
    stopping: Callable[[], bool] = lambda: False
    """Polled while waiting: True ends the wait with `OutageWaitStopped`."""
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _jitter: random.Random = field(default_factory=random.Random)

    def run(self, what: str, action: Callable[[bool], T]) -> T:
        """`action(again)`; run again, with `again` true, after an error `sink_unreachable` accepts. `what` names it
        in the log and in the one line of `SinkUnreachableError` the job ends with once the budget is spent."""
        since: float | None = None
        attempts = 0
        while True:
            try:
                result = action(attempts > 0)
            except Exception as e:
                if not sink_unreachable(e):
                    raise
                now = self.clock()
                since = now if since is None else since
                attempts += 1
                self._wait(what, e, attempts, now - since)
                continue
            if attempts:
                log.warning("%s: the sink is back after %d attempt(s)", what, attempts)
            return result

    def _wait(self, what: str, error: BaseException, attempts: int, spent: float) -> None:
        error_text = _one_line(error)
        if spent >= self.budget_seconds:
            raise SinkUnreachableError(
                f"could not reach the sink while {what} for {spent:.0f} s ({attempts - 1} retries, "
                f"`sink.reconnect_seconds` is {self.budget_seconds:g}): {error_text}. Everything committed before "
                "stays; `ingest run` resumes there once the catalog and the storage are back"
            )
        wait = next_wait(attempts, self.budget_seconds - spent, self._jitter)
        log.warning(
            "%s: the sink cannot be reached (%s); trying again in %.1f s (attempt %d)", what, error_text, wait, attempts
        )
        deadline = self.clock() + wait
        while self.clock() < deadline:
            if self.stopping():
                raise OutageWaitStopped(f"asked to stop while {what} waited for the sink")
            self.sleep(min(0.2, max(0.0, deadline - self.clock())))


def _one_line(error: BaseException) -> str:
    """The line of the error that says what could not be reached, else its first line (Spark's errors carry a
    Java trace, whose cause is further down)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = next((line for line in lines if _UNREACHABLE.search(line)), lines[0] if lines else "")
    return f"{type(error).__name__}: {said}"[:300]
