"""What every bench shares: a private MariaDB with the CDC user (its password in the environment), a scratch
directory kept when a run fails, the pipeline file, the job run as a user runs it (`ingest ...`) or as a worker
process of the bench, the wall, CPU and RSS of a process tree, the host, and the results printed side by side and
written to bench/results/. A bench module keeps only what it measures: its workload, its baselines, its table."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import math
import os
import platform
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
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ingest.devservers.mariadb import MariaDBServer

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
DATABASE = "bench"
CDC_USER = "bench_cdc"
PASSWORD_ENV = "INGEST_BENCH_MYSQL_PASSWORD"
SPARK_CONF_ENV = "INGEST_BENCH_SPARK_CONF"
"""`--spark-conf` settings as JSON, for the workers and jobs (which inherit the environment)."""
MIB = 1024 * 1024
STARTED_LINE = "BENCH_RUN_STARTED"
DONE_LINE = "BENCH_RUN_DONE"
RESULT_PREFIX = "BENCH_RESULT "
READY_TIMEOUT_SECONDS = 900.0
"""Spark start, discovery and the snapshot must be over within this; else a bench gives up on the job."""
STOP_TIMEOUT_SECONDS = 600.0
SCRAPE_SECONDS = 1.0


class BenchError(RuntimeError):
    """The benchmark could not run (a worker failed, a server did not start, ...)."""


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def host_info() -> dict[str, Any]:
    """The machine a bench ran on, for its results."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_1m_at_start": os.getloadavg()[0],
    }


