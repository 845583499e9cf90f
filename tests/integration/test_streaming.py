"""Snapshot, then the binlog: Iceberg follows MySQL exactly once (MISSION.md "Binlog phase", "Writing Iceberg,
exactly once"). Every test ends with `ingest verify`: MySQL and Iceberg equal row for row."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import PostgresServer
from ingest.faults import ENV as CRASH_ENV
from ingest.faults import FAIL_ENV, InjectedFailure
from ingest.faults import reset as reset_fault_counts
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.maintenance import SUMMARY_MAINTENANCE
from ingest.sink.merge import offset_from_summary
from ingest.sink.summary import SUMMARY_PIPELINE, SUMMARY_STREAM_OFFSET
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable
from tests.conftest import (
    ROW_METADATA,
    embedded_sink,
    main_history,
    minio_sink,
    open_descriptors,
    rest_sink,
    run_ingest,
    source_section,
)
from tests.executor_sql import run_once
from tests.type_cases import TYPES_DDL, TYPES_ROWS, check_iceberg_rows

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _fresh_db(mariadb: MariaDBServer, db: str) -> None:
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.acct (id INT NOT NULL PRIMARY KEY, owner VARCHAR(20), balance DECIMAL(12,2))",
        f"CREATE TABLE {db}.tag (name VARCHAR(10) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, n INT)",
        f"INSERT INTO {db}.acct SELECT seq, CONCAT('o', seq), seq * 1.5 FROM {db}.seq_1_to_300",
        f"INSERT INTO {db}.tag SELECT CONCAT(ELT(1 + seq % 3, 'a', 'B', 'c'), seq), seq FROM {db}.seq_1_to_60",
    )


def partitioned(db: str) -> dict[str, Any]:
    """`table_options` that partition `acct` by its key and by a column its updates change (rows move between
    partitions), as users partition big tables; `tag` stays unpartitioned, as targets are by default."""
    return {f"{db}.acct": {"partition_by": ["bucket(4, id)", "truncate(100, balance)"]}}


def _config(
    mariadb: MariaDBServer, db: str, warehouse: Path, catalog: str = "lake", one_commit: bool = True, **stream: Any
) -> PipelineConfig:
    sink = embedded_sink(warehouse)
    sink["catalog_name"] = catalog
    sink["one_commit"] = one_commit
    return parse_config(
        {
            "name": db,
            "source": source_section(mariadb),
            "tables": {"include": [rf"{db}\..*"]},
            "sink": sink,
            "snapshot": {"chunk_size": 50, "parallelism": 2, "chunks_per_commit": 8},
            "stream": {"batch_interval_seconds": 1, **stream},
            "table_options": partitioned(db),
        }
    )


def write_config_file(mariadb: MariaDBServer, db: str, base: Path, catalog: str, **stream: Any) -> Path:
    """The pipeline `_config` describes, as a file for `ingest run` in a process of its own."""
    path = base / "pipeline.yaml"
    data = {
        "name": db,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{db}\..*"]},
        "sink": {**embedded_sink(base), "catalog_name": catalog},
        "snapshot": {"chunk_size": 50, "parallelism": 2, "chunks_per_commit": 8},
        "stream": {"batch_interval_seconds": 1, **stream},
        "table_options": partitioned(db),
    }
    path.write_text(yaml.safe_dump(data))
    return path


DML = [
    "UPDATE {db}.acct SET balance = balance + 10 WHERE id % 7 = 0",
    "DELETE FROM {db}.acct WHERE id BETWEEN 100 AND 120",
    "INSERT INTO {db}.acct VALUES (1000, 'new', 1), (1001, 'new', 2)",
    "UPDATE {db}.acct SET id = 2000 WHERE id = 5",  # primary-key update
    "DELETE FROM {db}.acct WHERE id = 6",
    "INSERT INTO {db}.acct VALUES (6, 'reborn', 6)",  # delete then re-insert of one key
    "UPDATE {db}.tag SET name = 'A1' WHERE name = 'a3'",  # a case-only key change under a _ci collation
    "UPDATE {db}.tag SET n = n + 1",
]


DML_AGAIN = [
    "UPDATE {db}.acct SET balance = balance + 10 WHERE id % 7 = 0",
    "DELETE FROM {db}.acct WHERE id BETWEEN 130 AND 150",
    "INSERT INTO {db}.acct VALUES (1010, 'new', 1), (1011, 'new', 2)",
    "UPDATE {db}.acct SET id = 2010 WHERE id = 15",  # primary-key update
    "DELETE FROM {db}.acct WHERE id = 16",
    "INSERT INTO {db}.acct VALUES (16, 'reborn', 16)",  # delete then re-insert of one key
    "UPDATE {db}.tag SET name = 'A2' WHERE name = 'a6'",  # a case-only key change under a _ci collation
    "UPDATE {db}.tag SET n = n + 1",
]
"""The changes of DML on other keys: a second batch of the same kinds on a table that took DML already."""


def _snapshot_count(config: PipelineConfig, namespace: str, table: str) -> int:
    return len(load_pyiceberg_catalog(config.sink).load_table((namespace, table)).snapshots())


def _stream_offsets(config: PipelineConfig, namespace: str, table: str) -> list[str]:
    """The binlog offset of every stream commit of this pipeline to one target, in commit order."""
    table_ = load_pyiceberg_catalog(config.sink).load_table((namespace, table))
    out = []
    for snapshot in main_history(table_):
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        if props.get(SUMMARY_PIPELINE) == config.name and SUMMARY_STREAM_OFFSET in props:
            if SUMMARY_MAINTENANCE not in props:  # a rewrite carries the offset below it, commits no batch
                out.append(props[SUMMARY_STREAM_OFFSET])
    return out


def write_dml(mariadb: MariaDBServer, db: str, dml: list[str] = DML) -> None:
    """`dml` in one transaction over both tables, then two single-row updates of one key."""
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        for statement in dml:
            cur.execute(statement.format(db=db))
        cur.execute("COMMIT")
        cur.execute(f"UPDATE {db}.acct SET owner = 'twice' WHERE id = 1")
        cur.execute(f"UPDATE {db}.acct SET owner = 'thrice' WHERE id = 1")


@contextmanager
def binlog_row_metadata(mariadb: MariaDBServer, setting: str) -> Iterator[None]:
    """As the `row_metadata` fixture, for a part of a test: the events logged in the block carry `setting`."""
    mariadb.execute(f"SET GLOBAL binlog_row_metadata = '{setting}'")
    try:
        yield
    finally:
        mariadb.execute("SET GLOBAL binlog_row_metadata = 'FULL'")


@pytest.mark.spark_compat
def test_changes_after_the_snapshot_are_applied_exactly_once(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """One batch of DML per binlog_row_metadata setting (ROW_METADATA), one after the other on one snapshot; then
    runs that find nothing new, or one change, each a query of its own."""
    db = "flow"
    _fresh_db(mariadb, db)
    config = _config(mariadb, db, tmp_path, catalog="flow_lake")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    for setting, dml in zip(ROW_METADATA, (DML, DML_AGAIN), strict=True):
        with binlog_row_metadata(mariadb, setting):
            write_dml(mariadb, db, dml)
        run(config, spark=spark, until_caught_up=True)
        assert verify(config), setting
    # Warmed up by three queries: py4j's connection for the JVM's finalizer thread (made once) is open by now.
    warmed_up = open_descriptors(spark)
    before = (_snapshot_count(config, db, "acct"), _snapshot_count(config, db, "tag"))
    run(config, spark=spark, until_caught_up=True)  # nothing new: no new Iceberg snapshot
    assert (_snapshot_count(config, db, "acct"), _snapshot_count(config, db, "tag")) == before
    assert StateTable.open(config.sink, config.name).stream_offset() is not None
    assert spark.streams.active == []
    for n in range(2):  # more pipeline runs in turn, each a query of its own
        mariadb.execute(f"UPDATE {db}.acct SET owner = 'run {n}' WHERE id = 1")
        run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    # Each query used to leave its py4j callback connection open: one socket and one thread per query.
    assert open_descriptors(spark) == warmed_up


@pytest.mark.spark_compat
def test_every_type_case_has_the_same_iceberg_value_through_the_binlog(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, row_metadata: str
) -> None:
    """At NO_LOG the events name no column and carry no signedness, character set or ENUM/SET members: the job
    takes them from the schema it follows, by position (ingest/source/binlog/table_maps.py)."""
    db = "btypes"
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    with mariadb.admin(db) as conn, conn.cursor() as cur:
        cur.execute(TYPES_DDL.format(table="all_types"))
    config = _config(mariadb, db, tmp_path, catalog=f"btypes_{row_metadata}")
    run(config, spark=spark, until_caught_up=True)  # empty snapshot; the rows come through the binlog
    with mariadb.admin(db) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute("SET SESSION time_zone = '+08:00'")
        for row in TYPES_ROWS:
            cur.execute(f"INSERT INTO all_types VALUES {row}")
    run(config, spark=spark, until_caught_up=True)
    rows = load_pyiceberg_catalog(config.sink).load_table((db, "all_types")).scan().to_arrow().to_pylist()
    assert check_iceberg_rows(rows) == []


PAD_KEYS_DDL = [
    "CREATE TABLE {db}.padc (k CHAR(6) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, v INT)",
    "CREATE TABLE {db}.padv (k VARCHAR(8) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, v INT)",
    "CREATE TABLE {db}.nopad (k VARCHAR(8) COLLATE utf8mb4_general_nopad_ci NOT NULL PRIMARY KEY, v INT)",
    "INSERT INTO {db}.padc VALUES ('a', 1), ('b  ', 2), ('c', 3), ('d', 4)",  # CHAR drops trailing spaces
    "INSERT INTO {db}.padv VALUES ('a ', 1), ('b', 2), ('c  ', 3), ('d ', 4)",  # VARCHAR keeps them
    "INSERT INTO {db}.nopad VALUES ('a', 1), ('a ', 2), ('b', 3), ('b  ', 4)",  # NO PAD: four keys
]
# One transaction, so one batch: each statement finds its row by a key MySQL deems equal, not byte-equal.
PAD_KEYS_DML = [
    "UPDATE {db}.padc SET v = v + 10 WHERE k = 'a   '",
    "UPDATE {db}.padc SET k = 'B ' WHERE k = 'b'",  # a case-only key change
    "DELETE FROM {db}.padc WHERE k = 'C  '",
    "INSERT INTO {db}.padc VALUES ('c    ', 30)",  # deleted and inserted again, spelled otherwise
    "INSERT INTO {db}.padc VALUES ('e ', 5)",
    "UPDATE {db}.padv SET v = v + 10 WHERE k = 'a'",  # updates 'a ', whose bytes stay 'a '
    "UPDATE {db}.padv SET k = 'b  ' WHERE k = 'b'",  # a key change of trailing spaces only
    "DELETE FROM {db}.padv WHERE k = 'c'",
    "INSERT INTO {db}.padv VALUES ('c', 30)",
    "UPDATE {db}.padv SET k = 'D' WHERE k = 'd'",
    "UPDATE {db}.padv SET v = 40 WHERE k = 'd   '",
    "UPDATE {db}.nopad SET v = v + 10 WHERE k = 'a '",  # only 'a ' under NO PAD
    "DELETE FROM {db}.nopad WHERE k = 'b'",
    "INSERT INTO {db}.nopad VALUES ('b ', 5)",
]


def test_keys_equal_under_the_collation_but_not_in_bytes_keep_mysqls_exact_rows_through_a_batch(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """FAILURES.md "Keys and chunks": `'a'` equals `'a '` under PAD SPACE and `'b'` equals `'B'` under _ci. The
    binlog carries the stored bytes, the batch collapses by them, and the MERGE matches by them: Iceberg ends
    with MySQL's exact keys (trailing spaces and case), one row each, never a row per spelling."""
    db = "padkeys"
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}", *(s.format(db=db) for s in PAD_KEYS_DDL))
    config = _config(mariadb, db, tmp_path, catalog="padkeys_lake")
    run(config, spark=spark, until_caught_up=True)
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        for statement in PAD_KEYS_DML:
            cur.execute(statement.format(db=db))
        cur.execute("COMMIT")
    run(config, spark=spark, until_caught_up=True)
    catalog = load_pyiceberg_catalog(config.sink)
    expected = {
        "padc": [("B", 2), ("a", 11), ("c", 30), ("d", 4), ("e", 5)],
        "padv": [("D", 40), ("a ", 11), ("b  ", 2), ("c", 30)],
        "nopad": [("a", 1), ("a ", 12), ("b ", 5), ("b  ", 4)],
    }
    for table, rows in expected.items():
        with mariadb.admin(db) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT k, v FROM {table}")
            assert sorted(cur.fetchall()) == rows, table  # the test's own reading of MySQL's semantics
        iceberg = catalog.load_table((db, table)).scan().to_arrow().to_pylist()
        assert sorted((r["k"], r["v"]) for r in iceberg) == rows, table
    assert verify(config)


