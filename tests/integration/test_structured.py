"""The job's Structured Streaming query itself: the binlog Python data source, its offsets and chunk batches, the
foreachBatch commit, a kept checkpoint, and what Spark reports of the query (test_streaming covers the binlog
phase's behaviour, test_chaos random kills). Tests that apply changes end with `ingest verify`."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql.streaming import StreamingQueryListener

from ingest import metrics
from ingest.commands.snapshot import ask_snapshot
from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import ConfigError, SchemaChangeError
from ingest.model.position import Watermark
from ingest.query.binlog_source import OBSERVED, BinlogSourceSpec, BinlogStreamReader, decode_batch
from ingest.query.pipeline import run, streaming_of
from ingest.query.start import prepare
from ingest.query.structured import query_name
from ingest.source.discovery import discover
from ingest.source.mysql import connect
from ingest.state.table import StateTable
from tests.conftest import embedded_sink, run_ingest, source_section
from tests.integration.test_streaming import (
    _config,
    _fresh_db,
    _stream_offsets,
    write_config_file,
    write_dml,
)

pytestmark = pytest.mark.integration


def _structured(mariadb: MariaDBServer, db: str, warehouse: Path, catalog: str = "", **stream: Any) -> PipelineConfig:
    """A catalog name of its own per test (a Spark session keeps catalogs by name)."""
    return _config(mariadb, db, warehouse, catalog=catalog or f"s_{db}", **stream)


@pytest.mark.spark_compat
# At NO_LOG only: the replay decodes the batch by position with the schema at the checkpoint's offsets, the harder of
# the two settings; FULL's names change nothing in what Spark replays or what the sink finds committed.
@pytest.mark.parametrize("row_metadata", ["NO_LOG"], indirect=True)
def test_a_kill_9_with_a_kept_checkpoint_replays_the_same_batch_and_commits_it_once(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, row_metadata: str
) -> None:
    """Killed between two tables' commits of a batch, then, resumed, after the whole batch is committed but before
    Spark records it: each run replays the batch Spark planned from its offset log, and the table that missed it
    commits it with the very same end offset; no table commits a batch twice."""
    db = "skill"
    _fresh_db(mariadb, db)
    checkpoint = tmp_path / "checkpoint"
    # One table after the other: the first kill after a table is staged falls between the two tables.
    settings = {"checkpoint_location": str(checkpoint), "concurrent_merges": 1}
    catalog = f"s_{row_metadata}"
    config = _structured(mariadb, db, tmp_path, catalog, **settings)
    run(config, spark=spark, snapshot_only=True)
    write_dml(mariadb, db)  # its first transaction changes both tables: any batch holding it commits both
    config_file = write_config_file(mariadb, db, tmp_path, catalog, **settings)
    cut_short: list[str] = []
    # Killed with the batch staged and not committed, then with it committed and Spark's commit log not written.
    for crash_at in ("stream.after_table_commit:1", "atomic.after_swap:1"):
        before = _stream_offsets(config, db, "acct")
        crashed = run_ingest("run", "--config", str(config_file), crash_at=crash_at)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
        acct, tag = _stream_offsets(config, db, "acct"), _stream_offsets(config, db, "tag")
        if crash_at.startswith("atomic.after_swap"):
            assert len(acct) > len(before) and acct[-1] in tag, "the batch's one commit holds both tables"
            cut_short.append(acct[-1])
        else:
            assert acct == before, "a staged batch is in no table"
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    acct, tag = _stream_offsets(config, db, "acct"), _stream_offsets(config, db, "tag")
    # Each batch is committed once per table: the batch Spark replays from its offset log after the second kill is
    # found in both tables, with the very same end offset, and committed to neither again.
    assert len(acct) == len(set(acct)) and len(tag) == len(set(tag))
    assert all(offset in tag and offset in acct for offset in cut_short), cut_short


def test_a_kill_9_inside_a_chunk_batch_with_a_kept_checkpoint_reads_each_chunk_once(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """The query reads the snapshot in chunk batches. Killed after a chunk batch's rows are committed to the target
    and before the state table records them: the next run records them from the target's snapshot summary, Spark
    runs the batch again from its offset log (the same chunks), and the sink reads none of them twice."""
    db = "schunks"
    _fresh_db(mariadb, db)
    write_dml(mariadb, db)  # changes in the binlog too, between and after the chunk batches
    checkpoint = tmp_path / "checkpoint"
    settings = {"checkpoint_location": str(checkpoint)}
    config = _structured(mariadb, db, tmp_path, **settings)
    config_file = write_config_file(mariadb, db, tmp_path, f"s_{db}", **settings)
    crashed = run_ingest("run", "--config", str(config_file), crash_at="snapshot.after_commit:1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert '"chunks"' in (checkpoint / "offsets" / "0").read_text()  # the batch Spark planned is a chunk batch
    assert not (checkpoint / "commits" / "0").exists()
    state = StateTable.open(config.sink, config.name)
    assert state.done(f"{db}.acct") == {} and len(state.plan(f"{db}.acct") or []) == 6
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    state = StateTable.open(config.sink, config.name)
    for table in ("acct", "tag"):
        assert state.times_recorded(f"{db}.{table}") == {i: 1 for i in range(len(state.plan(f"{db}.{table}") or []))}


def test_small_tables_share_a_chunk_batch_and_a_kill_9_between_their_commits_reads_each_chunk_once(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Tables of one chunk each are read in one chunk batch: a commit per table, appended by the driver, and one
    state commit for the batch's records. Killed after the second table's commit, before that state commit: the
    kept checkpoint's batch names all three tables, the next run records the first two from their targets'
    snapshot summaries, replays the batch, reads only the third, and every change in the binlog lands."""
    db = "slone"
    tables = ("l1", "l2", "l3")
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        *(f"CREATE TABLE {db}.{t} (id INT NOT NULL PRIMARY KEY, v VARCHAR(10))" for t in tables),
        *(f"INSERT INTO {db}.{t} SELECT seq, CONCAT('{t}-', seq) FROM {db}.seq_1_to_30" for t in tables),
        *(f"UPDATE {db}.{t} SET v = 'changed' WHERE id % 4 = 0" for t in tables),
        *(f"DELETE FROM {db}.{t} WHERE id = 7" for t in tables),
    )
    checkpoint = tmp_path / "checkpoint"
    data = {
        "name": db,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{db}\..*"]},
        "sink": {**embedded_sink(tmp_path), "catalog_name": f"s_{db}"},
        "snapshot": {"chunk_size": 50},
        "stream": {"batch_interval_seconds": 1, "checkpoint_location": str(checkpoint)},
    }
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))
    config = parse_config(data, tmp_path)
    crashed = run_ingest("run", "--config", str(config_file), crash_at="snapshot.after_commit:2")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    planned = json.loads((checkpoint / "offsets" / "0").read_text().splitlines()[-1])["chunks"]
    assert planned == {"parts": [[f"{db}.{t}", [0]] for t in tables]}, planned  # one micro-batch for the three
    state = StateTable.open(config.sink, config.name)
    assert [len(state.done(f"{db}.{t}")) for t in tables] == [0, 0, 0]  # l1 and l2 committed, none recorded
    assert len(state.plan(f"{db}.l3") or []) == 1  # the plans were recorded, in one commit before the query
    mariadb.execute(f"UPDATE {db}.l3 SET v = 'after' WHERE id < 5", f"INSERT INTO {db}.l1 VALUES (100, 'new')")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    state = StateTable.open(config.sink, config.name)
    for t in tables:
        assert state.times_recorded(f"{db}.{t}") == {0: 1}, t


