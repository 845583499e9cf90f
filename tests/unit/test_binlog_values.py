"""Unit tests of turning binlog row values into the driver's row tuples: pure logic, no server."""

from __future__ import annotations

import pytest

from ingest.errors import SourceError
from ingest.model.columns import SourceColumn
from ingest.source.binlog_values import RowDecoder, row_images

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
