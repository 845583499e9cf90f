"""Binlog positions, GTID sets and the offsets the job checkpoints.

Pure values (no I/O): the snapshot chunk reader records a `Watermark` before and after each chunk, the
binlog reader restarts from a `StreamOffset`, and both are stored as JSON in Spark streaming offsets.
Malformed text raises `ValueError` quoting the text and the expected form, so callers can wrap it in
the `IngestError` that fits where the text came from (server, checkpoint or config).
"""

from __future__ import annotations

import bisect
import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeAlias, TypeGuard, overload

__all__ = [
    "BinlogPosition",
    "GtidFlavor",
    "GtidSet",
    "Interval",
    "JsonValue",
    "MariadbGtid",
    "MariadbGtidPos",
    "MysqlGtidSet",
    "StreamOffset",
    "Watermark",
    "parse_gtid_set",
]

JsonValue: TypeAlias = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
GtidFlavor: TypeAlias = Literal["mysql", "mariadb"]
Interval: TypeAlias = tuple[int, int]
"""Inclusive (start, end) range of MySQL transaction numbers."""

# MySQL's GNO is a signed 64-bit number and 0 is never assigned (rpl_gtid.h: MAX_GNO = LLONG_MAX).
_MAX_GNO = 2**63 - 1
# MariaDB stores domain and server id as uint32 and the sequence number as uint64.
_MAX_UINT32 = 2**32 - 1
_MAX_UINT64 = 2**64 - 1

_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_INTERVAL_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
# MySQL 8.4 tags: a letter or underscore, then up to 31 letters, digits or underscores.
_TAG_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
_MARIADB_GTID_RE = re.compile(r"([0-9]+)-([0-9]+)-([0-9]+)")
_BINLOG_FILE_RE = re.compile(r"(.+)\.([0-9]+)")

_MYSQL_FORM = (
    "expected 'uuid:N[-M][:N[-M]...]' entries separated by commas, "
    "e.g. '3528d5b7-e86d-11ea-8e5b-0242ac110004:1-5:7,5d0b498d-e388-11ea-a9ff-0242ac110004:2853-3315'"
)
_MARIADB_FORM = "expected comma-separated 'domain-server_id-seq', one per domain, e.g. '0-1-100,1-2-7'"
_MARIADB_RANGES = "domain and server_id < 2^32, seq < 2^64"
_BINLOG_FORM = "expected 'file:pos' with a numbered binlog file, e.g. 'mysql-bin.000003:1234'"


def _quote(text: str, limit: int = 200) -> str:
    # gtid_executed can be kilobytes long; quote enough to recognise it without flooding the log.
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} chars)"


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass; a True/False that slipped into an offset is a bug, not position 1/0.
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------------------------------
# MySQL
# --------------------------------------------------------------------------------------------------


def _normalize_uuid(uuid: str) -> str:
    if not isinstance(uuid, str) or _UUID_RE.fullmatch(uuid) is None:
        raise ValueError(
            f"invalid MySQL server UUID {uuid!r}: expected 8-4-4-4-12 hex digits, "
            "e.g. '3528d5b7-e86d-11ea-8e5b-0242ac110004'"
        )
    return uuid.lower()


def _check_gno(seq: int) -> None:
    if not _is_int(seq) or not 1 <= seq <= _MAX_GNO:
        raise ValueError(f"invalid MySQL GTID number {seq!r}: expected an integer from 1 to {_MAX_GNO}")


