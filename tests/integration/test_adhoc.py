"""Snapshots asked of a running job (`ingest snapshot`, MISSION.md seed 004): a table created after the job
started, or copied again, lands equal to MySQL while the job keeps streaming the other tables."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.exceptions import CommitFailedException, ValidationException

from ingest.commands.verify import verify
from ingest.devservers.mariadb import MariaDBServer
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.summary import SUMMARY_STREAM_OFFSET
from ingest.sink.targets import COPY_BRANCH, STAGE_BRANCH
from ingest.state.table import StateTable
from tests.conftest import main_history, run_ingest
from tests.integration.test_streaming import _fresh_db, _start_streaming_job, background_writes

pytestmark = pytest.mark.integration

LIVE_SNAPSHOT = {"chunk_size": 40, "chunks_per_commit": 1}


BINLOG_COMMIT = "binlog: committed"
"""The job's log line after each binlog batch's commit (ingest/query/commit.py)."""


class _Log:
    """The job's stderr, read on a thread as it comes (a full pipe would block the job). The job logs a line after
    each commit, so a test waiting on what a commit writes looks again at each new line, not on a clock."""

    def __init__(self, job: Any) -> None:
        self.lines: list[str] = []
        self._grew = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(job,), daemon=True)
        self._thread.start()

    def _read(self, job: Any) -> None:
        for line in job.stderr:
            with self._grew:
                self.lines.append(line)
                self._grew.notify_all()

    def next_line(self, seconds: float) -> None:
        """Until the job logs another line, at most `seconds`."""
        with self._grew:
            seen = len(self.lines)
            self._grew.wait_for(lambda: len(self.lines) > seen, timeout=seconds)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def text(self) -> str:
        self._thread.join(timeout=60)
        return "".join(self.lines)


def _wait(what: str, done: Callable[[], bool], job: Any, log: _Log, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert job.poll() is None, f"the job stopped while waiting until {what}: {log.text()[-3000:]}"
        assert time.monotonic() < deadline, f"not {what} after {seconds} s"
        log.next_line(1)


def _streaming(config: Any) -> bool:
    """The job has read every chunk and committed a binlog batch (the query reads chunks between binlog batches:
    a binlog batch alone does not say the snapshot is complete)."""
    try:
        state = StateTable.open(config.sink, config.name)
        copied = all(len(state.done(t)) == len(state.plan(t) or []) for t in state.tables())
        return copied and state.stream_offset() is not None
    except Exception:  # noqa: BLE001 - the catalog is created by the job
        return False


def _killed(job: Any, log: _Log) -> str:
    """The job's log, once it has killed itself at its crash point."""
    job.wait(timeout=240)
    err = log.text()
    assert job.returncode == -signal.SIGKILL, err[-3000:]
    return err


def _ingest_meanwhile(*args: str) -> Callable[[], Any]:
    """`ingest ARGS` started now, in a process of its own, while the test goes on; call the result to wait for it.
    (Commands that only read, or that the test does not order against its other steps: each spends its few
    seconds mostly in imports.)"""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(run_ingest, *args)
    pool.shutdown(wait=False)
    return future.result


def _streamed_after_copy(config: Any, namespace: str, table: str) -> bool:
    """A binlog-phase commit reached the target after its last chunk commit."""
    chunks = _commit_times(config, namespace, table, stream=False)
    return bool(chunks) and any(t > chunks[-1] for t in _commit_times(config, namespace, table, stream=True))


def _copied(config: Any, table_id: str) -> bool:
    state = StateTable.open(config.sink, config.name)
    plan = state.plan(table_id)
    return plan is not None and len(state.done(table_id)) == len(plan)


def _commit_times(config: Any, namespace: str, table: str, stream: bool) -> list[int]:
    """Commit times (ms) of a target's binlog-phase commits (stream) or of its chunk commits."""
    target = load_pyiceberg_catalog(config.sink).load_table((namespace, table))
    return sorted(
        s.timestamp_ms
        for s in main_history(target)
        if s.summary is not None and (SUMMARY_STREAM_OFFSET in s.summary.additional_properties) == stream
    )


