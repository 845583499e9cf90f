"""What a DDL statement in the binlog does to the tables the job captures, read from its SQL text.

The binlog logs DDL as the statement the client sent (MariaDB and MySQL both), so the job learns from the text
which tables a statement touches and how: an ALTER TABLE (its column renames and drops, which the schema the
server shows afterwards cannot tell apart from new columns), a TRUNCATE, a DROP TABLE, a RENAME TABLE. The
online schema change tools (pt-online-schema-change, gh-ost) are recognized by the names of their helper tables.
Everything here is pure text; `binlog.BinlogReader` and `streaming` act on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from ingest.model.changes import AlterColumns, TableName
from ingest.model.osc_tables import OscHelper, osc_helper
from ingest.source.binlog.alter_rule import NAME, read_alter, unquote

"""(database, table)"""

# A double-quoted name is a name under sql_mode ANSI_QUOTES, and a string nowhere a name can stand otherwise.
_NAME = NAME
_TABLE = rf"(?P<a>{_NAME})(?:\s*\.\s*(?P<b>{_NAME}))?"
_IDENTIFIER = re.compile(r'`((?:[^`]|``)+)`|"((?:[^"]|"")+)"|([\w$]+)')
_COMMENTS = r"(?:\s|/\*.*?\*/)*"

_DDL = re.compile(rf"^{_COMMENTS}(ALTER|RENAME|DROP|TRUNCATE|CREATE\s+OR\s+REPLACE)\b", re.IGNORECASE | re.DOTALL)
# Statements that change rows (a leading comment allowed); WITH starts INSERT/UPDATE/DELETE with a CTE.
_DML = re.compile(rf"^{_COMMENTS}(INSERT|UPDATE|DELETE|REPLACE|LOAD|WITH)\b", re.IGNORECASE | re.DOTALL)
_ALTER_TABLE = re.compile(
    rf"^{_COMMENTS}ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+(?:IF\s+EXISTS\s+)?{_TABLE}"
    r"(?:\s+(?:WAIT\s+\d+|NOWAIT))?",
    re.IGNORECASE | re.DOTALL,
)
_CREATE_TABLE = re.compile(
    rf"^{_COMMENTS}CREATE\s+(?:OR\s+REPLACE\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?{_TABLE}", re.IGNORECASE | re.DOTALL
)
_TRUNCATE = re.compile(rf"^{_COMMENTS}TRUNCATE\s+(?:TABLE\s+)?{_TABLE}", re.IGNORECASE | re.DOTALL)
_DROP_TABLE = re.compile(rf"^{_COMMENTS}DROP\s+TABLES?\s+(?:IF\s+EXISTS\s+)?", re.IGNORECASE | re.DOTALL)
_RENAME_TABLE = re.compile(rf"^{_COMMENTS}RENAME\s+TABLES?\s+(?:IF\s+EXISTS\s+)?", re.IGNORECASE | re.DOTALL)
_PAIR = re.compile(
    rf"^\s*(?P<a>{_NAME})(?:\s*\.\s*(?P<b>{_NAME}))?(?:\s+(?:WAIT\s+\d+|NOWAIT))?\s+TO\s+"
    rf"(?P<c>{_NAME})(?:\s*\.\s*(?P<d>{_NAME}))?\s*$",
    re.IGNORECASE,
)
_ONE_TABLE = re.compile(rf"^\s*{_TABLE}\s*$")
# Clauses of ALTER TABLE that change columns by name.
_RENAME_COLUMN = re.compile(rf"^RENAME\s+COLUMN\s+(?:IF\s+EXISTS\s+)?(?P<a>{_NAME})\s+TO\s+(?P<b>{_NAME})", re.I)
_CHANGE_COLUMN = re.compile(
    rf"^CHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?(?P<a>{_NAME})\s+(?P<b>{_NAME})\s+(?P<rest>.*)$", re.I | re.DOTALL
)
_DROP_COLUMN = re.compile(rf"^DROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?(?P<a>{_NAME})\s*(?:RESTRICT|CASCADE)?$", re.I)
_NOT_A_COLUMN = frozenset(
    {"PRIMARY", "INDEX", "KEY", "FOREIGN", "CONSTRAINT", "CHECK", "PARTITION", "SYSTEM", "PERIOD", "UNIQUE"}
)
_TABLE_RENAME = re.compile(rf"^RENAME\s+(?:TO\s+|AS\s+)?{_TABLE}$", re.I)


_PIECE = re.compile(
    r"""(?P<quoted>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*"|`(?:[^`]|``)*`)"""
    r"|/\*M?!\d*(?P<live>.*?)\*/"
    r"|/\*.*?\*/|--(?=\s|$)[^\n]*|\#[^\n]*",
    re.DOTALL,
)


