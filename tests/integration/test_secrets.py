"""FAILURES.md "Security": no secret of the pipeline leaves the places it was given to. The job runs on the S3
profile (MinIO through S3FileIO, the JDBC catalog on PostgreSQL) with all three of its secrets read from files:
the MySQL password, the catalog database's password and the S3 secret key. While it snapshots and streams
in its Structured Streaming query, every process of its tree (the Python driver, the JVM, Python workers)
is read from /proc; afterwards its output at DEBUG, the JVM's log at DEBUG, Spark's event log, every file it
wrote, every object in its bucket and every row of the catalog database are searched."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
import yaml

from ingest.commands.verify import verify
from ingest.config import parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import CATALOG_DB, PostgresServer
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable
from tests.conftest import minio_sink, source_section

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

JVM_DEBUG_LOG = """\
rootLogger.level = debug
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d %p %c: %m%n
"""


def _session_processes(session: int) -> Iterator[tuple[int, bytes, bytes]]:
    """(pid, command line, environment) of every live process of a session, children of children included."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # The fields after the command name, which may itself hold spaces and parentheses.
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) != session:
                continue
            yield int(entry.name), (entry / "cmdline").read_bytes(), (entry / "environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # it ended while being read


def _catalog_rows(postgres: PostgresServer) -> list[str]:
    """Every row of every table of the catalog database, as text."""
    with (
        psycopg2.connect(
            host=postgres.host, port=postgres.port, user=postgres.user, password=postgres.password, dbname=CATALOG_DB
        ) as conn,
        conn.cursor() as cur,
    ):
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = [name for (name,) in cur.fetchall()]
        rows: list[str] = []
        for table in tables:
            cur.execute(f'SELECT row_to_json(t)::text FROM "{table}" t')
            rows += [text for (text,) in cur.fetchall()]
    assert any("metadata_location" in row for row in rows), tables  # the job's tables really are there
    return rows


def test_no_secret_reaches_a_command_line_an_environment_a_log_or_anything_written(
    mariadb: MariaDBServer, minio: MinioServer, postgres: PostgresServer, tmp_path: Path, cdc_password: str
) -> None:
    mariadb.execute(
        "DROP DATABASE IF EXISTS hush",
        "CREATE DATABASE hush",
        "CREATE TABLE hush.acct (id INT NOT NULL PRIMARY KEY, owner VARCHAR(20), n INT)",
        "INSERT INTO hush.acct SELECT seq, CONCAT('o', seq), seq FROM hush.seq_1_to_400",
    )
    bucket = minio.bucket("hush")
    secrets = {"mysql": cdc_password, "catalog": postgres.password, "s3": minio.secret_key}
    files = tmp_path / "secrets"
    files.mkdir(mode=0o700)
    for name, value in secrets.items():
        (files / name).write_text(value + "\n")
    sink = minio_sink(minio, postgres, bucket)
    sink["catalog"].update(
        {"jdbc.password": {"file": str(files / "catalog")}, "s3.secret-access-key": {"file": str(files / "s3")}}
    )
    events = tmp_path / "events"
    events.mkdir()
    jvm_log = tmp_path / "jvm-debug.log"
    log4j = tmp_path / "log4j2.properties"
    log4j.write_text(JVM_DEBUG_LOG.format(path=jvm_log))
    data = {
        "name": "hush",
        "source": {**source_section(mariadb), "password": {"file": str(files / "mysql")}},
        "tables": {"include": [r"hush\..*"]},
        "sink": {**sink, "catalog_name": "hushlake", "state_table": "ingest_meta.state_hush"},
        "snapshot": {"chunk_size": 100, "parallelism": 2},
        # Spark's MERGE, not the driver's apply: Iceberg's JVM side, with its catalog and S3 clients, is what
        # logs at DEBUG here. The snapshot's data files are written by the Python workers, whose FileIO holds the S3
        # secret.
        "stream": {
            "batch_interval_seconds": 1,
            "checkpoint_location": str(tmp_path / "cp"),
            "driver_apply_max_rows": 0,
        },
        "spark": {
            "conf": {
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": f"file://{events}",
                "spark.eventLog.compress": "false",  # searchable as it is
                "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}",
            }
        },
    }
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))
    # The test's own environment holds the secrets (the fixtures put them there); the job's must not.
    env = {k: v for k, v in os.environ.items() if v not in secrets.values()}
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        job = subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", "--log-level", "DEBUG", "run", "--config", str(config_file)],
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=stdout,
            stderr=stderr,
        )
    config = parse_config(data, tmp_path)
    seen: dict[int, bytes] = {}
    try:
        deadline = time.monotonic() + 240
        updates = 0
        last_update = None
        while time.monotonic() < deadline and job.poll() is None:
            for pid, cmdline, environ in _session_processes(job.pid):
                seen[pid] = cmdline
                for name, value in secrets.items():
                    assert value.encode() not in cmdline, f"the {name} secret is on the command line of {cmdline!r}"
                    assert value.encode() not in environ, f"the {name} secret is in the environment of {cmdline!r}"
            log = err.read_text()
            if last_update is None and "binlog phase from " in log:
                # Changes keep arriving, so the streaming query keeps running batches in Python workers, until
                # Spark's MERGE has committed some (an update of a row whose chunk is read later is in the chunk).
                mariadb.execute(f"UPDATE hush.acct SET n = n + 1 WHERE id = {updates % 400 + 1}")
                updates += 1
                if updates >= 5 and re.search(r"binlog: committed [1-9]", log):
                    with mariadb.admin() as conn:
                        last_update = read_watermark(conn, "mariadb").position
            if last_update is not None:
                # The stop is sent once the job has committed the last update: a SIGTERM gives a loaded machine
                # only STOP_GRACE_SECONDS to catch up, and what this test compares afterwards is every row.
                offset = StateTable.open(config.sink, config.name).stream_offset()
                if offset is not None and offset.position >= last_update:
                    break
            time.sleep(1)
        assert job.poll() is None, err.read_text()[-3000:]
        assert last_update is not None, "the job never reached the binlog phase"
        assert time.monotonic() < deadline, f"the job never committed up to {last_update}"
    finally:
        job.send_signal(signal.SIGTERM)  # the job stops after its current commit
        try:
            job.wait(timeout=120)
        finally:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0, err.read_text()[-3000:]
    commands = b"\n".join(seen.values())
    assert b"java" in commands and b"pyspark" in commands, "the JVM and a Python worker were both looked at"
    assert b"ingest.runtime.daemon" in commands, "Spark forks the Python workers from the job's daemon"
    assert len(seen) >= 3, seen

    assert verify(config)
    texts = {"job stdout": out.read_bytes(), "job stderr": err.read_bytes(), "JVM log": jvm_log.read_bytes()}
    assert b"DEBUG" in texts["job stderr"] and b" DEBUG org.apache.iceberg" in texts["JVM log"]
    assert b"binlog: committed" in texts["job stderr"]
    logs = [p for p in events.rglob("*") if p.is_file()]
    assert logs and any(b"SparkListenerSQLExecutionStart" in p.read_bytes() for p in logs), logs
    for path in tmp_path.rglob("*"):
        if path.is_file() and files not in path.parents:
            texts[str(path)] = path.read_bytes()
    s3 = minio.s3_client()
    for item in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        texts[f"s3://{bucket}/{item['Key']}"] = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    assert any(name.endswith(".parquet") for name in texts)
    texts["catalog database"] = "\n".join(_catalog_rows(postgres)).encode()
    for where, content in texts.items():
        for name, value in secrets.items():
            assert value.encode() not in content, f"the {name} secret is in {where}"
