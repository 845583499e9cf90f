"""Unit tests of ingest.model.position: GTID sets, binlog positions and checkpointed offsets."""

from __future__ import annotations

import json
import random

import pytest

from ingest.model.position import (
    BinlogPosition,
    GtidSet,
    MariadbGtid,
    MariadbGtidPos,
    MysqlGtidSet,
    StreamOffset,
    Watermark,
    parse_gtid_set,
)

U1 = "3528d5b7-e86d-11ea-8e5b-0242ac110004"
U2 = "5d0b498d-e388-11ea-a9ff-0242ac110004"
# As `SELECT @@gtid_executed` prints it on a server that replicated from two sources, with gaps.
REAL_SET = f"{U1}:9-7635928:7635930-7648258,\n{U2}:2853-3315"


# --------------------------------------------------------------------------------------------------
# MySQL GTID sets
# --------------------------------------------------------------------------------------------------


def test_real_multi_uuid_set_round_trips_to_canonical_text() -> None:
    gtids = MysqlGtidSet.parse(REAL_SET)
    assert str(gtids) == f"{U1}:9-7635928:7635930-7648258,{U2}:2853-3315"
    assert MysqlGtidSet.parse(str(gtids)) == gtids
    assert gtids.uuids() == (U1, U2)
    assert gtids.ranges(U1) == ((9, 7635928), (7635930, 7648258))


@pytest.mark.parametrize(
    ("uuid", "seq", "expected"),
    [
        (U1, 8, False),  # before the first interval
        (U1, 9, True),  # first interval's start
        (U1, 7635928, True),  # first interval's end
        (U1, 7635929, False),  # the gap
        (U1, 7635930, True),  # second interval's start
        (U1, 7648258, True),  # last interval's end
        (U1, 7648259, False),  # after the last interval
        (U2, 2852, False),
        (U2, 2853, True),
        (U2, 3315, True),
        (U2, 3316, False),
        (U2, 9, False),  # a number of U1's interval, asked of U2
        ("00000000-0000-0000-0000-000000000001", 9, False),  # unknown server
    ],
)
def test_contains_in_real_set(uuid: str, seq: int, expected: bool) -> None:
    gtids = MysqlGtidSet.parse(REAL_SET)
    assert gtids.contains(uuid, seq) is expected
    assert gtids.contains_gtid(f"{uuid}:{seq}") is expected
    assert gtids.contains_gtid(f"{uuid.upper()}:{seq}") is expected


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("", ""),
        ("  \n ", ""),
        (f"{U1}:1-5:6-9", f"{U1}:1-9"),  # adjacent
        (f"{U1}:1-5:3-9", f"{U1}:1-9"),  # overlapping
        (f"{U1}:14-16:1-9", f"{U1}:1-9:14-16"),  # unsorted
        (f"{U1}:2-3:1:4", f"{U1}:1-4"),  # single numbers joining ranges
        (f"{U1}:5", f"{U1}:5"),
        (f"{U1}:5-5", f"{U1}:5"),
        (f"{U1}:1-3:7", f"{U1}:1-3:7"),
        (f"{U2}:1-3,{U1}:1-9:14-16", f"{U1}:1-9:14-16,{U2}:1-3"),  # UUIDs sorted
        (f"{U1}:1-3,{U1}:4-6", f"{U1}:1-6"),  # same UUID twice
        (f"{U1.upper()}:1-3", f"{U1}:1-3"),
        (f" {U1} : 1-3 ,\n\t{U2}:7 ", f"{U1}:1-3,{U2}:7"),
        (f"{U1}:1-{2**63 - 1}", f"{U1}:1-{2**63 - 1}"),
    ],
)
def test_mysql_parse_normalizes(text: str, canonical: str) -> None:
    assert str(MysqlGtidSet.parse(text)) == canonical


def test_upper_case_input_equals_lower_case_input() -> None:
    upper = MysqlGtidSet.parse(REAL_SET.upper())
    assert upper == MysqlGtidSet.parse(REAL_SET)
    assert upper.uuids() == (U1, U2)
    assert upper.contains(U1.upper(), 9)


