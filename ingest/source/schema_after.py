"""The schema a captured table has right after a DDL statement in the binlog, read from the server."""

from __future__ import annotations

from typing import Any

from ingest.config import PipelineConfig
from ingest.errors import SchemaChangeError, UnsupportedTableError
from ingest.model.changes import DdlStatement
from ingest.model.schema import TableSchema
from ingest.source.binlog import first_ddl_between
from ingest.source.mysql import load_schema
from ingest.source.watermark import read_watermark


def schema_after(config: PipelineConfig, conn: Any, flavor: str, old: TableSchema, ddl: DdlStatement) -> TableSchema:
    """The table's schema right after `ddl`: the live one, when no later DDL on the table is in the binlog (a
    TRUNCATE keeps the schema it had)."""
    if ddl.kind == "truncate":
        return old
    try:
        live = load_schema(conn, old.database, old.table, config.options_for(old.database, old.table))
    except UnsupportedTableError as e:
        raise SchemaChangeError(f"{old.table_id} after the DDL at {ddl.end} ({ddl.query[:200]!r}): {e}") from None
    _refuse_if_altered_again(config, conn, flavor, old, ddl)
    return live


def _refuse_if_altered_again(
    config: PipelineConfig, conn: Any, flavor: str, old: TableSchema, ddl: DdlStatement
) -> None:
    """The live schema is the schema right after `ddl` only if no later DDL on the table is in the binlog.

    information_schema shows only the newest schema. When the job is behind and the table was altered again
    later, the live schema describes that later statement, and the rows in between would be decoded or
    backfilled with the wrong columns or defaults. DDLs are therefore followed one at a time, and this case
    stops the job with the way out. The binlog end is read after the live schema, so a DDL already visible
    in information_schema is in the scanned range.
    """
    goal = read_watermark(conn, flavor).position
    found = first_ddl_between(config.source, [(old.database, old.table)], ddl.end, goal)
    if found is not None:
        position, query, _ = found
        raise SchemaChangeError(
            f"{old.table_id}: the DDL at {ddl.end} ({ddl.query[:200]!r}) cannot be followed because the table "
            f"was altered again later, at {position} ({query[:200]!r}); the server only shows the newest "
            "schema, not the one in between. Everything before the first DDL is committed. Re-snapshot the "
            "table (drop its target and state rows), and keep the job running during migrations: DDLs "
            "are followed one at a time"
        )
