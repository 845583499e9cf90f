"""The running job's lag across a restart of its source (issue 53): for each outage, how long after the server went
away the lag was back at the same run's p95 before it, over the outage (the goal: at most 2x + 10 s). See
bench/README.md.

    .venv/bin/python -m bench.outage                     # outages of 5 s and 60 s, 200 changes/s
    .venv/bin/python -m bench.outage --outages 5 --calm 20
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.soak import job_options, job_pipeline
from bench.tables import MixedWriter, create_tables, load_initial
from ingest.devservers.mariadb import MariaDBServer

STEADY_SCRAPES = 3


def back_to_normal(scraper: harness.Scraper, down: float, back: float, normal: float, timeout: float) -> float | None:
    """Seconds from `down` (the server stopped) until the lag, read after `back` (it started again), stayed at or
    under `normal` for STEADY_SCRAPES scrapes in a row."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        points = [p for p in scraper.between(back, float("inf")) if p.lag_s is not None]
        for i in range(len(points) - STEADY_SCRAPES + 1):
            run = points[i : i + STEADY_SCRAPES]
            if all(p.lag_s is not None and p.lag_s <= normal for p in run):
                return round(run[0].at - down, 3)
        time.sleep(1)
    return None


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    create_tables(server)
    keys = load_initial(server, args.rows)
    config_path, _, port = job_pipeline(server, scratch, "bench_outage", args.interval)
    with harness.JobProcess(config_path, scratch / "job.log", port) as job:
        results["ready_s"] = job.ready()
        scraper = job.scrape()
        writer = MixedWriter(server, keys, args.rate)
        writer.start()
        time.sleep(args.calm)
        baseline = results["baseline_lag_s"] = scraper.lag(args.calm / 2, args.calm)
        normal = (baseline["p95"] or 0.0) + args.interval
        results["outages"] = []
        for outage in args.outages:
            harness.progress(f"the source away for {outage:g} s")
            writer.stop()
            down = scraper.elapsed()
            server.stop()
            time.sleep(outage)
            server.start()
            back = scraper.elapsed()
            writer = MixedWriter(server, keys, args.rate)
            writer.start()
            recovered = back_to_normal(scraper, down, back, normal, timeout=10 * outage + 120)
            if not job.alive():
                raise harness.BenchError("the job ended during the outage; " + job.tail())
            results["outages"].append({"seconds": outage, "lag_normal_after_s": recovered, "goal_s": 2 * outage + 10})
            time.sleep(args.calm)
        writer.stop()
        results["job_exit_code"] = job.stop()
        results["reconnect_lines"] = sum(1 for line in job.new_log_lines() if "lost the binlog connection" in line)
    harness.progress("ingest run --until-caught-up, then ingest verify")
    results["catch_up_s"] = harness.ingest(config_path, "run", "--until-caught-up")
    results["verify"] = harness.run_verify(config_path)


def render(results: dict[str, Any]) -> str:
    base = results["baseline_lag_s"]
    lines = [
        f"baseline lag (same run, before the first outage): p50 {base['p50']} s, p95 {base['p95']} s",
        "| source away | lag back to normal after | x the outage | goal (2x + 10 s) |",
        "|---|---|---|---|",
    ]
    for o in results["outages"]:
        after = o["lag_normal_after_s"]
        ratio = "-" if after is None else f"{after / o['seconds']:.2f}"
        lines.append(
            f"| {o['seconds']:g} s | {after if after is not None else 'never'} s | {ratio} | {o['goal_s']:g} s |"
        )
    lines.append(f"job exit code {results['job_exit_code']}; verify ok: {results['verify']['ok']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.parser_for("bench.outage", __doc__, job_options(20_000, 200.0, 2.0, "each outage"))
    parser.add_argument("--outages", type=float, nargs="+", default=[5.0, 60.0], help="seconds the source is away")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    results = harness.run_bench("outage", parse_args(argv), measure, render, mariadb={})
    return 0 if results["verify"]["ok"] and results["job_exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
