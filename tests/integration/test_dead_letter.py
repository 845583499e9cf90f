"""`on_unrepresentable` in the binlog phase, against a real MariaDB, Spark and Iceberg: every kind of date
value Iceberg cannot hold goes to `<target>__rejected` (one row per value) instead of the target, exactly
once across a kill -9 right after the rejected rows' commit; a later valid change of a rejected key lands
in the target; `stop` stops at the value; `null` (the default) keeps today's NULL."""

from __future__ import annotations

import datetime as dt
import json
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.config import parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import SourceError
from ingest.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from tests.conftest import embedded_sink, mysql_rows, run_ingest, source_section

pytestmark = pytest.mark.integration

# (id, column, raw value as MySQL prints it, reason): one per kind of value the binlog phase rejects.
REJECTED = [
    (10, "d", "0000-00-00", "zero date"),
    (11, "d", "2020-00-15", "zero month or day"),
    (12, "d", "2020-02-31", "not a calendar date"),  # ALLOW_INVALID_DATES; stopped the job before
    (13, "dt", "0000-00-00 00:00:00.000", "zero date"),
    (14, "dt", "2021-04-31 01:02:03.500", "not a calendar date"),
    (15, "ts", "0000-00-00 00:00:00.000000", "zero date"),
    (16, "d", "0000-01-01", "year 0"),
    (1, "d", "0000-00-00", "zero date"),  # an UPDATE of a snapshotted row: the target keeps its old image
    (22, "d", "2020-02-30", "not a calendar date"),  # an UPDATE moving key 2 to 22: key 2 is deleted
]
CHANGES = [
    "INSERT INTO {t} (id, d, note) VALUES (10, '0000-00-00', 'ten')",
    "INSERT INTO {t} (id, d, note) VALUES (11, '2020-00-15', 'eleven')",
    "INSERT INTO {t} (id, d, note) VALUES (12, '2020-02-31', 'twelve')",
    "INSERT INTO {t} (id, dt, note) VALUES (13, '0000-00-00 00:00:00', 'thirteen')",
    "INSERT INTO {t} (id, dt, note) VALUES (14, '2021-04-31 01:02:03.5', 'fourteen')",
    "INSERT INTO {t} (id, ts, note) VALUES (15, '0000-00-00 00:00:00', 'fifteen')",
    "INSERT INTO {t} (id, d, note) VALUES (16, '0000-01-01', 'sixteen')",
    "UPDATE {t} SET d = '0000-00-00', note = 'one!' WHERE id = 1",
    "UPDATE {t} SET id = 22, d = '2020-02-30' WHERE id = 2",
    "INSERT INTO {t} (id, d, note) VALUES (30, '2024-01-02', 'valid')",
    "UPDATE {t} SET d = '2024-05-06', note = 'ten fixed' WHERE id = 10",  # a later valid image of a rejected key
]
# Keys whose target row differs from the source on purpose: rejected, and not fixed by a later change.
DIFFERENT = {1, 11, 12, 13, 14, 15, 16, 22}


def _fresh_db(mariadb: MariaDBServer, db: str) -> None:
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.ev (id INT NOT NULL PRIMARY KEY, d DATE, dt DATETIME(3), ts TIMESTAMP(6) NULL, "
        "note VARCHAR(20))",
        f"CREATE TABLE {db}.plain (id INT NOT NULL PRIMARY KEY, d DATE)",
        f"INSERT INTO {db}.ev (id, d, note) SELECT seq, '2020-01-01', CONCAT('row', seq) FROM {db}.seq_1_to_4",
    )


def _pipeline(mariadb: MariaDBServer, db: str, warehouse: Path, policy: str) -> dict[str, Any]:
    return {
        "name": db,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{db}\..*"]},
        "sink": {**embedded_sink(warehouse), "catalog_name": f"c_{db}"},
        "snapshot": {"chunk_size": 2, "parallelism": 2},
        "stream": {"batch_interval_seconds": 60},
        "table_options": {f"{db}.ev": {"on_unrepresentable": policy}},
    }


def _write(mariadb: MariaDBServer, statements: list[str]) -> None:
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = 'ALLOW_INVALID_DATES'")  # zero dates and invalid days allowed
        for statement in statements:
            cur.execute(statement)


