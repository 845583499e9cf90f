"""A captured table as both sides see it: its columns in order, its keys, and how MySQL quotes its names."""

from __future__ import annotations

from dataclasses import dataclass

from ingest.model.columns import SourceColumn


def quote(identifier: str) -> str:
    """A MySQL identifier in backticks, with backticks inside doubled."""
    return "`" + identifier.replace("`", "``") + "`"


@dataclass(frozen=True)
class TableSchema:
    """A captured table: its columns in order, its primary key, and the key the snapshot splits on."""

    database: str
    table: str
    columns: tuple[SourceColumn, ...]
    primary_key: tuple[str, ...]
    chunk_key: tuple[str, ...]
    collations: tuple[str | None, ...]
    """Collation of each chunk key column (None for non-string columns)."""

    @property
    def table_id(self) -> str:
        return f"{self.database}.{self.table}"

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
