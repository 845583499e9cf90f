"""What a monitoring system scrapes from a running job: counters and gauges the snapshot and the binlog
phase keep, served in the Prometheus text exposition format (version 0.0.4) on `metrics.port` (docs/config.md).

The format is a few lines of text per metric, so it is written here with the standard library (`http.server`
on a daemon thread) rather than with a client library. This module imports nothing else of the job: the sink
counts its commit retries here without depending on the job's layer.

One `JobMetrics` is current per process (`current()`), as a logger is: the job installs a fresh one for each run
(`recording`), and the places that count (the snapshot's commits, the binlog phase's batch commit, the MERGE
retry loop) report to it whether or not a port is open. Bookkeeping is a dictionary update under a lock.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ingest.model.position import BinlogPosition

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROBE_CACHE_SECONDS = 1.0
"""Scrapes closer together than this share one look at the source's binlog."""

MetricKind = Literal["counter", "gauge", "summary"]


@dataclass(frozen=True)
class MetricFamily:
    """One metric: its name, type, help line and samples (a sample name suffix such as `_sum`, labels, value)."""

    name: str
    kind: MetricKind
    help: str
    samples: list[tuple[str, Mapping[str, str], float]] = field(default_factory=list)


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def render(families: Sequence[MetricFamily]) -> str:
    """The Prometheus text format of `families`: HELP and TYPE lines, then one line per sample."""
    lines = []
    for family in families:
        help_text = family.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {family.name} {help_text}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for suffix, labels, value in family.samples:
            text = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
            lines.append(
                f"{family.name}{suffix}{{{text}}} {_number(value)}"
                if text
                else f"{family.name}{suffix} {_number(value)}"
            )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Progress:
    """What the job has done so far, as the progress display reads it."""

    at: float
    """When it was read (monotonic seconds)."""
    chunks: Mapping[str, tuple[int, int]]
    """Per source table: snapshot chunks done (earlier runs included), planned."""
    rows: Mapping[str, int]
    """Per source table: rows the snapshot copied in this run."""
    changes: Mapping[str, int]
    """Per source table: binlog changes applied in this run."""
    committed: str | None
    """The binlog offset every table holds, once the binlog phase has one."""
    lag: float | None
    """Seconds since the source was at the committed offset (its last transaction's commit, or a heartbeat)."""
    last_commit_age: float | None
    """Seconds since the last binlog batch was committed."""
    paused: bool
    """The snapshot waits for a busy source (`snapshot.max_source_load`)."""
    reconnecting: Reconnecting | None = None
    """The binlog reader is reconnecting to the source: for how many seconds, attempts, last error."""


Reconnecting = tuple[float, int, str]
"""A reader reconnecting to the source: since when (seconds since the epoch), attempts so far, the last error."""

BytesBehindProbe = Callable[["BinlogPosition"], "int | None"]
"""Binlog bytes from a committed position to the server's current end (None when they cannot be counted)."""


