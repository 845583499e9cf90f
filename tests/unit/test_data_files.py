"""Data files written from Arrow by a pickled writer, and appended in one commit: on a local SQLite catalog."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ingest.sink.data_files import DataFileWriter, append_files, writable_from_arrow

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


@pytest.fixture
def catalog(tmp_path: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("n")
    return catalog


def _rows(ids: range) -> pa.Table:
    # The columns in another order than the target's, and plain strings where the target reads large ones.
    return pa.table({"name": [f"n{i}" for i in ids], "id": pa.array(ids, pa.int64())})


def test_a_pickled_writer_holds_no_pyiceberg_object_and_its_files_hold_every_row_in_one_append(catalog: Any) -> None:
    table = catalog.create_table("n.t", schema=SCHEMA)
    writer = pickle.loads(pickle.dumps(DataFileWriter(table)))
    assert {type(v) for v in vars(writer).values()} <= {str, dict, type(None)}  # planners unpickle it cheaply

    files = writer.write([_rows(range(0, 5)), _rows(range(5, 12))], rows_per_batch=4)
    assert sum(f.record_count for f in files) == 12
    assert len(files) == 1  # the tables of one partition go to one file (up to the target file size)
    assert table.scan().to_arrow().num_rows == 0  # written, not committed

    append_files(table, files, {"ingest.test": "batch-1"}, "main")
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(12))
    assert len(table.snapshots()) == 1
    assert table.current_snapshot().summary.additional_properties["ingest.test"] == "batch-1"


def test_an_append_another_writer_beat_is_made_again_on_fresh_metadata(catalog: Any) -> None:
    table = catalog.create_table("n.t", schema=SCHEMA)
    stale = catalog.load_table("n.t")
    table.append(_rows(range(0, 3)).select(["id", "name"]).cast(table.schema().as_arrow()))  # the other writer
    files = DataFileWriter(stale).write([_rows(range(3, 6))], rows_per_batch=100)
    append_files(stale, files, {}, "main")  # `stale` does not know the other commit yet
    assert sorted(catalog.load_table("n.t").scan().to_arrow().column("id").to_pylist()) == list(range(6))


def test_a_null_in_a_required_column_fails_the_write(catalog: Any) -> None:
    table = catalog.create_table("n.t", schema=SCHEMA)
    rows = pa.table({"id": pa.array([1, None], pa.int64()), "name": ["a", "b"]})
    with pytest.raises(ValueError, match="'id' with null values"):
        DataFileWriter(table).write([rows], rows_per_batch=100)


def test_partitioned_and_non_parquet_targets_are_not_written_from_arrow(catalog: Any) -> None:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import LongType, NestedField, StringType

    assert writable_from_arrow(catalog.create_table("n.plain", schema=SCHEMA))
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()))
    spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="id"))
    assert not writable_from_arrow(catalog.create_table("n.parted", schema=schema, partition_spec=spec))
    assert not writable_from_arrow(
        catalog.create_table("n.orc", schema=SCHEMA, properties={"write.format.default": "orc"})
    )
    # pyiceberg creates no format 3 table: tests/integration/test_trino.py snapshots into one, made by Spark.
