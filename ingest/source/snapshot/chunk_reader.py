"""Reading one chunk without locks (MISSION.md "Lock-free chunk read", the DBLog / Flink CDC 2.0 algorithm).

1. low watermark; 2. SELECT the chunk; 3. high watermark; 4. replay the binlog between the two for this
table and key range onto the chunk buffer. The buffer then equals the table's content at the high
watermark. This code runs on Spark executors: everything it needs travels in a picklable `ChunkTask`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pymysql
from pymysqlreplication.event import MariadbGtidEvent, QueryEvent, XAPrepareEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from ingest.changes.rejects import Unrepresentable, find_unrepresentable, key_json, reason_of
from ingest.config import SourceConfig
from ingest.errors import SchemaChangeError, SourceError
from ingest.faults import crash_point
from ingest.model.columns import TEMPORAL_TYPES, TargetColumn, rows_to_record_batch
from ingest.model.position import BinlogPosition, Watermark
from ingest.model.schema import OCCURRENCE_TARGET, SERVER_ORDERED_TYPES, TableSchema, quote, source_targets
from ingest.source.binlog import table_maps
from ingest.source.binlog.binlog_values import RowDecoder, row_images
from ingest.source.binlog.ddl import ddl_tables, statement_tables
from ingest.source.binlog.event_groups import XaId, control_statement, group_flags, one_phase, xa_statement_id
from ingest.source.binlog.foreign_keys import Actions, load_actions, update_changed
from ingest.source.binlog.reader import (
    dump_server_id,
    open_stream,
    query_of,
    read_prepared,
    refuse_statement,
)
from ingest.source.binlog.row_events import RowEvents, event_kind
from ingest.source.mysql import connect
from ingest.source.reconnect import Reconnect, lost_connection
from ingest.source.snapshot.chunk_select import open_select
from ingest.source.snapshot.chunks import Chunk, Key, range_predicate
from ingest.source.watermark import read_watermark

log = logging.getLogger(__name__)

ImagePair = tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]
HookPoint = Literal["after_low_watermark", "before_high_watermark", "after_high_watermark"]
ChunkHook = Callable[[HookPoint, Chunk], None]


@dataclass(frozen=True)
class ChunkTask:
    """Everything an executor needs to read one chunk."""

    source: SourceConfig
    flavor: str
    schema: TableSchema
    chunk: Chunk
    hook: ChunkHook | None = None
    """Test hook fired at the three points of FAILURES.md ("Watermarks, positions, GTIDs")."""
    driver: str = "auto"
    """`snapshot.driver`: who runs the SELECT (ingest.source.snapshot.chunk_select)."""
    on_unrepresentable: str = "null"
    """The table's `on_unrepresentable`: with `stop` or `dead_letter` the read looks for dates no Iceberg value
    holds (ingest.changes.rejects)."""


@dataclass
class ChunkResult:
    table: Any
    """The chunk at its high watermark: a ``pyarrow.Table`` of the target columns."""
    low: Watermark
    high: Watermark
    window_events: int = 0
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    unrepresentable: dict[Key, list[Unrepresentable]] = field(default_factory=dict)
    """Rows of the chunk at its high watermark holding values no Iceberg value holds, by key (Iceberg-side
    values of the chunk key); empty under `on_unrepresentable: null`, which does not look."""

    @property
    def rows(self) -> list[tuple[Any, ...]]:
        """The rows as tuples of their Iceberg-side values (for tests and small tables)."""
        columns = [c.to_pylist() for c in self.table.columns]
        return list(zip(*columns, strict=True)) if columns else []


class ChunkConnections:
    """The two sessions chunk reads use, opened on first use and kept for the chunks that follow (one
    Spark partition reads many chunks; with TLS a connection costs several round trips):
    `conn` (PyMySQL) for watermarks and the binlog window's lookups, `select` for the read view."""

    def __init__(self, source: SourceConfig, driver: str) -> None:
        self.source, self.driver = source, driver
        self._conn: pymysql.connections.Connection[Any] | None = None
        self._select: Any = None

    @property
    def conn(self) -> pymysql.connections.Connection[Any]:
        if self._conn is None:
            self._conn = connect(self.source)
        return self._conn

    @property
    def select(self) -> Any:
        if self._select is None:
            self._select = open_select(self.source, self.driver)
        return self._select

    def close(self, quietly: bool = False) -> None:
        """Close both sessions; `quietly`: one that is dead already (a lost connection) fails its close unheard."""
        try:
            for closable in (self._select, self._conn):
                if closable is not None:
                    try:
                        closable.close()
                    except Exception:
                        if not quietly:
                            raise
        finally:
            self._select = self._conn = None

    def __enter__(self) -> ChunkConnections:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_chunk(task: ChunkTask, connections: ChunkConnections | None = None) -> ChunkResult:
    """Read one chunk; with `connections`, on sessions the caller keeps open for its next chunks.

    A chunk whose connection is lost (a restarted server, a killed session, a reset) is read again whole on new
    sessions, with backoff, for at most `source.reconnect_seconds` (ingest.source.reconnect); a read from a new
    low watermark is as good as the first, and the chunks read before it are kept."""
    if connections is None:
        with ChunkConnections(task.source, task.driver) as own:
            return read_chunk(task, own)
    chunk, source = task.chunk, task.source
    reconnect = Reconnect(
        source.reconnect_seconds,
        f"{source.host}:{source.port}",
        f"the connection of {chunk.table_id} chunk {chunk.index}",
    )
    redefined = 0
    while True:
        try:
            result = _read_chunk_once(task, connections)
        except Exception as e:
            connections.close(quietly=True)
            if lost_connection(e):
                _wait_to_read_again(task, reconnect, e)
            # ER_TABLE_DEF_CHANGED: the table was replaced after the read view began (an online schema change's
            # RENAME swap). Read the chunk again from a new low watermark; what changed is the binlog phase's to judge.
            elif _error_code(e) == 1412 and redefined < READ_ATTEMPTS - 1:
                redefined += 1
                log.info(
                    "%s chunk %d: the table was redefined during the read; reading it again",
                    chunk.table_id,
                    chunk.index,
                )
            else:
                raise
            continue
        if reconnect.attempts:
            log.warning(
                "%s chunk %d read after %d reconnect attempt(s)", chunk.table_id, chunk.index, reconnect.attempts
            )
        return result


