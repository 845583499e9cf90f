"""The job against a peer, Debezium's MariaDB connector (embedded, `bench/peer/CountingEngine.java`), on the same data
in one run: a snapshot of bench.items and a catch-up over a recorded binlog, each against its raw baseline,
`--rounds` times, medians shown. Debezium's jars are fetched by mvn into the tools cache the first time. See
bench/README.md.

    .venv/bin/python -m bench.peer                                           # 1,000,000 rows, 200,000 changes, 3 rounds
    .venv/bin/python -m bench.peer --rows 50000 --changes 20000 --rounds 1   # a quick one
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import harness
from bench.binlog import BASELINE_SERVER_ID, JOB_SERVER_ID, make_config, measure_catchup, measure_raw_parse
from bench.many_tables import pipeline_file
from bench.tables import (
    TABLE,
    TABLES,
    create_table,
    create_tables,
    drop_table,
    fill_table,
    load_initial,
    record_binlog,
    select_all,
)
from ingest.config import parse_config
from ingest.devservers.mariadb import CDC_GRANTS, MariaDBServer
from ingest.model.position import BinlogPosition
from ingest.runtime.cache import tools_dir

DEBEZIUM_VERSION = "3.5.0.Final"
"""Debezium's embedded engine, MariaDB connector and file storage, all of one version (bench/peer/pom.xml)."""
PEER_DIR = Path(__file__).resolve().parent / "peer"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
"""Pinned, as scripts/setup.sh pins it for the Iceberg jars."""
ENGINE_CLASS = "CountingEngine"
ENGINE_HEAP = "-Xmx2g"
"""The Debezium JVM's heap: as much as the job's Spark driver (2 GB)."""
DEBEZIUM_SERVER_ID = 5601
"""Debezium's replica id, apart from the job's and the baseline's (bench.binlog) so none disconnects another."""
TOPIC_PREFIX = "peer"
STALL_SECONDS = 300.0
"""Debezium is stopped as failed when it prints nothing (no progress line, sent at most once a second) this long."""
EXIT_GRACE_SECONDS = 30.0
"""How long the engine may take to exit once it printed that it reached its target (it exits at once)."""
EXTRA_GRANTS = "none"
"""What Debezium was granted beyond the job's CDC user: nothing (snapshot.locking.mode=none needs no RELOAD)."""


# ---------------------------------------------------------------------------------------------------
# Debezium: jars, the program, a run.


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def fetch_jars(home: Path) -> Path:
    """Debezium's jars and their dependencies from Maven Central into `home`/lib, once per pom."""
    lib, pom = home / "lib", PEER_DIR / "pom.xml"
    marker = lib / f".complete-{_digest(pom)}"
    if marker.exists():
        return lib
    harness.progress(f"fetching Debezium {DEBEZIUM_VERSION} jars with mvn into {lib}")
    shutil.rmtree(lib, ignore_errors=True)
    done = subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(pom),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={lib}",
            f"-Dmaven.repo.local={home / 'm2'}",
            f"-Ddebezium.version={DEBEZIUM_VERSION}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise harness.BenchError(
            f"mvn could not fetch Debezium {DEBEZIUM_VERSION}:\n{(done.stdout + done.stderr)[-3000:]}"
        )
    marker.touch()
    return lib