def _merge(intervals: Iterable[Interval]) -> tuple[Interval, ...]:
    """Sort and coalesce overlapping or adjacent ranges (1-5 and 6-9 become 1-9), as MySQL prints them."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + 1:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return tuple(merged)


def _subtract(left: tuple[Interval, ...], right: tuple[Interval, ...]) -> list[Interval]:
    """The parts of sorted, merged `left` not covered by sorted, merged `right` (one linear pass)."""
    out: list[Interval] = []
    j = 0
    for start, end in left:
        cursor = start
        while j < len(right) and right[j][1] < cursor:
            j += 1
        # `right[k]` may also cover the next `left` range, so only `j` survives this loop.
        k = j
        while k < len(right) and right[k][0] <= end:
            r_start, r_end = right[k]
            if r_start > cursor:
                out.append((cursor, r_start - 1))
            cursor = r_end + 1  # > cursor: the skip loop above left only ranges ending at or after it
            if cursor > end:
                break
            k += 1
        if cursor <= end:
            out.append((cursor, end))
    return out


def _ranges_text(intervals: tuple[Interval, ...]) -> str:
    # MySQL prints a one-number range as ':N', not ':N-N'.
    return "".join(f":{s}" if s == e else f":{s}-{e}" for s, e in intervals)


def _contains(intervals: tuple[Interval, ...], seq: int) -> bool:
    # Binary search: gtid_executed of a busy server with gaps can hold many ranges per UUID.
    i = bisect.bisect_right(intervals, (seq, _MAX_GNO))
    return i > 0 and intervals[i - 1][1] >= seq


@dataclass(frozen=True)
class MysqlGtidSet:
    """A MySQL GTID set (`@@gtid_executed`), always normalized so `==` and `str()` are canonical.

    `intervals` holds (lower-case server UUID, sorted merged inclusive ranges) pairs sorted by UUID;
    any input given to the constructor is normalized. Tagged GTIDs (MySQL 8.4) are not supported.
    """

    flavor: ClassVar[Literal["mysql"]] = "mysql"

    intervals: tuple[tuple[str, tuple[Interval, ...]], ...] = ()

    def __post_init__(self) -> None:
        by_uuid: dict[str, list[Interval]] = {}
        for uuid, ranges in self.intervals:
            bucket = by_uuid.setdefault(_normalize_uuid(uuid), [])
            for start, end in ranges:
                _check_gno(start)
                _check_gno(end)
                if start > end:
                    raise ValueError(f"invalid MySQL GTID interval {start}-{end} for {uuid}: start > end")
                bucket.append((start, end))
        normalized = tuple((uuid, _merge(ranges)) for uuid, ranges in sorted(by_uuid.items()) if ranges)
        # Frozen dataclass: normalizing in place is the documented way to set a field after __init__.
        object.__setattr__(self, "intervals", normalized)

    @classmethod
    def _from_dict(cls, by_uuid: Mapping[str, Iterable[Interval]]) -> MysqlGtidSet:
        return cls(tuple((uuid, tuple(ranges)) for uuid, ranges in by_uuid.items()))

    @classmethod
    def parse(cls, text: str) -> MysqlGtidSet:
        """Parse `@@gtid_executed`-style text; the empty (or all-whitespace) string is the empty set."""
        if not text.strip():
            return cls()

        def bad(detail: str) -> ValueError:
            return ValueError(f"invalid MySQL GTID set {_quote(text)}: {detail}; {_MYSQL_FORM}")

        by_uuid: dict[str, list[Interval]] = {}
        for item in text.split(","):
            parts = [part.strip() for part in item.split(":")]
            uuid = parts[0]
            if _UUID_RE.fullmatch(uuid) is None:
                hint = (
                    " (this looks like a MariaDB GTID; is the flavor right?)"
                    if _MARIADB_GTID_RE.fullmatch(item.strip())
                    else ""
                )
                raise bad(f"{item.strip()!r} does not start with a server UUID{hint}")
            if len(parts) < 2:
                raise bad(f"{item.strip()!r} has no transaction numbers after the UUID")
            bucket = by_uuid.setdefault(uuid, [])  # __post_init__ lowercases and merges
            for part in parts[1:]:
                match = _INTERVAL_RE.fullmatch(part)
                if match is None:
                    if _TAG_RE.fullmatch(part):
                        raise bad(f"tagged GTIDs (MySQL 8.4 'uuid:tag:N') are not supported: {part!r}")
                    raise bad(f"{part!r} is not a number or a range N-M")
                start_text, end_text = match.group(1), match.group(2) or match.group(1)
                # Check the digit count before int() so absurd input gets this message, not int()'s.
                if len(start_text.lstrip("0")) > 19 or len(end_text.lstrip("0")) > 19:
                    raise bad(f"{part!r} is out of range 1-{_MAX_GNO}")
                start, end = int(start_text), int(end_text)
                if not 1 <= start <= end <= _MAX_GNO:
                    raise bad(f"{part!r} is not a range N-M with 1 <= N <= M <= {_MAX_GNO}")
                bucket.append((start, end))
        return cls._from_dict(by_uuid)

    def __str__(self) -> str:
        return ",".join(uuid + _ranges_text(ranges) for uuid, ranges in self.intervals)

    def is_empty(self) -> bool:
        return not self.intervals

    def uuids(self) -> tuple[str, ...]:
        return tuple(uuid for uuid, _ in self.intervals)

    def ranges(self, uuid: str) -> tuple[Interval, ...]:
        """The merged ranges of one server UUID (empty if it has none)."""
        return dict(self.intervals).get(_normalize_uuid(uuid), ())

    def contains(self, uuid: str, seq: int) -> bool:
        _check_gno(seq)
        return _contains(self.ranges(uuid), seq)

    def contains_gtid(self, gtid: str) -> bool:
        """Whether the single GTID 'uuid:N' is in the set."""
        uuid, seq = _parse_mysql_gtid(gtid)
        return self.contains(uuid, seq)

    def add(self, uuid: str, seq: int) -> MysqlGtidSet:
        _check_gno(seq)
        by_uuid: dict[str, list[Interval]] = {u: list(r) for u, r in self.intervals}
        by_uuid.setdefault(_normalize_uuid(uuid), []).append((seq, seq))
        return self._from_dict(by_uuid)

    def union(self, other: MysqlGtidSet) -> MysqlGtidSet:
        by_uuid: dict[str, list[Interval]] = {u: list(r) for u, r in self.intervals}
        for uuid, ranges in other.intervals:
            by_uuid.setdefault(uuid, []).extend(ranges)
        return self._from_dict(by_uuid)

    def difference(self, other: MysqlGtidSet) -> MysqlGtidSet:
        """The GTIDs in `self` that are not in `other` (like MySQL's GTID_SUBTRACT)."""
        theirs = dict(other.intervals)
        remaining = {uuid: _subtract(ranges, theirs.get(uuid, ())) for uuid, ranges in self.intervals}
        return self._from_dict(remaining)

    def issubset(self, other: MysqlGtidSet) -> bool:
        """Whether every GTID of `self` is in `other` (like MySQL's GTID_SUBSET)."""
        return self.difference(other).is_empty()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, MysqlGtidSet):
            return NotImplemented
        return self.issubset(other)


