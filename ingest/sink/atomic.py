"""Many Iceberg tables committed at once: every table's staged change lands, or none does (issue 52).

A change is staged as pyiceberg stages a one-table commit: the table it was made on, the requirements the table's
metadata must still meet (its branch heads as they were) and the updates (a new snapshot, a branch moved). Where the
catalog can, `commit_together` lands them all in one step:

- a JDBC catalog (pyiceberg's SQL catalog on SQLite or PostgreSQL, the table Iceberg's Java `JdbcCatalog` shares):
  every table's new metadata file is written first, then every table's pointer is swapped in one database
  transaction, each UPDATE conditional on the pointer the change was staged from (a one-table commit's
  compare-and-set). One pointer moved by another writer rolls back all of them.
- a REST catalog that lists `POST /v1/{prefix}/transactions/commit` among its endpoints: the changes go in that one
  request, which the server applies all or none (what it promises; Iceberg's own test server checks every
  requirement first, then commits the tables one by one).

Other catalogs (Glue, Hive, Hadoop, a REST server without the endpoint) cannot: `can_commit_together` is False and
the caller commits table by table. Nothing of a failed `commit_together` is visible: a metadata file written before
the swap failed is an orphan no table points at.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ingest.faults import crash_point
from ingest.sink.targets import STAGE_BRANCH

log = logging.getLogger(__name__)

TRANSACTIONS_COMMIT = "POST /v1/{prefix}/transactions/commit"
WRITERS = 8
"""Metadata files written at once before a JDBC catalog's swap."""


@dataclass(frozen=True)
class Staged:
    """One table's change, not committed: `table` is the pyiceberg table it was made on."""

    table: Any
    requirements: tuple[Any, ...]
    updates: tuple[Any, ...]


def staged(table: Any, transaction: Any) -> Staged:
    """What a pyiceberg transaction on `table` would commit (its staged requirements and updates)."""
    return Staged(table, tuple(transaction._requirements), tuple(transaction._updates))


def can_commit_together(catalog: Any) -> bool:
    """The catalog lands several tables' changes in one step (see the module)."""
    from pyiceberg.catalog.sql import SqlCatalog

    if isinstance(catalog, SqlCatalog):
        return bool(catalog.engine.dialect.supports_sane_rowcount)
    # A RestCatalog exists only once its module is imported (which takes a third of a second: not for the others).
    rest = sys.modules.get("pyiceberg.catalog.rest")
    if rest is not None and isinstance(catalog, rest.RestCatalog):
        return rest.Endpoint.from_string(TRANSACTIONS_COMMIT) in catalog._supported_endpoints
    return False


def commit_together(catalog: Any, changes: Sequence[Staged]) -> None:
    """Land every change, or none: `CommitFailedException` when a table's requirements no longer hold (another
    writer moved it; stage again from fresh metadata). Each table object is brought up to its new metadata."""
    from pyiceberg.catalog.sql import SqlCatalog

    changes = [c for c in changes if c.updates]
    if not changes:
        return
    if isinstance(catalog, SqlCatalog):
        _commit_sql(catalog, changes)
    else:
        _commit_rest(catalog, changes)


def _commit_sql(catalog: Any, changes: Sequence[Staged]) -> None:
    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.sql import IcebergTables
    from pyiceberg.exceptions import CommitFailedException
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    def write(change: Staged) -> tuple[Any, Any]:
        # On the metadata the change was staged from, not loaded again: if the catalog moved on since, the swap's
        # condition on that metadata's location refuses the commit.
        table = change.table
        new = catalog._update_and_stage_table(table, table.name(), change.requirements, change.updates)
        catalog._write_metadata(metadata=new.metadata, io=new.io, metadata_path=new.metadata_location)
        return table, new

    with ThreadPoolExecutor(max_workers=min(len(changes), WRITERS), thread_name_prefix="metadata") as pool:
        swaps = list(pool.map(write, changes))  # an object store's latency, not CPU, bounds each
    crash_point("atomic.before_swap")
    with Session(catalog.engine) as session:
        for table, new in swaps:
            identifier = table.name()
            namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
            name = Catalog.table_name_from(identifier)
            done: Any = session.execute(
                update(IcebergTables)
                .where(
                    IcebergTables.catalog_name == catalog.name,
                    IcebergTables.table_namespace == namespace,
                    IcebergTables.table_name == name,
                    IcebergTables.metadata_location == table.metadata_location,
                )
                .values(metadata_location=new.metadata_location, previous_metadata_location=table.metadata_location)
            )
            if done.rowcount < 1:
                session.rollback()
                raise CommitFailedException(f"{namespace}.{name} was committed by another writer meanwhile")
        session.commit()
    crash_point("atomic.after_swap")
    for table, new in swaps:
        _now_at(catalog, table, table.metadata, new.metadata, new.metadata_location)


