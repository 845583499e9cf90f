"""The changelog of one table: every row change of a batch, not collapsed, as +I, -U/+U and -D rows.

Flink CDC's changelog output (seed 000) in table form: an UPDATE becomes its before image (-U) then its
after image (+U), even when the primary key changes. Each row carries a sequence string that sorts in
binlog order in any engine (Trino, Spark, DuckDB compare strings the same way), so
`ORDER BY _seq` replays the table's history.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ingest.model.changes import ChangelogRow

OP_INSERT, OP_UPDATE_BEFORE, OP_UPDATE_AFTER, OP_DELETE = "+I", "-U", "+U", "-D"

# Fixed widths make text order equal numeric order. A binlog file number is at most 2^31 - 1 (10
# digits), an event position fits in 32 bits (12 digits leave room), and an event holds fewer than
# 10^10 rows.
_WIDTHS = (10, 12, 10)


def sequence_text(file_number: int, pos: int, row_index: int, image: int) -> str:
    """`ffffffffff-pppppppppppp-rrrrrrrrrr-i`: binlog file number, end of the row event, row in the event,
    and 0 for the before image of an update (or an insert or delete), 1 for its after image."""
    parts = (file_number, pos, row_index)
    for value, width in zip(parts, _WIDTHS, strict=True):
        if not 0 <= value < 10**width:
            raise ValueError(f"changelog sequence part {value} does not fit {width} digits ({parts})")
    return f"{file_number:010d}-{pos:012d}-{row_index:010d}-{image}"


@dataclass(frozen=True)
class SourceChange:
    """A row change with what the changelog needs of its transaction (the materializer needs less)."""

    file: str
    file_number: int
    pos: int
    row_index: int
    before: tuple[Any, ...] | None
    after: tuple[Any, ...] | None
    gtid: str | None
    commit_time: int


def changelog_rows(changes: Iterable[SourceChange]) -> list[ChangelogRow]:
    """Every change as changelog rows, in binlog order (input order does not matter)."""
    out: list[ChangelogRow] = []
    for c in sorted(changes, key=lambda c: (c.file_number, c.pos, c.row_index)):
        position = f"{c.file}:{c.pos}"

        def row(op: str, image: tuple[Any, ...], half: int, c: SourceChange = c, position: str = position) -> None:
            seq = sequence_text(c.file_number, c.pos, c.row_index, half)
            out.append(ChangelogRow(op, seq, position, c.gtid, c.commit_time, image))

        if c.before is None and c.after is not None:
            row(OP_INSERT, c.after, 0)
        elif c.before is not None and c.after is None:
            row(OP_DELETE, c.before, 0)
        elif c.before is not None and c.after is not None:
            row(OP_UPDATE_BEFORE, c.before, 0)
            row(OP_UPDATE_AFTER, c.after, 1)
        else:
            raise ValueError(f"a row change at {position} row {c.row_index} has neither a before nor an after image")
    return out
