"""Readers see whole transactions across tables when they read at the cut (issue 52). A transfer workload: each
transaction moves an amount between two `accounts` rows and adds a `transfers` row and two `ledger` rows. The job
streams it and is killed with SIGKILL twice meanwhile (the first time by itself, halfway through its snapshot, so that
the next run reads the rest while it streams); a reader reads the three tables at the newest cut the state
table holds, over and over, and checks the invariants: the balances' sum is constant, each balance is its opening
plus its ledger, and the ledger has two rows per transfer. Not one read at the cut may see a transfer torn. The
ledger's changelog table is in the cut too: read at it, it ends where the ledger does.

The batch lands in one commit of the catalog (ingest/sink/atomic.py): the three tables' main, read at one instant of
the catalog (their pointers in one query), is never torn either. Loading the tables one after the other, as an
engine does, can straddle a commit: those reads are counted, as what a reader without the cut sees."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyiceberg.table import StaticTable
from sqlalchemy import text

from ingest.commands.cut import cut_report
from ingest.commands.verify import verify
from ingest.config import parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.faults import ENV as CRASH_ENV
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.source.watermark import read_watermark
from ingest.state.table import KIND_CHUNK, KIND_CUT, StateTable, _cut_of, _watermark
from tests.conftest import (
    embedded_sink,
    minio_sink,
    mysql_rows,
    rest_sink,
    run_ingest,
    source_section,
    start_ingest,
)

ACCOUNTS, OPENING = 20, 1000
RATE = 40
CHUNK_ROWS, CHUNKS_PER_COMMIT = 256, 8
SEEDED = (CHUNKS_PER_COMMIT + 2) * CHUNK_ROWS // 2  # transfers of nothing: 10 ledger chunks, 5 transfers chunks
TABLES = ("accounts", "ledger", "transfers")


def _transfers(server: MariaDBServer, stop: threading.Event, done: Counter[str]) -> None:
    """Transfers at up to `RATE` a second: as many on a fast machine as on a slow one, so that the job keeps up."""
    rng = random.Random(52)
    started = time.monotonic()
    with server.admin("cut") as conn, conn.cursor() as cur:
        cur.execute("SET SESSION autocommit = 0")
        while not stop.wait(max(0.0, started + done["transfers"] / RATE - time.monotonic())):
            src, dst = rng.sample(range(1, ACCOUNTS + 1), 2)
            amount = rng.randint(1, 50)
            cur.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (amount, src))
            cur.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (amount, dst))
            cur.execute("INSERT INTO transfers (src, dst, amount) VALUES (%s, %s, %s)", (src, dst, amount))
            cur.execute("INSERT INTO ledger (account, amount) VALUES (%s, %s), (%s, %s)", (src, -amount, dst, amount))
            conn.commit()
            done["transfers"] += 1


def _torn(tables: dict[str, list[dict[str, Any]]]) -> str | None:
    """What a read of the three tables breaks of the invariants (None: nothing)."""
    balances = {r["id"]: r["balance"] for r in tables["accounts"]}
    if len(balances) != ACCOUNTS or sum(balances.values()) != ACCOUNTS * OPENING:
        return f"balances sum to {sum(balances.values())} over {len(balances)} accounts"
    moved = Counter[int]()
    for r in tables["ledger"]:
        moved[r["account"]] += r["amount"]
    if any(balances[a] != OPENING + moved[a] for a in balances):
        return "a balance does not match its ledger"
    if len(tables["ledger"]) != 2 * len(tables["transfers"]):
        return f"{len(tables['ledger'])} ledger rows for {len(tables['transfers'])} transfers"
    return None


def _changelog_torn(ledger: list[dict[str, Any]], logged: list[dict[str, Any]]) -> str | None:
    """What the ledger's changelog read at the cut breaks against the ledger read at it (None: nothing). The ledger
    only grows, its ids in commit order (one writer): the rows the snapshot copied come first, then every row the
    binlog phase added, each a `+I` of the changelog. So the changelog is the ledger from its first row on."""
    inserted = [r["id"] for r in logged if r["_op"] == "+I"]
    if len(inserted) != len(logged) or len(set(inserted)) != len(inserted):
        return f"{len(logged)} changelog rows, {len(set(inserted))} distinct inserts"
    tail = {r["id"] for r in ledger if inserted and r["id"] >= min(inserted)}
    if set(inserted) != tail:
        return f"{len(set(inserted) - tail)} changelog rows not in the ledger, {len(tail - set(inserted))} missing"
    return None


def _cut_history(config: Any, stop: threading.Event, seen: Counter[str], problems: list[str]) -> None:
    """Every cut the job records, from the state table's snapshots as they come (it keeps its last few): no table is
    in a cut whose offset is before one of its chunks' high watermarks (a chunk read while the job streams holds the
    rows of that point), and where a table joins the cut, the three tables read at it are whole. The reader of the
    newest cut can miss a cut that lasts one batch; this looks at each."""
    catalog = load_pyiceberg_catalog(config.sink)
    checked: set[int] = set()
    members: frozenset[str] = frozenset()
    while not stop.wait(0.3):
        try:
            state = catalog.load_table(config.sink.state_table)
        except Exception:  # noqa: BLE001 - before the first run the catalog does not exist yet
            continue
        for snapshot in sorted(state.snapshots(), key=lambda s: s.sequence_number):
            if snapshot.snapshot_id in checked:
                continue
            checked.add(snapshot.snapshot_id)
            try:
                rows = state.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()
            except Exception:  # noqa: BLE001 - expired meanwhile
                continue
            ours = [r for r in rows if r["pipeline"] == config.name]
            cut = _cut_of([r for r in ours if r["kind"] == KIND_CUT])
            if cut is None:
                continue
            seen["cuts recorded"] += 1
            offset = cut.offset.position
            for r in ours:
                high = _watermark(r["high_watermark"]) if r["kind"] == KIND_CHUNK else None
                if high is not None and r["table_id"] in cut.tables and high.position > offset:
                    problems.append(f"{r['table_id']} is in the cut at {offset}, its chunk read at {high.position}")
            joined = frozenset(cut.tables) != members and _whole(cut.tables)
            members = frozenset(cut.tables)
            if not joined:
                continue
            seen["joins"] += 1
            if (why := _torn(_read_at(catalog, cut.tables))) is not None:
                problems.append(f"at the cut {offset}, where every table joined it: {why}")


def _whole(named: Mapping[str, Any]) -> bool:
    """Every table of the workload is named (in a cut's tables)."""
    return all(f"cut.{t}" in named for t in TABLES)


def _read_at(catalog: Any, named: Mapping[str, tuple[str, int | None]]) -> dict[str, list[dict[str, Any]]]:
    """The workload's tables, each read at the snapshot a cut names (None: empty)."""
    read = {}
    for t in TABLES:
        name, snapshot_id = named[f"cut.{t}"]
        scan = catalog.load_table(name).scan(snapshot_id=snapshot_id)
        read[t] = scan.to_arrow().to_pylist() if snapshot_id is not None else []
    return read


class _NoInstant(Exception):
    """The catalog cannot be read at one instant (a REST catalog)."""


def _read_loop(config: Any, stop: threading.Event, seen: Counter[str], problems: list[str]) -> None:
    catalog = load_pyiceberg_catalog(config.sink)
    # Twice a second: each round scans ten tables in this process, on the cores the job and the writer need; every
    # cut the job records is checked by `_cut_history` whatever this samples.
    while not stop.wait(0.5):  # the job commits to the same catalog meanwhile
        try:
            cut = StateTable.open(config.sink, config.name).cut()
        except Exception:  # noqa: BLE001 - before the first run the catalog does not exist yet
            cut = None
        if cut is None or not _whole(cut.tables):
            continue  # a table is still being copied, or its copy is ahead of the offset: main is torn
        read = _read_at(catalog, cut.tables)
        seen["cut"] += 1
        if (why := _torn(read)) is not None:
            problems.append(f"at the cut {cut.offset}: {why}")
        if "cut.ledger" in cut.changelogs:
            seen["changelog at the cut"] += 1
            name, snapshot_id = cut.changelogs["cut.ledger"]
            logged = catalog.load_table(name).scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
            if (why := _changelog_torn(read["ledger"], logged)) is not None:
                problems.append(f"the ledger's changelog at the cut {cut.offset}: {why}")
        try:
            # As an engine plans a query of several tables: every table's metadata loaded, then each scanned. A
            # batch can land between two loads (each reads and parses a metadata file: tens of milliseconds).
            loaded = {t: catalog.load_table(("cut", t)) for t in TABLES}
            main = {t: table.scan().to_arrow().to_pylist() for t, table in loaded.items()}
            # The catalog's pointers to the three tables' main, read in one query: what the catalog holds at one
            # instant. A batch committed table by table can be half there; one committed at once cannot. (A REST
            # catalog offers no such read: its server's own database is not the job's to look at.)
            at_once = None
            if not hasattr(catalog, "engine"):
                raise _NoInstant
            with catalog.engine.connect() as db:
                where = "catalog_name = :c AND table_namespace = 'cut'"
                located = dict(
                    db.execute(
                        text(f"SELECT table_name, metadata_location FROM iceberg_tables WHERE {where}"),
                        {"c": config.sink.catalog_name},
                    ).fetchall()
                )
            at_once = {
                t: StaticTable.from_metadata(located[t], catalog.properties).scan().to_arrow().to_pylist()
                for t in TABLES
            }
        except _NoInstant:
            pass
        except Exception:  # noqa: BLE001 - the targets are not created yet
            continue
        seen["main"] += 1
        seen["main torn"] += _torn(main) is not None
        if at_once is None:
            continue
        seen["at once"] += 1
        if (why := _torn(at_once)) is not None:
            seen["at once torn"] += 1
            problems.append(f"main, read at one instant of the catalog: {why}")


def reads_at_the_cut(mariadb: MariaDBServer, tmp_path: Path, apply: str, request: pytest.FixtureRequest) -> None:
    """The workload, run with kills, read at the cut and checked (see the module). `apply`, one test module each so
    that the runs share out over the test workers: `driver` (test_cut.py), the small targets take their batches from
    pyiceberg, on the JDBC catalog in PostgreSQL with MinIO; `spark` (test_cut_spark.py), from Spark's MERGE, into each
    table's stage branch, published by the batch's one commit, on the embedded catalog (SQLite); `rest`
    (test_cut_rest.py), the REST catalog with MinIO, each batch one request to its transactions endpoint."""
    mariadb.execute(
        "DROP DATABASE IF EXISTS cut",
        "CREATE DATABASE cut",
        "CREATE TABLE cut.accounts (id INT NOT NULL PRIMARY KEY, balance INT NOT NULL)",
        "CREATE TABLE cut.transfers (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, src INT, dst INT, amount INT)",
        "CREATE TABLE cut.ledger (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, account INT, amount INT)",
        f"INSERT INTO cut.accounts SELECT seq, {OPENING} FROM cut.seq_1_to_{ACCOUNTS}",
        # Transfers of nothing before the job starts (they keep every invariant), so that whatever the machine's
        # speed the ledger has more chunks than one commit takes and transfers more than one: the chunk batches are
        # then accounts alone, then the ledger's first commit, where the first run kills itself. With the writer's
        # rows alone a fast start planned one transfers chunk, which shared accounts' batch, and the kill came
        # before any of the ledger was read.
        f"INSERT INTO cut.transfers (src, dst, amount) SELECT 1 + seq % {ACCOUNTS}, 1 + (seq + 1) % {ACCOUNTS}, 0 "
        f"FROM cut.seq_1_to_{SEEDED}",
        f"INSERT INTO cut.ledger (account, amount) SELECT 1 + seq % {ACCOUNTS}, 0 FROM cut.seq_1_to_{2 * SEEDED}",
    )
    data = {
        "name": "cut",
        "source": source_section(mariadb),
        "tables": {"include": [r"cut\..*"]},
        "table_options": {"cut.ledger": {"changelog": True}},
        "snapshot": {"chunk_size": CHUNK_ROWS, "chunks_per_commit": CHUNKS_PER_COMMIT},
        "sink": {**_sink(request, apply, tmp_path), "namespace": "cut"},
        # Small batches: after a restart the backlog takes several, each ending before the chunks read meanwhile.
        "stream": {
            "batch_interval_seconds": 1,
            "batch_max_changes": 1000,
            **({"driver_apply_max_rows": 0} if apply == "spark" else {}),
        },
    }
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))
    config = parse_config(data, tmp_path)
    stop_writer, stop_reader = threading.Event(), threading.Event()
    done, seen, problems = Counter[str](), Counter[str](), list[str]()
    writer = threading.Thread(target=_transfers, args=(mariadb, stop_writer, done))
    reader = threading.Thread(target=_read_loop, args=(config, stop_reader, seen, problems))
    history = threading.Thread(target=_cut_history, args=(config, stop_reader, seen, problems))
    writer.start()
    reader.start()
    history.start()
    rng = random.Random(7)
    try:
        # The first run kills itself halfway through the ledger's chunks (a crash point: SIGKILL to its process
        # group). The next run reads the rest of them while it streams the backlog from the crash: its first
        # batches end before those chunks' high watermarks.
        log_file = tmp_path / "run-0.log"
        job = start_ingest(config_file, log_file, env={**os.environ, CRASH_ENV: "snapshot.after_state:2"})
        assert job.wait(timeout=300) == -signal.SIGKILL, log_file.read_text()[-3000:]
        assert StateTable.open(config.sink, config.name).done("cut.ledger"), "no chunk of the ledger was read"
        for attempt in range(1, 3):  # one run killed while it streams, then one that catches up
            before = _cut_offset(config)
            log_file = tmp_path / f"run-{attempt}.log"
            job = start_ingest(config_file, log_file)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and job.poll() is None and _cut_offset(config) in (before, None):
                time.sleep(0.5)  # until this run has recorded a cut of its own, with every table in it
            time.sleep(rng.uniform(2, 5))
            assert job.poll() is None, log_file.read_text()[-3000:]
            if attempt == 2:  # the writer stops and this run catches up, as a last run of its own would
                stop_writer.set()
                _caught_up(mariadb, config, job, log_file)
            # The job and its JVM: SIGKILL; then SIGTERM, to the whole group as systemd stops a unit, which
            # the JVM ignores (ingest.runtime.spark.launching_jvm) and the job stops on with exit 0.
            os.killpg(job.pid, signal.SIGKILL if attempt < 2 else signal.SIGTERM)
            job.wait(timeout=60)
            assert job.returncode == (-signal.SIGKILL if attempt < 2 else 0), log_file.read_text()[-3000:]
    finally:
        stop_writer.set()
        writer.join()
        stop_reader.set()
        reader.join()
        history.join()
    print(
        f"transfers {done['transfers']}; reads at the cut {seen['cut']}; reads of main {seen['main']}, torn "
        f"{seen['main torn']} ({1000 * seen['main torn'] / max(seen['main'], 1):.0f} per 1,000); reads of main at one "
        f"instant of the catalog {seen['at once']}, torn {seen['at once torn']}; cuts recorded and checked "
        f"{seen['cuts recorded']}, where every table joined {seen['joins']}"
    )
    assert not problems, problems[:5]
    assert seen["cut"] >= 5 and seen["main"] >= 5 and done["transfers"] > 100, (seen, done)
    assert seen["changelog at the cut"] >= 5, seen
    assert seen["cuts recorded"] >= 10 and seen["joins"] >= 1, seen
    assert seen["at once"] >= 5 or apply == "rest", seen
    assert verify(config, ranges=2)

    # After the catch-up the cut is at the job's offset, and the tables read at it are MySQL's, row for row.
    report = cut_report(config)
    assert report is not None and report["not_in_cut"] == []
    state = StateTable.open(config.sink, config.name)
    cut = state.cut()
    assert cut is not None and cut.offset == state.stream_offset()
    catalog = load_pyiceberg_catalog(config.sink)
    for t, at_cut in _read_at(catalog, cut.tables).items():
        assert sorted(at_cut, key=lambda r: r["id"]) == mysql_rows(mariadb, f"cut.{t}", "id")
    assert [r["table"] for r in report["changelogs"]] == ["cut.ledger"]
    name, snapshot_id = cut.changelogs["cut.ledger"]
    logged = catalog.load_table(name).scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
    assert _changelog_torn(mysql_rows(mariadb, "cut.ledger", "id"), logged) is None
    shown = run_ingest("cut", "--config", str(config_file))
    assert shown.returncode == 0 and "cut.accounts" in shown.stdout and "FOR VERSION AS OF" in shown.stdout, shown
    assert "cut.ledger (changelog)  cut.ledger_changelog" in shown.stdout, shown.stdout


