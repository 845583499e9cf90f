"""Unit tests of the pure side of schema evolution: which source changes a target can follow, and how;
which DDL statements touch which captured tables; what old rows hold for an added column."""

from __future__ import annotations

from decimal import Decimal

import pytest

from ingest.errors import SchemaChangeError
from ingest.model.columns import SourceColumn
from ingest.model.schema import TableSchema
from ingest.sink.evolution import (
    AddedColumn,
    SchemaPlan,
    _moves,
    default_kind,
    implicit_default,
    plan_schema_change,
    schema_from_json,
    schema_to_json,
    spark_string,
)
from ingest.source.binlog.ddl import ddl_tables, named_tables, statement_tables


def col(name: str, column_type: str, nullable: bool = True, **kw: object) -> SourceColumn:
    data_type = column_type.split("(")[0].split()[0].lower()
    args = column_type.split("(")[1].split(")")[0].split(",") if "(" in column_type else []
    if data_type == "decimal":
        kw.setdefault("numeric_precision", int(args[0]))
        kw.setdefault("numeric_scale", int(args[1]))
    if data_type in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"):
        kw.setdefault("character_set", "utf8mb4")
    return SourceColumn(name, data_type, column_type, nullable, **kw)  # type: ignore[arg-type]


ID = col("id", "int(11)", False)


def table(*columns: SourceColumn, key: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema("db", "t", (ID, *columns), key, key, (None,) * len(key))


def plan(old: TableSchema, new: TableSchema) -> SchemaPlan:
    return plan_schema_change(old, new, "ALTER TABLE t ...", "bin.000001:400")


def test_added_columns_are_placed_after_their_source_neighbour() -> None:
    a, b, c = col("a", "int(11)"), col("b", "varchar(5)"), col("c", "int(11)", False)
    result = plan(table(a), table(c, a, b))
    assert result.added == (AddedColumn(c, "id"), AddedColumn(b, "a"))
    assert not result.widened and not result.relaxed


@pytest.mark.parametrize(
    ("old", "new", "widened"),
    [
        ("int(11)", "bigint(20)", [("v", "BIGINT")]),
        ("tinyint(4)", "int(11)", []),  # both INT in Iceberg
        ("smallint(5) unsigned", "int(11)", []),
        ("int(10) unsigned", "bigint(20)", []),  # both BIGINT
        ("float", "double", [("v", "DOUBLE")]),
        ("decimal(10,2)", "decimal(20,2)", [("v", "DECIMAL(20,2)")]),
        ("varchar(20)", "varchar(200)", []),
        ("varchar(20)", "text", []),
        ("enum('a','b')", "enum('a','b','c')", []),
        ("enum('a','b','z')", "enum('z','b','a')", []),  # an ENUM's rows keep their text in any order
        ("enum('a','b')", "enum('x','b','y','a')", []),
        ("set('a','c')", "set('x','a','b','c','d')", []),  # a SET's old members keep their order
        ("varchar(20000)", "mediumtext", []),
        ("tinytext", "text", []),
    ],
)
def test_value_preserving_changes_are_followed(old: str, new: str, widened: list[tuple[str, str]]) -> None:
    result = plan(table(col("v", old)), table(col("v", new)))
    assert list(result.widened) == widened and not result.added


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("bigint(20)", "int(11)", "narrowing integer"),
        ("int(11)", "int(10) unsigned", "signed to unsigned"),
        ("bigint(20)", "bigint(20) unsigned", "signed to unsigned"),
        ("bigint(20) unsigned", "decimal(20,0)", "type change"),
        ("decimal(10,2)", "decimal(10,3)", "scale change"),
        ("decimal(30,2)", "decimal(40,2)", "Iceberg cannot promote DECIMAL\\(30,2\\) to STRING"),
        ("varchar(20)", "varchar(5)", "shorter length"),
        ("varchar(20)", "char(20)", "fixed-length CHAR"),
        ("double", "float", "type change"),
        ("int(11)", "varchar(20)", "type change"),
        ("enum('a','b')", "enum('b','c')", r"ENUM members \['a'\] removed"),
        ("set('a','b')", "set('b','a')", "SET members reordered"),
        ("set('a','b')", "set('a')", r"SET members \['b'\] removed"),
        ("varchar(20000)", "text", "shorter length"),  # 20,000 four-byte characters need 80,000 bytes
        ("varchar(100)", "tinytext", "shorter length"),
        ("text", "varchar(1000)", "shorter length"),
        ("varchar(20)", "varbinary(20)", "type change"),  # CONVERT TO CHARACTER SET binary
    ],
)
def test_value_changing_changes_are_refused_naming_the_column(old: str, new: str, why: str) -> None:
    with pytest.raises(SchemaChangeError, match=rf"db\.t: the schema change at bin.000001:400 .*'v': .*{why}"):
        plan(table(col("v", old)), table(col("v", new)))


