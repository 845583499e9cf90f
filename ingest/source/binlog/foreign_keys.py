"""Foreign key actions, which InnoDB applies without logging them.

With ROW binlogging, `ON DELETE CASCADE`, `ON DELETE SET NULL`, `ON UPDATE CASCADE` (and SET DEFAULT) change the
child rows inside InnoDB: the binlog holds the parent's row event and nothing for the children. A copy that
follows the binlog alone keeps the children as they were. MySQL 9.6 moved the actions to the SQL layer, which
logs them unless `innodb_native_foreign_keys` is on; MariaDB does not log them.

The reader watches the tables from which an action can reach a captured table (`Actions`). At a delete, or an
update that changes a referenced column, of such a table (unless the event ran with `foreign_key_checks=0`,
when nothing acts), each acting parent row becomes a `KeyAction` of the child, which the batch applies
(ingest.changes.key_actions), when the job can tell exactly which child rows the action reached: the parent's rows
are read (decoded with the schema the job follows when it is captured, else by the column names the server logs
at binlog_row_metadata=FULL: `named_parent_rows`), every table through which the action acts in
turn on captured tables is captured (what it did to their rows is worked out from them at commit, down any number
of foreign keys and through self-references: ingest.query.chains), and the key's columns are integers (compared
by value, never by a collation). Inside an XA transaction the actions count at its commit, with its changes. Any
other acting change stops the reader by name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import pymysql

from ingest.changes.key_actions import inexact_key
from ingest.errors import SourceError
from ingest.model.changes import ForeignKey, KeyAction
from ingest.model.columns import SourceColumn
from ingest.model.schema import TableSchema, quote
from ingest.source.binlog.binlog_values import row_images
from ingest.source.binlog.table_maps import logged_data_type, names_logged

log = logging.getLogger(__name__)

TableKey = tuple[str, str]
UNREAD = "(a rule the job could not read)"
ACTING = frozenset({"CASCADE", "SET NULL", "SET DEFAULT", UNREAD})
NO_FOREIGN_KEY_CHECKS = 0x0002
"""A row event's flag: the statement ran with foreign_key_checks=0, and InnoDB applied no action."""
Images = list[tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]]


class Actions:
    """The parent tables whose deletes or key updates can change captured tables through foreign key actions."""

    def __init__(self, keys: Sequence[ForeignKey], captured: Collection[TableKey]) -> None:
        out: dict[TableKey, list[ForeignKey]] = {}
        for key in keys:
            out.setdefault(key.parent, []).append(key)
        captured = set(captured)

        def reached(child: TableKey) -> frozenset[TableKey]:
            """The captured tables a change of `child` can reach through actions, itself included."""
            return frozenset(_through(child, out) & captured)

        self.watched: dict[TableKey, list[tuple[ForeignKey, frozenset[TableKey]]]] = {}
        """Per parent table: each foreign key out of it whose action reaches captured tables, and those tables."""
        for parent, from_parent in out.items():
            ends = [(key, end) for key in from_parent if (end := reached(key.child))]
            if ends:
                self.watched[parent] = ends
        self.chained: dict[TableKey, list[ForeignKey]] = {
            parent: chained
            for parent, from_parent in out.items()
            if parent in captured and (chained := [k for k in from_parent if k.child in captured])
        }
        """Per captured table: its foreign keys with actions to captured tables (itself too). What an action did to
        its rows acts on theirs in turn, which the batch works out from its rows (ingest.query.chains)."""
        self._unread = {
            child: sorted(t for t in _through(child, out) if t not in captured and reached(t))
            for child in {k.child for k in keys}
        }
        """Per child table: the tables not captured through which an action on it reaches captured tables (their
        rows are unknown, so what the action did in turn is too)."""

    def __bool__(self) -> bool:
        return bool(self.watched)

    def act(
        self,
        table: TableKey,
        kind: str,
        flags: int,
        at: Any,
        key_changed: Callable[[Sequence[str]], bool],
        copied_after: Callable[[TableKey], bool],
        images: Images | None = None,
        schemas: Mapping[TableKey, TableSchema] | None = None,
    ) -> list[KeyAction]:
        """What the foreign key actions of a row event of `table` did to captured tables, as `KeyAction`s; a stop
        when they may have changed captured tables in a way the job cannot apply.

        `key_changed(columns)` says whether an update changed any of the parent's `columns` (True when it cannot
        be told); `copied_after(table)` whether a captured table's snapshot was read after this event. `images`
        are the event's rows, decoded with `schemas[table]`, when the parent is captured."""
        watched = self.watched.get(table)
        if watched is None or kind == "insert" or flags & NO_FOREIGN_KEY_CHECKS:
            return []
        rule = "DELETE" if kind == "delete" else "UPDATE"
        out: list[KeyAction] = []
        for key, ends in watched:
            acting = key.on_delete if kind == "delete" else key.on_update
            if acting not in ACTING:
                continue
            if kind == "update" and not key_changed(key.parent_columns):
                continue
            stale = sorted(f"{db}.{t}" for db, t in ends if not copied_after((db, t)))
            if not stale:
                continue
            why = _why_not(key, acting, self._unread[key.child], images, schemas)
            if not why:
                assert images is not None and schemas is not None
                out.extend(_key_actions(key, acting, kind, at, images, schemas))
                continue
            raise SourceError(
                f"{table[0]}.{table[1]}: the {kind} at binlog position {at} may have changed {', '.join(stale)} "
                f"through the foreign key `{key.name}` of {key.child_id} (ON {rule} {acting}), "
                "and InnoDB does not log what a foreign key action changes: the job cannot apply this one "
                f"({why}), and nothing from the event on was "
                f"applied. Snapshot those tables again (`ingest resnapshot --config ... --table {stale[0]}`), or "
                "make the application change the children itself (the foreign key without its action)"
            )
        return out


