"""The state table: each table's chunk plan and every chunk done, with its key range and high watermark.

An Iceberg table written with pyiceberg from the driver. It is written strictly after the data it
describes; the target's own snapshot summaries cover the gap (see sink/targets.py).

Plans and chunk rows are appended (bounded by the plan). The stream offset is one row per pipeline,
replaced in a single Iceberg commit per batch, and old snapshots are expired every few batches, so a
long stream keeps a constant number of live files and snapshots (FAILURES.md "Many small commits").
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ingest.config import SinkConfig
from ingest.errors import SinkError
from ingest.model.position import Watermark
from ingest.sink.atomic import Staged, staged
from ingest.sink.catalog import cached_pyiceberg_catalog
from ingest.sink.outage import SinkOutage
from ingest.source.snapshot.chunks import Chunk, decode_key, encode_key
from ingest.state.writes import KEEP_SNAPSHOTS, MAX_SNAPSHOTS, StateWrites, retry_commit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CutTables:
    """A cut's tables: per source table, its Iceberg table and the snapshot that holds it at the cut's offset (None:
    the table is empty at the cut, it has no snapshot yet); and the same of each changelog table in the cut."""

    targets: Mapping[str, tuple[str, int | None]]
    changelogs: Mapping[str, tuple[str, int | None]] = field(default_factory=dict)


# A cut row's chunk_index: whether it names the source table's target or its changelog table.
CUT_TARGET, CUT_CHANGELOG = 0, 1

KIND_PLAN = "plan"
KIND_CHUNK = "chunk"
KIND_OFFSET = "offset"
# The point a startup mode that copies nothing started from (one row per pipeline, never deleted): the pipeline
# has begun, so a run after `ingest resnapshot` of every table copies them instead of starting over.
KIND_START = "start"
# The cut recorded with the offset (one row per table in it; replaced with the offset row, in its commit).
KIND_CUT = "cut"
# Asked by `ingest snapshot` of a running job (or of the next run): copy a table now, or copy it again.
KIND_SIGNAL_SNAPSHOT = "signal:snapshot"
KIND_SIGNAL_AGAIN = "signal:again"
SIGNAL_KINDS = (KIND_SIGNAL_SNAPSHOT, KIND_SIGNAL_AGAIN)
# `ingest snapshot --pause`: a running job reads no chunk of the table until the row is deleted (--resume).
KIND_PAUSED = "signal:paused"

# pyiceberg honours these: appends merge small manifests, and old metadata.json files are deleted.
MAINTENANCE_PROPERTIES = {
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "4",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "8",
}
STATE_ARROW_SCHEMA = pa.schema(
    [
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("table_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("chunk_index", pa.int32(), nullable=False),
        pa.field("lower_key", pa.string()),
        pa.field("upper_key", pa.string()),
        pa.field("low_watermark", pa.string()),
        pa.field("high_watermark", pa.string()),
        pa.field("row_count", pa.int64()),
        pa.field("window_events", pa.int64()),
        pa.field("target_snapshot_id", pa.int64()),
        pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
        # Offset rows: when the source was at that position (the commit time of the batch's last
        # transaction, or when a heartbeat showed the source idle there); `ingest status` derives lag from it.
        pa.field("source_commit_time", pa.timestamp("us", tz="UTC")),
        # Cut rows: the Iceberg table (`namespace.name`) whose snapshot `target_snapshot_id` is in the cut.
        pa.field("iceberg_table", pa.string()),
    ]
)
# Columns added after the first release, added to older state tables when they are opened.
_ADDED_COLUMNS = ("source_commit_time", "iceberg_table")


@dataclass(frozen=True)
class Cut:
    """A point at which every table in it is whole: each Iceberg table at its snapshot holds every change of the
    source up to `offset`, and nothing after it. Recorded with the offset, in the same state-table commit."""

    offset: Watermark
    recorded_at: dt.datetime
    tables: dict[str, tuple[str, int | None]]
    """Per source table (`db.table`): its Iceberg table (`namespace.name`) and the snapshot id to read it at (None:
    the table is empty at the cut, it has no snapshot yet)."""
    changelogs: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    """Per source table whose changelog table is in the cut: that table and the snapshot to read it at."""


@dataclass(frozen=True)
class Requests:
    """What `ingest snapshot` asked of the job."""

    snapshot: dict[str, bool]
    """Tables to copy now, each with whether to drop what the job holds of it first (--again)."""
    paused: frozenset[str]
    """Tables whose chunks are not to be read until resumed."""


@dataclass(frozen=True)
class ChunkRecord:
    """A chunk whose rows are committed to the target."""

    chunk: Chunk
    high_watermark: Watermark | None
    low_watermark: Watermark | None = None
    row_count: int = 0
    window_events: int = 0
    target_snapshot_id: int | None = None


class StateTable:
    """What one pipeline's rows of the state table mean: plans, chunk records, the offset and its cut, requests
    (how they are written: `StateWrites`)."""

    def __init__(
        self,
        table: Any,
        pipeline: str,
        max_snapshots: int = MAX_SNAPSHOTS,
        keep_snapshots: int = KEEP_SNAPSHOTS,
        outage: SinkOutage | None = None,
    ) -> None:
        self._table = table
        self.pipeline = pipeline
        self._writes = StateWrites(table, STATE_ARROW_SCHEMA, outage or SinkOutage(0), max_snapshots, keep_snapshots)
        self._plans: dict[str, list[Chunk]] = {}
        self._planned_at: dict[str, Watermark | None] = {}
        self._offset: Watermark | None = None
        self._offset_source_time: int | None = None
        self._offset_recorded_at: dt.datetime | None = None
        self._done: dict[str, dict[int, list[ChunkRecord]]] = defaultdict(lambda: defaultdict(list))
        self._cut: Cut | None = None
        self._load()

    @property
    def outage(self) -> SinkOutage:
        """Waits out a sink that cannot be reached while this table, or a snapshot chunk's target, is written."""
        return self._writes.outage

    @classmethod
    def open(cls, sink: SinkConfig, pipeline: str, stopping: Callable[[], bool] = lambda: False) -> StateTable:
        """The state table, rows of the pipeline named `pipeline`, created if missing. Opening it, and each write
        and reload after, waits out a sink that cannot be reached for `sink.reconnect_seconds`; `stopping` is polled
        meanwhile, and true ends the wait (`OutageWaitStopped`)."""
        outage = SinkOutage(sink.reconnect_seconds, stopping)
        return outage.run("opening the state table", lambda _: cls(_load_or_create(sink), pipeline, outage=outage))

    def _load(self) -> None:
        self._planned_at.clear()
        self._done.clear()
        self._offset = self._offset_source_time = self._offset_recorded_at = None
        self._table.refresh()
        rows = self._table.scan(row_filter=f"pipeline = {_quote(self.pipeline)}").to_arrow().to_pylist()
        plans: dict[str, list[Chunk]] = defaultdict(list)
        cut_rows: list[dict[str, Any]] = []
        for r in sorted(rows, key=lambda r: (r["recorded_at"], r["chunk_index"])):
            chunk = Chunk(
                r["table_id"], r["chunk_index"], decode_key(_loads(r["lower_key"])), decode_key(_loads(r["upper_key"]))
            )
            if r["kind"] == KIND_PLAN:
                plans[r["table_id"]].append(chunk)
                self._planned_at[r["table_id"]] = _watermark(r["low_watermark"])
            elif r["kind"] == KIND_OFFSET:
                self._offset = _watermark(r["high_watermark"])
                source_time = r.get("source_commit_time")
                self._offset_source_time = None if source_time is None else int(source_time.timestamp())
                self._offset_recorded_at = r["recorded_at"]
            elif r["kind"] == KIND_CUT:
                cut_rows.append(r)
            elif r["kind"] == KIND_CHUNK:
                self._done[r["table_id"]][chunk.index].append(
                    ChunkRecord(
                        chunk,
                        _watermark(r["high_watermark"]),
                        _watermark(r["low_watermark"]),
                        r["row_count"] or 0,
                        r["window_events"] or 0,
                        r["target_snapshot_id"],
                    )
                )
        self._plans = {t: sorted(c, key=lambda c: c.index) for t, c in plans.items()}
        self._cut = _cut_of(cut_rows)

    def reload(self) -> None:
        """Read the table's current snapshot again: what other writers recorded since it was opened or reloaded."""
        self.outage.run("reading the state table", lambda _: self._load())

    def plan(self, table_id: str) -> list[Chunk] | None:
        return self._plans.get(table_id)

    def tables(self) -> list[str]:
        return sorted(self._plans)

    def unfinished(self, table_id: str) -> bool:
        """The table is planned and some of its chunks are not copied yet."""
        return len(self._done.get(table_id, {})) < len(self._plans.get(table_id) or [])

    def done(self, table_id: str) -> dict[int, ChunkRecord]:
        """The first record of each chunk done (a chunk recorded twice would be a bug the tests look for)."""
        return {i: records[0] for i, records in self._done[table_id].items()}

    def times_recorded(self, table_id: str) -> dict[int, int]:
        return {i: len(records) for i, records in self._done[table_id].items()}

    def stream_offset(self) -> Watermark | None:
        """The binlog position up to which every target has committed every change (None before streaming)."""
        return self._offset

    def offset_source_time(self) -> int | None:
        """Seconds since the epoch when the source was at the stream offset (None if not known)."""
        return self._offset_source_time

    def offset_recorded_at(self) -> dt.datetime | None:
        """When the job recorded the stream offset: its last binlog-phase commit."""
        return self._offset_recorded_at

    def record_offset(self, offset: Watermark, source_time: int | None = None, cut: CutTables | None = None) -> None:
        """Written strictly after all targets committed the batch ending at `offset`.

        The pipeline's offset row is replaced, not added: delete and append are one Iceberg commit, so a
        reader (or a crash) sees the old offset or the new one, never none and never both. With `cut` (per source
        table, its Iceberg table and its changelog table, each with the snapshot that holds it at `offset`), the
        cut's rows are replaced in the same commit: the cut a reader finds is always whole.
        """
        rows, ours, now = _offset_rows(self.pipeline, offset, source_time, cut)
        self._writes.replace("recording the offset", rows, ours)
        self._offset_recorded(offset, source_time, cut, now)

    def offset_change(
        self, offset: Watermark, source_time: int | None, cut: CutTables
    ) -> tuple[Staged, Callable[[], None]]:
        """`record_offset`'s commit staged, to land in one commit with the targets' (ingest.sink.atomic), and what
        to call once it has landed."""
        rows, ours, now = _offset_rows(self.pipeline, offset, source_time, cut)
        change = staged(self._writes.table, self._writes.staged_replace(rows, ours))
        return change, lambda: self._offset_recorded(offset, source_time, cut, now)

    def refresh(self) -> None:
        """Read the table's metadata again (after a commit with other tables that did not land)."""
        self._writes.table.refresh()

    def _offset_recorded(self, offset: Watermark, source_time: int | None, cut: CutTables | None, now: Any) -> None:
        self._offset, self._offset_source_time, self._offset_recorded_at = offset, source_time, now
        if cut is not None:
            self._cut = Cut(offset, now, dict(cut.targets), dict(cut.changelogs))
        try:
            self._writes.expire_snapshots()
        except Exception as e:  # noqa: BLE001 - maintenance must never fail a batch that is already recorded
            log.warning("state table: maintenance failed, will try again after a later batch: %s", e)

    def live_files(self) -> int:
        """Data files of the current state-table snapshot (for status and tests)."""
        return self._writes.live_files()

    def one_commit(self, hold_s: float | None = None) -> AbstractContextManager[None]:
        """Plans, chunk records and requests made inside are written in one commit (`StateWrites.one_commit`);
        inside, what this object says is already up to date."""
        return self._writes.one_commit(hold_s)

    def planned_at(self, table_id: str) -> Watermark | None:
        """The binlog position when the table was split: earlier than every chunk's high watermark."""
        return self._planned_at.get(table_id)

    def save_plan(self, table_id: str, chunks: list[Chunk], planned_at: Watermark) -> None:
        now = dt.datetime.now(dt.UTC)
        marker = ChunkRecord(chunks[0], None, planned_at)
        self._writes.append([_row(self.pipeline, KIND_PLAN, c, now, marker) for c in chunks])
        self._plans[table_id] = list(chunks)
        self._planned_at[table_id] = planned_at

    def record_start(self, table_ids: Sequence[str], start: Watermark) -> None:
        """Record that each table's target holds every change up to `start` (a startup mode that copies nothing:
        the target is created empty and the binlog is read from `start`), all tables in one commit.

        Each table gets a plan of one chunk over its whole key space, recorded done with `start` as its high
        watermark: the binlog phase then starts at `start` and applies exactly the changes after it, by the
        rules of a copied table (the high-watermark filter), and a run that restarts before its first commit
        starts there again; a run that has committed resumes from its offset as usual. A pipeline row records
        `start` too, so that the pipeline counts as begun even once `ingest resnapshot` has forgotten every table.
        """
        now = dt.datetime.now(dt.UTC)
        marker = Chunk("*", -1, None, None)
        rows = [_row(self.pipeline, KIND_START, marker, now, ChunkRecord(marker, start))]
        for table_id in table_ids:
            chunk = Chunk(table_id, 0, None, None)
            rows.append(_row(self.pipeline, KIND_PLAN, chunk, now, ChunkRecord(chunk, None, start)))
            rows.append(_row(self.pipeline, KIND_CHUNK, chunk, now, ChunkRecord(chunk, start, start)))
        self._writes.append(rows)
        for table_id in table_ids:
            chunk = Chunk(table_id, 0, None, None)
            self._plans[table_id] = [chunk]
            self._planned_at[table_id] = start
            self._done[table_id][0].append(ChunkRecord(chunk, start, start))

    def record_chunks(self, records: list[ChunkRecord]) -> None:
        if not records:
            return
        now = dt.datetime.now(dt.UTC)
        self._writes.append([_row(self.pipeline, KIND_CHUNK, r.chunk, now, r) for r in records])
        for r in records:
            self._done[r.chunk.table_id][r.chunk.index].append(r)

    def forget(self, table_id: str) -> None:
        """Delete the table's plan and chunk records, and its place in the cut (one commit): its next run plans and
        snapshots it again."""
        self._writes.delete(f"pipeline = {_quote(self.pipeline)} AND table_id = {_quote(table_id)}")
        self._plans.pop(table_id, None)
        self._planned_at.pop(table_id, None)
        self._done.pop(table_id, None)
        if self._cut is not None:
            self._cut.tables.pop(table_id, None)
            self._cut.changelogs.pop(table_id, None)

    def ask_snapshot(self, table_ids: Sequence[str], again: bool) -> None:
        """Ask the job to snapshot `table_ids` (again: drop what it holds of them first), in one commit."""
        now = dt.datetime.now(dt.UTC)
        kind = KIND_SIGNAL_AGAIN if again else KIND_SIGNAL_SNAPSHOT
        self._writes.append([_row(self.pipeline, kind, Chunk(t, 0, None, None), now) for t in table_ids])

    def requests(self) -> Requests:
        """What `ingest snapshot` asked that no job has taken yet, read from the table's current snapshot (not
        from what was loaded when it was opened)."""
        self._table.refresh()
        kinds = ", ".join(_quote(k) for k in (*SIGNAL_KINDS, KIND_PAUSED))
        rows = self._table.scan(
            row_filter=f"pipeline = {_quote(self.pipeline)} AND kind IN ({kinds})", selected_fields=("table_id", "kind")
        ).to_arrow()
        asked: dict[str, bool] = {}
        paused = set()
        for table_id, kind in zip(rows.column("table_id").to_pylist(), rows.column("kind").to_pylist(), strict=True):
            if kind == KIND_PAUSED:
                paused.add(table_id)
            else:
                asked[table_id] = asked.get(table_id, False) or kind == KIND_SIGNAL_AGAIN
        return Requests(asked, frozenset(paused))

    def pause(self, table_ids: Sequence[str]) -> None:
        paused = self.requests().paused
        now = dt.datetime.now(dt.UTC)
        rows = [_row(self.pipeline, KIND_PAUSED, Chunk(t, 0, None, None), now) for t in table_ids if t not in paused]
        if rows:
            self._writes.append(rows)

    def resume(self, table_ids: Sequence[str]) -> None:
        tables = ", ".join(_quote(t) for t in table_ids)
        self._writes.delete(
            f"pipeline = {_quote(self.pipeline)} AND kind = {_quote(KIND_PAUSED)} AND table_id IN ({tables})"
        )

    def drop_signals(self, table_id: str) -> None:
        """The requests to copy one table are taken (`forget` drops them too, with the rest of the table's state,
        a pause included)."""
        kinds = ", ".join(_quote(k) for k in SIGNAL_KINDS)
        self._writes.delete(
            f"pipeline = {_quote(self.pipeline)} AND table_id = {_quote(table_id)} AND kind IN ({kinds})"
        )

    def cut(self) -> Cut | None:
        """The newest cut recorded (None before the binlog phase's first commit)."""
        return self._cut

    def forget_offset(self) -> None:
        """Delete the pipeline's binlog offset, and the cut with it: with every table snapshotted again, none holds
        what they say."""
        kinds = ", ".join(_quote(k) for k in (KIND_OFFSET, KIND_CUT))
        self._writes.delete(f"pipeline = {_quote(self.pipeline)} AND kind IN ({kinds})")
        self._cut = None
        self._offset = None
        self._offset_source_time = None
        self._offset_recorded_at = None


