"""Schema evolution of a target from a DDL in the binlog: which source changes Iceberg can follow, and how.

The rule is "never silently wrong": a change is followed only when every value an old row holds in MySQL
after the ALTER is the value Iceberg already holds (or gets from the default backfill). MySQL rewrites
old rows during an ALTER without writing binlog events, so a value-changing ALTER (narrowing, a charset
change, dropping or renaming a column, a new primary key) could never be mirrored from the binlog and
stops the job with a `SchemaChangeError` instead. `plan_schema_change` is pure; the functions taking a
Spark session apply a plan to a target idempotently, so the step can be re-run after a crash.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import pyarrow as pa

from ingest.errors import SchemaChangeError, UnsupportedTableError
from ingest.model import charsets
from ingest.model.columns import SourceColumn, TargetColumn, map_column, quote_identifier, rows_to_record_batch
from ingest.model.schema import OCCURRENCE_COLUMN
from ingest.sink.summary import snapshot_properties as tagged

log = logging.getLogger(__name__)

SOURCE_SCHEMA_PROPERTY = "ingest.source-schema"
"""Table property: the MySQL schema (JSON) the target mirrors at its committed offset."""

_INT_RANK = {"tinyint": 1, "smallint": 2, "mediumint": 3, "int": 4, "bigint": 5}
_TEXT_CAPACITY = {"tinytext": 255, "text": 65535, "mediumtext": 16777215, "longtext": 4294967295}
_BLOB_CAPACITY = {"tinyblob": 255, "blob": 65535, "mediumblob": 16777215, "longblob": 4294967295}
_LENGTH = re.compile(r"\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)")
# Iceberg's legal type promotions, as the Spark types of ingest/model/columns.py name them.
_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")


@dataclass(frozen=True)
class AddedColumn:
    column: SourceColumn
    after: str | None
    """The column it follows in the source (None: it is the first)."""


@dataclass(frozen=True)
class SchemaPlan:
    """What a target must do to follow one source schema change."""

    added: tuple[AddedColumn, ...] = ()
    widened: tuple[tuple[str, str], ...] = ()
    """(column, new Spark type): int -> bigint, float -> double, decimal precision up."""
    relaxed: tuple[str, ...] = ()
    """Columns that became nullable in the source and are required in Iceberg."""
    renamed: tuple[tuple[str, str], ...] = ()
    """(old name, new name)"""
    dropped: tuple[str, ...] = ()
    order: tuple[str, ...] = ()
    """The source's columns in their new order, when the columns kept from before changed places."""

    @property
    def empty(self) -> bool:
        return not (self.added or self.widened or self.relaxed or self.renamed or self.dropped or self.order)


# --- the pure diff ------------------------------------------------------------------------------------


def _length(column_type: str) -> int | None:
    match = _LENGTH.search(column_type)
    return int(match.group(1)) if match else None


_COUNTED = ("char", "varchar", "binary", "varbinary")
"""String types whose length counts characters (a binary string's characters are bytes); the TEXT and BLOB types'
capacities count bytes."""


def _fits(old: SourceColumn, new: SourceColumn) -> bool:
    """Whether every value of `old` fits `new` once converted to its character set."""
    old_cs, new_cs = old.character_set, new.character_set
    if new.data_type in _COUNTED:
        most = _counted(old) if old.data_type in _COUNTED else _capacity(old) // charsets.min_bytes(old_cs)
        return most <= _counted(new)
    if old.data_type in _COUNTED:
        most = _counted(old) * charsets.max_bytes(new_cs)
    elif charsets.same_bytes(old_cs, new_cs):
        most = _capacity(old)
    else:
        most = _capacity(old) // charsets.min_bytes(old_cs) * charsets.max_bytes(new_cs)
    return most <= _capacity(new)


def _counted(col: SourceColumn) -> int:
    """The characters a CHAR, VARCHAR, BINARY or VARBINARY column holds."""
    return _length(col.column_type) or 0


def _capacity(col: SourceColumn) -> int:
    """The bytes a TEXT or BLOB type holds."""
    return _TEXT_CAPACITY.get(col.data_type, _BLOB_CAPACITY.get(col.data_type, 0))


def _fsp(col: SourceColumn) -> int:
    return col.datetime_precision or 0


