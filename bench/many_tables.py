"""What the job pays per table: many small tables snapshotted and then caught up with nothing to stream (issue 39).

A private MariaDB holds `--tables` tables of `--rows` rows each (an `INT` key, a `VARCHAR`, an `INT`, a
`DATETIME(6)` and a `DECIMAL`). Measured in one run, one after another:

- **baseline**: one PyMySQL connection as the CDC user streams `SELECT *` of every table with an unbuffered
  `SSCursor`, table after table, and discards the rows (the reference, ratio 1.00);
- **snapshot**: `ingest run --snapshot-only`, exactly as a user runs it, into a fresh embedded warehouse
  (SQLite JDBC catalog, local files); its wall clock includes the JVM's start;
- **idle catch-up**: `ingest run --until-caught-up` right after it, with no change to stream: what every run
  pays for the tables it captures.

Printed: seconds, seconds per table, and the job's time as a multiple of the baseline's; `ingest verify` must
find every table equal. Results go to `bench/results/many_tables-<UTC time>.json`.

    .venv/bin/python -m bench.many_tables                      # 100 tables of 1,000 rows
    .venv/bin/python -m bench.many_tables --tables 20 --rows 200
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pymysql
import pymysql.cursors
import yaml

from bench.snapshot import CDC_USER, DATABASE, PASSWORD_ENV, BenchError, _progress, host_info, write_results
from ingest.devservers.mariadb import MariaDBServer

ROOT = Path(__file__).resolve().parents[1]


def create_tables(server: MariaDBServer, tables: int, rows: int) -> list[str]:
    names = [f"t{i:04d}" for i in range(tables)]
    statements = [f"DROP DATABASE IF EXISTS {DATABASE}", f"CREATE DATABASE {DATABASE}"]
    for name in names:
        statements += [
            f"CREATE TABLE {DATABASE}.{name} (id INT PRIMARY KEY, label VARCHAR(20), n INT, at DATETIME(6), "
            "amount DECIMAL(10,2))",
            f"INSERT INTO {DATABASE}.{name} SELECT seq, CONCAT('r', seq), seq * 3, "
            f"TIMESTAMP('2026-01-01') + INTERVAL seq SECOND, seq / 7 FROM {DATABASE}.seq_1_to_{rows}",
        ]
    server.execute(*statements)
    return names


def baseline(server: MariaDBServer, names: list[str], password: str) -> float:
    """Seconds to stream every table with one SSCursor connection, as the CDC user."""
    started = time.perf_counter()
    conn = pymysql.connect(host=server.host, port=server.port, user=CDC_USER, password=password)
    try:
        for name in names:
            with conn.cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute(f"SELECT * FROM `{DATABASE}`.`{name}`")
                for _ in cur:
                    pass
    finally:
        conn.close()
    return time.perf_counter() - started


def job(config_file: Path, *args: str) -> float:
    """Seconds of `ingest ARGS --config FILE` as a user runs it; a failure stops the bench with its log."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "ingest.cli", *args, "--config", str(config_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise BenchError(f"ingest {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return seconds


def measure(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    password = secrets.token_urlsafe(16)
    os.environ[PASSWORD_ENV] = password
    with MariaDBServer(server_id=7) as server:
        server.create_cdc_user(CDC_USER, password)
        _progress(f"creating {args.tables} tables of {args.rows} rows")
        names = create_tables(server, args.tables, args.rows)
        document = {
            "name": "many",
            "source": {
                "host": server.host,
                "port": server.port,
                "user": CDC_USER,
                "password": {"env": PASSWORD_ENV},
                "flavor": "mariadb",
                "server_id": 7401,
            },
            "tables": {"include": [rf"{DATABASE}\..*"]},
            "sink": {
                "catalog_name": "lake",
                "catalog": {
                    "type": "jdbc",
                    "uri": f"jdbc:sqlite:{scratch}/catalog.db",
                    "warehouse": f"file://{scratch}/warehouse",
                },
            },
        }
        config_file = scratch / "pipeline.yaml"
        config_file.write_text(yaml.safe_dump(document))
        _progress("baseline")
        base = baseline(server, names, password)
        _progress("snapshot")
        snapshot = job(config_file, "run", "--snapshot-only")
        _progress("idle catch-up")
        idle = job(config_file, "run", "--until-caught-up")
        _progress("verify")
        job(config_file, "verify")
    return {"baseline_s": base, "snapshot_s": snapshot, "idle_catch_up_s": idle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=100, help="tables to capture (default 100)")
    parser.add_argument("--rows", type=int, default=1000, help="rows in each (default 1,000)")
    args = parser.parse_args()
    results: dict[str, Any] = {"host": host_info(), "tables": args.tables, "rows": args.rows}
    with tempfile.TemporaryDirectory(prefix="bench-many-") as scratch:
        results.update(measure(args, Path(scratch)))
    print(f"{args.tables} tables of {args.rows} rows")
    print(f"{'run':<28}{'s':>9}{'s/table':>10}{'time / base':>12}")
    for label, key in (("baseline: SSCursor SELECT *", "baseline_s"), ("ingest run --snapshot-only", "snapshot_s")):
        seconds = results[key]
        print(f"{label:<28}{seconds:>9.1f}{seconds / args.tables:>10.3f}{seconds / results['baseline_s']:>12.1f}")
    idle = results["idle_catch_up_s"]
    print(f"{'idle --until-caught-up':<28}{idle:>9.1f}{idle / args.tables:>10.3f}{'':>12}")
    print(f"results: {write_results(results, 'many_tables')}")


if __name__ == "__main__":
    main()
