"""The binlog reader against event groups production servers write, on the real MariaDB: a SAVEPOINT inside a
transaction, a compressed binlog (`log_bin_compress`), XA transactions (committed, rolled back, one phase, and
prepared before a restart), and partition maintenance, which logs no rows. Each used to end with the reader
passing changes over without a word (issue 40); now each is read whole or stops the job by name. The pipeline
test at the end lands them all in Iceberg and compares with MySQL."""

from __future__ import annotations

import datetime as dt
import logging
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import SchemaChangeError, SourceError, UnsupportedTableError
from ingest.model.changes import DdlStatement, Transaction
from ingest.model.position import BinlogPosition
from ingest.model.schema import TableSchema
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.summary import SUMMARY_STREAM_OFFSET
from ingest.sink.targets import PARTITIONS_PROPERTY
from ingest.source.binlog.reader import BinlogReader
from ingest.source.binlog.startup import _first_commit_at_or_after
from ingest.source.discovery import discover
from ingest.source.mysql import connect
from ingest.source.watermark import read_watermark
from tests.conftest import embedded_sink, main_history, mysql_rows, run_ingest, source_section
from tests.executor_sql import run_once

pytestmark = pytest.mark.integration

DB = "groups"
LONG = "x" * 300
"""A value long enough that every event holding it is compressed."""


@pytest.fixture
def compressed(mariadb: MariaDBServer) -> Iterator[None]:
    """The shared server compresses every binlog event it can for the test (global, dynamic settings)."""
    mariadb.execute("SET GLOBAL log_bin_compress = ON", "SET GLOBAL log_bin_compress_min_len = 10")
    try:
        yield
    finally:
        mariadb.execute("SET GLOBAL log_bin_compress = OFF", "SET GLOBAL log_bin_compress_min_len = 256")


def _document(mariadb: MariaDBServer, warehouse: Path) -> dict[str, Any]:
    return {
        "name": DB,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{DB}\..*"]},
        "sink": embedded_sink(warehouse),
    }


@pytest.fixture
def config(mariadb: MariaDBServer, tmp_path: Path) -> PipelineConfig:
    """The pipeline of the test's database, made afresh with its table `t`."""
    _fresh(mariadb)
    return parse_config(_document(mariadb, tmp_path))


def _fresh(mariadb: MariaDBServer) -> None:
    with mariadb.admin() as conn, conn.cursor() as cur:  # a failed test's prepared XA would hold its locks
        cur.execute("XA RECOVER")
        for _, _, _, data in cur.fetchall():
            cur.execute("XA ROLLBACK %s", (data,))
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, v VARCHAR(1000))",
        f"INSERT INTO {DB}.t VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')",
    )


def _here(config: PipelineConfig) -> BinlogPosition:
    with connect(config.source) as conn:
        return read_watermark(conn, "mariadb").position


def _session(mariadb: MariaDBServer, *statements: str) -> None:
    """Statements in one session, in order (transactions and XA transactions are per session)."""
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def _read(config: PipelineConfig, start: BinlogPosition, schemas: Sequence[TableSchema] = ()) -> list[Transaction]:
    reader = BinlogReader(
        config.source, schemas or discover(config.source, config.tables, config.table_options).schemas, start
    )
    try:
        return [
            item for item in reader.transactions() if isinstance(item, Transaction) and (item.changes or item.actions)
        ]
    finally:
        reader.close()


def _rows(transactions: list[Transaction]) -> list[tuple[Any, Any]]:
    """(key before, row after) of each change, in binlog order."""
    return [(None if c.before is None else c.before[0], c.after) for t in transactions for c in t.changes]


def _killed_at(document: dict[str, Any], base: Path, point: str) -> None:
    """`ingest run --until-caught-up` of the pipeline `document` in a process of its own, killed (-9) at `point`."""
    config_file = base / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(document))
    killed = run_ingest("run", "--config", str(config_file), "--until-caught-up", crash_at=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]


def test_a_savepoint_keeps_the_changes_before_it_and_the_rollback_to_it_drops_only_what_it_undid(
    mariadb: MariaDBServer, config: PipelineConfig, row_metadata: str, compressed: None
) -> None:
    start = _here(config)
    _session(
        mariadb,
        "BEGIN",
        f"UPDATE t SET v = '{LONG}1' WHERE id = 1",
        "SAVEPOINT s1",
        "UPDATE t SET v = 'undone' WHERE id = 2",
        "ROLLBACK TO SAVEPOINT s1",
        "SAVEPOINT s2",
        "UPDATE t SET v = 'kept' WHERE id = 4",
        "RELEASE SAVEPOINT s2",
        "DELETE FROM t WHERE id = 3",
        "COMMIT",
    )
    transactions = _read(config, start)
    assert len(transactions) == 1
    assert _rows(transactions) == [(1, (1, f"{LONG}1")), (4, (4, "kept")), (3, None)]


def test_compressed_inserts_updates_and_deletes_read_as_the_rows_they_were(
    mariadb: MariaDBServer, config: PipelineConfig, row_metadata: str, compressed: None
) -> None:
    start = _here(config)
    _session(
        mariadb,
        f"INSERT INTO t VALUES (5, '{LONG}5'), (6, '{LONG}6')",
        f"UPDATE t SET v = CONCAT(v, '{LONG}') WHERE id IN (1, 5)",
        "DELETE FROM t WHERE id IN (2, 6)",
    )
    assert _rows(_read(config, start)) == [
        (None, (5, f"{LONG}5")),
        (None, (6, f"{LONG}6")),
        (1, (1, f"a{LONG}")),
        (5, (5, f"{LONG}5{LONG}")),
        (2, None),
        (6, None),
    ]


