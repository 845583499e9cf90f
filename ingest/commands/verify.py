"""`ingest verify`: MySQL vs Iceberg, row count and checksum per key range, naming every range that differs.

MySQL rows go through the same converters as the snapshot, Iceberg rows are read with pyiceberg (a second
engine besides Spark), and both are reduced to one 64-bit digest per row. A range's checksum is the XOR
of its rows' digests. Ranges follow the chunk plan, so membership is decided by the server.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ingest.config import PipelineConfig
from ingest.model.columns import rows_to_record_batch
from ingest.model.schema import OCCURRENCE_COLUMN, TableSchema, quote, source_targets
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.source.mysql import connect
from ingest.source.snapshot.chunks import Chunk, Key, range_predicate
from ingest.state.table import StateTable
from ingest.text import counted

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RangeReport:
    table_id: str
    lower: Key | None
    upper: Key | None
    mysql_rows: int
    iceberg_rows: int
    mysql_checksum: int
    iceberg_checksum: int

    @property
    def same(self) -> bool:
        return self.mysql_rows == self.iceberg_rows and self.mysql_checksum == self.iceberg_checksum


def _canonical(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None).isoformat() + "Z"
    return value


def row_digest(values: Sequence[Any]) -> int:
    text = repr(tuple(_canonical(v) for v in values)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def _ranges(plan: list[Chunk] | None, count: int) -> list[tuple[Key | None, Key | None]]:
    if not plan:
        return [(None, None)]
    per = max(1, -(-len(plan) // count))
    groups = [plan[i : i + per] for i in range(0, len(plan), per)]
    return [(g[0].lower, g[-1].upper) for g in groups]


def verify_table(
    config: PipelineConfig, schema: TableSchema, plan: list[Chunk] | None, ranges: int, catalog: Any
) -> list[RangeReport]:
    if schema.keyless:
        return _verify_alike(config, schema, catalog)
    targets = source_targets(schema)
    names = [t.name for t in targets]
    key_positions = schema.key_positions()
    namespace, name = config.target_for(schema.database, schema.table)
    iceberg = catalog.load_table((namespace, name)).scan().to_arrow().to_pylist()
    in_iceberg: dict[Key, int] = {}
    # Keys held by more than one Iceberg row (a row written twice): the rows beyond the first of each key.
    repeated: Counter[Key] = Counter()
    for row in iceberg:
        values = [row[n] for n in names]
        key = tuple(_canonical(values[i]) for i in key_positions)
        if key in in_iceberg:
            repeated[key] += 1
        in_iceberg[key] = row_digest(values)
    reports = []
    columns = ", ".join(quote(n) for n in schema.column_names)
    with connect(config.source, streaming=True) as conn:
        for lower, upper in _ranges(plan, ranges):
            where, params = range_predicate(schema.chunk_key, lower, upper)
            m_rows = i_rows = m_sum = i_sum = 0
            with conn.cursor() as cur:
                cur.execute(f"SELECT {columns} FROM {schema.quoted} WHERE {where}", params)
                while batch := cur.fetchmany(10_000):
                    for values in rows_to_record_batch(targets, batch).to_pylist():
                        row = [values[n] for n in names]
                        digest = row_digest(row)
                        m_rows += 1
                        m_sum ^= digest
                        other = in_iceberg.pop(tuple(_canonical(row[i]) for i in key_positions), None)
                        if other is not None:
                            i_rows += 1
                            i_sum ^= other
            reports.append(RangeReport(schema.table_id, lower, upper, m_rows, i_rows, m_sum, i_sum))
    if repeated:
        reports.append(RangeReport(schema.table_id, None, None, 0, sum(repeated.values()), 0, 0))
        log.error(
            "%s: %d keys are held by more than one row in Iceberg, e.g. %s",
            schema.table_id,
            len(repeated),
            list(repeated)[:3],
        )
    if in_iceberg:
        extra = 0
        for digest in in_iceberg.values():
            extra ^= digest
        reports.append(RangeReport(schema.table_id, None, None, 0, len(in_iceberg), 0, extra))
        log.error(
            "%s: %d rows in Iceberg have keys not in MySQL, e.g. %s",
            schema.table_id,
            len(in_iceberg),
            list(in_iceberg)[:3],
        )
    return reports


def _verify_alike(config: PipelineConfig, schema: TableSchema, catalog: Any) -> list[RangeReport]:
    """A table without a key, as one range: MySQL's rows and Iceberg's as multisets (how many rows hold each
    digest; the checksum sums the digests, as XOR would cancel a pair of alike rows), and the Iceberg rows'
    numbers among alike rows, which must be 1..n for the binlog phase to delete the right one."""
    targets = source_targets(schema)
    names = [t.name for t in targets]
    in_iceberg: Counter[int] = Counter()
    numbers: dict[int, list[int]] = {}
    for row in catalog.load_table(config.target_for(schema.database, schema.table)).scan().to_arrow().to_pylist():
        digest = row_digest([row[n] for n in names])
        in_iceberg[digest] += 1
        numbers.setdefault(digest, []).append(row[OCCURRENCE_COLUMN])
    in_mysql: Counter[int] = Counter()
    columns = ", ".join(quote(n) for n in schema.column_names)
    with connect(config.source, streaming=True) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT {columns} FROM {schema.quoted}")
        while batch := cur.fetchmany(10_000):
            for values in rows_to_record_batch(targets, batch).to_pylist():
                in_mysql[row_digest([values[n] for n in names])] += 1

    def checksum(rows: Counter[int]) -> int:
        return sum(digest * count for digest, count in rows.items()) % 2**64

    reports = [
        RangeReport(
            schema.table_id, None, None, in_mysql.total(), in_iceberg.total(), checksum(in_mysql), checksum(in_iceberg)
        )
    ]
    misnumbered = [d for d, held in numbers.items() if sorted(held) != list(range(1, len(held) + 1))]
    if misnumbered:
        reports.append(RangeReport(schema.table_id, None, None, 0, len(misnumbered), 0, 0))
        log.error(
            "%s: %d row values are not numbered 1..n among their alike rows in %s",
            schema.table_id,
            len(misnumbered),
            OCCURRENCE_COLUMN,
        )
    return reports


def verify(config: PipelineConfig, tables: Sequence[str] = (), ranges: int = 16) -> bool:
    """Print a line per range that differs and a summary per table; True when everything matches."""
    from ingest.source.discovery import discover

    info = discover(config.source, config.tables, config.table_options)
    state = StateTable.open(config.sink, config.name)
    catalog = load_pyiceberg_catalog(config.sink)
    wanted = set(tables)
    unknown = wanted - {s.table_id for s in info.schemas}
    if unknown:
        from ingest.errors import ConfigError

        raise ConfigError(f"--table {sorted(unknown)[0]} is not among the pipeline's tables")
    all_same = True
    for schema in info.schemas:
        if wanted and schema.table_id not in wanted:
            continue
        reports = verify_table(config, schema, state.plan(schema.table_id), ranges, catalog)
        bad = [r for r in reports if not r.same]
        rows = sum(r.mysql_rows for r in reports)
        for r in bad:
            print(
                f"DIFF {r.table_id} keys [{r.lower}, {r.upper}): mysql {r.mysql_rows} rows "
                f"checksum {r.mysql_checksum:016x}, iceberg {r.iceberg_rows} rows checksum {r.iceberg_checksum:016x}"
            )
        print(
            f"{'OK  ' if not bad else 'FAIL'} {schema.table_id}: {counted(rows, 'row')} in "
            f"{counted(len(reports), 'range')}, {len(bad)} differ"
        )
        all_same = all_same and not bad
    return all_same
