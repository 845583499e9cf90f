"""The target-only predicates of a MERGE (ingest/sink/pruning.py): what they say, and that every value is a literal
of the column's exact type."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from ingest.model.columns import SourceColumn, map_columns
from ingest.sink.pruning import MAX_IN_VALUES, MAX_RANGES, target_predicate

COLUMNS = map_columns(
    "db.t",
    [
        SourceColumn("id", "int", "int(11)", False),
        SourceColumn("big", "bigint", "bigint(20) unsigned", False),
        SourceColumn("name", "varchar", "varchar(20)", True),
        SourceColumn("raw", "varbinary", "varbinary(16)", True),
        SourceColumn("amount", "decimal", "decimal(12,2)", True, 12, 2),
        SourceColumn("ratio", "double", "double", True),
        SourceColumn("day", "date", "date", True),
        SourceColumn("at", "datetime", "datetime(6)", True, datetime_precision=6),
        SourceColumn("ts", "timestamp", "timestamp(3)", True, datetime_precision=3),
        SourceColumn("`odd` col", "bigint", "bigint(20)", False),
    ],
)


def test_no_keys_no_predicate() -> None:
    assert target_predicate(COLUMNS, ("id",), []) is None


def test_integer_keys_are_a_set_then_ranges_split_at_the_wide_gaps() -> None:
    keys = [(k,) for k in (5, 1, 2, 3, 1000, 1001, 3)]
    assert target_predicate(COLUMNS, ("id",), keys) == (
        "t.`id` IN (1, 2, 3, 5, 1000, 1001) AND (t.`id` BETWEEN 1 AND 5 OR t.`id` BETWEEN 1000 AND 1001)"
    )


def test_evenly_spread_keys_keep_one_range() -> None:
    keys = [(k * 7,) for k in range(1, 300)]
    predicate = target_predicate(COLUMNS, ("id",), keys)
    assert predicate == "t.`id` BETWEEN 7 AND 2093"  # too many keys to list: Spark's Bloom filter has them


def test_ranges_are_bounded_and_cover_every_key() -> None:
    # 20 clusters of 10 keys, a million apart, and one key far out
    keys = [(c * 1_000_000 + i,) for c in range(20) for i in range(10)] + [(10**12,)]
    predicate = target_predicate(COLUMNS, ("`odd` col",), keys, alias="x")
    assert predicate is not None
    assert predicate.startswith("(x.```odd`` col` BETWEEN 0L AND ")
    bounds = [
        tuple(int(v.rstrip("L")) for v in r.split(" BETWEEN ")[1].split(" AND "))
        for r in predicate.strip("()").split(" OR ")
    ]
    assert len(bounds) == MAX_RANGES
    assert bounds[-1] == (10**12, 10**12)  # the widest gap is cut first
    assert sum(hi - lo for lo, hi in bounds) < 20_000_000  # of a span of 10**12
    assert all(any(lo <= k <= hi for lo, hi in bounds) for (k,) in keys)


QUOTED = "it's \\ 'quoted' ☃"


def test_every_literal_has_the_columns_exact_type() -> None:
    keys = [
        (
            18446744073709551615,
            QUOTED,
            b"\x00\xff'",
            Decimal("12.50"),
            dt.date(1969, 12, 31),
            dt.datetime(2024, 3, 10, 2, 30, 0, 5),
            dt.datetime(1960, 1, 1, 0, 0, 0, 1000),
        )
    ]
    names = ("big", "name", "raw", "amount", "day", "at", "ts")
    predicate = target_predicate(COLUMNS, names, keys)
    assert predicate == " AND ".join(
        [
            "t.`big` IN (CAST('18446744073709551615' AS DECIMAL(20,0)))",
            "t.`big` BETWEEN CAST('18446744073709551615' AS DECIMAL(20,0)) AND "
            "CAST('18446744073709551615' AS DECIMAL(20,0))",
            f"t.`name` IN (CAST(X'{QUOTED.encode().hex()}' AS STRING))",
            "t.`raw` IN (X'00ff27')",
            "t.`amount` IN (CAST('12.50' AS DECIMAL(12,2)))",
            "t.`day` IN (DATE '1969-12-31')",
            "t.`at` IN (TIMESTAMP_NTZ '2024-03-10 02:30:00.000005')",
            # 1960-01-01T00:00:00.001 UTC, before the epoch
            "t.`ts` IN (timestamp_micros(-315619199999000L))",
        ]
    )


def test_a_type_without_exact_literals_gets_no_predicate() -> None:
    assert target_predicate(COLUMNS, ("ratio",), [(0.1,), (0.2,)]) is None
    assert target_predicate(COLUMNS, ("id", "ratio"), [(1, 0.1)]) == "t.`id` IN (1) AND t.`id` BETWEEN 1 AND 1"


def test_other_columns_keep_null_rows() -> None:
    predicate = target_predicate(
        COLUMNS, ("id",), [(1,)], {"day": [dt.date(2024, 1, 2), None, dt.date(2024, 1, 1)], "name": [None]}
    )
    assert predicate == (
        "t.`id` IN (1) AND t.`id` BETWEEN 1 AND 1 AND "
        "(t.`day` IN (DATE '2024-01-01', DATE '2024-01-02') OR t.`day` IS NULL) AND "
        "(t.`day` BETWEEN DATE '2024-01-01' AND DATE '2024-01-02' OR t.`day` IS NULL) AND t.`name` IS NULL"
    )


def test_strings_get_one_range() -> None:
    predicate = target_predicate(COLUMNS, ("name",), [("b",), ("a",), ("é",)])
    a, b, e = (f"CAST(X'{s.encode().hex()}' AS STRING)" for s in ("a", "b", "é"))
    assert predicate == f"t.`name` IN ({a}, {b}, {e}) AND t.`name` BETWEEN {a} AND {e}"


def test_up_to_max_in_values_are_listed() -> None:
    listed = target_predicate(COLUMNS, ("id",), [(k,) for k in range(MAX_IN_VALUES)])
    assert listed is not None and listed.startswith("t.`id` IN (0, 1, 2,")
    assert target_predicate(COLUMNS, ("id",), [(k,) for k in range(MAX_IN_VALUES + 1)]) == (
        f"t.`id` BETWEEN 0 AND {MAX_IN_VALUES}"
    )


def test_partition_values_are_every_image_of_the_batch_unless_the_target_may_keep_old_rows() -> None:
    from ingest.changes.materializer import Change
    from ingest.config import parse_config
    from ingest.model.schema import TableSchema
    from ingest.query.batch import TableStream, _partition_values

    schema = TableSchema(
        "db",
        "t",
        (SourceColumn("id", "int", "int(11)", False), SourceColumn("day", "date", "date", True)),
        ("id",),
        ("id",),
        (None,),
    )
    table = TableStream(schema, "lake.db.t", [], [], None, partition_columns=("day",))
    d1, d2, d3 = dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)
    changes = [
        Change((1, 10, 0), (1, d1), (1, d2)),
        Change((1, 20, 0), (2, None), None),
        Change((1, 30, 0), None, (3, d3)),
    ]

    def values(**options: object) -> object:
        config = parse_config(
            {
                "source": {"host": "h", "user": "u", "password": {"file": "/dev/null"}},
                "tables": {"include": [r"db\.t"]},
                "sink": {"catalog": {"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db"}},
                **options,
            }
        )
        return _partition_values(config.targets, config.stream, table, changes)

    assert values() == {"day": {d1, d2, d3, None}}
    assert values(stream={"on_schema_change": "ignore"}) is None
    assert values(table_options={"db.t": {"on_unrepresentable": "dead_letter"}}) is None
    table.partition_columns = ()
    assert values() is None
