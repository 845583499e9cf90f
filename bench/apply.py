"""What one binlog batch costs to apply as its target grows (issue 31), against an append of the same rows and
against the MERGE the job ran before it pruned its target, in one run; then the read cost of many batches before
and after compaction, and the same end to end on a private MariaDB. No timing is asserted; see bench/README.md.

    .venv/bin/python -m bench.apply [--sizes 200000,2000000,20000000] [--changes 20000] [--rounds 3]
                                    [--formats 2,3] [--rows-per-file 1000000] [--partition-by SPEC ...]
                                    [--read-rows 2000000] [--read-batches 50] [--e2e-sizes 200000,10000000]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import random
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any
from unittest import mock

from bench import harness
from bench.tables import insert_unlogged, sequence
from ingest.config import MaintenanceConfig, PipelineConfig, parse_config
from ingest.model.columns import SourceColumn
from ingest.model.position import BinlogPosition, Watermark
from ingest.model.schema import TableSchema

log = logging.getLogger("bench.apply")

PIPELINE = "bench_apply"
MIX = (0.5, 0.1, 0.4)
"""Updates of existing keys, deletes of existing keys, inserts of new keys, as shares of a batch."""
NEWEST_SHARE = 0.01
DISTRIBUTIONS = ("newest-1%", "uniform")
MODES = ("apply", "unpruned", "position")
"""apply: the job's Spark MERGE; unpruned: the MERGE before issue 31; position: the driver's apply by position
(ingest/sink/position_deletes.py, format 2 only), what the job does now where it can."""
E2E_MODES = ("apply", "merge", "unpruned", "restarted", "idle")
"""End to end: the job as configured (by position), with `stream.position_deletes: false` (Spark's MERGE), and
with the MERGE of before issue 31, each a `run(until_caught_up=True)` in the bench's Spark session; then the job as
a user restarts it, `ingest run --until-caught-up` in a new process (its Python, its JVM, its Spark's Python
processes), and the same again with nothing new to apply right after (what a restart costs before any batch)."""
RESTARTS = ("restarted", "idle")
STATUSES = ("new", "paid", "shipped", "done")
EPOCH_2024 = 1_704_067_200
LOOKUPS = 5

SCHEMA = TableSchema(
    "bench",
    "items",
    (
        SourceColumn("id", "bigint", "bigint(20)", False),
        SourceColumn("customer_id", "bigint", "bigint(20)", False),
        SourceColumn("status", "varchar", "varchar(16)", False),
        SourceColumn("amount", "decimal", "decimal(12,2)", True, 12, 2),
        SourceColumn("created_at", "datetime", "datetime(6)", False, datetime_precision=6),
        SourceColumn("updated_us", "bigint", "bigint(20)", False),
        SourceColumn("note", "varchar", "varchar(64)", True),
    ),
    ("id",),
    ("id",),
    (None,),
)

FILL_SQL = """INSERT INTO {table}
SELECT id, id % 5000, element_at(array('new', 'paid', 'shipped', 'done'), CAST(id % 4 AS INT) + 1),
       CASE WHEN id % 11 = 0 THEN NULL ELSE CAST((id % 100000) / 100 AS DECIMAL(12,2)) END,
       CAST(timestamp_seconds({epoch} + id) AS TIMESTAMP_NTZ), 1700000000000000, concat('order ', id, ' v0')
FROM range(1, {rows} + 1, 1, {parts})"""


def row(i: int, version: int) -> tuple[Any, ...]:
    """Row i of version `version` in the driver's form (what PyMySQL returns); version 0 is FILL_SQL's."""
    return (
        i,
        i % 5000,
        STATUSES[(i + version) % 4] if version else STATUSES[i % 4],
        None if i % 11 == 0 else Decimal(i % 100000 + version).scaleb(-2),
        dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i),
        1_700_000_000_000_000 + version,
        f"order {i} v{version}",
    )


Batch = dict[tuple[Any, ...], tuple[Any, ...] | None]


class Keys:
    """The keys a table holds, to draw existing keys from and to give new ones."""

    def __init__(self, rows: int, seed: int) -> None:
        self.top = rows
        self.deleted: set[int] = set()
        self.random = random.Random(seed)
        self.version = 0

    def draw(self, count: int, distribution: str) -> list[int]:
        # The newest 1 % of the keys, or on a small table the newest three times as many as the batch needs.
        window = max(int(self.top * NEWEST_SHARE), 3 * count)
        low = max(1, self.top - window) if distribution == "newest-1%" else 1
        picked: set[int] = set()
        while len(picked) < count:
            k = self.random.randint(low, self.top)
            if k not in self.deleted:
                picked.add(k)
        return list(picked)

    def batch(self, changes: int, distribution: str) -> tuple[Batch, Batch]:
        """A batch for MERGE (a delete is None) and the same changes as full rows for the append."""
        self.version += 1
        updates, deletes = int(changes * MIX[0]), int(changes * MIX[1])
        inserts = changes - updates - deletes
        existing = self.draw(updates + deletes, distribution)
        merge: Batch = {}
        append: Batch = {}
        for k in existing[:updates]:
            merge[(k,)] = append[(k,)] = row(k, self.version)
        for k in existing[updates:]:
            merge[(k,)] = None
            append[(k,)] = row(k, self.version)
            self.deleted.add(k)
        for k in range(self.top + 1, self.top + inserts + 1):
            merge[(k,)] = append[(k,)] = row(k, self.version)
        self.top += inserts
        return merge, append


def make_config(
    base: Path, format_version: int, partition_by: Sequence[str], rows: int | None = None, server: Any = None
) -> PipelineConfig:
    """The pipeline of bench.items (or, end to end, of bench.items_<rows> on `server`) into an embedded warehouse."""
    return parse_config(make_document(base, format_version, partition_by, rows, server))


def make_document(
    base: Path, format_version: int, partition_by: Sequence[str], rows: int | None = None, server: Any = None
) -> dict[str, Any]:
    """`make_config`'s pipeline file."""
    table = "items" if rows is None else f"items_{rows}"
    document = harness.pipeline_document(
        PIPELINE if rows is None else f"bench_e2e_{rows}",
        "127.0.0.1" if server is None else server.host,
        3306 if server is None else server.port,
        rf"{harness.DATABASE}\.{table}",
        base,
        5403,
        sink={"format_version": format_version},
        spark={"master": "local[2]"},
        table_options={f"{harness.DATABASE}.{table}": {"partition_by": list(partition_by)}},
    )
    if rows is not None:
        document["sink"]["catalog_name"] = f"e2e_{rows}"
    return document


BEFORE_CONF = {
    # Spark's defaults, which the job's sessions changed for issue 31 (ingest/runtime/session_conf.py)
    "spark.sql.autoBroadcastJoinThreshold": "10MB",
    "spark.sql.optimizer.runtime.bloomFilter.enabled": "false",
}


@contextlib.contextmanager
def unpruned(spark: Any) -> Iterator[None]:
    """The job's MERGE as it was before issue 31: no target-only predicates, no Bloom filter of the batch.

    The job's query makes a binlog batch's predicates in its source's Python process, which no patch here reaches:
    for `run()`, the commit of each batch drops them (`TableBatch.where`, None: the whole target is read)."""
    from ingest.query import structured
    from ingest.query.commit import commit_prepared
    from ingest.sink import merge

    def commit_unpruned(
        spark_: Any,
        targets: Any,
        stream: Any,
        state: Any,
        tables: Any,
        prepared: Sequence[Any],
        *args: Any,
        **kwargs: Any,
    ) -> None:
        unpruned = [dataclasses.replace(p, where=None) for p in prepared]
        commit_prepared(spark_, targets, stream, state, tables, unpruned, *args, **kwargs)

    kept = merge.target_predicate
    conf = {k: spark.conf.get(k) for k in BEFORE_CONF}
    merge.target_predicate = lambda *args, **kwargs: None  # type: ignore[assignment]
    for key, value in BEFORE_CONF.items():
        spark.conf.set(key, value)
    try:
        with mock.patch.object(structured, "commit_prepared", commit_unpruned):
            yield
    finally:
        merge.target_predicate = kept
        for key, value in conf.items():
            spark.conf.set(key, value)


class Bench:
    def __init__(self, args: argparse.Namespace, base: Path) -> None:
        from ingest.runtime.spark import spark_session
        from ingest.sink.catalog import load_pyiceberg_catalog

        self.args = args
        self.base = base
        self.configs = {v: make_config(base, v, args.partition_by) for v in args.formats}
        first = self.configs[args.formats[0]]
        # As in run(): pyiceberg creates the SQLite catalog's tables before Spark first uses the catalog.
        load_pyiceberg_catalog(first.sink).list_namespaces()
        started = time.perf_counter()
        self.spark = spark_session(first.spark, first.sink, "bench-apply")
        self.spark_start_s = time.perf_counter() - started
        self.position = 4

    def target(self, version: int, name: str) -> str:
        from ingest.sink.targets import ensure_target

        config = self.configs[version]
        options = dict(config.table_options)
        options["bench.items"] = dataclasses.replace(options["bench.items"], target=f"applybench.{name}")
        return ensure_target(self.spark, dataclasses.replace(config, table_options=options).targets, SCHEMA)

    def fill(self, table: str, rows: int) -> float:
        parts = max(1, -(-rows // self.args.rows_per_file))
        started = time.perf_counter()
        self.spark.sql(FILL_SQL.format(table=table, epoch=EPOCH_2024, rows=rows, parts=parts))
        return time.perf_counter() - started

    def merge(self, table: str, batch: Batch, pruned: bool) -> float:
        from ingest.sink.merge import merge_into

        self.position += 1
        end = Watermark(BinlogPosition("mysql-bin.000001", self.position))
        started = time.perf_counter()
        with contextlib.nullcontext() if pruned else unpruned(self.spark):
            merge_into(self.spark, table, SCHEMA, batch, end, lambda: None)
        return time.perf_counter() - started

    def by_position(self, version: int, table: str, batch: Batch) -> float:
        from ingest.sink.catalog import cached_pyiceberg_catalog
        from ingest.sink.driver_apply import apply_in_driver, driver_target
        from ingest.sink.merge import batch_arrow, stream_offset_properties

        self.position += 1
        end = Watermark(BinlogPosition("mysql-bin.000001", self.position))
        config = self.configs[version]
        stream = dataclasses.replace(config.stream, driver_apply_max_rows=1)  # never the small targets' rewrite
        started = time.perf_counter()
        rows = batch_arrow(SCHEMA, batch)
        names = (table.split(".")[1].strip("`"), table.split(".")[2].strip("`"))
        driver = driver_target(cached_pyiceberg_catalog(config.sink), names, table, SCHEMA, stream, rows, False)
        assert driver is not None and driver.how == "position", table
        properties = stream_offset_properties(config.name, end)
        apply_in_driver(driver, table, SCHEMA, rows, end, properties, lambda: None)
        return time.perf_counter() - started

    def run_mode(self, version: int, table: str, batch: Batch, mode: str) -> float:
        if mode == "position":
            return self.by_position(version, table, batch)
        return self.merge(table, batch, mode == "apply")

    def append(self, table: str, rows: Batch) -> float:
        from ingest.sink.merge import OP_COLUMN, batch_arrow

        started = time.perf_counter()
        self.spark.createDataFrame(batch_arrow(SCHEMA, rows)).drop(OP_COLUMN).writeTo(table).append()
        return time.perf_counter() - started

    def scaling(self, version: int, rows: int, append_table: str) -> dict[str, Any]:
        table = self.target(version, f"items_v{version}_{rows}")
        fill_s = self.fill(table, rows)
        keys = Keys(rows, seed=rows + version)
        harness.progress(f"v{version}, {rows:,} rows: filled in {fill_s:.1f} s")
        modes = MODES if version == 2 else tuple(m for m in MODES if m != "position")
        for distribution in DISTRIBUTIONS:  # warm-up: plans, JIT, the first read of the table's metadata
            for mode in modes:
                self.run_mode(version, table, keys.batch(min(self.args.changes, 1000), distribution)[0], mode)
        times: dict[str, dict[str, list[float]]] = {d: {m: [] for m in (*MODES, "append")} for d in DISTRIBUTIONS}
        for r in range(self.args.rounds):
            for distribution in DISTRIBUTIONS:
                for mode in modes if r % 2 == 0 else modes[::-1]:
                    merge, rows_of = keys.batch(self.args.changes, distribution)
                    times[distribution][mode].append(self.run_mode(version, table, merge, mode))
                    if mode == "apply":
                        times[distribution]["append"].append(self.append(append_table, rows_of))
            harness.progress(f"v{version}, {rows:,} rows: round {r + 1} {_medians(times)}")
        return {
            "format_version": version,
            "rows": rows,
            "fill_s": round(fill_s, 2),
            "seconds": {d: {m: [round(t, 3) for t in ts] for m, ts in by.items()} for d, by in times.items()},
            "median_s": _medians(times),
        }

    def read_cost(self, version: int) -> dict[str, Any]:
        from ingest.sink.maintenance import maintain

        rows = self.args.read_rows
        table = self.target(version, f"items_v{version}_read")
        self.fill(table, rows)
        keys = Keys(rows, seed=7 + version)
        probe = keys.draw(LOOKUPS, "uniform")
        fresh = self.reads(table, probe)
        applied = []
        for b in range(self.args.read_batches):
            applied.append(self.merge(table, keys.batch(self.args.changes, DISTRIBUTIONS[b % 2])[0], True))
        after = self.reads(table, probe)
        end = Watermark(BinlogPosition("mysql-bin.000001", self.position))
        started = time.perf_counter()
        maintain(self.spark, table, PIPELINE, end, MaintenanceConfig(every_commits=50, expire_after_hours=None))
        maintain_s = time.perf_counter() - started
        compacted = self.reads(table, probe)
        files = self.files(table)
        # What compaction left of the key order the MERGE's ranges rely on: a few batches of recent keys after it.
        later = [self.merge(table, keys.batch(self.args.changes, DISTRIBUTIONS[0])[0], True) for _ in range(3)]
        harness.progress(
            f"v{version} reads after {len(applied)} batches: {after}, compacted: {compacted}; then {later}"
        )
        return {
            "format_version": version,
            "rows": rows,
            "batches": len(applied),
            "apply_s_median": round(statistics.median(applied), 3) if applied else None,
            "fresh": fresh,
            "after_batches": after,
            "maintenance_s": round(maintain_s, 2),
            "compacted": compacted,
            "files": files,
            "apply_after_compaction_s": [round(t, 3) for t in later],
        }

    def reads(self, table: str, probe: Sequence[int]) -> dict[str, float]:
        self.spark.sql(f"REFRESH TABLE {table}")
        counts, lookups = [], []
        for _ in range(3):
            started = time.perf_counter()
            self.spark.sql(f"SELECT count(*) FROM {table}").collect()
            counts.append(time.perf_counter() - started)
        for k in probe:
            started = time.perf_counter()
            self.spark.sql(f"SELECT * FROM {table} WHERE id = {int(k)}").collect()
            lookups.append(time.perf_counter() - started)
        return {"count_s": round(statistics.median(counts), 3), "lookup_s": round(statistics.median(lookups), 3)}

    def files(self, table: str) -> dict[str, int]:
        data = self.spark.sql(f"SELECT count(*) FROM {table}.data_files").collect()[0][0]
        deletes = self.spark.sql(f"SELECT count(*) FROM {table}.delete_files").collect()[0][0]
        return {"data_files": int(data), "delete_files": int(deletes)}


E2E_WINDOW = 100_000
"""Keys the end-to-end batch updates and deletes among: the newest 100,000 (1 % of 10 M rows)."""
E2E_LOAD_SLICE = 500_000


class EndToEnd:
    """The job itself, from the CLI's entry (`ingest.query.pipeline.run`), on a real MariaDB: a table of N rows is
    snapshotted, then each round writes one batch of `--changes` changes (set-based statements in one transaction:
    updates and deletes of keys among the newest E2E_WINDOW, inserts of new keys) and times
    `run(until_caught_up=True)`, which reads them from the binlog and commits them, once with the job as it is and
    once with the MERGE of before issue 31 (alternating)."""

    def __init__(self, bench: Bench, server: Any) -> None:
        self.bench, self.server = bench, server

    def config(self, rows: int) -> PipelineConfig:
        return parse_config(self.document(rows))

    def document(self, rows: int) -> dict[str, Any]:
        args = self.bench.args
        return make_document(self.bench.base / f"e2e-{rows}", args.formats[0], args.partition_by, rows, self.server)

    def load(self, rows: int) -> float:
        table = f"bench.items_{rows}"
        started = time.perf_counter()
        self.server.execute(
            "CREATE DATABASE IF NOT EXISTS bench",
            f"DROP TABLE IF EXISTS {table}",
            f"CREATE TABLE {table} (id BIGINT NOT NULL PRIMARY KEY, customer_id BIGINT NOT NULL, "
            "status VARCHAR(16) NOT NULL, amount DECIMAL(12,2) NULL, created_at DATETIME(6) NOT NULL, "
            "updated_us BIGINT NOT NULL, note VARCHAR(64) NULL) ENGINE=InnoDB",
        )
        insert_unlogged(
            self.server,
            rows,
            lambda offset, n: (
                f"INSERT INTO {table} SELECT s, s % 5000, ELT(1 + s % 4, 'new', 'paid', 'shipped', 'done'), "
                "IF(s % 11 = 0, NULL, (s % 100000) / 100), TIMESTAMP'2024-01-01 00:00:00' + INTERVAL s SECOND, "
                f"1700000000000000, CONCAT('order ', s, ' v0') FROM {sequence(offset, n)}"
            ),
            E2E_LOAD_SLICE,
        )
        return time.perf_counter() - started

    def write_batch(self, rows: int, top: int, round_: int) -> int:
        """One transaction of `--changes` changes; returns the new top key."""
        changes = self.bench.args.changes
        updates, deletes = int(changes * MIX[0]), int(changes * MIX[1])
        inserts = changes - updates - deletes
        low = top - E2E_WINDOW
        table = f"bench.items_{rows}"
        with self.server.admin("bench") as conn, conn.cursor() as cur:
            cur.execute("BEGIN")
            # Every (E2E_WINDOW / updates)-th key of the window, shifted each round so no key is deleted twice.
            step = E2E_WINDOW // updates
            cur.execute(
                f"UPDATE {table} SET updated_us = updated_us + 1, status = 'paid' WHERE id > %s AND id %% %s = %s",
                (low, step, round_ % step),
            )
            step = E2E_WINDOW // deletes
            cur.execute(f"DELETE FROM {table} WHERE id > %s AND id %% %s = %s", (low, step, (round_ + 3) % step))
            cur.execute(
                f"INSERT INTO {table} SELECT s, s % 5000, 'new', 1.00, "
                "TIMESTAMP'2024-01-01 00:00:00' + INTERVAL s SECOND, "
                f"1, 'new' FROM {sequence(top, inserts)}"
            )
            cur.execute("COMMIT")
        return top + inserts

    def measure(self, rows: int) -> dict[str, Any]:
        from ingest.query.pipeline import run

        load_s = self.load(rows)
        config = self.config(rows)
        started = time.perf_counter()
        run(config, snapshot_only=True, spark=self.bench.spark)
        snapshot_s = time.perf_counter() - started
        harness.progress(f"end to end, {rows:,} rows: loaded in {load_s:.1f} s, snapshotted in {snapshot_s:.1f} s")
        top = rows
        merging = dataclasses.replace(config, stream=dataclasses.replace(config.stream, position_deletes=False))
        config_file = harness.write_pipeline(self.document(rows), self.bench.base / f"e2e-{rows}" / "pipeline.yaml")
        times: dict[str, list[float]] = {m: [] for m in E2E_MODES}
        in_session = [m for m in E2E_MODES if m not in RESTARTS]
        for r in range(1 + self.bench.args.rounds):  # round 0 warms the binlog phase up, not reported
            for mode in in_session if r % 2 == 0 else in_session[::-1]:
                top = self.write_batch(rows, top, len(E2E_MODES) * r + E2E_MODES.index(mode))
                started = time.perf_counter()
                with contextlib.nullcontext() if mode != "unpruned" else unpruned(self.bench.spark):
                    run(config if mode == "apply" else merging, until_caught_up=True, spark=self.bench.spark)
                if r:
                    times[mode].append(time.perf_counter() - started)
            top = self.write_batch(rows, top, len(E2E_MODES) * r + E2E_MODES.index("restarted"))
            for mode in RESTARTS:  # the batch, then nothing new
                seconds = harness.ingest(config_file, "run", "--until-caught-up")
                if r:
                    times[mode].append(seconds)
            harness.progress(f"end to end, {rows:,} rows: round {r} {times}")
        return {
            "rows": rows,
            "load_s": round(load_s, 1),
            "snapshot_s": round(snapshot_s, 1),
            "catch_up_s": {m: [round(t, 3) for t in ts] for m, ts in times.items()},
            "median_s": {m: round(statistics.median(ts), 3) if ts else None for m, ts in times.items()},
        }


def _medians(times: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float | None]]:
    return {d: {m: round(statistics.median(ts), 3) if ts else None for m, ts in by.items()} for d, by in times.items()}


def slope_200m(points: Sequence[tuple[int, float]]) -> float | None:
    """Apply time at 200 M rows on a least-squares line through (rows, seconds)."""
    line = harness.least_squares([x for x, _ in points], [y for _, y in points])
    return None if line is None else line[2] + line[0] * (200_000_000 - line[1])


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for version in results["args"]["formats"]:
        runs = [s for s in results["scaling"] if s["format_version"] == version]
        if not runs:
            continue
        smallest, largest = runs[0], runs[-1]
        per: dict[str, Any] = {}
        for d in DISTRIBUTIONS:
            m_small, m_large = smallest["median_s"][d], largest["median_s"][d]
            per[d] = {
                "apply_largest_over_smallest": _ratio(m_large["apply"], m_small["apply"]),
                "unpruned_largest_over_smallest": _ratio(m_large["unpruned"], m_small["unpruned"]),
                "apply_over_append_largest": _ratio(m_large["apply"], m_large["append"]),
                "apply_over_unpruned_smallest": _ratio(m_small["apply"], m_small["unpruned"]),
                "apply_s_at_200m": harness.rounded(
                    slope_200m([(r["rows"], r["median_s"][d]["apply"]) for r in runs]), 2
                ),
                "unpruned_s_at_200m": harness.rounded(
                    slope_200m([(r["rows"], r["median_s"][d]["unpruned"]) for r in runs]), 2
                ),
                "position_largest_over_smallest": _ratio(m_large["position"], m_small["position"]),
                "position_over_apply_largest": _ratio(m_large["position"], m_large["apply"]),
            }
        out[f"v{version}"] = per
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return harness.rounded(harness.ratio(a, b), 2)


def render(results: dict[str, Any]) -> str:
    lines = [
        f"bench.apply: {results['args']['changes']:,} changes per batch "
        f"({', '.join(f'{int(s * 100)} %' for s in MIX)} updates/deletes/inserts), "
        f"{results['args']['rows_per_file']:,} rows per file, partition_by {results['args']['partition_by'] or 'none'}"
        f"{harness.spark_conf_note(results['args'].get('spark_conf'))}",
        "",
        "| format | rows | keys | apply s (MERGE) | unpruned s (before) | position s | append s | apply / append "
        "| apply / unpruned | position / apply |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in results["scaling"]:
        for d in DISTRIBUTIONS:
            m = s["median_s"][d]
            lines.append(
                f"| v{s['format_version']} | {s['rows']:,} | {d} | {m['apply']} | {m['unpruned']} | {m['position']} "
                f"| {m['append']} | {_ratio(m['apply'], m['append'])} | {_ratio(m['apply'], m['unpruned'])} "
                f"| {_ratio(m['position'], m['apply'])} |"
            )
    lines += [
        "",
        "| format | keys | apply largest / smallest | before | apply / append, largest | apply s at 200 M "
        "(line) | before at 200 M |",
        "|---|---|---|---|---|---|---|",
    ]
    for version, per in results["summary"].items():
        for d, v in per.items():
            lines.append(
                f"| {version} | {d} | {v['apply_largest_over_smallest']} | {v['unpruned_largest_over_smallest']} "
                f"| {v['apply_over_append_largest']} | {v['apply_s_at_200m']} | {v['unpruned_s_at_200m']} |"
            )
    if results["reads"]:
        lines += [
            "",
            "| format | rows | batches | count s: fresh / after / compacted | lookup s: fresh / after / "
            "compacted | after / compacted (count, lookup) | apply s: median of the batches / after compaction |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in results["reads"]:
            f, a, c = r["fresh"], r["after_batches"], r["compacted"]
            lines.append(
                f"| v{r['format_version']} | {r['rows']:,} | {r['batches']} | {f['count_s']} / {a['count_s']} / "
                f"{c['count_s']} | {f['lookup_s']} / {a['lookup_s']} / {c['lookup_s']} | "
                f"{_ratio(a['count_s'], c['count_s'])}, {_ratio(a['lookup_s'], c['lookup_s'])} | "
                f"{r['apply_s_median']} / {statistics.median(r['apply_after_compaction_s']):.3f} |"
            )
    if results["end_to_end"]:
        lines += [
            "",
            "| end to end: rows | snapshot s | catch-up of one batch s | with Spark's MERGE s | before issue 31 s "
            "| apply / MERGE | apply / before | restarted with the batch s | restarted with nothing new s "
            "| restarted: with / without |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for e in results["end_to_end"]:
            m = e["median_s"]
            lines.append(
                f"| {e['rows']:,} | {e['snapshot_s']} | {m['apply']} | {m['merge']} | {m['unpruned']} | "
                f"{_ratio(m['apply'], m['merge'])} | {_ratio(m['apply'], m['unpruned'])} | {m['restarted']} "
                f"| {m['idle']} | {_ratio(m['restarted'], m['idle'])} |"
            )
        first, last = results["end_to_end"][0], results["end_to_end"][-1]
        lines.append(
            f"\nend to end, {last['rows']:,} / {first['rows']:,} rows: "
            f"{_ratio(last['median_s']['apply'], first['median_s']['apply'])} "
            f"(before: {_ratio(last['median_s']['unpruned'], first['median_s']['unpruned'])})"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.parser_for("bench.apply", __doc__)
    parser.add_argument(
        "--sizes",
        type=lambda text: harness.int_list(text) if text else [],
        default=[200_000, 2_000_000, 20_000_000],
        help="target sizes of the scaling part; '' skips it",
    )
    parser.add_argument("--changes", type=harness.positive, default=20_000)
    parser.add_argument("--rounds", type=harness.positive, default=3)
    parser.add_argument("--formats", type=harness.int_list, default=[2, 3])
    parser.add_argument("--rows-per-file", type=harness.positive, default=1_000_000)
    parser.add_argument(
        "--partition-by",
        action="append",
        default=[],
        metavar="SPEC",
        help="a partition field of every target, as table_options.<table>.partition_by (repeatable)",
    )
    parser.add_argument("--read-rows", type=int, default=2_000_000, help="0 skips the read-cost part")
    parser.add_argument("--read-batches", type=int, default=50)
    parser.add_argument(
        "--e2e-sizes",
        type=lambda text: harness.int_list(text) if text else [],
        default=[200_000, 10_000_000],
        help="table sizes of the end-to-end part (a MariaDB table, the job's snapshot, then catch-ups); '' skips it",
    )
    harness.add_common_options(parser)
    return parser.parse_args(argv)


def measure(_: None, args: argparse.Namespace, base: Path, results: dict[str, Any]) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    results.update(scaling=[], reads=[], end_to_end=[])
    bench = Bench(args, base)
    results["spark_start_s"] = round(bench.spark_start_s, 2)
    for version in args.formats:
        append_table = bench.target(version, f"items_v{version}_append")
        for rows in sorted(args.sizes):
            results["scaling"].append(bench.scaling(version, rows, append_table))
            bench.spark.sql(f"DROP TABLE IF EXISTS lake.applybench.items_v{version}_{rows} PURGE")
    if args.read_rows > 0 and args.read_batches > 0:
        for version in args.formats:
            results["reads"].append(bench.read_cost(version))
    if args.e2e_sizes:
        with harness.private_mariadb(extra_args=("--innodb-buffer-pool-size=1G",), base_dir=base / "mariadb") as server:
            e2e = EndToEnd(bench, server)
            results["end_to_end"] = [e2e.measure(rows) for rows in sorted(args.e2e_sizes)]
    results["summary"] = summarize(results)
    bench.spark.stop()


def main(argv: list[str] | None = None) -> int:
    results = harness.run_bench("apply", parse_args(argv), measure, render)
    print(json.dumps(results["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