def _charset_change(
    old_set: str, new_set: str, old_type: str = "varchar(20)", new_type: str = "", strict: bool = False
) -> SchemaPlan:
    old = table(col("v", old_type, character_set=old_set))
    new = table(col("v", new_type or old_type, character_set=new_set))
    return plan_schema_change(old, new, "ALTER TABLE t CONVERT TO CHARACTER SET x", "bin.000001:400", strict=strict)


@pytest.mark.parametrize(
    ("old_set", "new_set"),
    [
        ("latin1", "utf8mb4"),
        ("utf8mb3", "utf8mb4"),
        ("utf8", "utf8mb3"),
        ("ucs2", "utf16"),
        ("utf16", "utf8mb4"),
        ("utf32", "utf16le"),
        ("cp1251", "utf8mb3"),
        ("gbk", "ucs2"),
        ("ascii", "latin1"),
        ("ascii", "sjis"),
        ("latin2", "latin2"),
    ],
)
def test_a_character_set_that_holds_every_old_character_is_followed(old_set: str, new_set: str) -> None:
    assert _charset_change(old_set, new_set).empty
    assert _charset_change(old_set, new_set, "char(5)").empty


@pytest.mark.parametrize(
    ("old_set", "new_set"),
    [
        ("utf8mb4", "latin1"),  # issue 63: 'Привет 中文' became '?????? ??'
        ("utf8mb4", "utf8mb3"),  # emoji and supplementary CJK
        ("utf16", "ucs2"),
        ("gb18030", "utf8mb3"),
        ("utf8mb3", "cp1251"),
        ("latin1", "cp1251"),
        ("latin1", "ascii"),
        ("ascii", "swe7"),  # swe7 puts Swedish letters at [ \\ ] { | }
        ("cp1251", "koi8r"),  # the same alphabet, but the sets are not known to hold each other
    ],
)
def test_a_character_set_that_lacks_old_characters_is_refused_outside_a_strict_sql_mode(
    old_set: str, new_set: str
) -> None:
    with pytest.raises(SchemaChangeError, match=rf"'v': a character set change from {old_set} to {new_set} outside"):
        _charset_change(old_set, new_set)
    with pytest.raises(SchemaChangeError, match="a character set change"):
        _charset_change(old_set, new_set, "text")
    # Under a strict sql_mode without IGNORE the server failed the statement on a character the new set lacks.
    assert _charset_change(old_set, new_set, strict=True).empty


def test_a_text_types_capacity_counts_bytes_in_the_new_character_set() -> None:
    # A latin1 TEXT holds 65,535 characters, up to 3 bytes each in utf8mb4: CONVERT TO makes it a MEDIUMTEXT.
    assert _charset_change("latin1", "utf8mb4", "text", "mediumtext").empty
    assert _charset_change("utf8mb3", "utf8mb4", "text").empty  # UTF-8 keeps a character's bytes
    assert _charset_change("ascii", "utf8mb4", "tinytext").empty
    for strict in (False, True):  # a TEXT's excess trailing spaces are cut with a note even in strict mode
        with pytest.raises(SchemaChangeError, match="shorter length"):
            _charset_change("latin1", "utf8mb4", "text", strict=strict)
    with pytest.raises(SchemaChangeError, match="shorter length"):
        _charset_change("ucs2", "utf8mb4", "text", "text", strict=True)  # 32,767 characters, up to 3 bytes each


def test_drops_renames_and_moves_are_followed_by_name_as_the_statement_says() -> None:
    a, b, c = col("a", "int(11)"), col("b", "varchar(5)"), col("c", "int(11)")
    b2 = col("b2", "varchar(9)")
    result = plan_schema_change(table(a, b, c), table(c, b2), "ALTER ...", "", {"b": "b2"}, ("a",))
    assert result.renamed == (("b", "b2"),) and result.dropped == ("a",) and not result.added
    assert result.order == ("id", "c", "b2")  # c moved before b2
    assert plan_schema_change(table(a, b), table(a, b), "", "", {}, ()).empty
    # A rename of a key column keeps the key.
    k = col("k", "int(11)", False)
    renamed_key = plan_schema_change(
        table(k, key=("id", "k")), table(col("k2", "int(11)", False), key=("id", "k2")), "", "", {"k": "k2"}, ()
    )
    assert renamed_key.renamed == (("k", "k2"),)


