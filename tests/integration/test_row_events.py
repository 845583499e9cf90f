"""Our row-event decoder against python-mysql-replication's, event by event on a real binlog.

`ingest.source.binlog.row_events` decodes row images from the event's bytes; the library decodes the same bytes its
own way. Both must give the same tuples, value for value and type for type, for every column of the shared
type fixture, for random values of the column shapes whose encoding has corners (DECIMAL groups, fractional
seconds, negative TIME, 2-byte lengths, multi-byte SET/BIT, latin1, MariaDB's pre-5.6 temporal formats), for
inserts, updates and deletes. Events the decoder does not cover must be declined, never guessed at.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.model.columns import InvalidTemporal, rows_to_record_batch
from ingest.model.position import BinlogPosition
from ingest.model.schema import TableSchema, target_columns
from ingest.source.binlog.binlog_values import RowDecoder, row_images
from ingest.source.binlog.quick_events import GTID, ROW_EVENTS, TABLE_MAP, XID, Buffer
from ingest.source.binlog.reader import BinlogReader, open_stream
from ingest.source.binlog.row_events import RowEvents, event_kind
from ingest.source.discovery import discover
from ingest.source.mysql import connect
from ingest.source.watermark import read_watermark
from tests.conftest import embedded_sink, source_section
from tests.type_cases import create_types_table

pytestmark = pytest.mark.integration

DB = "rowev"
SET_MEMBERS = [f"m{i}" for i in range(12)]  # 12 members: the SET takes 2 bytes
SHAPES = f"""
CREATE TABLE {DB}.shapes (
  id INT NOT NULL PRIMARY KEY,
  si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT, mu MEDIUMINT UNSIGNED, tu TINYINT UNSIGNED, bi BIGINT,
  d5 DECIMAL(5,5), d18 DECIMAL(18,0), d20 DECIMAL(20,9), d9 DECIMAL(9,4), d30 DECIMAL(30,12),
  t0 TIME, t1 TIME(1), t2 TIME(2), t4 TIME(4), t5 TIME(5), t6 TIME(6),
  dt1 DATETIME(1), dt2 DATETIME(2), dt5 DATETIME(5), ts0 TIMESTAMP NULL, ts3 TIMESTAMP(3) NULL,
  lat VARCHAR(20) CHARACTER SET latin1, wide CHAR(100), big VARCHAR(300), mt MEDIUMTEXT, lb LONGBLOB,
  bt BIT(12), st SET({", ".join(f"'{m}'" for m in SET_MEMBERS)})
)
"""


def _decimal(rng: random.Random, precision: int, scale: int) -> Decimal:
    digits = "".join(rng.choice("0123456789") for _ in range(precision))
    text = f"{digits[: precision - scale] or '0'}.{digits[precision - scale :]}" if scale else digits
    return Decimal(("-" if rng.random() < 0.5 else "") + text)


def _time(rng: random.Random, fsp: int) -> str:
    seconds = rng.randrange(0, 839 * 3600)
    fraction = f".{rng.randrange(10**fsp):0{fsp}d}" if fsp else ""
    sign = "-" if rng.random() < 0.5 else ""
    return f"{sign}{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}{fraction}"


def _datetime(rng: random.Random, fsp: int, first: int = 1, last: int = 9999) -> str:
    moment = dt.datetime(first, 1, 1) + dt.timedelta(seconds=rng.randrange((last - first) * 365 * 86400))
    fraction = f".{rng.randrange(10**fsp):0{fsp}d}" if fsp else ""
    return moment.strftime("%Y-%m-%d %H:%M:%S") + fraction


def _shape_row(rng: random.Random, key: int) -> list[Any]:
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.1 else value

    text = "".join(rng.choice("aé😀 z") for _ in range(rng.randrange(0, 100)))
    members = [m for m in SET_MEMBERS if rng.random() < 0.3]
    values = [
        rng.randrange(-(2**15), 2**15),
        rng.randrange(2**16),
        rng.randrange(-(2**23), 2**23),
        rng.randrange(2**24),
        rng.randrange(2**8),
        rng.randrange(-(2**63), 2**63),
        _decimal(rng, 5, 5),
        _decimal(rng, 18, 0),
        _decimal(rng, 20, 9),
        _decimal(rng, 9, 4),
        _decimal(rng, 30, 12),
        *(_time(rng, fsp) for fsp in (0, 1, 2, 4, 5, 6)),
        *(_datetime(rng, fsp) for fsp in (1, 2, 5)),
        _datetime(rng, 0, 1971, 2037),
        _datetime(rng, 3, 1971, 2037),
        "".join(rng.choice("abcÿé ") for _ in range(rng.randrange(0, 20))),
        text[:100],
        (text * 4)[:300],
        text * rng.randrange(1, 40),
        rng.randbytes(rng.choice([0, 10, 300, 70000])),
        rng.randrange(2**12),
        ",".join(members),
    ]
    return [key, *(maybe(v) for v in values)]


@pytest.fixture(scope="module")
def config(mariadb: MariaDBServer, tmp_path_factory: pytest.TempPathFactory) -> PipelineConfig:
    return parse_config(
        {
            "name": DB,
            "source": source_section(mariadb),
            "tables": {"include": [rf"{DB}\..*"]},
            "sink": embedded_sink(tmp_path_factory.mktemp("rowev")),
        }
    )


def _position(config: PipelineConfig) -> BinlogPosition:
    with connect(config.source) as conn:
        return read_watermark(conn, "mariadb").position


def _library_rows(kind: str, event: Any, schema: TableSchema) -> list[tuple[Any, Any]]:
    """The job's rows the way the library path makes them (BinlogReader before this decoder)."""
    decode = RowDecoder(schema.columns)
    out = []
    for row in event.rows:
        before, after = row_images(kind, row)
        out.append((None if before is None else decode(before), None if after is None else decode(after)))
    return out