class _QueriesStarted(StreamingQueryListener):  # type: ignore[misc]
    """What a Spark user watching the job sees: the queries started, and each micro-batch's progress (batch id,
    input rows, the row changes it observed)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.progress: list[tuple[int, int, int]] = []
        self.ended = 0

    def onQueryStarted(self, event: Any) -> None:
        self.names.append(event.name)

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        observed = p.observedMetrics.get(OBSERVED)
        self.progress.append((p.batchId, p.numInputRows, -1 if observed is None else observed["changes"]))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self.ended += 1


def _watched_run(spark: Any, config: PipelineConfig) -> _QueriesStarted:
    """`run(until_caught_up=True)` with a listener on the session, returned once it has heard the query end (Spark's
    listener bus delivers events on a thread of its own)."""
    started = _QueriesStarted()
    spark.streams.addListener(started)
    try:
        run(config, spark=spark, until_caught_up=True)
        deadline = time.monotonic() + 30
        while not started.ended and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(started)
    return started


def test_a_paused_table_keeps_its_chunks_unread_and_a_run_until_caught_up_ends_without_them(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """The query reads the chunks of every table but one paused before the first run; `--until-caught-up` ends once
    the others are read and the binlog is caught up. Resumed, the next run reads the rest and ends equal."""
    db = "spause"
    _fresh_db(mariadb, db)
    config = _structured(mariadb, db, tmp_path)
    ask_snapshot(config, [f"{db}.tag"], "pause")
    write_dml(mariadb, db)
    started = _watched_run(spark, config)
    assert started.names == [query_name(config.name)] == [f"ingest_{config.name}"]  # the snapshot and binlog: one query
    state = StateTable.open(config.sink, config.name)
    assert len(state.done(f"{db}.acct")) == len(state.plan(f"{db}.acct") or []) > 0
    assert state.done(f"{db}.tag") == {} and len(state.plan(f"{db}.tag") or []) > 0
    ask_snapshot(config, [f"{db}.tag"], "resume")
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)


@pytest.mark.spark_compat
def test_spark_reports_every_micro_batch_with_the_changes_it_applied(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Spark's own view of the job, as its UI, a listener or `lastProgress` show it: a progress event for every
    micro-batch, the last one too, each with its parts as input rows and the row changes it applied observed
    (`observedMetrics["ingest"]`); together, the changes the job's own metrics counted."""
    db = "sprogress"
    _fresh_db(mariadb, db)
    config = _structured(mariadb, db, tmp_path, batch_max_changes=40)
    run(config, spark=spark, snapshot_only=True)
    write_dml(mariadb, db)
    started = _watched_run(spark, config)
    # Spark's own view: a progress event for every micro-batch, the last one too, each with its parts as input rows
    # and the row changes it applied observed; together, the changes the job's metrics counted.
    # (An idle trigger repeats the next batch's id with no input; of each id, the event with its rows counts.)
    ran: dict[int, tuple[int, int]] = {}
    for batch, rows, changes in started.progress:
        if batch not in ran or rows > ran[batch][0]:
            ran[batch] = (rows, changes)
    assert sorted(ran) == list(range(len(ran))) and len(ran) >= 2, started.progress
    assert all(rows >= 1 for batch, (rows, _) in ran.items() if batch > 0), started.progress  # 4.0's first: empty
    applied = sum(metrics.latest().progress().changes.values())
    assert sum(changes for _, changes in ran.values()) == applied > 0, (started.progress, applied)
    assert verify(config)