def test_constructor_normalizes_like_parse() -> None:
    built = MysqlGtidSet(((U1.upper(), ((6, 9), (1, 5))), (U2, ())))
    assert built == MysqlGtidSet.parse(f"{U1}:1-9")
    assert hash(built) == hash(MysqlGtidSet.parse(f"{U1}:1-9"))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (f"{U1}", "no transaction numbers"),
        (f"{U1}:", "is not a number or a range"),
        (f"{U1}:1-", "is not a number or a range"),
        (f"{U1}:a-5", "is not a number or a range"),
        (f"{U1}:0-5", "1 <= N <= M"),
        (f"{U1}:9-5", "1 <= N <= M"),
        (f"{U1}:1-{2**63}", "1 <= N <= M"),
        (f"{U1}:1-{'9' * 40}", "out of range"),
        (f"{U1}:1-5,", "does not start with a server UUID"),
        (f"{U1}:1-5,,{U2}:1", "does not start with a server UUID"),
        ("3528d5b7-e86d-11ea-8e5b:1-5", "does not start with a server UUID"),
        ("0-1-100", "looks like a MariaDB GTID"),
        (f"{U1}:mytag:1-5", "tagged GTIDs"),
        (f"{U1}:1-5:mytag:7", "tagged GTIDs"),
    ],
)
def test_mysql_bad_text_is_quoted_with_expected_form(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        MysqlGtidSet.parse(text)
    message = str(info.value)
    assert repr(text) in message
    assert fragment in message
    assert "expected 'uuid:N[-M]" in message


def test_very_long_bad_text_is_quoted_truncated() -> None:
    text = ",".join(f"{U1}:{n}" for n in range(1, 200, 2)) + ",oops"
    with pytest.raises(ValueError, match=r"'oops' does not start with a server UUID") as info:
        MysqlGtidSet.parse(text)
    assert f"({len(text)} chars)" in str(info.value)


@pytest.mark.parametrize(
    ("gtid", "fragment"),
    [
        (U1, "expected 'uuid:N'"),
        (f"{U1}:0", "is not a number"),
        (f"{U1}:1-5", "is not a number"),
        (f"{U1}:mytag:5", "tagged GTIDs"),
        ("nope:5", "expected 'uuid:N'"),
    ],
)
def test_contains_gtid_rejects_bad_gtid(gtid: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment) as info:
        MysqlGtidSet.parse(REAL_SET).contains_gtid(gtid)
    assert repr(gtid) in str(info.value)


@pytest.mark.parametrize("seq", [0, -1, 2**63])
def test_mysql_numbers_out_of_range_are_rejected(seq: int) -> None:
    gtids = MysqlGtidSet.parse(f"{U1}:1-5")
    with pytest.raises(ValueError, match="expected an integer from 1 to"):
        gtids.contains(U1, seq)
    with pytest.raises(ValueError, match="expected an integer from 1 to"):
        gtids.add(U1, seq)


def test_add_returns_new_set_and_merges() -> None:
    gtids = MysqlGtidSet.parse(f"{U1}:1-5:7-9")
    filled = gtids.add(U1, 6)
    assert str(filled) == f"{U1}:1-9"
    assert str(gtids) == f"{U1}:1-5:7-9"  # unchanged
    assert str(filled.add(U2.upper(), 3)) == f"{U1}:1-9,{U2}:3"
    assert filled.add(U1, 4) == filled


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        ("", "", ""),
        (f"{U1}:1-5", "", f"{U1}:1-5"),
        (f"{U1}:1-5", f"{U1}:6-9", f"{U1}:1-9"),
        (f"{U1}:1-5", f"{U1}:8-9", f"{U1}:1-5:8-9"),
        (f"{U1}:1-5:20-30", f"{U1}:4-22,{U2}:1", f"{U1}:1-30,{U2}:1"),
        (REAL_SET, f"{U1}:7635929", f"{U1}:9-7648258,{U2}:2853-3315"),
    ],
)
def test_union(left: str, right: str, expected: str) -> None:
    a, b = MysqlGtidSet.parse(left), MysqlGtidSet.parse(right)
    assert str(a.union(b)) == expected
    assert str(b.union(a)) == expected


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        ("", f"{U1}:1-5", ""),
        (f"{U1}:1-5", "", f"{U1}:1-5"),
        (f"{U1}:1-10", f"{U1}:3-4", f"{U1}:1-2:5-10"),
        (f"{U1}:1-10", f"{U1}:1-10", ""),
        (f"{U1}:1-10", f"{U1}:0000000001-20", ""),
        (f"{U1}:1-10", f"{U1}:5-20", f"{U1}:1-4"),
        (f"{U1}:5-10", f"{U1}:1-6", f"{U1}:7-10"),
        (f"{U1}:1-10:20-30", f"{U1}:8-22", f"{U1}:1-7:23-30"),  # one range of right spans two of left
        (f"{U1}:1-30", f"{U1}:2:4:6-7:29", f"{U1}:1:3:5:8-28:30"),
        (f"{U1}:1-5,{U2}:1-5", f"{U2}:1-5", f"{U1}:1-5"),
        (f"{U1}:1-5", f"{U2}:1-5", f"{U1}:1-5"),  # other UUIDs do not subtract
        (REAL_SET, f"{U1}:1-7635929,{U2}:3000-9999", f"{U1}:7635930-7648258,{U2}:2853-2999"),
    ],
)
def test_difference(left: str, right: str, expected: str) -> None:
    assert str(MysqlGtidSet.parse(left).difference(MysqlGtidSet.parse(right))) == expected


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        ("", "", True),
        ("", REAL_SET, True),
        (REAL_SET, "", False),
        (REAL_SET, REAL_SET, True),
        (f"{U1}:9-20", REAL_SET, True),
        (f"{U1}:7635928-7635930", REAL_SET, False),  # spans the gap
        (f"{U2}:2853", REAL_SET, True),
        (f"{U2}:2852", REAL_SET, False),
        (f"{U1}:1-9", f"{U1}:1-5:6-9", True),
        (REAL_SET, f"{U1}:1-7648258,{U2}:1-4000", True),
    ],
)
def test_issubset(left: str, right: str, expected: bool) -> None:
    a, b = MysqlGtidSet.parse(left), MysqlGtidSet.parse(right)
    assert a.issubset(b) is expected
    assert (a <= b) is expected
    assert (b >= a) is expected


