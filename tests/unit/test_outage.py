"""Waiting out a sink outage (ingest/sink/outage.py): which errors say the sink could not be reached, the backoff,
a stop during the wait, and the one line the job gives up with."""

from __future__ import annotations

import pytest

from ingest.errors import CommitConflictError, SchemaChangeError, SinkUnreachableError, TransientError
from ingest.sink.outage import OutageWaitStopped, SinkOutage, sink_unreachable

JAVA_S3 = (
    "An error occurred while calling o98.sql.\n: org.apache.iceberg.exceptions.RuntimeIOException: ...\n"
    "Caused by: software.amazon.awssdk.core.exception.SdkClientException: Unable to execute HTTP request: "
    "Connect to 127.0.0.1:9000 failed: Connection refused"
)


class Py4JJavaError(Exception):
    """As py4j names it: told apart by its text only."""


@pytest.mark.parametrize(
    ("error", "unreachable"),
    [
        (
            OSError(
                "When reading information for key 'k' in bucket 'b': AWS Error NETWORK_CONNECTION during HeadObject"
            ),
            True,
        ),
        (OSError("AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate."), True),
        (OSError("AWS Error SERVICE_UNAVAILABLE during PutObject operation"), True),
        (OSError("AWS Error UNKNOWN (HTTP status 503) during HeadObject operation: No response body."), True),
        (OSError("AWS Error UNKNOWN (HTTP status 403) during HeadObject operation: No response body."), False),
        (
            Exception(
                '(psycopg2.OperationalError) connection to server at "127.0.0.1", port 5 failed: Connection refused'
            ),
            True,
        ),
        (Exception("(psycopg2.OperationalError) server closed the connection unexpectedly"), True),
        (Exception("FATAL: terminating connection due to administrator command"), True),
        (Py4JJavaError(JAVA_S3), True),
        (Py4JJavaError("org.postgresql.util.PSQLException: This connection has been closed."), True),
        (Py4JJavaError("org.apache.iceberg.exceptions.CommitStateUnknownException: Timeout"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (Exception("HTTPConnectionPool(host='127.0.0.1', port=8181): Max retries exceeded with url: /v1/config"), True),
        (OSError("AWS Error ACCESS_DENIED during PutObject operation"), False),
        (Py4JJavaError("org.apache.spark.sql.AnalysisException: [TABLE_OR_VIEW_NOT_FOUND]"), False),
        (Exception('(psycopg2.OperationalError) FATAL: password authentication failed for user "iceberg"'), False),
        (SchemaChangeError("db.t: Connection refused in a column comment"), False),
        (CommitConflictError("lake.db.t: MERGE kept conflicting"), False),
        (ValueError("a bug"), False),
    ],
)
def test_only_an_unreachable_sink_is_waited_for(error: BaseException, unreachable: bool) -> None:
    assert sink_unreachable(error) is unreachable


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_commit_is_run_again_told_it_is_again_until_the_sink_is_back() -> None:
    clock = _Clock()
    outage = SinkOutage(300, clock=clock, sleep=clock.sleep)
    calls: list[bool] = []

    def commit(again: bool) -> str:
        calls.append(again)
        if len(calls) < 4:
            raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation")
        return "done"

    assert outage.run("committing", commit) == "done"
    assert calls == [False, True, True, True]  # a retry looks at the tables first (commit_prepared's `settle`)
    assert 0.4 * (1 + 2 + 4) <= clock.now <= 0.6 * (1 + 2 + 4)  # doubling from 0.5 s


def test_an_error_that_is_not_an_outage_is_raised_at_once() -> None:
    outage = SinkOutage(300)
    with pytest.raises(ValueError, match="a bug"):
        outage.run("committing", lambda again: (_ for _ in ()).throw(ValueError("a bug")))


def test_past_its_budget_it_gives_up_with_one_transient_line() -> None:
    clock = _Clock()
    outage = SinkOutage(30, clock=clock, sleep=clock.sleep)

    def commit(again: bool) -> None:
        raise Py4JJavaError(JAVA_S3)

    with pytest.raises(SinkUnreachableError) as gave_up:
        outage.run("committing the batch up to b.000001:4", commit)
    error: TransientError = gave_up.value
    message = str(error)
    assert "\n" not in message and 30 <= clock.now <= 30.5
    assert message.startswith("could not reach the sink while committing the batch up to b.000001:4 for 30 s")
    assert "sink.reconnect_seconds` is 30" in message and "Unable to execute HTTP request" in message


def test_a_stop_ends_the_wait_at_once() -> None:
    clock = _Clock()
    outage = SinkOutage(300, stopping=lambda: clock.now >= 1.0, clock=clock, sleep=clock.sleep)

    def commit(again: bool) -> None:
        raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation")

    with pytest.raises(OutageWaitStopped):
        outage.run("committing", commit)
    assert clock.now < 1.5
