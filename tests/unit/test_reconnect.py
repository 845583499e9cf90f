"""The reconnect policy of the binlog reader (ingest/source/reconnect.py): which errors are a lost connection, the
backoff, and the one line it gives up with."""

from __future__ import annotations

from pathlib import Path

import pymysql
import pytest

from ingest.backoff import MAX_WAIT_SECONDS
from ingest.errors import SourceConnectError, SourceUnreachableError, TransientError
from ingest.source.reconnect import (
    Reconnect,
    lost_connection,
    publish,
    read_published,
    stall_timeout,
)


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (pymysql.err.OperationalError(2003, "Can't connect to MySQL server on '127.0.0.1'"), True),
        (pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query (timed out)"), True),
        (pymysql.err.OperationalError(2006, "MySQL server has gone away"), True),
        (pymysql.err.OperationalError(1927, "Connection was killed"), True),
        (pymysql.err.OperationalError(1053, "Server shutdown in progress"), True),
        (pymysql.err.InterfaceError(0, ""), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (TimeoutError(), True),
        (pymysql.err.OperationalError(1236, "Could not find first log file name in binary log index file"), False),
        (pymysql.err.OperationalError(1045, "Access denied for user 'cdc'"), False),
        (pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax"), False),
        (ValueError("a bug"), False),
        # mysqlclient's errors (the snapshot's fast driver) by their class name and code
        (type("OperationalError", (Exception,), {})(2013, "Lost connection to server during query"), True),
        (type("OperationalError", (Exception,), {})(1146, "Table 'db.t' doesn't exist"), False),
        # a session the job could not open: a server away is retried, a refused password is not
        (SourceConnectError("cannot connect to MySQL at db:3306 as cdc: Connection refused", lost=True), True),
        (SourceConnectError("cannot connect to MySQL at db:3306 as cdc: Access denied", lost=False), False),
    ],
)
def test_only_a_lost_connection_is_retried(error: BaseException, lost: bool) -> None:
    assert lost_connection(error) is lost


def test_the_wait_doubles_up_to_its_cap_and_a_recovery_starts_a_new_streak() -> None:
    now = [0.0]
    reconnect = Reconnect(300, "db:3306", clock=lambda: now[0])
    error = pymysql.err.OperationalError(2003, "Can't connect")
    waits = []
    for _ in range(8):
        waits.append(reconnect.next_wait(error, "mysql-bin.000001:4"))
        now[0] += waits[-1]
    assert 0.4 <= waits[0] <= 0.6 and all(w <= MAX_WAIT_SECONDS * 1.2 for w in waits)
    assert waits[4] > 2 * waits[1]
    assert reconnect.attempts == 8 and reconnect.since == 0.0 and "2003" in reconnect.last_error
    reconnect.recovered()
    assert reconnect.since is None and reconnect.attempts == 0
    assert reconnect.next_wait(error, "x") <= 0.6


def test_past_its_budget_it_gives_up_with_one_line_naming_the_server_the_time_and_the_position() -> None:
    now = [100.0]
    reconnect = Reconnect(30, "db.example:3306", clock=lambda: now[0])
    error = pymysql.err.OperationalError(2003, "Can't connect to MySQL server on 'db.example' ([Errno 111])")
    wait = reconnect.next_wait(error, "mysql-bin.000007:1234")
    while True:
        now[0] += wait
        try:
            wait = reconnect.next_wait(error, "mysql-bin.000007:1234")
        except SourceUnreachableError as e:
            given_up: TransientError = e
            break
        assert now[0] - 100.0 + wait <= 30  # never waits past the budget
    message = str(given_up)
    assert "\n" not in message
    assert "db.example:3306" in message and "for 30 s" in message and "mysql-bin.000007:1234" in message
    assert "OperationalError: (2003" in message and "source.reconnect_seconds" in message


def test_a_stall_is_three_missed_heartbeats_at_least_five_seconds() -> None:
    assert stall_timeout(1.0) == 5.0
    assert stall_timeout(10.0) == 30.0


def test_a_chunk_reader_gives_up_naming_what_it_lost_and_what_stays() -> None:
    now = [0.0]
    reconnect = Reconnect(5, "db:3306", "the connection of shop.t chunk 7", clock=lambda: now[0])
    error = pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
    with pytest.raises(SourceUnreachableError) as gave_up:
        while True:
            now[0] += reconnect.next_wait(error, "The chunks of shop.t committed before stay")
    assert str(gave_up.value).startswith("lost the connection of shop.t chunk 7 to the source at db:3306")
    assert str(gave_up.value).endswith("The chunks of shop.t committed before stay")


def test_a_streak_said_after_the_runs_scratch_directory_is_gone_is_not_an_error(tmp_path: Path) -> None:
    reconnect = Reconnect(300, "db:3306")
    reconnect.next_wait(pymysql.err.OperationalError(2003, "Can't connect"), "")
    publish(tmp_path / "gone" / "reconnecting.json", reconnect)  # the job is ending: only the metrics miss it
    reconnect.recovered()
    publish(tmp_path / "gone" / "reconnecting.json", reconnect)
    assert read_published(tmp_path / "gone" / "reconnecting.json") is None
