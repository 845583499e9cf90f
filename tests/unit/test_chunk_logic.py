"""Unit tests of the pure parts of chunking: key range predicates, lossless key encoding, chunk progress ranges."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import random
import sqlite3
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from ingest.errors import UnsupportedTableError
from ingest.sink.targets import decode_ranges, encode_ranges
from ingest.source.snapshot.chunk_reader import numbered
from ingest.source.snapshot.chunks import Chunk, decode_key, encode_key, range_predicate

# --------------------------------------------------------------------------------------------------
# range_predicate: exact SQL text and parameters
# --------------------------------------------------------------------------------------------------


def test_one_column_lower_only() -> None:
    assert range_predicate(["id"], (10,), None) == ("`id` >= %s", [10])


def test_one_column_upper_only() -> None:
    assert range_predicate(["id"], None, (20,)) == ("`id` < %s", [20])


def test_one_column_both_bounds() -> None:
    assert range_predicate(["id"], (10,), (20,)) == ("`id` >= %s AND `id` < %s", [10, 20])


def test_one_column_unbounded() -> None:
    assert range_predicate(["id"], None, None) == ("TRUE", [])


def test_three_columns_lower_only() -> None:
    assert range_predicate(["a", "b", "c"], (1, 2, 3), None) == (
        "(`a` > %s OR (`a` = %s AND (`b` > %s OR (`b` = %s AND `c` >= %s))))",
        [1, 1, 2, 2, 3],
    )


def test_three_columns_upper_only() -> None:
    assert range_predicate(["a", "b", "c"], None, (4, 5, 6)) == (
        "(`a` < %s OR (`a` = %s AND (`b` < %s OR (`b` = %s AND `c` < %s))))",
        [4, 4, 5, 5, 6],
    )


def test_three_columns_both_bounds() -> None:
    assert range_predicate(["a", "b", "c"], (1, 2, 3), (4, 5, 6)) == (
        "(`a` > %s OR (`a` = %s AND (`b` > %s OR (`b` = %s AND `c` >= %s))))"
        " AND (`a` < %s OR (`a` = %s AND (`b` < %s OR (`b` = %s AND `c` < %s))))",
        [1, 1, 2, 2, 3, 4, 4, 5, 5, 6],
    )


def test_three_columns_unbounded() -> None:
    assert range_predicate(["a", "b", "c"], None, None) == ("TRUE", [])


def test_two_columns_lower_only() -> None:
    assert range_predicate(["x", "y"], ("k", b"\x00"), None) == (
        "(`x` > %s OR (`x` = %s AND `y` >= %s))",
        ["k", "k", b"\x00"],
    )


def test_identifiers_with_backticks_are_quoted() -> None:
    assert range_predicate(["we`ird", "plain"], ("v", 1), None) == (
        "(`we``ird` > %s OR (`we``ird` = %s AND `plain` >= %s))",
        ["v", "v", 1],
    )
    assert range_predicate(["``"], None, (0,)) == ("`````` < %s", [0])


def test_values_are_parameters_never_sql_text() -> None:
    evil = "x' OR '1'='1"
    sql, params = range_predicate(["k"], (evil,), (evil + "z",))
    assert evil not in sql
    assert params == [evil, evil + "z"]


def _select(columns: list[str], rows: list[tuple[int, ...]], lower: Any, upper: Any) -> set[tuple[int, ...]]:
    """Run the predicate on SQLite (same row-comparison semantics for integers) and return the matched rows."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute(f"CREATE TABLE t ({', '.join('`' + c + '` INTEGER' for c in columns)})")
        conn.executemany(f"INSERT INTO t VALUES ({', '.join('?' for _ in columns)})", rows)
        where, params = range_predicate(columns, lower, upper)
        sql = f"SELECT * FROM t WHERE {where}".replace("%s", "?")
        return set(conn.execute(sql, params).fetchall())
    finally:
        conn.close()


def test_three_column_predicate_selects_exactly_lower_le_key_lt_upper() -> None:
    columns = ["a", "b", "c"]
    rows = list(itertools.product(range(3), repeat=3))
    bounds: list[tuple[int, ...] | None] = [None, (0, 0, 0), (1, 1, 1), (1, 0, 2), (2, 2, 2), (0, 2, 1)]
    for lower, upper in itertools.product(bounds, repeat=2):
        expected = {r for r in rows if (lower is None or r >= lower) and (upper is None or r < upper)}
        assert _select(columns, rows, lower, upper) == expected, (lower, upper)


