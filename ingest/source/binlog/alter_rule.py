"""Which clauses of an ALTER TABLE the job may follow from the binlog, taken from the statement's grammar.

The server rewrites old rows during an ALTER without logging a row event for them. So an ALTER is followed
only where every old row's new value can be derived from the statement and the schema: a column added as NULL or
with a constant default (evaluated as the server did, `ingest.query.ddl`), a widening that keeps every value
(`ingest.sink.evolution`), a rename, a drop, a move; and every clause that leaves the rows alone (keys, indexes,
table options). A clause whose values the server computes per row (a generated column, an AUTO_INCREMENT
column added), that may remove rows (`ALTER IGNORE` with a unique key, another storage engine) or that the job does
not know is never followed: the job reads the table again (`stream.on_unfollowable: recopy`) or stops by name.

`RULES` is the grammar of MariaDB 10.11/11.x and MySQL 8.4/9.x, clause by clause, as their reference manuals give
it (docs/config.md "Every clause of ALTER TABLE" is the same list). Pure text, no server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Effect = Literal["keeps", "keys", "columns", "partitions", "table", "reads"]
"""What a clause does to the rows the server already has:
keeps: no value changes; keys: none, but a new primary key is decided by the schema diff, and under ALTER IGNORE a
unique key deletes the rows that repeat it; columns: a column added, redefined, renamed, dropped or moved, each
decided by the column rule (`column_rule`) and the schema diff (`ingest.sink.evolution`); partitions: rows moved
by whole partitions, decided by `ingest.source.binlog.partitions`; table: the table renamed; reads: values the job
cannot derive, so the table is read again (or the job stops)."""

# sql_mode bits (the binlog's Q_SQL_MODE_CODE; the same in MySQL and MariaDB).
STRICT_TRANS_TABLES = 1 << 21
STRICT_ALL_TABLES = 1 << 22

# The storage engines that hold the rows they are given: a table moved to one keeps every row. Any other
# (BLACKHOLE discards them, MERGE and FEDERATED show another table's, SEQUENCE is no table of rows) is read again.
ROW_KEEPING_ENGINES = frozenset(
    {"innodb", "xtradb", "myisam", "aria", "memory", "heap", "archive", "csv", "rocksdb", "tokudb", "columnstore",
     "mroonga", "s3", "ndb", "ndbcluster"}
)  # fmt: skip

NAME = r'(?:`(?:[^`]|``)+`|"(?:[^"]|"")+"|[\w$]+)'
"""An identifier as SQL writes it: backquoted, double-quoted (ANSI_QUOTES) or bare (`ddl` uses it too)."""
_NAME = NAME
_STRINGS = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\"", re.DOTALL)


@dataclass(frozen=True)
class ClauseRule:
    """One clause of the ALTER TABLE grammar and what the job does with it."""

    clause: str
    """The clause as the manuals write it."""
    pattern: re.Pattern[str]
    effect: Effect
    old_rows: str
    """What the server does to the rows it has."""
    job: str
    """What the job does."""
    servers: str = "both"
    """Where the clause exists: both, MariaDB, MySQL."""


def _rule(clause: str, pattern: str, effect: Effect, old_rows: str, job: str, servers: str = "both") -> ClauseRule:
    return ClauseRule(clause, re.compile(pattern, re.I | re.DOTALL), effect, old_rows, job, servers)


_KEEP = "followed: nothing to do"
_INDEX = r"(?:INDEX|KEY)"
_CONSTRAINT = rf"(?:CONSTRAINT(?:\s+(?!PRIMARY\b|UNIQUE\b|FOREIGN\b|CHECK\b){_NAME})?\s+)?"

# Table options: any number of them may stand in one clause, separated by spaces (`ENGINE=InnoDB ROW_FORMAT=DYNAMIC`).
_TABLE_OPTIONS = (
    "AUTOEXTEND_SIZE", "AUTO_INCREMENT", "AVG_ROW_LENGTH", "CHECKSUM", "COMMENT", "COMPRESSION", "CONNECTION",
    "DATA DIRECTORY", "INDEX DIRECTORY", "DELAY_KEY_WRITE", "ENCRYPTED", "ENCRYPTION", "ENCRYPTION_KEY_ID",
    "ENGINE_ATTRIBUTE", "SECONDARY_ENGINE_ATTRIBUTE", "SECONDARY_ENGINE", "IETF_QUOTES", "INSERT_METHOD",
    "KEY_BLOCK_SIZE", "MAX_ROWS", "MIN_ROWS", "PACK_KEYS", "PAGE_CHECKSUM", "PAGE_COMPRESSED",
    "PAGE_COMPRESSION_LEVEL", "PASSWORD", "ROW_FORMAT", "STATS_AUTO_RECALC", "STATS_PERSISTENT", "STATS_SAMPLE_PAGES",
    "TABLESPACE", "TRANSACTIONAL", "STORAGE", "DEFAULT CHARACTER SET", "CHARACTER SET", "DEFAULT CHARSET", "CHARSET",
    "DEFAULT COLLATE", "COLLATE", "ALGORITHM", "LOCK",
)  # fmt: skip
_OPTION_VALUE = r"(?:\s*=\s*|\s+)(?:'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\"|[\w$.-]+)"
_ONE_OPTION = re.compile(
    r"(?:" + "|".join(o.replace(" ", r"\s+") for o in sorted(_TABLE_OPTIONS, key=len, reverse=True)) + r")\b"
    + _OPTION_VALUE + r"\s*",
    re.I,
)  # fmt: skip
_ENGINE = re.compile(r"ENGINE(?:\s*=\s*|\s+)[`'\"]?(?P<engine>[\w$]+)[`'\"]?\s*", re.I)
_UNION = re.compile(r"UNION\s*=?\s*\(.*?\)\s*", re.I | re.DOTALL)


RULES: tuple[ClauseRule, ...] = (
    # Columns.
    _rule("ADD [COLUMN] [IF NOT EXISTS] (col definition, ...)",
          r"^ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?\(", "columns",
          "as ADD COLUMN, for each column", "as ADD COLUMN, for each column"),
    _rule("ADD [COLUMN] [IF NOT EXISTS] col definition [FIRST | AFTER col]",
          rf"^ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?(?!(?:PRIMARY|UNIQUE|INDEX|KEY|FULLTEXT|SPATIAL|VECTOR|FOREIGN"
          rf"|CONSTRAINT|CHECK|PARTITION|PERIOD|SYSTEM)\b){_NAME}\s+\S",
          "columns", "each old row gets the column's value for it",
          "followed when that value is NULL or a constant default, backfilled; a generated column, an AUTO_INCREMENT "
          "one or a default computed per row or at the moment: read again"),
    _rule("CHANGE [COLUMN] [IF EXISTS] old new definition [FIRST | AFTER col]",
          rf"^CHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?{_NAME}\s+{_NAME}\s+\S", "columns",
          "renames the column and converts its values to the new definition",
          "renamed; the conversion followed when it keeps every value (a widening), else read again or stop"),
    _rule("MODIFY [COLUMN] [IF EXISTS] col definition [FIRST | AFTER col]",
          rf"^MODIFY\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?{_NAME}\s+\S", "columns",
          "converts the column's values to the new definition",
          "followed when the conversion keeps every value (a widening, NULL allowed, NOT NULL under a strict "
          "sql_mode); "
          "a new generation expression or AUTO_INCREMENT over rows holding 0 or NULL: read again; else stop"),
    _rule("DROP [COLUMN] [IF EXISTS] col [RESTRICT | CASCADE]",
          rf"^DROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?(?!(?:PRIMARY|INDEX|KEY|FOREIGN|CONSTRAINT|CHECK|PARTITION|PERIOD"
          rf"|SYSTEM)\b){_NAME}\s*(?:RESTRICT|CASCADE)?$",
          "columns", "the column's values go", "followed: the Iceberg column is dropped"),
    _rule("RENAME COLUMN [IF EXISTS] old TO new", rf"^RENAME\s+COLUMN\s+(?:IF\s+EXISTS\s+)?{_NAME}\s+TO\s+{_NAME}$",
          "columns", "none", "followed: the Iceberg column is renamed (same field id)"),
    _rule("ALTER [COLUMN] col SET DEFAULT {literal | (expr)} | DROP DEFAULT",
          rf"^ALTER\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?{_NAME}\s+(?:SET\s+DEFAULT\b|DROP\s+DEFAULT$)", "keeps",
          "none (the default is for rows written later)", _KEEP),
    _rule("ALTER [COLUMN] col SET {VISIBLE | INVISIBLE}",
          rf"^ALTER\s+(?:COLUMN\s+)?{_NAME}\s+SET\s+(?:VISIBLE|INVISIBLE)$", "keeps",
          "none (hidden from SELECT *, still logged)", _KEEP, "MySQL"),
    _rule("CONVERT TO CHARACTER SET charset [COLLATE collation]", r"^CONVERT\s+TO\s+(?:CHARACTER\s+SET|CHARSET)\b",
          "columns", "converts every text column's values to the character set: a character it lacks becomes '?' "
          "outside a strict sql_mode (or with IGNORE), fails the statement under one",
          "each column as MODIFY: followed when the new set holds every character of the old one (any set into "
          "utf8mb4, utf16 or utf32; any but those into utf8mb3 or ucs2; ascii into any set but swe7) or the "
          "sql_mode was strict; else read again or stop"),
    # Keys, indexes and constraints.
    _rule("ADD [CONSTRAINT [symbol]] PRIMARY KEY (cols)", rf"^ADD\s+{_CONSTRAINT}PRIMARY\s+KEY\b", "keys",
          "none; with ALTER IGNORE, rows with a duplicate key are deleted",
          "a new primary key: stop or read again; with ALTER IGNORE: read again"),
    _rule("ADD [CONSTRAINT [symbol]] UNIQUE [INDEX | KEY] [name] (cols)", rf"^ADD\s+{_CONSTRAINT}UNIQUE\b", "keys",
          "none; with ALTER IGNORE, rows with a duplicate key are deleted",
          "followed; with ALTER IGNORE: read again"),
    _rule("ADD {INDEX | KEY} [IF NOT EXISTS] [name] (cols)", rf"^ADD\s+{_INDEX}\b", "keeps", "none", _KEEP),
    _rule("ADD {FULLTEXT | SPATIAL | VECTOR} [INDEX | KEY] [name] (cols)",
          r"^ADD\s+(?:FULLTEXT|SPATIAL|VECTOR)\b", "keeps", "none", _KEEP),
    _rule("ADD [CONSTRAINT [symbol]] FOREIGN KEY [name] (cols) REFERENCES ...",
          rf"^ADD\s+{_CONSTRAINT}FOREIGN\s+KEY\b", "keeps",
          "none (the server refuses rows that break it, unless foreign_key_checks=0)",
          "followed; its actions are applied as the rows change (docs/config.md)"),
    _rule("ADD [CONSTRAINT [symbol]] CHECK (expr) [[NOT] ENFORCED]", rf"^ADD\s+{_CONSTRAINT}CHECK\b", "keeps",
          "none (the server refuses a table that breaks it)", _KEEP),
    _rule("DROP PRIMARY KEY", r"^DROP\s+PRIMARY\s+KEY$", "keys",
          "none", "a changed primary key: stop or read again"),
    _rule("DROP {INDEX | KEY} [IF EXISTS] name", rf"^DROP\s+{_INDEX}\b", "keeps", "none",
          "followed (a unique key the job chunks by: stop)"),
    _rule("DROP FOREIGN KEY [IF EXISTS] name", r"^DROP\s+FOREIGN\s+KEY\b", "keeps", "none", _KEEP),
    _rule("DROP {CONSTRAINT | CHECK} [IF EXISTS] name", r"^DROP\s+(?:CONSTRAINT|CHECK)\b", "keeps", "none", _KEEP),
    _rule("ALTER {INDEX | KEY} name {[NOT] IGNORED | VISIBLE | INVISIBLE}",
          rf"^ALTER\s+{_INDEX}\s+{_NAME}\s+(?:NOT\s+IGNORED|IGNORED|VISIBLE|INVISIBLE)$", "keeps", "none", _KEEP),
    _rule("ALTER {CHECK | CONSTRAINT} name [NOT] ENFORCED",
          rf"^ALTER\s+(?:CHECK|CONSTRAINT)\s+{_NAME}\s+(?:NOT\s+)?ENFORCED$", "keeps", "none", _KEEP, "MySQL"),
    _rule("RENAME {INDEX | KEY} old TO new", rf"^RENAME\s+{_INDEX}\s+{_NAME}\s+TO\s+{_NAME}$", "keeps", "none", _KEEP),
    _rule("{DISABLE | ENABLE} KEYS", r"^(?:DISABLE|ENABLE)\s+KEYS$", "keeps", "none", _KEEP),
    # Periods and system versioning.
    _rule("ADD PERIOD FOR name (start, end)",
          rf"^ADD\s+PERIOD\s+(?:IF\s+NOT\s+EXISTS\s+)?FOR\s+(?!SYSTEM_TIME\b){_NAME}",
          "keeps", "none (an application-time period)", _KEEP, "MariaDB"),
    _rule("DROP PERIOD FOR name",
          rf"^DROP\s+PERIOD\s+(?:IF\s+EXISTS\s+)?FOR\s+(?!SYSTEM_TIME\b){_NAME}$", "keeps",
          "none", _KEEP, "MariaDB"),
    _rule("ADD SYSTEM VERSIONING, ADD PERIOD FOR SYSTEM_TIME",
          r"^ADD\s+(?:SYSTEM\s+VERSIONING|PERIOD\s+FOR\s+SYSTEM_TIME)\b",
          "reads", "rows get their start and end times; deletes keep history rows from then on",
          "read again or stop (system-versioned tables are refused)", "MariaDB"),
    _rule("DROP SYSTEM VERSIONING, DROP PERIOD FOR SYSTEM_TIME",
          r"^DROP\s+(?:SYSTEM\s+VERSIONING|PERIOD\s+FOR\s+SYSTEM_TIME)\b", "reads", "history rows are deleted",
          "read again or stop", "MariaDB"),
    # The table.
    _rule("RENAME [TO | AS] new_name", rf"^RENAME\s+(?:TO\s+|AS\s+)?{_NAME}(?:\s*\.\s*{_NAME})?$", "table",
          "none", "as RENAME TABLE (docs/config.md)"),
    _rule("ORDER BY col [, col ...]", r"^ORDER\s+BY\b", "keeps", "none (rows stored in that order)", _KEEP),
    _rule("FORCE", r"^FORCE$", "keeps", "none (the table is rebuilt)", _KEEP),
    _rule("{WITH | WITHOUT} VALIDATION", r"^WITH(?:OUT)?\s+VALIDATION$", "keeps", "none", _KEEP, "MySQL"),
    _rule("SECONDARY_LOAD | SECONDARY_UNLOAD", r"^SECONDARY_(?:UN)?LOAD$", "keeps",
          "none (a copy in a secondary engine)", _KEEP, "MySQL"),
    _rule("ENGINE [=] name", r"^ENGINE\b", "keeps",
          "rows kept by an engine that stores them; BLACKHOLE discards them, MERGE and FEDERATED show other tables'",
          "followed into InnoDB, MyISAM, Aria, MEMORY, ARCHIVE, CSV, RocksDB, ColumnStore, Mroonga, S3, NDB; any "
          "other engine: read again or stop"),
    _rule("UNION [=] (tables)", r"^UNION\b", "reads", "the MERGE table shows the rows of other tables",
          "read again or stop"),
    _rule("SEQUENCE [=] {0 | 1}", r"^SEQUENCE\b", "reads", "the table becomes a sequence (or stops being one)",
          "read again or stop", "MariaDB"),
    _rule("WITH SYSTEM VERSIONING (table option)", r"^WITH\s+SYSTEM\s+VERSIONING$", "reads",
          "as ADD SYSTEM VERSIONING", "read again or stop", "MariaDB"),
    _rule("table options: " + ", ".join(o for o in _TABLE_OPTIONS if o not in ("ALGORITHM", "LOCK"))
          + " (several may stand in one clause)", r"^(?:" + "|".join(
              o.replace(" ", r"\s+") for o in sorted(_TABLE_OPTIONS, key=len, reverse=True)) + r")\b",
          "keeps", "none (CHARACTER SET and COLLATE without CONVERT TO: the default for columns added later)", _KEEP),
    # Partitions and tablespaces.
    _rule("ADD PARTITION, DROP PARTITION, TRUNCATE PARTITION, COALESCE PARTITION, REORGANIZE PARTITION, "
          "EXCHANGE PARTITION, ANALYZE / CHECK / OPTIMIZE / REBUILD / REPAIR PARTITION, REMOVE PARTITIONING, "
          "PARTITION BY, CONVERT PARTITION ... TO TABLE, CONVERT TABLE ... TO PARTITION, "
          "{DISCARD | IMPORT} [PARTITION ...] TABLESPACE, UPGRADE PARTITIONING",
          r"^(?:(?:ADD|DROP|TRUNCATE|COALESCE|REORGANIZE|EXCHANGE|ANALYZE|CHECK|OPTIMIZE|REBUILD|REPAIR|DISCARD|IMPORT"
          r"|CONVERT)\s+(?:PARTITION|TABLESPACE)|PARTITION\s+BY|REMOVE\s+PARTITIONING|UPGRADE\s+PARTITIONING"
          r"|CONVERT\s+TABLE)\b",
          "partitions", "rows removed, moved or brought in by whole partitions or tablespaces, unlogged",
          "DROP / TRUNCATE PARTITION of a RANGE or LIST partitioning the job keeps bounds for: followed; ADD, "
          "maintenance: nothing; anything that moves rows: read again or stop (docs/config.md)"),
)  # fmt: skip


def classify(clause: str) -> ClauseRule | None:
    """The grammar rule of one clause of an ALTER TABLE (comments gone, as `ddl.alter_clauses` gives it); None for a
    clause the job does not know."""
    text = clause.strip()
    for rule in RULES:
        if rule.pattern.search(text):
            return rule
    return None


@dataclass(frozen=True)
class AlterReading:
    """What an ALTER TABLE's clauses say about its old rows (`read_alter`)."""

    reads_again: tuple[str, ...] = ()
    """Why old rows' values cannot be derived (one reason a clause): the table is read again, or the job stops."""
    numbered: tuple[str, ...] = ()
    """Columns made AUTO_INCREMENT by CHANGE or MODIFY (their names after the statement): the server numbers old rows
    that hold 0 or NULL in them, so the target is looked at for such rows."""
    strict: bool = False
    """The statement ran under a strict sql_mode and without IGNORE: a conversion that would change a value (a
    NULL into a NOT NULL column, a truncation) failed the statement, which the binlog then does not hold."""


