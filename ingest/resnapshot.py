"""`ingest resnapshot`: forget what the job holds of some tables, so that the next `ingest run` copies them
again while the other tables keep streaming.

The way out where the binlog cannot be followed: a schema change during a table's snapshot, a DDL Iceberg
cannot follow, a target dropped or damaged by hand. Per table, the target and its changelog table are
dropped with their files, then the table's plan and chunk records are deleted from the state table. In
that order: a run that finds chunk records but no target says so instead of trusting them, and a crash in
between is mended by running the command again. The job-wide binlog offset is kept while other tables
stream (the binlog phase resumes where it was and drops each change the new chunks already hold), and
deleted with the last table: then the next run starts over from a new snapshot of every table.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pyiceberg.exceptions import NoSuchTableError

from ingest.config import PipelineConfig
from ingest.errors import ConfigError
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.state.table import StateTable

log = logging.getLogger(__name__)


def resnapshot(config: PipelineConfig, tables: Sequence[str]) -> list[str]:
    """Drop the targets (and changelog tables) of `tables` ('db.table') and their state; return what was dropped."""
    if not tables:
        raise ConfigError("name at least one table to snapshot again: --table DB.TABLE")
    state = StateTable.open(config)
    known = state.tables()
    unknown = [t for t in tables if t not in known]
    if unknown:
        raise ConfigError(
            f"{', '.join(unknown)}: not a table of pipeline {config.name!r} (its tables: {', '.join(known) or 'none'})"
        )
    catalog = load_pyiceberg_catalog(config.sink)
    dropped = []
    for table_id in tables:
        db, table = table_id.split(".", 1)
        names = [config.target_for(db, table)]
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
        state.forget(table_id)
        log.info("%s: its chunks are forgotten; the next `ingest run` snapshots it again", table_id)
    if not state.tables():
        # Every table starts over: the old offset describes none of them, and its binlog may be gone (purged,
        # or on a server the job no longer reads).
        state.forget_offset()
    return dropped
