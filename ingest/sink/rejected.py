"""Rejected tables: `<target>__rejected`, one row per value the target could not hold exactly.

Written for tables with `on_unrepresentable: dead_letter` (ingest/changes/rejects.py decides which values), by
the binlog phase and by the snapshot (snapshot.py, before the chunks' commit; `seq` names the chunk and the
key there). Exactly once: a batch's rejected rows are MERGEd in before the target's MERGE of
the same batch, matched on (`seq`, `column_name`), the row image's place in the binlog and the column. A
batch replayed after a crash (before or after the target's commit) finds its rows already there and adds
none, whatever the batch boundaries of the replay; and since they commit before the target does, a
target that holds a batch implies its rejected rows are held too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ingest.config import Targets
from ingest.model.changes import RejectedValue
from ingest.model.columns import quote_identifier
from ingest.sink.targets import OLD_METADATA_DELETED, qualified

log = logging.getLogger(__name__)

# The rejected table of a target is `<target name><REJECTED_SUFFIX>` in the target's namespace.
REJECTED_SUFFIX = "__rejected"

# (name, Spark DDL type, arrow type, nullable)
COLUMNS: tuple[tuple[str, str, Any, bool], ...] = (
    ("key_json", "STRING", pa.string(), False),
    ("column_name", "STRING", pa.string(), False),
    ("raw_value", "STRING", pa.string(), False),
    ("reason", "STRING", pa.string(), False),
    ("phase", "STRING", pa.string(), False),
    ("binlog_position", "STRING", pa.string(), True),
    ("gtid", "STRING", pa.string(), True),
    ("seq", "STRING", pa.string(), True),
    ("chunk_index", "INT", pa.int32(), True),
    ("commit_ts", "TIMESTAMP", pa.timestamp("us", tz="UTC"), True),
)


def rejected_table_for(targets: Targets, database: str, table: str) -> tuple[str, str] | None:
    """(namespace, name) of a source table's rejected table, or None when its policy is not `dead_letter`."""
    if targets.options_for(database, table).on_unrepresentable != "dead_letter":
        return None
    namespace, name = targets.target_for(database, table)
    return namespace, name + REJECTED_SUFFIX


def ensure_rejected(spark: Any, targets: Targets, database: str, table: str) -> str | None:
    """Create the rejected table if the table has one and it is missing; return its qualified name."""
    names = rejected_table_for(targets, database, table)
    if names is None:
        return None
    name = qualified(targets, *names)
    if not spark.catalog.tableExists(name):
        columns = ", ".join(f"{quote_identifier(n)} {ddl}{'' if null else ' NOT NULL'}" for n, ddl, _, null in COLUMNS)
        props = {"format-version": str(targets.sink.format_version), **OLD_METADATA_DELETED}
        tblprops = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())
        spark.sql(f"CREATE TABLE IF NOT EXISTS {name} ({columns}) USING iceberg TBLPROPERTIES ({tblprops})")
        log.info("created rejected table %s for %s.%s", name, database, table)
    return name


def rejected_arrow(rows: Sequence[RejectedValue]) -> Any:
    """The `pyarrow.Table` of rejected rows."""
    values: dict[str, list[Any]] = {
        "key_json": [r.key_json for r in rows],
        "column_name": [r.column for r in rows],
        "raw_value": [r.raw for r in rows],
        "reason": [r.reason for r in rows],
        "phase": [r.phase for r in rows],
        "binlog_position": [r.position for r in rows],
        "gtid": [r.gtid for r in rows],
        "seq": [r.seq for r in rows],
        "chunk_index": [r.chunk_index for r in rows],
        "commit_ts": [None if r.commit_time is None else r.commit_time * 1_000_000 for r in rows],
    }
    arrays = [
        pa.array(values[n], pa.int64()).cast(t) if n == "commit_ts" else pa.array(values[n], t)
        for n, _, t, _ in COLUMNS
    ]
    return pa.Table.from_arrays(arrays, schema=pa.schema([pa.field(n, t, nullable=null) for n, _, t, null in COLUMNS]))


def merge_rejected(spark: Any, table: str, rows: Sequence[RejectedValue]) -> None:
    """Add the rows the table does not hold yet, by (`seq`, `column_name`): a replay adds nothing."""
    if not rows:
        return
    view = f"ingest_rejected_{abs(hash((table, rows[0].seq, len(rows))))}"
    spark.createDataFrame(rejected_arrow(rows)).createOrReplaceTempView(view)
    names = [quote_identifier(n) for n, _, _, _ in COLUMNS]
    try:
        spark.sql(
            f"MERGE INTO {table} t USING {view} s ON t.seq = s.seq AND t.column_name = s.column_name "
            f"WHEN NOT MATCHED THEN INSERT ({', '.join(names)}) VALUES ({', '.join('s.' + n for n in names)})"
        )
    finally:
        spark.catalog.dropTempView(view)
    log.warning("%s: %d values rejected (not written to the target)", table, len(rows))
