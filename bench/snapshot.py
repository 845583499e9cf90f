"""Snapshot throughput, CPU and memory of the job against a plain PyMySQL read of the same table, in one run.

    .venv/bin/python -m bench.snapshot [--rows N] [--chunk-size 8192] [--parallelism 1,2]
                                       [--memory-sizes 1000000,4000000] [--update-rate 500] [--in-query 2]
                                       [--keep-logs] [--spark-conf KEY=VALUE ...]

Starts a private MariaDB, fills `bench.items`, measures the baselines in this process, then runs
`ingest.query.pipeline.run(snapshot_only=True)` once per measurement in a child process (and, for `--in-query`,
`run(until_caught_up=True)`, whose streaming query reads the chunks in chunk batches)
(`python -m bench.snapshot --worker SPEC`): a Spark session's master cannot change, and the child's
process tree (driver, JVM, Python workers) is exactly the job, without MariaDB. The child announces
the start and end of `run` and its JSON result on stdout; its stderr (Spark and job logs) goes to a
log file. Nothing here asserts on timing. See bench/README.md for what each number means.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import random
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"

DATABASE = "bench"
TABLE = "items"
CDC_USER = "bench_cdc"
PASSWORD_ENV = "INGEST_BENCH_MYSQL_PASSWORD"
SPARK_CONF_ENV = "INGEST_BENCH_SPARK_CONF"
"""`--spark-conf` settings as JSON, for the workers (which inherit the environment)."""


def add_spark_conf_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spark-conf",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a Spark setting for every run of ours (repeatable), as `spark.conf` in the pipeline file",
    )


def share_spark_conf(pairs: list[str]) -> dict[str, str]:
    """Parse `--spark-conf` values and hand them to the workers through the environment."""
    conf = dict(p.split("=", 1) for p in pairs)
    os.environ[SPARK_CONF_ENV] = json.dumps(conf)
    return conf


def spark_conf_note(conf: dict[str, str] | None) -> str:
    """For a report's first line: the `--spark-conf` settings, if any."""
    return "; spark.conf " + ", ".join(f"{k}={v}" for k, v in conf.items()) if conf else ""


def spark_section(master: str) -> dict[str, Any]:
    """The pipeline's `spark` section in a worker: the master, and the settings `--spark-conf` gave."""
    return {"master": master, "conf": json.loads(os.environ.get(SPARK_CONF_ENV, "{}"))}


LOAD_SLICE = 250_000
"""Rows per INSERT ... SELECT when filling a table."""
FIXED_PARALLELISM = 2
"""The parallelism of the watermark-correction and memory runs."""

STARTED_LINE = "BENCH_RUN_STARTED"
DONE_LINE = "BENCH_RUN_DONE"
RESULT_PREFIX = "BENCH_RESULT "

MIB = 1024 * 1024

log = logging.getLogger("bench.snapshot")


class BenchError(RuntimeError):
    """The benchmark could not run (a worker failed, a server did not start, ...)."""


# ---------------------------------------------------------------------------------------------------
# CPU and memory of a process tree: psutil when the venv has it, else /proc.

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _load_psutil() -> Any:
    try:
        import importlib

        return importlib.import_module("psutil")
    except ImportError:
        return None


_psutil = _load_psutil()
CPU_METHOD = (
    "psutil: user+system CPU of every live process of the job's tree, plus children_user+children_system "
    "(exited children the parent waited for)"
    if _psutil is not None
    else "/proc/<pid>/stat: utime+stime of every live process of the job's tree, plus cutime+cstime "
    "(exited children the parent waited for); psutil is not installed in the venv"
)


@dataclass(frozen=True)
class ProcSample:
    pid: int
    ppid: int
    name: str
    cpu: float
    """Own user+system CPU seconds (all threads)."""
    children_cpu: float
    """User+system CPU seconds of the exited children this process waited for."""
    rss: int
    """Resident set size in bytes."""


def _proc_stat(pid: int) -> ProcSample | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The name is in parentheses and may itself contain spaces or parentheses.
    name = text[text.index("(") + 1 : text.rindex(")")]
    f = text[text.rindex(")") + 2 :].split()
    # f[0] is field 3 (state) of proc(5): ppid 4, utime 14, stime 15, cutime 16, cstime 17, rss 24.
    return ProcSample(
        pid=pid,
        ppid=int(f[1]),
        name=name,
        cpu=(int(f[11]) + int(f[12])) / CLOCK_TICKS,
        children_cpu=(int(f[13]) + int(f[14])) / CLOCK_TICKS,
        rss=int(f[21]) * PAGE_SIZE,
    )


