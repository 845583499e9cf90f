"""Manifest files read once by the driver: their entries kept by what they are.

A batch reads the same manifests several times per target (the scan that finds the rows the batch touches, then
the snapshot producers of its overwrite and its delete), and every batch reads again the manifests the batches
before it left. pyiceberg reads and decodes each from storage every time: at 500 changes/s, 40 % of the driver's
CPU (py-spy, bench.steady; issue 66).

A manifest file is never written twice (a new one gets a new name), so its entries are what its path says, but for
what reading adds from the manifest list's entry for it (the snapshot id and sequence numbers its entries inherit,
its partition spec): the key holds those too. The entries are shared between readers, as pyiceberg's own cache of
manifest lists shares its manifests: nothing in pyiceberg or here changes an entry once it is read (a changed
status is a copy). Kept up to `MAX_ENTRIES` entries, the least recently read dropped first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

MAX_ENTRIES = 250_000
"""About a kilobyte each: a quarter of a GiB at most in the driver."""

_Key = tuple[str, Any, Any, Any, bool]


class ManifestEntries:
    """Entries of manifest files by key, up to `max_entries` in all (a manifest larger than that is not kept)."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._kept: OrderedDict[_Key, list[Any]] = OrderedDict()
        self._entries = 0
        self._lock = threading.Lock()
        self.reads = self.hits = 0

    def get(self, key: _Key) -> list[Any] | None:
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
                self.hits += 1
            return found

    def put(self, key: _Key, entries: list[Any]) -> None:
        with self._lock:
            self.reads += 1
            if key in self._kept or len(entries) > self._max:
                return
            self._kept[key] = entries
            self._entries += len(entries)
            while self._entries > self._max:
                _, dropped = self._kept.popitem(last=False)
                self._entries -= len(dropped)


CACHE = ManifestEntries(MAX_ENTRIES)
_installing = threading.Lock()


def keep_manifest_entries() -> None:
    """From now on, pyiceberg reads each manifest file's entries once in this process (idempotent)."""
    from pyiceberg.manifest import ManifestFile

    with _installing:
        read = ManifestFile.fetch_manifest_entry
        if getattr(read, "keeps_entries", False):
            return

        def fetch_manifest_entry(self: ManifestFile, io: Any, discard_deleted: bool = True) -> list[Any]:
            key = (
                self.manifest_path,
                self.added_snapshot_id,
                self.sequence_number,
                self.partition_spec_id,
                discard_deleted,
            )
            entries = CACHE.get(key)
            if entries is None:
                entries = read(self, io, discard_deleted)
                CACHE.put(key, entries)
            return list(entries)  # the list is the caller's

        fetch_manifest_entry.keeps_entries = True  # type: ignore[attr-defined]
        ManifestFile.fetch_manifest_entry = fetch_manifest_entry  # type: ignore[method-assign]
