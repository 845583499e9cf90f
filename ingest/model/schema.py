"""A captured table as both sides see it: its columns in order, its keys, and how MySQL quotes its names."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pyarrow as pa

from ingest.model.columns import SourceColumn, TargetColumn, map_columns

OCCURRENCE_COLUMN = "_ingest_occurrence"
"""The target's last column for a table without a key (`TableSchema.keyless`): the rows that hold the same values
are numbered 1..n in it, so that a delete of one of n alike rows removes one (the n-th) and a reader sees n rows."""


def quote(identifier: str) -> str:
    """A MySQL identifier in backticks, with backticks inside doubled."""
    return "`" + identifier.replace("`", "``") + "`"


SERVER_ORDERED_TYPES = frozenset({"uuid", "inet4", "inet6"})
"""Key types whose values the job holds as text but the server orders otherwise: compared by the server."""


@dataclass(frozen=True)
class TableSchema:
    """A captured table: its columns in order, its primary key, and the key the snapshot splits on. A table with
    neither a primary key nor a unique key over NOT NULL columns has no keys (`keyless`)."""

    database: str
    table: str
    columns: tuple[SourceColumn, ...]
    primary_key: tuple[str, ...]
    chunk_key: tuple[str, ...]
    collations: tuple[str | None, ...]
    """Collation of each chunk key column (None for non-string columns)."""

    @property
    def keys_ordered_in_python(self) -> bool:
        """Python orders the chunk key's values as the server does: no collation decides (strings), and no type
        whose order only the server knows (MariaDB's UUID orders by its swapped groups, INET4 and INET6 by their
        bytes, not by their text)."""
        return all(c is None for c in self.collations) and not any(
            self.key_column(k).data_type in SERVER_ORDERED_TYPES for k in self.chunk_key
        )

    @property
    def table_id(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def keyless(self) -> bool:
        """No key tells the rows apart: the table is copied as a multiset, its rows numbered in
        `OCCURRENCE_COLUMN`, read in one chunk and changed by whole rows."""
        return not self.primary_key

    @property
    def quoted(self) -> str:
        return f"{quote(self.database)}.{quote(self.table)}"

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def key_positions(self) -> tuple[int, ...]:
        names = self.column_names
        return tuple(names.index(k) for k in self.chunk_key)

    def primary_key_positions(self) -> tuple[int, ...]:
        """Where the primary key (the Iceberg identifier) sits in a row; may differ from the chunk key."""
        names = self.column_names
        return tuple(names.index(k) for k in self.primary_key)

    def key_column(self, name: str) -> SourceColumn:
        return next(c for c in self.columns if c.name == name)


def source_targets(schema: TableSchema) -> list[TargetColumn]:
    """The Iceberg columns of the source table's columns, in order; key columns are always required (identifier
    fields must be)."""
    targets = map_columns(schema.table_id, schema.columns)
    keys = set(schema.primary_key)
    return [dataclasses.replace(t, nullable=False) if t.name in keys else t for t in targets]


OCCURRENCE_TARGET = TargetColumn(OCCURRENCE_COLUMN, "BIGINT", pa.int64(), False)


def target_columns(schema: TableSchema) -> list[TargetColumn]:
    """The target's Iceberg columns: the source's (`source_targets`), then, for a table without a key, the number
    of each row among the rows alike (`OCCURRENCE_COLUMN`)."""
    return [*source_targets(schema), *([OCCURRENCE_TARGET] if schema.keyless else [])]
