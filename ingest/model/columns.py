"""MySQL/MariaDB column types -> Iceberg columns, and driver values -> arrow values.

A source column (one row of ``information_schema.COLUMNS``) maps to a ``TargetColumn`` that carries the
Spark SQL DDL type, the arrow type and a value converter. The three must agree because rows become
``pyarrow.RecordBatch``es that a Spark Python Data Source yields and Spark then writes to Iceberg.
The converters take what PyMySQL returns with its default converters, ``charset='utf8mb4'`` and the
session ``time_zone`` set to ``'+00:00'``. docs/types.md is the user-facing version of this mapping.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import SourceError, UnsupportedTableError

__all__ = [
    "TEMPORAL_TYPES",
    "InvalidTemporal",
    "SourceColumn",
    "TargetColumn",
    "arrow_schema",
    "identity",
    "map_column",
    "map_columns",
    "quote_identifier",
    "rows_to_record_batch",
    "spark_ddl",
    "text_rows_to_record_batch",
]

# Iceberg (and Spark) decimals stop at 38 digits; MySQL/MariaDB allow 65.
MAX_DECIMAL_PRECISION = 38

_INT32_TYPES = frozenset({"tinyint", "smallint", "mediumint"})
_TEXT_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"})
_STRING_TYPES = _TEXT_TYPES | {"enum", "set", "json"}
_SERVER_TEXT_TYPES = frozenset({"uuid", "inet4", "inet6"})
_BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
# MySQL 8 reports GEOMETRYCOLLECTION as 'geomcollection' in DATA_TYPE; MariaDB and MySQL 5.7 do not.
_SPATIAL_TYPES = frozenset(
    {
        "geometry",
        "point",
        "linestring",
        "polygon",
        "multipoint",
        "multilinestring",
        "multipolygon",
        "geometrycollection",
        "geomcollection",
    }
)

_TYPE_ARGS = re.compile(r"\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)")
_MEMBER = re.compile(r"'((?:[^']|'')*)'")
# The types whose values MySQL may hold as zero or invalid dates, which no Iceberg value can hold.
TEMPORAL_TYPES = frozenset({"date", "datetime", "timestamp"})


class InvalidTemporal(str):
    """A DATE, DATETIME or TIMESTAMP value that is no calendar date ('0000-00-00', '2020-02-31'), as MySQL prints it.

    The binlog decoder gives these where the library gave None (or failed), so that the raw value can be
    reported (ingest/changes/rejects.py). It is driver text, which the date converters turn into NULL, as
    they do with the text PyMySQL returns for the same values in the snapshot.
    """

    __slots__ = ()


# Arrow raises these when a raw driver value does not fit the target type (a zero date given as str).
_RAW_REJECTED = (TypeError, ValueError, OverflowError)


def identity(value: Any) -> Any:
    """The converter of columns whose driver values pyarrow takes as they are.

    ``rows_to_record_batch`` checks for this exact function (``convert is identity``) and then hands
    the whole column to pyarrow without a Python call per value.
    """
    return value


@dataclass(frozen=True)
class SourceColumn:
    """One column as ``information_schema.COLUMNS`` describes it."""

    name: str
    data_type: str
    column_type: str
    nullable: bool
    numeric_precision: int | None = None
    numeric_scale: int | None = None
    datetime_precision: int | None = None
    character_set: str | None = None

    @classmethod
    def from_information_schema(cls, row: Mapping[str, Any]) -> SourceColumn:
        """Build from a dict cursor row of ``SELECT ... FROM information_schema.COLUMNS``."""
        return cls(
            name=_text(_field(row, "COLUMN_NAME")) or "",
            data_type=(_text(_field(row, "DATA_TYPE")) or "").lower(),
            column_type=_text(_field(row, "COLUMN_TYPE")) or "",
            nullable=(_text(_field(row, "IS_NULLABLE")) or "").upper() == "YES",
            numeric_precision=_int_or_none(_field(row, "NUMERIC_PRECISION")),
            numeric_scale=_int_or_none(_field(row, "NUMERIC_SCALE")),
            datetime_precision=_int_or_none(_field(row, "DATETIME_PRECISION")),
            character_set=_text(_field(row, "CHARACTER_SET_NAME")),
        )

    @property
    def unsigned(self) -> bool:
        # ZEROFILL implies UNSIGNED and COLUMN_TYPE then says both.
        return "unsigned" in self.column_type.lower()

    @property
    def members(self) -> list[str]:
        """An ENUM's or SET's members in definition order, as COLUMN_TYPE quotes them ('' is one quote)."""
        return [m.replace("''", "'") for m in _MEMBER.findall(self.column_type)]


@dataclass(frozen=True)
class TargetColumn:
    """The Iceberg column a source column becomes, with the converter for its values.

    ``convert`` maps one PyMySQL value to one value pyarrow accepts for ``arrow_type``; None stays None.
    It is ``identity`` when no conversion is needed.
    """

    name: str
    spark_type: str
    arrow_type: Any  # pyarrow.DataType; pyarrow ships no type stubs
    nullable: bool
    convert: Callable[[Any], Any] = identity
    text_form: str = "convert"
    """How the server's text-protocol bytes of this column become arrow values (see ``text_to_array``)."""

    @property
    def needs_conversion(self) -> bool:
        return self.convert is not identity

    def to_array(self, values: Sequence[Any]) -> Any:
        """Build the arrow array (``pyarrow.Array``) of one column of driver values."""
        if self.convert is identity:
            return pa.array(values, type=self.arrow_type)
        if isinstance(self.convert, _Converter):
            return self.convert.to_array(values, self.arrow_type)
        return pa.array([self.convert(v) for v in values], type=self.arrow_type)

    def text_to_array(self, values: Sequence[bytes | None]) -> Any:
        """Build the arrow array from the bytes the server sends in the text protocol (no driver converters).

        This is the snapshot's fast path (mysqlclient returning raw bytes): numbers, decimals, dates and
        timestamps are parsed by Arrow in C++ for the whole column, with no Python object per value.
        The result equals ``to_array`` of what PyMySQL returns for the same rows (tests/unit/test_types.py).
        """
        form = self.text_form
        if form == "binary":
            return pa.array(values, type=pa.binary())
        if form == "string":
            return pa.array(values, type=pa.string())
        if form == "cast":
            return pc.cast(pa.array(values, type=pa.string()), self.arrow_type)
        if form == "via":  # parse as the wider type PyMySQL would produce, then narrow (FLOAT via double)
            return pc.cast(pa.array(values, type=pa.string()), pa.float64()).cast(self.arrow_type)
        if form == "unsigned":
            return pc.cast(pa.array(values, type=pa.string()), pa.uint64()).cast(self.arrow_type)
        if form in ("date", "datetime", "timestamp"):
            parse_type = pa.timestamp("us") if form == "timestamp" else self.arrow_type
            array = _parse_or_null(pa.array(values, type=pa.string()), parse_type)
            if form == "timestamp":
                # Session time_zone is '+00:00': the text is UTC. Zero timestamps were nulled by the parse.
                array = array.cast(self.arrow_type)
            return array
        return self.to_array(values)  # "convert": the driver converter takes bytes too (BIT, DECIMAL > 38)


