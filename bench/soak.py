"""Soak: the job running for a long time under a steady mixed load (`ingest run` as a user runs it), sampled for
growth of memory, files and lag; printed: a line per sample and the flatness figures. See bench/README.md.

    .venv/bin/python -m bench.soak [--minutes 60] [--rate 500] [--sample-seconds 30] [--interval 5] [--reader-rounds 3]
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench import harness, readers
from bench.tables import MIX, TABLES, MixedWriter, create_tables, load_initial, source_counts, three_tables_document
from ingest.config import MaintenanceConfig, PipelineConfig, StreamConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.process import free_port
from ingest.devservers.trino import trino_missing

PIPELINE = "bench_soak"
JOB_SERVER_ID = 5403
FLAT_KEYS = (
    ("cores", "job cores", "cores"),
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
END_MINUTES = 10
"""The job's CPU of the run's last minutes is compared with that of its first as many (`last_over_first`)."""
MAINTENANCE_LINE = re.compile(r": maintenance in [0-9.]+ s")
WARNING_LINE = re.compile(r" (WARNING|ERROR) ingest")


def job_pipeline(server: MariaDBServer, scratch: Path, name: str, interval: float) -> tuple[Path, dict[str, Any], int]:
    """The pipeline file of a job that runs as a user runs it (bench.soak, bench.osc, bench.outage): the three
    tables into an embedded warehouse under `scratch`, maintenance at its defaults, metrics on a free port."""
    port = free_port()
    document = three_tables_document(
        name,
        JOB_SERVER_ID,
        server.host,
        server.port,
        scratch / "warehouse",
        stream={"batch_interval_seconds": interval},
        metrics={"port": port},
    )
    return harness.write_pipeline(document, scratch / f"{name}.yaml"), document, port


def job_options(rows: int, rate: float, interval: float, calm: str) -> list[harness.Option]:
    """The options of a bench that runs the job under bench.tables' mixed writer (bench.osc, bench.outage)."""
    return [
        ("--rows", int, rows, "orders (customers a quarter, events half)"),
        ("--rate", float, rate, "offered single-row transactions per second"),
        ("--interval", float, interval, "stream.batch_interval_seconds"),
        ("--calm", float, 30.0, f"seconds of load before and after {calm}"),
    ]


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
    targets = {t: table_counts(catalog, config.target_for(harness.DATABASE, t)) for t in TABLES}
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