def _why_not(
    key: ForeignKey,
    acting: str,
    unread: Sequence[TableKey],
    images: Images | None,
    schemas: Mapping[TableKey, TableSchema] | None,
) -> str:
    """Why the job cannot apply `key`'s action exactly ("" when it can)."""
    if acting not in ("CASCADE", "SET NULL"):
        return f"ON ... {acting}"
    if unread:
        names = ", ".join(f"{db}.{t}" for db, t in unread)
        return f"the action acts in turn through {names}, which is not captured, so its rows are not read"
    if schemas is None:
        return "while a snapshot chunk of the table was read"
    if images is None or key.parent not in schemas:
        return (
            f"{key.parent[0]}.{key.parent[1]} is not captured, and the server does not name the columns of its rows "
            "(binlog_row_metadata=FULL would), so the job cannot read them"
        )
    child, parent = schemas.get(key.child), schemas[key.parent]
    if child is None or not key.child_columns:
        return "the child's key columns are unknown"
    return inexact_key(key, child, parent)


def _through(child: TableKey, out: Mapping[TableKey, Sequence[ForeignKey]]) -> set[TableKey]:
    """Every table an action on `child` can reach in turn (`child` itself, and beyond it)."""
    seen, todo = {child}, [child]
    while todo:
        for key in out.get(todo.pop(), ()):
            if key.child not in seen:  # a self-reference or a cycle ends where it began
                seen.add(key.child)
                todo.append(key.child)
    return seen


def _key_actions(
    key: ForeignKey, acting: str, kind: str, at: Any, images: Images, schemas: Mapping[TableKey, TableSchema]
) -> list[KeyAction]:
    """One `KeyAction` per parent row whose key the event deleted or changed."""
    child, parent = schemas[key.child], schemas[key.parent]
    names = parent.column_names
    referenced = [names.index(c) for c in key.parent_columns]
    columns = tuple(child.column_names.index(c) for c in key.child_columns)
    out = []
    for i, (before, after) in enumerate(images):
        if before is None:
            continue
        old = tuple(before[p] for p in referenced)
        if None in old:
            continue  # no child row refers to a NULL
        if kind == "delete":
            new = None if acting == "CASCADE" else (None,) * len(old)
        else:
            assert after is not None
            moved = tuple(after[p] for p in referenced)
            if moved == old:
                continue
            new = moved if acting == "CASCADE" else (None,) * len(old)
        out.append(KeyAction(child.table_id, at, i, columns, old, new))
    return out


def named_parent_rows(event: Any, kind: str) -> tuple[TableSchema, Images] | None:
    """The rows of a row event of a parent the job does not capture, as images in the order its table map names
    the columns, with a schema of those columns (their names, and integer types as the key check reads them); None
    when the server does not name them (binlog_row_metadata below FULL), so that they could only be matched by a
    position the job does not follow for that table."""
    table = event.table_map.get(event.table_id)
    if table is None or not names_logged(table):
        return None
    columns = []
    for column in table.columns:
        kind_of = logged_data_type(column.type) or "unknown"
        columns.append(SourceColumn(column.name, kind_of, f"{kind_of}{' unsigned' if column.unsigned else ''}", True))
    names = [c.name for c in columns]
    images: Images = []
    for row in event.rows:
        before, after = row_images(kind, row)
        images.append(
            (
                None if before is None else tuple(before[n] for n in names),
                None if after is None else tuple(after[n] for n in names),
            )
        )
    return TableSchema(event.schema, event.table, tuple(columns), (), (), ()), images


