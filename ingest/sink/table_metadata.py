"""Table metadata read once by the driver, and shared rather than deep-copied.

A table's metadata file holds every snapshot it keeps (a day of 5-second batches is 17,280 of them), and every
batch loaded each target from the catalog again, reading and parsing that file, then deep-copied it at each step of
its commit (pyiceberg's `update_table_metadata` copies the result whole). At 720 snapshots, an hour of batches,
that is 18 ms to parse and 29 ms per copy (bench/README.md, issue 66): a batch's cost grew with the hours the job
had run.

- A metadata file is never written twice (a commit writes a new one under a new name), so its content is what
  its location says: the metadata read from a location is kept, and the metadata the driver writes is kept under
  the location it wrote, so the next load of that table reads nothing. Only the newest of each table's metadata
  directory is kept, up to `MAX_TABLES` tables, the least recently used dropped first.
- The metadata models are frozen, and pyiceberg makes every change as a new model whose unchanged fields are the
  old one's (`model_copy(update=...)`, a shallow copy): nothing changes a model's lists or maps once it is built.
  The deep copy of a metadata object is therefore the object itself.

A catalog that sends the metadata in its answer (REST) reads no file: there only the copies are saved.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

MAX_TABLES = 1000
"""Tables whose newest metadata is kept: a job writes each of its targets, its changelogs and the state table."""


class MetadataFiles:
    """Metadata by location, the newest of each table's metadata directory, up to `max_tables` tables."""

    def __init__(self, max_tables: int) -> None:
        self._max = max_tables
        self._kept: OrderedDict[str, tuple[str, Any]] = OrderedDict()  # directory: (location, metadata)
        self._lock = threading.Lock()
        self.reads = self.hits = 0

    def get(self, location: str) -> Any | None:
        with self._lock:
            found = self._kept.get(_directory(location))
            if found is None or found[0] != location:
                return None
            self._kept.move_to_end(_directory(location))
            self.hits += 1
            return found[1]

    def put(self, location: str, metadata: Any, read: bool) -> None:
        with self._lock:
            self.reads += read
            directory = _directory(location)
            self._kept[directory] = (location, metadata)
            self._kept.move_to_end(directory)
            while len(self._kept) > self._max:
                self._kept.popitem(last=False)


def _directory(location: str) -> str:
    return location.rpartition("/")[0]


CACHE = MetadataFiles(MAX_TABLES)
_installing = threading.Lock()


def keep_table_metadata() -> None:
    """From now on, in this process, pyiceberg reads each metadata file at most once, not at all after writing it,
    and shares metadata instead of deep-copying it (idempotent)."""
    from pyiceberg.serializers import FromInputFile, ToOutputFile
    from pyiceberg.table.metadata import TableMetadataCommonFields

    with _installing:
        read, write = FromInputFile.table_metadata, ToOutputFile.table_metadata
        if getattr(read, "keeps_metadata", False):
            return

        def table_metadata_read(input_file: Any, encoding: str = "utf-8") -> Any:
            metadata = CACHE.get(input_file.location)
            if metadata is None:
                metadata = read(input_file, encoding)
                CACHE.put(input_file.location, metadata, read=True)
            return metadata

        def table_metadata_written(metadata: Any, output_file: Any, overwrite: bool = False) -> None:
            write(metadata, output_file, overwrite)
            CACHE.put(output_file.location, metadata, read=False)

        table_metadata_read.keeps_metadata = True  # type: ignore[attr-defined]
        FromInputFile.table_metadata = staticmethod(table_metadata_read)  # type: ignore[method-assign]
        ToOutputFile.table_metadata = staticmethod(table_metadata_written)  # type: ignore[method-assign]
        TableMetadataCommonFields.__deepcopy__ = _shared  # type: ignore[method-assign]


def _shared(self: Any, memo: dict[int, Any] | None = None) -> Any:
    """A frozen metadata model's deep copy: itself (see the module)."""
    return self
