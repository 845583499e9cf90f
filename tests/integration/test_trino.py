"""The tables as Trino sees them: a real Trino server (ingest/devservers/trino.py) reads what the job wrote on
the S3 profile (MinIO through Trino's native S3 file system, the same PostgreSQL JDBC catalog), and every
row is compared with MySQL's, not counted."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from trino.exceptions import TrinoExternalError

from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import PostgresServer
from ingest.devservers.rest_catalog import RestCatalogServer
from ingest.devservers.trino import TrinoServer
from ingest.query.pipeline import run
from ingest.sink import position_deletes
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.maintenance import SUMMARY_MAINTENANCE
from ingest.sink.summary import SUMMARY_STREAM_OFFSET
from ingest.state.table import StateTable
from tests.conftest import minio_sink, mysql_rows, rest_sink, run_ingest, source_section
from tests.type_cases import check_iceberg_rows, create_types_table

pytestmark = pytest.mark.integration

BUCKET = "trino"
CATALOG = "s3lake"  # minio_sink's catalog name: Trino's catalog reads the same name in the JDBC catalog
REST_CATALOG = "rest"

# The Trino type each MySQL type of tests/type_cases.py arrives as (docs/types.md, "Read with Trino").
TRINO_TYPES = {
    "id": "integer",
    "bu": "decimal(20,0)",
    "iu": "bigint",
    "ti1": "integer",
    "yr": "integer",
    "d65": "varchar",
    "d10": "decimal(10,2)",
    "b1": "boolean",
    "b8": "bigint",
    "b64": "decimal(20,0)",
    "e": "varchar",
    "st": "varchar",
    "j": "varchar",
    "bl": "varbinary",
    "tx": "varchar",
    "vb": "varbinary",
    "ch": "varchar",
    "emo": "varchar",
    "dt6": "timestamp(6)",
    "dt3": "timestamp(6)",
    "ts6": "timestamp(6) with time zone",
    "d": "date",
    "tm3": "varchar",
    "tm": "varchar",
    "f": "real",
    "db": "double",
    "g": "varbinary",
    "zd": "date",
    "zdt": "timestamp(6)",
    "zts": "timestamp(6) with time zone",
    "u": "varchar",
    "i4": "varchar",
    "i6": "varchar",
}


@pytest.fixture(scope="module")
def trino(minio: MinioServer, postgres: PostgresServer, rest_catalog: RestCatalogServer) -> Iterator[TrinoServer]:
    minio.bucket(BUCKET)
    s3 = {
        "fs.native-s3.enabled": "true",
        "s3.endpoint": minio.endpoint,
        "s3.path-style-access": "true",
        "s3.region": minio.region,
        "s3.aws-access-key": minio.access_key,
        "s3.aws-secret-key": minio.secret_key,
    }
    lake = {
        "connector.name": "iceberg",
        "iceberg.catalog.type": "jdbc",
        "iceberg.jdbc-catalog.driver-class": "org.postgresql.Driver",
        "iceberg.jdbc-catalog.connection-url": postgres.jdbc_url,
        "iceberg.jdbc-catalog.connection-user": postgres.user,
        "iceberg.jdbc-catalog.connection-password": postgres.password,
        "iceberg.jdbc-catalog.catalog-name": CATALOG,
        "iceberg.jdbc-catalog.default-warehouse-dir": f"s3://{BUCKET}/warehouse",
        **s3,
    }
    rest = {
        "connector.name": "iceberg",
        "iceberg.catalog.type": "rest",
        "iceberg.rest-catalog.uri": rest_catalog.uri,
        **s3,
    }
    with TrinoServer({CATALOG: lake, REST_CATALOG: rest}) as server:
        yield server


def _config(
    mariadb: MariaDBServer, minio: MinioServer, postgres: PostgresServer, db: str, **extra: Any
) -> PipelineConfig:
    sink = {**minio_sink(minio, postgres, BUCKET), "state_table": f"ingest_meta.state_{db}"}
    sink.update(extra.pop("sink", {}))
    return parse_config(
        {
            "name": db,
            "source": source_section(mariadb),
            "tables": {"include": [rf"{db}\..*"]},
            "sink": sink,
            "snapshot": {"chunk_size": 100, "parallelism": 2, "chunks_per_commit": 4},
            "stream": {"batch_interval_seconds": 60},
            **extra,
        }
    )


def _trino_rows(
    trino: TrinoServer, table: str, key: str, version: int | None = None, catalog: str = CATALOG
) -> list[dict[str, Any]]:
    as_of = f" FOR VERSION AS OF {version}" if version is not None else ""
    return trino.query(f"SELECT * FROM {catalog}.{table}{as_of} ORDER BY {key}")


def _stream_snapshots(trino: TrinoServer, table: str) -> list[tuple[int, str]]:
    """(snapshot id, binlog offset) of each batch the job committed to a target, oldest first: the query
    docs/querying.md gives for time travel to a binlog offset."""
    namespace, name = table.split(".")
    rows = trino.query(
        f"SELECT snapshot_id, element_at(summary, '{SUMMARY_STREAM_OFFSET}') AS binlog_offset "
        f'FROM {CATALOG}.{namespace}."{name}$snapshots" '
        f"WHERE element_at(summary, '{SUMMARY_STREAM_OFFSET}') IS NOT NULL "
        f"AND element_at(summary, '{SUMMARY_MAINTENANCE}') IS NULL ORDER BY committed_at"
    )
    return [(r["snapshot_id"], r["binlog_offset"]) for r in rows]


def test_every_type_case_reads_through_trino_with_its_exact_value(
    spark: Any, trino: TrinoServer, mariadb: MariaDBServer, minio: MinioServer, postgres: PostgresServer
) -> None:
    db = "trtypes"
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    with mariadb.admin() as conn:
        create_types_table(conn, f"{db}.types")
    run(_config(mariadb, minio, postgres, db), spark=spark, snapshot_only=True)
    described = {r["Column"]: r["Type"] for r in trino.query(f"DESCRIBE {CATALOG}.{db}.types")}
    assert described == TRINO_TYPES
    rows = _trino_rows(trino, f"{db}.types", "id")
    assert check_iceberg_rows(rows) == []


def test_binlog_merges_compaction_and_expiry_in_format_v2_read_equal_to_mysql_and_travel_back(
    spark: Any, trino: TrinoServer, mariadb: MariaDBServer, minio: MinioServer, postgres: PostgresServer
) -> None:
    db = "trmerge"
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.acct (id INT NOT NULL PRIMARY KEY, owner VARCHAR(20), balance DECIMAL(12,2), "
        "opened DATETIME(6))",
        f"INSERT INTO {db}.acct SELECT seq, CONCAT('o', seq), seq * 1.5, "
        f"TIMESTAMP('2026-01-01') + INTERVAL seq SECOND FROM {db}.seq_1_to_400",
    )
    # Compaction after every second commit, expiry of everything but the newest 10 snapshots.
    maintenance = {"every_commits": 2, "expire_after_hours": 0}
    config = _config(
        mariadb,
        minio,
        postgres,
        db,
        sink={"format_version": 2, "maintenance": maintenance},
        # As users partition big tables: by time, and by the key
        table_options={f"{db}.acct": {"partition_by": ["days(opened)", "bucket(4, id)"]}},
    )
    run(config, spark=spark, snapshot_only=True)
    rounds = [
        [
            f"UPDATE {db}.acct SET balance = balance + 10 WHERE id % 7 = 0",
            f"DELETE FROM {db}.acct WHERE id BETWEEN 100 AND 120",
            f"UPDATE {db}.acct SET id = id + 1000 WHERE id BETWEEN 200 AND 205",  # primary keys move
        ],
        [
            f"INSERT INTO {db}.acct VALUES (100, 'back', 1.00, '2026-06-01 12:00:00.000001')",
            f"DELETE FROM {db}.acct WHERE id = 7",
        ],
        [f"UPDATE {db}.acct SET owner = NULL WHERE id % 11 = 0", f"UPDATE {db}.acct SET id = 7 WHERE id = 1201"],
    ]
    states = []
    for statements in rounds:
        mariadb.execute(*statements)
        run(config, spark=spark, until_caught_up=True)
        states.append(mysql_rows(mariadb, f"{db}.acct", "id"))
        assert _trino_rows(trino, f"{db}.acct", "id") == states[-1]

    loaded = load_pyiceberg_catalog(config.sink).load_table((db, "acct"))
    summaries = [s.summary.additional_properties for s in loaded.snapshots() if s.summary is not None]
    assert any(SUMMARY_MAINTENANCE in props for props in summaries), "never compacted"
    # Time travel: the snapshot of the offset each catch-up committed holds MySQL as it was then.
    batches = _stream_snapshots(trino, f"{db}.acct")
    assert len(batches) == len(rounds)
    for (snapshot_id, _), state in zip(batches, states, strict=True):
        assert _trino_rows(trino, f"{db}.acct", "id", version=snapshot_id) == state
    offset = StateTable.open(config.sink, config.name).stream_offset()
    assert offset is not None and f'"{offset.position}"' in batches[-1][1]
    _assert_read_at_the_cut(trino, CATALOG, db, states[-1])


def _assert_read_at_the_cut(trino: TrinoServer, catalog: str, db: str, expected: list[dict[str, Any]]) -> None:
    """The cut, found in the state table with docs/querying.md's query, read with FOR VERSION AS OF: MySQL's rows."""
    cut = trino.query(
        f"SELECT table_id, iceberg_table, target_snapshot_id FROM {catalog}.ingest_meta.state_{db} "
        f"WHERE pipeline = '{db}' AND kind = 'cut'"
    )
    assert [(r["table_id"], r["iceberg_table"]) for r in cut] == [(f"{db}.acct", f"{db}.acct")]
    assert _trino_rows(trino, f"{db}.acct", "id", cut[0]["target_snapshot_id"], catalog) == expected


def test_schema_evolution_reads_equal_to_mysql(
    spark: Any,
    trino: TrinoServer,
    mariadb: MariaDBServer,
    minio: MinioServer,
    postgres: PostgresServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = "trddl"
    # Its 51 rows would be written again with each batch's as the target's one small file: deletes by position
    # instead, for Trino to apply.
    monkeypatch.setattr(position_deletes, "TAIL_BYTES", 0)
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.item (id INT NOT NULL PRIMARY KEY, qty INT, name VARCHAR(10))",
        f"INSERT INTO {db}.item SELECT seq, seq, CONCAT('n', seq) FROM {db}.seq_1_to_50",
    )
    # Its batches by position (ingest/sink/position_deletes.py): delete files Trino applies, after a widening too.
    config = _config(mariadb, minio, postgres, db, stream={"batch_interval_seconds": 60, "driver_apply_max_rows": 1})
    run(config, spark=spark, snapshot_only=True)
    # One DDL per catch-up: the job follows a DDL while it runs (docs/config.md#schema-changes).
    mariadb.execute(
        f"ALTER TABLE {db}.item ADD COLUMN added DATE",
        f"UPDATE {db}.item SET added = '2026-11-25' WHERE id % 5 = 0",
    )
    run(config, spark=spark, until_caught_up=True)
    mariadb.execute(
        f"ALTER TABLE {db}.item MODIFY qty BIGINT",  # widened: int -> long in Iceberg
        f"UPDATE {db}.item SET qty = qty * 10000000000 WHERE id % 5 = 0",
        f"INSERT INTO {db}.item VALUES (51, 1, 'late', '2026-11-26')",
    )
    run(config, spark=spark, until_caught_up=True)
    described = {r["Column"]: r["Type"] for r in trino.query(f"DESCRIBE {CATALOG}.{db}.item")}
    assert described == {"id": "integer", "qty": "bigint", "name": "varchar", "added": "date"}
    assert _trino_rows(trino, f"{db}.item", "id") == mysql_rows(mariadb, f"{db}.item", "id")
    assert _trino_rows(trino, f"{db}.item", "id")[4]["added"] == dt.date(2026, 11, 25)
    assert _position_delete_files(trino, CATALOG, f"{db}.item") > 0


def _position_delete_files(trino: TrinoServer, catalog: str, table: str) -> int:
    namespace, name = table.split(".")
    return int(trino.query(f'SELECT count(*) AS n FROM {catalog}.{namespace}."{name}$files" WHERE content = 1')[0]["n"])


def test_format_v3_reads_until_the_first_deletion_vector_which_this_trino_refuses(
    spark: Any, trino: TrinoServer, mariadb: MariaDBServer, minio: MinioServer, postgres: PostgresServer
) -> None:
    """Trino 476 (the newest on Maven Central) has no reader of Iceberg v3 deletion vectors: it must refuse
    such a table, never return rows that were deleted (docs/querying.md says so)."""
    db = "trv3"
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.acct (id INT NOT NULL PRIMARY KEY, owner VARCHAR(20))",
        f"INSERT INTO {db}.acct SELECT seq, CONCAT('o', seq) FROM {db}.seq_1_to_200",
    )
    config = _config(mariadb, minio, postgres, db, sink={"format_version": 3})
    run(config, spark=spark, snapshot_only=True)
    assert _trino_rows(trino, f"{db}.acct", "id") == mysql_rows(mariadb, f"{db}.acct", "id")
    mariadb.execute(f"DELETE FROM {db}.acct WHERE id <= 10", f"UPDATE {db}.acct SET owner = 'x' WHERE id = 50")
    run(config, spark=spark, until_caught_up=True)
    with pytest.raises(TrinoExternalError, match="ICEBERG_BAD_DATA.*Unexpected PUFFIN file format"):
        _trino_rows(trino, f"{db}.acct", "id")


def test_the_rest_catalog_profile_reads_equal_to_mysql_through_trino_status_and_verify(
    spark: Any, trino: TrinoServer, mariadb: MariaDBServer, minio: MinioServer, rest_catalog: RestCatalogServer,
    tmp_path: Path,
) -> None:  # fmt: skip
    db = "trrest"
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.acct (id INT NOT NULL PRIMARY KEY, owner VARCHAR(20), balance DECIMAL(12,2))",
        f"INSERT INTO {db}.acct SELECT seq, CONCAT('o', seq), seq * 1.5 FROM {db}.seq_1_to_300",
    )
    data = {
        "name": db,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{db}\..*"]},
        "sink": {**rest_sink(minio, rest_catalog), "state_table": f"ingest_meta.state_{db}"},
        "snapshot": {"chunk_size": 100, "parallelism": 2, "chunks_per_commit": 4},
        "stream": {"driver_apply_max_rows": 1},  # by position: delete files through the REST catalog, on S3
    }
    config = parse_config(data)
    run(config, spark=spark, snapshot_only=True)
    mariadb.execute(
        f"UPDATE {db}.acct SET balance = NULL WHERE id % 3 = 0",
        f"DELETE FROM {db}.acct WHERE id BETWEEN 10 AND 30",
        f"UPDATE {db}.acct SET id = id + 1000 WHERE id BETWEEN 40 AND 45",
    )
    run(config, spark=spark, until_caught_up=True)
    rows = _trino_rows(trino, f"{db}.acct", "id", catalog=REST_CATALOG)
    assert rows == mysql_rows(mariadb, f"{db}.acct", "id")
    assert _position_delete_files(trino, REST_CATALOG, f"{db}.acct") > 0
    _assert_read_at_the_cut(trino, REST_CATALOG, db, rows)
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))
    for command in ("status", "verify"):
        done = run_ingest(command, "--config", str(config_file))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "acct" in run_ingest("status", "--config", str(config_file)).stdout
