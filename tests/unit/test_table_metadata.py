"""Table metadata read once by the driver and shared, not deep-copied (ingest.sink.table_metadata): bounded, the
newest of each table kept, and a table loaded through it sees every commit, on a local SQLite catalog."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ingest.sink import table_metadata
from ingest.sink.table_metadata import MetadataFiles, keep_table_metadata
from tests.conftest import sqlite_catalog

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])


def test_the_newest_metadata_of_each_table_is_kept_up_to_a_bound() -> None:
    kept = MetadataFiles(max_tables=2)
    kept.put("s3://w/a/metadata/00001-x.metadata.json", "a1", read=True)
    kept.put("s3://w/a/metadata/00002-y.metadata.json", "a2", read=False)  # the same table's newer one replaces it
    assert kept.get("s3://w/a/metadata/00001-x.metadata.json") is None
    assert kept.get("s3://w/a/metadata/00002-y.metadata.json") == "a2"
    kept.put("s3://w/b/metadata/00001-z.metadata.json", "b1", read=True)
    kept.put("s3://w/c/metadata/00001-z.metadata.json", "c1", read=True)  # three tables: the least recent goes
    assert kept.get("s3://w/a/metadata/00002-y.metadata.json") is None
    assert kept.get("s3://w/b/metadata/00001-z.metadata.json") == "b1"
    assert (kept.reads, kept.hits) == (3, 2)


@pytest.fixture
def catalog(tmp_path: Path) -> Any:
    keep_table_metadata()
    keep_table_metadata()  # once only
    catalog = sqlite_catalog(tmp_path)
    catalog.create_table("n.t", schema=SCHEMA)
    return catalog


def _ids(table: Any) -> list[int]:
    return sorted(table.scan().to_arrow().column("id").to_pylist())


def test_a_table_loaded_again_reads_no_metadata_file_and_sees_every_commit(catalog: Any) -> None:
    cache = table_metadata.CACHE
    table = catalog.load_table("n.t")
    table.append(pa.table({"id": [1, 2]}, schema=SCHEMA))
    reads = cache.reads
    again = catalog.load_table("n.t")  # the metadata this process wrote: not read from storage
    assert cache.reads == reads and again.metadata is table.metadata and _ids(again) == [1, 2]

    # Another writer's commit (a catalog object of its own) is a new location: read, and seen.
    other = type(catalog)("t", uri=catalog.properties["uri"], warehouse=catalog.properties["warehouse"])
    other.load_table("n.t").append(pa.table({"id": [3]}, schema=SCHEMA))
    table_metadata.CACHE = MetadataFiles(table_metadata.MAX_TABLES)  # as if another process had written it
    try:
        assert _ids(catalog.load_table("n.t")) == [1, 2, 3] and table_metadata.CACHE.reads == 1
        assert _ids(catalog.load_table("n.t")) == [1, 2, 3] and table_metadata.CACHE.reads == 1
    finally:
        table_metadata.CACHE = cache


def test_metadata_is_shared_not_copied_and_a_commit_leaves_the_old_one_as_it_was(catalog: Any) -> None:
    table = catalog.load_table("n.t")
    table.append(pa.table({"id": [1]}, schema=SCHEMA))
    before = table.metadata
    snapshots, refs, log = list(before.snapshots), dict(before.refs), list(before.snapshot_log)
    assert copy.deepcopy(before) is before
    with table.transaction() as transaction:
        transaction.append(pa.table({"id": [2]}, schema=SCHEMA))
        transaction.set_properties({"k": "v"})
    assert table.metadata is not before and len(table.metadata.snapshots) == len(snapshots) + 1
    assert (before.snapshots, before.refs, before.snapshot_log) == (snapshots, refs, log)
    assert "k" not in before.properties and table.metadata.properties["k"] == "v"
