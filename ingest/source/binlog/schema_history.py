"""The schema a captured table had right after a DDL statement when later statements changed it again.

The server shows only its newest schema. When the job follows a DDL while later DDL on the same table is already
in the binlog (the job was down during a migration, or runs as a step every hour), the schema in between is
derived from the statements' text (`after_first`): each ALTER's clauses move the table's columns (added, dropped,
renamed, moved, redefined), and a column's definition at the first statement is known exactly when it comes from
the schema the job had before (`old`), or from the server's newest schema when no later statement redefines it.
The live schema is the check at the end: the statements must lead from `old`'s columns to the server's, by name
and order, with every column no statement redefined unchanged. Anything else, a clause not understood included, is
a reason given back, never a guess. A column defined by the first statement and redefined by a later one would
need its type read from the text: that is refused too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ingest.model.columns import SourceColumn
from ingest.model.schema import TableSchema
from ingest.source.binlog.alter_rule import NAME, unquote
from ingest.source.binlog.ddl import NOT_A_COLUMN, alter_clauses, dropped_column
from ingest.source.binlog.partitions import changes_partitions_only

_POSITION = re.compile(rf"\s+(?:FIRST|AFTER\s+(?P<after>{NAME}))\s*$", re.I)
_ADD = re.compile(rf"^ADD\s+(?:COLUMN\s+)?(?P<if>IF\s+NOT\s+EXISTS\s+)?(?P<a>{NAME})\s+\S", re.I)
_CHANGE = re.compile(rf"^CHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?(?P<a>{NAME})\s+(?P<b>{NAME})\s+\S", re.I)
_MODIFY = re.compile(rf"^MODIFY\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?(?P<a>{NAME})\s+\S", re.I)
_RENAME = re.compile(rf"^RENAME\s+COLUMN\s+(?:IF\s+EXISTS\s+)?(?P<a>{NAME})\s+TO\s+(?P<b>{NAME})\s*$", re.I)
_ALTER = re.compile(
    rf"^ALTER\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?(?P<a>{NAME})\s+(?:SET|DROP)\s+(?:DEFAULT|VISIBLE|INVISIBLE)\b", re.I
)
_KEYS = re.compile(
    r"^(?:ADD|DROP)\s+(?:CONSTRAINT\b.*?\s+)?(?:PRIMARY|UNIQUE|INDEX|KEY|FULLTEXT|SPATIAL|FOREIGN|CONSTRAINT|CHECK)\b"
    r"|^RENAME\s+(?:INDEX|KEY)\b|^ALTER\s+(?:INDEX|KEY|CHECK|CONSTRAINT)\b|^(?:ENABLE|DISABLE)\s+KEYS$",
    re.I | re.DOTALL,
)
_KEY_CHANGE = re.compile(r"^(?:ADD|DROP)\s+(?:CONSTRAINT\b.*?\s+)?(?:PRIMARY|UNIQUE)\b|^DROP\s+(?:INDEX|KEY)\b", re.I)
_OPTION = re.compile(
    r"^(?:ALGORITHM|LOCK|ENGINE|AUTO_INCREMENT|COMMENT|ROW_FORMAT|KEY_BLOCK_SIZE|STATS_\w+|PACK_KEYS|CHECKSUM"
    r"|DELAY_KEY_WRITE|AVG_ROW_LENGTH|MAX_ROWS|MIN_ROWS|PAGE_CHECKSUM|TRANSACTIONAL|(?:DEFAULT\s+)?(?:CHARSET|"
    r"CHARACTER\s+SET|COLLATE))\b|^FORCE$",
    re.I,
)


@dataclass
class _Slot:
    """One column through the statements."""

    name: str
    old: str | None
    """Its name in `old`, when it is `old`'s column and no statement so far redefined it."""
    defined_at: int | None = None
    """The statement that (re)defined it last (None: `old`'s definition)."""
    redefined_later: bool = False
    """A statement after the first redefined it."""
    gone: bool = False


def after_first(old: TableSchema, statements: Sequence[str], live: TableSchema) -> TableSchema | str:
    """The schema right after `statements[0]`, given the later `statements[1:]` on the same table and the server's
    schema now (`live`); or why it cannot be known exactly."""
    slots = [_Slot(c.name, c.name) for c in old.columns]
    first: list[tuple[_Slot, str, int | None]] = []
    key_changes: list[int] = []
    for k, statement in enumerate(statements):
        why = _apply(slots, statement, k, key_changes)
        if why:
            return f"statement {k + 1} of {len(statements)} ({statement[:120]!r}): {why}"
        if k == 0:
            first = [(slot, slot.name, slot.defined_at) for slot in slots]
    final = [slot.name for slot in slots]
    if [n.lower() for n in final] != [n.lower() for n in live.column_names]:
        return f"the statements lead to columns {final}, but the server has {list(live.column_names)}"
    live_columns = {c.name.lower(): c for c in live.columns}
    old_columns = {c.name: c for c in old.columns}
    for slot in slots:  # a column no statement redefined must be as it was
        if slot.defined_at is None and slot.old is not None:
            if dataclasses.replace(live_columns[slot.name.lower()], name=slot.old) != old_columns[slot.old]:
                return f"column {slot.name!r} changed without a statement that says so"
    columns: list[SourceColumn] = []
    for slot, name, defined_at in first:
        if defined_at is None:
            assert slot.old is not None
            column = old_columns[slot.old]
        elif slot.redefined_later or slot.gone:
            return f"column {name!r} is defined by the first statement and changed again later: its type in between"
        else:
            column = live_columns[slot.name.lower()]
        columns.append(dataclasses.replace(column, name=name))
    named = [(slot, name) for slot, name, _ in first]
    return _with_keys(old, live, columns, named, key_changes)


