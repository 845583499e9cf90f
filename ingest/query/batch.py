"""A binlog batch turned into what its commits write, per table (`prepare_batch`).

What the target and its changelog hold already is skipped, each by its own committed offset; so is what the
table's snapshot chunks hold (the chunk high-watermark filter of Flink CDC 2.0, for changes inside the
snapshot's window). Each key is folded to its final state (the materializer), values Iceberg cannot hold are
split off (`on_unrepresentable`), and what is left becomes Arrow tables: the target's rows with the part of the
target a MERGE of them reads, and the changelog rows. The job's query
prepares its batches in the binlog source's own Python process, so that the driver gets Arrow tables to commit.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ingest.changes.changelog import SourceChange, changelog_rows
from ingest.changes.key_actions import act_on_changes
from ingest.changes.materializer import Change, created_keys, materialize
from ingest.changes.rejects import split_rejected
from ingest.config import SourceConfig, StreamConfig, TableSelection, Targets
from ingest.errors import SourceError
from ingest.model.changes import ForeignKey, KeyAction, RejectedValue, RowChange, Transaction
from ingest.model.position import BinlogPosition
from ingest.model.schema import TableSchema
from ingest.sink.changelog import changelog_arrow
from ingest.sink.merge import (
    alike_arrow,
    batch_arrow,
    batch_where,
)
from ingest.source.snapshot.chunk_reader import in_chunk
from ingest.source.snapshot.chunks import Chunk, Key


@dataclass(frozen=True)
class Streaming:
    """What the binlog phase takes from the pipeline file: the source it reads, the tables it captures (a DDL
    naming another table they match adds it), how it batches and follows DDL (`stream`), how many chunks a chunk
    batch reads (`snapshot.chunks_per_commit`), and the tables it writes."""

    source: SourceConfig
    tables: TableSelection
    stream: StreamConfig
    chunks_per_commit: int
    targets: Targets


@dataclass
class TableStream:
    """What the binlog phase knows about one captured table."""

    schema: TableSchema
    target: str
    """The Spark name the phase writes the table to: its copy branch while it is copied again (sink/recopy.py)."""
    chunks: list[Chunk]
    chunk_highs: list[BinlogPosition | None]
    """Per chunk, the high watermark it was read at; None while a snapshot asked of the running job has not
    read it yet (it will hold every change until then: the binlog phase drops them all)."""
    committed: BinlogPosition | None
    """The newest batch end this table's target holds (from its snapshot summaries)."""
    changelog: tuple[str, str] | None = None
    """(namespace, name) of the table's changelog table, when it has one."""
    changelog_committed: BinlogPosition | None = None
    """The newest batch end the changelog table holds."""
    committed_known: bool = True
    """False when snapshot expiry hid whether the target holds a batch newer than `committed`."""
    planned_at: BinlogPosition | None = None
    """A position before the table's schema was loaded and split (earlier than every chunk)."""
    partition_columns: tuple[str, ...] = ()
    """Columns other than the key that a partition spec of the target takes values from: a MERGE reads only the
    partitions its rows' old and new values fall in (ingest/sink/pruning.py)."""
    head: int | None = None
    """The target's current snapshot id as the job last saw it (None: empty), when `head_known`: what the cut
    names for the table (ingest.query.commit.table_cut)."""
    head_known: bool = False
    changelog_head: int | None = None
    """The changelog table's current snapshot id as the job last saw it, when `changelog_head_known`."""
    changelog_head_known: bool = False
    since_compaction: dict[str, int] = field(default_factory=dict)
    """Per qualified name (the target, the changelog table): commits since its last rewrite, counted up to
    `sink.maintenance.every_commits`."""

    def forget_heads(self) -> None:
        """The target's and the changelog's snapshots are looked up again for the next cut."""
        self.head_known = self.changelog_head_known = False

    @property
    def max_high(self) -> BinlogPosition | None:
        """Past this every change passes: None while a chunk is unread."""
        return None if None in self.chunk_highs else max(h for h in self.chunk_highs if h is not None)

    @property
    def last_read(self) -> BinlogPosition | None:
        """The newest high watermark of its chunks read (None: none is read yet)."""
        return max((h for h in self.chunk_highs if h is not None), default=None)

    @property
    def min_high(self) -> BinlogPosition | None:
        """Up to this the chunks read hold every change (None: none is read yet)."""
        return min((h for h in self.chunk_highs if h is not None), default=None)

    @property
    def unread(self) -> list[Chunk]:
        return [c for c, h in zip(self.chunks, self.chunk_highs, strict=True) if h is None]

    @property
    def chunks_by_value(self) -> bool:
        """The table's chunks are split on an integer key: the chunk of a key read from the target is found by
        comparing values, without the server (no collation, and an integer is the same value on both sides)."""
        schema = self.schema
        return bool(schema.chunk_key) and all(
            schema.key_column(k).data_type in ("tinyint", "smallint", "mediumint", "int", "bigint")
            for k in schema.chunk_key
        )

    @property
    def chunk_lowers(self) -> list[Key]:
        """The lower bound of every chunk after the first, in key order: a key's chunk is found by bisecting them."""
        return [c.lower for c in self.chunks[1:] if c.lower is not None]

    def read_at(self) -> Callable[[Key], BinlogPosition | None]:
        """For a table split on an integer key (`chunks_by_value`): the high watermark of the chunk that holds a
        key, or None while that chunk is unread."""
        lowers, highs = self.chunk_lowers, list(self.chunk_highs)
        return lambda key: highs[bisect.bisect_right(lowers, key)]

    @property
    def contained_until(self) -> BinlogPosition | None:
        """Up to here every chunk holds every change, and the target every DDL statement: the lowest chunk high
        watermark, or while chunks are unread (a snapshot asked of the running job) the plan's position."""
        return self.planned_at if self.unread else self.min_high


