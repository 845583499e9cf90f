"""Manifest files read once by the driver (ingest.sink.manifests): bounded, and a table read through it sees every
commit, on a local SQLite catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ingest.sink import manifests
from ingest.sink.manifests import ManifestEntries, keep_manifest_entries
from tests.conftest import sqlite_catalog

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


def test_entries_are_kept_up_to_a_bound_the_least_recently_read_dropped_first() -> None:
    kept = ManifestEntries(max_entries=5)
    kept.put(("a", 1, 1, 0, True), [1, 2])
    kept.put(("b", 1, 1, 0, True), [3, 4])
    assert kept.get(("a", 1, 1, 0, True)) == [1, 2]  # now the most recent
    kept.put(("c", 1, 1, 0, True), [5, 6])  # 6 entries: the least recent goes
    assert kept.get(("b", 1, 1, 0, True)) is None
    assert kept.get(("a", 1, 1, 0, True)) == [1, 2] and kept.get(("c", 1, 1, 0, True)) == [5, 6]
    kept.put(("d", 1, 1, 0, True), list(range(6)))  # larger than the bound: read, not kept
    assert kept.get(("d", 1, 1, 0, True)) is None
    # What a manifest list adds on reading is part of the key: another sequence number is another read.
    assert kept.get(("a", 1, 2, 0, True)) is None
    assert (kept.reads, kept.hits) == (4, 3)


@pytest.fixture
def table(tmp_path: Path) -> Any:
    keep_manifest_entries()
    keep_manifest_entries()  # once only
    return sqlite_catalog(tmp_path).create_table("n.t", schema=SCHEMA)


def _rows(ids: range) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]}, schema=SCHEMA)


def _ids(table: Any) -> list[int]:
    return sorted(table.scan().to_arrow().column("id").to_pylist())


def test_a_table_read_again_reads_no_manifest_twice_and_sees_every_commit(table: Any) -> None:
    for start in (0, 10, 20):
        table.append(_rows(range(start, start + 10)))
    cache = manifests.CACHE
    assert _ids(table) == list(range(30))
    reads, hits = cache.reads, cache.hits
    assert _ids(table) == list(range(30))
    assert cache.reads == reads and cache.hits == hits + 3  # three manifests, none read from storage again
    table.delete("id < 5 or id >= 25")  # the delete's producer reads them too, and writes a manifest of its own
    assert _ids(table) == list(range(5, 25))
    table.append(_rows(range(100, 102)))
    assert _ids(table) == [*range(5, 25), 100, 101]
    first = table.snapshots()[0].snapshot_id
    assert sorted(table.scan(snapshot_id=first).to_arrow().column("id").to_pylist()) == list(range(10))
