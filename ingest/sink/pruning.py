"""What a MERGE may read of its target: target-only predicates built from the batch (issue 31).

A MERGE's ON clause joins every row of the target with the batch: without more, Spark scans and shuffles the
whole table for every batch, so a batch costs what the table holds. Spark pushes the ON clause's target-only
conjuncts into the target scan (Iceberg prunes files, row groups and partitions by them, Spark filters the rows
it reads before the join's shuffle), so the job adds predicates that every row the batch can match satisfies:

- ranges of the first key column, `t.k BETWEEN lo AND hi OR ...` (split at the widest gaps between the keys):
  implied by `t.k = s.k`, so the MERGE means exactly what it meant without them. Iceberg drops the data files
  (and Parquet row groups) whose min/max statistics miss every range, and projects them onto a partition spec
  that partitions by the key (`bucket`, `truncate`, identity), so recent keys of an AUTO_INCREMENT table read
  only the newest files;
- the keys themselves, `t.k IN (...)`, for a batch of at most MAX_IN_VALUES keys: a larger list costs more to
  plan than it saves (Iceberg itself stops using an IN of more than 200 values for pruning). A larger batch's keys
  reach the scan as a Bloom filter Spark builds from the batch at run time (session_conf.py), which drops the
  rows of other keys before the shuffle;
- the same for other columns the target is partitioned by (`days(created_at)`), from the values the batch's
  rows may hold there now: the before images of its updates and deletes, and its after images. That is implied
  only while the target holds exactly what the source held before the batch (or, after an unknown commit
  outcome, after it), which the caller decides.

Values become SQL literals of the column's exact Spark type, rendered from the Arrow values the batch itself
is written with, so a literal compares as the stored value does; a type with no exact literal form (floating
point) gets no predicate, which only means less pruning.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa

from ingest.model.columns import TargetColumn, quote_identifier

MAX_RANGES = 16
"""Ranges of the first key column, at most: enough to keep a few hot regions apart (new rows, a batch of old
ones), few enough that every file's statistics are checked against them cheaply."""

MAX_IN_VALUES = 200
"""Distinct values of one column, at most, listed as `IN (...)`; Iceberg's own limit for pruning by an IN."""

Key = tuple[Any, ...]


def target_predicate(
    targets: Sequence[TargetColumn],
    key: Sequence[str],
    keys: Collection[Key],
    columns: Mapping[str, Collection[Any]] | None = None,
    alias: str = "t",
) -> str | None:
    """The target-only conjunction for a MERGE of `keys` (driver values, in the order of `key`), or None.

    `columns` maps other target columns to every value the target's rows of this batch may hold there (None
    included, for NULL); pass only columns the caller knows the target agrees with the source on.
    """
    if not keys:
        return None
    by_name = {t.name: t for t in targets}
    parts: list[str] = []
    for i, name in enumerate(key):
        parts.extend(_column_predicates(by_name[name], alias, {k[i] for k in keys}, ranges=i == 0))
    for name, values in (columns or {}).items():
        parts.extend(_column_predicates(by_name[name], alias, values, ranges=True))
    return " AND ".join(parts) if parts else None


def _column_predicates(target: TargetColumn, alias: str, values: Collection[Any], ranges: bool) -> list[str]:
    """The list of values first (Spark evaluates conjuncts in order: the hash lookup discards most rows), then the
    ranges: of the first key column and of other columns always, of any column whose values are too many to list."""
    present = [v for v in values if v is not None]
    found = sorted_values(target, present)
    if found is None:
        return []
    ordered, render = found
    column = f"{alias}.{quote_identifier(target.name)}"
    null = [f"{column} IS NULL"] if len(present) < len(values) else []
    if not ordered:
        return null
    alternatives = []
    if len(ordered) <= MAX_IN_VALUES:
        alternatives.append([f"{column} IN ({', '.join(map(render, ordered))})"])
    if ranges or len(ordered) > MAX_IN_VALUES:
        bounds = _ranges(ordered)
        alternatives.append([f"{column} BETWEEN {render(lo)} AND {render(hi)}" for lo, hi in bounds])
    return [_any([*terms, *null]) for terms in alternatives]


def _any(terms: Sequence[str]) -> str:
    return terms[0] if len(terms) == 1 else f"({' OR '.join(terms)})"


def sorted_values(target: TargetColumn, values: Sequence[Any]) -> tuple[list[Any], Callable[[Any], str]] | None:
    """The distinct values in the order Iceberg and Spark compare them, converted as the batch's rows are, with
    what renders one as a Spark SQL literal; None when the column's type has no exact literal form."""
    array = target.to_array(list(values))
    render = _renderer(array.type)
    if render is None:
        return None
    return sorted({v for v in array.to_pylist() if v is not None}), render


def _renderer(arrow_type: Any) -> Callable[[Any], str] | None:
    if pa.types.is_int32(arrow_type):
        return lambda v: str(int(v))
    if pa.types.is_int64(arrow_type):
        return lambda v: f"{int(v)}L"
    if pa.types.is_decimal(arrow_type):
        spark = f"DECIMAL({arrow_type.precision},{arrow_type.scale})"
        return lambda v: f"CAST('{format(Decimal(v), 'f')}' AS {spark})"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        # Hex bytes cast to a string: exact for any text, with nothing to escape.
        return lambda v: f"CAST(X'{v.encode('utf-8').hex()}' AS STRING)"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return lambda v: f"X'{bytes(v).hex()}'"
    if pa.types.is_boolean(arrow_type):
        return lambda v: "TRUE" if v else "FALSE"
    if pa.types.is_date32(arrow_type):
        return lambda v: f"DATE '{v.isoformat()}'"
    if pa.types.is_timestamp(arrow_type) and arrow_type.unit == "us":
        if arrow_type.tz is None:
            return lambda v: f"TIMESTAMP_NTZ '{v.isoformat(sep=' ', timespec='microseconds')}'"
        # An instant: its microseconds since the epoch, whatever the session's time zone.
        return lambda v: f"timestamp_micros({_epoch_micros(v)}L)"
    return None


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _epoch_micros(value: dt.datetime) -> int:
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _ranges(ordered: Sequence[Any]) -> list[tuple[Any, Any]]:
    """Up to MAX_RANGES ranges covering every value, split at the widest gaps between neighbours (those much wider
    than the median one); one range when the values have no distance (strings, bytes)."""
    if len(ordered) == 1:
        return [(ordered[0], ordered[0])]
    gaps = [_distance(a, b) for a, b in zip(ordered, ordered[1:], strict=False)]
    widths = [g for g in gaps if g is not None]
    if len(widths) < len(gaps):
        return [(ordered[0], ordered[-1])]
    # Only gaps far wider than the typical one are worth a cut: evenly spread keys keep (about) one range.
    wide = 8 * statistics.median(widths)
    widest = sorted(range(len(widths)), key=widths.__getitem__, reverse=True)[: MAX_RANGES - 1]
    out: list[tuple[Any, Any]] = []
    start = 0
    for cut in sorted(i for i in widest if widths[i] > wide):
        out.append((ordered[start], ordered[cut]))
        start = cut + 1
    out.append((ordered[start], ordered[-1]))
    return out


def _distance(a: Any, b: Any) -> float | None:
    if isinstance(a, bool):
        return None
    if isinstance(a, int | Decimal):
        return float(b - a)
    if isinstance(a, dt.datetime):
        return float((b - a).total_seconds())
    if isinstance(a, dt.date):
        return float((b - a).days)
    return None
