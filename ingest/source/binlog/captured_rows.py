"""The row events of the captured tables, decoded with the schema in force, and the foreign key actions row events
set off on captured tables (which the server does not log)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ingest.config import SourceConfig
from ingest.errors import SchemaChangeError
from ingest.model.changes import ForeignKey, KeyAction, RowChange, Transaction
from ingest.model.position import BinlogPosition
from ingest.model.schema import TableSchema
from ingest.source.binlog import table_maps
from ingest.source.binlog.binlog_values import RowDecoder, row_images
from ingest.source.binlog.foreign_keys import Actions, load_actions, named_parent_rows, update_changed
from ingest.source.binlog.quick_events import Rows
from ingest.source.binlog.row_events import RowEvents, event_kind
from ingest.source.mysql import connect

log = logging.getLogger(__name__)


class CapturedRows:
    """Turns row events into the captured tables' row changes and foreign key actions. `tables` and
    `contained_until` are shared with the reader (it forgets a table dropped; a position passed is dropped here),
    `unfollowed` with its schema statements (a DDL passed over during a table's snapshot)."""

    def __init__(
        self,
        source: SourceConfig,
        schemas: Sequence[TableSchema],
        tables: set[tuple[str, str]],
        contained_until: dict[tuple[str, str], BinlogPosition],
        unfollowed: dict[tuple[str, str], tuple[str, BinlogPosition]],
    ) -> None:
        self.schemas = {(s.database, s.table): s for s in schemas}
        self._decoders = {k: RowDecoder(s.columns) for k, s in self.schemas.items()}
        self._row_events = RowEvents()
        self._tables = tables
        self._contained_until = contained_until
        self._unfollowed = unfollowed
        self._actions = self._load_actions(source)

    @property
    def chained(self) -> dict[str, list[ForeignKey]]:
        """Per captured table (by id): its foreign keys whose actions act on captured tables, itself too."""
        return {f"{db}.{table}": keys for (db, table), keys in self._actions.chained.items()}

    def set_schema(self, schema: TableSchema) -> None:
        key = (schema.database, schema.table)
        self.schemas[key] = schema
        self._decoders[key] = RowDecoder(schema.columns)

    def forget(self, key: tuple[str, str]) -> None:
        self.schemas.pop(key, None)
        self._decoders.pop(key, None)

    def add(
        self, event: Any, end: BinlogPosition, current: Transaction | None, in_xa: bool, at: BinlogPosition
    ) -> Transaction | None:
        """A row event: its changes of captured tables, and the foreign key actions it sets off, added to the
        transaction under way (begun here if need be). Returns that transaction. `in_xa`: the event is in an XA
        transaction's first half; `at`: where its event group begins (for a refusal's message)."""
        key = (event.schema, event.table)
        images = None
        if key in self._actions.watched:
            images, acted = self._key_actions(key, event_kind(event), event, end, in_xa, at)
            if acted:
                current = current if current is not None else Transaction(end)
                current.actions.extend(acted)
        if key not in self._tables:
            return current
        contained = self._contained_until.get(key)
        # An XA transaction's rows count at its commit, which a chunk may or may not have seen: they are held, and
        # compared with the chunks at XA COMMIT (`_decided`).
        if contained is not None and not in_xa:
            if end <= contained:
                return current
            del self._contained_until[key]  # positions only grow: no more lookups for this table
        if key in self._unfollowed:
            self._refuse_unfollowed(key, event)
        if images is None:
            images = self._images(key, event_kind(event), event, end, at)
        return _with_changes(current, key, end, images)

    def add_quick(
        self,
        table: Any,
        rows: Rows,
        data: bytes,
        dbms: str,
        end: BinlogPosition,
        current: Transaction | None,
        in_xa: bool,
    ) -> tuple[bool, Transaction | None]:
        """A row event read in place (`quick_events`), as `add` takes it: (False, `current`) when it is one only the
        library path reads (a table whose foreign key actions are watched or whose DDL was passed over, rows not
        decoded here), else (True, the transaction under way)."""
        key = (table.schema, table.table)
        if key in self._actions.watched or key in self._unfollowed:
            return False, current
        if key not in self._tables:
            return True, current
        contained = self._contained_until.get(key)
        if contained is not None and not in_xa and end <= contained:
            return True, current
        images = self._row_events.decoded(key, table, rows, self.schemas[key].columns, data, dbms, end)
        if images is None:
            return False, current
        if contained is not None and not in_xa:
            del self._contained_until[key]  # positions only grow: no more lookups for this table
        return True, _with_changes(current, key, end, images)

    def _library_row(
        self, key: tuple[str, str], kind: str, row: dict[str, Any], at: BinlogPosition
    ) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]:
        before, after = row_images(kind, row)
        return (
            None if before is None else self._row(key, before, at),
            None if after is None else self._row(key, after, at),
        )

    def _row(self, key: tuple[str, str], values: dict[str, Any], at: BinlogPosition) -> tuple[Any, ...]:
        decode = self._decoders[key]
        if not decode.matches(values):
            # Rows are matched by the names the server logs (binlog_row_metadata=FULL), or by position with the
            # schema in force (table_maps.by_position): a row of other columns is never misread.
            schema = self.schemas[key]
            raise SchemaChangeError(
                f"a binlog row of {schema.table_id} at {at} has columns {sorted(values)}, but the job "
                f"expects {sorted(schema.column_names)}: its schema changed without a DDL statement the job could "
                f"follow. Snapshot the table again: `ingest resnapshot --config ... --table {schema.table_id}`"
            )
        return decode(values)

    def _load_actions(self, source: SourceConfig) -> Actions:
        """The foreign key actions that can reach the captured tables, as the server shows them now."""
        with connect(source) as conn:
            actions = load_actions(conn, self._tables)
        if actions:
            log.info(
                "foreign keys with ON DELETE / ON UPDATE actions reach captured tables from %s; the server does not "
                "log what they change, so a change of these tables that may act stops the job",
                ", ".join(sorted(f"{db}.{t}" for db, t in actions.watched)),
            )
        return actions

    def _images(
        self, key: tuple[str, str], kind: str, event: Any, end: BinlogPosition, at: BinlogPosition
    ) -> list[Any]:
        """(before, after) per row of a captured table's row event, decoded with the schema in force."""
        images = self._row_events.rows(key, kind, event, self.schemas[key].columns, end)
        if images is None:  # an event only the library reads
            images = [self._library_row(key, kind, row, at) for row in event.rows]
        return images

    def _key_actions(
        self, key: tuple[str, str], kind: str, event: Any, end: BinlogPosition, in_xa: bool, at: BinlogPosition
    ) -> tuple[list[Any] | None, list[KeyAction]]:
        """What the foreign key actions of a parent table's row event did to captured tables (a stop where the
        job cannot apply them), and the event's rows when they were decoded for that (a captured parent)."""

        def copied_after(table: tuple[str, str]) -> bool:
            # An XA transaction's first half counts at its commit, later than `end`: its actions are kept, and
            # judged against the chunks at commit like its changes (ingest.query.batch).
            contained = self._contained_until.get(table)
            return contained is not None and end <= contained and not in_xa

        images, schemas = None, self.schemas
        if key in self._tables and key not in self._unfollowed and kind != "insert":
            images = self._images(key, kind, event, end, at)
        elif key not in self._tables and kind != "insert" and (named := named_parent_rows(event, kind)) is not None:
            parent, images = named  # a parent not captured, its columns named by the server
            schemas = {**self.schemas, key: parent}
        changed = update_changed(event, kind) if images is None else _key_changed(images, schemas[key])
        acted = self._actions.act(key, kind, event.flags, end, changed, copied_after, images, schemas)
        return (images if key in self._tables else None), acted

    def _refuse_unfollowed(self, key: tuple[str, str], event: Any) -> None:
        """A row after a DDL passed over during the table's snapshot: refused when matched by position."""
        query, at = self._unfollowed[key]
        table_maps.refuse_by_position_after_ddl(
            event, self.schemas[key].table_id, query, at, "before the high watermark of the first of its chunks read"
        )


def _with_changes(
    current: Transaction | None, key: tuple[str, str], end: BinlogPosition, images: list[Any]
) -> Transaction:
    """The transaction under way (begun at `end` if none), with a row event's (before, after) images as changes."""
    current = current if current is not None else Transaction(end)
    table_id = f"{key[0]}.{key[1]}"
    # A list, not a generator: most events hold one row, and a generator costs more than the row (bench.reader).
    current.changes += [RowChange(table_id, end, i, before, after) for i, (before, after) in enumerate(images)]
    return current


def _key_changed(images: list[Any], schema: TableSchema) -> Callable[[Sequence[str]], bool]:
    """For `Actions.act`: whether an update's rows, decoded with the schema the job follows, changed any of the
    columns asked about (True when one is not in the schema)."""
    names = schema.column_names

    def changed(columns: Sequence[str]) -> bool:
        spots = [names.index(c) for c in columns if c in names]
        return len(spots) < len(columns) or any(
            b is None or a is None or any(b[p] != a[p] for p in spots) for b, a in images
        )

    return changed
