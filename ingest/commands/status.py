"""`ingest status`: what the job has committed, per table and job-wide, and how far behind the source it is.

Everything comes from Iceberg (state table, target snapshots) plus a few source queries (`SHOW MASTER
STATUS`, `SHOW BINARY LOGS`; on MariaDB, for an offset recorded without its GTID position,
`BINLOG_GTID_POS`, which reads the offset's binlog file up to it), so status works while the job runs or
is down, and needs no more grants than the job. After a failover the offset is a position of another
server, and only its GTIDs say how far behind the job is.
Lag is given in binlog bytes and files (exact and cheap), in transactions on MariaDB (GTID sequence
numbers; MySQL has no function that maps a binlog position to its GTID set) and in seconds (an upper
bound, see `lag_seconds`). Row events are not counted: that would mean reading the binlog.
What only the running job knows (is it reconnecting to the source?) comes from its metrics endpoint, when the
pipeline file names one (`metrics.port`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TextIO

import pymysql

from ingest.config import PipelineConfig
from ingest.model.position import BinlogPosition, MariadbGtidPos
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.merge import committed_offset
from ingest.sink.targets import COPY_BRANCH, copy_under_way, job_head
from ingest.source.mysql import binlog_sizes, connect, server_flavor
from ingest.source.watermark import bytes_behind, read_watermark
from ingest.state.table import StateTable

log = logging.getLogger(__name__)


def transactions_behind(cur: Any, committed: BinlogPosition, server_gtid: MariadbGtidPos) -> int | None:
    """MariaDB: transactions between the committed offset and the server's GTID position (every database
    of the server, like the byte count). None when the server cannot map the offset to a GTID position
    (its binlog file was purged, or the query failed)."""
    try:
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (committed.file, committed.pos))
    except pymysql.err.MySQLError as e:
        log.warning("cannot map the committed offset to a GTID position: %s", e)
        return None
    row = cur.fetchone()
    if row is None or row[0] is None:
        return None
    return server_gtid.transactions_since(MariadbGtidPos.parse(str(row[0])))


def lag_seconds(caught_up: bool | None, source_time: int | None, now: float) -> float | None:
    """0 when caught up; else the seconds since the source was last known to be at the committed offset.

    That time is the commit time of the last committed transaction, or a heartbeat's time when the job
    committed while the source was idle, so the value is an upper bound of how old the oldest change
    missing from Iceberg is. None when unknown (the source unreachable, or nothing streamed yet).
    """
    if caught_up:
        return 0.0
    if caught_up is None or source_time is None:
        return None
    return max(0.0, round(now - source_time, 3))


def _iso(value: dt.datetime | float | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        value = dt.datetime.fromtimestamp(value, dt.UTC)
    return value.astimezone(dt.UTC).isoformat(timespec="seconds")


def _table_commits(config: PipelineConfig, catalog: Any, table_id: str) -> dict[str, Any]:
    """The target's last commit time and stream offset, and its changelog's, from Iceberg metadata."""
    from pyiceberg.exceptions import NoSuchTableError

    database, _, table = table_id.partition(".")
    out: dict[str, Any] = {"last_commit": None, "stream_offset": None, "copy_branch": None}
    names = {"": config.target_for(database, table)}
    changelog = config.changelog_for(database, table)
    if changelog is not None:
        names["changelog_"] = changelog
        out["changelog"] = ".".join(changelog)
    for prefix, name in names.items():
        try:
            iceberg_table = catalog.load_table(name)
        except NoSuchTableError:
            out[f"{prefix}last_commit"] = out[f"{prefix}stream_offset"] = None
            continue
        current = job_head(iceberg_table)  # the job's last commit: to the copy branch while one exists
        out[f"{prefix}last_commit"] = None if current is None else _iso(current.timestamp_ms / 1000)
        if not prefix and copy_under_way(iceberg_table):
            out["copy_branch"] = COPY_BRANCH
        offset = committed_offset(iceberg_table, config.name)
        out[f"{prefix}stream_offset"] = None if offset is None else str(offset.position)
    return out


def table_status(config: PipelineConfig, state: StateTable | None = None) -> list[dict[str, Any]]:
    """Per table: phase, chunks done / total, rows, high watermarks, last commit and committed offsets."""
    state = StateTable.open(config.sink, config.name) if state is None else state
    catalog = load_pyiceberg_catalog(config.sink)
    out = []
    for table_id in state.tables():
        plan = state.plan(table_id) or []
        done = state.done(table_id)
        highs = [r.high_watermark for r in done.values() if r.high_watermark is not None]
        out.append(
            {
                "table": table_id,
                "phase": "snapshot done" if len(done) >= len(plan) else "snapshot",
                "chunks_done": len(done),
                "chunks_total": len(plan),
                "rows": sum(r.row_count for r in done.values()),
                "low_high_watermark": str(min(highs).position) if highs else None,
                "high_high_watermark": str(max(highs).position) if highs else None,
                **_table_commits(config, catalog, table_id),
            }
        )
    return out


def binlog_status(config: PipelineConfig, state: StateTable, now: float | None = None) -> dict[str, Any]:
    """Job-wide: committed offset, the source's position, and the lag between them."""
    now = time.time() if now is None else now
    offset = state.stream_offset()
    committed = offset.position if offset is not None else None
    source_time = state.offset_source_time()
    server: BinlogPosition | None = None
    same_server = True
    sizes: dict[str, int] = {}
    transactions: int | None = None
    try:
        with connect(config.source) as conn:
            flavor = config.source.flavor if config.source.flavor != "auto" else server_flavor(conn)
            watermark = read_watermark(conn, flavor)
            server = watermark.position
            # After a failover the offset is a position of another server: only its GTIDs compare.
            same_server = offset is None or offset.server_id in (None, watermark.server_id)
            sizes = binlog_sizes(conn)
            if (
                offset is not None
                and isinstance(offset.gtid, MariadbGtidPos)
                and isinstance(watermark.gtid, MariadbGtidPos)
            ):
                transactions = watermark.gtid.transactions_since(offset.gtid)
            elif committed is not None and same_server and isinstance(watermark.gtid, MariadbGtidPos):
                with conn.cursor() as cur:
                    transactions = transactions_behind(cur, committed, watermark.gtid)
    except Exception as e:  # noqa: BLE001 - status still shows what Iceberg knows when MySQL is down
        log.warning("cannot reach the source for the current binlog position: %s", e)
    behind = files = None
    caught_up: bool | None = None
    if committed is not None and server is not None and not same_server:
        caught_up = None if transactions is None else transactions == 0
    elif committed is not None and server is not None:
        behind = bytes_behind(committed, server, sizes)
        if committed.base_name == server.base_name:
            files = max(0, server.file_number - committed.file_number)
            caught_up = committed >= server
    return {
        "committed_offset": None if committed is None else str(committed),
        "server_position": None if server is None else str(server),
        "caught_up": caught_up,
        "bytes_behind": behind,
        "files_behind": files,
        "transactions_behind": transactions,
        "source_time_at_offset": _iso(source_time),
        "lag_seconds": lag_seconds(caught_up, source_time, now),
        "last_commit": _iso(state.offset_recorded_at()),
    }