def _parse_or_null(text: Any, arrow_type: Any) -> Any:
    """Cast a string column; values Arrow cannot parse (zero or invalid dates) become NULL, as in the driver path."""
    try:
        return pc.cast(text, arrow_type)
    except pa.ArrowInvalid:
        pass
    out = []
    for value in text:
        try:
            out.append(pc.cast(value, arrow_type))
        except pa.ArrowInvalid:
            out.append(pa.scalar(None, type=arrow_type))
    return pa.array([v.as_py() for v in out], type=arrow_type)


def map_column(table: str, col: SourceColumn) -> TargetColumn:
    """Map one source column; raise ``UnsupportedTableError`` naming table and column if it cannot be."""
    t = col.data_type

    def target(
        spark_type: str, arrow_type: Any, convert: Callable[[Any], Any] = identity, text_form: str = "convert"
    ) -> TargetColumn:
        return TargetColumn(col.name, spark_type, arrow_type, col.nullable, convert, text_form)

    if t in _INT32_TYPES or (t == "int" and not col.unsigned):
        return target("INT", pa.int32(), text_form="cast")
    if t == "int" or (t == "bigint" and not col.unsigned):
        return target("BIGINT", pa.int64(), text_form="cast")
    if t == "bigint":
        return target("DECIMAL(20,0)", pa.decimal128(20, 0), _UnsignedToDecimal(), "unsigned")
    if t == "year":
        return target("INT", pa.int32(), text_form="cast")
    if t == "decimal":
        precision, scale = _decimal_args(table, col)
        if precision <= MAX_DECIMAL_PRECISION:
            return target(f"DECIMAL({precision},{scale})", pa.decimal128(precision, scale), text_form="cast")
        return target("STRING", pa.string(), _DecimalToText(scale))
    if t == "float":
        return target("FLOAT", pa.float32(), text_form="via")
    if t == "double":
        return target("DOUBLE", pa.float64(), text_form="cast")
    if t == "bit":
        bits = _bit_width(table, col)
        if bits == 1:
            return target("BOOLEAN", pa.bool_(), _BitToBool())
        if bits < 64:
            return target("BIGINT", pa.int64(), _BitToInt())
        return target("DECIMAL(20,0)", pa.decimal128(20, 0), _BitToDecimal())
    if t in _STRING_TYPES:
        return target("STRING", pa.string(), text_form="string")
    if t in _SERVER_TEXT_TYPES:
        # MariaDB's UUID, INET4 and INET6: the server's text (the binlog's bytes are printed the same way, see
        # ingest/source/binlog/binlog_values.py). Spark has no UUID type to give an Iceberg uuid column.
        return target("STRING", pa.string(), text_form="string")
    if t in _BINARY_TYPES or t in _SPATIAL_TYPES:
        return target("BINARY", pa.binary(), text_form="binary")
    # Zero dates become NULL, so date-like targets are optional even when the source is NOT NULL.
    if t == "date":
        return TargetColumn(col.name, "DATE", pa.date32(), True, _ToDate(), "date")
    if t == "datetime":
        return TargetColumn(col.name, "TIMESTAMP_NTZ", pa.timestamp("us"), True, _ToNaiveDatetime(), "datetime")
    if t == "timestamp":
        return TargetColumn(col.name, "TIMESTAMP", pa.timestamp("us", tz="UTC"), True, _ToUtcDatetime(), "timestamp")
    if t == "time":
        # The server's text already is MySQL's rendering, which is what _TimeToText rebuilds from a timedelta.
        return target("STRING", pa.string(), _TimeToText(_fsp(col)), "string")
    raise _unsupported(table, col, "this job has no Iceberg mapping for it")


