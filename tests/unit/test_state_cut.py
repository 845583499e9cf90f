"""The cut the state table records with the offset (issue 52), on a local SQLite catalog: written in the offset's
commit, replaced whole by the next, left alone by an offset recorded without one, and gone with the offset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingest.model.position import BinlogPosition, Watermark
from ingest.state.table import KIND_CUT, STATE_ARROW_SCHEMA, CutTables, StateTable


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
    tables = {"db.a": ("db.a", 11), "db.b": ("lake_b.b", None)}
    state.record_offset(_at(100), cut=CutTables(tables, {"db.a": ("db.a_changelog", 21)}))
    assert len(table.snapshots()) == before + 1  # the offset and the cut: one commit

    cut = StateTable(table, "p").cut()  # read back from the table
    assert cut is not None and cut.offset == _at(100)
    assert cut.tables == tables and cut.changelogs == {"db.a": ("db.a_changelog", 21)}

    state.record_offset(_at(200), cut=CutTables({"db.a": ("db.a", 12)}))  # db.b and the changelog no longer in it
    state.record_offset(_at(300))  # no cut: the one recorded stays, at its own offset
    again = StateTable(table, "p")
    assert again.stream_offset() == _at(300)
    cut = again.cut()
    assert cut is not None and cut.offset == _at(200) and cut.tables == {"db.a": ("db.a", 12)} and not cut.changelogs
    rows = table.scan(row_filter=f"kind = '{KIND_CUT}'").to_arrow().to_pylist()
    assert [(r["table_id"], r["iceberg_table"], r["target_snapshot_id"]) for r in rows] == [("db.a", "db.a", 12)]


def test_another_pipelines_cut_and_a_forgotten_table_or_offset(table: Any) -> None:
    mine, other = StateTable(table, "p"), StateTable(table, "q")
    mine.record_offset(_at(100), cut=CutTables({"db.a": ("db.a", 1), "db.b": ("db.b", 2)}, {"db.b": ("db.b_log", 3)}))
    other.record_offset(_at(50), cut=CutTables({"db.a": ("q.a", 9)}))
    mine.forget("db.b")  # `ingest resnapshot` of one table: it leaves the cut until copied again, its changelog too
    assert mine.cut() is not None and mine.cut().tables == {"db.a": ("db.a", 1)} and not mine.cut().changelogs
    cut = StateTable(table, "p").cut()
    assert cut is not None and cut.tables == {"db.a": ("db.a", 1)} and not cut.changelogs
    mine.forget_offset()  # every table copied again: no cut holds
    assert StateTable(table, "p").cut() is None
    theirs = StateTable(table, "q").cut()
    assert theirs is not None and theirs.tables == {"db.a": ("q.a", 9)}


def _stream(table: str, committed: int | None, head: int | None, **kw: Any) -> Any:
    from types import SimpleNamespace

    logged = kw.get("changelog_committed")
    return SimpleNamespace(
        schema=SimpleNamespace(database="db", table=table),
        target=f"`lake`.`db`.`{table}`",
        committed=None if committed is None else BinlogPosition("mysql-bin.000001", committed),
        head=head,
        head_known=True,
        unread=kw.get("unread", False),
        last_read=None if "last_read" not in kw else BinlogPosition("mysql-bin.000001", kw["last_read"]),
        changelog=("db", f"{table}_changelog") if "changelog_head" in kw else None,
        changelog_committed=None if logged is None else BinlogPosition("mysql-bin.000001", logged),
        changelog_head=kw.get("changelog_head"),
        changelog_head_known=True,
    )


def test_the_cut_leaves_out_a_table_copied_or_ahead_of_the_offset() -> None:
    """A table that holds more than the offset (a batch committed table by table, cut off by a crash, replayed in
    smaller batches; a chunk read while the job streamed, at a high watermark past the batch's end) would make the
    cut torn: it joins the cut once the offset has caught up with it. A changelog table is in the cut with its
    target, under the same rule."""
    from types import SimpleNamespace

    from ingest.query.commit import table_cut

    targets = SimpleNamespace(target_for=lambda db, t: (db, t))
    tables = {
        "db.at": _stream("at", 100, 1, changelog_committed=100, changelog_head=11),
        "db.behind": _stream("behind", 40, 2, changelog_head=None),  # its changelog has nothing yet
        "db.empty": _stream("empty", None, None),
        "db.ahead": _stream("ahead", 160, 3, changelog_head=13),
        "db.log_ahead": _stream("log_ahead", 90, 5, changelog_committed=160, changelog_head=15),
        "db.copied": _stream("copied", 100, 4, unread=True, changelog_head=14),
        "db.read_ahead": _stream("read_ahead", 90, 6, last_read=130, changelog_head=16),
        "db.read_before": _stream("read_before", 90, 7, last_read=100),
    }
    at = BinlogPosition("mysql-bin.000001", 100)
    cut = table_cut(targets, tables, at)  # type: ignore[arg-type]
    assert cut.targets == {
        "db.at": ("db.at", 1),
        "db.behind": ("db.behind", 2),
        "db.empty": ("db.empty", None),
        "db.log_ahead": ("db.log_ahead", 5),
        "db.read_before": ("db.read_before", 7),
    }
    assert cut.changelogs == {"db.at": ("db.at_changelog", 11), "db.behind": ("db.behind_changelog", None)}
    later = table_cut(targets, tables, BinlogPosition("mysql-bin.000001", 160))  # type: ignore[arg-type]
    assert "db.ahead" in later.targets and "db.log_ahead" in later.changelogs
    assert later.targets["db.read_ahead"] == ("db.read_ahead", 6) and "db.read_ahead" in later.changelogs
