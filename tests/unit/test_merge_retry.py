"""merge_into's retry when Iceberg reports a conflicting commit (FAILURES.md "Iceberg side": a concurrent
writer or compaction during a MERGE). Spark is replaced by a recorder: what is tested is the decision logic
(retry from fresh state, never MERGE a batch the table already holds), not Spark."""

from __future__ import annotations

from typing import Any

import pytest

from ingest.errors import CommitConflictError
from ingest.model.columns import SourceColumn
from ingest.model.position import BinlogPosition, Watermark
from ingest.model.schema import TableSchema
from ingest.sink import merge

SCHEMA = TableSchema(
    "db",
    "t",
    (SourceColumn("id", "int", "int(11)", False), SourceColumn("n", "int", "int(11)", True)),
    ("id",),
    ("id",),
    (None,),
)
END = Watermark(BinlogPosition("mysql-bin.000003", 900))
CONFLICT = "org.apache.iceberg.exceptions.ValidationException: Found conflicting files that can contain records"


class RecordingSpark:
    """Records SQL; MERGE statements raise the scripted errors in turn (None: succeed)."""

    def __init__(self, merge_outcomes: list[str | None]) -> None:
        self.outcomes = list(merge_outcomes)
        self.statements: list[str] = []
        self.catalog = self

    def createDataFrame(self, table: Any) -> RecordingSpark:  # noqa: N802 - Spark's name
        return self

    def createOrReplaceTempView(self, name: str) -> None:  # noqa: N802 - Spark's name
        pass

    def dropTempView(self, name: str) -> None:  # noqa: N802 - Spark's name
        pass

    def sql(self, statement: str) -> None:
        self.statements.append(statement.split()[0])
        if statement.startswith(("MERGE", "INSERT")) and self.outcomes:
            error = self.outcomes.pop(0)
            if error is not None:
                raise RuntimeError(error)


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(merge.time, "sleep", lambda _: None)


def _offsets(*values: BinlogPosition | None) -> Any:
    answers = list(values)

    def read_offset() -> BinlogPosition | None:
        return answers.pop(0)

    return read_offset


def test_a_conflict_is_retried_from_fresh_state() -> None:
    spark = RecordingSpark([CONFLICT, None])
    assert merge.merge_into(spark, "lake.db.t", SCHEMA, {(1,): (1, 5)}, END, _offsets(None, None)) is True
    assert spark.statements == ["MERGE", "REFRESH", "MERGE"]


def test_a_batch_the_table_turns_out_to_hold_after_a_conflict_is_not_merged_again() -> None:
    # The first attempt raised, but its commit went through (or another run of this job committed it).
    spark = RecordingSpark([CONFLICT])
    assert merge.merge_into(spark, "lake.db.t", SCHEMA, {(1,): (1, 5)}, END, _offsets(None, END.position)) is False
    assert spark.statements == ["MERGE", "REFRESH"]


def test_an_append_is_retried_the_same_way() -> None:
    spark = RecordingSpark(["CommitFailedException: Cannot commit", None])
    assert merge.merge_into(spark, "lake.db.t", SCHEMA, {(1,): (1, 5)}, END, _offsets(None, None), append=True)
    assert spark.statements == ["INSERT", "REFRESH", "INSERT"]


def test_other_errors_are_not_retried() -> None:
    spark = RecordingSpark(["AnalysisException: cannot resolve column"])
    with pytest.raises(RuntimeError, match="cannot resolve"):
        merge.merge_into(spark, "lake.db.t", SCHEMA, {(1,): (1, 5)}, END, _offsets(None))
    assert spark.statements == ["MERGE"]


def test_conflicts_that_go_on_end_in_a_transient_error() -> None:
    spark = RecordingSpark([CONFLICT] * merge.MAX_ATTEMPTS)
    offsets = _offsets(*([None] * merge.MAX_ATTEMPTS))
    with pytest.raises(CommitConflictError, match="kept conflicting"):
        merge.merge_into(spark, "lake.db.t", SCHEMA, {(1,): (1, 5)}, END, offsets)
    assert spark.statements.count("MERGE") == merge.MAX_ATTEMPTS