def window_sample(points: Sequence[harness.Scrape], seconds: float) -> dict[str, Any]:
    """What one sample window's scrapes say: lag percentiles, applied changes per second, batches, RSS."""
    lags = [p.lag_s for p in points if p.lag_s is not None]
    applied = [p.applied for p in points if p.applied is not None]
    batches = [p for p in points if p.batches is not None and p.batch_seconds is not None]
    last = points[-1] if points else None
    stats = harness.lag_stats(lags)
    out: dict[str, Any] = {
        "scrapes": len(points),
        "lag_p50_s": stats["p50"],
        "lag_p95_s": stats["p95"],
        "lag_max_s": stats["max"],
        "bytes_behind_max": max((p.bytes_behind for p in points if p.bytes_behind is not None), default=None),
        "rss_mib": None if last is None else round(last.rss / harness.MIB, 1),
        "jvm_rss_mib": None if last is None else round(last.jvm_rss / harness.MIB, 1),
        "rss_max_mib": max((round(p.rss / harness.MIB, 1) for p in points), default=None),
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


def flatness(samples: Sequence[Mapping[str, Any]], key: str) -> dict[str, float | None]:
    """Per hour: the least-squares slope of `key` over the first and the second half of the samples, and the mean
    of the last quarter over the mean of the first. Samples without the value are left out."""
    points = [(float(s["elapsed_s"]) / 3600, float(s[key])) for s in samples if s.get(key) is not None]
    half = len(points) // 2
    quarter = max(1, len(points) // 4)

    def slope(part: Sequence[tuple[float, float]]) -> float | None:
        line = harness.least_squares([x for x, _ in part], [y for _, y in part])
        return None if line is None else line[0]

    first_q = [y for _, y in points[:quarter]]
    last_q = [y for _, y in points[-quarter:]]
    ratio = None
    if len(points) >= 2 and first_q and sum(first_q) != 0:
        ratio = (sum(last_q) / len(last_q)) / (sum(first_q) / len(first_q))
    return {
        "slope_first_half_per_h": harness.rounded(slope(points[:half])),
        "slope_second_half_per_h": harness.rounded(slope(points[half:])),
        "last_quarter_over_first": harness.rounded(ratio),
    }


def last_over_first(samples: Sequence[Mapping[str, Any]], key: str, seconds: float) -> float | None:
    """The mean of `key` over the samples of the run's last `seconds` over its mean over the first `seconds` (a
    job's cost that grows with the hours it has run shows here); None for a run shorter than twice `seconds`."""
    points = [(float(s["elapsed_s"]), float(s[key])) for s in samples if s.get(key) is not None]
    if not points or points[-1][0] < 2 * seconds:
        return None
    first = [y for x, y in points if x <= seconds]
    last = [y for x, y in points if x > points[-1][0] - seconds]
    if not first or not last or sum(first) == 0:
        return None
    return harness.rounded((sum(last) / len(last)) / (sum(first) / len(first)))


# ---------------------------------------------------------------------------------------------------
# The run.


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    """Run the job, offer the load, sample; fills `results`."""
    from ingest.sink.catalog import load_pyiceberg_catalog

    defaults, maintenance = StreamConfig(), MaintenanceConfig()
    results["job_settings"] = {
        "spark_master": "local[2]",
        "batch_max_changes": defaults.batch_max_changes,
        "maintenance_every_commits": maintenance.every_commits,
        "maintenance_expire_after_hours": maintenance.expire_after_hours,
    }
    results["mix"] = [f"{t}:{k}" for t, k in MIX]
    results["cpu_method"] = harness.CPU_METHOD
    create_tables(server)
    keys = load_initial(server, args.initial_rows)
    results["initial_rows"] = source_counts(server)
    config_path, document, port = job_pipeline(server, scratch, PIPELINE, args.interval)
    config, warehouse = parse_config(document, scratch), scratch / "warehouse"
    results["metrics_port"] = port
    harness.progress(f"ingest run (snapshot, then the binlog; log {scratch}/job.log), metrics on :{port}")
    with harness.JobProcess(config_path, scratch / "job.log", port) as job:
        results["ready_s"] = job.ready()
        harness.progress(f"binlog phase after {results['ready_s']:.1f}s; offering {args.rate:g} changes/s")
        catalog = load_pyiceberg_catalog(config.sink)
        start_counts = lake_counts(catalog, config, warehouse)
        tree = harness.tree_memory(job.pid)
        results["at_start"] = {
            "rss_mib": round(tree["rss"] / harness.MIB, 1),
            "jvm_rss_mib": round(tree["by"].get("jvm", 0) / harness.MIB, 1),
            "processes": tree["processes"],
            "open_fds": tree["fds"],
            **start_counts,
        }
        with harness.mariadb_cpu_into(server, results):
            cpu_before = harness.tree_cpu(job.pid)
            scraper = job.scrape()
            writer = MixedWriter(server, keys, args.rate)
            writer.start()
            samples, failure, cpu_after = sample_run(job, writer, catalog, config, warehouse, args)
        results["samples"] = samples
        results["writer"] = {**writer.summary(), "by_kind": writer.by_kind}
        results["job_cpu_s"] = round(sum(cpu_after.values()) - sum(cpu_before.values()), 3)
        results["scrapes_failed"] = scraper.failed  # before the stop: once the job exits, every scrape fails
        harness.progress(f"writer stopped after {writer.written:,} statements; SIGTERM to the job")
        stopped_at = time.monotonic()
        code = job.stop()
        results["stop_s"] = round(time.monotonic() - stopped_at, 3)
        results["job_exit_code"] = code
        results["lag_whole_run_s"] = scraper.lag(0, args.minutes * 60)
        lines = job.new_log_lines()
        results["maintenance_runs"] = (samples[-1]["maintenance_runs"] if samples else 0) + sum(
            1 for line in lines if MAINTENANCE_LINE.search(line)
        )
        results["job_warnings"] = (samples[-1]["job_warnings"] if samples else 0) + sum(
            1 for line in lines if WARNING_LINE.search(line)
        )
        results["flatness"] = {key: flatness(samples, key) for key, _, _ in FLAT_KEYS}
        results["cores_last_over_first"] = last_over_first(samples, "cores", END_MINUTES * 60)
        if failure is not None or code != 0:
            results["failure"] = failure or f"the job exited with code {code} after SIGTERM (None: killed)"
            results["job_log_tail"] = job.tail().splitlines()
            return
    results["at_end"] = lake_counts(catalog, config, warehouse)
    harness.progress("ingest verify")
    results["verify"] = harness.run_verify(config_path)
    results["source_rows"] = source_counts(server)
    if args.reader_rounds:
        harness.progress("what the targets cost their readers, against compacted copies")
        results["readers"] = readers.reader_costs(config, TABLES, args.reader_rounds, scratch)


def sample_run(
    job: harness.JobProcess, writer: MixedWriter, catalog: Any, config: PipelineConfig, warehouse: Path, args: Any
) -> tuple[list[dict[str, Any]], str | None, dict[str, float]]:
    """Every `--sample-seconds` for `--minutes`: a sample of the scrapes, the tree's CPU and the lake's counts; then
    the writer stops. The samples, why the run stopped early (or None) and the tree's CPU at the end."""
    assert job.scraper is not None
    samples: list[dict[str, Any]] = []
    maintenance_runs = warnings = 0
    count = max(1, math.floor(args.minutes * 60 / args.sample_seconds))
    written = applied = 0.0
    cpu_prev = harness.tree_cpu(job.pid)
    failure: str | None = None
    for k in range(1, count + 1):
        boundary = k * args.sample_seconds
        while job.scraper.elapsed() < boundary and job.alive():
            time.sleep(min(1.0, max(0.0, boundary - job.scraper.elapsed())))
        if not job.alive():
            failure = f"the job exited (code {job.proc.returncode}) during the soak"
            break
        if writer.error is not None:
            failure = f"the writer stopped: {writer.error}"
            break
        sample = window_sample(job.scraper.between(boundary - args.sample_seconds, boundary), args.sample_seconds)
        cpu_now = harness.tree_cpu(job.pid)
        counts = lake_counts(catalog, config, warehouse)
        lines = job.new_log_lines()
        maintenance_runs += sum(1 for line in lines if MAINTENANCE_LINE.search(line))
        warnings += sum(1 for line in lines if WARNING_LINE.search(line))
        now_applied = sample.pop("applied_total")
        samples.append(
            {
                "sample": k,
                "elapsed_s": round(boundary, 3),
                "offered_per_s": round((writer.written - written) / args.sample_seconds, 1),
                "applied_per_s": None
                if now_applied is None
                else round((now_applied - applied) / args.sample_seconds, 1),
                # exited workers count through their parent
                "cores": round((sum(cpu_now.values()) - sum(cpu_prev.values())) / args.sample_seconds, 3),
                "pss_mib": round(harness.tree_memory(job.pid)["pss"] / harness.MIB, 1),
                **sample,
                **{k_: v for k_, v in counts.items() if k_ != "by_table"},
                "maintenance_runs": maintenance_runs,
                "job_warnings": warnings,
                "by_table": counts["by_table"],
            }
        )
        written, cpu_prev = float(writer.written), cpu_now
        applied = applied if now_applied is None else now_applied
        x = samples[-1]
        harness.progress(
            f"sample {k}/{count}: RSS {x['rss_mib']} MiB (JVM {x['jvm_rss_mib']}), lag p95 "
            f"{harness.fmt(x['lag_p95_s'], '.2f')}s, files {x['data_files']}+{x['delete_files']} del, "
            f"snapshots {x['snapshots']}, metadata.json {x['metadata_files']}"
        )
    writer.stop()
    return samples, failure, harness.tree_cpu(job.pid) if job.alive() else cpu_prev


SAMPLE_COLUMNS = harness.columns(
    "#:3; min:5:.1f; offer/s:7; appl/s:7; cores:5:.2f; RSS:6; JVM:6; PSS:6; lag p50:7:.2f; p95:6:.2f; max:6:.2f; "
    "data:5; del:5; snaps:5; state:5; meta:5; maint:5"
)
FLATNESS = "slope_first_half_per_h slope_second_half_per_h last_quarter_over_first"
EMPTY_FLATNESS = dict.fromkeys(FLATNESS.split())
FLATNESS_COLUMNS = [
    harness.Column(f"{'':<28} unit", 38),
    *harness.columns("1st half /h:12:,.1f; 2nd half /h:12:,.1f; last/first q:12:.3f"),
]


def render(results: dict[str, Any]) -> str:
    a = results["args"]
    s = results["job_settings"]
    lines = [
        f"Soak: offered {a['rate']:g} changes/s for {a['minutes']:g} min, "
        f"trigger interval {a['interval']:g}s, sample every {a['sample_seconds']:g}s; "
        f"maintenance every {s['maintenance_every_commits']} commits, expiry after "
        f"{s['maintenance_expire_after_hours']} h; {results['host']['cpus']} CPUs",
        f"initial rows {results.get('initial_rows')}; binlog phase reached after "
        f"{harness.fmt(results.get('ready_s'), '.1f')}s (Spark start, discovery, snapshot)",
    ]
    rows = []
    if start := results.get("at_start"):
        rows.append([" 0", 0.0, "", "", "", *harness.pick(start, "rss_mib jvm_rss_mib"), "", "", "", ""])
        rows[-1] += [*harness.pick(start, "data_files delete_files snapshots state_snapshots metadata_files"), ""]
    for x in results.get("samples", []):
        first = [f"{x['sample']:>2}", x["elapsed_s"] / 60, *harness.pick(x, "offered_per_s applied_per_s cores")]
        last = "rss_mib jvm_rss_mib pss_mib lag_p50_s lag_p95_s lag_max_s data_files delete_files snapshots"
        rows.append(first + harness.pick(x, last + " state_snapshots metadata_files maintenance_runs"))
    lines += [
        "",
        "RSS/JVM/PSS in MiB (at the sample); lag s (ingest_lag_seconds over the window); files summed",
        *harness.text_table(SAMPLE_COLUMNS, rows, rule=False),
        "",
        "Flatness (least-squares slope per hour over each half of the samples; "
        "last-quarter mean / first-quarter mean):",
    ]
    flat = [
        [f"  {label:<26} {unit:<9}", *harness.pick(results.get("flatness", {}).get(key) or EMPTY_FLATNESS, FLATNESS)]
        for key, label, unit in FLAT_KEYS
    ]
    lines += harness.text_table(FLATNESS_COLUMNS, flat, rule=False)
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
            "lag over the whole run: "
            + ", ".join(f"{p} {harness.fmt(whole[p], '.2f')}s" for p in ("p50", "p95", "max"))
        )
    if results.get("cores_last_over_first") is not None:
        lines.append(
            f"job cores over the last {END_MINUTES} minutes / over the first {END_MINUTES}: "
            f"{results['cores_last_over_first']:.3f}"
        )
    if "job_cpu_s" in results:
        lines.append(
            f"job CPU {results['job_cpu_s']:.1f}s; MariaDB CPU {harness.fmt(results.get('mariadb_cpu_s'), '.1f')}s; "
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
    if results.get("readers"):
        lines += readers.render(results["readers"])
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.parser_for("bench.soak", __doc__)
    parser.add_argument("--minutes", type=harness.positive_float, default=60.0, help="minutes of offered load (60)")
    parser.add_argument("--rate", type=harness.positive_float, default=500.0, help="offered changes per second (500)")
    parser.add_argument(
        "--sample-seconds", type=harness.positive_float, default=30.0, help="seconds between two samples (30)"
    )
    parser.add_argument(
        "--interval",
        type=harness.positive_float,
        default=5.0,
        help="stream.batch_interval_seconds (5, the job's default)",
    )
    parser.add_argument(
        "--initial-rows",
        type=harness.positive,
        default=20_000,
        help="initial orders (customers 1/4, events 1/2; 20000)",
    )
    parser.add_argument(
        "--reader-rounds",
        type=int,
        default=3,
        help="rounds of each reader query after the run, target vs a compacted copy (3; 0 skips them)",
    )
    harness.add_common_options(parser, spark_conf=False)
    args = parser.parse_args(argv)
    if args.sample_seconds > args.minutes * 60:
        parser.error("--sample-seconds must not be longer than the run (--minutes)")
    if args.reader_rounds and (missing := trino_missing()) is not None:  # before the hour, not after it
        parser.error(f"--reader-rounds: {missing} (or --reader-rounds 0)")
    return args


def main(argv: list[str] | None = None) -> int:
    results = harness.run_bench("soak", parse_args(argv), measure, render, mariadb={})
    return 0 if not results.get("failure") and results.get("verify", {}).get("ok", False) else 1


if __name__ == "__main__":
    raise SystemExit(main())