def test_xa_transactions_count_at_their_commit_and_not_at_all_when_rolled_back(
    mariadb: MariaDBServer, config: PipelineConfig, row_metadata: str, compressed: None
) -> None:
    start = _here(config)
    _session(
        mariadb,
        "XA START 'a'",
        f"INSERT INTO t VALUES (5, '{LONG}')",
        "UPDATE t SET v = 'xa' WHERE id = 1",
        "XA END 'a'",
        "XA PREPARE 'a'",
    )
    _session(mariadb, "UPDATE t SET v = 'between' WHERE id = 2")  # a transaction after the prepare, before the commit
    _session(
        mariadb,
        "XA COMMIT 'a'",
        "XA START 'b'",
        "INSERT INTO t VALUES (6, 'rolled back')",
        "XA END 'b'",
        "XA PREPARE 'b'",
        "XA ROLLBACK 'b'",
        "XA START 'c'",
        "DELETE FROM t WHERE id = 3",
        "XA END 'c'",
        "XA COMMIT 'c' ONE PHASE",
    )
    transactions = _read(config, start)
    assert _rows(transactions) == [
        (2, (2, "between")),
        (None, (5, LONG)),
        (1, (1, "xa")),
        (3, None),
    ]
    between, committed, _ = transactions
    assert committed.end > between.end
    assert {c.position for c in committed.changes} == {committed.end}  # the rows count at the commit


def test_an_xa_transaction_prepared_before_the_reader_started_is_read_back_at_its_commit(
    mariadb: MariaDBServer, config: PipelineConfig, row_metadata: str, compressed: None
) -> None:
    """The job stopped (or was killed) between XA PREPARE and XA COMMIT and resumed at an offset after the
    prepare: the commit finds the prepared rows in the binlog behind it."""
    with mariadb.admin(DB) as xa, xa.cursor() as cur:
        for statement in (
            "XA START 'late'",
            f"INSERT INTO t VALUES (7, '{LONG}')",
            "XA END 'late'",
            "XA PREPARE 'late'",
        ):
            cur.execute(statement)
        _session(mariadb, "FLUSH BINARY LOGS", "UPDATE t SET v = 'after the prepare' WHERE id = 2")
        resumed_at = _here(config)  # the offset the job committed before it stopped
        cur.execute("XA COMMIT 'late'")
    assert _rows(_read(config, resumed_at)) == [(None, (7, LONG))]


@pytest.mark.parametrize(
    "statement",
    [
        "ALTER TABLE p DROP PARTITION p0",
        "ALTER TABLE p TRUNCATE PARTITION p0",
        "ALTER TABLE p EXCHANGE PARTITION p0 WITH TABLE swap",
        "ALTER TABLE swap_into EXCHANGE PARTITION p0 WITH TABLE {captured}",
        "/*!50100 ALTER TABLE p TRUNCATE PARTITION p0 */",  # an executable comment is statement text
        "ALTER TABLE {captured} DISCARD TABLESPACE",  # its rows are gone without row events
    ],
)
def test_partition_maintenance_that_removes_rows_stops_the_reader_by_name_or_is_handed_on_under_evolve(
    mariadb: MariaDBServer, config: PipelineConfig, statement: str
) -> None:
    mariadb.execute(
        f"CREATE TABLE {DB}.p (id INT PRIMARY KEY) PARTITION BY RANGE (id) "
        "(PARTITION p0 VALUES LESS THAN (100), PARTITION p1 VALUES LESS THAN MAXVALUE)",
        f"INSERT INTO {DB}.p VALUES (1), (2), (200)",
        f"CREATE TABLE {DB}.swap (id INT PRIMARY KEY)",
        f"CREATE TABLE {DB}.swap_into LIKE {DB}.p",
    )
    schemas = [s for s in discover(config.source, config.tables, config.table_options).schemas if s.table in ("p", "t")]
    if "{captured}" in statement:  # the captured table is one exchanged into a partition of another, or discarded
        mariadb.execute(f"CREATE TABLE {DB}.flat (id INT PRIMARY KEY)", f"INSERT INTO {DB}.flat VALUES (5)")
        schemas = [s for s in discover(config.source, config.tables, config.table_options).schemas if s.table == "flat"]
        statement = statement.format(captured="flat")
    start = _here(config)
    mariadb.execute(statement, database=DB)
    reader = BinlogReader(config.source, schemas, start, on_ddl="fail")  # under evolve the sink follows or refuses
    try:
        with pytest.raises(SchemaChangeError, match="brings in rows of whole partitions or tablespaces") as caught:
            list(reader.transactions())
    finally:
        reader.close()
    assert f"{DB}." in str(caught.value) and "ingest resnapshot" in str(caught.value)
    # Under `evolve` the statement is handed on, for the sink to follow (ingest.query.ddl.remove_partition_rows),
    # or to refuse, or to copy the table again (`stream.on_unfollowable: recopy`).
    reader = BinlogReader(config.source, schemas, start, on_ddl="evolve")
    try:
        statements = [item for item in reader.transactions() if isinstance(item, DdlStatement)]
    finally:
        reader.close()
    assert [(s.kind, [t for _, t in s.tables]) for s in statements] == [("partition", [schemas[0].table])]


def test_savepoints_xa_and_a_compressed_binlog_land_in_iceberg_equal_to_mysql_across_a_kill(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, compressed: None
) -> None:
    """A savepoint, compressed events, and an XA transaction over two tables prepared before one run's end and
    committed before the next run, which is killed (-9) between the two tables' commits of that batch: the
    resumed run reads the prepared rows back again, and each table holds the batch once."""
    _fresh(mariadb)
    mariadb.execute(f"CREATE TABLE {DB}.u (id INT PRIMARY KEY, v VARCHAR(1000))", f"INSERT INTO {DB}.u VALUES (1, 'a')")
    document = _document(mariadb, tmp_path)
    document["stream"] = {"concurrent_merges": 1}  # tables commit one after the other, in name order
    config = parse_config(document)
    run(config, spark=spark, snapshot_only=True)
    _session(
        mariadb,
        "BEGIN",
        f"UPDATE t SET v = '{LONG}' WHERE id = 1",
        "SAVEPOINT s1",
        "UPDATE t SET v = 'undone' WHERE id = 2",
        "ROLLBACK TO SAVEPOINT s1",
        f"INSERT INTO t VALUES (10, '{LONG}')",
        "COMMIT",
        "XA START 'e2e'",
        f"INSERT INTO t VALUES (11, '{LONG}')",
        "DELETE FROM t WHERE id = 4",
        f"UPDATE u SET v = '{LONG}' WHERE id = 1",
        "XA END 'e2e'",
        "XA PREPARE 'e2e'",
    )
    run(config, spark=spark, until_caught_up=True)  # commits past the prepare, which is still undecided
    assert verify(config)  # MySQL shows none of the prepared rows yet, and neither does Iceberg
    _session(mariadb, "XA COMMIT 'e2e'")
    _killed_at(document, tmp_path, "stream.after_table_commit:1")
    _session(mariadb, "UPDATE t SET v = 'last' WHERE id = 3")
    run(config, spark=spark, until_caught_up=True)  # reads the prepared rows back at the commit, again
    assert verify(config)
    for table in ("t", "u"):
        offsets = _stream_offsets(config, table)
        assert len(offsets) == len(set(offsets)), f"{table}: a batch committed twice"