_RECONNECTING = re.compile(r'^ingest_source_reconnecting\{error="((?:[^"\\]|\\.)*)"\} 1(?:\.0)?$', re.MULTILINE)
_GAUGE = r"^{}(?:\{{[^}}]*\}})? (\S+)$"


def job_from_metrics(text: str) -> dict[str, Any]:
    """The running job's own view, from its metrics page: whether its binlog reader is reconnecting to the source,
    since when, how many attempts, and the last error."""
    reconnecting = _RECONNECTING.search(text)
    if reconnecting is None:
        return {"running": True, "reconnecting": None}
    error = re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], reconnecting[1])
    since = re.search(_GAUGE.format("ingest_source_reconnecting_since_seconds"), text, re.MULTILINE)
    attempts = re.search(_GAUGE.format("ingest_source_reconnect_attempts"), text, re.MULTILINE)
    return {
        "running": True,
        "reconnecting": {
            "since": None if since is None else _iso(float(since[1])),
            "attempts": 0 if attempts is None else int(float(attempts[1])),
            "error": error,
        },
    }


def job_status(config: PipelineConfig, timeout: float = 2.0) -> dict[str, Any] | None:
    """What the running job says of itself at its metrics endpoint (`metrics.port`); None without one. An
    endpoint that does not answer says only that: the job is down, or runs on another host."""
    port = config.metrics.port
    if port is None:
        return None
    host = "127.0.0.1" if config.metrics.host in ("0.0.0.0", "::", "") else config.metrics.host
    url = f"http://{host}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return {"metrics": url, **job_from_metrics(answer.read().decode())}
    except OSError:
        return {"metrics": url, "running": None, "reconnecting": None}


