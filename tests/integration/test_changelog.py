"""The changelog table (every change as +I/-U/+U/-D, in binlog order, exactly once) and `ingest status`
(committed offsets, last commits, lag), against a real MariaDB, Spark and Iceberg."""

from __future__ import annotations

import datetime as dt
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commands.status import binlog_status, table_status
from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.state.table import StateTable
from tests.conftest import embedded_sink, run_ingest, source_section

pytestmark = pytest.mark.integration

# (statement or transaction, expected changelog rows as (op, id, owner)) in binlog order.
CHANGES: list[tuple[list[str], list[tuple[str, int, str]]]] = [
    (["INSERT INTO {db}.acct VALUES (10, 'ten', 1)"], [("+I", 10, "ten")]),
    (["UPDATE {db}.acct SET owner = 'TEN' WHERE id = 10"], [("-U", 10, "ten"), ("+U", 10, "TEN")]),
    (["UPDATE {db}.acct SET id = 11 WHERE id = 10"], [("-U", 10, "TEN"), ("+U", 11, "TEN")]),  # key change
    (["DELETE FROM {db}.acct WHERE id = 1"], [("-D", 1, "o1")]),
    (
        [  # one transaction of several statements, one of them a two-row event
            "INSERT INTO {db}.acct VALUES (20, 'tx', 0)",
            "UPDATE {db}.acct SET owner = CONCAT(owner, '!') WHERE id IN (2, 3)",
            "DELETE FROM {db}.acct WHERE id = 20",
        ],
        [
            ("+I", 20, "tx"),
            ("-U", 2, "o2"),
            ("+U", 2, "o2!"),
            ("-U", 3, "o3"),
            ("+U", 3, "o3!"),
            ("-D", 20, "tx"),
        ],
    ),
]
EXPECTED = [row for _, rows in CHANGES for row in rows]


def _fresh_db(mariadb: MariaDBServer, db: str) -> None:
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.acct (id INT NOT NULL PRIMARY KEY, owner VARCHAR(20), balance DECIMAL(12,2))",
        f"CREATE TABLE {db}.plain (id INT NOT NULL PRIMARY KEY, n INT)",
        f"INSERT INTO {db}.acct SELECT seq, CONCAT('o', seq), seq * 1.5 FROM {db}.seq_1_to_5",
        f"INSERT INTO {db}.plain SELECT seq, seq FROM {db}.seq_1_to_5",
    )


def _pipeline(mariadb: MariaDBServer, db: str, warehouse: Path, catalog: str) -> dict[str, Any]:
    return {
        "name": db,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{db}\..*"]},
        "sink": {**embedded_sink(warehouse), "catalog_name": catalog},
        "snapshot": {"chunk_size": 2, "parallelism": 2},
        "stream": {"batch_interval_seconds": 60},
        "table_options": {f"{db}.acct": {"changelog": True}},
    }


def _apply_changes(mariadb: MariaDBServer, db: str) -> None:
    with mariadb.admin() as conn, conn.cursor() as cur:
        for statements, _ in CHANGES:
            cur.execute("BEGIN")
            for statement in statements:
                cur.execute(statement.format(db=db))
            cur.execute("COMMIT")


def _changelog(config: PipelineConfig, db: str) -> list[dict[str, Any]]:
    table = load_pyiceberg_catalog(config.sink).load_table((db, "acct_changelog"))
    return sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["_seq"])


def _snapshots(config: PipelineConfig, db: str, name: str) -> int:
    return len(load_pyiceberg_catalog(config.sink).load_table((db, name)).snapshots())


