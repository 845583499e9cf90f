"""Iceberg target tables: created from the MySQL schema, written with the chunk progress in the same commit."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ingest.config import PartitionField, Targets
from ingest.errors import ConfigError
from ingest.model.columns import quote_identifier
from ingest.model.schema import OCCURRENCE_COLUMN, TableSchema, target_columns
from ingest.sink.catalog import cached_pyiceberg_catalog
from ingest.sink.evolution import SOURCE_SCHEMA_PROPERTY, schema_to_json, spark_string
from ingest.sink.summary import SUMMARY_CHUNKS_DONE, SUMMARY_PIPELINE
from ingest.sink.summary import snapshot_properties as summary_properties

log = logging.getLogger(__name__)


COPY_BRANCH = "ingest_copy"
"""The Iceberg branch a target is copied into again (ingest/sink/recopy.py) while readers keep its main. While it
exists, the job writes the table there and reads what the table holds from there."""
_BRANCH_SUFFIX = "." + quote_identifier(f"branch_{COPY_BRANCH}")
STAGE_BRANCH = "ingest_stage"
"""The Iceberg branch Spark writes a batch's part to (a MERGE, an append) before the batch's one commit moves the
table's main to it (ingest/sink/atomic.py). Between batches it points where main does; readers never look at it."""
_STAGE_SUFFIX = "." + quote_identifier(f"branch_{STAGE_BRANCH}")

MERGE_ON_READ = {
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}
OLD_METADATA_DELETED = {
    # Every commit writes a new metadata.json; without this each one stays forever (Iceberg keeps the
    # newest `write.metadata.previous-versions-max`, 100 by default, only when told to delete).
    "write.metadata.delete-after-commit.enabled": "true",
}


def qualified(targets: Targets, namespace: str, name: str) -> str:
    return ".".join(quote_identifier(p) for p in (targets.sink.catalog_name, *namespace.split("."), name))


def ensure_target(spark: Any, targets: Targets, schema: TableSchema) -> str:
    """Create the target if missing (merge-on-read, primary key as identifier fields); return its name."""
    return ensure_target_created(spark, targets, schema)[0]


PARTITIONS_PROPERTY = "ingest.source-partitions"
"""Target table property: the source table's MySQL partitions as of the target's offset (JSON of
`ingest.source.binlog.partitions.PartitionLayout`), for the rows a DROP or TRUNCATE PARTITION removes."""


def ensure_target_created(
    spark: Any, targets: Targets, schema: TableSchema, partitions: Callable[[], str | None] | None = None
) -> tuple[str, bool]:
    """`ensure_target`, and whether the target was created now (with the source's `partitions()`, asked only
    then)."""
    namespace, name = targets.target_for(schema.database, schema.table)
    table = qualified(targets, namespace, name)
    # The catalog is asked directly: every run ensures every target, and a Spark statement costs far more.
    catalog = cached_pyiceberg_catalog(targets.sink)
    created = not catalog.table_exists((namespace, name))
    if created:
        catalog.create_namespace_if_not_exists(tuple(namespace.split(".")))
        layout = None if partitions is None else partitions()
        props = {
            "format-version": str(targets.sink.format_version),
            **MERGE_ON_READ,
            **OLD_METADATA_DELETED,
            **targets.sink.table_properties,
            # The source schema the target mirrors; the binlog phase decodes with it until a DDL changes it.
            SOURCE_SCHEMA_PROPERTY: schema_to_json(schema),
            **({PARTITIONS_PROPERTY: layout} if layout is not None else {}),
        }
        fields = targets.options_for(schema.database, schema.table).partition_by
        if fields or not _create_in_catalog(catalog, targets, (namespace, name), schema, props):
            columns = ", ".join(
                f"{quote_identifier(t.name)} {t.spark_type}{'' if t.nullable else ' NOT NULL'}"
                for t in target_columns(schema)
            )
            tblprops = ", ".join(f"{spark_string(k)} = {spark_string(v)}" for k, v in props.items())
            partitioned = f" PARTITIONED BY ({partition_clause(schema, fields)})" if fields else ""
            spark.sql(
                f"CREATE TABLE IF NOT EXISTS {table} ({columns}) USING iceberg{partitioned} TBLPROPERTIES ({tblprops})"
            )
            if not schema.keyless:  # identifier fields must be required, and no column of a keyless table need be
                keys = ", ".join(quote_identifier(k) for k in schema.primary_key)
                spark.sql(f"ALTER TABLE {table} SET IDENTIFIER FIELDS {keys}")
        log.info("created %s for %s", table, schema.table_id)
    return table, created