def _parse_mysql_gtid(gtid: str) -> tuple[str, int]:
    uuid, sep, seq_text = gtid.strip().rpartition(":")
    form = "expected 'uuid:N', e.g. '3528d5b7-e86d-11ea-8e5b-0242ac110004:42'"
    if not sep or _UUID_RE.fullmatch(uuid) is None:
        if sep and uuid.count(":") == 1:
            raise ValueError(f"invalid MySQL GTID {gtid!r}: tagged GTIDs are not supported; {form}")
        raise ValueError(f"invalid MySQL GTID {gtid!r}: {form}")
    if not seq_text.isascii() or not seq_text.isdigit() or len(seq_text.lstrip("0")) > 19:
        raise ValueError(f"invalid MySQL GTID {gtid!r}: {seq_text!r} is not a number 1-{_MAX_GNO}; {form}")
    seq = int(seq_text)
    if not 1 <= seq <= _MAX_GNO:
        raise ValueError(f"invalid MySQL GTID {gtid!r}: {seq_text!r} is not a number 1-{_MAX_GNO}; {form}")
    return uuid.lower(), seq


# --------------------------------------------------------------------------------------------------
# MariaDB
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MariadbGtid:
    """One MariaDB GTID 'domain-server_id-seq'."""

    domain_id: int
    server_id: int
    seq_no: int

    def __post_init__(self) -> None:
        for name, value, top in (
            ("domain_id", self.domain_id, _MAX_UINT32),
            ("server_id", self.server_id, _MAX_UINT32),
            ("seq_no", self.seq_no, _MAX_UINT64),
        ):
            if not _is_int(value) or not 0 <= value <= top:
                raise ValueError(f"invalid MariaDB GTID {name} {value!r}: expected an integer 0-{top}")

    @classmethod
    def parse(cls, text: str) -> MariadbGtid:
        form = f"expected 'domain-server_id-seq' ({_MARIADB_RANGES}), e.g. '0-1-100'"
        match = _MARIADB_GTID_RE.fullmatch(text.strip())
        # Check the digit count before int() so absurd input gets this message, not int()'s.
        if match is None or any(len(g.lstrip("0")) > 20 for g in match.groups()):
            raise ValueError(f"invalid MariaDB GTID {_quote(text)}: {form}")
        domain_id, server_id, seq_no = (int(g) for g in match.groups())
        if domain_id > _MAX_UINT32 or server_id > _MAX_UINT32 or seq_no > _MAX_UINT64:
            raise ValueError(f"invalid MariaDB GTID {_quote(text)}: a number is out of range; {form}")
        return cls(domain_id, server_id, seq_no)

    @classmethod
    def of_event(cls, domain_id: int, server_id: int, seq_no: int) -> MariadbGtid:
        """A GTID event's numbers, unpacked from fields of 4, 4 and 8 bytes: in range by their width, so not
        checked again (the reader makes one per transaction)."""
        gtid = object.__new__(cls)
        gtid.__dict__.update(domain_id=domain_id, server_id=server_id, seq_no=seq_no)
        return gtid

    def __str__(self) -> str:
        return f"{self.domain_id}-{self.server_id}-{self.seq_no}"


