"""Soak: the job running for a long time under a steady mixed load, sampled for growth of memory, files and lag.

    .venv/bin/python -m bench.soak [--minutes 60] [--rate 500] [--sample-seconds 30]
                                   [--interval 5] [--initial-rows 20000] [--keep-logs]

Starts a private MariaDB with the three tables of `bench.binlog` (`bench.orders`, `bench.customers`,
`bench.events`), then runs the job as a user does, `ingest run --config soak.yaml`, in a child process of its
own session: it snapshots the tables and follows the binlog until SIGTERM, with `metrics.port` on a free port
and `sink.maintenance` at its defaults. Once the job is in the binlog phase a writer thread offers `--rate`
single-row transactions per second (inserts, updates and deletes over the three tables, the row counts
staying level) for `--minutes`. Each second the job's `/metrics` is scraped and its process tree's RSS read;
every `--sample-seconds` the Iceberg tables are counted (data files, delete files, snapshots, metadata.json
files) with pyiceberg. At the end the writer stops, the job gets SIGTERM, and `ingest verify` compares MySQL
and Iceberg. Printed: a line per sample and the flatness figures (least-squares slopes over each half of the
run, last-quarter mean / first-quarter mean). Nothing here asserts on timing. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlparse

from bench.binlog import (
    ORDER_COLUMNS,
    STATUSES,
    TABLES,
    US_NOW,
    KeySpace,
    create_tables,
    event_key,
    lag_stats,
    load_initial,
    source_counts,
)
from bench.snapshot import (
    CDC_USER,
    CPU_METHOD,
    DATABASE,
    MIB,
    PASSWORD_ENV,
    ROOT,
    BenchError,
    PacedWriter,
    _category,
    _fmt,
    _positive,
    _progress,
    host_info,
    mariadb_cpu,
    process_tree,
    proportional_set_size,
    spark_section,
    tree_cpu,
    write_results,
)
from ingest.config import MaintenanceConfig, PipelineConfig, StreamConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.process import free_port

PIPELINE = "bench_soak"
JOB_SERVER_ID = 5403
SCRAPE_SECONDS = 1.0
"""How often `/metrics` is scraped and the job's tree's RSS read."""
READY_TIMEOUT_SECONDS = 900.0
"""Spark start, discovery and the snapshot must be over within this; else the soak gives up."""
STOP_TIMEOUT_SECONDS = 600.0
MIX = (
    ("orders", "insert"),
    ("orders", "update"),
    ("orders", "delete"),
    ("orders", "update"),
    ("orders", "update"),
    ("events", "insert"),
    ("events", "update"),
    ("events", "delete"),
    ("customers", "update"),
    ("customers", "update"),
)
"""The writer's cycle of statements: 2 inserts, 6 updates, 2 deletes in 10; the tables keep their row counts."""
FLAT_KEYS = (
    ("rss_mib", "tree RSS", "MiB"),
    ("jvm_rss_mib", "JVM RSS", "MiB"),
    ("open_fds", "open descriptors (tree)", "descriptors"),
    ("data_files", "data files", "files"),
    ("delete_files", "delete files", "files"),
    ("snapshots", "snapshots (targets)", "snapshots"),
    ("state_snapshots", "snapshots (state table)", "snapshots"),
    ("metadata_files", "metadata.json files", "files"),
    ("lag_p95_s", "lag p95", "s"),
)
"""The sample fields the flatness figures are computed for: key, label, unit."""
MAINTENANCE_LINE = re.compile(r": maintenance in [0-9.]+ s")
WARNING_LINE = re.compile(r" (WARNING|ERROR) ingest")


# ---------------------------------------------------------------------------------------------------
# The pipeline and the job's process.


