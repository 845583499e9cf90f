"""The upsert materializer (MISSION.md; our answer to Flink's SinkUpsertMaterializer, seed 003).

Every change carries its source sequence. Per batch and table, changes are ordered by sequence and
folded into one final state per primary key: the last row image, or a delete. An update that changes
the key becomes a delete of the old key and an upsert of the new one. The result is exact even when
changes arrive shuffled, keeps nothing beyond the batch (Flink keeps every row version forever), and
gives MERGE INTO the one source row per target row it requires.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Key = tuple[Any, ...]
Row = tuple[Any, ...]
# (binlog file number, position of the event's end, row index inside the event)
Sequence_ = tuple[int, int, int]


@dataclass(frozen=True)
class Change:
    """One row change: insert (before is None), delete (after is None) or update (both)."""

    seq: Sequence_
    before: Row | None
    after: Row | None

    @property
    def op(self) -> str:
        if self.before is None:
            return "+I"
        return "-D" if self.after is None else "+U"


def materialize(changes: Iterable[Change], key_positions: Sequence[int]) -> dict[Key, Row | None]:
    """Final state per key: a row to upsert, or None to delete. Input order does not matter."""
    final: dict[Key, Row | None] = {}
    for change in sorted(changes, key=lambda c: c.seq):
        if change.before is not None:
            before_key = tuple(change.before[i] for i in key_positions)
            if change.after is None or tuple(change.after[i] for i in key_positions) != before_key:
                final[before_key] = None
        if change.after is not None:
            final[tuple(change.after[i] for i in key_positions)] = change.after
    return final


def created_keys(changes: Iterable[Change], key_positions: Sequence[int]) -> set[Key]:
    """Keys the batch creates: the first change naming each one makes a row with it (an insert, or an update
    moving a row to it). The source's unique key allows that only for a key absent at that moment, so such a
    key is absent from the table before the batch, and from a target that holds everything before it."""
    seen: set[Key] = set()
    created: set[Key] = set()
    for change in sorted(changes, key=lambda c: c.seq):
        if change.before is not None:
            seen.add(tuple(change.before[i] for i in key_positions))
        if change.after is not None:
            key = tuple(change.after[i] for i in key_positions)
            if key not in seen:
                seen.add(key)
                created.add(key)
    return created
