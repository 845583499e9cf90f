"""What a statement logged as text does to the captured tables' schemas or partitions, by the DDL policy
(`stream.on_schema_change`): refused, passed over (already in a table's chunks, ignored, an online schema change's
cut-over), or followed; and the tables it names that the pipeline would capture."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingest.config import TableSelection
from ingest.errors import SchemaChangeError
from ingest.model.changes import AlterColumns
from ingest.model.position import BinlogPosition
from ingest.source.binlog.ddl import (
    CUT_OVER,
    OnlineSchemaChanges,
    Swap,
    alter_columns,
    ddl_kind,
    ddl_tables,
    named_tables,
    partition_tables,
    renamed_tables,
)

log = logging.getLogger(__name__)

FOLLOWED = ("alter", "truncate", "swap", "drop", "partition")
"""The kinds of DDL statement `on_ddl="evolve"` yields as a `DdlStatement` to follow: `ddl.ddl_kind`'s "alter" and
"truncate"; "swap", an online schema change tool's helper table renamed to a captured table's name (`ddl.Swap`);
"drop", a captured table dropped or renamed away (its capture ends: `forget`); "partition", a partition statement
that removes or moves rows without row events (`ddl.partition_tables`: followed when it drops or truncates
partitions whose bounds the job knows, else refused or copied again)."""


@dataclass(frozen=True)
class Followed:
    """A statement to follow (`on_ddl="evolve"`): the captured tables it changes, its kind (one of FOLLOWED, or what
    `recopy` copies again), what it said of their columns, and the online schema change it swaps in, if any."""

    tables: tuple[tuple[str, str], ...]
    kind: str
    said: AlterColumns | None
    swap: Swap | None


class SchemaStatements:
    """Judges each statement logged as text against the captured tables (`tables`, shared with the reader, which
    forgets a table dropped): `read` refuses it, passes it over, or says how to follow it."""

    def __init__(
        self,
        tables: set[tuple[str, str]],
        contained_until: Mapping[tuple[str, str], BinlogPosition],
        planned_at: Mapping[tuple[str, str], BinlogPosition],
        on_ddl: str,
        recopy: bool,
        new_tables: TableSelection | None,
    ) -> None:
        self._tables = tables
        self._contained_until = contained_until
        """Per table, up to where the snapshot's chunks hold every change (shared with the reader)."""
        self._planned_at = planned_at
        """Per table, a position before its snapshot's schema was loaded: a DDL up to here is in that schema."""
        self.unfollowed: dict[tuple[str, str], tuple[str, BinlogPosition]] = {}
        """Per table, the first DDL passed over as contained in its chunks that came after its schema was loaded:
        it changed the table during its snapshot, so the rows after its chunks may have columns the schema the
        job decodes with has not."""
        self.on_ddl = on_ddl
        self.recopy = recopy
        """With `on_ddl="evolve"`, a DDL it cannot follow is yielded too (its table is copied again)."""
        self.new_tables = new_tables
        """When set, a DDL statement naming a table it matches that is not captured is reported (`named`)."""
        self._osc = OnlineSchemaChanges()

    def read(self, query: str, default_db: str, end: BinlogPosition, sql_mode: Any) -> Followed | None:
        """The statement at `end` that changes captured tables' schemas or partitions: refused (raised), passed
        over or ignored (None), or to follow with `on_ddl="evolve"`. None too for any other statement."""
        touched = []
        for t in ddl_tables(query, default_db, self._tables):
            # A table snapshotted after the statement already has what it did.
            if (contained := self._contained_until.get(t)) is None or end > contained:
                touched.append(t)
            elif (planned := self._planned_at.get(t)) is None or end > planned:
                self.unfollowed.setdefault(t, (query, end))
        partitions = [
            t
            for t in partition_tables(query, default_db, self._tables)
            if (contained := self._contained_until.get(t)) is None or end > contained
        ]
        if partitions and self.on_ddl != "evolve":  # followed, copied again or refused downstream
            _refuse_partition_change(query, partitions, end)
        touched += [t for t in partitions if t not in touched]
        osc = self._osc.read(query, default_db, self._tables)
        if not touched:
            return None
        if osc == CUT_OVER and self.on_ddl == "evolve":
            log.info("%s: renamed away for an online schema change's cut-over: %s", touched, query[:200])
            return None
        kind = "swap" if isinstance(osc, Swap) else "partition" if partitions else ddl_kind(query)
        if kind == "rename":
            # Renamed away: gone under its name; unless another table takes the name (not a swap).
            into = {new for _, new in renamed_tables(query, default_db)}
            kind = "replace" if any(t in into for t in touched) else "drop"
        self._schema_change(query, touched, end, kind)
        if self.on_ddl != "evolve":
            return None
        swap = osc if isinstance(osc, Swap) else None
        said = swap.said if swap is not None else alter_columns(query, default_db, sql_mode)
        return Followed(tuple(touched), kind, said, swap)

    def named(self, query: str, default_db: str) -> tuple[tuple[str, str], ...]:
        """The tables the statement names that the pipeline's patterns match and that are not captured (nor an
        online schema change tool's helper): the job copies them."""
        if self.new_tables is None:
            return ()
        named = named_tables(query, default_db)
        return tuple(
            t
            for t in named
            if t not in self._tables and self.new_tables.matches(*t) and self._osc.helper(t, self._tables) is None
        )

    def _schema_change(self, query: str, touched: list[tuple[str, str]], end: BinlogPosition, kind: str) -> None:
        """Apply the policy's refusals; returns when the statement is to be ignored or evolved."""
        names = ", ".join(f"{db}.{t}" for db, t in touched)
        if self.on_ddl == "ignore":
            log.warning("ignoring schema change of %s at %s: %s", names, end, query[:200])
            return
        if self.on_ddl == "evolve" and (kind in FOLLOWED or self.recopy):
            return
        if self.on_ddl == "evolve":
            why = (
                "a table replaced by another (CREATE OR REPLACE, a RENAME that gives its name to a table that is no "
                "online schema change tool's helper) cannot be followed"
            )
            way_out = "Snapshot the table again"
        else:
            why = "`stream.on_schema_change` is `fail`"
            way_out = (
                "Set `stream.on_schema_change: evolve` to follow the DDL Iceberg can follow (docs/config.md, "
                '"Schema changes"), or snapshot the table again'
            )
        raise SchemaChangeError(
            f"the schema of {names} changed at binlog position {end}: {query[:200]!r}; {why}. Everything before "
            f"the statement is committed. {way_out} "
            f"(`ingest resnapshot --config ... --table {touched[0][0]}.{touched[0][1]}`)"
        )


def _refuse_partition_change(query: str, touched: list[tuple[str, str]], end: BinlogPosition) -> None:
    """A partition or tablespace statement that deletes, moves or brings in rows without row events (DROP,
    TRUNCATE, EXCHANGE, CONVERT PARTITION; DISCARD, IMPORT TABLESPACE) stops the job: the rows it removed would
    stay in Iceberg, and those it brought would be missing."""
    names = ", ".join(f"{db}.{t}" for db, t in touched)
    raise SchemaChangeError(
        f"{names}: the statement at binlog position {end} removes, moves or brings in rows of whole partitions "
        f"or tablespaces without logging them ({query[:200]!r}); the job does not know which rows they were, "
        f"and none was applied. Everything before the statement is committed. Snapshot the table again "
        f"(`ingest resnapshot --config ... --table {touched[0][0]}.{touched[0][1]}`)"
    )
