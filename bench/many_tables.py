"""What the job pays per table: many small tables against one table of as many rows (issue 39).

A private MariaDB holds `--tables` tables of `--rows` rows each in database `many`, and one table of
`--tables` x `--rows` rows in database `one` (each: an `INT` key, a `VARCHAR`, an `INT`, a `DATETIME(6)` and a
`DECIMAL`). Measured in one run, for each of the two databases in turn:

- **baseline**: one PyMySQL connection as the CDC user streams `SELECT *` of every table with an unbuffered
  `SSCursor`, table after table, and discards the rows;
- **snapshot**: `ingest run --snapshot-only`, exactly as a user runs it, into a fresh embedded warehouse
  (SQLite JDBC catalog, local files); its wall clock includes the JVM's start;
- **first run**: `ingest run --until-caught-up` into another fresh warehouse: the default run, whose streaming
  query reads the chunks between its binlog batches;
- **idle catch-up**: `ingest run --until-caught-up` right after it, with no change to stream: what every run
  pays for the tables it captures;
- **a batch over every table**: `--batch-changes` updates spread evenly over the database's tables (one
  transaction per table), then `ingest run --until-caught-up`: one batch, over 200 tables or one;
- **a batch in one table**: as many updates in the first table only, then `ingest run --until-caught-up`: what
  a one-table batch pays for the other tables captured beside it.

Printed: seconds, seconds per table, and the ratio of the many tables' time to the one table's (the same rows);
`ingest verify` must find every table equal. Results go to `bench/results/many_tables-<UTC time>.json`.

    .venv/bin/python -m bench.many_tables                      # 100 tables of 1,000 rows
    .venv/bin/python -m bench.many_tables --tables 20 --rows 200 --batch-changes 2000
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

from bench.snapshot import CDC_USER, PASSWORD_ENV, BenchError, _progress, host_info, write_results
from ingest.devservers.mariadb import MariaDBServer

ROOT = Path(__file__).resolve().parents[1]


def create_tables(server: MariaDBServer, database: str, tables: int, rows: int) -> list[str]:
    names = [f"t{i:04d}" for i in range(tables)]
    statements = [f"DROP DATABASE IF EXISTS {database}", f"CREATE DATABASE {database}"]
    for name in names:
        statements += [
            f"CREATE TABLE {database}.{name} (id INT PRIMARY KEY, label VARCHAR(20), n INT, at DATETIME(6), "
            "amount DECIMAL(10,2))",
            f"INSERT INTO {database}.{name} SELECT seq, CONCAT('r', seq), seq * 3, "
            f"TIMESTAMP('2026-01-01') + INTERVAL seq SECOND, seq / 7 FROM {database}.seq_1_to_{rows}",
        ]
    server.execute(*statements)
    return [f"{database}.{name}" for name in names]


def baseline(server: MariaDBServer, names: list[str], password: str) -> float:
    """Seconds to stream every table with one SSCursor connection, as the CDC user."""
    started = time.perf_counter()
    conn = pymysql.connect(host=server.host, port=server.port, user=CDC_USER, password=password)
    try:
        for name in names:
            with conn.cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute("SELECT * FROM {}.{}".format(*(f"`{part}`" for part in name.split("."))))
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


def measure(
    server: MariaDBServer, password: str, database: str, names: list[str], rows: int, scratch: Path, changes: int
) -> dict[str, Any]:
    """The runs of one database's tables, each pipeline into a warehouse of its own under `scratch`."""
    copied, first_file = (pipeline_file(server, database, scratch / name) for name in ("snapshot", "first"))
    _progress(f"{database}: baseline")
    base = baseline(server, names, password)
    _progress(f"{database}: snapshot")
    snapshot = job(copied, "run", "--snapshot-only")
    _progress(f"{database}: first run")
    first = job(first_file, "run", "--until-caught-up")
    _progress(f"{database}: idle catch-up")
    idle = job(copied, "run", "--until-caught-up")
    job(first_file, "verify")  # before the batches, which only the other pipeline reads
    _progress(f"{database}: a batch of {changes} changes over every table")
    update(server, names, rows, changes)
    spread = job(copied, "run", "--until-caught-up")
    _progress(f"{database}: a batch of {changes} changes in one table")
    update(server, names[:1], rows, changes)
    one_table = job(copied, "run", "--until-caught-up")
    _progress(f"{database}: verify")
    job(copied, "verify")
    return {
        "tables": len(names),
        "baseline_s": base,
        "snapshot_s": snapshot,
        "first_run_s": first,
        "idle_catch_up_s": idle,
        "batch_over_all_s": spread,
        "batch_in_one_s": one_table,
    }


