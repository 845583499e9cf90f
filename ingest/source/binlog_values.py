"""python-mysql-replication values -> the values PyMySQL returns for the same column.

The snapshot (PyMySQL) and the binlog (python-mysql-replication) must produce identical Iceberg
values, so binlog values are first brought to the driver's form, then share one set of converters
(ingest/sink/types.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ingest.sink.types import SourceColumn

_SET_MEMBERS = re.compile(r"'((?:[^']|'')*)'")


def _set_joiner(column_type: str) -> Callable[[Any], Any]:
    order = [m.replace("''", "'") for m in _SET_MEMBERS.findall(column_type)]

    def join(value: Any) -> Any:
        # The binlog library gives a Python set; MySQL prints members in definition order, comma-joined.
        if isinstance(value, set | frozenset):
            return ",".join(member for member in order if member in value)
        return value

    return join


def _identity(value: Any) -> Any:
    return value


def driver_form(columns: Sequence[SourceColumn]) -> list[Callable[[Any], Any]]:
    """One function per column turning a binlog value into the driver's value (identity where equal)."""
    fns: list[Callable[[Any], Any]] = []
    for col in columns:
        if col.data_type == "set":
            fns.append(_set_joiner(col.column_type))
        else:
            # BIT arrives as a '0101' string and zero dates as None; the converters accept both forms.
            fns.append(_identity)
    return fns
