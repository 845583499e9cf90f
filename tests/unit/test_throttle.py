"""`snapshot.max_source_load`: when the snapshot pauses for a busy source and when it reads on, the waits between
samples, the stop signal during a pause, the metrics and the config section (ingest/source/snapshot/throttle.py)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from time import monotonic
from typing import Any

import pymysql
import pytest

from ingest.config import SourceLoadLimit, parse_config
from ingest.errors import ConfigError, MissingPrivilegeError
from ingest.metrics import JobMetrics, recording
from ingest.query.stop import StopSignal
from ingest.source.snapshot.throttle import (
    SourceLoad,
    SourceThrottle,
    backoff,
    check_load_probe,
    overload,
    read_source_load,
)
from tests.unit.test_metrics import samples

THREADS = SourceLoadLimit(threads_running=20, check_seconds=2, max_check_seconds=10)
BOTH = SourceLoadLimit(threads_running=20, replica_lag_seconds=30)


def test_overload_names_each_bound_exceeded_and_nothing_at_or_below_it() -> None:
    assert overload(SourceLoad(37), THREADS) == "Threads_running 37 > 20"
    assert overload(SourceLoad(20), THREADS) is None  # at the bound: reads on
    assert overload(SourceLoad(37, 45.0), BOTH) == "Threads_running 37 > 20, replica lag 45 s > 30 s"
    assert overload(SourceLoad(3, 45.0), BOTH) == "replica lag 45 s > 30 s"
    assert overload(SourceLoad(3, 30.0), BOTH) is None
    # Not a replica, or its replication stopped: the lag is unknown and holds nothing back.
    assert overload(SourceLoad(3, None), BOTH) is None
    lag_only = SourceLoadLimit(replica_lag_seconds=0)
    assert overload(SourceLoad(500, 0.0), lag_only) is None  # no thread bound: any number of threads
    assert overload(SourceLoad(500, 1.0), lag_only) == "replica lag 1 s > 0 s"


def test_backoff_doubles_from_check_seconds_up_to_the_ceiling() -> None:
    assert [backoff(THREADS, n) for n in range(6)] == [2, 4, 8, 10, 10, 10]
    assert backoff(THREADS, 10_000) == 10  # no overflow on a pause of days


class Source:
    """Samples played back in order (the last one repeats); counts how often it was asked."""

    def __init__(self, *loads: SourceLoad) -> None:
        self.loads, self.asked = list(loads), 0

    def __call__(self) -> SourceLoad:
        self.asked += 1
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]


class FakeTime:
    """A clock that moves only when the throttle waits (a stop event's wait)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now


class FakeStop(threading.Event):
    def __init__(self, time: FakeTime, stop_after_waits: int | None = None) -> None:
        super().__init__()
        self.time, self.stop_after = time, stop_after_waits

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.time.waits.append(timeout)
        self.time.now += timeout
        if self.stop_after is not None and len(self.time.waits) >= self.stop_after:
            self.set()
        return self.is_set()


@pytest.fixture
def job() -> Iterator[JobMetrics]:
    fake = FakeTime()
    with recording(JobMetrics("p", monotonic=fake)) as metrics:
        metrics.fake_time = fake  # type: ignore[attr-defined]
        yield metrics


def test_a_quiet_source_is_sampled_once_and_never_waited_for(job: JobMetrics) -> None:
    source, time = Source(SourceLoad(3)), FakeTime()
    throttle = SourceThrottle(THREADS, source, clock=time)
    assert throttle.wait(FakeStop(time))
    assert (source.asked, time.waits, throttle.seconds()) == (1, [], 0)
    assert samples(job.exposition())["ingest_snapshot_throttled_seconds_total"] == 0


def test_a_pause_waits_with_backoff_logs_once_and_counts_its_seconds(
    job: JobMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    time = FakeTime()
    source = Source(SourceLoad(37), SourceLoad(40), SourceLoad(25), SourceLoad(21), SourceLoad(3))
    throttle = SourceThrottle(THREADS, source, clock=time)
    caplog.set_level(logging.INFO, logger="ingest.source.snapshot.throttle")
    assert throttle.wait(FakeStop(time), "db.t: chunks 4/10")
    assert time.waits == [2, 4, 8, 10]
    assert throttle.seconds() == throttle.paused_seconds == 24
    assert [r.getMessage() for r in caplog.records] == [
        "snapshot paused: Threads_running 37 > 20 (db.t: chunks 4/10)",
        "snapshot resumed after 24.0 s paused (Threads_running 3 <= 20) (db.t: chunks 4/10)",
    ]
    # A second pause starts its waits at check_seconds again and adds to the seconds.
    source.loads = [SourceLoad(30), SourceLoad(2)]
    assert throttle.wait(FakeStop(time))
    assert time.waits[4:] == [2] and throttle.seconds() == 26


def test_the_metrics_show_a_pause_while_it_lasts(job: JobMetrics) -> None:
    fake: FakeTime = job.fake_time  # type: ignore[attr-defined]
    throttle = SourceThrottle(THREADS, Source(SourceLoad(37)), clock=fake)
    assert not throttle.ready()  # the non-blocking look of the binlog phase: paused, nothing waited
    fake.now += 7
    got = samples(job.exposition())
    assert (got["ingest_snapshot_paused"], got["ingest_snapshot_throttled_seconds_total"]) == (1, 7)
    assert throttle.seconds() == 7
    assert not throttle.ready()  # still busy: the same pause
    throttle.sample = Source(SourceLoad(1))
    fake.now += 3
    assert throttle.ready()
    got = samples(job.exposition())
    assert (got["ingest_snapshot_paused"], got["ingest_snapshot_throttled_seconds_total"]) == (0, 10)


def test_the_stop_signal_ends_a_pause_at_once(job: JobMetrics, caplog: pytest.LogCaptureFixture) -> None:
    time = FakeTime()
    source = Source(SourceLoad(99))
    throttle = SourceThrottle(THREADS, source, clock=time)
    caplog.set_level(logging.INFO, logger="ingest.source.snapshot.throttle")
    assert not throttle.wait(FakeStop(time, stop_after_waits=3))
    assert (source.asked, time.waits) == (3, [2, 4, 8])  # not sampled again after the signal
    assert samples(job.exposition())["ingest_snapshot_paused"] == 0
    assert "snapshot pause ended by the stop signal" in caplog.records[-1].getMessage()
    stopped = FakeStop(time)
    stopped.set()
    assert not throttle.wait(stopped)  # asked to stop before: not even sampled
    assert source.asked == 3


class Cursor:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers, self.description, self.row = answers, None, None

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def execute(self, statement: str) -> None:
        answer = self.answers[statement]
        if isinstance(answer, Exception):
            raise answer
        names, self.row = answer
        self.description = [(n,) for n in names]

    def fetchone(self) -> Any:
        return self.row


class Conn:
    def __init__(self, **replica: Any) -> None:
        self.answers: dict[str, Any] = {
            "SHOW GLOBAL STATUS LIKE 'Threads_running'": (("Variable_name", "Value"), ("Threads_running", "12")),
            **replica,
        }

    def cursor(self) -> Cursor:
        return Cursor(self.answers)


REPLICA_ROW = (("Slave_IO_State", "Seconds_Behind_Master"), ("Waiting", 42))
DENIED = pymysql.err.OperationalError(
    1227, "Access denied; you need (at least one of) the SUPER, SLAVE MONITOR privilege(s) for this operation"
)


def test_samples_read_threads_running_and_a_replicas_lag() -> None:
    assert read_source_load(Conn(), replica_lag=False) == SourceLoad(12, None)
    assert read_source_load(Conn(**{"SHOW REPLICA STATUS": REPLICA_ROW}), replica_lag=True) == SourceLoad(12, 42.0)
    # An older server without SHOW REPLICA STATUS, not a replica:
    old = Conn(
        **{
            "SHOW REPLICA STATUS": pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax"),
            "SHOW SLAVE STATUS": (("Slave_IO_State",), None),
        }
    )
    assert read_source_load(old, replica_lag=True) == SourceLoad(12, None)
    stopped = Conn(**{"SHOW REPLICA STATUS": (("Seconds_Behind_Source",), (None,))})  # MySQL, replication stopped
    assert read_source_load(stopped, replica_lag=True) == SourceLoad(12, None)


def test_a_lag_bound_the_cdc_user_cannot_read_is_refused_at_start(caplog: pytest.LogCaptureFixture) -> None:
    denied = Conn(**{"SHOW REPLICA STATUS": DENIED})
    check_load_probe(denied, THREADS, "mariadb")  # no lag bound: the status is not asked for
    with pytest.raises(MissingPrivilegeError) as refused:
        check_load_probe(denied, BOTH, "mariadb")
    message = str(refused.value)
    assert "`snapshot.max_source_load.replica_lag_seconds`" in message and "GRANT SLAVE MONITOR ON *.*" in message
    with pytest.raises(MissingPrivilegeError, match="GRANT REPLICATION CLIENT"):
        check_load_probe(denied, BOTH, "mysql")
    caplog.set_level(logging.WARNING, logger="ingest.source.snapshot.throttle")
    check_load_probe(Conn(**{"SHOW REPLICA STATUS": (("Slave_IO_State",), None)}), BOTH, "mariadb")
    assert "the source is not a replica" in caplog.text
    check_load_probe(Conn(**{"SHOW REPLICA STATUS": REPLICA_ROW}), BOTH, "mariadb")


CONFIG: dict[str, Any] = {
    "source": {"host": "db", "user": "cdc", "password": {"env": "INGEST_UNIT_THROTTLE_PW"}},
    "tables": {"include": [r"shop\..*"]},
    "sink": {"catalog": {"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db"}},
}


def _snapshot(monkeypatch: pytest.MonkeyPatch, max_source_load: Any) -> Any:
    monkeypatch.setenv("INGEST_UNIT_THROTTLE_PW", "pw")
    return parse_config({**CONFIG, "snapshot": {"max_source_load": max_source_load}}).snapshot


def test_the_config_section(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _snapshot(monkeypatch, None).max_source_load is None
    assert _snapshot(monkeypatch, {"threads_running": 20}).max_source_load == SourceLoadLimit(20, None, 2.0, 30.0)
    assert _snapshot(
        monkeypatch, {"threads_running": 20, "replica_lag_seconds": 30, "check_seconds": 0.5, "max_check_seconds": 4}
    ).max_source_load == SourceLoadLimit(20, 30.0, 0.5, 4.0)
    assert _snapshot(monkeypatch, {"check_seconds": 60, "replica_lag_seconds": 5}).max_source_load == SourceLoadLimit(
        None, 5.0, 60.0, 60.0
    )
    for bad, error in [
        ({}, "`snapshot.max_source_load.threads_running` or `snapshot.max_source_load.replica_lag_seconds` is req"),
        ({"threads_running": 0}, "`snapshot.max_source_load.threads_running` must be at least 1"),
        ({"replica_lag_seconds": -1}, "`snapshot.max_source_load.replica_lag_seconds` must be 0 or more"),
        ({"threads_running": 5, "check_seconds": 0}, "`snapshot.max_source_load.check_seconds` must be positive"),
        ({"threads_running": 5, "check_seconds": 5, "max_check_seconds": 1}, "must be at least `check_seconds`"),
        ({"threads_running": 5, "threads": 5}, "unknown key `snapshot.max_source_load.threads`"),
        (20, "`snapshot.max_source_load` must be a mapping"),
    ]:
        with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace("*", r"\*")):
            _snapshot(monkeypatch, bad)


def test_sigterm_ends_a_real_pause_within_moments(job: JobMetrics) -> None:
    """The job's own stop signal (SIGTERM sets its event) wakes a pause that would otherwise wait 30 s more."""
    stop = StopSignal()
    stop.install()
    try:
        throttle = SourceThrottle(SourceLoadLimit(threads_running=1, check_seconds=30), Source(SourceLoad(99)))
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        started = monotonic()
        assert not throttle.wait(stop.event)
        assert monotonic() - started < 5
    finally:
        stop.uninstall()
