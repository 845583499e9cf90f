"""What a restarted `ingest run --until-caught-up` pays before and for one batch (issue 51 item 2): a table copied
once, then per round one UPDATE and the command in a new process, as a user restarts the job. Wall seconds and the
CPU of its process tree by part (the job's Python, Spark's JVM, Spark's Python processes), read from /proc every
50 ms. With `--baseline DIR` (another checkout of the project, run with its own `ingest` on PYTHONPATH) both run in
turn, round by round, and their ratio is printed. No timing is asserted; see bench/README.md.

    .venv/bin/python -m bench.restart                                  # 20,000 rows, 5,000 changes a round, 4 rounds
    .venv/bin/python -m bench.restart --baseline /path/to/other/checkout
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import harness
from ingest.devservers.mariadb import MariaDBServer

PARTS = ("driver", "jvm", "python_workers")
"""`harness.tree_part`: the job's own Python, Spark's JVM, Spark's Python processes."""


def _parts_cpu(root: int, seen: dict[tuple[int, int], tuple[str, float]]) -> None:
    """Each process of the tree's CPU so far, by its part, into `seen` (by pid and start time: pids are reused)."""
    for sample in harness.process_tree(root):
        seen[(sample.pid, sample.start_ticks)] = (harness.tree_part(sample, root), sample.cpu)


def timed_run(config_file: Path, checkout: Path) -> dict[str, Any]:
    """`ingest run --until-caught-up` of `checkout`: its wall seconds and CPU by part."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    seen: dict[tuple[int, int], tuple[str, float]] = {}
    started = time.perf_counter()
    job = subprocess.Popen(
        [sys.executable, "-m", "ingest.cli", "run", "--until-caught-up", "--config", str(config_file)],
        cwd=checkout,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    while job.poll() is None:
        _parts_cpu(job.pid, seen)
        time.sleep(0.05)
    wall = time.perf_counter() - started
    err = job.stderr.read().decode(errors="replace") if job.stderr else ""
    if job.returncode != 0:
        raise harness.BenchError(f"ingest run exited {job.returncode}:\n{err[-3000:]}")
    cpu: dict[str, float] = defaultdict(float)
    for part, seconds in seen.values():
        cpu[part] += seconds
    return {"wall_s": round(wall, 3), "cpu_s": {p: round(cpu[p], 2) for p in PARTS}}


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    server.execute(
        "CREATE DATABASE d",
        "CREATE TABLE d.t (id INT PRIMARY KEY, a VARCHAR(20), n INT, at DATETIME(6), amount DECIMAL(12,2))",
        f"INSERT INTO d.t SELECT seq, CONCAT('a', seq), seq, TIMESTAMP('2026-01-01') + INTERVAL seq SECOND, "
        f"seq / 7 FROM d.seq_1_to_{args.rows}",
    )
    document = harness.pipeline_document("restart", server.host, server.port, r"d\.t", scratch / "warehouse", 5901)
    config_file = harness.write_pipeline(document, scratch / "pipeline.yaml")
    checkouts = {"ours": harness.ROOT, **({"baseline": Path(args.baseline).resolve()} if args.baseline else {})}
    harness.progress("the copy")
    timed_run(config_file, harness.ROOT)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in checkouts}
    step = max(1, args.rows // args.changes)
    for r in range(args.rounds):
        for name in list(checkouts) if r % 2 == 0 else list(checkouts)[::-1]:
            server.execute(f"UPDATE d.t SET n = n + 1, at = at + INTERVAL 1 SECOND WHERE id % {step} = {r % step}")
            runs[name].append(timed_run(config_file, checkouts[name]))
            harness.progress(f"round {r}, {name}: {runs[name][-1]}")
    results["runs"] = runs
    results["medians"] = {
        name: {
            "wall_s": statistics.median(x["wall_s"] for x in xs),
            "cpu_s": {p: round(statistics.median(x["cpu_s"][p] for x in xs), 2) for p in PARTS},
        }
        for name, xs in runs.items()
    }
    if args.baseline:
        ratios = [a["wall_s"] / b["wall_s"] for a, b in zip(runs["ours"], runs["baseline"], strict=True)]
        results["wall_ratio"] = {"median": round(statistics.median(ratios), 3), "min": min(ratios), "max": max(ratios)}


def render(results: dict[str, Any]) -> str:
    args = results["args"]
    lines = [
        f"A restarted `ingest run --until-caught-up` with one batch of about {args['changes']:,} changes to a table "
        f"of {args['rows']:,} rows, medians of {args['rounds']} rounds; CPU s of its tree by part",
        f"{'checkout':10s} {'wall s':>8s} " + " ".join(f"{p:>15s}" for p in PARTS) + f" {'all':>8s}",
    ]
    for name, m in results["medians"].items():
        cpu = m["cpu_s"]
        lines.append(
            f"{name:10s} {m['wall_s']:8.2f} "
            + " ".join(f"{cpu[p]:15.2f}" for p in PARTS)
            + f" {sum(cpu.values()):8.2f}"
        )
    if "wall_ratio" in results:
        r = results["wall_ratio"]
        lines.append(f"wall ours / baseline, round by round: median {r['median']} ({r['min']:.3f}-{r['max']:.3f})")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.parser_for("bench.restart", __doc__)
    parser.add_argument("--rows", type=harness.positive, default=20_000, help="rows of the table (20000)")
    parser.add_argument("--changes", type=harness.positive, default=5_000, help="rows one round updates (5000)")
    parser.add_argument("--rounds", type=harness.positive, default=4, help="restarted runs of each checkout (4)")
    parser.add_argument("--baseline", default=None, help="another checkout, run in turn with this one")
    harness.add_common_options(parser, spark_conf=False)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    harness.run_bench("restart", parse_args(argv), measure, render, mariadb={"server_id": 7})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
