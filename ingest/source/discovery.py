"""Discovery: check that the source can be captured, and load the schema of every table the pipeline selects."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from ingest.config import SourceConfig, TableOptions, TableSelection, options_for
from ingest.errors import ConfigError
from ingest.model.schema import TableSchema
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


def discover(source: SourceConfig, selection: TableSelection, table_options: Mapping[str, TableOptions]) -> SourceInfo:
    """Check the source can be captured and load the schema of every selected table."""
    with connect(source) as conn:
        flavor = source.flavor if source.flavor != "auto" else server_flavor(conn)
        check_binlog_settings(conn)
        check_privileges(conn, flavor)
        tables = list_tables(conn, selection)
        if not tables:
            raise ConfigError(
                "`tables.include` matched no table the CDC user can see "
                f"(patterns: {[p.pattern for p in selection.include]}); patterns match `database.table`"
            )
        schemas = tuple(load_schema(conn, db, t, options_for(table_options, db, t)) for db, t in tables)
    return SourceInfo(flavor, schemas)
