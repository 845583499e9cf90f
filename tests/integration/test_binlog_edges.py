"""The binlog phase's edges: server settings it must refuse, a purged binlog, DDL, idle tables, Iceberg
maintenance (compaction and snapshot expiry) between batches."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

from ingest import metrics
from ingest.commands.resnapshot import resnapshot
from ingest.commands.status import binlog_status
from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import BinlogPurgedError, SinkError, SourceError
from ingest.faults import FAIL_ENV, InjectedFailure
from ingest.faults import reset as reset_fault_counts
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.maintenance import MAINTAINED_AT, RETAIN_LAST, SUMMARY_MAINTENANCE, commits_since_compaction
from ingest.sink.summary import SUMMARY_PIPELINE, SUMMARY_STREAM_OFFSET
from ingest.source.binlog.reader import SchemaChangeError, open_stream, table_maps
from ingest.source.mysql import connect
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable
from tests.certificates import certificates
from tests.conftest import embedded_sink, source_section

pytestmark = pytest.mark.integration


def _setup(
    mariadb: MariaDBServer,
    db: str,
    tmp_path: Path,
    catalog: str,
    tables: str = "t",
    maintenance: dict[str, Any] | None = None,
    changelog: bool = False,
    one_commit: bool = True,
    **stream: Any,
) -> PipelineConfig:
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id INT NOT NULL PRIMARY KEY, v VARCHAR(20), n INT)",
        f"CREATE TABLE {db}.other (id INT NOT NULL PRIMARY KEY, v INT)",
        f"INSERT INTO {db}.t SELECT seq, CONCAT('v', seq), seq FROM {db}.seq_1_to_200",
    )
    sink = embedded_sink(tmp_path)
    sink["catalog_name"] = catalog
    if maintenance is not None:
        sink["maintenance"] = maintenance
    sink["changelog"] = changelog
    sink["one_commit"] = one_commit
    return parse_config(
        {
            "name": db,
            "source": source_section(mariadb),
            "tables": {"include": [rf"{db}\.{tables}"]},
            "sink": sink,
            "snapshot": {"chunk_size": 50},
            "stream": {"batch_interval_seconds": 1, **stream},
        }
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("binlog_format", "STATEMENT", "binlog_format is STATEMENT; CDC needs ROW"),
        ("binlog_format", "MIXED", "binlog_format is MIXED; CDC needs ROW"),
        ("binlog_row_image", "MINIMAL", "binlog_row_image is MINIMAL; CDC needs FULL"),
        ("binlog_row_image", "NOBLOB", "binlog_row_image is NOBLOB; CDC needs FULL"),
    ],
)
def test_server_settings_that_would_lose_data_are_refused(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, variable: str, value: str, message: str
) -> None:
    config = _setup(mariadb, "settings", tmp_path, "settings_lake")
    mariadb.execute(f"SET GLOBAL {variable} = '{value}'")
    try:
        with pytest.raises(SourceError, match=message):
            run(config, spark=spark, until_caught_up=True)
    finally:
        mariadb.execute(f"SET GLOBAL {variable} = '{'ROW' if variable == 'binlog_format' else 'FULL'}'")


@pytest.mark.parametrize(
    ("db", "variable", "value", "refusal"),
    [
        # Columns missing from an event must not be written as NULLs.
        ("minimal", "binlog_row_image", "MINIMAL", r"lacks columns .* binlog_row_image must be FULL"),
        # The global setting is still ROW: only the statement in the binlog tells.
        (
            "stmtlog",
            "binlog_format",
            "STATEMENT",
            r"stmtlog\.t: the change at .* logged as SQL text.*ingest resnapshot",
        ),
    ],
    ids=["minimal-row-image", "statement-format"],
)
def test_a_writer_session_overriding_the_binlog_settings_stops_the_job_instead_of_losing_its_change(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, db: str, variable: str, value: str, refusal: str
) -> None:
    config = _setup(mariadb, db, tmp_path, f"{db}_lake")
    run(config, spark=spark, until_caught_up=True)
    with mariadb.admin(db) as conn, conn.cursor() as cur:
        cur.execute(f"SET SESSION {variable} = '{value}'")
        cur.execute("UPDATE t SET n = -1 WHERE id BETWEEN 3 AND 5")
    with pytest.raises(SourceError, match=refusal):
        run(config, spark=spark, until_caught_up=True)
    assert not verify(config)  # nothing was written: the update is missing, and the job says so


def purge_binlogs(mariadb: MariaDBServer) -> None:
    """Start a new binlog file and purge every older one (the job's offset with them)."""
    mariadb.execute("FLUSH BINARY LOGS")
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        current = cur.fetchone()[0]
        # MariaDB keeps a file until InnoDB's binlog checkpoint has passed it: ask again until it is gone.
        for _ in range(80):
            cur.execute("FLUSH ENGINE LOGS")
            cur.execute(f"PURGE BINARY LOGS TO '{current}'")
            cur.execute("SHOW BINARY LOGS")
            if cur.fetchone()[0] == current:
                break
            time.sleep(0.25)
        else:
            pytest.fail("the server did not purge its old binlogs")


def test_a_purged_binlog_stops_the_job_with_the_recovery_path(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    config = _setup(mariadb, "purged", tmp_path, "purged_lake")
    run(config, spark=spark, snapshot_only=True)
    mariadb.execute("UPDATE purged.t SET n = -1 WHERE id = 2")
    run(config, spark=spark, until_caught_up=True)
    assert StateTable.open(config.sink, config.name).stream_offset() is not None  # the job's offset, soon purged
    mariadb.execute("UPDATE purged.t SET n = 0 WHERE id = 1")
    purge_binlogs(mariadb)
    with pytest.raises(BinlogPurgedError, match=r"is no longer on the server .*`ingest resnapshot --config"):
        run(config, spark=spark, until_caught_up=True)
    # The way out the error names: snapshot every table again; the job starts over from their new chunks.
    assert resnapshot(config, ["purged.t"]).branched == ("purged.t",)
    assert StateTable.open(config.sink, config.name).stream_offset() is None
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)


def test_ddl_on_a_captured_table_stops_the_job_naming_the_statement(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    config = _setup(mariadb, "ddl", tmp_path, "ddl_lake", on_schema_change="fail")
    run(config, spark=spark, until_caught_up=True)
    mariadb.execute("UPDATE ddl.t SET n = -7 WHERE id = 7")
    run(config, spark=spark, until_caught_up=True)
    committed = StateTable.open(config.sink, config.name).stream_offset()
    assert committed is not None
    mariadb.execute("ALTER TABLE ddl.t ADD COLUMN extra INT DEFAULT 5", "UPDATE ddl.t SET n = -8 WHERE id = 8")
    with pytest.raises(
        SchemaChangeError,
        match=r"the schema of ddl.t changed at binlog position \S+:\d+: 'ALTER TABLE ddl.t ADD COLUMN extra.*is `fail`",
    ):
        run(config, spark=spark, until_caught_up=True)
    assert StateTable.open(config.sink, config.name).stream_offset() == committed  # nothing after the DDL was applied


def test_a_change_older_than_the_live_schema_is_decoded_with_the_schema_the_target_mirrors(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    config = _setup(mariadb, "ddl2", tmp_path, "ddl2_lake")
    run(config, spark=spark, until_caught_up=True)
    # The job is down while a change and then a DDL happen: at restart the live schema is already the new one,
    # but the change before the DDL is decoded with the schema stored in the target, and committed.
    mariadb.execute(
        "UPDATE ddl2.t SET n = -7 WHERE id = 7",
        "ALTER TABLE ddl2.t DROP COLUMN v",
        "UPDATE ddl2.t SET n = -8 WHERE id = 8",
    )
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    table = load_pyiceberg_catalog(config.sink).load_table(("ddl2", "t"))
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert (rows[7]["n"], rows[8]["n"]) == (-7, -8) and "v" not in rows[7]


def test_a_change_older_than_the_loaded_schema_is_refused_not_misread(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    # With `ignore` the job decodes with the live schema; a row written before the DDL must not be misread.
    config = _setup(mariadb, "ddl3", tmp_path, "ddl3_lake", on_schema_change="ignore")
    run(config, spark=spark, until_caught_up=True)
    mariadb.execute("UPDATE ddl3.t SET n = -7 WHERE id = 7", "ALTER TABLE ddl3.t DROP COLUMN v")
    with pytest.raises(SchemaChangeError, match=r"a binlog row of ddl3.t .* has columns .* but the job expects"):
        run(config, spark=spark, until_caught_up=True)


def test_idle_captured_tables_still_move_the_offset(spark: Any, mariadb: MariaDBServer, tmp_path: Path) -> None:
    config = _setup(mariadb, "idle", tmp_path, "idle_lake")
    run(config, spark=spark, until_caught_up=True)
    # The first run had nothing to stream after its copy (the server's end is where the targets are): it says so,
    # the job's last look at its progress and `ingest status` giving a lag of 0, not "unknown".
    assert metrics.latest().progress().lag is not None
    status = binlog_status(config, StateTable.open(config.sink, config.name))
    assert status["caught_up"] is True and status["lag_seconds"] == 0.0, status
    mariadb.execute(*(f"INSERT INTO idle.other VALUES ({i}, {i})" for i in range(50)))  # not captured
    with connect(config.source) as conn:
        goal = read_watermark(conn, "mariadb").position
    run(config, spark=spark, until_caught_up=True)
    offset = StateTable.open(config.sink, config.name).stream_offset()
    assert offset is not None and offset.position >= goal


def test_compaction_and_expiry_down_to_one_snapshot_do_not_lose_the_offset(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    config = _setup(mariadb, "maint", tmp_path, "maint_lake")
    run(config, spark=spark, until_caught_up=True)
    for i in range(3):
        mariadb.execute(f"UPDATE maint.t SET n = n + 1 WHERE id % 3 = {i}", f"DELETE FROM maint.t WHERE id = {10 + i}")
        run(config, spark=spark, until_caught_up=True)
    spark.sql("CALL maint_lake.system.rewrite_data_files(table => 'maint.t', options => map('min-input-files', '1'))")
    spark.sql(
        "CALL maint_lake.system.expire_snapshots(table => 'maint.t', older_than => TIMESTAMP '2999-01-01', "
        "retain_last => 1)"
    )
    mariadb.execute("UPDATE maint.t SET v = 'after' WHERE id < 20", "INSERT INTO maint.t VALUES (500, 'x', 1)")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)


def test_an_insert_batch_committed_before_a_failure_is_not_appended_again_when_expiry_hid_its_offset(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target committed a batch of inserts, the job failed before the state table recorded it, and then
    compaction and expiry down to one snapshot removed every snapshot naming the batch's offset. The restart
    replays the batch from the state table's offset and cannot tell that the target holds it: it must MERGE
    it (idempotent), never append it (which would duplicate every row). Table by table (`sink.one_commit: false`,
    and catalogs that cannot commit tables together): one commit of the batch and its offset leaves no such gap."""
    config = _setup(mariadb, "maintfail", tmp_path, "maintfail_lake", one_commit=False)
    run(config, spark=spark, until_caught_up=True)
    mariadb.execute("INSERT INTO maintfail.t SELECT seq, 'new', seq FROM maintfail.seq_1000_to_1099")
    reset_fault_counts()
    monkeypatch.setenv(FAIL_ENV, "stream.after_table_commit:1")
    with pytest.raises(InjectedFailure):
        run(config, spark=spark, until_caught_up=True)
    monkeypatch.delenv(FAIL_ENV)
    assert spark.sql("SELECT count(*) FROM maintfail_lake.maintfail.t").collect()[0][0] == 300  # the batch is in
    spark.sql(
        "CALL maintfail_lake.system.rewrite_data_files(table => 'maintfail.t', options => map('min-input-files', '1'))"
    )
    spark.sql(
        "CALL maintfail_lake.system.expire_snapshots(table => 'maintfail.t', older_than => TIMESTAMP '2999-01-01', "
        "retain_last => 1)"
    )
    run(config, spark=spark, until_caught_up=True)
    assert spark.sql("SELECT count(*) FROM maintfail_lake.maintfail.t").collect()[0][0] == 300
    assert verify(config)


def test_the_job_compacts_and_expires_its_targets_so_many_small_commits_keep_files_and_snapshots_bounded(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """FAILURES.md "Many small commits": each batch adds data and delete files and a snapshot; the job's own
    maintenance (every 3 commits here) keeps their number bounded, and the rewrites keep the offset."""
    db = "upkeep"
    config = _setup(
        mariadb,
        db,
        tmp_path,
        "upkeep_lake",
        maintenance={"every_commits": 3, "expire_after_hours": 0},
        changelog=True,
        batch_max_changes=1,
    )
    run(config, spark=spark, until_caught_up=True)
    for i in range(7):  # seven transactions, each its own batch: an update of 20 rows, a delete, an insert
        mariadb.execute(
            f"UPDATE {db}.t SET n = n + 1 WHERE id BETWEEN {i * 20 + 1} AND {i * 20 + 20}",
            f"DELETE FROM {db}.t WHERE id = {150 + i}",
            f"INSERT INTO {db}.t VALUES ({1000 + i}, 'new', {i})",
        )
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)

    table = load_pyiceberg_catalog(config.sink).load_table((db, "t"))
    snapshots = table.snapshots()
    rewrites = [
        s for s in snapshots if s.summary is not None and SUMMARY_MAINTENANCE in s.summary.additional_properties
    ]
    assert rewrites, "the job never compacted its target"
    # 21 batches (without upkeep, measured: 22 snapshots and 16 data files; Iceberg keeps delete files at 2 itself).
    assert len(snapshots) <= RETAIN_LAST + 3
    summary = table.current_snapshot().summary.additional_properties
    assert int(summary["total-data-files"]) <= 4 and int(summary["total-delete-files"]) <= 3, summary
    # Each batch's commit adds a manifest, which a reader's planning opens; the rewrite merges them.
    assert len(table.current_snapshot().manifests(table.io)) <= 4
    # A rewrite carries the offset of the commit below it, so expiry that keeps only the rewrite keeps the offset.
    by_id = {s.snapshot_id: s for s in snapshots}
    below = rewrites[-1]
    while below.summary is not None and SUMMARY_MAINTENANCE in below.summary.additional_properties:
        below = by_id[below.parent_snapshot_id]
    for rewrite in rewrites:
        assert rewrite.summary.additional_properties[SUMMARY_PIPELINE] == config.name
    offset_of = [s.summary.additional_properties[SUMMARY_STREAM_OFFSET] for s in (rewrites[-1], below)]
    assert offset_of[0] == offset_of[1]
    # The changelog table, append-only, gets the same upkeep.
    changelog = load_pyiceberg_catalog(config.sink).load_table((db, "t_changelog"))
    logged = [s.summary.additional_properties for s in changelog.snapshots() if s.summary is not None]
    assert any(SUMMARY_MAINTENANCE in props for props in logged)
    assert len(logged) <= RETAIN_LAST + 3
    assert int(changelog.current_snapshot().summary.additional_properties["total-data-files"]) <= 4
    # Each table's last maintenance marks the snapshot it ended at, so a new run counts commits from there: one
    # that rewrote nothing commits no snapshot, and a count back to the last rewrite would maintain it again at
    # once, run after run.
    for maintained in (table, changelog):
        assert maintained.properties[MAINTAINED_AT] in {str(s.snapshot_id) for s in maintained.snapshots()}
        assert commits_since_compaction(maintained, 50) < 3


def test_a_dropped_target_is_named_and_one_table_is_snapshotted_again_while_the_other_streams(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "again"
    config = _setup(mariadb, db, tmp_path, "again_lake", tables="(t|other)")
    mariadb.execute(f"INSERT INTO {db}.other SELECT seq, seq FROM {db}.seq_1_to_30")
    run(config, spark=spark, until_caught_up=True)
    mariadb.execute(f"UPDATE {db}.t SET n = -1 WHERE id < 5", f"UPDATE {db}.other SET v = -1 WHERE id < 5")
    run(config, spark=spark, until_caught_up=True)
    offset = StateTable.open(config.sink, config.name).stream_offset()
    assert offset is not None

    load_pyiceberg_catalog(config.sink).purge_table((db, "t"))  # a target dropped by hand
    mariadb.execute(f"DELETE FROM {db}.t WHERE id > 190", f"DELETE FROM {db}.other WHERE id > 25")
    with pytest.raises(SinkError, match=r"records 4 chunks copied, but the target .* did not exist.*ingest resnapshot"):
        run(config, spark=spark, until_caught_up=True)

    # The failed run created the target again, empty: readers have nothing to keep, so it is dropped.
    assert resnapshot(config, [f"{db}.t"]).dropped == (f"{db}.t",)
    assert StateTable.open(config.sink, config.name).stream_offset() == offset  # `other` still holds what it says
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)


def _tls_config(server: MariaDBServer, db: str, tmp_path: Path, tls: dict[str, str]) -> PipelineConfig:
    return parse_config(
        {
            "name": db,
            "source": {**source_section(server), "tls": tls},
            "tables": {"include": [rf"{db}\.t"]},
            "sink": {**embedded_sink(tmp_path), "catalog_name": f"{db}_lake"},
            "snapshot": {"chunk_size": 50},
        }
    )


def test_tls_is_used_by_every_connection_and_a_server_without_it_is_refused(
    spark: Any, mariadb: MariaDBServer, cdc_password: str, tmp_path: Path
) -> None:
    """FAILURES.md "Security": TLS when asked, on the binlog streams too, and never a silent plaintext fallback."""
    plain = _tls_config(mariadb, "tlsplain", tmp_path, {"mode": "required"})
    refusal = r"did not take TLS, and tls.mode is required: not connecting in plaintext"
    with pytest.raises(SourceError, match=refusal):
        connect(plain.source)
    with mariadb.admin() as conn:
        now = read_watermark(conn, "mariadb").position
    stream = open_stream(plain.source, now, 99)
    with pytest.raises(SourceError, match=refusal):
        next(iter(stream))
    stream.close()

    ca, cert, key = certificates(tmp_path / "tls")
    with MariaDBServer(server_id=3, extra_args=(f"--ssl-ca={ca}", f"--ssl-cert={cert}", f"--ssl-key={key}")) as server:
        server.create_cdc_user("cdc", cdc_password)
        server.execute("ALTER USER 'cdc'@'%' REQUIRE SSL")  # any plaintext connection of the job is refused
        server.execute(
            "CREATE DATABASE tlsdb",
            "CREATE TABLE tlsdb.t (id INT NOT NULL PRIMARY KEY, v VARCHAR(20), n INT)",
            "INSERT INTO tlsdb.t SELECT seq, CONCAT('v', seq), seq FROM tlsdb.seq_1_to_200",
        )
        config = _tls_config(server, "tlsdb", tmp_path, {"mode": "verify_ca", "ca_file": str(ca)})
        run(config, spark=spark, snapshot_only=True)  # the chunk reads
        server.execute("UPDATE tlsdb.t SET n = -1 WHERE id < 10", "DELETE FROM tlsdb.t WHERE id > 190")
        run(config, spark=spark, until_caught_up=True)  # the binlog stream
        assert verify(config)


def test_table_maps_parsed_once_decode_every_row_as_a_full_parse_does(
    mariadb: MariaDBServer, tmp_path: Path, row_metadata: str
) -> None:
    """The table-map cache (source/table_maps.py) against the library's own parse of the same binlog: two
    tables, many small transactions, an ALTER in between (a new table id and columns). Table maps without
    column names (NO_LOG) are cached as well: the library is never asked to look names up."""
    config = _setup(mariadb, "tmaps", tmp_path, "tmaps_lake")
    with mariadb.admin() as conn, conn.cursor() as cur:
        start = read_watermark(conn, "mariadb").position
        for i in range(30):
            cur.execute(f"UPDATE tmaps.t SET n = n + {i + 1} WHERE id = {1 + i % 5}")
            cur.execute(f"INSERT INTO tmaps.other VALUES ({i}, {i})")
            if i == 15:
                cur.execute("ALTER TABLE tmaps.t ADD COLUMN extra VARCHAR(9) DEFAULT 'x' AFTER v")

    def read(cached: bool) -> list[tuple[str, list[dict[str, Any]]]]:
        table_maps.TableMapEvent.__init__ = table_maps._init if cached else table_maps._parse
        stream = open_stream(config.source, start, 4242, only_events=[WriteRowsEvent, UpdateRowsEvent])
        try:
            return [(f"{e.schema}.{e.table}", e.rows) for e in stream]
        finally:
            stream.close()
            table_maps.install()

    before = dict(table_maps.stats)
    full, cached = read(False), read(True)
    assert table_maps.stats["reused"] - before["reused"] >= 50  # most of the 60 transactions' table maps
    assert cached == full and len(full) == 60
    assert len(full[-2][1][0]["after_values"]) == 4 and len(full[0][1][0]["after_values"]) == 3
    assert ("extra" in full[-2][1][0]["after_values"]) == (row_metadata == "FULL")