READ_ATTEMPTS = 3


def _wait_to_read_again(task: ChunkTask, reconnect: Reconnect, error: BaseException) -> None:
    chunk = task.chunk
    wait = reconnect.next_wait(
        error,
        f"The chunks of {chunk.table_id} committed before stay; `ingest run` reads the others once the server is back",
    )
    log.warning(
        "%s chunk %d: lost the connection to %s (%s); reading the chunk again in %.1f s (attempt %d)",
        chunk.table_id,
        chunk.index,
        reconnect.where,
        reconnect.last_error,
        wait,
        reconnect.attempts,
    )
    time.sleep(wait)


def _error_code(error: BaseException) -> object:
    """The server's error number of a PyMySQL or mysqlclient error (their first argument)."""
    args = getattr(error, "args", ())
    return args[0] if args else None


def _read_chunk_once(task: ChunkTask, connections: ChunkConnections) -> ChunkResult:
    started = time.perf_counter()
    schema, chunk = task.schema, task.chunk
    targets = source_targets(schema)
    conn = connections.conn
    low = read_watermark(conn, task.flavor)
    select = connections.select
    snapshot_point = select.begin(task.flavor)
    if snapshot_point is not None:
        # Exact point of the read view (MariaDB); keep the GTID read just before as a lower bound.
        low = Watermark(snapshot_point.position, low.gtid, low.server_id)
    elif schema.keyless:
        select.end()
        raise SourceError(
            f"{schema.table_id} has no key, and its copy needs the binlog position its read view begins at, which "
            f"MariaDB gives and {task.flavor} does not: without a key, the changes of the read's window cannot be "
            "told from the rows it read. Add a primary key or a unique key on NOT NULL columns, or exclude the table"
        )
    if task.hook:
        task.hook("after_low_watermark", chunk)
    where, params = range_predicate(schema.chunk_key, chunk.lower, chunk.upper)
    columns = ", ".join(quote(c) for c in schema.column_names)
    try:
        table = select.select(f"SELECT {columns} FROM {schema.quoted} WHERE {where}", params, targets)
        looks = task.on_unrepresentable != "null"
        unrepresentable = _unrepresentable(select, schema, targets, where, params) if looks else {}
    except Exception as e:
        if _error_code(e) == 1054:  # ER_BAD_FIELD_ERROR
            raise SchemaChangeError(
                f"{schema.table_id}: a column the snapshot reads is gone (dropped or renamed during the snapshot, "
                f"chunk {chunk.index}): {e.args[-1]}. Re-snapshot the table: `ingest resnapshot --config ... "
                f"--table {schema.table_id}`, then `ingest run`"
            ) from None
        raise
    select.end()  # end the read view at once: no metadata lock is held between chunks
    crash_point(f"chunk.after_select.{chunk.table_id}.{chunk.index}")
    select_done = time.perf_counter()
    if task.hook:
        task.hook("before_high_watermark", chunk)
    high = read_watermark(conn, task.flavor)
    if task.hook:
        task.hook("after_high_watermark", chunk)
    events = 0
    if schema.keyless:
        if high.position > low.position:
            table, events = _apply_window_alike(task, conn, low, high, table, targets)
        table = numbered(table)
    elif high.position > low.position:
        finals, events = window_changes(task, conn, low, high)
        keys = _iceberg_keys(targets, schema.key_positions(), finals)
        table = _apply_finals(table, targets, schema.key_positions(), finals, keys)
        if looks:
            _judge_window(unrepresentable, schema, keys, finals)
    if task.on_unrepresentable == "stop" and unrepresentable:
        raise _stop_at(task, unrepresentable, high)
    result = ChunkResult(table, low, high, events, unrepresentable=unrepresentable)
    result.seconds = time.perf_counter() - started
    result.timings = {"select": select_done - started, "window": time.perf_counter() - select_done}
    return result


