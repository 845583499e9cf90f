"""Replicas: snapshot and stream from a read-only replica; failover to a replica, then resume by GTID
(FAILURES.md "Watermarks, positions, GTIDs").

For failover, a primary and a GTID replica with `log_slave_updates`, both real MariaDB servers with the same binlog base
name, so positions of the two compare without an error and only the server id tells them apart. The job
follows the primary, is killed between two tables of a batch (the tables then hold different offsets),
the primary dies and the replica takes over; the job, pointed at the replica, must find every recorded
point again by its GTIDs: the targets equal the new primary row for row and the changelog holds each
change exactly once.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commands.status import binlog_status
from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import SourceError
from ingest.model.position import MariadbGtidPos
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.source.binlog.failover import locate
from ingest.source.discovery import discover
from ingest.source.mysql import connect, load_schema
from ingest.source.snapshot.chunk_reader import ChunkTask, HookPoint, read_chunk
from ingest.source.snapshot.chunks import Chunk, split_table
from ingest.state.table import StateTable
from tests.conftest import CDC_USER, embedded_sink, run_ingest, source_section
from tests.integration.test_chunks import HOOK_DML, _table_rows

pytestmark = pytest.mark.integration

# Single-statement transactions, each with the changelog rows it makes on acct (op, id).
FIRST = [("INSERT INTO {db}.acct VALUES (50, 'first', 5)", [("+I", 50)])]
BEFORE_CRASH = [
    ("INSERT INTO {db}.acct VALUES (100, 'a', 1)", [("+I", 100)]),
    ("UPDATE {db}.acct SET owner = 'b' WHERE id = 1", [("-U", 1), ("+U", 1)]),
    ("UPDATE {db}.tag SET n = n + 1 WHERE n < 3", []),
]
BEFORE_FAILOVER = [
    ("DELETE FROM {db}.acct WHERE id = 2", [("-D", 2)]),
    ("UPDATE {db}.acct SET id = 200 WHERE id = 3", [("-U", 3), ("+U", 200)]),
    ("INSERT INTO {db}.tag VALUES ('zz', 9)", []),
]
AFTER_FAILOVER = [
    ("INSERT INTO {db}.acct VALUES (300, 'on the replica', 3)", [("+I", 300)]),
    ("UPDATE {db}.acct SET balance = 0 WHERE id = 100", [("-U", 100), ("+U", 100)]),
    ("DELETE FROM {db}.tag WHERE name = 'zz'", []),
]


@pytest.fixture
def pair(cdc_password: str) -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    """A primary (server id 21) and its GTID replica (22), the replica following from the first event.

    The replica starts a new binlog file first: a replica's binlog never has the primary's layout (it
    started at another time, rotates at other times), and without this the two would be byte for byte
    alike, and the primary's positions would happen to be right on the replica.
    """
    with MariaDBServer(server_id=21) as primary, MariaDBServer(server_id=22) as replica:
        replica.execute("FLUSH BINARY LOGS")
        replica.replicate_from(primary)
        primary.create_cdc_user(CDC_USER, cdc_password)  # replicated, like everything after this
        yield primary, replica


def _setup(primary: MariaDBServer, db: str) -> None:
    primary.execute(
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.acct (id INT NOT NULL PRIMARY KEY, owner VARCHAR(20), balance DECIMAL(12,2))",
        f"CREATE TABLE {db}.tag (name VARCHAR(10) NOT NULL PRIMARY KEY, n INT)",
        f"INSERT INTO {db}.acct SELECT seq, CONCAT('o', seq), seq FROM {db}.seq_1_to_40",
        f"INSERT INTO {db}.tag SELECT CONCAT('t', seq), seq FROM {db}.seq_1_to_10",
    )


def _pipeline(server: MariaDBServer, db: str, warehouse: Path) -> dict[str, Any]:
    return {
        "name": db,
        "source": source_section(server),
        "tables": {"include": [rf"{db}\..*"]},
        # Table by table, one after the other, so that the crash after the first table's commit falls between the
        # two: a table ahead of the offset, with a point of the old primary, is what a failover must find again.
        "sink": {**embedded_sink(warehouse), "catalog_name": f"{db}_lake", "one_commit": False},
        "snapshot": {"chunk_size": 8, "parallelism": 2},
        "stream": {"batch_interval_seconds": 60, "concurrent_merges": 1},
        "table_options": {f"{db}.acct": {"changelog": True}},
    }


def _apply(server: MariaDBServer, db: str, changes: list[tuple[str, list[tuple[str, int]]]]) -> None:
    with server.admin() as conn, conn.cursor() as cur:
        for statement, _ in changes:
            cur.execute(statement.format(db=db))


def _server_id_of_offset(config: Any) -> int | None:
    offset = StateTable.open(config.sink, config.name).stream_offset()
    return None if offset is None else offset.server_id


def test_failover_to_a_replica_resumes_by_gtid_exactly_once(
    spark: Any, pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    primary, replica = pair
    db = "fo"
    _setup(primary, db)
    on_primary = _pipeline(primary, db, tmp_path)
    config = parse_config(on_primary)
    run(config, spark=spark, until_caught_up=True)  # snapshot, then the binlog up to now
    _apply(primary, db, FIRST)
    run(config, spark=spark, until_caught_up=True)  # a batch: the state table's offset is a primary's point
    assert verify(config)
    assert _server_id_of_offset(config) == 21

    _apply(primary, db, BEFORE_CRASH)
    config_file = tmp_path / "primary.yaml"
    config_file.write_text(yaml.safe_dump(on_primary))
    crash_at = "stream.after_table_commit:1"
    crashed = run_ingest("run", "--config", str(config_file), "--until-caught-up", crash_at=crash_at)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    # acct holds the batch, its changelog, tag and the state table do not: four points to find again.
    catalog = load_pyiceberg_catalog(config.sink)
    acct = catalog.load_table((db, "acct")).scan().to_arrow().to_pylist()
    assert {r["id"]: r["owner"] for r in acct}[1] == "b"
    assert catalog.load_table((db, "acct_changelog")).scan().to_arrow().num_rows == 1  # FIRST's insert

    _apply(primary, db, BEFORE_FAILOVER)
    replica.wait_for(primary)
    primary.stop()
    replica.promote()
    _apply(replica, db, AFTER_FAILOVER)

    config_on_replica = parse_config(_pipeline(replica, db, tmp_path))
    assert (
        binlog_status(config_on_replica, StateTable.open(config_on_replica.sink, config_on_replica.name))[
            "transactions_behind"
        ]
        == 9
    )
    run(config_on_replica, spark=spark, until_caught_up=True)
    assert verify(config_on_replica)
    assert _server_id_of_offset(config_on_replica) == 22
    status = binlog_status(config_on_replica, StateTable.open(config_on_replica.sink, config_on_replica.name))
    assert status["transactions_behind"] == 0 and status["caught_up"] is True

    # Every change once, none lost and none twice: the changelog started after the snapshot.
    logged = catalog.load_table((db, "acct_changelog")).scan().to_arrow().to_pylist()
    expected = [row for _, rows in FIRST + BEFORE_CRASH + BEFORE_FAILOVER + AFTER_FAILOVER for row in rows]
    assert Counter((r["_op"], r["id"]) for r in logged) == Counter(expected)
    # A rerun on the new primary finds nothing new.
    snapshots = len(catalog.load_table((db, "acct")).snapshots())
    run(config_on_replica, spark=spark, until_caught_up=True)
    assert len(catalog.load_table((db, "acct")).snapshots()) == snapshots


def test_a_replica_without_transactions_iceberg_holds_stops_the_job_naming_them(
    spark: Any, pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    primary, replica = pair
    db = "lost"
    _setup(primary, db)
    replica.wait_for(primary)
    replica.execute("STOP SLAVE")  # asynchronous replication: what follows never reaches the replica
    config = parse_config(_pipeline(primary, db, tmp_path))
    run(config, spark=spark, snapshot_only=True)
    _apply(primary, db, BEFORE_CRASH)
    run(config, spark=spark, until_caught_up=True)
    primary.stop()
    replica.promote()

    config_on_replica = parse_config(_pipeline(replica, db, tmp_path))
    with pytest.raises(SourceError, match=r"lacks transactions Iceberg already holds: domain 0 up to sequence"):
        run(config_on_replica, spark=spark, until_caught_up=True)


def _writer(primary: MariaDBServer, db: str, stop: threading.Event, done: list[int]) -> None:
    """Random multi-statement transactions on the primary, about 5 ms apart: updates, deletes, inserts, key moves."""
    rng = random.Random(11)
    with primary.admin(db) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION autocommit = 0")
        while not stop.is_set():
            for _ in range(rng.randint(1, 3)):
                k, op = rng.randint(1, 500), rng.choice(["update", "update", "delete", "insert", "move"])
                if op == "update":
                    cur.execute("UPDATE acct SET balance = balance + 1 WHERE id = %s", (k,))
                elif op == "delete":
                    cur.execute("DELETE FROM acct WHERE id = %s", (k,))
                elif op == "insert":
                    cur.execute("INSERT IGNORE INTO acct VALUES (%s, 'new', %s)", (k, rng.randint(0, 99)))
                else:
                    cur.execute("UPDATE IGNORE acct SET id = %s WHERE id = %s", (rng.randint(1, 500), k))
                done[0] += cur.rowcount
            conn.commit()
            # Paced as the suite's other writers are: unpaced it keeps one of the two cores busy and grows the
            # binlog the job must catch up with as fast as the server can write.
            time.sleep(0.005)


def test_a_chunk_read_on_a_read_only_replica_takes_the_writes_replicated_inside_its_window(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    """The three hook points of FAILURES.md on a replica: the DML runs on the primary and the hook waits until
    the replica has applied it, so it reaches the chunk only through the replica's own binlog window."""
    primary, replica = pair
    db = "rohook"
    primary.execute(f"CREATE DATABASE {db}")
    replica.wait_for(primary)
    replica.execute("SET GLOBAL read_only = ON")
    config = parse_config(_pipeline(replica, db, tmp_path))
    for point in ("after_low_watermark", "before_high_watermark", "after_high_watermark"):
        _dml_on_the_primary_at(point, primary, replica, config, db)
    assert _gtid_servers(replica) == {21}


