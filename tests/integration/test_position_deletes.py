"""A batch applied by position (ingest/sink/position_deletes.py): per key the batch's final row or nothing, read
by pyiceberg and by Spark, over several files of several row groups, after a key column was renamed and widened;
one delete file per data file it deletes from; a commit a compaction beat is refused, never applied to the
rewritten files' positions; and the job's maintenance folds the deletes into the data.

pyiceberg on a real SQLite catalog and local warehouse, and the module's Spark reading and compacting it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyiceberg.exceptions import ValidationException
from pyiceberg.types import LongType

from ingest.config import PipelineConfig, parse_config
from ingest.model.columns import SourceColumn
from ingest.model.position import BinlogPosition, Watermark
from ingest.model.schema import TableSchema
from ingest.sink import position_deletes
from ingest.sink.catalog import cached_pyiceberg_catalog, spark_catalog_conf
from ingest.sink.driver_apply import apply_in_driver, driver_target, stage_in_driver
from ingest.sink.maintenance import maintain
from ingest.sink.merge import batch_arrow, stream_offset_properties
from ingest.sink.position_deletes import FILE_PATH_ID
from ingest.sink.targets import ensure_target_created
from tests.conftest import embedded_sink

pytestmark = pytest.mark.integration

Rows = dict[tuple[Any, ...], tuple[Any, ...]]


def _schema(key: str = "id", key_type: str = "int") -> TableSchema:
    columns = (
        SourceColumn(key, "varchar", "varchar(20)", False, character_set="utf8mb4"),
        SourceColumn("k2", key_type, key_type, False),
        SourceColumn("v", "int", "int", True),
    )
    return TableSchema("db", "t", columns, (key, "k2"), (key, "k2"), (None, None))


def _config(base: Path, name: str) -> PipelineConfig:
    return parse_config(
        {
            "name": "bypos",
            "source": {"host": "h", "user": "u", "password": {"env": "HOME"}},
            "tables": {"include": [r"db\..*"]},
            "sink": {**embedded_sink(base), "catalog_name": name},
            "stream": {"driver_apply_max_rows": 1},  # every batch that deletes goes by position
        }
    )


def _at(pos: int) -> Watermark:
    return Watermark(BinlogPosition("mysql-bin.000001", pos), None)


def _apply(
    config: PipelineConfig, schema: TableSchema, finals: dict[Any, Any], end: Watermark, append: bool = False
) -> bool:
    catalog = cached_pyiceberg_catalog(config.sink)
    rows = batch_arrow(schema, finals)
    driver = driver_target(
        catalog, ("db", "t"), f"{config.sink.catalog_name}.db.t", schema, config.stream, rows, append
    )
    assert driver is not None and driver.how == ("append" if append else "position")
    properties = stream_offset_properties(config.name, end)
    return apply_in_driver(driver, "t", schema, rows, end, properties, lambda: None)


def _pyiceberg_rows(config: PipelineConfig) -> Rows:
    table = cached_pyiceberg_catalog(config.sink).load_table(("db", "t"))
    return {(r["ident"], r["k2"]): (r["v"],) for r in table.scan().to_arrow().to_pylist()}


def _spark_rows(spark: Any, config: PipelineConfig) -> Rows:
    spark.sql(f"REFRESH TABLE {config.sink.catalog_name}.db.t")
    rows = spark.sql(f"SELECT ident, k2, v FROM {config.sink.catalog_name}.db.t").collect()
    return {(r["ident"], r["k2"]): (r["v"],) for r in rows}


def _with_catalog(spark: Any, config: PipelineConfig) -> None:
    plain, secret = spark_catalog_conf(config.sink)
    for key, value in {**plain, **secret}.items():
        spark.conf.set(key, value)
    spark.sql(f"SHOW NAMESPACES IN {config.sink.catalog_name}").collect()  # loaded, as the job's first query does


def _loaded(spark: Any, base: Path, name: str) -> tuple[PipelineConfig, TableSchema, Rows]:
    """The target with six data files of five row groups each, enough for a compaction to rewrite them (keys
    "k0000".."k2999", k2 the key's number mod 7), then its key column `id` renamed `ident` and `k2` widened to
    BIGINT: the files keep their names and types."""
    config = _config(base, name)
    _with_catalog(spark, config)
    ensure_target_created(None, config.targets, _schema())
    table = cached_pyiceberg_catalog(config.sink).load_table(("db", "t"))
    with table.transaction() as transaction:
        transaction.set_properties({"write.parquet.row-group-limit": "100"})
    held: Rows = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(position_deletes, "TAIL_BYTES", 0)  # a file per append
        for part in range(6):
            rows = {(f"k{i:04}", i % 7): (f"k{i:04}", i % 7, i) for i in range(part * 500, part * 500 + 500)}
            assert _apply(config, _schema(), rows, _at(10 + part), append=True)
            held |= {key: (row[2],) for key, row in rows.items()}
    with table.update_schema() as update:
        update.rename_column("id", "ident")
        update.update_column("k2", LongType())
    return config, _schema("ident", "bigint"), held


def _expect(expected: Rows, batch: dict[Any, Any]) -> None:
    """`expected` after `batch`: per key its final row, or nothing."""
    for key, row in batch.items():
        if row is None:
            expected.pop(key, None)
        else:
            expected[key] = (row[2],)


def test_a_batch_by_position_leaves_per_key_its_final_row_or_nothing_for_pyiceberg_and_spark_and_compacts_away(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(position_deletes, "TAIL_BYTES", 0)  # every file deleted from by position
    config, schema, expected = _loaded(spark, tmp_path, "lake_bypos")
    # Updates in every file, deletes, a delete of a key never held, an insert, and a key whose k2 differs.
    batch: dict[Any, Any] = {(f"k{i:04}", i % 7): (f"k{i:04}", i % 7, -i) for i in (0, 5, 1500, 2999)}
    batch |= {(f"k{i:04}", i % 7): None for i in (1, 1001, 2500)}
    batch |= {("k9999", 1): None, ("new", 3): ("new", 3, 3), ("k0002", 99): ("k0002", 99, 99)}
    assert _apply(config, schema, batch, _at(200))
    _expect(expected, batch)
    assert _pyiceberg_rows(config) == expected
    assert _spark_rows(spark, config) == expected

    table = cached_pyiceberg_catalog(config.sink).load_table(("db", "t"))
    summary = table.current_snapshot().summary
    assert summary.operation.value == "overwrite"
    assert summary.additional_properties["added-position-deletes"] == "7"  # 4 updated rows and 3 deleted
    data_files = {task.file.file_path for task in table.scan().plan_files()}
    deletes = {d.file_path: d for task in table.scan().plan_files() for d in task.delete_files}
    assert len(deletes) == 4  # one per data file it deletes from (of 6), naming that file in its bounds
    for delete in deletes.values():
        assert delete.lower_bounds[FILE_PATH_ID] == delete.upper_bounds[FILE_PATH_ID]
        assert delete.lower_bounds[FILE_PATH_ID].decode() in data_files

    # A second batch over the first one's rows (deleting rows already deleted by position is harmless): the first
    # file's delete file is merged into the one this batch writes for it, and removed.
    ident = table.schema().find_field("ident").field_id  # the file of k0000-k0499
    (first,) = next(t for t in table.scan().plan_files() if t.file.upper_bounds[ident] == b"k0499").delete_files
    again = {(f"k{i:04}", i % 7): (f"k{i:04}", i % 7, 7) for i in (0, 1, 2)} | {("new", 3): None}
    assert _apply(config, schema, again, _at(300))
    _expect(expected, again)
    assert _pyiceberg_rows(config) == expected == _spark_rows(spark, config)
    table = table.refresh()
    summary = table.current_snapshot().summary.additional_properties
    assert (summary["added-position-delete-files"], summary["removed-position-delete-files"]) == ("2", "1")
    # The first file's 3 positions removed, written again with a fourth; k0000 and "new" in the first batch's rows.
    assert summary["total-position-deletes"] == str(7 - 3 + 4 + 2)
    tasks = table.scan().plan_files()
    assert all(len(task.delete_files) <= 1 for task in tasks)
    assert first.file_path not in {d.file_path for task in tasks for d in task.delete_files}
    assert len({d.file_path for task in tasks for d in task.delete_files}) == 5  # 4 and the new rows' file

    maintain(spark, f"{config.sink.catalog_name}.db.t", config.name, _at(300), config.sink.maintenance)
    table = table.refresh()
    assert not [d for task in table.scan().plan_files() for d in task.delete_files]  # folded into the data
    assert _pyiceberg_rows(config) == expected == _spark_rows(spark, config)


def _files(config: PipelineConfig) -> tuple[set[str], dict[str, set[str]]]:
    """The target's data files, and per data file its delete files."""
    tasks = cached_pyiceberg_catalog(config.sink).load_table(("db", "t")).scan().plan_files()
    return {t.file.file_path for t in tasks}, {t.file.file_path: {d.file_path for d in t.delete_files} for t in tasks}


def test_the_batch_rows_join_the_smallest_small_file_so_a_target_does_not_gain_a_file_per_batch(
    spark: Any, tmp_path: Path
) -> None:
    config, schema, expected = _loaded(spark, tmp_path, "lake_tail")  # six files of 500 rows: all small
    data, _ = _files(config)
    for n in range(3):
        # Updates in every file, a delete, and new keys: the smallest file is written again with the batch's rows
        # (its own rows of the batch's keys left out, its deletes applied), the others deleted from by position.
        batch: dict[Any, Any] = {(f"k{i:04}", i % 7): (f"k{i:04}", i % 7, -n) for i in range(n, 3000, 499)}
        batch |= {(f"k{i:04}", i % 7): None for i in (10 + n, 1010 + n)} | {(f"new{n}", 1): (f"new{n}", 1, n)}
        assert _apply(config, schema, batch, _at(200 + n))
        _expect(expected, batch)
        assert _pyiceberg_rows(config) == expected
        now, deletes = _files(config)
        assert len(now) == len(data) == 6 and len(now - data) == 1  # one file replaced, none added
        assert all(len(d) <= 1 for d in deletes.values()) and not deletes[(now - data).pop()]
        data = now
    summary = cached_pyiceberg_catalog(config.sink).load_table(("db", "t")).current_snapshot().summary
    assert summary.additional_properties["deleted-data-files"] == "1"
    assert _spark_rows(spark, config) == expected


def test_a_compaction_between_reading_the_positions_and_the_commit_fails_the_commit_and_the_retry_applies(
    spark: Any, tmp_path: Path
) -> None:
    config, schema, expected = _loaded(spark, tmp_path, "lake_race")
    catalog = cached_pyiceberg_catalog(config.sink)
    batch: dict[Any, Any] = {("k0010", 3): ("k0010", 3, -1), ("k2010", 1): None}
    rows = batch_arrow(schema, batch)
    driver = driver_target(catalog, ("db", "t"), "t", schema, config.stream, rows, False)
    assert driver is not None and driver.how == "position"
    properties = stream_offset_properties(config.name, _at(200))
    staged = stage_in_driver(driver, schema, rows, properties)
    # Another writer compacts the six files into one: the positions read above are of files no longer live.
    maintain(spark, f"{config.sink.catalog_name}.db.t", "another", _at(1), config.sink.maintenance)
    # pyiceberg would retry the commit on the new head; the positions' producer refuses.
    with pytest.raises(ValidationException, match="positions were read at snapshot"):
        staged.commit_transaction()
    assert _pyiceberg_rows(config) == expected  # nothing of the batch, and no row lost
    # The job's apply retries from fresh metadata: the keys found again in the compacted file.
    fresh = driver._replace(table=catalog.load_table(("db", "t")))
    assert apply_in_driver(fresh, "t", schema, rows, _at(200), properties, lambda: None)
    expected[("k0010", 3)] = (-1,)
    del expected[("k2010", 1)]
    assert _pyiceberg_rows(config) == expected == _spark_rows(spark, config)
