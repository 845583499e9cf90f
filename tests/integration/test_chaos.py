"""Chaos: a random DML workload runs while the job is SIGKILLed (its whole process group) at random moments,
again and again, and restarted each time, on the S3 profile (MinIO through S3FileIO, the JDBC catalog on
PostgreSQL). The runs alternate between a fresh query each (no `stream.checkpoint_location`: Iceberg alone
says where to resume) and a Spark checkpoint kept across runs (which the fresh runs leave behind). The kills
land in the snapshot, in binlog apply and in the job's own maintenance (some at random; the third
binlog-phase kill, and every fifth after it, at a named point inside a compaction). One target is partitioned,
one is not. The server writes its binlog at each `row_metadata` setting. At the end Iceberg equals MySQL row for
row, no chunk was recorded twice, and no table committed the same binlog batch twice.

`CHAOS_KILLS` kills per run: `make test` runs 6 at MariaDB's default row metadata (NO_LOG); `make chaos` runs 50
at each setting (NO_LOG and FULL).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commands.verify import verify
from ingest.config import parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import PostgresServer
from ingest.faults import ENV as CRASH_ENV
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.maintenance import SUMMARY_MAINTENANCE
from ingest.sink.summary import SUMMARY_STREAM_OFFSET
from ingest.state.table import StateTable
from tests.conftest import ROW_METADATA, main_history, minio_sink, source_section, start_ingest

pytestmark = pytest.mark.integration

KILLS = int(os.environ.get("CHAOS_KILLS", "6"))
FULL_LENGTH = KILLS >= 50
# The short run (`make test`) at MariaDB's default row metadata, the harder case (columns matched by
# position); the full one at both settings.
SETTINGS = ROW_METADATA if FULL_LENGTH else ["NO_LOG"]
SNAPSHOT_KILLS = 3
MAINTENANCE_POINTS = ("maintenance.after_data_rewrite:1", "maintenance.before_expiry:1")
# The lines of the job's log that say which phase it is in, the latest one seen naming where a kill landed. The
# query reads the snapshot's chunks while it streams: every kill of a run that started it lands in a query with
# that run's kind of checkpoint.
PHASE_LINES = (
    (": planned ", "snapshot"),  # planned N chunks
    (": chunks ", "snapshot"),  # chunks n/N (read while streaming)
    ("binlog phase from ", "apply"),
    ("maintenance starts", "maintenance"),
    ("maintenance in", "apply"),
    ("maintenance failed", "apply"),
)


def _phase_at_kill(log: str) -> str:
    phase = "start"
    for line in log.splitlines():
        for marker, name in PHASE_LINES:
            if marker in line:
                phase = name
    return phase


def _workload(server: MariaDBServer, stop: threading.Event, done: Counter[str]) -> None:
    rng = random.Random(20261122)
    with server.admin("chaos") as conn, conn.cursor() as cur:
        cur.execute("SET SESSION autocommit = 0")
        while not stop.is_set():
            for _ in range(rng.randint(1, 5)):  # multi-statement transactions
                op = rng.choice(["update", "update", "delete", "insert", "pk", "reinsert", "bulk"])
                k = rng.randint(1, 1500)
                if op == "update":
                    cur.execute("UPDATE acct SET balance = balance + 1, note = %s WHERE id = %s", (f"n{k}", k))
                elif op == "delete":
                    cur.execute("DELETE FROM acct WHERE id = %s", (k,))
                elif op == "insert":
                    cur.execute("INSERT IGNORE INTO acct VALUES (%s, 1, 'new')", (k,))
                elif op == "pk":
                    cur.execute("UPDATE IGNORE acct SET id = %s WHERE id = %s", (rng.randint(1, 1500), k))
                elif op == "reinsert":
                    cur.execute("DELETE FROM acct WHERE id = %s", (k,))
                    cur.execute("INSERT INTO acct VALUES (%s, 2, 'reborn')", (k,))
                else:  # a multi-row event
                    cur.execute("UPDATE acct SET balance = balance - 1 WHERE id BETWEEN %s AND %s", (k, k + 20))
                    cur.execute("UPDATE tag SET n = n + 1 WHERE n %% 7 = %s", (k % 7,))
                done[op] += 1
            conn.commit()
            time.sleep(0.03)


def _offset(data: dict[str, Any], base: Path) -> Any:
    try:
        config = parse_config(data, base)
        return StateTable.open(config.sink, config.name).stream_offset()
    except Exception:  # noqa: BLE001 - before the first run the catalog does not exist yet
        return None


@pytest.mark.parametrize("row_metadata", SETTINGS, indirect=True)
def test_random_sigkills_during_snapshot_and_binlog_lose_and_duplicate_nothing(
    spark: Any,
    mariadb: MariaDBServer,
    minio: MinioServer,
    postgres: PostgresServer,
    tmp_path: Path,
    row_metadata: str,
) -> None:
    mariadb.execute(
        "DROP DATABASE IF EXISTS chaos",
        "CREATE DATABASE chaos",
        "CREATE TABLE chaos.acct (id INT NOT NULL PRIMARY KEY, balance INT NOT NULL, note VARCHAR(20))",
        "CREATE TABLE chaos.tag (name VARCHAR(12) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, n INT NOT NULL)",
        "INSERT INTO chaos.acct SELECT seq, 0, CONCAT('s', seq) FROM chaos.seq_1_to_1000",
        "INSERT INTO chaos.tag SELECT CONCAT(ELT(1 + seq % 3, 'x', 'Y', 'z'), seq), seq FROM chaos.seq_1_to_300",
    )
    sink = minio_sink(minio, postgres, minio.bucket(f"chaos-{row_metadata.lower().replace('_', '-')}"))
    data = {
        "name": "chaos",
        "source": source_section(mariadb),
        "tables": {"include": [r"chaos\..*"]},
        # The job's own compaction every 3 commits, so that kills also land in it.
        "sink": {
            **sink,
            "catalog_name": f"chaos_{row_metadata}",  # one per run: the module's Spark session caches catalogs
            "state_table": f"ingest_meta.state_chaos_{row_metadata}",
            # No expiry: every batch commit stays for the check that none was committed twice.
            "maintenance": {"every_commits": 3, "expire_after_hours": None},
        },
        "snapshot": {"chunk_size": 50, "parallelism": 2, "chunks_per_commit": 4},
        "stream": {"batch_interval_seconds": 1, "batch_max_changes": 500},
        # acct is partitioned by its key and by a column every update changes (rows move between partitions: the
        # MERGE finds them by their before images); tag is unpartitioned, as targets are by default.
        "table_options": {"chaos.acct": {"partition_by": ["bucket(4, id)", "truncate(4, balance)"]}},
    }
    config_file = tmp_path / "pipeline.yaml"
    rng = random.Random(7)
    stop, done = threading.Event(), Counter[str]()
    writer = threading.Thread(target=_workload, args=(mariadb, stop, done))
    writer.start()
    phases: list[str] = []
    try:
        for attempt in range(KILLS):
            before = _offset(data, tmp_path)
            checkpoint = "kept" if attempt % 2 else "fresh"
            kept = {"checkpoint_location": str(tmp_path / "checkpoint")} if checkpoint == "kept" else {}
            config_file.write_text(yaml.safe_dump({**data, "stream": {**data["stream"], **kept}}))
            env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
            named = attempt >= SNAPSHOT_KILLS and (attempt - SNAPSHOT_KILLS) % 5 == 2
            if named:  # the job kills its own process group there, as a SIGKILL from outside would
                env[CRASH_ENV] = MAINTENANCE_POINTS[attempt // 10 % 2]  # each point in both kinds of run
            log_file = tmp_path / f"run-{attempt}.log"
            job = start_ingest(config_file, log_file, env)
            deadline = time.monotonic() + 180
            if attempt < SNAPSHOT_KILLS:
                # The first kills land in the snapshot: once this run has copied chunks, at a random moment.
                while time.monotonic() < deadline and job.poll() is None:
                    if ": chunks " in log_file.read_text():
                        break
                    time.sleep(0.2)
                time.sleep(rng.uniform(0, 2))
            else:
                # Later kills land in the binlog phase: once this run has committed a batch, at a random moment
                # (or, for a named point, when the job reaches it).
                while time.monotonic() < deadline and job.poll() is None:
                    if not named and _offset(data, tmp_path) != before:
                        break
                    time.sleep(1)
                time.sleep(0 if named else rng.uniform(0, 3))
            assert (job.poll() is not None) == named, (
                f"attempt {attempt}: the kill must hit a running job\n" + log_file.read_text()[-3000:]
            )
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=60)
            err = log_file.read_text()
            assert job.returncode == -signal.SIGKILL, err[-2000:]
            streaming = "binlog phase from " in err  # the query ran, with this run's kind of checkpoint
            phases.append(f"{_phase_at_kill(err)}/{checkpoint}" if streaming else _phase_at_kill(err))
    finally:
        stop.set()
        writer.join()
    print(f"{row_metadata}: {KILLS} kills, {Counter(phases)}, workload {dict(done)}")
    for phase in ("snapshot", "maintenance"):
        assert sum(p.startswith(f"{phase}/") for p in phases) >= 1, phases
    for checkpoint in ("fresh", "kept"):
        assert sum(p.endswith(f"/{checkpoint}") for p in phases) >= 2, phases
    assert sum(done.values()) > 200, done

    # The final catch-up may use bigger batches: batch boundaries are free to differ between runs. It reads what
    # chunks the killed runs left unread (each run lived a few seconds: the query reads chunk batches between its
    # binlog batches), then one change to each table after it, so that a run that is not killed commits a binlog
    # batch to both and each reaches its compaction count (a change before would be in a chunk read after it).
    config = parse_config({**data, "stream": {"batch_interval_seconds": 5, "batch_max_changes": 50000}}, tmp_path)
    run(config, spark=spark, until_caught_up=True)
    mariadb.execute(
        "UPDATE chaos.acct SET balance = balance + 1 ORDER BY id LIMIT 1", "UPDATE chaos.tag SET n = n + 1 LIMIT 1"
    )
    run(config, spark=spark, until_caught_up=True)
    assert verify(config, ranges=5)

    state = StateTable.open(config.sink, config.name)
    for table_id in ("chaos.acct", "chaos.tag"):
        assert set(state.times_recorded(table_id).values()) == {1}, f"{table_id}: a chunk recorded twice"
    catalog = load_pyiceberg_catalog(config.sink)
    for table in ("acct", "tag"):
        summaries = [s.summary.additional_properties for s in main_history(catalog.load_table(("chaos", table)))]
        offsets = [  # the job's rewrites carry the offset of the batch below them; they commit no batch
            json.loads(props[SUMMARY_STREAM_OFFSET])["position"]
            for props in summaries
            if SUMMARY_STREAM_OFFSET in props and SUMMARY_MAINTENANCE not in props
        ]
        assert offsets, f"{table}: no binlog batch was committed"
        assert len(offsets) == len(set(offsets)), f"{table}: a binlog batch was committed twice"
        if table == "acct":  # MERGEd by Spark: its delete files and small data files are compacted
            assert any(SUMMARY_MAINTENANCE in props for props in summaries), f"{table}: never compacted"
        else:  # a small target the driver applies batches to, rewriting the files it deletes from (driver_apply)
            current = catalog.load_table(("chaos", table)).current_snapshot()
            assert current is not None and current.summary is not None
            totals = current.summary.additional_properties
            assert totals["total-delete-files"] == "0", totals
            # Compaction rewrites 5 files or more (Iceberg's min-input-files): the table stays below that.
            assert int(totals["total-data-files"]) < 5 + 3, totals
