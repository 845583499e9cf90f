"""The schema a captured table has right after a DDL statement in the binlog: read from the server, or derived
from the statements when later ones changed the table again (ingest.source.binlog.schema_history)."""

from __future__ import annotations

import logging
from typing import Any

from ingest.config import SourceConfig, TableOptions
from ingest.errors import SchemaChangeError, UnsupportedTableError
from ingest.model.changes import DdlStatement
from ingest.model.schema import TableSchema
from ingest.source.binlog.reader import ddl_between
from ingest.source.binlog.schema_history import after_first
from ingest.source.mysql import load_schema
from ingest.source.watermark import read_watermark

log = logging.getLogger(__name__)


def schema_after(
    source: SourceConfig, options: TableOptions, conn: Any, flavor: str, old: TableSchema, ddl: DdlStatement
) -> TableSchema:
    """The table's schema right after `ddl` (`options`: its `table_options` entry): the live one when no later DDL
    on the table is in the binlog, else derived from the statements and checked against the live one
    (ingest.source.binlog.schema_history); a TRUNCATE keeps the schema it had."""
    if ddl.kind in ("truncate", "partition"):
        return old  # rows go, the columns stay
    try:
        live = load_schema(conn, old.database, old.table, options)
    except UnsupportedTableError as e:
        raise SchemaChangeError(f"{old.table_id} after the DDL at {ddl.end} ({ddl.query[:200]!r}): {e}") from None
    # The binlog end is read after the live schema, so a DDL already visible in information_schema is in the range.
    goal = read_watermark(conn, flavor).position
    later = ddl_between(source, [(old.database, old.table)], ddl.end, goal)
    if not later:
        return live
    found = after_first(old, [ddl.query, *(query for _, query, _ in later)], live)
    if isinstance(found, str):
        position, query, _ = later[0]
        raise SchemaChangeError(
            f"{old.table_id}: the DDL at {ddl.end} ({ddl.query[:200]!r}) cannot be followed because the table "
            f"was altered again later, at {position} ({query[:200]!r}), and the schema in between cannot be "
            f"told exactly from the statements and the server's newest schema: {found}. Everything before the "
            "first DDL is committed. Snapshot the table again (`ingest resnapshot --config ... --table "
            f"{old.table_id}`), or set `stream.on_unfollowable: recopy`"
        )
    log.info(
        "%s: the schema right after the DDL at %s is derived from it and %d later statement(s) on the table",
        old.table_id,
        ddl.end,
        len(later),
    )
    return found