def catch_up_end(goal: BinlogPosition, tables: Iterable[TableStream]) -> BinlogPosition:
    """Where a catch-up (`--until-caught-up`) ends: the binlog's end when it began, or the high watermark of a chunk
    read since, if later. That chunk holds its rows as they were there; the other chunks' keys are brought there
    too by the changes up to it, so that the tables all hold the source as of one point."""
    return max([goal, *(read for table in tables if (read := table.last_read) is not None)])


class HighWatermarkFilter:
    """Keeps of each change what its key's chunk does not hold already: the part of an image whose chunk was
    read before the change (position > that chunk's high watermark).

    The images of a key-changing update belong to their own chunks, so each side is judged alone: the update
    stays whole when both chunks were read before it, becomes the delete of the old key when only the old
    key's chunk was (the new key's chunk, read later, holds the new row and everything after it), becomes the
    insert of the new key when only the new key's chunk was, and is dropped when neither was.

    Past the table's highest chunk watermark every change passes without a lookup (the "pure binlog"
    flag). Chunk membership of string keys is decided by the server, as in the chunk reader.
    """

    def __init__(self, conn: Any, table: TableStream) -> None:
        self.conn = conn
        self.table = table
        self.numeric = table.schema.keys_ordered_in_python
        self._lowers = table.chunk_lowers

    def keep(self, changes: Sequence[RowChange]) -> list[RowChange]:
        table = self.table
        if not changes:
            return []
        if table.last_read is None:
            return []  # no chunk is read yet: they will hold every change (no key needs looking up)
        max_high = table.max_high
        late = [] if max_high is None else [c for c in changes if c.position > max_high]
        if len(late) == len(changes):
            return late
        early = changes if max_high is None else [c for c in changes if c.position <= max_high]
        positions = table.schema.key_positions()
        keys = [tuple(img[i] for i in positions) for c in early for img in (c.before, c.after) if img is not None]
        index = self._chunk_index(keys)

        def past_its_chunk(change: RowChange, image: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
            """The image if its chunk was read before the change, else None (the chunk holds it, or will)."""
            if image is None:
                return None
            high = table.chunk_highs[index[tuple(image[i] for i in positions)]]
            return image if high is not None and change.position > high else None

        kept = []
        for change in early:
            before, after = past_its_chunk(change, change.before), past_its_chunk(change, change.after)
            if before is change.before and after is change.after:
                kept.append(change)
            elif before is not None or after is not None:
                kept.append(change._replace(before=before, after=after))
        return kept + late

    def _chunk_index(self, keys: list[Key]) -> dict[Key, int]:
        unique = list(dict.fromkeys(keys))
        if self.numeric:
            return {k: bisect.bisect_right(self._lowers, k) for k in unique}
        # Chunk by chunk, every key not placed yet in one server query (per 200 keys): the number of
        # queries grows with the chunks, not with keys times chunks.
        result: dict[Key, int] = {}
        pending = unique
        for i, chunk in enumerate(self.table.chunks):
            if not pending:
                break
            inside = in_chunk(self.conn, self.table.schema, chunk, pending)
            result.update((k, i) for k in pending if inside[k])
            pending = [k for k in pending if not inside[k]]
        return result


def _older(a: BinlogPosition | None, b: BinlogPosition | None) -> BinlogPosition | None:
    return None if a is None or b is None else min(a, b)


@dataclass
class Pending:
    """A table's part of a batch whose foreign key actions act in turn on captured tables (its own rows, or a
    child's): finished on the driver (`finish_part`, ingest.query.chains), where the rows they reached are read."""

    changes: list[RowChange]
    """Its changes the target or changelog do not hold, past their chunks, before any action is applied."""
    actions: list[KeyAction]
    """The actions of the batch's parent rows on it, past what its target or changelog hold."""
    origins: dict[BinlogPosition, tuple[str | None, int]]
    """(GTID, commit time) of the transaction of each of its changes and of each action of the batch."""
    keys: list[ForeignKey]
    """Its foreign keys with actions to captured tables: what the actions do to its rows acts on theirs."""


@dataclass
class TableBatch:
    """One table's part of a binlog batch, ready to commit (pickled whole from the source's process to the
    driver: Arrow tables pickle as their buffers)."""

    table_id: str
    rows: pa.Table | None
    """The target's rows (`batch_arrow`: per key its final image, or its key to delete); None: nothing to apply."""
    append: bool
    """Every row has a key the batch created, which the target cannot hold: appended, nothing read."""
    where: str | None
    """What of the target the MERGE reads (`batch_where`); None: all of it."""
    applied: int
    """Row changes `rows` stand for."""
    changelog: pa.Table | None
    """The changelog table's rows (`changelog_arrow`); None: no changelog, or nothing for it."""
    rejected: list[RejectedValue]
    actions: list[KeyAction] = field(default_factory=list)
    """Foreign key actions to apply at commit to the target's rows of keys `rows` does not hold
    (ingest.sink.key_actions); those of the keys it holds are in `rows` already."""
    action_origins: dict[BinlogPosition, tuple[str | None, int]] = field(default_factory=dict)
    """(GTID, commit time) of each action's transaction, by its position: for the changelog rows of what it did."""
    target_acted: bool = False
    """The target's rows `actions` reach are in `rows` already (ingest.query.chains): the commit reads none."""
    pending: Pending | None = None
    """Set when the driver finishes the part (`finish_part`): `rows` and `changelog` are None until then."""


def prepare_batch(
    targets: Targets,
    stream: StreamConfig,
    tables: Mapping[str, TableStream],
    filters: Mapping[str, HighWatermarkFilter],
    batch: Sequence[Transaction],
    chained: Mapping[str, Sequence[ForeignKey]] | None = None,
) -> list[TableBatch]:
    """What `batch` writes, per table it changes (in table order), as of what each table holds now.

    `chained`: per table, its foreign keys whose actions act on captured tables (itself too). A table an action
    of the batch reaches and whose rows act in turn, and every table they act on, is left `Pending` for the driver."""
    per_table: dict[str, list[RowChange]] = defaultdict(list)
    # For changelog rows: by the row event's place in the binlog, not by object (the high-watermark filter may
    # replace a change with one side of it).
    transaction_of: dict[BinlogPosition, Transaction] = {}
    logged = {table_id for table_id, table in tables.items() if _logged(targets, table)}
    per_actions: dict[str, list[KeyAction]] = defaultdict(list)
    for tx in batch:
        for change in tx.changes:
            per_table[change.table_id].append(change)
            if change.table_id in logged:
                transaction_of[change.position] = tx
        for action in tx.actions:
            per_actions[action.table_id].append(action)
            transaction_of[action.position] = tx
    pending = _in_turn(per_actions.keys(), chained or {})
    acting_at = {a.position for actions in per_actions.values() for a in actions} if pending else set()

    def origin(position: BinlogPosition) -> tuple[str | None, int]:
        return transaction_of[position].gtid, transaction_of[position].commit_time

    prepared = []
    for table_id in sorted(per_table.keys() | per_actions.keys() | pending):
        changes = per_table.get(table_id, [])
        table = tables[table_id]
        # What the target (and the changelog) hold already is skipped, each by its own committed offset.
        floor = held_floor(table)
        if floor is not None:
            changes = [c for c in changes if c.position > floor]
        changes = filters[table_id].keep(changes)  # may ask the server (one connection: on this thread)
        if table_id in pending:
            actions = [a for a in per_actions.get(table_id, []) if floor is None or a.position > floor]
            origins = {p: origin(p) for p in {c.position for c in changes if table_id in logged} | acting_at}
            held = TableBatch(table_id, None, False, None, len(changes), None, [])
            held.pending = Pending(changes, actions, origins, list((chained or {}).get(table_id, ())))
            prepared.append(held)
            continue
        actions = actions_to_apply(table, per_actions.get(table_id, []), floor)
        part = finish_part(targets, stream, table, changes, actions, origin)
        if part is not None:
            prepared.append(part)
    return prepared


def _logged(targets: Targets, table: TableStream) -> bool:
    """Whether the table's changes need their transaction's GTID and commit time: for its changelog, or for the
    values it rejects."""
    schema = table.schema
    return (
        table.changelog is not None or targets.options_for(schema.database, schema.table).on_unrepresentable != "null"
    )


def _in_turn(acted_on: Iterable[str], chained: Mapping[str, Sequence[ForeignKey]]) -> set[str]:
    """The tables with actions whose rows act in turn, and every table they act on, down to the last."""
    out: set[str] = set()
    todo = [t for t in acted_on if chained.get(t)]
    while todo:
        table = todo.pop()
        if table not in out:
            out.add(table)
            todo.extend(key.child_id for key in chained.get(table, ()))
    return out


def held_floor(table: TableStream) -> BinlogPosition | None:
    """Up to here the table's target (and its changelog, if it has one) hold every change."""
    return _older(table.committed, table.changelog_committed) if table.changelog else table.committed


def finish_part(
    targets: Targets,
    stream: StreamConfig,
    table: TableStream,
    changes: list[RowChange],
    actions: list[KeyAction],
    origin: Callable[[BinlogPosition], tuple[str | None, int]],
    reached: list[tuple[KeyAction, tuple[Any, ...], tuple[Any, ...] | None]] | None = None,
) -> TableBatch | None:
    """One table's part of a batch from its changes (past what its target, changelog and chunks hold) and the
    actions to apply (`actions_to_apply`); None when it writes nothing. `reached` gets each action's change of a
    key the batch changed before it (`act_on_changes`)."""
    schema = table.schema
    changes = act_on_changes(changes, actions, schema.primary_key_positions(), reached)
    # Values Iceberg cannot hold exactly (on_unrepresentable); the rejected rows are kept whatever the
    # target or changelog hold: their MERGE adds only rows it does not have (ingest/sink/rejected.py).
    policy = targets.options_for(schema.database, schema.table).on_unrepresentable
    changes, rejected = split_rejected(
        changes, schema.columns, schema.primary_key_positions(), policy, lambda c: origin(c.position)
    )
    to_merge = [c for c in changes if table.committed is None or c.position > table.committed]
    done = table.changelog_committed
    to_log = [c for c in changes if done is None or c.position > done] if table.changelog is not None else []
    if not (to_merge or to_log or rejected or actions):
        return None
    rows, append, where = _target_rows(targets, stream, table, to_merge)
    if actions and rows is None:
        rows = batch_arrow(schema, {})  # the target's rows the actions reach are added at commit
    changelog = _changelog_rows(table, to_log, origin) if to_log else None
    part = TableBatch(table.schema.table_id, rows, append and not actions, where, len(to_merge), changelog, rejected)
    part.actions = actions
    if table.changelog is not None:
        part.action_origins = {a.position: origin(a.position) for a in actions}
    return part


def actions_to_apply(table: TableStream, actions: list[KeyAction], floor: BinlogPosition | None) -> list[KeyAction]:
    """The foreign key actions of a batch that the table's target does not hold yet.

    Those before every chunk's read are held by the chunks; after every chunk's read, by nothing yet. An action
    between the reads of two chunks would reach rows of both kinds, which the job cannot tell apart: a stop."""
    if floor is not None:
        actions = [a for a in actions if a.position > floor]
    if not actions or table.last_read is None:
        return []  # nothing new, or no chunk read yet: the chunks will hold what the actions did
    schema = table.schema
    if schema.keyless:
        raise SourceError(
            f"{schema.table_id}: a foreign key action at binlog position {actions[0].position} changed its rows "
            "without row events, and the table has no key to find them by: nothing from there on was applied. Add "
            f"a key to it, or snapshot it again (`ingest resnapshot --config ... --table {schema.table_id}`)"
        )
    min_high, max_high = table.min_high, table.max_high
    assert min_high is not None
    actions = [a for a in actions if a.position > min_high]
    straddling = [a for a in actions if max_high is None or a.position <= max_high]
    if straddling and not table.chunks_by_value:
        raise SourceError(
            f"{schema.table_id}: a foreign key action at binlog position {straddling[0].position} changed rows of "
            "chunks read before it and after it, without row events, and the table's key is not an integer, so "
            "the job cannot tell which chunk holds a row without asking the server at commit. Snapshot it again "
            f"(`ingest resnapshot --config ... --table {schema.table_id}`)"
        )
    return actions  # a row of a chunk read after an action already holds it: `TableStream.read_at` tells


def _target_rows(
    targets: Targets, stream: StreamConfig, table: TableStream, changes: list[RowChange]
) -> tuple[pa.Table | None, bool, str | None]:
    """The target's rows of the batch, whether they are appended, and what of the target a MERGE reads."""
    if not changes:
        return None, False, None
    schema = table.schema
    if schema.keyless:  # whole rows, counted: the MERGE reads the target's numbers of the values they hold
        return alike_arrow(schema, [(c.before, c.after) for c in changes]), False, None
    folded = [Change((c.position.file_number, c.position.pos, c.row_index), c.before, c.after) for c in changes]
    finals = materialize(folded, schema.primary_key_positions())
    # A batch that only creates rows (inserts of keys absent before it: an event or log table, new orders) is
    # appended: the target holds exactly the source before the batch, so it cannot hold those keys. Not under
    # the `ignore` DDL policy, where an ignored TRUNCATE leaves rows behind that re-inserts must overwrite. Nor
    # when expiry hid the target's newest offset: it may hold this very batch (committed before a crash).
    append = (
        table.committed_known
        and stream.on_schema_change != "ignore"
        and all(row is not None for row in finals.values())
        and finals.keys() <= created_keys(folded, schema.primary_key_positions())
    )
    where = None if append else batch_where(schema, finals.keys(), _partition_values(targets, stream, table, folded))
    return batch_arrow(schema, finals), append, where


def _changelog_rows(
    table: TableStream, changes: list[RowChange], origin: Callable[[BinlogPosition], tuple[str | None, int]]
) -> pa.Table:
    return changelog_arrow(
        table.schema,
        changelog_rows(
            SourceChange(
                c.position.file,
                c.position.file_number,
                c.position.pos,
                c.row_index,
                c.before,
                c.after,
                *origin(c.position),
            )
            for c in changes
        ),
    )


def _partition_values(
    targets: Targets, stream: StreamConfig, table: TableStream, changes: list[Change]
) -> dict[str, set[Any]] | None:
    """Every value each partition column of the target may hold in the rows the batch changes: those of the rows'
    images before and after each change. The target holds the source's rows as of the batch's start (or, when a
    commit's outcome was unknown, its end), so the rows it matches hold one of them. Not under the `ignore` DDL
    policy nor with `dead_letter`: then the target may keep rows the source no longer has, as they were."""
    schema = table.schema
    if (
        not table.partition_columns
        or stream.on_schema_change == "ignore"
        or targets.options_for(schema.database, schema.table).on_unrepresentable == "dead_letter"
    ):
        return None
    names = schema.column_names
    positions = {c: names.index(c) for c in table.partition_columns if c in names}
    images = [image for c in changes for image in (c.before, c.after) if image is not None]
    return {column: {image[p] for image in images} for column, p in positions.items()}
