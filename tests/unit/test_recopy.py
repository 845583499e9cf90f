"""Unit tests of the pure side of copying a target again into its branch: when the source schema still fits the
target (else the target is dropped), and the Spark names of the branch."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from ingest.model.position import BinlogPosition, Watermark
from ingest.query import commit, ddl
from ingest.query.batch import TableStream
from ingest.sink.evolution import schema_from_json, schema_to_json
from ingest.sink.recopy import added_columns, iceberg_misfit, schema_misfit
from ingest.sink.targets import (
    COPY_BRANCH,
    STAGE_BRANCH,
    copy_under_way,
    job_head,
    on_copy_branch,
    on_stage_branch,
    table_of,
)
from tests.unit.test_schema_evolution import col, table

OLD = table(col("v", "varchar(20)"), col("n", "int(11)"))


def test_the_same_schema_fits_also_after_the_round_trip_through_the_table_property() -> None:
    stored = schema_from_json("db", "t", schema_to_json(OLD))
    assert schema_misfit(stored, OLD) is None


def test_a_changed_column_set_type_or_key_does_not_fit_and_says_what_changed() -> None:
    added = table(col("v", "varchar(20)"), col("n", "int(11)"), col("x", "int(11)"))
    assert schema_misfit(OLD, added) == "its columns changed (+x)"
    dropped = table(col("v", "varchar(20)"))
    assert schema_misfit(OLD, dropped) == "its columns changed (-n)"
    widened = table(col("v", "varchar(40)"), col("n", "int(11)"))
    assert schema_misfit(OLD, widened) == "its columns changed (~v)"
    swapped = table(col("n", "int(11)"), col("v", "varchar(20)"))
    assert schema_misfit(OLD, swapped) == "its columns changed (order)"
    rekeyed = dataclasses.replace(OLD, primary_key=("id", "n"))
    assert schema_misfit(OLD, rekeyed) == "the primary key changed from ['id'] to ['id', 'n']"


def test_a_target_that_does_not_record_its_source_schema_does_not_fit() -> None:
    assert schema_misfit(None, OLD) == "the target does not record the source schema it mirrors"


def _iceberg(**fields: tuple[str, bool]) -> SimpleNamespace:
    """A stand-in of a pyiceberg table with only a schema: name -> (Iceberg type, required)."""
    columns = [SimpleNamespace(name=n, field_type=t, required=r) for n, (t, r) in fields.items()]
    return SimpleNamespace(schema=lambda: SimpleNamespace(fields=columns))


def test_iceberg_columns_that_hold_the_new_rows_take_a_copy_through_the_branch() -> None:
    target = _iceberg(id=("int", True), v=("string", False), n=("long", False))
    assert iceberg_misfit(target, OLD) is None  # int(11) into long: Iceberg holds it
    narrowed = table(col("v", "varchar(5)"), col("n", "smallint(6)"))
    assert iceberg_misfit(target, narrowed) is None
    assert iceberg_misfit(target, dataclasses.replace(OLD, primary_key=("id", "n"))) is None
    assert iceberg_misfit(target, table(col("v", "varchar(5)"))) == "its columns changed (-n)"
    assert iceberg_misfit(target, table(col("v", "varchar(5)"), col("n", "decimal(10,2)"))) == (
        "column 'n' is long in Iceberg, which cannot hold DECIMAL(10,2)"
    )
    scaled = _iceberg(id=("int", True), v=("string", False), n=("decimal(10, 2)", False))
    assert iceberg_misfit(scaled, table(col("v", "varchar(5)"), col("n", "decimal(8,2)"))) is None
    assert "cannot hold DECIMAL(10,3)" in str(
        iceberg_misfit(scaled, table(col("v", "text"), col("n", "decimal(10,3)")))
    )
    required = _iceberg(id=("int", True), v=("string", True), n=("long", False))
    assert iceberg_misfit(required, OLD) == "column 'v' is required in Iceberg and nullable in the source"


def test_columns_only_added_join_the_iceberg_schema_and_take_a_copy_through_the_branch() -> None:
    """A generated column added (issue 49): the table is read again into its branch while main keeps its rows."""
    from pyiceberg.types import IntegerType, StringType

    target = _iceberg(id=("int", True), v=("string", False), n=("long", False))
    grown = table(col("g", "varchar(30)"), col("v", "varchar(20)"), col("n", "int(11)"), col("x", "int(11)"))
    assert iceberg_misfit(target, grown) is None
    assert added_columns(target, grown) == [("g", StringType(), "id"), ("x", IntegerType(), "n")]
    assert added_columns(target, OLD) == []


def test_the_branch_name_is_added_once_and_taken_off_for_the_table() -> None:
    target = "`lake`.`db`.`t`"
    branch = on_copy_branch(target)
    assert branch == f"`lake`.`db`.`t`.`branch_{COPY_BRANCH}`"
    assert on_copy_branch(branch) == branch
    assert table_of(branch) == target
    assert table_of(target) == target
    stage = on_stage_branch(target)
    assert stage == f"`lake`.`db`.`t`.`branch_{STAGE_BRANCH}`"
    assert table_of(stage) == target


def test_the_job_reads_the_branch_head_while_the_branch_exists() -> None:
    main, copy = SimpleNamespace(snapshot_id=1), SimpleNamespace(snapshot_id=2)

    def fake(refs: dict[str, object]) -> SimpleNamespace:
        return SimpleNamespace(
            metadata=SimpleNamespace(refs=refs),
            current_snapshot=lambda: main,
            snapshot_by_name=lambda name: copy if name == COPY_BRANCH else None,
        )

    assert not copy_under_way(fake({"main": 1})) and job_head(fake({"main": 1})) is main
    assert copy_under_way(fake({"main": 1, COPY_BRANCH: 2})) and job_head(fake({"main": 1, COPY_BRANCH: 2})) is copy


def test_the_binlog_phase_does_not_maintain_a_target_copied_into_its_branch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction and expiry would rewrite main, which readers see, and could expire the branch's chunk commits."""
    maintained: list[str] = []
    monkeypatch.setattr(commit, "maintain", lambda spark, name, *rest: maintained.append(name))
    targets = SimpleNamespace(pipeline="p", sink=SimpleNamespace(maintenance=SimpleNamespace(every_commits=1)))
    end = Watermark(BinlogPosition.parse("bin.000001:400"))
    main, copy = "`lake`.`db`.`t`", on_copy_branch("`lake`.`db`.`u`")
    tables = [TableStream(OLD, name, [], [], end.position) for name in (main, copy)]
    commit._maintain_due(None, targets, tables, end)  # type: ignore[arg-type]
    assert maintained == [main]