_STRING = re.compile(r"'(?:[^'\\]|\\.|'')*'", re.DOTALL)


def _plain(query: str) -> str:
    """The statement without its comments: `/* gh-ost */` may stand between any two words, and a client may send
    `-- ...` and `# ...` to the line's end. The executable comments of MySQL and MariaDB (`/*!50100 ... */`,
    `/*M!100301 ... */`) are statement text: the server that logged them ran what they hold (mysqldump wraps whole
    statements in them). Quoted text is kept as it is."""
    if "/*" not in query and "--" not in query and "#" not in query:
        return query
    return _PIECE.sub(lambda m: m["quoted"] or (f" {m['live']} " if m["live"] is not None else " "), query)


def _table(a: str, b: str | None, default_db: str) -> TableName:
    return (unquote(a), unquote(b)) if b else (default_db, unquote(a))


def _same(a: TableName, b: TableName) -> bool:
    return a[0].lower() == b[0].lower() and a[1].lower() == b[1].lower()


def split_top_level(text: str) -> list[str]:
    """`text` split at the commas outside parentheses, quotes and comments, each part stripped."""
    parts: list[str] = []
    depth, start, i, quote = 0, 0, 0, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\" and quote != "`":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"`":
            quote = c
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = len(text) if end < 0 else end + 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def then(first: AlterColumns, second: AlterColumns) -> AlterColumns:
    """What two ALTERs of one table, one after the other, say about the first's columns."""
    back = {new: old for old, new in first.renamed.items()}
    renamed = dict(first.renamed)
    dropped = list(first.dropped)
    for old, new in second.renamed.items():
        original = back.get(old, old)
        renamed[original] = new
        if original == new:
            del renamed[original]
    for name in second.dropped:
        original = back.get(name, name)
        renamed.pop(original, None)
        dropped.append(original)
    numbered = [second.renamed.get(n, n) for n in first.numbered if n not in second.dropped]
    return AlterColumns(
        renamed,
        tuple(dropped),
        second.table_renamed_to or first.table_renamed_to,
        first.reads_again + second.reads_again,
        (*numbered, *second.numbered),
        first.strict and second.strict,
    )


_IGNORE = re.compile(rf"^{_COMMENTS}ALTER\s+(?:ONLINE\s+)?IGNORE\b", re.IGNORECASE | re.DOTALL)


def alter_columns(query: str, default_db: str, sql_mode: int | None = None) -> AlterColumns:
    """The column renames and drops of an ALTER TABLE statement (names as written, unquoted), and what its clauses
    say of old rows' values (`alter_rule.read_alter`; `sql_mode` is the statement's, None when not known)."""
    clauses = alter_clauses(query)
    if clauses is None:
        return AlterColumns()
    reading = read_alter(clauses, bool(_IGNORE.match(_plain(query))), sql_mode)
    renamed: dict[str, str] = {}
    dropped: list[str] = []
    moved_to: TableName | None = None
    for clause in clauses:
        if (m := _RENAME_COLUMN.match(clause)) and unquote(m["a"]) != unquote(m["b"]):
            renamed[unquote(m["a"])] = unquote(m["b"])
        elif (m := _CHANGE_COLUMN.match(clause)) and unquote(m["a"]) != unquote(m["b"]):
            renamed[unquote(m["a"])] = unquote(m["b"])
        elif (m := _DROP_COLUMN.match(clause)) and m["a"].upper() not in _NOT_A_COLUMN:
            dropped.append(unquote(m["a"]))
        elif m := _TABLE_RENAME.match(clause):
            moved_to = _table(m["a"], m["b"], default_db)
    return AlterColumns(renamed, tuple(dropped), moved_to, reading.reads_again, reading.numbered, reading.strict)


def alter_clauses(query: str) -> list[str] | None:
    """The clauses of an ALTER TABLE statement, without comments; None for another statement."""
    query = _plain(query)
    head = _ALTER_TABLE.match(query)
    return None if head is None else split_top_level(query[head.end() :])


def dropped_column(clause: str) -> str | None:
    """The column an ALTER TABLE clause drops (`DROP [COLUMN] [IF EXISTS] c`), unquoted; None for another clause."""
    m = _DROP_COLUMN.match(clause)
    return None if m is None or m["a"].upper() in _NOT_A_COLUMN else unquote(m["a"])


"""A MySQL identifier as written: backquoted, double-quoted (ANSI_QUOTES) or bare."""
NOT_A_COLUMN = _NOT_A_COLUMN
"""Words that, after ADD or DROP, begin a clause of something other than a column."""