def _proc_tree(root: int) -> list[ProcSample]:
    samples: dict[int, ProcSample] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            sample = _proc_stat(int(entry.name))
            if sample is not None:
                samples[sample.pid] = sample
    children: dict[int, list[int]] = defaultdict(list)
    for sample in samples.values():
        children[sample.ppid].append(sample.pid)
    out: list[ProcSample] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in samples:
            out.append(samples[pid])
            todo.extend(children[pid])
    return out


def _psutil_tree(root: int) -> list[ProcSample]:
    out: list[ProcSample] = []
    try:
        top = _psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except _psutil.Error:
        return out
    for proc in procs:
        try:
            with proc.oneshot():
                t = proc.cpu_times()
                out.append(
                    ProcSample(
                        proc.pid,
                        proc.ppid(),
                        proc.name(),
                        t.user + t.system,
                        t.children_user + t.children_system,
                        proc.memory_info().rss,
                    )
                )
        except _psutil.Error:
            continue
    return out


def process_tree(root: int) -> list[ProcSample]:
    """The live processes of the tree rooted at `root`, root included."""
    return _psutil_tree(root) if _psutil is not None else _proc_tree(root)


def process_sample(pid: int) -> ProcSample | None:
    tree = process_tree(pid)
    return next((s for s in tree if s.pid == pid), None)


def _category(sample: ProcSample, root: int) -> str:
    if sample.pid == root:
        return "driver"
    return "jvm" if sample.name == "java" else "python_workers"


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds so far of the tree by part (driver, jvm, python_workers); exited children count via their parent."""
    by: dict[str, float] = defaultdict(float)
    for sample in process_tree(root):
        by[_category(sample, root)] += sample.cpu + sample.children_cpu
    return dict(by)


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 3) for k in sorted(set(before) | set(after))}


def proportional_set_size(pid: int) -> int | None:
    """PSS in bytes (shared pages divided among their users), from /proc/<pid>/smaps_rollup; None if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class TreeMonitor:
    """Samples the RSS (and PSS) of a process tree every `interval` seconds in a thread; keeps the peaks.

    It runs in the orchestrating process, outside the measured tree: reading every process's smaps costs
    CPU (in the kernel, charged to the reader) that must not count as the job's, nor take the job's GIL.

    RSS sums count pages shared between processes (forked Python workers, shared libraries) once per
    process; PSS splits them, so the PSS sum is closer to the memory the tree really occupies.
    """

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root = root
        self.interval = interval
        self.peak_total = 0
        self.peak_pss = 0
        self.peak_by: dict[str, int] = defaultdict(int)
        self.peak_processes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-monitor", daemon=True)

    def _sample(self) -> None:
        by: dict[str, int] = defaultdict(int)
        tree = process_tree(self.root)
        pss = 0
        for sample in tree:
            by[_category(sample, self.root)] += sample.rss
            pss += proportional_set_size(sample.pid) or 0
        self.peak_total = max(self.peak_total, sum(by.values()))
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_processes = max(self.peak_processes, len(tree))
        for key, value in by.items():
            self.peak_by[key] = max(self.peak_by[key], value)
        self.samples += 1

    def _loop(self) -> None:
        self._sample()
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (a last sample first, while the tree still runs); idempotent."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self._sample()

    def peaks(self) -> dict[str, Any]:
        """What the results report of the tree's memory."""
        return {
            "peak_rss_mib": round(self.peak_total / MIB, 1),
            "peak_rss_mib_by_part": {k: round(v / MIB, 1) for k, v in sorted(self.peak_by.items())},
            "peak_pss_mib": round(self.peak_pss / MIB, 1),
            "peak_processes": self.peak_processes,
            "rss_samples": self.samples,
        }


# ---------------------------------------------------------------------------------------------------
# The source table.

COLUMNS = "id, c_bigint, c_varchar, c_decimal, c_datetime, c_timestamp, c_double, c_tinyint, c_text"


def create_table(server: MariaDBServer, table: str) -> None:
    server.execute(
        f"CREATE DATABASE IF NOT EXISTS {DATABASE}",
        f"DROP TABLE IF EXISTS {DATABASE}.{table}",
        f"""CREATE TABLE {DATABASE}.{table} (
            id INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
            c_bigint BIGINT NOT NULL,
            c_varchar VARCHAR(64) NOT NULL,
            c_decimal DECIMAL(12,2) NULL,
            c_datetime DATETIME(6) NOT NULL,
            c_timestamp TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
            c_double DOUBLE NULL,
            c_tinyint TINYINT NOT NULL,
            c_text TEXT NOT NULL
        ) ENGINE=InnoDB""",
    )


