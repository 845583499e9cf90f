"""Copying a target again while readers keep seeing the old one (issue 24): the copy goes to an Iceberg branch.

`ingest resnapshot`, `ingest snapshot --again` and `stream.on_purged: resnapshot` used to drop the target, so
readers saw it empty, then filling, until the copy ended. Now, when the source schema still maps onto the
target's, the copy starts with one metadata commit that points the branch `ingest_copy` at a new empty
snapshot (no parent, no files, summary "chunks done: none"); the job then writes the table's chunks and binlog
MERGEs to the branch and reads what the table holds from it (targets.job_head), while main stays as it was. When
the last chunk is committed, one more metadata commit moves main to the branch head and removes the branch:
readers go from the old table to the new one at once. The branch is the durable "copy under way" signal: it
exists from the first commit to the last, whatever crashes in between.

Iceberg's schema is table-wide, so a source whose columns no longer match the ones the target mirrors (the
schema change Iceberg cannot take that made the user copy the table again) cannot use a branch: the caller
drops the target as before, and readers see it empty meanwhile.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table.update.snapshot import ManageSnapshots

from ingest.faults import crash_point
from ingest.model.schema import TableSchema, target_columns
from ingest.sink.evolution import SOURCE_SCHEMA_PROPERTY, iceberg_promotion, schema_from_json, schema_to_json
from ingest.sink.summary import SUMMARY_CHUNKS_DONE, SUMMARY_PIPELINE
from ingest.sink.targets import COPY_BRANCH, copy_under_way, iceberg_type, table_of

log = logging.getLogger(__name__)

SUMMARY_COPY = "ingest.copy"
"""Snapshot summary key of the empty snapshot a copy branch starts at (value: `started`)."""


def schema_misfit(stored: TableSchema | None, live: TableSchema) -> str | None:
    """Why chunks of `live` cannot be written under the schema the target mirrors (`stored`); None if they can."""
    if stored is None:
        return "the target does not record the source schema it mirrors"
    if stored.primary_key != live.primary_key:
        return f"the primary key changed from {list(stored.primary_key)} to {list(live.primary_key)}"
    if stored.columns != live.columns:
        old = {c.name: c for c in stored.columns}
        new = {c.name: c for c in live.columns}
        changed = sorted(
            [f"-{n}" for n in old.keys() - new.keys()]
            + [f"+{n}" for n in new.keys() - old.keys()]
            + [f"~{n}" for n in old.keys() & new.keys() if old[n] != new[n]]
        )
        return f"its columns changed ({', '.join(changed) or 'order'})"
    return None


# The Spark types of ingest/model/columns.py, as pyiceberg names the Iceberg types they are stored as.
_SPARK_OF = {
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "string": "STRING",
    "binary": "BINARY",
    "date": "DATE",
    "timestamp": "TIMESTAMP_NTZ",
    "timestamptz": "TIMESTAMP",
}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")


def _holds(iceberg_type: str, spark_type: str) -> bool:
    """An Iceberg column of `iceberg_type` holds every value of a target column of `spark_type` unchanged: it is of
    the same type, or of one Iceberg promotes `spark_type` to."""
    decimal = _DECIMAL.fullmatch(iceberg_type)
    held = f"DECIMAL({decimal[1]},{decimal[2]})" if decimal else _SPARK_OF.get(iceberg_type)
    return held is not None and iceberg_promotion(spark_type, held) is not None


def iceberg_misfit(iceberg_table: Any, live: TableSchema) -> str | None:
    """Why the target's Iceberg columns cannot hold the rows of `live` (None: they can, by the same names, once the
    columns `added_columns` names are added).

    A branch shares the table's Iceberg schema, not the source schema the job mirrors: a new primary key, or a
    narrower type (INT where Iceberg has `long`), changes nothing Iceberg stores, so such a table is copied again
    into a branch too, and readers keep the old rows until the copy ends. Nor does a column only added: it joins
    the schema, optional, in the commit that starts the branch, and main reads it as NULL until the copy lands."""
    fields = {f.name: f for f in iceberg_table.schema().fields}
    columns = target_columns(live)
    names = {c.name for c in columns}
    if not fields.keys() <= names:
        changed = sorted([f"-{n}" for n in fields.keys() - names] + [f"+{n}" for n in names - fields.keys()])
        return f"its columns changed ({', '.join(changed)})"
    for c in columns:
        if c.name not in fields:
            continue  # added
        field = fields[c.name]
        if not _holds(str(field.field_type), c.spark_type):
            return f"column {c.name!r} is {field.field_type} in Iceberg, which cannot hold {c.spark_type}"
        if field.required and c.nullable:
            return f"column {c.name!r} is required in Iceberg and nullable in the source"
    return None


def added_columns(iceberg_table: Any, live: TableSchema) -> list[tuple[str, Any, str | None]]:
    """The columns of `live` the target's Iceberg schema lacks: (name, pyiceberg type, the column it follows in
    the source; None: it is the first)."""
    fields = {f.name for f in iceberg_table.schema().fields}
    added: list[tuple[str, Any, str | None]] = []
    previous: str | None = None
    for column in target_columns(live):
        if column.name not in fields:
            added.append((column.name, iceberg_type(column.spark_type), previous))
        previous = column.name
    return added


def stored_schema(iceberg_table: Any, live: TableSchema) -> TableSchema | None:
    """The source schema the target mirrors (the table property the job keeps), or None."""
    text = iceberg_table.properties.get(SOURCE_SCHEMA_PROPERTY)
    return None if not text else schema_from_json(live.database, live.table, text)


def start_branch_copy(catalog: Any, names: tuple[str, str], live: TableSchema, pipeline: str) -> bool:
    """Point the target's copy branch at a new empty snapshot, in one commit; False (nothing done) when the target
    is missing or its schema does not fit `live`, so the caller drops it instead (logged with the reason)."""
    try:
        table = catalog.load_table(names)
    except NoSuchTableError:
        return False
    if table.current_snapshot() is None:  # readers see no rows: nothing to keep (and Iceberg wants main first)
        log.info("%s: its target %s holds no snapshot; it is dropped and copied again", live.table_id, ".".join(names))
        return False
    stored = stored_schema(table, live)
    misfit = schema_misfit(stored, live)
    if misfit is not None and stored is not None and iceberg_misfit(table, live) is None:
        log.info(
            "%s: %s, which the target's Iceberg columns hold: it mirrors the new schema from the copy on",
            live.table_id,
            misfit,
        )
        misfit = None
        mirrored = {SOURCE_SCHEMA_PROPERTY: schema_to_json(live)}
    else:
        mirrored = {}
    if misfit is not None:
        log.warning(
            "%s: %s; an Iceberg branch shares the table's schema, so the target %s is dropped and copied again: "
            "readers see it empty, then filling, until the copy ends",
            live.table_id,
            misfit,
            ".".join(names),
        )
        return False
    props = {SUMMARY_PIPELINE: pipeline, SUMMARY_CHUNKS_DONE: "", SUMMARY_COPY: "started"}
    added = added_columns(table, live)
    with table.transaction() as tx:
        if mirrored:  # the binlog phase decodes with the schema the target mirrors (start._table_streams)
            tx.set_properties(mirrored)
        if added:  # optional, placed as in the source: main reads NULL in them until the copy lands
            with tx.update_schema() as update:
                for name, field_type, after in added:
                    update.add_column(name, field_type)
                    if after is None:
                        update.move_first(name)
                    else:
                        update.move_after(name, after)
        if copy_under_way(table):  # copied again while a copy runs: start that one over
            ManageSnapshots(tx).remove_branch(COPY_BRANCH).commit()
        # The branch of a missing ref gets a snapshot without a parent: empty, and made with the ref in one commit.
        tx.update_snapshot(snapshot_properties=props, branch=COPY_BRANCH).fast_append().commit()
    log.info(
        "%s: copying it again into branch %s of %s; readers see the old rows until the copy ends",
        live.table_id,
        COPY_BRANCH,
        ".".join(names),
    )
    return True


def finish_branch_copy(catalog: Any, names: tuple[str, str], spark: Any = None, target: str | None = None) -> bool:
    """Move the target's main to its copy branch's head and remove the branch, in one commit; False when no copy
    was under way. `target` (a qualified Spark name) is refreshed in `spark` after it."""
    table = catalog.load_table(names)
    if not copy_under_way(table):
        return False
    head = table.snapshot_by_name(COPY_BRANCH).snapshot_id
    crash_point("recopy.before_swap")
    with table.manage_snapshots() as ms:
        ms.set_current_snapshot(snapshot_id=head)
        ms.remove_branch(COPY_BRANCH)
    crash_point("recopy.after_swap")
    if spark is not None and target is not None:
        spark.sql(f"REFRESH TABLE {table_of(target)}")
    log.info("%s: the copy is complete; readers now see it (main moved to snapshot %d)", ".".join(names), head)
    return True
