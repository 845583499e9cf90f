"""Foreign key actions InnoDB applied without logging them, applied to a child table's changes and rows.

A parent's delete or key update that acts (ON DELETE CASCADE / SET NULL, ON UPDATE CASCADE / SET NULL) changes the
child rows that refer to it, and the binlog holds nothing for them (ingest.source.binlog.foreign_keys). The reader turns
each acting parent row into a `KeyAction` of the child. A batch applies them in binlog order: to the keys the
batch itself changes before an action, as changes of their own at the action's place (`act_on_changes`), so that
the materializer folds them like any change; to the rows of every other key at commit, where the target holds
them as they were before the batch (`acted`, ingest.sink.key_actions).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ingest.changes.materializer import Key, Row, key_getter
from ingest.errors import SourceError
from ingest.model.changes import ForeignKey, KeyAction, RowChange
from ingest.model.schema import TableSchema

EXACT_KEY_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint"})
"""Column types whose values the job compares as MySQL does (no collation, no rounding): integers that Iceberg
holds as integers (BIGINT UNSIGNED is a decimal there)."""


def refers(row: Row, action: KeyAction) -> bool:
    """Whether `row` refers to the parent row of `action` (MATCH SIMPLE: a NULL in its key refers to nothing)."""
    return all(row[c] is not None and row[c] == v for c, v in zip(action.columns, action.old, strict=True))


def acted(row: Row | None, actions: Iterable[KeyAction]) -> Row | None:
    """`row` after `actions`, in their order: None once one deletes it."""
    for action in actions:
        if row is None:
            return None
        if refers(row, action):
            row = None if action.new is None else _set(row, action.columns, action.new)
    return row


def _set(row: Row, columns: Sequence[int], values: Sequence[Any]) -> Row:
    out = list(row)
    for c, v in zip(columns, values, strict=True):
        out[c] = v
    return tuple(out)


def act_on_changes(
    changes: Sequence[RowChange],
    actions: Sequence[KeyAction],
    key_positions: Sequence[int],
    reached: list[tuple[KeyAction, Row, Row | None]] | None = None,
) -> list[RowChange]:
    """One table's `changes` in binlog order, with a change of each key the batch changed before an action and
    whose row then refers to it: the row before and after the action, at the action's place (also added to
    `reached`, with the action, when given).

    A key the batch changes only after an action needs none: its row event's before image already shows what
    the action did. Keys the batch does not change are left to the commit (`acted` on the target's rows)."""
    if not actions:
        return list(changes)
    key_of = key_getter(key_positions)
    ordered: list[tuple[Any, int, int, int, RowChange | KeyAction]] = [
        *((c.position, c.row_index, 0, 0, c) for c in changes),
        *((a.position, a.row_index, 1, a.step, a) for a in actions),
    ]
    ordered.sort(key=lambda item: item[:4])
    current = _Rows()
    out: list[RowChange] = []
    for *_, item in ordered:
        if isinstance(item, KeyAction):
            for key, row in current.referring(item):
                after = acted(row, (item,))
                out.append(RowChange(item.table_id, item.position, item.row_index, row, after))
                current.put(key, after)
                if reached is not None:
                    reached.append((item, row, after))
        else:
            out.append(item)
            if item.before is not None:
                current.put(key_of(item.before), None)
            if item.after is not None:
                current.put(key_of(item.after), item.after)
    return out


class _Rows:
    """The rows of the keys a batch changed so far, found by the values of the columns an action looks at (one
    index per set of columns, made when first asked): a batch of many rows and many actions stays linear."""

    def __init__(self) -> None:
        self.rows: dict[Key, Row] = {}
        self.indexes: dict[tuple[int, ...], dict[tuple[Any, ...], set[Key]]] = {}

    def put(self, key: Key, row: Row | None) -> None:
        old = self.rows.pop(key, None)
        for columns, index in self.indexes.items():
            if old is not None:
                index.get(tuple(old[c] for c in columns), set()).discard(key)
            if row is not None:
                index.setdefault(tuple(row[c] for c in columns), set()).add(key)
        if row is not None:
            self.rows[key] = row

    def referring(self, action: KeyAction) -> list[tuple[Key, Row]]:
        index = self.indexes.get(action.columns)
        if index is None:
            index = self.indexes[action.columns] = {}
            for key, row in self.rows.items():
                index.setdefault(tuple(row[c] for c in action.columns), set()).add(key)
        found = [(key, self.rows[key]) for key in index.get(tuple(action.old), ())]
        return [(key, row) for key, row in found if refers(row, action)]


def inexact_key(key: ForeignKey, child: TableSchema, parent: TableSchema) -> str:
    """Why the job cannot compare `key`'s values as MySQL does ("" when it can: integers on both sides)."""
    for schema, names in ((child, key.child_columns), (parent, key.parent_columns)):
        for name in names:
            column = next((c for c in schema.columns if c.name == name), None)
            if column is None or column.data_type not in EXACT_KEY_TYPES or "bigint unsigned" in column.column_type:
                return f"the key column {schema.table_id}.{name} is not an integer"
    return ""


def actions_in_turn(
    key: ForeignKey,
    parent: TableSchema,
    child: TableSchema,
    reached: Sequence[tuple[KeyAction, Row, Row | None]],
) -> list[KeyAction]:
    """The actions `key` took in turn on `child` when actions deleted or re-keyed rows of `parent` (`reached`: each
    action with a row it reached, before and after): one per row whose referenced values went (ON DELETE) or
    changed (ON UPDATE), at that action's place one step further. A rule that does not act takes none (InnoDB
    would have refused the statement had a row referred to it)."""
    referenced = [parent.column_names.index(c) for c in key.parent_columns]
    columns = tuple(child.column_names.index(c) for c in key.child_columns)
    out = []
    for action, before, after in reached:
        old = tuple(before[p] for p in referenced)
        if None in old:
            continue  # no row refers to a NULL
        if after is None:
            rule, moved = key.on_delete, None
        else:
            rule, moved = key.on_update, tuple(after[p] for p in referenced)
            if moved == old:
                continue
        if rule in ("RESTRICT", "NO ACTION"):
            continue
        if rule not in ("CASCADE", "SET NULL"):
            raise SourceError(
                f"{parent.table_id}: the foreign key action at binlog position {action.position} acted in turn on "
                f"{child.table_id} through the foreign key `{key.name}` ({rule}), which the job cannot apply, and "
                f"InnoDB does not log what it changed: nothing from there on was applied. Snapshot the table again "
                f"(`ingest resnapshot --config ... --table {child.table_id}`)"
            )
        new = moved if rule == "CASCADE" else (None,) * len(old)
        out.append(KeyAction(child.table_id, action.position, action.row_index, columns, old, new, action.step + 1))
    return out