_ICEBERG_TYPES = {
    "INT": "IntegerType",
    "BIGINT": "LongType",
    "FLOAT": "FloatType",
    "DOUBLE": "DoubleType",
    "BOOLEAN": "BooleanType",
    "STRING": "StringType",
    "BINARY": "BinaryType",
    "DATE": "DateType",
    "TIMESTAMP": "TimestamptzType",
    "TIMESTAMP_NTZ": "TimestampType",
}
"""The pyiceberg type of each Spark type the job maps columns to (ingest/model/columns.py), as Spark's Iceberg
catalog makes it; `DECIMAL(p,s)` is `DecimalType(p, s)`."""


def iceberg_type(spark_type: str) -> Any:
    """The pyiceberg type of a target column's Spark type."""
    from pyiceberg import types

    decimal = re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", spark_type)
    if decimal:
        return types.DecimalType(int(decimal[1]), int(decimal[2]))
    return getattr(types, _ICEBERG_TYPES[spark_type])()


def _create_in_catalog(
    catalog: Any, targets: Targets, names: tuple[str, str], schema: TableSchema, properties: dict[str, str]
) -> bool:
    """Create an unpartitioned format 2 target with pyiceberg, as Spark's Iceberg catalog makes it: the same field
    ids, types, identifier fields, location and properties, in one catalog commit (Spark's CREATE TABLE and ALTER
    cost about half a second a table). False, with nothing done, where Spark must create it: format 3 (pyiceberg
    does not write it), or a catalog other than JDBC and REST, whose table locations only Spark's catalog knows."""
    from pyiceberg.exceptions import TableAlreadyExistsError
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    kind = targets.sink.catalog.get("type")
    if int(properties["format-version"]) != 2 or kind not in ("jdbc", "rest"):
        return False
    fields = [
        NestedField(number, column.name, iceberg_type(column.spark_type), required=not column.nullable)
        for number, column in enumerate(target_columns(schema), start=1)
    ]
    by_name = {f.name: f.field_id for f in fields}
    iceberg_schema = Schema(*fields, identifier_field_ids=[by_name[k] for k in schema.primary_key])
    location = None
    if kind == "jdbc":  # Iceberg's JDBC catalog puts a table at <warehouse>/<namespace levels>/<name>
        warehouse = str(targets.sink.catalog.get("warehouse", "")).rstrip("/")
        location = "/".join([warehouse, *names[0].split("."), names[1]])
    try:
        catalog.create_table(
            names,
            iceberg_schema,
            location=location,
            properties={"write.parquet.compression-codec": "zstd", **properties},
        )
    except TableAlreadyExistsError:
        pass  # made by another run meanwhile, as CREATE TABLE IF NOT EXISTS would leave it
    return True


# The Iceberg types each transform takes, as the Spark types the job maps columns to (ingest/model/columns.py).
_TRANSFORM_TYPES = {
    "years": ("DATE", "TIMESTAMP", "TIMESTAMP_NTZ"),
    "months": ("DATE", "TIMESTAMP", "TIMESTAMP_NTZ"),
    "days": ("DATE", "TIMESTAMP", "TIMESTAMP_NTZ"),
    "hours": ("TIMESTAMP", "TIMESTAMP_NTZ"),
    "bucket": ("INT", "BIGINT", "DECIMAL", "STRING", "BINARY", "DATE", "TIMESTAMP", "TIMESTAMP_NTZ"),
    "truncate": ("INT", "BIGINT", "DECIMAL", "STRING", "BINARY"),
    "identity": ("INT", "BIGINT", "DECIMAL", "STRING", "BINARY", "DATE", "TIMESTAMP", "TIMESTAMP_NTZ", "BOOLEAN"),
}


