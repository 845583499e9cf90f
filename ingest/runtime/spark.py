"""Building (or joining) the Spark session with the Iceberg runtime and the sink catalog."""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from typing import Any

from ingest.config import SinkConfig, SparkConfig
from ingest.runtime.class_archive import driver_options
from ingest.runtime.jars import UnsupportedSpark, check_spark, installed_spark, maven_packages, spark_minor
from ingest.runtime.session_conf import BASE_CONF, JIT, jar_conf
from ingest.sink.catalog import spark_catalog_conf

log = logging.getLogger(__name__)


def launch_conf(log_level: str = "ERROR") -> dict[str, str]:
    """JVM options for when the job launches the JVM itself (no spark-submit); spark.conf in the pipeline file
    overrides them.

    HotSpot compiles with C1 only: the job's JVM runs many short, different query plans; C2 kept recompiling
    them on one of the two cores and cost more than it gave back (bench/README.md, "JIT"). The driver also
    maps the class archive setup trained, when there is one (`ingest.runtime.class_archive`), and logs Spark's
    own messages at `log_level` (`spark.log_level`), from the JVM's first line on.
    """
    return {
        "spark.driver.extraJavaOptions": " ".join([JIT, *driver_options(), *log_options(log_level)]),
        "spark.executor.extraJavaOptions": JIT,
    }


def log_options(level: str) -> list[str]:
    """The driver JVM's log4j2 settings: the job's own file (`log4j2.properties` beside this module), at `level`."""
    from importlib import resources

    config = resources.files("ingest.runtime").joinpath("log4j2.properties")
    # A failed query is reported by the job in one line (ingest.cli); Spark's own report of it, a Python and a Java
    # trace with the query's plan, shows at a level below ERROR only.
    streaming = "OFF" if level == "ERROR" else level
    return [
        f"-Dlog4j2.configurationFile=file:{config}",
        f"-Dingest.spark.log.level={level}",
        f"-Dingest.spark.streaming.log.level={streaming}",
    ]


_RUNTIME_JAR = re.compile(r"iceberg-spark-runtime-(\d+\.\d+)_")


def check_submitted_runtime(spark_version: str, jars: str) -> None:
    """Refuse an Iceberg runtime built for another Spark than the one running (spark-submit's jars).

    A runtime built for another Spark minor fails on the first SQL statement with a JVM linkage error
    (NoSuchMethodError from the Iceberg SQL extensions); this says which jar to submit instead.
    """
    minor = spark_minor(spark_version)
    for built_for in sorted(set(_RUNTIME_JAR.findall(jars))):
        if built_for != minor:
            raise UnsupportedSpark(
                f"the Iceberg runtime submitted is built for Spark {built_for}, but this is Spark {spark_version}: "
                f"submit --packages {maven_packages(spark_version)} (python -m ingest.runtime.jars --spark {minor})"
            )