def compile_engine(home: Path, lib: Path) -> Path:
    """CountingEngine.java compiled against the jars, into a directory named after the source's digest."""
    source = PEER_DIR / f"{ENGINE_CLASS}.java"
    classes = home / f"classes-{_digest(source)}"
    if (classes / f"{ENGINE_CLASS}.class").exists():
        return classes
    building = Path(tempfile.mkdtemp(prefix="classes-", dir=home))
    done = subprocess.run(
        ["javac", "-cp", f"{lib}/*", "-d", str(building), str(source)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise harness.BenchError(f"javac failed on {source}:\n{done.stderr[-3000:]}")
    building.rename(classes)
    return classes


def debezium_classpath() -> str:
    """The classpath of CountingEngine, fetching and compiling what is missing."""
    home = tools_dir() / f"debezium-{DEBEZIUM_VERSION}"
    home.mkdir(parents=True, exist_ok=True)
    lib = fetch_jars(home)
    return f"{lib}/*:{compile_engine(home, lib)}"


def engine_properties(server: MariaDBServer, tables: str, snapshot_mode: str) -> dict[str, str]:
    """The connector's settings: the CDC user, in-memory offsets and schema history, no locks, one record a change."""
    return {
        "name": "bench-peer",
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "offset.storage": f"{ENGINE_CLASS}$SeededOffsetStore",
        "offset.flush.interval.ms": "60000",
        "schema.history.internal": "io.debezium.relational.history.MemorySchemaHistory",
        "database.hostname": server.host,
        "database.port": str(server.port),
        "database.user": harness.CDC_USER,
        "database.server.id": str(DEBEZIUM_SERVER_ID),
        "topic.prefix": TOPIC_PREFIX,
        "database.include.list": harness.DATABASE,
        "table.include.list": rf"{harness.DATABASE}\.({tables})",
        "snapshot.mode": snapshot_mode,
        "snapshot.locking.mode": "none",
        # One record per row change, as the baselines count: no tombstone after a delete, no DDL records.
        "tombstones.on.delete": "false",
        "include.schema.changes": "false",
        "bench.password.env": harness.PASSWORD_ENV,
    }


def write_properties(values: Mapping[str, str], path: Path) -> Path:
    """`values` as a Java properties file (a backslash is an escape there, so it is doubled)."""
    path.write_text("".join(f"{key}={value.replace(chr(92), chr(92) * 2)}\n" for key, value in values.items()))
    return path


def _lines(proc: subprocess.Popen[str]) -> Iterator[dict[str, Any]]:
    """The engine's JSON lines as they come; a BenchError if it is silent for STALL_SECONDS."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, name="debezium-stdout", daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=STALL_SECONDS)
        except queue.Empty:
            raise harness.BenchError(f"Debezium printed nothing for {STALL_SECONDS:.0f} s") from None
        if line is None:
            return
        if line.startswith("{"):
            yield json.loads(line)


def _engine_events(classpath: str, properties: Path, log: Path) -> tuple[float, dict[str, dict[str, Any]], float]:
    """Run the engine to its end; the launch time, its last line of each event, and the CPU seconds it used."""
    events: dict[str, dict[str, Any]] = {}
    cpu_before = _children_cpu()
    with open(log, "w") as stderr:
        launched = time.time()
        proc = subprocess.Popen(
            ["java", ENGINE_HEAP, "-cp", classpath, ENGINE_CLASS, str(properties)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
        try:
            for event in _lines(proc):
                events[event["event"]] = event
                if event["event"] in ("done", "stopped"):
                    break
        finally:
            _end(proc, grace=EXIT_GRACE_SECONDS if "done" in events else 0)
    return launched, events, _children_cpu() - cpu_before


def _end(proc: subprocess.Popen[str], grace: float) -> None:
    """Wait `grace` seconds for the engine to exit by itself, then kill it; reaped either way."""
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children (the engine's JVM is the only one that ends meanwhile)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_engine(classpath: str, settings: dict[str, str], target: int, log: Path) -> dict[str, Any]:
    """CountingEngine until it counted `target` records of `settings['bench.count']`; its times and rates."""
    properties = write_properties({**settings, "bench.target": str(target)}, log.with_suffix(".properties"))
    load = os.getloadavg()[0]
    launched, events, cpu = _engine_events(classpath, properties, log)
    done = events.get("done")
    if done is None:
        stopped = events.get("stopped", {})
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise harness.BenchError(f"Debezium stopped before {target:,} records: {stopped}; log {log}, tail:\n{tail}")
    end = done["t_ms"] / 1000
    start, first = events["engine_start"]["t_ms"] / 1000, events["first"]["t_ms"] / 1000
    counted = int(done[settings["bench.count"]])
    return {
        "records": counted,
        "snapshot_records": done["snapshot"],
        "streaming_records": done["streaming"],
        "process_s": round(end - launched, 3),
        "engine_s": round(end - start, 3),
        "to_first_s": round(first - start, 3),
        "after_first_s": round(end - first, 3),
        "rows_per_s": counted / (end - launched),
        "engine_rows_per_s": counted / (end - start),
        "after_first_rows_per_s": (counted - 1) / (end - first) if end > first else None,
        "cpu_s": round(cpu, 3),
        "load_avg_1m_before": load,
    }


# ---------------------------------------------------------------------------------------------------
# Snapshot.


def our_snapshot(server: MariaDBServer, scratch: Path) -> dict[str, Any]:
    """`ingest run --snapshot-only` of bench.items into a fresh warehouse, timed as a user waits for it."""
    config_file = pipeline_file(server, harness.DATABASE, scratch)
    load = os.getloadavg()[0]
    seconds = harness.ingest(config_file, "run", "--snapshot-only")
    rows = iceberg_rows(config_file, TABLE)
    return {"rows": rows, "process_s": round(seconds, 3), "rows_per_s": rows / seconds, "load_avg_1m_before": load}


def iceberg_rows(config_file: Path, table: str) -> int:
    """The rows of the table's Iceberg target, from its current snapshot's summary."""
    from ingest.sink.catalog import load_pyiceberg_catalog

    config = parse_config(yaml.safe_load(config_file.read_text()))
    target = load_pyiceberg_catalog(config.sink).load_table(config.target_for(harness.DATABASE, table))
    snapshot = target.current_snapshot()
    return int(snapshot.summary["total-records"]) if snapshot is not None and snapshot.summary else 0


def snapshot_round(server: MariaDBServer, rows: int, classpath: str, scratch: Path) -> dict[str, Any]:
    """The baseline, Debezium's initial_only snapshot and ours, one after the other over bench.items."""
    harness.progress(f"{scratch.name}: baseline, PyMySQL SSCursor SELECT *")
    out = {"baseline": select_all(server, [f"{harness.DATABASE}.{TABLE}"])}
    harness.progress(f"{scratch.name}: Debezium initial_only (log {scratch}/debezium.log)")
    settings = {**engine_properties(server, TABLE, "initial_only"), "bench.count": "snapshot"}
    out["debezium"] = run_engine(classpath, settings, rows, scratch / "debezium.log")
    harness.progress(f"{scratch.name}: ours, ingest run --snapshot-only")
    out["ours"] = our_snapshot(server, scratch / "ours")
    return out


def measure_snapshot(server: MariaDBServer, rows: int, rounds: int, classpath: str, scratch: Path) -> dict[str, Any]:
    """bench.items of `rows` rows read by the three, `rounds` times in turn; then the table is dropped."""
    create_table(server, TABLE)
    harness.progress(f"snapshot: loading {rows:,} rows into {harness.DATABASE}.{TABLE}")
    out: dict[str, Any] = {"load_s": round(fill_table(server, TABLE, rows), 3), "rounds": []}
    for r in range(1, rounds + 1):
        (scratch / f"snapshot-{r}").mkdir()
        out["rounds"].append(snapshot_round(server, rows, classpath, scratch / f"snapshot-{r}"))
    drop_table(server, TABLE)
    return out


# ---------------------------------------------------------------------------------------------------
# Catch-up.


def gtid_at(server: MariaDBServer, position: str) -> str:
    """The server's GTID position at a binlog file:pos (what a replica resuming there by GTID asks for)."""
    at = BinlogPosition.parse(position)
    with server.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (at.file, at.pos))
        row = cur.fetchone()
    if not row or row[0] is None:
        raise harness.BenchError(f"the server has no GTID position at {position}")
    return str(row[0])


def streaming_settings(server: MariaDBServer, start: str) -> dict[str, str]:
    """Debezium resuming at `start` (file:pos) with a schema history rebuilt from the tables (recovery)."""
    at = BinlogPosition.parse(start)
    return {
        **engine_properties(server, "|".join(TABLES), "recovery"),
        "bench.count": "streaming",
        "bench.offset.file": at.file,
        "bench.offset.pos": str(at.pos),
        "bench.offset.gtids": gtid_at(server, start),
    }


def round_spec(server: MariaDBServer, scratch: Path) -> dict[str, Any]:
    """bench.binlog's worker spec for one round's catch-up: its own warehouse under `scratch`."""
    (scratch / "warehouse").mkdir(parents=True)  # the SQLite catalog file's directory must exist
    spec = {"host": server.host, "port": server.port, "warehouse": str(scratch / "warehouse")}
    return {**spec, "kind": "catchup", "label": scratch.name}


def prepare_binlog(server: MariaDBServer, specs: list[dict[str, Any]], changes: int, initial: int) -> dict[str, Any]:
    """bench.binlog's tables, loaded and snapshotted by the job into each round's warehouse, then the recorded
    binlog; its range."""
    create_tables(server)
    keys = load_initial(server, initial)
    for spec in specs:
        log = Path(spec["warehouse"]).parent / "snapshot.log"
        harness.progress(f"catch-up: the job's snapshot of the initial rows for {spec['label']} (log {log})")
        with harness.Worker("bench.binlog", {**spec, "kind": "snapshot"}, log) as worker:
            worker.finish()
    harness.progress(f"catch-up: recording at least {changes:,} row changes")
    return record_binlog(server, make_config(specs[0]), keys, changes)


def catchup_round(
    server: MariaDBServer, binlog: Mapping[str, Any], spec: dict[str, Any], classpath: str
) -> dict[str, Any]:
    """The recorded range read by the raw parse, by Debezium from its start and by the job's catch-up."""
    scratch, config = Path(spec["warehouse"]).parent, make_config(spec)
    harness.progress(f"{spec['label']}: raw parse of {binlog['start']} .. {binlog['end']}")
    out = {"baseline": measure_raw_parse(server, config, binlog["start"], binlog["end"])}
    harness.progress(f"{spec['label']}: Debezium from {binlog['start']} (log {scratch}/debezium.log)")
    settings = streaming_settings(server, binlog["start"])
    out["debezium"] = run_engine(classpath, settings, out["baseline"]["rows"], scratch / "debezium.log")
    harness.progress(f"{spec['label']}: ours, run(until_caught_up=True) (log {scratch}/catchup.log)")
    out["ours"] = measure_catchup(server, spec, config, scratch / "catchup.log")
    return out


def measure_streaming(
    server: MariaDBServer, changes: int, initial: int, rounds: int, classpath: str, scratch: Path
) -> dict[str, Any]:
    """One recorded binlog, read by the three `rounds` times in turn (each of ours from its own snapshot)."""
    specs = [round_spec(server, scratch / f"catchup-{r}") for r in range(1, rounds + 1)]
    binlog = prepare_binlog(server, specs, changes, initial)
    harness.progress(f"catch-up: recorded {binlog['rows_affected']:,} row changes in {binlog['seconds']:.1f} s")
    return {"binlog": binlog, "rounds": [catchup_round(server, binlog, spec, classpath) for spec in specs]}


# ---------------------------------------------------------------------------------------------------
# Medians over the rounds.


def median_of(values: list[Any]) -> Any:
    """The median of each number over the rounds, field by field; a flag holds if it held in every round;
    anything else is the first round's."""
    first = values[0]
    if isinstance(first, bool):
        return all(values)
    if isinstance(first, int | float) and all(isinstance(v, int | float) for v in values):
        return statistics.median(values)
    if isinstance(first, Mapping) and all(isinstance(v, Mapping) for v in values):
        return {key: median_of([v.get(key) for v in values]) for key in first}
    return first


# ---------------------------------------------------------------------------------------------------
# Ratios and the table.


@dataclass(frozen=True)
class Measured:
    """One line of the table: what was timed, over how long, at what rate."""

    key: str
    """Its name in the JSON's ratios."""
    label: str
    seconds: float | None
    rate: float | None
    """Rows or changes per second."""
    cpu_s: float | None = None
    versus: float | None = None
    """Ours / Debezium: this line's rate over that of the Debezium line timed the same way."""


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def snapshot_lines(part: Mapping[str, Any]) -> list[Measured]:
    """The snapshot part's lines, the baseline first."""
    base, dbz, ours = part["baseline"], part["debezium"], part["ours"]
    return [
        Measured("baseline", "baseline: PyMySQL SSCursor SELECT *", base["seconds"], base["rows_per_s"], base["cpu_s"]),
        Measured(
            "debezium_launch",
            "Debezium initial_only: launch to last row",
            dbz["process_s"],
            dbz["rows_per_s"],
            dbz["cpu_s"],
        ),
        Measured("debezium_engine", "  engine start to last row", dbz["engine_s"], dbz["engine_rows_per_s"]),
        Measured("debezium_after_first", "  after its first row", dbz["after_first_s"], dbz["after_first_rows_per_s"]),
        Measured(
            "ours_launch",
            "ours: ingest run --snapshot-only [launch]",
            ours["process_s"],
            ours["rows_per_s"],
            versus=_over(ours["rows_per_s"], dbz["rows_per_s"]),
        ),
    ]


def streaming_lines(part: Mapping[str, Any]) -> list[Measured]:
    """The catch-up part's lines, the baseline first."""
    base, dbz, ours = part["baseline"], part["debezium"], part["ours"]
    warm = ours.get("after_first_batch") or {}
    whole = ours["spark_start_s"] + ours["run_seconds"]
    dbz_warm = dbz["after_first_rows_per_s"]
    return [
        Measured(
            "baseline", "baseline: python-mysql-replication rows", base["seconds"], base["rows_per_s"], base["cpu_s"]
        ),
        Measured(
            "debezium_launch",
            "Debezium recovery: launch to last change",
            dbz["process_s"],
            dbz["rows_per_s"],
            dbz["cpu_s"],
        ),
        Measured("debezium_engine", "  engine start to last change", dbz["engine_s"], dbz["engine_rows_per_s"]),
        Measured("debezium_after_first", "  after its first change", dbz["after_first_s"], dbz_warm),
        Measured(
            "ours_launch",
            "ours: Spark start + run() [launch]",
            whole,
            ours["changes"] / whole,
            versus=_over(ours["changes"] / whole, dbz["rows_per_s"]),
        ),
        Measured(
            "ours_binlog_phase",
            "ours: binlog phase [engine start]",
            ours["stream_seconds"],
            ours["changes_per_s"],
            ours["stream_cpu_s"],
            _over(ours["changes_per_s"], dbz["engine_rows_per_s"]),
        ),
        Measured(
            "ours_after_first_batch",
            "ours: after the first batch [first change]",
            warm.get("seconds"),
            warm.get("changes_per_s"),
            versus=_over(warm.get("changes_per_s"), dbz_warm),
        ),
    ]


PARTS = {"snapshot": snapshot_lines, "catchup": streaming_lines}


def ratios(results: Mapping[str, Any]) -> dict[str, Any]:
    """Each median line's throughput over the baseline's, ours over Debezium's, and the latter in every round."""
    out: dict[str, Any] = {}
    for part, lines in PARTS.items():
        table, rounds = lines(results[part]["median"]), [lines(r) for r in results[part]["rounds"]]
        for i, line in enumerate(table[1:], start=1):
            out[f"{part}_{line.key}_vs_baseline"] = _over(line.rate, table[0].rate)
            if line.key.startswith("ours"):
                out[f"{part}_{line.key}_ours_vs_debezium"] = line.versus
                out[f"{part}_{line.key}_ours_vs_debezium_by_round"] = [r[i].versus for r in rounds]
    return out


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_part(title: str, unit: str, lines: list[Measured]) -> str:
    """One part as a table: seconds, rate, CPU, the ratio to the baseline, ours / Debezium."""
    rows = [title, f"{'measurement':<46}{'seconds':>9}{unit:>12}{'CPU s':>8}{'x baseline':>12}{'ours/Dbz':>10}"]
    for line in lines:
        rows.append(
            f"{line.label:<46}{_cell(line.seconds, '.2f'):>9}{_cell(line.rate, ',.0f'):>12}"
            f"{_cell(line.cpu_s, '.1f'):>8}{_cell(_over(line.rate, lines[0].rate), '.2f'):>12}"
            f"{_cell(line.versus, '.2f'):>10}"
        )
    return "\n".join(rows)


def checks(results: Mapping[str, Any]) -> str:
    """Whether every round counted what it should: rows in Iceberg and Debezium's records, `ingest verify`."""
    snap = all(
        r["ours"]["rows"] == r["baseline"]["rows"] == r["debezium"]["records"] for r in results["snapshot"]["rounds"]
    )
    stream = all(
        r["ours"]["changes"] == r["baseline"]["rows"] == r["debezium"]["records"] and r["ours"]["verify"]["ok"]
        for r in results["catchup"]["rounds"]
    )
    verdict = {True: "OK", False: "MISMATCH (see the JSON)"}
    return (
        f"Checked in every round: snapshot rows in Iceberg and Debezium's records {verdict[snap]}; catch-up changes, "
        f"Debezium's records and ingest verify {verdict[stream]}."
    )


def spread(results: Mapping[str, Any]) -> str:
    """Ours / Debezium of each round, for the lines a reader compares first."""
    r = results["ratios"]
    by_round = [
        ("snapshot", r["snapshot_ours_launch_ours_vs_debezium_by_round"]),
        ("catch-up binlog phase", r["catchup_ours_binlog_phase_ours_vs_debezium_by_round"]),
    ]
    return "ours/Dbz by round: " + "; ".join(
        f"{name} {', '.join(_cell(v, '.2f') for v in vs)}" for name, vs in by_round
    )


def render(results: Mapping[str, Any]) -> str:
    snap, stream = results["snapshot"]["median"], results["catchup"]["median"]
    rounds = len(results["snapshot"]["rounds"])
    return "\n\n".join(
        [
            f"bench.peer: Debezium {DEBEZIUM_VERSION} MariaDB connector (embedded, counting consumer) against the "
            f"job, medians of {rounds} round(s); Debezium's grants beyond the CDC user's ({CDC_GRANTS}): "
            f"{EXTRA_GRANTS}",
            render_part(
                f"Snapshot of {harness.DATABASE}.{TABLE}, {int(snap['baseline']['rows']):,} rows",
                "rows/s",
                snapshot_lines(snap),
            ),
            render_part(
                f"Catch-up over {int(stream['baseline']['rows']):,} recorded row changes",
                "changes/s",
                streaming_lines(stream),
            ),
            "ours/Dbz: our throughput over Debezium's line timed as in [brackets] (above 1: ours is faster).\n"
            f"{spread(results)}\n{checks(results)}",
        ]
    )


# ---------------------------------------------------------------------------------------------------
# The run.


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    results["debezium"] = {
        "version": DEBEZIUM_VERSION,
        "cdc_grants": CDC_GRANTS,
        "extra_grants": EXTRA_GRANTS,
        "server_ids": {"debezium": DEBEZIUM_SERVER_ID, "job": JOB_SERVER_ID, "baseline": BASELINE_SERVER_ID},
    }
    classpath = debezium_classpath()
    results["snapshot"] = measure_snapshot(server, args.rows, args.rounds, classpath, scratch)
    results["catchup"] = measure_streaming(server, args.changes, args.initial_rows, args.rounds, classpath, scratch)
    for part in PARTS:
        results[part]["median"] = median_of(results[part]["rounds"])
    results["ratios"] = ratios(results)


def main(argv: list[str] | None = None) -> int:
    options: list[harness.Option] = [
        ("--rows", harness.positive, 1_000_000, "rows of the snapshot table"),
        ("--changes", harness.positive, 200_000, "at least this many recorded changes"),
        ("--initial-rows", harness.positive, 20_000, "rows of bench.orders before the catch-up's snapshot"),
        ("--rounds", harness.positive, 3, "times each part is measured, in turn; the table shows medians"),
    ]
    parser = harness.parser_for("bench.peer", __doc__, options)
    harness.add_common_options(parser, spark_conf=False)
    args = parser.parse_args(argv)
    harness.run_bench("peer", args, measure, render, mariadb={"extra_args": ("--innodb-buffer-pool-size=1G",)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