def _caught_up(mariadb: MariaDBServer, config: Any, job: Any, log_file: Path) -> None:
    """Wait until the running job has committed the binlog up to its end, with every table in the cut there."""
    with mariadb.admin() as conn:
        end = read_watermark(conn, "mariadb").position
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and job.poll() is None:
        state = StateTable.open(config.sink, config.name)
        offset, cut = state.stream_offset(), state.cut()
        if (
            offset is not None
            and offset.position >= end
            and cut is not None
            and cut.offset == offset
            and _whole(cut.tables)
        ):
            return
        time.sleep(0.5)
    raise AssertionError(f"the job did not catch up to {end}:\n" + log_file.read_text()[-3000:])


def _sink(request: pytest.FixtureRequest, apply: str, base: Path) -> dict[str, Any]:
    """Each run on a catalog of its own: `driver` on the JDBC catalog in PostgreSQL with MinIO, `spark` on the
    embedded one (SQLite, local files), `rest` on the REST catalog with MinIO."""
    if apply == "spark":
        return embedded_sink(base)
    minio = request.getfixturevalue("minio")
    if apply == "rest":
        return {**rest_sink(minio, request.getfixturevalue("rest_catalog")), "state_table": "ingest_meta.state_cut"}
    sink = minio_sink(minio, request.getfixturevalue("postgres"), minio.bucket("cut-driver"))
    return {**sink, "state_table": "ingest_meta.state_cut"}


def _cut_offset(config: Any) -> Any:
    """The offset of the newest cut that has every table in it (None: none has yet)."""
    try:
        cut = StateTable.open(config.sink, config.name).cut()
    except Exception:  # noqa: BLE001 - before the first run the catalog does not exist yet
        return None
    return None if cut is None or not _whole(cut.tables) else cut.offset
