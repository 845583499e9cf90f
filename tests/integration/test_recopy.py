"""Copying a target again through an Iceberg branch (issue 24): readers of main see the old rows, whole, until the
copy is complete, whichever way it was asked for (`ingest resnapshot`, `ingest snapshot --again`, a purged binlog
with `stream.on_purged: resnapshot`) and wherever the job is killed; a source whose schema no longer fits the
target is dropped and copied as before."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commands.resnapshot import resnapshot
from ingest.commands.snapshot import ask_snapshot
from ingest.commands.status import table_status
from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.faults import FAIL_ENV, InjectedFailure
from ingest.faults import reset as reset_fault_counts
from ingest.query.pipeline import run
from ingest.query.snapshot import SUMMARY_BATCH
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.maintenance import SUMMARY_MAINTENANCE
from ingest.sink.recopy import SUMMARY_COPY
from ingest.sink.summary import SUMMARY_STREAM_OFFSET
from ingest.sink.targets import COPY_BRANCH, STAGE_BRANCH, chunks_done_in_target, copy_under_way, lineage
from ingest.state.table import StateTable
from tests.conftest import embedded_sink, main_history, run_ingest, source_section
from tests.integration.test_adhoc import _Log, _stop
from tests.integration.test_binlog_edges import purge_binlogs
from tests.integration.test_streaming import _start_streaming_job, background_writes

pytestmark = pytest.mark.integration

KEYS = 300
CHUNKS = 8  # KEYS / chunk_size 40, rounded up
SNAPSHOT = {"chunk_size": 40, "chunks_per_commit": 1, "parallelism": 2}


def _setup(
    mariadb: MariaDBServer, db: str, tmp_path: Path, tables: str = "t", **stream: Any
) -> tuple[PipelineConfig, Path]:
    """`db.t` with KEYS rows, and a pipeline of the `tables` of `db` (a pattern; also as a file, for runs in a
    subprocess). The module's Spark session keeps the first catalog of a name: each test's is named after its
    database."""
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id INT NOT NULL PRIMARY KEY, v INT)",
        f"INSERT INTO {db}.t SELECT seq, seq FROM {db}.seq_1_to_{KEYS}",
    )
    data = {
        "name": db,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{db}\.{tables}"]},
        "sink": {**embedded_sink(tmp_path), "catalog_name": f"{db}_lake"},
        "snapshot": SNAPSHOT,
        "stream": {"batch_interval_seconds": 1, **stream},
    }
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))
    return parse_config(data, tmp_path), config_file


def _first_copy(spark: Any, config: PipelineConfig) -> None:
    """The target's first copy, whose rows readers keep seeing while it is copied again: in one chunk commit, as
    how it was committed is no test's point (the copies the tests watch or kill commit chunk by chunk)."""
    snapshot = dataclasses.replace(config.snapshot, chunks_per_commit=CHUNKS)
    run(dataclasses.replace(config, snapshot=snapshot), spark=spark, until_caught_up=True)


def _target(config: PipelineConfig, db: str) -> Any:
    return load_pyiceberg_catalog(config.sink).load_table((db, "t"))


def _rows(table: Any) -> dict[int, int]:
    """What a reader of the table's main sees."""
    return {r["id"]: r["v"] for r in table.scan().to_arrow().to_pylist()}


def _mysql(mariadb: MariaDBServer, db: str) -> dict[int, int]:
    with mariadb.admin(db) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, v FROM t")
        return {int(k): int(v) for k, v in cur.fetchall()}


def _watch_main(config: PipelineConfig, db: str, done: Callable[[], bool]) -> list[tuple[int, dict[int, int], int]]:
    """Until `done`, read the target's main about three times a second while its copy branch exists: per reading,
    main's snapshot id, its rows, and how many chunks the branch holds then."""
    seen = []
    while not done():
        table = _target(config, db)
        if copy_under_way(table):
            seen.append((table.current_snapshot().snapshot_id, _rows(table), len(chunks_done_in_target(table, db))))
        time.sleep(0.3)
    return seen


def _during_copy(seen: list[tuple[int, dict[int, int], int]]) -> None:
    """Main was read while the branch held some chunks but not all of them (the copy was under way)."""
    assert any(0 < chunks < CHUNKS for _, _, chunks in seen), [chunks for _, _, chunks in seen]


