"""Unit tests of the pure parts of ingest/source/binlog/startup.py: which events a reader may start at, and which
binlog file holds the first transaction at or after a time."""

from __future__ import annotations

import pytest

from ingest.source.binlog.startup import group_start_event, start_file_for


@pytest.mark.parametrize(
    ("event_type", "info"),
    [
        ("Format_desc", "Server ver: 10.11.19-MariaDB-log, Binlog ver: 4"),
        ("Gtid_list", "[0-1-5]"),
        ("Binlog_checkpoint", "mysql-bin.000001"),
        ("Gtid", "BEGIN GTID 0-1-6"),
        ("Gtid", "GTID 0-1-7"),
        ("Query", "BEGIN"),
        ("Query", "ALTER TABLE t ADD COLUMN c INT"),
        ("Anonymous_Gtid", "SET @@SESSION.GTID_NEXT= 'ANONYMOUS'"),
        ("Previous_gtids", ""),
        ("Rotate", "mysql-bin.000002;pos=4"),
    ],
)
def test_a_group_or_file_may_begin_at_these_events(event_type: str, info: str) -> None:
    assert group_start_event(event_type, info)


@pytest.mark.parametrize(
    ("event_type", "info"),
    [
        ("Table_map", "table_id: 18 (d.t)"),
        ("Write_rows_v1", "table_id: 18 flags: STMT_END_F"),
        ("Update_rows", "table_id: 18 flags: STMT_END_F"),
        ("Annotate_rows", "INSERT INTO d.t VALUES (2,2)"),
        ("Xid", "COMMIT /* xid=13 */"),
        ("Query", "COMMIT"),
        ("Query", " rollback "),
        ("Query", "XA END X'31',X'',1"),
        ("Intvar", "INSERT_ID=5"),
    ],
)
def test_a_reader_never_starts_inside_a_transaction(event_type: str, info: str) -> None:
    assert not group_start_event(event_type, info)


STARTS = [("mysql-bin.000001", 100), ("mysql-bin.000002", 200), ("mysql-bin.000003", 300)]


@pytest.mark.parametrize(
    ("at", "file"),
    [
        (101, "mysql-bin.000001"),
        (200, "mysql-bin.000001"),  # a transaction of second 200 may be in the file opened before that second
        (201, "mysql-bin.000002"),
        (300, "mysql-bin.000002"),
        (301, "mysql-bin.000003"),
        (10**10, "mysql-bin.000003"),
    ],
)
def test_the_newest_file_opened_before_the_time_is_read_from(at: int, file: str) -> None:
    assert start_file_for(STARTS, at) == file


def test_a_time_no_later_than_the_first_file_has_none() -> None:
    assert start_file_for(STARTS, 100) is None
    assert start_file_for(STARTS, 99) is None
    assert start_file_for([], 99) is None