def _same_values(old: SourceColumn, new: SourceColumn, strict: bool) -> str | None:
    """None when every old value is unchanged by MySQL's conversion to the new type; else why not. `strict`: the
    statement ran under a strict sql_mode without IGNORE."""
    a, b = old.data_type, new.data_type
    if old.column_type.lower() == new.column_type.lower() and a == b:
        # COLUMN_TYPE does not name the character set; an ENUM's or SET's values are its members, which it shows.
        if old.character_set == new.character_set or a in ("enum", "set"):
            return None
    if a in _INT_RANK and b in _INT_RANK:
        if old.unsigned and not new.unsigned:
            return None if _INT_RANK[b] > _INT_RANK[a] else "a narrowing integer change"
        if not old.unsigned and new.unsigned:
            return "signed to unsigned (negative values would change)"
        return None if _INT_RANK[b] >= _INT_RANK[a] else "a narrowing integer change"
    if a == "float" and b == "double":
        return None
    if a == "decimal" and b == "decimal":
        if old.numeric_scale != new.numeric_scale:
            return "a decimal scale change (values would be rounded or rescaled)"
        if (new.numeric_precision or 0) < (old.numeric_precision or 0):
            return "a narrowing decimal change"
        return None
    text = ("char", "varchar", *_TEXT_CAPACITY)
    blobs = ("binary", "varbinary", *_BLOB_CAPACITY)
    for family, fixed in ((text, "char"), (blobs, "binary")):
        if a in family and b in family:
            if why := _character_set_change(old, new, strict):
                return why
            if b == fixed and a != fixed:
                return f"a change to fixed-length {fixed.upper()} (values would be padded)"
            if not _fits(old, new):
                return "a shorter length (values could be truncated)"
            return None
    if a == b and a in ("datetime", "timestamp"):
        return None if _fsp(new) >= _fsp(old) else "fewer fractional second digits"
    if a == b and a in ("enum", "set"):
        return _members_change(a, old.members, new.members)  # converted to a new set, they show it
    return f"a type change from {old.column_type} to {new.column_type}"


def _character_set_change(old: SourceColumn, new: SourceColumn, strict: bool) -> str | None:
    """Why a text column's new character set may have changed old values (None: it holds every character of the old
    one, or the statement ran under a strict sql_mode, which fails on a character the new set lacks rather than
    write `?` for it). See ingest/model/charsets.py."""
    if strict or charsets.holds(old.character_set, new.character_set):
        return None
    return (
        f"a character set change from {old.character_set} to {new.character_set} outside a strict sql_mode (or with "
        f"IGNORE): old values' characters that {new.character_set} lacks were written as '?'"
    )


def _members_change(kind: str, old: list[str], new: list[str]) -> str | None:
    """Why an ENUM's or SET's new members may have changed old values. The server converts old values by their
    text: with every old member kept, an ENUM keeps each row's text whatever the order; a SET's value lists its
    members in definition order, so its old members must also keep their order among themselves."""
    if missing := [m for m in old if m not in new]:
        return f"{kind.upper()} members {missing} removed (rows holding them became '')"
    if kind == "set" and [m for m in new if m in old] != old:
        return "SET members reordered (a value lists its members in definition order)"
    return None


def _not_null_values(old: SourceColumn, new: SourceColumn, strict: bool) -> str | None:
    """Why a column made NOT NULL may hold other values now (None: it holds the same). Outside a strict sql_mode
    (or under ALTER IGNORE, or an online schema change tool's INSERT IGNORE copy) the server writes the type's zero
    value over NULLs; into a TIMESTAMP it writes the current time even under a strict one."""
    if not old.nullable or new.nullable:
        return None
    if new.data_type == "timestamp":
        return "made NOT NULL: rows holding NULL got the time of the ALTER"
    if not strict:
        return "made NOT NULL outside a strict sql_mode (or with IGNORE): rows holding NULL got the type's zero value"
    return None


def iceberg_promotion(old: str, new: str) -> Literal["same", "widen"] | None:
    """How an Iceberg column of Spark type `old` takes the values of Spark type `new` (None: Iceberg cannot
    promote it): the same type, or one of Iceberg's promotions (int to long, float to double, a decimal's
    precision up)."""
    if old == new:
        return "same"
    if (old, new) in (("INT", "BIGINT"), ("FLOAT", "DOUBLE")):
        return "widen"
    a, b = _DECIMAL.fullmatch(old), _DECIMAL.fullmatch(new)
    if a and b and a.group(2) == b.group(2) and int(b.group(1)) >= int(a.group(1)):
        return "widen"
    return None


def _iceberg_change(old: TargetColumn, new: TargetColumn) -> Literal["same", "widen"] | None:
    """How the Iceberg type follows (None: Iceberg cannot promote it)."""
    return iceberg_promotion(old.spark_type, new.spark_type)


