"""Foreign key actions applied at commit to the target's rows of keys the batch does not change.

InnoDB deleted, nulled or re-keyed child rows the binlog never names (ingest.source.binlog.foreign_keys); the batch
applied the actions to the keys it changes itself (ingest.changes.key_actions). Every other row an action reached
is in the target as it was before the batch: those rows are read from it (a filter on the values the actions
start from, then an exact match here), acted on in binlog order, and join the batch's rows, so that one MERGE
commits all of it with the batch's offset.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from ingest.changes.key_actions import acted
from ingest.model.changes import KeyAction
from ingest.model.columns import quote_identifier
from ingest.model.schema import TableSchema, source_targets
from ingest.sink.merge import OP_COLUMN, batch_where
from ingest.sink.pruning import target_predicate


class ActedRow(NamedTuple):
    """One action's change of a target row the batch does not change: its images as the target holds them
    (Iceberg-side values, every column), for the changelog."""

    action: KeyAction
    before: tuple[Any, ...]
    after: tuple[Any, ...] | None


def act_on_target(
    spark: Any,
    target: str,
    schema: TableSchema,
    rows: pa.Table,
    actions: Sequence[KeyAction],
    read_at: Callable[[tuple[Any, ...]], Any] | None = None,
) -> tuple[pa.Table, str | None, list[ActedRow]]:
    """The batch's `rows` (`batch_arrow`) and, for every row of `target` the actions reach whose key `rows` does
    not hold, its delete or its new row; with what of the target a MERGE of them all reads, and each action's
    change of those rows in binlog order (for a changelog).

    `read_at(key)`, when given, is the high watermark of the snapshot chunk a key's row came from: an action at or
    before it is in that row already (the chunk was read after it), so only the later ones act on the row."""
    names = schema.column_names
    keys = schema.primary_key
    held = set(zip(*(rows.column(k).to_pylist() for k in keys), strict=True))
    found = _reached(spark, target, schema, [c for c in rows.column_names if c != OP_COLUMN], actions)
    read = sorted({c for a in actions for c in a.columns} | set(schema.primary_key_positions()))
    gone, moved = [], []
    new_values: dict[int, list[Any]] = defaultdict(list)
    steps: list[ActedRow] = []
    index = ActionIndex(actions)
    for i, found_row in enumerate(found.to_pylist()):
        row = tuple(found_row[n] for n in names)
        key = tuple(row[p] for p in schema.primary_key_positions())
        if key in held:
            continue  # the batch changes this key: its row is in `rows`, acted on in binlog order
        high = None if read_at is None else read_at(key)
        own = acted_steps(row, index, high)
        steps += own
        after = own[-1].after if own else row
        if after is None:
            gone.append(i)
        elif after != row:
            moved.append(i)
            for c in read:
                new_values[c].append(after[c])
    parts = [rows]
    if gone:
        parts.append(_with_op(found.take(gone), "D", rows.schema))
    if moved:
        changed = found.take(moved)
        for c, column in new_values.items():
            at = changed.schema.get_field_index(names[c])
            changed = changed.set_column(at, changed.schema.field(at), pa.array(column, changed.schema.field(at).type))
        parts.append(_with_op(changed, "U", rows.schema))
    out = pa.concat_tables(parts)
    all_keys = list(zip(*(out.column(k).to_pylist() for k in keys), strict=True))
    return out, batch_where(schema, all_keys), sorted(steps, key=lambda s: s.action.order)


class ActionIndex:
    """Actions by the values they start from (per set of columns they look at), each with its place in their
    order: finding the next action that reaches a row is a lookup per set of columns, not a pass over every
    action (thousands of target rows and of actions in one batch)."""

    def __init__(self, actions: Sequence[KeyAction]) -> None:
        self.column_sets = sorted({a.columns for a in actions})
        self.by_start: dict[tuple[tuple[int, ...], tuple[Any, ...]], list[tuple[int, KeyAction]]] = defaultdict(list)
        for i, action in enumerate(actions):
            self.by_start[(action.columns, tuple(action.old))].append((i, action))

    def next_reaching(self, row: tuple[Any, ...], after: int, high: Any) -> tuple[int, KeyAction] | None:
        """The first action after place `after` (and after binlog position `high`, when given) that refers to
        `row`, with its place."""
        best: tuple[int, KeyAction] | None = None
        for columns in self.column_sets:
            values = tuple(row[c] for c in columns)
            if None in values:
                continue  # MATCH SIMPLE: a NULL refers to nothing
            for i, action in self.by_start.get((columns, values), ()):
                if i > after and (high is None or action.position > high):
                    best = (i, action) if best is None or i < best[0] else best
                    break
        return best


def acted_steps(row: tuple[Any, ...], index: ActionIndex, high: Any) -> list[ActedRow]:
    """Each action's change of `row` (every column), in their order, until one deletes it (`high`: only actions
    after that binlog position, when given)."""
    steps = []
    current: tuple[Any, ...] | None = row
    place = -1
    while current is not None:
        found = index.next_reaching(current, place, high)
        if found is None:
            break
        place, action = found
        after = acted(current, (action,))
        if after != current:
            steps.append(ActedRow(action, current, after))
            current = after
    return steps


def _with_op(table: pa.Table, op: str, schema: pa.Schema) -> pa.Table:
    return table.append_column(OP_COLUMN, pa.array([op] * table.num_rows, pa.string())).cast(schema)


def _reached(
    spark: Any, target: str, schema: TableSchema, columns: list[str], actions: Sequence[KeyAction]
) -> pa.Table:
    """The target's rows that may refer to a parent row of `actions`: per set of foreign key columns, the values
    the actions start from (a superset: `acted` matches exactly)."""
    targets = source_targets(schema)
    starts: dict[tuple[int, ...], set[tuple[Any, ...]]] = defaultdict(set)
    for action in actions:
        starts[action.columns].add(action.old)
    terms = []
    for positions, olds in starts.items():
        term = target_predicate(targets, [schema.column_names[c] for c in positions], olds)
        terms.append(f"({term})" if term is not None else "TRUE")
    select = ", ".join(f"t.{quote_identifier(c)}" for c in columns)
    return spark.sql(f"SELECT {select} FROM {target} t WHERE {' OR '.join(terms)}").toArrow()