def _job_line(job: dict[str, Any]) -> str:
    if job["running"] is None:
        return f"job: no answer at {job['metrics']} (not running, or not on this host)"
    reconnecting = job["reconnecting"]
    if reconnecting is None:
        return "job: running"
    return (
        f"job: running, reconnecting to the source since {reconnecting['since']} "
        f"(attempt {reconnecting['attempts']}: {reconnecting['error']})"
    )


def watch_status(
    render: Callable[[], str],
    interval: float,
    out: TextIO,
    clear: bool,
    header: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.time,
) -> None:
    """`ingest status --watch`: the status again every `interval` seconds until Ctrl-C. On a terminal (`clear`)
    each one replaces the last on the screen; otherwise they follow one another. `header`: a line with the time
    above each (not for JSON). A failed refresh shows its error and the next one tries again."""
    try:
        while True:
            try:
                text = render()
            except Exception as e:  # noqa: BLE001 - the source or catalog away for a moment must not end the watch
                text = f"ingest: cannot read the status: {e}\n"
            top = f"{_iso(now())} (every {interval:g} s; Ctrl-C stops)\n" if header else ""
            out.write(("\x1b[H\x1b[2J" if clear else "") + top + text + ("" if clear else "\n"))
            out.flush()
            sleep(interval)
    except KeyboardInterrupt:
        return


def _stream_line(binlog: dict[str, Any]) -> str:
    """The binlog phase in a few words: where it committed, where the server is, how far behind."""
    if binlog["committed_offset"] is None:
        return "binlog phase not started"
    lag = binlog["lag_seconds"]
    behind = [
        f"{binlog[key]} {unit}"
        for key, unit in (("bytes_behind", "bytes"), ("files_behind", "files"), ("transactions_behind", "transactions"))
        if binlog[key] is not None
    ]
    return (
        f"binlog committed up to {binlog['committed_offset']} at {binlog['last_commit']}; server at "
        f"{binlog['server_position'] or 'unknown'}"
        + (f", {' / '.join(behind)} behind" if behind else "")
        + ("" if lag is None else f", lag {lag:.0f} s")
    )


def print_status(config: PipelineConfig, as_json: bool = False, out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out
    state = StateTable.open(config.sink, config.name)
    rows = table_status(config, state)
    binlog = binlog_status(config, state)
    job = job_status(config)
    requests = state.requests()
    asked = [{"table": t, "again": again} for t, again in sorted(requests.snapshot.items())]
    for row in rows:
        row["paused"] = row["table"] in requests.paused
    if as_json:
        print(
            json.dumps(
                {"pipeline": config.name, "job": job, "binlog": binlog, "tables": rows, "snapshot_requests": asked},
                indent=2,
            ),
            file=out,
        )
        return
    print(f"pipeline {config.name}: {len(rows)} tables; {_stream_line(binlog)}", file=out)
    if job is not None:
        print(_job_line(job), file=out)
    if asked:
        tables = ", ".join(f"{a['table']}{' (again)' if a['again'] else ''}" for a in asked)
        print(f"snapshots asked, not taken by a job yet: {tables}", file=out)
    print(
        f"{'table':<32} {'phase':<14} {'chunks':>11} {'rows':>10}  {'last commit':<25} {'committed offset':<28} "
        "high watermarks (lowest .. highest)",
        file=out,
    )
    for r in rows:
        chunks = f"{r['chunks_done']}/{r['chunks_total']}"
        phase = "binlog" if binlog["committed_offset"] is not None and r["phase"] == "snapshot done" else r["phase"]
        phase = f"{phase} (paused)" if r["paused"] and phase == "snapshot" else phase
        print(
            f"{r['table']:<32} {phase:<14} {chunks:>11} {r['rows']:>10}  {r['last_commit'] or '-':<25} "
            f"{r['stream_offset'] or '-':<28} {r['low_high_watermark']} .. {r['high_high_watermark']}",
            file=out,
        )
        if r["copy_branch"] is not None:
            branch = r["copy_branch"]
            print(f"  copied again into branch {branch}; readers see the old rows until it is complete", file=out)
        if "changelog" in r:
            print(
                f"{'  changelog ' + r['changelog']:<71} {r['changelog_last_commit'] or '-':<25} "
                f"{r['changelog_stream_offset'] or '-':<28}",
                file=out,
            )
