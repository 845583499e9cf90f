"""Snapshot and binlog with executors in separate JVMs and Python processes (`local-cluster`), so everything a
chunk read and a MERGE need is proven to pickle, ship and run outside the driver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.commands.verify import verify
from ingest.config import parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.query.pipeline import run
from ingest.state.table import StateTable
from tests.conftest import embedded_sink, source_section, spark_for_module

pytestmark = [pytest.mark.integration, pytest.mark.spark_compat]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_for_module("local-cluster[2,1,1024]")
    yield session
    session.stop()


def test_chunks_and_binlog_batches_run_on_executor_processes_and_land_exactly_once(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    mariadb.execute(
        "DROP DATABASE IF EXISTS cluster",
        "CREATE DATABASE cluster",
        "CREATE TABLE cluster.events (tenant VARCHAR(8) COLLATE utf8mb4_general_ci NOT NULL, n INT NOT NULL, "
        "payload VARBINARY(16), at TIMESTAMP(6) NOT NULL, PRIMARY KEY (tenant, n))",
        "INSERT INTO cluster.events SELECT ELT(1 + seq % 3, 'a', 'B', 'c'), seq, UNHEX(MD5(seq)), "
        "TIMESTAMP('2025-01-01') + INTERVAL seq SECOND FROM cluster.seq_1_to_2000",
    )
    assert spark.sparkContext.master.startswith("local-cluster")
    pids = spark.sparkContext.parallelize(range(4), 4).map(lambda _: __import__("os").getpid()).collect()
    assert len(set(pids)) >= 2 and __import__("os").getpid() not in pids  # executors are other processes
    config = parse_config(
        {
            "name": "cluster",
            "source": source_section(mariadb),
            "tables": {"include": [r"cluster\.events"]},
            "sink": embedded_sink(tmp_path),
            "snapshot": {"chunk_size": 300, "parallelism": 2, "chunks_per_commit": 4},
            "stream": {"batch_interval_seconds": 60},
        }
    )
    run(config, spark=spark, snapshot_only=True)
    assert verify(config, ranges=3)
    state = StateTable.open(config.sink, config.name)
    assert set(state.times_recorded("cluster.events").values()) == {1}
    assert sum(r.row_count for r in state.done("cluster.events").values()) == 2000

    # The binlog phase on the same executors: several kinds of change, one multi-statement transaction.
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("UPDATE cluster.events SET payload = NULL WHERE n % 10 = 0")
        cur.execute("UPDATE cluster.events SET n = n + 10000 WHERE n BETWEEN 100 AND 110")  # primary-key update
        cur.execute("DELETE FROM cluster.events WHERE n BETWEEN 500 AND 520")
        cur.execute("COMMIT")
        cur.execute("INSERT INTO cluster.events VALUES ('C', 500, NULL, '2025-02-01')")  # re-insert, other case
        cur.execute("INSERT INTO cluster.events VALUES ('z', 1, 0x00ff, '2025-03-01')")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config, ranges=3)
    offset = StateTable.open(config.sink, config.name).stream_offset()
    assert offset is not None
