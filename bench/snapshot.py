"""Snapshot throughput, CPU and memory of the job against a plain PyMySQL read of the same table, in one run. The
baselines run in this process, the job in `python -m bench.snapshot --worker SPEC` children (a Spark session's
master cannot change; the child's tree is exactly the job). No timing is asserted; see bench/README.md.

    .venv/bin/python -m bench.snapshot [--rows N] [--chunk-size 8192] [--parallelism 1,2]
                                       [--memory-sizes 1000000,4000000] [--update-rate 500] [--in-query 2]
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from bench import harness
from bench.tables import TABLE, create_table, drop_table, fill_table, select_all
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer

FIXED_PARALLELISM = 2
"""The parallelism of the watermark-correction and memory runs."""


def make_config(spec: dict[str, Any]) -> PipelineConfig:
    """A pipeline over one table of the bench database into an embedded warehouse (SQLite JDBC catalog)."""
    parallelism = int(spec["parallelism"])
    document = harness.pipeline_document(
        "bench",
        spec["host"],
        int(spec["port"]),
        rf"{harness.DATABASE}\.{re.escape(spec['table'])}",
        Path(spec["warehouse"]),
        5401,
        snapshot={"chunk_size": int(spec["chunk_size"]), "parallelism": parallelism},
        spark={"master": f"local[{parallelism}]"},
        # Without snapshot_only, the job's query reads the chunks itself (chunk batches), then catches up.
        **({} if spec.get("query") else {"startup_mode": "snapshot_only"}),
    )
    return parse_config(document)


def measure_chunk_reader(server: MariaDBServer, table: str, chunk_size: int, scratch: Path) -> dict[str, Any]:
    """Our executor-side work without Spark: every chunk through `chunk_batches` (lock-free read + Arrow), serially."""
    from ingest.model.schema import target_columns
    from ingest.source.discovery import discover
    from ingest.source.mysql import connect
    from ingest.source.snapshot.chunk_reader import ChunkConnections, ChunkTask
    from ingest.source.snapshot.chunks import split_table
    from ingest.source.snapshot.snapshot_source import chunk_batches, source_schema

    spec = {"host": server.host, "port": server.port, "table": table, "parallelism": 1, "chunk_size": chunk_size}
    config = make_config({**spec, "warehouse": str(scratch / "unused")})
    info = discover(config.source, config.tables, config.table_options)
    schema = info.schemas[0]
    with connect(config.source) as conn:
        plan = split_table(conn, schema, chunk_size)
    targets = target_columns(schema)
    _, arrow_schema = source_schema(targets)

    def body() -> dict[str, Any]:
        reports: dict[int, dict[str, Any]] = {}
        sessions = ChunkConnections(config.source, config.snapshot.driver)  # kept across chunks, as a partition does
        for chunk in plan:
            task = ChunkTask(config.source, info.flavor, schema, chunk)
            for _batch in chunk_batches(task, targets, arrow_schema, reports.__setitem__, sessions):
                pass
        sessions.close()
        metas = [reports[chunk.index] for chunk in plan]
        return {
            "rows": sum(int(m["rows"]) for m in metas),
            "chunks": len(plan),
            "window_events": sum(int(m["window_events"]) for m in metas),
            "read_chunk_select_s": round(sum(float(m["timings"]["select"]) for m in metas), 3),
            "read_chunk_window_s": round(sum(float(m["timings"]["window"]) for m in metas), 3),
            "read_s": sum(float(m["seconds"]) for m in metas),
        }

    out = harness.measured_here(server, body)
    out["arrow_and_other_s"] = round(out["seconds"] - out.pop("read_s"), 3)
    return out


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Inside the child: start Spark, run the snapshot, measure the process tree around `run`."""
    from ingest.query.pipeline import run
    from ingest.sink.targets import qualified
    from ingest.state.table import StateTable

    config = make_config(spec)
    spark, spark_start = harness.start_spark(config, spec["label"])
    if spec.get("query"):
        measured = harness.measured_tree(lambda: run(config, until_caught_up=True, spark=spark))
    else:
        measured = harness.measured_tree(lambda: run(config, snapshot_only=True, spark=spark))
    table_id = f"{harness.DATABASE}.{spec['table']}"
    done = StateTable.open(config.sink, config.name).done(table_id)
    namespace, name = config.target_for(harness.DATABASE, spec["table"])
    rows_in_iceberg = int(spark.table(qualified(config, namespace, name)).count())
    spark.stop()
    rows = int(spec["rows"])
    return {
        "label": spec["label"],
        "table": table_id,
        "parallelism": int(spec["parallelism"]),
        "query": bool(spec.get("query")),
        "rows": rows,
        "seconds": measured["seconds"],
        "rows_per_s": rows / measured["seconds"],
        "spark_start_s": round(spark_start, 3),
        "cpu_s": measured["cpu_s"],
        "cpu_s_by_part": measured["cpu"],
        "cpu_s_per_million": harness.per_million(measured["cpu_s"], rows),
        "chunks": len(done),
        "rows_recorded": sum(r.row_count for r in done.values()),
        "rows_in_iceberg": rows_in_iceberg,
        "window_events": sum(r.window_events for r in done.values()),
        "load_avg_1m_before": measured["load_avg_1m_before"],
    }