def _stream_offsets(config: PipelineConfig, table: str) -> list[str]:
    """The binlog offset of each stream commit to a target, in commit order."""
    target = load_pyiceberg_catalog(config.sink).load_table((DB, table))
    snapshots = main_history(target)
    summaries = [s.summary.additional_properties for s in snapshots if s.summary is not None]
    return [props[SUMMARY_STREAM_OFFSET] for props in summaries if SUMMARY_STREAM_OFFSET in props]


def test_a_system_versioned_table_or_a_sequence_the_patterns_match_is_refused_by_name_and_a_view_is_named(
    mariadb: MariaDBServer, config: PipelineConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mariadb.execute(
        f"CREATE TABLE {DB}.hist (id INT PRIMARY KEY, v INT) WITH SYSTEM VERSIONING",
        f"CREATE SEQUENCE {DB}.seq",
        f"CREATE VIEW {DB}.v AS SELECT id FROM {DB}.t",
    )
    with pytest.raises(UnsupportedTableError) as caught:
        discover(config.source, config.tables, config.table_options)
    assert f"{DB}.hist (SYSTEM VERSIONED)" in str(caught.value)
    assert f"{DB}.seq (SEQUENCE)" in str(caught.value)
    assert f"{DB}.v" not in str(caught.value)
    excluded = parse_config(
        {
            "name": DB,
            "source": source_section(mariadb),
            "tables": {"include": [rf"{DB}\..*"], "exclude": [rf"{DB}\.(hist|seq)"]},
            "sink": embedded_sink(tmp_path),
        }
    )
    with caplog.at_level(logging.INFO, logger="ingest.source.mysql"):
        assert [s.table for s in discover(excluded.source, excluded.tables, excluded.table_options).schemas] == ["t"]
    assert f"not copied, views have no rows of their own: {DB}.v" in caplog.text


FOREIGN_KEYS = [
    f"CREATE TABLE {DB}.p (id INT PRIMARY KEY, a INT, name VARCHAR(20))",
    f"CREATE TABLE {DB}.c (id INT PRIMARY KEY, pid INT, pa INT, "
    f"FOREIGN KEY fk_c (pid) REFERENCES {DB}.p (id) ON DELETE CASCADE ON UPDATE CASCADE)",
    f"CREATE TABLE {DB}.mid (id INT PRIMARY KEY, pid INT, "
    f"FOREIGN KEY fk_mid (pid) REFERENCES {DB}.p (id) ON DELETE CASCADE)",
    f"CREATE TABLE {DB}.leaf (id INT PRIMARY KEY, mid INT, "
    f"FOREIGN KEY fk_leaf (mid) REFERENCES {DB}.mid (id) ON DELETE SET NULL)",
    f"CREATE TABLE {DB}.tree (id INT PRIMARY KEY, up INT, "
    f"FOREIGN KEY fk_up (up) REFERENCES {DB}.tree (id) ON DELETE CASCADE)",
    f"CREATE TABLE {DB}.kept (id INT PRIMARY KEY, pid INT, "
    f"FOREIGN KEY fk_kept (pid) REFERENCES {DB}.p (id) ON DELETE RESTRICT)",
    f"INSERT INTO {DB}.p VALUES (1, 1, 'one'), (2, 2, 'two'), (3, 3, 'three'), (4, 4, 'four')",
    f"INSERT INTO {DB}.c VALUES (1, 1, 1), (2, 2, 2)",
    f"INSERT INTO {DB}.mid VALUES (3, 3)",
    f"INSERT INTO {DB}.leaf VALUES (1, 3)",
    f"INSERT INTO {DB}.tree VALUES (1, NULL), (2, 1)",
    f"CREATE TABLE {DB}.s (code VARCHAR(8) PRIMARY KEY)",
    f"CREATE TABLE {DB}.sc (id INT PRIMARY KEY, code VARCHAR(8), "
    f"FOREIGN KEY fk_sc (code) REFERENCES {DB}.s (code) ON DELETE CASCADE)",
    f"INSERT INTO {DB}.s VALUES ('A')",
    f"INSERT INTO {DB}.sc VALUES (1, 'a')",  # refers to 'A' by the collation
]


@pytest.mark.parametrize(
    ("captured", "statement", "reached"),
    [
        (  # two levels through a table not captured: the rows of mid that p's delete removes act on leaf in turn
            ("p", "leaf"),
            "DELETE FROM p WHERE id = 3",
            "groups.leaf through the foreign key `fk_mid` of groups.mid (ON DELETE CASCADE), and InnoDB does not log "
            "what a foreign key action changes: the job cannot apply this one (the action acts in turn through "
            "groups.mid, which is not captured, so its rows are not read)",
        ),
        (  # a key the job would have to compare by collation
            ("s", "sc"),
            "DELETE FROM s WHERE code = 'a'",
            "(the key column groups.sc.code is not an integer)",
        ),
    ],
)
def test_a_parent_change_whose_foreign_key_action_reaches_a_captured_table_stops_the_reader_by_name(
    mariadb: MariaDBServer,
    config: PipelineConfig,
    row_metadata: str,
    captured: tuple[str, ...],
    statement: str,
    reached: str,
) -> None:
    """InnoDB applies ON DELETE / ON UPDATE actions without logging them: a copy following the binlog would keep
    the children as they were."""
    mariadb.execute(*FOREIGN_KEYS)
    schemas = [s for s in discover(config.source, config.tables, config.table_options).schemas if s.table in captured]
    start = _here(config)
    _session(mariadb, *statement.split("; "))
    assert reached in _refusal(config, schemas, start)


def _refusal(config: PipelineConfig, schemas: Sequence[TableSchema], start: BinlogPosition) -> str:
    """The message of the stop a reader of `schemas` from `start` makes at a foreign key action it cannot apply."""
    reader = BinlogReader(config.source, schemas, start)
    try:
        with pytest.raises(SourceError, match="does not log what a foreign key action changes") as caught:
            list(reader.transactions())
    finally:
        reader.close()
    return str(caught.value)


def test_a_parent_not_captured_is_read_by_the_column_names_the_server_logs_and_refused_without_them(
    mariadb: MariaDBServer, config: PipelineConfig, row_metadata: str
) -> None:
    """The parent's rows give the values the child's rows refer to. With binlog_row_metadata=FULL the server names
    its columns in the binlog; below it they could only be matched by position, in a schema of the parent the job
    does not follow."""
    mariadb.execute(*FOREIGN_KEYS)
    schemas = [s for s in discover(config.source, config.tables, config.table_options).schemas if s.table == "c"]
    start = _here(config)
    _session(mariadb, "DELETE FROM p WHERE id = 1", "UPDATE p SET id = 10 WHERE id = 2")
    if row_metadata == "FULL":
        read = _read(config, start, schemas)
        assert [(a.table_id, a.columns, a.old, a.new) for t in read for a in t.actions] == [
            ("groups.c", (1,), (1,), None),  # ON DELETE CASCADE
            ("groups.c", (1,), (2,), (10,)),  # ON UPDATE CASCADE
        ]
        return
    refused = _refusal(config, schemas, start)
    assert "(groups.p is not captured, and the server does not name the columns of its rows" in refused
    assert "through the foreign key `fk_c` of groups.c (ON DELETE CASCADE)" in refused


def test_a_captured_parent_whose_actions_reach_only_a_captured_child_gives_the_child_what_they_did(
    mariadb: MariaDBServer, config: PipelineConfig, row_metadata: str
) -> None:
    mariadb.execute(*FOREIGN_KEYS)
    schemas = [s for s in discover(config.source, config.tables, config.table_options).schemas if s.table in ("p", "c")]
    start = _here(config)
    _session(mariadb, "BEGIN", "DELETE FROM p WHERE id = 1", "UPDATE p SET id = 20, a = 5 WHERE id = 2", "COMMIT")
    _session(mariadb, "UPDATE p SET a = 6 WHERE id = 20")  # no referenced column changed: nothing acts
    read = _read(config, start, schemas)
    assert [(a.table_id, a.columns, a.old, a.new) for t in read for a in t.actions] == [
        ("groups.c", (1,), (1,), None),  # ON DELETE CASCADE
        ("groups.c", (1,), (2,), (20,)),  # ON UPDATE CASCADE
    ]
    # Inside an XA transaction, the actions count at its commit, after the changes before them; none at a rollback.
    start = _here(config)
    _session(mariadb, "XA START 'y'", "DELETE FROM p WHERE id = 3", "XA END 'y'", "XA PREPARE 'y'", "XA ROLLBACK 'y'")
    first_half = ["XA START 'x'", "UPDATE c SET pa = 9 WHERE id = 2", "DELETE FROM p WHERE id = 20", "XA END 'x'"]
    _session(mariadb, *first_half, "XA PREPARE 'x'")
    committed_at = _here(config)
    _session(mariadb, "XA COMMIT 'x'")
    (xa,) = _read(config, start, schemas)
    assert [(c.table_id, c.row_index, c.after) for c in xa.changes] == [
        ("groups.c", 0, (2, 20, 9)),
        ("groups.p", 1, None),
    ]
    assert [(a.table_id, a.row_index, a.old, a.new) for a in xa.actions] == [("groups.c", 2, (20,), None)]
    assert committed_at < xa.changes[0].position == xa.actions[0].position == xa.end


def test_parent_changes_that_cannot_act_on_a_captured_table_pass(
    mariadb: MariaDBServer, config: PipelineConfig, row_metadata: str
) -> None:
    mariadb.execute(*FOREIGN_KEYS)
    schemas = {s.table: s for s in discover(config.source, config.tables, config.table_options).schemas}
    start = _here(config)
    _session(mariadb, "UPDATE p SET name = 'renamed', a = 10 WHERE id = 1")  # no referenced column changed
    _session(mariadb, "SET foreign_key_checks = 0", "DELETE FROM p WHERE id = 2")  # nothing cascades
    with_child = [schemas["p"], schemas["c"]]
    assert _rows(_read(config, start, with_child)) == [(1, (1, 10, "renamed")), (2, None)]
    start = _here(config)
    _session(mariadb, "DELETE FROM p WHERE id = 4")  # its actions reach c, mid and leaf: none is captured
    assert _rows(_read(config, start, [schemas["p"], schemas["kept"]])) == [(4, None)]


def test_a_start_by_timestamp_never_splits_a_transaction_at_its_savepoint(
    mariadb: MariaDBServer, config: PipelineConfig
) -> None:
    """`startup_mode: timestamp` starts at the first group committed at or after the time: a SAVEPOINT before
    the time inside a transaction committed after it is no group's end."""
    begin = _here(config)
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        for statement in ("BEGIN", "UPDATE t SET v = 'before the time' WHERE id = 1", "SAVEPOINT s1"):
            cur.execute(statement)
        at = int(time.time()) + 1  # the binlog stamps whole seconds
        time.sleep(max(0.0, at - time.time()) + 0.05)
        cur.execute("UPDATE t SET v = 'after the time' WHERE id = 2")
        cur.execute("COMMIT")
    start = _first_commit_at_or_after(config.source, begin, at, _here(config))
    assert start is not None
    assert _rows(_read(config, start)) == [(1, (1, "before the time")), (2, (2, "after the time"))]


def test_foreign_key_actions_land_in_iceberg_equal_to_mysql_across_a_kill_between_two_tables_commits(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """ON DELETE CASCADE, ON UPDATE CASCADE and ON DELETE / UPDATE SET NULL, which InnoDB applies to the children
    without row events, interleaved with changes of the same children in one batch: rows the batch changed before
    an action, rows it did not change (read from the target), chains of re-keyings and a delete at the end. The
    second batch is killed (-9) after the first table's commit and resumed, the third after the first changelog's
    commit (before its target's): every table holds each once. The children's changelog tables hold what the
    actions did too: replayed in `_seq` order over the copied rows, they give MySQL's rows."""
    _fresh(mariadb)
    mariadb.execute(
        f"CREATE TABLE {DB}.p (id INT PRIMARY KEY, a INT)",
        f"CREATE TABLE {DB}.c (id INT PRIMARY KEY, pid INT, v VARCHAR(20), "
        f"FOREIGN KEY (pid) REFERENCES {DB}.p (id) ON DELETE CASCADE ON UPDATE CASCADE)",
        f"CREATE TABLE {DB}.n (id INT PRIMARY KEY, pid INT, "
        f"FOREIGN KEY (pid) REFERENCES {DB}.p (id) ON DELETE SET NULL ON UPDATE SET NULL)",
        f"INSERT INTO {DB}.p SELECT seq, seq FROM {DB}.seq_1_to_9",
        f"INSERT INTO {DB}.c VALUES (1, 1, 'a'), (2, 1, 'b'), (3, 2, 'c'), (4, 3, 'd'), (5, 4, 'e'), (6, 5, 'f'), "
        "(7, NULL, 'g'), (9, 7, 'h'), (10, 8, 'i')",
        f"INSERT INTO {DB}.n VALUES (1, 1), (2, 2), (3, 3), (4, 6), (5, 7), (6, 8)",
    )
    document = _document(mariadb, tmp_path)
    document["sink"]["catalog_name"] = "fk_lake"  # the module's Spark session keeps each catalog name's first warehouse
    document["stream"] = {"concurrent_merges": 1}  # tables commit one after the other, in name order
    document["table_options"] = {f"{DB}.c": {"changelog": True}, f"{DB}.n": {"changelog": True}}
    config = parse_config(document)
    run(config, spark=spark, snapshot_only=True)
    copied = {table: _iceberg_rows(config, table) for table in ("c", "n")}
    _session(mariadb, "BEGIN", "UPDATE c SET v = 'touched' WHERE id = 1", "DELETE FROM p WHERE id = 1", "COMMIT")
    _session(mariadb, "UPDATE p SET id = 20 WHERE id = 2")  # c 3 re-keyed, n 2 nulled, neither in the batch
    _session(mariadb, "INSERT INTO c VALUES (8, 20, 'new')", "UPDATE p SET id = 30 WHERE id = 20")  # a chain
    _session(mariadb, "UPDATE c SET v = 'after' WHERE id = 4", "DELETE FROM p WHERE id = 3")
    _session(mariadb, "SET foreign_key_checks = 0", "DELETE FROM p WHERE id = 4")  # nothing acts: c 5 dangles
    _session(mariadb, "DELETE FROM c WHERE id = 6", "DELETE FROM p WHERE id = 5")  # nothing left to act on
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, pid FROM c ORDER BY id")
        assert cur.fetchall() == ((3, 30), (5, 4), (7, None), (8, 30), (9, 7), (10, 8))  # the actions acted

    _session(mariadb, "DELETE FROM p WHERE id = 30", "UPDATE p SET id = 70 WHERE id = 7", "DELETE FROM p WHERE id = 8")
    _killed_at(document, tmp_path, "stream.after_table_commit:1")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)

    _session(
        mariadb, "INSERT INTO p VALUES (40, 40)", "INSERT INTO c VALUES (11, 40, 'x')", "INSERT INTO n VALUES (7, 40)"
    )
    # The batch's own rows re-keyed and nulled, then rows it does not change (c 9, n 4), read from the target.
    _session(
        mariadb,
        "UPDATE p SET id = 41 WHERE id = 40",
        "UPDATE p SET id = 71 WHERE id = 70",
        "DELETE FROM p WHERE id = 6",
    )
    _killed_at(document, tmp_path, "stream.after_changelog_commit:1")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)

    # An XA transaction whose delete cascades, prepared before a run's end and committed after it: its actions
    # count at the commit, which the next run reads the prepared half back for.
    first_half = ["XA START 'fk'", "UPDATE c SET v = 'xa' WHERE id = 11", "DELETE FROM p WHERE id = 71", "XA END 'fk'"]
    _session(mariadb, *first_half, "XA PREPARE 'fk'")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)  # nothing of it yet
    _session(mariadb, "XA COMMIT 'fk'")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM c WHERE id = 9")
        assert cur.fetchone()[0] == 0  # the cascade acted
    for table in ("c", "n", "p", "c_changelog", "n_changelog"):
        offsets = _stream_offsets(config, table)
        assert len(offsets) == len(set(offsets)), f"{table}: a batch committed twice"
    for table in ("c", "n"):
        assert _replayed(copied[table], config, f"{table}_changelog") == _iceberg_rows(config, table), table


