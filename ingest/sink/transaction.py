"""pyiceberg transactions that compute their table's metadata once per staged step, not at every read.

pyiceberg 0.12's `Transaction.table_metadata` applies every staged update to the table's metadata again and
deep-copies the result each time it is read, and a write reads it many times: 52 times for the state table's offset
record (a delete and an append), 11 ms each on a table of 30 snapshots, half a second of every batch's commit. The
metadata models are frozen, so the copy made for a step is shared until the next update is staged, or the table
object moves to new metadata.
"""

from __future__ import annotations

import functools
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
