"""Table maps without column names (binlog_row_metadata NO_LOG / MINIMAL) completed from the job's schema, by
position: pure logic on the library's own column objects, no server."""

from __future__ import annotations

from typing import Any

import pytest
from pymysqlreplication.column import Column
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.table import Table

from ingest.errors import SchemaChangeError
from ingest.model.columns import SourceColumn
from ingest.source.binlog.row_events import TableDecoder
from ingest.source.binlog.table_maps import by_position, names_logged


def _logged(*types: int, names: tuple[str | None, ...] | None = None) -> Table:
    """A table map as the library parses it from a server that logs no metadata (names None, all signed)."""
    columns = [
        Column(
            type=t,
            name=None if names is None else names[i],
            unsigned=False,
            character_set_name=None,
            enum_values=None,
            set_values=None,
            max_length=40,
            size=1,
            is_primary=False,
        )
        for i, t in enumerate(types)
    ]
    return Table(7, "db", "t", columns)


def _schema(*columns: tuple[str, str, str, str | None]) -> list[SourceColumn]:
    return [SourceColumn(n, d, c, True, character_set=cs) for n, d, c, cs in columns]


SCHEMA = _schema(
    ("k", "int", "int(11)", None),
    ("u", "bigint", "bigint(20) unsigned", None),
    ("e", "enum", "enum('x','it''s')", "utf8mb4"),
    ("s", "set", "set('p','q')", "utf8mb4"),
    ("l", "varchar", "varchar(10)", "latin1"),
    ("raw", "varbinary", "varbinary(10)", None),
)
TYPES = (FIELD_TYPE.LONG, FIELD_TYPE.LONGLONG, FIELD_TYPE.ENUM, FIELD_TYPE.SET, FIELD_TYPE.VARCHAR, FIELD_TYPE.VARCHAR)


def test_a_table_map_without_names_gets_the_schemas_names_signedness_charsets_and_members_by_position() -> None:
    table = _logged(*TYPES)
    assert not names_logged(table)

    assert by_position(table, ("db", "t"), SCHEMA, "mariadb", "binlog.000001:4")

    columns: list[Any] = table.columns
    assert [c.name for c in columns] == ["k", "u", "e", "s", "l", "raw"]
    assert [c.unsigned for c in columns] == [False, True, False, False, False, False]
    assert columns[2].enum_values == ["", "x", "it's"]  # index 0 is the empty (invalid) member, as with FULL
    assert columns[3].set_values == ["p", "q"]
    # The library's forms with FULL metadata: a charset's Python encoding, 'binary' for a binary string.
    assert (columns[4].character_set_name, columns[5].character_set_name) == ("cp1252", "binary")
    assert columns[0].character_set_name is None
    assert not names_logged(table)  # completed by the job, not named by the server
    assert TableDecoder.build(columns, SCHEMA, "strict") is not None


def test_a_table_map_the_server_named_is_left_alone() -> None:
    table = _logged(*TYPES, names=("k", "u", "e", "s", "l", "raw"))
    assert names_logged(table)
    assert not by_position(table, ("db", "t"), SCHEMA, "mariadb", "binlog.000001:4")
    assert [c.unsigned for c in table.columns] == [False] * 6


def test_a_shared_table_map_is_completed_again_for_another_schema_of_the_same_types() -> None:
    """Table maps of the same bytes share one parse; a RENAME COLUMN or new ENUM members change no byte."""
    table = _logged(FIELD_TYPE.LONG, FIELD_TYPE.ENUM)
    before = _schema(("k", "int", "int(11)", None), ("e", "enum", "enum('a','b')", "utf8mb4"))
    after = _schema(("k", "int", "int(11)", None), ("state", "enum", "enum('a','b','c')", "utf8mb4"))
    assert by_position(table, ("db", "t"), before, "mariadb", "p1")
    assert by_position(table, ("db", "t"), after, "mariadb", "p2")
    columns: list[Any] = table.columns
    assert (columns[1].name, columns[1].enum_values) == ("state", ["", "a", "b", "c"])


@pytest.mark.parametrize(
    ("types", "why"),
    [
        ((FIELD_TYPE.LONG, FIELD_TYPE.LONGLONG), "has 2 columns"),  # a column more than the schema
        (
            (
                FIELD_TYPE.LONG,
                FIELD_TYPE.LONGLONG,
                FIELD_TYPE.ENUM,
                FIELD_TYPE.SET,
                FIELD_TYPE.LONG,
                FIELD_TYPE.VARCHAR,
            ),
            "LONG",
        ),  # same count, a type in the wrong place
    ],
    ids=["count", "type"],
)
def test_a_table_map_that_does_not_fit_the_schema_by_position_is_refused_naming_the_table_and_position(
    types: tuple[int, ...], why: str
) -> None:
    with pytest.raises(SchemaChangeError, match=rf"db\.t at binlog\.000009:120 .*{why}.*ingest resnapshot"):
        by_position(_logged(*types), ("db", "t"), SCHEMA, "mariadb", "binlog.000009:120")