def _rows(config: Any, db: str, name: str) -> list[dict[str, Any]]:
    return load_pyiceberg_catalog(config.sink).load_table((db, name)).scan().to_arrow().to_pylist()


def _check_target(config: Any, mariadb: MariaDBServer, db: str, different: set[int]) -> None:
    """Equal to the source (id, note, d) except the rejected keys, which are checked one by one."""
    target = {r["id"]: r for r in _rows(config, db, "ev")}
    source = {r["id"]: r for r in mysql_rows(mariadb, f"{db}.ev", "id")}
    assert set(target) == (set(source) - different) | ({1} & different), sorted(target)
    for key in set(target) - different:
        assert (target[key]["note"], target[key]["d"]) == (source[key]["note"], source[key]["d"]), key
    if 1 in different:
        assert (target[1]["note"], target[1]["d"]) == ("row1", dt.date(2020, 1, 1))  # the old image
    assert 2 not in target and 22 not in target


def test_dead_letter_in_the_binlog_phase_survives_kill_9_after_the_rejected_commit(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "deadletter"
    _fresh_db(mariadb, db)
    raw = _pipeline(mariadb, db, tmp_path, "dead_letter")
    config = parse_config(raw)
    run(config, spark=spark, snapshot_only=True)
    _write(mariadb, [s.format(t=f"{db}.ev") for s in CHANGES] + [f"INSERT INTO {db}.plain VALUES (1, '2020-02-31')"])

    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    crashed = run_ingest(
        "run", "--config", str(config_file), "--until-caught-up", crash_at="stream.after_rejected_commit:1"
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert len(_rows(config, db, "ev__rejected")) == len(REJECTED)  # committed before the kill
    assert {r["id"] for r in _rows(config, db, "ev")} == {1, 2, 3, 4}  # the target's MERGE was not

    run(config, spark=spark, until_caught_up=True)
    rejected = _rows(config, db, "ev__rejected")
    assert len({(r["seq"], r["column_name"]) for r in rejected}) == len(rejected)  # none twice
    got = sorted((json.loads(r["key_json"])["id"], r["column_name"], r["raw_value"], r["reason"]) for r in rejected)
    assert got == sorted(REJECTED)
    assert all(r["phase"] == "binlog" and r["binlog_position"] and r["gtid"] and r["commit_ts"] for r in rejected)
    _check_target(config, mariadb, db, DIFFERENT)
    # `null`, the default, on the other table: the invalid day (which stopped the job before) is NULL.
    assert _rows(config, db, "plain") == [{"id": 1, "d": None}]

    # Later valid changes of rejected keys land in the target; nothing is rejected again.
    _write(
        mariadb,
        [
            f"UPDATE {db}.ev SET d = '2021-01-01' WHERE id IN (1, 11)",
            f"UPDATE {db}.ev SET dt = '2021-01-01 00:00:00' WHERE id = 13",
        ],
    )
    run(config, spark=spark, until_caught_up=True)
    assert len(_rows(config, db, "ev__rejected")) == len(REJECTED)
    _check_target(config, mariadb, db, DIFFERENT - {1, 11, 13})
    target = {r["id"]: r for r in _rows(config, db, "ev")}
    assert target[11]["d"] == dt.date(2021, 1, 1) and target[13]["dt"] == dt.datetime(2021, 1, 1)


def test_stop_names_the_value_and_commits_nothing_of_it(spark: Any, mariadb: MariaDBServer, tmp_path: Path) -> None:
    db = "deadstop"
    _fresh_db(mariadb, db)
    config = parse_config(_pipeline(mariadb, db, tmp_path, "stop"))
    run(config, spark=spark, snapshot_only=True)
    _write(mariadb, [f"INSERT INTO {db}.ev (id, d) VALUES (10, '2020-02-31')"])
    with pytest.raises(SourceError, match=r"deadstop\.ev: column 'd'.*'2020-02-31' \(not a calendar date\)"):
        run(config, spark=spark, until_caught_up=True)
    assert {r["id"] for r in _rows(config, db, "ev")} == {1, 2, 3, 4}
