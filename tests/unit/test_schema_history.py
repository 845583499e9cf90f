"""Unit tests of ingest.source.binlog.schema_history: the schema right after a DDL statement derived from the statements
that followed it and the server's newest schema, or the reason it cannot be (issue 41)."""

from __future__ import annotations

import dataclasses

import pytest

from ingest.model.columns import SourceColumn
from ingest.model.schema import TableSchema
from ingest.source.binlog.schema_history import after_first


def col(name: str, kind: str = "int", nullable: bool = True) -> SourceColumn:
    return SourceColumn(name, kind, kind, nullable)


def table(*columns: SourceColumn, key: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema("db", "t", columns, key, key, (None,) * len(key))


OLD = table(col("id", nullable=False), col("a", "varchar"), col("c"))


def names_and_kinds(found: TableSchema | str) -> list[tuple[str, str]]:
    assert isinstance(found, TableSchema), found
    return [(c.name, c.data_type) for c in found.columns]


def test_a_rename_then_another_columns_type_change_gives_the_renamed_table_with_the_old_type() -> None:
    live = table(col("id", nullable=False), col("b", "varchar"), col("c", "bigint"))
    found = after_first(OLD, ["ALTER TABLE t RENAME COLUMN a TO b", "ALTER TABLE t MODIFY c BIGINT"], live)
    assert names_and_kinds(found) == [("id", "int"), ("b", "varchar"), ("c", "int")]


def test_two_added_columns_each_take_the_servers_definition_at_their_place() -> None:
    live = table(col("x", "date"), col("id", nullable=False), col("a", "varchar"), col("y"), col("c"))
    found = after_first(OLD, ["ALTER TABLE t ADD COLUMN y INT AFTER a", "ALTER TABLE t ADD x DATE FIRST"], live)
    assert names_and_kinds(found) == [("id", "int"), ("a", "varchar"), ("y", "int"), ("c", "int")]


def test_a_column_added_then_dropped_or_renamed_later() -> None:
    live = table(col("id", nullable=False), col("a", "varchar"), col("c"), col("z", "double"))
    found = after_first(
        OLD, ["ALTER TABLE t ADD COLUMN y DOUBLE, ALGORITHM=INPLACE", "ALTER TABLE t RENAME COLUMN y TO z"], live
    )
    assert names_and_kinds(found) == [("id", "int"), ("a", "varchar"), ("c", "int"), ("y", "double")]
    live = table(col("id", nullable=False), col("a", "varchar"))
    found = after_first(OLD, ["ALTER TABLE t DROP COLUMN c", "ALTER TABLE t ADD INDEX i (a), DROP c2"], live)
    assert isinstance(found, str) and "no such column" in found
    found = after_first(OLD, ["ALTER TABLE t DROP COLUMN c", "ALTER TABLE t ADD INDEX i (a)"], live)
    assert names_and_kinds(found) == [("id", "int"), ("a", "varchar")]


@pytest.mark.parametrize(
    ("statements", "live_columns", "reason"),
    [
        (  # a column's type between two redefinitions is only in the text
            ["ALTER TABLE t ADD COLUMN y INT", "ALTER TABLE t MODIFY y BIGINT"],
            [col("id", nullable=False), col("a", "varchar"), col("c"), col("y", "bigint")],
            "defined by the first statement and changed again later",
        ),
        (  # the server disagrees with what the statements say
            ["ALTER TABLE t ADD COLUMN y INT", "ALTER TABLE t ADD COLUMN z INT"],
            [col("id", nullable=False), col("a", "varchar"), col("c"), col("y")],
            "the statements lead to columns",
        ),
        (  # a column changed by something no statement shows
            ["ALTER TABLE t ADD COLUMN y INT", "ALTER TABLE t COMMENT 'x'"],
            [col("id", nullable=False), col("a", "text"), col("c"), col("y")],
            "column 'a' changed without a statement",
        ),
        (
            ["ALTER TABLE t ADD COLUMN y INT", "ALTER TABLE t ADD SYSTEM VERSIONING"],
            [col("id", nullable=False), col("a", "varchar"), col("c"), col("y")],
            "a clause the job does not follow",
        ),
        (
            ["ALTER TABLE t ADD PRIMARY KEY (a)", "ALTER TABLE t DROP PRIMARY KEY"],
            [col("id", nullable=False), col("a", "varchar"), col("c")],
            "the keys changed in the first statement and again later",
        ),
    ],
)
def test_what_the_text_and_the_server_cannot_tell_exactly_is_a_reason_not_a_guess(
    statements: list[str], live_columns: list[SourceColumn], reason: str
) -> None:
    found = after_first(OLD, statements, table(*live_columns))
    assert isinstance(found, str) and reason in found, found


def test_keys_follow_a_rename_and_a_key_change_in_the_first_statement_takes_the_servers() -> None:
    live = table(col("pk", nullable=False), col("a", "varchar"), col("c"), key=("pk",))
    found = after_first(OLD, ["ALTER TABLE t CHANGE id pk INT NOT NULL", "ALTER TABLE t MODIFY c BIGINT"], live)
    assert isinstance(found, TableSchema) and found.primary_key == ("pk",)  # the server's definition of pk
    found = after_first(OLD, ["ALTER TABLE t RENAME COLUMN id TO pk", "ALTER TABLE t MODIFY c BIGINT"], live)
    assert isinstance(found, TableSchema) and found.primary_key == ("pk",) and found.chunk_key == ("pk",)
    live = dataclasses.replace(live, primary_key=("a",), chunk_key=("a",))
    found = after_first(OLD, ["ALTER TABLE t RENAME COLUMN id TO pk, DROP PRIMARY KEY, ADD PRIMARY KEY (a)"], live)
    assert isinstance(found, TableSchema) and found.primary_key == ("a",)
