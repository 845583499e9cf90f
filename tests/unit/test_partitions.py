"""Unit tests of ingest.source.binlog.partitions: the rows a DROP or TRUNCATE PARTITION removes, by the bounds the job
kept, and the bounds carried through partition statements (issue 40)."""

from __future__ import annotations

import pytest

from ingest.source.binlog.partitions import PartitionLayout, after_statement, partition_statement, removed_rows

RANGE = PartitionLayout(
    "RANGE COLUMNS", "`d`", (("p23", "'2024-01-01'"), ("p24", "'2025-01-01'"), ("pmax", "MAXVALUE"))
)
LIST = PartitionLayout("LIST", "`region`", (("a", "1,2"), ("b", "3,NULL"), ("c", "4")))


def quote(column: str) -> str:
    return f"t.`{column}`"


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("ALTER TABLE t DROP PARTITION p23", ("drop", ("p23",))),
        ("ALTER TABLE db.t TRUNCATE PARTITION p23, `p24`", ("truncate", ("p23", "p24"))),
        ("ALTER TABLE t TRUNCATE PARTITION ALL", ("truncate", ("ALL",))),
        ("/* nightly */ ALTER TABLE t DROP PARTITION p23, ALGORITHM=INPLACE", ("drop", ("p23",))),
        ("ALTER TABLE t EXCHANGE PARTITION p23 WITH TABLE x", None),
        ("ALTER TABLE t ADD COLUMN x INT", None),
        ("TRUNCATE TABLE t", None),
    ],
)
def test_the_partitions_a_statement_drops_or_truncates(query: str, found: object) -> None:
    assert partition_statement(query) == found


def test_range_partitions_hold_the_rows_from_the_bound_before_to_their_own_and_the_first_holds_null() -> None:
    assert removed_rows(RANGE, ("p23",), quote) == "(t.`d` < '2024-01-01' OR t.`d` IS NULL)"
    assert removed_rows(RANGE, ("P24",), quote) == "(t.`d` >= '2024-01-01' AND t.`d` < '2025-01-01')"
    assert removed_rows(RANGE, ("pmax",), quote) == "(t.`d` >= '2025-01-01')"
    assert removed_rows(RANGE, ("ALL",), quote).count(" OR (") == 2


def test_list_partitions_hold_their_values_and_null_where_listed() -> None:
    assert (
        removed_rows(LIST, ("a", "b"), quote) == "(t.`region` IN (1, 2)) OR (t.`region` IN (3) OR t.`region` IS NULL)"
    )


def test_time_partitions_by_year_to_days_or_unix_timestamp_compare_the_function_of_the_column() -> None:
    years = PartitionLayout("RANGE", "year(`d`)", (("p23", "2024"), ("p24", "2025")))
    assert removed_rows(years, ("p24",), quote) == "(year(t.`d`) >= 2024 AND year(t.`d`) < 2025)"
    days = PartitionLayout("RANGE", "to_days(`d`)", (("p0", "739252"),))  # TO_DAYS('2024-01-01')
    value = "(datediff(t.`d`, DATE'1970-01-01') + 719528)"
    assert removed_rows(days, ("p0",), quote) == f"({value} < 739252 OR {value} IS NULL)"
    seconds = PartitionLayout("LIST", "UNIX_TIMESTAMP(`at`)", (("p0", "0,86400"),))
    assert removed_rows(seconds, ("p0",), quote) == "(unix_seconds(t.`at`) IN (0, 86400))"


@pytest.mark.parametrize(
    ("layout", "names", "reason"),
    [
        (PartitionLayout("RANGE", "month(`d`)", (("p", "6"),)), ("p",), "not RANGE or LIST of one column"),
        (PartitionLayout("RANGE", "`a` + `b`", (("p", "6"),)), ("p",), "not RANGE or LIST of one column"),
        (PartitionLayout("RANGE COLUMNS", "year(`d`)", (("p", "6"),)), ("p",), "not RANGE or LIST of one column"),
        (PartitionLayout("HASH", "`id`", (("p0", None),)), ("p0",), "not RANGE or LIST of one column"),
        (RANGE, ("gone",), "partition gone is not in the layout the job kept"),
    ],
)
def test_what_no_condition_can_hold_exactly_is_a_reason(
    layout: PartitionLayout, names: tuple[str], reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        removed_rows(layout, names, quote)


def test_the_kept_bounds_follow_drop_truncate_and_add_and_are_lost_on_anything_else() -> None:
    assert after_statement(RANGE, "ALTER TABLE t DROP PARTITION p23") == PartitionLayout(
        RANGE.method, RANGE.expression, RANGE.partitions[1:]
    )
    assert after_statement(RANGE, "ALTER TABLE t TRUNCATE PARTITION p24") == RANGE
    added = after_statement(
        LIST, "ALTER TABLE t ADD PARTITION (PARTITION d VALUES IN (6, 7), PARTITION e VALUES IN (8))"
    )
    assert added is not None and added.partitions[-2:] == (("d", "6, 7"), ("e", "8"))
    assert (
        after_statement(RANGE, "ALTER TABLE t REORGANIZE PARTITION pmax INTO (PARTITION x VALUES LESS THAN (1))")
        is None
    )
    assert after_statement(RANGE, "ALTER TABLE t ADD COLUMN x INT") == RANGE  # no partition clause
    assert after_statement(None, "ALTER TABLE t DROP PARTITION p23") is None
    assert PartitionLayout.from_json(RANGE.to_json()) == RANGE