def pipeline_document(host: str, port: int, warehouse: Path, interval: float, metrics_port: int) -> dict[str, Any]:
    """The pipeline file (as a document) of the soak: the three tables into an embedded warehouse, maintenance at
    its defaults, the metrics endpoint on `metrics_port`."""
    return {
        "name": PIPELINE,
        "source": {
            "host": host,
            "port": port,
            "user": CDC_USER,
            "password": {"env": PASSWORD_ENV},
            "flavor": "mariadb",
            "server_id": JOB_SERVER_ID,
        },
        "tables": {"include": [rf"{DATABASE}\.({'|'.join(TABLES)})"]},
        "sink": {
            "catalog_name": "lake",
            "catalog": {
                "type": "jdbc",
                "uri": f"jdbc:sqlite:{warehouse}/catalog.db",
                "warehouse": f"file://{warehouse}/warehouse",
            },
        },
        "snapshot": {"parallelism": 2},
        "spark": spark_section("local[2]"),
        "stream": {"batch_interval_seconds": interval},
        "metrics": {"port": metrics_port},
    }


class JobProcess:
    """`python -m ingest.cli run --config FILE` in its own session (the job exactly as a user runs it); its output
    goes to a log file. Its process tree (driver, JVM, Python workers) is what the soak measures."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # closed in wait() or __exit__
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", "run", "--config", str(config_path)],
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a kill on failure reaches its JVM and Python workers too
        )
        self._read_to = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        """SIGTERM to the driver only: the job stops after reading what the source wrote before it."""
        os.kill(self.proc.pid, signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None (and the tree killed) if it did not exit within `timeout`."""
        try:
            code: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        self._log.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def new_log_lines(self) -> list[str]:
        """The lines the job logged since the last call."""
        with open(self.log_path, "rb") as f:
            f.seek(self._read_to)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line being written stays for the next call
        self._read_to += end
        return data[:end].decode(errors="replace").splitlines()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> JobProcess:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.kill()
        if not self._log.closed:
            self._log.close()


# ---------------------------------------------------------------------------------------------------
# The offered load.


class MixedWriter(PacedWriter):
    """Single-row autocommit statements at about `rate` per second, cycling through MIX: new orders and events
    at the top of their key ranges, deletes of the oldest, updates of random live keys, customer updates."""

    def __init__(self, server: MariaDBServer, keys: KeySpace, rate: float) -> None:
        super().__init__(server, rate, "mixed-writer")
        self.keys = keys
        self.by_kind: dict[str, int] = {"insert": 0, "update": 0, "delete": 0}
        self._rng = random.Random(20261125)
        db = DATABASE
        self._sql = {
            ("orders", "insert"): f"INSERT INTO {db}.orders ({ORDER_COLUMNS}) "
            f"VALUES (%s, %s, 'new', 1.00, NOW(6), {US_NOW}, 'soak')",
            ("orders", "update"): f"UPDATE {db}.orders SET status = %s, amount = IFNULL(amount, 0) + 1, "
            f"updated_us = {US_NOW} WHERE id = %s",
            ("orders", "delete"): f"DELETE FROM {db}.orders WHERE id = %s",
            ("events", "insert"): f"INSERT INTO {db}.events (event_key, kind, payload, score, seen_at, n) "
            "VALUES (%s, 'view', %s, %s, NOW(3), %s)",
            ("events", "update"): f"UPDATE {db}.events SET n = n + 1, score = IFNULL(score, 0) + 0.5, "
            "seen_at = NOW(3) WHERE event_key = %s",
            ("events", "delete"): f"DELETE FROM {db}.events WHERE event_key = %s",
            ("customers", "update"): f"UPDATE {db}.customers SET balance = balance + 1, tier = (tier + 1) %% 5, "
            "updated_at = NOW(6) WHERE id = %s",
        }

    def write(self, cur: Any) -> None:
        table, kind = MIX[self.written % len(MIX)]
        k = self.keys
        params: tuple[Any, ...]
        if table == "orders":
            if kind == "insert":
                params = (k.orders_hi, k.orders_hi % 5000 + 1)
                k.orders_hi += 1
            elif kind == "delete":
                params = (k.orders_lo,)
                k.orders_lo += 1
            else:
                params = (self._rng.choice(STATUSES), self._rng.randrange(k.orders_lo, k.orders_hi))
        elif table == "events":
            if kind == "insert":
                n = k.events_hi
                params = (event_key(n), f'{{"n":{n}}}', None if n % 7 == 0 else n / 3, n)
                k.events_hi += 1
            elif kind == "delete":
                params = (event_key(k.events_lo),)
                k.events_lo += 1
            else:
                params = (event_key(self._rng.randrange(k.events_lo, k.events_hi)),)
        else:
            params = (self._rng.randrange(1, k.customers_hi),)
        cur.execute(self._sql[table, kind], params)
        self.by_kind[kind] += 1


