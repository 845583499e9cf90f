"""Where the binlog phase starts, from the recorded offset and each table's chunks and commits."""

from ingest.model.position import BinlogPosition
from ingest.model.schema import TableSchema
from ingest.query.batch import TableStream
from ingest.query.start import _resume_at


def _at(pos: int, file: str = "mysql-bin.000001") -> BinlogPosition:
    return BinlogPosition(file, pos)


def _table(name: str, highs: list[int], committed: int | None = None) -> TableStream:
    schema = TableSchema("db", name, (), ("id",), ("id",), (None,))
    return TableStream(schema, f"db.{name}", [], [_at(h) for h in highs], None if committed is None else _at(committed))


def test_without_a_recorded_offset_the_job_starts_at_the_lowest_chunk_high_watermark() -> None:
    assert _resume_at([_table("a", [500, 300]), _table("b", [400])], None) == _at(300)


def test_the_recorded_offset_wins_over_older_chunks() -> None:
    assert _resume_at([_table("a", [300]), _table("b", [400])], _at(900)) == _at(900)


def test_a_table_snapshotted_again_after_the_offset_starts_at_its_new_chunks_when_every_table_was() -> None:
    assert _resume_at([_table("a", [1200, 1500]), _table("b", [1300])], _at(900)) == _at(1200)
    assert _resume_at([_table("a", [1200]), _table("b", [400])], _at(900)) == _at(900)


def test_a_target_committed_past_the_recorded_offset_does_not_move_the_start() -> None:
    # A crash inside a schema change step commits the target past its DDL before the decoding schema is stored:
    # starting at the target's commit would skip the DDL and decode later rows with the old columns.
    assert _resume_at([_table("a", [300], committed=1000)], _at(900)) == _at(900)
    assert _resume_at([_table("a", [300], committed=1000)], None) == _at(300)


def test_binlog_files_order_numerically() -> None:
    later = BinlogPosition("mysql-bin.000010", 4)
    assert _resume_at([_table("a", [300])], later) == later


def _copying(name: str, highs: list[int | None]) -> TableStream:
    """A table whose snapshot was asked of the running job: chunks not read yet have no high watermark."""
    table = _table(name, [])
    table.chunk_highs = [None if h is None else _at(h) for h in highs]
    return table


def test_a_table_being_copied_needs_only_what_its_read_chunks_do() -> None:
    # No chunk read: every one will hold all changes up to when it is read, so the table needs nothing.
    assert _resume_at([_table("a", [300]), _copying("b", [None, None])], _at(900)) == _at(900)
    assert _resume_at([_copying("b", [None, None])], _at(900)) == _at(900)
    # Chunks read since the offset was recorded: the binlog phase applied the changes after them up to it.
    assert _resume_at([_table("a", [300]), _copying("b", [1200, None])], _at(900)) == _at(900)
    assert _resume_at([_copying("b", [1200, None])], None) == _at(1200)
    # Nothing read and nothing recorded: no point is needed (the job starts where the server is).
    assert _resume_at([_copying("b", [None])], None) is None