def update_changed(event: Any, kind: str) -> Callable[[Sequence[str]], bool]:
    """For `Actions.check`: whether any row of an update event changed one of the columns asked about, by the
    library's rows (True when that cannot be told: a table whose columns the server does not name and the job
    does not decode, or rows the library cannot read)."""

    def changed(columns: Sequence[str]) -> bool:
        try:
            rows = event.rows
        except Exception:  # noqa: BLE001 - rows of a table the job does not decode: assume the worst
            return True
        for row in rows:
            before, after = row_images(kind, row)
            if before is None or after is None or any(c not in before or c not in after for c in columns):
                return True
            if any(before[c] != after[c] for c in columns):
                return True
        return False

    return changed


_KEY_COLUMNS = """
SELECT CONSTRAINT_NAME, REFERENCED_TABLE_SCHEMA, REFERENCED_TABLE_NAME, REFERENCED_COLUMN_NAME, COLUMN_NAME
FROM information_schema.KEY_COLUMN_USAGE
WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND REFERENCED_TABLE_NAME IS NOT NULL
ORDER BY CONSTRAINT_NAME, ORDINAL_POSITION
"""
_RULES = re.compile(
    r"CONSTRAINT `((?:[^`]|``)+)` FOREIGN KEY .*?REFERENCES .*?\)"
    r"(?: ON DELETE (RESTRICT|CASCADE|SET NULL|NO ACTION|SET DEFAULT))?"
    r"(?: ON UPDATE (RESTRICT|CASCADE|SET NULL|NO ACTION|SET DEFAULT))?\s*(?:,|\n|$)"
)


def load_actions(conn: pymysql.connections.Connection[Any], captured: Collection[TableKey]) -> Actions:
    """The foreign keys with actions that can reach the captured tables, as they stand now; none when the server
    logs what the actions change itself.

    Only a captured table's ancestors can reach it: the foreign keys of the captured tables are read, then those
    of the tables they reference, and so on (one query per table, which the server answers from that table
    alone; a table without foreign keys costs one). MariaDB shows REFERENTIAL_CONSTRAINTS, where the rules are,
    only to a user with more than SELECT on the table: the key columns come from KEY_COLUMN_USAGE and the rules
    from SHOW CREATE TABLE, which SELECT allows. A table the CDC user cannot see is not followed."""
    keys: list[ForeignKey] = []
    seen, todo = set(captured), list(captured)
    with conn.cursor() as cur:
        while todo:
            child = todo.pop()
            cur.execute(_KEY_COLUMNS, child)
            columns: dict[str, list[str]] = {}
            own: dict[str, list[str]] = {}
            parents: dict[str, TableKey] = {}
            for name, parent_schema, parent, column, child_column in cur.fetchall():
                parents[str(name)] = (str(parent_schema), str(parent))
                columns.setdefault(str(name), []).append(str(column))
                own.setdefault(str(name), []).append(str(child_column))
            if not parents:
                continue
            cur.execute(f"SHOW CREATE TABLE {quote(child[0])}.{quote(child[1])}")
            rules = {
                m[1].replace("``", "`"): (m[2] or "RESTRICT", m[3] or "RESTRICT")
                for m in _RULES.finditer(str(cur.fetchone()[1]))
            }
            for name, parent in parents.items():
                # A rule the statement does not show as expected is taken as acting: a stop, never a silent miss.
                on_delete, on_update = rules.get(name, (UNREAD, UNREAD))
                if on_delete in ACTING or on_update in ACTING:
                    keys.append(
                        ForeignKey(name, child, parent, tuple(columns[name]), on_delete, on_update, tuple(own[name]))
                    )
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
    if keys and server_logs_actions(conn):  # asked only when there is something to watch
        return Actions((), captured)
    return Actions(keys, captured)


def server_logs_actions(conn: pymysql.connections.Connection[Any]) -> bool:
    """MySQL 9.6 and later apply foreign key actions in the SQL layer and log them, unless
    `innodb_native_foreign_keys` is on; MariaDB does not log them."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        (version,) = cur.fetchone()
        text = str(version)
        if "mariadb" in text.lower():
            return False
        major_minor = tuple(int(part) for part in text.split("-")[0].split(".")[:2])
        if major_minor < (9, 6):
            return False
        cur.execute("SHOW GLOBAL VARIABLES LIKE 'innodb_native_foreign_keys'")
        row = cur.fetchone()
    return row is None or str(row[1]).upper() != "ON"
