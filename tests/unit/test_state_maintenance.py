"""Unit tests of the bounded state table and of finding a target's committed offset: pure logic, fake snapshots."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ingest.model.position import BinlogPosition, MariadbGtidPos, Watermark
from ingest.sink.maintenance import MAINTAINED_AT, commits_since_compaction
from ingest.sink.merge import committed_offset, offset_from_summary, offset_summary, stream_history
from ingest.sink.summary import SUMMARY_CHUNKS_DONE, SUMMARY_PIPELINE, SUMMARY_STREAM_OFFSET
from ingest.sink.targets import COPY_BRANCH, chunks_done_in_target
from ingest.state.table import _quote
from ingest.state.writes import snapshots_to_expire

# --------------------------------------------------------------------------------------------------
# Which state-table snapshots to expire
# --------------------------------------------------------------------------------------------------


def test_nothing_is_expired_up_to_the_limit() -> None:
    snapshots = [(100 + i, i) for i in range(10)]
    assert snapshots_to_expire(snapshots, {109}, keep=2, max_snapshots=10) == []


def test_over_the_limit_all_but_the_newest_are_expired_whatever_the_id_order() -> None:
    # Ids are random in Iceberg; age is the sequence number.
    snapshots = [(9, 1), (3, 2), (7, 3), (1, 4), (5, 5)]
    assert snapshots_to_expire(snapshots, {5}, keep=2, max_snapshots=4) == [3, 7, 9]


def test_a_branch_or_tag_head_is_never_expired_and_the_current_one_always_stays() -> None:
    snapshots = [(1, 1), (2, 2), (3, 3), (4, 4)]
    assert snapshots_to_expire(snapshots, {2, 4}, keep=1, max_snapshots=2) == [1, 3]
    assert snapshots_to_expire(snapshots, {4}, keep=0, max_snapshots=2) == [1, 2, 3]  # keep is at least 1


def test_pipeline_names_are_quoted_for_pyiceberg_filters() -> None:
    assert _quote("shop") == "'shop'"
    assert _quote("o'brien") == "'o''brien'"


# --------------------------------------------------------------------------------------------------
# committed_offset: walk back from the current snapshot
# --------------------------------------------------------------------------------------------------


@dataclass
class FakeOperation:
    value: str


@dataclass
class FakeSummary:
    additional_properties: dict[str, str] = field(default_factory=dict)
    operation: FakeOperation = field(default_factory=lambda: FakeOperation("overwrite"))


@dataclass
class FakeSnapshot:
    snapshot_id: int
    parent_snapshot_id: int | None
    summary: FakeSummary

    @property
    def sequence_number(self) -> int:
        return self.snapshot_id  # the fakes are numbered in commit order


@dataclass
class FakeMetadata:
    refs: dict[str, int]


class FakeTable:
    def __init__(self, snapshots: list[FakeSnapshot], current: int | None, branch: int | None = None) -> None:
        """`branch`: the head of the copy branch (ingest_copy), when there is one."""
        self._snapshots = snapshots
        self._current = current
        self.metadata = FakeMetadata({} if current is None else {"main": current})
        self.properties: dict[str, str] = {}
        if branch is not None:
            self.metadata.refs[COPY_BRANCH] = branch

    def snapshots(self) -> list[FakeSnapshot]:
        return self._snapshots

    def current_snapshot(self) -> FakeSnapshot | None:
        return self._by_id(self._current)

    def snapshot_by_name(self, name: str) -> FakeSnapshot | None:
        return self._by_id(self.metadata.refs.get(name))

    def _by_id(self, snapshot_id: int | None) -> FakeSnapshot | None:
        return next((s for s in self._snapshots if s.snapshot_id == snapshot_id), None)


def ours(sid: int, parent: int | None, pos: int, pipeline: str = "p") -> FakeSnapshot:
    props = {SUMMARY_PIPELINE: pipeline, SUMMARY_STREAM_OFFSET: json.dumps({"position": f"bin.000001:{pos}"})}
    return FakeSnapshot(sid, parent, FakeSummary(props))


def other(sid: int, parent: int | None) -> FakeSnapshot:
    return FakeSnapshot(sid, parent, FakeSummary({"spark.app.id": "compaction"}))


def offset(table: Any) -> BinlogPosition | None:
    found = committed_offset(table, "p")
    return None if found is None else found.position


def test_the_newest_ancestor_of_ours_is_the_offset_even_under_other_writers_commits() -> None:
    chain = [ours(1, None, 100), ours(2, 1, 200), other(3, 2), ours(4, 3, 150, pipeline="q"), other(5, 4)]
    assert offset(FakeTable(chain, 5)) == BinlogPosition.parse("bin.000001:200")


def test_a_rolled_back_snapshot_does_not_count() -> None:
    # 3 committed offset 300, then the table was rolled back to 2: 3 is no longer in the lineage.
    chain = [ours(1, None, 100), ours(2, 1, 200), ours(3, 2, 300), other(4, 2)]
    assert offset(FakeTable(chain, 4)) == BinlogPosition.parse("bin.000001:200")


def test_expired_parents_end_the_walk() -> None:
    assert offset(FakeTable([other(7, 6)], 7)) is None  # compaction, then expiry down to one snapshot
    assert offset(FakeTable([ours(6, 5, 600), other(7, 6)], 7)) == BinlogPosition.parse("bin.000001:600")
    assert offset(FakeTable([], None)) is None


def test_the_walk_is_complete_only_when_nothing_of_ours_can_have_been_expired() -> None:
    def complete(table: FakeTable) -> bool:
        return stream_history(table, "p").complete

    snapshot_phase = FakeSnapshot(1, None, FakeSummary({SUMMARY_PIPELINE: "p", SUMMARY_CHUNKS_DONE: "0-3"}))
    assert complete(FakeTable([ours(6, 5, 600), other(7, 6)], 7))  # found
    assert complete(FakeTable([snapshot_phase, other(2, 1)], 2))  # no stream commit after the snapshot phase
    assert complete(FakeTable([other(1, None), other(2, 1)], 2))  # the whole history, none of ours
    assert complete(FakeTable([], None))  # an empty table
    # Compaction, then expiry down to one snapshot: a stream commit may have been under it.
    assert not complete(FakeTable([other(7, 6)], 7))
    assert not complete(
        FakeTable([FakeSnapshot(1, 0, FakeSummary({SUMMARY_PIPELINE: "q", SUMMARY_CHUNKS_DONE: "0"}))], 1)
    )


def test_commits_since_compaction_count_back_to_the_newest_rewrite_and_stop_at_the_limit() -> None:
    def rewrite(sid: int, parent: int | None) -> FakeSnapshot:
        return FakeSnapshot(sid, parent, FakeSummary(operation=FakeOperation("replace")))

    chain = [ours(1, None, 100), rewrite(2, 1), ours(3, 2, 300), other(4, 3), ours(5, 4, 500)]
    assert commits_since_compaction(FakeTable(chain, 5), 50) == 3
    assert commits_since_compaction(FakeTable(chain, 5), 2) == 2  # no need to walk further than the limit
    assert commits_since_compaction(FakeTable(chain, 2), 50) == 0
    assert commits_since_compaction(FakeTable(chain[2:], 5), 50) == 3  # expiry cut the walk: what it saw
    assert commits_since_compaction(FakeTable([], None), 50) == 0
    # A maintenance with nothing to rewrite commits no snapshot: the snapshot it ended at counts as a rewrite.
    maintained = FakeTable(chain, 5)
    maintained.properties[MAINTAINED_AT] = "4"
    assert commits_since_compaction(maintained, 50) == 1
    maintained.properties[MAINTAINED_AT] = "5"
    assert commits_since_compaction(maintained, 50) == 0


def test_a_cycle_in_broken_metadata_does_not_loop_forever() -> None:
    assert offset(FakeTable([other(1, 2), other(2, 1)], 1)) is None


def test_a_commit_summary_keeps_the_gtid_position_and_server_of_its_offset() -> None:
    end = Watermark(BinlogPosition.parse("mysql-bin.000004:77"), MariadbGtidPos.parse("0-21-40"), server_id=21)
    props = {SUMMARY_PIPELINE: "p", SUMMARY_STREAM_OFFSET: offset_summary(end)}
    assert committed_offset(FakeTable([FakeSnapshot(1, None, FakeSummary(props))], 1), "p") == end
    # A summary written before GTIDs and server ids were recorded reads as a bare position.
    assert offset_from_summary(json.dumps({"position": "mysql-bin.000004:77"})) == Watermark(end.position)


def test_while_a_copy_branch_exists_the_walk_and_the_chunks_done_come_from_the_branch() -> None:
    """Main holds the old copy (chunks 0-3, offset 200); the branch starts at an empty snapshot without a parent
    (chunks done: none), then gets one chunk commit and one stream commit."""

    def chunks(sid: int, parent: int | None, done: str) -> FakeSnapshot:
        return FakeSnapshot(sid, parent, FakeSummary({SUMMARY_PIPELINE: "p", SUMMARY_CHUNKS_DONE: done}))

    old = [chunks(1, None, "0-3"), ours(2, 1, 200)]
    started = FakeTable([*old, chunks(3, None, "")], 2, branch=3)
    assert offset(started) is None and stream_history(started, "p").complete
    assert chunks_done_in_target(started, "p") == set()
    copying = FakeTable([*old, chunks(3, None, ""), chunks(4, 3, "0"), ours(5, 4, 300)], 2, branch=5)
    assert offset(copying) == BinlogPosition.parse("bin.000001:300")
    assert chunks_done_in_target(copying, "p") == {0}
    assert commits_since_compaction(copying, 50) == 3
    swapped = FakeTable(copying.snapshots(), 5)  # main moved to the branch head, the branch removed
    assert offset(swapped) == BinlogPosition.parse("bin.000001:300") and chunks_done_in_target(swapped, "p") == {0}