def _invalid_date(column: str) -> str:
    """True where a DATE/DATETIME/TIMESTAMP value is no calendar date: zero year, month or day, or a day past the
    month's last (what MariaDB keeps under ALLOW_INVALID_DATES or without NO_ZERO_DATE)."""
    return (
        f"({column} IS NOT NULL AND (YEAR({column}) = 0 OR MONTH({column}) = 0 OR DAYOFMONTH({column}) = 0 "
        f"OR LAST_DAY({column}) IS NULL OR DAYOFMONTH({column}) > DAYOFMONTH(LAST_DAY({column}))))"
    )


def _unrepresentable(
    select: Any, schema: TableSchema, targets: Sequence[TargetColumn], where: str, params: Sequence[Any]
) -> dict[Key, list[Any]]:
    """The chunk's rows holding dates no Iceberg value holds, read in the chunk SELECT's read view (the same
    rows): key -> the values, as MySQL prints them. The server finds them; only those rows come back."""
    temporal = [c for c in schema.columns if c.data_type in TEMPORAL_TYPES]
    if not temporal:
        return {}
    positions = schema.key_positions()
    key_targets = [targets[i] for i in positions]
    raw = [TargetColumn(f"raw_{i}", "STRING", pa.string(), True, text_form="string") for i in range(len(temporal))]
    picks = [f"IF({_invalid_date(quote(c.name))}, CAST({quote(c.name)} AS CHAR), NULL)" for c in temporal]
    keys = ", ".join(quote(schema.column_names[i]) for i in positions)
    sql = (
        f"SELECT {keys}, {', '.join(picks)} FROM {schema.quoted} WHERE ({where}) "
        f"AND ({' OR '.join(_invalid_date(quote(c.name)) for c in temporal)})"
    )
    found: dict[Key, list[Any]] = {}
    for row in select.select(sql, params, [*key_targets, *raw]).to_pylist():
        values = list(row.values())
        key, texts = tuple(values[: len(positions)]), values[len(positions) :]
        found[key] = [Unrepresentable(c.name, t, reason_of(t)) for c, t in zip(temporal, texts, strict=True) if t]
    return found