def _dml_on_the_primary_at(
    point: str, primary: MariaDBServer, replica: MariaDBServer, config: PipelineConfig, db: str
) -> None:
    table = f"{db}.hook_{point}"
    primary.execute(
        f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(20))",
        f"INSERT INTO {table} SELECT seq, CONCAT('v', seq) FROM {db}.seq_2_to_24_step_2",
    )
    replica.wait_for(primary)
    with connect(config.source) as conn:
        schema = load_schema(conn, db, f"hook_{point}", config.options_for(db, f"hook_{point}"))
        target = next(c for c in split_table(conn, schema, 3) if c.lower == (8,))

    def rows_now() -> list[tuple[Any, ...]]:
        return sorted(_table_rows(replica, schema, target))

    before_dml: list[tuple[Any, ...]] = []

    def hook(at: HookPoint, chunk: Chunk) -> None:
        if at == point and chunk == target:
            before_dml.extend(rows_now())
            primary.execute(*(s.format(t=table) for s in HOOK_DML))
            replica.wait_for(primary)

    result = read_chunk(ChunkTask(config.source, "mariadb", schema, target, hook))
    after_dml = rows_now()
    assert before_dml and before_dml != after_dml
    assert sorted(result.rows) == (before_dml if point == "after_high_watermark" else after_dml), point
    if point != "after_high_watermark":
        assert result.window_events >= len(HOOK_DML), point


