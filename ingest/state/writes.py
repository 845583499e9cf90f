"""How the state table is written: each write one Iceberg commit, made again after a conflict or a sink that was
away without landing twice; rows held to share one commit (`one_commit`); old snapshots expired."""

from __future__ import annotations

import itertools
import logging
import time
import uuid
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from ingest import metrics
from ingest.faults import crash_point
from ingest.sink.outage import SinkOutage
from ingest.sink.transaction import open_transaction, overwrite_files

log = logging.getLogger(__name__)

# Expire state-table snapshots once there are more than MAX_SNAPSHOTS, down to the newest KEEP_SNAPSHOTS.
# Only the current snapshot is ever read, so this loses nothing; keeping a few helps debugging.
MAX_SNAPSHOTS = 24
KEEP_SNAPSHOTS = 4
COMMIT_ATTEMPTS = 4
SUMMARY_WRITE = "ingest.state.write"
"""The snapshot summary key of a state-table append's own id (`StateWrites._write`)."""


class StateWrites:
    """The writes of one state table (a pyiceberg table of rows of `schema`)."""

    def __init__(
        self,
        table: Any,
        schema: pa.Schema,
        outage: SinkOutage,
        max_snapshots: int = MAX_SNAPSHOTS,
        keep_snapshots: int = KEEP_SNAPSHOTS,
    ) -> None:
        self.table = table
        self.schema = schema
        self.outage = outage
        """Waits out a catalog or object store that cannot be reached while the table is written."""
        self.max_snapshots = max_snapshots
        self.keep_snapshots = keep_snapshots
        self._pending: list[dict[str, Any]] | None = None
        """Rows appended inside `one_commit`, written when it ends."""
        self._hold: tuple[float, float] | None = None
        """Inside `one_commit(hold_s=...)`: how long rows may wait, and since when the oldest waits."""

    def replace(self, what: str, rows: pa.Table, where: str) -> None:
        """The rows `where` matches replaced by `rows`, in one commit: a reader (or a crash) sees the old rows or
        the new ones, never none and never both. Run again whole if the sink was away: landing twice leaves one."""
        self.flush()
        self.commit(what, lambda: self._overwrite(rows, where).commit_transaction())

    def staged_replace(self, rows: pa.Table, where: str) -> Any:
        """`replace`'s transaction, not committed: it lands with other tables' changes (ingest.sink.atomic)."""
        self.flush()
        return self._overwrite(rows, where)

    def _overwrite(self, rows: pa.Table, where: str) -> Any:
        """One snapshot (pyiceberg's `overwrite` makes a delete and an append, two): each file holding a row `where`
        matches replaced by its other rows, and `rows` added. The files are small: the offset's own, mostly."""
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.expressions.visitors import bind
        from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files, _expression_to_complementary_pyarrow
        from pyiceberg.table import _parse_row_filter

        transaction = open_transaction(self.table)
        metadata = transaction.table_metadata
        matching = _parse_row_filter(where)
        others = _expression_to_complementary_pyarrow(bind(metadata.schema(), matching, True), metadata.schema())
        scan = ArrowScan(metadata, self.table.io, metadata.schema(), AlwaysTrue())
        write_uuid, counter = uuid.uuid4(), itertools.count(0)
        with overwrite_files(transaction, {}, write_uuid) as overwrite:
            for task in self.table.scan(row_filter=matching).plan_files():
                held = scan.to_table(tasks=[task])
                kept = held.filter(others)
                if kept.num_rows == held.num_rows:
                    continue
                overwrite.delete_data_file(task.file)
                rows = pa.concat_tables([kept.cast(rows.schema), rows]) if kept.num_rows else rows
            for data_file in _dataframe_to_data_files(metadata, rows, self.table.io, write_uuid, counter):
                overwrite.append_data_file(data_file)
        return transaction

    @contextmanager
    def one_commit(self, hold_s: float | None = None) -> Iterator[None]:
        """Plans and chunk records made inside are written in one commit when the block ends, also when it raises
        (each stands for what was done before it), but not if the process dies first: they are then planned again,
        or found in the targets' snapshot summaries (`reconcile`), as after a crash between a target's commit and
        its record. Many small tables each cost a commit otherwise. Inside, what this object says is already
        up to date; other writes (deletes, the offset) write the pending rows first, keeping their order.

        With `hold_s`, a row is not held longer than that: the first one appended after it has waited so long
        writes them all (`ingest status` and the metrics then see a long copy go on)."""
        if self._pending is not None:
            yield  # inside an outer block: its commit takes these too
            return
        self._pending = []
        self._hold = None if hold_s is None else (hold_s, 0.0)
        try:
            yield
        finally:
            self.flush()
            self._pending = None
            self._hold = None

    def flush(self) -> None:
        """Write the rows `one_commit` holds so far (its block stays open)."""
        if self._pending:
            rows, self._pending = self._pending, []
            self._write(rows)

    def delete(self, rows: str) -> None:
        self.flush()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Delete operation did not match any records")
            self.commit("deleting from the state table", lambda: self.table.delete(rows))

    def append(self, rows: list[dict[str, Any]]) -> None:
        if self._pending is None:
            self._write(rows)
            return
        if not self._pending and self._hold is not None:
            self._hold = (self._hold[0], time.monotonic())  # the oldest row waits from now
        self._pending.extend(rows)
        if self._hold is not None and time.monotonic() - self._hold[1] >= self._hold[0]:
            self.flush()

    def _write(self, rows: list[dict[str, Any]]) -> None:
        """Append `rows` in one commit. A commit cut off by the sink is run again only if it did not land: each
        carries its own id in its snapshot summary, looked for first (appended twice, a plan would hold its
        chunks twice)."""
        data = pa.Table.from_pylist(rows, schema=self.schema)
        write_id = uuid.uuid4().hex
        self.commit(
            "writing the state table",
            lambda: self.table.append(data, snapshot_properties={SUMMARY_WRITE: write_id}),
            landed=lambda: self._holds(write_id),
        )

    def commit(self, what: str, commit: Callable[[], Any], landed: Callable[[], bool] = lambda: False) -> None:
        """Run a commit; again from fresh metadata on a conflict (`_retry_commit`), and after the sink could not
        be reached (`self.outage`, within `sink.reconnect_seconds`), unless `landed()` says the cut-off one did:
        without `landed`, `commit` must give the same result when run again."""

        def attempt(again: bool) -> None:
            if again:
                self.table.refresh()
                if landed():
                    return
            retry_commit(self.table, commit)

        self.outage.run(what, attempt)

    def _holds(self, write_id: str) -> bool:
        """A snapshot of the table's history was committed by the write `write_id` (expiry keeps the newest
        `KEEP_SNAPSHOTS` and only after an offset is recorded, so a write cut off just now is still there)."""
        from pyiceberg.table.snapshots import ancestors_of

        return any(
            s.summary is not None and s.summary.additional_properties.get(SUMMARY_WRITE) == write_id
            for s in ancestors_of(self.table.current_snapshot(), self.table.metadata)
        )

    def expire_snapshots(self) -> list[int]:
        """Expire old state-table snapshots once there are too many; return the ids expired.

        Best effort: expiry is one commit that only drops history (the current snapshot, which holds every
        row this class reads, is never expired), so a crash or a conflict here loses nothing.
        """
        from pyiceberg.exceptions import CommitFailedException

        table = self.table
        protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
        expired = snapshots_to_expire(
            [(s.snapshot_id, s.sequence_number) for s in table.snapshots()],
            protected,
            self.keep_snapshots,
            self.max_snapshots,
        )
        if not expired:
            return []
        gone = set(expired)
        unreferenced = _files_of(table, [s for s in table.snapshots() if s.snapshot_id in gone]) - _files_of(
            table, [s for s in table.snapshots() if s.snapshot_id not in gone]
        )
        crash_point("state.before_expire")
        try:
            table.maintenance.expire_snapshots().by_ids(expired).commit()
        except CommitFailedException as e:
            log.info("state table: snapshot expiry skipped this time (%s)", e)
            table.refresh()
            return []
        crash_point("state.after_expire")
        # pyiceberg's expiry only edits metadata; the files no retained snapshot references are ours to delete.
        # A crash before (or during) this loop leaves orphans behind, never a missing file.
        for path in sorted(unreferenced):
            try:
                table.io.delete(path)
            except Exception as e:  # noqa: BLE001 - an orphan left behind is harmless
                log.debug("state table: could not delete %s: %s", path, e)
        log.debug("state table: expired %d snapshots, deleted %d files", len(expired), len(unreferenced))
        return expired

    def live_files(self) -> int:
        """Data files of the current state-table snapshot (for status and tests)."""
        return len(self.table.scan().plan_files())


