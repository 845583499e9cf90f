"""python-mysql-replication values -> the values PyMySQL returns for the same column.

The snapshot (PyMySQL) and the binlog (python-mysql-replication) must produce identical Iceberg
values, so binlog values are first brought to the driver's form, then share one set of converters
(ingest/model/columns.py).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

from ingest.errors import SourceError
from ingest.model.columns import SourceColumn

# python-mysql-replication's reason for a column that is not in the row image at all.
_ABSENT = "cols bitmap"


def _set_joiner(order: Sequence[str]) -> Callable[[Any], Any]:

    def join(value: Any) -> Any:
        # The binlog library gives a Python set; MySQL prints members in definition order, comma-joined.
        if isinstance(value, set | frozenset):
            return ",".join(member for member in order if member in value)
        return value

    return join


def unchanged(value: Any) -> Any:
    """The driver form of a value the binlog library already gives in it."""
    return value


def _padded(length: int) -> Callable[[Any], Any]:
    def pad(value: Any) -> Any:
        # The binlog drops a BINARY(n) value's trailing 0x00 bytes (all of them for an all-zero value, which the
        # library then gives as ''); the server pads it back to n bytes.
        if isinstance(value, str):
            value = value.encode()
        return value.ljust(length, b"\x00") if isinstance(value, bytes) else value

    return pad


def _bytes(value: Any) -> Any:
    """An empty binary value, which the library gives as '' (it decodes with no codec), is b''."""
    return b"" if value == "" else value


def _year(value: Any) -> Any:
    """YEAR stores 0000 as 0, which the library reads as 1900 (no YEAR is 1900: they run 1901 to 2155)."""
    return 0 if value == 1900 else value


_BINARY_LENGTH = re.compile(r"^binary\((\d+)\)")


def driver_form(columns: Sequence[SourceColumn]) -> list[Callable[[Any], Any]]:
    """One function per column turning a binlog value into the driver's value (identity where equal)."""
    fns: list[Callable[[Any], Any]] = []
    for col in columns:
        if col.data_type == "set":
            fns.append(_set_joiner(col.members))
        elif col.data_type == "binary" and (m := _BINARY_LENGTH.match(col.column_type.lower())):
            fns.append(_padded(int(m[1])))
        elif col.data_type in ("varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
            fns.append(_bytes)
        elif col.data_type == "year":
            fns.append(_year)
        else:
            # BIT arrives as a '0101' string and zero dates as None; the converters accept both forms.
            fns.append(unchanged)
    return fns


class RowDecoder:
    """A binlog row's values (a dict by column name) as a tuple in the schema's column order, driver form.

    Per row this is one C-level key-set comparison and one `itemgetter` call; only columns whose binlog
    value differs from the driver's (SET) go through a Python function.
    """

    def __init__(self, columns: Sequence[SourceColumn]) -> None:
        names = [c.name for c in columns]
        self.names = frozenset(names)
        self._get: Callable[[dict[str, Any]], tuple[Any, ...]] = (
            operator.itemgetter(*names) if len(names) > 1 else (lambda values: (values[names[0]],))
        )
        self._fixes = [(i, fn) for i, fn in enumerate(driver_form(columns)) if fn is not unchanged]

    def matches(self, values: dict[str, Any]) -> bool:
        """The row has exactly the schema's columns."""
        return values.keys() == self.names

    def __call__(self, values: dict[str, Any]) -> tuple[Any, ...]:
        row = self._get(values)
        if not self._fixes:
            return row
        fixed = list(row)
        for i, fn in self._fixes:
            fixed[i] = fn(fixed[i])
        return tuple(fixed)


def restore_empty_sets(values: dict[str, Any], none_sources: dict[str, Any] | None) -> dict[str, Any]:
    """The binlog library reports an empty SET as None with the reason 'empty set'; the driver gives ''.

    Columns absent from the event (a writer session with binlog_row_image MINIMAL or NOBLOB) are also
    reported as None; writing them would overwrite real values with NULL, so they stop the job.
    """
    if not none_sources:
        return values
    absent = sorted(name for name, why in none_sources.items() if why == _ABSENT)
    if absent:
        raise SourceError(
            f"a binlog row lacks columns {absent}: binlog_row_image must be FULL on every writer session "
            "(a session with MINIMAL or NOBLOB wrote this change); nothing of it was applied"
        )
    empty = [name for name, why in none_sources.items() if why == "empty set"]
    return {**values, **dict.fromkeys(empty, "")} if empty else values


def row_images(event_kind: str, row: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(before, after) value dicts of one binlog row, with empty SETs restored."""
    if event_kind == "insert":
        return None, restore_empty_sets(row["values"], row.get("none_sources"))
    if event_kind == "delete":
        return restore_empty_sets(row["values"], row.get("none_sources")), None
    return (
        restore_empty_sets(row["before_values"], row.get("before_none_sources")),
        restore_empty_sets(row["after_values"], row.get("after_none_sources")),
    )