class JobMetrics:
    """The numbers of one run of the job, updated by the threads that do the work, read by scrapes."""

    def __init__(
        self,
        pipeline: str = "",
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pipeline = pipeline
        self._clock, self._monotonic = clock, monotonic
        self._paused = 0
        """Snapshot readers paused by `snapshot.max_source_load` now (one at a time in practice)."""
        self._paused_since: float | None = None
        self._throttled_seconds = 0.0
        self._lock = threading.Lock()
        self._snapshot_rows: dict[str, int] = {}
        self._chunks: dict[str, tuple[int, int]] = {}
        self._changes: dict[str, int] = {}
        self._retries: dict[str, int] = {}
        self._batches = 0
        self._batch_seconds = 0.0
        self._last_batch_seconds: float | None = None
        self._committed: BinlogPosition | None = None
        self._source_time: float | None = None
        self._last_batch_at: float | None = None
        self.bytes_behind_probe: BytesBehindProbe | None = None
        """Set by the job: asked at scrape time (at most once per PROBE_CACHE_SECONDS) for the bytes behind."""
        self._probed: tuple[float, BinlogPosition, int | None] | None = None
        self._probe_error: str | None = None
        self.reconnecting_probe: Callable[[], Reconnecting | None] | None = None
        """Set by the job: whether the binlog reader (in another process) is reconnecting to the source."""
        self.reconnect_file: str | None = None
        """Set by the job: where the binlog reader says it is reconnecting (what `reconnecting_probe` reads)."""

    # -- what the job reports

    def snapshot_progress(self, table: str, done: int, planned: int) -> None:
        """The table's snapshot has `done` of its `planned` chunks copied (counting earlier runs)."""
        with self._lock:
            self._chunks[table] = (done, planned)

    def rows_copied(self, table: str, rows: int) -> None:
        """A snapshot commit appended `rows` rows of the table."""
        with self._lock:
            self._snapshot_rows[table] = self._snapshot_rows.get(table, 0) + rows

    def offset_committed(self, position: BinlogPosition, source_time: float | None) -> None:
        """Every captured table holds the binlog up to `position`; the source was there at `source_time`."""
        with self._lock:
            self._committed = position
            if source_time is not None:
                self._source_time = source_time

    def batch_committed(
        self, changes: Mapping[str, int], seconds: float, position: BinlogPosition, source_time: float | None
    ) -> None:
        """A binlog batch applied `changes` (row changes per source table) and was recorded in `seconds`."""
        with self._lock:
            for table, n in changes.items():
                self._changes[table] = self._changes.get(table, 0) + n
            self._batches += 1
            self._batch_seconds += seconds
            self._last_batch_seconds = seconds
            self._last_batch_at = self._clock()
        self.offset_committed(position, source_time)

    def snapshot_paused(self, paused: bool) -> None:
        """The snapshot began (True) or ended (False) a pause for a busy source (`snapshot.max_source_load`)."""
        with self._lock:
            now = self._monotonic()
            if paused:
                self._paused += 1
                if self._paused == 1:
                    self._paused_since = now
            elif self._paused > 0:
                self._paused -= 1
                if self._paused == 0 and self._paused_since is not None:
                    self._throttled_seconds += now - self._paused_since
                    self._paused_since = None

    def commit_retried(self, target: str) -> None:
        """A commit to the Iceberg table `target` conflicted with another writer and is tried again."""
        with self._lock:
            self._retries[target] = self._retries.get(target, 0) + 1

    # -- what a scrape, or the progress display, reads

    def progress(self) -> Progress:
        """The counters now, for the progress display (ingest.commands.progress); asks nothing of the source."""
        with self._lock:
            return Progress(
                at=self._monotonic(),
                chunks=dict(self._chunks),
                rows=dict(self._snapshot_rows),
                changes=dict(self._changes),
                committed=None if self._committed is None else str(self._committed),
                lag=None if self._source_time is None else max(0.0, self._clock() - self._source_time),
                last_commit_age=None if self._last_batch_at is None else max(0.0, self._clock() - self._last_batch_at),
                paused=self._paused > 0,
                reconnecting=self._reconnecting_for(),
            )

    def _reconnecting_for(self) -> Reconnecting | None:
        """`reconnecting()` with the seconds it has lasted in place of when it began."""
        status = self.reconnecting()
        return None if status is None else (max(0.0, self._clock() - status[0]), status[1], status[2])

    def reconnecting(self) -> Reconnecting | None:
        """Whether the binlog reader is reconnecting to the source now (asks no server: a file on this host)."""
        probe = self.reconnecting_probe
        return None if probe is None else probe()

    def bytes_behind(self) -> int | None:
        """Binlog bytes from the committed offset to the server's end, asked of the source (cached briefly)."""
        with self._lock:
            committed, probed = self._committed, self._probed
        probe = self.bytes_behind_probe
        if committed is None or probe is None:
            return None
        now = time.monotonic()
        if probed is not None and probed[1] == committed and now - probed[0] < PROBE_CACHE_SECONDS:
            return probed[2]
        try:
            behind = probe(committed)
        except Exception as e:  # noqa: BLE001 - a scrape must answer while the source is away
            if str(e) != self._probe_error:
                log.warning("metrics: cannot read the source's binlog end for bytes behind: %s", e)
            self._probe_error = str(e)
            return None
        self._probe_error = None
        with self._lock:
            self._probed = (now, committed, behind)
        return behind

    def families(self) -> list[MetricFamily]:
        behind = self.bytes_behind()  # outside the lock: it may wait on the source
        reconnecting = self.reconnecting()
        with self._lock:
            info = MetricFamily(
                "ingest_pipeline_info",
                "gauge",
                "The pipeline this job runs (always 1).",
                [("", {"pipeline": self.pipeline}, 1)],
            )
            return [info, *self._snapshot_families(), *self._binlog_families(behind), *_source_families(reconnecting)]

    def _snapshot_families(self) -> list[MetricFamily]:
        throttled = self._throttled_seconds
        if self._paused_since is not None:  # the pause in progress counts up to now
            throttled += self._monotonic() - self._paused_since
        return [
            MetricFamily(
                "ingest_snapshot_rows_total",
                "counter",
                "Rows the snapshot copied into the target, per source table, since the job started.",
                _per("table", self._snapshot_rows),
            ),
            MetricFamily(
                "ingest_snapshot_chunks_done",
                "gauge",
                "Chunks of the table's snapshot copied, by this run and earlier ones.",
                _per("table", {t: d for t, (d, _) in self._chunks.items()}),
            ),
            MetricFamily(
                "ingest_snapshot_chunks_planned",
                "gauge",
                "Chunks the table's snapshot is split into.",
                _per("table", {t: p for t, (_, p) in self._chunks.items()}),
            ),
            MetricFamily(
                "ingest_snapshot_paused",
                "gauge",
                "1 while the snapshot waits for a busy source (snapshot.max_source_load), else 0.",
                [("", {}, 1 if self._paused else 0)],
            ),
            MetricFamily(
                "ingest_snapshot_throttled_seconds_total",
                "counter",
                "Seconds the snapshot waited for a busy source (snapshot.max_source_load) since the job started.",
                [("", {}, round(throttled, 3))],
            ),
        ]

    def _binlog_families(self, behind: int | None) -> list[MetricFamily]:
        lag: float | None = None
        if behind == 0:
            lag = 0.0  # the source is where the job committed: nothing is missing (as `ingest status` says)
        elif self._source_time is not None:
            lag = max(0.0, round(self._clock() - self._source_time, 3))
        return [
            MetricFamily(
                "ingest_binlog_changes_applied_total",
                "counter",
                "Binlog row changes applied to the target (MERGE or append), per source table, since the job started.",
                _per("table", self._changes),
            ),
            MetricFamily(
                "ingest_commit_retries_total",
                "counter",
                "Iceberg commits tried again after a conflict with another writer, per Iceberg table.",
                _per("target", self._retries),
            ),
            MetricFamily(
                "ingest_batch_duration_seconds",
                "summary",
                "Time to commit a binlog batch: every table's MERGE and the state table's offset.",
                [("_sum", {}, self._batch_seconds), ("_count", {}, self._batches)],
            ),
            MetricFamily(
                "ingest_last_batch_duration_seconds",
                "gauge",
                "Time the last binlog batch took to commit.",
                [] if self._last_batch_seconds is None else [("", {}, self._last_batch_seconds)],
            ),
            MetricFamily(
                "ingest_lag_seconds",
                "gauge",
                "0 when the committed offset is the source's binlog end, else seconds since the source was last "
                "known to be at it (the commit time of the last committed transaction, or an idle heartbeat's).",
                [] if lag is None else [("", {}, lag)],
            ),
            MetricFamily(
                "ingest_binlog_bytes_behind",
                "gauge",
                "Binlog bytes from the committed offset to the source's binlog end (SHOW BINARY LOGS sizes).",
                [] if behind is None else [("", {}, behind)],
            ),
        ]

    def exposition(self) -> str:
        return render(self.families())


def _per(label: str, values: Mapping[str, float]) -> list[tuple[str, Mapping[str, str], float]]:
    return [("", {label: k}, v) for k, v in sorted(values.items())]


def _source_families(reconnecting: Reconnecting | None) -> list[MetricFamily]:
    since, attempts, error = reconnecting or (None, 0, "")
    return [
        MetricFamily(
            "ingest_source_reconnecting",
            "gauge",
            "1 while the binlog reader reconnects to the source (a restarted server, a killed, reset or stalled "
            "connection), labelled with the last error; else 0.",
            [("", {"error": error} if reconnecting else {}, 1 if reconnecting else 0)],
        ),
        MetricFamily(
            "ingest_source_reconnect_attempts",
            "gauge",
            "Attempts of the reconnect under way (0 when none is).",
            [("", {}, attempts)],
        ),
        MetricFamily(
            "ingest_source_reconnecting_since_seconds",
            "gauge",
            "When the reconnect under way began, in seconds since the epoch (absent when none is).",
            [] if since is None else [("", {}, since)],
        ),
    ]


_outside_runs = JobMetrics()
_current = _outside_runs
_last_run: JobMetrics | None = None


def current() -> JobMetrics:
    """The metrics of the run in progress (a throwaway one outside a run)."""
    return _current


def latest() -> JobMetrics:
    """The metrics of the run in progress, else of the last run that ended (for a last look at its progress)."""
    return _last_run if _current is _outside_runs and _last_run is not None else _current


@contextmanager
def recording(metrics: JobMetrics) -> Iterator[JobMetrics]:
    """Make `metrics` current for the block (a run of the job), then put the previous one back."""
    global _current, _last_run
    previous, _current = _current, metrics
    try:
        yield metrics
    finally:
        _current, _last_run = previous, metrics


class _Handler(BaseHTTPRequestHandler):
    server: _MetricsHTTPServer

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is served")
            return
        try:
            body = self.server.metrics.exposition().encode()
        except Exception as e:  # noqa: BLE001 - a failed scrape must not stop the server
            log.warning("metrics: cannot render the metrics: %s", e)
            self.send_error(500, "cannot render the metrics")
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        log.debug("metrics: %s - %s", self.address_string(), format % args)


class _MetricsHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], metrics: JobMetrics) -> None:
        self.metrics = metrics
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


class MetricsServer:
    """Serves `metrics` at http://HOST:PORT/metrics on a daemon thread until closed."""

    def __init__(self, metrics: JobMetrics, host: str, port: int) -> None:
        self._httpd = _MetricsHTTPServer((host, port), metrics)
        self.host, self.port = host, int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="metrics-http", daemon=True
        )
        self._thread.start()
        log.info("metrics: serving http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