def test_type_values_do_not_depend_on_the_server_or_job_time_zone(mariadb: MariaDBServer, tmp_path: Path) -> None:
    """FAILURES.md "Types and settings": a server whose default zone is +08:00 and a job (JVM and Python) in
    America/New_York give the same values as everywhere else, through the snapshot and through the binlog. One job
    does both: the binlog's rows are written once it has read every chunk."""
    db = "tz"
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.time_zone")
        (zone,) = cur.fetchone()
    # What `--default-time-zone` sets at start: the zone of every session opened from now on (the job's too).
    mariadb.execute("SET GLOBAL time_zone = '+08:00'")
    try:
        mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
        with mariadb.admin(db) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")  # no SET time_zone: the server's default applies
            for table in ("snap", "logged"):
                cur.execute(TYPES_DDL.format(table=table))
            for row in TYPES_ROWS:
                cur.execute(f"INSERT INTO snap VALUES {row}")
        config, job = _start_streaming_job(
            mariadb, db, tmp_path, rf"{db}\..*", "tz_lake", env_extra={"TZ": "America/New_York"}
        )
        try:
            _wait_until(job, lambda: _copied(StateTable.open(config.sink, config.name)), "every chunk read")
            with mariadb.admin(db) as conn, conn.cursor() as cur:
                cur.execute("SET SESSION sql_mode = ''")
                for row in TYPES_ROWS:
                    cur.execute(f"INSERT INTO logged VALUES {row}")
                written = read_watermark(conn, "mariadb").position
            _wait_until(job, lambda: _streamed_past(config, written), "the binlog's rows committed")
            job.send_signal(signal.SIGTERM)
            _, err = job.communicate(timeout=120)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        assert job.returncode == 0, err[-3000:]
    finally:
        mariadb.execute(f"SET GLOBAL time_zone = '{zone}'")
    assert _stream_offsets(config, db, "logged"), "the rows of `logged` came through the binlog"
    catalog = load_pyiceberg_catalog(config.sink)
    for table in ("snap", "logged"):
        assert check_iceberg_rows(catalog.load_table((db, table)).scan().to_arrow().to_pylist()) == [], table