def test_adjacent_chunks_partition_the_rows() -> None:
    columns = ["a", "b"]
    rows = list(itertools.product(range(4), repeat=2))
    edges: list[tuple[int, ...] | None] = [None, (0, 3), (1, 1), (3, 0), None]
    seen: list[tuple[int, ...]] = []
    for lower, upper in itertools.pairwise(edges):
        seen.extend(_select(columns, rows, lower, upper))
    assert sorted(seen) == rows


# --------------------------------------------------------------------------------------------------
# encode_key / decode_key: lossless, JSON-safe
# --------------------------------------------------------------------------------------------------

ROUND_TRIP_VALUES: list[Any] = [
    0,
    1,
    18446744073709551615,
    -9223372036854775808,
    -1,
    Decimal("-0.000000000000000000000000000001"),
    Decimal("1.10"),
    Decimal("12345678901234567890123456789.000000001"),
    "plain",
    "emoji \U0001f600 with trailing spaces   ",
    "",
    'quote " and backslash \\ and newline \n',
    b"\x00",
    b"\xff",
    b"\x00\xff\x80 bytes \x00",
    b"",
    dt.date(1000, 1, 1),
    dt.date(9999, 12, 31),
    dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
    dt.datetime(1970, 1, 1, 0, 0, 0, 1),
    dt.datetime(2020, 5, 5, 5, 5, 5),
    dt.timedelta(hours=-838, minutes=-59, seconds=-59),
    dt.timedelta(microseconds=-1),
    dt.timedelta(days=-1, seconds=3600, microseconds=5),
    dt.timedelta(hours=838, minutes=59, seconds=59, microseconds=999999),
    0.1,
    -2.5e-300,
]


@pytest.mark.parametrize("value", ROUND_TRIP_VALUES, ids=repr)
def test_value_round_trips_exactly_through_json(value: Any) -> None:
    encoded = encode_key((value,))
    decoded = decode_key(json.loads(json.dumps(encoded)))
    assert decoded == (value,)
    assert decoded is not None
    assert type(decoded[0]) is type(value)
    if isinstance(value, Decimal):
        assert decoded[0].as_tuple() == value.as_tuple()
        assert str(decoded[0]) == str(value)


def test_multi_value_key_round_trips() -> None:
    key = (18446744073709551615, "a \U0001f600 ", b"\x00\xff", Decimal("-0.000000000000000000000000000001"))
    assert decode_key(json.loads(json.dumps(encode_key(key)))) == key


def test_exact_encodings() -> None:
    assert encode_key((18446744073709551615,)) == [{"i": "18446744073709551615"}]
    assert encode_key((-5,)) == [{"i": "-5"}]
    assert encode_key((Decimal("-0.000000000000000000000000000001"),)) == [{"d": "-1E-30"}]
    assert encode_key((b"\x00\xff",)) == [{"b": "AP8="}]
    assert encode_key((dt.date(2024, 1, 2),)) == [{"date": "2024-01-02"}]
    assert encode_key((dt.datetime(2024, 1, 2, 3, 4, 5, 6),)) == [{"dt": "2024-01-02T03:04:05.000006"}]
    assert encode_key((dt.timedelta(microseconds=-1),)) == [{"td": "-1"}]
    assert encode_key((dt.timedelta(days=-1, seconds=3600, microseconds=5),)) == [{"td": "-82799999995"}]
    assert encode_key(("s ",)) == [{"s": "s "}]


def test_datetime_is_not_encoded_as_a_date() -> None:
    ((tagged,),) = [encode_key((dt.datetime(2024, 1, 2, 0, 0),))]
    assert tagged == {"dt": "2024-01-02T00:00:00"}
    decoded = decode_key([tagged])
    assert decoded == (dt.datetime(2024, 1, 2, 0, 0),)


