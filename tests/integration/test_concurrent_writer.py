"""Other writers at work. A writer runs random DML for the whole snapshot: each chunk's rows in Iceberg, moved
forward by replaying the binlog from that chunk's recorded high watermark to now, equal MySQL now, which holds
only if every chunk equals the table at its high watermark. And another Spark session compacts a target while
the job MERGEs into it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
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
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.summary import SUMMARY_STREAM_OFFSET
from ingest.source.discovery import discover
from ingest.source.mysql import connect
from ingest.source.snapshot.chunk_reader import ChunkTask, window_changes
from ingest.source.snapshot.chunks import range_predicate
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable
from tests.conftest import embedded_sink, main_history, minio_sink, source_section

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _writer(server: MariaDBServer, db: str, stop: threading.Event, counts: dict[str, int], pause: float = 0) -> None:
    rng = random.Random(7)
    with server.admin(db) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION autocommit = 0")
        while not stop.is_set():
            for _ in range(rng.randint(1, 4)):  # multi-statement transactions
                op = rng.choice(["update", "update", "delete", "insert", "move"])
                k = rng.randint(1, 4000)
                if op == "update":
                    cur.execute("UPDATE t SET v = v + 1, s = %s WHERE id = %s", (f"u{rng.random():.6f}", k))
                elif op == "delete":
                    cur.execute("DELETE FROM t WHERE id = %s", (k,))
                elif op == "insert":
                    cur.execute("INSERT IGNORE INTO t VALUES (%s, %s, 'new')", (k, rng.randint(0, 9)))
                else:  # a primary-key update moves a row to another chunk
                    cur.execute("UPDATE IGNORE t SET id = %s WHERE id = %s", (rng.randint(1, 4000), k))
                counts[op] = counts.get(op, 0) + cur.rowcount
            conn.commit()
            time.sleep(pause)


def test_each_chunk_equals_the_table_at_its_recorded_high_watermark(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    mariadb.execute(
        "DROP DATABASE IF EXISTS busy",
        "CREATE DATABASE busy",
        "CREATE TABLE busy.t (id INT NOT NULL PRIMARY KEY, v INT NOT NULL, s VARCHAR(20))",
        "INSERT INTO busy.t SELECT seq, seq % 10, CONCAT('s', seq) FROM busy.seq_1_to_3000",
    )
    config = parse_config(
        {
            "name": "busy",
            "source": source_section(mariadb),
            "tables": {"include": [r"busy\.t"]},
            "sink": embedded_sink(tmp_path),
            "snapshot": {"chunk_size": 150, "parallelism": 2, "chunks_per_commit": 5},
            "startup_mode": "snapshot_only",
        }
    )
    stop, counts = threading.Event(), {}
    writer = threading.Thread(target=_writer, args=(mariadb, "busy", stop, counts))
    writer.start()
    try:
        run(config, spark=spark)
    finally:
        stop.set()
        writer.join()
    assert sum(counts.values()) > 100, counts

    (schema,) = discover(config.source, config.tables, config.table_options).schemas
    state = StateTable.open(config.sink, config.name)
    records = state.done("busy.t")
    assert sum(r.window_events for r in records.values()) > 0, "no chunk had writes inside its window"
    iceberg = {
        r["id"]: (r["id"], r["v"], r["s"])
        for r in load_pyiceberg_catalog(config.sink).load_table(("busy", "t")).scan().to_arrow().to_pylist()
    }
    with connect(config.source) as conn:
        now = read_watermark(conn, "mariadb")
        for index, record in sorted(records.items()):
            chunk = record.chunk
            assert record.high_watermark is not None
            buffer = {
                (k,): row
                for k, row in iceberg.items()
                if (chunk.lower is None or (k,) >= chunk.lower) and (chunk.upper is None or (k,) < chunk.upper)
            }
            finals, _ = window_changes(
                ChunkTask(config.source, "mariadb", schema, chunk), conn, record.high_watermark, now
            )
            for key, row in finals.items():
                if row is None:
                    buffer.pop(key, None)
                else:
                    buffer[key] = row
            where, params = range_predicate(schema.chunk_key, chunk.lower, chunk.upper)
            with conn.cursor() as cur:
                cur.execute(f"SELECT id, v, s FROM busy.t WHERE {where}", params)
                mysql_now = sorted(tuple(r) for r in cur.fetchall())
            assert sorted(buffer.values()) == mysql_now, f"chunk {index} was not the table at its high watermark"


def test_a_compaction_another_session_commits_while_the_job_merges_is_retried_and_loses_nothing(
    spark: Any, mariadb: MariaDBServer, minio: MinioServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    """FAILURES.md "Concurrent writer or compaction while we MERGE": while the job streams (a process of its own),
    this test's Spark session compacts the same target again and again through the catalog on PostgreSQL. Each
    of the job's MERGEs that a compaction got ahead of fails Iceberg's validation, and the job must retry it
    from fresh state; each compaction a MERGE got ahead of fails instead. Either way nothing is lost or doubled."""
    mariadb.execute(
        "DROP DATABASE IF EXISTS rivals",
        "CREATE DATABASE rivals",
        "CREATE TABLE rivals.t (id INT NOT NULL PRIMARY KEY, v INT NOT NULL, s VARCHAR(20))",
        "INSERT INTO rivals.t SELECT seq, seq % 10, CONCAT('s', seq) FROM rivals.seq_1_to_4000",
    )
    data = {
        "name": "rivals",
        "source": source_section(mariadb),
        "tables": {"include": [r"rivals\.t"]},
        "sink": {
            **minio_sink(minio, postgres, minio.bucket("rivals")),
            "catalog_name": "rivallake",
            "state_table": "ingest_meta.state_rivals",
            "maintenance": {"every_commits": 0},  # only the other session compacts
        },
        "snapshot": {"chunk_size": 500, "parallelism": 2},
        "stream": {"batch_interval_seconds": 1},
    }
    config = parse_config(data)
    run(config, spark=spark, snapshot_only=True)
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))
    stop, counts = threading.Event(), {}
    writer = threading.Thread(target=_writer, args=(mariadb, "rivals", stop, counts, 0.01))
    log_file = tmp_path / "job.log"
    compactions = Counter[str]()
    with log_file.open("w") as stderr:
        job = subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", "run", "--config", str(config_file)],
            cwd=ROOT,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    writer.start()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and job.poll() is None:
            if compactions["committed"] >= 3 and "commit conflict at attempt" in log_file.read_text():
                break
            try:  # every data file, every time: each compaction overlaps the job's latest MERGE
                spark.sql(
                    "CALL rivallake.system.rewrite_data_files(table => 'rivals.t', "
                    "options => map('rewrite-all', 'true'))"
                ).collect()
                compactions["committed"] += 1
            except Exception as e:  # noqa: BLE001 - Iceberg's validation failure, surfaced by Spark
                assert "ValidationException" in str(e) or "CommitFailedException" in str(e), str(e)[:2000]
                compactions["refused"] += 1
        assert job.poll() is None, log_file.read_text()[-3000:]
    finally:
        stop.set()
        writer.join()
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(timeout=120)
        finally:
            os.killpg(job.pid, signal.SIGKILL)
    log = log_file.read_text()
    assert job.returncode == 0, log[-3000:]
    retries = log.count("commit conflict at attempt")
    print(f"compactions {dict(compactions)}, job MERGE retries {retries}, writes {counts}")
    assert retries >= 1, "no MERGE of the job met a compaction: the retry was not exercised"
    assert compactions["committed"] >= 3
    run(config, spark=spark, until_caught_up=True)
    assert verify(config, ranges=4)
    offsets = [
        json.loads(s.summary.additional_properties[SUMMARY_STREAM_OFFSET])["position"]
        for s in main_history(load_pyiceberg_catalog(config.sink).load_table(("rivals", "t")))
        if s.summary is not None
        and SUMMARY_STREAM_OFFSET in s.summary.additional_properties
        and s.summary.operation.value != "replace"
    ]
    assert offsets and len(offsets) == len(set(offsets)), "a batch was committed twice"
