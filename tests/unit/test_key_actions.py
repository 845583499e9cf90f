"""Unit tests of ingest.changes.key_actions: foreign key actions applied to a child's changes and rows in binlog
order (issue 40)."""

from __future__ import annotations

from typing import Any

import pytest

from ingest.changes.key_actions import act_on_changes, acted, actions_in_turn, inexact_key
from ingest.changes.materializer import Change, materialize
from ingest.errors import SourceError
from ingest.model.changes import ForeignKey, KeyAction, RowChange
from ingest.model.columns import SourceColumn
from ingest.model.position import BinlogPosition
from ingest.model.schema import TableSchema
from ingest.query.batch import Pending
from ingest.query.chains import commit_order

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


def _schema(table: str, *columns: tuple[str, str]) -> TableSchema:
    cols = tuple(SourceColumn(name, kind, kind, True) for name, kind in columns)
    return TableSchema("db", table, cols, (columns[0][0],), (columns[0][0],), (None,))


ORDERS = _schema("ord", ("id", "int"), ("cust", "int"))
ITEMS = _schema("item", ("id", "int"), ("note", "varchar"), ("ord", "int"))


def _key(on_delete: str, on_update: str = "RESTRICT") -> ForeignKey:
    return ForeignKey("fk_item", ("db", "item"), ("db", "ord"), ("id",), on_delete, on_update, ("ord",))


def test_rows_an_action_deleted_or_re_keyed_act_in_turn_one_step_further_at_the_same_place() -> None:
    root = KeyAction("db.ord", at(50), 3, (1,), (9,), None, step=2)
    reached = [
        (root, (4, 9), None),  # deleted: ON DELETE acts on the items of order 4
        (root, (5, 9), (5, 10)),  # its own key kept: nothing refers to `cust`
        (root, (None, 9), None),  # a NULL is referred to by nothing
    ]
    (deleted,) = actions_in_turn(_key("CASCADE"), ORDERS, ITEMS, reached)
    assert deleted == KeyAction("db.item", at(50), 3, (2,), (4,), None, step=3)
    assert deleted.order > root.order
    (nulled,) = actions_in_turn(_key("SET NULL"), ORDERS, ITEMS, reached)
    assert nulled.new == (None,)
    assert actions_in_turn(_key("RESTRICT"), ORDERS, ITEMS, reached) == []  # InnoDB refused such statements
    moved = [(root, (4, 9), (6, 9))]
    assert actions_in_turn(_key("CASCADE", "CASCADE"), ORDERS, ITEMS, moved)[0][3:6] == ((2,), (4,), (6,))
    assert actions_in_turn(_key("CASCADE", "SET NULL"), ORDERS, ITEMS, moved)[0].new == (None,)
    with pytest.raises(SourceError, match="through the foreign key `fk_item` \\(SET DEFAULT\\)"):
        actions_in_turn(_key("SET DEFAULT"), ORDERS, ITEMS, reached)


def test_act_on_changes_tells_which_rows_each_action_reached() -> None:
    reached: list[Any] = []
    act_on_changes([change(10, None, (7, 1, "x")), change(11, None, (8, 2, "y"))], [cascade(20, 1)], (0,), reached)
    assert reached == [(cascade(20, 1), (7, 1, "x"), None)]


def test_the_job_compares_only_integer_keys_as_mysql_does() -> None:
    assert inexact_key(_key("CASCADE"), ITEMS, ORDERS) == ""
    text = ForeignKey("k", ("db", "item"), ("db", "ord"), ("id",), "CASCADE", "CASCADE", ("note",))
    assert inexact_key(text, ITEMS, ORDERS) == "the key column db.item.note is not an integer"


def _held(*children: str) -> Pending:
    keys = [ForeignKey("k", ("db", c), ("db", "x"), ("id",), "CASCADE", "CASCADE", ("p",)) for c in children]
    return Pending([], [], {}, keys)


def test_tables_commit_in_order_after_the_tables_their_rows_act_on_and_a_cycle_stops() -> None:
    pending = {"db.ord": _held("item"), "db.item": _held("tag", "item"), "db.tag": _held(), "db.cat": _held("cat")}
    assert commit_order(pending) == ["db.cat", "db.ord", "db.item", "db.tag"]  # parents first; reversed to commit
    with pytest.raises(SourceError, match="in a cycle between db.a, db.b"):
        commit_order({"db.a": _held("b"), "db.b": _held("a")})


def test_the_target_rows_steps_found_by_index_are_those_of_every_action_in_order() -> None:
    """act_on_target finds each action that reaches a target row by the values it starts from (thousands of rows
    and actions in a batch: a pass over every action per row was quadratic). The steps are those of applying every
    action in turn, for moves, nulls and deletes, a composite key beside a single one, and a position bound."""
    import random

    from ingest.sink.key_actions import ActionIndex, acted_steps

    rng = random.Random(7)
    actions = []
    for pos in range(1, 400):
        columns = rng.choice([(1,), (1, 2)])
        old = tuple(rng.randrange(6) for _ in columns)
        new = rng.choice([None, tuple(rng.randrange(6) for _ in columns), (None,) * len(columns)])
        actions.append(KeyAction(CHILD, at(pos), 0, columns, old, new))
    index = ActionIndex(actions)
    for key in range(300):
        row = (key, rng.choice([None, *range(6)]), rng.randrange(6))
        high = rng.choice([None, at(rng.randrange(400))])
        expected, current = [], row
        for action in actions:
            if current is None or (high is not None and action.position <= high):
                continue
            after = acted(current, (action,))
            if after != current:
                expected.append((action, current, after))
                current = after
        assert [tuple(s) for s in acted_steps(row, index, high)] == expected