def test_changelog_holds_every_change_in_order_and_status_shows_the_lag(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "clog"
    _fresh_db(mariadb, db)
    config = parse_config(_pipeline(mariadb, db, tmp_path, "clog_lake"))
    started = dt.datetime.now(dt.UTC).replace(microsecond=0)
    run(config, spark=spark, until_caught_up=True)
    assert _changelog(config, db) == []  # the changelog starts with the binlog phase
    assert not load_pyiceberg_catalog(config.sink).table_exists((db, "plain_changelog"))

    _apply_changes(mariadb, db)
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    rows = _changelog(config, db)
    assert [(r["_op"], r["id"], r["owner"]) for r in rows] == EXPECTED
    assert [r["balance"] for r in rows[:2]] == [1, 1]
    assert all(started - dt.timedelta(seconds=2) <= r["_commit_ts"] <= dt.datetime.now(dt.UTC) for r in rows)
    # One transaction, one GTID and one commit time; each statement before it was a transaction of its own.
    gtids = [r["_gtid"] for r in rows]
    assert None not in gtids and len(set(gtids[-6:])) == 1 and len(set(gtids)) == 5
    assert len({r["_commit_ts"] for r in rows[-6:]}) == 1
    assert [r["_position"] for r in rows] == sorted((r["_position"] for r in rows), key=lambda p: int(p.split(":")[1]))

    # A rerun with nothing new adds nothing to the changelog.
    before = _snapshots(config, db, "acct_changelog")
    run(config, spark=spark, until_caught_up=True)
    assert _snapshots(config, db, "acct_changelog") == before

    # Status when caught up: the committed offset is the server's position, nothing behind.
    state = StateTable.open(config.sink, config.name)
    binlog = binlog_status(config, state)
    assert binlog["caught_up"] is True, binlog
    assert binlog["committed_offset"] == binlog["server_position"]
    assert (binlog["bytes_behind"], binlog["files_behind"], binlog["lag_seconds"]) == (0, 0, 0.0)
    assert binlog["transactions_behind"] == 0
    assert binlog["last_commit"] is not None and binlog["source_time_at_offset"] is not None
    tables = {t["table"]: t for t in table_status(config, state)}
    acct = tables[f"{db}.acct"]
    assert acct["last_commit"] is not None and acct["stream_offset"] is not None
    assert acct["changelog"] == f"{db}.acct_changelog" and acct["changelog_stream_offset"] == acct["stream_offset"]
    assert "changelog" not in tables[f"{db}.plain"]

    # Writes the job has not seen yet: behind in bytes and in seconds (the CLI, as a user runs it).
    time.sleep(1.5)
    mariadb.execute(f"UPDATE {db}.plain SET n = n + 1")
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(_pipeline(mariadb, db, tmp_path, "clog_lake")))
    status = run_ingest("status", "--config", str(config_file), "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    behind = json.loads(status.stdout)["binlog"]
    assert behind["caught_up"] is False and behind["bytes_behind"] > 0 and behind["files_behind"] == 0
    assert behind["transactions_behind"] == 1  # the one autocommit UPDATE
    assert behind["lag_seconds"] >= 1 and behind["committed_offset"] == binlog["committed_offset"]
    text = run_ingest("status", "--config", str(config_file))
    assert text.returncode == 0 and "bytes / 0 files / 1 transactions behind, lag" in text.stdout, (
        text.stdout + text.stderr[-2000:]
    )

    # A schema change (issue 32): the changelog follows it, and the changes after it have the new columns.
    mariadb.execute(
        f"ALTER TABLE {db}.acct DROP COLUMN balance, CHANGE owner holder VARCHAR(20), ADD COLUMN note VARCHAR(5) "
        "DEFAULT 'n'",
        f"UPDATE {db}.acct SET holder = 'h' WHERE id = 2",
    )
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    after = _changelog(config, db)
    assert [(r["_op"], r["id"], r["holder"], r["note"]) for r in after[len(rows) :]] == [
        ("-U", 2, "o2!", "n"),
        ("+U", 2, "h", "n"),
    ]
    assert after[0]["holder"] == rows[0]["owner"] and "balance" not in after[0]  # renamed and dropped by field id


def test_kill_9_around_the_changelog_commit_loses_and_duplicates_nothing(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """One job killed before the changelog's append to its stage branch, then, resumed, after it (the batch's one
    commit not made), then right after that commit landed (the job not told): the changelog holds nothing, nothing,
    then every change once; the last resume ends equal and adds nothing to it."""
    db = "clogcrash"
    _fresh_db(mariadb, db)
    catalog = "k_clogcrash"
    config = parse_config(_pipeline(mariadb, db, tmp_path, catalog))
    run(config, spark=spark, snapshot_only=True)
    _apply_changes(mariadb, db)
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(_pipeline(mariadb, db, tmp_path, catalog)))
    for crash_at, logged in (
        ("stream.before_changelog_commit:1", 0),
        ("stream.after_changelog_commit:1", 0),
        ("atomic.after_swap:1", len(EXPECTED)),
    ):
        crashed = run_ingest("run", "--config", str(config_file), "--until-caught-up", crash_at=crash_at)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
        assert len(_changelog(config, db)) == logged, crash_at
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    rows = _changelog(config, db)
    assert [(r["_op"], r["id"], r["owner"]) for r in rows] == EXPECTED
    assert len({r["_seq"] for r in rows}) == len(rows)
