"""`snapshot.max_source_load` on the real server: a snapshot started while MariaDB runs more threads than the bound
waits without committing a chunk, says so in its log and metrics, and completes once the load is gone; a lag bound
the CDC user cannot read is refused before anything is written."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import pymysql
import pytest

from ingest import metrics
from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import MissingPrivilegeError
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.state.table import StateTable, pipeline_is_new
from tests.conftest import embedded_sink, source_section
from tests.unit.test_metrics import samples

pytestmark = pytest.mark.integration

DB = "throttle"
ER_QUERY_INTERRUPTED = 1317
BOUND = 3
SLEEPERS = 6
"""Sessions each running SELECT SLEEP(...) while the snapshot starts: Threads_running is then at least 7."""


def _config(mariadb: MariaDBServer, base: Path, **max_source_load: Any) -> PipelineConfig:
    return parse_config(
        {
            "name": DB,
            "source": source_section(mariadb),
            "tables": {"include": [rf"{DB}\.item"]},
            "sink": {**embedded_sink(base), "catalog_name": "lake_throttle"},
            "snapshot": {
                "chunk_size": 50,
                "parallelism": 1,
                "chunks_per_commit": 4,
                "max_source_load": max_source_load,
            },
        }
    )


def _threads_running(mariadb: MariaDBServer) -> int:
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS LIKE 'Threads_running'")
        return int(cur.fetchone()[1])


class Load:
    """`SLEEPERS` admin sessions each running a long SELECT SLEEP until `release` kills their queries."""

    def __init__(self, mariadb: MariaDBServer) -> None:
        self.mariadb = mariadb
        self.ids: list[int] = []
        self.threads = [threading.Thread(target=self._sleep, daemon=True) for _ in range(SLEEPERS)]
        self._lock = threading.Lock()

    def _sleep(self) -> None:
        with self.mariadb.admin() as conn, conn.cursor() as cur:
            with self._lock:
                self.ids.append(conn.thread_id())
            try:
                cur.execute("SELECT SLEEP(120)")
            except pymysql.err.OperationalError as e:
                if e.args[0] != ER_QUERY_INTERRUPTED:  # ended by `release`
                    raise

    def start(self) -> None:
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + 20
        while _threads_running(self.mariadb) <= BOUND + 1:
            assert time.monotonic() < deadline, "the sleeping queries never ran"
            time.sleep(0.1)

    def release(self) -> None:
        with self.mariadb.admin() as conn, conn.cursor() as cur:
            for thread_id in self.ids:
                cur.execute(f"KILL QUERY {thread_id}")
        for thread in self.threads:
            thread.join(timeout=10)


def _current_snapshot(config: PipelineConfig) -> Any:
    return load_pyiceberg_catalog(config.sink).load_table((DB, "item")).current_snapshot()


def test_a_snapshot_waits_while_the_source_runs_too_many_threads_then_completes(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.item (id INT NOT NULL PRIMARY KEY, v VARCHAR(20))",
        f"INSERT INTO {DB}.item SELECT seq, CONCAT('v', seq) FROM {DB}.seq_1_to_200",  # 4 chunks, 1 commit
    )
    assert _threads_running(mariadb) <= BOUND, "the server is busy before the test loads it"
    config = _config(mariadb, tmp_path, threads_running=BOUND, check_seconds=0.25, max_check_seconds=1)
    caplog.set_level(logging.INFO, logger="ingest")
    load = Load(mariadb)
    load.start()
    failure: list[BaseException] = []
    seen: dict[str, list[Any]] = {"metrics": []}

    def job() -> None:
        try:
            run(config, snapshot_only=True, spark=spark)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            failure.append(e)

    runner = threading.Thread(target=job, name="throttled-job")
    try:
        runner.start()
        deadline = time.monotonic() + 60
        while "snapshot paused" not in caplog.text:
            assert runner.is_alive() and time.monotonic() < deadline, (failure, caplog.text[-3000:])
            time.sleep(0.1)
        paused_at = time.monotonic()
        while time.monotonic() - paused_at < 2.5:  # loaded for 2.5 s more: the job keeps waiting, reading nothing
            got = samples(metrics.current().exposition())
            seen["metrics"].append(got)
            assert got["ingest_snapshot_paused"] == 1, got
            assert got.get(f'ingest_snapshot_chunks_done{{table="{DB}.item"}}', 0) == 0, got
            assert _current_snapshot(config) is None, "a chunk was committed while the source was loaded"
            time.sleep(0.5)
        throttled = [m["ingest_snapshot_throttled_seconds_total"] for m in seen["metrics"]]
        assert throttled == sorted(throttled) and throttled[-1] >= 1.5, throttled
    finally:
        load.release()
        runner.join(timeout=120)
    assert not runner.is_alive() and not failure, (failure, caplog.text[-3000:])

    log = caplog.text
    assert len(re.findall(rf"snapshot paused: Threads_running \d+ > {BOUND} \({DB}\.item: chunks 0/4\)", log)) == 1, log
    assert re.search(rf"snapshot resumed after \d+\.\d s paused \(Threads_running \d <= {BOUND}\)", log), log
    assert re.search(rf"{DB}\.item: chunks 4/4, 200 rows, \d+ rows/s, paused \d+\.\d s for source load", log), log
    state = StateTable.open(config.sink, config.name)
    assert len(state.done(f"{DB}.item")) == 4
    assert verify(config)


def test_a_lag_bound_the_cdc_user_cannot_read_is_refused_before_anything_is_written(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    # The test's CDC user has the grants the job needs, not SLAVE MONITOR (MariaDB 10.5.9+ asks it for
    # SHOW REPLICA STATUS).
    config = _config(mariadb, tmp_path, threads_running=20, replica_lag_seconds=30)
    with pytest.raises(MissingPrivilegeError, match=r"replica_lag_seconds.*GRANT SLAVE MONITOR ON \*\.\*"):
        run(config, spark=spark)
    assert pipeline_is_new(config.sink, config.name)