def _gtid_servers(server: MariaDBServer) -> set[int]:
    """The server ids of every GTID in the server's binlog (`domain-server-seq` per domain and server)."""
    with server.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_state")
        (state,) = cur.fetchone()
    return {int(g.split("-")[1]) for g in state.split(",") if g}


class ReplicatedWriteInTheFirstWindows:
    """A chunk hook (run on an executor): between the low watermark and the select of the first chunks, an update
    on the primary that the replica applies before the read goes on. Those chunks' windows hold replicated writes
    whatever the writer thread's timing (a snapshot fast enough ended before the writer's first ones reached it)."""

    def __init__(self, primary_socket: str, replica_socket: str, db: str) -> None:
        self.primary, self.replica, self.db = primary_socket, replica_socket, db

    def __call__(self, at: str, chunk: Any) -> None:
        if at != "after_low_watermark" or chunk.index > 2:
            return
        import pymysql

        with pymysql.connect(unix_socket=self.primary, user="root", database=self.db, autocommit=True) as conn:
            with conn.cursor() as cur:
                cur.execute("UPDATE acct SET balance = balance + 1 ORDER BY id LIMIT 3")
                cur.execute("SELECT @@gtid_binlog_pos")
                (position,) = cur.fetchone()
        with pymysql.connect(unix_socket=self.replica, user="root", autocommit=True) as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT MASTER_GTID_WAIT(%s, 60)", (position,))
                assert cur.fetchone() == (0,), f"the replica did not apply {position}"