def _iceberg_keys(
    targets: Sequence[TargetColumn], positions: Sequence[int], finals: dict[Key, tuple[Any, ...] | None]
) -> list[Key]:
    """The keys of `finals` (driver values) as Iceberg-side values, in the same order: the SELECT's converters
    give the chunk's rows those, so a key matches exactly, byte for byte, as in the binlog."""
    if not finals:
        return []
    key_targets = [targets[i] for i in positions]
    return [tuple(r.values()) for r in rows_to_record_batch(key_targets, [tuple(k) for k in finals]).to_pylist()]


def _judge_window(
    found: dict[Key, list[Any]], schema: TableSchema, keys: Sequence[Key], finals: dict[Key, tuple[Any, ...] | None]
) -> None:
    """Keys the binlog window changed (`keys`: those of `finals` as Iceberg values) are judged by their final
    image, as the chunk now holds it."""
    for key, row in zip(keys, finals.values(), strict=True):
        found.pop(key, None)
        values = [] if row is None else find_unrepresentable(schema.columns, row)
        if values:
            found[key] = values


def _stop_at(task: ChunkTask, found: dict[Key, list[Any]], high: Watermark) -> SourceError:
    """`on_unrepresentable: stop`: the chunk is not committed; the error names the first value."""
    schema = task.schema
    key, values = next(iter(found.items()))
    value = values[0]
    return SourceError(
        f"{schema.table_id}: column {value.column!r} of the row with key {key_json(schema.chunk_key, key)} holds "
        f"{value.raw!r} ({value.reason}), read by snapshot chunk {task.chunk.index} at binlog position "
        f"{high.position}, which no Iceberg value holds exactly; `on_unrepresentable` is `stop` for this table. "
        f"Set it to `dead_letter` (or `null`) in `table_options.{schema.table_id}` and run again"
    )


def _apply_finals(
    table: Any,
    targets: Sequence[TargetColumn],
    positions: Sequence[int],
    finals: dict[Key, tuple[Any, ...] | None],
    keys: Sequence[Key],
) -> Any:
    """Replace the rows of every key the window touched by its final image (or nothing, if deleted). Keys are
    compared as Iceberg-side values on both sides (`keys`: those of `finals`, see `_iceberg_keys`)."""
    if not finals:
        return table
    touched = set(keys)
    key_columns = [table.column(i).to_pylist() for i in positions]
    keep = [key not in touched for key in zip(*key_columns, strict=True)]
    kept = table.filter(pa.array(keep, type=pa.bool_())) if keep else table
    upserts = [row for row in finals.values() if row is not None]
    if not upserts:
        return kept
    return pa.concat_tables([kept, pa.Table.from_batches([rows_to_record_batch(targets, upserts)])])


def _apply_window_alike(
    task: ChunkTask,
    conn: pymysql.connections.Connection[Any],
    low: Watermark,
    high: Watermark,
    table: Any,
    targets: Sequence[TargetColumn],
) -> tuple[Any, int]:
    """A table without a key, read at exactly `low` (the read view's start), brought to `high` as a multiset:
    per row value, the window's inserts less its deletes (an update is both) are added, or that many alike rows
    removed. Values compare as their Iceberg-side values, as the SELECT gave them. Returns it, and the change
    count."""
    changes = list(_binlog_rows(task, low, high, load_actions(conn, [(task.schema.database, task.schema.table)])))
    net: dict[tuple[Any, ...], int] = {}
    image_of: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for sign, images in ((-1, [b for b, _ in changes if b is not None]), (1, [a for _, a in changes if a is not None])):
        if not images:
            continue
        for image, row in zip(images, rows_to_record_batch(targets, images).to_pylist(), strict=True):
            value = tuple(row.values())
            net[value] = net.get(value, 0) + sign
            image_of.setdefault(value, image)
    gone = {value: -n for value, n in net.items() if n < 0}
    keep = []
    for row in table.to_pylist() if gone else ():
        value = tuple(row.values())
        left = gone.get(value, 0)
        keep.append(left == 0)
        if left:
            gone[value] = left - 1
    if any(gone.values()):
        raise SourceError(
            f"{task.schema.table_id} (no key): the binlog between {low.position} and {high.position} deletes rows "
            "the read did not hold, so the read view did not begin where the server said; nothing was committed. "
            "Run again, and report this if it repeats"
        )
    kept = table.filter(pa.array(keep, type=pa.bool_())) if keep else table
    added = [image_of[value] for value, n in net.items() for _ in range(n)]
    if added:
        kept = pa.concat_tables([kept, pa.Table.from_batches([rows_to_record_batch(targets, added)])])
    return kept, len(changes)


