"""MySQL/MariaDB column -> Iceberg column mapping and PyMySQL value conversion (ingest/model/columns.py)."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from ingest.errors import SourceError, UnsupportedTableError
from ingest.model.columns import (
    SourceColumn,
    TargetColumn,
    arrow_schema,
    identity,
    map_column,
    map_columns,
    rows_to_record_batch,
    spark_ddl,
    text_rows_to_record_batch,
)

UTC = dt.UTC


def col(
    column_type: str,
    *,
    name: str = "c",
    nullable: bool = True,
    precision: int | None = None,
    scale: int | None = None,
    fsp: int | None = None,
) -> SourceColumn:
    """A SourceColumn as information_schema describes `column_type` (DATA_TYPE is its first word)."""
    data_type = re.match(r"[a-z][a-z0-9]*", column_type)
    assert data_type is not None
    return SourceColumn(
        name=name,
        data_type=data_type.group(0),
        column_type=column_type,
        nullable=nullable,
        numeric_precision=precision,
        numeric_scale=scale,
        datetime_precision=fsp,
        character_set=None,
    )


def target(column_type: str, **kwargs: Any) -> TargetColumn:
    return map_column("shop.orders", col(column_type, **kwargs))


def through_arrow(t: TargetColumn, values: list[Any]) -> list[Any]:
    """Values as they come out of a record batch built from one column."""
    batch = rows_to_record_batch([t], [(v,) for v in values])
    assert batch.schema == arrow_schema([t])
    result: list[Any] = batch.column(0).to_pylist()
    return result


# --- information_schema -----------------------------------------------------------------------------


def test_from_information_schema_reads_upper_case_keys() -> None:
    row = {
        "COLUMN_NAME": "price",
        "DATA_TYPE": "DECIMAL",
        "COLUMN_TYPE": "decimal(10,2) unsigned",
        "IS_NULLABLE": "NO",
        "NUMERIC_PRECISION": 10,
        "NUMERIC_SCALE": 2,
        "DATETIME_PRECISION": None,
        "CHARACTER_SET_NAME": None,
    }
    assert SourceColumn.from_information_schema(row) == SourceColumn(
        "price", "decimal", "decimal(10,2) unsigned", False, 10, 2, None, None
    )


def test_from_information_schema_decodes_bytes_and_reads_nullable_yes() -> None:
    row = {
        "COLUMN_NAME": "note 📝".encode(),
        "DATA_TYPE": b"varchar",
        "COLUMN_TYPE": b"varchar(20)",
        "IS_NULLABLE": b"YES",
        "NUMERIC_PRECISION": None,
        "NUMERIC_SCALE": None,
        "DATETIME_PRECISION": None,
        "CHARACTER_SET_NAME": b"utf8mb4",
    }
    source = SourceColumn.from_information_schema(row)
    assert (source.name, source.data_type, source.nullable, source.character_set) == (
        "note 📝",
        "varchar",
        True,
        "utf8mb4",
    )


def test_unsigned_read_from_column_type() -> None:
    assert col("int(10) unsigned zerofill").unsigned
    assert not col("int(11)").unsigned


# --- the mapping table (docs/types.md) --------------------------------------------------------------

MAPPING = [
    # column_type, SourceColumn kwargs, spark type, arrow type
    ("tinyint(4)", {}, "INT", pa.int32()),
    ("tinyint(1)", {}, "INT", pa.int32()),
    ("tinyint(3) unsigned", {}, "INT", pa.int32()),
    ("smallint(6)", {}, "INT", pa.int32()),
    ("smallint(5) unsigned", {}, "INT", pa.int32()),
    ("mediumint(9)", {}, "INT", pa.int32()),
    ("mediumint(8) unsigned", {}, "INT", pa.int32()),
    ("int(11)", {}, "INT", pa.int32()),
    ("int(10) unsigned", {}, "BIGINT", pa.int64()),
    ("bigint(20)", {}, "BIGINT", pa.int64()),
    ("bigint(20) unsigned", {}, "DECIMAL(20,0)", pa.decimal128(20, 0)),
    ("year(4)", {}, "INT", pa.int32()),
    ("decimal(10,2)", {"precision": 10, "scale": 2}, "DECIMAL(10,2)", pa.decimal128(10, 2)),
    ("decimal(38,10)", {"precision": 38, "scale": 10}, "DECIMAL(38,10)", pa.decimal128(38, 10)),
    ("decimal(39,0)", {"precision": 39, "scale": 0}, "STRING", pa.string()),
    ("decimal(65,30)", {"precision": 65, "scale": 30}, "STRING", pa.string()),
    ("float", {}, "FLOAT", pa.float32()),
    ("double", {}, "DOUBLE", pa.float64()),
    ("bit(1)", {"precision": 1}, "BOOLEAN", pa.bool_()),
    ("bit(2)", {"precision": 2}, "BIGINT", pa.int64()),
    ("bit(63)", {"precision": 63}, "BIGINT", pa.int64()),
    ("bit(64)", {"precision": 64}, "DECIMAL(20,0)", pa.decimal128(20, 0)),
    ("char(3)", {}, "STRING", pa.string()),
    ("varchar(255)", {}, "STRING", pa.string()),
    ("tinytext", {}, "STRING", pa.string()),
    ("text", {}, "STRING", pa.string()),
    ("mediumtext", {}, "STRING", pa.string()),
    ("longtext", {}, "STRING", pa.string()),
    ("enum('a','b')", {}, "STRING", pa.string()),
    ("set('a','b')", {}, "STRING", pa.string()),
    ("json", {}, "STRING", pa.string()),
    ("binary(16)", {}, "BINARY", pa.binary()),
    ("varbinary(255)", {}, "BINARY", pa.binary()),
    ("tinyblob", {}, "BINARY", pa.binary()),
    ("blob", {}, "BINARY", pa.binary()),
    ("mediumblob", {}, "BINARY", pa.binary()),
    ("longblob", {}, "BINARY", pa.binary()),
    ("geometry", {}, "BINARY", pa.binary()),
    ("point", {}, "BINARY", pa.binary()),
    ("linestring", {}, "BINARY", pa.binary()),
    ("polygon", {}, "BINARY", pa.binary()),
    ("multipoint", {}, "BINARY", pa.binary()),
    ("multilinestring", {}, "BINARY", pa.binary()),
    ("multipolygon", {}, "BINARY", pa.binary()),
    ("geometrycollection", {}, "BINARY", pa.binary()),
    ("geomcollection", {}, "BINARY", pa.binary()),
    ("date", {}, "DATE", pa.date32()),
    ("datetime(6)", {"fsp": 6}, "TIMESTAMP_NTZ", pa.timestamp("us")),
    ("timestamp", {"fsp": 0}, "TIMESTAMP", pa.timestamp("us", tz="UTC")),
    ("time(3)", {"fsp": 3}, "STRING", pa.string()),
]


@pytest.mark.parametrize(("column_type", "kwargs", "spark_type", "arrow_type"), MAPPING)
def test_mapping(column_type: str, kwargs: dict[str, Any], spark_type: str, arrow_type: Any) -> None:
    t = target(column_type, **kwargs)
    assert (t.spark_type, t.arrow_type) == (spark_type, arrow_type)


def _spark_type(ddl: str) -> Any:
    from pyspark.sql import types as T

    m = re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", ddl)
    if m:
        return T.DecimalType(int(m.group(1)), int(m.group(2)))
    simple = {
        "INT": T.IntegerType(),
        "BIGINT": T.LongType(),
        "FLOAT": T.FloatType(),
        "DOUBLE": T.DoubleType(),
        "BOOLEAN": T.BooleanType(),
        "STRING": T.StringType(),
        "BINARY": T.BinaryType(),
        "DATE": T.DateType(),
        "TIMESTAMP": T.TimestampType(),
        "TIMESTAMP_NTZ": T.TimestampNTZType(),
    }
    return simple[ddl]


@pytest.mark.parametrize(("column_type", "kwargs", "spark_type", "arrow_type"), MAPPING)
def test_arrow_type_is_what_spark_expects_for_the_spark_type(
    column_type: str, kwargs: dict[str, Any], spark_type: str, arrow_type: Any
) -> None:
    from pyspark.sql.pandas.types import to_arrow_type

    t = target(column_type, **kwargs)
    assert to_arrow_type(_spark_type(t.spark_type)) == t.arrow_type


def test_iceberg_types_from_the_arrow_schema() -> None:
    # The Iceberg column types docs/types.md promises, as pyiceberg derives them from the arrow schema.
    from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow
    from pyiceberg.schema import Schema

    expected = {
        "int(11)": "int",
        "bigint(20)": "long",
        "bigint(20) unsigned": "decimal(20, 0)",
        "bit(64)": "decimal(20, 0)",
        "bit(1)": "boolean",
        "float": "float",
        "double": "double",
        "varchar(10)": "string",
        "blob": "binary",
        "date": "date",
        "datetime": "timestamp",
        "timestamp": "timestamptz",
    }
    targets = [target(ct, name=ct, precision=64 if ct == "bit(64)" else None) for ct in expected]
    schema = visit_pyarrow(arrow_schema(targets), _ConvertToIcebergWithoutIDs())
    assert isinstance(schema, Schema)
    assert {f.name: str(f.field_type) for f in schema.fields} == expected


# --- integers ---------------------------------------------------------------------------------------


def test_integers_keep_their_edges() -> None:
    assert through_arrow(target("int(11)"), [-(2**31), 2**31 - 1]) == [-(2**31), 2**31 - 1]
    assert through_arrow(target("int(10) unsigned"), [0, 2**32 - 1]) == [0, 2**32 - 1]
    assert through_arrow(target("mediumint(8) unsigned"), [16777215]) == [16777215]
    assert through_arrow(target("bigint(20)"), [-(2**63), 2**63 - 1]) == [-(2**63), 2**63 - 1]
    assert through_arrow(target("year(4)"), [1901, 2155, 0]) == [1901, 2155, 0]


def test_tinyint_1_is_an_int_not_a_boolean() -> None:
    t = target("tinyint(1)")
    assert t.spark_type == "INT"
    assert through_arrow(t, [0, 1, 2, 127, -128]) == [0, 1, 2, 127, -128]


@pytest.mark.parametrize("value", [18446744073709551615, 18446744073709551604, 2**63, 0])
def test_bigint_unsigned_survives_exactly(value: int) -> None:
    t = target("bigint(20) unsigned", precision=20)
    assert t.convert(value) == Decimal(value)
    assert through_arrow(t, [value]) == [Decimal(value)]


def test_bigint_unsigned_batch_mixes_nulls_and_values_above_int64() -> None:
    values = [1, None, 18446744073709551615]
    out = through_arrow(target("bigint(20) unsigned"), values)
    assert out == [Decimal(1), None, Decimal(18446744073709551615)]


# --- BIT --------------------------------------------------------------------------------------------


def test_bit_64_with_high_bit_set_stays_positive() -> None:
    t = target("bit(64)", precision=64)
    assert t.convert(b"\xff" * 8) == Decimal(18446744073709551615)
    assert through_arrow(t, [b"\xff" * 8, b"\x80" + b"\x00" * 7, None]) == [
        Decimal(18446744073709551615),
        Decimal(2**63),
        None,
    ]


def test_bit_8_is_unsigned_big_endian() -> None:
    t = target("bit(8)", precision=8)
    assert t.convert(b"\x80") == 128
    assert through_arrow(t, [b"\x80", b"\x01"]) == [128, 1]
    # Two bytes, big-endian: BIT(16) b'\x01\x00' is 256.
    assert target("bit(16)", precision=16).convert(b"\x01\x00") == 256


def test_bit_1_is_boolean() -> None:
    t = target("bit(1)", precision=1)
    assert (t.convert(b"\x01"), t.convert(b"\x00")) == (True, False)
    assert through_arrow(t, [b"\x01", b"\x00", None]) == [True, False, None]


def test_bit_accepts_python_mysql_replication_bit_strings() -> None:
    # The binlog reader returns BIT as '0'/'1' text; both paths must give the same value.
    assert target("bit(8)", precision=8).convert("10000000") == 128
    assert target("bit(64)", precision=64).convert("1" * 64) == Decimal(2**64 - 1)


def test_bit_width_falls_back_to_column_type() -> None:
    assert target("bit(1)").spark_type == "BOOLEAN"
    assert target("bit(64)").spark_type == "DECIMAL(20,0)"


# --- DECIMAL / FLOAT --------------------------------------------------------------------------------


def test_decimal_up_to_38_digits_is_a_decimal() -> None:
    t = target("decimal(10,2)", precision=10, scale=2)
    assert t.convert is identity
    out = through_arrow(t, [Decimal("-12345678.90"), Decimal("99999999.99"), Decimal("0.00")])
    assert out == [Decimal("-12345678.90"), Decimal("99999999.99"), Decimal("0.00")]
    assert str(out[0]) == "-12345678.90"


def test_decimal_precision_falls_back_to_column_type() -> None:
    assert target("decimal(12,4)").spark_type == "DECIMAL(12,4)"
    assert target("decimal(65,30)").spark_type == "STRING"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal("1.5"), "1.500000000000000000000000000000"),
        (Decimal("-1.5"), "-1.500000000000000000000000000000"),
        (Decimal("1.500000000000000000000000000000"), "1.500000000000000000000000000000"),
        (Decimal("1E-30"), "0.000000000000000000000000000001"),
        (Decimal("-0E-30"), "0.000000000000000000000000000000"),
        (Decimal("1E+34"), "10000000000000000000000000000000000.000000000000000000000000000000"),
        (
            Decimal("-99999999999999999999999999999999999.999999999999999999999999999999"),
            "-99999999999999999999999999999999999.999999999999999999999999999999",
        ),
    ],
)
def test_decimal_65_30_is_mysql_canonical_text(value: Decimal, text: str) -> None:
    t = target("decimal(65,30)", precision=65, scale=30)
    assert t.convert(value) == text
    assert through_arrow(t, [value]) == [text]


def test_decimal_over_38_with_scale_0_has_no_point() -> None:
    t = target("decimal(65,0)", precision=65, scale=0)
    assert t.convert(Decimal("-12345678901234567890123456789012345678901")) == (
        "-12345678901234567890123456789012345678901"
    )


def test_float_and_double() -> None:
    assert through_arrow(target("float"), [1.5, -3.25e38]) == [1.5, pytest.approx(-3.25e38, rel=1e-6)]
    assert through_arrow(target("double"), [0.1, -1.7976931348623157e308]) == [0.1, -1.7976931348623157e308]


# --- strings and binaries ---------------------------------------------------------------------------


def test_strings_keep_emoji_and_text_as_returned() -> None:
    values = ["héllo 😀👩‍💻", "", "a,c", '{"k": [1, "😀"]}']
    for column_type in ["varchar(64)", "longtext", "set('a','b','c')", "json", "enum('😀','x')"]:
        t = target(column_type)
        assert t.convert is identity
        assert through_arrow(t, values) == values


def test_mariadb_json_is_longtext_and_maps_to_string() -> None:
    source = SourceColumn.from_information_schema(
        {
            "COLUMN_NAME": "doc",
            "DATA_TYPE": "longtext",
            "COLUMN_TYPE": "longtext",
            "IS_NULLABLE": "YES",
            "NUMERIC_PRECISION": None,
            "NUMERIC_SCALE": None,
            "DATETIME_PRECISION": None,
            "CHARACTER_SET_NAME": "utf8mb4",
        }
    )
    assert map_column("db.t", source).spark_type == "STRING"


def test_binary_and_spatial_keep_bytes() -> None:
    # MySQL internal geometry: 4-byte SRID, then WKB of POINT(1 2).
    point = b"\x00\x00\x00\x00\x01\x01\x00\x00\x00" + b"\x00" * 6 + b"\xf0?" + b"\x00" * 7 + b"@"
    assert through_arrow(target("point"), [point]) == [point]
    blob = bytes(range(256))
    assert through_arrow(target("longblob"), [blob, b""]) == [blob, b""]
    assert through_arrow(target("binary(2)"), [b"\x00\xff"]) == [b"\x00\xff"]


# --- dates and times --------------------------------------------------------------------------------


def test_timestamp_attaches_utc() -> None:
    t = target("timestamp(6)", fsp=6)
    naive = dt.datetime(2024, 3, 31, 1, 30, 0, 123456)
    assert t.convert(naive) == dt.datetime(2024, 3, 31, 1, 30, 0, 123456, tzinfo=UTC)
    assert t.convert(naive).tzinfo is UTC
    [out] = through_arrow(t, [naive])
    assert out == dt.datetime(2024, 3, 31, 1, 30, 0, 123456, tzinfo=UTC)
    # Epoch microseconds of the UTC reading, not of any local-time reading.
    micros = rows_to_record_batch([t], [(naive,)]).column(0).cast(pa.int64()).to_pylist()
    assert micros == [1711848600123456]


def test_timestamp_aware_value_is_moved_to_utc() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    assert target("timestamp").convert(dt.datetime(2024, 1, 1, 2, tzinfo=plus_two)) == dt.datetime(
        2024, 1, 1, 0, tzinfo=UTC
    )


def test_binlog_zero_timestamp_epoch_becomes_null() -> None:
    # python-mysql-replication reads a zero TIMESTAMP as 0 seconds; real TIMESTAMPs start at 1 second.
    t = target("timestamp(6)", fsp=6)
    epoch = dt.datetime(1970, 1, 1)
    one_second = dt.datetime(1970, 1, 1, 0, 0, 1)
    assert t.convert(epoch) is None
    assert t.convert(one_second) == one_second.replace(tzinfo=UTC)
    assert through_arrow(t, [epoch, one_second, None]) == [None, one_second.replace(tzinfo=UTC), None]
    # DATETIME has no such gap: 1970-01-01 00:00:00 is a real value there.
    assert target("datetime").convert(epoch) == epoch


def test_datetime_stays_naive() -> None:
    t = target("datetime(6)", fsp=6)
    value = dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert t.convert(value) == value
    assert t.convert(value).tzinfo is None
    assert through_arrow(t, [value, dt.datetime(1000, 1, 1)]) == [value, dt.datetime(1000, 1, 1)]


def test_date() -> None:
    t = target("date")
    assert through_arrow(t, [dt.date(1000, 1, 1), dt.date(9999, 12, 31)]) == [
        dt.date(1000, 1, 1),
        dt.date(9999, 12, 31),
    ]


@pytest.mark.parametrize(
    ("column_type", "zero", "valid"),
    [
        ("date", "0000-00-00", dt.date(2020, 1, 2)),
        ("date", b"0000-00-00", dt.date(2020, 1, 2)),
        ("date", "2020-00-00", dt.date(2020, 1, 2)),
        ("datetime", "0000-00-00 00:00:00", dt.datetime(2020, 1, 2, 3, 4, 5)),
        ("datetime", b"0000-00-00 00:00:00", dt.datetime(2020, 1, 2, 3, 4, 5)),
        ("datetime", "2020-00-00 00:00:00", dt.datetime(2020, 1, 2, 3, 4, 5)),
        ("timestamp", "0000-00-00 00:00:00", dt.datetime(2020, 1, 2, 3, 4, 5)),
        ("timestamp", b"0000-00-00 00:00:00", dt.datetime(2020, 1, 2, 3, 4, 5)),
    ],
)
def test_zero_dates_become_null(column_type: str, zero: str | bytes, valid: Any) -> None:
    t = target(column_type, nullable=False)
    assert t.convert(zero) is None
    out = through_arrow(t, [valid, zero, None])
    assert out[1:] == [None, None]
    assert out[0] == (valid.replace(tzinfo=UTC) if column_type == "timestamp" else valid)


def test_date_targets_are_nullable_even_when_the_source_is_not_null() -> None:
    # A NOT NULL DATETIME can hold '0000-00-00 00:00:00', which becomes NULL.
    for column_type in ["date", "datetime", "timestamp"]:
        assert target(column_type, nullable=False).nullable
    assert not target("int(11)", nullable=False).nullable


@pytest.mark.parametrize(
    ("fsp", "value", "text"),
    [
        (0, dt.timedelta(hours=12), "12:00:00"),
        (0, dt.timedelta(0), "00:00:00"),
        (0, dt.timedelta(seconds=-1), "-00:00:01"),
        (0, dt.timedelta(hours=25, minutes=6, seconds=17), "25:06:17"),
        (0, -dt.timedelta(hours=25, minutes=6, seconds=17), "-25:06:17"),
        (0, dt.timedelta(hours=838, minutes=59, seconds=59), "838:59:59"),
        (0, -dt.timedelta(hours=838, minutes=59, seconds=59), "-838:59:59"),
        (3, dt.timedelta(hours=12, milliseconds=500), "12:00:00.500"),
        (3, -dt.timedelta(milliseconds=500), "-00:00:00.500"),
        (6, dt.timedelta(hours=1, microseconds=1), "01:00:00.000001"),
        (6, -dt.timedelta(hours=838, minutes=59, seconds=59, microseconds=999999), "-838:59:59.999999"),
    ],
)
def test_time_is_mysql_text(fsp: int, value: dt.timedelta, text: str) -> None:
    t = target(f"time({fsp})" if fsp else "time", fsp=fsp)
    assert t.convert(value) == text
    assert through_arrow(t, [value]) == [text]


def test_time_fsp_falls_back_to_column_type() -> None:
    assert target("time(3)").convert(dt.timedelta(microseconds=500000)) == "00:00:00.500"


def test_time_negative_timedelta_is_days_minus_one() -> None:
    # What PyMySQL builds for '-00:00:01': days=-1, seconds=86399.
    value = dt.timedelta(days=-1, seconds=86399)
    assert (value.days, value.seconds) == (-1, 86399)
    assert target("time").convert(value) == "-00:00:01"


# --- NULLs ------------------------------------------------------------------------------------------

ALL_TYPES = [(column_type, kwargs) for column_type, kwargs, _, _ in MAPPING]


def test_nulls_in_every_type() -> None:
    targets = [target(ct, name=f"c{i}", **kw) for i, (ct, kw) in enumerate(ALL_TYPES)]
    for t in targets:
        assert t.convert(None) is None, t.spark_type
    batch = rows_to_record_batch(targets, [tuple(None for _ in targets)] * 2)
    assert batch.num_rows == 2
    assert [batch.column(i).null_count for i in range(len(targets))] == [2] * len(targets)


def test_null_in_not_null_column_is_refused() -> None:
    with pytest.raises(SourceError, match="'id'"):
        rows_to_record_batch([target("bigint(20)", name="id", nullable=False)], [(1,), (None,)])


# --- DDL, schema, batches ---------------------------------------------------------------------------


def test_spark_ddl_quotes_names() -> None:
    targets = [
        target("bigint(20)", name="id", nullable=False),
        target("varchar(5)", name="my col"),
        target("decimal(20,2)", name="we`ird", precision=20, scale=2),
        target("datetime", name="at"),
    ]
    expected = "`id` BIGINT NOT NULL, `my col` STRING, `we``ird` DECIMAL(20,2), `at` TIMESTAMP_NTZ"
    assert spark_ddl(targets) == expected


def test_arrow_schema_names_types_and_nullability() -> None:
    targets = [target("int(11)", name="id", nullable=False), target("text", name="my col")]
    assert arrow_schema(targets) == pa.schema(
        [pa.field("id", pa.int32(), nullable=False), pa.field("my col", pa.string(), nullable=True)]
    )


def test_rows_to_record_batch() -> None:
    sources = [
        col("bigint(20) unsigned", name="id", nullable=False, precision=20),
        col("varchar(20)", name="name"),
        col("timestamp", name="ts"),
        col("time(3)", name="t", fsp=3),
        col("bit(1)", name="flag", precision=1),
        col("decimal(65,30)", name="big", precision=65, scale=30),
        col("date", name="d"),
    ]
    targets = map_columns("db.t", sources)
    rows = [
        (
            18446744073709551615,
            "😀",
            dt.datetime(2024, 1, 1),
            dt.timedelta(hours=-1),
            b"\x01",
            Decimal("1.5"),
            "0000-00-00",
        ),
        (1, None, None, None, None, None, dt.date(2024, 2, 29)),
    ]
    batch = rows_to_record_batch(targets, rows)
    assert batch.schema == arrow_schema(targets)
    assert batch.to_pydict() == {
        "id": [Decimal(18446744073709551615), Decimal(1)],
        "name": ["😀", None],
        "ts": [dt.datetime(2024, 1, 1, tzinfo=UTC), None],
        "t": ["-01:00:00.000", None],
        "flag": [True, None],
        "big": ["1.500000000000000000000000000000", None],
        "d": [None, dt.date(2024, 2, 29)],
    }


def test_rows_to_record_batch_without_rows_has_the_schema() -> None:
    targets = [target("int(11)", name="a"), target("time", name="b")]
    batch = rows_to_record_batch(targets, [])
    assert batch.num_rows == 0
    assert batch.schema == arrow_schema(targets)


def test_rows_of_the_wrong_length_are_refused() -> None:
    targets = [target("int(11)", name="a"), target("int(11)", name="b")]
    with pytest.raises(ValueError, match="different lengths"):
        rows_to_record_batch(targets, [(1, 2), (1,)])
    with pytest.raises(ValueError, match="3 values"):
        rows_to_record_batch(targets, [(1, 2, 3)])


def test_columns_without_conversion_are_identity_detectable() -> None:
    plain = ["int(11)", "bigint(20)", "varchar(3)", "json", "blob", "point", "double", "float", "year"]
    for column_type in plain:
        assert not target(column_type).needs_conversion, column_type
    converted = ["time", "bit(1)", "bigint(20) unsigned", "date", "datetime", "timestamp"]
    for column_type in converted:
        assert target(column_type).needs_conversion, column_type
    assert target("decimal(65,30)", precision=65, scale=30).needs_conversion


def test_a_plain_callable_converter_is_applied_per_value() -> None:
    calls: list[Any] = []

    def spy(value: Any) -> Any:
        calls.append(value)
        return value

    spied = TargetColumn("a", "INT", pa.int32(), True, spy)
    plain = target("int(11)", name="b")
    batch = rows_to_record_batch([spied, plain], [(1, 2), (3, 4)])
    assert calls == [1, 3]
    assert batch.column(1).to_pylist() == [2, 4]


def test_equal_columns_compare_equal() -> None:
    assert target("time(3)", fsp=3) == target("time(3)", fsp=3)
    assert target("time(3)", fsp=3) != target("time(6)", fsp=6)


@pytest.mark.parametrize("column_type", ["uuid", "inet4", "inet6"])
def test_mariadbs_uuid_and_inet_types_are_the_servers_text(column_type: str) -> None:
    [target] = map_columns("shop.hosts", [col(column_type, name="addr")])
    assert target.spark_type == "STRING" and target.text_form == "string" and not target.needs_conversion


# --- unsupported ------------------------------------------------------------------------------------


@pytest.mark.parametrize("column_type", ["vector(3)", "whatever"])
def test_unsupported_type_names_table_column_and_type(column_type: str) -> None:
    with pytest.raises(UnsupportedTableError) as info:
        map_columns("shop.orders", [col("int(11)", name="id"), col(column_type, name="odd col")])
    message = str(info.value)
    assert "shop.orders" in message
    assert "'odd col'" in message
    assert column_type in message
    assert "xclude" in message


# --- the text path (mysqlclient without converters) -------------------------------------------------

# (column, the server's text-protocol bytes, what PyMySQL's default converters return for them)
TEXT_CASES: list[tuple[str, dict[str, Any], bytes | None, Any]] = [
    ("int", {}, b"-2147483648", -2147483648),
    ("tinyint(1)", {}, b"5", 5),
    ("int unsigned", {}, b"4294967295", 4294967295),
    ("bigint", {}, b"-9223372036854775808", -9223372036854775808),
    ("bigint unsigned", {}, b"18446744073709551615", 18446744073709551615),
    ("year", {}, b"0000", 0),
    ("decimal(10,2)", {"precision": 10, "scale": 2}, b"-3.25", Decimal("-3.25")),
    ("decimal(65,30)", {"precision": 65, "scale": 30}, b"1.500000000000000000000000000000", Decimal("1.5")),
    ("float", {}, b"1.25", 1.25),
    ("float", {}, b"0.1", 0.1),
    ("double", {}, b"1e300", 1e300),
    ("double", {}, b"-0", -0.0),
    ("bit(1)", {"precision": 1}, b"\x01", b"\x01"),
    ("bit(64)", {"precision": 64}, b"\xff" * 8, b"\xff" * 8),
    ("varchar(10)", {}, "😀é".encode(), "😀é"),
    ("json", {}, b'{"k": [1, 2]}', '{"k": [1, 2]}'),
    ("varbinary(4)", {}, b"\x00\xff", b"\x00\xff"),
    ("date", {}, b"0001-01-01", dt.date(1, 1, 1)),
    ("date", {}, b"0000-00-00", "0000-00-00"),
    ("date", {}, b"2020-02-31", "2020-02-31"),
    ("datetime(6)", {"fsp": 6}, b"1969-07-20 20:17:40.123456", dt.datetime(1969, 7, 20, 20, 17, 40, 123456)),
    ("datetime(3)", {"fsp": 3}, b"2024-03-10 02:30:00.500", dt.datetime(2024, 3, 10, 2, 30, 0, 500000)),
    ("datetime", {}, b"0000-00-00 00:00:00", "0000-00-00 00:00:00"),
    ("timestamp(6)", {"fsp": 6}, b"2000-01-01 00:00:00.000001", dt.datetime(2000, 1, 1, 0, 0, 0, 1)),
    ("timestamp", {}, b"0000-00-00 00:00:00", "0000-00-00 00:00:00"),
    ("time(3)", {"fsp": 3}, b"-838:59:59.500", -dt.timedelta(hours=838, minutes=59, seconds=59, microseconds=500000)),
    ("time", {}, b"-00:00:01", -dt.timedelta(seconds=1)),
    ("int", {}, None, None),
]


@pytest.mark.parametrize(("column_type", "kwargs", "text", "driver_value"), TEXT_CASES)
def test_text_path_equals_the_driver_path(
    column_type: str, kwargs: dict[str, Any], text: Any, driver_value: Any
) -> None:
    t = target(column_type, **kwargs)
    from_text = t.text_to_array([text, None])
    from_driver = t.to_array([driver_value, None])
    assert from_text.type == t.arrow_type
    assert from_text.to_pylist() == from_driver.to_pylist()


def test_text_path_nulls_only_the_invalid_dates_of_a_column() -> None:
    t = target("datetime")
    values = [b"2020-01-01 00:00:00", b"0000-00-00 00:00:00", None, b"2020-00-10 00:00:00", b"1999-12-31 23:59:59"]
    assert t.text_to_array(values).to_pylist() == [
        dt.datetime(2020, 1, 1),
        None,
        None,
        None,
        dt.datetime(1999, 12, 31, 23, 59, 59),
    ]


def test_text_path_refuses_null_in_a_not_null_column() -> None:
    t = target("int", nullable=False)
    with pytest.raises(SourceError, match="NOT NULL"):
        text_rows_to_record_batch([t], [(b"1",), (None,)])


def test_text_path_refuses_a_number_it_cannot_parse() -> None:
    with pytest.raises(pa.ArrowInvalid):
        target("int").text_to_array([b"12x"])