def _typed(rows: list[tuple[Any, Any]]) -> list[Any]:
    """Rows with each value's type next to it: 1 == 1.0 == True, but the decoders must agree on types too."""
    return [tuple(None if image is None else [_typed_value(v) for v in image] for image in row) for row in rows]


_ZERO_TIMESTAMP = dt.datetime(1970, 1, 1)


def _typed_value(value: Any) -> tuple[type, Any]:
    # Ours keeps a zero or invalid date's text (InvalidTemporal) where the library gives None, or the epoch
    # for the zero TIMESTAMP; the converters turn all three into NULL.
    if isinstance(value, InvalidTemporal) or value == _ZERO_TIMESTAMP:
        return type(None), None
    return type(value), value


def _first_difference(schema: TableSchema, got: list[tuple[Any, Any]], want: list[tuple[Any, Any]]) -> str:
    for row, (ours, library) in enumerate(zip(_typed(got), _typed(want), strict=True)):
        for image, (a, b) in enumerate(zip(ours, library, strict=True)):
            for name, x, y in zip(schema.column_names, a or [], b or [], strict=False):
                if x != y:
                    return f"{schema.table_id} row {row} image {image} column {name}: ours {x}, library's {y}"
    return f"{schema.table_id}: {len(got)} rows, library's {len(want)}"


def _events(config: PipelineConfig, start: BinlogPosition, end: BinlogPosition) -> Iterator[tuple[str, Any]]:
    stream = open_stream(config.source, start, 5491, only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent])
    try:
        for event in stream:
            if BinlogPosition(stream.log_file, event.packet.log_pos) > end:
                return
            yield event_kind(event), event
    finally:
        stream.close()


def _compare(config: PipelineConfig, start: BinlogPosition) -> tuple[dict[str, int], dict[str, int], RowEvents]:
    """Decode every row event from `start` both ways; rows decoded by us and events declined, per table."""
    end = _position(config)
    schemas = {(s.database, s.table): s for s in discover(config.source, config.tables, config.table_options).schemas}
    ours = RowEvents()
    decoded: dict[str, int] = {}
    declined: dict[str, int] = {}
    for kind, event in _events(config, start, end):
        key = (event.schema, event.table)
        schema = schemas[key]
        got = ours.rows(key, kind, event, schema.columns)
        if got is None:
            declined[event.table] = declined.get(event.table, 0) + 1
            continue
        want = _library_rows(kind, event, schema)
        assert _typed(got) == _typed(want), _first_difference(schema, got, want)
        decoded[event.table] = decoded.get(event.table, 0) + len(got)
    return decoded, declined, ours