def map_columns(table: str, cols: Iterable[SourceColumn]) -> list[TargetColumn]:
    return [map_column(table, c) for c in cols]


def arrow_schema(targets: Sequence[TargetColumn]) -> Any:
    """The ``pyarrow.Schema`` of the record batches built from ``targets``."""
    return pa.schema([pa.field(t.name, t.arrow_type, nullable=t.nullable) for t in targets])


def quote_identifier(name: str) -> str:
    """Quote a column name for Spark SQL: backticks around it, inner backticks doubled."""
    return "`" + name.replace("`", "``") + "`"


def spark_ddl(targets: Sequence[TargetColumn]) -> str:
    """A Spark ``StructType`` DDL string, e.g. ``"`id` BIGINT NOT NULL, `my col` STRING"``."""
    return ", ".join(f"{quote_identifier(t.name)} {t.spark_type}{_not_null(t)}" for t in targets)


def _not_null(target: TargetColumn) -> str:
    return "" if target.nullable else " NOT NULL"


def rows_to_record_batch(targets: Sequence[TargetColumn], rows: Sequence[Sequence[Any]]) -> Any:
    """Turn driver rows (tuples in ``targets`` order) into a ``pyarrow.RecordBatch`` of ``arrow_schema``.

    Works column by column; columns whose converter is ``identity`` go to pyarrow without Python work
    per value.
    """
    schema = arrow_schema(targets)
    if not rows:
        return pa.RecordBatch.from_arrays([pa.array([], type=t.arrow_type) for t in targets], schema=schema)
    # zip in C is the cheapest transpose; strict=True makes ragged rows fail instead of truncating.
    try:
        columns = list(zip(*rows, strict=True))
    except ValueError as exc:
        raise ValueError(f"rows have different lengths; expected {len(targets)} values per row") from exc
    if len(columns) != len(targets):
        raise ValueError(f"rows have {len(columns)} values but there are {len(targets)} target columns")
    return _record_batch(targets, [t.to_array(values) for t, values in zip(targets, columns, strict=True)])


def text_rows_to_record_batch(targets: Sequence[TargetColumn], rows: Sequence[Sequence[bytes | None]]) -> Any:
    """Like ``rows_to_record_batch`` for rows of raw text-protocol bytes (see ``TargetColumn.text_to_array``)."""
    if not rows:
        return rows_to_record_batch(targets, rows)
    columns = list(zip(*rows, strict=True))
    if len(columns) != len(targets):
        raise ValueError(f"rows have {len(columns)} values but there are {len(targets)} target columns")
    return _record_batch(targets, [t.text_to_array(values) for t, values in zip(targets, columns, strict=True)])


