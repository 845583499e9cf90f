"""What the job pays per table (issue 39): `--tables` tables of `--rows` rows against one table of as many rows, each
through the SSCursor baseline, the snapshot, a first run, an idle catch-up and a batch over every table or one. See
bench/README.md.

    .venv/bin/python -m bench.many_tables                      # 100 tables of 1,000 rows
    .venv/bin/python -m bench.many_tables --tables 20 --rows 200 --batch-changes 2000
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench import harness
from bench.tables import select_all
from ingest.devservers.mariadb import MariaDBServer


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


def pipeline_file(server: MariaDBServer, database: str, scratch: Path) -> Path:
    """The pipeline of `database`'s tables into an empty embedded warehouse under `scratch`, as a file."""
    document = harness.pipeline_document(database, server.host, server.port, rf"{database}\..*", scratch, 7401)
    return harness.write_pipeline(document, scratch / "pipeline.yaml")


def measure_database(
    server: MariaDBServer, database: str, names: list[str], rows: int, scratch: Path, changes: int
) -> dict[str, Any]:
    """The runs of one database's tables, each pipeline into a warehouse of its own under `scratch`."""
    copied, first_file = (pipeline_file(server, database, scratch / name) for name in ("snapshot", "first"))
    harness.progress(f"{database}: baseline")
    base = select_all(server, names)["seconds"]
    harness.progress(f"{database}: snapshot")
    snapshot = harness.ingest(copied, "run", "--snapshot-only")
    harness.progress(f"{database}: first run")
    first = harness.ingest(first_file, "run", "--until-caught-up")
    harness.progress(f"{database}: idle catch-up")
    idle = harness.ingest(copied, "run", "--until-caught-up")
    harness.ingest(first_file, "verify")  # before the batches, which only the other pipeline reads
    harness.progress(f"{database}: a batch of {changes} changes over every table")
    update(server, names, rows, changes)
    spread = harness.ingest(copied, "run", "--until-caught-up")
    harness.progress(f"{database}: a batch of {changes} changes in one table")
    update(server, names[:1], rows, changes)
    one_table = harness.catch_up_and_verify(copied, database)
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


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    harness.progress(f"creating {args.tables} tables of {args.rows} rows, and one of {args.tables * args.rows}")
    many = create_tables(server, "many", args.tables, args.rows)
    one = create_tables(server, "one", 1, args.tables * args.rows)
    results["many"] = measure_database(server, "many", many, args.rows, scratch / "many", args.batch_changes)
    results["one"] = measure_database(server, "one", one, args.tables * args.rows, scratch / "one", args.batch_changes)


RUNS = (
    ("baseline: SSCursor SELECT *", "baseline_s"),
    ("ingest run --snapshot-only", "snapshot_s"),
    ("ingest run (first, --until-caught-up)", "first_run_s"),
    ("idle --until-caught-up", "idle_catch_up_s"),
    ("a batch over every table", "batch_over_all_s"),
    ("a batch in one table", "batch_in_one_s"),
)


def render(results: dict[str, Any]) -> str:
    tables, rows = results["args"]["tables"], results["args"]["rows"]
    columns = [
        harness.Column("run", 38),
        harness.Column("many s", 9, ".1f"),
        harness.Column("one s", 9, ".1f"),
        harness.Column("many/one", 10, ".2f"),
        harness.Column("s/table", 9, ".3f"),
    ]
    table = [
        [label, m, o, m / o, m / tables]
        for label, key in RUNS
        for m, o in [(results["many"][key], results["one"][key])]
    ]
    return "\n".join(
        [
            f"{tables} tables of {rows} rows (many) against one table of {tables * rows} (one)",
            *harness.text_table(columns, table, sep="", rule=False),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    options: list[harness.Option] = [
        ("--tables", harness.positive, 100, "tables to capture"),
        ("--rows", harness.positive, 1000, "rows in each"),
        ("--batch-changes", harness.positive, 20_000, "updates of the two batch runs"),
    ]
    args = harness.parser_for("bench.many_tables", __doc__, options).parse_args(argv)
    harness.run_bench("many_tables", args, measure, render, mariadb={"server_id": 7})


if __name__ == "__main__":
    main()