def test_our_decoder_gives_the_librarys_rows_for_every_type_and_random_values(
    mariadb: MariaDBServer, config: PipelineConfig
) -> None:
    mariadb.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}", SHAPES)
    start = _position(config)
    with mariadb.admin(DB) as conn:
        create_types_table(conn, f"{DB}.types")
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")
            cur.execute("UPDATE types SET d65 = -d65, tm3 = '12:00:00.25', st = 'y', b64 = 0 WHERE id < 3")
            cur.execute("UPDATE types SET id = id + 10")
            cur.execute("DELETE FROM types WHERE id = 11")
            rng = random.Random(20261123)
            for first in range(1, 301, 50):  # multi-row events of 50 rows
                rows = [_shape_row(rng, k) for k in range(first, first + 50)]
                marks = ", ".join(["%s"] * len(rows[0]))
                cur.executemany(f"INSERT INTO shapes VALUES ({marks})", rows)
            cur.execute("UPDATE shapes SET d20 = -d20, t6 = '-00:00:00.000001', st = '', bt = b'101' WHERE id % 3 = 0")
            cur.execute("DELETE FROM shapes WHERE id % 4 = 0")
        conn.commit()

    decoded, declined, ours = _compare(config, start)

    assert declined == {}
    assert ours.fallbacks == 0
    # 300 inserted + 100 updated + 75 deleted shapes; 3 + 2 + 3 (the key update) + 1 types.
    assert decoded == {"shapes": 475, "types": 9}


def test_pre_56_temporal_columns_are_decoded_and_the_old_datetime_is_left_to_the_library(
    mariadb: MariaDBServer, config: PipelineConfig
) -> None:
    """MariaDB writes its old TIME, DATETIME and TIMESTAMP formats for tables made with
    mysql56_temporal_format off: ours reads the old TIME and TIMESTAMP, and declines the old DATETIME."""
    mariadb.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}")
    mariadb.execute("SET GLOBAL mysql56_temporal_format = OFF")
    try:
        mariadb.execute(
            f"CREATE TABLE {DB}.old_tt (id INT NOT NULL PRIMARY KEY, t TIME, ts TIMESTAMP NULL)",
            f"CREATE TABLE {DB}.old_dt (id INT NOT NULL PRIMARY KEY, d DATETIME)",
        )
    finally:
        mariadb.execute("SET GLOBAL mysql56_temporal_format = ON")
    start = _position(config)
    mariadb.execute(
        f"INSERT INTO {DB}.old_tt VALUES (1, '-12:34:56', '2001-02-03 04:05:06'), (2, '838:59:59', NULL)",
        f"INSERT INTO {DB}.old_dt VALUES (1, '2001-02-03 04:05:06'), (2, NULL)",
        f"UPDATE {DB}.old_tt SET t = '00:00:01', ts = '2030-01-01 00:00:00'",
    )

    decoded, declined, _ = _compare(config, start)

    assert decoded == {"old_tt": 4}
    assert declined == {"old_dt": 1}


def test_an_event_without_every_column_is_declined(mariadb: MariaDBServer, config: PipelineConfig) -> None:
    """A writer session with binlog_row_image MINIMAL logs only some columns: the library path refuses it
    (test_binlog_edges)."""
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT NOT NULL PRIMARY KEY, v INT, w INT)",
        f"INSERT INTO {DB}.t VALUES (1, 1, 1)",
    )
    start = _position(config)
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
        cur.execute("UPDATE t SET v = 2")
        conn.commit()

    decoded, declined, _ = _compare(config, start)

    assert decoded == {}
    assert declined == {"t": 1}


