"""The upsert materializer (MISSION.md; our answer to Flink's SinkUpsertMaterializer, seed 003).

Every change carries its source sequence. Per batch and table, changes are ordered by sequence and
folded into one final state per primary key: the last row image, or a delete. An update that changes
the key becomes a delete of the old key and an upsert of the new one. The result is exact even when
changes arrive shuffled, keeps nothing beyond the batch (Flink keeps every row version forever), and
gives MERGE INTO the one source row per target row it requires.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Key = tuple[Any, ...]
Row = tuple[Any, ...]
# (binlog file number, position of the event's end, row index inside the event)
Sequence_ = tuple[int, int, int]


class Change:
    """One row change: insert (before is None), delete (after is None) or update (both).

    A plain class with slots: one is built per binlog row of a batch, and this is the cheapest object
    to build that a weak reference can still watch (the tests prove the materializer keeps none).
    """

    __slots__ = ("seq", "before", "after", "__weakref__")

    def __init__(self, seq: Sequence_, before: Row | None, after: Row | None) -> None:
        self.seq = seq
        self.before = before
        self.after = after

    def __repr__(self) -> str:
        return f"Change({self.seq!r}, {self.before!r}, {self.after!r})"

    @property
    def op(self) -> str:
        if self.before is None:
            return "+I"
        return "-D" if self.after is None else "+U"


def key_getter(key_positions: Sequence[int]) -> Callable[[Row], Key]:
    """The key of a row image, always as a tuple (itemgetter gives a bare value for one position)."""
    if len(key_positions) == 1:
        position = key_positions[0]
        return lambda row: (row[position],)
    return operator.itemgetter(*key_positions)


def _by_seq(change: Change) -> Sequence_:
    return change.seq


def materialize(changes: Iterable[Change], key_positions: Sequence[int]) -> dict[Key, Row | None]:
    """Final state per key: a row to upsert, or None to delete. Input order does not matter."""
    key_of = key_getter(key_positions)
    final: dict[Key, Row | None] = {}
    for change in sorted(changes, key=_by_seq):
        if change.before is not None:
            before_key = key_of(change.before)
            if change.after is None or key_of(change.after) != before_key:
                final[before_key] = None
        if change.after is not None:
            final[key_of(change.after)] = change.after
    return final


def created_keys(changes: Iterable[Change], key_positions: Sequence[int]) -> set[Key]:
    """Keys the batch creates: the first change naming each one makes a row with it (an insert, or an update
    moving a row to it). The source's unique key allows that only for a key absent at that moment, so such a
    key is absent from the table before the batch, and from a target that holds everything before it."""
    key_of = key_getter(key_positions)
    seen: set[Key] = set()
    created: set[Key] = set()
    for change in sorted(changes, key=_by_seq):
        if change.before is not None:
            seen.add(key_of(change.before))
        if change.after is not None:
            key = key_of(change.after)
            if key not in seen:
                seen.add(key)
                created.add(key)
    return created