def test_foreign_key_actions_acting_in_turn_down_three_levels_and_through_a_self_reference_land_equal_across_a_kill(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """A customer's delete cascades to its orders, whose deletes cascade to their items, whose deletes null the
    tags that name them; a category's delete cascades down its subtree (a self-reference), whose deletes null the
    notes on them; a parent the job does not capture deletes and nulls its children. InnoDB logs none of it past
    the first row event. Rows the batch changed before the action
    (an item updated, then its customer deleted) and rows read from the targets are both reached. The second
    batch is killed (-9) after its first table's commit (the deepest table commits first) and resumed. The
    changelogs hold what the actions did in turn."""
    _fresh(mariadb)
    mariadb.execute(
        f"CREATE TABLE {DB}.cust (id INT PRIMARY KEY, name VARCHAR(20))",
        f"CREATE TABLE {DB}.ord (id INT PRIMARY KEY, cust INT, "
        f"FOREIGN KEY fk_ord (cust) REFERENCES {DB}.cust (id) ON DELETE CASCADE ON UPDATE CASCADE)",
        f"CREATE TABLE {DB}.item (id INT PRIMARY KEY, ord INT, note VARCHAR(20), "
        f"FOREIGN KEY fk_item (ord) REFERENCES {DB}.ord (id) ON DELETE CASCADE ON UPDATE CASCADE)",
        f"CREATE TABLE {DB}.tag (id INT PRIMARY KEY, item INT, "
        f"FOREIGN KEY fk_tag (item) REFERENCES {DB}.item (id) ON DELETE SET NULL)",
        f"CREATE TABLE {DB}.cat (id INT PRIMARY KEY, up INT, "
        f"FOREIGN KEY fk_up (up) REFERENCES {DB}.cat (id) ON DELETE CASCADE)",
        f"CREATE TABLE {DB}.cnote (id INT PRIMARY KEY, cat INT, "
        f"FOREIGN KEY fk_cnote (cat) REFERENCES {DB}.cat (id) ON DELETE SET NULL)",
        f"INSERT INTO {DB}.cust SELECT seq, CONCAT('c', seq) FROM {DB}.seq_1_to_6",
        f"INSERT INTO {DB}.ord SELECT seq, 1 + seq % 6 FROM {DB}.seq_1_to_18",  # 3 orders per customer
        f"INSERT INTO {DB}.item SELECT seq, 1 + seq % 18, 'new' FROM {DB}.seq_1_to_36",  # 2 items per order
        f"INSERT INTO {DB}.tag SELECT seq, 1 + seq % 36 FROM {DB}.seq_1_to_40",
        # a tree: 1 > 2 > 3 > 4, 1 > 5, 6 > 7 (ids ascending, so each parent is inserted first)
        f"INSERT INTO {DB}.cat VALUES (1, NULL), (2, 1), (3, 2), (4, 3), (5, 1), (6, NULL), (7, 6)",
        f"INSERT INTO {DB}.cnote VALUES (1, 4), (2, 5), (3, 7), (4, 1), (5, NULL)",
        # a parent the job does not capture, read by the column names the server logs (binlog_row_metadata=FULL)
        f"CREATE TABLE {DB}.ext (id INT PRIMARY KEY, v VARCHAR(20))",
        f"CREATE TABLE {DB}.extc (id INT PRIMARY KEY, ext INT, "
        f"FOREIGN KEY fk_extc (ext) REFERENCES {DB}.ext (id) ON DELETE CASCADE ON UPDATE SET NULL)",
        f"INSERT INTO {DB}.ext VALUES (1, 'a'), (2, 'b'), (3, 'c')",
        f"INSERT INTO {DB}.extc VALUES (1, 1), (2, 1), (3, 2), (4, 3)",
    )
    document = _document(mariadb, tmp_path)
    document["sink"]["catalog_name"] = "chain_lake"  # the module's Spark keeps each catalog name's first warehouse
    document["tables"] = {"include": [rf"{DB}\.(cust|ord|item|tag|cat|cnote|extc)"]}
    document["table_options"] = {f"{DB}.item": {"changelog": True}, f"{DB}.cat": {"changelog": True}}
    config = parse_config(document)
    run(config, spark=spark, snapshot_only=True)
    copied = {table: _iceberg_rows(config, table) for table in ("item", "cat")}

    def equal() -> None:
        assert verify(config)
        for table in ("cust", "ord", "item", "tag", "cat", "cnote", "extc"):
            assert _iceberg_rows(config, table) == {r["id"]: r for r in mysql_rows(mariadb, f"{DB}.{table}", "id")}

    # Customer 1: orders 6, 12, 18 from the target, their items, their items' tags. Customer 2: order 1's item 18
    # changed in the batch first. The subtree of category 2, deep in the target.
    _session(mariadb, "DELETE FROM cust WHERE id = 1")
    _session(
        mariadb, "BEGIN", "UPDATE item SET note = 'touched' WHERE id = 18", "DELETE FROM cust WHERE id = 2", "COMMIT"
    )
    _session(mariadb, "DELETE FROM cat WHERE id = 2")
    _session(mariadb, "UPDATE cust SET id = 30 WHERE id = 3")  # orders re-keyed to 30; their ids, and items, stay
    _session(mariadb, "DELETE FROM ext WHERE id = 1", "UPDATE ext SET id = 20 WHERE id = 2")  # extc 1, 2 go; 3 nulled
    run(config, spark=spark, until_caught_up=True)
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*), COUNT(item) FROM tag")
        assert cur.fetchone() == (40, 27)  # the actions acted three levels down: 13 tags nulled
        cur.execute("SELECT id FROM cat ORDER BY id")
        assert cur.fetchall() == ((1,), (5,), (6,), (7,))
        cur.execute("SELECT id, ext FROM extc ORDER BY id")
        assert cur.fetchall() == ((3, None), (4, 3))
    equal()

    # Killed between the commits of a batch whose actions act in turn (cust commits first, then the tables the
    # actions reached, deepest first: tag, item, then cnote, ord, cat), then resumed.
    _session(mariadb, "INSERT INTO ord VALUES (40, 30)", "INSERT INTO item VALUES (80, 40, 'x')")
    _session(mariadb, "DELETE FROM cust WHERE id = 30", "DELETE FROM cat WHERE id = 1")
    _killed_at(document, tmp_path, "stream.after_table_commit:3")
    run(config, spark=spark, until_caught_up=True)
    equal()
    for table in ("item", "cat"):
        assert _replayed(copied[table], config, f"{table}_changelog") == _iceberg_rows(config, table), table
        offsets = _stream_offsets(config, table)
        assert len(offsets) == len(set(offsets)), f"{table}: a batch committed twice"


