"""Binlog-phase throughput, lag, stop time and MERGE cost of the job against raw binlog parsing, in one run:
the raw python-mysql-replication parse of a recorded binlog (the baseline), our reader without Spark, the job's
catch-up, its lag at offered loads, MERGE against append, a long run of MERGEs with and without maintenance, and the
catch-up of a binlog without column names. The job runs in `python -m bench.binlog --worker SPEC` children. No
timing is asserted; see bench/README.md.

    .venv/bin/python -m bench.binlog [--changes 200000] [--loads 500,2000] [--duration 60] [--interval 5] ...
"""

from __future__ import annotations

import argparse
import datetime as dt
import inspect
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench import harness
from bench.tables import (
    ORDER_COLUMNS,
    SLICE,
    STATUSES,
    TABLES,
    US_NOW,
    KeySpace,
    create_tables,
    load_initial,
    record_binlog,
    source_counts,
    three_tables_document,
)
from ingest.config import PipelineConfig, StreamConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.model.position import BinlogPosition, Watermark

STREAM_LINE = "BENCH_STREAM_STARTED"
"""Printed by a worker when the job enters the binlog phase (`ingest.query.structured.stream_structured`)."""

PIPELINE = "bench_binlog"
JOB_SERVER_ID = 5402
BASELINE_SERVER_ID = 5490
LAG_POLL_SECONDS = 0.25
MERGE_WARMUP_CHANGES = 1000
MERGE_MIX = (0.6, 0.1, 0.3)
"""Updates of existing keys, deletes of existing keys, inserts of new keys, as shares of a MERGE batch."""


def make_config(
    spec: Mapping[str, Any], *, format_version: int = 2, targets: Mapping[str, str] | None = None
) -> PipelineConfig:
    """The pipeline over the three tables into an embedded warehouse (SQLite JDBC catalog), Spark local[2]."""
    return parse_config(make_document(spec, format_version, targets))


