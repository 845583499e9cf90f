"""`ingest cut`: the newest consistent cut the job recorded: per table, its Iceberg table and the snapshot to read it
at, all of them as of one binlog offset. A reader that loads tables one after the other can straddle a commit; one
that reads each table at the cut's snapshot sees every transaction whole (docs/querying.md)."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from ingest.config import PipelineConfig
from ingest.state.table import StateTable


def cut_report(config: PipelineConfig) -> dict[str, Any] | None:
    """The cut as `ingest cut --json` prints it (None before the binlog phase's first commit)."""
    state = StateTable.open(config.sink, config.name)
    cut = state.cut()
    if cut is None:
        return None
    return {
        "pipeline": config.name,
        "offset": str(cut.offset.position),
        "gtid": None if cut.offset.gtid is None else str(cut.offset.gtid),
        "recorded_at": cut.recorded_at.isoformat(),
        "state_table": config.sink.state_table,
        "tables": [
            {"table": table_id, "iceberg_table": name, "snapshot_id": snapshot_id}
            for table_id, (name, snapshot_id) in sorted(cut.tables.items())
        ],
        "changelogs": [
            {"table": table_id, "iceberg_table": name, "snapshot_id": snapshot_id}
            for table_id, (name, snapshot_id) in sorted(cut.changelogs.items())
        ],
        "not_in_cut": [t for t in state.tables() if t not in cut.tables],
    }


def print_cut(config: PipelineConfig, as_json: bool = False, out: TextIO = sys.stdout) -> None:
    report = cut_report(config)
    if as_json:
        print(json.dumps(report, indent=2), file=out)
        return
    if report is None:
        print(f"pipeline {config.name!r} has no cut yet: its binlog phase has committed nothing", file=out)
        return
    gtid = f" (GTID {report['gtid']})" if report["gtid"] else ""
    print(
        f"cut of pipeline {config.name!r} at binlog {report['offset']}{gtid}, recorded {report['recorded_at']}",
        file=out,
    )
    listed = [(t, t["table"]) for t in report["tables"]]
    listed += [(t, f"{t['table']} (changelog)") for t in report["changelogs"]]
    rows = [(label, t["iceberg_table"], _snapshot(t["snapshot_id"])) for t, label in listed]
    widths = [max(len(r[i]) for r in [("table", "iceberg table", "snapshot"), *rows]) for i in range(3)]
    for row in [("table", "iceberg table", "snapshot"), *rows]:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip(), file=out)
    if report["not_in_cut"]:
        waiting = ", ".join(report["not_in_cut"])
        print(f"not in the cut yet (being copied, or holding more than the offset): {waiting}", file=out)
    print(
        "read each table at its snapshot (Trino: FOR VERSION AS OF <snapshot>; Spark: the `snapshot-id` option; "
        f"pyiceberg: scan(snapshot_id=...)); the cut is also in {config.sink.state_table} (kind = 'cut')",
        file=out,
    )


def _snapshot(snapshot_id: int | None) -> str:
    return "(empty)" if snapshot_id is None else str(snapshot_id)
