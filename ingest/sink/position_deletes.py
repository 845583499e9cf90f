"""A batch applied to a large target by position: merge-on-read written by the job, without Spark's MERGE.

Spark's MERGE turns the batch's Arrow into Spark rows, joins them with the target's rows and writes Parquet again;
that was most of the binlog phase's CPU (issue 51). The job knows what the join would find, the batch's keys, so
it looks them up itself:
- the data files whose bounds may hold a key are planned from the manifests (pyiceberg's scan planning);
- of each, only the key columns are read, only the row groups whose statistics may hold a key, and the rows of
  the batch's keys give their positions;
- one snapshot (what Iceberg's Java `RowDelta` makes) adds a position delete file per data file holding a key
  (`file_path`, `pos`: the file granularity Iceberg's writers use by default) and a data file of the batch's
  final rows, tagged with the batch's offset like every commit of the job;
- a data file's delete file already there (one of an earlier batch, or any other whose bounds name that file alone)
  is merged into the one the batch writes for it, and removed in the same snapshot: at every snapshot a data file
  has at most one such delete file, as format 3's deletion vectors have by rule, so a reader opens one per data
  file however many batches deleted from it;
- the batch's final rows are written with the rows of the target's smallest data file while it is small
  (`TAIL_BYTES`), which the snapshot replaces: a target does not gain a data file (and a manifest) per batch.
Spark, Trino and pyiceberg apply the deletes when they read; the job's maintenance rewrites them away
(ingest/sink/maintenance.py). The snapshot requires the branch head it read the positions at (and refuses
pyiceberg's own retry on a newer head), so a compaction committed in between fails the commit and the batch is
staged again from fresh metadata: positions are never applied to files that were rewritten.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingest.errors import SinkError
from ingest.model.schema import TableSchema
from ingest.sink.transaction import open_transaction

FILE_PATH_ID, POS_ID = 2147483546, 2147483545
"""The field ids of a position delete file's columns (the Iceberg table spec, "Position Delete Files")."""

IN_LIST_MAX = 200
"""pyiceberg's scan planning evaluates an IN of more values than this as "may match" for every file; above it,
files are planned by the keys' range only (binding the values would cost, and prune nothing)."""

TAIL_BYTES = 4 << 20
"""The batch's rows are written with those of the target's smallest data file under this size, which the snapshot
replaces (its rows of the batch's keys left out, its deletes applied): a target gains a data file when its last
one reaches this size, not at every batch, and a batch rewrites at most this much of what it did not change."""

READERS = 4
"""Data files read (and delete files written) at once: object store latency, not CPU, bounds one file's turn."""


class UnpositionedFile(SinkError):
    """A data file of the target without Iceberg field ids (added from outside, read by name mapping): the job
    cannot tell its key columns by id. It stops by name; Spark's MERGE can apply the batch."""


def stage_by_position(
    table: Any, schema: TableSchema, rows: pa.Table, final: pa.Table, properties: dict[str, str], held: bool = True
) -> Any:
    """The pyiceberg transaction (not committed) that applies the batch `rows` (`batch_arrow`) to `table` in one
    snapshot tagged with `properties`: every row holding one of the batch's keys deleted by position, and `final`
    (the batch's final rows, conformed to the target) added. `held=False`: the batch's keys are known not to be in
    the table (a batch that only creates rows), none is looked for. Raises `UnpositionedFile` when a data file that
    may hold a key has no field ids."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    transaction = open_transaction(table)
    metadata = transaction.table_metadata
    keys = rows.select(list(schema.primary_key))
    located = locate(table, keys) if held else {}
    tail = _tail(table) if final.num_rows else None
    if tail is not None:
        located.pop(tail.file.file_path, None)  # its rows of the batch's keys are left out, not deleted by position
        final = pa.concat_tables([_without(_read(metadata, table.io, tail), keys).cast(final.schema), final])
    write_uuid = uuid.uuid4()
    files = []
    if final.num_rows:
        files = list(_dataframe_to_data_files(metadata, final, table.io, write_uuid, itertools.count(0)))

    def deletes(numbered: tuple[int, tuple[str, Located]]) -> Any:
        number, (data_file, found) = numbered
        positions = _with_earlier(table.io, data_file, found)
        return write_position_deletes(table, metadata, data_file, positions, write_uuid, number)

    with ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="deletes") as pool:
        files += list(pool.map(deletes, enumerate(sorted(located.items()))))
    if not files:
        return transaction
    producer = _row_delta_class()(transaction, table.io, properties)
    for data_file in files:
        producer.append_data_file(data_file)
    for found in located.values():
        for earlier in found.deletes:
            producer.remove(earlier)
    if tail is not None:
        producer.remove(tail.file)
        for delete in tail.delete_files:
            if _deletes_only_from(delete, tail.file.file_path, metadata.default_spec_id):
                producer.remove(delete)
    producer.commit()
    return transaction


def _tail(table: Any) -> Any | None:
    """The scan task (with its delete files) of the target's smallest data file under `TAIL_BYTES`, or None."""
    tasks = [t for t in table.scan().plan_files() if t.file.file_size_in_bytes < TAIL_BYTES]
    return min(tasks, key=lambda t: t.file.file_size_in_bytes, default=None)


