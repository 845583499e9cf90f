"""Unit tests of turning binlog row values into the driver's row tuples: pure logic, no server."""

from __future__ import annotations

import pytest

from ingest.errors import SourceError
from ingest.model.columns import SourceColumn
from ingest.source.binlog.binlog_values import RowDecoder, row_images

ID = SourceColumn("id", "int", "int(11)", False)
TAGS = SourceColumn("tags", "set", "set('a','b''s','c')", True)
NOTE = SourceColumn("note", "varchar", "varchar(20)", True)


def test_values_come_out_in_the_schemas_column_order_whatever_the_dict_order() -> None:
    decode = RowDecoder([ID, NOTE])
    assert decode({"note": "x", "id": 7}) == (7, "x")
    assert RowDecoder([ID])({"id": 3}) == (3,)  # one column is still a tuple


def test_a_set_is_joined_in_definition_order_and_other_columns_pass_unchanged() -> None:
    decode = RowDecoder([ID, TAGS, NOTE])
    assert decode({"id": 1, "tags": {"c", "b's"}, "note": None}) == (1, "b's,c", None)
    assert decode({"id": 1, "tags": "", "note": "n"}) == (1, "", "n")  # an empty set, already restored


def test_a_row_with_other_columns_does_not_match() -> None:
    decode = RowDecoder([ID, NOTE])
    assert decode.matches({"id": 1, "note": None})
    assert not decode.matches({"id": 1})
    assert not decode.matches({"id": 1, "note": None, "extra": 2})
    assert not decode.matches({"id": 1, "other": None})


def test_row_images_restore_empty_sets_and_refuse_absent_columns() -> None:
    row = {"values": {"id": 1, "tags": None}, "none_sources": {"tags": "empty set"}}
    assert row_images("insert", row) == (None, {"id": 1, "tags": ""})
    update = {"before_values": {"id": 1}, "after_values": {"id": 2}}
    assert row_images("update", update) == ({"id": 1}, {"id": 2})
    with pytest.raises(SourceError, match=r"lacks columns \['note'\].*binlog_row_image must be FULL"):
        row_images("delete", {"values": {"id": 1, "note": None}, "none_sources": {"note": "cols bitmap"}})


# MariaDB's own text of INET6 values (`SELECT LOWER(HEX(CAST(x AS INET6))), CAST(x AS INET6)` on 10.11): the first
# longest run of zero groups becomes `::`, even a run of one; IPv4-compatible and -mapped addresses end dotted.
INET6_TEXT = [
    ("00000000000000000000000000000000", "::"),
    ("00000000000000000000000000000001", "::1"),
    ("00000000000000000000ffff01020304", "::ffff:1.2.3.4"),
    ("00000000000000000000000001020304", "::1.2.3.4"),
    ("00010000000000000000000000000000", "1::"),
    ("00010000000000010000000000000001", "1:0:0:1::1"),
    ("00000000000100000000000000000000", "0:0:1::"),
    ("fe800000000000000001000000000001", "fe80::1:0:0:1"),
    ("00000000000000000000ffff00000000", "::ffff:0.0.0.0"),
    ("00000000000000000000000000010000", "::0.1.0.0"),
    ("20010db8000000000000ff0000428329", "2001:db8::ff00:42:8329"),
    ("00010002000300040005000600070008", "1:2:3:4:5:6:7:8"),
    ("00000001000000010000000100000001", "::1:0:1:0:1:0:1"),
    ("ffff0001000100010001000100010000", "ffff:1:1:1:1:1:1::"),
    ("00014032000100000001000000010000", "1:4032:1::1:0:1:0"),
    ("0000ffff00000001ace98e9c00000001", "::ffff:0:1:ace9:8e9c:0:1"),
    ("0000000000000000000000000000ffff", "::ffff"),
    ("00000000000000000000000100000000", "::1:0:0"),
]


@pytest.mark.parametrize(("hexed", "text"), INET6_TEXT, ids=[t for _, t in INET6_TEXT])
def test_an_inet6_value_reads_as_mariadb_prints_it(hexed: str, text: str) -> None:
    decode = RowDecoder([SourceColumn("a", "inet6", "inet6", True)])
    # The binlog drops a fixed-size binary value's trailing zero bytes; the server pads them back.
    assert decode({"a": bytes.fromhex(hexed).rstrip(b"\x00") or ""}) == (text,)


def test_uuid_and_inet4_values_read_as_mariadb_prints_them() -> None:
    columns = [SourceColumn("u", "uuid", "uuid", True), SourceColumn("i", "inet4", "inet4", True)]
    decode = RowDecoder(columns)
    raw = bytes.fromhex("6ccd780cbaba102695645b8c656024db")
    assert decode({"u": raw, "i": b"\xc0\xa8\x00\x01"}) == ("6ccd780c-baba-1026-9564-5b8c656024db", "192.168.0.1")
    assert decode({"u": bytes.fromhex("123e4567e89b42d3a4564266141740"), "i": ""}) == (
        "123e4567-e89b-42d3-a456-426614174000",
        "0.0.0.0",
    )
    assert decode({"u": None, "i": None}) == (None, None)