def _random_set(rng: random.Random) -> tuple[MysqlGtidSet, set[tuple[str, int]]]:
    numbers = {(uuid, n) for uuid in (U1, U2) for n in range(1, 41) if rng.random() < 0.4}
    shuffled = sorted(numbers, key=lambda g: rng.random())  # any order must give the same set
    return MysqlGtidSet(tuple((uuid, ((n, n),)) for uuid, n in shuffled)), numbers


def _members(gtids: MysqlGtidSet) -> set[tuple[str, int]]:
    return {(uuid, n) for uuid, ranges in gtids.intervals for lo, hi in ranges for n in range(lo, hi + 1)}


def test_set_operations_agree_with_python_sets() -> None:
    # Seeded so a failure reproduces; checks the interval arithmetic against the obvious model.
    rng = random.Random(20240611)
    for _ in range(60):
        (a, a_model), (b, b_model) = _random_set(rng), _random_set(rng)
        assert _members(a.difference(b)) == a_model - b_model
        union, union_model = a.union(b), a_model | b_model
        assert _members(union) == a_model | b_model
        assert all(union.contains(u, n) is ((u, n) in union_model) for u in (U1, U2) for n in range(1, 41))
        assert a.issubset(b) is (a_model <= b_model)
        assert MysqlGtidSet.parse(str(a)) == a


def test_is_empty() -> None:
    assert MysqlGtidSet.parse("").is_empty()
    assert MysqlGtidSet().is_empty()
    assert not MysqlGtidSet.parse(f"{U1}:1").is_empty()
    assert MysqlGtidSet.parse(f"{U1}:1-5").difference(MysqlGtidSet.parse(f"{U1}:1-5")).is_empty()


# --------------------------------------------------------------------------------------------------
# MariaDB GTID positions
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("", ""),
        ("0-1-100", "0-1-100"),
        ("0-1-100,1-2-7", "0-1-100,1-2-7"),
        ("1-2-7, \n0-1-100", "0-1-100,1-2-7"),  # sorted by domain
        ("10-1-5,2-1-5", "2-1-5,10-1-5"),  # numeric, not text, order
        (f"{2**32 - 1}-{2**32 - 1}-{2**64 - 1}", f"{2**32 - 1}-{2**32 - 1}-{2**64 - 1}"),
    ],
)
def test_mariadb_parse_normalizes(text: str, canonical: str) -> None:
    pos = MariadbGtidPos.parse(text)
    assert str(pos) == canonical
    assert MariadbGtidPos.parse(str(pos)) == pos