def pipeline_is_new(sink: SinkConfig, pipeline: str) -> bool:
    """Whether the pipeline has recorded nothing yet (no plan, no offset, no start): its first run. Reads only,
    so it may be asked before anything is written (the state table is not created here)."""
    from pyiceberg.exceptions import NoSuchTableError

    namespace, _, name = sink.state_table.rpartition(".")
    try:
        table = cached_pyiceberg_catalog(sink).load_table((namespace, name))
    except NoSuchTableError:
        return True
    kinds = ", ".join(_quote(k) for k in (KIND_PLAN, KIND_OFFSET, KIND_START))
    rows = table.scan(
        row_filter=f"pipeline = {_quote(pipeline)} AND kind IN ({kinds})", selected_fields=("kind",), limit=1
    ).to_arrow()
    return bool(rows.num_rows == 0)


def _load_or_create(sink: SinkConfig) -> Any:
    """The pyiceberg table `sink.state_table`, created if missing, and brought up to this release (its columns and
    maintenance properties)."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

    catalog = cached_pyiceberg_catalog(sink)  # the one run() opened first, before Spark
    namespace, _, name = sink.state_table.rpartition(".")
    try:
        table = catalog.load_table((namespace, name))
    except NoSuchTableError:
        try:
            catalog.create_namespace(namespace)
        except NamespaceAlreadyExistsError:
            pass
        try:
            table = catalog.create_table(
                (namespace, name),
                schema=STATE_ARROW_SCHEMA,
                properties={"format-version": "2", **MAINTENANCE_PROPERTIES},
            )
        except TableAlreadyExistsError:
            table = catalog.load_table((namespace, name))
    _add_missing_columns(table)
    missing = {k: v for k, v in MAINTENANCE_PROPERTIES.items() if table.properties.get(k) != v}
    if missing:  # a state table created by an older version
        retry_commit(table, lambda: table.transaction().set_properties(missing).commit_transaction())
    return table


def _quote(value: str) -> str:
    """A string literal of pyiceberg's filter syntax."""
    return "'" + value.replace("'", "''") + "'"


