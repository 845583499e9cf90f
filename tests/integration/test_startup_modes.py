"""The startup modes that copy nothing (`latest`, `binlog_position`, `gtid`, `timestamp`): the targets are
created empty and hold exactly the changes after the start point; a start the server cannot serve is refused
before anything is written; a job killed before or after its first binlog commit neither loses nor repeats a
change on restart."""

from __future__ import annotations

import datetime as dt
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commands.resnapshot import resnapshot
from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import BinlogPurgedError, ConfigError
from ingest.faults import FAIL_ENV, InjectedFailure
from ingest.faults import reset as reset_fault_counts
from ingest.model.position import BinlogPosition
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.summary import SUMMARY_STREAM_OFFSET
from ingest.state.table import StateTable, pipeline_is_new
from tests.conftest import embedded_sink, main_history, mysql_rows, run_ingest, source_section

pytestmark = pytest.mark.integration


def _fresh_db(mariadb: MariaDBServer, db: str) -> None:
    """Rows 1-20 written before any start point."""
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id INT NOT NULL PRIMARY KEY, v VARCHAR(20), n INT)",
        f"INSERT INTO {db}.t SELECT seq, CONCAT('old', seq), seq FROM {db}.seq_1_to_20",
    )


def _data(mariadb: MariaDBServer, db: str, base: Path, mode: str, **startup: Any) -> dict[str, Any]:
    return {
        "name": db,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{db}\..*"]},
        "sink": {**embedded_sink(base), "catalog_name": f"lake_{db}"},
        "stream": {"batch_interval_seconds": 1},
        "startup_mode": mode,
        **({"startup": startup} if startup else {}),
    }


def _config(mariadb: MariaDBServer, db: str, base: Path, mode: str, **startup: Any) -> PipelineConfig:
    return parse_config(_data(mariadb, db, base, mode, **startup))


def _write_after(mariadb: MariaDBServer, db: str) -> list[int]:
    """Changes after the start point (an update, a delete, inserts, a key moved); the keys they touch."""
    mariadb.execute(
        f"UPDATE {db}.t SET v = 'changed', n = n + 100 WHERE id IN (3, 4)",
        f"DELETE FROM {db}.t WHERE id = 5",
        f"INSERT INTO {db}.t VALUES (100, 'new', 1), (101, 'new', 2)",
        f"UPDATE {db}.t SET id = 200 WHERE id = 7",
    )
    return [3, 4, 5, 7, 100, 101, 200]


def _target_rows(config: PipelineConfig, db: str) -> dict[int, dict[str, Any]]:
    rows = load_pyiceberg_catalog(config.sink).load_table((db, "t")).scan().to_arrow().to_pylist()
    by_key = {r["id"]: r for r in rows}
    assert len(by_key) == len(rows), "a key is in the target twice"
    return by_key


def _assert_only_changed_keys(mariadb: MariaDBServer, config: PipelineConfig, db: str, changed: list[int]) -> None:
    """The target holds exactly MySQL's rows of the keys changed after the start, and nothing written before."""
    source = {r["id"]: r for r in mysql_rows(mariadb, f"{db}.t", "id") if r["id"] in changed}
    assert _target_rows(config, db) == source


def _position(mariadb: MariaDBServer) -> tuple[str, int, str]:
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        gtid = str(cur.fetchone()[0])
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
    return str(file), int(pos), gtid


def test_latest_creates_empty_targets_and_follows_the_binlog_from_the_first_runs_end(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "st_latest"
    _fresh_db(mariadb, db)
    config = _config(mariadb, db, tmp_path, "latest")
    run(config, spark=spark, until_caught_up=True)
    table = load_pyiceberg_catalog(config.sink).load_table((db, "t"))
    assert [f.name for f in table.schema().fields] == ["id", "v", "n"]
    assert table.scan().to_arrow().num_rows == 0
    # Nothing to stream after the start: the run recorded its start as the offset, caught up. Written after the
    # first run, before any binlog commit: the next run starts at the first run's end, not at the binlog's end again.
    offset = StateTable.open(config.sink, config.name).stream_offset()
    file, pos, _ = _position(mariadb)
    assert offset is not None and offset.position == BinlogPosition(file, pos)
    changed = _write_after(mariadb, db)
    run(config, spark=spark, until_caught_up=True)
    _assert_only_changed_keys(mariadb, config, db, changed)
    mariadb.execute(f"UPDATE {db}.t SET v = 'again' WHERE id IN (1, 100)")
    run(config, spark=spark, until_caught_up=True)  # resumes from its committed offset
    _assert_only_changed_keys(mariadb, config, db, [1, *changed])
    # The pipeline has begun: a table snapshotted again is copied whole, not started at the binlog's end again.
    assert resnapshot(config, [f"{db}.t"]).branched == (f"{db}.t",)
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)


