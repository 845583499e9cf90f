"""The snapshot phase end to end: MariaDB -> Spark (local[2]) -> Iceberg, both catalog profiles, crashes.

Every test compares Iceberg with MySQL row for row (`ingest verify`, which reads Iceberg with pyiceberg).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commands.status import table_status
from ingest.commands.verify import verify
from ingest.config import parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import PostgresServer
from ingest.model.schema import target_columns
from ingest.query.pipeline import run
from ingest.query.snapshot import SUMMARY_BATCH
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.evolution import spark_string
from ingest.sink.summary import SUMMARY_CHUNKS_DONE
from ingest.source.discovery import discover
from ingest.state.table import StateTable
from tests.conftest import CDC_PASSWORD_ENV, embedded_sink, minio_sink, run_ingest, source_section
from tests.type_cases import check_iceberg_rows, create_types_table

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shop(mariadb: MariaDBServer) -> str:
    from ingest.demo import _load_sample

    mariadb.execute("DROP DATABASE IF EXISTS shop")
    _load_sample(mariadb)
    with mariadb.admin() as conn:
        conn.select_db("shop")
        create_types_table(conn, "all_types")
    return "shop"


def _config(
    mariadb: MariaDBServer, sink: dict[str, Any], name: str, include: str = r"shop\..*", **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "source": source_section(mariadb),
        "tables": {"include": [include]},
        "sink": {**sink, "namespace": "{pipeline}_{database}", "state_table": f"ingest_meta.state_{name}"},
        "snapshot": {"chunk_size": 400, "parallelism": 2, "chunks_per_commit": 4},
        "startup_mode": "snapshot_only",
        **extra,
    }


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A catalog whose tables an older Iceberg made, without view support (JDBC schema V0): Spark's tableExists
    on a table not there yet fails on such a catalog unless the job has it migrated."""
    base = tmp_path_factory.mktemp("warehouse")
    with closing(sqlite3.connect(base / "catalog.db")) as db:
        db.execute(
            "CREATE TABLE iceberg_tables (catalog_name VARCHAR(255) NOT NULL, table_namespace VARCHAR(255) NOT NULL, "
            "table_name VARCHAR(255) NOT NULL, metadata_location VARCHAR(1000), previous_metadata_location "
            "VARCHAR(1000), PRIMARY KEY (catalog_name, table_namespace, table_name))"
        )
        db.execute(
            "CREATE TABLE iceberg_namespace_properties (catalog_name VARCHAR(255) NOT NULL, namespace VARCHAR(255) "
            "NOT NULL, property_key VARCHAR(255), property_value VARCHAR(1000), "
            "PRIMARY KEY (catalog_name, namespace, property_key))"
        )
        db.commit()
    return base