def _offset_rows(
    pipeline: str, offset: Watermark, source_time: int | None, cut: CutTables | None
) -> tuple[pa.Table, str, dt.datetime]:
    """The pipeline's offset row (and its cut's rows), the filter of the rows they replace, and when."""
    now = dt.datetime.now(dt.UTC)
    marker = Chunk("*", -1, None, None)
    row = _row(pipeline, KIND_OFFSET, marker, now, ChunkRecord(marker, offset))
    if source_time is not None:
        row["source_commit_time"] = dt.datetime.fromtimestamp(source_time, dt.UTC)
    rows = [row, *_cut_rows(pipeline, now, offset, cut or CutTables({}))]
    kinds = (KIND_OFFSET,) if cut is None else (KIND_OFFSET, KIND_CUT)
    ours = f"pipeline = {_quote(pipeline)} AND kind IN ({', '.join(_quote(k) for k in kinds)})"
    return pa.Table.from_pylist(rows, schema=STATE_ARROW_SCHEMA), ours, now


def _cut_rows(pipeline: str, now: dt.datetime, offset: Watermark, cut: CutTables) -> list[dict[str, Any]]:
    rows = []
    for role, tables in ((CUT_TARGET, cut.targets), (CUT_CHANGELOG, cut.changelogs)):
        for table_id, (name, snapshot_id) in sorted(tables.items()):
            at = Chunk(table_id, role, None, None)
            row = _row(pipeline, KIND_CUT, at, now, ChunkRecord(at, offset, target_snapshot_id=snapshot_id))
            rows.append({**row, "iceberg_table": name})
    return rows