# ---------------------------------------------------------------------------------------------------
# What is read each second: the job's /metrics and its tree's RSS.


def parse_exposition(text: str) -> dict[str, float]:
    """Prometheus text format to {metric name: sum of its samples' values} (labels summed over)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class Scrape:
    """One second's reading of the job."""

    at: float
    """Seconds since the writer started (negative before)."""
    lag_s: float | None
    """`ingest_lag_seconds`; None before the binlog phase or when the scrape failed."""
    bytes_behind: float | None
    applied: float | None
    """`ingest_binlog_changes_applied_total`, summed over the tables."""
    batches: float | None
    batch_seconds: float | None
    rss: int
    jvm_rss: int
    processes: int
    fds: int
    """Open descriptors of the whole tree: sockets, files, pipes."""


def read_metrics(port: int, timeout: float = 5.0) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
            return parse_exposition(response.read().decode())
    except (OSError, urllib.error.URLError):
        return None


def tree_descriptors(root: int) -> int:
    """Open descriptors of the tree's processes (those of a process that ends meanwhile are not counted)."""
    total = 0
    for sample in process_tree(root):
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{sample.pid}/fd"))
    return total


def tree_rss(root: int) -> tuple[int, int, int]:
    """RSS of the whole tree, of its JVM alone (bytes), and how many processes it has."""
    tree = process_tree(root)
    jvm = sum(s.rss for s in tree if _category(s, root) == "jvm")
    return sum(s.rss for s in tree), jvm, len(tree)


class Scraper:
    """Every SCRAPE_SECONDS, in a thread: `/metrics` of the job and the RSS of its tree (read from outside it)."""

    def __init__(self, root: int, port: int, t0: float) -> None:
        self.root, self.port, self.t0 = root, port, t0
        self.points: list[Scrape] = []
        self.failed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)

    def scrape(self) -> Scrape:
        m = read_metrics(self.port)
        if m is None:
            self.failed += 1
            m = {}
        rss, jvm, processes = tree_rss(self.root)
        return Scrape(
            at=time.monotonic() - self.t0,
            lag_s=m.get("ingest_lag_seconds"),
            bytes_behind=m.get("ingest_binlog_bytes_behind"),
            applied=m.get("ingest_binlog_changes_applied_total"),
            batches=m.get("ingest_batch_duration_seconds_count"),
            batch_seconds=m.get("ingest_batch_duration_seconds_sum"),
            rss=rss,
            jvm_rss=jvm,
            processes=processes,
            fds=tree_descriptors(self.root),
        )

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            point = self.scrape()
            with self._lock:
                self.points.append(point)
            next_at += SCRAPE_SECONDS
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, lo: float, hi: float) -> list[Scrape]:
        with self._lock:
            return [p for p in self.points if lo < p.at <= hi]