class ActOnAParentAfterChunkOne:
    """A chunk hook (run on an executor): once, right after chunk 1 of `c` is read (chunks 0 and 1 hold their rows
    as before, 2 and 3 will be read after), a parent is deleted and another re-keyed; InnoDB changes children in
    every chunk without row events."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def __call__(self, at: str, chunk: Any) -> None:
        if at == "after_high_watermark" and chunk.table_id == f"{DB}.c" and chunk.index == 1:
            statements = [
                ("DELETE FROM p WHERE id = 1", None),
                ("UPDATE p SET id = 20 WHERE id = 2", None),
                # Rows the later chunks hold that the actions above must not reach again: a child of a parent 1
                # inserted again, and children re-keyed to 2 by a later action.
                ("INSERT INTO p VALUES (1)", None),
                ("UPDATE c SET pid = 1 WHERE id = 25", None),
                ("UPDATE p SET id = 2 WHERE id = 3", None),
            ]
            run_once(self.socket, DB, "marker", statements)


def test_a_foreign_key_action_between_two_chunk_reads_acts_only_on_the_rows_of_the_chunks_read_before_it(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Children of both parents sit in every chunk of `c`. The chunks read after the actions hold what they did;
    those read before hold the rows as they were, and the binlog phase must act on exactly those (a cascade
    applied to a row of a later chunk would delete a row re-inserted since, or re-key one twice)."""
    _fresh(mariadb)
    mariadb.execute(
        f"CREATE TABLE {DB}.p (id INT PRIMARY KEY)",
        f"CREATE TABLE {DB}.c (id INT PRIMARY KEY, pid INT, "
        f"FOREIGN KEY (pid) REFERENCES {DB}.p (id) ON DELETE CASCADE ON UPDATE CASCADE)",
        f"CREATE TABLE {DB}.marker (x INT PRIMARY KEY)",
        f"INSERT INTO {DB}.p VALUES (1), (2), (3)",
        f"INSERT INTO {DB}.c SELECT seq, 1 + seq % 3 FROM {DB}.seq_1_to_40",
    )
    document = _document(mariadb, tmp_path)
    document["sink"]["catalog_name"] = "straddle_lake"
    document["snapshot"] = {"chunk_size": 10, "parallelism": 1}  # four chunks of c, read in order
    config = parse_config(document)
    run(config, spark=spark, snapshot_only=True, hook=ActOnAParentAfterChunkOne(mariadb.socket))
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM marker")
        assert cur.fetchone()[0] == 1  # the hook ran
        cur.execute("INSERT INTO c VALUES (41, 2)")
    copied = _iceberg_rows(config, "c")
    assert copied[1]["pid"] == 2 and copied[2]["pid"] == 3 and copied[3]["pid"] == 1  # chunk 0 as before
    assert 24 not in copied and copied[25]["pid"] == 1 and copied[26]["pid"] == 2  # chunk 2 as after
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    assert _iceberg_rows(config, "c") == {r["id"]: r for r in mysql_rows(mariadb, f"{DB}.c", "id")}


