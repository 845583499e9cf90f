"""Unit tests of pure logic: bytes behind across binlog files (ingest/source/watermark.py), lag in seconds
(ingest/commands/status.py)."""

from __future__ import annotations

from ingest.commands.status import lag_seconds
from ingest.model.position import BinlogPosition
from ingest.source.watermark import bytes_behind


def pos(text: str) -> BinlogPosition:
    return BinlogPosition.parse(text)


SIZES = {"b.000009": 1000, "b.000010": 500, "b.000011": 700, "b.000012": 300}


def test_bytes_behind_in_one_file_and_across_files() -> None:
    assert bytes_behind(pos("b.000010:100"), pos("b.000010:450"), SIZES) == 350
    assert bytes_behind(pos("b.000010:450"), pos("b.000010:450"), SIZES) == 0
    # rest of .10, all of .11, start of .12
    assert bytes_behind(pos("b.000010:100"), pos("b.000012:250"), SIZES) == 400 + 700 + 250


def test_bytes_behind_across_a_digit_count_change() -> None:
    sizes = {"b.999999": 100, "b.1000000": 50}
    assert bytes_behind(pos("b.999999:40"), pos("b.1000000:10"), sizes) == 60 + 10


def test_bytes_behind_is_unknown_when_it_cannot_be_counted() -> None:
    assert bytes_behind(pos("b.000009:100"), pos("b.000012:1"), {"b.000009": 1000, "b.000012": 300}) is None
    assert bytes_behind(pos("a.000001:4"), pos("b.000001:4"), SIZES) is None  # after a failover


def test_lag_seconds() -> None:
    assert lag_seconds(True, None, 1000.0) == 0.0
    assert lag_seconds(False, 990, 1000.0) == 10.0
    assert lag_seconds(False, 1010, 1000.0) == 0.0  # clocks of source and job differ a little
    assert lag_seconds(False, None, 1000.0) is None
    assert lag_seconds(None, 990, 1000.0) is None
