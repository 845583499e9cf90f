"""The state table: each table's chunk plan and every chunk done, with its key range and high watermark.

An append-only Iceberg table written with pyiceberg from the driver. It is written strictly after the
data it describes; the target's own snapshot summaries cover the gap (see sink/targets.py).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ingest.config import PipelineConfig
from ingest.errors import SinkError
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.source.chunks import Chunk, decode_key, encode_key
from ingest.source.position import Watermark

log = logging.getLogger(__name__)

KIND_PLAN = "plan"
KIND_CHUNK = "chunk"
KIND_OFFSET = "offset"

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
    ]
)
# Columns added after the first release, added to older state tables when they are opened.
_ADDED_COLUMNS = ("source_commit_time",)


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
    """Plans and chunk records of one pipeline."""

    def __init__(self, table: Any, pipeline: str) -> None:
        self._table = table
        self.pipeline = pipeline
        self._plans: dict[str, list[Chunk]] = {}
        self._planned_at: dict[str, Watermark | None] = {}
        self._offset: Watermark | None = None
        self._offset_source_time: int | None = None
        self._offset_recorded_at: dt.datetime | None = None
        self._done: dict[str, dict[int, list[ChunkRecord]]] = defaultdict(lambda: defaultdict(list))
        self._load()

    @classmethod
    def open(cls, config: PipelineConfig) -> StateTable:
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

        catalog = load_pyiceberg_catalog(config.sink)
        namespace, _, name = config.sink.state_table.rpartition(".")
        try:
            table = catalog.load_table((namespace, name))
        except NoSuchTableError:
            try:
                catalog.create_namespace(namespace)
            except NamespaceAlreadyExistsError:
                pass
            try:
                table = catalog.create_table(
                    (namespace, name), schema=STATE_ARROW_SCHEMA, properties={"format-version": "2"}
                )
            except TableAlreadyExistsError:
                table = catalog.load_table((namespace, name))
        _add_missing_columns(table)
        return cls(table, config.name)

    def _load(self) -> None:
        self._table.refresh()
        rows = self._table.scan(row_filter=f"pipeline = '{self.pipeline}'").to_arrow().to_pylist()
        plans: dict[str, list[Chunk]] = defaultdict(list)
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

    def plan(self, table_id: str) -> list[Chunk] | None:
        return self._plans.get(table_id)

    def tables(self) -> list[str]:
        return sorted(self._plans)

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

    def record_offset(self, offset: Watermark, source_time: int | None = None) -> None:
        """Written strictly after all targets committed the batch ending at `offset`."""
        now = dt.datetime.now(dt.UTC)
        row = _row(
            self.pipeline,
            KIND_OFFSET,
            Chunk("*", -1, None, None),
            now,
            ChunkRecord(Chunk("*", -1, None, None), offset),
        )
        if source_time is not None:
            row["source_commit_time"] = dt.datetime.fromtimestamp(source_time, dt.UTC)
        self._append([row])
        self._offset = offset
        self._offset_source_time = source_time
        self._offset_recorded_at = now

    def planned_at(self, table_id: str) -> Watermark | None:
        """The binlog position when the table was split: earlier than every chunk's high watermark."""
        return self._planned_at.get(table_id)

    def save_plan(self, table_id: str, chunks: list[Chunk], planned_at: Watermark) -> None:
        now = dt.datetime.now(dt.UTC)
        marker = ChunkRecord(chunks[0], None, planned_at)
        self._append([_row(self.pipeline, KIND_PLAN, c, now, marker) for c in chunks])
        self._plans[table_id] = list(chunks)
        self._planned_at[table_id] = planned_at

    def record_chunks(self, records: list[ChunkRecord]) -> None:
        if not records:
            return
        now = dt.datetime.now(dt.UTC)
        self._append([_row(self.pipeline, KIND_CHUNK, r.chunk, now, r) for r in records])
        for r in records:
            self._done[r.chunk.table_id][r.chunk.index].append(r)

    def _append(self, rows: list[dict[str, Any]]) -> None:
        self._table.append(pa.Table.from_pylist(rows, schema=STATE_ARROW_SCHEMA))


def _add_missing_columns(table: Any) -> None:
    """Evolve a state table created by an older release (adding optional columns is always safe)."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.types import TimestamptzType

    for _ in range(3):
        have = {f.name for f in table.schema().fields}
        missing = [c for c in _ADDED_COLUMNS if c not in have]
        if not missing:
            return
        try:
            with table.update_schema() as update:
                for name in missing:
                    update.add_column(name, TimestamptzType())
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
    }