_DEFINITION_HEAD = re.compile(
    rf"^(?:ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?(?P<added>{_NAME})"
    rf"|CHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?{_NAME}\s+(?P<changed>{_NAME})"
    rf"|MODIFY\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?(?P<modified>{_NAME}))\s+(?P<definition>.*)$",
    re.I | re.DOTALL,
)
_GENERATED = re.compile(r"\b(?:GENERATED\s+ALWAYS\s+)?AS\s*\(|\bGENERATED\s+ALWAYS\b", re.I)
_AUTO_INCREMENT = re.compile(r"\bAUTO_INCREMENT\b", re.I)
_VERSIONED = re.compile(r"\bWITH\s+SYSTEM\s+VERSIONING\b", re.I)


def unquote(name: str) -> str:
    """An identifier `NAME` matched, without its quotes."""
    if name[:1] in '`"':
        return name[1:-1].replace(name[0] * 2, name[0])
    return name


def column_rule(clause: str) -> tuple[str | None, str | None]:
    """(why old rows' values of the column cannot be derived, or None; the column if it is made AUTO_INCREMENT by
    CHANGE or MODIFY) for one ADD / CHANGE / MODIFY clause; (None, None) for any other clause."""
    m = _DEFINITION_HEAD.match(clause.strip())
    if m is None or _ADD_SEVERAL.match(clause.strip()):
        return None, None
    definition = _STRINGS.sub("''", m["definition"])
    name = unquote(m["added"] or m["changed"] or m["modified"])
    if _GENERATED.search(definition):
        return f"column {name!r} is generated: the server computed its value for every old row", None
    if _VERSIONED.search(definition):
        return f"column {name!r} is made system-versioned: old rows get history the binlog does not hold", None
    if _AUTO_INCREMENT.search(definition):
        if m["added"]:
            return f"column {name!r} is added AUTO_INCREMENT: the server numbered every old row", None
        return None, name
    return None, None


