"""`ingest resnapshot`: forget what the job holds of some tables, so that the next `ingest run` copies them
again while the other tables keep streaming.

The way out where the binlog cannot be followed: a schema change during a table's snapshot, a DDL Iceberg
cannot follow, a target dropped or damaged by hand, a purged binlog. Per table, the copy starts over: into a
branch of the target when the source schema still fits it (readers keep the old rows until the new copy is
complete, see sink/recopy.py), else by dropping the target with its files; the changelog table is dropped
either way. Then the table's plan and chunk records are deleted from the state table. In that order: a run
that finds chunk records the branch lacks, or no target, does not trust them (the first it forgets, the
second it names), and a crash in between is mended by running the command again. The job-wide binlog offset
is kept while other tables stream (the binlog phase resumes where it was and drops each change the new chunks
already hold), and deleted with the last table: then the next run starts over from a new snapshot of every
table.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pyiceberg.exceptions import NoSuchTableError

from ingest.config import PipelineConfig
from ingest.errors import ConfigError, IngestError
from ingest.faults import crash_point
from ingest.model.schema import TableSchema
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.sink.recopy import start_branch_copy
from ingest.source.mysql import connect, load_schema
from ingest.state.table import StateTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartedOver:
    """What `ingest resnapshot` did to the Iceberg tables."""

    branched: tuple[str, ...]
    """Targets whose copy starts over in their branch: readers keep the old rows until it is complete."""
    dropped: tuple[str, ...]
    """Targets (whose schema no longer fits) and changelog tables dropped with their files."""


def resnapshot(config: PipelineConfig, tables: Sequence[str]) -> StartedOver:
    """Start the copies of `tables` ('db.table') over and forget their state."""
    if not tables:
        raise ConfigError("name at least one table to snapshot again: --table DB.TABLE")
    state = StateTable.open(config.sink, config.name)
    known = state.tables()
    unknown = [t for t in tables if t not in known]
    if unknown:
        raise ConfigError(
            f"{', '.join(unknown)}: not a table of pipeline {config.name!r} (its tables: {', '.join(known) or 'none'})"
        )
    catalog = load_pyiceberg_catalog(config.sink)
    branched, dropped = [], []
    live = _live_schemas(config, tables)
    for table_id in tables:
        db, table = table_id.split(".", 1)
        target = config.target_for(db, table)
        names = []
        schema = live[table_id]
        if schema is not None and start_branch_copy(catalog, target, schema, config.name):
            branched.append(".".join(target))
        else:
            names.append(target)
        changelog = config.changelog_for(db, table)
        if changelog is not None:
            names.append(changelog)
        for namespace, name in names:
            try:
                catalog.purge_table((namespace, name))
            except NoSuchTableError:
                continue  # dropped by an earlier attempt that stopped before the state was deleted
            dropped.append(f"{namespace}.{name}")
            log.info("%s: dropped %s.%s and its files", table_id, namespace, name)
        crash_point("resnapshot.before_forget")  # the next run forgets chunks its branch lacks (snapshot.py)
        state.forget(table_id)
        log.info("%s: its chunks are forgotten; the next `ingest run` snapshots it again", table_id)
    if not state.tables():
        # Every table starts over: the old offset describes none of them, and its binlog may be gone (purged,
        # or on a server the job no longer reads).
        state.forget_offset()
    return StartedOver(tuple(branched), tuple(dropped))


def _live_schemas(config: PipelineConfig, tables: Sequence[str]) -> dict[str, TableSchema | None]:
    """Each table's schema on the source now; None for one the job cannot capture as it is (gone, no key...):
    its target is dropped, and the next run names what is wrong."""
    found: dict[str, TableSchema | None] = {}
    with connect(config.source) as conn:
        for table_id in tables:
            db, table = table_id.split(".", 1)
            try:
                found[table_id] = load_schema(conn, db, table, config.options_for(db, table))
            except IngestError as e:
                log.warning("%s: %s; its target is dropped", table_id, e)
                found[table_id] = None
    return found
