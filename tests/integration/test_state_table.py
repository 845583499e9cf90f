"""The state table stays bounded over a long stream (FAILURES.md "Many small commits: metadata and file counts
stay bounded by the maintenance the job runs"), and a crash in the middle of its maintenance loses no offset.

pyiceberg on a real SQLite catalog and local warehouse; no Spark needed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ingest.config import PipelineConfig, parse_config
from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import PostgresServer
from ingest.faults import ENV as CRASH_ENV
from ingest.model.position import BinlogPosition, Watermark
from ingest.source.snapshot.chunks import Chunk
from ingest.state.table import (
    KIND_OFFSET,
    STATE_ARROW_SCHEMA,
    ChunkRecord,
    StateTable,
    _row,
)
from ingest.state.writes import MAX_SNAPSHOTS
from tests.conftest import embedded_sink, minio_sink

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _config(base: Path, name: str = "long", sink: dict[str, Any] | None = None) -> PipelineConfig:
    return parse_config(
        {
            "name": name,
            "source": {"host": "h", "user": "u", "password": {"env": "HOME"}},
            "tables": {"include": [r"db\..*"]},
            "sink": sink or embedded_sink(base),
        }
    )


def _at(pos: int) -> Watermark:
    return Watermark(BinlogPosition("mysql-bin.000001", pos), None)


def _planned(config: PipelineConfig) -> StateTable:
    state = StateTable.open(config.sink, config.name)
    plan = [Chunk("db.t", 0, None, (100,)), Chunk("db.t", 1, (100,), (200,)), Chunk("db.t", 2, (200,), None)]
    state.save_plan("db.t", plan, _at(4))
    state.record_chunks([ChunkRecord(c, _at(10 + c.index), _at(5), 100) for c in plan[:2]])
    state.record_chunks([ChunkRecord(plan[2], _at(20), _at(5), 7)])
    return state


def _files(base: Path) -> int:
    return sum(1 for p in (base / "warehouse").rglob("*") if p.is_file())


@pytest.fixture(params=["embedded", "s3"])
def profile(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[PipelineConfig, Callable[[], int]]:
    """A pipeline config in one catalog profile, and a count of the files in its warehouse."""
    if request.param == "embedded":
        return _config(tmp_path), lambda: _files(tmp_path)
    minio: MinioServer = request.getfixturevalue("minio")
    postgres: PostgresServer = request.getfixturevalue("postgres")
    bucket = minio.bucket(f"state-{tmp_path.name.lower().replace('_', '-')}"[:63])
    sink = {**minio_sink(minio, postgres, bucket), "state_table": f"ingest_meta.state_{tmp_path.name.lower()}"}
    client = minio.s3_client()

    def objects() -> int:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sum(len(page.get("Contents", [])) for page in pages)

    return _config(tmp_path, sink=sink), objects


def test_many_batches_keep_snapshots_live_files_and_storage_bounded(
    profile: tuple[PipelineConfig, Callable[[], int]],
) -> None:
    config, files = profile
    state = _planned(config)
    state.record_offset(_at(999))
    before = len(state._table.snapshots())
    state.record_offset(_at(1000))
    assert len(state._table.snapshots()) == before + 1  # the old row's removal and the new row: one snapshot
    sizes = []
    for i in range(1, 81):
        state.record_offset(_at(1000 + i))
        if i % 20 == 0:
            table = state._table
            current = table.current_snapshot()
            assert current is not None
            sizes.append((len(table.snapshots()), state.live_files(), len(current.manifests(table.io)), files()))
    for snapshots, live, manifests, files in sizes:
        assert snapshots <= MAX_SNAPSHOTS + 2
        assert live <= 4  # plan, two chunk appends, one offset row
        assert manifests <= 5  # theirs, and the one listing the offset file this snapshot removed
        assert files <= 150, sizes  # grows with the expiry window, not with the number of batches
    assert sizes[-1][3] <= max(s[3] for s in sizes[:3]) + 10, sizes

    reopened = StateTable.open(config.sink, config.name)
    assert reopened.stream_offset() == _at(1080)
    assert [c.index for c in reopened.plan("db.t") or []] == [0, 1, 2]
    assert reopened.times_recorded("db.t") == {0: 1, 1: 1, 2: 1}
    assert reopened.done("db.t")[2].high_watermark == _at(20)
    rows = reopened._table.scan(row_filter=f"kind = '{KIND_OFFSET}'").to_arrow().to_pylist()
    assert len(rows) == 1


def test_a_state_table_written_by_the_append_only_version_is_cleaned_by_the_first_offset(tmp_path: Path) -> None:
    config = _config(tmp_path, name="legacy")
    state = _planned(config)
    marker = Chunk("*", -1, None, None)
    for pos in (300, 100, 200):  # the old code appended one offset row per batch
        row = _row(
            config.name,
            KIND_OFFSET,
            marker,
            dt.datetime.now(dt.UTC),
            ChunkRecord(marker, _at(pos)),
        )
        state._table.append(pa.Table.from_pylist([row], schema=STATE_ARROW_SCHEMA))
    assert StateTable.open(config.sink, config.name).stream_offset() == _at(200)  # the newest row wins, as before
    neighbour = _config(tmp_path, name="neighbour")
    other = StateTable.open(neighbour.sink, neighbour.name)  # another pipeline sharing the table
    other.record_offset(_at(7))
    state = StateTable.open(config.sink, config.name)
    state.record_offset(_at(400))
    offsets = state._table.scan(row_filter=f"kind = '{KIND_OFFSET}'").to_arrow().to_pylist()
    assert sorted((r["pipeline"], Watermark.from_json(json.loads(r["high_watermark"]))) for r in offsets) == [
        ("legacy", _at(400)),
        ("neighbour", _at(7)),
    ]
    assert StateTable.open(neighbour.sink, neighbour.name).stream_offset() == _at(7)


@pytest.mark.parametrize("crash_at", ["state.before_expire:1", "state.after_expire:1", "state.after_expire:2"])
def test_kill_9_during_maintenance_loses_no_offset_and_the_next_runs_go_on(tmp_path: Path, crash_at: str) -> None:
    config = _config(tmp_path)
    _planned(config)
    script = textwrap.dedent(
        f"""
        import sys
        from tests.integration.test_state_table import _at, _config
        from ingest.state.table import StateTable
        from pathlib import Path
        config = _config(Path({str(tmp_path)!r}))
        state = StateTable.open(config.sink, config.name)
        for i in range(1, 200):
            print(i, flush=True)
            state.record_offset(_at(1000 + i))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    env[CRASH_ENV] = crash_at
    job = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
        check=False,
    )
    assert job.returncode == -signal.SIGKILL, job.stderr[-3000:]
    last = int(job.stdout.split()[-1])
    assert last >= MAX_SNAPSHOTS // 2  # the crash was in maintenance, which first runs when history is full
    state = StateTable.open(config.sink, config.name)
    # Maintenance runs after the offset's own commit: the offset being recorded at the crash is durable.
    assert state.stream_offset() == _at(1000 + last)
    assert state.times_recorded("db.t") == {0: 1, 1: 1, 2: 1}
    for i in range(1, 60):
        state.record_offset(_at(5000 + i))
    assert StateTable.open(config.sink, config.name).stream_offset() == _at(5059)
    assert len(state._table.snapshots()) <= MAX_SNAPSHOTS + 2


