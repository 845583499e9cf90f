"""Unit tests of ingest.changes.key_actions: foreign key actions applied to a child's changes and rows in binlog
order (issue 40)."""

from __future__ import annotations

from typing import Any

from ingest.changes.key_actions import act_on_changes, acted
from ingest.changes.materializer import Change, materialize
from ingest.model.changes import KeyAction, RowChange
from ingest.model.position import BinlogPosition

CHILD = "db.c"
FK = (1,)  # rows are (id, pid, v)


def at(pos: int) -> BinlogPosition:
    return BinlogPosition("bin.000001", pos)


def change(pos: int, before: Any, after: Any) -> RowChange:
    return RowChange(CHILD, at(pos), 0, before, after)


def cascade(pos: int, old: int, new: int | None = None) -> KeyAction:
    return KeyAction(CHILD, at(pos), 0, FK, (old,), None if new is None else (new,))


def set_null(pos: int, old: int) -> KeyAction:
    return KeyAction(CHILD, at(pos), 0, FK, (old,), (None,))


def final(changes: list[RowChange]) -> dict[Any, Any]:
    return materialize(
        [Change((c.position.file_number, c.position.pos, c.row_index), c.before, c.after) for c in changes], (0,)
    )


def test_a_row_that_refers_to_the_parent_is_deleted_nulled_or_moved_and_one_that_does_not_is_kept() -> None:
    row = (7, 1, "x")
    assert acted(row, [cascade(10, 1)]) is None
    assert acted(row, [set_null(10, 1)]) == (7, None, "x")
    assert acted(row, [cascade(10, 1, 5)]) == (7, 5, "x")
    assert acted(row, [cascade(10, 2)]) == row
    assert acted((7, None, "x"), [set_null(10, 1), cascade(11, 1)]) == (7, None, "x")  # NULL refers to nothing


def test_actions_apply_in_order_so_a_moved_reference_is_followed_by_a_later_action() -> None:
    row = (7, 1, "x")
    assert acted(row, [cascade(10, 1, 2), cascade(11, 2)]) is None
    assert acted(row, [cascade(10, 2), cascade(11, 1, 2)]) == (7, 2, "x")  # the delete of 2 came before the move


def test_a_key_the_batch_changed_before_the_action_gets_a_change_at_the_action() -> None:
    changes = [change(5, None, (1, 1, "new")), change(6, (2, 1, "a"), (2, 1, "b"))]
    out = act_on_changes(changes, [cascade(10, 1)], (0,))
    assert out[:2] == changes
    assert sorted(out[2:]) == [
        RowChange(CHILD, at(10), 0, (1, 1, "new"), None),
        RowChange(CHILD, at(10), 0, (2, 1, "b"), None),
    ]
    assert final(out) == {(1,): None, (2,): None}


def test_a_key_changed_after_the_action_already_shows_it_and_gets_no_change_of_it() -> None:
    # Row 3 referred to parent 1; the action nulled it, unlogged; the update after it shows pid NULL.
    changes = [change(20, (3, None, "a"), (3, None, "b"))]
    assert act_on_changes(changes, [set_null(10, 1)], (0,)) == changes


def test_a_key_moved_away_or_deleted_before_the_action_is_not_acted_on() -> None:
    changes = [change(5, (1, 1, "a"), (9, 1, "a")), change(6, (2, 1, "b"), None)]
    out = act_on_changes(changes, [set_null(10, 1)], (0,))
    assert final(out) == {(1,): None, (9,): (9, None, "a"), (2,): None}


def test_actions_and_changes_interleave_by_binlog_place() -> None:
    changes = [
        change(5, None, (1, 1, "a")),  # refers to parent 1
        change(15, (1, 2, "a"), (1, 2, "b")),  # after the move: the before image shows pid 2
        change(25, None, (2, 2, "c")),  # a new row of parent 2, after its delete
    ]
    out = act_on_changes(changes, [cascade(10, 1, 2), cascade(20, 2)], (0,))
    assert [(c.position.pos, c.before, c.after) for c in out] == [
        (5, None, (1, 1, "a")),
        (10, (1, 1, "a"), (1, 2, "a")),
        (15, (1, 2, "a"), (1, 2, "b")),
        (20, (1, 2, "b"), None),
        (25, None, (2, 2, "c")),
    ]


def test_every_key_of_a_large_batch_that_refers_to_a_deleted_parent_goes_and_the_others_stay() -> None:
    changes = [change(1, None, (k, k % 1000, "v")) for k in range(20_000)]  # looked up by value, not row by row
    actions = [cascade(10 + p, p) for p in range(0, 1000, 2)]
    rows = final(act_on_changes(changes, actions, (0,)))
    assert [k for (k,), row in rows.items() if row is not None] == [k for k in range(20_000) if k % 2]