def spark_session(
    settings: SparkConfig,
    sink: SinkConfig,
    app_name: str,
    extra: dict[str, str] | None = None,
    launched: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> Any:
    """The session for a pipeline: its `spark` settings, and its sink's catalog attached. Under spark-submit, jars
    and master come from spark-submit; else `launched` is told of the JVM process the job starts."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    spark_version = installed_spark()
    check_spark(spark_version)
    under_submit = "SPARK_SUBMIT" in os.environ or os.environ.get("PYSPARK_GATEWAY_PORT") is not None
    submitted = SparkConf() if under_submit else None  # what spark-submit was given
    if submitted is not None:
        check_submitted_runtime(
            spark_version, f"{submitted.get('spark.jars.packages', '')},{submitted.get('spark.jars', '')}"
        )
    builder = SparkSession.builder.appName(app_name)
    conf: dict[str, str] = dict(BASE_CONF)
    if not under_submit:
        # Python workers must run the interpreter that has this package and its dependencies.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.master(settings.master)
        conf.update(jar_conf(spark_version))
        conf.update(launch_conf(settings.log_level))
        conf.setdefault("spark.driver.memory", "2g")
    plain, secret = spark_catalog_conf(sink)
    conf.update(plain)
    conf.update(settings.conf)
    conf.update(extra or {})
    # Key names only: the SQL events and the environment Spark logs redact whatever this matches.
    given = conf.get(REDACTION_REGEX) or (submitted.get(REDACTION_REGEX) if submitted is not None else None)
    conf[REDACTION_REGEX] = redaction_regex(given, secret)
    for key, value in conf.items():
        builder = builder.config(key, value)
    with nullcontext() if under_submit else launching_jvm(launched):
        session = builder.getOrCreate()
    return attach_catalog(session, sink)


class EarlySession:
    """The job's own Spark session, started on a thread of its own as soon as the pipeline file is read: the JVM
    starts (a process of its own, about 3 s on 2 cores) while the job imports its modules, looks at the source and
    opens the catalog, instead of after. `session()` waits for it and raises what its start raised. A job that
    fails before it needs Spark exits without waiting: the thread is a daemon, and the JVM ends with the job
    (`launching_jvm`)."""

    def __init__(self, settings: SparkConfig, sink: SinkConfig, app_name: str, warm_up: bool) -> None:
        self.warm_up = warm_up
        """The session's warm-up read (`ingest.runtime.warm_up`) is started as soon as the session is up."""
        self._session: Any = None
        self._error: BaseException | None = None
        self._jvm: list[subprocess.Popen[bytes]] = []
        self._taken = False
        self._thread = threading.Thread(
            target=self._start, args=(settings, sink, app_name), name="ingest-spark-start", daemon=True
        )
        self._thread.start()
        atexit.register(self._end_untaken)

    def _start(self, settings: SparkConfig, sink: SinkConfig, app_name: str) -> None:
        from ingest.runtime.warm_up import start_warm_up

        try:
            self._session = spark_session(settings, sink, app_name, launched=self._jvm.append)
        except BaseException as e:  # noqa: BLE001 - raised where the session is asked for
            self._error = e
            return
        if self.warm_up:
            start_warm_up(self._session)

    def session(self) -> Any:
        self._taken = True
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._session

    def _end_untaken(self) -> None:
        """A job that ends before it asked for the session (a refusal, an unreachable source or catalog) ends the
        JVM still starting too, which would otherwise run on until its gateway is up to see the job gone."""
        if not self._taken:
            for jvm in self._jvm:
                with suppress(OSError):
                    jvm.kill()


@contextmanager
def launching_jvm(launched: Callable[[subprocess.Popen[bytes]], None] | None = None) -> Iterator[None]:
    """Inside, a JVM the job launches (Spark's driver, through pyspark's gateway) starts with SIGTERM ignored, and
    its stderr reaches the job's through a thread that leaves out the JVM's notice of an incubator module.

    SIGTERM: sent to the job's whole process group (`kill -TERM -PGID`, systemd stopping its unit) it then reaches
    only the job, which stops after its current commit with exit 0, instead of killing the JVM under it. The JVM
    still ends with the job: pyspark's gateway exits when its parent's pipe closes. pyspark ignores SIGINT (Ctrl-C)
    in it the same way; the disposition is set in the child, between fork and exec, so the job's own handler never
    misses a signal.

    stderr: Spark 4.1's launcher adds `--add-modules=jdk.incubator.vector` to every JVM it starts, and the JVM
    prints `WARNING: Using incubator modules: ...` before any logging is set up, on every run, the demo's first
    line on a terminal. Everything else the JVM writes there (Spark's errors, its Python workers' output) passes
    line by line, as it comes. `launched` is told of the JVM's process."""
    import pyspark.java_gateway

    gateway: Any = pyspark.java_gateway
    launch = gateway.Popen

    def popen(*args: Any, **kwargs: Any) -> Any:
        then = kwargs.get("preexec_fn")

        def preexec() -> None:
            if then is not None:
                then()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # kept through exec: HotSpot leaves it ignored

        if "stderr" in kwargs:  # a caller that reads it itself
            return launch(*args, **{**kwargs, "preexec_fn": preexec})
        child = launch(*args, **{**kwargs, "preexec_fn": preexec, "stderr": subprocess.PIPE})
        stream, child.stderr = child.stderr, None  # the forwarding thread's alone
        # A daemon: the JVM's stderr closes only after the job's process has exited (and its stdin pipe with it).
        child.forwarding = threading.Thread(target=_forward, args=(stream,), name="ingest-jvm-stderr", daemon=True)
        child.forwarding.start()
        if launched is not None:
            launched(child)
        return child

    gateway.Popen = popen
    try:
        yield
    finally:
        gateway.Popen = launch


INCUBATOR_NOTICE = b"WARNING: Using incubator modules:"


def _forward(stream: Any) -> None:
    """The JVM's stderr to the job's, but for its incubator notice (see `launching_jvm`), until the JVM exits. The
    pipe is drained to the end even when the job's stderr fails: a full pipe would block the JVM's logging."""
    out = 2
    with stream:
        for read in stream:
            line = read.encode() if isinstance(read, str) else read  # a stream opened as text
            if line.startswith(INCUBATOR_NOTICE):
                continue
            left = memoryview(line)
            try:
                while left:
                    left = left[os.write(out, left) :]
            except OSError:
                pass  # the job's stderr is gone (its reader exited): the JVM's lines have nowhere to go


def attach_catalog(session: Any, sink: SinkConfig) -> Any:
    """Register the sink catalog on a running session; Iceberg reads these settings on first use."""
    plain, secret = spark_catalog_conf(sink)
    for key, value in {**plain, **secret}.items():
        session.conf.set(key, value)
    _redact_from_event_logs(session, secret)
    return session


def callback_connection(session: Any) -> Any | None:
    """The py4j connection on which the current thread answers a call from the JVM (a `foreachBatch` call), or
    None outside one. py4j gives each JVM thread that calls Python its own connection and closes it with neither
    the thread nor the query: a process that runs queries in turn holds one socket and one thread per query
    unless it closes them (`close_callback_connection`)."""
    client = getattr(session.sparkContext._gateway, "_gateway_client", None)
    thread_connection = getattr(client, "get_thread_connection", None)
    return thread_connection() if thread_connection is not None else None


def close_callback_connection(connection: Any | None) -> None:
    """Close a connection `callback_connection` returned, once the JVM thread it served has ended (a stopped
    query's). Its socket is shut down: the Python thread reading it sees the end and closes the connection itself
    (closing its stream from here would wait on that read forever), and the JVM's side closes on the same end.
    Never from within the call it serves."""
    sock = getattr(connection, "socket", None)
    if sock is not None:
        with suppress(OSError):  # closed already
            sock.shutdown(socket.SHUT_RDWR)


REDACTION_REGEX = "spark.redaction.regex"
SPARK_REDACTION_DEFAULT = "(?i)secret|password|token|access[.]?key"


def redaction_regex(given: str | None, secret: dict[str, str]) -> str:
    """Spark's redaction pattern (the one given, else Spark's default) that also matches every secret setting's
    exact name: a catalog secret under a name the default misses (`credential`, a custom key) is redacted too."""
    pattern = given or SPARK_REDACTION_DEFAULT
    names = [rf"\Q{key}\E" for key in sorted(secret) if rf"\Q{key}\E" not in pattern]
    return "|".join([pattern, *names])


def _redact_from_event_logs(session: Any, secret: dict[str, str]) -> None:
    """Keep the session's secret settings out of Spark's event logs.

    Spark hands every session setting to each job as a job property, and its event log writes the
    properties of each job and stage; it redacts only the keys its SparkConf holds (Spark 4.1, found by
    tests/integration/test_secrets.py). So the secret settings also go into the running context's SparkConf,
    in memory, with a redaction pattern that names them. Nothing reaches a command line: the JVM is running.
    """
    if not secret:
        return
    jconf = session.sparkContext._jsc.sc().conf()
    for key, value in secret.items():
        jconf.set(key, value)
    given = jconf.get(REDACTION_REGEX) if jconf.contains(REDACTION_REGEX) else None
    jconf.set(REDACTION_REGEX, redaction_regex(given, secret))
