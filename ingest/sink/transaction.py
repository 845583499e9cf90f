"""pyiceberg transactions that compute their table's metadata once per staged step, not at every read.

pyiceberg 0.12's `Transaction.table_metadata` applies every staged update to the table's metadata again and
deep-copies the result each time it is read, and a write reads it many times: 52 times for the state table's offset
record (a delete and an append), 11 ms each on a table of 30 snapshots, half a second of every batch's commit. The
metadata models are frozen, so the copy made for a step is shared until the next update is staged, or the table
object moves to new metadata.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any


def open_transaction(table: Any) -> Any:
    """A transaction on the pyiceberg `table`, as `table.transaction()` opens."""
    return _transaction_class()(table)


@functools.cache
def _transaction_class() -> Any:
    # pyiceberg.table takes most of a second to import: not for a module that only names this one.
    from pyiceberg.table import Transaction

    class OnceTransaction(Transaction):
        _metadata_for: tuple[Any, Any, Any] | None = None

        @property
        def table_metadata(self) -> Any:
            base, updates = self._table.metadata, self._updates
            known = self._metadata_for
            if known is not None and known[0] is base and known[1] is updates:
                return known[2]
            metadata = super().table_metadata
            self._metadata_for = (base, updates, metadata)
            return metadata

    return OnceTransaction


def overwrite_files(transaction: Any, properties: dict[str, str], write_uuid: uuid.UUID) -> Any:
    """pyiceberg's overwrite of main in `transaction` (`update_snapshot(...).overwrite(...)`), whose snapshot leaves
    out the manifests that hold only removed files. pyiceberg writes the files an overwrite removes into a manifest
    of their own, and keeps it in every later snapshot: a table rewritten at every batch gains a manifest a batch,
    which every reader's planning opens, until maintenance merges them."""
    from pyiceberg.table.snapshots import Operation

    current = transaction.table_metadata.current_snapshot()
    return _overwrite_class()(
        commit_uuid=write_uuid,
        operation=Operation.OVERWRITE if current is not None else Operation.APPEND,
        transaction=transaction,
        io=transaction._table.io,
        snapshot_properties=properties,
    )


@functools.cache
def _overwrite_class() -> Any:
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class Overwrite(_OverwriteFiles):
        def _existing_manifests(self) -> list[Any]:
            return [m for m in super()._existing_manifests() if m.has_added_files() or m.has_existing_files()]

    return Overwrite
