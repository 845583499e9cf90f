"""A binlog batch reads only the part of its target it can change (issue 31, ingest/sink/pruning.py), proven the
way Iceberg proves its own pushdown: every data file the batch has no business with is moved away before the
binlog phase runs. A MERGE that read one of them would fail (the file is missing); the job must commit the batch,
and once the files are back, Iceberg must equal MySQL row for row."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.query.pipeline import run
from tests.conftest import embedded_sink, source_section

pytestmark = pytest.mark.integration


def _config(mariadb: MariaDBServer, db: str, base: Path, options: dict[str, Any] | None = None) -> PipelineConfig:
    return parse_config(
        {
            "name": db,
            "source": source_section(mariadb),
            "tables": {"include": [rf"{db}\.t"]},
            # A catalog of its own: the module's Spark session keeps catalogs by name.
            "sink": {**embedded_sink(base), "catalog_name": f"lake_{db}"},
            # One chunk per commit: a data file per 100 keys, each with its own key range.
            "snapshot": {"chunk_size": 100, "parallelism": 2, "chunks_per_commit": 1},
            "stream": {"batch_interval_seconds": 60},
            "table_options": {f"{db}.t": options or {}},
        }
    )


def _data_files(spark: Any, table: str) -> list[dict[str, Any]]:
    rows = spark.sql(
        f"SELECT *, readable_metrics.id.lower_bound AS lo, readable_metrics.id.upper_bound AS hi "
        f"FROM {table}.data_files"
    ).collect()
    return [r.asDict(recursive=True) for r in rows]


@contextmanager
def _moved_away(paths: list[str], to: Path) -> Iterator[None]:
    """The files, unreadable while the block runs; put back after it, whatever happened."""
    to.mkdir()
    moved = [(Path(p.removeprefix("file:")), to / f"{i}.parquet") for i, p in enumerate(paths)]
    for source, aside in moved:
        shutil.move(source, aside)
    try:
        yield
    finally:
        for source, aside in moved:
            shutil.move(aside, source)


def _apply_with_only(
    spark: Any, config: PipelineConfig, table: str, needed: Callable[[dict[str, Any]], bool], base: Path
) -> None:
    files = _data_files(spark, table)
    away = [f["file_path"] for f in files if not needed(f)]
    assert away and len(away) < len(files), files  # the test means something: some files go, some stay
    with _moved_away(away, base / "aside"):
        run(config, spark=spark, until_caught_up=True)
    spark.sql(f"REFRESH TABLE {table}")
    assert verify(config)


@pytest.mark.parametrize("keys", [30, 300], ids=["listed-keys", "too-many-keys-to-list"])
def test_a_batch_of_recent_keys_reads_only_the_files_holding_them(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, keys: int
) -> None:
    db = f"prunerecent{keys}"
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, note VARCHAR(20))",
        f"INSERT INTO {db}.t SELECT seq, seq, CONCAT('n', seq) FROM {db}.seq_1_to_1000",
    )
    config = _config(mariadb, db, tmp_path)
    run(config, spark=spark, snapshot_only=True)
    low = 1000 - keys + 1  # updates and deletes of the newest keys, inserts above them, a key moved up
    mariadb.execute(
        f"UPDATE {db}.t SET v = v + 1 WHERE id >= {low}",
        f"DELETE FROM {db}.t WHERE id % 7 = 0 AND id >= {low}",
        f"INSERT INTO {db}.t SELECT seq, 0, 'new' FROM {db}.seq_1001_to_{1000 + keys}",
        f"UPDATE {db}.t SET id = 5000 WHERE id = {low + 1}",
    )
    table = f"lake_{db}.{db}.t"
    _apply_with_only(spark, config, table, lambda f: f["hi"] >= low, tmp_path)


def test_a_partitioned_target_reads_only_the_partitions_its_rows_were_and_are_in(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "prunedays"
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id BIGINT NOT NULL PRIMARY KEY, created DATE NOT NULL, v INT NOT NULL)",
        # Ten days, each holding keys from the whole key range: key statistics prune nothing here.
        f"INSERT INTO {db}.t SELECT seq, DATE('2026-01-01') + INTERVAL (seq % 10) DAY, seq FROM {db}.seq_1_to_1000",
    )
    config = _config(mariadb, db, tmp_path, {"partition_by": ["days(created)"]})
    run(config, spark=spark, snapshot_only=True)
    mariadb.execute(
        f"UPDATE {db}.t SET v = -v WHERE created = '2026-01-03'",  # rows of day 3 change in place
        f"UPDATE {db}.t SET created = '2026-01-05' WHERE id IN (12, 22)",  # two rows move from day 3 to day 5
        f"DELETE FROM {db}.t WHERE id = 32",  # a row of day 3 goes
        f"INSERT INTO {db}.t VALUES (2000, '2026-01-05', 1)",
    )
    table = f"lake_{db}.{db}.t"
    touched = {dt.date(2026, 1, 3), dt.date(2026, 1, 5)}
    _apply_with_only(spark, config, table, lambda f: f["partition"]["created_day"] in touched, tmp_path)


def test_a_large_batch_reaches_the_target_scan_as_key_ranges_and_a_bloom_filter_of_its_keys(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    from ingest.sink.merge import batch_arrow, batch_where, merge_statement
    from ingest.sink.targets import ensure_target
    from ingest.source.discovery import discover

    db = "prunebloom"
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, note VARCHAR(20))",
    )
    config = _config(mariadb, db, tmp_path)
    schema = discover(config.source, config.tables, config.table_options).schemas[0]
    run(config, spark=spark, snapshot_only=True)  # creates the (empty) target and the catalog
    table = ensure_target(spark, config.targets, schema)
    spark.sql(f"INSERT INTO {table} SELECT id, 0, 'x' FROM range(1, 100001, 1, 4)")
    batch = {(k,): (k, 1, "y") for k in range(50_001, 51_001)} | {(k,): None for k in range(90_001, 90_101)}
    spark.createDataFrame(batch_arrow(schema, batch)).createOrReplaceTempView("batch")
    statement = merge_statement(table, "batch", schema, batch_where(schema, batch.keys()))
    # The job asks Spark for the Bloom filter once the target's pruned scan is big; this one is small.
    threshold = "spark.sql.optimizer.runtime.bloomFilter.applicationSideScanSizeThreshold"
    kept = spark.conf.get(threshold)
    spark.conf.set(threshold, "1")
    try:
        plan = spark.sql(f"EXPLAIN {statement}").collect()[0][0]
    finally:
        spark.conf.set(threshold, kept)
    scan = next(line for line in plan.splitlines() if "IcebergScan(" in line)
    # 1,100 keys, too many to list: two ranges, pushed into Iceberg's scan of the target ...
    assert "id >= 50001 AND id <= 51000" in scan and "id >= 90001 AND id <= 90100" in scan, scan
    assert " IN " not in scan
    # ... and the batch's keys as a Bloom filter on the target's rows, before the join's shuffle.
    target_side = plan[: plan.index("IcebergScan(")]
    assert "might_contain" in target_side.rsplit("Exchange hashpartitioning", 1)[-1], plan
