"""What following foreign keys costs (issue 40): the same deletes, once as InnoDB's unlogged actions (`keyed`), once
with every row change logged (`logged`, the baseline); each caught up by `ingest run --until-caught-up` and verified.
See bench/README.md.

    .venv/bin/python -m bench.foreign_keys                          # 20,000 parents, 2,000 deleted
    .venv/bin/python -m bench.foreign_keys --parents 2000 --deleted 200
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench import harness
from bench.many_tables import pipeline_file
from ingest.devservers.mariadb import MariaDBServer

CHILDREN_PER_PARENT = 5


def create_tables(server: MariaDBServer, database: str, parents: int, keyed: bool) -> None:
    """`p`, `c` and `g` in `database`, with foreign keys only if `keyed`."""
    children = parents * CHILDREN_PER_PARENT
    c_key = ", FOREIGN KEY (p_id) REFERENCES p (id) ON DELETE CASCADE" if keyed else ""
    g_key = ", FOREIGN KEY (c_id) REFERENCES c (id) ON DELETE SET NULL" if keyed else ""
    server.execute(
        f"DROP DATABASE IF EXISTS {database}",
        f"CREATE DATABASE {database}",
        f"CREATE TABLE {database}.p (id INT PRIMARY KEY, label VARCHAR(20))",
        f"CREATE TABLE {database}.c (id INT PRIMARY KEY, p_id INT, n INT, KEY (p_id){c_key})",
        f"CREATE TABLE {database}.g (id INT PRIMARY KEY, c_id INT, note VARCHAR(20), KEY (c_id){g_key})",
        f"INSERT INTO {database}.p SELECT seq, CONCAT('p', seq) FROM {database}.seq_1_to_{parents}",
        f"INSERT INTO {database}.c SELECT seq, (seq - 1) DIV {CHILDREN_PER_PARENT} + 1, seq * 3 "
        f"FROM {database}.seq_1_to_{children}",
        f"INSERT INTO {database}.g SELECT seq, seq, CONCAT('g', seq) FROM {database}.seq_1_to_{children}",
    )


def delete_parents(server: MariaDBServer, database: str, deleted: int, keyed: bool) -> int:
    """Delete the first `deleted` parents, with the same end state in both databases; returns the row changes the
    binlog holds for it."""
    children = deleted * CHILDREN_PER_PARENT
    if keyed:
        server.execute(f"DELETE FROM {database}.p WHERE id <= {deleted}")
        return deleted
    server.execute(
        f"UPDATE {database}.g SET c_id = NULL WHERE c_id <= {children}",
        f"DELETE FROM {database}.c WHERE p_id <= {deleted}",
        f"DELETE FROM {database}.p WHERE id <= {deleted}",
    )
    return 2 * children + deleted


def measure_database(server: MariaDBServer, database: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    keyed = database == "keyed"
    harness.progress(
        f"{database}: {args.parents} parents, {args.parents * CHILDREN_PER_PARENT} children and grandchildren"
    )
    create_tables(server, database, args.parents, keyed)
    config_file = pipeline_file(server, database, scratch / database)
    harness.progress(f"{database}: first run")
    first = harness.ingest(config_file, "run", "--until-caught-up")
    logged = delete_parents(server, database, args.deleted, keyed)
    label = f"{database}: {args.deleted} parents' deletes ({logged} row changes logged)"
    return {
        "first_run_s": first,
        "changes_logged": logged,
        "catch_up_s": harness.catch_up_and_verify(config_file, label),
    }


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    for database in ("keyed", "logged"):
        results[database] = measure_database(server, database, args, scratch)


def render(results: dict[str, Any]) -> str:
    keyed, logged, args = results["keyed"], results["logged"], results["args"]
    children = args["deleted"] * CHILDREN_PER_PARENT
    return "\n".join(
        [
            f"{args['deleted']} of {args['parents']} parents deleted: {children} children deleted, "
            f"{children} grandchildren nulled",
            f"{'catch-up run':<44}{'changes logged':>16}{'s':>8}",
            f"{'keyed: actions applied by the job':<44}{keyed['changes_logged']:>16}{keyed['catch_up_s']:>8.1f}",
            f"{'logged: every row change in the binlog':<44}{logged['changes_logged']:>16}{logged['catch_up_s']:>8.1f}",
            f"keyed / logged: {keyed['catch_up_s'] / logged['catch_up_s']:.2f}",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser_for("bench.foreign_keys", __doc__)
    parser.add_argument("--parents", type=int, default=20_000, help="parents (default 20,000)")
    parser.add_argument("--deleted", type=int, default=2_000, help="parents deleted (default 2,000)")
    args = parser.parse_args(argv)
    if not 0 < args.deleted <= args.parents:
        parser.error("--deleted must be between 1 and --parents")
    harness.run_bench("foreign_keys", args, measure, render, mariadb={"server_id": 7})


if __name__ == "__main__":
    main()