def test_mariadb_transactions_since_counts_seq_per_domain() -> None:
    now = MariadbGtidPos.parse("0-1-120,1-2-9,5-3-4")
    assert now.transactions_since(MariadbGtidPos.parse("0-1-100,1-2-7")) == 20 + 2 + 4  # domain 5 from 0
    assert now.transactions_since(now) == 0
    # After a failover the domain continues on another server: only the sequence numbers count.
    assert MariadbGtidPos.parse("0-9-105").transactions_since(MariadbGtidPos.parse("0-1-100")) == 5
    assert MariadbGtidPos.parse("0-1-90").transactions_since(MariadbGtidPos.parse("0-1-100,1-1-3")) == 0
    assert MariadbGtidPos().transactions_since(now) == 0


@pytest.mark.parametrize(
    ("gtid", "expected"),
    [
        ("0-1-99", True),
        ("0-1-100", True),
        ("0-1-101", False),
        ("0-3-100", True),  # server id is not compared: the domain moved to another server
        ("1-2-7", True),
        ("1-2-8", False),
        ("2-1-1", False),  # domain not in the position
    ],
)
def test_mariadb_contains(gtid: str, expected: bool) -> None:
    pos = MariadbGtidPos.parse("0-1-100,1-2-7")
    domain, server, seq = (int(n) for n in gtid.split("-"))
    assert pos.contains(domain, server, seq) is expected
    assert pos.contains_gtid(gtid) is expected


@pytest.mark.parametrize("text", ["0-1-100,0-2-5", "0-1-100,1-1-3,0-1-100"])
def test_mariadb_duplicate_domain_is_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="domain 0 appears twice") as info:
        MariadbGtidPos.parse(text)
    assert repr(text) in str(info.value)


def test_mariadb_duplicate_domain_is_rejected_by_constructor() -> None:
    with pytest.raises(ValueError, match="domain 3 appears twice"):
        MariadbGtidPos((MariadbGtid(3, 1, 1), MariadbGtid(3, 2, 2)))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("0-1", "is not 'domain-server_id-seq'"),
        ("0-1-100,", "is not 'domain-server_id-seq'"),
        ("0-1-x", "is not 'domain-server_id-seq'"),
        ("-1-1-5", "is not 'domain-server_id-seq'"),
        (f"{U1}:1-5", "looks like a MySQL GTID set"),
        (f"{2**32}-1-1", "out of range"),
        (f"0-1-{2**64}", "out of range"),
    ],
)
def test_mariadb_bad_text_is_quoted_with_expected_form(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        MariadbGtidPos.parse(text)
    message = str(info.value)
    assert repr(text) in message
    assert fragment in message
    assert "e.g. '0-1-100,1-2-7'" in message


def test_mariadb_union_keeps_max_seq_and_its_server() -> None:
    a = MariadbGtidPos.parse("0-1-100,1-2-7")
    b = MariadbGtidPos.parse("0-3-150,1-2-5,2-4-1")
    assert str(a.union(b)) == "0-3-150,1-2-7,2-4-1"
    assert str(b.union(a)) == "0-3-150,1-2-7,2-4-1"


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        ("", "", True),
        ("", "0-1-1", True),
        ("0-1-1", "", False),
        ("0-1-100", "0-1-100,1-2-7", True),
        ("0-1-100", "0-9-100", True),
        ("0-1-101", "0-1-100,1-2-7", False),
        ("0-1-100,2-1-1", "0-1-100,1-2-7", False),  # domain 2 missing on the right
    ],
)
def test_mariadb_issubset(left: str, right: str, expected: bool) -> None:
    a, b = MariadbGtidPos.parse(left), MariadbGtidPos.parse(right)
    assert a.issubset(b) is expected
    assert (a <= b) is expected