_ADD_SEVERAL = re.compile(r"^ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?\((?P<inner>.*)\)\s*$", re.I | re.DOTALL)


def _several_added(clause: str) -> str | None:
    """Why `ADD [COLUMN] (a definition, b definition)` adds a column whose old rows' values cannot be derived."""
    m = _ADD_SEVERAL.match(clause.strip())
    inner = _STRINGS.sub("''", m["inner"]) if m else ""
    if _GENERATED.search(inner) or _AUTO_INCREMENT.search(inner) or _VERSIONED.search(inner):
        return f"{clause[:80]!r} adds a generated, AUTO_INCREMENT or system-versioned column, computed per row"
    return None


def _option_reasons(clause: str) -> list[str]:
    """Why a clause of table options (several may follow each other) cannot be followed; [] when it can."""
    rest = clause.strip()
    reasons: list[str] = []
    while rest:
        if m := _ENGINE.match(rest):
            if m["engine"].lower() not in ROW_KEEPING_ENGINES:
                reasons.append(f"ENGINE={m['engine']}: the job cannot tell which rows that engine keeps")
        elif m := _UNION.match(rest):
            reasons.append("UNION=(...): the table shows the rows of other tables")
        elif not (m := _ONE_OPTION.match(rest)):
            return [*reasons, f"a table option the job does not know: {rest[:80]!r}"]
        rest = rest[m.end() :].lstrip(", ")
    return reasons