def partition_clause(schema: TableSchema, fields: Sequence[PartitionField]) -> str:
    """The PARTITIONED BY list of `table_options.<table>.partition_by`, checked against the table's columns."""
    types = {t.name: t.spark_type for t in target_columns(schema)}
    key = f"table_options.{schema.table_id}.partition_by"
    parts = []
    for f in fields:
        if f.column not in types:
            raise ConfigError(f"`{key}`: {schema.table_id} has no column {f.column!r} (columns: {', '.join(types)})")
        base = types[f.column].split("(")[0]
        if base not in _TRANSFORM_TYPES[f.transform]:
            raise ConfigError(
                f"`{key}`: {f} cannot partition {schema.table_id}: column {f.column!r} is {types[f.column]} in "
                f"Iceberg; {f.transform} takes {', '.join(_TRANSFORM_TYPES[f.transform])}"
            )
        parts.append(f.render(quote_identifier(f.column)))
    return ", ".join(parts)


def check_targets(targets: Targets, schemas: Sequence[TableSchema]) -> None:
    """Before anything is written: no two source tables write one Iceberg table, and each partition spec names
    columns of its table that its transform takes."""
    _check_target_names(targets, [(s.database, s.table) for s in schemas])
    for schema in schemas:
        partition_clause(schema, targets.options_for(schema.database, schema.table).partition_by)


def _check_target_names(targets: Targets, tables: Sequence[tuple[str, str]]) -> None:
    """Two source tables must never write one Iceberg table (a target, or a changelog table)."""
    owner: dict[tuple[str, str], str] = {}
    for db, t in tables:
        names = [targets.target_for(db, t), targets.changelog_for(db, t)]
        for name in (n for n in names if n is not None):
            other = owner.setdefault(name, f"{db}.{t}")
            if other != f"{db}.{t}":
                raise ConfigError(
                    f"`{other}` and `{db}.{t}` would both write the Iceberg table {'.'.join(name)}; give one of "
                    "them another `table_options.<table>.target`, or change `sink.table_name`"
                )


def partition_source_columns(iceberg_table: Any, schema: TableSchema) -> tuple[str, ...]:
    """The source columns, other than the primary key, that a partition spec of the target (any of its specs: old
    files keep theirs) takes values from; a pyiceberg table."""
    columns = iceberg_table.schema()
    found: list[str] = []
    for spec in iceberg_table.specs().values():
        for f in spec.fields:
            name = columns.find_column_name(f.source_id)
            if name in schema.column_names and name not in schema.primary_key and name not in found:
                found.append(name)
    return tuple(found)


def copy_under_way(iceberg_table: Any) -> bool:
    """The target is being copied again into its branch (the branch is the durable signal of that)."""
    return COPY_BRANCH in iceberg_table.metadata.refs


def job_head(iceberg_table: Any) -> Any:
    """The newest snapshot of what the job holds of the table: the copy branch's head while it exists, else main's."""
    if copy_under_way(iceberg_table):
        return iceberg_table.snapshot_by_name(COPY_BRANCH)
    return iceberg_table.current_snapshot()


def on_copy_branch(target: str) -> str:
    """The Spark name that writes to (and reads) the copy branch of a qualified target name."""
    return target if target.endswith(_BRANCH_SUFFIX) else target + _BRANCH_SUFFIX


def on_stage_branch(target: str) -> str:
    """The Spark name that writes to (and reads) the stage branch of a qualified table name."""
    return target + _STAGE_SUFFIX


def table_of(target: str) -> str:
    """The qualified table name of a Spark name that may point at the copy branch (for DDL and REFRESH)."""
    return target.removesuffix(_BRANCH_SUFFIX).removesuffix(_STAGE_SUFFIX)


def lineage(iceberg_table: Any) -> Iterator[Any]:
    """The job's head of the table (`job_head`), then its parent, and so on while they are kept (stops at a cycle
    in broken metadata)."""
    by_id = {s.snapshot_id: s for s in iceberg_table.snapshots()}
    snapshot = job_head(iceberg_table)
    seen: set[int] = set()
    while snapshot is not None and snapshot.snapshot_id not in seen:
        seen.add(snapshot.snapshot_id)
        yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = by_id.get(parent) if parent is not None else None