def plan_schema_change(
    old: Any,
    new: Any,
    statement: str = "",
    position: str = "",
    renamed: Mapping[str, str] | None = None,
    dropped: Sequence[str] = (),
    strict: bool = False,
) -> SchemaPlan:
    """The plan that makes a target of `old` (a TableSchema) follow `new`, or SchemaChangeError naming why not.

    `renamed` (old name -> new name) and `dropped` are what the statement says by name (`ddl.alter_columns`):
    the schema the server shows afterwards cannot tell a renamed column from a dropped one and an added one.
    None means the renames are not known (a table swapped in by an online schema change tool whose ALTER the
    job did not see): then columns both gone and new are refused rather than guessed. `strict`: the statement ran
    under a strict sql_mode without IGNORE, so a column made NOT NULL held no NULL (the server would have failed the
    statement rather than write the type's zero value over it). Added columns become
    nullable in Iceberg (a required column cannot be added to a table that has rows); their default is
    backfilled. Columns keep their Iceberg field ids through renames and moves, so no row is rewritten.
    """
    reasons: list[str] = []
    table = old.table_id
    kept, gone, fresh = _columns_by_name(old, new, renamed, dropped, reasons)
    widened, relaxed = _type_changes(old, new, kept, strict, reasons)
    added: list[AddedColumn] = []
    previous: str | None = None
    for col in new.columns:
        if col.name in fresh:
            try:
                map_column(table, col)
            except UnsupportedTableError as e:
                reasons.append(str(e))
            added.append(AddedColumn(col, previous))
        previous = col.name
    if reasons:
        raise SchemaChangeError(
            f"{table}: the schema change{f' at {position}' if position else ''}"
            f"{f' ({statement[:200]!r})' if statement else ''} cannot be applied to Iceberg without making "
            f"old rows wrong: {'; '.join(reasons)}. Nothing after it was applied; snapshot the table again "
            f"(`ingest resnapshot --config ... --table {table}`), or set `stream.on_schema_change: ignore` if the "
            "change does not matter"
        )
    kept_order = [c.name for c in new.columns if c.name not in fresh]
    moved = [kept[c.name] for c in old.columns if c.name in kept] != kept_order
    return SchemaPlan(
        tuple(added),
        tuple(widened),
        tuple(relaxed),
        tuple((k, v) for k, v in kept.items() if k != v),
        tuple(gone),
        tuple(new.column_names) if moved else (),
    )


def _columns_by_name(
    old: Any, new: Any, renamed: Mapping[str, str] | None, dropped: Sequence[str], reasons: list[str]
) -> tuple[dict[str, str], list[str], list[str]]:
    """Which old columns are kept (old name -> new name), gone, and new, by what the statement says and the
    schemas show; why not (appended to `reasons`) where they disagree or the key changes."""
    new_by_name = {c.name: c for c in new.columns}
    old_names = set(old.column_names)
    # A rename of a column the old schema has not (added, then renamed, on a tool's helper table) is an addition.
    renames = {k: v for k, v in (renamed or {}).items() if k in old_names}
    for before, after in renames.items():
        if after not in new_by_name:
            reasons.append(f"the statement renames {before!r} to {after!r}, which the table's columns do not show")
        elif after in old_names:
            reasons.append(f"column {before!r} takes the name of another column, {after!r}, in the same statement")
    for name in dropped:
        if name in new_by_name and name not in renames.values():
            reasons.append(f"column {name!r} is dropped and added again in the same statement")
    kept = {c.name: renames.get(c.name, c.name) for c in old.columns if renames.get(c.name, c.name) in new_by_name}
    gone = [c.name for c in old.columns if c.name not in kept]
    fresh = [c.name for c in new.columns if c.name not in kept.values()]
    if renamed is None and gone and fresh:
        reasons.append(
            f"columns {gone} are gone and {fresh} are new, and the statements that did it were not read, so a "
            "rename cannot be told from a drop and an add"
        )
    elif renamed is not None and (unsaid := [c for c in gone if c not in dropped]):
        reasons.append(f"column {unsaid[0]!r} is gone, but the statement neither drops nor renames it as read")
    if old.keyless and gone:
        reasons.append(
            f"column {gone[0]!r} of a table without a key is gone: rows that differed only in it become alike, and "
            f"their numbers among alike rows ({OCCURRENCE_COLUMN}) would repeat"
        )
    if [renames.get(k, k) for k in old.primary_key] != list(new.primary_key):
        reasons.append(f"the primary key changed from {list(old.primary_key)} to {list(new.primary_key)}")
    return kept, gone, fresh