def _record_batch(targets: Sequence[TargetColumn], arrays: Sequence[Any]) -> Any:
    for target, array in zip(targets, arrays, strict=True):
        # pyarrow does not enforce non-nullable fields, and Spark would read garbage instead of NULL.
        if not target.nullable and array.null_count:
            raise SourceError(
                f"column {target.name!r} is NOT NULL in the source schema but a row has NULL in it; "
                "the table was probably altered: re-snapshot the table."
            )
    return pa.RecordBatch.from_arrays(list(arrays), schema=arrow_schema(targets))


# --- converters -------------------------------------------------------------------------------------
# Converters are frozen dataclasses rather than closures so that equal columns compare equal.


class _Converter:
    """A converter that may build a whole arrow array faster than one Python call per value."""

    def __call__(self, value: Any) -> Any:
        raise NotImplementedError

    def to_array(self, values: Sequence[Any], arrow_type: Any) -> Any:
        return pa.array([self(v) for v in values], type=arrow_type)


class _RawFirst(_Converter):
    """For types whose driver values pyarrow almost always takes as they are (dates, timestamps).

    Try the raw column first; only a column holding an odd value (a zero date as str) pays for the
    per-value conversion.
    """

    def to_array(self, values: Sequence[Any], arrow_type: Any) -> Any:
        try:
            return pa.array(values, type=arrow_type)
        except _RAW_REJECTED:
            return super().to_array(values, arrow_type)


@dataclass(frozen=True)
class _UnsignedToDecimal(_Converter):
    """BIGINT UNSIGNED (int up to 2**64-1) -> DECIMAL(20,0); int64 would wrap past 2**63-1."""

    def __call__(self, value: Any) -> Any:
        if value is None or isinstance(value, Decimal):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return Decimal(value)
        raise TypeError(f"expected int for BIGINT UNSIGNED, got {type(value).__name__}")

    def to_array(self, values: Sequence[Any], arrow_type: Any) -> Any:
        # uint64 holds every value and the cast to decimal runs in C.
        try:
            return pa.array(values, type=pa.uint64()).cast(arrow_type)
        except _RAW_REJECTED:
            return super().to_array(values, arrow_type)


def _bits(value: Any) -> int:
    # PyMySQL gives big-endian bytes; python-mysql-replication gives a str of '0'/'1' digits.
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big")
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return int(value, 2)
    raise TypeError(f"expected bytes for BIT, got {type(value).__name__}")


@dataclass(frozen=True)
class _BitToBool(_Converter):
    def __call__(self, value: Any) -> Any:
        return None if value is None else _bits(value) != 0


@dataclass(frozen=True)
class _BitToInt(_Converter):
    def __call__(self, value: Any) -> Any:
        return None if value is None else _bits(value)


@dataclass(frozen=True)
class _BitToDecimal(_Converter):
    """BIT(64) -> DECIMAL(20,0): read unsigned so a set high bit stays positive."""

    def __call__(self, value: Any) -> Any:
        return None if value is None else Decimal(_bits(value))

    def to_array(self, values: Sequence[Any], arrow_type: Any) -> Any:
        ints = [None if v is None else _bits(v) for v in values]
        return pa.array(ints, type=pa.uint64()).cast(arrow_type)


