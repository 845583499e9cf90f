"""on_unrepresentable: which values are rejected, and what becomes of the change (ingest/changes/rejects.py)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from ingest.changes.rejects import (
    REASON_NOT_A_DATE,
    REASON_ZERO_DATE,
    REASON_ZERO_PART,
    REASON_ZERO_YEAR,
    find_unrepresentable,
    key_json,
    reason_of,
    split_rejected,
)
from ingest.errors import ConfigError, SourceError
from ingest.model.changes import RowChange
from ingest.model.columns import InvalidTemporal, SourceColumn, map_column, rows_to_record_batch
from ingest.model.position import BinlogPosition
from ingest.source.binlog import row_events

COLUMNS = [
    SourceColumn("id", "int", "int", False),
    SourceColumn("d", "date", "date", True),
    SourceColumn("note", "varchar", "varchar(10)", True),
    SourceColumn("ts", "timestamp", "timestamp", True),
]
KEY = [0]
AT = BinlogPosition("mysql-bin.000003", 1234)


def change(before: tuple[object, ...] | None, after: tuple[object, ...] | None, row: int = 0) -> RowChange:
    return RowChange("shop.t", AT, row, before, after)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("0000-00-00", REASON_ZERO_DATE),
        ("0000-00-00 00:00:00.000000", REASON_ZERO_DATE),
        ("2020-00-15", REASON_ZERO_PART),
        ("2020-05-00 10:00:00", REASON_ZERO_PART),
        ("0000-01-01", REASON_ZERO_YEAR),
        ("2020-02-31", REASON_NOT_A_DATE),
        ("garbage", REASON_NOT_A_DATE),
    ],
)
def test_reason_of(raw: str, reason: str) -> None:
    assert reason_of(raw) == reason


def test_find_unrepresentable_only_judges_date_like_columns() -> None:
    image = (1, InvalidTemporal("0000-00-00"), "0000-00-00", InvalidTemporal("0000-00-00 00:00:00"))
    found = find_unrepresentable(COLUMNS, image)
    assert [(f.column, f.raw, f.reason) for f in found] == [
        ("d", "0000-00-00", REASON_ZERO_DATE),
        ("ts", "0000-00-00 00:00:00", REASON_ZERO_DATE),
    ]
    # The snapshot drivers' text (str from PyMySQL, bytes from mysqlclient) counts the same.
    assert [f.raw for f in find_unrepresentable(COLUMNS, (1, b"2020-02-31", None, None))] == ["2020-02-31"]
    assert find_unrepresentable(COLUMNS, (1, dt.date(2020, 2, 29), "x", None)) == []


def test_invalid_temporal_still_converts_to_null() -> None:
    """`null` (the default) keeps today's values: the marker is driver text, which the converters null."""
    targets = [map_column("shop.t", c) for c in COLUMNS]
    batch = rows_to_record_batch(targets, [(1, InvalidTemporal("2020-02-31"), "a", InvalidTemporal("0000-00-00"))])
    assert batch.to_pylist() == [{"id": 1, "d": None, "note": "a", "ts": None}]


def test_null_policy_keeps_every_change() -> None:
    changes = [change(None, (1, InvalidTemporal("0000-00-00"), "a", None))]
    assert split_rejected(changes, COLUMNS, KEY, "null") == (changes, [])


def test_dead_letter_drops_an_insert_and_records_each_value() -> None:
    bad = change(None, (7, InvalidTemporal("0000-00-00"), "a", InvalidTemporal("0000-00-00 00:00:00")), row=2)
    good = change(None, (8, dt.date(2020, 1, 1), "b", None), row=3)
    kept, rejected = split_rejected([bad, good], COLUMNS, KEY, "dead_letter", lambda c: ("0-1-5", 1700000000))
    assert kept == [good]
    assert [(r.key_json, r.column, r.raw, r.reason) for r in rejected] == [
        ('{"id": 7}', "d", "0000-00-00", REASON_ZERO_DATE),
        ('{"id": 7}', "ts", "0000-00-00 00:00:00", REASON_ZERO_DATE),
    ]
    first = rejected[0]
    assert (first.position, first.gtid, first.commit_time) == ("mysql-bin.000003:1234", "0-1-5", 1700000000)
    assert first.seq == "0000000003-000000001234-0000000002-1"
    assert len({(r.seq, r.column) for r in rejected}) == 2  # the MERGE's identity is unique per value


def test_dead_letter_update_of_the_same_key_leaves_the_old_image() -> None:
    update = change((7, dt.date(2020, 1, 1), "a", None), (7, InvalidTemporal("2020-02-31"), "b", None))
    kept, rejected = split_rejected([update], COLUMNS, KEY, "dead_letter")
    assert kept == []
    assert [(r.column, r.raw, r.reason) for r in rejected] == [("d", "2020-02-31", REASON_NOT_A_DATE)]


def test_dead_letter_update_that_moves_the_key_still_deletes_the_old_key() -> None:
    update = change((7, dt.date(2020, 1, 1), "a", None), (9, InvalidTemporal("0000-00-00"), "a", None))
    kept, rejected = split_rejected([update], COLUMNS, KEY, "dead_letter")
    assert kept == [update._replace(after=None)]
    assert rejected[0].key_json == '{"id": 9}'


def test_dead_letter_judges_only_after_images() -> None:
    """A before image only names the key to remove: deleting a row that held a zero date is applied."""
    delete = change((7, InvalidTemporal("0000-00-00"), "a", None), None)
    fix = change((7, InvalidTemporal("0000-00-00"), "a", None), (7, dt.date(2020, 1, 1), "a", None))
    assert split_rejected([delete, fix], COLUMNS, KEY, "dead_letter") == ([delete, fix], [])