def _in_thread(job: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            job()
        except BaseException as e:  # noqa: BLE001 - raised again by the test
            errors.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, errors


def _copy_while_readers_watch(
    spark: Any, mariadb: MariaDBServer, config: PipelineConfig, db: str, old: dict[int, int]
) -> None:
    """Run the job until caught up, with writes to the source, reading main all along: main shows exactly the old
    rows while the branch fills; then a second run takes the writes after the first one's goal, and the copy is
    complete, each chunk and batch once."""
    with background_writes(mariadb, db, _bump):
        job, errors = _in_thread(lambda: run(config, spark=spark, until_caught_up=True))
        seen = _watch_main(config, db, lambda: not job.is_alive())
        job.join()
    assert not errors, errors
    _during_copy(seen)
    assert all(rows == old for _, rows, _ in seen)
    run(config, spark=spark, until_caught_up=True)
    _once_each(config, db)


def _once_each(config: PipelineConfig, db: str) -> None:
    """The copy is complete, read once: the branch is gone, main equals MySQL, no chunk was recorded twice and no
    binlog batch was committed twice."""
    table = _target(config, db)
    assert not copy_under_way(table) and set(table.metadata.refs) - {STAGE_BRANCH} == {"main"}
    assert verify(config)
    assert set(StateTable.open(config.sink, config.name).times_recorded(f"{db}.t").values()) == {1}
    offsets = [
        json.loads(props[SUMMARY_STREAM_OFFSET])["position"]
        for s in main_history(table)
        if SUMMARY_STREAM_OFFSET in (props := s.summary.additional_properties) and SUMMARY_MAINTENANCE not in props
    ]
    assert len(offsets) == len(set(offsets)), "a binlog batch was committed twice"


POLL = 0.25
"""Seconds between looks at the running job's state while waiting on it."""


def _wait(what: str, done: Callable[[], bool], job: Any, log: _Log, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert job.poll() is None, f"the job stopped while waiting until {what}: {log.text()[-3000:]}"
        assert time.monotonic() < deadline, f"not {what} after {seconds} s"
        time.sleep(POLL)


def _streaming(config: PipelineConfig) -> bool:
    """The job has read every chunk and committed a binlog batch (a binlog batch alone does not say the snapshot
    is complete: the query reads chunks between binlog batches)."""
    try:
        state = StateTable.open(config.sink, config.name)
    except Exception:  # noqa: BLE001 - the catalog is created by the job
        return False
    copied = all(len(state.done(t)) == len(state.plan(t) or []) for t in state.tables())
    return copied and state.stream_offset() is not None


def _streams_on_into_main(config: PipelineConfig, db: str, job: Any, log: _Log) -> None:
    """Once the copy is swapped in: until main holds a binlog-phase commit made after the snapshot it has now (the
    job streams on into main after the copy)."""
    swapped = _target(config, db).current_snapshot().snapshot_id

    def streamed() -> bool:
        for s in lineage(_target(config, db)):
            if s.snapshot_id == swapped:
                return False
            props = s.summary.additional_properties
            if SUMMARY_STREAM_OFFSET in props and SUMMARY_MAINTENANCE not in props:
                return True
        return False

    _wait("a binlog commit into main after the swap", streamed, job, log)


def _caught_up(spark: Any, config: PipelineConfig) -> None:
    """Catch up after a SIGTERM stop, before comparing with MySQL: a stop reads on for at most 10 s (StopPoint), and
    on a loaded machine the job can still be behind the writer's last changes then (CI's 3 workers on 2 cores). The
    catch-up starts from what Iceberg holds, so a change the job lost or committed twice still fails `_once_each`."""
    run(config, spark=spark, until_caught_up=True)


def _bump(cur: Any, n: int) -> None:
    cur.execute("UPDATE t SET v = v + 1 WHERE id = %s", (1 + n * 7 % KEYS,))


def test_readers_of_main_see_the_old_rows_while_resnapshot_copies_into_the_branch(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Fails on the old behaviour: a dropped target is missing, then empty, then partial while it is copied."""
    db = "recopy_offline"
    config, _ = _setup(mariadb, db, tmp_path)
    _first_copy(spark, config)
    mariadb.execute(f"UPDATE {db}.t SET v = -v WHERE id <= 100")  # the old rows differ from the new copy
    old = _rows(_target(config, db))
    assert len(old) == KEYS and old != _mysql(mariadb, db)
    uuid = _target(config, db).metadata.table_uuid

    assert resnapshot(config, [f"{db}.t"]).branched == (f"{db}.t",)
    assert _rows(_target(config, db)) == old
    _copy_while_readers_watch(spark, mariadb, config, db, old)
    assert _target(config, db).metadata.table_uuid == uuid  # the same table: never dropped


def _killed_at(config: PipelineConfig, config_file: Path, crash_at: str) -> None:
    """`ingest run --until-caught-up` in a process of its own, killed (SIGKILL) at `crash_at`."""
    killed = run_ingest("run", "--config", str(config_file), "--until-caught-up", crash_at=crash_at)
    assert killed.returncode == -signal.SIGKILL, (crash_at, killed.stderr[-3000:])


def _branch_kept(config: PipelineConfig, db: str, old: dict[int, int]) -> None:
    """After a kill before the swap: the copy is still under way, readers of main see exactly the old rows."""
    table = _target(config, db)
    assert copy_under_way(table) and _rows(table) == old
    assert table_status(config)[0]["copy_branch"] == COPY_BRANCH


def test_a_job_killed_during_the_branch_copy_ends_equal_with_the_branch_gone(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """One table killed at each point of its branch copy in turn, with DML after every kill that the next run must
    take: between two chunk commits, then (the resumed run copying the rest) between the last chunk and the swap;
    the run after that swaps and streams. Then a second copy, whole in one process, killed right after its swap:
    main is then exactly MySQL, and DML after it streams into main."""
    db = "recopy_kill"
    config, config_file = _setup(mariadb, db, tmp_path)
    _first_copy(spark, config)
    mariadb.execute(f"UPDATE {db}.t SET v = -v WHERE id > 200")
    old = _rows(_target(config, db))
    assert resnapshot(config, [f"{db}.t"]).branched == (f"{db}.t",)

    _killed_at(config, config_file, "snapshot.after_commit:3")
    _branch_kept(config, db, old)
    mariadb.execute(f"UPDATE {db}.t SET v = 0 WHERE id % 10 = 0", f"DELETE FROM {db}.t WHERE id = 5")
    _killed_at(config, config_file, "recopy.before_swap")
    _branch_kept(config, db, old)
    mariadb.execute(f"UPDATE {db}.t SET v = 1 WHERE id % 10 = 1", f"DELETE FROM {db}.t WHERE id = 6")
    run(config, spark=spark, until_caught_up=True)
    _once_each(config, db)

    assert resnapshot(config, [f"{db}.t"]).branched == (f"{db}.t",)
    _killed_at(config, config_file, "recopy.after_swap")
    table = _target(config, db)
    assert not copy_under_way(table) and _rows(table) == _mysql(mariadb, db)
    mariadb.execute(f"UPDATE {db}.t SET v = 2 WHERE id % 10 = 2", f"DELETE FROM {db}.t WHERE id = 7")
    run(config, spark=spark, until_caught_up=True)
    _once_each(config, db)


def test_a_resnapshot_stopped_between_its_two_steps_is_finished_by_the_next_run(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The branch is started over but the state table still records the old copy's chunks: the run must not take
    them for chunks of the new copy (the branch would stay empty, then replace main)."""
    db = "recopy_half"
    config, _ = _setup(mariadb, db, tmp_path)
    _first_copy(spark, config)
    mariadb.execute(f"UPDATE {db}.t SET v = -v WHERE id > 100")
    monkeypatch.setenv(FAIL_ENV, "resnapshot.before_forget")
    reset_fault_counts()
    with pytest.raises(InjectedFailure):
        resnapshot(config, [f"{db}.t"])
    monkeypatch.delenv(FAIL_ENV)
    assert (
        copy_under_way(_target(config, db)) and len(StateTable.open(config.sink, config.name).done(f"{db}.t")) == CHUNKS
    )
    run(config, spark=spark, until_caught_up=True)
    _once_each(config, db)


def test_a_copy_asked_again_while_its_branch_copy_is_under_way_starts_that_copy_over(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = "recopy_twice"
    config, _ = _setup(mariadb, db, tmp_path)
    _first_copy(spark, config)
    assert resnapshot(config, [f"{db}.t"]).branched == (f"{db}.t",)
    monkeypatch.setenv(FAIL_ENV, "snapshot.after_state:3")  # the run fails with 3 chunks in the branch
    reset_fault_counts()
    with pytest.raises(InjectedFailure):
        run(config, spark=spark, until_caught_up=True)
    monkeypatch.delenv(FAIL_ENV)
    assert len(chunks_done_in_target(_target(config, db), db)) == 3
    mariadb.execute(f"UPDATE {db}.t SET v = -v WHERE id % 3 = 0")
    assert ask_snapshot(config, [f"{db}.t"], "again").tables == (f"{db}.t",)
    run(config, spark=spark, until_caught_up=True)
    _once_each(config, db)
    # Main holds the second start of the branch and its chunk commits only, not the first start's three.
    history = [s.summary.additional_properties for s in lineage(_target(config, db))]
    assert sum(SUMMARY_COPY in props for props in history) == 1
    assert sum(SUMMARY_BATCH in props for props in history) == CHUNKS


def _streaming_and_maintained(config: PipelineConfig, log: _Log) -> bool:
    """The job streams, and has started its maintenance of the target once: so that none during the copy says
    something."""
    return _streaming(config) and any("maintenance starts" in line for line in log.lines)


def test_snapshot_again_asked_of_a_running_job_copies_into_the_branch_while_readers_see_main_whole(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Main stays at the snapshot it had when the request was taken (the job writes only the branch meanwhile, and
    neither compacts nor expires the table though it is due every 2 commits): every reading sees that one
    snapshot, with every key. Fails on the old behaviour (the target dropped)."""
    db = "recopy_live"
    first, _ = _setup(mariadb, db, tmp_path)
    _first_copy(spark, first)  # the job below starts with the target copied: it streams, then is asked to copy again
    maintenance = {"maintenance": {"every_commits": 2, "expire_after_hours": 0}}
    config, job = _start_streaming_job(
        mariadb, db, tmp_path, rf"{db}\.t", f"{db}_lake", SNAPSHOT, sink=maintenance, signal_poll_seconds=1
    )
    log = _Log(job)
    try:
        with background_writes(mariadb, db, _bump):
            _wait("the job streams and has compacted once", lambda: _streaming_and_maintained(config, log), job, log)
            uuid = _target(config, db).metadata.table_uuid
            asked = run_ingest("snapshot", "--config", str(tmp_path / "pipeline.yaml"), "--table", f"{db}.t", "--again")
            assert asked.returncode == 0, asked.stderr[-2000:]
            _wait("the job took the request", lambda: copy_under_way(_target(config, db)), job, log)
            seen = _watch_main(config, db, lambda: job.poll() is not None or not copy_under_way(_target(config, db)))
            _streams_on_into_main(config, db, job, log)
        err = _stop(job, log)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert f"chunks {CHUNKS}/{CHUNKS} read while streaming" in err, err[-3000:]
    during = err.split("copying it again", 1)[1].split("the copy is complete", 1)[0]
    assert "maintenance starts" in err and "maintenance starts" not in during, err[-3000:]
    _during_copy(seen)
    assert len({snapshot for snapshot, _, _ in seen}) == 1
    assert all(sorted(rows) == list(range(1, KEYS + 1)) for _, rows, _ in seen)
    _caught_up(spark, config)
    _once_each(config, db)
    assert _target(config, db).metadata.table_uuid == uuid


def test_a_ddl_evolve_cannot_follow_copies_the_table_again_through_its_branch_while_the_job_runs(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Issue 32, `stream.on_unfollowable: recopy`: a narrowing `MODIFY` (INT to SMALLINT, which evolve refuses)
    reaches the running job under a writer. The job does not stop: every change before the statement is
    committed, the table is copied again into its branch, which its Iceberg columns (still `int`) hold, so readers
    of main keep the old rows, whole, until the swap; the other table streams on meanwhile."""
    db = "recopy_ddl"
    first, _ = _setup(mariadb, db, tmp_path, "(t|u)")
    mariadb.execute(
        f"CREATE TABLE {db}.u (id INT NOT NULL PRIMARY KEY, v INT)",
        f"INSERT INTO {db}.u SELECT seq, 0 FROM {db}.seq_1_to_20",
    )
    _first_copy(spark, first)  # the job below starts with both targets copied
    config, job = _start_streaming_job(
        mariadb, db, tmp_path, rf"{db}\.(t|u)", f"{db}_lake", SNAPSHOT, on_unfollowable="recopy"
    )
    log = _Log(job)

    def write(cur: Any, n: int) -> None:
        _bump(cur, n)
        cur.execute("UPDATE u SET v = %s WHERE id = %s", (n, 1 + n % 20))

    try:
        with background_writes(mariadb, db, write):
            _wait("the job is streaming", lambda: _streaming(config), job, log)
            uuid = _target(config, db).metadata.table_uuid
            mariadb.execute(f"ALTER TABLE {db}.t MODIFY v SMALLINT")
            _wait("the job met the DDL", lambda: copy_under_way(_target(config, db)), job, log)
            seen = _watch_main(config, db, lambda: job.poll() is not None or not copy_under_way(_target(config, db)))
            _streams_on_into_main(config, db, job, log)
        err = _stop(job, log)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert "a narrowing integer change" in err and "it is copied again; the other tables stream on" in err, err[-3000:]
    assert "mirrors the new schema from the copy on" in err, err[-3000:]
    _during_copy(seen)
    assert all(sorted(rows) == list(range(1, KEYS + 1)) for _, rows, _ in seen)
    _caught_up(spark, config)
    _once_each(config, db)
    assert _target(config, db).metadata.table_uuid == uuid
    assert json.loads(_target(config, db).properties["ingest.source-schema"])["columns"][1]["data_type"] == "smallint"


def test_a_generated_column_added_while_the_job_streams_is_read_again_into_the_branch_readers_keep_the_old_rows(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Issue 49: the server computed the new column's value for every old row and logged none. With
    `on_unfollowable: recopy` the job reads the table again while it streams: the column joins the Iceberg schema
    (main reads it as NULL until the copy lands) and the copy goes to the branch, so readers of main keep every
    row until the swap; then main holds the server's values. It used to add the column as NULL and exit 0."""
    db = "recopy_generated"
    first, _ = _setup(mariadb, db, tmp_path, on_unfollowable="recopy")
    _first_copy(spark, first)
    config, job = _start_streaming_job(
        mariadb, db, tmp_path, rf"{db}\.t", f"{db}_lake", SNAPSHOT, on_unfollowable="recopy"
    )
    log = _Log(job)
    try:
        with background_writes(mariadb, db, _bump):
            _wait("the job is streaming", lambda: _streaming(config), job, log)
            uuid = _target(config, db).metadata.table_uuid
            mariadb.execute(f"ALTER TABLE {db}.t ADD COLUMN g INT AS (v * 2) STORED AFTER id")
            _wait("the job met the DDL", lambda: copy_under_way(_target(config, db)), job, log)
            seen = _watch_main(config, db, lambda: job.poll() is not None or not copy_under_way(_target(config, db)))
            _streams_on_into_main(config, db, job, log)
        err = _stop(job, log)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert "'g' is generated" in err and "it is copied again; the other tables stream on" in err, err[-3000:]
    _during_copy(seen)
    assert all(sorted(rows) == list(range(1, KEYS + 1)) for _, rows, _ in seen)
    _caught_up(spark, config)
    _once_each(config, db)
    assert _target(config, db).metadata.table_uuid == uuid
    assert [f.name for f in _target(config, db).schema().fields] == ["id", "g", "v"]
    rows = _target(config, db).scan().to_arrow().to_pylist()
    assert rows and all(r["g"] == 2 * r["v"] for r in rows)


def test_a_job_killed_at_a_ddl_it_copies_again_copies_it_on_the_next_run(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """The request to copy the table again is recorded before the DDL's offset: a kill between them, or after,
    leaves a run that copies it and ends equal. A new primary key fits the branch too (Iceberg stores no key)."""
    db = "recopy_ddl_kill"
    config, config_file = _setup(mariadb, db, tmp_path, on_unfollowable="recopy")
    _first_copy(spark, config)
    mariadb.execute(
        f"UPDATE {db}.t SET v = -v WHERE id <= 10",
        f"ALTER TABLE {db}.t DROP PRIMARY KEY, ADD PRIMARY KEY (id, v)",
        f"INSERT INTO {db}.t VALUES (1, 5)",  # a second row of id 1: only the new key tells them apart
    )
    crashed = run_ingest(
        "run", "--config", str(config_file), "--until-caught-up", crash_at="stream.before_schema_state:1"
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert f"{db}.t" in StateTable.open(config.sink, config.name).requests().snapshot
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    assert sorted((r["id"], r["v"]) for r in _target(config, db).scan().to_arrow().to_pylist())[:2] == [(1, -1), (1, 5)]
    assert set(StateTable.open(config.sink, config.name).times_recorded(f"{db}.t").values()) == {1}


def test_a_generated_column_read_again_under_kills_at_its_steps_ends_equal_each_chunk_once(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Issue 49, exactly once: SIGKILL before the DDL's offset (the request to copy again recorded) and before the
    copy's swap (the added column already in the schema; kills between chunk commits are the test above's); readers
    of main keep every old row throughout, and the run after the kills ends equal to MariaDB, the new column holding
    the server's values, each chunk recorded once."""
    db = "recopy_gen_kill"
    config, config_file = _setup(mariadb, db, tmp_path, on_unfollowable="recopy")
    _first_copy(spark, config)
    mariadb.execute(
        f"UPDATE {db}.t SET v = -v WHERE id <= 10",
        f"ALTER TABLE {db}.t ADD COLUMN g INT AS (v * 2) STORED",
        f"UPDATE {db}.t SET v = 0 WHERE id % 10 = 0",
    )
    _killed_at(config, config_file, "stream.before_schema_state:1")
    assert f"{db}.t" in StateTable.open(config.sink, config.name).requests().snapshot
    old = _rows(_target(config, db))  # what came before the DDL, committed
    assert old[1] == -1 and old[10] == -10 and old[20] == 20
    mariadb.execute(f"DELETE FROM {db}.t WHERE id = 5", f"UPDATE {db}.t SET v = 7 WHERE id = 6")
    _killed_at(config, config_file, "recopy.before_swap")
    _branch_kept(config, db, old)
    run(config, spark=spark, until_caught_up=True)
    _once_each(config, db)
    rows = _target(config, db).scan().to_arrow().to_pylist()
    assert len(rows) == KEYS - 1 and all(r["g"] == 2 * r["v"] for r in rows)


def test_a_source_schema_that_no_longer_fits_the_target_drops_it_as_before_and_says_why(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = "recopy_misfit"
    config, _ = _setup(mariadb, db, tmp_path)
    _first_copy(spark, config)
    # With the job stopped: not followed. A column only added would join the Iceberg schema (test_recopy's
    # generated column); one dropped cannot leave it while readers of main still read the old rows.
    mariadb.execute(f"ALTER TABLE {db}.t DROP COLUMN v, ADD COLUMN x INT DEFAULT 7")
    with caplog.at_level(logging.WARNING, logger="ingest.sink.recopy"):
        over = resnapshot(config, [f"{db}.t"])
    assert over.branched == () and over.dropped == (f"{db}.t",)
    assert "its columns changed (+x, -v)" in caplog.text and "readers see it empty" in caplog.text
    run(config, spark=spark, until_caught_up=True)
    assert [f.name for f in _target(config, db).schema().fields] == ["id", "x"]
    assert verify(config)


def test_a_purged_binlog_with_on_purged_resnapshot_copies_every_table_again_through_branches(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stop` (the default) still stops with the way out: test_binlog_edges.py's purged-binlog test."""
    db = "recopy_purged"
    config, _ = _setup(mariadb, db, tmp_path, on_purged="resnapshot")
    _first_copy(spark, config)
    mariadb.execute(f"UPDATE {db}.t SET v = -v WHERE id <= 50")
    run(config, spark=spark, until_caught_up=True)
    assert StateTable.open(config.sink, config.name).stream_offset() is not None
    mariadb.execute(f"UPDATE {db}.t SET v = 0 WHERE id > 250")  # in the binlog about to be purged
    purge_binlogs(mariadb)
    old = _rows(_target(config, db))
    assert old != _mysql(mariadb, db)
    # A failure right after the table's copy started over (the state still holds its old chunks and offset).
    monkeypatch.setenv(FAIL_ENV, "purged.after_start_over")
    reset_fault_counts()
    with pytest.raises(InjectedFailure):
        run(config, spark=spark, until_caught_up=True)
    monkeypatch.delenv(FAIL_ENV)
    assert copy_under_way(_target(config, db)) and _rows(_target(config, db)) == old

    _copy_while_readers_watch(spark, mariadb, config, db, old)
    assert StateTable.open(config.sink, config.name).stream_offset() is not None  # streaming from the new snapshot