def _read(metadata: Any, io: Any, task: Any) -> pa.Table:
    """A data file's rows, its deletes applied."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    return ArrowScan(metadata, io, metadata.schema(), AlwaysTrue()).to_table(tasks=[task])


def _without(held: pa.Table, keys: pa.Table) -> pa.Table:
    """The rows of `held` whose key is none of `keys`' (the key columns, as the batch has them)."""
    names = keys.column_names
    keys = _distinct(keys).cast(pa.schema([pa.field(n, held.schema.field(n).type) for n in names]))
    return held.join(keys, names, join_type="left anti")


class Located(NamedTuple):
    """What a batch deletes from one data file."""

    positions: pa.Array
    """The positions of the rows holding the batch's keys, ascending."""
    deletes: tuple[Any, ...]
    """The position delete files (pyiceberg `DataFile`s) already applying to this data file alone: their positions
    are written again with the batch's, and they are removed."""


def locate(table: Any, keys: pa.Table) -> dict[str, Located]:
    """Per data file of `table` (its main branch) holding a row with one of `keys` (the key columns, as the batch
    has them), the positions of those rows and its own delete files. Rows deleted before are found too: deleting a
    position twice is harmless, and telling them apart would cost reading the delete files of every file read."""
    if keys.num_rows == 0:
        return {}
    keys = _distinct(keys)
    ids = [table.schema().find_field(name).field_id for name in keys.column_names]
    sorted_first = _sorted_values(keys.column(0))
    spec_id = table.metadata.default_spec_id
    tasks = list(table.scan(row_filter=may_hold(keys)).plan_files())

    def positions(task: Any) -> tuple[str, Located]:
        path = task.file.file_path
        with table.io.new_input(path).open() as stream:
            found = _positions_in(pq.ParquetFile(stream), path, ids, keys, sorted_first)
        return path, Located(found, tuple(d for d in task.delete_files if _deletes_only_from(d, path, spec_id)))

    with ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="locate") as pool:
        return {path: found for path, found in pool.map(positions, tasks) if len(found.positions)}


def _deletes_only_from(delete: Any, data_file: str, spec_id: int) -> bool:
    """`delete` is a position delete file whose bounds name `data_file` alone (of the table's current spec, as the
    delete manifest the batch writes)."""
    from pyiceberg.manifest import DataFileContent

    if delete.content != DataFileContent.POSITION_DELETES or delete.spec_id != spec_id:
        return False
    low, high = (bounds.get(FILE_PATH_ID) if bounds else None for bounds in (delete.lower_bounds, delete.upper_bounds))
    return low is not None and low == high == data_file.encode()


def _with_earlier(io: Any, data_file: str, found: Located) -> pa.Array:
    """The positions of `found` and of its earlier delete files in `data_file`, each once, ascending."""
    if not found.deletes:
        return found.positions
    parts = [found.positions.cast(pa.int64())]
    for delete in found.deletes:
        with io.new_input(delete.file_path).open() as stream:
            held = pq.read_table(stream, columns=["file_path", "pos"])
        parts.append(held.filter(pc.equal(held.column("file_path"), data_file)).column("pos").combine_chunks())
    merged = pc.unique(pa.concat_arrays([p.cast(pa.int64()) for p in parts]))
    return merged.take(pc.array_sort_indices(merged))


def _distinct(keys: pa.Table) -> pa.Table:
    return keys.group_by(keys.column_names).aggregate([])


