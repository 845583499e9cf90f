"""A batch applied to a target by the driver, with pyiceberg, instead of a Spark MERGE.

A MERGE costs Spark a plan, a job and a commit, and turns the batch's Arrow into Spark rows and back into Parquet:
about a second of CPU for a few rows, and most of the binlog phase's CPU on a catch-up (issue 51). The driver takes
the same change in one snapshot carrying the batch's end offset, as a MERGE's does, in one of three ways:
- `append`: a batch that only creates rows (`created_keys`) is appended, whatever the target's size (written with
  the rows of the target's smallest data file while that is small, which it replaces: no file per batch);
- `rewrite`: a small target (`stream.driver_apply_max_rows`, a part of at most `MAX_KEYS` keys, a one-column key
  of integers or strings) has the data files holding the batch's keys rewritten without them (copy-on-write);
- `position`: any other target's rows of the batch's keys are deleted by position (ingest/sink/position_deletes.py,
  merge-on-read, as the MERGE of a target with `write.merge.mode=merge-on-read` does), unless
  `stream.position_deletes` is off.
The batch's final rows are added in each. What a table holds after it is what the MERGE would leave: per key of the
batch, its final row or nothing.

Only where that is plainly so: an unpartitioned format 2 target of Parquet files, main (not a copy branch), a table
with a key, with no column the batch does not set. Everything else is MERGEd by Spark.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ingest import metrics
from ingest.config import StreamConfig
from ingest.errors import CommitConflictError
from ingest.model.position import Watermark
from ingest.model.schema import TableSchema
from ingest.sink.data_files import DataFileWriter, writable_from_arrow
from ingest.sink.merge import MAX_ATTEMPTS, OP_COLUMN
from ingest.sink.position_deletes import may_hold, stage_by_position
from ingest.sink.targets import table_of
from ingest.sink.transaction import open_transaction, overwrite_files

log = logging.getLogger(__name__)

MAX_KEYS = 10_000
"""The most keys a batch the driver deletes from may hold: pyiceberg's delete filter grows with them (20,000 keys
took 2.1 s on a table of 100,000 rows, 50,000 took 6.4 s; Spark's MERGE takes a second or two), and a batch that
large on a small table is a catch-up, where a MERGE's fixed cost does not matter."""


class DriverApply(NamedTuple):
    table: Any
    """The target's pyiceberg table."""
    how: str
    """"append", "rewrite" or "position" (see the module)."""


def driver_target(
    catalog: Any,
    names: tuple[str, str],
    target: str,
    schema: TableSchema,
    stream: StreamConfig,
    rows: pa.Table,
    append: bool,
) -> DriverApply | None:
    """How the driver applies the batch `rows` to the target (see the module), or None when Spark MERGEs it. A
    target with a column the batch does not set (added by hand) is MERGEd: an update keeps its value."""
    max_rows = stream.driver_apply_max_rows
    if max_rows == 0 or schema.keyless or target != table_of(target):
        return None
    rewrite = not append and rows.num_rows <= MAX_KEYS and len(schema.primary_key) == 1
    if not (append or rewrite or stream.position_deletes):
        return None  # known without loading the table
    table = catalog.load_table(names)
    if table.format_version != 2 or not writable_from_arrow(table):
        return None
    if sorted(f.name for f in table.schema().fields) != sorted(c for c in rows.column_names if c != OP_COLUMN):
        return None
    if append:
        return DriverApply(table, "append")
    if rewrite and _small_with_plain_key(table, schema, max_rows):
        return DriverApply(table, "rewrite")
    return DriverApply(table, "position") if stream.position_deletes else None


def _small_with_plain_key(table: Any, schema: TableSchema, max_rows: int) -> bool:
    """At most `max_rows` rows, and a (one-column) key of integers or strings."""
    from pyiceberg.types import IntegerType, LongType, StringType

    key = table.schema().find_field(schema.primary_key[0])
    if not isinstance(key.field_type, (IntegerType, LongType, StringType)):
        return False
    current = table.current_snapshot()
    summary = current.summary if current is not None else None
    return int(summary.additional_properties.get("total-records", 0)) <= max_rows if summary is not None else True


