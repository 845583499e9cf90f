"""Several Iceberg tables committed in one step (ingest/sink/atomic.py), on each catalog the project runs: the
embedded JDBC catalog on SQLite, the JDBC catalog on PostgreSQL (the S3 profile) and the REST catalog server.

No Spark here: the changes are staged with pyiceberg, as the job stages its small targets and its offset; a Spark
write reaches the same commit as a stage-branch head (`publish_stage`), staged the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pydantic import TypeAdapter
from pyiceberg.exceptions import CommitFailedException

from ingest.config import SinkConfig
from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import PostgresServer
from ingest.devservers.rest_catalog import RestCatalogServer
from ingest.faults import InjectedFailure, reset
from ingest.sink.atomic import can_commit_together, commit_together, publish_stage, staged, start_stage
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.targets import STAGE_BRANCH
from tests.conftest import embedded_sink, minio_sink, rest_sink

pytestmark = pytest.mark.integration

ROWS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])


@pytest.fixture(params=["embedded", "postgres", "rest"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "embedded":
        sink = embedded_sink(tmp_path)
    elif request.param == "postgres":
        minio: MinioServer = request.getfixturevalue("minio")
        postgres: PostgresServer = request.getfixturevalue("postgres")
        sink = minio_sink(minio, postgres, minio.bucket(f"atomic-{uuid.uuid4().hex[:8]}"))
    else:
        rest: RestCatalogServer = request.getfixturevalue("rest_catalog")
        sink = rest_sink(request.getfixturevalue("minio"), rest)
    catalog = load_pyiceberg_catalog(TypeAdapter(SinkConfig).validate_python(sink, context={"base_dir": tmp_path}))
    catalog.create_namespace_if_not_exists("atomic")
    yield catalog


def _table(catalog: Any, rows: int) -> Any:
    """A new table holding `rows` rows (one snapshot), under a name of its own."""
    table = catalog.create_table(("atomic", f"t_{uuid.uuid4().hex[:10]}"), schema=ROWS)
    table.append(_rows(range(rows)))
    return table


def _rows(ids: range) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "v": f"v{i}"} for i in ids], schema=ROWS)


def _appended(table: Any, ids: range) -> Any:
    transaction = table.transaction()
    transaction.append(_rows(ids))
    return staged(table, transaction)


def _count(catalog: Any, table: Any) -> int:
    return int(catalog.load_table(table.name()).scan().to_arrow().num_rows)


def test_every_table_lands_in_one_commit(catalog: Any) -> None:
    assert can_commit_together(catalog)
    a, b = _table(catalog, 3), _table(catalog, 5)
    commit_together(catalog, [_appended(a, range(10, 12)), _appended(b, range(10, 13))])
    assert (_count(catalog, a), _count(catalog, b)) == (5, 8)
    # Each table object is at its new metadata: a change staged on it now commits without a conflict.
    commit_together(catalog, [_appended(a, range(20, 21)), _appended(b, range(20, 21))])
    assert (_count(catalog, a), _count(catalog, b)) == (6, 9)


def test_a_table_moved_by_another_writer_fails_the_commit_of_every_table(catalog: Any) -> None:
    a, b = _table(catalog, 3), _table(catalog, 5)
    changes = [_appended(a, range(10, 12)), _appended(b, range(10, 13))]
    catalog.load_table(b.name()).append(_rows(range(100, 101)))  # another writer, after the batch was staged
    with pytest.raises(CommitFailedException):
        commit_together(catalog, changes)
    assert (_count(catalog, a), _count(catalog, b)) == (3, 6)
    assert len(catalog.load_table(a.name()).snapshots()) == 1


def test_a_commit_cut_off_before_its_swap_leaves_every_table_as_it_was(
    catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _table(catalog, 3), _table(catalog, 5)
    monkeypatch.setenv("INGEST_FAIL_AT", "atomic.before_swap")
    reset()
    with pytest.raises(InjectedFailure):
        commit_together(catalog, [_appended(a, range(10, 12)), _appended(b, range(10, 13))])
    assert (_count(catalog, a), _count(catalog, b)) == (3, 5)


def test_a_stage_branch_is_published_with_the_other_tables(catalog: Any) -> None:
    """What the job does with a Spark write: the branch pointed at main, written, then main moved to its head in the
    one commit of the batch."""
    a, b = _table(catalog, 3), _table(catalog, 5)
    names = a.name()
    base = start_stage(catalog, names)
    assert base == a.current_snapshot().snapshot_id
    on_branch = catalog.load_table(names)
    on_branch.append(_rows(range(10, 14)), branch=STAGE_BRANCH)  # the stand-in for Spark's write to the branch
    assert _count(catalog, a) == 3  # readers of main do not see the branch
    published = publish_stage(catalog, names, base)
    assert published is not None
    change, head = published
    commit_together(catalog, [change, _appended(b, range(10, 11))])
    assert (_count(catalog, a), _count(catalog, b)) == (7, 6)
    assert catalog.load_table(names).current_snapshot().snapshot_id == head
    # Between batches the branch is where main is: the next batch starts it without a commit.
    snapshots = len(catalog.load_table(names).metadata.snapshot_log)
    assert start_stage(catalog, names) == head
    assert len(catalog.load_table(names).metadata.snapshot_log) == snapshots


def test_a_stage_branch_over_a_main_that_moved_is_not_published(catalog: Any) -> None:
    a = _table(catalog, 3)
    names = a.name()
    base = start_stage(catalog, names)
    catalog.load_table(names).append(_rows(range(10, 11)), branch=STAGE_BRANCH)
    catalog.load_table(names).append(_rows(range(100, 101)))  # another writer's commit to main
    with pytest.raises(CommitFailedException):
        publish_stage(catalog, names, base)
    # The next batch starts the branch again where main is now.
    assert start_stage(catalog, names) == catalog.load_table(names).current_snapshot().snapshot_id


def test_a_table_without_a_snapshot_gets_its_branch_from_an_empty_one(catalog: Any) -> None:
    a = catalog.create_table(("atomic", f"t_{uuid.uuid4().hex[:10]}"), schema=ROWS)
    base = start_stage(catalog, a.name())
    assert _count(catalog, a) == 0
    catalog.load_table(a.name()).append(_rows(range(2)), branch=STAGE_BRANCH)
    published = publish_stage(catalog, a.name(), base)
    assert published is not None
    commit_together(catalog, [published[0]])
    assert _count(catalog, a) == 2