def read_alter(clauses: list[str], ignore: bool = False, sql_mode: int | None = None) -> AlterReading:
    """What the clauses of one ALTER TABLE (`ddl.alter_clauses`) say about its old rows. `ignore`: the statement
    was `ALTER IGNORE TABLE`; `sql_mode` the statement's (None: not known, taken as not strict)."""
    reasons: list[str] = []
    numbered: list[str] = []
    for clause in clauses:
        rule = classify(clause)
        if rule is None:
            reasons.append(f"a clause the job does not know: {clause[:80]!r}")
            continue
        if rule.effect == "partitions":
            break  # the partition clause ends the statement: its names and definitions follow, split at commas
        if rule.effect == "reads":
            reasons.append(f"{clause[:80]!r}: {rule.old_rows}")
        elif rule.effect == "keys" and ignore:
            reasons.append(f"ALTER IGNORE with {clause[:80]!r}: rows with a duplicate key were deleted unlogged")
        elif rule.clause.startswith(("ENGINE", "table options")):
            reasons += _option_reasons(clause)
        elif rule.effect == "columns":
            why, auto = column_rule(clause)
            why = why or _several_added(clause)
            if why is not None:
                reasons.append(why)
            if auto is not None:
                numbered.append(auto)
    strict = sql_mode is not None and bool(sql_mode & (STRICT_TRANS_TABLES | STRICT_ALL_TABLES)) and not ignore
    return AlterReading(tuple(reasons), tuple(numbered), strict)


def rules_table() -> str:
    """`RULES` as the Markdown table docs/config.md gives ("Every clause of ALTER TABLE")."""
    lines = ["| clause | servers | what it does to old rows | what the job does |", "|---|---|---|---|"]
    for rule in RULES:
        cells = (rule.clause, rule.servers, rule.old_rows, rule.job)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(rules_table())