def _iceberg_rows(config: PipelineConfig, table: str) -> dict[Any, dict[str, Any]]:
    """The target's rows by their `id`."""
    rows = load_pyiceberg_catalog(config.sink).load_table((DB, table)).scan().to_arrow().to_pylist()
    return {row["id"]: row for row in rows}


def _replayed(rows: dict[Any, dict[str, Any]], config: PipelineConfig, changelog: str) -> dict[Any, dict[str, Any]]:
    """`rows` with the changelog's changes applied in `_seq` order."""
    out = dict(rows)
    log_rows = load_pyiceberg_catalog(config.sink).load_table((DB, changelog)).scan().to_arrow().to_pylist()
    for row in sorted(log_rows, key=lambda r: r["_seq"]):
        image = {k: v for k, v in row.items() if not k.startswith("_")}
        if row["_op"] in ("-U", "-D"):
            assert out.pop(image["id"]) == image, row  # the image removed is the row the table held
        else:
            assert image["id"] not in out, row
            out[image["id"]] = image
    return out


def test_dropped_and_truncated_partitions_land_in_iceberg_equal_to_mysql_across_a_kill(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Nightly retention on a RANGE COLUMNS table and LIST maintenance with a partition added and dropped again:
    no row events, and the rows each statement removed go from the target in one commit at the statement. The
    last statement is killed (-9) after its commit and resumed: it is applied once."""
    _fresh(mariadb)
    mariadb.execute(
        f"CREATE TABLE {DB}.pr (id INT, d DATE, v INT, PRIMARY KEY (id, d)) PARTITION BY RANGE COLUMNS (d) ("
        "PARTITION p23 VALUES LESS THAN ('2024-01-01'), PARTITION p24 VALUES LESS THAN ('2025-01-01'), "
        "PARTITION pmax VALUES LESS THAN (MAXVALUE))",
        f"INSERT INTO {DB}.pr SELECT seq, DATE_ADD('2023-01-01', INTERVAL seq * 7 DAY), seq FROM {DB}.seq_1_to_150",
        f"CREATE TABLE {DB}.pl (id INT, region INT, PRIMARY KEY (id, region)) PARTITION BY LIST (region) ("
        "PARTITION a VALUES IN (1, 2), PARTITION b VALUES IN (3), PARTITION c VALUES IN (4, 5))",
        f"INSERT INTO {DB}.pl SELECT seq, 1 + seq % 5 FROM {DB}.seq_1_to_50",
    )
    document = _document(mariadb, tmp_path)
    document["sink"]["catalog_name"] = "part_lake"  # the module's Spark session keeps each name's first warehouse
    config = parse_config(document)
    run(config, spark=spark, until_caught_up=True)
    _session(
        mariadb,
        "UPDATE pr SET v = -v WHERE id % 10 = 0",
        "ALTER TABLE pr TRUNCATE PARTITION p24",
        "INSERT INTO pr VALUES (1000, '2024-06-01', 1)",  # into the truncated partition again
        "ALTER TABLE pr DROP PARTITION p23",
        "INSERT INTO pr VALUES (1001, '2023-06-01', 2)",  # now in p24, whose range starts below
        "ALTER TABLE pl DROP PARTITION b",
        "ALTER TABLE pl TRUNCATE PARTITION c",
        "ALTER TABLE pl ADD PARTITION (PARTITION d VALUES IN (6))",
        "INSERT INTO pl VALUES (100, 6), (101, 6), (102, 4)",
    )
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    _session(mariadb, "ALTER TABLE pl DROP PARTITION d", "INSERT INTO pl VALUES (103, 1)")
    _killed_at(document, tmp_path, "stream.after_partition_delete:1")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    for table in ("pr", "pl"):
        offsets = _stream_offsets(config, table)
        assert len(offsets) == len(set(offsets)), f"{table}: a statement or batch committed twice"


def test_time_partitions_by_year_to_days_and_unix_timestamp_are_followed_and_another_function_stops_by_name(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Time-partitioned tables, dropped and truncated by partition: the rows go where Spark's year, day number and
    epoch seconds of the target's column say MariaDB's YEAR, TO_DAYS and UNIX_TIMESTAMP put them (verify compares
    every row). A partitioning function the job cannot compute alike (MONTH) stops it, naming the statement."""
    _fresh(mariadb)
    mariadb.execute(
        f"CREATE TABLE {DB}.py (id INT, d DATE, PRIMARY KEY (id, d)) PARTITION BY RANGE (YEAR(d)) ("
        "PARTITION p23 VALUES LESS THAN (2024), PARTITION p24 VALUES LESS THAN (2025), "
        "PARTITION pmax VALUES LESS THAN MAXVALUE)",
        f"CREATE TABLE {DB}.pd (id INT, d DATETIME(6), PRIMARY KEY (id, d)) PARTITION BY RANGE (TO_DAYS(d)) ("
        "PARTITION p0 VALUES LESS THAN (TO_DAYS('2024-03-01')), PARTITION p1 VALUES LESS THAN (TO_DAYS('2024-03-02')), "
        "PARTITION pmax VALUES LESS THAN MAXVALUE)",
        f"CREATE TABLE {DB}.pu (id INT, at TIMESTAMP(3) NOT NULL, PRIMARY KEY (id, at)) "
        "PARTITION BY RANGE (UNIX_TIMESTAMP(at)) ("
        "PARTITION p0 VALUES LESS THAN (UNIX_TIMESTAMP('2024-03-01 00:00:00')), "
        "PARTITION p1 VALUES LESS THAN (UNIX_TIMESTAMP('2024-03-02 00:00:00')), "
        "PARTITION pmax VALUES LESS THAN MAXVALUE)",
        f"CREATE TABLE {DB}.pm (id INT, d DATE, PRIMARY KEY (id, d)) PARTITION BY RANGE (MONTH(d)) ("
        "PARTITION h1 VALUES LESS THAN (7), PARTITION h2 VALUES LESS THAN MAXVALUE)",
        # The edges of each partition: its first and last day, and around midnight of the bounds.
        f"INSERT INTO {DB}.py VALUES (1, '2023-12-31'), (2, '2024-01-01'), (3, '2024-12-31'), (4, '2025-01-01')",
        f"INSERT INTO {DB}.pd VALUES (1, '2024-02-29 23:59:59.999999'), (2, '2024-03-01 00:00:00'), "
        "(3, '2024-03-01 23:59:59.5'), (4, '2024-03-02 00:00:00')",
        f"INSERT INTO {DB}.pu VALUES (1, '2024-02-29 23:59:59.999'), (2, '2024-03-01 00:00:00'), "
        "(3, '2024-03-01 23:59:59.5'), (4, '2024-03-02 00:00:00')",
        f"INSERT INTO {DB}.pm VALUES (1, '2024-05-05'), (2, '2024-08-08')",
        # A log without a key, alike rows on each side of a bound: its dropped partition's rows go, the rest stay.
        f"CREATE TABLE {DB}.pl (d DATE, msg VARCHAR(5)) PARTITION BY RANGE (YEAR(d)) ("
        "PARTITION p23 VALUES LESS THAN (2024), PARTITION p24 VALUES LESS THAN (2025), "
        "PARTITION pmax VALUES LESS THAN MAXVALUE)",
        f"INSERT INTO {DB}.pl VALUES ('2023-12-31', 'a'), ('2023-12-31', 'a'), ('2024-01-01', 'a'), "
        "('2024-01-01', 'a'), ('2024-12-31', NULL), ('2025-01-01', NULL), ('2025-01-01', NULL)",
    )
    document = _document(mariadb, tmp_path)
    document["sink"]["catalog_name"] = "time_lake"
    config = parse_config(document)
    run(config, spark=spark, until_caught_up=True)
    _session(
        mariadb,
        "ALTER TABLE py DROP PARTITION p24",
        "ALTER TABLE pd TRUNCATE PARTITION p1",
        "ALTER TABLE pu DROP PARTITION p1",
        "INSERT INTO py VALUES (5, '2024-06-06')",  # into pmax now
        "ALTER TABLE pl DROP PARTITION p24",
        "INSERT INTO pl VALUES ('2024-06-06', 'a'), ('2023-12-31', 'a')",  # into pmax now, and one more alike
    )
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)  # row for row (pl as a multiset): each table lost exactly its partition's rows
    pl = load_pyiceberg_catalog(config.sink).load_table((DB, "pl")).scan().to_arrow()
    assert sorted(map(repr, pl.select(["d", "msg"]).to_pylist())) == sorted(
        repr({"d": dt.date(*d), "msg": m})
        for d, m in [((2023, 12, 31), "a")] * 3 + [((2024, 6, 6), "a"), ((2025, 1, 1), None), ((2025, 1, 1), None)]
    )
    _session(mariadb, "ALTER TABLE pm DROP PARTITION h1")
    with pytest.raises(SchemaChangeError, match=r"groups.pm: .*DROP PARTITION h1.* cannot tell which: .*month\(`d`\)"):
        run(config, spark=spark, until_caught_up=True)