def numbered(table: Any) -> Any:
    """`table` (rows of a table without a key) with `OCCURRENCE_COLUMN` last: each row's number, from 1, among the
    rows that hold the same values in every column (NULL alike)."""
    count = table.num_rows
    if not count:
        return table.append_column(OCCURRENCE_TARGET.name, pa.array([], type=pa.int64()))
    rows = pa.array(range(count), type=pa.int64())
    alike = (
        table.append_column("__row", rows)
        .group_by(table.column_names, use_threads=False)
        .aggregate([("__row", "list")])["__row_list"]
        .combine_chunks()
    )
    members = alike.flatten()  # the row numbers, grouped: each group's in table order
    starts = pc.take(alike.offsets, pc.list_parent_indices(alike))
    place = pc.add(pc.subtract(pa.array(range(len(members)), type=pa.int64()), starts), 1)
    return table.append_column(OCCURRENCE_TARGET.name, pc.take(place, pc.sort_indices(members)))


def _binlog_rows(
    task: ChunkTask, low: Watermark, high: Watermark, actions: Actions | None = None
) -> Iterator[ImagePair]:
    """(before, after) images of this table's row changes committed with low < position <= high, in binlog order:
    tuples of driver values in the schema's column order, decoded as the binlog phase decodes them.

    An XA transaction's rows count at its XA COMMIT (the chunk's SELECT may have run between its prepare and its
    commit): held from its first half, given at the commit if that comes inside the window (read back from the
    binlog when the prepare came before it), dropped at XA ROLLBACK. A parent's change whose foreign key action
    may reach the table stops the read (`actions`; InnoDB does not log what an action changes)."""
    window = _Window(task, low)
    watched = set(actions.watched) if actions else set()
    # The parents' row events are read too when an action can reach the table from them.
    schema = task.schema
    filters: dict[str, Any] = {} if watched else {"only_schemas": [schema.database], "only_tables": [schema.table]}
    stream = open_stream(
        task.source,
        low.position,
        # Each concurrent dump connection needs its own server id, or the server drops the older one.
        dump_server_id(),
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, QueryEvent, MariadbGtidEvent, XAPrepareEvent],
        **filters,
    )
    try:
        for event in stream:
            # log_pos is where the event ends; the high watermark is always at a transaction boundary.
            end = BinlogPosition(stream.log_file, event.packet.log_pos)
            if end > high.position:
                return
            if isinstance(event, MariadbGtidEvent):
                window.held = [] if group_flags(event.flags)[1] else None
            elif isinstance(event, XAPrepareEvent):
                if not event.one_phase:
                    window.prepared[XaId.of(event)] = window.held or []
                window.held = None
            elif isinstance(event, QueryEvent):
                yield from window.statement(event, end)
            else:
                kind = event_kind(event)
                if actions is not None and (event.schema, event.table) in watched:
                    changed = update_changed(event, kind)
                    actions.act((event.schema, event.table), kind, event.flags, end, changed, _never)
                if (event.schema, event.table) == window.key:
                    yield from window.rows(event, kind, end)
    finally:
        stream.close()