@dataclass(frozen=True)
class MariadbGtidPos:
    """A MariaDB GTID position (`@@gtid_binlog_pos` / `@@gtid_current_pos`): the last GTID per domain.

    Sequence numbers grow per domain, so the seq alone orders GTIDs of one domain; the server id is kept
    to print the position back but not compared, since after a failover the domain continues on a new
    server. `entries` is sorted by domain; two entries for one domain raise ValueError.
    """

    flavor: ClassVar[Literal["mariadb"]] = "mariadb"

    entries: tuple[MariadbGtid, ...] = ()

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.entries, key=lambda g: g.domain_id))
        for prev, cur in zip(ordered, ordered[1:], strict=False):
            if prev.domain_id == cur.domain_id:
                raise ValueError(
                    f"invalid MariaDB GTID position: domain {cur.domain_id} appears twice "
                    f"({str(prev)!r} and {str(cur)!r}); {_MARIADB_FORM}"
                )
        object.__setattr__(self, "entries", ordered)

    @classmethod
    def parse(cls, text: str) -> MariadbGtidPos:
        """Parse 'd-s-n,d-s-n'; the empty (or all-whitespace) string is the empty position."""
        if not text.strip():
            return cls()

        def bad(detail: str) -> ValueError:
            return ValueError(f"invalid MariaDB GTID position {_quote(text)}: {detail}; {_MARIADB_FORM}")

        by_domain: dict[int, MariadbGtid] = {}
        for item in text.split(","):
            piece = item.strip()
            if _MARIADB_GTID_RE.fullmatch(piece) is None:
                hint = " (this looks like a MySQL GTID set; is the flavor right?)" if ":" in piece else ""
                raise bad(f"{piece!r} is not 'domain-server_id-seq'{hint}")
            try:
                gtid = MariadbGtid.parse(piece)
            except ValueError:
                raise bad(f"{piece!r} has a number out of range ({_MARIADB_RANGES})") from None
            seen = by_domain.setdefault(gtid.domain_id, gtid)
            if seen is not gtid:
                raise bad(f"domain {gtid.domain_id} appears twice ({str(seen)!r} and {piece!r})")
        return cls(tuple(by_domain.values()))

    def __str__(self) -> str:
        return ",".join(str(gtid) for gtid in self.entries)

    def is_empty(self) -> bool:
        return not self.entries

    def get(self, domain_id: int) -> MariadbGtid | None:
        """The entry of one domain, or None if the position has none."""
        for gtid in self.entries:
            if gtid.domain_id == domain_id:
                return gtid
        return None

    def contains(self, domain_id: int, server_id: int, seq_no: int) -> bool:
        """Whether the GTID is at or before this position: its domain's entry has seq >= `seq_no`."""
        wanted = MariadbGtid(domain_id, server_id, seq_no)  # validates the numbers
        mine = self.get(wanted.domain_id)
        return mine is not None and mine.seq_no >= wanted.seq_no

    def contains_gtid(self, gtid: str) -> bool:
        parsed = MariadbGtid.parse(gtid)
        return self.contains(parsed.domain_id, parsed.server_id, parsed.seq_no)

    def advance(self, gtid: MariadbGtid) -> MariadbGtidPos:
        """The position after applying `gtid`: its domain's entry is replaced, as the server does."""
        if len(self.entries) == 1 and self.entries[0].domain_id == gtid.domain_id:
            # One domain, as most servers have: nothing to sort or check again (once per transaction).
            one = object.__new__(MariadbGtidPos)
            object.__setattr__(one, "entries", (gtid,))
            return one
        return MariadbGtidPos(tuple(g for g in self.entries if g.domain_id != gtid.domain_id) + (gtid,))

    def union(self, other: MariadbGtidPos) -> MariadbGtidPos:
        """Per domain the entry with the highest seq (on a tie, `self`'s entry and server id)."""
        best = {g.domain_id: g for g in self.entries}
        for gtid in other.entries:
            mine = best.get(gtid.domain_id)
            if mine is None or gtid.seq_no > mine.seq_no:
                best[gtid.domain_id] = gtid
        return MariadbGtidPos(tuple(best.values()))

    def transactions_since(self, earlier: MariadbGtidPos) -> int:
        """How many transactions this position is past `earlier`: per domain, the difference of the
        sequence numbers, which the server gives out one per transaction (a domain `earlier` lacks
        counts from 0). Domains behind `earlier` count 0, never negative."""
        return sum(
            max(0, g.seq_no - (0 if (e := earlier.get(g.domain_id)) is None else e.seq_no)) for g in self.entries
        )

    def issubset(self, other: MariadbGtidPos) -> bool:
        """Whether every domain of `self` is in `other` with a seq no greater than `other`'s."""
        return all(other.contains(g.domain_id, g.server_id, g.seq_no) for g in self.entries)

    def __le__(self, other: object) -> bool:
        if not isinstance(other, MariadbGtidPos):
            return NotImplemented
        return self.issubset(other)