def test_a_target_copied_without_kept_bounds_follows_a_truncate_by_the_servers_and_keeps_them(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """A target copied before the job kept partition bounds: a DROP PARTITION stops by name, since the dropped
    partition's bounds are gone from the server; a TRUNCATE PARTITION leaves them there, so it is followed by
    the server's bounds (no partition statement came after it), which the job keeps from then on."""
    _fresh(mariadb)
    mariadb.execute(
        f"CREATE TABLE {DB}.pk (id INT PRIMARY KEY) PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN (10), "
        "PARTITION p1 VALUES LESS THAN (20), PARTITION p2 VALUES LESS THAN MAXVALUE)",
        f"INSERT INTO {DB}.pk SELECT seq FROM {DB}.seq_1_to_30",
    )
    document = _document(mariadb, tmp_path)
    document["sink"]["catalog_name"] = "kept_lake"
    config = parse_config(document)
    run(config, spark=spark, until_caught_up=True)
    spark.sql(f"ALTER TABLE kept_lake.{DB}.pk UNSET TBLPROPERTIES ('{PARTITIONS_PROPERTY}')")  # as copied before
    _session(mariadb, "ALTER TABLE pk DROP PARTITION p0")
    with pytest.raises(SchemaChangeError, match=r"groups.pk: .*DROP PARTITION p0.* did not keep the table's partition"):
        run(config, spark=spark, until_caught_up=True)
    config = parse_config({**document, "stream": {"on_unfollowable": "recopy"}})
    run(config, spark=spark, until_caught_up=True)  # copied again, with its bounds kept
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    spark.sql(f"ALTER TABLE kept_lake.{DB}.pk UNSET TBLPROPERTIES ('{PARTITIONS_PROPERTY}')")
    _session(mariadb, "ALTER TABLE pk TRUNCATE PARTITION p1", "INSERT INTO pk VALUES (15)")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    _session(mariadb, "ALTER TABLE pk DROP PARTITION p1")  # by the bounds kept at the TRUNCATE
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
