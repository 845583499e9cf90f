"""A captured table's MySQL partitions, and the rows a partition statement removes without row events.

`ALTER TABLE t DROP PARTITION p` and `TRUNCATE PARTITION p` (nightly retention) log one Query event and no row
events. The rows they removed are those whose partitioning column falls in the partitions' bounds, which the
definitions give: for RANGE [the previous partition's bound, its own), for LIST its values. The bounds must be
those of the statement's moment: the server shows only today's partitions, and a dropped one is gone from them, so
the job keeps the layout it read with the table's plan and carries it through each partition statement it follows
(`after_statement`). RANGE and LIST by a column, or by YEAR, TO_DAYS or UNIX_TIMESTAMP of one (time-partitioned
tables), are followed. Other expressions, HASH and KEY, and a layout the job did not keep are reasons given back,
never a guess.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from ingest.source.binlog.alter_rule import NAME, unquote
from ingest.source.binlog.ddl import alter_clauses, split_top_level


@dataclass(frozen=True)
class PartitionLayout:
    method: str
    """RANGE, RANGE COLUMNS, LIST, LIST COLUMNS, HASH, KEY, ... (information_schema.PARTITIONS)."""
    expression: str
    """The partitioning expression or column list as the server shows it (`d`, year(`d`))."""
    partitions: tuple[tuple[str, str | None], ...]
    """(name, description) in order: RANGE's bound (`10`, `MAXVALUE`, `'2024-01-01'`), LIST's values."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PartitionLayout:
        data = json.loads(text)
        return cls(data["method"], data["expression"], tuple((n, d) for n, d in data["partitions"]))