def test_mariadb_advance_returns_new_position() -> None:
    pos = MariadbGtidPos.parse("0-1-100,1-2-7")
    assert str(pos.advance(MariadbGtid(0, 3, 101))) == "0-3-101,1-2-7"
    assert str(pos.advance(MariadbGtid(5, 1, 1))) == "0-1-100,1-2-7,5-1-1"
    assert str(pos) == "0-1-100,1-2-7"  # unchanged
    assert pos.advance(MariadbGtid(0, 1, 101)).contains_gtid("0-1-101")
    assert not pos.contains_gtid("0-1-101")
    one = MariadbGtidPos.parse("0-1-100")  # one domain: the entry replaced in place of a sort
    assert one.advance(MariadbGtid(0, 2, 101)) == MariadbGtidPos.parse("0-2-101")
    assert str(one.advance(MariadbGtid(3, 1, 1))) == "0-1-100,3-1-1"


def test_mariadb_is_empty_and_get() -> None:
    assert MariadbGtidPos.parse("").is_empty()
    pos = MariadbGtidPos.parse("0-1-100")
    assert not pos.is_empty()
    assert pos.get(0) == MariadbGtid(0, 1, 100)
    assert pos.get(1) is None


# --------------------------------------------------------------------------------------------------
# parse_gtid_set
# --------------------------------------------------------------------------------------------------


def test_parse_gtid_set_picks_type_by_flavor() -> None:
    mysql = parse_gtid_set(REAL_SET, "mysql")
    mariadb = parse_gtid_set("0-1-100", "mariadb")
    assert isinstance(mysql, MysqlGtidSet)
    assert mysql.contains(U2, 3000)
    assert isinstance(mariadb, MariadbGtidPos)
    assert mariadb.contains(0, 1, 100)
    with pytest.raises(ValueError, match="MariaDB"):
        parse_gtid_set("0-1-100", "mysql")
    with pytest.raises(ValueError, match="unknown GTID flavor 'postgres'"):
        parse_gtid_set("0-1-100", "postgres")  # type: ignore[call-overload]


# --------------------------------------------------------------------------------------------------
# Binlog positions
# --------------------------------------------------------------------------------------------------


def test_binlog_parse_and_str() -> None:
    pos = BinlogPosition.parse("mysql-bin.000003:1234")
    assert pos == BinlogPosition("mysql-bin.000003", 1234)
    assert str(pos) == "mysql-bin.000003:1234"
    assert pos.base_name == "mysql-bin"
    assert pos.file_number == 3


@pytest.mark.parametrize(
    ("low", "high"),
    [
        ("mysql-bin.000003:4", "mysql-bin.000003:5"),
        ("mysql-bin.000003:99999", "mysql-bin.000004:4"),
        ("mysql-bin.999999:4000", "mysql-bin.1000000:4"),  # digit count grows; text order would be wrong
        ("mysql-bin.9:4", "mysql-bin.10:4"),
        ("my.host-bin.000001:4", "my.host-bin.000002:4"),
    ],
)
def test_binlog_ordering(low: str, high: str) -> None:
    a, b = BinlogPosition.parse(low), BinlogPosition.parse(high)
    assert a < b and a <= b and b > a and b >= a
    assert not (b < a) and not (a > b) and not (b <= a) and not (a >= b)
    assert sorted([b, a]) == [a, b]


def test_binlog_equal_positions_compare_equal() -> None:
    a, b = BinlogPosition.parse("mysql-bin.000003:4"), BinlogPosition("mysql-bin.000003", 4)
    assert a == b and a <= b and a >= b and not a < b and not a > b


def test_binlog_different_base_names_cannot_be_ordered() -> None:
    a, b = BinlogPosition.parse("mysql-bin.000003:4"), BinlogPosition.parse("mariadb-bin.000001:4")
    with pytest.raises(ValueError, match="different binlog base names"):
        _ = a < b
    with pytest.raises(ValueError, match="compare GTIDs instead"):
        _ = a >= b
    assert a != b


