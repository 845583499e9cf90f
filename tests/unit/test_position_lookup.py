"""Unit tests of the key lookup in ingest/sink/position_deletes.py, on Parquet files in memory: the positions of a
batch's keys in a data file, by field id, across row groups pruned by their statistics, for one-column and
two-column keys, and a file written under an older name and a narrower type."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingest.sink.position_deletes import UnpositionedFile, _group_may_hold, _positions_in, _sorted_values


def _file(columns: dict[str, tuple[int, pa.Array]], row_group_size: int = 10) -> pq.ParquetFile:
    """A Parquet file of `columns` (name: (field id, values)) in row groups of `row_group_size` rows."""
    fields = [
        pa.field(name, values.type, metadata={b"PARQUET:field_id": str(field_id).encode()})
        for name, (field_id, values) in columns.items()
    ]
    table = pa.Table.from_arrays([values for _, values in columns.values()], schema=pa.schema(fields))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return pq.ParquetFile(pa.BufferReader(sink.getvalue()))


def _positions(parquet: pq.ParquetFile, ids: list[int], keys: pa.Table) -> list[int]:
    return _positions_in(parquet, "f.parquet", ids, keys, _sorted_values(keys.column(0))).to_pylist()


def test_the_positions_of_one_column_keys_across_row_groups() -> None:
    parquet = _file({"id": (1, pa.array(range(0, 200, 2), pa.int64())), "v": (2, pa.array(["x"] * 100))})
    keys = pa.table({"id": pa.array([198, 0, 4, 5, 57, 120], pa.int64())})  # 5 and 57 are not held
    assert _positions(parquet, [1], keys) == [0, 2, 60, 99]


def test_a_file_under_an_older_name_and_a_narrower_type_is_read_by_field_id() -> None:
    # Written when the key was `old_id` INT; the table now calls it `id`, a BIGINT.
    parquet = _file({"v": (2, pa.array(range(50), pa.int32())), "old_id": (1, pa.array(range(100, 150), pa.int32()))})
    keys = pa.table({"id": pa.array([100, 149, 2], pa.int64())})
    assert _positions(parquet, [1], keys) == [0, 49]


def test_two_column_keys_match_on_both_columns() -> None:
    parquet = _file(
        {
            "a": (1, pa.array([f"k{i % 10}" for i in range(40)])),
            "b": (2, pa.array([i // 10 for i in range(40)], pa.int32())),
        }
    )
    keys = pa.table({"a": ["k3", "k3", "k9", "k1"], "b": pa.array([0, 2, 3, 9], pa.int32())})
    assert _positions(parquet, [1, 2], keys) == [3, 23, 39]  # (k1, 9) is not held


def test_a_file_without_field_ids_is_refused_by_name() -> None:
    table = pa.table({"id": pa.array([1, 2], pa.int64())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    parquet = pq.ParquetFile(pa.BufferReader(sink.getvalue()))
    with pytest.raises(UnpositionedFile, match="f.parquet has no column with field id 1"):
        _positions(parquet, [1], table)


class _Stats:
    def __init__(self, low: Any, high: Any) -> None:
        self.has_min_max, self.min, self.max = True, low, high


@pytest.mark.parametrize(
    ("low", "high", "held"),
    [
        (10, 20, True),  # 15 is in it
        (16, 24, False),  # between 15 and 25
        (25, 25, True),
        (26, 99, False),  # above every key
        (0, 4, False),  # below every key
        ("a", "b", True),  # statistics of another type: not pruned
    ],
)
def test_a_row_group_is_read_only_when_its_key_range_may_hold_a_key(low: Any, high: Any, held: bool) -> None:
    assert _group_may_hold(_Stats(low, high), [5, 15, 25]) is held