def test_stop_names_table_column_value_and_position() -> None:
    bad = change(None, (7, InvalidTemporal("0000-00-00"), "a", None))
    with pytest.raises(SourceError, match=r"shop\.t: column 'd'.*'0000-00-00' \(zero date\).*mysql-bin\.000003:1234"):
        split_rejected([bad], COLUMNS, KEY, "stop")


def test_key_json_forms() -> None:
    text = key_json(["a", "b", "c", "d"], (Decimal("1.50"), b"\x00\xff", dt.date(2020, 1, 2), "é"))
    assert json.loads(text) == {"a": "1.50", "b": "AP8=", "c": "2020-01-02", "d": "é"}


def test_binlog_decoder_keeps_the_raw_text_of_invalid_dates() -> None:
    def date_bytes(y: int, m: int, d: int) -> bytes:
        return ((y << 9) | (m << 5) | d).to_bytes(3, "little")

    assert row_events._date(date_bytes(0, 0, 0), 0) == ("0000-00-00", 3)
    assert row_events._date(date_bytes(2020, 2, 31), 0) == ("2020-02-31", 3)
    assert isinstance(row_events._date(date_bytes(2020, 0, 5), 0)[0], InvalidTemporal)
    assert row_events._date(date_bytes(2020, 2, 29), 0) == (dt.date(2020, 2, 29), 3)

    def datetime2(y: int, mo: int, d: int, h: int, mi: int, s: int) -> bytes:
        packed = (1 << 39) | ((y * 13 + mo) << 22) | (d << 17) | (h << 12) | (mi << 6) | s
        return packed.to_bytes(5, "big")

    assert row_events._datetime2(0)(datetime2(0, 0, 0, 0, 0, 0), 0) == ("0000-00-00 00:00:00", 5)
    value, end = row_events._datetime2(6)(datetime2(2021, 4, 31, 1, 2, 3) + (500).to_bytes(3, "big"), 0)
    assert (value, end) == ("2021-04-31 01:02:03.000500", 8)
    assert isinstance(value, InvalidTemporal)
    assert row_events._timestamp2(3)(bytes(6), 0) == ("0000-00-00 00:00:00.000", 6)
    assert row_events._timestamp2(0)((1).to_bytes(4, "big"), 0) == (dt.datetime(1970, 1, 1, 0, 0, 1), 4)


def test_config_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X", "secret")
    from ingest.config import parse_config

    base = {
        "source": {"host": "h", "user": "u", "password": {"env": "X"}},
        "tables": {"include": ["shop\\..*"]},
        "sink": {"catalog": {"type": "hadoop", "warehouse": "/tmp/w"}},
    }
    config = parse_config({**base, "table_options": {"shop.t": {"on_unrepresentable": "dead_letter"}}})
    assert config.options_for("shop", "t").on_unrepresentable == "dead_letter"
    assert config.options_for("shop", "u").on_unrepresentable == "null"
    with pytest.raises(ConfigError, match="on_unrepresentable"):
        parse_config({**base, "table_options": {"shop.t": {"on_unrepresentable": "drop"}}})


def test_a_value_a_chunk_read_is_named_by_its_chunk_and_key_whatever_its_watermark() -> None:
    """A chunk read again after a crash (at a later high watermark) gives the same `seq`, so the rejected table's
    MERGE on (`seq`, `column_name`) adds its values once."""
    from ingest.changes.rejects import Unrepresentable, chunk_rejected
    from ingest.model.position import Watermark

    found = [Unrepresentable("d", "0000-00-00", REASON_ZERO_DATE), Unrepresentable("ts", "2020-02-31", "x")]
    first = chunk_rejected(["id"], (7,), found, 3, Watermark(AT, None))
    again = chunk_rejected(["id"], (7,), found, 3, Watermark(BinlogPosition("mysql-bin.000004", 4), None))
    assert [(r.seq, r.column) for r in first] == [(r.seq, r.column) for r in again]
    assert first[0] == first[0].__class__(
        '{"id": 7}', "d", "0000-00-00", REASON_ZERO_DATE, str(AT), 'snapshot:3:{"id": 7}', None, None, "snapshot", 3
    )
    assert chunk_rejected(["id"], (8,), found, 3, Watermark(AT, None))[0].seq != first[0].seq


def test_the_window_of_a_chunk_decides_for_the_keys_it_changed() -> None:
    """A row the SELECT found rejected but the binlog window fixed is kept; one the window broke is rejected; a
    deleted one is neither (ingest/source/snapshot/chunk_reader.py)."""
    from ingest.changes.rejects import Unrepresentable
    from ingest.model.schema import TableSchema, target_columns
    from ingest.source.snapshot.chunk_reader import _iceberg_keys, _judge_window

    schema = TableSchema("shop", "t", tuple(COLUMNS), ("id",), ("id",), (None,))
    zero = Unrepresentable("d", "0000-00-00", REASON_ZERO_DATE)
    found = {(1,): [zero], (2,): [zero], (3,): [zero]}
    finals = {
        (1,): (1, dt.date(2020, 1, 1), "fixed", None),
        (2,): None,
        (4,): (4, InvalidTemporal("2020-02-31"), "broken", None),
    }
    _judge_window(found, schema, _iceberg_keys(target_columns(schema), schema.key_positions(), finals), finals)
    assert found == {(3,): [zero], (4,): [Unrepresentable("d", "2020-02-31", REASON_NOT_A_DATE)]}