def _damage(config: Any, db: str) -> None:
    """Delete rows from a target by hand while the job commits to it. The job's own commits can win the
    race (pyiceberg then refuses ours), as any other writer's would: try again on the fresh table."""
    for attempt in range(20):
        try:
            load_pyiceberg_catalog(config.sink).load_table((db, "t")).delete("id < 100")
            return
        except (CommitFailedException, ValidationException):
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("the job's commits refused every hand-made delete for 20 attempts")


def _stop(job: Any, log: _Log) -> str:
    job.send_signal(signal.SIGTERM)
    job.wait(timeout=120)
    err = log.text()
    assert job.returncode == 0, err[-3000:]
    return err


def _move_keys(cur: Any, n: int, table: str, keys: int) -> None:
    """Random-looking DML on one table of `keys` rows: updates everywhere; deletes and re-inserts in the first
    quarter only (a duplicate row elsewhere would never be healed by a later delete); keys moving into a new
    range above the table and back into the first quarter, across chunks."""
    quarter = keys // 4
    cur.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", (1 + n * 7 % keys,))
    cur.execute(f"DELETE FROM {table} WHERE id = %s", (1 + n * 11 % quarter,))
    cur.execute(f"INSERT IGNORE INTO {table} VALUES (%s, %s)", (1 + n * 17 % quarter, n))
    cur.execute(f"UPDATE IGNORE {table} SET id = %s WHERE id = %s", (keys + 1 + n * 19 % keys, 1 + n * 23 % keys))
    cur.execute(f"UPDATE IGNORE {table} SET id = %s WHERE id = %s", (1 + n * 13 % quarter, keys + 1 + n * 29 % keys))


