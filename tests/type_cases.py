"""The shared type fixture: one table with every type case of FAILURES.md "Types and settings", the rows
to insert, and the exact Iceberg value each must become. The snapshot tests use it now; the binlog tests
must produce the same values from the same rows."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

UTC = dt.UTC

TYPES_DDL = """
CREATE TABLE {table} (
  id INT NOT NULL PRIMARY KEY,
  bu BIGINT UNSIGNED, iu INT UNSIGNED, ti1 TINYINT(1), yr YEAR,
  d65 DECIMAL(65,30), d10 DECIMAL(10,2),
  b1 BIT(1), b8 BIT(8), b64 BIT(64),
  e ENUM('a','b','c'), st SET('x','y','z'), j JSON,
  bl BLOB, tx TEXT, vb VARBINARY(16), ch CHAR(5), emo VARCHAR(10),
  dt6 DATETIME(6), dt3 DATETIME(3), ts6 TIMESTAMP(6) NULL, d DATE, tm3 TIME(3), tm TIME,
  f FLOAT, db DOUBLE, g GEOMETRY,
  zd DATE, zdt DATETIME, zts TIMESTAMP NULL,
  u UUID, i4 INET4, i6 INET6
)
"""

# Inserted with the session time_zone '+08:00', so TIMESTAMP values are converted to UTC by the server.
TYPES_ROWS = [
    "(1, 18446744073709551615, 4294967295, 5, 2155, 1.5, -3.25, b'1', b'10000000', 0xFFFFFFFFFFFFFFFF,"
    " 'b', 'x,z', '{\"k\": [1, 2]}', 0x00FF, 'héllo', 0x00FF10, 'ab', '😀🚀',"
    " '1969-07-20 20:17:40.123456', '2024-03-10 02:30:00.5', '2000-01-01 08:00:00.000001', '0001-01-01',"
    " '-838:59:59.5', '838:59:59', 1.25, 2.5, ST_GeomFromText('POINT(1 2)'),"
    " '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00',"
    # MariaDB's UUID (a time-based one, whose groups MariaDB may store swapped), INET4, INET6 (IPv4-mapped).
    " '6ccd780c-baba-1026-9564-5b8c656024db', '192.168.0.1', '::ffff:1.2.3.4')",
    "(2, 0, 0, -128, 1901, -99999999999999999999999999999999999.999999999999999999999999999999, 0.01,"
    " b'0', b'00000001', b'1', 'a', '', '[]', '', '', '', '', '',"
    " '9999-12-31 23:59:59.999999', '1970-01-01 00:00:00', '1970-01-01 08:00:01', '9999-12-31',"
    " '00:00:00.001', '-00:00:01', -0.5, 1e300, NULL, '2020-02-29', '2020-02-29 12:00:00', '2038-01-19 11:14:07',"
    # The binlog drops trailing zero bytes of these (all of them for 0.0.0.0 and ::).
    " '123e4567-e89b-42d3-a456-426614174000', '0.0.0.0', '::')",
    "(3" + ", NULL" * 32 + ")",
]

EXPECTED: dict[int, dict[str, Any]] = {
    1: {
        "bu": Decimal(18446744073709551615),
        "iu": 4294967295,
        "ti1": 5,
        "yr": 2155,
        "d65": "1.500000000000000000000000000000",
        "d10": Decimal("-3.25"),
        "b1": True,
        "b8": 128,
        "b64": Decimal(18446744073709551615),
        "e": "b",
        "st": "x,z",
        "j": '{"k": [1, 2]}',
        "bl": b"\x00\xff",
        "tx": "héllo",
        "vb": b"\x00\xff\x10",
        "ch": "ab",
        "emo": "😀🚀",
        "dt6": dt.datetime(1969, 7, 20, 20, 17, 40, 123456),
        "dt3": dt.datetime(2024, 3, 10, 2, 30, 0, 500000),
        "ts6": dt.datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        "d": dt.date(1, 1, 1),
        "tm3": "-838:59:59.500",
        "tm": "838:59:59",
        "f": 1.25,
        "db": 2.5,
        "zd": None,
        "zdt": None,
        "zts": None,
        "u": "6ccd780c-baba-1026-9564-5b8c656024db",
        "i4": "192.168.0.1",
        "i6": "::ffff:1.2.3.4",
    },
    2: {
        "bu": Decimal(0),
        "iu": 0,
        "ti1": -128,
        "yr": 1901,
        "d65": "-99999999999999999999999999999999999.999999999999999999999999999999",
        "d10": Decimal("0.01"),
        "b1": False,
        "b8": 1,
        "b64": Decimal(1),
        "e": "a",
        "st": "",
        "j": "[]",
        "bl": b"",
        "tx": "",
        "vb": b"",
        "ch": "",
        "emo": "",
        "dt6": dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        "dt3": dt.datetime(1970, 1, 1),
        "ts6": dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
        "d": dt.date(9999, 12, 31),
        "tm3": "00:00:00.001",
        "tm": "-00:00:01",
        "f": -0.5,
        "db": 1e300,
        "zd": dt.date(2020, 2, 29),
        "zdt": dt.datetime(2020, 2, 29, 12),
        "zts": dt.datetime(2038, 1, 19, 3, 14, 7, tzinfo=UTC),
        "u": "123e4567-e89b-42d3-a456-426614174000",
        "i4": "0.0.0.0",
        "i6": "::",
    },
    3: {},  # every column NULL
}


def create_types_table(admin_conn: Any, table: str) -> None:
    with admin_conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # permissive: zero dates are accepted
        cur.execute("SET SESSION time_zone = '+08:00'")
        cur.execute(TYPES_DDL.format(table=table))
        for row in TYPES_ROWS:
            cur.execute(f"INSERT INTO {table} VALUES {row}")


def check_iceberg_rows(rows: list[dict[str, Any]]) -> list[str]:
    """Differences between Iceberg rows (pyiceberg `to_pylist`) and EXPECTED; empty when equal."""
    problems = []
    by_id = {r["id"]: r for r in rows}
    if sorted(by_id) != sorted(EXPECTED):
        return [f"ids {sorted(by_id)} != {sorted(EXPECTED)}"]
    for row_id, expected in EXPECTED.items():
        row = by_id[row_id]
        for column, value in row.items():
            if column in ("id", "g"):
                continue
            want = expected.get(column)
            got = value
            if isinstance(got, dt.datetime) and got.tzinfo is not None:
                got = got.astimezone(UTC)
            if got != want or type(got) is not type(want):
                problems.append(f"row {row_id} column {column}: got {value!r}, want {want!r}")
        if row_id == 1 and not (isinstance(row["g"], bytes) and row["g"][:4] == b"\x00\x00\x00\x00"):
            problems.append(f"row 1 column g: got {row['g']!r}, want SRID 0 + WKB bytes")
    return problems