def test_tables_gone_from_the_source_are_read_with_their_targets_schema_until_their_drop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A table the state knows that discovery no longer finds: read on with the schema its target mirrors, unless
    its capture ended already (dropped target, or marked), or the patterns no longer match it."""
    from pyiceberg.exceptions import NoSuchTableError

    from ingest.config import parse_config
    from tests.unit.test_config import PW, PW_ENV, cfg

    monkeypatch.setenv(PW_ENV, PW)
    config = parse_config(cfg(tables={"include": [r"db\.(t|gone|marked|dropped)"]}))
    stored = {ddl.SOURCE_SCHEMA_PROPERTY: schema_to_json(OLD)}
    targets = {
        "gone": SimpleNamespace(properties=stored),
        "marked": SimpleNamespace(properties={**stored, ddl.SOURCE_DROPPED_PROPERTY: "mysql-bin.000001:4"}),
        "unmatched": SimpleNamespace(properties=stored),
    }

    def load_table(names: tuple[str, str]) -> SimpleNamespace:
        if names[1] not in targets:
            raise NoSuchTableError(names[1])
        return targets[names[1]]

    monkeypatch.setattr(ddl, "cached_pyiceberg_catalog", lambda sink: SimpleNamespace(load_table=load_table))
    state = SimpleNamespace(tables=lambda: ["db.t", "db.gone", "db.marked", "db.dropped", "db.unmatched"])
    gone = ddl.gone_tables(config, state, [OLD])  # type: ignore[arg-type]
    assert [s.table_id for s in gone] == ["db.gone"] and gone[0].columns == OLD.columns
