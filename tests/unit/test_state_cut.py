"""The cut the state table records with the offset (issue 52), on a local SQLite catalog: written in the offset's
commit, replaced whole by the next, left alone by an offset recorded without one, and gone with the offset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingest.model.position import BinlogPosition, Watermark
from ingest.state.table import KIND_CUT, STATE_ARROW_SCHEMA, StateTable


def _at(pos: int) -> Watermark:
    return Watermark(BinlogPosition("mysql-bin.000001", pos))


@pytest.fixture
def table(tmp_path: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("n")
    return catalog.create_table("n.state", schema=STATE_ARROW_SCHEMA)


def test_the_cut_is_recorded_with_the_offset_in_one_commit_and_replaced_whole(table: Any) -> None:
    state = StateTable(table, "p")
    assert state.cut() is None
    before = len(table.snapshots())
    state.record_offset(_at(100), cut={"db.a": ("db.a", 11), "db.b": ("lake_b.b", None)})
    assert len(table.snapshots()) == before + 1  # the offset and the cut: one commit

    cut = StateTable(table, "p").cut()  # read back from the table
    assert cut is not None and cut.offset == _at(100)
    assert cut.tables == {"db.a": ("db.a", 11), "db.b": ("lake_b.b", None)}

    state.record_offset(_at(200), cut={"db.a": ("db.a", 12)})  # db.b no longer in it
    state.record_offset(_at(300))  # no cut: the one recorded stays, at its own offset
    again = StateTable(table, "p")
    assert again.stream_offset() == _at(300)
    cut = again.cut()
    assert cut is not None and cut.offset == _at(200) and cut.tables == {"db.a": ("db.a", 12)}
    rows = table.scan(row_filter=f"kind = '{KIND_CUT}'").to_arrow().to_pylist()
    assert [(r["table_id"], r["iceberg_table"], r["target_snapshot_id"]) for r in rows] == [("db.a", "db.a", 12)]


def test_another_pipelines_cut_and_a_forgotten_table_or_offset(table: Any) -> None:
    mine, other = StateTable(table, "p"), StateTable(table, "q")
    mine.record_offset(_at(100), cut={"db.a": ("db.a", 1), "db.b": ("db.b", 2)})
    other.record_offset(_at(50), cut={"db.a": ("q.a", 9)})
    mine.forget("db.b")  # `ingest resnapshot` of one table: it leaves the cut until copied again
    cut = StateTable(table, "p").cut()
    assert cut is not None and cut.tables == {"db.a": ("db.a", 1)}
    mine.forget_offset()  # every table copied again: no cut holds
    assert StateTable(table, "p").cut() is None
    theirs = StateTable(table, "q").cut()
    assert theirs is not None and theirs.tables == {"db.a": ("q.a", 9)}