def _type_changes(
    old: Any, new: Any, kept: Mapping[str, str], strict: bool, reasons: list[str]
) -> tuple[list[tuple[str, str]], list[str]]:
    """The kept columns whose Iceberg type widens, and those that become nullable; why a change cannot be followed
    (appended to `reasons`)."""
    table = old.table_id
    new_by_name = {c.name: c for c in new.columns}
    widened: list[tuple[str, str]] = []
    relaxed: list[str] = []
    for col in old.columns:
        if col.name not in kept:
            continue
        after = new_by_name[kept[col.name]]
        why = _same_values(col, after, strict) or _not_null_values(col, after, strict)
        if why is None:
            try:
                old_target, new_target = map_column(table, col), map_column(table, after)
            except UnsupportedTableError as e:
                reasons.append(str(e))
                continue
            kind = _iceberg_change(old_target, new_target)
            if kind is None:
                why = f"Iceberg cannot promote {old_target.spark_type} to {new_target.spark_type}"
            elif kind == "widen":
                widened.append((after.name, new_target.spark_type))
            if not old_target.nullable and new_target.nullable and after.name not in new.primary_key:
                relaxed.append(after.name)
        if why is not None:
            reasons.append(f"column {col.name!r}: {why} ({col.column_type} -> {after.column_type})")
    return widened, relaxed


# --- defaults of added columns ------------------------------------------------------------------------

DefaultKind = Literal["null", "constant", "implicit", "expression"]
_NUMERIC_LITERAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def default_kind(flavor: str, col: SourceColumn, column_default: str | None, extra: str) -> DefaultKind:
    """What MySQL wrote into old rows for an added column, from information_schema.COLUMNS.

    MariaDB reports COLUMN_DEFAULT as an SQL expression (literals quoted, `NULL` for a NULL default);
    MySQL 8 reports literals bare and marks expressions with DEFAULT_GENERATED in EXTRA. "implicit" is a
    NOT NULL column without a default: old rows hold the type's zero value.
    """
    if column_default is None or (flavor == "mariadb" and column_default.upper() == "NULL"):
        return "null" if col.nullable else "implicit"
    if flavor == "mariadb":
        literal = column_default.startswith("'") or _NUMERIC_LITERAL.fullmatch(column_default) is not None
        return "constant" if literal else "expression"
    return "expression" if "DEFAULT_GENERATED" in extra.upper() else "constant"


def computed_per_row(extra: str) -> str | None:
    """How the server filled an added column in old rows, by information_schema.COLUMNS.EXTRA, when it computed a
    value for each row (a generated column, an AUTO_INCREMENT one, a system-versioning period column): None when
    not. The statement's text says the same (`ingest.source.binlog.alter_rule`); this reads what the server made of it,
    also where the text is not known (an online schema change tool's helper met at its swap)."""
    words = extra.upper()
    if "GENERATED" in words or "ROW START" in words or "ROW END" in words:
        return "as a generated column: the server computed its value for every old row"
    if "AUTO_INCREMENT" in words:
        return "AUTO_INCREMENT: the server numbered every old row"
    return None


def implicit_default(col: SourceColumn) -> Any:
    """The value MySQL gives old rows for a NOT NULL column added without a default, in PyMySQL's form."""
    if col.data_type in _INT_RANK or col.data_type in ("float", "double", "year"):
        return 0
    if col.data_type == "decimal":
        return Decimal(0)
    if col.data_type in ("char", "varchar", *_TEXT_CAPACITY):
        return ""
    if col.data_type in ("varbinary", *_BLOB_CAPACITY):
        return b""
    return None  # no safe guess: the caller refuses


# --- the source schema a target mirrors ---------------------------------------------------------------