def read_layout(conn: Any, database: str, table: str) -> PartitionLayout | None:
    """The table's partitions as the server shows them now; None when it is not partitioned."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT PARTITION_METHOD, PARTITION_EXPRESSION, PARTITION_NAME, PARTITION_DESCRIPTION "
            "FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "AND PARTITION_NAME IS NOT NULL ORDER BY PARTITION_ORDINAL_POSITION",
            (database, table),
        )
        rows = cur.fetchall()
    if not rows:
        return None
    return PartitionLayout(
        str(rows[0][0]), str(rows[0][1]), tuple((str(r[2]), None if r[3] is None else str(r[3])) for r in rows)
    )


_ADD = re.compile(r"^ADD\s+PARTITION\s*\((?P<body>.*)\)$", re.I | re.DOTALL)
_ADDED = re.compile(
    rf"^PARTITION\s+(?P<name>{NAME})\s+VALUES\s+(?:LESS\s+THAN\s*(?P<less>\(.*\)|MAXVALUE)|IN\s*\((?P<in>.*)\))$",
    re.I | re.DOTALL,
)
_MOVING = re.compile(
    r"\b(?:PARTITION\s+BY|REMOVE\s+PARTITIONING|REORGANIZE|COALESCE|EXCHANGE|CONVERT|DISCARD|IMPORT|REBUILD)\b", re.I
)
_NAMES = re.compile(NAME)


_OPTIONS = r"(?:\s*,\s*(?:ALGORITHM|LOCK)\s*=?\s*\w+)*"
_DROP_OR_TRUNCATE = re.compile(
    rf"^(?P<op>DROP|TRUNCATE)\s+PARTITION\s+(?P<names>ALL|{NAME}(?:\s*,\s*{NAME})*?){_OPTIONS}$", re.I
)
_PARTITION_CLAUSE = re.compile(
    r"^(?:(?:ADD|DROP|TRUNCATE|COALESCE|REORGANIZE|EXCHANGE|ANALYZE|CHECK|OPTIMIZE|REBUILD|REPAIR|DISCARD|IMPORT"
    r"|CONVERT)\s+PARTITION|PARTITION\s+BY|REMOVE\s+PARTITIONING)\b",
    re.I,
)


def partition_statement(query: str) -> tuple[str, tuple[str, ...]] | None:
    """("drop" or "truncate", partition names; ("ALL",) for all) of an ALTER TABLE that only drops or truncates
    partitions (ALGORITHM= or LOCK= beside it); None for any other statement."""
    clauses = alter_clauses(query)
    if not clauses:
        return None
    m = _DROP_OR_TRUNCATE.match(", ".join(clauses))  # the names' commas split them into clauses of their own
    if m is None:
        return None
    return m["op"].lower(), tuple(unquote(n) for n in _NAMES.findall(m["names"]))


def changes_partitions_only(query: str) -> bool:
    """Whether an ALTER TABLE changes partitions and nothing else: no column, key or option."""
    clauses = alter_clauses(query) or []
    return bool(clauses) and bool(_PARTITION_CLAUSE.match(clauses[0]))


def after_statement(layout: PartitionLayout | None, query: str) -> PartitionLayout | None:
    """The layout after an ALTER TABLE the job followed: DROP PARTITION removes, TRUNCATE keeps, ADD PARTITION
    appends; None (not known) after any other partition clause, or when it was not known before."""
    if layout is None:
        return None
    dropped = partition_statement(query)
    if dropped is not None:
        op, names = dropped
        if op == "truncate":
            return layout
        wanted = {n.lower() for n in names}
        return PartitionLayout(
            layout.method, layout.expression, tuple(p for p in layout.partitions if p[0].lower() not in wanted)
        )
    clauses = alter_clauses(query) or []
    added = []
    for clause in clauses:
        m = _ADD.match(clause)
        if m is None:
            if _MOVING.search(clause) or re.search(r"\bPARTITION", clause, re.I):
                return None
            continue
        for part in split_top_level(m["body"]):
            p = _ADDED.match(" ".join(part.split()))
            if p is None:
                return None
            bound = p["less"] if p["less"] is not None else p["in"]
            bound = bound[1:-1].strip() if bound.startswith("(") else bound
            added.append((unquote(p["name"]), bound.upper() if bound.upper() == "MAXVALUE" else bound))
    return PartitionLayout(layout.method, layout.expression, layout.partitions + tuple(added))


_COLUMN = re.compile(r"^\s*`((?:[^`]|``)+)`\s*$|^\s*([\w$]+)\s*$")
_FUNCTION = re.compile(r"^\s*(\w+)\s*\(\s*(`(?:[^`]|``)+`|[\w$]+)\s*\)\s*$")
_SPARK_OF = {
    # MariaDB's partitioning functions whose value Spark computes alike from the target's column:
    "year": "year({})",  # of a DATE or DATETIME (DATE, TIMESTAMP_NTZ): the calendar year
    "to_days": "(datediff({}, DATE'1970-01-01') + 719528)",  # days since year 0, as TO_DAYS counts them
    "unix_timestamp": "unix_seconds({})",  # of a TIMESTAMP (UTC): whole seconds since the epoch
}


def _partition_value(layout: PartitionLayout, quote: Any) -> str:
    """The Spark SQL value of a row that the partitions' bounds are compared with: the partitioning column, or the
    function of it (`quote` quotes the column's name); ValueError with the reason for any other partitioning."""
    method = layout.method.upper()
    column = _COLUMN.match(layout.expression)
    if column is not None and method in ("RANGE", "RANGE COLUMNS", "LIST", "LIST COLUMNS"):
        return str(quote((column[1] or "").replace("``", "`") or column[2]))
    function = _FUNCTION.match(layout.expression)
    if function is not None and method in ("RANGE", "LIST") and function[1].lower() in _SPARK_OF:
        return _SPARK_OF[function[1].lower()].format(quote(unquote(function[2])))
    raise ValueError(
        f"the table is partitioned by {method} ({layout.expression}), not RANGE or LIST of one column or of "
        "YEAR, TO_DAYS or UNIX_TIMESTAMP of one"
    )


def removed_rows(layout: PartitionLayout, names: tuple[str, ...], quote: Any) -> str:
    """A Spark SQL condition on the target's columns that holds exactly the rows of partitions `names`
    (`quote` quotes a column's name); ValueError with the reason when no such condition can be told."""
    method = layout.method.upper()
    column = _partition_value(layout, quote)
    wanted = [n.lower() for n in names]
    if wanted == ["all"]:
        wanted = [p[0].lower() for p in layout.partitions]
    at = {p[0].lower(): i for i, p in enumerate(layout.partitions)}
    missing = [n for n in wanted if n not in at]
    if missing:
        raise ValueError(
            f"partition {missing[0]} is not in the layout the job kept {[p[0] for p in layout.partitions]}"
        )
    terms = []
    for name in wanted:
        i = at[name]
        description = layout.partitions[i][1]
        if description is None:
            raise ValueError(f"partition {name} has no bounds")
        if method.startswith("RANGE"):
            lower = None if i == 0 else layout.partitions[i - 1][1]
            upper = None if description.upper() == "MAXVALUE" else description
            bounds = [f"{column} >= {_literal(lower)}"] if lower is not None else []
            bounds += [f"{column} < {_literal(upper)}"] if upper is not None else []
            inside = " AND ".join(bounds) or "TRUE"
            # NULL sorts below every bound: RANGE keeps it in the first partition.
            terms.append(f"({inside} OR {column} IS NULL)" if i == 0 else f"({inside})")
        else:
            values = [v.strip() for v in split_top_level(description)]
            listed = [v for v in values if v.upper() != "NULL"]
            alternatives = [f"{column} IN ({', '.join(_literal(v) for v in listed)})"] if listed else []
            if len(listed) < len(values):
                alternatives.append(f"{column} IS NULL")
            terms.append("(" + " OR ".join(alternatives) + ")")
    return " OR ".join(terms)


def _literal(value: str) -> str:
    """A bound as the server shows it (`10`, `'2024-01-01'`), as a Spark SQL literal (a string compares with the
    column's type: a DATE, a TIMESTAMP_NTZ, a STRING)."""
    value = value.strip()
    if value.startswith("(") and value.endswith(")"):
        value = value[1:-1].strip()
    if re.fullmatch(r"-?\d+(?:\.\d+)?", value) or value.startswith("'"):
        return value
    raise ValueError(f"a bound the job cannot read: {value!r}")