def _cut_of(rows: Sequence[dict[str, Any]]) -> Cut | None:
    """The cut the state table's cut rows hold (all written in one commit, at one offset)."""
    if not rows:
        return None
    offset = _watermark(rows[0]["high_watermark"])
    assert offset is not None
    tables, changelogs = (
        {r["table_id"]: (r["iceberg_table"], r["target_snapshot_id"]) for r in rows if r["chunk_index"] == role}
        for role in (CUT_TARGET, CUT_CHANGELOG)
    )
    return Cut(offset, rows[0]["recorded_at"], tables, changelogs)


def _add_missing_columns(table: Any) -> None:
    """Evolve a state table created by an older release (adding optional columns is always safe)."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.types import StringType, TimestamptzType

    types = {"source_commit_time": TimestamptzType, "iceberg_table": StringType}

    for _ in range(3):
        have = {f.name for f in table.schema().fields}
        missing = [c for c in _ADDED_COLUMNS if c not in have]
        if not missing:
            return
        try:
            with table.update_schema() as update:
                for name in missing:
                    update.add_column(name, types[name]())
            return
        except CommitFailedException:
            table.refresh()  # another job evolved it at the same time
    raise SinkError(f"cannot add columns {missing} to the state table: other writers kept changing its schema")


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _watermark(text: str | None) -> Watermark | None:
    return None if text is None else Watermark.from_json(json.loads(text))


def _row(pipeline: str, kind: str, chunk: Chunk, now: dt.datetime, record: ChunkRecord | None = None) -> dict[str, Any]:
    def wm(w: Watermark | None) -> str | None:
        return None if w is None else json.dumps(w.to_json(), sort_keys=True)

    return {
        "pipeline": pipeline,
        "table_id": chunk.table_id,
        "kind": kind,
        "chunk_index": chunk.index,
        "lower_key": None if chunk.lower is None else json.dumps(encode_key(chunk.lower)),
        "upper_key": None if chunk.upper is None else json.dumps(encode_key(chunk.upper)),
        "low_watermark": wm(record.low_watermark) if record else None,
        "high_watermark": wm(record.high_watermark) if record else None,
        "row_count": record.row_count if record else None,
        "window_events": record.window_events if record else None,
        "target_snapshot_id": record.target_snapshot_id if record else None,
        "recorded_at": now,
        "source_commit_time": None,
        "iceberg_table": None,
    }