GtidSet: TypeAlias = MysqlGtidSet | MariadbGtidPos


@overload
def parse_gtid_set(text: str, flavor: Literal["mysql"]) -> MysqlGtidSet: ...
@overload
def parse_gtid_set(text: str, flavor: Literal["mariadb"]) -> MariadbGtidPos: ...
@overload
def parse_gtid_set(text: str, flavor: GtidFlavor) -> GtidSet: ...
def parse_gtid_set(text: str, flavor: GtidFlavor) -> GtidSet:
    """Parse server GTID text of the given flavor ('mysql' GTID set or 'mariadb' GTID position)."""
    if flavor == "mysql":
        return MysqlGtidSet.parse(text)
    if flavor == "mariadb":
        return MariadbGtidPos.parse(text)
    raise ValueError(f"unknown GTID flavor {flavor!r}: expected 'mysql' or 'mariadb'")


# --------------------------------------------------------------------------------------------------
# Binlog positions and offsets
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _binlog_file_parts(file: str) -> tuple[str, int] | None:
    """A binlog file name's base and number (None: not 'name.N'). A reader makes a position per event, of a few
    files: the regex runs once per file."""
    match = _BINLOG_FILE_RE.fullmatch(file)
    return None if match is None else (match[1], int(match[2]))


@dataclass(frozen=True)
class BinlogPosition:
    """A byte offset in a numbered binlog file, e.g. mysql-bin.000003:1234.

    Ordered by the file number as an integer (the server widens it past 999999: mysql-bin.1000000),
    then by offset. Positions from different base names (another server or a renamed log_bin) raise
    ValueError when compared, because their order is unknown; compare GTIDs instead.
    """

    file: str
    pos: int
    _base: str = field(init=False, repr=False, compare=False)
    _order: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = _binlog_file_parts(self.file) if isinstance(self.file, str) else None
        if parts is None:
            raise ValueError(f"invalid binlog file {self.file!r}: expected 'name.N' like 'mysql-bin.000003'")
        if not _is_int(self.pos) or self.pos < 0:
            raise ValueError(f"invalid binlog position {self.pos!r} in {self.file}: expected an integer >= 0")
        # Parsed once: positions are compared for every row change (filters, skips), not only per batch.
        object.__setattr__(self, "_base", parts[0])
        object.__setattr__(self, "_order", (parts[1], self.pos))

    @classmethod
    def parse(cls, text: str) -> BinlogPosition:
        file, sep, pos_text = text.strip().rpartition(":")
        numeric = pos_text.isascii() and pos_text.isdigit()
        if not sep or not numeric or _BINLOG_FILE_RE.fullmatch(file) is None:
            raise ValueError(f"invalid binlog position {_quote(text)}: {_BINLOG_FORM}")
        return cls(file, int(pos_text))

    def moved_to(self, pos: int) -> BinlogPosition:
        """The same file at `pos`, an event's end from its header (an unsigned field of 4 bytes): the file's name
        is not parsed again (the reader makes one per event)."""
        moved = object.__new__(BinlogPosition)
        moved.__dict__.update(file=self.file, pos=pos, _base=self._base, _order=(self._order[0], pos))
        return moved

    @property
    def base_name(self) -> str:
        return self._base

    @property
    def file_number(self) -> int:
        return self._order[0]

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}"

    def _key(self, other: BinlogPosition) -> tuple[tuple[int, int], tuple[int, int]]:
        if self._base != other._base:
            raise ValueError(
                f"cannot order binlog positions {self} and {other}: different binlog base names "
                f"({self.base_name!r} vs {other.base_name!r}), e.g. after a failover; compare GTIDs instead"
            )
        return self._order, other._order

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        mine, theirs = self._key(other)
        return mine < theirs

    def __le__(self, other: object) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        mine, theirs = self._key(other)
        return mine <= theirs

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        mine, theirs = self._key(other)
        return mine > theirs

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        mine, theirs = self._key(other)
        return mine >= theirs


