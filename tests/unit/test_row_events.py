"""Unit tests of decoding row images from binlog bytes: pure logic on hand-made bytes, no server.

tests/integration/test_row_events.py compares the decoder with python-mysql-replication on a real binlog;
these pin the encodings' corners with bytes worked out from MySQL's storage formats.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

from pymysqlreplication.column import Column
from pymysqlreplication.constants import BINLOG, FIELD_TYPE

from ingest.model.columns import SourceColumn
from ingest.source.binlog.row_events import RowEvents, TableDecoder, column_reader


def _column(kind: int, name: str = "c", **meta: Any) -> Column:
    return Column(type=kind, name=name, unsigned=meta.pop("unsigned", False), character_set_name=None, **meta)


def _read(column: Column, data: bytes) -> Any:
    read = column_reader(column)
    assert read is not None
    value, end = read(b"\xee" + data + b"\xee", 1)  # bytes around it must not be touched
    assert end == 1 + len(data)
    return value


def test_decimal_groups_and_sign_follow_mysqls_packed_form() -> None:
    # MySQL's own example: DECIMAL(14,4) 1234567890.1234, and its negative (every byte inverted).
    column = _column(FIELD_TYPE.NEWDECIMAL, precision=14, decimals=4)
    assert _read(column, bytes.fromhex("810dfb38d204d2")) == Decimal("1234567890.1234")
    negative = _read(column, bytes.fromhex("7ef204c72dfb2d"))
    assert negative == Decimal("-1234567890.1234") and str(negative) == "-1234567890.1234"


def test_decimals_without_an_integral_or_a_fractional_part_keep_their_exponent() -> None:
    only_fraction = _column(FIELD_TYPE.NEWDECIMAL, precision=5, decimals=5)
    assert str(_read(only_fraction, bytes.fromhex("80303a"))) == "0.12346"  # 12346 in 3 bytes
    assert str(_read(only_fraction, bytes.fromhex("7fffff"))) == "-0.00000"  # a negative zero, as MySQL's bytes say
    whole = _column(FIELD_TYPE.NEWDECIMAL, precision=3, decimals=0)
    assert str(_read(whole, bytes.fromhex("807b"))) == "123"


def test_time2_is_signed_and_fractions_scale_by_precision() -> None:
    assert _read(_column(FIELD_TYPE.TIME2, fsp=0), bytes.fromhex("80c000")) == dt.timedelta(hours=12)
    assert _read(_column(FIELD_TYPE.TIME2, fsp=0), bytes.fromhex("7fffff")) == dt.timedelta(seconds=-1)
    # 12:00:00.25 at TIME(2): one fraction byte of hundredths.
    assert _read(_column(FIELD_TYPE.TIME2, fsp=2), bytes.fromhex("80c00019")) == dt.timedelta(
        hours=12, microseconds=250000
    )


def test_datetime2_decodes_and_a_zero_date_is_its_text() -> None:
    packed = (1 << 39) | ((2024 * 13 + 3) << 22) | (10 << 17) | (2 << 12) | (30 << 6)
    column = _column(FIELD_TYPE.DATETIME2, fsp=1)
    assert _read(column, packed.to_bytes(5, "big") + bytes([50])) == dt.datetime(2024, 3, 10, 2, 30, 0, 500000)
    # The library gives None; the text converts to NULL the same way, and on_unrepresentable can report it.
    assert _read(column, (1 << 39).to_bytes(5, "big") + b"\x00") == "0000-00-00 00:00:00.0"


def test_bit_and_text_follow_the_librarys_forms() -> None:
    assert _read(_column(FIELD_TYPE.BIT, bits=12, bytes=2), bytes.fromhex("0805")) == "100000000101"
    assert _read(_column(FIELD_TYPE.VARCHAR, max_length=300), b"\x03\x00h\xc3\xa9") == "hé"
    binary = Column(type=FIELD_TYPE.BLOB, name="b", unsigned=False, character_set_name="binary", length_size=2)
    assert _read(binary, b"\x02\x00\x00\xff") == b"\x00\xff"
    assert _read(binary, b"\x00\x00") == ""  # the library's quirk for an empty value with no codec, kept


def test_a_table_decoder_puts_values_in_the_schemas_order_with_nulls_and_joined_sets() -> None:
    table = [
        _column(FIELD_TYPE.VARCHAR, "note", max_length=20),
        _column(FIELD_TYPE.SET, "tags", size=1, set_values=["a", "b", "c"]),
        _column(FIELD_TYPE.LONG, "id"),
    ]
    schema = [
        SourceColumn("id", "int", "int(11)", False),
        SourceColumn("note", "varchar", "varchar(20)", True),
        SourceColumn("tags", "set", "set('a','b','c')", True),
    ]
    decoder = TableDecoder.build(table, schema, "strict")
    assert decoder is not None
    # Row 1: note NULL (bit 0), tags {a, c}, id 7. Row 2: nothing NULL, an empty set.
    rows = (
        bytes([0b001, 0b101])
        + (7).to_bytes(4, "little")
        + bytes([0b000, 1])
        + b"x"
        + b"\x00"
        + (8).to_bytes(4, "little")
    )
    first, at = decoder.image(rows, 0)
    second, end = decoder.image(rows, at)
    assert first == (7, None, "a,c")
    assert second == (8, "x", "")
    assert end == len(rows)


def test_a_table_map_that_is_not_the_schema_or_has_a_type_read_only_by_the_library_is_declined() -> None:
    schema = [SourceColumn("id", "int", "int(11)", False)]
    assert TableDecoder.build([_column(FIELD_TYPE.LONG, "other")], schema, "strict") is None
    assert TableDecoder.build([_column(FIELD_TYPE.LONG, "")], schema, "strict") is None  # no names logged
    assert TableDecoder.build([_column(FIELD_TYPE.DATETIME, "id")], schema, "strict") is None  # the old DATETIME
    assert TableDecoder.build([_column(FIELD_TYPE.LONG, "id")], schema, "strict") is not None


def _write_event(body: bytes, size: int, table: list[Column]) -> Any:
    """A write-rows event as the library leaves it before reading rows: its bytes at the packet's position."""
    wrapper = SimpleNamespace(packet=SimpleNamespace(_data=b"head" + body, _position=4), read_bytes=0)
    return SimpleNamespace(
        packet=wrapper,
        event_size=size,
        table_map={7: SimpleNamespace(columns=table)},
        table_id=7,
        event_type=BINLOG.WRITE_ROWS_EVENT_V2,
        number_of_columns=len(table),
        columns_present_bitmap=bytes([(1 << len(table)) - 1]),
    )


def test_an_event_whose_bytes_do_not_decode_is_left_to_the_library() -> None:
    table = [_column(FIELD_TYPE.LONG, "id"), _column(FIELD_TYPE.VARCHAR, "note", max_length=20)]
    schema = [SourceColumn("id", "int", "int(11)", False), SourceColumn("note", "varchar", "varchar(20)", True)]
    rows = b"\x00" + (1).to_bytes(4, "little") + b"\x02ab" + b"\x02" + (2).to_bytes(4, "little")
    events = RowEvents()
    assert events.rows(("d", "t"), "insert", _write_event(rows, len(rows), table), schema) == [
        (None, (1, "ab")),
        (None, (2, None)),
    ]
    # The last row's NULL bitmap says `note` is there, but the event ends: no guess, the library decides.
    cut = rows[:-5] + b"\x00" + (2).to_bytes(4, "little")
    assert events.rows(("d", "t"), "insert", _write_event(cut, len(cut), table), schema) is None
    # One byte too many after the last row: the layout is not what was read.
    extra = rows + b"\x00"
    assert events.rows(("d", "t"), "insert", _write_event(extra, len(extra), table), schema) is None
    assert events.fallbacks == 2
