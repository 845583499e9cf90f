"""What the binlog says happened, as both sides see it: row changes, transactions, DDL statements; and the rows
they become in the tables beside a target (changelog rows, rejected values), which the changes make and the sink
writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ingest.model.position import BinlogPosition, MariadbGtidPos

TableName = tuple[str, str]
"""(database, table)"""


@dataclass(frozen=True)
class AlterColumns:
    """What one ALTER TABLE says about its columns by name (the rest is read from the server afterwards)."""

    renamed: dict[str, str] = field(default_factory=dict)
    """old name -> new name (RENAME COLUMN, and CHANGE to another name)"""
    dropped: tuple[str, ...] = ()
    table_renamed_to: TableName | None = None
    """ALTER TABLE ... RENAME TO: the table's new name."""
    reads_again: tuple[str, ...] = ()
    """Why the old rows' new values cannot be derived from the statement (`ingest.source.binlog.alter_rule`)."""
    numbered: tuple[str, ...] = ()
    """Columns made AUTO_INCREMENT (names after the statement): the server numbered old rows holding 0 or NULL."""
    strict: bool = False
    """It ran under a strict sql_mode without IGNORE, so no conversion changed a value without failing it."""


class RowChange(NamedTuple):
    """One row change (a tuple: the reader makes one per binlog row, so it is cheap to build)."""

    table_id: str
    position: BinlogPosition
    """End of the row event that carried this change."""
    row_index: int
    before: tuple[Any, ...] | None
    after: tuple[Any, ...] | None


@dataclass(frozen=True)
class ForeignKey:
    """A foreign key with an action: `child` references `parent`."""

    name: str
    child: TableName
    parent: TableName
    parent_columns: tuple[str, ...]
    on_delete: str
    on_update: str
    child_columns: tuple[str, ...] = ()

    @property
    def child_id(self) -> str:
        """The child table's id (`TableSchema.table_id`)."""
        return f"{self.child[0]}.{self.child[1]}"


class KeyAction(NamedTuple):
    """What a foreign key action of InnoDB did to a captured child table, unlogged, at a parent's row change: every
    row whose foreign key columns held `old` was deleted (`new` None) or got `new` there (SET NULL: all None)."""

    table_id: str
    """The child table."""
    position: BinlogPosition
    """End of the parent's row event."""
    row_index: int
    """The parent row's place in its event."""
    columns: tuple[int, ...]
    """The child's foreign key columns, by place in its rows."""
    old: tuple[Any, ...]
    new: tuple[Any, ...] | None
    step: int = 0
    """0 for the action of the parent's row change; n for one InnoDB took in turn, n foreign keys further down (a
    child's row the action deleted or re-keyed, acting on the grandchild rows that refer to it). Actions of one
    parent row apply in this order."""

    @property
    def order(self) -> tuple[BinlogPosition, int, int]:
        return (self.position, self.row_index, self.step)


@dataclass(slots=True)  # (made per transaction: half the cost to build)
class Transaction:
    """The row changes of one committed transaction to captured tables, and where it ends."""

    end: BinlogPosition
    gtid: str | None = None
    changes: list[RowChange] = field(default_factory=list)
    commit_time: int = 0
    """Seconds since the epoch, from the commit event's header."""
    gtid_after: MariadbGtidPos | None = None
    """The server's GTID position once this transaction is applied (MariaDB; None where not tracked)."""
    actions: list[KeyAction] = field(default_factory=list)
    """What foreign key actions did to captured tables without row events (ingest.source.binlog.foreign_keys)."""


@dataclass(frozen=True)
class DdlStatement:
    """A DDL statement on captured tables; it is a transaction of its own, from `start` to `end`."""

    query: str
    tables: tuple[tuple[str, str], ...]
    start: BinlogPosition
    end: BinlogPosition
    gtid_after: MariadbGtidPos | None = None
    """The server's GTID position right after the statement (MariaDB; None where not tracked)."""
    kind: str = "alter"
    """One of FOLLOWED; or, when the reader is to `recopy`, the `ddl.ddl_kind` of a statement it cannot follow."""
    said: AlterColumns | None = None
    """What the statement (for a swap: the ALTERs of the helper table) says of columns by name; None: unknown."""


@dataclass(frozen=True)
class TablesNamed:
    """A DDL statement that gave tables names the pipeline matches, tables it does not capture (a CREATE TABLE
    or a RENAME while the job runs); a transaction of its own, ending at `end`."""

    tables: tuple[tuple[str, str], ...]
    end: BinlogPosition
    gtid_after: MariadbGtidPos | None = None


def changes_in(item: Any) -> int:
    """Row changes in one item of `BinlogReader.transactions` (a DDL statement holds none)."""
    return len(item.changes) if isinstance(item, Transaction) else 0


@dataclass(frozen=True)
class ChangelogRow:
    """One row of a changelog table: the row image and what happened to it, where and when."""

    op: str
    seq: str
    position: str
    """`file:pos` of the end of the row event, as the binlog names it."""
    gtid: str | None
    commit_time: int
    """Seconds since the epoch: the source transaction's commit event header."""
    image: tuple[Any, ...]


@dataclass(frozen=True)
class RejectedValue:
    """One row of a rejected table: a value of a binlog row image that was not written to the target."""

    key_json: str
    column: str
    raw: str
    reason: str
    position: str
    """`file:pos` of the end of the row event, as the binlog names it."""
    seq: str
    """The changelog's sequence of the row image (binlog order); with `column`, the row's identity."""
    gtid: str | None
    commit_time: int | None
    """The source transaction's commit time, epoch seconds (None for a value read by the snapshot)."""
    phase: str = "binlog"
    """`binlog`, or `snapshot` for a value a chunk read."""
    chunk_index: int | None = None
    """The chunk that read it (snapshot phase)."""
