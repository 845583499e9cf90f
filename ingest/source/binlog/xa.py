"""XA transactions in the binlog: the first half, up to XA PREPARE, is held until its decision; XA COMMIT
applies it at the commit's position, XA ROLLBACK drops it."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ingest.model.changes import KeyAction, RowChange, Transaction
from ingest.model.position import BinlogPosition
from ingest.source.binlog.event_groups import XaId, one_phase, xa_statement_id


class Prepared(NamedTuple):
    """What the first half of an XA transaction did to captured tables, held until its decision."""

    changes: list[RowChange]
    actions: list[KeyAction]


class XaHold:
    """The captured changes and foreign key actions of each XA transaction prepared in the binlog read so far and
    not yet decided. `read_back(xid, end)` reads a transaction prepared before the reader's start, decided at
    `end`, back from the binlog."""

    def __init__(self, read_back: Callable[[XaId, BinlogPosition], Prepared]) -> None:
        self._read_back = read_back
        self._prepared: dict[XaId, Prepared] = {}
        self.stop_after: XaId | None = None
        """Set on a reader that only reads back one prepared XA transaction (`read_prepared`)."""

    def prepare(self, xid: XaId, current: Transaction | None) -> bool:
        """XA PREPARE of `xid`: what its first half did (`current`) is held. True: the reader was only to read back
        this one."""
        self._prepared[xid] = Prepared([], []) if current is None else Prepared(current.changes, current.actions)
        return xid == self.stop_after

    def held(self, xid: XaId) -> Prepared:
        return self._prepared.get(xid, Prepared([], []))

    def decide(
        self,
        query: str,
        control: str,
        current: Transaction | None,
        end: BinlogPosition,
        contained: Callable[[str], BinlogPosition | None],
    ) -> Transaction | None:
        """XA COMMIT or XA ROLLBACK of a prepared XA transaction: its held changes, as a transaction ending here
        (a commit), or none (a rollback). `contained(table_id)`: up to where the snapshot's chunks hold every change
        of the table (a change committed before is left out)."""
        transaction = current if current is not None else Transaction(end)
        if one_phase(query):  # XA COMMIT ... ONE PHASE: the group's own changes, never prepared
            held = Prepared(list(transaction.changes), list(transaction.actions))
            transaction.changes.clear()
            transaction.actions.clear()
        else:
            xid = xa_statement_id(query, end)
            found = self._prepared.pop(xid, None)
            if control == "xa rollback":
                return current
            if found is None:  # prepared before this reader's start (it resumed between prepare and decision)
                found = self._read_back(xid, end)
            held = found
        # The changes and actions count at the commit, in their order: renumbered there, so that the actions stay
        # between the changes they came between (ingest.changes.key_actions orders by position and row).
        ordered = sorted(
            [(c.position, c.row_index, 0, c) for c in held.changes]
            + [(a.position, a.row_index, 1, a) for a in held.actions],
            key=lambda item: item[:3],
        )
        for *_, item in ordered:
            row = len(transaction.changes) + len(transaction.actions)
            if isinstance(item, KeyAction):
                transaction.actions.append(item._replace(position=end, row_index=row))
                continue
            bound = contained(item.table_id)
            if bound is None or end > bound:  # else committed before the chunks that hold it were read
                transaction.changes.append(RowChange(item.table_id, end, row, item.before, item.after))
        return transaction
