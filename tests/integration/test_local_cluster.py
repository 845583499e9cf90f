"""The snapshot with executors in separate JVMs and Python processes (`local-cluster`), so everything a
chunk read needs is proven to pickle, ship and run outside the driver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.config import parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.pipeline import run
from ingest.state.table import StateTable
from ingest.verify import verify
from tests.conftest import embedded_sink, source_section, spark_for_module

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_for_module("local-cluster[2,1,1024]")
    yield session
    session.stop()


def test_chunks_are_read_by_executor_processes_and_land_exactly_once(
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
            "startup_mode": "snapshot_only",
        }
    )
    run(config, spark=spark)
    assert verify(config, ranges=3)
    state = StateTable.open(config)
    assert set(state.times_recorded("cluster.events").values()) == {1}
    assert sum(r.row_count for r in state.done("cluster.events").values()) == 2000
