"""The real stack works: MariaDB's binlog, Spark with Iceberg on both catalog profiles, pyiceberg reads back."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pymysql
import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import MariadbGtidEvent
from pymysqlreplication.row_event import WriteRowsEvent

from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import PostgresServer
from ingest.runtime.jars import installed_spark, spark_minor
from ingest.runtime.spark import spark_session
from ingest.sink.catalog import load_pyiceberg_catalog
from tests.conftest import CDC_USER, embedded_sink, minio_sink, source_section

pytestmark = [pytest.mark.integration, pytest.mark.spark_compat]


def _config(mariadb: MariaDBServer, sink: dict[str, Any]) -> PipelineConfig:
    return parse_config(
        {"name": "stack", "source": source_section(mariadb), "tables": {"include": [r"stack\..*"]}, "sink": sink}
    )


@pytest.fixture(scope="module")
def stack_db(mariadb: MariaDBServer) -> str:
    mariadb.execute(
        "CREATE DATABASE IF NOT EXISTS stack",
        "CREATE TABLE stack.people (id BIGINT UNSIGNED PRIMARY KEY, name VARCHAR(40), born DATE)",
        "INSERT INTO stack.people VALUES (1, 'Ada', '1815-12-10'), (18446744073709551615, 'Max', NULL)",
    )
    return "stack"


def test_mariadb_runs_with_the_binlog_settings_cdc_needs(mariadb: MariaDBServer) -> None:
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata, "
            "@@gtid_strict_mode, @@server_id"
        )
        assert cur.fetchone() == (1, "ROW", "FULL", "FULL", 1, 1)
        cur.execute("SHOW GRANTS FOR %s@'%%'", (CDC_USER,))
        grants = " ".join(row[0] for row in cur.fetchall())
    assert "GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.*" in grants
    assert "ALL PRIVILEGES" not in grants and "RELOAD" not in grants


def test_cdc_user_cannot_write(mariadb: MariaDBServer, stack_db: str, cdc_password: str) -> None:
    conn = pymysql.connect(host=mariadb.host, port=mariadb.port, user=CDC_USER, password=cdc_password)
    with conn, conn.cursor() as cur, pytest.raises(pymysql.err.OperationalError, match="denied"):
        cur.execute("DELETE FROM stack.people")


def test_an_insert_is_seen_in_the_binlog_with_its_gtid_and_position(
    mariadb: MariaDBServer, stack_db: str, cdc_password: str
) -> None:
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        log_file, log_pos = cur.fetchone()[:2]
        cur.execute("INSERT INTO stack.people VALUES (7, 'Grace', '1906-12-09')")
        cur.execute("SELECT @@gtid_binlog_pos")
        (gtid_after,) = cur.fetchone()
    stream = BinLogStreamReader(
        connection_settings={"host": mariadb.host, "port": mariadb.port, "user": CDC_USER, "passwd": cdc_password},
        server_id=9101,
        log_file=log_file,
        log_pos=log_pos,
        resume_stream=True,
        blocking=False,
        # File/position streaming: with is_mariadb=True the library would ignore log_pos and start at the file's head.
        is_mariadb=False,
        only_events=[MariadbGtidEvent, WriteRowsEvent],
    )
    seen_gtid, rows = None, []
    try:
        for event in stream:
            if isinstance(event, MariadbGtidEvent):
                seen_gtid = event.gtid
            elif isinstance(event, WriteRowsEvent) and event.table == "people":
                rows = [r["values"] for r in event.rows]
                assert event.packet.log_pos > log_pos
                break
    finally:
        stream.close()
    assert rows == [{"id": 7, "name": "Grace", "born": rows[0]["born"]}]
    assert str(rows[0]["born"]) == "1906-12-09"
    assert seen_gtid == gtid_after


def _write_and_read_back(config: PipelineConfig, mariadb: MariaDBServer, cdc_password: str) -> list[dict[str, Any]]:
    spark = spark_session(config.spark, config.sink, "ingest-test-stack")
    # The JVM runs the Spark this interpreter's PySpark is (4.1 in the full suite, 4.0 in the compatibility
    # subset), with the one Iceberg runtime built for it on its class path.
    minor = spark_minor(installed_spark())
    assert spark_minor(spark.version) == minor
    runtimes = re.findall(r"iceberg-spark-runtime-[\d.]+_[\d.]+", spark.conf.get("spark.jars"))
    assert runtimes == [f"iceberg-spark-runtime-{minor}_2.13"], runtimes
    conn = pymysql.connect(host=mariadb.host, port=mariadb.port, user=CDC_USER, password=cdc_password, database="stack")
    with conn, conn.cursor() as cur:
        cur.execute("SELECT CAST(id AS DECIMAL(20,0)), name, born FROM people WHERE id <> 7 ORDER BY id")
        rows = cur.fetchall()
    df = spark.createDataFrame(rows, "id DECIMAL(20,0), name STRING, born DATE")
    catalog = config.sink.catalog_name
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.stack")
    df.writeTo(f"{catalog}.stack.people").using("iceberg").tableProperty("format-version", "2").createOrReplace()
    table = load_pyiceberg_catalog(config.sink).load_table("stack.people")
    return sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])


def test_spark_writes_mariadb_rows_to_the_embedded_catalog_and_pyiceberg_reads_them(
    mariadb: MariaDBServer, stack_db: str, cdc_password: str, tmp_path: Path
) -> None:
    got = _write_and_read_back(_config(mariadb, embedded_sink(tmp_path)), mariadb, cdc_password)
    assert [(int(r["id"]), r["name"]) for r in got] == [(1, "Ada"), (18446744073709551615, "Max")]
    assert str(got[0]["born"]) == "1815-12-10"
    assert list((tmp_path / "warehouse" / "stack" / "people" / "data").glob("*.parquet"))


def test_spark_writes_to_minio_through_the_postgres_catalog_and_pyiceberg_reads_it(
    mariadb: MariaDBServer, minio: MinioServer, postgres: PostgresServer, stack_db: str, cdc_password: str
) -> None:
    bucket = minio.bucket("stack-smoke")
    config = _config(mariadb, minio_sink(minio, postgres, bucket))
    config_secret_free = repr(config)
    got = _write_and_read_back(config, mariadb, cdc_password)
    assert [(int(r["id"]), r["name"]) for r in got] == [(1, "Ada"), (18446744073709551615, "Max")]
    keys = [o["Key"] for o in minio.s3_client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert any(k.startswith("warehouse/stack/people/data/") and k.endswith(".parquet") for k in keys)
    assert any(k.endswith(".metadata.json") for k in keys)
    assert minio.secret_key not in config_secret_free and postgres.password not in config_secret_free
    assert os.environ["INGEST_TEST_S3_SECRET"] == minio.secret_key
