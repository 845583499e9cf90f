"""Foreign key actions that act in turn, worked out on the driver from the rows they reached.

When an action deletes or re-keys rows of a captured table, InnoDB applies that table's own foreign key actions to
the rows that refer to them: a grandchild's, further down, or the table's own rows through a self-reference. None
of it is logged. The source leaves the batch's parts of such tables `Pending` (ingest.query.batch); here each is
finished with the actions known so far (`finish_part`, then `act_on_target` for the target's rows they reach). The
rows each action changed, before and after, give the actions its table's foreign keys take in turn
(`actions_in_turn`), one step further at the same place in the binlog. The tables whose actions changed are
finished again until none changes: as many rounds as the actions went levels deep (InnoDB stops a statement past
15).

A table's rows as they were at an action are its target's and the batch's changes before it only when every chunk
of it was read before the action: an action whose rows act on a table with rows read before it, on a table not
wholly read before it, stops the job. So does a cycle of foreign keys between two tables, whose commits could not
be ordered (below).

The tables an action acts on in turn commit before the tables whose rows acted (`commit_order`): a crash between
their commits replays the batch while the acting tables' targets still hold their rows as they were before it, and
the tables that hold the batch skip it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from ingest.changes.key_actions import actions_in_turn, inexact_key
from ingest.config import StreamConfig, Targets
from ingest.errors import SourceError
from ingest.model.changes import ForeignKey, KeyAction
from ingest.model.position import BinlogPosition
from ingest.query.batch import Pending, TableBatch, TableStream, actions_to_apply, finish_part, held_floor
from ingest.sink.changelog import with_acted_rows
from ingest.sink.key_actions import act_on_target

MAX_ROUNDS = 17
"""InnoDB applies foreign key actions 15 levels deep at most (it fails the statement beyond): a round per level,
and one to find that nothing changes."""

Reached = list[tuple[KeyAction, tuple[Any, ...], tuple[Any, ...] | None]]


def settle_chains(
    spark: Any,
    targets: Targets,
    stream: StreamConfig,
    tables: Mapping[str, TableStream],
    prepared: Sequence[TableBatch],
    end: BinlogPosition,
) -> list[TableBatch]:
    """`prepared` with every `Pending` part finished (or left out when its table holds the batch or it writes
    nothing), in the order to commit them: the parts of other tables first, then the pending ones, the tables
    actions reach in turn before the tables whose rows acted."""
    pending = {p.table_id: p.pending for p in prepared if p.pending is not None}
    if not pending:
        return list(prepared)
    order = commit_order(pending)
    # A table holding the batch was committed after every table its rows act on: nothing left to work out.
    live = [t for t in order if not _holds(tables[t], end)]
    finished: dict[str, tuple[frozenset[KeyAction], TableBatch | None, Reached]] = {}
    derived: dict[str, set[KeyAction]] = {}
    for _ in range(MAX_ROUNDS):
        for table_id in live:
            held = pending[table_id]
            actions = frozenset(held.actions) | derived.get(table_id, set())
            if table_id not in finished or finished[table_id][0] != actions:
                finished[table_id] = (actions, *_finish(spark, targets, stream, tables[table_id], held, actions))
        now: dict[str, set[KeyAction]] = defaultdict(set)
        for table_id in live:
            actions, _, reached = finished[table_id]
            for key in pending[table_id].keys:
                child_id = key.child_id
                if child_id not in live:
                    continue  # it holds the batch already
                parent, child = tables[table_id], tables[child_id]
                more = actions_in_turn(key, parent.schema, child.schema, reached)
                _check_in_turn(key, parent, child, actions, more)
                now[child_id].update(more)
        if now == derived:
            break
        derived = dict(now)
    else:
        raise SourceError(
            f"foreign key actions of the batch ending at {end} kept acting in turn on {', '.join(live)} after "
            f"{MAX_ROUNDS} rounds, deeper than InnoDB goes: nothing of the batch was applied"
        )
    done = [finished[t][1] for t in reversed(live)]
    return [p for p in prepared if p.pending is None] + [p for p in done if p is not None]


def _finish(
    spark: Any,
    targets: Targets,
    stream: StreamConfig,
    table: TableStream,
    held: Pending,
    actions: frozenset[KeyAction],
) -> tuple[TableBatch | None, Reached]:
    """The table's part with `actions` applied to the batch's rows and to the target's, and every row they
    changed (before, after) with the action that changed it."""
    ordered = sorted(actions, key=lambda a: a.order)
    applied = actions_to_apply(table, ordered, held_floor(table))
    reached: Reached = []
    part = finish_part(targets, stream, table, list(held.changes), applied, held.origins.__getitem__, reached)
    if part is None or not applied:
        return part, reached
    assert part.rows is not None
    read_at = table.read_at() if table.chunks_by_value else None
    part.rows, part.where, acted = act_on_target(spark, table.target, table.schema, part.rows, applied, read_at)
    if table.changelog is not None and acted:
        part.changelog = with_acted_rows(table.schema, part.changelog, acted, part.action_origins)
    part.target_acted = True
    reached += [(a.action, a.before, a.after) for a in acted]
    return part, reached


def _check_in_turn(
    key: ForeignKey, parent: TableStream, child: TableStream, actions: frozenset[KeyAction], more: Sequence[KeyAction]
) -> None:
    """Stop where the actions `key` takes in turn cannot be known exactly: values compared by a collation or
    rounding, or the parent's rows at an action unknown while the child holds rows read before it."""
    if more:
        why = inexact_key(key, child.schema, parent.schema)
        if why:
            raise SourceError(
                f"{parent.schema.table_id}: a foreign key action at binlog position {more[0].position} acted in "
                f"turn on {child.schema.table_id} through the foreign key `{key.name}`, and the job cannot apply it "
                f"({why}): nothing from there on was applied. Snapshot the table again "
                f"(`ingest resnapshot --config ... --table {child.schema.table_id}`)"
            )
    for action in actions:
        at = action.position
        child_read_before = child.min_high is not None and at > child.min_high
        parent_whole = parent.max_high is not None and at > parent.max_high
        if child_read_before and not parent_whole:
            raise SourceError(
                f"{parent.schema.table_id}: a foreign key action at binlog position {at} changed its rows while its "
                f"snapshot was read, and they may act in turn on rows of {child.schema.table_id} (foreign key "
                f"`{key.name}`) read before it: the job cannot tell which, and nothing from there on was applied. "
                f"Snapshot both again (`ingest resnapshot --config ... --table {parent.schema.table_id} --table "
                f"{child.schema.table_id}`)"
            )