def test_snapshot_and_stream_from_a_read_only_replica_while_the_primary_takes_writes(
    spark: Any, pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    """Seed 004's read-only mode: watermarks are the replica's own binlog positions and GTIDs, nothing is
    written to any server, and the writes the replica applies during the chunk windows land exactly once."""
    primary, replica = pair
    db = "ro"
    _setup(primary, db)
    primary.execute(f"INSERT INTO {db}.acct SELECT seq, CONCAT('o', seq), seq FROM {db}.seq_41_to_400")
    replica.wait_for(primary)
    replica.execute("SET GLOBAL read_only = ON")  # the replication thread applies, no client may write
    config = parse_config(_pipeline(replica, db, tmp_path))

    stop, done = threading.Event(), [0]
    writer = threading.Thread(target=_writer, args=(primary, db, stop, done))
    writer.start()
    try:
        # The snapshot's windows see the replicated writes.
        hook = ReplicatedWriteInTheFirstWindows(primary.socket, replica.socket, db)
        run(config, spark=spark, until_caught_up=True, hook=hook)
    finally:
        stop.set()
        writer.join()
    assert done[0] > 100, done
    records = StateTable.open(config.sink, config.name).done(f"{db}.acct")
    assert sum(r.window_events for r in records.values()) > 0, "no chunk had replicated writes inside its window"

    replica.wait_for(primary)
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    assert _server_id_of_offset(config) == 22
    with replica.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@read_only")
        assert cur.fetchone() == (1,)
    # Every transaction in the replica's binlog came from the primary: the job wrote nothing there.
    assert _gtid_servers(replica) == {21}


def test_a_replica_that_does_not_log_what_it_applies_is_refused(cdc_password: str, tmp_path: Path) -> None:
    """Without log_slave_updates a replica's binlog holds none of the primary's changes: reading it would
    snapshot the tables and then never see a change. The job refuses it before reading anything."""
    with (
        MariaDBServer(server_id=31) as primary,
        MariaDBServer(server_id=32, extra_args=("--log-slave-updates=OFF",)) as replica,
    ):
        replica.replicate_from(primary)
        primary.create_cdc_user(CDC_USER, cdc_password)
        _setup(primary, "nolog")
        replica.wait_for(primary)
        config = parse_config(_pipeline(replica, "nolog", tmp_path))
        with pytest.raises(SourceError, match=r"a replica with log_slave_updates OFF: .* never reaches its own binlog"):
            discover(config.source, config.tables, config.table_options)
        replica.execute("STOP SLAVE")  # no longer replicating: its binlog is the whole truth again
        assert discover(config.source, config.tables, config.table_options).schemas


def test_failover_while_the_snapshot_runs_reads_the_rest_on_the_replica_and_ends_equal(
    spark: Any, pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    """The primary dies with part of the chunks read (their high watermarks are its positions): the job on the
    promoted replica reads the other chunks there and starts the binlog phase at the primary's chunk highs found
    again by GTID, so the writes made on the primary during the snapshot and on the replica after it all land."""
    primary, replica = pair
    db = "fosnap"
    _setup(primary, db)
    primary.execute(f"INSERT INTO {db}.acct SELECT seq, CONCAT('o', seq), seq FROM {db}.seq_41_to_400")
    on_primary = _pipeline(primary, db, tmp_path)
    on_primary["snapshot"]["chunks_per_commit"] = 4
    config_file = tmp_path / "primary.yaml"
    config_file.write_text(yaml.safe_dump(on_primary))

    stop, done = threading.Event(), [0]
    writer = threading.Thread(target=_writer, args=(primary, db, stop, done))
    writer.start()
    try:
        crashed = run_ingest(
            "run", "--config", str(config_file), "--until-caught-up", crash_at="snapshot.after_state:3"
        )
    finally:
        stop.set()
        writer.join()
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert done[0] > 0
    config = parse_config(on_primary)
    read_on_primary = StateTable.open(config.sink, config.name).done(f"{db}.acct")
    plan = StateTable.open(config.sink, config.name).plan(f"{db}.acct")
    assert plan is not None and 0 < len(read_on_primary) < len(plan)

    primary.execute(f"UPDATE {db}.acct SET owner = 'last on the primary' WHERE id > 390")
    replica.wait_for(primary)
    primary.stop()
    replica.promote()
    # A key of a chunk read on the primary: its change reaches the target through the binlog phase, once, and is
    # in the changelog (a key of a chunk still unread would come with that chunk's read, as snapshot rows do).
    with replica.admin(db) as conn, conn.cursor() as cur:
        for chunk in sorted((c for c in plan if c.index in read_on_primary), key=lambda c: c.index):
            cur.execute(
                "SELECT MIN(id) FROM acct WHERE id >= %s AND id < %s",
                (chunk.lower[0] if chunk.lower else 0, chunk.upper[0] if chunk.upper else 1 << 30),
            )
            (moved,) = cur.fetchone()
            if moved is not None:
                break
        assert moved is not None
        cur.execute("UPDATE acct SET owner = 'on the replica' WHERE id = %s", (moved,))
    replica.execute(f"INSERT INTO {db}.acct VALUES (1000, 'on the replica', 3)", f"DELETE FROM {db}.tag WHERE n > 5")

    config_on_replica = parse_config(_pipeline(replica, db, tmp_path))
    run(config_on_replica, spark=spark, until_caught_up=True)
    assert verify(config_on_replica)
    state = StateTable.open(config_on_replica.sink, config_on_replica.name)
    assert state.times_recorded(f"{db}.acct") == {c.index: 1 for c in plan}
    servers = Counter(r.high_watermark.server_id for r in state.done(f"{db}.acct").values())
    assert set(servers) == {21, 22}, servers  # some chunks were read on each server
    assert _server_id_of_offset(config_on_replica) == 22
    logged = load_pyiceberg_catalog(config.sink).load_table((db, "acct_changelog")).scan().to_arrow().to_pylist()
    assert Counter((r["_op"], r["id"]) for r in logged if r["owner"] == "on the replica") == Counter([("+U", moved)])


def test_gtid_points_are_found_in_a_busy_binlog(mariadb: MariaDBServer, tmp_path: Path) -> None:
    """`locate` streams by GTID from the lowest point to the highest. A non-blocking GTID dump is reset by
    MariaDB part-way through a busy binlog and the library reconnected from the start, forever: the job hung
    at its first run after a failover. Each point found must be where the server's own BINLOG_GTID_POS says
    that GTID position is; a point at the binlog's end is found without a later event to see."""
    db = "busylocate"
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT, v INT)")
    with mariadb.admin(db) as conn, conn.cursor() as cur:
        for i in range(12_000):  # one transaction each
            cur.execute("INSERT INTO t VALUES (%s, %s)", (i % 100, i))
        cur.execute("SELECT @@gtid_binlog_pos")
        (end,) = cur.fetchone()
    last = MariadbGtidPos.parse(str(end))
    domain, server, top = last.entries[0].domain_id, last.entries[0].server_id, last.entries[0].seq_no
    points = [MariadbGtidPos.parse(f"{domain}-{server}-{n}") for n in (top - 11_000, top - 5_000, top - 10, top)]
    config = parse_config(
        {
            "name": db,
            "source": source_section(mariadb),
            "tables": {"include": [rf"{db}\..*"]},
            "sink": embedded_sink(tmp_path),
        }
    )
    with connect(config.source) as conn:
        found = locate(conn, config.source, points)
        with conn.cursor() as cur:
            for point, position in zip(points, found, strict=True):
                cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (position.file, position.pos))
                (at,) = cur.fetchone()
                assert MariadbGtidPos.parse(str(at)) == point, (point, position, at)
