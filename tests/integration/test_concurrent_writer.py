"""A writer runs random DML for the whole snapshot. Until the binlog phase exists, the proof is per chunk:
each chunk's rows in Iceberg, moved forward by replaying the binlog from that chunk's recorded high
watermark to now, equal MySQL now. That holds only if every chunk equals the table at its high watermark."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest

from ingest.config import parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.pipeline import discover, run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.source.chunk_reader import ChunkTask, window_changes
from ingest.source.chunks import range_predicate
from ingest.source.mysql import connect
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable
from tests.conftest import embedded_sink, source_section

pytestmark = pytest.mark.integration


def _writer(server: MariaDBServer, stop: threading.Event, counts: dict[str, int]) -> None:
    rng = random.Random(7)
    with server.admin("busy") as conn, conn.cursor() as cur:
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
    writer = threading.Thread(target=_writer, args=(mariadb, stop, counts))
    writer.start()
    try:
        run(config, spark=spark)
    finally:
        stop.set()
        writer.join()
    assert sum(counts.values()) > 100, counts

    (schema,) = discover(config).schemas
    state = StateTable.open(config)
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