def test_utf16_ucs2_and_utf32_columns_read_through_the_binlog_as_mysql_holds_them(
    mariadb: MariaDBServer, config: PipelineConfig, row_metadata: str
) -> None:
    """MySQL stores ucs2, utf16 and utf32 big-endian without a byte order mark: read as the library's `utf16`
    (this machine's order) the reader stopped with a UnicodeDecodeError, and `ucs2` is no Python codec."""
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.wide (id INT PRIMARY KEY, u2 VARCHAR(20) CHARACTER SET ucs2, "
        "u16 VARCHAR(20) CHARACTER SET utf16, le CHAR(10) CHARACTER SET utf16le, u32 TEXT CHARACTER SET utf32)",
    )
    schemas = [s for s in discover(config.source, config.tables, config.table_options).schemas if s.table == "wide"]
    start = _position(config)
    rows = [(1, "añ€", "a😀€z", "le😀", "u32 😀"), (2, "", "", "", ""), (3, None, None, None, None)]
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO wide VALUES (%s, %s, %s, %s, %s)", rows)
        cur.execute("UPDATE wide SET u16 = 'ü', u32 = 'ÿ' WHERE id = 2")
        conn.commit()
        cur.execute("SELECT * FROM wide ORDER BY id")
        assert [tuple(r) for r in cur.fetchall()] == [rows[0], (2, "", "ü", "", "ÿ"), rows[2]]
    reader = BinlogReader(config.source, schemas, start)
    try:
        changes = [c for t in reader.transactions() for c in getattr(t, "changes", [])]
    finally:
        reader.close()
    assert [c.after for c in changes] == [*rows, (2, "", "ü", "", "ÿ")]


class _LibraryOnly:
    """A buffer that never looks: every event is read by python-mysql-replication, as before `quick_events`. (Not a
    subclass of `Buffer`, which may be a compiled class: ingest.runtime.compiled.)"""

    drained = False  # never waits for the server itself: the library does

    def look(self, stream: Any) -> bool:
        return False

    def after_library(self, stream: Any) -> None:
        pass


def _transactions(config: PipelineConfig, start: BinlogPosition, buffer: Any) -> list[Any]:
    schemas = discover(config.source, config.tables, config.table_options).schemas
    reader = BinlogReader(config.source, schemas, start)
    reader._buffer = buffer
    try:
        return list(reader.transactions())
    finally:
        reader.close()


def test_events_read_in_place_are_the_transactions_the_library_path_reads(
    mariadb: MariaDBServer, config: PipelineConfig, row_metadata: str
) -> None:
    """The reader reads the everyday events (GTID, ANNOTATE_ROWS, table maps, row events, XID) in place from the
    connection's buffer (`quick_events`); read with every event through the library instead, the same binlog gives
    the same transactions: their changes value for value, their ends, GTIDs and commit times."""
    mariadb.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}", SHAPES)
    start = _position(config)
    rng = random.Random(20261207)
    with mariadb.admin(DB) as conn:
        create_types_table(conn, f"{DB}.types")
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")
            cur.execute("UPDATE types SET d65 = -d65, tm3 = '12:00:00.25', st = 'y', b64 = 0 WHERE id < 3")
            rows = [_shape_row(rng, k) for k in range(1, 121)]
            marks = ", ".join(["%s"] * len(rows[0]))
            cur.executemany(f"INSERT INTO shapes VALUES ({marks})", rows[:60])  # one multi-row event
            conn.commit()
            conn.autocommit(True)
            for row in rows[60:]:  # single-row transactions, as a busy source writes them
                cur.execute(f"INSERT INTO shapes VALUES ({marks})", row)
            for k in range(1, 121, 7):
                cur.execute("UPDATE shapes SET d20 = -d20, st = '' WHERE id = %s", (k,))
            cur.execute("DELETE FROM shapes WHERE id % 5 = 0")
            cur.execute("DELETE FROM types WHERE id = 2")
    quick = Buffer()
    read_in_place = _transactions(config, start, quick)
    by_library = _transactions(config, start, _LibraryOnly())
    assert [t.changes for t in read_in_place] == [t.changes for t in by_library]
    assert read_in_place == by_library
    # 120 inserts, 18 updates and 24 deletes of shapes; the types table's 3 rows, 2 updates and a delete.
    assert sum(len(t.changes) for t in read_in_place) == 168
    taken = {kind: quick.taken[kind] for kind in (GTID, TABLE_MAP, XID)}
    assert min(taken.values()) > 0 and sum(quick.taken[k] for k in ROW_EVENTS) > 0, quick.taken