def copy_snapshots(iceberg_table: Any) -> list[Any]:
    """The snapshots that can hold the job's copy of the table: all of them, or while a copy branch exists only
    the branch's lineage (main's snapshots hold the old copy's chunks), oldest first."""
    if copy_under_way(iceberg_table):
        return list(reversed(list(lineage(iceberg_table))))
    return list(iceberg_table.snapshots())


def encode_ranges(indexes: Iterable[int]) -> str:
    """Chunk indexes as compact ranges: {0,1,2,5} -> '0-2,5'."""
    parts: list[str] = []
    ordered = sorted(set(indexes))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def decode_ranges(text: str) -> set[int]:
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def chunks_done_in_target(iceberg_table: Any, pipeline: str) -> set[int]:
    """Chunk indexes recorded in the newest snapshot of ours that is still in the table's history.

    Each snapshot-phase commit carries the cumulative set, so the newest one suffices, and a crash between
    the data commit and the state-table commit cannot make a committed chunk be read (and appended) again.
    While a copy branch exists, only its lineage counts: main's snapshots hold the old copy's chunks.
    """
    snapshots = sorted(copy_snapshots(iceberg_table), key=lambda s: s.sequence_number, reverse=True)
    for snapshot in snapshots:
        summary = snapshot.summary
        props = summary.additional_properties if summary is not None else {}
        if props.get(SUMMARY_PIPELINE) == pipeline and SUMMARY_CHUNKS_DONE in props:
            return decode_ranges(props[SUMMARY_CHUNKS_DONE])
    return set()


def row_identity(schema: TableSchema) -> tuple[str, ...]:
    """The target's columns that tell its rows apart: the primary key, or, for a table without a key, every column
    and the row's number among alike rows."""
    return schema.primary_key or (*schema.column_names, OCCURRENCE_COLUMN)


def delete_where(
    spark: Any, target: str, key: Sequence[str], where: str, snapshot_properties: Mapping[str, str]
) -> None:
    """Delete the rows of `target` that `where` (on alias `t`) holds, in one commit whose summary carries
    `snapshot_properties`: a MERGE of the target with itself, so that Spark always takes the row-level path,
    which carries the session's snapshot properties (a DELETE whose condition covers whole files would not).
    The rows are matched on `key` (`row_identity`), null-safe."""
    on = " AND ".join(f"t.{quote_identifier(k)} <=> s.{quote_identifier(k)}" for k in key)
    keys = ", ".join(f"t.{quote_identifier(k)}" for k in key)
    with summary_properties(spark, snapshot_properties):
        spark.sql(
            f"MERGE INTO {target} t USING (SELECT {keys} FROM {target} t WHERE {where}) s ON {on} "
            "WHEN MATCHED THEN DELETE"
        )


def store_partitions(spark: Any, table: str, layout: Any) -> None:
    """Keep the source's partition layout (`PartitionLayout`, None: not known) as the target's property."""
    if layout is None:
        spark.sql(f"ALTER TABLE {table} UNSET TBLPROPERTIES IF EXISTS ({spark_string(PARTITIONS_PROPERTY)})")
    else:
        spark.sql(
            f"ALTER TABLE {table} SET TBLPROPERTIES ({spark_string(PARTITIONS_PROPERTY)} = "
            f"{spark_string(layout.to_json())})"
        )


def delete_every_row(spark: Any, target: str, snapshot_properties: Mapping[str, str]) -> None:
    """Delete every row of `target` (its copy branch, when it names one) in one commit whose summary carries
    `snapshot_properties`: whole data and delete files are dropped, nothing is rewritten.

    Through Iceberg's API: Spark runs `DELETE FROM` without a condition as a metadata-only delete that takes no
    snapshot properties from the session, so its commit could not carry the offset.
    """
    jvm = spark._jvm
    table = table_of(target)
    jtable = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table)
    delete = jtable.newDelete().deleteFromRowFilter(jvm.org.apache.iceberg.expressions.Expressions.alwaysTrue())
    for key, value in snapshot_properties.items():
        delete = delete.set(key, value)
    if table != target:
        delete = delete.toBranch(COPY_BRANCH)
    delete.commit()
    spark.sql(f"REFRESH TABLE {table}")
