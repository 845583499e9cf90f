"""The job's pyiceberg transaction: its table metadata computed once per staged step, on a local SQLite catalog."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ingest.sink.transaction import open_transaction

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])


@pytest.fixture
def table(tmp_path: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("n")
    table = catalog.create_table("n.t", schema=SCHEMA)
    for i in range(3):
        table.append(pa.table({"id": pa.array([i], pa.int64()), "v": [f"v{i}"]}, schema=SCHEMA))
    return table


def test_the_metadata_is_computed_once_per_step_and_is_what_pyiceberg_computes(
    table: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyiceberg.table as pyiceberg_table

    made = []
    update = pyiceberg_table.update_table_metadata

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return update(*args, **kwargs)

    monkeypatch.setattr(pyiceberg_table, "update_table_metadata", counted)
    ours = open_transaction(table)
    assert ours.table_metadata is ours.table_metadata and len(made) == 1  # read twice, made once
    rows = pa.table({"id": pa.array([1], pa.int64()), "v": ["new"]}, schema=SCHEMA)
    theirs = table.transaction()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for staged in (ours, theirs):
            staged.overwrite(rows, overwrite_filter="id = 1")
    made.clear()
    after = ours.table_metadata
    assert after is ours.table_metadata and len(made) == 1  # a new step: made again, once
    operations = [[s.summary.operation for s in m.snapshots] for m in (after, theirs.table_metadata)]
    assert operations[0] == operations[1] and len(operations[0]) == 5  # three appends, the delete, the append
    ours.commit_transaction()
    assert sorted(table.scan().to_arrow().column("v").to_pylist()) == ["new", "v0", "v2"]
    assert ours.table_metadata is not after  # the table moved to its new metadata