def test_what_cannot_be_told_or_mirrored_is_refused() -> None:
    v, w = col("v", "int(11)"), col("w", "int(11)")
    with pytest.raises(SchemaChangeError, match=r"columns \['v'\] are gone and \['w'\] are new"):
        plan(table(v), table(w))  # renames unknown (a swapped-in table): a rename or a drop and an add?
    assert plan(table(v, w), table(w)).dropped == ("v",)  # only gone: a drop
    with pytest.raises(SchemaChangeError, match="'v' is gone, but the statement neither drops nor renames it"):
        plan_schema_change(table(v), table(w), "", "", {}, ())
    with pytest.raises(SchemaChangeError, match="'v' is dropped and added again"):
        plan_schema_change(table(v), table(v), "", "", {}, ("v",))
    with pytest.raises(SchemaChangeError, match="'v' takes the name of another column, 'w'"):
        plan_schema_change(table(v, w), table(w, col("x", "int(11)")), "", "", {"v": "w", "w": "x"}, ())
    with pytest.raises(SchemaChangeError, match=r"primary key changed from \['id'\] to \['id', 'v'\]"):
        plan(table(col("v", "int(11)", False)), table(col("v", "int(11)", False), key=("id", "v")))
    with pytest.raises(SchemaChangeError, match=r"column 'v': a narrowing"):
        plan_schema_change(table(v), table(col("v2", "smallint(6)")), "", "", {"v": "v2"}, ())


@pytest.mark.parametrize(
    ("columns", "order", "moves"),
    [
        (["id", "a", "b"], ["id", "a", "b"], []),
        (["id", "a", "b"], ["id", "b", "a"], [("b", "AFTER `id`")]),
        (["id", "a", "b"], ["b", "id", "a"], [("b", "FIRST")]),
        (["id", "a", "b", "_extra"], ["a", "b", "id"], [("a", "FIRST"), ("b", "AFTER `a`")]),
    ],
)
def test_column_moves_put_the_source_order_in_place(
    columns: list[str], order: list[str], moves: list[tuple[str, str]]
) -> None:
    assert _moves(columns, order) == moves


def test_nullability() -> None:
    # NOT NULL -> NULL relaxes the Iceberg column; NULL -> NOT NULL keeps it optional (nothing to do) where the
    # statement ran under a strict sql_mode: the server would have failed it rather than change a NULL.
    assert plan(table(col("v", "int(11)", False)), table(col("v", "int(11)", True))).relaxed == ("v",)
    nullable, not_null = table(col("v", "int(11)", True)), table(col("v", "int(11)", False))
    assert plan_schema_change(nullable, not_null, strict=True).empty


@pytest.mark.parametrize(
    ("column_type", "strict", "why"),
    [
        ("int(11)", False, "outside a strict sql_mode"),
        ("varchar(10)", False, "outside a strict sql_mode"),
        ("timestamp", True, "got the time of the ALTER"),
    ],
)
def test_a_column_made_not_null_where_the_server_may_have_filled_nulls_is_refused(
    column_type: str, strict: bool, why: str
) -> None:
    nullable, not_null = table(col("v", column_type, True)), table(col("v", column_type, False))
    with pytest.raises(SchemaChangeError, match=f"column 'v': made NOT NULL.*{why}"):
        plan_schema_change(nullable, not_null, "ALTER TABLE t MODIFY v NOT NULL", "bin.000001:400", strict=strict)


@pytest.mark.parametrize(
    ("flavor", "default", "extra", "nullable", "kind"),
    [
        ("mariadb", "7", "", False, "constant"),
        ("mariadb", "'x''y'", "", True, "constant"),
        ("mariadb", "-1.5e3", "", True, "constant"),
        ("mariadb", "NULL", "", True, "null"),
        ("mariadb", None, "", True, "null"),
        ("mariadb", None, "", False, "implicit"),
        ("mariadb", "current_timestamp()", "", False, "expression"),
        ("mariadb", "(`a` + 1)", "", True, "expression"),
        ("mysql", "7", "", False, "constant"),
        ("mysql", "CURRENT_TIMESTAMP", "DEFAULT_GENERATED", False, "expression"),
        ("mysql", None, "", False, "implicit"),
    ],
)
def test_default_kinds(flavor: str, default: str | None, extra: str, nullable: bool, kind: str) -> None:
    assert default_kind(flavor, col("c", "int(11)", nullable), default, extra) == kind