def _require_keys(
    data: Mapping[str, object], what: str, keys: frozenset[str], optional: frozenset[str] = frozenset()
) -> None:
    # Offsets live in Spark checkpoints; an unknown key means a newer writer, so refuse rather than drop it.
    if not isinstance(data, Mapping) or not keys <= set(data) <= keys | optional:
        found = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        also = f" (and optionally {sorted(optional)})" if optional else ""
        raise _bad_json(what, data, f"expected keys {sorted(keys)}{also}, found {found}")


def _bad_json(what: str, data: object, detail: str) -> ValueError:
    return ValueError(f"invalid {what} JSON {_quote(repr(data))}: {detail}")


@dataclass(frozen=True)
class Watermark:
    """Where the binlog was when the chunk reader started or finished reading a chunk.

    The low and high watermarks of the Flink CDC 2.0 / DBLog algorithm: binlog events between them
    that touch the chunk's key range are merged into the chunk. Ordering (`<`, `<=`, ...) uses the
    binlog position only and raises across binlog base names; across a failover only GTIDs compare.
    `==` compares both fields.
    """

    position: BinlogPosition
    gtid: GtidSet | None = None
    server_id: int | None = None
    """`@@server_id` of the server whose binlog `position` is in (None where not known): positions of two
    servers never compare, so a point recorded on another server is found again by its GTIDs."""

    _KEYS: ClassVar[frozenset[str]] = frozenset({"file", "pos", "gtid_flavor", "gtid"})
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"server_id"})

    def __post_init__(self) -> None:
        if self.server_id is not None and (not _is_int(self.server_id) or not 0 <= self.server_id <= _MAX_UINT32):
            raise ValueError(f"invalid server id {self.server_id!r}: expected an integer from 0 to {_MAX_UINT32}")

    def to_json(self) -> dict[str, JsonValue]:
        data: dict[str, JsonValue] = {
            "file": self.position.file,
            "pos": self.position.pos,
            "gtid_flavor": None if self.gtid is None else self.gtid.flavor,
            "gtid": None if self.gtid is None else str(self.gtid),
        }
        if self.server_id is not None:
            data["server_id"] = self.server_id
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Watermark:
        _require_keys(data, "watermark", cls._KEYS, cls._OPTIONAL)
        file, pos, flavor, gtid_text = data["file"], data["pos"], data["gtid_flavor"], data["gtid"]
        server_id = data.get("server_id")
        if not isinstance(file, str) or not _is_int(pos):
            raise _bad_json("watermark", data, "'file' must be a string, 'pos' an integer")
        if server_id is not None and not _is_int(server_id):
            raise _bad_json("watermark", data, "'server_id' must be an integer")
        position = BinlogPosition(file, pos)
        if flavor is None and gtid_text is None:
            return cls(position, None, server_id)
        if flavor not in ("mysql", "mariadb") or not isinstance(gtid_text, str):
            detail = "'gtid_flavor' must be 'mysql' or 'mariadb' and 'gtid' a string, or both null"
            raise _bad_json("watermark", data, detail)
        return cls(position, parse_gtid_set(gtid_text, "mysql" if flavor == "mysql" else "mariadb"), server_id)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Watermark):
            return NotImplemented
        return self.position < other.position

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Watermark):
            return NotImplemented
        return self.position <= other.position

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Watermark):
            return NotImplemented
        return self.position > other.position

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Watermark):
            return NotImplemented
        return self.position >= other.position