DdlKind = Literal["alter", "truncate", "drop", "rename", "replace", "other"]


def ddl_kind(query: str) -> DdlKind:
    """What kind of table DDL a statement is (an ALTER that renames its table counts as a rename)."""
    query = _plain(query)
    if _ALTER_TABLE.match(query):
        return "rename" if alter_columns(query, "").table_renamed_to is not None else "alter"
    if _TRUNCATE.match(query):
        return "truncate"
    if _DROP_TABLE.match(query) and not re.match(rf"^{_COMMENTS}DROP\s+TEMPORARY\b", query, re.I | re.DOTALL):
        return "drop"
    if _RENAME_TABLE.match(query):
        return "rename"
    if _CREATE_TABLE.match(query) and re.match(rf"^{_COMMENTS}CREATE\s+OR\s+REPLACE\b", query, re.I | re.DOTALL):
        return "replace"
    return "other"


def dropped_tables(query: str, default_db: str) -> list[TableName]:
    """The tables a DROP TABLE statement names (none for DROP TEMPORARY TABLE, which drops no captured table)."""
    query = _plain(query)
    head = _DROP_TABLE.match(query)
    if head is None or ddl_kind(query) != "drop":
        return []
    body = re.sub(r"/\*.*?\*/", " ", query[head.end() :], flags=re.DOTALL)
    body = re.sub(r"\s+(?:(?:WAIT\s+\d+|NOWAIT)\s*)?(?:RESTRICT|CASCADE)?\s*$", "", body, flags=re.I)
    return [_table(m["a"], m["b"], default_db) for part in split_top_level(body) if (m := _ONE_TABLE.match(part))]


def renamed_tables(query: str, default_db: str) -> list[tuple[TableName, TableName]]:
    """(old, new) of each table a RENAME TABLE or ALTER TABLE ... RENAME statement renames, in its order."""
    query = _plain(query)
    alter = _ALTER_TABLE.match(query)
    if alter is not None:
        to = alter_columns(query, default_db).table_renamed_to
        return [] if to is None else [(_table(alter["a"], alter["b"], default_db), to)]
    head = _RENAME_TABLE.match(query)
    if head is None:
        return []
    body = re.sub(r"/\*.*?\*/", " ", query[head.end() :], flags=re.DOTALL)
    pairs = []
    for part in split_top_level(body):
        if m := _PAIR.match(part):
            pairs.append((_table(m["a"], m["b"], default_db), _table(m["c"], m["d"], default_db)))
    return pairs


def truncated_table(query: str, default_db: str) -> TableName | None:
    query = _plain(query)
    m = _TRUNCATE.match(query)
    return None if m is None else _table(m["a"], m["b"], default_db)


def ddl_tables(query: str, default_db: str, tables: Iterable[TableName]) -> list[TableName]:
    """The captured tables a DDL statement changes.

    ALTER TABLE, TRUNCATE, DROP TABLE and RENAME TABLE are parsed; for the others (CREATE OR REPLACE, an
    unparsed form) any mention of a captured table's name counts.
    """
    query = _plain(query)
    if not _DDL.match(query):
        return []
    kind = ddl_kind(query)
    named: list[TableName] | None = None
    if kind in ("alter", "rename") and (alter := _ALTER_TABLE.match(query)):
        named = [_table(alter["a"], alter["b"], default_db)]
    elif kind == "truncate":
        named = [t for t in [truncated_table(query, default_db)] if t is not None]
    elif kind == "drop":
        named = dropped_tables(query, default_db)
    elif kind == "rename":
        named = [name for pair in renamed_tables(query, default_db) for name in pair]
    if not named:
        return _mentioned(query, default_db, tables)
    return [t for t in tables if any(_same(t, n) for n in named)]


_PARTITION_ROWS = re.compile(
    r"\b(?:DROP|TRUNCATE|EXCHANGE|CONVERT)\s+PARTITION\b|\bCONVERT\s+TABLE\b.*\bTO\s+PARTITION\b"
    r"|\b(?:DISCARD|IMPORT)\b.*\bTABLESPACE\b",
    re.I | re.DOTALL,
)


def partition_tables(query: str, default_db: str, tables: Iterable[TableName]) -> list[TableName]:
    """The captured tables an ALTER TABLE removes, moves or brings in rows of by whole partitions or tablespaces,
    which the binlog logs as the statement alone: DROP, TRUNCATE, EXCHANGE (with the table it names) and CONVERT
    PARTITION, CONVERT TABLE ... TO PARTITION, DISCARD and IMPORT [PARTITION ...] TABLESPACE. Any mention of a
    captured table's name counts."""
    query = _plain(query)
    if not _ALTER_TABLE.match(query) or not _PARTITION_ROWS.search(_STRING.sub("''", query)):
        return []
    return _mentioned(query, default_db, tables)