def test_snapshot_of_several_key_types_equals_mysql(
    spark: Any, mariadb: MariaDBServer, shop: str, warehouse: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = parse_config(_config(mariadb, embedded_sink(warehouse), "full"))
    run(config, spark=spark)
    assert verify(config, ranges=4)
    with closing(sqlite3.connect(warehouse / "catalog.db")) as db:  # migrated to V1: views can be asked about
        assert "iceberg_type" in [column[1] for column in db.execute("PRAGMA table_info(iceberg_tables)")]
    out = capsys.readouterr().out
    assert "FAIL" not in out and "OK   shop.orders: 5000 rows" in out
    status = {s["table"]: s for s in table_status(config)}
    assert status["shop.orders"]["chunks_done"] == status["shop.orders"]["chunks_total"] >= 12
    assert status["shop.customers"]["rows"] == 3000
    state = StateTable.open(config.sink, config.name)
    for table_id in status:
        assert set(state.times_recorded(table_id).values()) == {1}, f"{table_id}: a chunk was recorded twice"
    # A second run finds everything done: no new Iceberg snapshot on any target.
    catalog = load_pyiceberg_catalog(config.sink)
    # Commits of several chunks: the executors wrote the chunks' Arrow to data files, one per input partition, and
    # the driver appended them; Spark's writer, whose commits name its application, never saw the rows.
    commits = [
        s.summary.additional_properties
        for s in catalog.load_table(("full_shop", "orders")).snapshots()
        if SUMMARY_BATCH in s.summary.additional_properties
    ]
    assert len(commits) >= 3
    assert all("spark.app.id" not in c and int(c["added-data-files"]) <= 2 for c in commits), commits
    before = {t: len(catalog.load_table(("full_shop", t.split(".")[1])).snapshots()) for t in status}
    run(config, spark=spark)
    after = {t: len(catalog.load_table(("full_shop", t.split(".")[1])).snapshots()) for t in status}
    assert before == after


def test_verify_names_a_row_written_twice_a_missing_row_and_a_changed_value(
    spark: Any, mariadb: MariaDBServer, shop: str, warehouse: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ingest verify` is what the kill tests trust to see a duplicate: a key held by two Iceberg rows with the
    same values must fail it, as a missing row and a changed value do."""
    import pyarrow as pa
    from pyiceberg.expressions import EqualTo

    config = parse_config(_config(mariadb, embedded_sink(warehouse), "tamper", include=r"shop\.customers"))
    run(config, spark=spark)
    assert verify(config, ranges=2)
    table = load_pyiceberg_catalog(config.sink).load_table(("tamper_shop", "customers"))
    row = table.scan(row_filter=EqualTo("id", 7)).to_arrow()
    assert row.num_rows == 1
    capsys.readouterr()

    table.append(row)  # the same row once more
    assert not verify(config, ranges=2)
    assert "FAIL shop.customers" in capsys.readouterr().out
    table.delete(EqualTo("id", 7))  # both copies: the row is missing
    assert not verify(config, ranges=2)
    assert "DIFF shop.customers keys" in capsys.readouterr().out
    name = row.schema.field("name")
    changed = row.set_column(row.schema.get_field_index("name"), name, pa.array(["someone else"], name.type))
    table.append(changed)
    assert not verify(config, ranges=2)
    table.delete(EqualTo("id", 7))
    table.append(row)  # as it was: equal again
    assert verify(config, ranges=2)


@pytest.mark.spark_compat
def test_every_type_case_lands_with_its_exact_iceberg_value(
    spark: Any, mariadb: MariaDBServer, shop: str, warehouse: Path
) -> None:
    config = parse_config(_config(mariadb, embedded_sink(warehouse), "types", include=r"shop\.all_types"))
    run(config, spark=spark)
    rows = load_pyiceberg_catalog(config.sink).load_table(("types_shop", "all_types")).scan().to_arrow().to_pylist()
    assert check_iceberg_rows(rows) == []
    # Spark reads the same table back (a second engine).
    assert spark.sql("SELECT count(*) FROM lake.types_shop.all_types WHERE bu = 18446744073709551615").first()[0] == 1
    # The job created the target in the catalog (pyiceberg), as Spark's Iceberg catalog makes it from the same
    # columns and properties: field ids, types, required columns, identifier fields, spec, order, location.
    catalog = load_pyiceberg_catalog(config.sink)
    made = catalog.load_table(("types_shop", "all_types"))
    schema = next(
        s for s in discover(config.source, config.tables, config.table_options).schemas if s.table == "all_types"
    )
    columns = ", ".join(f"`{t.name}` {t.spark_type}{'' if t.nullable else ' NOT NULL'}" for t in target_columns(schema))
    wanted = {k: v for k, v in made.properties.items() if k != "write.parquet.compression-codec"}
    properties = ", ".join(
        f"{spark_string(k)} = {spark_string(v)}" for k, v in {"format-version": "2", **wanted}.items()
    )
    spark.sql(f"CREATE TABLE lake.types_shop.by_spark ({columns}) USING iceberg TBLPROPERTIES ({properties})")
    spark.sql(f"ALTER TABLE lake.types_shop.by_spark SET IDENTIFIER FIELDS {', '.join(schema.primary_key)}")
    twin = catalog.load_table(("types_shop", "by_spark"))
    assert made.schema().fields == twin.schema().fields
    assert made.schema().identifier_field_ids == twin.schema().identifier_field_ids == [1]
    assert (made.spec(), made.sort_order(), made.format_version) == (twin.spec(), twin.sort_order(), 2)
    assert made.location().removesuffix("/all_types") == twin.location().removesuffix("/by_spark")
    assert {k: v for k, v in twin.properties.items() if k != "owner"} == made.properties


def test_snapshot_to_minio_through_the_postgres_catalog(
    spark: Any, mariadb: MariaDBServer, minio: MinioServer, postgres: PostgresServer, shop: str
) -> None:
    bucket = minio.bucket("snapshot-profile")
    config = parse_config(
        _config(mariadb, minio_sink(minio, postgres, bucket), "s3", include=r"shop\.(orders|products)")
    )
    run(config, spark=spark)
    assert verify(config, ranges=3)
    keys = [o["Key"] for o in minio.s3_client().list_objects_v2(Bucket=bucket, MaxKeys=1000)["Contents"]]
    assert any(k.startswith("warehouse/s3_shop/orders/data/") for k in keys)
    assert any(k.startswith("warehouse/ingest_meta/state_s3/") for k in keys)


# --- kill -9 at named points, then resume --------------------------------------------------------------

CRASH_POINTS = [
    "snapshot.after_plan",
    # the whole job dies while executors read chunks
    pytest.param("chunk.after_select.shop.orders.3", marks=pytest.mark.spark_compat),
    "snapshot.before_commit:2",
    "snapshot.after_commit:2",  # data committed, state table not written (the FlinkX/Canal window)
    "snapshot.after_state:1",
]


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
def test_kill_9_at_a_named_point_then_resume_reads_no_chunk_twice_and_loses_none(
    spark: Any, mariadb: MariaDBServer, shop: str, tmp_path: Path, crash_at: str
) -> None:
    name = "crash"
    sink = embedded_sink(tmp_path)
    # A catalog name of its own: the resume runs in this module's Spark session, which caches catalogs by name.
    sink["catalog_name"] = "crash_" + "".join(c if c.isalnum() else "_" for c in crash_at)
    data = _config(mariadb, sink, name, include=r"shop\.orders")
    data["snapshot"].update(chunk_size=1000, chunks_per_commit=2)
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))
    assert os.environ[CDC_PASSWORD_ENV]

    crashed = run_ingest("run", "--config", str(config_file), "--snapshot-only", crash_at=crash_at)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    config = parse_config(data, tmp_path)
    run(config, spark=spark)  # the resume, as a fresh process would: all it knows is in Iceberg

    assert verify(config, ranges=4)
    state = StateTable.open(config.sink, config.name)
    plan = state.plan("shop.orders")
    assert plan is not None and len(plan) == 5
    assert state.times_recorded("shop.orders") == {c.index: 1 for c in plan}
    table = load_pyiceberg_catalog(config.sink).load_table((f"{name}_shop", "orders"))
    assert table.scan().to_arrow().num_rows == 5000
    latest = table.current_snapshot()
    assert latest is not None and latest.summary is not None
    assert latest.summary.additional_properties[SUMMARY_CHUNKS_DONE] == "0-4"
    # The resumed run re-read only what the crash left unrecorded.
    appended = sum(
        int((s.summary.additional_properties if s.summary else {}).get("added-records", 0)) for s in table.snapshots()
    )
    assert appended == 5000, "rows appended twice"
    assert json.loads(json.dumps(table_status(config)))[0]["chunks_done"] == 5


def test_secrets_never_reach_logs_or_iceberg_metadata_even_at_debug(
    mariadb: MariaDBServer, shop: str, tmp_path: Path, cdc_password: str
) -> None:
    """FAILURES.md "Security": the password is not in the job's output at DEBUG, in the snapshot and in the
    binlog phase (the replication library logs its settings), nor in any file it wrote."""
    data = _config(mariadb, embedded_sink(tmp_path), "secrets", include=r"shop\.products", startup_mode="initial")
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))

    def job(mode: str) -> subprocess.CompletedProcess[str]:
        return run_ingest("--log-level", "DEBUG", "run", "--config", str(config_file), mode)

    snapshot = job("--snapshot-only")
    mariadb.execute("UPDATE shop.products SET price = price + 1 WHERE sku LIKE 'Zz-000%'")
    binlog = job("--until-caught-up")
    mariadb.execute("UPDATE shop.products SET price = price - 1 WHERE sku LIKE 'Zz-000%'")  # as other tests expect
    for done in (snapshot, binlog):
        assert done.returncode == 0, done.stderr[-3000:]
        assert "DEBUG" in done.stderr  # the log level really was DEBUG
        assert cdc_password not in done.stdout and cdc_password not in done.stderr
    assert "binlog: committed" in binlog.stderr  # the binlog phase ran and applied the update
    assert cdc_password not in config_file.read_text()
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "pipeline.yaml"]
    assert any(p.name.endswith(".metadata.json") for p in written)
    for path in written:
        assert cdc_password.encode() not in path.read_bytes(), f"password found in {path}"


def test_bad_config_exits_2_naming_the_key_and_writes_nothing(tmp_path: Path) -> None:
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(
        "source: {host: h, user: u, password: {env: HOME}}\ntables: {include: ['a']}\nsink: {catalgo: {type: jdbc}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "ingest.cli", "run", "--config", str(config_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "ingest: config error: unknown key `sink.catalgo` in `sink`; see docs/config.md for the valid keys"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.yaml"]


def test_an_unreachable_source_is_named_and_nothing_is_written(mariadb: MariaDBServer, tmp_path: Path) -> None:
    """FAILURES.md "Security and bad input": a wrong host or port fails fast, names the address, and leaves no
    warehouse or catalog behind."""
    from ingest.devservers.process import free_port

    data = _config(mariadb, embedded_sink(tmp_path), "nowhere", include=r"shop\.products")
    data["source"].update(port=free_port(), connect_timeout=2)  # nothing listens there
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))
    done = run_ingest("run", "--config", str(config_file))
    port = data["source"]["port"]
    assert done.returncode == 3, done.stderr[-2000:]
    assert f"cannot connect to MySQL at 127.0.0.1:{port} as cdc" in done.stderr, done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.yaml"]


def test_an_unreachable_catalog_is_named_before_spark_is_used_and_nothing_is_written(
    mariadb: MariaDBServer, shop: str, tmp_path: Path
) -> None:
    """FAILURES.md "Security and bad input": a catalog database that is down or at a wrong address fails the
    run with its address (never its password), not a stack trace from the JVM."""
    from ingest.devservers.process import free_port

    port = free_port()  # nothing listens there
    password = "catalog-pw-" + os.urandom(4).hex()
    sink = {
        "catalog_name": "lake",
        "catalog": {
            "type": "jdbc",
            "uri": f"jdbc:postgresql://127.0.0.1:{port}/iceberg",
            "jdbc.user": "iceberg",
            "jdbc.password": {"env": "INGEST_TEST_CATALOG_PASSWORD"},
            "warehouse": f"file://{tmp_path}/warehouse",
        },
    }
    data = _config(mariadb, sink, "nocatalog", include=r"shop\.products")
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))
    done = run_ingest("run", "--config", str(config_file), env_extra={"INGEST_TEST_CATALOG_PASSWORD": password})
    assert done.returncode == 3, done.stderr[-2000:]
    assert f"cannot open the Iceberg catalog `lake` at 'postgresql+psycopg2://127.0.0.1:{port}/iceberg'" in (
        done.stderr
    ), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and password not in done.stderr + done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.yaml"]


def test_missing_grant_is_named(mariadb: MariaDBServer, shop: str, tmp_path: Path) -> None:
    mariadb.execute(
        "CREATE USER IF NOT EXISTS 'reader'@'%' IDENTIFIED BY 'reader-pw'", "GRANT SELECT ON *.* TO 'reader'@'%'"
    )
    os.environ["INGEST_TEST_READER_PASSWORD"] = "reader-pw"
    data = _config(mariadb, embedded_sink(tmp_path), "grants", include=r"shop\.products")
    data["source"].update(user="reader", password={"env": "INGEST_TEST_READER_PASSWORD"})
    from ingest.errors import MissingPrivilegeError

    with pytest.raises(MissingPrivilegeError, match=r"lacks REPLICATION SLAVE; run: GRANT REPLICATION SLAVE"):
        run(parse_config(data))