def _with_keys(
    old: TableSchema,
    live: TableSchema,
    columns: list[SourceColumn],
    first: list[tuple[_Slot, str]],
    key_changes: list[int],
) -> TableSchema | str:
    """The schema after the first statement with its keys: `old`'s while no statement changed keys, the server's
    when only the first did; both by the names after the first statement."""
    to_first = {slot.name.lower(): name for slot, name in first if not slot.gone}
    from_old = {slot.old: name for slot, name in first if slot.old is not None}
    if any(k > 0 for k in key_changes) and 0 in key_changes:
        return "the keys changed in the first statement and again later"
    if 0 in key_changes:
        names = [to_first.get(n.lower()) for n in live.chunk_key + live.primary_key]
        if None in names:
            return "a key column of the server's schema is not one the first statement left"
        return dataclasses.replace(
            live,
            columns=tuple(columns),
            primary_key=tuple(to_first[n.lower()] for n in live.primary_key),
            chunk_key=tuple(to_first[n.lower()] for n in live.chunk_key),
        )
    keys = [from_old.get(n) for n in old.chunk_key + old.primary_key]
    if None in keys:
        return "a key column was renamed or redefined"
    if not key_changes:  # the server's keys must be old's, by the names the statements lead to
        final = {slot.old: slot.name.lower() for slot, _ in first if slot.old is not None}
        if [final.get(n) for n in old.primary_key] != [n.lower() for n in live.primary_key]:
            return "the primary key changed without a statement that says so"
    return dataclasses.replace(
        old,
        columns=tuple(columns),
        primary_key=tuple(from_old[n] for n in old.primary_key),
        chunk_key=tuple(from_old[n] for n in old.chunk_key),
    )


def _apply(slots: list[_Slot], statement: str, k: int, key_changes: list[int]) -> str:
    """Move `slots` through one statement's clauses; a reason when a clause is not understood ("" when all are)."""
    clauses = alter_clauses(statement)
    if clauses is None:
        return "not an ALTER TABLE of its columns"
    if changes_partitions_only(statement):
        return ""  # partitions hold rows; the columns stay
    for clause in clauses:
        why = _clause(slots, clause, k, key_changes)
        if why:
            return why
    return ""


def _find(slots: list[_Slot], written: str) -> _Slot | None:
    name = unquote(written).lower()
    return next((s for s in slots if s.name.lower() == name), None)


def _redefine(slot: _Slot, k: int) -> None:
    slot.defined_at = k
    if k > 0:
        slot.redefined_later = True


def _move(slots: list[_Slot], slot: _Slot, clause: str) -> str:
    """Place `slot` where the clause's FIRST or AFTER says; why not, if it cannot."""
    where = _POSITION.search(clause)
    if where is None:
        return ""
    slots.remove(slot)
    if where["after"] is None:
        slots.insert(0, slot)
        return ""
    after = _find(slots, where["after"])
    if after is None:
        return f"AFTER {where['after']}: no such column"
    slots.insert(slots.index(after) + 1, slot)
    return ""


def _clause(slots: list[_Slot], clause: str, k: int, key_changes: list[int]) -> str:
    if _KEYS.match(clause):
        if _KEY_CHANGE.match(clause):
            key_changes.append(k)
        return ""
    if _OPTION.match(clause):
        return ""
    if (
        (m := _ADD.match(clause))
        and unquote(m["a"]).upper() not in NOT_A_COLUMN
        and not re.match(r"ADD\s+PARTITION\b", clause, re.I)
    ):
        if _find(slots, m["a"]) is not None:
            return "" if m["if"] else f"ADD of {unquote(m['a'])!r}, which exists"
        slot = _Slot(unquote(m["a"]), None, k)
        slots.append(slot)
        return _move(slots, slot, clause)
    if m := _CHANGE.match(clause) or _MODIFY.match(clause):
        redefined = _find(slots, m["a"])
        if redefined is None:
            return f"{clause.split()[0].upper()} of {unquote(m['a'])!r}: no such column"
        if "b" in m.groupdict():  # CHANGE names it anew
            redefined.name = unquote(m["b"])
        _redefine(redefined, k)
        return _move(slots, redefined, clause)
    if m := _RENAME.match(clause):
        renamed = _find(slots, m["a"])
        if renamed is None:
            return f"RENAME of {unquote(m['a'])!r}: no such column"
        renamed.name = unquote(m["b"])
        return ""
    if m := _ALTER.match(clause):
        altered = _find(slots, m["a"])
        if altered is None:
            return f"ALTER of {unquote(m['a'])!r}: no such column"
        _redefine(altered, k)
        return ""
    if (name := dropped_column(clause)) is not None:
        dropped = next((s for s in slots if s.name.lower() == name.lower()), None)
        if dropped is None:
            return "" if re.search(r"\bIF\s+EXISTS\b", clause, re.I) else f"DROP of {name!r}: no such column"
        slots.remove(dropped)
        dropped.gone = True
        return ""
    return f"a clause the job does not follow: {clause[:80]!r}"
