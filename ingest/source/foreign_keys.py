"""Foreign key actions, which InnoDB applies without logging them.

With ROW binlogging, `ON DELETE CASCADE`, `ON DELETE SET NULL`, `ON UPDATE CASCADE` (and SET DEFAULT) change the
child rows inside InnoDB: the binlog holds the parent's row event and nothing for the children. A copy that
follows the binlog alone keeps the children as they were. MySQL 9.6 moved the actions to the SQL layer, which
logs them unless `innodb_native_foreign_keys` is on; MariaDB does not log them.

The reader watches the tables from which an action can reach a captured table (`Actions`): a delete, or an
update that changes a referenced column, of such a table stops it by name at that row event (unless the event
ran with `foreign_key_checks=0`, when nothing cascades). Applying the actions instead is not built yet.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql

from ingest.errors import SourceError
from ingest.model.schema import quote
from ingest.source.binlog_values import row_images

log = logging.getLogger(__name__)

TableKey = tuple[str, str]
UNREAD = "(a rule the job could not read)"
ACTING = frozenset({"CASCADE", "SET NULL", "SET DEFAULT", UNREAD})
NO_FOREIGN_KEY_CHECKS = 0x0002
"""A row event's flag: the statement ran with foreign_key_checks=0, and InnoDB applied no action."""


@dataclass(frozen=True)
class ForeignKey:
    """A foreign key with an action: `child` references `parent`."""

    name: str
    child: TableKey
    parent: TableKey
    parent_columns: tuple[str, ...]
    on_delete: str
    on_update: str


class Actions:
    """The parent tables whose deletes or key updates can change captured tables through foreign key actions."""

    def __init__(self, keys: Sequence[ForeignKey], captured: Collection[TableKey]) -> None:
        out: dict[TableKey, list[ForeignKey]] = {}
        for key in keys:
            out.setdefault(key.parent, []).append(key)
        captured = set(captured)

        def reached(child: TableKey) -> frozenset[TableKey]:
            """The captured tables a change of `child` can reach through actions, itself included."""
            found, seen, todo = set(), {child}, [child]
            while todo:
                table = todo.pop()
                if table in captured:
                    found.add(table)
                for key in out.get(table, ()):
                    if key.child not in seen:  # a self-reference or a cycle ends where it began
                        seen.add(key.child)
                        todo.append(key.child)
            return frozenset(found)

        self.watched: dict[TableKey, list[tuple[ForeignKey, frozenset[TableKey]]]] = {}
        """Per parent table: each foreign key out of it whose action reaches captured tables, and those tables."""
        for parent, from_parent in out.items():
            ends = [(key, end) for key in from_parent if (end := reached(key.child))]
            if ends:
                self.watched[parent] = ends

    def __bool__(self) -> bool:
        return bool(self.watched)

    def check(
        self,
        table: TableKey,
        kind: str,
        flags: int,
        at: object,
        key_changed: Callable[[Sequence[str]], bool],
        copied_after: Callable[[TableKey], bool],
    ) -> None:
        """Stop at a row event of `table` whose foreign key actions may have changed captured tables.

        `key_changed(columns)` says whether an update changed any of the parent's `columns` (True when it cannot
        be told); `copied_after(table)` whether a captured table's snapshot was read after this event."""
        watched = self.watched.get(table)
        if watched is None or kind == "insert" or flags & NO_FOREIGN_KEY_CHECKS:
            return
        rule = "DELETE" if kind == "delete" else "UPDATE"
        for key, ends in watched:
            acting = key.on_delete if kind == "delete" else key.on_update
            if acting not in ACTING:
                continue
            if kind == "update" and not key_changed(key.parent_columns):
                continue
            stale = sorted(f"{db}.{t}" for db, t in ends if not copied_after((db, t)))
            if stale:
                raise SourceError(
                    f"{table[0]}.{table[1]}: the {kind} at binlog position {at} may have changed {', '.join(stale)} "
                    f"through the foreign key `{key.name}` of {key.child[0]}.{key.child[1]} (ON {rule} {acting}), "
                    "and InnoDB does not log what a foreign key "
                    "action changes: the job cannot apply it, and nothing from the event on was applied. Snapshot "
                    f"those tables again (`ingest resnapshot --config ... --table {stale[0]}`), or make the "
                    "application change the children itself (the foreign key without its action)"
                )


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
SELECT CONSTRAINT_NAME, REFERENCED_TABLE_SCHEMA, REFERENCED_TABLE_NAME, REFERENCED_COLUMN_NAME
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
            parents: dict[str, TableKey] = {}
            for name, parent_schema, parent, column in cur.fetchall():
                parents[str(name)] = (str(parent_schema), str(parent))
                columns.setdefault(str(name), []).append(str(column))
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
                    keys.append(ForeignKey(name, child, parent, tuple(columns[name]), on_delete, on_update))
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