EDGE_COLUMNS = [
    ("b4", "BINARY(4)", ["'a'", "X'00'", "X'61000000'", "''", "X'FFFFFFFF'", "'ab '"]),
    ("vb", "VARBINARY(4)", ["X'6100'", "''", "X'00'"]),
    ("bl", "BLOB", ["''", "X'00FF'"]),
    ("c4", "CHAR(4)", ["'a'", "'a  '", "''"]),
    ("t0", "TIME", ["'-838:59:59'", "'838:59:59'", "'-00:00:01'", "'00:00:00'"]),
    ("t1", "TIME(1)", ["'-00:00:00.1'", "'-00:00:01.9'", "'00:00:00.5'"]),
    ("t2", "TIME(2)", ["'-00:00:00.01'", "'-12:00:00.99'"]),
    ("t3", "TIME(3)", ["'-00:00:00.5'", "'-00:00:01.999'", "'-838:59:58.001'"]),
    ("t4", "TIME(4)", ["'-00:00:00.0001'", "'-00:00:02.5'"]),
    ("t6", "TIME(6)", ["'-00:00:00.000001'", "'-838:59:58.999999'", "'-01:00:00.5'", "'12:34:56.000100'"]),
    ("d", "DATE", ["'0000-00-00'", "'2020-00-00'", "'1000-01-01'", "'9999-12-31'", "'2020-02-00'"]),
    ("dt", "DATETIME", ["'0000-00-00 00:00:00'", "'1000-01-01 00:00:00'", "'9999-12-31 23:59:59'"]),
    ("dt6", "DATETIME(6)", ["'0000-00-00 00:00:00.000000'", "'9999-12-31 23:59:59.999999'"]),
    ("ts", "TIMESTAMP(6) NULL", ["'1970-01-01 00:00:01.000000'", "'2038-01-19 03:14:07.999999'"]),
    ("y", "YEAR", ["0", "1901", "2155", "'0000'", "70"]),
    ("bit1", "BIT(1)", ["b'1'", "b'0'"]),
    ("bit64", "BIT(64)", ["b'1111111111111111111111111111111111111111111111111111111111111111'", "0"]),
    ("bit5", "BIT(5)", ["b'10000'", "b'11111'", "b'00001'"]),
    # Integers at their documented ranges, signed and unsigned.
    ("ti", "TINYINT", ["-128", "127", "0"]),
    ("tiu", "TINYINT UNSIGNED", ["255", "0", "128"]),
    ("si", "SMALLINT", ["-32768", "32767"]),
    ("siu", "SMALLINT UNSIGNED", ["65535", "32768"]),
    ("mi", "MEDIUMINT", ["-8388608", "8388607", "-1"]),
    ("miu", "MEDIUMINT UNSIGNED", ["16777215", "8388608"]),
    ("i", "INT", ["-2147483648", "2147483647"]),
    ("iu", "INT UNSIGNED", ["4294967295", "2147483648"]),
    ("bi", "BIGINT", ["-9223372036854775808", "9223372036854775807"]),
    ("biu", "BIGINT UNSIGNED", ["18446744073709551615", "9223372036854775808"]),
    # Decimals: the widest, signs, all-fraction, the extremes of 38 digits and of 65 (a string in Iceberg).
    ("d1", "DECIMAL(1,0)", ["9", "-9", "0"]),
    ("d55", "DECIMAL(5,5)", ["0.99999", "-0.00001", "0"]),
    ("d38", "DECIMAL(38,10)", ["'9999999999999999999999999999.9999999999'", "'-0.0000000001'", "'-1'"]),
    ("d65", "DECIMAL(65,30)", ["'99999999999999999999999999999999999.999999999999999999999999999999'", "'-0.5'", "0"]),
    ("d200", "DECIMAL(20,0)", ["'-99999999999999999999'", "'12345678901234567890'"]),
    # Floating point: the limits, the smallest normal and subnormal values, signed zero.
    ("f", "FLOAT", ["3.40282e38", "-1.17549e-38", "0", "-0", "1.5"]),
    ("db", "DOUBLE", ["1.7976931348623157e308", "2.2250738585072014e-308", "4.9e-324", "-0", "0.1"]),
    # Text: ENUM and SET members (the empty string of a bad ENUM value, index 0), JSON, other character sets.
    ("en", "ENUM('a','b c','ü')", ["'a'", "'ü'", "''", "'b c'"]),
    ("st", "SET('x','y','z')", ["'x,z'", "''", "'x,y,z'", "'z'"]),
    ("js", "JSON", ['\'{"a": [1, 2.5, null, true], "ü": "😀"}\'', "'\"s\"'", "'null'", "'[]'"]),
    ("l1", "VARCHAR(5) CHARACTER SET latin1", ["'é'", "'ÿ ß'", "''"]),
    ("cp", "VARCHAR(5) CHARACTER SET cp1251", ["'Жж'", "''"]),
    ("gb", "VARCHAR(5) CHARACTER SET gbk", ["'中文'"]),
    ("u3", "VARCHAR(5) CHARACTER SET utf8mb3", ["'€ü'"]),
    ("tx", "TEXT CHARACTER SET utf8mb4", ["'😀 a\\n'", "''"]),
    ("g", "GEOMETRY", ["ST_GeomFromText('POINT(1 2)')", "ST_GeomFromText('LINESTRING(0 0, 1 1)', 4326)"]),
    ("ts0", "TIMESTAMP NULL", ["'0000-00-00 00:00:00'", "'2038-01-19 03:14:07'"]),
]


