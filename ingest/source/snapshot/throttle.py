"""A snapshot that yields to a busy source (`snapshot.max_source_load`, docs/config.md).

Before the driver hands the next chunks to the chunk readers it samples the source: `Threads_running` and,
when bounded, a replica's lag behind its primary. Above a bound it waits, sampling again after a wait that
doubles up to a ceiling, and reads on once the source is back at or below every bound. A pause only delays
the next read: chunks already committed, their watermarks and the batch being read are untouched.

The decision (`overload`, `SourceThrottle`) is plain Python with the sample, the clock and the wait passed in;
`read_source_load` and `check_load_probe` are the two places that ask the server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pymysql

from ingest import metrics
from ingest.config import SourceConfig, SourceLoadLimit
from ingest.errors import MissingPrivilegeError
from ingest.source.mysql import connect

log = logging.getLogger(__name__)

ER_PARSE_ERROR = 1064
ER_SPECIFIC_ACCESS_DENIED_ERROR = 1227
ER_ACCESS_DENIED_ERROR = 1045
_REPLICA_STATUS = ("SHOW REPLICA STATUS", "SHOW SLAVE STATUS")  # the second before MySQL 8.0.22 / MariaDB 10.5.1
_LAG_COLUMNS = ("Seconds_Behind_Master", "Seconds_Behind_Source")


@dataclass(frozen=True)
class SourceLoad:
    """One sample of how busy the source is."""

    threads_running: int
    """`SHOW GLOBAL STATUS LIKE 'Threads_running'` (the sampling session itself counts as one)."""
    replica_lag_seconds: float | None = None
    """`Seconds_Behind_Master`; None when not asked, not a replica, or its replication is not running."""


def overload(load: SourceLoad, limit: SourceLoadLimit) -> str | None:
    """What is above its bound in `load` ("Threads_running 37 > 20"), or None when reading may go on."""
    reasons = []
    if limit.threads_running is not None and load.threads_running > limit.threads_running:
        reasons.append(f"Threads_running {load.threads_running} > {limit.threads_running}")
    lag, bound = load.replica_lag_seconds, limit.replica_lag_seconds
    if bound is not None and lag is not None and lag > bound:
        reasons.append(f"replica lag {lag:g} s > {bound:g} s")
    return ", ".join(reasons) or None


def describe(load: SourceLoad, limit: SourceLoadLimit) -> str:
    """The sampled values next to their bounds, for the line that says the snapshot goes on."""
    parts = []
    if limit.threads_running is not None:
        parts.append(f"Threads_running {load.threads_running} <= {limit.threads_running}")
    if limit.replica_lag_seconds is not None:
        lag = "unknown" if load.replica_lag_seconds is None else f"{load.replica_lag_seconds:g} s"
        parts.append(f"replica lag {lag}")
    return ", ".join(parts)


def backoff(limit: SourceLoadLimit, waits: int) -> float:
    """Seconds to wait before the sample after `waits` waits of the same pause: doubling from `check_seconds`."""
    return float(min(limit.check_seconds * 2 ** min(waits, 32), limit.max_check_seconds))


class SourceThrottle:
    """Holds the snapshot back while the source is above `limit`; one object per reader of chunks, so a pause is
    logged once when it begins and once when it ends, and its seconds are counted in the job's metrics."""

    def __init__(
        self,
        limit: SourceLoadLimit,
        sample: Callable[[], SourceLoad],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.sample, self.clock = limit, sample, clock
        self.paused_seconds = 0.0
        """Seconds of the pauses this throttle ended (`seconds()` adds the one in progress)."""
        self._paused_since: float | None = None
        self._waits = 0

    @property
    def paused(self) -> bool:
        return self._paused_since is not None

    def ready(self, what: str = "") -> bool:
        """Sample once: True when the next chunks may be read, False (a pause begun or going on) otherwise."""
        load = self.sample()
        reason = overload(load, self.limit)
        now = self.clock()
        if reason is not None:
            if self._paused_since is None:
                self._paused_since, self._waits = now, 0
                metrics.current().snapshot_paused(True)
                log.info("snapshot paused: %s%s", reason, _about(what))
            return False
        if self._paused_since is not None:
            pause = now - self._paused_since
            self._end(now)
            log.info("snapshot resumed after %.1f s paused (%s)%s", pause, describe(load, self.limit), _about(what))
        return True

    def wait(self, stop: threading.Event, what: str = "") -> bool:
        """Return once the source is at or below every bound (True), or as soon as `stop` is set (False)."""
        while not stop.is_set():
            if self.ready(what):
                return True
            delay = backoff(self.limit, self._waits)
            self._waits += 1
            if stop.wait(delay):
                break
        if self._paused_since is not None:
            self._end(self.clock())
            log.info("snapshot pause ended by the stop signal; nothing more is read")
        return False

    def _end(self, now: float) -> None:
        assert self._paused_since is not None
        self.paused_seconds += now - self._paused_since
        self._paused_since = None
        metrics.current().snapshot_paused(False)

    def seconds(self) -> float:
        """`paused_seconds` with the pause in progress counted up to now."""
        since = self._paused_since
        return self.paused_seconds + (0.0 if since is None else self.clock() - since)


def _about(what: str) -> str:
    return f" ({what})" if what else ""


def read_source_load(conn: Any, replica_lag: bool) -> SourceLoad:
    """Sample the source on `conn` (a PyMySQL connection); the replica's lag only when `replica_lag`."""
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS LIKE 'Threads_running'")
        row = cur.fetchone()
    threads = int(row[1]) if row else 0
    lag = None
    if replica_lag:
        status = replica_status(conn)
        lag = _lag_of(status) if status is not None else None
    return SourceLoad(threads, lag)


def replica_status(conn: Any) -> dict[str, Any] | None:
    """The first row of `SHOW REPLICA STATUS` (or `SHOW SLAVE STATUS` on servers that lack that spelling) by
    column name; None when the server is not a replica."""
    for statement in _REPLICA_STATUS:
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
                row = cur.fetchone()
                names = [d[0] for d in cur.description or ()]
        except pymysql.err.ProgrammingError as e:
            if e.args and e.args[0] == ER_PARSE_ERROR and statement != _REPLICA_STATUS[-1]:
                continue
            raise
        return dict(zip(names, row, strict=False)) if row else None
    return None


def _lag_of(status: dict[str, Any]) -> float | None:
    for column in _LAG_COLUMNS:
        if status.get(column) is not None:
            return float(status[column])
    return None  # NULL: the replica's SQL or IO thread is not running, so its lag is unknown


def check_load_probe(conn: Any, limit: SourceLoadLimit, flavor: str) -> None:
    """At start: every bound of `limit` can be sampled by the CDC user; a lag bound it cannot read is refused
    (the snapshot would otherwise read on at full speed, the very thing the bound is there to prevent)."""
    read_source_load(conn, replica_lag=False)
    if limit.replica_lag_seconds is None:
        return
    try:
        status = replica_status(conn)
    except pymysql.err.MySQLError as e:
        code = e.args[0] if e.args else None
        if code not in (ER_SPECIFIC_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_ERROR):
            raise
        grant = "SLAVE MONITOR" if flavor == "mariadb" else "REPLICATION CLIENT"
        raise MissingPrivilegeError(
            "`snapshot.max_source_load.replica_lag_seconds` needs the source's replication lag, but the CDC user may "
            f"not read it (SHOW REPLICA STATUS: {e.args[-1] if e.args else e}); run: GRANT {grant} ON *.* TO <cdc user>"
            ", or remove `replica_lag_seconds` (the job does not snapshot unbounded when a bound was asked for)"
        ) from None
    if status is None:
        log.warning(
            "`snapshot.max_source_load.replica_lag_seconds`: the source is not a replica (SHOW REPLICA STATUS is "
            "empty); its lag is checked should it become one"
        )
    elif _lag_of(status) is None:
        log.warning(
            "`snapshot.max_source_load.replica_lag_seconds`: the source's replication is not running "
            "(Seconds_Behind_Master is NULL); the lag bound applies once it runs"
        )


def source_throttle(source: SourceConfig, limit: SourceLoadLimit | None) -> SourceThrottle | None:
    """The snapshot's throttle, sampling on a session of its own per sample (a pause may outlast an idle session's
    timeout); None without a limit (`snapshot.max_source_load`)."""
    if limit is None:
        return None
    lag = limit.replica_lag_seconds is not None

    def sample() -> SourceLoad:
        with connect(source) as conn:
            return read_source_load(conn, lag)

    return SourceThrottle(limit, sample)