def snapshots_to_expire(
    snapshots: Sequence[tuple[int, int]], protected: Collection[int], keep: int, max_snapshots: int
) -> list[int]:
    """Ids of (snapshot id, sequence number) pairs to expire: none while there are at most `max_snapshots`,
    else all but the newest `keep`; a protected snapshot (a branch or tag head) is never expired."""
    if len(snapshots) <= max_snapshots:
        return []
    newest_first = sorted(snapshots, key=lambda s: s[1], reverse=True)
    return sorted(sid for sid, _ in newest_first[max(keep, 1) :] if sid not in protected)


def _files_of(table: Any, snapshots: Sequence[Any]) -> set[str]:
    """Manifest lists, manifests and data files (live or deleted entries alike) the snapshots reference."""
    files: set[str] = set()
    for snapshot in snapshots:
        files.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            files.add(manifest.manifest_path)
            files.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=False))
    return files


def retry_commit(table: Any, commit: Callable[[], Any]) -> None:
    """Run a pyiceberg commit; on a conflict (another pipeline sharing the state table committed first, or
    `ingest snapshot` added a row a delete's filter matches: pyiceberg refuses that delete, which would leave
    the row) refresh and run it again from fresh metadata, never reusing the failed one."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            commit()
            return
        except (CommitFailedException, ValidationException):
            if attempt == COMMIT_ATTEMPTS:
                raise
            metrics.current().commit_retried(".".join(table.name()))
            log.info("state table: commit conflict at attempt %d, retrying from fresh metadata", attempt)
            table.refresh()
            time.sleep(0.1 * attempt)
