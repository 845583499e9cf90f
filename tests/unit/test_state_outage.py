"""The state table's writes while the sink cannot be reached (issue 53), on a local SQLite catalog: a write cut off
before it landed is made again, one that landed unseen is not made twice, and a stop ends the wait."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ingest.model.position import BinlogPosition, Watermark
from ingest.sink.outage import OutageWaitStopped, SinkOutage
from ingest.source.snapshot.chunks import Chunk
from ingest.state.table import STATE_ARROW_SCHEMA, ChunkRecord, StateTable

MARK = Watermark(BinlogPosition("mysql-bin.000001", 4))


@pytest.fixture
def table(tmp_path: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("n")
    return catalog.create_table("n.state", schema=STATE_ARROW_SCHEMA)


def _outage(stopping: Callable[[], bool] = lambda: False) -> SinkOutage:
    clock = iter(float(i) for i in range(1000))
    return SinkOutage(60, stopping, clock=lambda: next(clock), sleep=lambda _: None)


def _cut_off(table: Any, method: str, landed: bool, times: int = 1) -> list[int]:
    """`table.<method>` fails `times` times as a reset connection would: after the commit landed, or before."""
    calls = [0]
    real = getattr(table, method)

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] <= times:
            if landed:
                real(*args, **kwargs)
            raise ConnectionError("Connection reset by peer")
        return real(*args, **kwargs)

    setattr(table, method, failing)
    return calls


def _records(state: StateTable, table_id: str, chunks: int) -> None:
    state.record_chunks([ChunkRecord(Chunk(table_id, i, None, None), MARK, MARK, 10) for i in range(chunks)])


@pytest.mark.parametrize("landed", [True, False])
def test_a_write_cut_off_by_the_sink_is_in_the_table_once(table: Any, landed: bool) -> None:
    state = StateTable(table, "p", outage=_outage())
    calls = _cut_off(table, "append", landed, times=2)
    _records(state, "db.t", 3)
    assert calls[0] == (1 if landed else 3)  # landed unseen: the retry finds its id in the history, appends no more
    reloaded = StateTable(table, "p")
    assert {i: len(r) for i, r in reloaded._done["db.t"].items()} == {0: 1, 1: 1, 2: 1}


def test_a_plan_cut_off_after_it_landed_holds_each_chunk_once(table: Any) -> None:
    state = StateTable(table, "p", outage=_outage())
    _cut_off(table, "append", landed=True)
    state.save_plan("db.t", [Chunk("db.t", i, None, None) for i in range(4)], MARK)
    assert [c.index for c in (StateTable(table, "p").plan("db.t") or [])] == [0, 1, 2, 3]


def test_the_offset_and_a_delete_cut_off_after_they_landed_are_run_again_with_the_same_result(table: Any) -> None:
    state = StateTable(table, "p", outage=_outage())
    _records(state, "db.t", 2)
    _cut_off(table, "overwrite", landed=True)
    state.record_offset(MARK)
    _cut_off(table, "delete", landed=True)
    state.forget("db.t")
    reloaded = StateTable(table, "p")
    assert reloaded.stream_offset() == MARK and not reloaded._done["db.t"]


def test_a_stop_while_a_write_waits_for_the_sink_ends_the_wait(table: Any) -> None:
    state = StateTable(table, "p", outage=_outage(stopping=lambda: True))
    _cut_off(table, "append", landed=False, times=100)
    with pytest.raises(OutageWaitStopped):
        _records(state, "db.t", 1)
    assert not StateTable(table, "p")._done["db.t"]


def test_without_an_outage_budget_the_first_error_ends_the_write(table: Any) -> None:
    state = StateTable(table, "p")
    _cut_off(table, "append", landed=False)
    with pytest.raises(Exception, match="could not reach the sink"):
        _records(state, "db.t", 1)