@dataclass
class _Window:
    """What reading a chunk's binlog window keeps between events."""

    task: ChunkTask
    low: Watermark
    altered: tuple[str, BinlogPosition] | None = None
    """The first DDL statement of the table inside the window, and where it ends."""
    held: list[ImagePair] | None = None
    """The rows of the XA transaction's first half being read; None outside one."""
    prepared: dict[XaId, list[ImagePair]] = field(default_factory=dict)
    """The rows of each XA transaction prepared inside the window, until its XA COMMIT or ROLLBACK."""

    def __post_init__(self) -> None:
        self.key = (self.task.schema.database, self.task.schema.table)
        self.decoder = RowEvents()
        self.library_images = _library_images(self.task)

    def statement(self, event: QueryEvent, end: BinlogPosition) -> Iterator[ImagePair]:
        """A statement logged as text: an XA transaction's control (its rows given at its commit), a statement
        that changes the table's rows (refused), or a DDL of the table (kept: rows after it must still decode)."""
        query, default_db = query_of(event)
        control = control_statement(query)
        if control == "xa start":
            self.held = []
        elif control == "xa commit":
            yield from _xa_commit(self.task, query, end, self.low, self.held, self.prepared)
            self.held = None
        elif control == "xa rollback":
            self.prepared.pop(xa_statement_id(query, end), None)
        if statement_tables(query, default_db, [self.key]):
            raise refuse_statement(self.task.schema.table_id, end, query)
        if self.altered is None and ddl_tables(query, default_db, [self.key]):
            self.altered = (query, end)

    def rows(self, event: Any, kind: str, end: BinlogPosition) -> Iterator[ImagePair]:
        """A row event of the table: its images, given now or held for their XA transaction's commit."""
        schema = self.task.schema
        altered = self.altered
        if altered is not None:
            where = f"inside the window of chunk {self.task.chunk.index}"
            table_maps.refuse_by_position_after_ddl(event, schema.table_id, *altered, where)
        try:
            images = self.decoder.rows(self.key, kind, event, schema.columns, end)
            if images is None:  # an event only the library reads
                images = [self.library_images(kind, row) for row in event.rows]
        except SourceError as e:
            if altered is None or isinstance(e, SchemaChangeError):
                raise
            # Names logged, but not the schema's (a column renamed or dropped by the DDL in this window).
            raise SchemaChangeError(
                f"{schema.table_id}: its schema changed during its snapshot, at binlog position {altered[1]} "
                f"({altered[0][:200]!r}), inside the window of chunk {self.task.chunk.index}, and the rows after it "
                f"no longer match the columns the copy reads ({e}); none was applied. Re-snapshot the table: "
                f"`ingest resnapshot --config ... --table {schema.table_id}`, then `ingest run`"
            ) from None
        if self.held is not None:
            self.held.extend(images)
        else:
            yield from images


def _xa_commit(
    task: ChunkTask,
    query: str,
    end: BinlogPosition,
    low: Watermark,
    held: list[ImagePair] | None,
    prepared: dict[XaId, list[ImagePair]],
) -> list[ImagePair]:
    """The rows an XA COMMIT inside the window commits: the group's own (ONE PHASE), those held since its
    prepare in the window, or those read back from before the window."""
    if one_phase(query):
        return held or []
    xid = xa_statement_id(query, end)
    found = prepared.pop(xid, None)
    if found is not None:
        return found
    return [(c.before, c.after) for c in read_prepared(task.source, [task.schema], xid, low.position, end).changes]


def _never(table: tuple[str, str]) -> bool:
    """No table's snapshot was read after a change inside a chunk's window."""
    return False


def _library_images(task: ChunkTask) -> Callable[[str, dict[str, Any]], ImagePair]:
    """How a row of an event the library decoded becomes what `_binlog_rows` gives (one decoder per window)."""
    schema = task.schema
    decode = RowDecoder(schema.columns)

    def as_row(values: dict[str, Any] | None) -> tuple[Any, ...] | None:
        if values is None:
            return None
        missing = [n for n in schema.column_names if n not in values]
        if missing:
            raise SourceError(
                f"a binlog event of {schema.table_id} lacks columns {missing}: the table changed between the "
                f"watermarks of chunk {task.chunk.index}, or binlog_row_image is not FULL"
            )
        return decode(values)

    def images(kind: str, row: dict[str, Any]) -> ImagePair:
        before, after = row_images(kind, row)
        return as_row(before), as_row(after)

    return images