def test_tables_created_while_the_job_runs_are_copied_by_themselves_or_on_request_paused_and_resumed(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """One job, while the binlog keeps flowing for `bal`, in two steps.

    Tables created or renamed into the pattern are copied without a request: the job ends its query at the
    statement, plans the new tables and starts it again; the query then reads their chunks in chunk batches
    between its binlog batches.

    Then a table is copied on request, paused and resumed. The request comes first, for certain: the table is
    created without a binlog entry, so the job cannot begin to copy it by itself (the other order is the next
    test)."""
    db = "adhoc_new"
    _fresh_db(mariadb, db)
    mariadb.execute(
        f"CREATE TABLE {db}.bal (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO {db}.bal SELECT seq, 0 FROM {db}.seq_1_to_80",
        f"CREATE TABLE {db}.staging (id INT PRIMARY KEY, v INT)",  # not matched until renamed
        f"INSERT INTO {db}.staging SELECT seq, seq FROM {db}.seq_1_to_80",
        f"CREATE TABLE {db}.staging2 LIKE {db}.staging",
        f"INSERT INTO {db}.staging2 SELECT * FROM {db}.staging",
    )
    config, job = _start_streaming_job(
        mariadb, db, tmp_path, rf"{db}\.(bal|fresh|auto_.*)", db, LIVE_SNAPSHOT, signal_poll_seconds=1
    )
    log = _Log(job)
    config_file = str(tmp_path / "pipeline.yaml")
    created, later, fresh = threading.Event(), threading.Event(), threading.Event()

    def write(cur: Any, n: int) -> None:
        cur.execute("UPDATE bal SET v = v + 1 WHERE id = %s", (1 + n % 80,))
        if created.is_set():
            _move_keys(cur, n, "auto_new", 120)
            _move_keys(cur, n, "auto_renamed", 80)
        if later.is_set():
            _move_keys(cur, n, "auto_later", 80)
        if fresh.is_set():
            _move_keys(cur, n, "fresh", 200)

    def read() -> int:
        return len(StateTable.open(config.sink, config.name).done(f"{db}.fresh"))

    try:
        with background_writes(mariadb, db, write):
            _wait("the job streams", lambda: _streaming(config), job, log)
            # Back to back: the job ends its binlog phase at the CREATE, finds both tables, and reads the RENAME
            # again in the next phase (the renamed table's target already has what it did).
            mariadb.execute(
                f"CREATE TABLE {db}.auto_new (id INT PRIMARY KEY, v INT)",
                f"INSERT INTO {db}.auto_new SELECT seq, 0 FROM {db}.seq_1_to_120",
                f"RENAME TABLE {db}.staging TO {db}.auto_renamed",
            )
            created.set()
            for table in ("auto_new", "auto_renamed"):
                _wait(f"{table} is copied", lambda t=table: _copied(config, f"{db}.{t}"), job, log)
            mariadb.execute(f"ALTER TABLE {db}.staging2 RENAME TO {db}.auto_later")  # alone: its own restart
            later.set()
            _wait("auto_later is copied", lambda: _copied(config, f"{db}.auto_later"), job, log)
            # Changes after the last chunk go through the binlog phase too.
            _wait("a binlog batch after the copy", lambda: _streamed_after_copy(config, db, "auto_later"), job, log)
            created.clear()
            later.clear()

            mariadb.execute(
                "SET SESSION sql_log_bin = 0",
                f"CREATE TABLE {db}.fresh (id INT PRIMARY KEY, v INT)",
                f"INSERT INTO {db}.fresh SELECT seq, 0 FROM {db}.seq_1_to_200",
            )
            fresh.set()
            asked = run_ingest("snapshot", "--config", config_file, "--table", f"{db}.fresh")
            assert asked.returncode == 0, asked.stderr[-2000:]
            assert "within 1 s" in asked.stdout
            paused = run_ingest("snapshot", "--config", config_file, "--table", f"{db}.fresh", "--pause")
            assert paused.returncode == 0, paused.stderr[-2000:]
            _wait(
                "the job took the request",
                lambda: StateTable.open(config.sink, config.name).plan(f"{db}.fresh") is not None,
                job,
                log,
            )
            # The pause is seen within a second or so (the source looks every `signal_poll_seconds`): once no chunk
            # was read across two binlog batches (an unpaused table has a chunk batch after each).
            held = [read(), log.count(BINLOG_COMMIT)]

            def pause_seen() -> bool:
                now = read()
                if now != held[0]:
                    held[:] = [now, log.count(BINLOG_COMMIT)]
                return log.count(BINLOG_COMMIT) >= held[1] + 2

            _wait("the pause is seen", pause_seen, job, log)
            status, batches = _ingest_meanwhile("status", "--config", config_file), log.count(BINLOG_COMMIT)
            _wait("four more binlog batches", lambda: log.count(BINLOG_COMMIT) >= batches + 4, job, log)
            assert read() == held[0] < len(StateTable.open(config.sink, config.name).plan(f"{db}.fresh") or [])
            assert "snapshot (paused)" in status().stdout
            resumed = run_ingest("snapshot", "--config", config_file, "--table", f"{db}.fresh", "--resume")
            assert resumed.returncode == 0, resumed.stderr[-2000:]
            _wait("the new table is copied", lambda: _copied(config, f"{db}.fresh"), job, log)
            _wait("a binlog batch after the copy", lambda: _streamed_after_copy(config, db, "fresh"), job, log)
        err = _stop(job, log)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert f"{db}.auto_new: named by a DDL statement" in err, err[-3000:]
    assert f"{db}.auto_later: named by a DDL statement" in err, err[-3000:]
    chunks = len(StateTable.open(config.sink, config.name).plan(f"{db}.fresh") or [])
    assert chunks >= 3 and f"{db}.fresh: chunks {chunks}/{chunks} read while streaming" in err, err[-3000:]
    # Refused requests write nothing, and the one for the next run changes no plan: they run while verify reads.
    captured = _ingest_meanwhile("snapshot", "--config", config_file, "--table", f"{db}.fresh")
    complete = _ingest_meanwhile("snapshot", "--config", config_file, "--table", f"{db}.fresh", "--pause")
    unmatched = _ingest_meanwhile("snapshot", "--config", config_file, "--table", f"{db}.acct")
    before = load_pyiceberg_catalog(config.sink).load_table((db, "fresh")).metadata.table_uuid
    # Asked while no job runs: the next run copies it again, into a branch of the same Iceberg table (readers keep
    # the old rows until the copy is complete, tests/integration/test_recopy.py).
    again = _ingest_meanwhile("snapshot", "--config", config_file, "--table", f"{db}.fresh", "--again")
    # Every table the job wrote, fresh's last changes included, is equal to MySQL (the others were last written
    # before fresh was created, long before the stop).
    assert verify(config)
    assert set(StateTable.open(config.sink, config.name).times_recorded(f"{db}.fresh").values()) == {
        1
    }  # no chunk read twice
    # The binlog kept flowing for the other table while the new one was copied, chunk by chunk.
    chunk_commits = _commit_times(config, db, "fresh", stream=False)
    assert len(chunk_commits) == chunks
    assert any(chunk_commits[0] < t < chunk_commits[-1] for t in _commit_times(config, db, "bal", stream=True))

    refused = captured()
    assert refused.returncode == 2 and "already captured" in refused.stderr and "--again" in refused.stderr
    refused = complete()
    assert refused.returncode == 2 and "nothing to pause" in refused.stderr, refused.stderr
    refused = unmatched()
    assert refused.returncode == 2 and "not a table" in refused.stderr, refused.stderr
    asked_again = again()
    assert asked_again.returncode == 0, asked_again.stderr[-2000:]
    status_json = run_ingest("status", "--config", config_file, "--json")
    assert json.loads(status_json.stdout)["snapshot_requests"] == [{"table": f"{db}.fresh", "again": True}]
    run(config, spark=spark, until_caught_up=True)
    fresh_table = load_pyiceberg_catalog(config.sink).load_table((db, "fresh"))
    assert fresh_table.metadata.table_uuid == before and set(fresh_table.metadata.refs) - {STAGE_BRANCH} == {"main"}
    assert StateTable.open(config.sink, config.name).requests().snapshot == {}
    assert verify(config)
    tables = ("auto_later", "auto_new", "auto_renamed", "bal", "fresh")
    assert StateTable.open(config.sink, config.name).tables() == [f"{db}.{t}" for t in tables]


def test_a_snapshot_asked_of_a_table_the_job_is_copying_by_itself_says_so_and_succeeds(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """The job comes first, for certain: it sees the CREATE TABLE, plans the new table and copies its first chunk,
    and is killed before the second (the third chunk batch of its query: the first reads `bal`). `ingest snapshot
    --table` for it is then no mistake: it says the copy is under way and exits 0, asking nothing; the next run
    finishes the copy; a complete copy is refused as before."""
    db = "adhoc_first"
    _fresh_db(mariadb, db)
    mariadb.execute(f"CREATE TABLE {db}.bal (id INT PRIMARY KEY, v INT)", f"INSERT INTO {db}.bal VALUES (1, 0)")
    config, job = _start_streaming_job(
        mariadb, db, tmp_path, rf"{db}\.(bal|fresh)", db, LIVE_SNAPSHOT, "adhoc.before_copy:3", signal_poll_seconds=1
    )
    log = _Log(job)
    config_file = str(tmp_path / "pipeline.yaml")
    created = threading.Event()

    def write(cur: Any, n: int) -> None:
        cur.execute("UPDATE bal SET v = v + 1")
        if created.is_set():
            _move_keys(cur, n, "fresh", 120)

    try:
        with background_writes(mariadb, db, write):
            _wait("the job streams", lambda: _streaming(config), job, log)
            mariadb.execute(
                f"CREATE TABLE {db}.fresh (id INT PRIMARY KEY, v INT)",
                f"INSERT INTO {db}.fresh SELECT seq, 0 FROM {db}.seq_1_to_120",
            )
            created.set()
            _killed(job, log)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    # How many chunks the plan has depends on how many rows the writer's deletes left when the job planned (a slow
    # machine plans later, after more of them); what matters is that the copy is planned in several and one is done.
    chunks = len(StateTable.open(config.sink, config.name).plan(f"{db}.fresh") or [])
    assert len(StateTable.open(config.sink, config.name).done(f"{db}.fresh")) == 1 < chunks

    asked = run_ingest("snapshot", "--config", config_file, "--table", f"{db}.fresh")
    assert asked.returncode == 0, asked.stderr[-2000:]
    assert f"{db}.fresh: pipeline '{db}' is copying it already (chunks 1/{chunks} read)" in asked.stdout, asked.stdout
    assert "asked pipeline" not in asked.stdout
    status = run_ingest("status", "--config", config_file, "--json")
    assert json.loads(status.stdout)["snapshot_requests"] == []

    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    assert StateTable.open(config.sink, config.name).times_recorded(f"{db}.fresh") == {i: 1 for i in range(chunks)}
    captured = run_ingest("snapshot", "--config", config_file, "--table", f"{db}.fresh")
    assert captured.returncode == 2 and "already captured" in captured.stderr and "--again" in captured.stderr


def test_a_table_copied_again_on_request_survives_a_kill_and_ends_equal(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """A target damaged by hand is copied again (into its branch) while the job runs. One lineage, two kills: the
    job is killed right after the copy started over (the request it took stays); the next job takes that request
    as it starts, starts the copy over again and is killed between two chunk commits of it; the run after ends
    with the table equal to MySQL."""
    db = "adhoc_again"
    table_id = f"{db}.t"
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO {db}.t SELECT seq, 0 FROM {db}.seq_1_to_160",
    )
    jobs: list[Any] = []

    def start(crash_at: str) -> tuple[Any, Any, _Log]:
        config, job = _start_streaming_job(
            mariadb, db, tmp_path, rf"{db}\.t", db, LIVE_SNAPSHOT, crash_at, signal_poll_seconds=1
        )
        jobs.append(job)
        return config, job, _Log(job)

    def branch_started() -> bool:
        return COPY_BRANCH in load_pyiceberg_catalog(config.sink).load_table((db, "t")).metadata.refs

    try:
        with background_writes(mariadb, db, lambda cur, n: _move_keys(cur, n, "t", 160)):
            config, job, log = start("adhoc.after_drop")
            _wait("the job streams", lambda: _streaming(config), job, log)
            _damage(config, db)
            asked = run_ingest("snapshot", "--config", str(tmp_path / "pipeline.yaml"), "--table", table_id, "--again")
            assert asked.returncode == 0, asked.stderr[-2000:]
            _killed(job, log)
            # The copy started over (its branch is new and empty); the request and the old copy's chunks are
            # forgotten only after that, so the request is still there for the next run.
            state = StateTable.open(config.sink, config.name)
            assert state.requests().snapshot == {table_id: True}
            assert len(state.done(table_id)) == len(state.plan(table_id) or []) > 0
            assert branch_started()

            # Killed before its second chunk batch: the first is the copy's first chunk (the request is taken
            # before the query starts, and the old copy's chunks are forgotten with it).
            config, job, log = start("adhoc.before_copy:2")
            _killed(job, log)
            state = StateTable.open(config.sink, config.name)
            assert state.requests().snapshot == {}
            assert len(state.done(table_id)) == 1 < len(state.plan(table_id) or [])
            assert branch_started()
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    assert set(StateTable.open(config.sink, config.name).times_recorded(table_id).values()) == {1}
    assert StateTable.open(config.sink, config.name).requests().snapshot == {}
    assert set(load_pyiceberg_catalog(config.sink).load_table((db, "t")).metadata.refs) - {STAGE_BRANCH} == {"main"}
