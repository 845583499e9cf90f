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


_FIXED_BINARY_TEXT_LENGTH = {"uuid": 16, "inet4": 4, "inet6": 16}
"""MariaDB's fixed-size binary types: logged as their bytes (a BINARY(n), trailing 0x00 bytes dropped), printed by the
server as text, which PyMySQL gives."""


def _uuid_text(raw: bytes) -> str:
    """MariaDB's text of a UUID: its 16 bytes as the binlog and HEX() give them, in groups of 8-4-4-4-12."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _inet4_text(raw: bytes) -> str:
    return ".".join(str(b) for b in raw)


def _inet6_text(raw: bytes) -> str:
    """MariaDB's text of an INET6 value (`Inet6::to_string`): the first longest run of zero groups, even a run of
    one, becomes `::`; an IPv4-compatible or IPv4-mapped address ends in dotted decimal."""
    words = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, 16, 2)]
    best, best_len, i = -1, 0, 0
    while i < 8:
        if words[i] == 0:
            j = i
            while j < 8 and words[j] == 0:
                j += 1
            if j - i > best_len:
                best, best_len = i, j - i
            i = j
        else:
            i += 1
    if best == 0 and (best_len == 6 or (best_len == 5 and words[5] == 0xFFFF)):
        head = "::" if best_len == 6 else "::ffff:"
        return head + ".".join(str(b) for b in raw[12:16])
    if best < 0:
        return ":".join(f"{w:x}" for w in words)
    left = ":".join(f"{w:x}" for w in words[:best])
    right = ":".join(f"{w:x}" for w in words[best + best_len :])
    return f"{left}::{right}"


_TEXT_OF = {"uuid": _uuid_text, "inet4": _inet4_text, "inet6": _inet6_text}


def _fixed_binary_text(data_type: str) -> Callable[[Any], Any]:
    length, text = _FIXED_BINARY_TEXT_LENGTH[data_type], _TEXT_OF[data_type]
    pad = _padded(length)

    def convert(value: Any) -> Any:
        return value if value is None else text(pad(value))

    return convert


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
        elif col.data_type in _FIXED_BINARY_TEXT_LENGTH:
            fns.append(_fixed_binary_text(col.data_type))
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