def wait_ready(job: JobProcess, port: int, timeout: float) -> float:
    """Wait until the job reports a lag (it does from the binlog phase on); the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if not job.alive():
            raise BenchError(
                f"the job exited (code {job.proc.returncode}) before the binlog phase; log {job.log_path}:\n"
                + job.log_tail()
            )
        m = read_metrics(port, timeout=2.0)
        if m is not None and "ingest_lag_seconds" in m:
            return time.monotonic() - started
        time.sleep(1.0)
    raise BenchError(f"the job did not reach the binlog phase within {timeout:.0f} s; log {job.log_path}")


# ---------------------------------------------------------------------------------------------------
# The Iceberg tables.


def _local_path(location: str) -> Path:
    return Path(urlparse(location).path)


def table_counts(catalog: Any, identifier: tuple[str, str]) -> dict[str, int]:
    """Live data and delete files and records (the current snapshot's totals), snapshots, metadata.json files."""
    table = catalog.load_table(identifier)
    current = table.current_snapshot()
    summary = current.summary if current is not None and current.summary is not None else None

    def total(key: str) -> int:
        value = summary.get(key) if summary is not None else None
        return int(value) if value is not None else 0

    metadata_dir = _local_path(table.metadata.location) / "metadata"
    return {
        "data_files": total("total-data-files"),
        "delete_files": total("total-delete-files"),
        "records": total("total-records"),
        "snapshots": len(table.snapshots()),
        "metadata_files": sum(1 for _ in metadata_dir.glob("*.metadata.json")),
    }


def lake_counts(catalog: Any, config: PipelineConfig, warehouse: Path) -> dict[str, Any]:
    """Per target, the state table, and the sums over the targets; metadata.json files of the whole warehouse."""
    targets = {t: table_counts(catalog, config.target_for(DATABASE, t)) for t in TABLES}
    namespace, _, name = config.sink.state_table.rpartition(".")
    state = table_counts(catalog, (namespace, name))
    sums = {k: sum(c[k] for c in targets.values()) for k in ("data_files", "delete_files", "records", "snapshots")}
    return {
        **sums,
        "state_snapshots": state["snapshots"],
        "metadata_files": sum(1 for _ in warehouse.rglob("*.metadata.json")),
        "by_table": {**targets, "state_table": state},
    }


# ---------------------------------------------------------------------------------------------------
# Samples and flatness (plain arithmetic).


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def window_sample(points: Sequence[Scrape], seconds: float) -> dict[str, Any]:
    """What one sample window's scrapes say: lag percentiles, applied changes per second, batches, RSS."""
    lags = [p.lag_s for p in points if p.lag_s is not None]
    applied = [p.applied for p in points if p.applied is not None]
    batches = [p for p in points if p.batches is not None and p.batch_seconds is not None]
    last = points[-1] if points else None
    stats = lag_stats(lags)
    out: dict[str, Any] = {
        "scrapes": len(points),
        "lag_p50_s": stats["p50"],
        "lag_p95_s": stats["p95"],
        "lag_max_s": stats["max"],
        "bytes_behind_max": max((p.bytes_behind for p in points if p.bytes_behind is not None), default=None),
        "rss_mib": None if last is None else round(last.rss / MIB, 1),
        "jvm_rss_mib": None if last is None else round(last.jvm_rss / MIB, 1),
        "rss_max_mib": max((round(p.rss / MIB, 1) for p in points), default=None),
        "processes": None if last is None else last.processes,
        "open_fds": None if last is None else last.fds,
        "applied_total": applied[-1] if applied else None,
    }
    if len(batches) >= 2:
        n = (batches[-1].batches or 0) - (batches[0].batches or 0)
        s = (batches[-1].batch_seconds or 0) - (batches[0].batch_seconds or 0)
        out["batch_seconds_mean"] = round(s / n, 3) if n else None
    else:
        out["batch_seconds_mean"] = None
    out["window_s"] = round(seconds, 3)
    return out


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The slope of the least-squares line through the points; None for fewer than two distinct xs."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def flatness(samples: Sequence[Mapping[str, Any]], key: str) -> dict[str, float | None]:
    """Per hour: the least-squares slope of `key` over the first and the second half of the samples, and the mean
    of the last quarter over the mean of the first. Samples without the value are left out."""
    points = [(float(s["elapsed_s"]) / 3600, float(s[key])) for s in samples if s.get(key) is not None]
    half = len(points) // 2
    quarter = max(1, len(points) // 4)

    def slope(part: Sequence[tuple[float, float]]) -> float | None:
        return least_squares_slope([x for x, _ in part], [y for _, y in part])

    first_q = [y for _, y in points[:quarter]]
    last_q = [y for _, y in points[-quarter:]]
    ratio = None
    if len(points) >= 2 and first_q and sum(first_q) != 0:
        ratio = (sum(last_q) / len(last_q)) / (sum(first_q) / len(first_q))
    return {
        "slope_first_half_per_h": _round(slope(points[:half])),
        "slope_second_half_per_h": _round(slope(points[half:])),
        "last_quarter_over_first": _round(ratio),
    }


# ---------------------------------------------------------------------------------------------------
# The run.


def run_verify(config_path: Path) -> dict[str, Any]:
    """`ingest verify` as a user runs it: its exit code and output."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "ingest.cli", "--log-level", "WARNING", "verify", "--config", str(config_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return {
        "exit_code": done.returncode,
        "ok": done.returncode == 0,
        "seconds": round(time.perf_counter() - started, 3),
        "output": done.stdout.splitlines() + done.stderr.splitlines(),
    }


def soak(
    server: MariaDBServer,
    keys: KeySpace,
    args: argparse.Namespace,
    scratch: Path,
    results: dict[str, Any],
) -> None:
    """Run the job, offer the load, sample; fills `results`."""
    from ingest.sink.catalog import load_pyiceberg_catalog

    warehouse = scratch / "warehouse"
    warehouse.mkdir()  # the SQLite catalog file's directory must exist
    port = free_port()
    document = pipeline_document(server.host, server.port, warehouse, args.interval, port)
    config_path = scratch / "soak.yaml"
    config_path.write_text(json.dumps(document, indent=2) + "\n")  # JSON is YAML
    config = parse_config(document, scratch)
    results["metrics_port"] = port

    log_path = scratch / "job.log"
    _progress(f"ingest run (snapshot, then the binlog; log {log_path}), metrics on :{port}")
    with JobProcess(config_path, log_path) as job:
        results["ready_s"] = round(wait_ready(job, port, READY_TIMEOUT_SECONDS), 3)
        _progress(f"binlog phase after {results['ready_s']:.1f}s; offering {args.rate:g} changes/s")
        catalog = load_pyiceberg_catalog(config.sink)
        t0 = time.monotonic()
        scraper = Scraper(job.pid, port, t0)
        writer = MixedWriter(server, keys, args.rate)
        start_counts = lake_counts(catalog, config, warehouse)
        rss, jvm, processes = tree_rss(job.pid)
        results["at_start"] = {
            "rss_mib": round(rss / MIB, 1),
            "jvm_rss_mib": round(jvm / MIB, 1),
            "processes": processes,
            "open_fds": tree_descriptors(job.pid),
            **start_counts,
        }
        db_before = mariadb_cpu(server)
        cpu_before = tree_cpu(job.pid)
        scraper.start()
        writer.start()
        samples: list[dict[str, Any]] = []
        maintenance_runs = warnings = 0
        duration = args.minutes * 60
        count = max(1, math.floor(duration / args.sample_seconds))
        written = applied = 0.0
        cpu_prev = cpu_before
        failure: str | None = None
        for k in range(1, count + 1):
            boundary = k * args.sample_seconds
            while time.monotonic() - t0 < boundary and job.alive():
                time.sleep(min(1.0, max(0.0, boundary - (time.monotonic() - t0))))
            if not job.alive():
                failure = f"the job exited (code {job.proc.returncode}) during the soak"
                break
            if writer.error is not None:
                failure = f"the writer stopped: {writer.error}"
                break
            points = scraper.between(boundary - args.sample_seconds, boundary)
            sample = window_sample(points, args.sample_seconds)
            now_written = float(writer.written)
            cpu_now = tree_cpu(job.pid)
            counts = lake_counts(catalog, config, warehouse)
            lines = job.new_log_lines()
            maintenance_runs += sum(1 for line in lines if MAINTENANCE_LINE.search(line))
            warnings += sum(1 for line in lines if WARNING_LINE.search(line))
            pss = sum(proportional_set_size(s.pid) or 0 for s in process_tree(job.pid))
            now_applied = sample.pop("applied_total")
            sample = {
                "sample": k,
                "elapsed_s": round(boundary, 3),
                "offered_per_s": round((now_written - written) / args.sample_seconds, 1),
                "applied_per_s": None
                if now_applied is None
                else round((now_applied - applied) / args.sample_seconds, 1),
                "cores": round(
                    (sum(cpu_now.values()) - sum(cpu_prev.values())) / args.sample_seconds, 3
                ),  # exited workers count through their parent
                "pss_mib": round(pss / MIB, 1),
                **sample,
                **{k_: v for k_, v in counts.items() if k_ != "by_table"},
                "maintenance_runs": maintenance_runs,
                "job_warnings": warnings,
                "by_table": counts["by_table"],
            }
            written, cpu_prev = now_written, cpu_now
            if now_applied is not None:
                applied = now_applied
            samples.append(sample)
            _progress(
                f"sample {k}/{count}: RSS {sample['rss_mib']} MiB (JVM {sample['jvm_rss_mib']}), lag p95 "
                f"{_fmt(sample['lag_p95_s'], '.2f')}s, files {sample['data_files']}+{sample['delete_files']} del, "
                f"snapshots {sample['snapshots']}, metadata.json {sample['metadata_files']}"
            )
        written_before_stop = writer.written
        writer.stop()
        stopped_at = time.monotonic()
        results["samples"] = samples
        results["writer"] = {
            "statements": writer.written,
            "by_kind": writer.by_kind,
            "seconds": round(writer.seconds, 3),
            "achieved_rate": writer.written / writer.seconds if writer.seconds else 0.0,
            "error": writer.error,
        }
        cpu_after = tree_cpu(job.pid) if job.alive() else cpu_prev
        results["job_cpu_s"] = round(sum(cpu_after.values()) - sum(cpu_before.values()), 3)
        db_after = mariadb_cpu(server)
        results["mariadb_cpu_s"] = None if db_before is None or db_after is None else round(db_after - db_before, 3)
        results["scrapes_failed"] = scraper.failed  # before the stop: once the job exits, every scrape fails
        if job.alive():
            _progress(f"writer stopped after {written_before_stop:,} statements; SIGTERM to the job")
            job.terminate()
        code = job.wait(STOP_TIMEOUT_SECONDS)
        scraper.stop()
        results["stop_s"] = round(time.monotonic() - stopped_at, 3)
        results["job_exit_code"] = code
        results["lag_whole_run_s"] = lag_stats([p.lag_s for p in scraper.between(0, duration) if p.lag_s is not None])
        lines = job.new_log_lines()
        results["maintenance_runs"] = maintenance_runs + sum(1 for line in lines if MAINTENANCE_LINE.search(line))
        results["job_warnings"] = warnings + sum(1 for line in lines if WARNING_LINE.search(line))
        if failure is not None or code != 0:
            results["failure"] = failure or f"the job exited with code {code} after SIGTERM (None: killed)"
            results["job_log_tail"] = job.log_tail().splitlines()
            return
    results["at_end"] = lake_counts(catalog, config, warehouse)
    _progress("ingest verify")
    results["verify"] = run_verify(config_path)
    results["source_rows"] = source_counts(server)


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    password = "bench-" + secrets.token_hex(8)
    os.environ[PASSWORD_ENV] = password  # the job inherits it; the config references it by name
    defaults, maintenance = StreamConfig(), MaintenanceConfig()
    results: dict[str, Any] = {
        "benchmark": "soak",
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": host_info(),
        "args": {
            "minutes": args.minutes,
            "rate": args.rate,
            "sample_seconds": args.sample_seconds,
            "interval": args.interval,
            "initial_rows": args.initial_rows,
        },
        "job_settings": {
            "spark_master": "local[2]",
            "batch_max_changes": defaults.batch_max_changes,
            "maintenance_every_commits": maintenance.every_commits,
            "maintenance_expire_after_hours": maintenance.expire_after_hours,
        },
        "mix": [f"{t}:{k}" for t, k in MIX],
        "cpu_method": CPU_METHOD,
    }
    scratch = Path(tempfile.mkdtemp(prefix="ingest-bench-soak-"))
    keep_scratch = args.keep_logs
    try:
        with MariaDBServer() as server:
            server.create_cdc_user(CDC_USER, password)
            create_tables(server)
            keys = load_initial(server, args.initial_rows)
            results["initial_rows"] = source_counts(server)
            soak(server, keys, args, scratch, results)
    except BaseException:
        keep_scratch = True
        _progress("failed")
        raise
    finally:
        if results.get("failure"):
            keep_scratch = True
        if keep_scratch:
            _progress(f"logs and warehouse kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    samples = results.get("samples", [])
    results["flatness"] = {key: flatness(samples, key) for key, _, _ in FLAT_KEYS}
    results["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return results


# ---------------------------------------------------------------------------------------------------
# The report.


def render(results: dict[str, Any]) -> str:
    a = results["args"]
    s = results["job_settings"]
    lines = [
        f"Soak: offered {a['rate']:g} changes/s for {a['minutes']:g} min, "
        f"trigger interval {a['interval']:g}s, sample every {a['sample_seconds']:g}s; "
        f"maintenance every {s['maintenance_every_commits']} commits, expiry after "
        f"{s['maintenance_expire_after_hours']} h; {results['host']['cpus']} CPUs",
        f"initial rows {results.get('initial_rows')}; binlog phase reached after "
        f"{_fmt(results.get('ready_s'), '.1f')}s (Spark start, discovery, snapshot)",
    ]
    start = results.get("at_start")
    header = (
        f"{'#':>3} {'min':>5} {'offer/s':>7} {'appl/s':>7} {'cores':>5} {'RSS':>6} {'JVM':>6} {'PSS':>6} "
        f"{'lag p50':>7} {'p95':>6} {'max':>6} {'data':>5} {'del':>5} {'snaps':>5} {'state':>5} {'meta':>5} "
        f"{'maint':>5}"
    )
    lines += [
        "",
        "RSS/JVM/PSS in MiB (at the sample); lag s (ingest_lag_seconds over the window); files summed",
        header,
    ]
    if start:
        lines.append(
            f"{'0':>3} {0:>5.1f} {'':>7} {'':>7} {'':>5} {start['rss_mib']:>6.0f} {start['jvm_rss_mib']:>6.0f} "
            f"{'':>6} {'':>7} {'':>6} {'':>6} {start['data_files']:>5} {start['delete_files']:>5} "
            f"{start['snapshots']:>5} {start['state_snapshots']:>5} {start['metadata_files']:>5} {'':>5}"
        )
    for x in results.get("samples", []):
        lines.append(
            f"{x['sample']:>3} {x['elapsed_s'] / 60:>5.1f} {_fmt(x['offered_per_s']):>7} {_fmt(x['applied_per_s']):>7} "
            f"{_fmt(x['cores'], '.2f'):>5} {_fmt(x['rss_mib']):>6} {_fmt(x['jvm_rss_mib']):>6} "
            f"{_fmt(x['pss_mib']):>6} {_fmt(x['lag_p50_s'], '.2f'):>7} {_fmt(x['lag_p95_s'], '.2f'):>6} "
            f"{_fmt(x['lag_max_s'], '.2f'):>6} {x['data_files']:>5} {x['delete_files']:>5} {x['snapshots']:>5} "
            f"{x['state_snapshots']:>5} {x['metadata_files']:>5} {x['maintenance_runs']:>5}"
        )
    flat = results.get("flatness", {})
    lines += [
        "",
        "Flatness (least-squares slope per hour over each half of the samples; "
        "last-quarter mean / first-quarter mean):",
        f"  {'':<26} {'unit':<9} {'1st half /h':>12} {'2nd half /h':>12} {'last/first q':>12}",
    ]
    for key, label, unit in FLAT_KEYS:
        f = flat.get(key, {})
        lines.append(
            f"  {label:<26} {unit:<9} {_fmt(f.get('slope_first_half_per_h'), ',.1f'):>12} "
            f"{_fmt(f.get('slope_second_half_per_h'), ',.1f'):>12} {_fmt(f.get('last_quarter_over_first'), '.3f'):>12}"
        )
    w = results.get("writer")
    if w:
        lines += [
            "",
            f"writer: {w['statements']:,} statements ({', '.join(f'{k} {v:,}' for k, v in w['by_kind'].items())}) "
            f"in {w['seconds']:.1f}s = {w['achieved_rate']:,.1f}/s" + (f"; ERROR {w['error']}" if w["error"] else ""),
        ]
    whole = results.get("lag_whole_run_s")
    if whole:
        lines.append(
            f"lag over the whole run: p50 {_fmt(whole['p50'], '.2f')}s, p95 {_fmt(whole['p95'], '.2f')}s, "
            f"max {_fmt(whole['max'], '.2f')}s"
        )
    if "job_cpu_s" in results:
        lines.append(
            f"job CPU {results['job_cpu_s']:.1f}s; MariaDB CPU {_fmt(results.get('mariadb_cpu_s'), '.1f')}s; "
            f"maintenance runs {results.get('maintenance_runs')}; job warnings/errors logged "
            f"{results.get('job_warnings')}; failed scrapes {results.get('scrapes_failed')}"
        )
    if "stop_s" in results:
        lines.append(f"SIGTERM to exit: {results['stop_s']:.1f}s, exit code {results.get('job_exit_code')}")
    if results.get("failure"):
        lines += ["", f"FAILED: {results['failure']}", *results.get("job_log_tail", [])]
    v = results.get("verify")
    if v:
        lines += [
            "",
            f"ingest verify: {'OK' if v['ok'] else 'FAILED'} (exit code {v['exit_code']}, {v['seconds']:.1f}s)",
        ]
        lines += [f"  {line}" for line in v["output"]]
    return "\n".join(lines)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=_positive_float, default=60.0, help="minutes of offered load (60)")
    parser.add_argument("--rate", type=_positive_float, default=500.0, help="offered changes per second (500)")
    parser.add_argument("--sample-seconds", type=_positive_float, default=30.0, help="seconds between two samples (30)")
    parser.add_argument(
        "--interval", type=_positive_float, default=5.0, help="stream.batch_interval_seconds (5, the job's default)"
    )
    parser.add_argument(
        "--initial-rows", type=_positive, default=20_000, help="initial orders (customers 1/4, events 1/2; 20000)"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the job's log and the warehouse in the temp dir")
    args = parser.parse_args(argv)
    if args.sample_seconds > args.minutes * 60:
        parser.error("--sample-seconds must not be longer than the run (--minutes)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = orchestrate(args)
    print(render(results))
    path = write_results(results, "soak")
    print(f"\nresults written to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    ok = not results.get("failure") and results.get("verify", {}).get("ok", False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