def _commit_rest(catalog: Any, changes: Sequence[Staged]) -> None:
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
    from pyiceberg.table import CommitTableRequest, TableIdentifier

    requests = []
    for change in changes:
        identifier = change.table.name()
        request = CommitTableRequest(
            identifier=TableIdentifier(namespace=identifier[:-1], name=identifier[-1]),
            requirements=change.requirements,
            updates=change.updates,
        )
        requests.append(json.loads(request.model_dump_json()))
    crash_point("atomic.before_swap")
    response = catalog._session.post(
        catalog.url("transactions/commit", prefixed=True),
        data=json.dumps({"table-changes": requests}).encode(),
        headers=catalog._session.headers,
    )
    if response.status_code == 409:
        raise CommitFailedException(f"the catalog refused the batch's commit: {response.text[:500]}")
    if response.status_code in (500, 502, 503, 504):
        # Whether it landed is unknown: the batch is committed again after a look at what the tables hold.
        raise CommitStateUnknownException(f"HTTP status {response.status_code} {response.text[:500]}")
    response.raise_for_status()
    crash_point("atomic.after_swap")
    for change in changes:
        old = change.table.metadata
        change.table.refresh()
        _now_at(catalog, change.table, old, change.table.metadata, change.table.metadata_location)


def _now_at(catalog: Any, table: Any, old: Any, metadata: Any, location: str) -> None:
    """`table` brought to its committed metadata; the metadata files its table properties no longer keep deleted,
    as after a one-table commit (best effort: an orphan left behind is harmless)."""
    table.metadata, table.metadata_location = metadata, location
    try:
        catalog._delete_old_metadata(table.io, old, metadata)
    except Exception as e:  # noqa: BLE001
        log.debug("%s: old metadata not deleted: %s", ".".join(table.name()), e)


def start_stage(catalog: Any, names: tuple[str, str]) -> int:
    """Point the table's stage branch where main is (a metadata commit, only when it is not there already: after
    another writer's commit, or a batch whose commit did not land) and return main's head, the base the branch's
    write is published over. A table without a snapshot first gets an empty one on main (pyiceberg writes no branch
    of such a table), which readers see as the empty table it was."""
    table = catalog.load_table(names)
    main = table.current_snapshot()
    if main is None:
        with table.transaction() as transaction:
            transaction.update_snapshot().fast_append().commit()
        main = table.current_snapshot()
    stage = table.metadata.refs.get(STAGE_BRANCH)
    if stage is None or stage.snapshot_id != main.snapshot_id:
        table.manage_snapshots().create_branch(main.snapshot_id, STAGE_BRANCH).commit()
    return int(main.snapshot_id)


def publish_stage(catalog: Any, names: tuple[str, str], base: int) -> tuple[Staged, int] | None:
    """The change that moves the table's main to its stage branch's head, and that head; None when the branch holds
    nothing new. `CommitFailedException` when main left `base` meanwhile (another writer): the branch's write would
    hide that commit, so the batch is staged again."""
    from pyiceberg.exceptions import CommitFailedException

    table = catalog.load_table(names)
    main = table.current_snapshot()
    if main is None or main.snapshot_id != base:
        raise CommitFailedException(f"{'.'.join(names)}: main moved while a batch was written to its stage branch")
    head = table.metadata.refs[STAGE_BRANCH].snapshot_id
    if head == base:
        return None
    updates, requirements = table.transaction()._set_ref_snapshot(snapshot_id=head, ref_name="main", type="branch")
    return Staged(table, tuple(requirements), tuple(updates)), int(head)