class UpdateWriter(harness.PacedWriter):
    """Updates random rows of `table` (ids 1..`rows`)."""

    def __init__(self, server: MariaDBServer, table: str, rows: int, rate: float) -> None:
        super().__init__(server, rate, "update-writer")
        self.rows = rows
        self._rng = random.Random(20240601)
        self._sql = (
            f"UPDATE {harness.DATABASE}.{table} SET c_bigint = c_bigint + 1, c_double = RAND(), "
            "c_timestamp = NOW() WHERE id = %s"
        )

    def write(self, cur: Any) -> None:
        cur.execute(self._sql, (self._rng.randint(1, self.rows),))


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    rows, chunk_size = args.rows, args.chunk_size
    results["table"] = (
        f"{harness.DATABASE}.{TABLE}: INT UNSIGNED AUTO_INCREMENT key + BIGINT, VARCHAR(64), DECIMAL(12,2), "
        "DATETIME(6), TIMESTAMP, DOUBLE, TINYINT, TEXT(60 chars)"
    )
    results["cpu_method"] = harness.CPU_METHOD

    def job(label: str, table: str, table_rows: int, parallelism: int, query: bool = False, **hooks: Any) -> Any:
        warehouse = scratch / f"warehouse-{label}"
        spec = {"label": label, "host": server.host, "port": server.port, "table": table, "rows": table_rows}
        spec |= {"parallelism": parallelism, "chunk_size": chunk_size, "warehouse": str(warehouse), "query": query}
        harness.progress(f"ours {label}: {table_rows:,} rows at parallelism {parallelism} (log {scratch}/{label}.log)")
        out: dict[str, Any] = {}
        with (
            harness.mariadb_cpu_into(server, out),
            harness.Worker("bench.snapshot", spec, scratch / f"{label}.log", monitor_interval=0.2, **hooks) as worker,
        ):
            out.update(worker.finish())
        shutil.rmtree(warehouse, ignore_errors=True)
        harness.progress(f"ours {label}: {out['rows_per_s']:,.0f} rows/s, peak RSS {out['peak_rss_mib']:,.0f} MiB")
        return out

    create_table(server, TABLE)
    harness.progress(f"loading {rows:,} rows into {harness.DATABASE}.{TABLE}")
    results["load_s"] = round(fill_table(server, TABLE, rows), 3)
    harness.progress(f"loaded in {results['load_s']:.1f}s; baseline: PyMySQL SSCursor")
    results["baseline_sscursor"] = select_all(server, [f"{harness.DATABASE}.{TABLE}"])
    harness.progress("chunk reader without Spark")
    results["chunk_reader_no_spark"] = measure_chunk_reader(server, TABLE, chunk_size, scratch)
    idle = {p: job(f"p{p}", TABLE, rows, p) for p in args.parallelism}
    if FIXED_PARALLELISM not in idle and (args.update_rate > 0 or args.memory_sizes):
        idle[FIXED_PARALLELISM] = job(f"p{FIXED_PARALLELISM}", TABLE, rows, FIXED_PARALLELISM)
    results["ours"] = [idle[p] for p in sorted(idle)]
    results["in_query"] = [job(f"query-p{p}", TABLE, rows, p, query=True) for p in args.in_query]
    if args.update_rate > 0:
        writer = UpdateWriter(server, TABLE, rows, args.update_rate)
        label = f"p{FIXED_PARALLELISM}-writer"
        correction = job(label, TABLE, rows, FIXED_PARALLELISM, on_started=writer.start, on_done=writer.stop)
        correction["writer"] = writer.summary()
        correction["idle_rows_per_s"] = idle[FIXED_PARALLELISM]["rows_per_s"]
        correction["rows_per_s_vs_idle"] = correction["rows_per_s"] / correction["idle_rows_per_s"]
        results["watermark_correction"] = correction
    results["memory"] = []
    for size in args.memory_sizes:
        if size == rows:
            entry = {**idle[FIXED_PARALLELISM], "reused_idle_run": True}
        else:
            table = f"{TABLE}_{size}"
            create_table(server, table)
            harness.progress(f"loading {size:,} rows into {harness.DATABASE}.{table}")
            load_s = fill_table(server, table, size)
            entry = {**job(f"mem{size}", table, size, FIXED_PARALLELISM), "load_s": round(load_s, 3)}
            entry["reused_idle_run"] = False
            drop_table(server, table)
        results["memory"].append(entry)
    results["ratios"] = ratios(results)


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    base = results["baseline_sscursor"]
    out: dict[str, Any] = {}

    def versus(name: str, run: dict[str, Any]) -> None:
        out[f"{name}_rows_per_s_vs_baseline"] = run["rows_per_s"] / base["rows_per_s"]
        out[f"{name}_cpu_per_row_vs_baseline"] = run["cpu_s_per_million"] / base["cpu_s_per_million"]

    for run in results["ours"]:
        versus(f"ours_p{run['parallelism']}", run)
    versus("chunk_reader", results["chunk_reader_no_spark"])
    for run in results["in_query"]:
        p = run["parallelism"]
        out[f"in_query_p{p}_rows_per_s_vs_baseline"] = run["rows_per_s"] / base["rows_per_s"]
        alone = next((r for r in results["ours"] if r["parallelism"] == p), None)
        if alone is not None:
            out[f"in_query_p{p}_rows_per_s_vs_snapshot_phase"] = run["rows_per_s"] / alone["rows_per_s"]
    if "watermark_correction" in results:
        out["writer_run_rows_per_s_vs_idle"] = results["watermark_correction"]["rows_per_s_vs_idle"]
    memory = results["memory"]
    if len(memory) > 1:
        smallest, largest = min(memory, key=lambda m: m["rows"]), max(memory, key=lambda m: m["rows"])
        for key in ("rss", "pss"):
            out[f"memory_peak_{key}_largest_vs_smallest"] = largest[f"peak_{key}_mib"] / smallest[f"peak_{key}_mib"]
        out["memory_rows_largest_vs_smallest"] = largest["rows"] / smallest["rows"]
    return out


