"""A job people can watch: the metrics endpoint scraped while the job runs, checked against what it did, and
`ingest status --watch` repeating the status until Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commands.verify import verify
from ingest.config import parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.process import free_port
from ingest.query.pipeline import run
from ingest.state.table import StateTable
from tests.conftest import embedded_sink, source_section
from tests.integration.test_streaming import ROOT, _fresh_db

pytestmark = pytest.mark.integration

TABLES = ("acct", "tag")


def _scrape(port: int) -> dict[str, float] | None:
    """Every sample of the endpoint (`name{labels}` -> value); None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _pipeline(mariadb: MariaDBServer, db: str, base: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": db,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{db}\..*"]},
        "sink": {**embedded_sink(base), "catalog_name": f"lake_{db}"},
        "snapshot": {"chunk_size": 50, "parallelism": 2, "chunks_per_commit": 2},
        "stream": {"batch_interval_seconds": 1},
        **extra,
    }


def test_the_metrics_a_running_job_serves_add_up_to_what_it_did(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "metrics_job"
    _fresh_db(mariadb, db)  # acct: 300 rows (integer key), tag: 60 rows (string key)
    with mariadb.admin() as conn, conn.cursor() as cur:
        source_rows = {}
        for table in TABLES:
            cur.execute(f"SELECT COUNT(*) FROM {db}.{table}")
            source_rows[table] = int(cur.fetchone()[0])
    port = free_port()
    pipeline = _pipeline(mariadb, db, tmp_path, metrics={"port": port})
    config = parse_config(pipeline)
    label = {t: f'{{table="{db}.{t}"}}' for t in TABLES}
    scrapes: list[dict[str, float]] = []
    last: dict[str, float] = {}
    ended = threading.Event()
    failure: list[str] = []

    def snapshot_done(got: dict[str, float]) -> bool:
        return all(
            got.get(f"ingest_snapshot_chunks_planned{label[t]}", 0)
            == got.get(f"ingest_snapshot_chunks_done{label[t]}", -1)
            for t in TABLES
        )

    def watch() -> None:
        """Scrape until the binlog changes written after the snapshot are counted and the job is caught up, then
        stop the job as Ctrl-C would (its handler runs on the main thread, where `run` waits)."""
        nonlocal last
        wrote = False
        deadline = time.monotonic() + 240
        try:
            while not ended.is_set() and time.monotonic() < deadline:
                got = _scrape(port)
                if got:
                    scrapes.append(got)
                    streaming = "ingest_lag_seconds" in got and snapshot_done(got)
                    if streaming and not wrote:
                        mariadb.execute(
                            f"UPDATE {db}.acct SET owner = 'scraped' WHERE id <= 25",
                            f"INSERT INTO {db}.tag VALUES ('m1', 1), ('m2', 2), ('m3', 3)",
                        )
                        wrote = True
                    applied = [got.get(f"ingest_binlog_changes_applied_total{label[t]}") for t in TABLES]
                    if wrote and applied == [25, 3] and got.get("ingest_binlog_bytes_behind") == 0:
                        last = got
                        return
                time.sleep(0.25)
            failure.append(f"not caught up with the changes in time; last scrape: {scrapes[-1:] or 'none'}")
        except Exception as e:  # noqa: BLE001 - reported by the test's thread
            failure.append(repr(e))
        finally:
            if not ended.is_set():
                os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        run(config, spark=spark)  # until the watcher's SIGINT
    finally:
        ended.set()
        watcher.join(timeout=30)
    assert not failure, failure
    assert _scrape(port) is None, "the endpoint closes with the job"

    state = StateTable.open(config.sink, config.name)
    for table in TABLES:
        assert last[f"ingest_snapshot_rows_total{label[table]}"] == source_rows[table]
        planned = len(state.plan(f"{db}.{table}") or [])
        assert (
            last[f"ingest_snapshot_chunks_done{label[table]}"] == last[f"ingest_snapshot_chunks_planned{label[table]}"]
        )
        assert last[f"ingest_snapshot_chunks_planned{label[table]}"] == planned > 1
    # Chunks are counted as they are committed: never backwards, in whatever scrape caught the snapshot.
    acct_done = [
        s[f"ingest_snapshot_chunks_done{label['acct']}"]
        for s in scrapes
        if f"ingest_snapshot_chunks_done{label['acct']}" in s
    ]
    assert acct_done == sorted(acct_done)
    assert last[f'ingest_pipeline_info{{pipeline="{db}"}}'] == 1
    assert last["ingest_binlog_bytes_behind"] == 0 and last["ingest_lag_seconds"] == 0  # caught up
    lags = [s["ingest_lag_seconds"] for s in scrapes if "ingest_lag_seconds" in s]
    assert lags and all(0 <= lag <= time.monotonic() - started + 5 for lag in lags)
    assert last["ingest_batch_duration_seconds_count"] >= 1
    assert 0 < last["ingest_last_batch_duration_seconds"] <= last["ingest_batch_duration_seconds_sum"]
    assert verify(config)


def test_status_watch_prints_the_status_again_until_ctrl_c(mariadb: MariaDBServer, tmp_path: Path) -> None:
    db = "metrics_watch"
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(_pipeline(mariadb, db, tmp_path)))
    status = subprocess.Popen(
        [sys.executable, "-m", "ingest.cli", "status", "--config", str(config_file), "--watch", "--interval", "1"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert status.stdout is not None
        lines.extend(status.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and status.poll() is None:
        if sum(line.startswith(f"pipeline {db}:") for line in lines) >= 2:
            break
        time.sleep(0.2)
    status.send_signal(signal.SIGINT)  # Ctrl-C
    _, err = status.communicate(timeout=30)
    reader.join(timeout=10)
    assert status.returncode == 0, err[-3000:]
    blocks = [i for i, line in enumerate(lines) if line.startswith(f"pipeline {db}:")]
    assert len(blocks) >= 2, "".join(lines)
    # Not a terminal: plain blocks one after another, each under the time it was read, none cleared.
    assert all("(every 1 s; Ctrl-C stops)" in lines[i - 1] and lines[i + 1].startswith("table ") for i in blocks)
    assert not any("\x1b" in line for line in lines)
    assert "binlog phase not started" in lines[blocks[0]]


def test_on_a_terminal_the_job_draws_its_progress_below_its_log(mariadb: MariaDBServer, tmp_path: Path) -> None:
    """`ingest run` with its stderr on a pseudo-terminal: the progress block is drawn again in place (erased with
    ANSI sequences) with per-table chunk lines, then the binlog line; the job's log lines come through whole."""
    import pty

    db = "metrics_tty"
    _fresh_db(mariadb, db)
    pipeline = _pipeline(mariadb, db, tmp_path)
    pipeline["snapshot"] = {**pipeline["snapshot"], "chunks_per_commit": 1}
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(pipeline))
    controller, terminal = pty.openpty()
    job = subprocess.Popen(
        [sys.executable, "-m", "ingest.cli", "run", "--config", str(config_file), "--until-caught-up"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=terminal,
        env={**os.environ, "TERM": "xterm"},
        start_new_session=True,
    )
    os.close(terminal)
    screen = bytearray()
    try:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the job closed the terminal (EIO)
                break
            if not chunk:
                break
            screen.extend(chunk)
        assert job.wait(timeout=300) == 0, screen.decode(errors="replace")[-3000:]
    finally:
        os.close(controller)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    text = screen.decode(errors="replace")
    assert "\x1b[J" in text, text[-3000:]  # drawn again in place
    assert f"snapshot {db}.acct  chunks " in text and "rows/s, ETA " in text, text[-3000:]
    assert f"snapshot {db}.acct  complete, 6 chunks, 300 rows copied" in text, text[-3000:]
    assert "binlog   lag " in text and "changes/s" in text, text[-3000:]
    # Log records are written whole, each on a line of its own after the block is erased.
    assert any(
        line.endswith(f"{db}.acct: planned 6 chunks of up to 50 rows") for line in text.replace("\r", "\n").split("\n")
    )
    assert verify(parse_config(pipeline))
