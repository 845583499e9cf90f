"""How the server groups binlog events into transactions, and which events the reader refuses.

A transaction is an event group: MariaDB's GTID event (MySQL: a BEGIN query) opens it, and an XID event, a
COMMIT query or an XA decision closes it. Statements inside a group do not close it: SAVEPOINT (the server cuts
what a ROLLBACK TO SAVEPOINT undid before logging the group), XA END, and DML of tables logged as text. An XA
transaction is two groups: its rows end at XA PREPARE, and XA COMMIT or XA ROLLBACK comes later as a group of
its own.

The reader is an allow-list: an event that can change rows and that it does not apply stops it with a message
that names the event (`refuse_event`), instead of being filtered out by its class.
"""

from __future__ import annotations

import re
from typing import Any, Literal, NamedTuple

from ingest.errors import SourceError

FL_STANDALONE = 0x01
"""MariaDB GTID event flag: the group has no BEGIN (a DDL statement, or a statement of its own)."""
FL_PREPARED_XA = 0x40
"""MariaDB GTID event flag: the group is an XA transaction's first half, up to XA PREPARE."""

Control = Literal[
    "begin",
    "commit",
    "rollback",
    "savepoint",
    "rollback to savepoint",
    "xa start",
    "xa end",
    "xa commit",
    "xa rollback",
]

_COMMENTS = r"(?:\s|/\*.*?\*/)*"
_CONTROL_PATTERNS: tuple[tuple[str, Control], ...] = (
    (r"(?:BEGIN|START\s+TRANSACTION)\b", "begin"),
    (r"COMMIT\b", "commit"),
    (r"ROLLBACK\s+(?:WORK\s+)?TO\b", "rollback to savepoint"),
    (r"ROLLBACK\b", "rollback"),
    (r"(?:RELEASE\s+)?SAVEPOINT\b", "savepoint"),
    (r"XA\s+(?:START|BEGIN)\b", "xa start"),
    (r"XA\s+END\b", "xa end"),
    (r"XA\s+COMMIT\b", "xa commit"),
    (r"XA\s+ROLLBACK\b", "xa rollback"),
)
_CONTROL = tuple(
    (re.compile(rf"^{_COMMENTS}{pattern}", re.IGNORECASE | re.DOTALL), control)
    for pattern, control in _CONTROL_PATTERNS
)


def control_statement(query: str) -> Control | None:
    """The transaction control statement a query event holds; None for any other statement."""
    for pattern, control in _CONTROL:
        if pattern.match(query):
            return control
    return None


def group_flags(flags: int) -> tuple[bool, bool]:
    """From a MariaDB GTID event's flags: whether the group is a transaction with a commit to come, and whether
    it is an XA transaction's first half."""
    return not flags & FL_STANDALONE, bool(flags & FL_PREPARED_XA)


class XaId(NamedTuple):
    """An XA transaction's id: format id, global transaction id and branch qualifier (bytes)."""

    format_id: int
    gtrid: bytes
    bqual: bytes

    def __str__(self) -> str:
        return f"X'{self.gtrid.hex()}',X'{self.bqual.hex()}',{self.format_id}"

    @classmethod
    def of(cls, event: Any) -> XaId:
        """The id an XA_PREPARE event carries."""
        return cls(event.xid_format_id, event.xid_gtrid, event.xid_bqual)


_XID = re.compile(
    r"^\s*XA\s+(?:COMMIT|ROLLBACK)\s+X'(?P<gtrid>[0-9a-f]*)'\s*,\s*X'(?P<bqual>[0-9a-f]*)'\s*,\s*(?P<format>\d+)",
    re.IGNORECASE,
)


_ONE_PHASE = re.compile(r"\bONE\s+PHASE\s*$", re.IGNORECASE)


def one_phase(query: str) -> bool:
    """An XA COMMIT ... ONE PHASE: it commits the group it ends, which was never prepared."""
    return _ONE_PHASE.search(query.strip().rstrip(";")) is not None