def update(server: MariaDBServer, names: list[str], rows: int, changes: int) -> None:
    """`changes` row updates spread evenly over `names` (tables of `rows` rows each), one transaction per table and
    round: a table's share beyond its rows updates them again."""
    each, extra = divmod(changes, len(names))
    statements = []
    for i, name in enumerate(names):
        share = each + (i < extra)
        while share > 0:
            statements.append(f"UPDATE {name} SET n = n + 1 WHERE id <= {min(share, rows)}")
            share -= min(share, rows)
    server.execute(*statements)


def pipeline_file(server: MariaDBServer, database: str, scratch: Path) -> Path:
    """The pipeline of `database`'s tables into an empty embedded warehouse under `scratch`, as a file."""
    scratch.mkdir(parents=True)
    document = {
        "name": database,
        "source": {
            "host": server.host,
            "port": server.port,
            "user": CDC_USER,
            "password": {"env": PASSWORD_ENV},
            "flavor": "mariadb",
            "server_id": 7401,
        },
        "tables": {"include": [rf"{database}\..*"]},
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
    return config_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=100, help="tables to capture (default 100)")
    parser.add_argument("--rows", type=int, default=1000, help="rows in each (default 1,000)")
    parser.add_argument(
        "--batch-changes", type=int, default=20_000, help="updates of the two batch runs (default 20,000)"
    )
    args = parser.parse_args()
    if args.batch_changes < 1:
        parser.error("--batch-changes must be at least 1")
    results: dict[str, Any] = {
        "host": host_info(),
        "tables": args.tables,
        "rows": args.rows,
        "batch_changes": args.batch_changes,
    }
    password = secrets.token_urlsafe(16)
    os.environ[PASSWORD_ENV] = password
    with MariaDBServer(server_id=7) as server, tempfile.TemporaryDirectory(prefix="bench-many-") as scratch:
        server.create_cdc_user(CDC_USER, password)
        _progress(f"creating {args.tables} tables of {args.rows} rows, and one of {args.tables * args.rows}")
        many = create_tables(server, "many", args.tables, args.rows)
        one = create_tables(server, "one", 1, args.tables * args.rows)
        results["many"] = measure(server, password, "many", many, args.rows, Path(scratch) / "many", args.batch_changes)
        results["one"] = measure(
            server, password, "one", one, args.tables * args.rows, Path(scratch) / "one", args.batch_changes
        )
    print(f"{args.tables} tables of {args.rows} rows (many) against one table of {args.tables * args.rows} (one)")
    print(f"{'run':<38}{'many s':>9}{'one s':>9}{'many/one':>10}{'s/table':>9}")
    for label, key in (
        ("baseline: SSCursor SELECT *", "baseline_s"),
        ("ingest run --snapshot-only", "snapshot_s"),
        ("ingest run (first, --until-caught-up)", "first_run_s"),
        ("idle --until-caught-up", "idle_catch_up_s"),
        ("a batch over every table", "batch_over_all_s"),
        ("a batch in one table", "batch_in_one_s"),
    ):
        m, o = results["many"][key], results["one"][key]
        print(f"{label:<38}{m:>9.1f}{o:>9.1f}{m / o:>10.2f}{m / args.tables:>9.3f}")
    print(f"results: {write_results(results, 'many_tables')}")


if __name__ == "__main__":
    main()