def test_bool_and_bytearray_are_normalised() -> None:
    assert encode_key((True, False)) == [{"i": "1"}, {"i": "0"}]
    assert decode_key(encode_key((True,))) == (1,)
    decoded = decode_key(encode_key((bytearray(b"\x00\x01"),)))
    assert decoded == (b"\x00\x01",)
    assert decoded is not None
    assert type(decoded[0]) is bytes


def test_unbounded_key_is_none() -> None:
    assert encode_key(None) is None
    assert decode_key(None) is None
    assert encode_key(()) == []
    assert decode_key([]) == ()


def test_unsupported_key_value_types_are_refused() -> None:
    with pytest.raises(UnsupportedTableError, match="^cannot use a value of type NoneType as a chunk key$"):
        encode_key((1, None))
    with pytest.raises(UnsupportedTableError, match="^cannot use a value of type list as a chunk key$"):
        encode_key(([1],))


def test_unknown_tag_is_refused() -> None:
    with pytest.raises(ValueError, match="^unknown key value tag 'zz'$"):
        decode_key([{"zz": "1"}])


# --------------------------------------------------------------------------------------------------
# Chunk JSON
# --------------------------------------------------------------------------------------------------


def test_chunk_to_json_exact() -> None:
    chunk = Chunk("shop.orders", 3, (1, "a"), None)
    assert chunk.to_json() == {
        "table": "shop.orders",
        "index": 3,
        "lower": [{"i": "1"}, {"s": "a"}],
        "upper": None,
    }


@pytest.mark.parametrize(
    "chunk",
    [
        Chunk("shop.orders", 0, None, None),
        Chunk("shop.orders", 0, None, (18446744073709551615,)),
        Chunk("shop.orders", 7, (5,), None),
        Chunk(
            "db.t`x",
            12,
            (Decimal("-0.000000000000000000000000000001"), "\U0001f600  ", b"\x00\xff"),
            (dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, 0, 0, 0, 999999), dt.timedelta(microseconds=-7)),
        ),
    ],
)
def test_chunk_round_trips_through_json_text(chunk: Chunk) -> None:
    text = json.dumps(chunk.to_json())
    again = Chunk.from_json(json.loads(text))
    assert again == chunk
    assert again.to_json() == chunk.to_json()


# --------------------------------------------------------------------------------------------------
# encode_ranges / decode_ranges (chunk indexes done, kept in Iceberg snapshot summaries)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("indexes", "text"),
    [
        ({0, 1, 2, 5, 7, 8}, "0-2,5,7-8"),
        (set(), ""),
        ({3}, "3"),
        ({3, 4}, "3-4"),
        ({0, 2, 4}, "0,2,4"),
        (set(range(1000)), "0-999"),
    ],
)
def test_encode_ranges_exact(indexes: set[int], text: str) -> None:
    assert encode_ranges(indexes) == text
    assert decode_ranges(text) == indexes


def test_encode_ranges_sorts_and_deduplicates() -> None:
    assert encode_ranges([8, 5, 7, 0, 2, 1, 1, 8]) == "0-2,5,7-8"
    assert encode_ranges(iter([2, 1])) == "1-2"


def test_decode_ranges_empty() -> None:
    assert decode_ranges("") == set()


def test_ranges_round_trip_random_sets() -> None:
    rng = random.Random(20240229)
    for _ in range(100):
        universe = rng.randint(1, 200)
        indexes = set(rng.sample(range(universe), rng.randint(0, universe)))
        text = encode_ranges(indexes)
        assert decode_ranges(text) == indexes
        assert encode_ranges(decode_ranges(text)) == text
        # Canonical: no range could be merged with the next one.
        pieces = [tuple(map(int, p.split("-"))) for p in filter(None, text.split(","))]
        ends = [(p[0], p[-1]) for p in pieces]
        assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(ends))


def test_alike_rows_are_numbered_from_one_in_table_order_with_nulls_alike_and_an_empty_table_gets_the_column() -> None:
    table = pa.table(
        {"a": pa.array([1, None, 1, None, 2, 1], pa.int64()), "b": pa.array([b"x", None, b"x", None, b"x", b"x"])}
    )
    assert numbered(table).column("_ingest_occurrence").to_pylist() == [1, 1, 2, 2, 1, 3]
    empty = numbered(table.slice(0, 0))
    assert empty.column_names == ["a", "b", "_ingest_occurrence"] and empty.num_rows == 0
