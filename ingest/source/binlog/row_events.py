"""Decoding the rows of a binlog row event from its bytes, straight into the job's row tuples.

python-mysql-replication decodes every value through several method calls, attribute lookups and a dict
per row: on the bench binlog (204,000 changes, 2 M values) that is 11.7 CPU seconds, nearly all of the
reader's. The library still parses every event's header and every table-map event; from a table map's
columns this module builds, once per table map and schema, one small reader per column, and decodes each
row image into a tuple in the schema's column order and the driver's form (`binlog_values.driver_form`).

The values are the library's, value for value and type for type: tests decode the same events both ways,
over every column of the shared type fixture. An event this module does not cover goes through the library
as before: a row image without every column (a writer with binlog_row_image MINIMAL or NOBLOB, which the
library path refuses), MySQL's partial JSON updates, a column type without a reader here, or columns that
differ from the schema's (the library path names the difference). A table map without column names (a
server not at binlog_row_metadata FULL) is first completed from the schema, by position (table_maps.py).
An event whose bytes it cannot decode is also left to the library (which raises its own error or reads
it), with a warning once per table.
"""

from __future__ import annotations

import codecs
import datetime as dt
import functools
import logging
import struct
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from pymysqlreplication.constants import BINLOG, FIELD_TYPE
from pymysqlreplication.json_binary import parse_json
from pymysqlreplication.row_event import DeleteRowsEvent, RowsEvent, UpdateRowsEvent, WriteRowsEvent

from ingest.model.columns import InvalidTemporal, SourceColumn
from ingest.source.binlog import table_maps
from ingest.source.binlog.binlog_values import driver_form, unchanged
from ingest.source.binlog.quick_events import Rows

log = logging.getLogger(__name__)

Reader = Callable[[bytes, int], tuple[Any, int]]
"""Reads one non-NULL value at an offset of the event's bytes: (value, offset after it)."""

Image = tuple[Any, ...]

_EPOCH = dt.datetime(1970, 1, 1)
_FSP_BYTES = {0: 0, 1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3}
_DECIMAL_DIGITS = 9
_DECIMAL_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
"""Bytes of a group of 0..8 leftover decimal digits (a full group of 9 takes 4)."""


def _fixed(fmt: str) -> Reader:
    unpack, size = struct.Struct(fmt).unpack_from, struct.calcsize(fmt)

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        return unpack(buf, pos)[0], pos + size

    return read


def _int24(signed: bool) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        return int.from_bytes(buf[pos : pos + 3], "little", signed=signed), pos + 3

    return read


def _fraction(fsp: int) -> tuple[int, Callable[[bytes, int], int]]:
    """Bytes of a fractional-seconds part of precision `fsp`, and its reader (microseconds; odd precisions store
    one digit more)."""
    size, from_bytes = _FSP_BYTES.get(fsp, 0), int.from_bytes
    scale: int = 10 ** (6 - fsp)

    def none(buf: bytes, pos: int) -> int:
        return 0

    def even(buf: bytes, pos: int) -> int:
        return from_bytes(buf[pos : pos + size], "big", signed=True) * scale

    def odd(buf: bytes, pos: int) -> int:
        return int(from_bytes(buf[pos : pos + size], "big", signed=True) / 10) * scale

    return size, (odd if fsp % 2 else even) if size else none


_MICROS_LIMIT = 1_000_000


def _text(length_size: int, encoding: str | None, errors: str) -> Reader:
    """A length-prefixed string, decoded by the column's character set (bytes where Python has no codec)."""

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        start = pos + length_size
        end = start + int.from_bytes(buf[pos:start], "little")
        raw = buf[start:end]
        if encoding is None:
            # Bytes, except an empty value: the library's decode with an unknown codec returns '' for it.
            return (raw or ""), end
        return raw.decode(encoding, errors), end

    return read


def _raw(length_size: int) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        start = pos + length_size
        end = start + int.from_bytes(buf[pos:start], "little")
        return buf[start:end], end

    return read


def _json(length_size: int) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        start = pos + length_size
        length = int.from_bytes(buf[pos:start], "little")
        if length == 0:
            return None, start
        data = buf[start : start + length]
        return parse_json(data[0], data[1:]), start + length

    return read


