"""Foreign key actions InnoDB applied without logging them, applied to a child table's changes and rows.

A parent's delete or key update that acts (ON DELETE CASCADE / SET NULL, ON UPDATE CASCADE / SET NULL) changes the
child rows that refer to it, and the binlog holds nothing for them (ingest.source.foreign_keys). The reader turns
each acting parent row into a `KeyAction` of the child. A batch applies them in binlog order: to the keys the
batch itself changes before an action, as changes of their own at the action's place (`act_on_changes`), so that
the materializer folds them like any change; to the rows of every other key at commit, where the target holds
them as they were before the batch (`acted`, ingest.sink.key_actions).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ingest.changes.materializer import Key, Row, key_getter
from ingest.model.changes import KeyAction, RowChange


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
    changes: Sequence[RowChange], actions: Sequence[KeyAction], key_positions: Sequence[int]
) -> list[RowChange]:
    """One table's `changes` in binlog order, with a change of each key the batch changed before an action and
    whose row then refers to it: the row before and after the action, at the action's place.

    A key the batch changes only after an action needs none: its row event's before image already shows what
    the action did. Keys the batch does not change are left to the commit (`acted` on the target's rows)."""
    if not actions:
        return list(changes)
    key_of = key_getter(key_positions)
    ordered: list[tuple[Any, int, int, RowChange | KeyAction]] = [
        *((c.position, c.row_index, 0, c) for c in changes),
        *((a.position, a.row_index, 1, a) for a in actions),
    ]
    ordered.sort(key=lambda item: item[:3])
    current = _Rows()
    out: list[RowChange] = []
    for *_, item in ordered:
        if isinstance(item, KeyAction):
            for key, row in current.referring(item):
                after = acted(row, (item,))
                out.append(RowChange(item.table_id, item.position, item.row_index, row, after))
                current.put(key, after)
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