@dataclass(frozen=True)
class StreamOffset:
    """Where the binlog reader restarts.

    Seek to `watermark` (the start of a transaction), skip `events_to_skip` row events, then skip
    `rows_to_skip` rows of the next row event. Counting inside the transaction is what lets a restart
    in the middle of a large transaction or a multi-row event neither lose nor repeat a row.
    """

    watermark: Watermark
    events_to_skip: int = 0
    rows_to_skip: int = 0

    _KEYS: ClassVar[frozenset[str]] = frozenset({"watermark", "events_to_skip", "rows_to_skip"})

    def __post_init__(self) -> None:
        for name, value in (("events_to_skip", self.events_to_skip), ("rows_to_skip", self.rows_to_skip)):
            if not _is_int(value) or value < 0:
                raise ValueError(f"invalid stream offset: {name} must be an integer >= 0, got {value!r}")

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "watermark": self.watermark.to_json(),
            "events_to_skip": self.events_to_skip,
            "rows_to_skip": self.rows_to_skip,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> StreamOffset:
        _require_keys(data, "stream offset", cls._KEYS)
        watermark, events, rows = data["watermark"], data["events_to_skip"], data["rows_to_skip"]
        if not isinstance(watermark, Mapping):
            raise _bad_json("stream offset", data, "'watermark' must be an object")
        if not _is_int(events) or not _is_int(rows):
            raise _bad_json("stream offset", data, "'events_to_skip' and 'rows_to_skip' must be integers")
        return cls(Watermark.from_json(watermark), events, rows)

    def to_text(self) -> str:
        """Compact JSON with sorted keys, so equal offsets give equal text in Spark checkpoints."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> StreamOffset:
        form = "expected a JSON object from StreamOffset.to_text()"
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"invalid stream offset {_quote(text)}: not JSON ({exc}); {form}") from None
        if not isinstance(data, dict):
            raise ValueError(f"invalid stream offset {_quote(text)}: {form}")
        return cls.from_json(data)
