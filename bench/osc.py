"""The running job's lag while pt-online-schema-change alters a captured table under load (issue 32): lag before,
during and after the swap, against the same run's lag before it; `--recopy` an ALTER the job copies again, and
`--backfill` (issue 49) one whose old rows the server computes, against a copy of the key and the new column. See
bench/README.md.

    .venv/bin/python -m bench.osc                          # 200,000 orders, 500 changes/s, interval 5 s
    .venv/bin/python -m bench.osc --rows 20000 --calm 20   # a smoke run
    .venv/bin/python -m bench.osc --backfill --rows 1000000 --rate 5000
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.soak import job_options, job_pipeline
from bench.tables import TABLES, MixedWriter, create_tables, load_initial, source_counts
from ingest.devservers.mariadb import MariaDBServer

FOLLOWED_LINE = "followed the schema change"
RECOPIED_LINE = "the copy is complete"
NARROWING = "MODIFY customer_id INT NOT NULL"
"""`--recopy`'s ALTER: BIGINT to INT, which evolve cannot follow (the values fit; Iceberg's `long` holds them)."""
BACKFILL = "ADD COLUMN g BIGINT AS (customer_id * 2) STORED"
"""`--backfill`'s ALTER, run directly (not by pt-osc): the server computes `g` for every old row and logs none, so the
job reads `orders` again (issue 49)."""
KEY_AND_COLUMN = "orders_key_g"
"""`--backfill`'s baseline: a table of `orders`' key and the new column's values, copied again by the same running
job (`ingest snapshot --again`) once the backfill has landed: a snapshot of the key and that column."""
COPIED_LINE = "planned "
"""A chunk plan in the job's log after its first snapshot would be a copy again."""


def migrate(server: MariaDBServer, alter: str) -> dict[str, Any]:
    """pt-online-schema-change of `orders` as root over the socket; its exit code, duration and last lines."""
    started = time.monotonic()
    done = subprocess.run(
        [
            "pt-online-schema-change",
            "--alter",
            alter,
            f"D={harness.DATABASE},t=orders,S={server.socket},u=root",
            "--execute",
            "--no-version-check",
            "--recursion-method=none",
            "--no-check-alter",
        ],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    return {
        "exit_code": done.returncode,
        "seconds": round(time.monotonic() - started, 3),
        "output": (done.stdout + done.stderr).splitlines()[-12:],
    }


def alter_directly(server: MariaDBServer, alter: str) -> dict[str, Any]:
    """`ALTER TABLE orders <alter>` as root: its duration (the server rebuilds the table, writers wait)."""
    started = time.monotonic()
    server.execute(f"ALTER TABLE {harness.DATABASE}.orders {alter}")
    return {"exit_code": 0, "seconds": round(time.monotonic() - started, 3), "output": []}


def key_and_column_table(server: MariaDBServer) -> None:
    """`--backfill`'s baseline table: orders' key and the values the new column will hold, unlogged."""
    with server.admin(harness.DATABASE) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"CREATE TABLE {KEY_AND_COLUMN} (id INT NOT NULL PRIMARY KEY, g BIGINT)")
        cur.execute(f"INSERT INTO {KEY_AND_COLUMN} SELECT id, customer_id * 2 FROM orders")
        conn.commit()


def copy_again_seconds(job: harness.JobProcess, config_path: Path, table: str, log_lines: list[str]) -> float:
    """Ask the running job to copy `table` again and wait until it logs the copy complete; the seconds taken."""
    started = time.monotonic()
    harness.ingest(config_path, "snapshot", "--table", table, "--again")
    found = job.wait_log(
        lambda lines: any(table in line and RECOPIED_LINE in line for line in lines), "copy " + table, log_lines
    )
    return round(found - started, 3)


_CHUNKS_READ = re.compile(r"(\S+): chunks (\d+)/(\d+) read")


