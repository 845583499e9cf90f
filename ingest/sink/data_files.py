"""Iceberg data files written from Arrow by pyiceberg, on an executor or in the driver, and appended in one commit.

Spark writes a DataFrame's rows through its JVM: the chunks' Arrow batches become Spark rows, then Parquet again.
That conversion was most of the snapshot's CPU. A `DataFileWriter` is pickled to the executors with the table's
metadata and FileIO; each writes its chunks' Arrow straight to Parquet data files and returns their descriptions,
and the driver appends them all in one commit (`append_files`).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from ingest.errors import CommitConflictError
from ingest.sink.transaction import open_transaction

log = logging.getLogger(__name__)


def writable_from_arrow(table: Any) -> bool:
    """Whether pyiceberg writes this target as Spark would: a format 2 (or 1) unpartitioned table of Parquet
    files. pyiceberg writes no format 3 table, computes bucket transforms only with a native extension the job does
    not install, and writes only Parquet."""
    return bool(
        table.format_version <= 2
        and table.spec().is_unpartitioned()
        and table.properties.get("write.format.default", "parquet").lower() == "parquet"
    )


class DataFileWriter:
    """Writes Arrow tables to data files of one target. In the driver it uses the table's own metadata and FileIO;
    pickled to the executors it goes as the metadata's JSON text and the FileIO's properties, which it loads when it
    first writes (unpickling it imports no pyiceberg)."""

    metadata_json: str
    io_properties: dict[str, str]

    def __init__(self, table: Any) -> None:
        self._parts: tuple[Any, Any] | None = (table.metadata, table.io)

    def __getstate__(self) -> dict[str, Any]:
        metadata, io = self._metadata_and_io()
        return {"metadata_json": metadata.model_dump_json(), "io_properties": dict(io.properties)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _parts=None)

    def _metadata_and_io(self) -> tuple[Any, Any]:
        if self._parts is None:
            from pyiceberg.io import load_file_io
            from pyiceberg.table.metadata import TableMetadataUtil

            metadata = TableMetadataUtil.parse_raw(self.metadata_json)
            self._parts = (metadata, load_file_io(self.io_properties, metadata.location))
        return self._parts

    def conform(self, rows: pa.Table) -> pa.Table:
        """`rows` by name, in the target's order, as its types; a NULL in a required column fails here."""
        schema = self._metadata_and_io()[0].schema()
        return rows.select([f.name for f in schema.fields]).cast(schema.as_arrow())

    def write(self, tables: Iterable[pa.Table], rows_per_batch: int) -> list[Any]:
        """The data files holding `tables`, one after another (pyiceberg's `DataFile`s, not committed). The tables
        are written as they come, into files of the target's `write.target-file-size-bytes`."""
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        metadata, io = self._metadata_and_io()
        schema = metadata.schema().as_arrow()

        def batches() -> Iterator[pa.RecordBatch]:
            for table in tables:
                yield from self.conform(table).to_batches(max_chunksize=rows_per_batch)

        reader = pa.RecordBatchReader.from_batches(schema, batches())
        return list(_dataframe_to_data_files(metadata, reader, io, uuid.uuid4(), itertools.count(0)))


def append_files(table: Any, files: list[Any], properties: dict[str, str], branch: str) -> None:
    """One append snapshot of `files` on `branch`, tagged with `properties`; `table` is left at the metadata it
    committed. A commit another writer beat (pyiceberg's `CommitFailedException`: nothing was committed) is tried
    again on fresh metadata, as Spark's append does."""
    from pyiceberg.exceptions import CommitFailedException

    from ingest.sink.merge import MAX_ATTEMPTS  # here: executors import this module, and merge costs them 0.4 s

    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with open_transaction(table) as transaction:
                update = transaction.update_snapshot(snapshot_properties=properties, branch=branch)
                with update.fast_append() as append:
                    for data_file in files:
                        append.append_data_file(data_file)
            return
        except CommitFailedException as e:
            log.warning("%s: append conflict at attempt %d, retrying on fresh metadata: %s", table.name(), attempt, e)
            table.refresh()
            time.sleep(0.2 * attempt)
    raise CommitConflictError(
        f"{table.name()}: an append kept conflicting with other writers after {MAX_ATTEMPTS} tries"
    )