@pytest.mark.parametrize("where", ["transaction end", "file head"])
def test_binlog_position_reads_from_the_given_file_and_position(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, where: str
) -> None:
    db = "st_pos_" + where.replace(" ", "_")
    _fresh_db(mariadb, db)
    if where == "file head":
        mariadb.execute("FLUSH BINARY LOGS")
    file, pos, _ = _position(mariadb)
    pos = 4 if where == "file head" else pos
    changed = _write_after(mariadb, db)
    config = _config(mariadb, db, tmp_path, "binlog_position", binlog_file=file, binlog_position=pos)
    run(config, spark=spark, until_caught_up=True)
    _assert_only_changed_keys(mariadb, config, db, changed)


def test_gtid_reads_from_the_transaction_after_the_given_gtid_position(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "st_gtid"
    _fresh_db(mariadb, db)
    _, _, gtid = _position(mariadb)
    changed = _write_after(mariadb, db)
    config = _config(mariadb, db, tmp_path, "gtid", gtid=gtid)
    run(config, spark=spark, until_caught_up=True)
    _assert_only_changed_keys(mariadb, config, db, changed)


def test_timestamp_reads_from_the_first_transaction_committed_at_or_after_the_time(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "st_time"
    _fresh_db(mariadb, db)
    mariadb.execute("FLUSH BINARY LOGS")  # the start is found in a file after the first one
    mariadb.execute(f"UPDATE {db}.t SET v = 'before' WHERE id = 1")
    # The binlog stamps whole seconds: the start is the next second, and the changes after it wait for it.
    at = int(time.time()) + 1
    time.sleep(max(0.0, at - time.time()) + 0.05)
    changed = _write_after(mariadb, db)
    when = dt.datetime.fromtimestamp(at, dt.UTC).isoformat()
    config = _config(mariadb, db, tmp_path, "timestamp", timestamp=when)
    run(config, spark=spark, until_caught_up=True)
    _assert_only_changed_keys(mariadb, config, db, changed)


LATER = "2099-01-01T00:00:00Z"
PAST = "2001-01-01T00:00:00Z"


def _purge_all_but_current(mariadb: MariaDBServer) -> str:
    mariadb.execute("FLUSH BINARY LOGS")
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        current = str(cur.fetchone()[0])
        # MariaDB keeps a file until InnoDB's binlog checkpoint has passed it: ask again until it is gone.
        for _ in range(80):
            cur.execute("FLUSH ENGINE LOGS")
            cur.execute(f"PURGE BINARY LOGS TO '{current}'")
            cur.execute("SHOW BINARY LOGS")
            if cur.fetchone()[0] == current:
                return current
            time.sleep(0.25)
    pytest.fail("the server did not purge its old binlogs")


def test_a_purged_future_or_mid_transaction_start_is_refused_before_anything_is_written(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "st_refused"
    _fresh_db(mariadb, db)
    old_file, old_pos, old_gtid = _position(mariadb)
    mariadb.execute(f"INSERT INTO {db}.t VALUES (50, 'x', 50)")  # a transaction at old_pos
    current = _purge_all_but_current(mariadb)
    mariadb.execute(f"INSERT INTO {db}.t VALUES (51, 'y', 51)")
    file, pos, gtid = _position(mariadb)
    assert file == current
    domain, server, seq = (int(x) for x in gtid.split("-"))
    base, number = file.rsplit(".", 1)
    later_file = f"{base}.{int(number) + 5:0{len(number)}d}"
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute(f"SHOW BINLOG EVENTS IN '{file}'")
        table_map = next(int(r[1]) for r in cur.fetchall() if r[2] == "Table_map")
    ahead = f"{domain}-{server}-{seq + 9}"

    def at(f: str, p: int) -> tuple[str, dict[str, Any]]:
        return "binlog_position", {"binlog_file": f, "binlog_position": p}

    cases: list[tuple[type[Exception], str, tuple[str, dict[str, Any]]]] = [
        (BinlogPurgedError, f"{old_file}:{old_pos} is no longer on the server", at(old_file, old_pos)),
        (ConfigError, f"{file}:{pos + 100_000} is past the end .* future", at(file, pos + 100_000)),
        (ConfigError, f"{later_file}:4 is past the end .* future", at(later_file, 4)),
        (ConfigError, f"{file}:{table_map} is inside a transaction", at(file, table_map)),
        (ConfigError, f"{file}:{table_map + 1} is not where an event", at(file, table_map + 1)),
        (BinlogPurgedError, f"{old_gtid} is no longer on the server", ("gtid", {"gtid": old_gtid})),
        (ConfigError, f"{ahead} is past the end", ("gtid", {"gtid": ahead})),
        (ConfigError, "2099-01-01T00:00:00.00:00 is later than the server", ("timestamp", {"timestamp": LATER})),
        (BinlogPurgedError, "2001-01-01T00:00:00.00:00 is no longer on the server", ("timestamp", {"timestamp": PAST})),
    ]
    for error, message, (mode, startup) in cases:
        config = _config(mariadb, db, tmp_path, mode, **startup)
        with pytest.raises(error, match=message) as raised:
            run(config, spark=spark, until_caught_up=True)
        assert "\n" not in str(raised.value)
    # A schema change of a captured table between the start and now: its rows before it cannot be decoded.
    mariadb.execute(f"ALTER TABLE {db}.t ADD COLUMN extra INT")
    config = _config(mariadb, db, tmp_path, "binlog_position", binlog_file=file, binlog_position=pos)
    with pytest.raises(ConfigError, match=rf"{file}:{pos} is before a schema change of {db}\.t"):
        run(config, spark=spark, until_caught_up=True)
    # Nothing was written: no target, no state table.
    assert load_pyiceberg_catalog(config.sink).list_namespaces() == []


def test_a_failure_after_the_targets_and_before_the_start_record_starts_at_the_same_position(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = "st_fail"
    _fresh_db(mariadb, db)
    file, pos, _ = _position(mariadb)
    changed = _write_after(mariadb, db)
    config = _config(mariadb, db, tmp_path, "binlog_position", binlog_file=file, binlog_position=pos)
    reset_fault_counts()
    monkeypatch.setenv(FAIL_ENV, "startup.before_record:1")
    with pytest.raises(InjectedFailure):
        run(config, spark=spark, until_caught_up=True)
    monkeypatch.delenv(FAIL_ENV)
    assert pipeline_is_new(config.sink, config.name)  # the targets exist, empty; the state table records nothing
    run(config, spark=spark, until_caught_up=True)
    _assert_only_changed_keys(mariadb, config, db, changed)


def test_kill_9_after_the_first_binlog_commit_and_before_its_offset_repeats_nothing_on_restart(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "st_kill"
    _fresh_db(mariadb, db)
    file, pos, _ = _position(mariadb)
    # Inserts only: such a batch is appended, not MERGEd, so a batch committed twice would show as rows twice.
    mariadb.execute(f"INSERT INTO {db}.t SELECT seq, 'after', seq FROM {db}.seq_21_to_40")
    data = _data(mariadb, db, tmp_path, "binlog_position", binlog_file=file, binlog_position=pos)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    # Killed right after the batch's one commit landed (the target's rows and the offset), before the job knew.
    crashed = run_ingest("run", "--config", str(path), "--until-caught-up", crash_at="atomic.after_swap")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    config = parse_config(data)
    assert StateTable.open(config.sink, config.name).stream_offset() is not None
    mariadb.execute(f"UPDATE {db}.t SET v = 'later' WHERE id IN (2, 30)")  # after the kill
    run(config, spark=spark, until_caught_up=True)
    _assert_only_changed_keys(mariadb, config, db, [2, *range(21, 41)])
    table = load_pyiceberg_catalog(config.sink).load_table((db, "t"))
    offsets = [
        s.summary.additional_properties[SUMMARY_STREAM_OFFSET]
        for s in main_history(table)
        if s.summary is not None and SUMMARY_STREAM_OFFSET in s.summary.additional_properties
    ]
    assert len(offsets) == len(set(offsets)) == 2, offsets  # the killed run's batch, then the update's