def test_implicit_defaults_are_the_zero_values_or_unknown() -> None:
    assert implicit_default(col("c", "int(11)", False)) == 0
    assert implicit_default(col("c", "decimal(5,2)", False)) == Decimal(0)
    assert implicit_default(col("c", "varchar(3)", False)) == ""
    assert implicit_default(col("c", "date", False)) is None  # a zero date: refused by the caller


def test_source_schema_round_trips_through_json() -> None:
    schema = table(col("v", "decimal(10,2)"), col("s", "varchar(9)"))
    assert schema_from_json("db", "t", schema_to_json(schema)) == schema


def test_spark_string_escapes_quotes_and_backslashes() -> None:
    assert spark_string("""a'b\\c"d""") == """'a\\'b\\\\c"d'"""


CAPTURED = [("shop", "t"), ("shop", "orders")]


@pytest.mark.parametrize(
    ("query", "default_db", "touched"),
    [
        ("ALTER TABLE t ADD COLUMN c INT", "shop", [("shop", "t")]),
        ("alter online ignore table `shop`.`orders` modify x bigint", "other", [("shop", "orders")]),
        ("ALTER TABLE t2 ADD COLUMN c INT", "shop", []),  # a table whose name contains a captured one
        ("ALTER TABLE t ADD COLUMN c INT", "other", []),
        ("ALTER TABLE IF EXISTS shop . t DROP c", "x", [("shop", "t")]),
        ("DROP TABLE t", "shop", [("shop", "t")]),
        ("RENAME TABLE orders TO orders_old", "shop", [("shop", "orders")]),
        ("INSERT INTO t VALUES (1)", "shop", []),
    ],
)
def test_ddl_tables(query: str, default_db: str, touched: list[tuple[str, str]]) -> None:
    assert ddl_tables(query, default_db, CAPTURED) == touched


@pytest.mark.parametrize(
    ("query", "default_db", "touched"),
    [
        ("UPDATE t SET n = -1 WHERE id = 3", "shop", [("shop", "t")]),
        ("/* app */ delete from `shop`.`orders` where id < 5", "other", [("shop", "orders")]),
        ("INSERT INTO shop.orders SELECT * FROM staging.o", "", [("shop", "orders")]),
        ("REPLACE INTO t VALUES (1)", "shop", [("shop", "t")]),
        ("LOAD DATA INFILE 'x' INTO TABLE orders", "shop", [("shop", "orders")]),
        ("WITH d AS (SELECT 1) UPDATE orders, d SET n = 1", "shop", [("shop", "orders")]),
        ("UPDATE t2 SET n = 1", "shop", []),  # another table whose name contains a captured one
        ("UPDATE t SET n = 1", "other", []),  # the same name in another database
        ("ALTER TABLE t ADD COLUMN c INT", "shop", []),  # DDL: ddl_tables
        ("BEGIN", "shop", []),
        ("COMMIT", "shop", []),
    ],
)
def test_statement_tables(query: str, default_db: str, touched: list[tuple[str, str]]) -> None:
    assert statement_tables(query, default_db, CAPTURED) == touched


def test_statements_that_give_a_table_a_name_are_recognized() -> None:
    assert named_tables("CREATE TABLE fresh (id INT PRIMARY KEY)", "db") == [("db", "fresh")]
    assert named_tables("create table if not exists `o`.`we``ird` like x", "db") == [("o", "we`ird")]
    assert named_tables("CREATE OR REPLACE TABLE t2 AS SELECT 1", "db") == [("db", "t2")]
    assert named_tables("RENAME TABLE a TO b, x.c TO `y`.d", "db") == [("db", "b"), ("y", "d")]
    assert named_tables("ALTER TABLE a RENAME TO b", "db") == [("db", "b")]
    assert named_tables("ALTER TABLE a RENAME AS s.b", "db") == [("s", "b")]
    # Not logged in row format, or no new table name (a renamed column only makes the job look again).
    assert named_tables("CREATE TEMPORARY TABLE t (a INT)", "db") == []
    assert named_tables("ALTER TABLE a ADD COLUMN x INT", "db") == []
    assert named_tables("GRANT SELECT ON db.x TO u", "db") == []
    assert named_tables("INSERT INTO t SELECT * FROM u", "db") == []