def fill_table(server: MariaDBServer, table: str, rows: int) -> float:
    """Insert rows 1..`rows` from the sequence engine, in slices; returns the seconds taken.

    The load is kept out of the binlog (sql_log_bin=0): the snapshot never reads it, and it would
    only cost time and disk.
    """
    started = time.perf_counter()
    with server.admin(DATABASE) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        for offset in range(0, rows, LOAD_SLICE):
            n = min(LOAD_SLICE, rows - offset)
            cur.execute(
                f"INSERT INTO {DATABASE}.{table} ({COLUMNS}) SELECT "
                "s, s * 2654435761, CONCAT('item-', s, '-', LEFT(MD5(s), 16)), "
                "IF(s % 17 = 0, NULL, (s % 10000000) / 100), "
                "TIMESTAMP'2020-01-01 00:00:00' + INTERVAL s * 1000003 MICROSECOND, "
                "FROM_UNIXTIME(1600000000 + s), IF(s % 13 = 0, NULL, s / 7e0), s % 256 - 128, "
                "RPAD(CONCAT('note ', s, ': '), 60, 'lorem ipsum dolor sit amet ') "
                f"FROM (SELECT CAST(seq + {offset} AS SIGNED) AS s FROM {DATABASE}.seq_1_to_{n}) AS g"
            )
    return time.perf_counter() - started


def drop_table(server: MariaDBServer, table: str) -> None:
    server.execute(f"DROP TABLE IF EXISTS {DATABASE}.{table}")


