"""Discovery: check that the source can be captured, and load the schema of every table the pipeline selects."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ingest.config import PipelineConfig
from ingest.errors import ConfigError
from ingest.model.schema import TableSchema
from ingest.sink.targets import partition_clause
from ingest.source.mysql import (
    check_binlog_settings,
    check_privileges,
    connect,
    list_tables,
    load_schema,
    server_flavor,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceInfo:
    flavor: str
    schemas: tuple[TableSchema, ...]


def discover(config: PipelineConfig) -> SourceInfo:
    """Check the source can be captured and load the schema of every selected table."""
    log.debug("pipeline %s: %r", config.name, config)  # secrets print as Secret(..., ***)
    with connect(config.source) as conn:
        flavor = config.source.flavor if config.source.flavor != "auto" else server_flavor(conn)
        check_binlog_settings(conn)
        check_privileges(conn, flavor)
        tables = list_tables(conn, config.tables)
        if not tables:
            raise ConfigError(
                "`tables.include` matched no table the CDC user can see "
                f"(patterns: {[p.pattern for p in config.tables.include]}); patterns match `database.table`"
            )
        schemas = tuple(load_schema(conn, db, t, config.options_for(db, t)) for db, t in tables)
    _check_target_names(config, tables)
    for schema in schemas:  # a partition spec naming no column of its table is refused before anything is written
        partition_clause(schema, config.options_for(schema.database, schema.table).partition_by)
    return SourceInfo(flavor, schemas)


def _check_target_names(config: PipelineConfig, tables: Sequence[tuple[str, str]]) -> None:
    """Two source tables must never write one Iceberg table (a target, or a changelog table)."""
    owner: dict[tuple[str, str], str] = {}
    for db, t in tables:
        names = [config.target_for(db, t), config.changelog_for(db, t)]
        for name in (n for n in names if n is not None):
            other = owner.setdefault(name, f"{db}.{t}")
            if other != f"{db}.{t}":
                raise ConfigError(
                    f"`{other}` and `{db}.{t}` would both write the Iceberg table {'.'.join(name)}; give one of "
                    "them another `table_options.<table>.target`, or change `sink.table_name`"
                )