def _busy_writes(cur: Any, n: int) -> None:
    """An update, a delete and an insert of keys spread over the table, chosen by `n`."""
    cur.execute("UPDATE acct SET balance = balance + 1 WHERE id = %s", (1 + n * 13 % 300,))
    cur.execute("DELETE FROM acct WHERE id = %s", (1 + n * 29 % 300,))
    cur.execute("INSERT IGNORE INTO acct VALUES (%s, 'w', 0)", (1 + n * 31 % 300,))


class WriteInEveryChunkWindow:
    """A chunk hook (run on an executor): between each chunk's low watermark and its select, writes to keys
    inside and outside the chunk, so every window has changes to reconcile, whatever the writer thread's timing."""

    def __init__(self, socket: str, db: str) -> None:
        self.socket, self.db = socket, db

    def __call__(self, at: str, chunk: Any) -> None:
        if at != "after_low_watermark":
            return
        import pymysql

        with pymysql.connect(unix_socket=self.socket, user="root", database=self.db, autocommit=True) as conn:
            with conn.cursor() as cur:
                for i in range(10):
                    _busy_writes(cur, 100_000 + chunk.index * 100 + i)


# At NO_LOG, the harder decoding: the setting changes nothing of the snapshot or its watermarks, and
# test_changes_after_the_snapshot_are_applied_exactly_once decodes at both.
@pytest.mark.parametrize("row_metadata", ["NO_LOG"], indirect=True)
def test_writes_during_the_snapshot_and_after_end_equal(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, row_metadata: str
) -> None:
    db = "busyflow"
    _fresh_db(mariadb, db)
    config = _config(mariadb, db, tmp_path, catalog=f"busy_{row_metadata}")
    stop = threading.Event()

    def writer() -> None:
        # Paced and bounded: the run's work grows with what is written while it runs, and an unpaced writer made
        # this test take minutes (each change written while the binlog phase catches up is read by the next run).
        with mariadb.admin(db) as conn, conn.cursor() as cur:
            for n in range(1, 2001):
                if stop.wait(0.005):
                    return
                _busy_writes(cur, n)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        run(config, spark=spark, until_caught_up=True, hook=WriteInEveryChunkWindow(mariadb.socket, db))
    finally:
        stop.set()
        thread.join()
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)


