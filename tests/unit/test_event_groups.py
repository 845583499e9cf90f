"""Event groups and foreign key actions: the pure logic under the binlog reader's allow-list (no server)."""

from __future__ import annotations

from typing import Any

import pytest

from ingest.errors import SourceError
from ingest.source.binlog.event_groups import (
    XaId,
    control_statement,
    group_flags,
    one_phase,
    refuse_event,
    xa_statement_id,
)
from ingest.source.binlog.foreign_keys import NO_FOREIGN_KEY_CHECKS, Actions, ForeignKey


@pytest.mark.parametrize(
    ("query", "control"),
    [
        ("BEGIN", "begin"),
        ("/* app */ START TRANSACTION", "begin"),
        ("COMMIT", "commit"),
        ("SAVEPOINT `s1`", "savepoint"),
        ("RELEASE SAVEPOINT s1", "savepoint"),
        ("ROLLBACK TO `s1`", "rollback to savepoint"),
        ("ROLLBACK WORK TO SAVEPOINT s1", "rollback to savepoint"),
        ("ROLLBACK", "rollback"),
        ("XA START X'7831',X'',1", "xa start"),
        ("XA END X'7831',X'',1", "xa end"),
        ("XA COMMIT X'7831',X'',1", "xa commit"),
        ("XA ROLLBACK X'7831',X'',1", "xa rollback"),
        ("UPDATE t SET v = 1", None),
        ("ALTER TABLE t ADD COLUMN c INT", None),
        ("COMMITTED_ORDERS_REFRESH()", None),
    ],
)
def test_transaction_control_statements(query: str, control: str | None) -> None:
    assert control_statement(query) == control


def test_xa_ids_as_the_server_logs_them() -> None:
    assert xa_statement_id("XA COMMIT X'7831',X'',1", "here") == XaId(1, b"x1", b"")
    assert xa_statement_id("XA ROLLBACK X'6162',X'63',7", "here") == XaId(7, b"ab", b"c")
    assert str(XaId(1, b"x1", b"")) == "X'7831',X'',1"
    with pytest.raises(SourceError, match="at binlog position here names its transaction in a form"):
        xa_statement_id("XA COMMIT 'plain'", "here")
    assert one_phase("XA COMMIT X'7831',X'',1 ONE PHASE")
    assert not one_phase("XA COMMIT X'7831',X'',1")


def test_gtid_flags() -> None:
    assert group_flags(0x01) == (False, False)  # standalone: a DDL
    assert group_flags(0x0C) == (True, False)  # transactional, parallel
    assert group_flags(0x4C) == (True, True)  # an XA transaction's first half


class _Event:
    def __init__(self, event_type: int, **fields: Any) -> None:
        self.event_type = event_type
        self.__dict__.update(fields)


def test_events_that_carry_no_rows_pass_and_the_others_stop_by_name() -> None:
    refuse_event(_Event(0x22), "p", set())  # ANONYMOUS_GTID_LOG_EVENT
    refuse_event(_Event(0x27, schema="d", table="other"), "p", {("d", "t")})  # a partial update of another table
    with pytest.raises(SourceError, match="TRANSACTION_PAYLOAD_EVENT.*binlog_transaction_compression"):
        refuse_event(_Event(0x28), "p", set())
    with pytest.raises(SourceError, match="PARTIAL_UPDATE_ROWS_EVENT"):
        refuse_event(_Event(0x27, schema="d", table="t"), "p", {("d", "t")})
    with pytest.raises(SourceError, match="type 0x99"):
        refuse_event(_Event(0x99), "p", set())


def _key(name: str, child: str, parent: str, on_delete: str = "CASCADE", on_update: str = "RESTRICT") -> ForeignKey:
    return ForeignKey(name, ("d", child), ("d", parent), ("id",), on_delete, on_update)


def test_actions_reach_captured_tables_through_tables_not_captured_and_stop_at_cycles() -> None:
    keys = [
        _key("a", "mid", "top"),
        _key("b", "leaf", "mid", on_delete="SET NULL"),
        _key("c", "tree", "tree"),
        _key("x", "one", "two"),
        _key("y", "two", "one"),
    ]
    actions = Actions(keys, [("d", "leaf"), ("d", "tree")])
    assert set(actions.watched) == {("d", "top"), ("d", "mid"), ("d", "tree")}
    assert not Actions(keys, [("d", "top")])  # nothing reaches a table that only references nothing


def _check(actions: Actions, table: str, kind: str, flags: int = 0, changed: bool = True, copied: bool = False) -> None:
    actions.act(("d", table), kind, flags, "here", lambda columns: changed, lambda table: copied)


def test_a_change_stops_only_when_its_rule_acts_and_reaches_a_table_not_copied_after_it() -> None:
    actions = Actions([_key("k", "child", "parent", on_delete="CASCADE", on_update="RESTRICT")], [("d", "child")])
    with pytest.raises(SourceError, match=r"d.child through the foreign key `k` of d.child \(ON DELETE CASCADE\)"):
        _check(actions, "parent", "delete")
    _check(actions, "parent", "update")  # ON UPDATE RESTRICT: nothing acts
    _check(actions, "parent", "insert")
    _check(actions, "parent", "delete", flags=NO_FOREIGN_KEY_CHECKS)
    _check(actions, "parent", "delete", copied=True)  # the child's snapshot was read after the change
    _check(actions, "other", "delete")
    updates = Actions([_key("u", "child", "parent", on_delete="RESTRICT", on_update="CASCADE")], [("d", "child")])
    _check(updates, "parent", "update", changed=False)  # no referenced column changed
    with pytest.raises(SourceError, match="ON UPDATE CASCADE"):
        _check(updates, "parent", "update")
