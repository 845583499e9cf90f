"""Row images holding a value Iceberg cannot hold exactly, and what becomes of them (`on_unrepresentable`).

MySQL keeps dates that are no calendar dates ('0000-00-00', '2020-00-15', '2020-02-31'; docs/types.md).
By default they become NULL (`null`). With `stop` the job stops at the first one; with `dead_letter` the
row image is not written to the target: each such value becomes one row of the table's rejected table,
and the change is applied as if that image had never been written (see `split_rejected`).

Pure logic: the binlog phase calls it on the changes of a batch (ingest/query/batch.py) and the sink writes
what it returns (ingest/sink/rejected.py).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ingest.changes.changelog import sequence_text
from ingest.errors import SourceError
from ingest.model.changes import RejectedValue, RowChange
from ingest.model.columns import TEMPORAL_TYPES, SourceColumn

REASON_ZERO_DATE = "zero date"
REASON_ZERO_PART = "zero month or day"
REASON_ZERO_YEAR = "year 0"
REASON_NOT_A_DATE = "not a calendar date"


@dataclass(frozen=True)
class Unrepresentable:
    """One value of a row image that no Iceberg value holds exactly."""

    column: str
    raw: str
    """The value as read: MySQL's text of it."""
    reason: str


def snapshot_seq(chunk_index: int, key: str) -> str:
    """The `seq` of a value a chunk read: with the column, its identity in the rejected table. A chunk read again
    after a crash (its first read never reached the target) finds its rows there and adds none."""
    return f"snapshot:{chunk_index}:{key}"


def chunk_rejected(
    names: Sequence[str], key: Sequence[Any], found: Sequence[Unrepresentable], chunk_index: int, high: Any
) -> list[RejectedValue]:
    """The rejected rows of one row of a chunk read at high watermark `high` (a `Watermark`)."""
    text = key_json(names, key)
    gtid = None if high.gtid is None else str(high.gtid)
    return [
        RejectedValue(
            text,
            v.column,
            v.raw,
            v.reason,
            str(high.position),
            snapshot_seq(chunk_index, text),
            gtid,
            None,
            "snapshot",
            chunk_index,
        )
        for v in found
    ]


def reason_of(raw: str) -> str:
    """Why a date's text is no Iceberg date: all zero, a zero month or day, year 0, or no such day."""
    date = raw.split(" ", 1)[0]
    parts = date.split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return REASON_NOT_A_DATE
    year, month, day = (int(p) for p in parts)
    if not (year or month or day):
        return REASON_ZERO_DATE
    if not (month and day):
        return REASON_ZERO_PART
    if not year:
        return REASON_ZERO_YEAR
    return REASON_NOT_A_DATE


def find_unrepresentable(columns: Sequence[SourceColumn], image: Sequence[Any]) -> list[Unrepresentable]:
    """The values of a row image (driver values, schema order) that the converters would turn into NULL.

    A date-like column holds text only when the value is no date: PyMySQL returns such values as text,
    the binlog decoder as `InvalidTemporal`. (A zero date in an event only python-mysql-replication
    decodes, such as the pre-5.6 DATETIME format, arrives as None and cannot be told from NULL.)
    """
    found = []
    for col, value in zip(columns, image, strict=True):
        if col.data_type in TEMPORAL_TYPES and isinstance(value, str | bytes | bytearray):
            raw = value.decode("ascii", "replace") if isinstance(value, bytes | bytearray) else str(value)
            found.append(Unrepresentable(col.name, raw, reason_of(raw)))
    return found


def key_json(names: Sequence[str], key: Sequence[Any]) -> str:
    """The primary key as a JSON object, in key order: numbers as numbers (DECIMAL as its text), text as
    text, bytes as base64, dates and times in ISO form."""
    return json.dumps(dict(zip(names, (_json_value(v) for v in key), strict=True)), ensure_ascii=False)


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.date | dt.datetime | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta | set | frozenset):
        return str(value)
    return value


def split_rejected(
    changes: Sequence[RowChange],
    columns: Sequence[SourceColumn],
    key_positions: Sequence[int],
    policy: str,
    gtid_of: Any = None,
) -> tuple[list[RowChange], list[RejectedValue]]:
    """The changes to apply, and the rejected values, of one table's changes under `policy`.

    Only after images are judged (a before image only names the key to remove). Under `dead_letter` a
    change whose after image holds such a value is applied as if that image had never been written: an
    insert is dropped, an update of the same key is dropped (the target keeps the row as it was before
    the update), and an update that changes the key still deletes the old key (the source no longer has
    it). Under `stop` the first one raises `SourceError`; under `null` nothing is judged.

    `gtid_of(change)` gives (gtid, commit time) of a change's transaction; None: (None, 0).
    """
    if policy == "null":
        return list(changes), []
    names = [columns[i].name for i in key_positions]
    kept: list[RowChange] = []
    rejected: list[RejectedValue] = []
    for change in changes:
        found = [] if change.after is None else find_unrepresentable(columns, change.after)
        if not found:
            kept.append(change)
            continue
        assert change.after is not None
        key = tuple(change.after[i] for i in key_positions)
        if policy == "stop":
            value = found[0]
            raise SourceError(
                f"{change.table_id}: column {value.column!r} of the row with key {key_json(names, key)} holds "
                f"{value.raw!r} ({value.reason}) at binlog position {change.position}, which no Iceberg value "
                f"holds exactly; `on_unrepresentable` is `stop` for this table. Set it to `dead_letter` (or `null`) "
                f"in `table_options.{change.table_id}` and run again"
            )
        gtid, commit_time = gtid_of(change) if gtid_of is not None else (None, 0)
        seq = sequence_text(change.position.file_number, change.position.pos, change.row_index, 1)
        rejected.extend(
            RejectedValue(key_json(names, key), v.column, v.raw, v.reason, str(change.position), seq, gtid, commit_time)
            for v in found
        )
        if change.before is not None and tuple(change.before[i] for i in key_positions) != key:
            kept.append(change._replace(after=None))  # the old key is gone from the source
    return kept, rejected