COLUMNS = [
    harness.Column("measurement", 34),
    harness.Column("rows/s", 10),
    harness.Column("x baseline", 10, ".2f"),
    harness.Column("wall s", 8, ".1f"),
    harness.Column("CPU s", 8, ".1f"),
    harness.Column("CPU s/M rows", 12, ".1f"),
    harness.Column("x base CPU", 10, ".2f"),
    harness.Column("peak RSS MiB", 12),
    harness.Column("MariaDB CPU s", 13, ".1f"),
]
MEMORY_COLUMNS = [
    harness.Column("  rows", 14, ","),
    *(
        harness.Column(t, w)
        for t, w in (("RSS total", 9), ("driver", 8), ("JVM", 8), ("py workers", 10), ("PSS total", 9))
    ),
    harness.Column("processes", 9),
    harness.Column("rows/s", 10),
]


def render(results: dict[str, Any]) -> str:
    base, reader, args, host = (
        results["baseline_sscursor"],
        results["chunk_reader_no_spark"],
        results["args"],
        results["host"],
    )
    correction = results.get("watermark_correction")

    def row(name: str, m: dict[str, Any]) -> list[Any]:
        per_m = m["cpu_s_per_million"]
        return [
            name,
            m["rows_per_s"],
            m["rows_per_s"] / base["rows_per_s"],
            m["seconds"],
            m["cpu_s"],
            per_m,
            per_m / base["cpu_s_per_million"],
            m.get("peak_rss_mib"),
            m.get("mariadb_cpu_s"),
        ]

    ours = [(f"ours: run() at parallelism {r['parallelism']}", r) for r in results["ours"]]
    ours += [(f"ours: the query's chunk batches p{r['parallelism']}", r) for r in results["in_query"]]
    ours += [(f"ours: p{correction['parallelism']} + update writer", correction)] if correction else []
    lines = [
        f"Snapshot benchmark, {results['started_at']}: {args['rows']:,} rows, chunk size {args['chunk_size']:,}, "
        f"{host['cpus']} CPUs, load average at start {host['load_avg_1m_at_start']:.2f}"
        f"{harness.spark_conf_note(args.get('spark_conf'))}",
        f"table {results['table']}; loaded in {results['load_s']:.1f}s",
        f"CPU of ours: {results['cpu_method']}",
        "",
        *harness.text_table(
            COLUMNS,
            [
                row("baseline: PyMySQL SSCursor SELECT *", base),
                row("chunk reader + Arrow, no Spark", reader),
                *(row(n, r) for n, r in ours),
            ],
        ),
        "",
        f"chunk reader breakdown ({reader['chunks']} chunks, serial): select {reader['read_chunk_select_s']:.1f}s, "
        f"window {reader['read_chunk_window_s']:.1f}s, "
        f"Arrow conversion and the rest {reader['arrow_and_other_s']:.1f}s",
    ]
    for _, run in ours:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in run["cpu_s_by_part"].items())
        rss = ", ".join(f"{k} {v:,.0f}" for k, v in run["peak_rss_mib_by_part"].items())
        check = "" if run["rows_recorded"] == run["rows_in_iceberg"] == run["rows"] else "  <-- ROW COUNT MISMATCH"
        lines += [
            f"{run['label']:<10} Spark start {run['spark_start_s']:.1f}s (not in wall s); CPU s by part: {parts}; "
            f"chunks {run['chunks']}, rows recorded {run['rows_recorded']:,}, in Iceberg {run['rows_in_iceberg']:,}, "
            f"window events {run['window_events']:,}{check}",
            f"{'':<10} peak RSS MiB by part: {rss}; peak PSS of the tree {run['peak_pss_mib']:,.0f} MiB; "
            f"at most {run['peak_processes']} processes",
        ]
    if correction:
        w = correction["writer"]
        lines += [
            "",
            f"Watermark correction (p{correction['parallelism']}): writer {w['statements']:,} updates in "
            f"{w['seconds']:.1f}s = {w['achieved_rate']:.0f}/s (target {w['target_rate']:.0f}/s)"
            + (f", writer error: {w['error']}" if w["error"] else ""),
            f"  rows/s {correction['rows_per_s']:,.0f} vs idle {correction['idle_rows_per_s']:,.0f}"
            f" = {correction['rows_per_s_vs_idle']:.2f}x; window events recorded in the state table: "
            f"{correction['window_events']:,}",
        ]
    if results["memory"]:
        lines += ["", f"Memory at parallelism {FIXED_PARALLELISM} (peak RSS of the job's process tree, MiB):"]
        memory_rows = []
        for m in results["memory"]:
            by = m["peak_rss_mib_by_part"]
            memory_rows.append(
                [
                    f"{m['rows']:>14,}",
                    m["peak_rss_mib"],
                    by.get("driver"),
                    by.get("jvm"),
                    by.get("python_workers"),
                    m["peak_pss_mib"],
                    m["peak_processes"],
                    m["rows_per_s"],
                ]
            )
            if m["reused_idle_run"]:
                memory_rows[-1][-1] = f"{m['rows_per_s']:>10,.0f}  (same run as the idle one above)"
        lines += harness.text_table(MEMORY_COLUMNS, memory_rows, rule=False)
    return "\n".join(lines + harness.ratio_lines(results["ratios"]))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.parser_for("bench.snapshot", __doc__)
    parser.add_argument(
        "--rows", type=harness.positive, default=1_000_000, help="rows in bench.items (default 1,000,000)"
    )
    parser.add_argument("--chunk-size", type=harness.positive, default=8192, help="snapshot.chunk_size (default 8192)")
    parser.add_argument(
        "--parallelism", type=harness.int_list, default=[1, 2], help="comma-separated snapshot.parallelism values (1,2)"
    )
    parser.add_argument(
        "--memory-sizes",
        type=harness.int_list,
        default=[1_000_000, 4_000_000],
        help="comma-separated table sizes for the memory runs at parallelism 2 (1000000,4000000); '' for none",
    )
    parser.add_argument(
        "--update-rate",
        type=float,
        default=500.0,
        help="updates/s of the writer during the watermark-correction run (500; 0 skips that run)",
    )
    parser.add_argument(
        "--in-query",
        type=harness.int_list,
        default=[2],
        help="comma-separated parallelisms of runs whose streaming query reads the chunks (2; '' for none)",
    )
    harness.add_common_options(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    if not harness.worker_main(sys.argv if argv is None else argv, run_worker):
        harness.run_bench(
            "snapshot", parse_args(argv), measure, render, mariadb={"extra_args": ("--innodb-buffer-pool-size=1G",)}
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