def xa_statement_id(query: str, at: object) -> XaId:
    """The id an XA COMMIT or XA ROLLBACK query event names (the server logs it in hexadecimal)."""
    m = _XID.match(query)
    if m is None:
        raise SourceError(
            f"the XA statement at binlog position {at} names its transaction in a form the job does not read "
            f"({query[:200]!r}). Nothing from it on was applied"
        )
    return XaId(int(m["format"]), bytes.fromhex(m["gtrid"]), bytes.fromhex(m["bqual"]))


# Event types the library does not parse (`NotImplementedEvent`) that change no rows.
_CARRY_NO_ROWS = {
    0x1C: "IGNORABLE_LOG_EVENT",
    0x22: "ANONYMOUS_GTID_LOG_EVENT",
    0x24: "TRANSACTION_CONTEXT_EVENT",
    0x25: "VIEW_CHANGE_EVENT",
    0x29: "HEARTBEAT_LOG_EVENT_V2",
    0x2A: "GTID_TAGGED_LOG_EVENT",
}
_NAMES = {
    0x01: "START_EVENT_V3",
    0x06: "LOAD_EVENT",
    0x08: "CREATE_FILE_EVENT",
    0x09: "APPEND_BLOCK_EVENT",
    0x0A: "EXEC_LOAD_EVENT",
    0x0B: "DELETE_FILE_EVENT",
    0x0C: "NEW_LOAD_EVENT",
    0x14: "PRE_GA_WRITE_ROWS_EVENT",
    0x15: "PRE_GA_UPDATE_ROWS_EVENT",
    0x16: "PRE_GA_DELETE_ROWS_EVENT",
    0x1A: "INCIDENT_EVENT",
    0x28: "TRANSACTION_PAYLOAD_EVENT",
}
_WAY_OUT = {
    0x28: "The server writes compressed transactions (binlog_transaction_compression=ON), which the job does "
    "not read yet: turn it off",
    0x1A: "The server logged an incident: events may be missing from the binlog here (as a replica would, the "
    "job stops). Snapshot the captured tables again",
}


def refuse_event(event: Any, at: object, tables: set[tuple[str, str]]) -> None:
    """Stop at an event the reader does not apply, unless it changes no captured rows."""
    kind = event.event_type
    if kind in _CARRY_NO_ROWS:
        return
    if hasattr(event, "table") and (event.schema, event.table) not in tables:
        return  # a partial JSON update of a table not captured
    if hasattr(event, "table"):
        name = "PARTIAL_UPDATE_ROWS_EVENT"
        way_out = "The server logs partial JSON updates (binlog_row_value_options=PARTIAL_JSON): turn it off"
    elif kind == 0x12:
        name = "EXECUTE_LOAD_QUERY_EVENT"
        way_out = "A LOAD DATA was logged as a statement (binlog_format STATEMENT or MIXED): make every writer log rows"
    else:
        name = _NAMES.get(kind, f"type {kind:#04x}")
        way_out = _WAY_OUT.get(kind, "The job does not read this kind of event")
    raise SourceError(
        f"the binlog event at position {at} is a {name}, which can change rows without row events the job reads. "
        f"Nothing from it on was applied. {way_out}, then snapshot the captured tables it may have changed again "
        "(`ingest resnapshot --config ... --table DB.T`)"
    )


def refuse_rolled_back(query: str, at: object, table_id: str) -> SourceError:
    """A ROLLBACK (or ROLLBACK TO SAVEPOINT) logged inside a group that holds captured changes: the server logs
    one only when the group also changed a non-transactional table, and which of its rows stand then depends on
    each table's engine."""
    return SourceError(
        f"{table_id}: the transaction ending at binlog position {at} was rolled back ({query[:100]!r}) after it "
        "changed captured rows and a table without transactions (MyISAM, Aria, MEMORY): which of its changes "
        "stand depends on each table's engine, and none was applied. Snapshot the table again "
        f"(`ingest resnapshot --config ... --table {table_id}`), and keep non-transactional tables out of "
        "transactions that change captured ones"
    )
