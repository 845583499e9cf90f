"""The binlog reader alone, per single-row transaction: the job's `BinlogReader` over a recorded binlog of the
steady load's transactions (bench.steady's stored procedure, run as fast as the server goes), against the raw
python-mysql-replication parse of the same range (the baseline), in turns, no Spark and no sink. See bench/README.md.

    .venv/bin/python -m bench.reader [--transactions 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from bench import harness
from bench.steady import LOAD_PROCEDURE, ServerLoad
from bench.tables import binlog_position, create_tables, load_initial, source_counts, three_tables_document
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.model.position import BinlogPosition

READER_SERVER_ID = 5601
BASELINE_SERVER_ID = 5602
CALL_TRANSACTIONS = 20_000
"""Transactions per call of the load procedure (each call's deadline is five seconds past its nominal length)."""


def record(server: MariaDBServer, config: PipelineConfig, transactions: int) -> dict[str, Any]:
    """At least `transactions` single-row transactions of the steady load; the binlog range they occupy."""
    start, done, call = binlog_position(config), 0, 0
    sizes = source_counts(server)
    while done < transactions:
        # A rate of a million per second is no pace at all: the procedure writes as fast as the server goes.
        load = ServerLoad(server, 1e6, CALL_TRANSACTIONS / 1e6, 1, call, sizes)
        load.run()
        if load.errors:
            raise RuntimeError(f"the load procedure failed: {'; '.join(load.errors)}")
        done, call = done + load.transactions, call + 1
    return {"start": str(start), "end": str(binlog_position(config)), "transactions": done}


def raw_parse(config: PipelineConfig, start: BinlogPosition, end: BinlogPosition) -> dict[str, Any]:
    """python-mysql-replication alone: every row of every row event in the range."""
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    from ingest.source.binlog.reader import open_stream

    stream = open_stream(
        config.source, start, BASELINE_SERVER_ID, only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent]
    )
    rows = 0
    try:
        for event in stream:
            rows += len(event.rows)
            if BinlogPosition(stream.log_file, event.packet.log_pos) >= end:
                break
    finally:
        stream.close()
    return {"rows": rows}


def ours(config: PipelineConfig, start: BinlogPosition, end: BinlogPosition) -> dict[str, Any]:
    """The job's reader: its transactions over the range, their changes counted (nothing batched or applied)."""
    from ingest.source.binlog.reader import BinlogReader
    from ingest.source.discovery import discover

    info = discover(config.source, config.tables, config.table_options)
    reader = BinlogReader(config.source, info.schemas, start)
    rows = transactions = 0
    try:
        for tx in reader.transactions():
            rows += len(tx.changes)
            transactions += 1
            if tx.end >= end:
                break
    finally:
        reader.close()
    return {"rows": rows, "transactions": transactions, "taken_in_place": dict(reader._buffer.taken)}


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    create_tables(server)
    load_initial(server, args.initial_rows)
    server.execute(LOAD_PROCEDURE)
    document = three_tables_document("bench_reader", READER_SERVER_ID, server.host, server.port, scratch / "wh")
    config = parse_config(document)
    harness.progress(f"recording {args.transactions:,} single-row transactions")
    binlog = results["binlog"] = record(server, config, args.transactions)
    start, end = BinlogPosition.parse(binlog["start"]), BinlogPosition.parse(binlog["end"])
    harness.progress(f"recorded {binlog['transactions']:,} transactions, {binlog['start']} .. {binlog['end']}")
    results["rounds"] = []
    for r in range(args.rounds):
        base = harness.measured_here(server, lambda: raw_parse(config, start, end))
        mine = harness.measured_here(server, lambda: ours(config, start, end))
        results["rounds"].append({"raw_parse": base, "ours": mine})
        harness.progress(
            f"round {r + 1}: raw parse {base['cpu_s']:.2f} CPU-s, ours {mine['cpu_s']:.2f} CPU-s "
            f"({mine['transactions']:,} transactions, {mine['rows']:,} changes)"
        )
    tx = binlog["transactions"]
    median = {part: statistics.median(r[part]["cpu_s"] for r in results["rounds"]) for part in ("raw_parse", "ours")}
    results["us_per_transaction"] = {part: round(cpu / tx * 1e6, 2) for part, cpu in median.items()}
    results["ratio_raw_over_ours"] = harness.ratio(median["raw_parse"], median["ours"])


def render(results: dict[str, Any]) -> str:
    b, per = results["binlog"], results["us_per_transaction"]
    rows = [
        [
            r + 1,
            x["raw_parse"]["cpu_s"],
            x["ours"]["cpu_s"],
            x["ours"]["rows"],
            harness.ratio(x["raw_parse"]["cpu_s"], x["ours"]["cpu_s"]),
        ]
        for r, x in enumerate(results["rounds"])
    ]
    lines = [
        f"The reader alone: {b['transactions']:,} single-row transactions of the steady load ({b['start']} .. "
        f"{b['end']}), read {len(rows)} times in turn by the raw library parse (baseline) and by BinlogReader",
        *harness.text_table(COLUMNS, rows),
        f"CPU per transaction (medians): raw parse {per['raw_parse']:.1f} us, ours {per['ours']:.1f} us",
        f"events read in place by ours: {results['rounds'][-1]['ours'].get('taken_in_place')}",
        *harness.ratio_lines({"raw parse CPU / ours (median)": results["ratio_raw_over_ours"]}),
    ]
    return "\n".join(lines)


COLUMNS = harness.columns("round:5:.0f; raw CPU-s:9:.2f; ours CPU-s:10:.2f; changes:9:,.0f; raw/ours:8:.3f")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.parser_for("bench.reader", __doc__)
    parser.add_argument(
        "--transactions", type=harness.positive, default=100_000, help="single-row transactions recorded (100,000)"
    )
    parser.add_argument("--rounds", type=harness.positive, default=3, help="reads of the range by each, in turn (3)")
    parser.add_argument(
        "--initial-rows", type=harness.positive, default=20_000, help="initial orders (customers 1/4, events 1/2)"
    )
    harness.add_common_options(parser, spark_conf=False)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    harness.run_bench("reader", parse_args(argv), measure, render, mariadb={})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