def _decimal(precision: int, scale: int) -> Reader:
    """DECIMAL's packed form: groups of 9 digits in 4 big-endian bytes, leftover digits in fewer, the integral
    part's leftover first; the sign in the first bit (set when non-negative); a negative number's bytes are
    inverted. The value is built from the same digits and exponent as the library's string."""
    integral = precision - scale
    lead, tail = integral % _DECIMAL_DIGITS, scale % _DECIMAL_DIGITS
    sizes = [(_DECIMAL_BYTES[lead], lead)] if lead else []
    sizes += [(4, _DECIMAL_DIGITS)] * (integral // _DECIMAL_DIGITS + scale // _DECIMAL_DIGITS)
    sizes += [(_DECIMAL_BYTES[tail], tail)] if tail else []
    total = sum(size for size, _ in sizes)
    bits = 8 * total
    sign_bit, every_bit = 1 << (bits - 1), (1 << bits) - 1
    groups = []  # per group of digits, from the first: (shift, mask, scale of the digits before it)
    shift = bits
    for size, digits in sizes:
        shift -= 8 * size
        groups.append((shift, (1 << (8 * size)) - 1, 10**digits))
    exponent = f"E-{scale}" if scale else ""  # the unscaled digits and the exponent: the library's digits

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        end = pos + total
        packed = int.from_bytes(buf[pos:end], "big")
        negative = not packed & sign_bit
        packed ^= (every_bit ^ sign_bit) if negative else sign_bit
        number = 0
        for group_shift, mask, factor in groups:
            number = number * factor + ((packed >> group_shift) & mask)
        return Decimal(f"-{number}{exponent}" if negative else f"{number}{exponent}"), end

    return read


def _datetime2(fsp: int) -> Reader:
    size, micros = _fraction(fsp)
    make, from_bytes = dt.datetime, int.from_bytes  # one datetime per value, built whole: the hottest reader

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        start = pos + 5
        end = start + size
        packed = from_bytes(buf[pos:start], "big")
        fraction = micros(buf, start)
        year_month = (packed >> 22) & 0x1FFFF
        try:
            return make(
                year_month // 13,
                year_month % 13,
                (packed >> 17) & 0x1F,
                (packed >> 12) & 0x1F,
                (packed >> 6) & 0x3F,
                packed & 0x3F,
                fraction if fraction > 0 else 0,
            ), end
        except ValueError:
            day, hour, minute, second = ((packed >> s) & m for s, m in _DATETIME_FIELDS)
            if fraction >= _MICROS_LIMIT and _valid_datetime(
                year_month // 13, year_month % 13, day, hour, minute, second
            ):
                raise  # a fraction no DATETIME holds, not a date MySQL allows: the library's error too
            # A zero or invalid date (the library gives None): kept as MySQL's text, which converts to NULL.
            text = _datetime_text(year_month // 13, year_month % 13, day, hour, minute, second, fraction, fsp)
            return InvalidTemporal(text), end

    return read


def _valid_datetime(year: int, month: int, day: int, hour: int, minute: int, second: int) -> bool:
    try:
        dt.datetime(year, month, day, hour, minute, second)
    except ValueError:
        return False
    return True


def _timestamp2(fsp: int) -> Reader:
    size, micros = _fraction(fsp)
    delta, from_bytes = dt.timedelta, int.from_bytes

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        start = pos + 4
        end = start + size
        seconds = from_bytes(buf[pos:start], "big", signed=True)
        fraction = micros(buf, start)
        if seconds == 0:  # TIMESTAMP starts at 1 s after the epoch: 0 is the zero timestamp
            return InvalidTemporal(_datetime_text(0, 0, 0, 0, 0, 0, fraction, fsp)), end
        if fraction >= _MICROS_LIMIT:  # timedelta would carry it into the seconds; the library refuses it
            raise ValueError(f"a TIMESTAMP fraction of {fraction} microseconds")
        return _EPOCH + delta(0, seconds, fraction if fraction > 0 else 0), end

    return read


_TIMEF_INT_OFS = 0x800000
_TIMEF_OFS = 0x800000000000


def time2_value(buf: bytes, pos: int, fsp: int) -> dt.timedelta:
    """A TIME2 value as MySQL packs it (`my_time_packed_from_binary`): an offset integer of 3 bytes and a
    fraction of 1 or 2 bytes, or one offset integer of 6 bytes for 5 or 6 digits. A negative value with a
    fraction stores its integer part one lower and its fraction counted back from it, for byte order: read
    apart, as python-mysql-replication reads them, -0.000001 s became -0.999999 s."""
    size = _FSP_BYTES.get(fsp, 0)
    if size == 3:
        packed = int.from_bytes(buf[pos : pos + 6], "big") - _TIMEF_OFS
    else:
        whole = int.from_bytes(buf[pos : pos + 3], "big") - _TIMEF_INT_OFS
        fraction = int.from_bytes(buf[pos + 3 : pos + 3 + size], "big")
        if whole < 0 and fraction:
            whole += 1
            fraction -= 1 << (8 * size)
        packed = (whole << 24) + fraction * (10000 if size == 1 else 100)
    sign, packed = (-1, -packed) if packed < 0 else (1, packed)
    hms, micros = packed >> 24, packed & 0xFFFFFF
    value = dt.timedelta(hours=(hms >> 12) & 0x3FF, minutes=(hms >> 6) & 0x3F, seconds=hms & 0x3F)
    return sign * (value + dt.timedelta(microseconds=micros))


def _time2(fsp: int) -> Reader:
    size = 3 + _FSP_BYTES.get(fsp, 0)

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        return time2_value(buf, pos, fsp), pos + size

    return read


def _library_time2(self: Any, column: Any) -> dt.timedelta:
    """python-mysql-replication's TIME2 reader, replaced (`install`): the events it reads itself agree."""
    return time2_value(self.packet.read(3 + _FSP_BYTES.get(column.fsp, 0)), 0, column.fsp)


def install() -> None:
    """Read TIME2 right in the library too (idempotent). As a `partialmethod`: a function of this module is no
    method descriptor where it runs compiled (ingest.runtime.compiled), so it would not be bound to the event."""
    RowsEvent._RowsEvent__read_time2 = functools.partialmethod(_library_time2)


def _date(buf: bytes, pos: int) -> tuple[Any, int]:
    packed = int.from_bytes(buf[pos : pos + 3], "little")
    year, month, day = (packed >> 9) & 0x7FFF, (packed >> 5) & 0xF, packed & 0x1F
    try:
        return dt.date(year, month, day), pos + 3
    except ValueError:  # a zero date, one with a zero part, or an invalid one (ALLOW_INVALID_DATES)
        return InvalidTemporal(f"{year:04d}-{month:02d}-{day:02d}"), pos + 3


# (shift, mask) of day, hour, minute and second in DATETIME2's packed 40 bits.
_DATETIME_FIELDS = ((17, 0x1F), (12, 0x1F), (6, 0x3F), (0, 0x3F))


def _datetime_text(year: int, month: int, day: int, hour: int, minute: int, second: int, micros: int, fsp: int) -> str:
    """A DATETIME or TIMESTAMP as MySQL prints it, with exactly `fsp` fraction digits."""
    text = f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"
    return f"{text}.{micros:06d}"[: len(text) + 1 + fsp] if fsp else text


def _time(buf: bytes, pos: int) -> tuple[Any, int]:
    packed = int.from_bytes(buf[pos : pos + 3], "little")
    hours, rest = divmod(packed, 10000)
    return dt.timedelta(hours=hours, minutes=rest // 100, seconds=rest % 100), pos + 3


def _timestamp(buf: bytes, pos: int) -> tuple[Any, int]:
    return _EPOCH + dt.timedelta(seconds=int.from_bytes(buf[pos : pos + 4], "little")), pos + 4


def _year(buf: bytes, pos: int) -> tuple[Any, int]:
    return buf[pos] + 1900, pos + 1


def _enum(size: int, members: Sequence[str] | None) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        index = int.from_bytes(buf[pos : pos + size], "little")
        return (members[index] if members else None), pos + size

    return read


def _set(size: int, members: Sequence[str] | None) -> Reader:
    """A SET's members as a Python set, or '' when none is set (the driver's form of an empty SET)."""
    bits = list(enumerate(members or ()))

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        mask = int.from_bytes(buf[pos : pos + size], "little")
        chosen = {member for i, member in bits if mask >> i & 1}
        return (chosen or ""), pos + size

    return read


def _bit(bits: int, size: int) -> Reader:
    keep = (1 << bits) - 1
    form = f"0{bits}b"

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        # The library's form: the column's bits as a '0101' string, most significant first.
        return format(int.from_bytes(buf[pos : pos + size], "big") & keep, form), pos + size

    return read


def _encoding(column: Any) -> str | None:
    """The Python codec of a text column (the library's choice); None where there is none (bytes)."""
    if column.character_set_name is None:
        return "utf-8"
    name = RowsEvent.charset_to_encoding(column.character_set_name)
    try:
        codecs.lookup(name)
    except LookupError:
        return None
    return str(name)


def column_reader(column: Any, errors: str = "strict") -> Reader | None:
    """The reader of a table-map column's values, or None for a type read only by the library."""
    kind, unsigned = column.type, column.unsigned
    if kind == FIELD_TYPE.TINY:
        return _fixed("<B" if unsigned else "<b")
    if kind == FIELD_TYPE.SHORT:
        return _fixed("<H" if unsigned else "<h")
    if kind == FIELD_TYPE.INT24:
        return _int24(signed=not unsigned)
    if kind == FIELD_TYPE.LONG:
        return _fixed("<I" if unsigned else "<i")
    if kind == FIELD_TYPE.LONGLONG:
        return _fixed("<Q" if unsigned else "<q")
    if kind == FIELD_TYPE.FLOAT:
        return _fixed("<f")
    if kind == FIELD_TYPE.DOUBLE:
        return _fixed("<d")
    if kind in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING):
        return _text(2 if column.max_length > 255 else 1, _encoding(column), errors)
    if kind == FIELD_TYPE.BLOB:
        return _text(column.length_size, _encoding(column), errors)
    if kind == FIELD_TYPE.GEOMETRY:
        return _raw(column.length_size)
    if kind == FIELD_TYPE.JSON:
        return _json(column.length_size)
    if kind == FIELD_TYPE.NEWDECIMAL:
        return _decimal(column.precision, column.decimals)
    if kind == FIELD_TYPE.DATETIME2:
        return _datetime2(column.fsp)
    if kind == FIELD_TYPE.TIMESTAMP2:
        return _timestamp2(column.fsp)
    if kind == FIELD_TYPE.TIME2:
        return _time2(column.fsp)
    if kind == FIELD_TYPE.DATE:
        return _date
    if kind == FIELD_TYPE.TIME:
        return _time
    if kind == FIELD_TYPE.TIMESTAMP:
        return _timestamp
    if kind == FIELD_TYPE.YEAR:
        return _year
    if kind == FIELD_TYPE.ENUM:
        return _enum(column.size, column.enum_values)
    if kind == FIELD_TYPE.SET:
        return _set(column.size, column.set_values)
    if kind == FIELD_TYPE.BIT:
        return _bit(column.bits, column.bytes)
    return None  # the old DATETIME and anything newer: the library reads them


def _fixed_up(read: Reader, fix: Callable[[Any], Any]) -> Reader:
    def fixed(buf: bytes, pos: int) -> tuple[Any, int]:
        value, end = read(buf, pos)
        return fix(value), end

    return fixed


class TableDecoder:
    """Row images of one table map's events, as tuples in a schema's column order (driver form)."""

    def __init__(self, steps: list[tuple[int, int, Reader]], width: int, columns: int) -> None:
        self._steps = steps
        """Per column in binlog order: its NULL bit, its slot in the schema's order, its reader."""
        self._width = width
        self._null_bytes = (columns + 7) // 8
        self.columns = columns

    @classmethod
    def build(cls, table_columns: Sequence[Any], schema: Sequence[SourceColumn], errors: str) -> TableDecoder | None:
        """None when the table map's columns are not the schema's, or a column has no reader here."""
        names = [c.name for c in table_columns]
        slots = {c.name: i for i, c in enumerate(schema)}
        if not all(names) or len(set(names)) != len(names) or set(names) != set(slots):
            return None
        fixes = dict(zip((c.name for c in schema), driver_form(schema), strict=True))
        steps = []
        for i, column in enumerate(table_columns):
            read = column_reader(column, errors)
            if read is None:
                return None
            fix = fixes[column.name]
            steps.append((1 << i, slots[column.name], read if fix is unchanged else _fixed_up(read, fix)))
        return cls(steps, len(schema), len(table_columns))

    def image(self, buf: bytes, pos: int) -> tuple[Image, int]:
        """One row image at `pos` (its NULL bitmap, then its values): the row and the offset after it."""
        start = pos + self._null_bytes
        nulls = int.from_bytes(buf[pos:start], "little")
        pos = start
        row: list[Any] = [None] * self._width
        for bit, slot, read in self._steps:
            if not nulls & bit:
                row[slot], pos = read(buf, pos)
        return tuple(row), pos


def event_kind(event: Any) -> str:
    """ "insert", "update" or "delete": what a row event's rows are."""
    if isinstance(event, WriteRowsEvent):
        return "insert"
    return "delete" if isinstance(event, DeleteRowsEvent) else "update"


class RowEvents:
    """Decodes the row events of captured tables, keeping one decoder per table for its current table map."""

    def __init__(self) -> None:
        self._decoders: dict[tuple[str, str], tuple[Any, Sequence[SourceColumn], TableDecoder | None]] = {}
        self.fallbacks = 0
        """Row events left to the library (not covered here)."""
        self._warned: set[tuple[str, str]] = set()

    def rows(
        self, key: tuple[str, str], kind: str, event: Any, schema: Sequence[SourceColumn], at: object = None
    ) -> list[tuple[Image | None, Image | None]] | None:
        """(before, after) per row of an "insert", "update" or "delete" event, or None when the library must
        read it. `schema` is the table's at this binlog position (`at`, for messages): a table map without column
        names is completed from it first (`table_maps.by_position`), for this decoder and the library alike."""
        table = event.table_map.get(event.table_id)
        if table is not None:
            table_maps.by_position(table, key, schema, getattr(event, "dbms", None) or "mysql", at)
        body = _event_body(event)
        ignore_errors = getattr(event, "_ignore_decode_errors", False)
        decoder = None if body is None or table is None else self._decoder(key, table, ignore_errors, schema)
        if body is None or decoder is None or not _full_images(event, decoder.columns):
            self.fallbacks += 1
            return None
        try:
            return _decode(decoder, kind, *body)
        except Exception as e:  # noqa: BLE001 - the library reads the untouched bytes, and decides
            self.fallbacks += 1
            if key not in self._warned:
                self._warned.add(key)
                log.warning("%s.%s: row event left to python-mysql-replication (%s)", *key, e)
            return None

    def decoded(
        self,
        key: tuple[str, str],
        table: Any,
        rows: Rows,
        schema: Sequence[SourceColumn],
        data: bytes,
        dbms: str,
        at: object,
    ) -> list[tuple[Image | None, Image | None]] | None:
        """`rows` of a row event read in place (`quick_events`) as `rows` decodes them, or None when the library
        path must read the event (not every column in its images, no decoder, or bytes not decoded here: that
        path says why)."""
        table_maps.by_position(table, key, schema, dbms, at)
        decoder = self._decoder(key, table, False, schema)
        if decoder is None or not rows.full or rows.columns != decoder.columns:
            return None
        try:
            return _decode(decoder, rows.kind, data, rows.start, rows.stop)
        except Exception:  # noqa: BLE001 - the library path reads the event again, and warns or decides
            return None

    def _decoder(
        self, key: tuple[str, str], table: Any, ignore_errors: bool, schema: Sequence[SourceColumn]
    ) -> TableDecoder | None:
        cached = self._decoders.get(key)
        if cached is not None and cached[0] is table and cached[1] is schema:
            return cached[2]
        decoder = TableDecoder.build(table.columns, schema, "ignore" if ignore_errors else "strict")
        self._decoders[key] = (table, schema, decoder)
        return decoder


def _decode(
    decoder: TableDecoder, kind: str, buf: bytes, pos: int, end: int
) -> list[tuple[Image | None, Image | None]]:
    image = decoder.image
    out: list[tuple[Image | None, Image | None]] = []
    if kind == "update":
        while pos < end:
            before, pos = image(buf, pos)
            after, pos = image(buf, pos)
            out.append((before, after))
    elif kind == "insert":
        while pos < end:
            row, pos = image(buf, pos)
            out.append((None, row))
    else:
        while pos < end:
            row, pos = image(buf, pos)
            out.append((row, None))
    if pos != end:
        raise ValueError(f"the rows end at byte {pos} of the event, not at {end}")
    return out


def _full_images(event: Any, columns: int) -> bool:
    """Every column is in the event's row images (binlog_row_image FULL), and it is not a partial update."""
    if event.event_type == BINLOG.PARTIAL_UPDATE_ROWS_EVENT or event.number_of_columns != columns:
        return False
    every = (1 << columns) - 1
    # Once per row event: no list or generator (they were a twelfth of a single-row transaction's read).
    if int.from_bytes(event.columns_present_bitmap, "little") != every:
        return False
    return not isinstance(event, UpdateRowsEvent) or int.from_bytes(event.columns_present_bitmap2, "little") == every


def _event_body(event: Any) -> tuple[bytes, int, int] | None:
    """The bytes holding a row event's rows: (buffer, first offset, end offset), or None when not at hand."""
    wrapper = event.packet
    if getattr(wrapper, "_BinLogPacketWrapper__data_buffer", b"") or getattr(event, "_RowsEvent__rows", None):
        return None  # the library has read (some of) them already
    if not getattr(event, "complete", True):
        return None
    mysql_packet = wrapper.packet
    data, start = getattr(mysql_packet, "_data", None), getattr(mysql_packet, "_position", None)
    if not isinstance(data, bytes) or not isinstance(start, int):
        return None
    end = start + event.event_size - wrapper.read_bytes
    return (data, start, end) if end <= len(data) else None