def schema_to_json(schema: Any) -> str:
    return json.dumps(
        {
            "columns": [dataclasses.asdict(c) for c in schema.columns],
            "primary_key": list(schema.primary_key),
            "chunk_key": list(schema.chunk_key),
            "collations": list(schema.collations),
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def schema_from_json(database: str, table: str, text: str) -> Any:
    from ingest.model.schema import TableSchema

    data = json.loads(text)
    return TableSchema(
        database,
        table,
        tuple(SourceColumn(**c) for c in data["columns"]),
        tuple(data["primary_key"]),
        tuple(data["chunk_key"]),
        tuple(data["collations"]),
    )


def spark_string(text: str) -> str:
    """A Spark SQL string literal (backslash escapes are on by default)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- applying a plan with Spark (idempotent: every step looks at the table first) ----------------------


def iceberg_columns(spark: Any, target: str) -> dict[str, Any]:
    """The target's Iceberg columns by name (Spark's fields), read afresh."""
    spark.sql(f"REFRESH TABLE {target}")
    return {f.name: f for f in spark.table(target).schema.fields}


def _same_type(field: Any, spark_type: str) -> bool:
    return str(field.dataType.simpleString()).replace(" ", "").lower() == spark_type.replace(" ", "").lower()


def apply_plan(spark: Any, target: str, table_id: str, plan: SchemaPlan) -> list[str]:
    """Evolve the Iceberg schema; steps already done (a re-run after a crash) are skipped. Returns the DDL run."""
    done: list[str] = []
    existing = iceberg_columns(spark, target)

    def run(statement: str) -> None:
        nonlocal existing
        done.append(statement)
        spark.sql(statement)
        existing = iceberg_columns(spark, target)

    for before, after in plan.renamed:
        if before in existing and after not in existing:
            run(f"ALTER TABLE {target} RENAME COLUMN {quote_identifier(before)} TO {quote_identifier(after)}")
    for name in plan.dropped:
        if name in existing:
            run(f"ALTER TABLE {target} DROP COLUMN {quote_identifier(name)}")
    for added in plan.added:
        name = added.column.name
        if name in existing:
            continue
        spark_type = map_column(table_id, added.column).spark_type
        # At its source position when the column before it is in the target; else at the end.
        if added.after is None:
            where = " FIRST"
        elif added.after in existing:
            where = f" AFTER {quote_identifier(added.after)}"
        else:
            where = ""
        run(f"ALTER TABLE {target} ADD COLUMN {quote_identifier(name)} {spark_type}{where}")
    for name, spark_type in plan.widened:
        if not _same_type(existing[name], spark_type):
            done.append(f"ALTER TABLE {target} ALTER COLUMN {quote_identifier(name)} TYPE {spark_type}")
            spark.sql(done[-1])
    for name in plan.relaxed:
        if not existing[name].nullable:
            done.append(f"ALTER TABLE {target} ALTER COLUMN {quote_identifier(name)} DROP NOT NULL")
            spark.sql(done[-1])
    for name, where in _moves(list(existing), plan.order):
        run(f"ALTER TABLE {target} ALTER COLUMN {quote_identifier(name)} {where}")
    return done


def _moves(columns: list[str], order: Sequence[str]) -> list[tuple[str, str]]:
    """The column moves (`FIRST`, `AFTER c`) that put `order`'s columns in its order in a table whose columns
    are `columns`; columns not in `order` stay where they are. Empty when they are in order already."""
    wanted = [c for c in order if c in columns]
    current = [c for c in columns if c in wanted]
    moves: list[tuple[str, str]] = []
    for i, name in enumerate(wanted):
        if current[i] == name:
            continue
        current.remove(name)
        current.insert(i, name)
        moves.append((name, "FIRST" if i == 0 else f"AFTER {quote_identifier(wanted[i - 1])}"))
    return moves


def backfill(
    spark: Any,
    target: str,
    table_id: str,
    values: Mapping[str, Any],
    columns: Sequence[SourceColumn],
    snapshot_properties: Mapping[str, str],
) -> None:
    """Set added columns of every row to the value MySQL gave old rows, in one commit tagged with the DDL.

    Called only while the target holds nothing newer than the DDL (checked by the caller through the
    committed offset), so it touches old rows only, and once: its commit records the DDL's position.
    The table is written again whole (`INSERT OVERWRITE` of its own rows with the values set), not MERGEd: a MERGE
    on a merge-on-read table would leave a delete file against every data file, which every later batch reads
    until compaction (bench.osc: the job's lag stayed 4x the interval after a backfill of 200,000 rows).
    """
    targets = [dataclasses.replace(map_column(table_id, c), nullable=True) for c in columns if c.name in values]
    frame = spark.createDataFrame(
        pa.Table.from_batches([rows_to_record_batch(targets, [tuple(values[t.name] for t in targets)])])
    )
    view = f"ingest_backfill_{abs(hash((target, tuple(values))))}"
    frame.createOrReplaceTempView(view)
    names = [f.name for f in spark.table(target).schema.fields]
    select = ", ".join(f"{'s' if n in values else 't'}.{quote_identifier(n)}" for n in names)
    try:
        with tagged(spark, snapshot_properties):
            spark.sql(f"INSERT OVERWRITE {target} SELECT {select} FROM {target} t CROSS JOIN {view} s")
    finally:
        spark.catalog.dropTempView(view)


def store_source_schema(spark: Any, target: str, schema: Any) -> None:
    spark.sql(
        f"ALTER TABLE {target} SET TBLPROPERTIES ({spark_string(SOURCE_SCHEMA_PROPERTY)} = "
        f"{spark_string(schema_to_json(schema))})"
    )