def write_results(results: Mapping[str, Any], bench: str) -> Path:
    """A bench's results as bench/results/<bench>-<UTC time>.json."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{bench}-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------------
# One run: the results, the scratch directory, the server.

Measure = Callable[[Any, argparse.Namespace, Path, dict[str, Any]], None]
"""`measure(server, args, scratch, results)`: what a bench measures, into `results`."""


def run_bench(
    benchmark: str,
    args: argparse.Namespace,
    measure: Measure,
    render: Callable[[dict[str, Any]], str],
    *,
    mariadb: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`measure` on a private MariaDB (`mariadb`: its arguments; None for none) with the CDC user, its password in
    the environment; then the results rendered, printed and written. The scratch directory (logs, warehouses) is
    kept after a failure (an exception, or `results["failure"]`) and with `--keep-logs`."""
    os.environ[PASSWORD_ENV] = "bench-" + secrets.token_hex(8)  # the jobs inherit it; the pipeline names it
    results: dict[str, Any] = {"benchmark": benchmark, "started_at": now(), "host": host_info(), "args": vars(args)}
    if hasattr(args, "spark_conf"):
        args.spark_conf = share_spark_conf(args.spark_conf)
    scratch = Path(tempfile.mkdtemp(prefix=f"ingest-bench-{benchmark}-"))
    try:
        with contextlib.ExitStack() as stack:
            server = None
            if mariadb is not None:  # its data in the scratch directory: it survives a stop and start
                server = stack.enter_context(private_mariadb(base_dir=scratch / "mariadb", **mariadb))
            measure(server, args, scratch, results)
    except BaseException:
        progress(f"failed; logs and warehouses kept in {scratch}")
        raise
    if results.get("failure") or getattr(args, "keep_logs", False):
        progress(f"logs and warehouses kept in {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    results["finished_at"] = now()
    print(render(results))
    print(f"results: {write_results(results, benchmark)}")
    return results


@contextlib.contextmanager
def private_mariadb(**kwargs: Any) -> Iterator[MariaDBServer]:
    """A MariaDB of the bench's own with the CDC user, whose password is in the environment."""
    with MariaDBServer(**kwargs) as server:
        server.create_cdc_user(CDC_USER, os.environ[PASSWORD_ENV])
        yield server


# ---------------------------------------------------------------------------------------------------
# Arguments, Spark settings, numbers.


def int_list(text: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"values must be at least 1, got {text!r}")
    return values


def positive(text: str) -> int:
    values = int_list(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one integer, got {text!r}")
    return values[0]


def non_negative(text: str) -> int:
    return 0 if text.strip() in ("0", "") else positive(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


Option = tuple[str, Callable[[str], Any], Any, str]
"""A bench's command-line option: its flag, type, default and help."""


def parser_for(module: str, doc: str | None, options: Sequence[Option] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").split("\n\n")[0])
    for flag, kind, default, help in options:
        parser.add_argument(flag, type=kind, default=default, help=f"{help} ({default})")
    return parser


def add_common_options(parser: argparse.ArgumentParser, spark_conf: bool = True) -> None:
    """`--keep-logs`, and `--spark-conf` for the benches whose jobs take it."""
    parser.add_argument("--keep-logs", action="store_true", help="keep the logs and warehouses in the temp dir")
    if spark_conf:
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


def spark_conf_note(conf: Mapping[str, str] | None) -> str:
    """For a report's first line: the `--spark-conf` settings, if any."""
    return "; spark.conf " + ", ".join(f"{k}={v}" for k, v in conf.items()) if conf else ""


def fmt(value: Any, spec: str = ",.0f") -> str:
    """A number for a table; `-` for None and NaN."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return format(value, spec)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def per_million(seconds: float, rows: int) -> float:
    return seconds / rows * 1e6 if rows else float("nan")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def lag_stats(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "p50": rounded(percentile(values, 0.5)),
        "p95": rounded(percentile(values, 0.95)),
        "p99": rounded(percentile(values, 0.99)),
        "max": rounded(max(values)) if values else None,
        "min": rounded(min(values)) if values else None,
    }


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float] | None:
    """The slope of the least-squares line through the points and its centre (mean x, mean y); None for fewer
    than two distinct xs."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx, mx, my


@dataclass(frozen=True)
class Column:
    """One column of a text table: its title, width and number format (the first column is left-aligned)."""

    title: str
    width: int
    spec: str = ",.0f"


def columns(spec: str) -> list[Column]:
    """Columns from `title:width[:format]` items separated by `;`."""
    out = []
    for item in spec.split(";"):
        title, width, *number = item.strip().split(":")
        out.append(Column(title, int(width), *number))
    return out


def text_table(
    columns: Sequence[Column], rows: Sequence[Sequence[Any]], sep: str = " ", rule: bool = True
) -> list[str]:
    """A header, a rule under it (`rule`) and the rows: text as it is, numbers in the column's format."""

    def cell(c: Column, value: Any, first: bool) -> str:
        text = value if isinstance(value, str) else fmt(value, c.spec)
        return f"{text:<{c.width}}" if first else f"{text:>{c.width}}"

    header = sep.join(f"{c.title:<{c.width}}" if i == 0 else f"{c.title:>{c.width}}" for i, c in enumerate(columns))
    lines = [header, "-" * len(header)] if rule else [header]
    return lines + [sep.join(cell(c, v, i == 0) for i, (c, v) in enumerate(zip(columns, r, strict=True))) for r in rows]


def pick(values: Mapping[str, Any], keys: str) -> list[Any]:
    """The values of the space-separated `keys`, in order: a table row from a result."""
    return [values[k] for k in keys.split()]


def ratio_lines(ratios: Mapping[str, float | None], width: int = 42) -> list[str]:
    """The `Ratios:` block a bench's report ends with."""
    return ["", "Ratios:", *(f"  {k:<{width}} {fmt(v, '.3f')}" for k, v in ratios.items())] if ratios else []


# ---------------------------------------------------------------------------------------------------
# The pipeline file.


def embedded_catalog(base: Path) -> dict[str, str]:
    """Catalog properties of an embedded warehouse under `base`: a SQLite JDBC catalog and local files."""
    return {"type": "jdbc", "uri": f"jdbc:sqlite:{base}/catalog.db", "warehouse": f"file://{base}/warehouse"}


def pipeline_document(
    name: str, host: str, port: int, include: str, warehouse: Path, server_id: int, **sections: Any
) -> dict[str, Any]:
    """A pipeline from the private MariaDB (as the CDC user) into an embedded warehouse; `sections` are added as
    they are (`spark`'s master comes with the `--spark-conf` settings)."""
    warehouse.mkdir(parents=True, exist_ok=True)  # the SQLite catalog file's directory must exist
    if "spark" in sections:
        sections["spark"] = {**sections["spark"], "conf": json.loads(os.environ.get(SPARK_CONF_ENV, "{}"))}
    source = {"host": host, "port": port, "user": CDC_USER, "password": {"env": PASSWORD_ENV}, "flavor": "mariadb"}
    return {
        "name": name,
        "source": {**source, "server_id": server_id},
        "tables": {"include": [include]},
        "sink": {"catalog_name": "lake", "catalog": embedded_catalog(warehouse), **sections.pop("sink", {})},
        **sections,
    }


def write_pipeline(document: Mapping[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")  # JSON is YAML
    return path


# ---------------------------------------------------------------------------------------------------
# CPU and memory of a process tree, from /proc.

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CPU_METHOD = (
    "/proc/<pid>/stat: utime+stime of every live process of the job's tree, plus cutime+cstime "
    "(exited children the parent waited for)"
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
    start_ticks: int = 0
    """When the process started (clock ticks after boot): with the pid, one process, as pids are reused."""


def _proc_stat(pid: int) -> ProcSample | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The name is in parentheses and may itself contain spaces or parentheses.
    name = text[text.index("(") + 1 : text.rindex(")")]
    f = text[text.rindex(")") + 2 :].split()
    # f[0] is field 3 (state) of proc(5): ppid 4, utime 14, stime 15, cutime 16, cstime 17, starttime 22, rss 24.
    cpu, children = (int(f[11]) + int(f[12])) / CLOCK_TICKS, (int(f[13]) + int(f[14])) / CLOCK_TICKS
    return ProcSample(pid, int(f[1]), name, cpu, children, int(f[21]) * PAGE_SIZE, int(f[19]))


def all_processes() -> dict[int, ProcSample]:
    """Every live process, by pid."""
    return {s.pid: s for e in os.scandir("/proc") if e.name.isdigit() and (s := _proc_stat(int(e.name)))}


def process_tree(root: int) -> list[ProcSample]:
    """The live processes of the tree rooted at `root`, root included."""
    samples = all_processes()
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


def tree_part(sample: ProcSample, root: int) -> str:
    if sample.pid == root:
        return "driver"
    return "jvm" if sample.name == "java" else "python_workers"


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds so far of the tree by part (driver, jvm, python_workers); exited children count via their parent."""
    by: dict[str, float] = defaultdict(float)
    for sample in process_tree(root):
        by[tree_part(sample, root)] += sample.cpu + sample.children_cpu
    return dict(by)


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
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


def tree_memory(root: int) -> dict[str, Any]:
    """RSS of the tree by part and in all, its PSS, how many processes and open descriptors it has."""
    tree = process_tree(root)
    by: dict[str, int] = defaultdict(int)
    fds = 0
    for s in tree:
        by[tree_part(s, root)] += s.rss
        with contextlib.suppress(OSError):
            fds += len(os.listdir(f"/proc/{s.pid}/fd"))
    pss = sum(proportional_set_size(s.pid) or 0 for s in tree)
    return {"rss": sum(by.values()), "by": dict(by), "pss": pss, "processes": len(tree), "fds": fds}


class TreeMonitor:
    """Samples the RSS (and PSS) of a process tree every `interval` seconds in a thread; keeps the peaks.

    It runs in the orchestrating process, outside the measured tree: reading every process's smaps costs CPU (in
    the kernel, charged to the reader) that must not count as the job's. RSS sums count pages shared between
    processes once per process; PSS splits them, so the PSS sum is closer to what the tree really occupies."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root, self.interval = root, interval
        self.peak_total = self.peak_pss = self.peak_processes = self.samples = 0
        self.peak_by: dict[str, int] = defaultdict(int)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-monitor", daemon=True)

    def _sample(self) -> None:
        m = tree_memory(self.root)
        self.peak_total, self.peak_pss = max(self.peak_total, m["rss"]), max(self.peak_pss, m["pss"])
        self.peak_processes = max(self.peak_processes, m["processes"])
        for key, value in m["by"].items():
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
        return {
            "peak_rss_mib": round(self.peak_total / MIB, 1),
            "peak_rss_mib_by_part": {k: round(v / MIB, 1) for k, v in sorted(self.peak_by.items())},
            "peak_pss_mib": round(self.peak_pss / MIB, 1),
            "peak_processes": self.peak_processes,
            "rss_samples": self.samples,
        }


def mariadb_cpu(server: MariaDBServer) -> float | None:
    """CPU seconds so far of the MariaDB server (context only: it is never counted as ours)."""
    try:
        pid = int((server.base_dir / "mysqld.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    sample = next((s for s in process_tree(pid) if s.pid == pid), None)
    return None if sample is None else sample.cpu


@contextlib.contextmanager
def mariadb_cpu_into(server: MariaDBServer, result: dict[str, Any]) -> Iterator[None]:
    """`result["mariadb_cpu_s"]`: the server's CPU seconds over the block."""
    before = mariadb_cpu(server)
    yield
    after = mariadb_cpu(server)
    result["mariadb_cpu_s"] = None if before is None or after is None else round(after - before, 3)


def measured_here(server: MariaDBServer, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`body()` in this process (a baseline): its result with wall, CPU and rate (`rows` of the result)."""
    out: dict[str, Any] = {"load_avg_1m_before": os.getloadavg()[0]}
    with mariadb_cpu_into(server, out):
        cpu, started = time.process_time(), time.perf_counter()
        out.update(body())
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    rows = int(out["rows"])
    out.update(seconds=round(wall, 3), rows_per_s=rows / wall if wall else float("nan"), cpu_s=round(cpu, 3))
    out["cpu_s_per_million"] = per_million(cpu, rows)
    return out


# ---------------------------------------------------------------------------------------------------
# The job: `ingest ...` as a user runs it, a worker process of the bench, a long-running `ingest run`.


def ingest(config_file: Path, *args: str, timeout: float = 3600) -> float:
    """Seconds of `ingest ARGS --config FILE` as a user runs it; a failure stops the bench with its log."""
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "ingest.cli", *args, "--config", str(config_file)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise BenchError(f"ingest {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return round(time.perf_counter() - started, 3)


def catch_up_and_verify(config_file: Path, label: str) -> float:
    """`ingest run --until-caught-up`, then `ingest verify` (a difference stops the bench); the run's seconds."""
    progress(f"{label}: catch-up")
    seconds = ingest(config_file, "run", "--until-caught-up")
    progress(f"{label}: verify")
    ingest(config_file, "verify")
    return seconds


def run_verify(config_file: Path) -> dict[str, Any]:
    """`ingest verify` as a user runs it: its exit code and output."""
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "ingest.cli", "--log-level", "WARNING", "verify", "--config", str(config_file)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False)
    return {
        "exit_code": done.returncode,
        "ok": done.returncode == 0,
        "seconds": round(time.perf_counter() - started, 3),
        "output": done.stdout.splitlines() + done.stderr.splitlines(),
    }


def start_spark(config: Any, label: str) -> tuple[Any, float]:
    """In a worker: logging to stderr (the parent's log file) and the job's Spark session; its start's seconds."""
    from ingest.runtime.spark import spark_session

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    started = time.perf_counter()
    spark = spark_session(config.spark, config.sink, f"bench-{label}")
    return spark, time.perf_counter() - started


def measured_tree(body: Callable[[], None]) -> dict[str, Any]:
    """In a worker: `body()` between STARTED_LINE and DONE_LINE (the parent samples the tree's memory then); its
    wall and the CPU of the worker's tree by part."""
    root, load = os.getpid(), os.getloadavg()[0]
    before = tree_cpu(root)
    print(STARTED_LINE, flush=True)
    started = time.perf_counter()
    body()
    wall = time.perf_counter() - started
    after = tree_cpu(root)
    print(DONE_LINE, flush=True)  # body returned: after a SIGTERM, the job has stopped here
    cpu = cpu_delta(before, after)
    return {"seconds": round(wall, 3), "cpu": cpu, "cpu_s": round(sum(cpu.values()), 3), "load_avg_1m_before": load}


def worker_main(argv: Sequence[str], run: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
    """In a worker (`--worker SPEC` in `argv`): `run(spec)` and its result on stdout; False if not a worker."""
    if "--worker" not in argv:
        return False
    result = run(json.loads(argv[list(argv).index("--worker") + 1]))
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return True


class Worker:
    """`python -m <module> --worker SPEC` in its own session; its stdout lines are marks (`marks`) and the result,
    its stderr goes to `log_path`. From STARTED_LINE to DONE_LINE a TreeMonitor samples its tree, and the hooks
    `on_started` and `on_done` run (on_done also if it ends without DONE_LINE)."""

    def __init__(
        self,
        module: str,
        spec: Mapping[str, Any],
        log_path: Path,
        *,
        marks: Sequence[str] = (),
        monitor_interval: float = 1.0,
        on_started: Callable[[], None] | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.spec, self.log_path = spec, log_path
        self.marks: dict[str, float] = {}
        self.result: dict[str, Any] | None = None
        self.exit_time: float | None = None
        self._events = {line: threading.Event() for line in (STARTED_LINE, DONE_LINE, *marks)}
        self._hooks = {STARTED_LINE: on_started, DONE_LINE: on_done}
        self.monitor = TreeMonitor(0, monitor_interval)
        self._exited = threading.Event()
        self._log = open(log_path, "a")  # closed in finish() or __exit__
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--worker", json.dumps(spec)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            start_new_session=True,  # a kill on failure reaches its JVM and Python workers too
        )
        self.monitor.root = self.proc.pid
        self._thread = threading.Thread(target=self._read, name=f"worker-{spec['label']}", daemon=True)
        self._thread.start()

    def _mark(self, line: str) -> None:
        self.marks[line] = time.time()
        self._events[line].set()
        if line == STARTED_LINE:
            self.monitor.start()
        elif line == DONE_LINE:
            self.monitor.stop()
        hook = self._hooks.get(line)
        if hook is not None:
            hook()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for raw in self.proc.stdout:
                line = raw.rstrip("\n")
                if line in self._events:
                    self._mark(line)
                elif line.startswith(RESULT_PREFIX):
                    self.result = json.loads(line[len(RESULT_PREFIX) :])
                else:
                    self._log.write(line + "\n")
                    self._log.flush()
        finally:
            self.monitor.stop()
            if DONE_LINE not in self.marks and self._hooks[DONE_LINE] is not None:
                self._hooks[DONE_LINE]()  # type: ignore[misc]
            self.proc.wait()
            self.exit_time = time.time()
            self._exited.set()

    def wait_for(self, line: str, timeout: float) -> bool:
        """True once the worker printed `line`; False if it exited first or the timeout passed."""
        deadline = time.monotonic() + timeout
        while not self._events[line].wait(0.2):
            if self._exited.is_set() or time.monotonic() > deadline:
                return self._events[line].is_set()
        return True

    def terminate(self) -> float:
        """SIGTERM to the job's driver only (its handler asks for a stop after the current commit)."""
        os.kill(self.proc.pid, signal.SIGTERM)
        return time.time()

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def finish(self, timeout: float = 3600) -> dict[str, Any]:
        """The worker's result with its tree's peaks; a BenchError with its log's tail if it failed."""
        if not self._exited.wait(timeout):
            self.kill()
            self._exited.wait(30)
        self._thread.join(5)
        self._log.close()
        code = self.proc.returncode
        if code != 0 or self.result is None:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])
            raise BenchError(f"worker {self.spec['label']} failed (exit {code}); log {self.log_path}, tail:\n{tail}")
        return {**self.result, **(self.monitor.peaks() if self.monitor.samples else {})}

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if et is not None:
            self.kill()
            if not self._log.closed:
                self._thread.join(5)
                self._log.close()


def parse_exposition(text: str) -> dict[str, float]:
    """Prometheus text format to {metric name: sum of its samples' values} (labels summed over)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(value)
    return out


def read_metrics(port: int, timeout: float = 5.0) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
            return parse_exposition(response.read().decode())
    except (OSError, urllib.error.URLError):
        return None


@dataclass(frozen=True)
class Scrape:
    """One second's reading of the job."""

    at: float
    """Seconds since the scraper started."""
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


class Scraper:
    """Every SCRAPE_SECONDS, in a thread: `/metrics` of the job and the RSS of its tree (read from outside it)."""

    def __init__(self, root: int, port: int) -> None:
        self.root, self.port, self.t0 = root, port, time.monotonic()
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
        tree = tree_memory(self.root)
        return Scrape(
            at=time.monotonic() - self.t0,
            lag_s=m.get("ingest_lag_seconds"),
            bytes_behind=m.get("ingest_binlog_bytes_behind"),
            applied=m.get("ingest_binlog_changes_applied_total"),
            batches=m.get("ingest_batch_duration_seconds_count"),
            batch_seconds=m.get("ingest_batch_duration_seconds_sum"),
            rss=tree["rss"],
            jvm_rss=tree["by"].get("jvm", 0),
            processes=tree["processes"],
            fds=tree["fds"],
        )

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            point = self.scrape()
            with self._lock:
                self.points.append(point)
            next_at += SCRAPE_SECONDS
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def start(self) -> None:
        self._thread.start()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def between(self, lo: float, hi: float) -> list[Scrape]:
        with self._lock:
            return [p for p in self.points if lo < p.at <= hi]

    def lag(self, lo: float, hi: float) -> dict[str, float | None]:
        """Lag percentiles of the scrapes in (lo, hi]."""
        return lag_stats([p.lag_s for p in self.between(lo, hi) if p.lag_s is not None])


class JobProcess:
    """`ingest run --config FILE` in its own session (the job exactly as a user runs it), its metrics endpoint on
    `metrics_port`; its output goes to a log file. `ready()` waits for the binlog phase, `scrape()` starts reading
    its /metrics and its process tree every second, `stop()` sends SIGTERM and waits for the exit code."""

    def __init__(self, config_path: Path, log_path: Path, metrics_port: int) -> None:
        self.log_path, self.port = log_path, metrics_port
        self._log = open(log_path, "ab")  # closed in wait() or __exit__
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", "run", "--config", str(config_path)],
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a kill on failure reaches its JVM and Python workers too
        )
        self._read_to = 0
        self.scraper: Scraper | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> float:
        """Wait until the job reports a lag (it does from the binlog phase on); the seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if not self.alive():
                raise BenchError(
                    f"the job exited (code {self.proc.returncode}) before the binlog phase:\n{self.tail()}"
                )
            m = read_metrics(self.port, timeout=2.0)
            if m is not None and "ingest_lag_seconds" in m:
                return round(time.monotonic() - started, 3)
            time.sleep(1.0)
        raise BenchError(f"the job did not reach the binlog phase within {timeout:.0f} s; log {self.log_path}")

    def scrape(self) -> Scraper:
        """Start scraping; the scrapes' times count from now."""
        self.scraper = Scraper(self.pid, self.port)
        self.scraper.start()
        return self.scraper

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> int | None:
        """SIGTERM to the driver only (the job stops after reading what the source wrote before it); the exit code,
        or None (and the tree killed) if it did not exit within `timeout`. The scraper stops after it."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        self._log.close()
        if self.scraper is not None:
            self.scraper.stop()
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

    def tail(self, lines: int = 40) -> str:
        return f"log {self.log_path}:\n" + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_log(self, found: Callable[[list[str]], bool], what: str, lines: list[str]) -> float:
        """Read the job's new log lines into `lines` until `found(lines)`; the monotonic time then."""
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline and self.alive():
            lines += self.new_log_lines()
            if found(lines):
                return time.monotonic()
            time.sleep(0.5)
        raise BenchError(f"the job did not {what}; {self.tail()}")

    def __enter__(self) -> JobProcess:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.kill()
        if not self._log.closed:
            self._log.close()
        if self.scraper is not None:
            self.scraper.stop()


class PacedWriter:
    """Single-statement autocommit transactions at about `rate` per second, in a thread, as root.

    Subclasses say what one statement is (`write`); `written` counts them. A writer that falls behind keeps
    its pace instead of bursting. An error stops it and is reported with the results."""

    def __init__(self, server: MariaDBServer, rate: float, name: str) -> None:
        self.server, self.rate = server, rate
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

    def summary(self) -> dict[str, Any]:
        return {
            "target_rate": self.rate,
            "statements": self.written,
            "seconds": round(self.seconds, 3),
            "achieved_rate": self.written / self.seconds if self.seconds else 0.0,
            "error": self.error,
        }
