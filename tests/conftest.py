"""Fixtures for real services. Integration tests fail (never skip) when a service cannot start."""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import PostgresServer
from ingest.devservers.rest_catalog import RestCatalogServer

CDC_USER = "cdc"
CDC_PASSWORD_ENV = "INGEST_TEST_MYSQL_PASSWORD"


def _scratch_for_spark(scratch: Path) -> None:
    """Spark scratch space (copied jars, shuffle files, native libraries) for every Spark launched from here on,
    in-process or as a job."""
    os.environ["SPARK_LOCAL_DIRS"] = str(scratch)
    # JVM options (not printed, unlike _JAVA_OPTIONS).
    os.environ["SPARK_SUBMIT_OPTS"] = f"-Djava.io.tmpdir={scratch}"


_session_scratch: Path | None = None


@pytest.fixture(scope="session", autouse=True)
def spark_scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The worker's own Spark keeps its scratch space here, under pytest's temp root, for the whole session."""
    global _session_scratch
    _session_scratch = tmp_path_factory.mktemp("spark-scratch")
    _scratch_for_spark(_session_scratch)
    return _session_scratch


@pytest.fixture(scope="module", autouse=True)
def module_scratch(spark_scratch: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The jobs a module starts keep their scratch space in a directory that goes with the module.

    A job killed with SIGKILL cannot remove its `spark-*` directory (about 120 MB of jars), and the kill tests do
    that dozens of times: kept for the session, they filled a CI machine's disk."""
    scratch = tmp_path_factory.mktemp("module-scratch")
    _scratch_for_spark(scratch)
    try:
        yield
    finally:
        _scratch_for_spark(spark_scratch)
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def cdc_password() -> str:
    password = "cdc-" + secrets.token_hex(8)
    os.environ[CDC_PASSWORD_ENV] = password
    return password


@pytest.fixture(scope="session")
def mariadb(cdc_password: str) -> Iterator[MariaDBServer]:
    with MariaDBServer(server_id=1) as server:
        server.create_cdc_user(CDC_USER, cdc_password)
        yield server


ROW_METADATA = ["FULL", "NO_LOG"]
"""binlog_row_metadata settings the binlog-phase tests run at: FULL (row events name their columns) and
MariaDB's default NO_LOG (MySQL's MINIMAL logs no names either): columns are then matched by position."""


@pytest.fixture(params=ROW_METADATA)
def row_metadata(request: pytest.FixtureRequest, mariadb: MariaDBServer) -> Iterator[str]:
    """The shared server writes its binlog at this binlog_row_metadata for the test (a global, dynamic
    setting: it applies to every event logged from now on), then goes back to FULL."""
    setting = str(request.param)
    mariadb.execute(f"SET GLOBAL binlog_row_metadata = '{setting}'")
    try:
        yield setting
    finally:
        mariadb.execute("SET GLOBAL binlog_row_metadata = 'FULL'")


_minio: MinioServer | None = None


@pytest.fixture(scope="session")
def minio() -> Iterator[MinioServer]:
    global _minio
    with MinioServer() as server:
        _minio = server
        yield server
        _minio = None


@pytest.fixture(scope="module", autouse=True)
def module_buckets() -> Iterator[None]:
    """The buckets a module makes go with it, and what its tables wrote to them: a worker's MinIO lives for the
    whole session, and the suite's data would otherwise fill a small disk."""
    before = list(_minio.buckets) if _minio is not None else []
    yield
    if _minio is not None:
        for name in [b for b in _minio.buckets if b not in before and b != REST_BUCKET]:
            _minio.drop_bucket(name)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


REST_BUCKET = "rest-warehouse"


@pytest.fixture(scope="session")
def rest_catalog(minio: MinioServer, postgres: PostgresServer) -> Iterator[RestCatalogServer]:
    """The REST catalog profile's server: Iceberg's REST catalog on PostgreSQL, metadata on MinIO."""
    with RestCatalogServer(minio, postgres, warehouse=f"s3://{minio.bucket(REST_BUCKET)}/warehouse") as server:
        yield server


def source_section(server: MariaDBServer) -> dict[str, Any]:
    return {
        "host": server.host,
        "port": server.port,
        "user": CDC_USER,
        "password": {"env": CDC_PASSWORD_ENV},
        "flavor": "mariadb",
        "server_id": 5401,
    }


def embedded_sink(base: Path) -> dict[str, Any]:
    """The embedded default: SQLite-backed JDBC catalog and a local warehouse directory."""
    return {
        "catalog_name": "lake",
        "catalog": {"type": "jdbc", "uri": f"jdbc:sqlite:{base}/catalog.db", "warehouse": f"file://{base}/warehouse"},
    }