def mariadb_cpu(server: MariaDBServer) -> float | None:
    """CPU seconds so far of the MariaDB server (context only: it is never counted as ours)."""
    try:
        pid = int((server.base_dir / "mysqld.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    sample = process_sample(pid)
    return None if sample is None else sample.cpu


def embedded_catalog(base: Path) -> dict[str, str]:
    """Catalog properties of an embedded warehouse under `base`: a SQLite JDBC catalog and local files."""
    return {"type": "jdbc", "uri": f"jdbc:sqlite:{base}/catalog.db", "warehouse": f"file://{base}/warehouse"}


def make_config(spec: dict[str, Any]) -> PipelineConfig:
    """A pipeline over one table of the bench database into an embedded warehouse (SQLite JDBC catalog)."""
    base = Path(spec["warehouse"])
    parallelism = int(spec["parallelism"])
    return parse_config(
        {
            "name": "bench",
            "source": {
                "host": spec["host"],
                "port": int(spec["port"]),
                "user": CDC_USER,
                "password": {"env": PASSWORD_ENV},
                "flavor": "mariadb",
                "server_id": 5401,
            },
            "tables": {"include": [rf"{DATABASE}\.{re.escape(spec['table'])}"]},
            "sink": {
                "catalog_name": "lake",
                "catalog": embedded_catalog(base),
            },
            "snapshot": {"chunk_size": int(spec["chunk_size"]), "parallelism": parallelism},
            "spark": spark_section(f"local[{parallelism}]"),
            # Without snapshot_only, the job's query reads the chunks itself (chunk batches), then catches up.
            **({} if spec.get("query") else {"startup_mode": "snapshot_only"}),
        }
    )


# ---------------------------------------------------------------------------------------------------
# Baselines, measured in this process.


def per_million(seconds: float, rows: int) -> float:
    return seconds / rows * 1e6 if rows else float("nan")


def measure_sscursor(server: MariaDBServer, table: str, password: str) -> dict[str, Any]:
    """Plain PyMySQL: stream SELECT * with an SSCursor as the CDC user, rows discarded."""
    import pymysql

    conn = pymysql.connect(
        host=server.host,
        port=server.port,
        user=CDC_USER,
        password=password,
        charset="utf8mb4",
        init_command="SET time_zone = '+00:00'",
        cursorclass=pymysql.cursors.SSCursor,
    )
    db_cpu = mariadb_cpu(server)
    load = os.getloadavg()[0]
    cpu = time.process_time()
    started = time.perf_counter()
    rows = 0
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {DATABASE}.{table}")
            for _ in cur:
                rows += 1
    finally:
        conn.close()
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    db_after = mariadb_cpu(server)
    return {
        "rows": rows,
        "seconds": round(wall, 3),
        "rows_per_s": rows / wall,
        "cpu_s": round(cpu, 3),
        "cpu_s_per_million_rows": per_million(cpu, rows),
        "mariadb_cpu_s": None if db_cpu is None or db_after is None else round(db_after - db_cpu, 3),
        "load_avg_1m_before": load,
    }


def measure_chunk_reader(server: MariaDBServer, table: str, chunk_size: int, scratch: Path) -> dict[str, Any]:
    """Our executor-side work without Spark: every chunk through `chunk_batches` (lock-free read + Arrow), serially."""
    from ingest.model.schema import target_columns
    from ingest.source.discovery import discover
    from ingest.source.mysql import connect
    from ingest.source.snapshot.chunk_reader import ChunkConnections, ChunkTask
    from ingest.source.snapshot.chunks import split_table
    from ingest.source.snapshot.snapshot_source import chunk_batches, source_schema

    spec = {
        "host": server.host,
        "port": server.port,
        "table": table,
        "parallelism": 1,
        "chunk_size": chunk_size,
        "warehouse": str(scratch / "unused"),
    }
    config = make_config(spec)
    info = discover(config)
    schema = info.schemas[0]
    with connect(config.source) as conn:
        plan = split_table(conn, schema, chunk_size)
    targets = target_columns(schema)
    _, arrow_schema = source_schema(targets)
    db_cpu = mariadb_cpu(server)
    load = os.getloadavg()[0]
    cpu = time.process_time()
    started = time.perf_counter()
    rows = events = 0
    select_s = window_s = read_s = 0.0
    reports: dict[int, dict[str, Any]] = {}
    sessions = ChunkConnections(config.source, config.snapshot.driver)  # kept across chunks, as a partition does
    for chunk in plan:
        task = ChunkTask(config.source, info.flavor, schema, chunk)
        for _batch in chunk_batches(task, targets, arrow_schema, lambda i, m: reports.__setitem__(i, m), sessions):
            pass
        meta = reports[chunk.index]
        rows += int(meta["rows"])
        events += int(meta["window_events"])
        select_s += float(meta["timings"]["select"])
        window_s += float(meta["timings"]["window"])
        read_s += float(meta["seconds"])
    sessions.close()
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    db_after = mariadb_cpu(server)
    return {
        "rows": rows,
        "chunks": len(plan),
        "seconds": round(wall, 3),
        "rows_per_s": rows / wall,
        "cpu_s": round(cpu, 3),
        "cpu_s_per_million_rows": per_million(cpu, rows),
        "read_chunk_select_s": round(select_s, 3),
        "read_chunk_window_s": round(window_s, 3),
        "arrow_and_other_s": round(wall - read_s, 3),
        "window_events": events,
        "mariadb_cpu_s": None if db_cpu is None or db_after is None else round(db_after - db_cpu, 3),
        "load_avg_1m_before": load,
    }


# ---------------------------------------------------------------------------------------------------
# The job, in a child process.


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Inside the child: start Spark, run the snapshot, measure the process tree around `run`."""
    from ingest.query.pipeline import run
    from ingest.runtime.spark import spark_session
    from ingest.sink.targets import qualified
    from ingest.state.table import StateTable

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = make_config(spec)
    root = os.getpid()
    started = time.perf_counter()
    spark = spark_session(config, app_name=f"bench-{spec['label']}")
    spark_start = time.perf_counter() - started
    load = os.getloadavg()[0]
    cpu_before = tree_cpu(root)
    print(STARTED_LINE, flush=True)  # the parent's TreeMonitor samples the tree from here to DONE_LINE
    started = time.perf_counter()
    if spec.get("query"):
        run(config, until_caught_up=True, spark=spark)
    else:
        run(config, snapshot_only=True, spark=spark)
    wall = time.perf_counter() - started
    cpu_after = tree_cpu(root)
    print(DONE_LINE, flush=True)

    table_id = f"{DATABASE}.{spec['table']}"
    done = StateTable.open(config).done(table_id)
    namespace, name = config.target_for(DATABASE, spec["table"])
    rows_in_iceberg = int(spark.table(qualified(config, namespace, name)).count())
    spark.stop()
    cpu = cpu_delta(cpu_before, cpu_after)
    cpu_total = sum(cpu.values())
    rows = int(spec["rows"])
    return {
        "label": spec["label"],
        "table": table_id,
        "parallelism": int(spec["parallelism"]),
        "query": bool(spec.get("query")),
        "rows": rows,
        "seconds": round(wall, 3),
        "rows_per_s": rows / wall,
        "spark_start_s": round(spark_start, 3),
        "cpu_s": round(cpu_total, 3),
        "cpu_s_by_part": cpu,
        "cpu_s_per_million_rows": per_million(cpu_total, rows),
        "chunks": len(done),
        "rows_recorded": sum(r.row_count for r in done.values()),
        "rows_in_iceberg": rows_in_iceberg,
        "window_events": sum(r.window_events for r in done.values()),
        "load_avg_1m_before": load,
    }


def spawn_worker(
    spec: dict[str, Any],
    log_path: Path,
    on_started: Callable[[], None] | None = None,
    on_done: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run one measurement in `python -m bench.snapshot --worker`; its result comes back on stdout."""
    cmd = [sys.executable, "-m", "bench.snapshot", "--worker", json.dumps(spec)]
    result: dict[str, Any] | None = None
    finished = False
    with open(log_path, "a") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log_file, text=True, bufsize=1)
        monitor = TreeMonitor(proc.pid)
        try:
            if proc.stdout is None:
                raise BenchError("no stdout pipe to the worker")
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                if line == STARTED_LINE:
                    monitor.start()
                    if on_started is not None:
                        on_started()
                elif line == DONE_LINE:
                    monitor.stop()
                    finished = True
                    if on_done is not None:
                        on_done()
                elif line.startswith(RESULT_PREFIX):
                    result = json.loads(line[len(RESULT_PREFIX) :])
                else:
                    log_file.write(line + "\n")
                    log_file.flush()
        finally:
            monitor.stop()
            code = proc.wait()
            if on_done is not None and not finished:
                on_done()
    if code != 0 or result is None:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise BenchError(f"worker {spec['label']} failed (exit code {code}); log {log_path}, tail:\n{tail}")
    return {**result, **monitor.peaks()}


class PacedWriter:
    """Single-statement autocommit transactions at about `rate` per second, in a thread, as root.

    Subclasses say what one statement is (`write`); `written` counts them. A writer that falls behind keeps
    its pace instead of bursting. An error stops it and is reported with the results."""

    def __init__(self, server: MariaDBServer, rate: float, name: str) -> None:
        self.server = server
        self.rate = rate
        self.written = 0
        self.seconds = 0.0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def write(self, cur: Any) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        interval = 1.0 / self.rate
        started = time.perf_counter()
        try:
            with self.server.admin(DATABASE) as conn, conn.cursor() as cur:
                next_at = started
                while not self._stop.is_set():
                    self.write(cur)
                    self.written += 1
                    next_at += interval
                    delay = next_at - time.perf_counter()
                    if delay > 0:
                        self._stop.wait(delay)
                    elif delay < -1.0:
                        next_at = time.perf_counter()  # fell behind: keep the pace, do not burst
        except Exception as e:  # reported with the results
            self.error = f"{type(e).__name__}: {e}"
        self.seconds = time.perf_counter() - started


class UpdateWriter(PacedWriter):
    """Updates random rows of `table` (ids 1..`rows`)."""

    def __init__(self, server: MariaDBServer, table: str, rows: int, rate: float) -> None:
        super().__init__(server, rate, "update-writer")
        self.rows = rows
        self._rng = random.Random(20240601)
        self._sql = (
            f"UPDATE {DATABASE}.{table} SET c_bigint = c_bigint + 1, c_double = RAND(), "
            "c_timestamp = NOW() WHERE id = %s"
        )

    def write(self, cur: Any) -> None:
        cur.execute(self._sql, (self._rng.randint(1, self.rows),))

    def summary(self) -> dict[str, Any]:
        return {
            "target_rate": self.rate,
            "updates": self.written,
            "seconds": round(self.seconds, 3),
            "achieved_rate": self.written / self.seconds if self.seconds else 0.0,
            "error": self.error,
        }


# ---------------------------------------------------------------------------------------------------
# The run.


def _progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextmanager
def _measured_mariadb(server: MariaDBServer, result: dict[str, Any]) -> Iterator[None]:
    before = mariadb_cpu(server)
    yield
    after = mariadb_cpu(server)
    result["mariadb_cpu_s"] = None if before is None or after is None else round(after - before, 3)


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    rows: int = args.rows
    chunk_size: int = args.chunk_size
    parallelisms: list[int] = args.parallelism
    memory_sizes: list[int] = args.memory_sizes
    password = "bench-" + secrets.token_hex(8)
    os.environ[PASSWORD_ENV] = password  # the workers inherit it; the config references it by name
    spark_conf = share_spark_conf(args.spark_conf)
    started_at = dt.datetime.now(dt.UTC)
    results: dict[str, Any] = {
        "benchmark": "snapshot",
        "started_at": started_at.isoformat(timespec="seconds"),
        "host": host_info(),
        "args": {
            "rows": rows,
            "chunk_size": chunk_size,
            "parallelism": parallelisms,
            "memory_sizes": memory_sizes,
            "update_rate": args.update_rate,
            "in_query": args.in_query,
            "spark_conf": spark_conf,
        },
        "table": f"{DATABASE}.{TABLE}: INT UNSIGNED AUTO_INCREMENT key + BIGINT, VARCHAR(64), DECIMAL(12,2), "
        "DATETIME(6), TIMESTAMP, DOUBLE, TINYINT, TEXT(60 chars)",
        "cpu_method": CPU_METHOD,
    }
    scratch = Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    keep_scratch = False
    idle: dict[int, dict[str, Any]] = {}

    def job(
        label: str, table: str, table_rows: int, parallelism: int, query: bool = False, **hooks: Any
    ) -> dict[str, Any]:
        warehouse = scratch / f"warehouse-{label}"
        warehouse.mkdir()  # the SQLite catalog file's directory must exist (pyiceberg does not create it)
        spec = {
            "label": label,
            "host": server.host,
            "port": server.port,
            "table": table,
            "rows": table_rows,
            "parallelism": parallelism,
            "chunk_size": chunk_size,
            "warehouse": str(warehouse),
            "query": query,
        }
        _progress(f"ours {label}: {table_rows:,} rows at parallelism {parallelism} (log {scratch}/{label}.log)")
        out: dict[str, Any] = {}
        with _measured_mariadb(server, out):
            out.update(spawn_worker(spec, scratch / f"{label}.log", **hooks))
        shutil.rmtree(warehouse, ignore_errors=True)
        _progress(f"ours {label}: {out['rows_per_s']:,.0f} rows/s, peak RSS {out['peak_rss_mib']:,.0f} MiB")
        return out

    try:
        server = MariaDBServer(extra_args=("--innodb-buffer-pool-size=1G",))
        with server:
            server.create_cdc_user(CDC_USER, password)
            create_table(server, TABLE)
            _progress(f"loading {rows:,} rows into {DATABASE}.{TABLE}")
            results["load_s"] = round(fill_table(server, TABLE, rows), 3)
            _progress(f"loaded in {results['load_s']:.1f}s; baseline: PyMySQL SSCursor")
            results["baseline_sscursor"] = measure_sscursor(server, TABLE, password)
            _progress("chunk reader without Spark")
            results["chunk_reader_no_spark"] = measure_chunk_reader(server, TABLE, chunk_size, scratch)

            for p in parallelisms:
                idle[p] = job(f"p{p}", TABLE, rows, p)
            if FIXED_PARALLELISM not in idle and (args.update_rate > 0 or memory_sizes):
                idle[FIXED_PARALLELISM] = job(f"p{FIXED_PARALLELISM}", TABLE, rows, FIXED_PARALLELISM)
            results["ours"] = [idle[p] for p in sorted(idle)]
            results["in_query"] = [job(f"query-p{p}", TABLE, rows, p, query=True) for p in args.in_query]

            if args.update_rate > 0:
                writer = UpdateWriter(server, TABLE, rows, args.update_rate)
                correction = job(
                    f"p{FIXED_PARALLELISM}-writer",
                    TABLE,
                    rows,
                    FIXED_PARALLELISM,
                    on_started=writer.start,
                    on_done=writer.stop,
                )
                correction["writer"] = writer.summary()
                correction["idle_rows_per_s"] = idle[FIXED_PARALLELISM]["rows_per_s"]
                correction["rows_per_s_vs_idle"] = correction["rows_per_s"] / correction["idle_rows_per_s"]
                results["watermark_correction"] = correction

            memory: list[dict[str, Any]] = []
            for size in memory_sizes:
                if size == rows:
                    entry = dict(idle[FIXED_PARALLELISM])
                    entry["reused_idle_run"] = True
                else:
                    table = f"{TABLE}_{size}"
                    create_table(server, table)
                    _progress(f"loading {size:,} rows into {DATABASE}.{table}")
                    load_s = fill_table(server, table, size)
                    entry = job(f"mem{size}", table, size, FIXED_PARALLELISM)
                    entry["load_s"] = round(load_s, 3)
                    entry["reused_idle_run"] = False
                    drop_table(server, table)
                memory.append(entry)
            results["memory"] = memory
    except BaseException:
        keep_scratch = True
        _progress("failed")
        raise
    finally:
        if keep_scratch or args.keep_logs:
            _progress(f"worker logs kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    results["ratios"] = ratios(results)
    results["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return results


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    base = results["baseline_sscursor"]
    out: dict[str, Any] = {}
    for run in results.get("ours", []):
        p = run["parallelism"]
        out[f"ours_p{p}_rows_per_s_vs_baseline"] = run["rows_per_s"] / base["rows_per_s"]
        out[f"ours_p{p}_cpu_per_row_vs_baseline"] = run["cpu_s_per_million_rows"] / base["cpu_s_per_million_rows"]
    reader = results.get("chunk_reader_no_spark")
    if reader:
        out["chunk_reader_rows_per_s_vs_baseline"] = reader["rows_per_s"] / base["rows_per_s"]
        out["chunk_reader_cpu_per_row_vs_baseline"] = reader["cpu_s_per_million_rows"] / base["cpu_s_per_million_rows"]
    for run in results.get("in_query", []):
        p = run["parallelism"]
        out[f"in_query_p{p}_rows_per_s_vs_baseline"] = run["rows_per_s"] / base["rows_per_s"]
        alone = next((r for r in results.get("ours", []) if r["parallelism"] == p), None)
        if alone is not None:
            out[f"in_query_p{p}_rows_per_s_vs_snapshot_phase"] = run["rows_per_s"] / alone["rows_per_s"]
    correction = results.get("watermark_correction")
    if correction:
        out["writer_run_rows_per_s_vs_idle"] = correction["rows_per_s_vs_idle"]
    memory = results.get("memory") or []
    if len(memory) > 1:
        smallest, largest = min(memory, key=lambda m: m["rows"]), max(memory, key=lambda m: m["rows"])
        out["memory_peak_rss_largest_vs_smallest"] = largest["peak_rss_mib"] / smallest["peak_rss_mib"]
        out["memory_peak_pss_largest_vs_smallest"] = largest["peak_pss_mib"] / smallest["peak_pss_mib"]
        out["memory_rows_largest_vs_smallest"] = largest["rows"] / smallest["rows"]
    return out


# ---------------------------------------------------------------------------------------------------
# Output.


def _fmt(value: Any, spec: str = ",.0f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value != value:  # NaN
        return "-"
    return format(value, spec)


def render(results: dict[str, Any]) -> str:
    base = results["baseline_sscursor"]
    reader = results["chunk_reader_no_spark"]
    lines = [
        f"Snapshot benchmark, {results['started_at']}: {results['args']['rows']:,} rows, "
        f"chunk size {results['args']['chunk_size']:,}, {results['host']['cpus']} CPUs, "
        f"load average at start {results['host']['load_avg_1m_at_start']:.2f}"
        f"{spark_conf_note(results['args'].get('spark_conf'))}",
        f"table {results['table']}; loaded in {results['load_s']:.1f}s",
        f"CPU of ours: {results['cpu_method']}",
        "",
    ]
    header = (
        f"{'measurement':<34} {'rows/s':>10} {'x baseline':>10} {'wall s':>8} {'CPU s':>8} {'CPU s/M rows':>12} "
        f"{'x base CPU':>10} {'peak RSS MiB':>12} {'MariaDB CPU s':>13}"
    )
    lines += [header, "-" * len(header)]

    def row(name: str, m: dict[str, Any], rss: Any = None) -> str:
        return (
            f"{name:<34} {_fmt(m['rows_per_s']):>10} {_fmt(m['rows_per_s'] / base['rows_per_s'], '.2f'):>10} "
            f"{_fmt(m['seconds'], '.1f'):>8} {_fmt(m['cpu_s'], '.1f'):>8} "
            f"{_fmt(m['cpu_s_per_million_rows'], '.1f'):>12} "
            f"{_fmt(m['cpu_s_per_million_rows'] / base['cpu_s_per_million_rows'], '.2f'):>10} "
            f"{_fmt(rss, ',.0f'):>12} {_fmt(m.get('mariadb_cpu_s'), '.1f'):>13}"
        )

    lines.append(row("baseline: PyMySQL SSCursor SELECT *", base))
    lines.append(row("chunk reader + Arrow, no Spark", reader))
    for run in results.get("ours", []):
        lines.append(row(f"ours: run() at parallelism {run['parallelism']}", run, run["peak_rss_mib"]))
    for run in results.get("in_query", []):
        lines.append(row(f"ours: the query's chunk batches p{run['parallelism']}", run, run["peak_rss_mib"]))
    correction = results.get("watermark_correction")
    if correction:
        lines.append(row(f"ours: p{correction['parallelism']} + update writer", correction, correction["peak_rss_mib"]))
    lines.append("")
    lines.append(
        f"chunk reader breakdown ({reader['chunks']} chunks, serial): select {reader['read_chunk_select_s']:.1f}s, "
        f"window {reader['read_chunk_window_s']:.1f}s, Arrow conversion and the rest {reader['arrow_and_other_s']:.1f}s"
    )
    for run in [*results.get("ours", []), *results.get("in_query", []), *([correction] if correction else [])]:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in run["cpu_s_by_part"].items())
        rss = ", ".join(f"{k} {v:,.0f}" for k, v in run["peak_rss_mib_by_part"].items())
        check = "" if run["rows_recorded"] == run["rows_in_iceberg"] == run["rows"] else "  <-- ROW COUNT MISMATCH"
        lines += [
            f"{run['label']:<10} Spark start {run['spark_start_s']:.1f}s (not in wall s); CPU s by part: {parts}; "
            f"chunks {run['chunks']}, rows recorded {run['rows_recorded']:,}, in Iceberg {run['rows_in_iceberg']:,}, "
            f"window events {run['window_events']:,}{check}",
            f"{'':<10} peak RSS MiB by part: {rss}; peak PSS of the tree {run['peak_pss_mib']:,.0f} MiB; "
            f"at most {run['peak_processes']} processes",
        ]
    if correction:
        w = correction["writer"]
        lines += [
            "",
            f"Watermark correction (p{correction['parallelism']}): writer {w['updates']:,} updates in "
            f"{w['seconds']:.1f}s = {w['achieved_rate']:.0f}/s (target {w['target_rate']:.0f}/s)"
            + (f", writer error: {w['error']}" if w["error"] else ""),
            f"  rows/s {correction['rows_per_s']:,.0f} vs idle {correction['idle_rows_per_s']:,.0f}"
            f" = {correction['rows_per_s_vs_idle']:.2f}x; window events recorded in the state table: "
            f"{correction['window_events']:,}",
        ]
    memory = results.get("memory") or []
    if memory:
        lines += ["", f"Memory at parallelism {FIXED_PARALLELISM} (peak RSS of the job's process tree, MiB):"]
        lines.append(
            f"  {'rows':>12} {'RSS total':>9} {'driver':>8} {'JVM':>8} {'py workers':>10} {'PSS total':>9} "
            f"{'processes':>9} {'rows/s':>10}"
        )
        for m in memory:
            by = m["peak_rss_mib_by_part"]
            lines.append(
                f"  {m['rows']:>12,} {m['peak_rss_mib']:>9,.0f} {_fmt(by.get('driver')):>8} {_fmt(by.get('jvm')):>8} "
                f"{_fmt(by.get('python_workers')):>10} {m['peak_pss_mib']:>9,.0f} {m['peak_processes']:>9} "
                f"{m['rows_per_s']:>10,.0f}" + ("  (same run as the idle one above)" if m["reused_idle_run"] else "")
            )
    if results.get("ratios"):
        lines += ["", "Ratios:"]
        lines += [f"  {k:<42} {v:.3f}" for k, v in results["ratios"].items()]
    return "\n".join(lines)


def host_info() -> dict[str, Any]:
    """The machine a bench ran on, for its results."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_1m_at_start": os.getloadavg()[0],
    }


def write_results(results: dict[str, Any], bench: str = "snapshot") -> Path:
    """A bench's results as bench/results/<bench>-<UTC time>.json."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"{bench}-{stamp}.json"
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    return path


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"values must be at least 1, got {text!r}")
    return values


def _positive(text: str) -> int:
    values = _int_list(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one integer, got {text!r}")
    return values[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=_positive, default=1_000_000, help="rows in bench.items (default 1,000,000)")
    parser.add_argument("--chunk-size", type=_positive, default=8192, help="snapshot.chunk_size (default 8192)")
    parser.add_argument(
        "--parallelism", type=_int_list, default=[1, 2], help="comma-separated snapshot.parallelism values (1,2)"
    )
    parser.add_argument(
        "--memory-sizes",
        type=_int_list,
        default=[1_000_000, 4_000_000],
        help="comma-separated table sizes for the memory runs at parallelism 2 (1000000,4000000); '' for none",
    )
    parser.add_argument(
        "--update-rate",
        type=float,
        default=500.0,
        help="updates/s of the writer during the watermark-correction run (500; 0 skips that run)",
    )
    parser.add_argument(
        "--in-query",
        type=_int_list,
        default=[2],
        help="comma-separated parallelisms of runs whose streaming query reads the chunks (2; '' for none)",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the workers' logs (Spark, job) in the temp dir")
    add_spark_conf_option(parser)
    parser.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        result = run_worker(json.loads(args.worker))
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    results = orchestrate(args)
    print(render(results))
    path = write_results(results)
    print(f"\nresults written to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