def is_ddl(query: str) -> bool:
    """A statement that creates, alters, renames, drops or truncates (a table, or something else)."""
    query = _plain(query)
    return _DDL.match(query) is not None or re.match(rf"^{_COMMENTS}CREATE\b", query, re.I | re.DOTALL) is not None


def created_table(query: str, default_db: str) -> TableName | None:
    """The table a CREATE TABLE statement creates."""
    m = _CREATE_TABLE.match(_plain(query))
    return None if m is None else _table(m["a"], m["b"], default_db)


def named_tables(query: str, default_db: str) -> list[TableName]:
    """The tables a DDL statement gives a name to: CREATE TABLE, RENAME TABLE ... TO, ALTER TABLE ... RENAME.
    A table that appears this way under a name the pipeline matches is copied while the job runs."""
    query = _plain(query)
    if m := _CREATE_TABLE.match(query):
        return [_table(m["a"], m["b"], default_db)]
    return [new for _, new in renamed_tables(query, default_db)]


def statement_tables(query: str, default_db: str, tables: Iterable[TableName]) -> list[TableName]:
    """The captured tables a data-changing statement logged as SQL text may change.

    With binlog_format ROW a change is logged as row events; its SQL text is in the binlog only when the
    session that ran it used STATEMENT or MIXED (a session variable the global check cannot see). Such a
    change cannot be read as rows: any mention of a captured table's name counts.
    """
    return _mentioned(query, default_db, tables) if _DML.match(query) else []


def _mentioned(query: str, default_db: str, tables: Iterable[TableName]) -> list[TableName]:
    names = {
        (quoted.replace("``", "`") or double.replace('""', '"') or bare).lower()
        for quoted, double, bare in _IDENTIFIER.findall(query)
    }
    return [(db, t) for db, t in tables if t.lower() in names and (db == default_db or db.lower() in names)]


# --- online schema change tools --------------------------------------------------------------------------


@dataclass(frozen=True)
class Swap:
    """An online schema change tool's helper table took the name of a captured table: the table's schema change,
    with what the ALTERs of the helper said about columns by name (None: the job did not see them all)."""

    table: TableName
    helper: TableName
    said: AlterColumns | None


CUT_OVER = "cut-over"
"""A captured table renamed to a tool's name for the original, alone (gh-ost's two-step cut-over): the helper
table takes its name in the next statement."""


class OnlineSchemaChanges:
    """Follows the helper tables of online schema changes of captured tables through the binlog's DDL statements.

    A helper created while the job reads is known from its CREATE on; the ALTERs run on it are composed, so its
    swap says which columns it renamed or dropped. One created before (the job started or resumed during the
    migration) is recognized at the swap by its name alone, with `said` None.
    """

    def __init__(self) -> None:
        self._helpers: dict[TableName, AlterColumns] = {}

    def helper(self, table: TableName, captured: Iterable[TableName]) -> OscHelper | None:
        return osc_helper(table[1], [t for db, t in captured if db == table[0]])

    def read(self, query: str, default_db: str, captured: Iterable[TableName]) -> Swap | str | None:
        """What a DDL statement does to an online schema change of a captured table: a `Swap`, `CUT_OVER`, or
        None (nothing, or a step the tool takes on its helper tables only)."""
        query = _plain(query)
        captured = list(captured)
        if m := _CREATE_TABLE.match(query):
            created = _table(m["a"], m["b"], default_db)
            if (h := self.helper(created, captured)) is not None and h.role in ("new", "ghost"):
                self._helpers[created] = AlterColumns()
            return None
        kind = ddl_kind(query)
        if kind == "alter" and (m := _ALTER_TABLE.match(query)):
            altered = _table(m["a"], m["b"], default_db)
            if altered in self._helpers:
                self._helpers[altered] = then(self._helpers[altered], alter_columns(query, default_db))
            return None
        if kind == "drop":
            for name in dropped_tables(query, default_db):
                self._helpers.pop(name, None)
            return None
        if kind != "rename":
            return None
        pairs = renamed_tables(query, default_db)
        for old, new in pairs:
            if any(_same(new, t) for t in captured):
                h = self.helper(old, captured)
                if h is not None and h.role in ("new", "ghost") and _same((old[0], h.base), new):
                    return Swap(new, old, self._helpers.pop(old, None))
        for old, new in pairs:
            if any(_same(old, t) for t in captured) and not any(_same(old, n) for _, n in pairs):
                h = self.helper(new, captured)
                if h is not None and h.role == "old" and _same((new[0], h.base), old):
                    return CUT_OVER
        return None