def sqlite_catalog(base: Path) -> Any:
    """A pyiceberg SQL catalog on SQLite with a local warehouse under `base`, and its namespace `n`."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{base}/catalog.db", warehouse=f"file://{base}/warehouse")
    catalog.create_namespace("n")
    return catalog


def _minio_file_io(minio: MinioServer) -> dict[str, Any]:
    """Catalog properties for data files on MinIO through S3FileIO; the secret comes from the environment."""
    os.environ["INGEST_TEST_S3_SECRET"] = minio.secret_key
    return {
        "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "s3.endpoint": minio.endpoint,
        "s3.path-style-access": "true",
        "s3.region": minio.region,
        "client.region": minio.region,
        "s3.access-key-id": minio.access_key,
        "s3.secret-access-key": {"env": "INGEST_TEST_S3_SECRET"},
    }


def rest_sink(minio: MinioServer, rest: RestCatalogServer) -> dict[str, Any]:
    """The REST profile: an Iceberg REST catalog server; data files on MinIO through S3FileIO, with the
    client's own S3 settings (the server vends none)."""
    return {"catalog_name": "restlake", "catalog": {"type": "rest", "uri": rest.uri, **_minio_file_io(minio)}}


def minio_sink(minio: MinioServer, postgres: PostgresServer, bucket: str) -> dict[str, Any]:
    """The S3 profile: MinIO through S3FileIO, JDBC catalog on a real PostgreSQL server."""
    os.environ["INGEST_TEST_PG_PASSWORD"] = postgres.password
    # Its own catalog name: a Spark session caches catalogs by name, and tests share one session per module.
    return {
        "catalog_name": "s3lake",
        "catalog": {
            "type": "jdbc",
            "uri": postgres.jdbc_url,
            "jdbc.user": postgres.user,
            "jdbc.password": {"env": "INGEST_TEST_PG_PASSWORD"},
            "warehouse": f"s3://{bucket}/warehouse",
            **_minio_file_io(minio),
        },
    }


def main_history(iceberg_table: Any) -> list[Any]:
    """The snapshots of a table's main branch, oldest first: what the table holds, and how it got there. A batch's
    write to the stage branch (ingest/sink/atomic.py) that was never published is not among them."""
    from pyiceberg.table.snapshots import ancestors_of

    current = iceberg_table.current_snapshot()
    return [] if current is None else list(reversed(list(ancestors_of(current, iceberg_table.metadata))))


def mysql_rows(mariadb: MariaDBServer, table: str, key: str) -> list[dict[str, Any]]:
    """A source table's rows by column name, in key order: what a reader of its Iceberg table must see."""
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table} ORDER BY {key}")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _repo_on_worker_path() -> None:
    """Python workers import test hooks by module name: give them the repository root."""
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


def spark_for_module(master: str) -> Any:
    """One Spark session per test module (stopped by the caller); pipelines add their catalogs to it."""
    import sys

    from pyspark.sql import SparkSession

    from ingest.runtime.jars import installed_spark
    from ingest.runtime.session_conf import BASE_CONF, jar_conf
    from ingest.runtime.spark import launch_conf

    _repo_on_worker_path()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    builder = SparkSession.builder.master(master).appName("ingest-tests")
    for key, value in {
        **BASE_CONF,
        **launch_conf(),
        **jar_conf(installed_spark()),
        "spark.driver.memory": "1g",
    }.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


_worker_spark: Any = None
"""The test worker's `local[2]` Spark (its JVM, SparkContext and pyspark's accumulator connection), started once."""


def _running_worker_spark() -> Any:
    global _worker_spark
    if _worker_spark is None or _worker_spark.sparkContext._jsc is None:  # none yet, or a module stopped it
        module_scratch = os.environ["SPARK_LOCAL_DIRS"]
        assert _session_scratch is not None
        _scratch_for_spark(_session_scratch)  # it outlives the module
        try:
            _worker_spark = spark_for_module("local[2]")
        finally:
            _scratch_for_spark(Path(module_scratch))
    return _worker_spark


@pytest.fixture(scope="session")
def worker_spark() -> Iterator[None]:
    """Stops the worker's Spark after its last module."""
    yield
    if _worker_spark is not None and _worker_spark.sparkContext._jsc is not None:
        _worker_spark.stop()


@pytest.fixture(scope="module")
def spark(worker_spark: None) -> Iterator[Any]:
    """A session of its own for the tests of one module (its own SQL settings, catalogs and data sources) on the
    worker's one `local[2]` SparkContext: a module no longer pays a JVM's start and first queries. Modules may
    override it (test_local_cluster starts a Spark of another master, which stops the worker's; the next module
    starts it again)."""
    session = _running_worker_spark().newSession()
    yield session
    for query in session.streams.active:
        query.stop()
    # The job raises the collector's threshold (ingest/runtime/python_gc.py), so cyclic garbage of a module's runs
    # (catalog engines, connections) could hold descriptors open well into later modules of this process.
    gc.collect()


