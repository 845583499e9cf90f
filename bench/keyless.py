"""What a table without a key costs against the same table with a primary key (issue 41), in one run: the SSCursor
baseline, the snapshot and the catch-up of the same changes, keyless / keyed. See bench/README.md.

    .venv/bin/python -m bench.keyless                      # 200,000 rows, 20,000 changes
    .venv/bin/python -m bench.keyless --rows 20000 --changes 2000
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench import harness
from bench.many_tables import pipeline_file
from bench.tables import select_all
from ingest.devservers.mariadb import MariaDBServer

COLUMNS = "id INT NOT NULL, label VARCHAR(20), n INT, at DATETIME(6), amount DECIMAL(10,2)"


def create_table(server: MariaDBServer, database: str, rows: int, key: bool) -> None:
    server.execute(
        f"DROP DATABASE IF EXISTS {database}",
        f"CREATE DATABASE {database}",
        f"CREATE TABLE {database}.t ({COLUMNS}{', PRIMARY KEY (id)' if key else ''})",
        f"INSERT INTO {database}.t SELECT seq, CONCAT('r', seq % 100), seq % 7, TIMESTAMP('2026-01-01') + "
        f"INTERVAL seq SECOND, (seq % 1000) / 7 FROM {database}.seq_1_to_{rows}",
    )


def change_statements(rows: int, changes: int) -> list[str]:
    """Ranges of 1,000 rows: half updated, a tenth deleted, the rest inserted past the last id."""
    statements, step = [], 1000
    updates, deletes = changes // 2, changes // 10
    for low in range(1, updates + 1, step):
        statements.append(f"UPDATE t SET n = n + 1, label = 'changed' WHERE id BETWEEN {low} AND {low + step - 1}")
    for low in range(updates + 1, updates + deletes + 1, step):
        statements.append(f"DELETE FROM t WHERE id BETWEEN {low} AND {low + step - 1}")
    inserts = changes - updates - deletes
    for low in range(rows + 1, rows + inserts + 1, step):
        statements.append(
            f"INSERT INTO t SELECT seq, 'new', 1, TIMESTAMP('2026-02-01'), 0.5 FROM seq_{low}_to_{low + step - 1}"
        )
    return statements


def measure_database(server: MariaDBServer, database: str, statements: list[str], scratch: Path) -> dict[str, Any]:
    config_file = pipeline_file(server, database, scratch)
    harness.progress(f"{database}: baseline")
    base = select_all(server, [f"{database}.t"])["seconds"]
    harness.progress(f"{database}: snapshot")
    snapshot = harness.ingest(config_file, "run", "--snapshot-only")
    server.execute(*statements, database=database)
    catch_up = harness.catch_up_and_verify(config_file, database)
    return {"baseline_s": base, "snapshot_s": snapshot, "catch_up_s": catch_up}


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    harness.progress(f"creating two tables of {args.rows} rows")
    create_table(server, "keyed", args.rows, key=True)
    create_table(server, "keyless", args.rows, key=False)
    statements = change_statements(args.rows, args.changes)
    for database in ("keyed", "keyless"):
        results[database] = measure_database(server, database, statements, scratch / database)


RUNS = (
    ("baseline: SSCursor SELECT *", "baseline_s"),
    ("ingest run --snapshot-only", "snapshot_s"),
    ("catch-up (--until-caught-up)", "catch_up_s"),
)


def render(results: dict[str, Any]) -> str:
    columns = [
        harness.Column("run", 34),
        harness.Column("keyed s", 9, ".1f"),
        harness.Column("keyless s", 11, ".1f"),
        harness.Column("keyless/keyed", 15, ".2f"),
    ]
    rows = [[label, k, n, n / k] for label, key in RUNS for k, n in [(results["keyed"][key], results["keyless"][key])]]
    args = results["args"]
    title = f"{args['rows']} rows with a primary key (keyed) and without any key (keyless), {args['changes']} changes"
    return "\n".join([title, *harness.text_table(columns, rows, sep="", rule=False)])


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser_for("bench.keyless", __doc__)
    parser.add_argument("--rows", type=int, default=200_000, help="rows in each table (default 200,000)")
    parser.add_argument("--changes", type=int, default=20_000, help="row changes to catch up (default 20,000)")
    harness.run_bench("keyless", parser.parse_args(argv), measure, render, mariadb={"server_id": 7})


if __name__ == "__main__":
    main()