def apply_in_driver(
    driver: DriverApply,
    target: str,
    schema: TableSchema,
    rows: pa.Table,
    end: Watermark,
    properties: dict[str, str],
    read_offset: Any,
) -> bool:
    """Apply the batch `rows` (`batch_arrow`: per key its final row, op U, or its delete, op D) to the driver's
    table (Spark's `target`), in one snapshot tagged with `properties`; False when the table already holds it. A
    conflict is retried from fresh metadata, as a MERGE is."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    for attempt in range(1, MAX_ATTEMPTS + 1):
        done = read_offset()
        if done is not None and done >= end.position:
            return False  # committed before (a replay, or a commit that raised after succeeding)
        try:
            stage_in_driver(driver, schema, rows, properties).commit_transaction()
            return True
        except (CommitFailedException, ValidationException) as e:
            metrics.current().commit_retried(target)
            log.warning("%s: commit conflict at attempt %d, retrying from fresh state: %s", target, attempt, e)
            driver.table.refresh()
            time.sleep(0.2 * attempt)
    raise CommitConflictError(f"{target}: a batch kept conflicting with other writers after {MAX_ATTEMPTS} tries")


def stage_in_driver(driver: DriverApply, schema: TableSchema, rows: pa.Table, properties: dict[str, str]) -> Any:
    """The pyiceberg transaction (not committed) that applies the batch `rows` to the driver's table in one snapshot
    tagged with `properties`: the batch's final rows added, after the rows of its keys are deleted by position
    ("position"), or with each data file holding one of its keys replaced by its other rows and the batch's rows of
    the keys it held ("rewrite": the files that may hold the keys are found by their range, and their set when it is
    small enough for pyiceberg to test). An "append" only adds
    (with the rows of the target's smallest small file, as "position" does: ingest/sink/position_deletes.py)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files

    table = driver.table
    final = DataFileWriter(table).conform(rows.filter(pc.equal(rows.column(OP_COLUMN), "U")))
    if driver.how in ("position", "append"):
        return stage_by_position(table, schema, rows, final, properties, held=driver.how == "position")
    key = schema.primary_key[0]
    keys = rows.column(key)
    transaction = open_transaction(table)
    metadata = transaction.table_metadata
    write_uuid, counter = uuid.uuid4(), itertools.count(0)

    def files(data: pa.Table) -> Any:
        return _dataframe_to_data_files(metadata, data, table.io, write_uuid, counter)

    with overwrite_files(transaction, properties, write_uuid) as overwrite:
        pieces, rest = [], final
        if len(keys):
            scan = ArrowScan(metadata, table.io, metadata.schema(), AlwaysTrue())
            for task in table.scan(row_filter=may_hold(rows.select([key]))).plan_files():
                held = scan.to_table(tasks=[task])
                hit = pc.is_in(held.column(key), value_set=keys.cast(held.schema.field(key).type))
                if not pc.any(hit).as_py():
                    continue  # the file holds none of the keys
                overwrite.delete_data_file(task.file)
                piece, rest = _kept_with_own_rows(held, hit, rest, key)
                pieces.append(piece)
        pieces = _new_rows_placed(pieces, rest)
        for data_file in itertools.chain.from_iterable(files(piece) for piece in pieces if piece.num_rows):
            overwrite.append_data_file(data_file)
    return transaction


def _kept_with_own_rows(held: pa.Table, hit: pa.Array, rest: pa.Table, key: str) -> tuple[pa.Table, pa.Table]:
    """A replaced file's rows without the batch's keys (`hit`), with the batch's rows (`rest`, conformed) of the keys
    it held: an updated row goes back to the file it was in, whose key range it keeps; and the batch's other rows."""
    own = pc.is_in(rest.column(key), value_set=held.column(key).filter(hit).cast(rest.schema.field(key).type))
    kept = held.filter(pc.invert(hit)).cast(rest.schema)
    return pa.concat_tables([kept, rest.filter(own)]), rest.filter(pc.invert(own))


def _new_rows_placed(pieces: list[pa.Table], rest: pa.Table) -> list[pa.Table]:
    """The files a rewrite writes: each file it replaces with its kept rows and the batch's rows of the keys it held
    (`pieces`), the batch's other rows (`rest`: new keys) with the smallest of them, so that a small target does
    not gain a file per batch, or in a file of their own when the batch replaces none."""
    if not rest.num_rows:
        return pieces
    if not pieces:
        return [rest]
    smallest = min(range(len(pieces)), key=lambda i: pieces[i].num_rows)
    return [pa.concat_tables([p, rest]) if i == smallest else p for i, p in enumerate(pieces)]