def run_ingest(
    *args: str, crash_at: str | None = None, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`ingest ARGS` as a separate job in a process group of its own (so a crash point kills only it)."""
    from ingest.faults import ENV as CRASH_ENV

    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV} | (env_extra or {})
    if crash_at:
        env[CRASH_ENV] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "ingest.cli", *args],
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
        check=False,
    )


def start_ingest(config_file: Path, log_file: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`ingest run` of `config_file` as a user starts it, in a process group of its own (to be killed with its JVM),
    its log in `log_file`; no crash point unless `env` names one."""
    from ingest.faults import ENV as CRASH_ENV

    env = env if env is not None else {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    with log_file.open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", "run", "--config", str(config_file)],
            cwd=Path(__file__).resolve().parent.parent,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def open_descriptors(spark: Any) -> dict[str, int]:
    """This process's open sockets, pipes and files by kind, and its threads, once the JVM has released every
    Python object it held and the count has stopped changing.

    A stopped query's foreachBatch function is released from the JVM's finalizer thread, which calls Python on a
    connection of its own, made the first time and kept as long as that thread lives: the count waits for the
    release, so that connection is in every count, whenever the JVM's collector gets to it. (`runFinalization`
    is not used: it runs finalizers on a new thread each time, and py4j would give each one a connection.)"""
    jvm = spark.sparkContext._jvm
    held = spark.sparkContext._gateway.gateway_property.pool
    last: dict[str, int] = {}
    steady = 0
    for _ in range(100):
        gc.collect()
        jvm.System.gc()
        time.sleep(0.1)
        now = {**_descriptors(), "held by the JVM": len(held)}
        if now == last and len(held) == 0:
            return now
        # An earlier module of this worker may have left an object the JVM keeps (a query that ended by an error,
        # which its session's query manager keeps): the count, not zero, is then what must not grow. Two seconds
        # without a change stand for the release that zero waits for otherwise.
        steady = steady + 1 if now == last else 0
        if steady >= 20:
            return now
        last = now
    raise AssertionError(f"the JVM's Python objects or the descriptors keep changing: {last}")


def _descriptors() -> dict[str, int]:
    kinds: Counter[str] = Counter()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the directory's own descriptor, closed by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            kinds[target.split(":")[0] if target.startswith(("socket:", "pipe:", "anon_inode:")) else "file"] += 1
    kinds["threads"] = threading.active_count()
    return dict(kinds)


_free_at_start: int | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _free_at_start
    _free_at_start = shutil.disk_usage(tempfile.gettempdir()).free


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The disk the suite's servers and temp files write to, at the start and at the end: a suite that fills a
    small disk fails in confusing ways (MinIO refuses writes when 1 % of its disk is left)."""
    usage = shutil.disk_usage(tempfile.gettempdir())
    gib = 1 << 30
    start = f"{_free_at_start / gib:.1f}" if _free_at_start is not None else "?"
    terminalreporter.write_line(
        f"disk of {tempfile.gettempdir()}: {start} GiB free at the start, {usage.free / gib:.1f} GiB at the end "
        f"(of {usage.total / gib:.1f} GiB)"
    )


def pytest_runtest_logstart(nodeid: str) -> None:
    """Under bench/suite_cpu.py: which test this process runs now, for the CPU of the processes below it."""
    where = os.environ.get("SUITE_CPU_DIR")
    if where:
        Path(where, str(os.getpid())).write_text(nodeid)


LONGEST_FIRST = (
    "test_streaming",
    "test_schema_evolution",
    "test_recopy",
    "test_chaos",
    "test_structured",
    "test_faults",
    "test_standalone_cluster",
    "test_cut_spark",
    "test_adhoc",
    "test_binlog_edges",
    "test_binlog_groups",
    "test_online_schema_change",
    "test_cut",
    "test_edge_tables",
    "test_failover",
    "test_trino",
    "test_snapshot",
    "test_cut_rest",
    "test_changelog",
    "test_dead_letter",
    "test_state_table",
    "test_secrets",
    "test_row_metadata",
    "test_startup_modes",
)
"""The integration modules that take longest, longest first (a module's worker time in `make test` on 2 cores,
2026-11-29: 1,068 s down to 99 s). make test hands the modules to its workers in collection order
(`--no-loadscope-reorder`): the longest start first, and the short ones fill the workers' ends. By default
pytest-xdist orders modules by their number of tests, which put the one-test modules (test_chaos,
test_standalone_cluster, the cut tests: 1,900 s between them) last, on workers that the others had left. Measured
over a whole run it saved about a minute of 58: the suite is bound by its CPU, not by its last modules."""


def _longest_first(items: list[pytest.Item]) -> None:
    """Order `items` by module, the modules of `LONGEST_FIRST` first in its order, the others after them as
    collected (tests/integration before tests/unit); a module's own tests keep their order."""
    rank = {f"tests/integration/{name}.py": i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest as collected


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first (`_longest_first`). A `spark_compat` test run at both row-metadata settings runs
    at NO_LOG (the harder case: columns matched by position) in the main suite, on Spark 4.1, and at FULL in the
    compatibility subset (`-m spark_compat`, on Spark 4.0: scripts/test-spark-compat.sh): the setting changes only
    the Python side, so each Spark runs it once."""
    _longest_first(items)
    if "spark_compat" in (config.getoption("markexpr") or ""):
        return
    kept, other_spark = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        full = callspec is not None and callspec.params.get("row_metadata") == "FULL"
        (other_spark if full and item.get_closest_marker("spark_compat") else kept).append(item)
    if other_spark:
        config.hook.pytest_deselected(items=other_spark)
        items[:] = kept