class MoveKeysDuringChunkThree:
    """A chunk hook (run on an executor): once, after chunk 2's low watermark (chunks 0 and 1 are read, 2 and 3
    not yet), keys move between a read chunk and an unread one, and each moved key changes again."""

    def __init__(self, socket: str, db: str) -> None:
        self.socket, self.db = socket, db

    def __call__(self, at: str, chunk: Any) -> None:
        if at != "after_low_watermark" or chunk.index != 2:
            return
        into_unread = chunk.lower[0] + 1  # a free key (keys are multiples of 10) inside chunk 2
        from_unread = (chunk.upper[0] + 9) // 10 * 10  # chunk 3's first key
        statements = [
            ("UPDATE t SET id = %s WHERE id = 10", (into_unread,)),  # chunk 0 -> chunk 2
            ("UPDATE t SET v = 'changed after the move' WHERE id = %s", (into_unread,)),
            ("UPDATE t SET id = 11 WHERE id = %s", (from_unread,)),  # chunk 3 -> chunk 0
            ("INSERT INTO t VALUES (%s, 're-inserted')", (from_unread,)),
        ]
        run_once(self.socket, self.db, "moved", statements)


def test_a_key_moved_between_a_read_chunk_and_an_unread_one_ends_with_its_latest_row(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Each image of a key-changing update belongs to its own chunk: the binlog phase must apply the delete of
    the old key only if the old key's chunk was read before the change, and the new row only if the new key's
    chunk was. Applying the whole update when either side was read overwrote chunk 2's newer row with the
    moved one, and deleted the re-inserted key that chunk 3 holds."""
    db = "keymove"
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(40))",
        f"CREATE TABLE {db}.moved (x INT)",
        f"INSERT INTO {db}.t SELECT seq * 10, CONCAT('v', seq) FROM {db}.seq_1_to_40",
    )
    config = parse_config(
        {
            "name": db,
            "source": source_section(mariadb),
            "tables": {"include": [rf"{db}\.t"]},
            "sink": {**embedded_sink(tmp_path), "catalog_name": "keymove"},
            "snapshot": {"chunk_size": 10, "parallelism": 1},
            "stream": {"batch_interval_seconds": 1},
            "table_options": {f"{db}.t": {"changelog": True}},
        }
    )
    run(config, spark=spark, until_caught_up=True, hook=MoveKeysDuringChunkThree(mariadb.socket, db))
    with mariadb.admin(db) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM moved")
        assert cur.fetchone()[0] == 1  # the hook ran
    assert verify(config)
    # The changelog keeps the side of each move the chunks read before it do not hold.
    changelog = load_pyiceberg_catalog(config.sink).load_table((db, "t_changelog")).scan().to_arrow()
    assert sorted(zip(changelog.column("_op").to_pylist(), changelog.column("id").to_pylist(), strict=True)) == [
        ("+I", 11),
        ("-D", 10),
    ]


def test_an_error_right_after_a_commit_leaves_its_files_and_the_retry_commits_nothing_twice(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAILURES.md "commit outcome unknown": the batch's one commit landed, then the job failed in its own process
    (not killed: its error handling runs, the Spark session lives on) before it learned so. In the same session the
    retry finds what the failed run committed, with its files, and commits nothing twice. Before that, a failure
    before the commit: nothing of the batch is in any table. One batch per point, one after the other on one
    snapshot."""
    db = "failflow"
    _fresh_db(mariadb, db)
    catalog = "fail_lake"
    config = _config(mariadb, db, tmp_path, catalog=catalog, concurrent_merges=1)
    run(config, spark=spark, snapshot_only=True)
    for point, dml, lands in (("stream.before_state", DML, False), ("atomic.after_swap", DML_AGAIN, True)):
        held = _stream_offsets(config, db, "acct")
        write_dml(mariadb, db, dml)
        reset_fault_counts()
        monkeypatch.setenv(FAIL_ENV, f"{point}:1")
        with pytest.raises(InjectedFailure):
            run(config, spark=spark, until_caught_up=True)
        monkeypatch.delenv(FAIL_ENV)
        assert spark.streams.active == [], point
        committed = _stream_offsets(config, db, "acct")
        assert (len(committed) > len(held)) == lands, point
        assert (len(_stream_offsets(config, db, "tag")) > len(held)) == lands, point  # both tables, or neither
        # Every file the committed snapshot references is still there (nothing was cleaned up as if it failed).
        assert spark.sql(f"SELECT count(*) FROM {catalog}.{db}.acct").collect()[0][0] > 0, point
        run(config, spark=spark, until_caught_up=True)
        assert verify(config), point
        for table in ("acct", "tag"):
            offsets = _stream_offsets(config, db, table)
            assert len(offsets) == len(set(offsets)), f"{table} after {point}: a batch committed twice"
        assert _stream_offsets(config, db, "acct")[: len(committed)] == committed, point


def test_kill_9_at_every_point_of_a_batchs_one_commit_then_resume_commits_each_batch_once(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """One job killed at each point of a batch's commit in turn, each run resuming from what the one before left:
    after a table's part is staged (a small target's change made, a MERGE written to the stage branch), before the
    one commit, between its metadata files and its swap, after the swap (landed, the job not told), after the job
    recorded it. Until the swap no table holds the batch and the offset has not moved; from the swap every table
    holds it once, with the offset. The last resume ends equal to MySQL. One batch per binlog_row_metadata setting
    (ROW_METADATA), each a transaction over two tables; acct takes its batches from Spark's MERGE (through its stage
    branch), tag by position (ingest/sink/position_deletes.py: its delete and data files written, then the kill)."""
    db = "crashflow"
    _fresh_db(mariadb, db)
    catalog = "crash_lake"
    by_position = {"batch_interval_seconds": 60, "driver_apply_max_rows": 1}
    config = _config(mariadb, db, tmp_path, catalog=catalog, **by_position)
    run(config, spark=spark, snapshot_only=True)
    config_file = write_config_file(mariadb, db, tmp_path, catalog, concurrent_merges=1, **by_position)

    def counts() -> tuple[int, int]:  # batch commits (a small target's is two snapshots: ingest/sink/driver_apply.py)
        return len(_stream_offsets(config, db, "acct")), len(_stream_offsets(config, db, "tag"))

    points = (  # every point once: the second batch's are those its table order or its state step reach first
        ["stream.after_table_commit:1", "stream.before_state:1", "atomic.before_swap:1", "atomic.after_swap:1"],
        ["stream.after_table_commit:2", "stream.after_state:1"],
    )
    for batches, (setting, dml, kills) in enumerate(zip(ROW_METADATA, (DML, DML_AGAIN), points, strict=True), start=1):
        with binlog_row_metadata(mariadb, setting), mariadb.admin() as conn, conn.cursor() as cur:
            for statement in dml:
                cur.execute(statement.format(db=db))
            # One transaction of two multi-row events on two tables (FAILURES.md: restart in a transaction).
            cur.execute("BEGIN")
            cur.execute(f"UPDATE {db}.acct SET balance = balance + 1 WHERE id IN (40, 41)")
            cur.execute(f"UPDATE {db}.tag SET n = n + 100 WHERE name IN ('B1', 'c2')")
            cur.execute("COMMIT")
        before, offset_before = counts(), StateTable.open(config.sink, config.name).stream_offset()
        for crash_at in kills:
            crashed = run_ingest("run", "--config", str(config_file), "--until-caught-up", crash_at=crash_at)
            assert crashed.returncode == -signal.SIGKILL, (setting, crash_at, crashed.stderr[-3000:])
            landed = crash_at.startswith(("atomic.after_swap", "stream.after_state"))
            after, offset = counts(), StateTable.open(config.sink, config.name).stream_offset()
            assert (after[0] - before[0], after[1] - before[1]) == ((1, 1) if landed else (0, 0)), (setting, crash_at)
            if landed:
                assert offset is not None and offset != offset_before, (setting, crash_at)
                tag_offset = offset_from_summary(_stream_offsets(config, db, "tag")[-1])
                assert offset.position == tag_offset.position, (setting, crash_at)
            else:
                assert offset == offset_before, (setting, crash_at)
        run(config, spark=spark, until_caught_up=True)
        assert verify(config), setting
        for table in ("acct", "tag"):
            offsets = _stream_offsets(config, db, table)
            assert len(offsets) == len(set(offsets)) == batches, f"{table} at {setting}: a batch committed twice"
    tag = load_pyiceberg_catalog(config.sink).load_table((db, "tag"))
    assert int(tag.current_snapshot().summary.additional_properties["total-position-deletes"]) > 0


def test_odd_identifiers_go_through_snapshot_binlog_changelog_and_verify(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """FAILURES.md "Keys and chunks": names with backticks, spaces, quotes and SQL keywords, end to end."""
    db = "odd db`x"
    table = "odd`; DROP TABLE x; --"
    quoted = "`odd db``x`.`odd``; DROP TABLE x; --`"
    mariadb.execute(
        "DROP DATABASE IF EXISTS `odd db``x`",
        "CREATE DATABASE `odd db``x`",
        f"CREATE TABLE {quoted} (`my col` INT PRIMARY KEY, `back``tick` VARCHAR(5), `select` INT, `it's` INT)",
        f"INSERT INTO {quoted} SELECT seq, CONCAT('b', seq), seq, -seq FROM `odd db``x`.seq_1_to_40",
    )
    config = parse_config(
        {
            "name": "odd",
            "source": source_section(mariadb),
            "tables": {"include": [r"odd db`x\..*"]},
            "sink": {**embedded_sink(tmp_path), "catalog_name": "odd_lake"},
            "snapshot": {"chunk_size": 7, "parallelism": 2},
            "stream": {"batch_interval_seconds": 1},
            "table_options": {f"{db}.{table}": {"changelog": True}},
        }
    )
    run(config, spark=spark, snapshot_only=True)
    mariadb.execute(
        f"UPDATE {quoted} SET `back``tick` = 'x''y', `select` = 0 WHERE `my col` % 3 = 0",
        f"UPDATE {quoted} SET `my col` = 100 WHERE `my col` = 1",  # a primary-key update
        f"DELETE FROM {quoted} WHERE `my col` = 2",
        f"INSERT INTO {quoted} VALUES (200, 'new', 1, 2)",
    )
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    catalog = load_pyiceberg_catalog(config.sink)
    assert catalog.load_table((db, table)).scan().to_arrow().num_rows == 40
    changelog = catalog.load_table((db, f"{table}_changelog")).scan().to_arrow()
    assert changelog.num_rows == 13 * 2 + 2 + 1 + 1  # 13 updates and one key move as -U/+U, a delete, an insert


def _operations(config: PipelineConfig, namespace: str, table: str) -> list[str]:
    """The operation of every stream commit of this pipeline to one target, in commit order."""
    table_ = load_pyiceberg_catalog(config.sink).load_table((namespace, table))
    return [
        s.summary.operation.value
        for s in main_history(table_)
        if s.summary is not None and SUMMARY_STREAM_OFFSET in s.summary.additional_properties
    ]


def test_a_batch_that_only_creates_rows_is_appended_once_across_a_kill_between_two_tables(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Spark's append against its MERGE (the driver's apply of small targets, which ends every batch in an append,
    is off: test_driver_apply.py covers it, and the kill tests above run through it)."""
    db = "appendflow"
    _fresh_db(mariadb, db)
    spark_only = {"batch_interval_seconds": 60, "concurrent_merges": 1, "driver_apply_max_rows": 0}
    config = _config(mariadb, db, tmp_path, catalog="appends", one_commit=False, **spark_only)
    run(config, spark=spark, snapshot_only=True)
    mariadb.execute(
        f"DELETE FROM {db}.acct WHERE id = 7",  # a key the snapshot held: the next batch may append it again
        f"UPDATE {db}.acct SET balance = 0 WHERE id = 8",
        f"UPDATE {db}.tag SET n = n + 1 WHERE name = 'a3'",
    )
    run(config, spark=spark, until_caught_up=True)
    assert _operations(config, db, "acct") == _operations(config, db, "tag") == ["overwrite"]
    mariadb.execute(
        f"INSERT INTO {db}.acct SELECT 1000 + seq, 'new', seq FROM {db}.seq_1_to_100",
        f"INSERT INTO {db}.acct VALUES (7, 'again', 7)",
        f"INSERT INTO {db}.acct VALUES (5000, 'gone', 0)",
        f"DELETE FROM {db}.acct WHERE id = 5000",
        f"INSERT INTO {db}.acct VALUES (5000, 'back', 1)",  # created, deleted and created again: still new
        f"INSERT INTO {db}.tag VALUES ('zz', 1)",
        f"DELETE FROM {db}.tag WHERE name = 'B1'",
        f"INSERT INTO {db}.tag VALUES ('B1', 100)",  # re-inserted after a delete in the batch: a MERGE
    )
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "name": db,
                "source": source_section(mariadb),
                "tables": {"include": [rf"{db}\..*"]},
                # Table by table: the kill between two tables' commits leaves acct ahead of the offset.
                "sink": {**embedded_sink(tmp_path), "catalog_name": "appends", "one_commit": False},
                "snapshot": {"chunk_size": 50, "parallelism": 2, "chunks_per_commit": 8},
                "stream": spark_only,
            }
        )
    )
    # Tables commit in name order: acct is appended, then the job dies before tag's MERGE and the state.
    crash_at = "stream.after_table_commit:1"
    crashed = run_ingest("run", "--config", str(config_file), "--until-caught-up", crash_at=crash_at)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert _operations(config, db, "acct") == ["overwrite", "append"]
    assert _operations(config, db, "tag") == ["overwrite"]
    run(config, spark=spark, until_caught_up=True)
    assert _operations(config, db, "acct") == ["overwrite", "append"]  # the replayed batch appended nothing again
    assert _operations(config, db, "tag") == ["overwrite", "overwrite"]
    assert verify(config)
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {db}.acct")
        (source_rows,) = cur.fetchone()
    assert spark.sql(f"SELECT COUNT(*), COUNT(DISTINCT id) FROM appends.{db}.acct").first()[:] == (source_rows,) * 2


def _start_streaming_job(
    mariadb: MariaDBServer,
    db: str,
    tmp_path: Path,
    tables: str,
    catalog: str,
    snapshot: dict[str, Any] | None = None,
    crash_at: str | None = None,
    sink: dict[str, Any] | None = None,
    env_extra: dict[str, str] | None = None,
    **stream: Any,
) -> tuple[PipelineConfig, subprocess.Popen[str]]:
    """`ingest run` of `tables` in `db` as a separate process (to be signalled), batches due every second; `sink`:
    more keys of the `sink` section; `env_extra`: more environment variables of the job."""
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "name": db,
                "source": source_section(mariadb),
                "tables": {"include": [tables]},
                "sink": {**embedded_sink(tmp_path), "catalog_name": catalog, **(sink or {})},
                "snapshot": {"chunk_size": 100, **(snapshot or {})},
                "stream": {"batch_interval_seconds": 1, **stream},
            }
        )
    )
    config = parse_config(yaml.safe_load(config_file.read_text()), tmp_path)
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV} | (env_extra or {})
    if crash_at:
        env[CRASH_ENV] = crash_at
    job = subprocess.Popen(
        [sys.executable, "-m", "ingest.cli", "run", "--config", str(config_file)],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return config, job


@contextmanager
def background_writes(
    mariadb: MariaDBServer, db: str, write: Callable[[Any, int], None], pause: float = 0.02
) -> Iterator[None]:
    """`write(cursor, n)` for n = 1, 2, ... on a thread (autocommit), `pause` seconds apart, until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        n = 0
        with mariadb.admin(db) as conn, conn.cursor() as cur:
            while not stop.is_set():
                n += 1
                write(cur, n)
                time.sleep(pause)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


@contextmanager
def _writes_while(mariadb: MariaDBServer, db: str, write: Any, job: subprocess.Popen[str]) -> Iterator[None]:
    """`write(cursor)` about 50 times a second until the block ends; then the job is killed if it is still
    running."""
    try:
        with background_writes(mariadb, db, lambda cur, _: write(cur)):
            yield
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)


def _wait_until(job: subprocess.Popen[str], condition: Callable[[], bool], what: str, each_poll: Any = None) -> None:
    """Until `condition()` holds (a state-table or catalog read that fails counts as not yet: the job creates them),
    calling `each_poll` meanwhile; the job must still be running, and at most 240 s."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and job.poll() is None:
        if each_poll is not None:
            each_poll()
        try:
            if condition():
                break
        except Exception:  # noqa: BLE001 - the catalog is created by the job
            pass
        time.sleep(0.5)
    assert job.poll() is None and time.monotonic() < deadline, f"the job should be running, with {what}, by now"


def _copied(state: StateTable) -> bool:
    """The job has planned its tables and read every chunk of each."""
    tables = state.tables()
    return bool(tables) and all(len(state.done(t)) == len(state.plan(t) or []) for t in tables)


def _streamed_past(config: PipelineConfig, position: Any) -> bool:
    """The job's offset (every target committed up to it) is at or past `position`."""
    offset = StateTable.open(config.sink, config.name).stream_offset()
    return offset is not None and offset.position >= position


def _wait_until_streaming(config: PipelineConfig, job: subprocess.Popen[str], each_poll: Any = None) -> None:
    """Until the job has read every chunk and committed a binlog batch (calling `each_poll` meanwhile). (The query
    reads chunks between binlog batches: a binlog batch alone does not say the snapshot is complete.)"""

    def streaming() -> bool:
        state = StateTable.open(config.sink, config.name)
        return _copied(state) and state.stream_offset() is not None

    _wait_until(job, streaming, "every chunk read and a binlog batch committed", each_poll)


def test_sigterm_under_steady_writes_commits_what_was_written_before_the_signal(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """The reader never idles here: the stop comes when it has read up to the source's position at the signal."""
    db = "termload"
    _fresh_db(mariadb, db)
    done_writes = [0]

    def write(cur: Any) -> None:  # never idle, never far ahead of the job
        cur.execute("UPDATE acct SET owner = %s WHERE id = 1", (f"w-{done_writes[0] + 1}",))
        done_writes[0] += 1  # committed (autocommit) before the counter moves

    config, job = _start_streaming_job(mariadb, db, tmp_path, rf"{db}\.acct", "termload_lake")
    with _writes_while(mariadb, db, write, job):
        _wait_until_streaming(config, job)
        written_before_signal = done_writes[0]
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=120)
    assert job.returncode == 0, err[-3000:]
    assert "stopping: everything up to" in err, err[-3000:]
    assert done_writes[0] > written_before_signal  # the writer kept going through the stop
    row = load_pyiceberg_catalog(config.sink).load_table((db, "acct")).scan(row_filter="id = 1").to_arrow()
    [owner] = row.column("owner").to_pylist()
    assert int(owner.split("-")[1]) >= written_before_signal, (owner, written_before_signal, err[-2000:])


def test_writes_to_other_tables_alone_still_move_the_offset_and_let_the_job_stop(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """FAILURES.md "Idle captured tables": a busy binlog brings no heartbeats, so the reader itself must hand
    the position of other tables' transactions over, or the offset stays behind until the binlog is purged. Then
    the captured table changes right before a SIGTERM: the job stops after its current commit, once it has read
    up to the signal's position (the other tables' writes going on), with what the source wrote before it (this
    test took over test_sigterm_stops_the_running_job_after_its_current_commit, which started a job for that)."""
    db = "busyother"
    _fresh_db(mariadb, db)
    config, job = _start_streaming_job(mariadb, db, tmp_path, rf"{db}\.acct", "busyother_lake")
    # Writes to a table the job does not capture, and nothing else until the signal.
    with _writes_while(mariadb, db, lambda cur: cur.execute("UPDATE tag SET n = n + 1 WHERE name = 'a3'"), job):
        _wait_until_streaming(config, job)  # the first offset after the snapshot comes from those writes alone
        first = StateTable.open(config.sink, config.name).stream_offset()
        assert first is not None
        with mariadb.admin() as conn:  # a point some of those writes past the first offset
            busy_at = read_watermark(conn, "mariadb").position
            while busy_at <= first.position:
                time.sleep(0.05)
                busy_at = read_watermark(conn, "mariadb").position
        _wait_until(job, lambda: _streamed_past(config, busy_at), f"its offset at {busy_at}")
        for n in range(3):  # the captured table changes, in transactions of their own, right before the signal
            mariadb.execute(f"UPDATE {db}.acct SET owner = 'streamed-{n}' WHERE id < 50")
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=120)
    assert job.returncode == 0, err[-3000:]
    assert "stopping: everything up to" in err, err[-3000:]  # reached the signal's position, not the grace period
    assert "binlog phase stopped at" in err, err[-3000:]
    assert verify(config)  # what the source wrote before the signal is committed
    offsets = _stream_offsets(config, db, "acct")
    assert offsets, "the updates before the signal were committed by the binlog phase"
    assert len(offsets) == len(set(offsets))  # no batch half-committed by the stop and committed again


@pytest.mark.parametrize("profile", ["jdbc", "rest"])
def test_binlog_phase_in_the_s3_profile_survives_kill_9_and_commits_each_batch_once(
    spark: Any,
    mariadb: MariaDBServer,
    minio: MinioServer,
    postgres: PostgresServer,
    tmp_path: Path,
    profile: str,
    request: pytest.FixtureRequest,
) -> None:
    """MinIO through S3FileIO, with the JDBC catalog on PostgreSQL or the REST catalog server: catch-up, then
    kill -9 mid-batch."""
    db = f"s3flow_{profile}"
    _fresh_db(mariadb, db)
    if profile == "rest":
        sink = rest_sink(minio, request.getfixturevalue("rest_catalog"))
    else:
        sink = minio_sink(minio, postgres, minio.bucket("stream-profile"))
    data = {
        "name": db,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{db}\..*"]},
        "sink": {**sink, "state_table": f"ingest_meta.state_{db}"},
        "snapshot": {"chunk_size": 50, "parallelism": 2, "chunks_per_commit": 8},
        "stream": {"batch_interval_seconds": 60},
    }
    config = parse_config(data)
    run(config, spark=spark, snapshot_only=True)
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")  # one multi-statement transaction: insert, update, PK update, delete + re-insert
        for statement in DML:
            cur.execute(statement.format(db=db))
        cur.execute("COMMIT")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)

    mariadb.execute(
        f"UPDATE {db}.acct SET id = id + 5000 WHERE id BETWEEN 200 AND 205",
        f"DELETE FROM {db}.tag WHERE n < 10",
        f"INSERT INTO {db}.tag VALUES ('b4', 40)",  # re-insert of a deleted key, another case
        f"UPDATE {db}.acct SET owner = 'late' WHERE id > 250",
    )
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))
    crashed = run_ingest(
        "run", "--config", str(config_file), "--until-caught-up", crash_at="stream.after_table_commit:1"
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    run(config, spark=spark, until_caught_up=True)  # the resume
    assert verify(config)
    for table in ("acct", "tag"):
        offsets = _stream_offsets(config, db, table)
        assert len(offsets) == len(set(offsets)) == 2, f"{table}: a batch committed twice or lost: {offsets}"
    offset = StateTable.open(config.sink, config.name).stream_offset()
    assert offset is not None and f'"{offset.position}"' in _stream_offsets(config, db, "tag")[-1]


def test_many_small_batches_keep_the_state_table_bounded_and_resume_still_works(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """FAILURES.md "Many small commits": one batch per transaction, the state table stays small."""
    from ingest.state.writes import MAX_SNAPSHOTS

    db = "longflow"
    _fresh_db(mariadb, db)
    config = _config(mariadb, db, tmp_path, catalog="long_lake", batch_max_changes=1)
    run(config, spark=spark, snapshot_only=True)
    mariadb.execute(*(f"UPDATE {db}.tag SET n = n + {i} WHERE n = {i}" for i in range(1, 21)))  # 20 transactions
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    assert len(_stream_offsets(config, db, "tag")) == 20  # really one batch each
    state = StateTable.open(config.sink, config.name)
    assert len(state._table.snapshots()) <= MAX_SNAPSHOTS + 2
    assert state.live_files() == 4  # both tables' plans (one commit), per table one chunk batch, one offset row
    mariadb.execute(f"DELETE FROM {db}.tag WHERE name LIKE 'c%'", f"INSERT INTO {db}.tag VALUES ('zz', 1)")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    assert len(_stream_offsets(config, db, "tag")) == 22