def commit_order(pending: Mapping[str, Pending]) -> list[str]:
    """The pending tables, each before the tables its rows act on (a self-reference aside); a stop at a cycle."""
    parents: dict[str, set[str]] = {t: set() for t in pending}
    for table_id, held in pending.items():
        for key in held.keys:
            child_id = key.child_id
            if child_id != table_id and child_id in parents:
                parents[child_id].add(table_id)
    order: list[str] = []
    ready = sorted(t for t, p in parents.items() if not p)
    while ready:
        table_id = ready.pop(0)
        order.append(table_id)
        for other in sorted(parents):
            if table_id in parents[other]:
                parents[other].discard(table_id)
                if not parents[other] and other not in order and other not in ready:
                    ready.append(other)
    if len(order) < len(pending):
        cycle = ", ".join(sorted(set(pending) - set(order)))
        raise SourceError(
            f"foreign keys with actions refer to each other in a cycle between {cycle}, and a batch's actions act on "
            "them in turn: the job cannot order their commits so that a crash between them replays exactly, and "
            "nothing from the batch on was applied. Make the application change those rows itself (the foreign "
            "keys without their actions), or stop capturing one of the tables"
        )
    return order


def _holds(table: TableStream, end: BinlogPosition) -> bool:
    return table.committed is not None and table.committed >= end