# Enough digits for DECIMAL(65,x); the default context (28 digits) would fail on quantize.
_DECIMAL_CONTEXT = Context(prec=100, rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class _DecimalToText(_Converter):
    """DECIMAL(p>38, s) -> the text MySQL prints: no exponent, exactly ``scale`` fraction digits."""

    scale: int

    def __call__(self, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bytes | bytearray):
            value = value.decode("ascii")
        if isinstance(value, bool) or not isinstance(value, Decimal | int | str):
            raise TypeError(f"expected Decimal for DECIMAL, got {type(value).__name__}")
        exact = Decimal(value).quantize(Decimal(1).scaleb(-self.scale), context=_DECIMAL_CONTEXT)
        # MySQL never prints a negative zero.
        if exact.is_zero():
            exact = exact.copy_abs()
        return format(exact, "f")


def _is_driver_text(value: Any) -> bool:
    return isinstance(value, str | bytes | bytearray)


@dataclass(frozen=True)
class _ToDate(_RawFirst):
    """DATE -> date; PyMySQL returns zero or invalid dates ('0000-00-00') as text: those become None."""

    def __call__(self, value: Any) -> Any:
        if value is None or _is_driver_text(value):
            return None
        if isinstance(value, dt.datetime):
            return value.date()
        if isinstance(value, dt.date):
            return value
        raise TypeError(f"expected date for DATE, got {type(value).__name__}")


@dataclass(frozen=True)
class _ToNaiveDatetime(_RawFirst):
    """DATETIME -> naive datetime (wall clock, no zone); zero or invalid datetimes become None."""

    def __call__(self, value: Any) -> Any:
        if value is None or _is_driver_text(value):
            return None
        if isinstance(value, dt.datetime):
            return value
        raise TypeError(f"expected datetime for DATETIME, got {type(value).__name__}")


# TIMESTAMP's range starts at '1970-01-01 00:00:01' UTC, so 0 seconds can only be the zero timestamp; the
# binlog (python-mysql-replication) gives it as 1970-01-01 00:00:00 where PyMySQL gives '0000-00-00 ...'.
_ZERO_TIMESTAMP = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class _ToUtcDatetime(_RawFirst):
    """TIMESTAMP -> UTC datetime; the zero timestamp, as text or as the epoch, becomes None.

    The session time_zone is '+00:00', so the naive datetime PyMySQL returns is UTC. (pyarrow reads naive
    datetimes as UTC too, which is what makes the raw-first path right.)
    """

    def __call__(self, value: Any) -> Any:
        if value is None or _is_driver_text(value):
            return None
        if isinstance(value, dt.datetime):
            utc = value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
            return None if utc == _ZERO_TIMESTAMP else utc
        raise TypeError(f"expected datetime for TIMESTAMP, got {type(value).__name__}")

    def to_array(self, values: Sequence[Any], arrow_type: Any) -> Any:
        array = super().to_array(values, arrow_type)
        # The raw path skipped __call__, so null the epoch column-wise.
        zero = pc.equal(array.cast(pa.int64()), 0)
        if pc.any(zero).as_py():
            array = pc.if_else(zero, pa.scalar(None, type=arrow_type), array)
        return array


@dataclass(frozen=True)
class _TimeToText(_Converter):
    """TIME -> '[-]HH:MM:SS[.f...]' with ``fsp`` fraction digits, as MySQL prints it.

    Not an Iceberg time: MySQL TIME is a signed duration up to 838:59:59, not a time of day.
    """

    fsp: int

    def __call__(self, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bytes | bytearray):
            value = value.decode("ascii")
        if isinstance(value, str):
            # PyMySQL hands back text it could not parse; it is already the server's own rendering.
            return value
        if not isinstance(value, dt.timedelta):
            raise TypeError(f"expected timedelta for TIME, got {type(value).__name__}")
        # Integer microseconds: a negative timedelta is stored as days=-1 plus positive seconds.
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        sign = "-" if micros < 0 else ""
        seconds, fraction = divmod(abs(micros), 1_000_000)
        hours, rest = divmod(seconds, 3600)
        minutes, secs = divmod(rest, 60)
        text = f"{sign}{hours:02d}:{minutes:02d}:{secs:02d}"
        if self.fsp:
            text += "." + f"{fraction:06d}"[: self.fsp]
        return text


# --- helpers ----------------------------------------------------------------------------------------


def _field(row: Mapping[str, Any], key: str) -> Any:
    # MySQL 8 returns information_schema column labels upper-case, older servers as written in the query.
    if key in row:
        return row[key]
    return row.get(key.lower())


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8")
    return str(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _type_args(column_type: str) -> tuple[int | None, int | None]:
    m = _TYPE_ARGS.search(column_type)
    if m is None:
        return None, None
    return int(m.group(1)), None if m.group(2) is None else int(m.group(2))


def _decimal_args(table: str, col: SourceColumn) -> tuple[int, int]:
    precision, scale = col.numeric_precision, col.numeric_scale
    if precision is None:
        precision, parsed_scale = _type_args(col.column_type)
        scale = parsed_scale if scale is None else scale
    if precision is None:
        raise _unsupported(table, col, "its precision is unknown")
    return precision, scale or 0


def _bit_width(table: str, col: SourceColumn) -> int:
    bits = col.numeric_precision
    if bits is None:
        bits = _type_args(col.column_type)[0]
    if bits is None or not 1 <= bits <= 64:
        raise _unsupported(table, col, "its bit width is unknown")
    return bits


def _fsp(col: SourceColumn) -> int:
    if col.datetime_precision is not None:
        return col.datetime_precision
    return _type_args(col.column_type)[0] or 0


def _unsupported(table: str, col: SourceColumn, why: str) -> UnsupportedTableError:
    return UnsupportedTableError(
        f"table {table}: column {col.name!r} has type {col.column_type or col.data_type!r}, "
        f"which cannot be ingested ({why}). Exclude the column from capture, or exclude the table, "
        "and see docs/types.md for the supported types."
    )