def wait_copied(job: harness.JobProcess, tables: int) -> float:
    """Wait until the job has logged every chunk of `tables` tables read; the seconds it took."""
    started = time.monotonic()
    copied: set[str] = set()
    while len(copied) < tables:
        if not job.alive() or time.monotonic() - started > harness.READY_TIMEOUT_SECONDS:
            raise harness.BenchError("the job did not copy every table; " + job.tail())
        for line in job.log_path.read_text(errors="replace").splitlines():
            m = _CHUNKS_READ.search(line)
            if m and m[2] == m[3]:
                copied.add(m[1])
        time.sleep(1.0)
    return time.monotonic() - started


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    create_tables(server)
    keys = load_initial(server, args.rows)
    stream: dict[str, Any] = {"on_unfollowable": "recopy"} if args.recopy or args.backfill else {}
    if args.backfill:
        stream["signal_poll_seconds"] = 1  # the baseline's request is taken at once
        key_and_column_table(server)
    config_path, document, port = job_pipeline(server, scratch, "bench_osc", args.interval)
    document["stream"].update(stream)
    if args.backfill:
        document["tables"]["include"].append(rf"{harness.DATABASE}\.{KEY_AND_COLUMN}")
    harness.write_pipeline(document, config_path)
    with harness.JobProcess(config_path, scratch / "job.log", port) as job:
        results["ready_s"] = job.ready()
        # The query copies the tables between its first binlog batches: the migration comes once all are copied.
        results["copied_s"] = round(wait_copied(job, len(TABLES) + (1 if args.backfill else 0)), 3)
        job.new_log_lines()  # the first copy's lines: what comes after is the migration's
        scraper = job.scrape()
        writer = MixedWriter(server, keys, args.rate)
        writer.start()
        time.sleep(args.calm)
        how = "ALTER TABLE orders" if args.backfill else "pt-online-schema-change --alter"
        harness.progress(f"{how} {args.alter!r} under {args.rate:g} changes/s")
        osc_start = scraper.elapsed()
        results["pt_osc"] = alter_directly(server, args.alter) if args.backfill else migrate(server, args.alter)
        osc_end = scraper.elapsed()
        if results["pt_osc"]["exit_code"] != 0:
            raise harness.BenchError("pt-online-schema-change failed:\n" + "\n".join(results["pt_osc"]["output"]))
        wanted = RECOPIED_LINE if args.recopy or args.backfill else FOLLOWED_LINE
        lines: list[str] = []

        def followed(lines: list[str]) -> list[str]:
            return [line for line in lines if wanted in line and KEY_AND_COLUMN not in line]

        followed_at = job.wait_log(lambda lines: bool(followed(lines)), "follow the swap", lines) - scraper.t0
        time.sleep(args.calm + args.interval)
        if args.backfill:
            harness.progress(f"the baseline: {KEY_AND_COLUMN} copied again by the same job, under the same writes")
            results["key_and_column_copy_s"] = copy_again_seconds(
                job, config_path, f"{harness.DATABASE}.{KEY_AND_COLUMN}", lines
            )
        writer.stop()
        results["writer"] = {"statements": writer.written, "rate": round(writer.written / writer.seconds, 1)}
        code = results["job_exit_code"] = job.stop()
        lines += job.new_log_lines()
        results["followed"] = followed(lines)
        results["seconds_to_follow"] = round(followed_at - osc_end, 3)
        results["copied_again"] = sum(1 for line in lines if COPIED_LINE in line)
        # "during": from the tool's start (a direct ALTER's end: writers wait on the server's rebuild, which is no
        # lag of the job's) until an interval after the job logged that it followed the swap.
        during_from = osc_end if args.backfill else osc_start
        results["seconds_from_alter_start"] = round(followed_at - osc_start, 3)
        windows = {
            "before": (0.0, osc_start),
            "during": (during_from, followed_at + args.interval),
            "after": (followed_at + args.interval, followed_at + args.interval + args.calm),
        }
        results["lag_s"] = {name: scraper.lag(lo, hi) for name, (lo, hi) in windows.items()}
        if code != 0:
            raise harness.BenchError(f"the job exited with {code}; " + job.tail())
    harness.progress("ingest run --until-caught-up, then ingest verify")
    results["catch_up_after_stop"] = {
        "exit_code": 0,
        "seconds": harness.ingest(config_path, "run", "--until-caught-up"),
    }
    results["verify"] = harness.run_verify(config_path)
    results["source_rows"] = source_counts(server)