def test_snapshot_requests_are_read_fresh_and_go_with_the_tables_state(tmp_path: Path) -> None:
    """`ingest snapshot` writes from another process than the job's: the job must see the rows it adds."""
    config = _config(tmp_path, "asks")
    job = _planned(config)  # db.t is planned
    cli = StateTable.open(config.sink, config.name)
    cli.ask_snapshot(["db.new"], again=False)
    cli.ask_snapshot(["db.t"], again=True)
    cli.pause(["db.t"])
    cli.pause(["db.t"])  # twice is once
    requests = job.requests()
    assert requests.snapshot == {"db.new": False, "db.t": True}
    assert requests.paused == {"db.t"}
    job.drop_signals("db.new")
    assert job.requests().snapshot == {"db.t": True}
    cli.resume(["db.t"])
    assert job.requests().paused == set()
    cli.pause(["db.t"])
    job.forget("db.t")  # copied again: its requests and its pause go with its plan, in one commit
    assert job.requests().snapshot == {} and job.requests().paused == set()
    assert job.plan("db.t") is None
    cli.ask_snapshot(["db.new"], again=False)
    assert StateTable.open(config.sink, config.name).tables() == []  # request rows are not tables


def test_plans_and_records_inside_one_commit_are_written_together_and_in_order_with_other_writes(
    tmp_path: Path,
) -> None:
    """Many small tables: their plans and chunk records in one state commit, readable at once by the writer; a
    delete inside the block writes what came before it first, so the order of writes holds."""
    config = _config(tmp_path, "one")
    state = StateTable.open(config.sink, config.name)
    commits = len(state._table.snapshots())
    at = Watermark(BinlogPosition("b.000001", 4), None, 1)
    with state.one_commit():
        for name in ("a", "b", "c"):
            chunk = Chunk(f"db.{name}", 0, None, None)
            state.save_plan(f"db.{name}", [chunk], at)
            state.record_chunks([ChunkRecord(chunk, at, at)])
            assert state.plan(f"db.{name}") == [chunk] and list(state.done(f"db.{name}")) == [0]
        assert StateTable.open(config.sink, config.name).tables() == []  # nothing written yet
        state.forget("db.b")  # a delete: the rows before it are written first, then it removes db.b's
        assert StateTable.open(config.sink, config.name).tables() == ["db.a", "db.c"]
        with state.one_commit():  # an inner block joins the outer one
            state.save_plan("db.d", [Chunk("db.d", 0, None, None)], at)
        assert StateTable.open(config.sink, config.name).tables() == ["db.a", "db.c"]
    again = StateTable.open(config.sink, config.name)
    assert again.tables() == ["db.a", "db.c", "db.d"]
    assert again.times_recorded("db.a") == {0: 1} and again.times_recorded("db.b") == {}
    assert len(again._table.snapshots()) == commits + 3  # the rows before the delete, the delete, the rest
    with pytest.raises(RuntimeError), state.one_commit():  # what was done before an error is still recorded
        state.save_plan("db.e", [Chunk("db.e", 0, None, None)], at)
        raise RuntimeError("the copy of the next table failed")
    assert "db.e" in StateTable.open(config.sink, config.name).tables()


