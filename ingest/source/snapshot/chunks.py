"""Chunk splitting on the primary key (or a user-named unique NOT NULL key); see MISSION.md "Chunk splitting".

Dense integer keys are split into fixed ranges from MIN/MAX. Everything else takes its boundaries from
the server (`ORDER BY key LIMIT 1 OFFSET n`), so ordering always follows the server's collation:
boundaries are never computed or compared in Python for strings.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pymysql

from ingest.errors import UnsupportedTableError
from ingest.model.schema import TableSchema, quote

_INTEGER_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint"})
# A key space at most this many times larger than the row count is split by arithmetic.
DENSE_FACTOR = 4.0

Key = tuple[Any, ...]


@dataclass(frozen=True)
class Chunk:
    """Rows with lower <= key < upper (row-value order of the chunk key); None is unbounded."""

    table_id: str
    index: int
    lower: Key | None
    upper: Key | None

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table_id,
            "index": self.index,
            "lower": encode_key(self.lower),
            "upper": encode_key(self.upper),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Chunk:
        return cls(str(data["table"]), int(data["index"]), decode_key(data["lower"]), decode_key(data["upper"]))


def _encode_value(v: Any) -> dict[str, str]:
    # Tagged and lossless: big unsigned ints, DECIMAL, binary and temporal keys round-trip exactly.
    if isinstance(v, bool):
        return {"i": str(int(v))}
    if isinstance(v, int):
        return {"i": str(v)}
    if isinstance(v, Decimal):
        return {"d": str(v)}
    if isinstance(v, str):
        return {"s": v}
    if isinstance(v, bytes | bytearray):
        return {"b": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, dt.datetime):
        return {"dt": v.isoformat()}
    if isinstance(v, dt.date):
        return {"date": v.isoformat()}
    if isinstance(v, dt.timedelta):
        return {"td": str(v.days * 86400_000000 + v.seconds * 1_000000 + v.microseconds)}
    if isinstance(v, float):
        return {"f": repr(v)}
    raise UnsupportedTableError(f"cannot use a value of type {type(v).__name__} as a chunk key")


def _decode_value(tagged: dict[str, str]) -> Any:
    ((tag, text),) = tagged.items()
    if tag == "i":
        return int(text)
    if tag == "d":
        return Decimal(text)
    if tag == "s":
        return text
    if tag == "b":
        return base64.b64decode(text)
    if tag == "dt":
        return dt.datetime.fromisoformat(text)
    if tag == "date":
        return dt.date.fromisoformat(text)
    if tag == "td":
        return dt.timedelta(microseconds=int(text))
    if tag == "f":
        return float(text)
    raise ValueError(f"unknown key value tag {tag!r}")


def encode_key(key: Key | None) -> list[dict[str, str]] | None:
    return None if key is None else [_encode_value(v) for v in key]


def decode_key(data: Sequence[dict[str, str]] | None) -> Key | None:
    return None if data is None else tuple(_decode_value(v) for v in data)


def _row_compare(columns: Sequence[str], op: str, params: list[Any], values: Sequence[Any]) -> str:
    """`(a, b) op (x, y)` written as nested OR/AND, which every MySQL/MariaDB version can use an index for."""
    strict = op.rstrip("=")
    head, *rest = columns
    params.append(values[0])
    if not rest:
        return f"{quote(head)} {op} %s"
    params.append(values[0])
    inner = _row_compare(rest, op, params, values[1:])
    return f"({quote(head)} {strict} %s OR ({quote(head)} = %s AND {inner}))"


def range_predicate(columns: Sequence[str], lower: Key | None, upper: Key | None) -> tuple[str, list[Any]]:
    """SQL condition and parameters for lower <= key < upper."""
    params: list[Any] = []
    parts = []
    if lower is not None:
        parts.append(_row_compare(columns, ">=", params, lower))
    if upper is not None:
        parts.append(_row_compare(columns, "<", params, upper))
    return (" AND ".join(parts) or "TRUE"), params


def split_table(conn: pymysql.connections.Connection[Any], schema: TableSchema, chunk_size: int) -> list[Chunk]:
    """The table's chunks, in key order, covering the whole key space (first and last are unbounded). A table
    without a key is one chunk: its read must begin at a binlog position the server names (chunk_reader)."""
    if schema.keyless:
        return [Chunk(schema.table_id, 0, None, None)]
    key = schema.chunk_key
    first = schema.key_column(key[0])
    if len(key) == 1 and first.data_type in _INTEGER_TYPES:
        bounds = _dense_integer_bounds(conn, schema, chunk_size)
        if bounds is not None:
            return _chunks_from_bounds(schema.table_id, [(b,) for b in bounds])
    return _chunks_from_bounds(schema.table_id, _server_bounds(conn, schema, chunk_size))


def _chunks_from_bounds(table_id: str, bounds: list[Key]) -> list[Chunk]:
    edges: list[Key | None] = [None, *bounds, None]
    return [Chunk(table_id, i, edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def _dense_integer_bounds(
    conn: pymysql.connections.Connection[Any], schema: TableSchema, chunk_size: int
) -> list[int] | None:
    column = quote(schema.chunk_key[0])
    with conn.cursor() as cur:
        cur.execute(f"SELECT MIN({column}), MAX({column}), COUNT(*) FROM {schema.quoted}")
        low, high, count = cur.fetchone()
    if not count:
        return []
    low, high = int(low), int(high)
    factor = (high - low + 1) / count
    if factor > DENSE_FACTOR:
        return None  # sparse: arithmetic ranges would be mostly empty or a few huge ones
    step = max(1, math.ceil(chunk_size * factor))
    # Python ints: no overflow near 2^64 (BIGINT UNSIGNED), unlike a 64-bit loop counter.
    return list(range(low + step, high + 1, step))


def _server_bounds(conn: pymysql.connections.Connection[Any], schema: TableSchema, chunk_size: int) -> list[Key]:
    columns = ", ".join(quote(c) for c in schema.chunk_key)
    bounds: list[Key] = []
    lower: Key | None = None
    with conn.cursor() as cur:
        while True:
            where, params = range_predicate(schema.chunk_key, lower, None)
            cur.execute(
                f"SELECT {columns} FROM {schema.quoted} WHERE {where} ORDER BY {columns} LIMIT 1 OFFSET %s",
                (*params, chunk_size),
            )
            row = cur.fetchone()
            if row is None:
                return bounds
            lower = tuple(row)
            bounds.append(lower)
