"""Online schema change tools (issue 32): the real pt-online-schema-change under a writer, and gh-ost's statement
sequence, are followed as the schema change each stands for. Their helper tables are never copied (the patterns
match them), the swap evolves the target without copying the table again, and a job killed at the swap, or
started in the middle of the migration, ends equal to MySQL."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ingest.commands.verify import verify
from ingest.devservers.mariadb import MariaDBServer
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.state.table import StateTable
from tests.conftest import mysql_rows, run_ingest
from tests.integration.test_streaming import _start_streaming_job, _wait_until_streaming, background_writes

pytestmark = pytest.mark.integration


def _tables(mariadb: MariaDBServer, db: str) -> None:
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id INT NOT NULL PRIMARY KEY, n INT, v VARCHAR(10), w INT NOT NULL DEFAULT 0)",
        f"INSERT INTO {db}.t SELECT seq, seq, CONCAT('v', seq), 0 FROM {db}.seq_1_to_400",
        f"CREATE TABLE {db}.other (id INT NOT NULL PRIMARY KEY, n INT)",
        f"INSERT INTO {db}.other SELECT seq, 0 FROM {db}.seq_1_to_50",
    )


def _write(cur: Any, n: int) -> None:
    """Writes of only the columns the migrations keep: they run on before, during and after the swap."""
    cur.execute("UPDATE t SET w = w + 1 WHERE id = %s", (1 + n * 7 % 400,))
    cur.execute("INSERT INTO t (id, w) VALUES (%s, %s) ON DUPLICATE KEY UPDATE w = w - 1", (1000 + n % 97, n))
    cur.execute("DELETE FROM t WHERE id = %s", (1000 + n * 13 % 97,))
    cur.execute("UPDATE other SET n = n + 1 WHERE id = %s", (1 + n % 50,))


def _captured(config: Any, db: str) -> tuple[list[str], list[str]]:
    """The Iceberg tables of the pipeline's namespace, and the columns of t's target in their order."""
    catalog = load_pyiceberg_catalog(config.sink)
    names = sorted(name for _, name in catalog.list_tables(db))
    target = catalog.load_table((db, "t"))
    return names, [f.name for f in target.schema().fields]


def test_pt_online_schema_change_under_a_writer_is_followed_across_kills_at_its_swap(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, row_metadata: str
) -> None:
    """pt-online-schema-change renames a column, drops one and adds one with a default while a writer changes the
    table: the job reads its helper `_t_new` being created and altered, skips the helper's rows, and at the
    `RENAME TABLE t TO _t_old, _t_new TO t` evolves the target as that ALTER would (the added column's default
    in old rows). It is killed after the Iceberg schema change; the next run, which resumes after the helper's
    ALTER and reads it back from the binlog, is killed after the backfill (at NO_LOG); the last ends equal."""
    db = f"ptosc_{row_metadata.lower()}"
    _tables(mariadb, db)
    config, job = _start_streaming_job(mariadb, db, tmp_path, rf"{db}\..*", db, crash_at="stream.after_schema_change:1")
    try:
        with background_writes(mariadb, db, _write, pause=0.005):
            _wait_until_streaming(config, job)
            altered = subprocess.run(
                [
                    "pt-online-schema-change",
                    "--alter",
                    "CHANGE n amount BIGINT, DROP COLUMN v, ADD COLUMN c INT NOT NULL DEFAULT 5",
                    f"D={db},t=t,S={mariadb.socket},u=root",
                    "--execute",
                    "--no-version-check",
                    "--recursion-method=none",
                    "--no-check-alter",  # it asks before renaming a column
                    "--chunk-size=100",
                ],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert altered.returncode == 0, altered.stdout[-2000:] + altered.stderr[-2000:]
            # Writes after the swap too, then no more: a writer running on through both runs of the job only made
            # each chase the binlog it grew.
            time.sleep(1)
        _, err = job.communicate(timeout=300)
        assert job.returncode == -signal.SIGKILL, err[-3000:]
        if row_metadata == "NO_LOG":  # the second kill does not depend on the setting, only the decoding does
            resumed = run_ingest(
                "run", "--config", str(tmp_path / "pipeline.yaml"), "--until-caught-up",
                crash_at="stream.after_backfill:1",
            )  # fmt: skip
            assert resumed.returncode == -signal.SIGKILL, resumed.stderr[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    names, columns = _captured(config, db)
    assert names == ["other", "t"]  # neither _t_new nor _t_old was ever copied
    assert columns == ["id", "amount", "w", "c"]
    assert [{k: r[k] for k in ("id", "amount", "w", "c")} for r in _iceberg_rows(config, db)] == mysql_rows(
        mariadb, f"{db}.t", "id"
    )
    state = StateTable.open(config.sink, config.name)
    assert set(state.times_recorded(f"{db}.t").values()) == {1}  # each chunk copied once: no copy again


def _iceberg_rows(config: Any, db: str) -> list[dict[str, Any]]:
    rows = load_pyiceberg_catalog(config.sink).load_table((db, "t")).scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def test_a_gh_ost_migration_begun_before_the_job_started_is_followed_at_its_two_step_cut_over(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """gh-ost's statements as it runs them (its binary does not install here): the ghost table `_t_gho` created
    LIKE the table and altered, its changelog table `_t_ghc`, the row copy and the changes it applies from the
    binlog, then the two-step cut-over (`RENAME TABLE t TO _t_del`, `RENAME TABLE _t_gho TO t`). The job starts
    after the ghost table was altered: it copies neither helper, reads their ALTER back from the binlog at the
    cut-over, and follows the swap with no copy of t. Killed after the swap's backfill commit, the next run (which
    resumes at the swap) ends equal."""
    db = "ghost"
    _tables(mariadb, db)
    mariadb.execute(
        f"create /* gh-ost */ table `{db}`.`_t_ghc` (id bigint auto_increment, last_update timestamp "
        "default current_timestamp on update current_timestamp, hint varchar(64) not null, value varchar(4096) not "
        "null, primary key(id), unique key hint_uidx(hint)) auto_increment=256",
        f"create /* gh-ost */ table `{db}`.`_t_gho` like `{db}`.`t`",
        f"alter /* gh-ost */ table `{db}`.`_t_gho` drop column v, change n amount bigint, add column c int default 3",
        f"insert /* gh-ost */ into `{db}`.`_t_ghc` (id, hint, value) values (2, 'state', 'GhostTableMigrated')",
    )
    config, job = _start_streaming_job(mariadb, db, tmp_path, rf"{db}\..*", db, crash_at="stream.after_backfill:1")
    other_writes = background_writes(mariadb, db, lambda cur, n: cur.execute("UPDATE other SET n = %s", (n,)))
    try:
        with other_writes:
            _wait_until_streaming(config, job)
        copy = f"insert /* gh-ost */ ignore into `{db}`.`_t_gho` (id, amount, w) select id, n, w from `{db}`.`t`"
        mariadb.execute(
            f"UPDATE {db}.t SET w = 7 WHERE id <= 10",
            copy + " where id <= 200",
            f"UPDATE {db}.t SET w = 8 WHERE id BETWEEN 150 AND 250",
            copy + " where id > 200",
            # What gh-ost applies from the binlog to the ghost table for the change to rows it had copied.
            f"replace /* gh-ost */ into `{db}`.`_t_gho` (id, amount, w) select id, n, w from `{db}`.`t` "
            "where id between 150 and 200",
            f"replace /* gh-ost */ into `{db}`.`_t_ghc` (id, hint, value) values (1, 'heartbeat', 'x')",
            f"rename /* gh-ost */ table `{db}`.`t` to `{db}`.`_t_del`",
            f"rename /* gh-ost */ table `{db}`.`_t_gho` to `{db}`.`t`",
            f"drop /* gh-ost */ table if exists `{db}`.`_t_del`",
            f"drop /* gh-ost */ table if exists `{db}`.`_t_ghc`",
            f"UPDATE {db}.t SET c = 4, w = 9 WHERE id = 3",
            f"INSERT INTO {db}.t (id, amount, w, c) VALUES (900, 9, 9, 9)",
        )
        _, err = job.communicate(timeout=240)  # killed once the cut-over's backfill is committed
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == -signal.SIGKILL, err[-3000:]
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    names, columns = _captured(config, db)
    assert names == ["other", "t"]
    assert columns == ["id", "amount", "w", "c"]
    assert [{k: r[k] for k in ("id", "amount", "w", "c")} for r in _iceberg_rows(config, db)] == mysql_rows(
        mariadb, f"{db}.t", "id"
    )
    assert set(StateTable.open(config.sink, config.name).times_recorded(f"{db}.t").values()) == {1}