def make_document(
    spec: Mapping[str, Any], format_version: int = 2, targets: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return three_tables_document(
        PIPELINE,
        JOB_SERVER_ID,
        spec["host"],
        int(spec["port"]),
        Path(spec["warehouse"]),
        sink={"format_version": format_version},
        stream={"batch_interval_seconds": float(spec["interval"])} if "interval" in spec else {},
        table_options={f"{harness.DATABASE}.{t}": {"target": v} for t, v in (targets or {}).items()},
    )


# ---------------------------------------------------------------------------------------------------
# Baselines, measured in this process over the recorded range.


def measure_raw_parse(server: MariaDBServer, config: PipelineConfig, start: str, end: str) -> dict[str, Any]:
    """python-mysql-replication alone: every row of every Write/Update/DeleteRowsEvent in the range, no sink."""
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    from ingest.source.binlog.reader import open_stream

    first, last = BinlogPosition.parse(start), BinlogPosition.parse(end)

    def body() -> dict[str, Any]:
        source = config.source
        stream = open_stream(
            source,
            first,
            BASELINE_SERVER_ID,
            only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        )
        rows = events = 0
        try:
            for event in stream:
                events += 1
                for _row in event.rows:
                    rows += 1
                if BinlogPosition(stream.log_file, event.packet.log_pos) >= last:
                    break
        finally:
            stream.close()
        return {"rows": rows, "row_events": events}

    return harness.measured_here(server, body)


def measure_reader(server: MariaDBServer, config: PipelineConfig, start: str, end: str) -> dict[str, Any]:
    """Our driver-side work without Spark: `BinlogReader` transactions, batched and materialized per table."""
    from ingest.changes.materializer import Change, materialize
    from ingest.model.changes import Transaction
    from ingest.source.binlog.reader import BinlogReader
    from ingest.source.discovery import discover

    info = discover(config.source, config.tables, config.table_options)
    schemas = {s.table_id: s for s in info.schemas}
    keys = {t: tuple(s.column_names.index(k) for k in s.primary_key) for t, s in schemas.items()}
    last = BinlogPosition.parse(end)
    batch_max = config.stream.batch_max_changes

    def body() -> dict[str, Any]:
        reader = BinlogReader(config.source, info.schemas, BinlogPosition.parse(start))
        rows = transactions = batches = finals = 0
        pending: list[Transaction] = []

        def fold() -> int:
            per: dict[str, list[Change]] = {}
            for tx in pending:
                for c in tx.changes:
                    per.setdefault(c.table_id, []).append(
                        Change((c.position.file_number, c.position.pos, c.row_index), c.before, c.after)
                    )
            return sum(len(materialize(v, keys[t])) for t, v in per.items())

        try:
            for tx in reader.transactions():
                rows += len(tx.changes)
                transactions += 1 if tx.changes else 0
                pending.append(tx)
                if sum(len(t.changes) for t in pending) >= batch_max:
                    finals += fold()
                    batches += 1
                    pending = []
                if tx.end >= last:
                    break
            if pending:
                finals += fold()
                batches += 1
        finally:
            reader.close()
        return {"rows": rows, "transactions": transactions, "batches": batches, "final_rows": finals}

    return harness.measured_here(server, body)


# ---------------------------------------------------------------------------------------------------
# The job, in child processes.


class StreamProbe:
    """Wraps the binlog phase (`ingest.query.structured.stream_structured`, the job's query) and each batch's commit
    (`commit_prepared`: the query's source process prepared the batch) in the worker to time them.

    The module attributes are replaced, also where another module of the job imported them by name; nothing of
    the job changes but a timestamp and a CPU reading per call.
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self.started: float | None = None
        self.ended: float | None = None
        self.started_wall: float | None = None
        self.cpu_start: dict[str, float] = {}
        self.cpu_end: dict[str, float] = {}
        self.batches: list[dict[str, Any]] = []

    def install(self) -> None:
        import ingest.query.commit as commit_module
        import ingest.query.structured as structured

        original_stream, original_commit = structured.stream_structured, commit_module.commit_prepared
        probe = self

        def stream(*args: Any, **kwargs: Any) -> BinlogPosition:
            probe.cpu_start = harness.tree_cpu(probe.root)
            probe.started_wall = time.time()
            probe.started = time.perf_counter()
            print(STREAM_LINE, flush=True)
            try:
                return original_stream(*args, **kwargs)
            finally:
                probe.ended = time.perf_counter()
                probe.cpu_end = harness.tree_cpu(probe.root)

        def commit(*args: Any, **kwargs: Any) -> None:
            # per table, its part of the batch, prepared in the source's process
            prepared = inspect.signature(original_commit).bind(*args, **kwargs).arguments["prepared"]
            started_wall, started = time.time(), time.perf_counter()
            original_commit(*args, **kwargs)
            probe.batches.append(
                {
                    "started_at": round(started_wall, 3),
                    "seconds": round(time.perf_counter() - started, 3),
                    "changes": sum(p.applied for p in prepared),
                    "tables": len(prepared),
                }
            )

        _rebind("stream_structured", original_stream, stream)
        _rebind("commit_prepared", original_commit, commit)

    def summary(self) -> dict[str, Any]:
        wall = None if self.started is None or self.ended is None else self.ended - self.started
        cpu = harness.cpu_delta(self.cpu_start, self.cpu_end) if self.cpu_end else {}
        changes = sum(b["changes"] for b in self.batches)
        with_changes = [b for b in self.batches if b["changes"]]
        starts = [b["started_at"] for b in with_changes]
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        return {
            "stream_seconds": None if wall is None else round(wall, 3),
            "stream_started_at": self.started_wall,
            "stream_cpu_s": round(sum(cpu.values()), 3),
            "stream_cpu_s_by_part": cpu,
            "changes": changes,
            "batches": len(self.batches),
            "batches_with_changes": len(with_changes),
            "batch_commit_seconds_median": harness.percentile([b["seconds"] for b in with_changes], 0.5),
            "batch_commit_seconds_max": max((b["seconds"] for b in with_changes), default=None),
            "batch_changes_max": max((b["changes"] for b in with_changes), default=None),
            "trigger_interval_observed_median_s": harness.percentile(gaps, 0.5),
            "after_first_batch": after_first_batch(with_changes),
            "batch_log": self.batches[:500],
        }


def _rebind(name: str, original: Any, replacement: Any) -> None:
    """Bind `replacement` as `name` in every module of the job that holds `original` under that name: the module
    that defines it and those that imported it by name (ingest.query.adhoc calls the phase, ingest.query.structured the
    commit)."""
    for loaded in list(sys.modules.values()):
        if getattr(loaded, "__name__", "").startswith("ingest") and getattr(loaded, name, None) is original:
            setattr(loaded, name, replacement)


def after_first_batch(batches: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The changes committed after the first batch and the time from its commit's end to the last one's: the
    rate of a warm JVM (the first MERGEs of a fresh JVM take several times longer than the rest)."""
    if len(batches) < 2:
        return None
    first_end = batches[0]["started_at"] + batches[0]["seconds"]
    last_end = batches[-1]["started_at"] + batches[-1]["seconds"]
    changes = sum(b["changes"] for b in batches[1:])
    seconds = last_end - first_end
    return {
        "changes": changes,
        "seconds": round(seconds, 3),
        "changes_per_s": changes / seconds if seconds > 0 else None,
    }


def worker_job(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Inside the child: `run()` as the spec's kind says (snapshot, catchup, lag), the process tree measured."""
    from ingest.query.pipeline import run

    config = make_config(spec)
    spark, spark_start = harness.start_spark(config, f"binlog-{spec['label']}")
    probe = StreamProbe(os.getpid())
    probe.install()
    kind = spec["kind"]
    if kind == "snapshot":
        measured = harness.measured_tree(lambda: run(config, snapshot_only=True, spark=spark))
    else:
        measured = harness.measured_tree(lambda: run(config, until_caught_up=kind == "catchup", spark=spark))
    spark.stop()
    return {
        "label": spec["label"],
        "kind": kind,
        "run_seconds": measured["seconds"],
        "run_cpu_s": measured["cpu_s"],
        "run_cpu_s_by_part": measured["cpu"],
        "spark_start_s": round(spark_start, 3),
        "load_avg_1m_before": measured["load_avg_1m_before"],
        **(probe.summary() if kind != "snapshot" else {}),
    }


def _orders_row(schema: Any, i: int, version: int) -> tuple[Any, ...]:
    """One `bench.orders` row in the driver's form (what PyMySQL returns), in the schema's column order."""
    values = {
        "id": i,
        "customer_id": i % 5000 + 1,
        "status": STATUSES[(i + version) % len(STATUSES)],
        "amount": None if i % 11 == 0 else Decimal(i % 100000 + version).scaleb(-2),
        "created_at": dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i),
        "updated_us": 1_700_000_000_000_000 + version,
        "note": f"order {i} v{version}",
    }
    return tuple(values[c] for c in schema.column_names)


Batch = dict[tuple[Any, ...], tuple[Any, ...] | None]


def merge_batch(schema: Any, base: int, r: int, n: int) -> tuple[Batch, Batch]:
    """Round r's batch of n final changes: updates and deletes of existing keys (a fresh window per round,
    never touched before) and inserts of new keys, in the shares of MERGE_MIX.

    Returns the batch for MERGE (a delete is None) and the same n changes as full rows for the append (a
    delete as its before image, as an append-only change log would carry it; the key-only rows MERGE gets
    would break the target's NOT NULL columns)."""
    updates, deletes = int(n * MERGE_MIX[0]), int(n * MERGE_MIX[1])
    inserts = n - updates - deletes
    first = 1 + r * (updates + deletes)
    merge: Batch = {}
    append: Batch = {}
    for i in range(first, first + updates):
        merge[(i,)] = append[(i,)] = _orders_row(schema, i, r + 1)
    for i in range(first + updates, first + updates + deletes):
        merge[(i,)] = None
        append[(i,)] = _orders_row(schema, i, 0)
    new = base + 1 + r * n
    for i in range(new, new + inserts):
        merge[(i,)] = append[(i,)] = _orders_row(schema, i, r + 1)
    return merge, append


def _last_summary(spark: Any, table: str) -> dict[str, str]:
    rows = spark.sql(f"SELECT summary FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()
    return {str(k): str(v) for k, v in (rows[0][0] or {}).items()} if rows else {}


SUMMARY_KEYS = (
    "added-data-files",
    "added-records",
    "added-delete-files",
    "added-position-delete-files",
    "added-position-deletes",
    "added-dvs",
    "removed-dvs",
    "removed-position-delete-files",
    "total-delete-files",
)


def orders_tables(
    spec: Mapping[str, Any], tables: Mapping[Any, tuple[int, str]], base: int
) -> tuple[Any, float, Any, dict[Any, str]]:
    """In a merge or upkeep worker: Spark, `bench.orders`' schema, and a target per entry of `tables` (format
    version, name) made by the job's `ensure_target` and filled with `base` rows; the Spark start's seconds."""
    from ingest.sink.catalog import load_pyiceberg_catalog
    from ingest.sink.merge import OP_COLUMN, batch_arrow
    from ingest.sink.targets import ensure_target
    from ingest.source.discovery import discover

    config = make_config(spec)
    # As in run(), pyiceberg creates the catalog's tables before Spark first uses the catalog (StateTable.open);
    # a SQLite catalog that Spark's JdbcCatalog creates has no view support, and its tableExists() then fails.
    load_pyiceberg_catalog(config.sink).list_namespaces()
    spark, spark_start = harness.start_spark(config, f"binlog-{spec['label']}")
    found = discover(config.source, config.tables, config.table_options).schemas
    schema = next(s for s in found if s.table == "orders")
    names = {
        key: ensure_target(spark, make_config(spec, format_version=v, targets={"orders": name}).targets, schema)
        for key, (v, name) in tables.items()
    }
    base_rows: Batch = {(i,): _orders_row(schema, i, 0) for i in range(1, base + 1)}
    frame = spark.createDataFrame(batch_arrow(schema, base_rows)).drop(OP_COLUMN)
    for table in names.values():
        frame.writeTo(table).append()
    return spark, spark_start, schema, names


def worker_merge(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Inside the child: MERGE INTO (the job's `merge_into`) vs append of the same batch, format v2 and v3."""
    from ingest.sink.merge import OP_COLUMN, batch_arrow, merge_into

    n, base, rounds = int(spec["merge_changes"]), int(spec["merge_base_rows"]), int(spec["merge_rounds"])
    versions = (2, 3)
    tables = {(v, mode): (v, f"mergebench.orders_v{v}_{mode}") for v in versions for mode in ("merge", "append")}
    started = time.perf_counter()
    spark, spark_start, schema, names = orders_tables(spec, tables, base)
    load_s = time.perf_counter() - started - spark_start
    measured: dict[int, list[dict[str, Any]]] = {v: [] for v in versions}
    for r in range(rounds + 1):  # round 0 is a small warm-up (JIT, first MERGE plans), not reported
        batch, rows = merge_batch(schema, base, r, min(n, MERGE_WARMUP_CHANGES) if r == 0 else n)
        for version in versions if r % 2 else versions[::-1]:  # alternate which format goes first
            t0 = time.perf_counter()
            spark.createDataFrame(batch_arrow(schema, batch))
            build = time.perf_counter() - t0
            t0 = time.perf_counter()
            position = BinlogPosition("mysql-bin.000001", 4 + r)
            merge_into(spark, names[version, "merge"], schema, batch, Watermark(position), _none)
            merge_s = time.perf_counter() - t0
            summary = _last_summary(spark, names[version, "merge"])
            t0 = time.perf_counter()
            spark.createDataFrame(batch_arrow(schema, rows)).drop(OP_COLUMN).writeTo(names[version, "append"]).append()
            append_s = time.perf_counter() - t0
            if r == 0:
                continue
            measured[version].append(
                {
                    "round": r,
                    "changes": len(batch),
                    "build_frame_s": round(build, 3),
                    "merge_s": round(merge_s, 3),
                    "append_s": round(append_s, 3),
                    "merge_summary": {k: summary[k] for k in SUMMARY_KEYS if k in summary},
                }
            )
    out: dict[str, Any] = {"spark_start_s": round(spark_start, 3), "base_load_s": round(load_s, 3), "formats": []}
    for version in versions:
        merge_med = harness.percentile([m["merge_s"] for m in measured[version]], 0.5)
        append_med = harness.percentile([m["append_s"] for m in measured[version]], 0.5)
        out["formats"].append(
            {
                "format_version": version,
                "deletes": "position delete files" if version == 2 else "deletion vectors",
                "base_rows": base,
                "changes": n,
                "rounds": measured[version],
                "merge_s_median": merge_med,
                "append_s_median": append_med,
                "build_frame_s_median": harness.percentile([m["build_frame_s"] for m in measured[version]], 0.5),
                "merge_vs_append": None if not merge_med or not append_med else merge_med / append_med,
            }
        )
    spark.stop()
    return out


def _none() -> BinlogPosition | None:
    return None


def worker_upkeep(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Inside the child: the same long run of small MERGEs into two tables, one maintained by the job's
    `maintain` every `upkeep_every` batches and one left alone; MERGE times early and late, files at the end."""
    from ingest.config import MaintenanceConfig
    from ingest.sink.maintenance import maintain
    from ingest.sink.merge import merge_into

    n, base, batches, every = (
        int(spec[k]) for k in ("upkeep_changes", "upkeep_base_rows", "upkeep_batches", "upkeep_every")
    )
    modes = ("maintained", "left alone")
    tables = {mode: (2, f"upkeepbench.orders_{mode.replace(' ', '_')}") for mode in modes}
    spark, spark_start, schema, names = orders_tables(spec, tables, base)
    settings = MaintenanceConfig(every_commits=every, expire_after_hours=0)
    merge_s: dict[str, list[float]] = {mode: [] for mode in modes}
    upkeep_s: list[float] = []
    for r in range(batches):
        batch, _ = merge_batch(schema, base, r, n)
        end = Watermark(BinlogPosition("mysql-bin.000001", 4 + r))
        for mode in modes if r % 2 else modes[::-1]:  # alternate which table goes first
            t0 = time.perf_counter()
            merge_into(spark, names[mode], schema, batch, end, _none)
            merge_s[mode].append(round(time.perf_counter() - t0, 3))
            if mode == "maintained" and (r + 1) % every == 0:
                t0 = time.perf_counter()
                maintain(spark, names[mode], PIPELINE, end, settings)
                upkeep_s.append(round(time.perf_counter() - t0, 3))
    tail = min(10, batches // 3)
    out: dict[str, Any] = {"spark_start_s": round(spark_start, 3), "tables": []}
    for mode in modes:
        summary = _last_summary(spark, names[mode])
        snapshots = spark.sql(f"SELECT count(*) FROM {names[mode]}.snapshots").collect()[0][0]
        times = merge_s[mode]
        out["tables"].append(
            {
                "table": mode,
                "merge_s": times,
                "merge_s_first_median": harness.percentile(times[1 : 1 + tail], 0.5),  # batch 0 warms the JVM up
                "merge_s_last_median": harness.percentile(times[-tail:], 0.5),
                "merge_s_total": round(sum(times), 3),
                "maintenance_s": upkeep_s if mode == "maintained" else [],
                "data_files": int(summary.get("total-data-files", 0)),
                "delete_files": int(summary.get("total-delete-files", 0)),
                "snapshots": int(snapshots),
            }
        )
    spark.stop()
    return out


class InsertWriter(harness.PacedWriter):
    """Single-row autocommit INSERTs into bench.orders at about `rate` per second, ids from `first_id` up.

    Each row's `updated_us` is the server's clock at the statement (its commit follows at once)."""

    def __init__(self, server: MariaDBServer, first_id: int, rate: float) -> None:
        super().__init__(server, rate, "insert-writer")
        self.first_id = first_id
        self._sql = (
            f"INSERT INTO {harness.DATABASE}.orders ({ORDER_COLUMNS}) "
            f"VALUES (%s, %s, 'lag', 1.00, NOW(6), {US_NOW}, 'lag probe')"
        )

    def write(self, cur: Any) -> None:
        i = self.first_id + self.written
        cur.execute(self._sql, (i, i % 5000 + 1))


class LagPoller:
    """Watches the Iceberg target of bench.orders with pyiceberg; for every new snapshot, reads the rows with
    an id above the highest seen so far and takes, per row, the snapshot's commit time (`timestamp_ms`) and
    the time this poller first saw the snapshot, minus the row's `updated_us`."""

    def __init__(self, config: PipelineConfig, first_id: int, interval: float = LAG_POLL_SECONDS) -> None:
        from ingest.sink.catalog import load_pyiceberg_catalog

        self.catalog = load_pyiceberg_catalog(config.sink)
        self.identifier = config.target_for(harness.DATABASE, "orders")
        self.interval = interval
        self.max_id = first_id - 1
        self.rows = 0
        self.lag_commit_s: list[float] = []
        self.lag_commit_after_first_s: list[float] = []
        """Rows written after the job's first commit with rows: the first MERGE of a fresh JVM is slow, and rows
        written while it runs wait for it and for the next interval."""
        self.first_commit_s: float | None = None
        self.lag_seen_s: list[float] = []
        self.snapshots: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.polls = 0
        table = self.catalog.load_table(self.identifier)
        self._seen = {s.snapshot_id for s in table.snapshots()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lag-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()  # whatever the job's last commit made visible

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - a failed poll is counted and the next one retries
                if len(self.errors) < 20:
                    self.errors.append(f"{type(e).__name__}: {e}")

    def poll(self) -> None:
        table = self.catalog.load_table(self.identifier)
        seen_at = time.time()
        self.polls += 1
        for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number):
            if snapshot.snapshot_id in self._seen:
                continue
            self._seen.add(snapshot.snapshot_id)
            arrow = table.scan(
                row_filter=f"id > {self.max_id}",
                selected_fields=("id", "updated_us"),
                snapshot_id=snapshot.snapshot_id,
            ).to_arrow()
            ids = arrow.column("id").to_pylist()
            written = arrow.column("updated_us").to_pylist()
            commit_s = snapshot.timestamp_ms / 1000
            lags = [commit_s - us / 1e6 for us in written]
            self.lag_commit_s.extend(lags)
            if self.first_commit_s is not None:
                self.lag_commit_after_first_s.extend(
                    lag for lag, us in zip(lags, written, strict=True) if us / 1e6 > self.first_commit_s
                )
            elif lags:
                self.first_commit_s = commit_s
            self.lag_seen_s.extend(seen_at - us / 1e6 for us in written)
            self.rows += len(ids)
            if ids:
                self.max_id = max(self.max_id, max(ids))
            self.snapshots.append(
                {
                    "snapshot_id": snapshot.snapshot_id,
                    "committed_at": commit_s,
                    "seen_at": round(seen_at, 3),
                    "rows": len(ids),
                    "max_lag_s": round(max(lags), 3) if lags else None,
                }
            )


def measure_lag(
    server: MariaDBServer,
    spec: dict[str, Any],
    rate: int,
    duration: float,
    first_id: int,
    log_path: Path,
) -> dict[str, Any]:
    config = make_config(spec)
    stats: dict[str, Any] = {}
    with (
        harness.mariadb_cpu_into(server, stats),
        harness.Worker("bench.binlog", spec, log_path, marks=(STREAM_LINE,)) as worker,
    ):
        if not worker.wait_for(STREAM_LINE, timeout=900):
            worker.finish(60)  # raises with the log's tail
            raise harness.BenchError(f"worker {spec['label']} never reached the binlog phase")
        poller = LagPoller(config, first_id)
        writer = InsertWriter(server, first_id, rate)
        poller.start()
        writer.start()
        try:
            time.sleep(duration)
            written_before_stop = writer.written
            sigterm_at = worker.terminate()
            returned = worker.wait_for(harness.DONE_LINE, timeout=600)
        finally:
            writer.stop()
        try:
            result = worker.finish(600)
        finally:
            poller.stop()
    returned_at = worker.marks.get(harness.DONE_LINE) if returned else None
    stream_s = result.get("stream_seconds") or float("nan")
    missing = max(0, first_id + written_before_stop - 1 - poller.max_id)
    return {
        **result,
        "offered_rate": rate,
        "duration_s": duration,
        "interval_s": float(spec["interval"]),
        "writer": {
            "rows": writer.written,
            "rows_before_sigterm": written_before_stop,
            "seconds": round(writer.seconds, 3),
            "achieved_rate": writer.written / writer.seconds if writer.seconds else 0.0,
            "achieved_rate_until_sigterm": written_before_stop / duration,
            "error": writer.error,
        },
        "rows_visible": poller.rows,
        "rows_written_before_sigterm_not_visible": missing,
        "lag_commit_s": harness.lag_stats(poller.lag_commit_s),
        "lag_seen_s": harness.lag_stats(poller.lag_seen_s),
        "lag_commit_after_first_commit_s": harness.lag_stats(poller.lag_commit_after_first_s),
        "rows_visible_after_first_commit": len(poller.lag_commit_after_first_s),
        "iceberg_snapshots_seen": len(poller.snapshots),
        "snapshot_log": poller.snapshots[:500],
        "poller": {"polls": poller.polls, "interval_s": poller.interval, "errors": poller.errors},
        "stop_run_returned_s": None if returned_at is None else round(returned_at - sigterm_at, 3),
        "stop_process_exit_s": None if worker.exit_time is None else round(worker.exit_time - sigterm_at, 3),
        "stream_cores": (result.get("stream_cpu_s") or 0.0) / stream_s if stream_s == stream_s else None,
        **stats,
    }


def iceberg_commits(config: PipelineConfig) -> dict[str, int]:
    """Snapshots of each target that carry this pipeline's stream offset, and all snapshots of the state table."""
    from ingest.sink.catalog import load_pyiceberg_catalog
    from ingest.sink.summary import SUMMARY_PIPELINE, SUMMARY_STREAM_OFFSET

    catalog = load_pyiceberg_catalog(config.sink)
    out: dict[str, int] = {}
    for t in TABLES:
        table = catalog.load_table(config.target_for(harness.DATABASE, t))
        out[t] = 0
        for s in table.snapshots():
            props = s.summary.additional_properties if s.summary is not None else {}
            if props.get(SUMMARY_PIPELINE) == PIPELINE and SUMMARY_STREAM_OFFSET in props:
                out[t] += 1
    namespace, _, name = config.sink.state_table.rpartition(".")
    out["state_table"] = len(catalog.load_table((namespace, name)).snapshots())
    return out


def measure_catchup(
    server: MariaDBServer, spec: Mapping[str, Any], config: PipelineConfig, log: Path
) -> dict[str, Any]:
    """The job's catch-up over the recorded binlog in a child process, then `ingest verify`."""
    commits_before = iceberg_commits(config)
    catchup: dict[str, Any] = {}
    with harness.mariadb_cpu_into(server, catchup), harness.Worker("bench.binlog", spec, log) as w:
        catchup.update(w.finish())
    commits_after = iceberg_commits(config)
    catchup["iceberg_commits"] = {k: commits_after[k] - commits_before.get(k, 0) for k in commits_after}
    stream_s = catchup["stream_seconds"]
    catchup["changes_per_s"] = catchup["changes"] / stream_s if stream_s else None
    catchup["cpu_s_per_million"] = harness.per_million(catchup["stream_cpu_s"], catchup["changes"])
    config_file = Path(spec["warehouse"]).parent / f"{spec['label']}.yaml"
    catchup["verify"] = harness.run_verify(harness.write_pipeline(make_document(spec), config_file))
    return catchup


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    defaults = StreamConfig()
    results["tables"] = {
        "orders": "INT key + BIGINT, VARCHAR(16), DECIMAL(12,2) (some NULLs), DATETIME(6), BIGINT, VARCHAR(64)",
        "customers": "BIGINT key + VARCHAR(64), VARCHAR(128), DECIMAL(14,2), TINYINT, TIMESTAMP(6)",
        "events": "VARCHAR(40) _ci key + VARCHAR(16), TEXT, DOUBLE (some NULLs), DATETIME(3), INT",
    }
    results["spark_master"] = "local[2]"
    results["catchup_stream_config"] = {
        "batch_max_changes": defaults.batch_max_changes,
        "batch_interval_seconds": defaults.batch_interval_seconds,
    }
    results["cpu_method"] = harness.CPU_METHOD
    base_spec = {"host": server.host, "port": server.port, "warehouse": str(scratch / "warehouse")}
    config = make_config(base_spec)
    create_tables(server)
    keys = load_initial(server, args.initial_rows)
    results["initial_rows"] = source_counts(server)
    harness.progress(f"snapshot of {results['initial_rows']} (log {scratch}/snapshot.log)")
    with harness.Worker(
        "bench.binlog", {**base_spec, "kind": "snapshot", "label": "snapshot"}, scratch / "snapshot.log"
    ) as w:
        results["snapshot"] = w.finish()

    harness.progress(f"recording a binlog of at least {args.changes:,} row changes")
    binlog = results["binlog"] = record_binlog(server, config, keys, args.changes)
    results["rows_after_binlog"] = source_counts(server)
    harness.progress(
        f"recorded {binlog['rows_affected']:,} row changes in {binlog['transactions']:,} transactions "
        f"({binlog['seconds']:.1f}s), {binlog['start']} .. {binlog['end']}; baseline: raw parse"
    )
    results["baseline_raw_parse"] = measure_raw_parse(server, config, binlog["start"], binlog["end"])
    harness.progress("BinlogReader + materialize, no Spark")
    results["reader_no_spark"] = measure_reader(server, config, binlog["start"], binlog["end"])
    log_path = scratch / "catchup.log"
    harness.progress(f"ours: catch-up with run(until_caught_up=True) (log {log_path})")
    catchup = measure_catchup(server, {**base_spec, "kind": "catchup", "label": "catchup"}, config, log_path)
    results["catchup"] = catchup
    harness.progress(
        f"ours: {catchup['changes']:,} changes in {catchup['stream_seconds']:.1f}s, verify {catchup['verify']['ok']}"
    )

    results["lag"] = []
    first_id = keys.orders_hi + 1_000_000
    for rate in args.loads:
        label = f"lag{rate}"
        harness.progress(
            f"lag at {rate}/s for {args.duration:.0f}s, interval {args.interval:g}s (log {scratch}/{label}.log)"
        )
        spec = {**base_spec, "kind": "lag", "label": label, "interval": args.interval}
        entry = measure_lag(server, spec, rate, args.duration, first_id, scratch / f"{label}.log")
        results["lag"].append(entry)
        first_id += entry["writer"]["rows"] + 1_000_000
        harness.progress(f"lag at {rate}/s: p50 {harness.fmt(entry['lag_commit_s']['p50'], '.2f')}s")

    for kind, wanted, what in (
        ("merge", args.merge_changes, f"MERGE vs append: {args.merge_changes:,} changes, {args.merge_rounds} rounds"),
        (
            "upkeep",
            args.upkeep_batches,
            f"maintenance: {args.upkeep_batches} MERGEs, compaction every {args.upkeep_every}",
        ),
    ):
        if wanted > 0:
            harness.progress(f"{what} (log {scratch}/{kind}.log)")
            spec = {**base_spec, "warehouse": str(scratch / f"warehouse-{kind}"), "kind": kind, "label": kind}
            spec |= {k: v for k, v in vars(args).items() if k.startswith(kind)}
            with harness.Worker("bench.binlog", spec, scratch / f"{kind}.log") as w:
                results[kind] = w.finish()
    if args.no_names_changes > 0:
        results["no_names"] = measure_without_names(server, base_spec, config, keys, args, scratch)
    results["ratios"] = ratios(results)


def measure_without_names(
    server: MariaDBServer,
    base_spec: Mapping[str, Any],
    config: PipelineConfig,
    keys: KeySpace,
    args: argparse.Namespace,
    scratch: Path,
) -> dict[str, Any]:
    """The raw parse, our reader and the job's catch-up again, over a binlog the server wrote at its
    default binlog_row_metadata (NO_LOG: no column names, no signedness or charsets), which the job reads by
    position with the schema it follows (ingest/source/binlog/table_maps.py). Last, so the runs before read FULL."""
    out: dict[str, Any] = {}
    server.execute("SET GLOBAL binlog_row_metadata = 'NO_LOG'")
    try:
        harness.progress(f"binlog_row_metadata NO_LOG: recording {args.no_names_changes:,} row changes")
        binlog = out["binlog"] = record_binlog(server, config, keys, args.no_names_changes)
    finally:
        server.execute("SET GLOBAL binlog_row_metadata = 'FULL'")
    harness.progress("NO_LOG: baseline raw parse, then BinlogReader + materialize, no Spark")
    out["baseline_raw_parse"] = measure_raw_parse(server, config, binlog["start"], binlog["end"])
    out["reader_no_spark"] = measure_reader(server, config, binlog["start"], binlog["end"])
    log_path = scratch / "catchup-no-names.log"
    harness.progress(f"NO_LOG: ours, catch-up with run(until_caught_up=True) (log {log_path})")
    out["catchup"] = measure_catchup(server, {**base_spec, "kind": "catchup", "label": "no-names"}, config, log_path)
    return out


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    base = results["baseline_raw_parse"]
    reader = results["reader_no_spark"]
    catchup = results["catchup"]
    out: dict[str, Any] = {}
    out["reader_changes_per_s_vs_baseline"] = reader["rows_per_s"] / base["rows_per_s"]
    out["reader_cpu_per_change_vs_baseline"] = reader["cpu_s_per_million"] / base["cpu_s_per_million"]
    if catchup["changes_per_s"]:
        out["ours_changes_per_s_vs_baseline"] = catchup["changes_per_s"] / base["rows_per_s"]
        out["ours_cpu_per_change_vs_baseline"] = catchup["cpu_s_per_million"] / base["cpu_s_per_million"]
    warm = catchup.get("after_first_batch") or {}
    if warm.get("changes_per_s"):
        out["ours_after_first_batch_changes_per_s_vs_baseline"] = warm["changes_per_s"] / base["rows_per_s"]
    for f in (results.get("merge") or {}).get("formats", []):
        if f["merge_vs_append"] is not None:
            out[f"merge_vs_append_v{f['format_version']}"] = f["merge_vs_append"]
    upkeep = {t["table"]: t for t in (results.get("upkeep") or {}).get("tables", [])}
    if upkeep and upkeep["maintained"]["merge_s_last_median"]:
        out["late_merge_left_alone_vs_maintained"] = (
            upkeep["left alone"]["merge_s_last_median"] / upkeep["maintained"]["merge_s_last_median"]
        )
    no_names = results.get("no_names")
    if no_names:
        raw = no_names["baseline_raw_parse"]
        out["no_log_reader_changes_per_s_vs_baseline"] = no_names["reader_no_spark"]["rows_per_s"] / raw["rows_per_s"]
        if no_names["catchup"]["changes_per_s"]:
            out["no_log_ours_changes_per_s_vs_baseline"] = no_names["catchup"]["changes_per_s"] / raw["rows_per_s"]
        out["no_log_raw_parse_vs_full_raw_parse"] = raw["rows_per_s"] / base["rows_per_s"]
    return out


CATCHUP_COLUMNS = harness.columns(
    "measurement:44; changes:9:,; changes/s:10; x baseline:10:.3f; wall s:8:.1f; CPU s:8:.1f; CPU s/M:8:.1f; "
    "x base CPU:10:.2f; MariaDB CPU s:13:.1f"
)
LAG_COLUMNS = harness.columns(
    "offered/s:9:,; achieved/s:10; interval s:10:g; trig obs s:10:.1f; rows seen:9:,; p50 s:6:.2f; p95 s:6:.2f; "
    "max s:6:.2f; seen p50:8:.2f; seen p95:8:.2f; seen max:8:.2f; commits:7; cores:5:.2f; stop s:6:.1f; "
    "exit s:6:.1f; unseen:6:,"
)
MERGE_COLUMNS = harness.columns(
    "table:30; MERGE s:8:.2f; append s:8:.2f; MERGE/append:12:.2f; build s:8:.2f;  deletes written:16"
)
UPKEEP_COLUMNS = harness.columns(
    "table:12; MERGE s early:13:.2f; MERGE s late:12:.2f; MERGE s sum:11:.1f; upkeep s sum:12:.1f; data files:10; "
    "delete files:12; snapshots:9"
)


def catchup_rows(base: Mapping[str, Any], reader: Mapping[str, Any], c: Mapping[str, Any]) -> list[list[Any]]:
    """The baseline, the reader without Spark and the job's binlog phase, against the baseline."""
    rows = [
        ("baseline: python-mysql-replication rows", base, "rows", "rows_per_s", "seconds", "cpu_s"),
        ("BinlogReader + materialize, no Spark", reader, "rows", "rows_per_s", "seconds", "cpu_s"),
        ("ours: run(until_caught_up) binlog phase", c, "changes", "changes_per_s", "stream_seconds", "stream_cpu_s"),
    ]
    per_base = base["cpu_s_per_million"]
    return [
        [
            name,
            m[n],
            m[rate],
            harness.ratio(m[rate], base["rows_per_s"]),
            m[wall],
            m[cpu],
            m["cpu_s_per_million"],
            m["cpu_s_per_million"] / per_base,
            m["mariadb_cpu_s"],
        ]
        for name, m, n, rate, wall, cpu in rows
    ]


def lag_row(e: Mapping[str, Any]) -> list[Any]:
    first = [f"{e['offered_rate']:>9,}", e["writer"]["achieved_rate_until_sigterm"]]
    first += harness.pick(e, "interval_s trigger_interval_observed_median_s rows_visible")
    lags = [e[lag][p] for lag in ("lag_commit_s", "lag_seen_s") for p in ("p50", "p95", "max")]
    last = "batches_with_changes stream_cores stop_run_returned_s stop_process_exit_s"
    return [*first, *lags, *harness.pick(e, last + " rows_written_before_sigterm_not_visible")]


def upkeep_row(t: Mapping[str, Any]) -> list[Any]:
    first = harness.pick(t, "table merge_s_first_median merge_s_last_median merge_s_total")
    return [*first, sum(t["maintenance_s"]), *harness.pick(t, "data_files delete_files snapshots")]


def render(results: dict[str, Any]) -> str:
    base, reader, c = results["baseline_raw_parse"], results["reader_no_spark"], results["catchup"]
    b = results["binlog"]
    args, stream = results["args"], results["catchup_stream_config"]
    commits = c["iceberg_commits"]
    parts = ", ".join(f"{k} {v:.1f}" for k, v in c["stream_cpu_s_by_part"].items())
    warm = c.get("after_first_batch")
    lines = [
        f"Binlog benchmark, {results['started_at']}: {results['host']['cpus']} CPUs, "
        f"load average at start {results['host']['load_avg_1m_at_start']:.2f}, Spark {results['spark_master']}"
        f"{harness.spark_conf_note(args.get('spark_conf'))}",
        f"tables {', '.join(f'{harness.DATABASE}.{t}' for t in TABLES)}: initial rows {results['initial_rows']}, "
        f"after the recorded binlog {results['rows_after_binlog']}",
        f"binlog {b['start']} .. {b['end']}: {b['rows_affected']:,} row changes in {b['transactions']:,} "
        f"transactions, recorded in {b['seconds']:.1f}s; snapshot took {results['snapshot']['run_seconds']:.1f}s",
        f"CPU of ours: {results['cpu_method']}",
        "",
        f"Catch-up over the recorded binlog (batch_max_changes {stream['batch_max_changes']}, "
        f"batch_interval_seconds {stream['batch_interval_seconds']:g})",
        *harness.text_table(CATCHUP_COLUMNS, catchup_rows(base, reader, c)),
        "",
        f"ours: {c['batches_with_changes']} batches with changes ({c['batches']} commits of an offset), up to "
        f"{harness.fmt(c['batch_changes_max'], ',')} changes, "
        f"commit median {harness.fmt(c['batch_commit_seconds_median'], '.1f')}s; "
        f"Iceberg commits: {sum(v for k, v in commits.items() if k != 'state_table')} to the targets "
        f"({', '.join(f'{t} {commits.get(t, 0)}' for t in TABLES)}) "
        f"+ {commits.get('state_table', 0)} to the state table",
        f"ours: binlog-phase CPU s by part: {parts}; run() in all {c['run_seconds']:.1f}s, {c['run_cpu_s']:.1f} CPU s; "
        f"Spark start {c['spark_start_s']:.1f}s (not counted); peak RSS {c['peak_rss_mib']:,.0f} MiB, "
        f"PSS {c['peak_pss_mib']:,.0f} MiB",
        f"ours: verify (MySQL vs Iceberg, row by row): {'OK' if c['verify']['ok'] else 'FAILED'}"
        + ("" if c["verify"]["ok"] else "  <-- " + "; ".join(c["verify"]["output"][-6:])),
    ]
    if warm:
        lines.append(
            f"ours: after the first batch (a warm JVM): {harness.fmt(warm['changes'], ',')} changes in "
            f"{warm['seconds']:.1f}s, {harness.fmt(warm['changes_per_s'])} changes/s, "
            f"{harness.fmt(warm['changes_per_s'] and warm['changes_per_s'] / base['rows_per_s'], '.3f')} x baseline"
        )
    lines.append(
        f"baseline: {base['row_events']:,} row events; reader: {reader['transactions']:,} transactions, "
        f"{reader['batches']} batches folding to {reader['final_rows']:,} final rows"
    )
    if base["rows"] != c["changes"] or reader["rows"] != base["rows"]:
        lines.append(
            f"  <-- CHANGE COUNT MISMATCH: baseline {base['rows']:,}, reader {reader['rows']:,}, job {c['changes']:,}"
        )
    if results["lag"]:
        lines += [
            "",
            f"Lag, MySQL commit -> row visible in Iceberg (single-row INSERTs into {harness.DATABASE}.orders for "
            f"{args['duration']:g}s each; committed = Iceberg snapshot timestamp_ms, seen = first poll "
            f"that saw it, every {LAG_POLL_SECONDS:g}s)",
        ]
        lag_rows = [
            [
                f"{e['offered_rate']:>9,}",
                e["writer"]["achieved_rate_until_sigterm"],
                e["interval_s"],
                e["trigger_interval_observed_median_s"],
                e["rows_visible"],
                *(e[lag][p] for lag in ("lag_commit_s", "lag_seen_s") for p in ("p50", "p95", "max")),
                e["batches_with_changes"],
                e["stream_cores"],
                e["stop_run_returned_s"],
                e["stop_process_exit_s"],
                e["rows_written_before_sigterm_not_visible"],
            ]
            for e in results["lag"]
        ]
        lines += harness.text_table(LAG_COLUMNS, lag_rows)
        for e in results["lag"]:
            af = e["lag_commit_after_first_commit_s"]
            notes = [
                f"rows written after the first commit (a fresh JVM's first MERGE): "
                f"{e['rows_visible_after_first_commit']:,}, "
                + ", ".join(f"{p} {harness.fmt(af[p], '.2f')}s" for p in ("p50", "p95", "max")),
                f"commit median {harness.fmt(e['batch_commit_seconds_median'], '.1f')}s",
            ]
            if e["writer"]["error"]:
                notes.append(f"writer error: {e['writer']['error']}")
            if e["poller"]["errors"]:
                notes.append(f"{len(e['poller']['errors'])} failed polls, e.g. {e['poller']['errors'][0][:160]}")
            lines.append(f"  at {e['offered_rate']}/s: " + "; ".join(notes))
    merge = results.get("merge")
    if merge and merge["formats"]:
        f0 = merge["formats"][0]
        lines += [
            "",
            f"MERGE INTO vs append of the same batch ({f0['changes']:,} changes: {MERGE_MIX[0]:.0%} updates, "
            f"{MERGE_MIX[1]:.0%} deletes, {MERGE_MIX[2]:.0%} inserts; {f0['base_rows']:,} rows in the table; "
            f"median of {len(f0['rounds'])} rounds after a warm-up)",
        ]
        merge_rows = []
        for f in merge["formats"]:
            s = f["rounds"][-1]["merge_summary"] if f["rounds"] else {}
            kinds = ("added-delete-files", "added-position-deletes", "added-dvs")
            deletes = ", ".join(f"{k} {s[k]}" for k in kinds if k in s) or "-"
            values = harness.pick(f, "merge_s_median append_s_median merge_vs_append build_frame_s_median")
            merge_rows.append([f"v{f['format_version']} ({f['deletes']})", *values, f"  {deletes}"])
        lines += harness.text_table(MERGE_COLUMNS, merge_rows)
    upkeep = results.get("upkeep")
    if upkeep and upkeep["tables"]:
        lines += [
            "",
            f"Maintenance: {args['upkeep_batches']} MERGE batches of {args['upkeep_changes']:,} changes into "
            f"{args['upkeep_base_rows']:,} rows, v2; one table compacted (sink.maintenance) every "
            f"{args['upkeep_every']} batches, expiry at 0 h, the other left alone",
            *harness.text_table(UPKEEP_COLUMNS, [upkeep_row(t) for t in upkeep["tables"]]),
        ]
    no_names = results.get("no_names")
    if no_names:
        nb = no_names["binlog"]
        lines += [
            "",
            f"binlog_row_metadata NO_LOG (no column names; read by position): {nb['rows_affected']:,} row changes, "
            f"{nb['start']} .. {nb['end']}; x baseline is against the raw parse of this range",
        ]
        rows = catchup_rows(no_names["baseline_raw_parse"], no_names["reader_no_spark"], no_names["catchup"])
        columns = [0, 1, 2, 3, 6]  # measurement, changes, changes/s, x baseline, CPU s/M
        lines += harness.text_table(
            [CATCHUP_COLUMNS[i] for i in columns], [[r[i] for i in columns] for r in rows], rule=False
        )
        lines.append(f"ours (NO_LOG): verify {'OK' if no_names['catchup']['verify']['ok'] else 'FAILED'}")
    return "\n".join(lines + harness.ratio_lines(results["ratios"], 40))


OPTIONS: list[harness.Option] = [
    ("--changes", harness.positive, 200_000, "row changes in the recorded binlog"),
    ("--loads", harness.int_list, [500, 2000], "comma-separated offered loads, rows/s ('' skips)"),
    ("--duration", harness.positive_float, 60.0, "seconds of writing per offered load"),
    ("--interval", harness.positive_float, 5.0, "stream.batch_interval_seconds of the lag runs"),
    ("--initial-rows", harness.positive, 20_000, "initial orders (customers 1/4, events 1/2)"),
    ("--merge-changes", harness.non_negative, 20_000, "changes per MERGE batch (0 skips)"),
    ("--merge-base-rows", harness.positive, 200_000, "rows in the MERGE tables"),
    ("--merge-rounds", harness.positive, 3, "timed MERGE/append rounds"),
    ("--upkeep-batches", harness.non_negative, 60, "MERGE batches of the maintenance run (0 skips)"),
    ("--upkeep-changes", harness.positive, 500, "changes per maintenance-run batch"),
    ("--upkeep-every", harness.positive, 20, "batches between compactions"),
    ("--upkeep-base-rows", harness.positive, 30_000, "rows in the maintenance tables"),
    ("--no-names-changes", harness.non_negative, 100_000, "row changes at binlog_row_metadata NO_LOG (0 skips)"),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.parser_for("bench.binlog", __doc__, OPTIONS)
    harness.add_common_options(parser)
    args = parser.parse_args(argv)
    if args.initial_rows < 2 * SLICE:
        parser.error(f"--initial-rows must be at least {2 * SLICE}")
    upkeep_needed = args.upkeep_batches * int(args.upkeep_changes * (MERGE_MIX[0] + MERGE_MIX[1]))
    if args.upkeep_batches and args.upkeep_base_rows < upkeep_needed:
        parser.error(f"--upkeep-base-rows must hold a fresh window of keys per batch: at least {upkeep_needed:,}")
    needed = (args.merge_rounds + 1) * int(args.merge_changes * (MERGE_MIX[0] + MERGE_MIX[1]))
    if args.merge_changes and args.merge_base_rows < needed:
        parser.error(
            f"--merge-base-rows must hold a fresh window of updated and deleted keys per round: at least {needed:,}"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    workers = {"merge": worker_merge, "upkeep": worker_upkeep}
    if not harness.worker_main(
        sys.argv if argv is None else argv, lambda spec: workers.get(spec["kind"], worker_job)(spec)
    ):
        harness.run_bench("binlog", parse_args(argv), measure, render, mariadb={})
    return 0


if __name__ == "__main__":
    sys.exit(main())
