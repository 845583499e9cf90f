"""`on_unrepresentable` in the binlog phase and in the snapshot, against a real MariaDB, Spark and Iceberg: every
kind of date value Iceberg cannot hold goes to `<target>__rejected` (one row per value) instead of the target,
exactly once across a kill -9 right after the rejected rows' commit; a later valid change of a rejected key
lands in the target; a change inside a chunk's watermark window decides for its row; `stop` stops at the value;
`null` (the default) keeps today's NULL."""

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
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.targets import chunks_done_in_target
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


# Rows holding such values before the snapshot: (id, column, raw value, reason), and the INSERTs that made them.
IN_SNAPSHOT = [r for r in REJECTED if r[0] in range(10, 17)]
INSERTS = [s for s in CHANGES if s.startswith("INSERT") and "'valid'" not in s]


class ChangeDuringChunks:
    """A chunk hook (run on an executor): inside the watermark windows of two chunks, a valid row becomes a zero
    date (id 3) and a rejected one becomes valid (id 10): the window decides, not the SELECT."""

    def __init__(self, socket: str, db: str) -> None:
        self.socket, self.db = socket, db

    def __call__(self, at: str, chunk: Any) -> None:
        from tests.executor_sql import run_once

        changes = {
            3: "UPDATE ev SET d = '0000-00-00' WHERE id = 3",
            10: "UPDATE ev SET d = '2024-05-06', note = 'ten fixed' WHERE id = 10",
        }
        for key, change in changes.items():
            inside = (chunk.lower is None or chunk.lower[0] <= key) and (chunk.upper is None or key < chunk.upper[0])
            if at == "before_high_watermark" and inside:
                allow = ("SET SESSION sql_mode = 'ALLOW_INVALID_DATES'", None)
                run_once(self.socket, self.db, f"marker{key}", [allow, (change, None)])


def _snapshot_of_ev(mariadb: MariaDBServer, db: str, tmp_path: Path, policy: str, inserts: list[str]) -> dict[str, Any]:
    """A fresh database whose table `ev` holds the rows of `inserts` before the snapshot; a pipeline of `ev` alone."""
    _fresh_db(mariadb, db)
    _write(mariadb, inserts)
    return _pipeline(mariadb, db, tmp_path, policy) | {"tables": {"include": [rf"{db}\.ev"]}}


def _snapshot_rejected(config: Any, db: str) -> list[tuple[int, str, str, str]]:
    rejected = _rows(config, db, "ev__rejected")
    assert len({(r["seq"], r["column_name"]) for r in rejected}) == len(rejected)  # none twice
    assert all(
        r["phase"] == "snapshot" and r["chunk_index"] is not None and r["binlog_position"] and r["commit_ts"] is None
        for r in rejected
    ), rejected
    return sorted((json.loads(r["key_json"])["id"], r["column_name"], r["raw_value"], r["reason"]) for r in rejected)


def test_dead_letter_in_the_snapshot_judges_each_row_as_its_chunk_holds_it(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "deadsnap"
    raw = _snapshot_of_ev(mariadb, db, tmp_path, "dead_letter", [s.format(t=f"{db}.ev") for s in INSERTS])
    mariadb.execute(f"CREATE TABLE {db}.marker3 (x INT)", f"CREATE TABLE {db}.marker10 (x INT)")
    config = parse_config(raw)
    run(config, spark=spark, snapshot_only=True, hook=ChangeDuringChunks(mariadb.socket, db))

    expected = sorted([r for r in IN_SNAPSHOT if r[0] != 10] + [(3, "d", "0000-00-00", "zero date")])
    assert _snapshot_rejected(config, db) == expected
    target = {r["id"]: r for r in _rows(config, db, "ev")}
    source = {r["id"]: r for r in mysql_rows(mariadb, f"{db}.ev", "id")}
    assert set(target) == {1, 2, 4, 10}  # the rows holding such values are left out of the target
    for key in target:
        assert (target[key]["note"], target[key]["d"]) == (source[key]["note"], source[key]["d"]), key


def test_dead_letter_in_the_snapshot_survives_kill_9_after_the_rejected_commit(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "deadsnapkill"
    raw = _snapshot_of_ev(mariadb, db, tmp_path, "dead_letter", [s.format(t=f"{db}.ev") for s in INSERTS])
    raw["snapshot"] = {**raw["snapshot"], "chunks_per_commit": 2}  # ranges of 2 keys, 4 keys per commit
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    config = parse_config(raw)

    crashed = run_ingest(
        "run", "--config", str(config_file), "--snapshot-only", crash_at="snapshot.after_rejected_commit:1"
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    # The rejected values of the first commit that has some ([9,13): ids 10-12) are in; that commit is not.
    assert [r[0] for r in _snapshot_rejected(config, db)] == [10, 11, 12]
    chunks = {r["chunk_index"] for r in _rows(config, db, "ev__rejected")}
    target = load_pyiceberg_catalog(config.sink).load_table((db, "ev"))
    assert chunks and not chunks & chunks_done_in_target(target, config.name)

    run(config, spark=spark, snapshot_only=True)
    assert _snapshot_rejected(config, db) == sorted(IN_SNAPSHOT)
    assert {r["id"] for r in _rows(config, db, "ev")} == {1, 2, 3, 4}
    run(config, spark=spark, until_caught_up=True)  # the binlog phase after it rejects nothing again
    assert len(_rows(config, db, "ev__rejected")) == len(IN_SNAPSHOT)


@pytest.mark.parametrize("driver", ["mysqlclient", "pymysql"])
def test_stop_in_the_snapshot_names_the_value_and_the_chunk(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, driver: str
) -> None:
    """Both chunk drivers find the value (the SELECT that finds it goes through the driver's own converters)."""
    db = "deadsnapstop"
    inserts = [f"INSERT INTO {db}.ev (id, dt) VALUES (10, '2021-04-31 01:02:03.5')"]
    raw = _snapshot_of_ev(mariadb, db, tmp_path, "stop", inserts)
    raw["sink"]["catalog_name"] += f"_{driver}"  # the module's Spark session keeps catalogs by name
    config = parse_config(raw | {"snapshot": {**raw["snapshot"], "driver": driver}})
    with pytest.raises(
        SourceError,
        match=r"deadsnapstop\.ev: column 'dt' .*\{\"id\": 10\}.*'2021-04-31 01:02:03.500' \(not a calendar date\), "
        r"read by snapshot chunk \d+ at binlog position",
    ):
        run(config, spark=spark, snapshot_only=True)