def _prunable(kind: pa.DataType) -> bool:
    """Whether values of this type compare in Python as the planner and Parquet statistics order them."""
    return bool(pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _sorted_values(column: pa.ChunkedArray) -> list[Any] | None:
    """The first key column's values sorted, for pruning row groups by their statistics; None where its type is not
    `_prunable`."""
    return sorted(column.to_pylist()) if _prunable(column.type) else None


def may_hold(keys: pa.Table) -> Any:
    """The scan filter of the files that may hold `keys`: per key column its values' range, and its values when
    few enough for the planner to test them."""
    from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, In, LessThanOrEqual, Reference

    where: Any = AlwaysTrue()
    for name in keys.column_names:
        column = keys.column(name)
        if not _prunable(column.type):
            continue  # a type whose Python value the planner may not compare with its bounds: not pruned by it
        bounds = pc.min_max(column)
        where = And(where, GreaterThanOrEqual(term=Reference(name), value=bounds["min"].as_py()))
        where = And(where, LessThanOrEqual(term=Reference(name), value=bounds["max"].as_py()))
        values = pc.unique(column)
        if len(values) <= IN_LIST_MAX:
            where = And(where, In(term=Reference(name), values=values.to_pylist()))
    return where


def _positions_in(
    parquet: pq.ParquetFile, path: str, ids: Sequence[int], keys: pa.Table, sorted_first: list[Any] | None
) -> pa.Array:
    """The positions in one data file of the rows with one of `keys`; `ids` are the key columns' field ids. The
    row groups that may hold a key are read together: the keys' hash table is built once per file."""
    names = _names_by_id(parquet, path, ids)
    leaf = _leaf_index(parquet, names[0])
    groups: list[int] = []
    shifts: list[tuple[int, int]] = []  # per group read: (its first row among those read, its first position)
    offset = read = 0
    for group in range(parquet.metadata.num_row_groups):
        meta = parquet.metadata.row_group(group)
        if sorted_first is None or _group_may_hold(meta.column(leaf).statistics, sorted_first):
            groups.append(group)
            shifts.append((read, offset))
            read += meta.num_rows
        offset += meta.num_rows
    if not groups:
        return pa.array([], pa.int64())
    held = parquet.read_row_groups(groups, columns=names).rename_columns(keys.column_names).cast(keys.schema)
    if len(names) == 1:
        hits = pc.indices_nonzero(pc.is_in(held.column(0), value_set=keys.column(0).combine_chunks()))
    else:
        numbered = held.append_column("__ingest_row", pa.array(range(held.num_rows), pa.int64()))
        rows = numbered.join(keys, keys.column_names, join_type="inner").column("__ingest_row").combine_chunks()
        hits = rows.take(pc.array_sort_indices(rows))  # a join's rows come in no order
    return pa.array(_shifted(hits.to_pylist(), shifts), pa.int64())


def _shifted(hits: list[int], shifts: list[tuple[int, int]]) -> list[int]:
    """`hits` (ascending rows among those read) as positions in the file: each moved by its group's shift."""
    positions, at = [], 0
    for hit in hits:
        while at + 1 < len(shifts) and shifts[at + 1][0] <= hit:
            at += 1
        positions.append(hit - shifts[at][0] + shifts[at][1])
    return positions


def _names_by_id(parquet: pq.ParquetFile, path: str, ids: Sequence[int]) -> list[str]:
    """The file's own names of the columns with field ids `ids` (a rename changes the table's name, not the
    file's)."""
    by_id: dict[int, str] = {}
    for column in parquet.schema_arrow:
        field_id = (column.metadata or {}).get(b"PARQUET:field_id")
        if field_id is not None:
            by_id[int(field_id)] = column.name
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise UnpositionedFile(
            f"{path} has no column with field id {missing[0]}: the file was not written with Iceberg field ids, "
            "so the job cannot find the batch's keys in it by position. Set `stream.position_deletes: false` "
            "to apply batches to this target with Spark's MERGE"
        )
    return [by_id[i] for i in ids]


def _leaf_index(parquet: pq.ParquetFile, name: str) -> int:
    schema = parquet.metadata.schema
    return next(i for i in range(len(schema)) if schema.column(i).path == name)


def _group_may_hold(statistics: Any, sorted_values: list[Any]) -> bool:
    """Whether a row group whose key column has `statistics` may hold one of `sorted_values`."""
    if statistics is None or not statistics.has_min_max:
        return True
    low, high = statistics.min, statistics.max
    if isinstance(low, bytes) or type(low) is not type(sorted_values[0]):
        return True  # statistics of another physical type than the values (a widened column): not pruned
    at = bisect.bisect_left(sorted_values, low)
    return at < len(sorted_values) and sorted_values[at] <= high


def write_position_deletes(
    table: Any, metadata: Any, data_file: str, positions: pa.Array, write_uuid: uuid.UUID, number: int
) -> Any:
    """A position delete file of `positions` (ascending) in `data_file`, and its pyiceberg `DataFile` (content
    position deletes, full bounds: a reader sees which one data file it applies to)."""
    from pyiceberg.io.fileformat import FileFormatFactory
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    delete_schema, arrow_schema = _delete_schemas()
    rows = pa.Table.from_arrays(
        [pa.array([data_file] * len(positions), pa.string()), positions.cast(pa.int64())], schema=arrow_schema
    )
    location = table.location_provider().new_data_location(
        data_file_name=f"00000-{number}-{write_uuid}-deletes.parquet"
    )
    output = table.io.new_output(location)
    properties = {**metadata.properties, "write.metadata.metrics.default": "full"}
    with FileFormatFactory.get(FileFormat.PARQUET).create_writer(output, delete_schema, properties) as writer:
        writer.write(rows)
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        file_size_in_bytes=len(output),
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **writer.result().to_serialized_dict(),
    )