def window_changes(
    task: ChunkTask, conn: pymysql.connections.Connection[Any], low: Watermark, high: Watermark
) -> tuple[dict[Key, tuple[Any, ...] | None], int]:
    """The final image (None: deleted) of every key of this chunk changed in (low, high], and the change count.

    Keys and rows are driver values (PyMySQL's forms). Applied in binlog order, exactly as "a delete
    removes the key, an insert/update sets it" on a buffer would: only the last change of a key counts.
    """
    positions = task.schema.key_positions()
    changes = list(_binlog_rows(task, low, high, load_actions(conn, [(task.schema.database, task.schema.table)])))
    finals: dict[Key, tuple[Any, ...] | None] = {}
    if not changes:
        return finals, 0
    keys = [tuple(image[i] for i in positions) for change in changes for image in change if image is not None]
    inside = in_chunk(conn, task.schema, task.chunk, keys)
    for before, after in changes:
        if before is not None:
            key = tuple(before[i] for i in positions)
            if inside[key]:
                finals[key] = None
        if after is not None:
            key = tuple(after[i] for i in positions)
            if inside[key]:
                finals[key] = after
    return finals, len(changes)


def in_chunk(
    conn: pymysql.connections.Connection[Any], schema: TableSchema, chunk: Chunk, keys: Sequence[Key]
) -> dict[Key, bool]:
    """Whether each key lies in the chunk's range, decided as the server orders keys.

    Numbers compare the same in Python and in SQL; strings depend on the column's collation
    (case, PAD SPACE), so any key with a string column is sent to the server.
    """
    unique = list(dict.fromkeys(keys))
    if chunk.lower is None and chunk.upper is None:
        return dict.fromkeys(unique, True)
    if schema.keys_ordered_in_python:
        return {
            k: (chunk.lower is None or k >= chunk.lower) and (chunk.upper is None or k < chunk.upper) for k in unique
        }
    result: dict[Key, bool] = {}
    exprs = []
    for name, collation in zip(schema.chunk_key, schema.collations, strict=True):
        data_type = schema.key_column(name).data_type
        if data_type in SERVER_ORDERED_TYPES:
            exprs.append(f"CAST(%s AS {data_type.upper()})")
        elif collation is None:
            exprs.append("%s")
        else:
            charset = collation.split("_", 1)[0]
            exprs.append(f"CONVERT(%s USING {charset}) COLLATE {collation}")
    for start in range(0, len(unique), 200):
        batch = unique[start : start + 200]
        selects, params = [], []
        for key in batch:
            predicate, p = _predicate_over_values(exprs, key, chunk)
            selects.append(predicate)
            params.extend(p)
        with conn.cursor() as cur:
            cur.execute("SELECT " + ", ".join(f"({s})" for s in selects), params)
            flags = cur.fetchone()
        result.update({k: bool(f) for k, f in zip(batch, flags, strict=True)})
    return result


def _predicate_over_values(exprs: Sequence[str], key: Key, chunk: Chunk) -> tuple[str, list[Any]]:
    """`lower <= key < upper` with the key's values in place of the columns (same nesting as range_predicate)."""
    params: list[Any] = []

    def compare(op: str, bound: Key, i: int) -> str:
        strict = op.rstrip("=")
        left = exprs[i]
        if i == len(exprs) - 1:
            params.extend([key[i], bound[i]])
            return f"{left} {op} {exprs[i]}"
        params.extend([key[i], bound[i], key[i], bound[i]])
        inner = compare(op, bound, i + 1)
        return f"({left} {strict} {exprs[i]} OR ({left} = {exprs[i]} AND {inner}))"

    parts = []
    if chunk.lower is not None:
        parts.append(compare(">=", chunk.lower, 0))
    if chunk.upper is not None:
        parts.append(compare("<", chunk.upper, 0))
    return " AND ".join(parts), params
