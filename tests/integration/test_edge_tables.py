"""Tables and binlogs at the edges (issue 22): a table without a primary key through snapshot and binlog, one
source transaction far larger than a batch, and one key updated in every transaction. The job runs as a process of
its own where it matters: killed with SIGKILL at a named point where exactly-once could break, and its peak memory
read from /proc while it runs, compared with a small job's (FAILURES.md "Keys and chunks", "Watermarks,
positions, GTIDs", "The materializer"). `pytest -s` prints every measured run's figures at the module's end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import SchemaChangeError
from ingest.faults import ENV as CRASH_ENV
from ingest.model.position import BinlogPosition
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.maintenance import SUMMARY_MAINTENANCE
from ingest.sink.merge import offset_from_summary
from ingest.sink.summary import SUMMARY_PIPELINE, SUMMARY_STREAM_OFFSET
from ingest.source.watermark import read_watermark
from tests.conftest import embedded_sink, main_history, mysql_rows, source_section
from tests.executor_sql import run_once

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

BIG_TRANSACTION_CHANGES = 60_000
"""Row changes in the one large source transaction. The issue asks for 300,000; that size is scaled down to keep
CI time low and is run by setting this constant to 300_000 (and the memory bound follows it)."""
BIG_TRANSACTION_BATCH = 5_000
"""`stream.batch_max_changes` while that transaction is applied: it is 12 times larger than a batch."""
HOT_KEY_UPDATES = 200_000
"""Updates of the one hot key (the issue's case is a million: set this to 1_000_000 to run it)."""
HOT_KEY_TRANSACTION = 10_000
"""Updates per source transaction of the hot key."""
HOT_KEY_BATCH = 20_000
"""`stream.batch_max_changes` while the hot key is applied: the updates span several batches."""


# --- the job as a process of its own, its memory read from /proc -----------------------------------------


def _proc_tree(root: int) -> list[int]:
    """`root` and its descendants now (parents read from /proc/<pid>/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parentheses
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _status_kb(pid: int, names: tuple[str, ...]) -> dict[str, int]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in names:
            out[key] = int(value.split()[0])
    return out


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


@dataclass
class PeakMemory:
    """Peak resident memory of a job's process tree, in MiB: each process's own peak (VmHWM, kept by the kernel
    and read until the process ends), and the peak of its Python and Java processes' summed resident memory at
    one sample (pages the forked Python workers share are counted in each: an upper figure).

    Peaks are kept per process and program: an exec starts a new peak, and a child the JVM has forked but not
    yet exec'd (it still shares the JVM's memory, under the forking thread's name) is not counted as a worker.
    """

    root: int
    peak_kib: dict[tuple[int, str], int] = field(default_factory=dict)
    total_kib: int = 0

    def sample(self) -> None:
        total = 0
        for pid in _proc_tree(self.root):
            name = _comm(pid)
            status = _status_kb(pid, ("VmHWM", "VmRSS"))
            if name is None or not status or _comm(pid) != name:
                continue  # gone, or exec'd between the reads
            if name == "java" or name.startswith("python"):  # not the shells, nor a fork not yet exec'd
                total += status.get("VmRSS", 0)
            self.peak_kib[pid, name] = max(self.peak_kib.get((pid, name), 0), status.get("VmHWM", 0))
        self.total_kib = max(self.total_kib, total)

    def _mib(self, pick: Any) -> float:
        return max((kib for (pid, name), kib in self.peak_kib.items() if pick(pid, name)), default=0) / 1024

    @property
    def driver(self) -> float:
        """The job's Python process (the driver: it reads the binlog and materializes batches)."""
        return self._mib(lambda pid, name: pid == self.root)

    @property
    def jvm(self) -> float:
        """Spark's JVM (local mode: driver and executors)."""
        return self._mib(lambda pid, name: name == "java")

    @property
    def workers(self) -> float:
        """The largest of Spark's Python workers."""
        return self._mib(lambda pid, name: pid != self.root and name.startswith("python"))

    def __str__(self) -> str:
        return (
            f"driver {self.driver:.0f} MiB, JVM {self.jvm:.0f} MiB, largest Python worker {self.workers:.0f} MiB, "
            f"whole tree at most {self.total_kib / 1024:.0f} MiB"
        )


@dataclass
class JobRun:
    returncode: int
    stderr: str
    memory: PeakMemory
    seconds: float


def run_job(config_file: Path, *args: str, crash_at: str | None = None) -> JobRun:
    """`ingest run --config FILE ARGS` in a session of its own (a crash point kills only it), its memory sampled
    every 50 ms while it runs."""
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV} | ({CRASH_ENV: crash_at} if crash_at else {})
    started = time.monotonic()
    job = subprocess.Popen(
        [sys.executable, "-m", "ingest.cli", "run", "--config", str(config_file), *args],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    memory = PeakMemory(job.pid)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            memory.sample()
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        _, err = job.communicate(timeout=600)
    finally:
        done.set()
        sampler.join()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return JobRun(job.returncode, err, memory, time.monotonic() - started)


def _write_pipeline(
    mariadb: MariaDBServer, db: str, base: Path, *, snapshot: dict[str, Any], stream: dict[str, Any], **extra: Any
) -> tuple[PipelineConfig, Path]:
    """The pipeline of every table of `db` on the embedded catalog, as a file for the job and as a config."""
    data = {
        "name": db,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{db}\..*"]},
        # Table by table: the kill tests here stop a job between two tables' commits of one batch.
        "sink": {**embedded_sink(base), "catalog_name": f"{db}_lake", "one_commit": False},
        "snapshot": snapshot,
        "stream": stream,
        **extra,
    }
    path = base / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return parse_config(data, base), path


# --- what the targets hold -----------------------------------------------------------------------------


def _stream_offsets(config: PipelineConfig, namespace: str, table: str) -> list[BinlogPosition]:
    """The batch end of every stream commit of this pipeline to one target, in commit order."""
    target = load_pyiceberg_catalog(config.sink).load_table((namespace, table))
    out = []
    for snapshot in main_history(target):
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        if props.get(SUMMARY_PIPELINE) == config.name and SUMMARY_STREAM_OFFSET in props:
            if SUMMARY_MAINTENANCE not in props:  # a rewrite carries the offset below it, commits no batch
                out.append(offset_from_summary(props[SUMMARY_STREAM_OFFSET]).position)
    return out


def _assert_each_batch_once(config: PipelineConfig, db: str, tables: list[str]) -> dict[str, list[BinlogPosition]]:
    offsets = {table: _stream_offsets(config, db, table) for table in tables}
    for table, committed in offsets.items():
        assert len(committed) == len(set(committed)), f"{table}: a batch committed twice: {committed}"
        assert committed == sorted(committed), f"{table}: offsets out of order: {committed}"
    return offsets


def _assert_same_rows(mariadb: MariaDBServer, config: PipelineConfig, db: str, table: str, key: list[str]) -> None:
    """Iceberg holds MySQL's rows, each once: compared as lists, since `verify` matches Iceberg rows to MySQL's
    by key and would not see a key held twice with the same values."""

    def order(row: dict[str, Any]) -> tuple[str, ...]:
        return tuple(repr(row[k]) for k in key)

    want = sorted(mysql_rows(mariadb, f"{db}.{table}", ", ".join(key)), key=order)
    got = sorted(load_pyiceberg_catalog(config.sink).load_table((db, table)).scan().to_arrow().to_pylist(), key=order)
    assert len(got) == len(want), f"{table}: {len(got)} rows in Iceberg, {len(want)} in MySQL"
    assert got == want


def _transactions(mariadb: MariaDBServer, db: str, marker: str | None, transactions: list[list[str]]) -> None:
    """Each list of statements as one transaction, after checking that the chunk hook ran (its `marker` row)."""
    with mariadb.admin(db) as conn, conn.cursor() as cur:
        if marker is not None:
            cur.execute(f"SELECT COUNT(*) FROM {marker}")
            assert cur.fetchone()[0] == 1  # the hook ran
        for transaction in transactions:
            cur.execute("BEGIN")
            for statement in transaction:
                cur.execute(statement)
            cur.execute("COMMIT")


def _killed_between_two_tables_and_resumed(
    spark: Any, config: PipelineConfig, config_file: Path, db: str, first: str, second: str
) -> None:
    """The job killed with SIGKILL after the first table's commit of a batch (before the second's), then resumed:
    each table holds that batch once."""
    crashed = run_job(config_file, "--until-caught-up", crash_at="stream.after_table_commit:1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    before = _assert_each_batch_once(config, db, [first, second])
    assert len(before[first]) == 1 and before[second] == [], before  # killed between the two tables
    run(config, spark=spark, until_caught_up=True)
    after = _assert_each_batch_once(config, db, [first, second])
    assert after[first] == before[first], f"{first} committed its batch again after the restart"
    assert after[second] == before[first], f"{second} should hold the same batch once"


# --- 1. a table without a primary key ------------------------------------------------------------------

NOPK_DB = "edge_nopk"


class MoveUniqueKeysDuringChunkTwo:
    """A chunk hook (run on an executor): once, after chunk 2's low watermark of `acct` (chunks 0 and 1 are
    read, 2 and later not yet), unique keys move between a read chunk and an unread one, and each moved row
    changes again: the binlog phase must place each image by its own chunk, keyed on the unique key."""

    def __init__(self, socket: str, db: str) -> None:
        self.socket, self.db = socket, db

    def __call__(self, at: str, chunk: Any) -> None:
        if at != "after_low_watermark" or chunk.table_id != f"{self.db}.acct" or chunk.index != 2:
            return
        into_unread = chunk.lower[0] + 1  # a free key (keys are multiples of 10) inside chunk 2
        from_unread = (chunk.upper[0] + 9) // 10 * 10  # chunk 3's first key
        statements = [
            ("UPDATE acct SET u = %s WHERE u = 10", (into_unread,)),  # chunk 0 -> chunk 2
            ("UPDATE acct SET owner = 'changed after the move' WHERE u = %s", (into_unread,)),
            ("UPDATE acct SET u = 11 WHERE u = %s", (from_unread,)),  # chunk 3 -> chunk 0
            ("INSERT INTO acct VALUES (%s, 're-inserted', 0)", (from_unread,)),
        ]
        run_once(self.socket, self.db, "moved", statements)


NOPK_DML = [
    # One transaction each, in the binlog phase: value updates, unique-key updates, a key swap, deletes, inserts.
    ["UPDATE acct SET balance = balance + 1 WHERE u % 70 = 0"],
    ["UPDATE acct SET u = u + 5 WHERE u BETWEEN 200 AND 240"],  # five rows' unique keys in one event
    [
        "UPDATE acct SET u = -1 WHERE u = 300",
        "UPDATE acct SET u = 300 WHERE u = 310",
        "UPDATE acct SET u = 310 WHERE u = -1",
    ],
    ["DELETE FROM acct WHERE u BETWEEN 400 AND 430"],
    ["INSERT INTO acct VALUES (1000, 'new', 1), (1001, 'new', 2)"],
    ["DELETE FROM acct WHERE u = 500", "INSERT INTO acct VALUES (500, 'reborn', 5)"],  # delete, then the key again
    ["UPDATE tag SET name = CONCAT(name, 'x') WHERE grp = 'a' AND n < 10"],  # a composite key's second column
    ["UPDATE tag SET grp = 'B' WHERE grp = 'b' AND name = 'n4'"],  # a case-only key change under _ci
    ["DELETE FROM tag WHERE grp = 'c' AND n > 20", "INSERT INTO tag VALUES ('c', 'n29', 290)"],
    # One transaction over both tables, multi-row events on each: the kill falls between its two tables' commits.
    [
        "UPDATE acct SET u = u + 2000, owner = 'moved late' WHERE u IN (50, 60)",
        "UPDATE tag SET n = n + 100, name = UPPER(name) WHERE grp = 'a' AND n BETWEEN 12 AND 18",
    ],
]


def test_a_table_without_primary_key_goes_through_snapshot_and_binlog_killed_and_resumed(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """FAILURES.md "Tables without a primary key": two tables with only a unique NOT NULL key (an integer; a
    composite of two `_ci` strings) named as their chunk key. Keys move during the snapshot and in the binlog
    (unique-key updates, a swap, delete and re-insert), and the job is killed with SIGKILL between the two
    tables' commits of one batch. The resumed job commits the rest once: MySQL's rows, each once in Iceberg."""
    db = NOPK_DB
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.acct (u INT NOT NULL, owner VARCHAR(30), balance INT, UNIQUE KEY uk (u))",
        f"CREATE TABLE {db}.tag (grp CHAR(2) COLLATE utf8mb4_general_ci NOT NULL, "
        "name VARCHAR(10) COLLATE utf8mb4_general_ci NOT NULL, n INT, UNIQUE KEY gn (grp, name))",
        f"INSERT INTO {db}.acct SELECT seq * 10, CONCAT('o', seq), seq FROM {db}.seq_1_to_60",
        f"INSERT INTO {db}.tag SELECT ELT(1 + seq % 3, 'a', 'b', 'c'), CONCAT('n', seq), seq FROM {db}.seq_1_to_30",
        f"CREATE TABLE {db}.moved (x INT PRIMARY KEY)",  # the hook's marker: a table with a key, captured too
    )
    config, config_file = _write_pipeline(
        mariadb,
        db,
        tmp_path,
        snapshot={"chunk_size": 10, "parallelism": 1},
        # One batch for everything; tables commit one after the other, in name order (acct, moved, tag).
        stream={"batch_interval_seconds": 60, "concurrent_merges": 1},
        table_options={f"{db}.acct": {"chunk_key": ["u"]}, f"{db}.tag": {"chunk_key": ["grp", "name"]}},
    )
    run(config, spark=spark, snapshot_only=True, hook=MoveUniqueKeysDuringChunkTwo(mariadb.socket, db))
    _transactions(mariadb, db, "moved", NOPK_DML)
    _killed_between_two_tables_and_resumed(spark, config, config_file, db, "acct", "tag")
    assert verify(config)
    _assert_same_rows(mariadb, config, db, "acct", ["u"])
    _assert_same_rows(mariadb, config, db, "tag", ["grp", "name"])
    with mariadb.admin(db) as conn, conn.cursor() as cur:  # the test's DML did what it says
        cur.execute("SELECT COUNT(*) FROM acct WHERE u IN (205, 2050, 2060, 11) OR owner = 'changed after the move'")
        assert cur.fetchone()[0] == 5


# --- 2. a table without any key: a multiset --------------------------------------------------------------

ALIKE_DB = "edge_alike"


class ChangeAlikeRowsInTheReadWindow:
    """A chunk hook: once, after the read view of `events` began (its one chunk), alike rows change, so the read
    must bring them from the read view's start to the high watermark through the binlog window."""

    def __init__(self, socket: str, db: str) -> None:
        self.socket, self.db = socket, db

    def __call__(self, at: str, chunk: Any) -> None:
        if at != "after_low_watermark" or chunk.table_id != f"{self.db}.events":
            return
        statements = [
            ("DELETE FROM events WHERE kind = 'click' LIMIT 1", None),
            ("INSERT INTO events VALUES ('2026-01-01 10:00:00', 'view', NULL, NULL)", None),
            ("UPDATE events SET amount = 9.99 WHERE kind IS NULL LIMIT 1", None),
        ]
        run_once(self.socket, self.db, "marker", statements)


ALIKE_DML = [
    # One transaction each, in the binlog phase.
    ["DELETE FROM events WHERE kind = 'click' LIMIT 1"],  # one of several alike rows
    ["UPDATE events SET kind = 'buy' WHERE kind = 'view' LIMIT 2"],  # two of them become another held value
    ["INSERT INTO events VALUES (NULL, NULL, NULL, NULL), ('2026-01-01 10:00:00', 'view', NULL, NULL)"],
    ["DELETE FROM events WHERE kind = 'view'", "INSERT INTO events VALUES ('2026-01-01 10:00:00', 'view', NULL, NULL)"],
    ["INSERT INTO links VALUES (1, 2), (1, 2)", "DELETE FROM links WHERE x = 1 AND n = 2 LIMIT 1"],  # nets one
    ["UPDATE links SET n = 7 WHERE x = 2 LIMIT 1", "UPDATE links SET n = 3 WHERE n = 7"],  # out and back
    # One transaction over both tables: the kill falls between their commits (events, then links).
    ["DELETE FROM events WHERE payload = x'00ff' LIMIT 1", "UPDATE links SET x = x + 10 WHERE x = 3 LIMIT 1"],
]
ALIKE_DML_LATER = [
    # After the restart: rows the binlog phase numbered are deleted and added again.
    ["DELETE FROM events WHERE kind = 'buy' LIMIT 1", "INSERT INTO events SELECT * FROM events WHERE kind = 'buy'"],
    ["DELETE FROM links WHERE x = 1 AND n = 2 LIMIT 1", "INSERT INTO links VALUES (1, 2), (1, 2), (1, 2)"],
    ["DELETE FROM events WHERE kind IS NULL AND amount IS NULL LIMIT 1"],
]


def _assert_same_multiset(mariadb: MariaDBServer, config: PipelineConfig, db: str, table: str) -> None:
    """Iceberg holds MySQL's rows as many times as MySQL does, each alike row numbered 1..n."""
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {db}.{table}")
        names = [d[0] for d in cur.description]
        want = Counter(tuple(row) for row in cur.fetchall())
    rows = load_pyiceberg_catalog(config.sink).load_table((db, table)).scan().to_arrow().to_pylist()
    got = Counter(tuple(row[n] for n in names) for row in rows)
    assert got == want, f"{table}: Iceberg less MySQL {got - want}, MySQL less Iceberg {want - got}"
    numbers: dict[tuple[Any, ...], list[int]] = {}
    for row in rows:
        numbers.setdefault(tuple(row[n] for n in names), []).append(row["_ingest_occurrence"])
    assert all(sorted(held) == list(range(1, len(held) + 1)) for held in numbers.values()), numbers


def test_a_table_without_any_key_is_kept_equal_to_mysql_as_a_multiset_across_a_kill(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """A log table and a link table with no key at all, with alike rows (NULLs too): the snapshot reads each in
    one chunk with changes inside its read window; the binlog deletes one of several alike rows, updates some,
    nets changes out inside a transaction, and the job is killed with SIGKILL between the two tables' commits of
    one batch. The resumed job commits the rest once, and later batches keep the copy equal as a multiset. A
    dropped column, which would make rows that differed only in it alike, stops the job by name."""
    db = ALIKE_DB
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.events (at DATETIME, kind VARCHAR(10), amount DECIMAL(8,2), payload BLOB, KEY (kind))",
        f"CREATE TABLE {db}.links (x INT NOT NULL, n INT NOT NULL, KEY (x))",  # `n`: a name the MERGE must not take
        f"INSERT INTO {db}.events VALUES "
        + ", ".join(["('2026-01-01 10:00:00', 'click', 1.50, NULL)"] * 4)
        + ", ('2026-01-01 10:00:00', 'view', NULL, NULL), (NULL, NULL, NULL, NULL), (NULL, NULL, NULL, NULL), "
        "(NULL, 'x', 0.00, x'00ff'), (NULL, 'x', 0.00, x'00ff'), (NULL, 'x', 0.00, x'00')",
        f"INSERT INTO {db}.links SELECT seq % 4, seq % 3 FROM {db}.seq_1_to_24",
        f"CREATE TABLE {db}.marker (x INT PRIMARY KEY)",  # the hook's marker: a table with a key, captured too
    )
    config, config_file = _write_pipeline(
        mariadb,
        db,
        tmp_path,
        snapshot={"chunk_size": 2, "parallelism": 1},
        # One batch for everything; tables commit one after the other, in name order (events, links, marker).
        stream={"batch_interval_seconds": 60, "concurrent_merges": 1},
    )
    run(config, spark=spark, snapshot_only=True, hook=ChangeAlikeRowsInTheReadWindow(mariadb.socket, db))
    for table in ("events", "links"):
        _assert_same_multiset(mariadb, config, db, table)
    _transactions(mariadb, db, "marker", ALIKE_DML)
    _killed_between_two_tables_and_resumed(spark, config, config_file, db, "events", "links")
    for table in ("events", "links"):
        _assert_same_multiset(mariadb, config, db, table)
    assert verify(config)

    _transactions(mariadb, db, None, ALIKE_DML_LATER)
    run(config, spark=spark, until_caught_up=True)
    for table in ("events", "links"):
        _assert_same_multiset(mariadb, config, db, table)
    assert verify(config)

    mariadb.execute(f"ALTER TABLE {db}.links DROP COLUMN n")
    with pytest.raises(SchemaChangeError, match=r"column 'n' of a table without a key is gone"):
        run(config, spark=spark, until_caught_up=True)


# --- the memory a small job takes, to bound the large ones by ------------------------------------------

MEMORY_FIGURES: dict[str, tuple[PeakMemory, float]] = {}
"""Every measured run of this module by name, printed at its end (pytest -s) for the record."""


@pytest.fixture(scope="module")
def baseline(spark: Any, mariadb: MariaDBServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeakMemory]:
    """The peak memory of the job streaming a handful of changes into two small tables (a MERGE into each):
    the job's own footprint, which the large runs below are compared with."""
    db = "edge_base"
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.big (id INT NOT NULL PRIMARY KEY, v INT)",
        f"CREATE TABLE {db}.side (id INT NOT NULL PRIMARY KEY, n INT)",
        f"INSERT INTO {db}.big SELECT seq, seq FROM {db}.seq_1_to_1000",
        f"INSERT INTO {db}.side SELECT seq, seq FROM {db}.seq_1_to_10",
    )
    config, config_file = _write_pipeline(
        mariadb,
        db,
        tmp_path_factory.mktemp(db),
        snapshot={"chunk_size": 500},
        stream={"batch_interval_seconds": 60, "batch_max_changes": BIG_TRANSACTION_BATCH, "concurrent_merges": 1},
    )
    run(config, spark=spark, snapshot_only=True)
    mariadb.execute(
        f"UPDATE {db}.big SET v = -v WHERE id <= 20",
        f"DELETE FROM {db}.big WHERE id > 990",
        f"INSERT INTO {db}.big VALUES (5000, 1)",
        f"UPDATE {db}.side SET n = n + 1",
    )
    small = run_job(config_file, "--until-caught-up")
    assert small.returncode == 0, small.stderr[-3000:]
    assert verify(config)
    MEMORY_FIGURES["small job: 41 changes"] = small.memory, small.seconds
    yield small.memory
    for name, (memory, seconds) in MEMORY_FIGURES.items():
        print(f"\npeak memory, {name} ({seconds:.0f} s): {memory}")


def _assert_memory_bounded(run_: JobRun, baseline: PeakMemory, extra_mib: float, what: str) -> None:
    """The job's Python processes may each grow by `extra_mib` over the small job's: the binlog source's (a Python
    worker of the query: it reads the binlog, holds a batch and folds it to one row per key) and the driver's
    (it gets the batch's Arrow tables to commit). The JVM fills its heap as it likes whatever the batch (the job
    gives it 2 GiB): it is only held below that much over the small job's, which a leak outside the heap would
    cross."""
    memory = run_.memory
    sampled = memory.driver > 0 and memory.jvm > 0 and memory.workers > 0
    assert sampled, f"{what}: the job's processes were not sampled: {memory}"
    assert memory.driver <= baseline.driver + extra_mib, f"{what}: {memory}; small job: {baseline}"
    assert memory.workers <= baseline.workers + extra_mib, f"{what}: {memory}; small job: {baseline}"
    assert memory.jvm <= baseline.jvm + 2048, f"{what}: {memory}; small job: {baseline}"


# --- 2. one transaction larger than a batch ------------------------------------------------------------

BIG_DB = "edge_bigtx"


def test_a_transaction_larger_than_a_batch_is_one_batch_killed_between_its_commits_and_resumed_once(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, baseline: PeakMemory
) -> None:
    """FAILURES.md "Restart in the middle of a large transaction": batches end at transaction boundaries
    (ingest/query/binlog_source.py takes whole transactions from the reader and hands a batch over once it holds
    `batch_max_changes`), so one transaction 12 times larger than `batch_max_changes` is one batch, held whole
    by the binlog source's process. It touches two tables; the job is killed with SIGKILL after the first table
    committed it and before the second did. The resumed job reads the transaction again, skips it on the table
    that holds it, commits it on the other, once: no target holds an offset inside the transaction, no offset
    twice, and Iceberg equals MySQL. The Python processes' peak memory grows with the transaction (docs/config.md
    says roughly 1 KB a change; about 0.5 KB was measured in the driver loop's day), bounded by 3 KB a change
    over the small job's."""
    db = BIG_DB
    inserts, updates = BIG_TRANSACTION_CHANGES * 6 // 10, BIG_TRANSACTION_CHANGES * 3 // 10
    deletes = BIG_TRANSACTION_CHANGES - inserts - updates
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.big (id INT NOT NULL PRIMARY KEY, v INT)",  # narrow: about 20 bytes a row image
        f"CREATE TABLE {db}.side (id INT NOT NULL PRIMARY KEY, n INT)",
        f"INSERT INTO {db}.big SELECT seq, seq FROM {db}.seq_1_to_1000",
        f"INSERT INTO {db}.side SELECT seq, seq FROM {db}.seq_1_to_10",
    )
    config, config_file = _write_pipeline(
        mariadb,
        db,
        tmp_path,
        snapshot={"chunk_size": 500},
        stream={"batch_interval_seconds": 60, "batch_max_changes": BIG_TRANSACTION_BATCH, "concurrent_merges": 1},
    )
    run(config, spark=spark, snapshot_only=True)
    with mariadb.admin(db) as conn, conn.cursor() as cur:
        tx_start = read_watermark(conn, "mariadb").position
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO big SELECT seq, seq FROM seq_1001_to_{1000 + inserts}")
        cur.execute(f"UPDATE big SET v = -v WHERE id <= {updates}")  # seeded rows and rows of this transaction
        cur.execute(f"DELETE FROM big WHERE id > {updates} AND id <= {updates + deletes}")
        cur.execute("UPDATE side SET n = n + 100")
        cur.execute("COMMIT")
        tx_end = read_watermark(conn, "mariadb").position
        cur.execute("UPDATE big SET v = 7 WHERE id = 1")  # later transactions: a batch of their own
        cur.execute("UPDATE side SET n = 0 WHERE id = 1")
        cur.execute("SELECT COUNT(*) FROM big")
        assert cur.fetchone()[0] == 1000 + inserts - deletes  # every statement changed the rows it says

    # Tables commit in name order: big commits the transaction, then the job dies before side's MERGE.
    crashed = run_job(config_file, "--until-caught-up", crash_at="stream.after_table_commit:1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert _stream_offsets(config, db, "big") == [tx_end], "big should hold the whole transaction as one batch"
    assert _stream_offsets(config, db, "side") == []

    run(config, spark=spark, until_caught_up=True)  # the resume, in this process: it reads the transaction again
    offsets = _assert_each_batch_once(config, db, ["big", "side"])
    for table, committed in offsets.items():
        assert committed[0] == tx_end and len(committed) == 2, f"{table}: {committed}"
        assert not [p for p in committed if tx_start < p < tx_end], f"{table}: a commit inside the transaction"
    assert verify(config)
    _assert_same_rows(mariadb, config, db, "big", ["id"])
    _assert_same_rows(mariadb, config, db, "side", ["id"])

    MEMORY_FIGURES[f"killed after a table's commit of a {BIG_TRANSACTION_CHANGES}-change transaction"] = (
        crashed.memory,
        crashed.seconds,
    )
    # 3 KB a change held (about six times what was measured), and room for the MERGE's Arrow data.
    _assert_memory_bounded(crashed, baseline, 3 * BIG_TRANSACTION_CHANGES / 1024 + 128, "killed run")


# --- 3. a hot key ----------------------------------------------------------------------------------------

HOT_DB = "edge_hot"


def test_a_hot_key_updated_in_every_transaction_ends_as_mysqls_last_image_in_bounded_memory(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, baseline: PeakMemory
) -> None:
    """FAILURES.md "A hot key updated a million times": HOT_KEY_UPDATES updates of one row, in transactions of
    HOT_KEY_TRANSACTION, go through the job in batches of HOT_KEY_BATCH changes. Iceberg ends with MySQL's last
    image, and the memory of the job's Python processes stays near the small job's: the reader runs at most one
    batch ahead and each batch collapses to one row, so the updates' count does not show in memory. Measured over
    the small job, in the driver loop's day (the binlog was read in the driver then; now in the source's Python
    worker): 26 MiB at 200,000 updates, 28 MiB at a million; the same 200,000 in one batch took 111 MiB. The bound
    allows 64 MiB, whatever HOT_KEY_UPDATES is."""
    db = HOT_DB
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.hot (id INT NOT NULL PRIMARY KEY, v INT, note VARCHAR(20))",
        f"INSERT INTO {db}.hot VALUES (1, 0, 'hot'), (2, 0, 'cold'), (3, 0, 'cold')",
    )
    config, config_file = _write_pipeline(
        mariadb,
        db,
        tmp_path,
        snapshot={"chunk_size": 100},
        stream={"batch_interval_seconds": 60, "batch_max_changes": HOT_KEY_BATCH},
    )
    run(config, spark=spark, snapshot_only=True)
    with mariadb.admin(db) as conn, conn.cursor() as cur:
        for first in range(1, HOT_KEY_UPDATES + 1, HOT_KEY_TRANSACTION):
            last = first + HOT_KEY_TRANSACTION - 1
            # One statement, one transaction: every row of the sequence updates row 1 (a row event each).
            cur.execute(
                f"INSERT INTO hot (id, v, note) SELECT 1, seq, CONCAT('n', seq) FROM seq_{first}_to_{last} "
                "ON DUPLICATE KEY UPDATE v = VALUES(v), note = VALUES(note)"
            )
            assert cur.rowcount == 2 * HOT_KEY_TRANSACTION  # MySQL counts an updated row twice
        cur.execute("UPDATE hot SET note = 'last' WHERE id = 3")

    job = run_job(config_file, "--until-caught-up")
    assert job.returncode == 0, job.stderr[-3000:]
    applied = [
        int(line.split("committed ")[1].split()[0]) for line in job.stderr.splitlines() if "binlog: committed" in line
    ]
    assert sum(applied) == HOT_KEY_UPDATES + 1, applied  # every update went through the pipeline
    assert len(applied) >= HOT_KEY_UPDATES // HOT_KEY_BATCH, applied  # in batches, not all at once
    rows = load_pyiceberg_catalog(config.sink).load_table((db, "hot")).scan().to_arrow().to_pylist()
    assert sorted(rows, key=lambda r: r["id"]) == mysql_rows(mariadb, f"{db}.hot", "id")
    assert rows and {r["id"]: r for r in rows}[1] == {"id": 1, "v": HOT_KEY_UPDATES, "note": f"n{HOT_KEY_UPDATES}"}
    assert verify(config)
    _assert_each_batch_once(config, db, ["hot"])

    MEMORY_FIGURES[f"hot key, {HOT_KEY_UPDATES} updates"] = job.memory, job.seconds
    _assert_memory_bounded(job, baseline, 64, "hot key")