@functools.cache
def _delete_schemas() -> tuple[Any, pa.Schema]:
    """A position delete file's Iceberg schema, and its Arrow schema with the field ids."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    schema = Schema(
        NestedField(FILE_PATH_ID, "file_path", StringType(), required=True),
        NestedField(POS_ID, "pos", LongType(), required=True),
    )
    return schema, schema_to_pyarrow(schema, include_field_ids=True)


@functools.cache
def _row_delta_class() -> type:
    """pyiceberg's fast append, made to write its position delete files into a delete manifest of their own, and to
    remove delete files: pyiceberg has no row delta of its own (apache/iceberg-python #1078)."""
    from pyiceberg.exceptions import ValidationException
    from pyiceberg.manifest import DataFileContent, ManifestContent
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _FastAppendFiles

    class RowDelta(_FastAppendFiles):
        def __init__(self, transaction: Any, io: Any, properties: dict[str, str]) -> None:
            super().__init__(Operation.OVERWRITE, transaction, io, snapshot_properties=properties)
            self._removed: dict[str, Any] = {}

        def remove(self, file: Any) -> None:
            """Remove a data or delete file of the branch's head: its manifest is written again without it."""
            self._removed[file.file_path] = file
            self.delete_data_file(file)  # counted in the snapshot's summary

        def _validate_concurrency(self) -> None:
            """pyiceberg retries a commit another writer beat on the new head, and a fast append validates
            nothing. The positions were read at the start, though: a compaction since may have rewritten their
            files, so any commit in between fails this one (the caller stages the batch again)."""
            if self._commit_window is not None and not self._commit_window.is_empty():
                head = self._commit_window.head
                raise ValidationException(
                    f"positions were read at snapshot {self._starting_snapshot_id}; "
                    f"the table moved on to {None if head is None else head.snapshot_id}"
                )

        def _manifests(self) -> list[Any]:
            """Per content (data, deletes), one manifest of the files added, and of the entries of the manifests
            holding a removed file: the others existing, the removed ones deleted. The other manifests as they
            were."""
            existing = self._existing_manifests()
            rewritten = _holding(existing, self._io, self._removed)
            written = []
            for content in (ManifestContent.DATA, ManifestContent.DELETES):
                data = content == ManifestContent.DATA
                added = [f for f in self._added_data_files if (f.content == DataFileContent.DATA) == data]
                held = [m for m in rewritten.values() if m.content == content]
                entries = [e for m in held for e in m.fetch_manifest_entry(self._io)]
                if added or entries:
                    writer = self._writer(content)
                    written.append(_written(writer, self._snapshot_id, added, entries, self._removed))
            return written + [m for m in existing if m.manifest_path not in rewritten]

        def _writer(self, content: Any) -> Any:
            spec = self._transaction.table_metadata.spec()
            if content == ManifestContent.DATA:
                return self.new_manifest_writer(spec)
            output = self.new_manifest_output()
            return _delete_manifest_writer()(spec, self.schema(), output, self._snapshot_id, self._compression)

    return RowDelta


def _written(writer: Any, snapshot_id: int, added: list[Any], entries: list[Any], removed: dict[str, Any]) -> Any:
    """The manifest `writer` writes: the files `added`, and `entries` of earlier manifests, deleted when their file
    is one of `removed` (by path), else existing."""
    with writer:
        for data_file in added:
            writer.add(_added_entry(snapshot_id, data_file))
        for entry in entries:
            (writer.delete if entry.data_file.file_path in removed else writer.existing)(entry)
    return writer.to_manifest_file()


def _holding(manifests: list[Any], io: Any, removed: dict[str, Any]) -> dict[str, Any]:
    """By path, the manifests that list a file of `removed` (by path); each of those must be listed."""
    from pyiceberg.exceptions import ValidationException

    holding = {}
    for manifest in manifests:
        if not removed:
            break  # a live file is listed once
        paths = {e.data_file.file_path for e in manifest.fetch_manifest_entry(io, discard_deleted=True)}
        if not paths.isdisjoint(removed):
            holding[manifest.manifest_path] = manifest
            removed = {path: file for path, file in removed.items() if path not in paths}
    if removed:
        raise ValidationException(f"files to remove are not in the table any more: {sorted(removed)}")
    return holding


@functools.cache
def _delete_manifest_writer() -> type:
    """pyiceberg's manifest writer, writing a delete manifest (pyiceberg writes none)."""
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    return DeleteManifestWriter


def _added_entry(snapshot_id: int, data_file: Any) -> Any:
    from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus

    return ManifestEntry.from_args(
        status=ManifestEntryStatus.ADDED,
        snapshot_id=snapshot_id,
        sequence_number=None,
        file_sequence_number=None,
        data_file=data_file,
    )
