"""`ingest demo`: a sample MariaDB database ingested into a local Iceberg warehouse, end to end.

It starts a private MariaDB (binlog ROW, GTIDs), loads `sample.sql`, creates the least-privilege CDC
user, writes a pipeline file for the embedded default (SQLite catalog, local warehouse), runs the
lock-free snapshot while a writer keeps changing the source, catches up with the binlog, verifies
MySQL against Iceberg row for row, and prints a query of the result.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ingest.config import load_config
from ingest.devservers.mariadb import MariaDBServer

log = logging.getLogger(__name__)

PASSWORD_ENV = "INGEST_DEMO_MYSQL_PASSWORD"


def _load_sample(server: MariaDBServer) -> None:
    sql = resources.files("ingest.demo").joinpath("sample.sql").read_text()
    text = "\n".join(ln for ln in sql.splitlines() if not ln.lstrip().startswith("--"))
    with server.admin() as conn, conn.cursor() as cur:
        for statement in filter(None, (s.strip() for s in text.split(";\n"))):
            cur.execute(statement.rstrip(";"))


def _writer(server: MariaDBServer, stop: threading.Event) -> None:
    """Keeps the source busy during the snapshot, as production databases are."""
    n = 0
    with server.admin("shop") as conn, conn.cursor() as cur:
        while not stop.is_set():
            n += 1
            cur.execute("UPDATE customers SET balance = balance + 1 WHERE id = %s", (1 + n * 7 % 3000,))
            cur.execute(
                "UPDATE orders SET status = 'shipped' WHERE customer_id = %s AND status = 'paid' LIMIT 1", (1 + n % 40,)
            )
            time.sleep(0.01)


def pipeline_file(base: Path, server: MariaDBServer) -> Path:
    data: dict[str, Any] = {
        "name": "demo",
        "source": {
            "host": server.host,
            "port": server.port,
            "user": "cdc",
            "password": {"env": PASSWORD_ENV},
            "flavor": "mariadb",
            "server_id": 5400,
        },
        "tables": {"include": [r"shop\..*"]},
        "sink": {
            "catalog_name": "lake",
            "catalog": {
                "type": "jdbc",
                "uri": f"jdbc:sqlite:{base / 'catalog.db'}",
                "warehouse": f"file://{base / 'warehouse'}",
            },
            "namespace": "{database}",
            "state_table": "ingest_meta.state",
        },
        "snapshot": {"chunk_size": 1000, "parallelism": 2, "chunks_per_commit": 16},
        "stream": {"batch_interval_seconds": 2},
    }
    path = base / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_demo(directory: str) -> int:
    from ingest.commands.status import print_status
    from ingest.commands.verify import verify
    from ingest.query.pipeline import run

    base = Path(directory).resolve()
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    started = time.monotonic()
    # binlog_row_metadata at the server's default (NO_LOG), as on most servers: the job needs no column names.
    with MariaDBServer(server_id=1, base_dir=base / "mariadb", row_metadata=None) as server:
        print(
            f"demo: MariaDB {server.host}:{server.port} up (binlog ROW, row image FULL, row metadata at its default, "
            "GTID); loading the sample shop"
        )
        _load_sample(server)
        os.environ[PASSWORD_ENV] = secrets.token_urlsafe(18)
        server.create_cdc_user("cdc", os.environ[PASSWORD_ENV])
        config = load_config(pipeline_file(base, server))
        stop = threading.Event()
        writer = threading.Thread(target=_writer, args=(server, stop), daemon=True)
        writer.start()
        try:
            print("demo: snapshotting shop.* into the Iceberg warehouse while a writer updates the source")
            run(config, snapshot_only=True)
        finally:
            stop.set()
            writer.join()
        print("demo: catching up with the binlog (the writer's changes during and after each chunk)")
        run(config, until_caught_up=True)
        print_status(config)
        spark = _spark()
        print("demo: orders by status in Iceberg (Spark SQL):")
        spark.sql(
            "SELECT status, count(*) AS orders, sum(total) AS total FROM lake.shop.orders "
            "GROUP BY status ORDER BY status"
        ).show()
        print(
            "demo: products (keys are case-insensitive in MariaDB and were chunked in the server's order; "
            "Spark sorts bytes):"
        )
        spark.sql("SELECT sku, title, price, tags FROM lake.shop.products ORDER BY sku LIMIT 5").show(truncate=False)
        print("demo: MariaDB vs Iceberg, row count and checksum per key range:")
        same = verify(config, ranges=8)
    print(
        f"demo: finished in {time.monotonic() - started:.0f}s; warehouse in {base / 'warehouse'}; "
        f"pipeline file {base / 'pipeline.yaml'}"
    )
    return 0 if same else 1


def _spark() -> Any:
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    assert session is not None
    return session