def test_edge_values_through_the_binlog_land_as_the_snapshot_reads_them(
    mariadb: MariaDBServer, config: PipelineConfig, row_metadata: str
) -> None:
    """The same edge values read by the snapshot's driver and by the binlog reader (inserted, then updated to
    themselves through a second column), turned into the Arrow values Iceberg gets, must be equal. Caught:
    BINARY(n) lost its trailing zero bytes, an empty binary value came as '', a negative TIME with a fraction
    was off by up to a second, and YEAR 0000 read as 1900 (python-mysql-replication reads them so too)."""
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.edge (id INT PRIMARY KEY, n INT, "
        + ", ".join(f"{c} {t}" for c, t, _ in EDGE_COLUMNS)
        + ")",
    )
    schema = next(s for s in discover(config.source, config.tables, config.table_options).schemas if s.table == "edge")
    start = _position(config)
    count = max(len(values) for _, _, values in EDGE_COLUMNS)
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates
        for i in range(count):
            values = [values[i] if i < len(values) else "NULL" for _, _, values in EDGE_COLUMNS]
            cur.execute(f"INSERT INTO edge VALUES ({i}, 0, {', '.join(values)})")
        cur.execute("UPDATE edge SET n = 1")  # every value again, as a before and an after image
        conn.commit()
    with connect(config.source) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {DB}.edge ORDER BY id")
        snapshot = [tuple(row) for row in cur.fetchall()]
    reader = BinlogReader(config.source, [schema], start)
    try:
        changes = [c for t in reader.transactions() for c in getattr(t, "changes", [])]
    finally:
        reader.close()
    targets = target_columns(schema)

    def arrow(rows: list[Any]) -> list[dict[str, Any]]:
        return rows_to_record_batch(targets, sorted(rows, key=lambda r: r[0])).to_pylist()

    inserted = arrow([c.after for c in changes if c.before is None])
    before = arrow([c.before for c in changes if c.before is not None])
    after = arrow([(c.after[0], 0, *c.after[2:]) for c in changes if c.before is not None])
    expected = arrow([(r[0], 0, *r[2:]) for r in snapshot])
    for got in (inserted, before, after):
        for want_row, got_row in zip(expected, got, strict=True):
            assert {k: v for k, v in got_row.items() if v != want_row[k]} == {}, want_row
