"""The tables as DuckDB sees them: DuckDB 1.5.5 with its iceberg extension from PyPI (no download at run time)
reads each table the job wrote by its current metadata file, and every row is compared with MySQL's."""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

import pytest

from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from tests.conftest import embedded_sink, mysql_rows, source_section
from tests.type_cases import check_iceberg_rows, create_types_table

pytestmark = pytest.mark.integration


def duckdb_reader() -> Any:
    """A DuckDB connection with the iceberg extension loaded from its PyPI package; nothing is fetched."""
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    for name in ("avro", "iceberg"):
        package = importlib.resources.files(f"duckdb_extension_{name}")
        con.execute(f"LOAD '{package / 'extensions' / f'v{duckdb.__version__}' / f'{name}.duckdb_extension'}'")
    return con


def _duckdb_rows(config: PipelineConfig, table: tuple[str, str], key: str) -> list[dict[str, Any]]:
    """The table's rows through DuckDB's `iceberg_scan` of the metadata file the catalog points at."""
    location = load_pyiceberg_catalog(config.sink).load_table(table).metadata_location
    con = duckdb_reader()
    try:
        cur = con.execute(f"SELECT * FROM iceberg_scan(?) ORDER BY {key}", [location.removeprefix("file://")])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    finally:
        con.close()


def _config(mariadb: MariaDBServer, db: str, base: Path, format_version: int = 2) -> PipelineConfig:
    return parse_config(
        {
            "name": db,
            "source": source_section(mariadb),
            "tables": {"include": [rf"{db}\..*"]},
            # A catalog name of its own: the module's Spark session keeps each catalog it has seen by name.
            "sink": {**embedded_sink(base), "catalog_name": f"lake_{db}", "format_version": format_version},
            "snapshot": {"chunk_size": 100, "parallelism": 2, "chunks_per_commit": 4},
            # An unpartitioned target takes its batches by position (ingest/sink/position_deletes.py): the job's
            # own delete files; a partitioned one, Spark's MERGE.
            "stream": {"batch_interval_seconds": 60, "driver_apply_max_rows": 1},
            # Partitioned by a time transform and by a column the updates change (rows move between partitions).
            "table_options": {f"{db}.acct": {"partition_by": ["months(opened)", "truncate(10, balance)"]}},
        }
    )


def test_every_type_case_reads_through_duckdb_with_its_exact_value(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "ddtypes"
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    with mariadb.admin() as conn:
        create_types_table(conn, f"{db}.types")
    config = _config(mariadb, db, tmp_path)
    run(config, spark=spark, snapshot_only=True)
    assert check_iceberg_rows(_duckdb_rows(config, (db, "types"), "id")) == []


@pytest.mark.parametrize("format_version", [2, 3])
def test_binlog_merges_read_equal_to_mysql_with_position_deletes_and_deletion_vectors(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, format_version: int
) -> None:
    db = f"ddmerge{format_version}"
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.acct (id INT NOT NULL PRIMARY KEY, owner VARCHAR(20), balance DECIMAL(12,2), "
        "opened DATETIME(6))",
        f"INSERT INTO {db}.acct SELECT seq, CONCAT('o', seq), seq * 1.5, "
        f"TIMESTAMP('2026-01-01') + INTERVAL seq SECOND FROM {db}.seq_1_to_300",
        f"CREATE TABLE {db}.plain (id INT NOT NULL PRIMARY KEY, note VARCHAR(20))",
        f"INSERT INTO {db}.plain SELECT seq, CONCAT('n', seq) FROM {db}.seq_1_to_300",
    )
    config = _config(mariadb, db, tmp_path, format_version)
    run(config, spark=spark, snapshot_only=True)
    mariadb.execute(
        f"UPDATE {db}.acct SET balance = balance + 10 WHERE id % 7 = 0",
        f"DELETE FROM {db}.acct WHERE id BETWEEN 100 AND 120",
        f"UPDATE {db}.acct SET id = id + 1000 WHERE id BETWEEN 200 AND 205",  # primary keys move
        f"INSERT INTO {db}.acct VALUES (100, 'back', 1.00, '2026-06-01 12:00:00.000001')",
        f"UPDATE {db}.plain SET note = 'changed' WHERE id % 3 = 0",
        f"DELETE FROM {db}.plain WHERE id BETWEEN 50 AND 60",
        f"INSERT INTO {db}.plain VALUES (55, 'back')",
    )
    run(config, spark=spark, until_caught_up=True)
    plain = load_pyiceberg_catalog(config.sink).load_table((db, "plain")).current_snapshot()
    if format_version == 2:  # by position; format 3 targets are MERGEd by Spark (deletion vectors)
        assert int(plain.summary.additional_properties["total-position-deletes"]) > 0
    assert _duckdb_rows(config, (db, "plain"), "id") == mysql_rows(mariadb, f"{db}.plain", "id")
    # The MERGE wrote row-level deletes of the version's kind: deletion vectors (Puffin) only in v3.
    puffins = list((tmp_path / "warehouse" / db / "acct").rglob("*.puffin"))
    assert bool(puffins) == (format_version == 3), puffins
    assert _duckdb_rows(config, (db, "acct"), "id") == mysql_rows(mariadb, f"{db}.acct", "id")