def test_a_block_that_holds_records_for_a_time_writes_them_once_that_time_has_passed(tmp_path: Path) -> None:
    """`--snapshot-only` holds the records of small tables' copies back for a time (`one_commit(hold_s=...)`):
    a record appended after the oldest one waited that long writes them all; a long hold writes at the end."""
    config = _config(tmp_path, "held")
    state = StateTable.open(config.sink, config.name)
    at = Watermark(BinlogPosition("b.000001", 4), None, 1)
    with state.one_commit():
        for name in ("a", "b", "c"):
            state.save_plan(f"db.{name}", [Chunk(f"db.{name}", 0, None, None)], at)
    commits = len(state._table.snapshots())

    def record(name: str) -> None:
        state.record_chunks([ChunkRecord(Chunk(f"db.{name}", 0, None, None), at, at)])

    with state.one_commit(hold_s=3600):
        record("a")
        record("b")
        assert StateTable.open(config.sink, config.name).times_recorded("db.a") == {}  # held
    assert StateTable.open(config.sink, config.name).times_recorded("db.b") == {0: 1}
    assert len(state._table.snapshots()) == commits + 1
    with state.one_commit(hold_s=0):
        record("c")  # it has waited long enough at once
        assert StateTable.open(config.sink, config.name).times_recorded("db.c") == {0: 1}
    assert len(state._table.snapshots()) == commits + 2
