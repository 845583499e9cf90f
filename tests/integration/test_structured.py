"""The binlog phase as a Spark Structured Streaming query (`stream.engine: structured`): the binlog Python data
source and the foreachBatch commit. Every test ends with `ingest verify`: MySQL and Iceberg equal row for row."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.config import PipelineConfig
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import ConfigError, SchemaChangeError
from ingest.pipeline import discover, run
from ingest.source.binlog_source import BinlogSourceSpec, BinlogStreamReader, decode_batch
from ingest.source.mysql import connect
from ingest.state.table import StateTable
from ingest.streaming import prepare
from ingest.verify import verify
from tests.conftest import embedded_sink, run_ingest, source_section
from tests.integration.test_streaming import DML, _config, _fresh_db, _snapshot_count

pytestmark = pytest.mark.integration


def _structured(mariadb: MariaDBServer, db: str, warehouse: Path, **stream: Any) -> PipelineConfig:
    return _config(mariadb, db, warehouse, catalog=f"s_{db}", engine="structured", **stream)


def _write(mariadb: MariaDBServer, db: str) -> None:
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        for statement in DML:
            cur.execute(statement.format(db=db))
        cur.execute("COMMIT")
        cur.execute(f"UPDATE {db}.acct SET owner = 'twice' WHERE id = 1")
        cur.execute(f"UPDATE {db}.acct SET owner = 'thrice' WHERE id = 1")


def _counts(config: PipelineConfig, db: str) -> tuple[int, int]:
    return _snapshot_count(config, db, "acct"), _snapshot_count(config, db, "tag")


def test_a_structured_streaming_query_applies_the_binlog_exactly_once(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "sflow"
    _fresh_db(mariadb, db)
    config = _structured(mariadb, db, tmp_path)
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    _write(mariadb, db)
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    before = _counts(config, db)
    run(config, spark=spark, until_caught_up=True)  # nothing new: no new Iceberg snapshot
    assert _counts(config, db) == before
    assert spark.streams.active == []
