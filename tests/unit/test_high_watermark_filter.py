"""The binlog phase's chunk high-watermark filter, image by image (integer keys: no server needed)."""

from ingest.model.changes import RowChange
from ingest.model.position import BinlogPosition
from ingest.model.schema import TableSchema
from ingest.query.batch import HighWatermarkFilter, TableStream
from ingest.source.mysql import SourceColumn
from ingest.source.snapshot.chunks import Chunk

SCHEMA = TableSchema("db", "t", (SourceColumn("id", "int", "int(11)", False),), ("id",), ("id",), (None,))
# Chunks [..10), [10..20), [20..): read at positions 100, 200 and 300.
CHUNKS = [Chunk("db.t", 0, None, (10,)), Chunk("db.t", 1, (10,), (20,)), Chunk("db.t", 2, (20,), None)]


def _filter() -> HighWatermarkFilter:
    highs = [BinlogPosition("b.000001", p) for p in (100, 200, 300)]
    return HighWatermarkFilter(None, TableStream(SCHEMA, "db.t", CHUNKS, highs, None))


def _change(pos: int, before: int | None, after: int | None) -> RowChange:
    return RowChange(
        "db.t",
        BinlogPosition("b.000001", pos),
        0,
        None if before is None else (before,),
        None if after is None else (after,),
    )


def _kept(*changes: RowChange) -> list[tuple[int, int | None, int | None]]:
    return [(c.position.pos, c.before and c.before[0], c.after and c.after[0]) for c in _filter().keep(list(changes))]


def test_a_change_its_chunk_holds_is_dropped_and_a_later_one_kept() -> None:
    assert _kept(_change(150, 5, 5), _change(150, 15, 15), _change(150, None, 16), _change(250, 17, None)) == [
        (150, 5, 5),
        (250, 17, None),
    ]


def test_a_key_moving_from_a_read_chunk_into_an_unread_one_only_deletes_the_old_key() -> None:
    # Chunk 1, read at 200, holds key 15 as it is then: an upsert of 15 from position 150 would overwrite it.
    assert _kept(_change(150, 5, 15)) == [(150, 5, None)]


def test_a_key_moving_from_an_unread_chunk_into_a_read_one_only_inserts_the_new_key() -> None:
    # Chunk 1, read at 200, does not hold key 15 (it moved away) but holds whatever took key 15 after: no delete.
    assert _kept(_change(150, 15, 5)) == [(150, None, 5)]


def test_a_key_moving_between_two_read_chunks_stays_one_update_and_between_two_unread_ones_is_dropped() -> None:
    assert _kept(_change(250, 5, 15)) == [(250, 5, 15)]
    assert _kept(_change(150, 15, 25)) == []


def test_past_the_highest_watermark_every_change_passes_unchanged() -> None:
    changes = [_change(301, 5, 25), _change(400, None, 15)]
    assert _filter().keep(changes) == changes