@pytest.mark.parametrize(
    "text",
    [
        "mysql-bin.000003",
        "mysql-bin:1234",
        "mysql-bin.000003:",
        "mysql-bin.000003:-1",
        "mysql-bin.000003:x",
        "",
    ],
)
def test_binlog_bad_text(text: str) -> None:
    with pytest.raises(ValueError, match="expected 'file:pos'") as info:
        BinlogPosition.parse(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(("file", "pos"), [("mysql-bin", 4), ("mysql-bin.", 4), ("mysql-bin.000001", -1)])
def test_binlog_constructor_validates(file: str, pos: int) -> None:
    with pytest.raises(ValueError, match="invalid binlog"):
        BinlogPosition(file, pos)


# --------------------------------------------------------------------------------------------------
# Watermark and StreamOffset
# --------------------------------------------------------------------------------------------------

POS = BinlogPosition("mysql-bin.000003", 1234)
GTIDS: list[GtidSet | None] = [
    None,
    MysqlGtidSet.parse(REAL_SET),
    MysqlGtidSet(),
    MariadbGtidPos.parse("0-1-100,1-2-7"),
]


@pytest.mark.parametrize("gtid", GTIDS, ids=["none", "mysql", "mysql-empty", "mariadb"])
def test_watermark_json_round_trip(gtid: GtidSet | None) -> None:
    mark = Watermark(POS, gtid)
    data = mark.to_json()
    # Only plain JSON types, so the dict survives json.dumps/loads unchanged.
    assert json.loads(json.dumps(data)) == data
    assert data["file"] == "mysql-bin.000003"
    assert data["pos"] == 1234
    assert data["gtid_flavor"] == (None if gtid is None else gtid.flavor)
    assert Watermark.from_json(data) == mark
    assert Watermark.from_json(json.loads(json.dumps(data))) == mark


def test_watermark_json_carries_the_server_id_and_reads_records_without_one() -> None:
    mark = Watermark(POS, MariadbGtidPos.parse("0-7-12"), server_id=7)
    data = mark.to_json()
    assert data["server_id"] == 7
    assert Watermark.from_json(json.loads(json.dumps(data))) == mark
    older = {k: v for k, v in data.items() if k != "server_id"}  # written before server ids were recorded
    assert Watermark.from_json(older) == Watermark(POS, MariadbGtidPos.parse("0-7-12"))
    assert mark != Watermark(POS, MariadbGtidPos.parse("0-7-12"), server_id=8)
    with pytest.raises(ValueError, match="'server_id' must be an integer"):
        Watermark.from_json({**data, "server_id": "7"})
    with pytest.raises(ValueError, match="invalid server id"):
        Watermark(POS, None, server_id=2**32)


def test_watermark_json_keeps_flavor() -> None:
    assert Watermark(POS, MysqlGtidSet.parse(f"{U1}:1")).to_json()["gtid_flavor"] == "mysql"
    assert Watermark(POS, MariadbGtidPos.parse("0-1-1")).to_json()["gtid_flavor"] == "mariadb"
    # An empty MySQL set is not "no GTID".
    assert Watermark.from_json(Watermark(POS, MysqlGtidSet()).to_json()).gtid == MysqlGtidSet()


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"file": "mysql-bin.000003", "pos": 4, "gtid_flavor": None}, "expected keys"),
        ({"file": "mysql-bin.000003", "pos": 4, "gtid_flavor": None, "gtid": None, "x": 1}, "expected keys"),
        ({"file": "mysql-bin.000003", "pos": "4", "gtid_flavor": None, "gtid": None}, "'pos' an integer"),
        ({"file": "mysql-bin.000003", "pos": True, "gtid_flavor": None, "gtid": None}, "'pos' an integer"),
        ({"file": "mysql-bin.000003", "pos": 4, "gtid_flavor": "pg", "gtid": ""}, "'gtid_flavor' must be"),
        ({"file": "mysql-bin.000003", "pos": 4, "gtid_flavor": "mysql", "gtid": None}, "'gtid_flavor' must"),
        ({"file": "mysql-bin.000003", "pos": 4, "gtid_flavor": None, "gtid": "0-1-1"}, "'gtid_flavor' must"),
        ({"file": "mysql-bin.000003", "pos": 4, "gtid_flavor": "mariadb", "gtid": "x"}, "MariaDB GTID"),
    ],
)
def test_watermark_from_bad_json(data: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        Watermark.from_json(data)


def test_watermark_orders_by_binlog_position_only() -> None:
    low = Watermark(BinlogPosition("mysql-bin.999999", 500), MysqlGtidSet.parse(f"{U1}:1-100"))
    high = Watermark(BinlogPosition("mysql-bin.1000000", 4), MysqlGtidSet.parse(f"{U1}:1-5"))
    assert low < high and low <= high and high > low and high >= low
    same_pos = Watermark(low.position, None)
    assert low <= same_pos and low >= same_pos and low != same_pos
    assert not (low < same_pos) and not (low > same_pos)
    other_server = Watermark(BinlogPosition("other-bin.000001", 4), None)
    with pytest.raises(ValueError, match="different binlog base names"):
        _ = low <= other_server


@pytest.mark.parametrize("gtid", GTIDS, ids=["none", "mysql", "mysql-empty", "mariadb"])
@pytest.mark.parametrize(("events", "rows"), [(0, 0), (3, 0), (3, 17)])
def test_stream_offset_text_round_trip(gtid: GtidSet | None, events: int, rows: int) -> None:
    offset = StreamOffset(Watermark(POS, gtid), events_to_skip=events, rows_to_skip=rows)
    text = offset.to_text()
    assert StreamOffset.from_text(text) == offset
    assert StreamOffset.from_json(json.loads(text)) == offset
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def test_stream_offset_text_is_exact() -> None:
    offset = StreamOffset(Watermark(POS, MariadbGtidPos.parse("0-1-100")), 2, 5)
    assert offset.to_text() == (
        '{"events_to_skip":2,"rows_to_skip":5,"watermark":'
        '{"file":"mysql-bin.000003","gtid":"0-1-100","gtid_flavor":"mariadb","pos":1234}}'
    )


def test_stream_offset_defaults_to_no_skipping() -> None:
    offset = StreamOffset(Watermark(POS))
    assert (offset.events_to_skip, offset.rows_to_skip) == (0, 0)


@pytest.mark.parametrize(("events", "rows"), [(-1, 0), (0, -1), (-5, -5)])
def test_stream_offset_rejects_negative_counts(events: int, rows: int) -> None:
    with pytest.raises(ValueError, match="must be an integer >= 0"):
        StreamOffset(Watermark(POS), events_to_skip=events, rows_to_skip=rows)


def test_stream_offset_from_json_rejects_negative_counts() -> None:
    data = StreamOffset(Watermark(POS), 1, 1).to_json()
    data["rows_to_skip"] = -1
    with pytest.raises(ValueError, match="rows_to_skip must be an integer >= 0"):
        StreamOffset.from_json(data)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "not JSON"),
        ("{", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"watermark": {}, "events_to_skip": 0, "rows_to_skip": 0}', "invalid watermark JSON"),
        ('{"watermark": 1, "events_to_skip": 0, "rows_to_skip": 0}', "'watermark' must be an object"),
        ('{"events_to_skip": 0, "rows_to_skip": 0}', "expected keys"),
        (
            '{"watermark": {"file": "mysql-bin.000003", "pos": 4, "gtid_flavor": null, "gtid": null},'
            ' "events_to_skip": 1.5, "rows_to_skip": 0}',
            "must be integers",
        ),
    ],
)
def test_stream_offset_from_bad_text(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        StreamOffset.from_text(text)


def test_a_position_moved_in_its_file_is_the_position_parsed_there() -> None:
    start = BinlogPosition("mysql-bin.1000001", 4)
    moved = start.moved_to(98765)
    parsed = BinlogPosition.parse("mysql-bin.1000001:98765")
    assert moved == parsed and hash(moved) == hash(parsed) and str(moved) == str(parsed) and repr(moved) == repr(parsed)
    assert (moved.base_name, moved.file_number) == ("mysql-bin", 1000001)
    assert start < moved < BinlogPosition("mysql-bin.1000002", 4)
    with pytest.raises(ValueError, match="different binlog base names"):
        _ = moved < BinlogPosition("other-bin.1000001", 5)


def test_a_gtid_of_an_event_is_the_gtid_made_with_its_checks() -> None:
    made = MariadbGtid.of_event(3, 4_294_967_295, 2**64 - 1)
    checked = MariadbGtid(3, 4_294_967_295, 2**64 - 1)
    assert made == checked and hash(made) == hash(checked) and str(made) == "3-4294967295-18446744073709551615"
    assert MariadbGtidPos((MariadbGtid(3, 1, 1),)).advance(made) == MariadbGtidPos((checked,))
