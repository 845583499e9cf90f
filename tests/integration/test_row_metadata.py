"""A server at its default binlog_row_metadata (MariaDB NO_LOG; MySQL's MINIMAL also logs no column names).

Row events then carry column types only: no names, no signedness, no character sets, no ENUM/SET members.
The job matches them to columns by position with the schema in force at that binlog position (the one it
follows through DDL), never with today's information_schema. These tests run on a server started without
the setting, as a new user's server is, and restart the job between DML and `ADD COLUMN ... AFTER`/`FIRST`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import SchemaChangeError
from ingest.model.schema import TableSchema
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.source.binlog.reader import BinlogReader
from ingest.source.mysql import connect, load_schema
from ingest.source.watermark import read_watermark
from ingest.state.table import StateTable
from tests.conftest import CDC_USER, embedded_sink, run_ingest, source_section

pytestmark = pytest.mark.integration

DB = "rowmeta"
# Columns whose values need what only FULL metadata names: signedness near 2^64, ENUM and SET members, a
# latin1 character set, and a BIT.
TABLE = f"""
CREATE TABLE {DB}.t (
  k INT PRIMARY KEY, a INT, b VARCHAR(20), c INT, d INT,
  u BIGINT UNSIGNED, e ENUM('x', 'y', 'z'), s SET('p', 'q', 'r'), l VARCHAR(10) CHARACTER SET latin1, bt BIT(8)
)
"""


@pytest.fixture(scope="module")
def server(cdc_password: str) -> Iterator[MariaDBServer]:
    with MariaDBServer(server_id=5, row_metadata=None) as server:
        server.create_cdc_user(CDC_USER, cdc_password)
        yield server


def _config(server: MariaDBServer, tmp_path: Path) -> dict[str, Any]:
    return {
        "name": DB,
        "source": source_section(server),
        "tables": {"include": [rf"{DB}\.t"]},
        "sink": embedded_sink(tmp_path),
        "snapshot": {"chunk_size": 2},
        "stream": {"batch_interval_seconds": 1},
    }


def _mysql_rows(server: MariaDBServer) -> list[dict[str, Any]]:
    with server.admin(DB) as conn, conn.cursor() as cur:
        cur.execute("SELECT * FROM t ORDER BY k")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _iceberg_rows(config: PipelineConfig) -> list[dict[str, Any]]:
    table = load_pyiceberg_catalog(config.sink).load_table((DB, "t"))
    return sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["k"])


def _comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """MySQL's values in Iceberg's form for the columns whose driver value differs (BIT as an integer)."""
    return [{**r, "bt": int.from_bytes(r["bt"], "big") if isinstance(r["bt"], bytes) else r["bt"]} for r in rows]


def test_a_server_at_its_default_row_metadata_is_followed_across_restarts_and_added_columns(
    spark: Any, server: MariaDBServer, tmp_path: Path
) -> None:
    with server.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@binlog_row_metadata")
        assert cur.fetchone() == ("NO_LOG",)  # MariaDB's default: the row events name no column
    server.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        TABLE,
        f"INSERT INTO {DB}.t SELECT seq, seq, CONCAT('b', seq), seq * 10, seq * 100, 18446744073709551600 + seq, "
        f"'y', 'p,r', 'ÿé', seq FROM {DB}.seq_1_to_5",
    )
    section = _config(server, tmp_path)
    config = parse_config(section)
    run(config, spark=spark, until_caught_up=True)

    # The steps: two statements, then a restart that must apply them.
    server.execute(
        f"INSERT INTO {DB}.t VALUES (10, 10, 'b10', 100, 1000, 18446744073709551615, 'z', 'q', 'àé', 255)",
        f"UPDATE {DB}.t SET c = -c, u = u - 1, e = 'x', s = 'p,q,r', bt = 128 WHERE k < 3",
    )
    run(config, spark=spark, until_caught_up=True)
    assert _iceberg_rows(config) == _comparable(_mysql_rows(server))

    # While the job is down: DML before and after an ADD COLUMN in the middle and one at the front. The rows
    # before each DDL have the old column count and order, and only the followed schema tells them apart.
    server.execute(
        f"UPDATE {DB}.t SET d = -d WHERE k = 4",
        f"ALTER TABLE {DB}.t ADD COLUMN x INT AFTER a",
        f"INSERT INTO {DB}.t (k, a, x, b, c, d, u) VALUES (11, 11, 7, 'b11', 110, 1100, 1)",
        f"UPDATE {DB}.t SET x = k * 3, b = 'moved' WHERE k IN (1, 5)",
    )
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(section))
    # Killed right after the first DDL is followed, then resumed: the rows after it are read after a restart.
    crashed = run_ingest("run", "--config", str(config_file), "--until-caught-up", crash_at="stream.after_backfill:1")
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    run(config, spark=spark, until_caught_up=True)
    assert _iceberg_rows(config) == _comparable(_mysql_rows(server))

    # Down again: DML, a column at the front, DML after it, read by a new run.
    server.execute(
        f"UPDATE {DB}.t SET c = c + 1 WHERE k > 3",
        f"ALTER TABLE {DB}.t ADD COLUMN y INT FIRST",
        f"UPDATE {DB}.t SET y = -k, a = a + 1000 WHERE k % 2 = 1",
        f"DELETE FROM {DB}.t WHERE k = 2",
    )
    done = run_ingest("run", "--config", str(config_file), "--until-caught-up")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "BINLOG_ROW_METADATA" not in done.stderr  # the library's advice to change the setting is not needed

    assert _iceberg_rows(config) == _comparable(_mysql_rows(server))
    assert verify(config)
    assert StateTable.open(config.sink, config.name).stream_offset() is not None


def _reader_rows(
    server: MariaDBServer, tmp_path: Path, schema: TableSchema, start: Any, until: Any, planned: Any
) -> list[tuple[Any, ...]]:
    config = parse_config(_config(server, tmp_path))
    reader = BinlogReader(
        config.source, [schema], start, contained_until={(DB, "r"): until}, planned_at={(DB, "r"): planned}
    )
    try:
        rows = []
        for item in reader.transactions():
            rows += [change.after for change in getattr(item, "changes", [])]
        return rows
    finally:
        reader.close()


def test_a_ddl_inside_the_snapshot_is_refused_by_position_and_one_before_the_plan_is_not(
    server: MariaDBServer, tmp_path: Path
) -> None:
    """The binlog phase passes over a DDL its chunks already contain. Its schema is the one loaded before the
    snapshot: after a reorder of two INT columns (same count, same types), rows decoded by position would
    swap them silently. So a row after such a DDL stops the reader when the server logs no names; a DDL
    before the schema was loaded (a table snapshotted again after it) is in the schema and reads right."""
    server.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.r (k INT PRIMARY KEY, a INT, b INT)",
    )
    config = parse_config(_config(server, tmp_path))
    with connect(config.source) as conn:
        old = load_schema(conn, DB, "r", config.options_for(DB, "r"))
        planned = read_watermark(conn, "mariadb").position
        server.execute(f"ALTER TABLE {DB}.r MODIFY b INT AFTER k", f"INSERT INTO {DB}.r (k, a, b) VALUES (0, 1, 2)")
        contained = read_watermark(conn, "mariadb").position
        server.execute(f"INSERT INTO {DB}.r (k, a, b) VALUES (1, 10, 20)")
        new = load_schema(conn, DB, "r", config.options_for(DB, "r"))
        assert [c.name for c in new.columns] == ["k", "b", "a"]

    with pytest.raises(SchemaChangeError, match=r"rowmeta.r: its schema changed during its snapshot, .*MODIFY b"):
        _reader_rows(server, tmp_path, old, planned, contained, planned)
    # Snapshotted (planned) after the DDL, with the schema of then: the row after is read by position, right.
    assert _reader_rows(server, tmp_path, new, planned, contained, contained) == [(1, 20, 10)]