def render(results: dict[str, Any]) -> str:
    interval = results["args"]["interval"]
    tool = "ALTER TABLE" if results["args"]["backfill"] else "pt-online-schema-change"
    out = [
        f"bench.osc: {results['args']['rows']:,} orders, {results['writer']['rate']:g} changes/s offered, interval "
        f"{interval:g} s; {tool} {results['pt_osc']['seconds']:.1f} s (exit {results['pt_osc']['exit_code']})",
        "| window | lag p50 s | p95 s | max s | p95 / interval |",
        "|---|---|---|---|---|",
    ]
    for name, stats in results["lag_s"].items():
        p95 = stats["p95"]
        per_interval = "" if p95 is None else f"{p95 / interval:.2f}"
        out.append(f"| {name} | {stats['p50']} | {p95} | {stats['max']} | {per_interval} |")
    args = results["args"]
    what = "copy again complete" if args["recopy"] or args["backfill"] else "swap followed"
    end = "the ALTER's" if args["backfill"] else "pt-osc's"
    out.append(f"{what} ({results['seconds_to_follow']:.1f} s after {end} end): {results['followed'][-1]}")
    if args["backfill"]:
        baseline = results["key_and_column_copy_s"]
        out.append(
            f"backfill (copy again of orders, {results['seconds_to_follow']:.1f} s after the ALTER's end) / a copy "
            f"of its key and the new column by the same job ({baseline:.1f} s): "
            f"{results['seconds_to_follow'] / baseline:.2f}; lag p95 during / before: "
            f"{harness.fmt(harness.ratio(results['lag_s']['during']['p95'], results['lag_s']['before']['p95']), '.2f')}"
        )
    out.append(
        f"tables copied again: {results['copied_again']}; verify: {'equal' if results['verify']['ok'] else 'DIFFERS'}"
    )
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.parser_for("bench.osc", __doc__, job_options(200_000, 500.0, 5.0, "the migration"))
    parser.add_argument(
        "--alter", default="ADD COLUMN region VARCHAR(8) NOT NULL DEFAULT 'eu'", help="pt-osc's --alter of orders"
    )
    parser.add_argument(
        "--recopy",
        action="store_true",
        help=f"`stream.on_unfollowable: recopy` and pt-osc's --alter {NARROWING!r}: the table is copied again while "
        "the others stream (the lag is the job's, over every table)",
    )
    parser.add_argument(
        "--backfill",
        action="store_true",
        help=f"`ALTER TABLE orders {BACKFILL}` run directly, `stream.on_unfollowable: recopy`: the job reads orders "
        f"again while the others stream; then, as the baseline, the same job copies {KEY_AND_COLUMN} (orders' key and "
        "the column's values) again",
    )
    args = parser.parse_args(argv)
    if args.recopy:
        args.alter = NARROWING
    if args.backfill:
        args.alter = BACKFILL
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("pt-online-schema-change") is None and not args.backfill:
        raise harness.BenchError("pt-online-schema-change is not installed (`make setup` installs percona-toolkit)")
    results = harness.run_bench("osc", args, measure, render, mariadb={})
    copies = 2 if args.backfill else 1 if args.recopy else 0
    return 0 if results["verify"]["ok"] and results["followed"] and results["copied_again"] == copies else 1


if __name__ == "__main__":
    sys.exit(main())