def test_a_replayed_batch_reads_the_same_events_as_the_first_read(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "sreplay"
    _fresh_db(mariadb, db)
    config = _structured(mariadb, db, tmp_path, batch_max_changes=40)
    run(config, spark=spark, snapshot_only=True)
    write_dml(mariadb, db)
    mariadb.execute(
        f"ALTER TABLE {db}.acct ADD COLUMN note VARCHAR(8) DEFAULT 'n'",
        f"INSERT INTO {db}.acct VALUES (3000, 'after', 1, 'ddl')",
        f"UPDATE {db}.acct SET note = 'set' WHERE id < 20",
    )
    info = discover(config.source, config.tables, config.table_options)
    with connect(config.source) as conn:
        begin = prepare(
            streaming_of(config), StateTable.open(config.sink, config.name), info.schemas, conn, info.flavor, True
        )
    assert begin.goal is not None
    spec = BinlogSourceSpec(
        streaming_of(config), info.flavor, tuple(begin.tables), begin.mark, begin.contained_until, goal=begin.goal
    )
    live = BinlogStreamReader(spec)
    batches = []
    start = live.initialOffset()
    deadline = time.monotonic() + 60
    while Watermark.from_json(start).position < begin.goal and time.monotonic() < deadline:
        rows, end = live.read(start)
        if end != start:
            batches.append((start, end, list(rows)))
            start = end
        else:
            time.sleep(0.1)
    live.stop()
    decoded = [decode_batch(rows) for _, _, rows in batches]
    assert Watermark.from_json(start).position == begin.goal
    assert len(batches) >= 3 and sum(b.ddl is not None for b in decoded) == 1  # the ALTER begins a batch
    final: dict[int, dict[str, Any]] = {}  # each batch's rows of acct, one per key, the later batch winning
    for batch in decoded:
        for part in batch.tables:
            if part.table_id == f"{db}.acct" and part.rows is not None:
                final.update((row["id"], row) for row in part.rows.to_pylist())
    assert final[3000]["note"] == "ddl" and (final[1]["owner"], final[1]["note"]) == ("thrice", "set")
    replay = BinlogStreamReader(spec)  # a new process after a crash: it starts from the targets' schemas again
    for start, end, rows in batches:
        again, first = decode_batch(list(replay.readBetweenOffsets(start, end))), decode_batch(rows)
        assert (again.ddl, again.tables, again.end.offset) == (first.ddl, first.tables, end)
    replay.stop()


def test_an_error_of_the_binlog_source_stops_the_job_with_its_own_class_and_message(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "sfail"
    _fresh_db(mariadb, db)
    config = _structured(mariadb, db, tmp_path, on_schema_change="fail")
    run(config, spark=spark, snapshot_only=True)
    mariadb.execute(
        f"INSERT INTO {db}.acct VALUES (5000, 'before', 1)",
        f"ALTER TABLE {db}.acct ADD COLUMN note VARCHAR(8)",
        f"INSERT INTO {db}.acct VALUES (5001, 'after', 1, 'x')",
    )
    with pytest.raises(SchemaChangeError, match=r"on_schema_change.*is .fail."):
        run(config, spark=spark, until_caught_up=True)
    assert spark.streams.active == []
    # Everything before the statement is committed.
    ids = {r[0] for r in spark.sql(f"SELECT id FROM s_{db}.{db}.acct WHERE id >= 5000").collect()}
    assert ids == {5000}


def test_a_checkpoint_ahead_of_the_iceberg_tables_is_refused(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "sahead"
    _fresh_db(mariadb, db)
    checkpoint = str(tmp_path / "checkpoint")
    (tmp_path / "b").mkdir()
    behind = _structured(mariadb, db, tmp_path / "b", "s_behind", checkpoint_location=checkpoint)
    run(behind, spark=spark, snapshot_only=True)
    ahead = _structured(mariadb, db, tmp_path, "s_ahead", checkpoint_location=checkpoint)
    run(ahead, spark=spark, until_caught_up=True)
    write_dml(mariadb, db)
    run(ahead, spark=spark, until_caught_up=True)  # the checkpoint has committed up to after the writes
    # Tables that hold the source only up to before the writes must not continue that checkpoint.
    with pytest.raises(ConfigError, match=r"\(`stream.checkpoint_location`\) has committed the binlog up to .*delete"):
        run(behind, spark=spark, until_caught_up=True)
    assert spark.streams.active == []


# At NO_LOG only, the case the replay's decoding by position is about (test_schema_evolution decodes at both).
@pytest.mark.parametrize("row_metadata", ["NO_LOG"], indirect=True)
def test_an_added_column_is_followed_in_binlog_order_across_a_kill_inside_the_schema_change(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, row_metadata: str
) -> None:
    """At NO_LOG the replay re-reads the rows before the ALTER with the schema at the checkpoint's resume point
    and those after it with the followed one, both by position."""
    db = "sddl"
    _fresh_db(mariadb, db)
    # The target has the column, the source schema it mirrors is not stored yet (test_schema_evolution kills
    # the job at every step of a schema change; this one with a kept checkpoint, which Spark replays).
    crash_at = "stream.after_schema_change:1"
    catalog = f"s_ddl_{row_metadata}"
    settings = {"checkpoint_location": str(tmp_path / "checkpoint")}
    config = _structured(mariadb, db, tmp_path, catalog, **settings)
    run(config, spark=spark, snapshot_only=True)
    mariadb.execute(
        f"UPDATE {db}.acct SET owner = 'before' WHERE id < 10",
        f"ALTER TABLE {db}.acct ADD COLUMN note VARCHAR(8) NOT NULL DEFAULT 'old'",
        f"INSERT INTO {db}.acct VALUES (3000, 'after', 1, 'new')",
        f"UPDATE {db}.acct SET note = 'set', owner = 'after' WHERE id BETWEEN 5 AND 14",
    )
    config_file = write_config_file(mariadb, db, tmp_path, catalog, **settings)
    crashed = run_ingest("run", "--config", str(config_file), crash_at=crash_at)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    # The restart runs the DDL's batch again from the checkpoint, and reads on from after it.
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    rows = spark.sql(
        f"SELECT id, owner, note FROM {catalog}.{db}.acct WHERE id IN (1, 5, 20, 3000) ORDER BY id"
    ).collect()
    assert [tuple(r) for r in rows] == [
        (1, "before", "old"),
        (5, "after", "set"),
        (20, "o20", "old"),
        (3000, "after", "new"),
    ]
