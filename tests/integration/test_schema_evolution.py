"""DDL in the binlog (MISSION.md "Binlog phase"): ALTER TABLE is followed in binlog order where Iceberg allows
it, a column added with a default shows that default in old rows, anything else stops the job after committing
what came before, and the schema-change step is exactly once across kill -9."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import pymysql
import pytest
import yaml

from ingest.commands.resnapshot import resnapshot
from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import SchemaChangeError, SourceError
from ingest.query.ddl import SUMMARY_SCHEMA_CHANGE
from ingest.query.pipeline import run
from ingest.sink.catalog import load_pyiceberg_catalog
from ingest.state.table import StateTable
from tests.conftest import embedded_sink, run_ingest, source_section
from tests.executor_sql import run_once

pytestmark = pytest.mark.integration


def _section(mariadb: MariaDBServer, db: str, tmp_path: Path, catalog: str, **stream: Any) -> dict[str, Any]:
    return {
        "name": db,
        "source": source_section(mariadb),
        "tables": {"include": [rf"{db}\.t"]},
        "sink": {**embedded_sink(tmp_path), "catalog_name": catalog},
        "snapshot": {"chunk_size": 40},
        "stream": {"batch_interval_seconds": 1, **stream},
    }


def _setup(mariadb: MariaDBServer, db: str, tmp_path: Path, catalog: str, **stream: Any) -> PipelineConfig:
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id INT NOT NULL PRIMARY KEY, v VARCHAR(20), n INT)",
        f"INSERT INTO {db}.t SELECT seq, CONCAT('v', seq), seq FROM {db}.seq_1_to_120",
    )
    return parse_config(_section(mariadb, db, tmp_path, catalog, **stream))


def _mysql_rows(mariadb: MariaDBServer, db: str, table: str = "t") -> list[dict[str, Any]]:
    with mariadb.admin(db) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table} ORDER BY id")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _iceberg(config: PipelineConfig, db: str, table: str = "t") -> Any:
    return load_pyiceberg_catalog(config.sink).load_table((db, table))


def _iceberg_rows(config: PipelineConfig, db: str, table: str = "t") -> list[dict[str, Any]]:
    return sorted(_iceberg(config, db, table).scan().to_arrow().to_pylist(), key=lambda r: r["id"])


def _backfills(config: PipelineConfig, db: str) -> int:
    return sum(
        1
        for s in _iceberg(config, db).snapshots()
        if s.summary is not None and SUMMARY_SCHEMA_CHANGE in s.summary.additional_properties
    )


def test_added_and_widened_columns_and_several_alters_between_two_runs_follow_the_binlog_with_each_moments_schema(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, row_metadata: str
) -> None:
    """Table t: columns added (old rows get the default) and widened, one ALTER statement per run. At NO_LOG the
    rows before and after each ALTER differ only in their column count and order: the job matches them by position
    with the schema it follows in binlog order.

    Table u, in the same pipeline (one snapshot for both): the job runs as a step, and u changed three times while
    it was down: rows written between the statements are decoded with the schema of their moment, derived from the
    statements and checked against the server's newest (at NO_LOG the row events carry no names: a wrong schema in
    between would misread them)."""
    db = "evo"
    _setup(mariadb, db, tmp_path, f"evo_{row_metadata}")
    mariadb.execute(f"CREATE TABLE {db}.u LIKE {db}.t", f"INSERT INTO {db}.u SELECT * FROM {db}.t")
    config = parse_config(
        {**_section(mariadb, db, tmp_path, f"evo_{row_metadata}"), "tables": {"include": [rf"{db}\.(t|u)"]}}
    )
    run(config, spark=spark, until_caught_up=True)
    mariadb.execute(
        f"UPDATE {db}.u SET n = -3 WHERE id = 3",
        f"ALTER TABLE {db}.u ADD COLUMN a INT DEFAULT 1 AFTER id",
        f"UPDATE {db}.u SET a = 5, v = 'between' WHERE id = 4",
        f"ALTER TABLE {db}.u RENAME COLUMN v TO label, ADD COLUMN b VARCHAR(8) DEFAULT 'bee'",
        f"INSERT INTO {db}.u (id, a, label, n, b) VALUES (500, 7, 'new', 8, 'bx')",
        f"ALTER TABLE {db}.u MODIFY n BIGINT",
        f"UPDATE {db}.u SET n = 9000000000 WHERE id = 5",
    )
    mariadb.execute(
        f"UPDATE {db}.t SET n = -1 WHERE id <= 5",
        f"INSERT INTO {db}.t VALUES (500, 'before', 500)",
        # One statement, two columns: a nullable one in the middle, a NOT NULL one with a default at the end.
        f"ALTER TABLE {db}.t ADD COLUMN note VARCHAR(10) NULL AFTER v, ADD COLUMN seven INT NOT NULL DEFAULT 7",
        f"UPDATE {db}.t SET seven = 1, note = 'changed' WHERE id BETWEEN 3 AND 8",
        f"INSERT INTO {db}.t VALUES (501, 'after', 'n', 501, 70)",
        f"DELETE FROM {db}.t WHERE id = 10",
    )
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    assert _iceberg_rows(config, db, "u") == _mysql_rows(mariadb, db, "u")
    assert _iceberg_rows(config, db) == _mysql_rows(mariadb, db)
    assert _iceberg_rows(config, db)[0] == {"id": 1, "v": "v1", "note": None, "n": -1, "seven": 7}
    mariadb.execute(
        f"ALTER TABLE {db}.t MODIFY n BIGINT, MODIFY v VARCHAR(64)",
        f"UPDATE {db}.t SET n = 9000000000, v = REPEAT('x', 60) WHERE id = 11",
        f"INSERT INTO {db}.t VALUES (502, 'big', NULL, -9000000000, 7)",
    )
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    assert _iceberg_rows(config, db) == _mysql_rows(mariadb, db)
    fields = {f.name: str(f.field_type) for f in _iceberg(config, db).schema().fields}
    assert list(fields) == ["id", "v", "note", "n", "seven"]
    assert fields["n"] == "long" and fields["seven"] == "int" and fields["note"] == "string"
    assert _backfills(config, db) == 1


def test_an_unsupported_change_stops_the_job_after_committing_what_came_before(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "evo_drop"
    config = _setup(mariadb, db, tmp_path, "evo_drop_lake")
    run(config, spark=spark, until_caught_up=True)
    mariadb.execute(
        f"UPDATE {db}.t SET n = -3 WHERE id = 3",
        f"ALTER TABLE {db}.t MODIFY n SMALLINT, DROP COLUMN v",
        f"UPDATE {db}.t SET n = -4 WHERE id = 4",
    )
    with pytest.raises(SchemaChangeError, match=rf"{db}\.t: the schema change at .*MODIFY n SMALLINT.*'n': a narrow"):
        run(config, spark=spark, until_caught_up=True)
    rows = {r["id"]: r for r in _iceberg_rows(config, db)}
    assert rows[3]["n"] == -3 and rows[4]["n"] == 4  # committed up to the DDL, nothing after it
    assert "v" in {f.name for f in _iceberg(config, db).schema().fields}  # nothing of the statement applied


def _killed(config_file: Path, crash_at: str) -> None:
    """`ingest run --until-caught-up` as a job of its own, SIGKILLed at `crash_at`."""
    crashed = run_ingest("run", "--config", str(config_file), "--until-caught-up", crash_at=crash_at)
    assert crashed.returncode == -signal.SIGKILL, (crash_at, crashed.stderr[-3000:])


def _kill_at_each_step(
    config: PipelineConfig, config_file: Path, db: str, snapshot: list[dict[str, Any]], before: list[dict[str, Any]]
) -> None:
    """The lineage of the test below, killed at each step of its two ALTERs and its TRUNCATE (`snapshot`: the rows
    copied; `before`: MySQL's rows right before the second ALTER)."""
    _killed(config_file, "stream.after_schema_change:1")  # the first ALTER's column added, not backfilled
    assert _backfills(config, db) == 0
    assert _iceberg_rows(config, db) == [{**r, "seven": None} for r in snapshot]

    _killed(config_file, "stream.after_backfill:1")  # replayed: found the column there, backfilled it
    assert _backfills(config, db) == 1
    assert _iceberg_rows(config, db) == [{**r, "seven": 7} for r in snapshot]

    # Replays the first ALTER (its step's first point) without a backfill, commits the rows up to the second one,
    # then is killed after the second one's Iceberg schema change.
    _killed(config_file, "stream.after_schema_change:2")
    assert _backfills(config, db) == 1  # never redone over the rows changed after it
    assert [f.name for f in _iceberg(config, db).schema().fields] == ["w", "id", "amount", "remark", "seven"]
    assert _iceberg_rows(config, db) == [
        {"w": r["w"], "id": r["id"], "amount": r["n"], "remark": r["note"], "seven": r["seven"]} for r in before
    ]

    _killed(config_file, "stream.after_truncate:1")  # the TRUNCATE committed, its offset not recorded
    assert _backfills(config, db) == 2
    assert _iceberg_rows(config, db) == []


def test_added_dropped_renamed_and_moved_columns_and_a_truncate_follow_the_binlog_across_kills_inside_each_step(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, row_metadata: str
) -> None:
    """Issue 32 and the schema-change step's exactly-once, in one lineage killed at each step. An ALTER adds a
    column with a default: killed after the Iceberg schema change (no backfill yet), then, resumed, after the
    backfill (the resumed run replays the ALTER and finds the column there). A second ALTER drops a column, renames
    one with CHANGE (and widens it), renames another with RENAME COLUMN and moves one: killed after the Iceberg
    schema change, before the source schema is stored. A TRUNCATE follows, then rows come back under old keys:
    killed after the TRUNCATE's commit, before the offset is. Each row event decodes with the columns of its moment
    (by name at FULL, by position at NO_LOG), Iceberg columns keep their field ids, the backfill is done once and
    never again over the rows changed after it, the TRUNCATE is one commit carrying its offset, and the job ends
    equal to MySQL, column for column and in MySQL's order. After each kill the target holds exactly the rows and
    columns up to its step, which the next run must take from there. The kills and resumes do not depend on the
    row metadata setting, only the decoding does: at FULL the lineage runs once, without kills."""
    db = "evo_rename"
    catalog = f"evo_rename_{row_metadata}"
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {db}",
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id INT NOT NULL PRIMARY KEY, v VARCHAR(20), n INT, note VARCHAR(10), w INT)",
        f"INSERT INTO {db}.t SELECT seq, CONCAT('v', seq), seq, 'x', -seq FROM {db}.seq_1_to_120",
    )
    section = _section(mariadb, db, tmp_path, catalog)
    config = parse_config(section)
    run(config, spark=spark, until_caught_up=True)
    before = {f.name: f.field_id for f in _iceberg(config, db).schema().fields}
    mariadb.execute(
        f"UPDATE {db}.t SET n = -1 WHERE id <= 5",
        f"ALTER TABLE {db}.t ADD COLUMN seven INT NOT NULL DEFAULT 7",
        f"UPDATE {db}.t SET seven = 1 WHERE id BETWEEN 3 AND 8",
        f"UPDATE {db}.t SET n = -2, v = 'gone' WHERE id BETWEEN 4 AND 9",
    )
    before_second_alter = _mysql_rows(mariadb, db)
    mariadb.execute(
        f"ALTER TABLE {db}.t DROP COLUMN v, CHANGE n amount BIGINT, RENAME COLUMN note TO remark, MODIFY w INT FIRST",
        f"UPDATE {db}.t SET amount = 9000000000, remark = 'after' WHERE id BETWEEN 3 AND 8",
        f"INSERT INTO {db}.t (id, w, amount, remark) VALUES (500, 5, 500, 'new')",
        f"DELETE FROM {db}.t WHERE id = 10",
        f"TRUNCATE TABLE {db}.t",
        f"INSERT INTO {db}.t (id, w, amount, remark) VALUES (1, 1, 1, 'back'), (7, 7, 7, 'back')",
        f"UPDATE {db}.t SET amount = 70 WHERE id = 7",
    )
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(section))
    snapshot = [{"id": i, "v": f"v{i}", "n": -1 if i <= 5 else i, "note": "x", "w": -i} for i in range(1, 121)]

    if row_metadata == "NO_LOG":
        _kill_at_each_step(config, config_file, db, snapshot, before_second_alter)

    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    assert _iceberg_rows(config, db) == _mysql_rows(mariadb, db)
    assert [r["id"] for r in _iceberg_rows(config, db)] == [1, 7]
    after = {f.name: f.field_id for f in _iceberg(config, db).schema().fields}
    assert list(after) == ["w", "id", "amount", "remark", "seven"]
    assert (after["amount"], after["remark"], after["w"]) == (before["n"], before["note"], before["w"])
    assert str(_iceberg(config, db).schema().find_field("amount").field_type) == "long"
    # The backfill and the TRUNCATE's one commit, each tagged with its position: neither done twice.
    assert _backfills(config, db) == 2
    assert StateTable.open(config.sink, config.name).stream_offset() is not None


def test_dropped_and_renamed_tables_end_their_capture_by_the_policy_and_a_name_taken_is_copied(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, row_metadata: str
) -> None:
    """Issue 32: `DROP TABLE a` and `RENAME TABLE b TO b2` end the capture of a and b at the statement, every change
    before it applied: with `on_drop_table: keep` their targets stay as they were (marked), with `drop` they go.
    b2, which the patterns match, is copied as a new table; c streams on. Killed after the policy's step and
    before the offset is recorded (at NO_LOG), the job ends the same."""
    db = f"evo_gone_{row_metadata.lower()}"
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    for name in ("a", "b", "c"):
        mariadb.execute(
            f"CREATE TABLE {db}.{name} (id INT NOT NULL PRIMARY KEY, n INT)",
            f"INSERT INTO {db}.{name} SELECT seq, seq FROM {db}.seq_1_to_30",
        )
    for policy in ("keep", "drop"):
        (tmp_path / policy).mkdir()
    sections = {
        policy: {
            **_section(mariadb, db, tmp_path / policy, f"{db}_{policy}", on_drop_table=policy),
            "tables": {"include": [rf"{db}\.(a|b|b2|c)"]},
        }
        for policy in ("keep", "drop")
    }
    configs = {policy: parse_config(section) for policy, section in sections.items()}
    for config in configs.values():
        run(config, spark=spark, until_caught_up=True)
    mariadb.execute(
        f"UPDATE {db}.a SET n = -1 WHERE id <= 3",
        f"UPDATE {db}.b SET n = -2 WHERE id <= 3",
        f"DROP TABLE {db}.a",
        f"RENAME TABLE {db}.b TO {db}.b2",
        f"UPDATE {db}.b2 SET n = -3 WHERE id = 4",
        f"UPDATE {db}.c SET n = -4 WHERE id = 5",
    )
    if row_metadata == "NO_LOG":  # the kill and resume do not depend on the setting, only the decoding does
        config_file = tmp_path / "keep.yaml"
        config_file.write_text(yaml.safe_dump(sections["keep"]))
        crashed = run_ingest(
            "run", "--config", str(config_file), "--until-caught-up", crash_at="stream.after_end_capture:1"
        )
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    for config in configs.values():
        run(config, spark=spark, until_caught_up=True)
        run(config, spark=spark, until_caught_up=True)  # b2, named by the RENAME, is copied by the next run
        assert verify(config)
    catalogs = {policy: load_pyiceberg_catalog(config.sink) for policy, config in configs.items()}
    assert sorted(name for _, name in catalogs["drop"].list_tables(db)) == ["b2", "c"]
    kept = catalogs["keep"]
    assert sorted(name for _, name in kept.list_tables(db)) == ["a", "b", "b2", "c"]
    for name, n in (("a", -1), ("b", -2)):
        target = kept.load_table((db, name))
        rows = sorted(target.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
        assert [r["n"] for r in rows[:4]] == [n, n, n, 4] and len(rows) == 30  # as it was at the statement
        assert "ingest.source-dropped" in target.properties
    b2 = sorted(kept.load_table((db, "b2")).scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [r["n"] for r in b2[:4]] == [-2, -2, -2, -3]


def test_a_column_whose_type_between_two_statements_only_the_text_holds_is_refused_not_guessed(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    db = "evo_again"
    config = _setup(mariadb, db, tmp_path, "evo_again_lake")
    run(config, spark=spark, until_caught_up=True)
    mariadb.execute(
        f"UPDATE {db}.t SET n = -3 WHERE id = 3",
        f"ALTER TABLE {db}.t ADD COLUMN a SMALLINT DEFAULT 1",
        f"UPDATE {db}.t SET a = 5 WHERE id = 4",
        f"ALTER TABLE {db}.t MODIFY a BIGINT",
    )
    with pytest.raises(SchemaChangeError, match=r"altered again later, at .*MODIFY a BIGINT.*'a' is defined by the fi"):
        run(config, spark=spark, until_caught_up=True)
    assert {r["id"]: r for r in _iceberg_rows(config, db)}[3]["n"] == -3


def test_a_non_constant_default_is_refused(spark: Any, mariadb: MariaDBServer, tmp_path: Path) -> None:
    db = "evo_now"
    config = _setup(mariadb, db, tmp_path, "evo_now_lake")
    run(config, spark=spark, until_caught_up=True)
    mariadb.execute(f"ALTER TABLE {db}.t ADD COLUMN at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP")
    with pytest.raises(SchemaChangeError, match=r"adds column 'at' .*current_timestamp\(\).* not in the binlog"):
        run(config, spark=spark, until_caught_up=True)


def test_a_generated_column_added_between_two_runs_stops_the_job_by_name_and_a_copy_again_holds_its_values(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    """Issue 49: the server computes a generated column's value for every old row and logs none of them. The job
    used to add the column as NULL in every old row and exit 0."""
    db = "evo_gen"
    config = _setup(mariadb, db, tmp_path, "evo_gen_lake")
    run(config, spark=spark, until_caught_up=True)
    mariadb.execute(
        f"UPDATE {db}.t SET n = -3 WHERE id = 3",
        f"ALTER TABLE {db}.t ADD COLUMN g INT AS (n * 2) STORED",
        f"UPDATE {db}.t SET n = -4 WHERE id = 4",
    )
    with pytest.raises(SchemaChangeError, match=r"ADD COLUMN g INT AS.*'g' is generated: the server computed its val"):
        run(config, spark=spark, until_caught_up=True)
    rows = {r["id"]: r for r in _iceberg_rows(config, db)}
    assert rows[3]["n"] == -3 and rows[4]["n"] == 4 and "g" not in rows[3]  # committed up to the statement
    with pytest.raises(SchemaChangeError, match=r"'g' is generated"):  # and it holds on restart
        run(config, spark=spark, until_caught_up=True)
    resnapshot(config, [f"{db}.t"])
    run(config, spark=spark, until_caught_up=True)
    assert _iceberg_rows(config, db) == _mysql_rows(mariadb, db)
    assert _iceberg_rows(config, db)[0]["g"] == 2


# Each ALTER gives old rows values the server computes (the table's rows before it: ids 1..30, v 'v<id>', n = id).
COMPUTED_BY_THE_SERVER = {
    "stored": ["ALTER TABLE {t} ADD COLUMN g INT AS (n * 2) STORED"],
    "virtual": ["ALTER TABLE {t} ADD COLUMN g VARCHAR(30) AS (CONCAT(v, '/', n)) VIRTUAL AFTER id"],
    "expression": [
        "ALTER TABLE {t} ADD COLUMN g INT AS (n + 1) PERSISTENT",
        "ALTER TABLE {t} MODIFY g INT AS (n * 3) PERSISTENT",
    ],
    "numbered": ["ALTER TABLE {t} ADD COLUMN seq INT NOT NULL AUTO_INCREMENT, ADD UNIQUE KEY (seq)"],
    "zero_key": ["UPDATE {t} SET id = 0 WHERE id = 1", "ALTER TABLE {t} MODIFY id INT NOT NULL AUTO_INCREMENT"],
    "ignored": ["UPDATE {t} SET n = 1 WHERE id <= 5", "ALTER IGNORE TABLE {t} ADD UNIQUE KEY (n)"],
    "not_null": [
        "UPDATE {t} SET n = NULL WHERE id <= 2",
        "SET SESSION sql_mode = ''",
        "ALTER TABLE {t} MODIFY n INT NOT NULL",
        "SET SESSION sql_mode = DEFAULT",
    ],
    "merge_engine": ["ALTER TABLE {t} ENGINE = MRG_MyISAM"],  # a MERGE table of no tables: its rows are gone
    # Issue 63: a character set that lacks old characters, outside a strict sql_mode: the server writes '?'.
    "narrowed_charset": [
        "UPDATE {t} SET v = 'Привет 中文' WHERE id = 3",
        "SET SESSION sql_mode = ''",
        "ALTER TABLE {t} CONVERT TO CHARACTER SET latin1",
        "SET SESSION sql_mode = DEFAULT",
    ],
    "narrowed_column": [
        "UPDATE {t} SET v = 'ok 😀' WHERE id = 3",
        "ALTER IGNORE TABLE {t} MODIFY v VARCHAR(20) CHARACTER SET utf8mb3",  # IGNORE: warnings, not errors
    ],
}
# Each ALTER keeps every old row's value: followed, not copied again (each table's statements before the first run
# in BEFORE_THE_COPY).
FOLLOWED = {
    "strict": ["ALTER TABLE {t} MODIFY n INT NOT NULL"],  # no NULL in n; the server's default mode is strict
    "strict_charset": ["ALTER TABLE {t} CONVERT TO CHARACTER SET latin1"],  # it fails on a character latin1 lacks
    "wider_charset": [
        "SET SESSION sql_mode = ''",
        "ALTER TABLE {t} CONVERT TO CHARACTER SET utf8mb4",  # utf8mb4 holds every latin1 character
        "SET SESSION sql_mode = DEFAULT",
        "UPDATE {t} SET v = 'Привет 😀' WHERE id = 4",
    ],
    "members": [
        "SET SESSION sql_mode = ''",
        "ALTER TABLE {t} MODIFY e ENUM('z','c','b','a') NOT NULL DEFAULT 'a', MODIFY s SET('x','p','y','q')",
        "SET SESSION sql_mode = DEFAULT",
        "UPDATE {t} SET e = 'c', s = 'x,q' WHERE id = 4",
    ],
}
BEFORE_THE_COPY = {
    "wider_charset": ["ALTER TABLE {t} CONVERT TO CHARACTER SET latin1", "UPDATE {t} SET v = 'é ß' WHERE id = 3"],
    "members": [
        "ALTER TABLE {t} ADD COLUMN e ENUM('a','b','z') NOT NULL DEFAULT 'a', ADD COLUMN s SET('p','q') NULL",
        "UPDATE {t} SET e = 'z', s = 'p,q' WHERE id <= 3",
    ],
}


def test_alters_whose_old_rows_the_server_computes_are_read_again_with_recopy(
    spark: Any, mariadb: MariaDBServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 49: with `stream.on_unfollowable: recopy` each table whose old rows an ALTER gave values the binlog
    does not hold is copied again, and every table ends equal to MariaDB. The same ALTER with its strict
    sql_mode and no IGNORE (table `strict`: a column made NOT NULL holding no NULL) is followed, not copied; so are
    a character set narrowed under a strict sql_mode, one widened outside it, and ENUM and SET members added or
    reordered with every old member kept (issue 63)."""
    db = "evo_computed"
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    names = [*COMPUTED_BY_THE_SERVER, *FOLLOWED]
    for name in names:
        mariadb.execute(
            f"CREATE TABLE {db}.{name} (id INT NOT NULL PRIMARY KEY, v VARCHAR(20), n INT)",
            f"INSERT INTO {db}.{name} SELECT seq, CONCAT('v', seq), seq FROM {db}.seq_1_to_30",
            *(f"{statement.format(t=f'{db}.{name}')}" for statement in BEFORE_THE_COPY.get(name, ())),
        )
    config = parse_config(
        {
            **_section(mariadb, db, tmp_path, "evo_computed_lake", on_unfollowable="recopy"),
            "tables": {"include": [rf"{db}\..*"]},
        }
    )
    run(config, spark=spark, until_caught_up=True)
    with mariadb.admin(db) as conn, conn.cursor() as cur:
        # The rule's premise: under the server's strict default a narrowing that would lose a character fails.
        cur.execute("UPDATE strict_charset SET v = 'Привет' WHERE id = 5")
        with pytest.raises(pymysql.MySQLError) as refused:
            cur.execute("ALTER TABLE strict_charset CONVERT TO CHARACTER SET latin1")
        assert refused.value.args[0] == 1366, refused.value
        cur.execute("UPDATE strict_charset SET v = 'v5' WHERE id = 5")
        for name, statements in {**COMPUTED_BY_THE_SERVER, **FOLLOWED}.items():
            cur.execute(f"UPDATE {name} SET v = 'before' WHERE id = 7")
            for statement in statements:
                cur.execute(statement.format(t=name))
            if name != "merge_engine":
                cur.execute(f"UPDATE {name} SET v = 'after' WHERE id = 8")
        conn.commit()
    with caplog.at_level(logging.INFO, logger="ingest.query.ddl"):
        run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    for name in names:
        assert _iceberg_rows(config, db, name) == _mysql_rows(mariadb, db, name), name
    assert _iceberg_rows(config, db, "stored")[1]["g"] == 4
    assert _iceberg_rows(config, db, "merge_engine") == []
    assert _iceberg_rows(config, db, "narrowed_charset")[2]["v"] == "?????? ??"  # as MariaDB rewrote it
    assert _iceberg_rows(config, db, "wider_charset")[2:4] == [
        {"id": 3, "v": "é ß", "n": 3},
        {"id": 4, "v": "Привет 😀", "n": 4},
    ]
    assert [(r["e"], r["s"]) for r in _iceberg_rows(config, db, "members")[2:5]] == [
        ("z", "p,q"),
        ("c", "x,q"),
        ("a", None),
    ]
    copied = {r.getMessage().split(":", 1)[0] for r in caplog.records if "it is copied again" in r.getMessage()}
    assert copied == {f"{db}.{name}" for name in COMPUTED_BY_THE_SERVER}
    for name in FOLLOWED:
        assert f"{db}.{name}: followed the schema change" in caplog.text


class AlterDuringSnapshot:
    """A chunk hook (run on an executor) that alters the table once, at one point of one chunk's read, then
    writes rows that only the new schema can hold."""

    def __init__(self, socket: str, db: str, at: str, ddl: str, after: tuple[str, ...]) -> None:
        self.socket, self.db, self.at, self.ddl, self.after = socket, db, at, ddl, after

    def __call__(self, at: str, chunk: Any) -> None:
        if at == self.at and chunk.index == 2:
            run_once(self.socket, self.db, "ddl_done", [(s, None) for s in (self.ddl, *self.after)])


ADD_DURING_SNAPSHOT = (
    "ALTER TABLE t ADD COLUMN c INT DEFAULT 7",
    ("UPDATE t SET c = 100 WHERE id = 110", "INSERT INTO t VALUES (121, 'new', 1, 200)"),
)
DROP_DURING_SNAPSHOT = ("ALTER TABLE t DROP COLUMN n", ("UPDATE t SET v = 'after' WHERE id = 110",))
# Another table takes the table's name (not an online schema change tool's helper, whose names end in _new etc.).
SWAP_DURING_SNAPSHOT = (
    "CREATE TABLE t_new LIKE t",
    (
        "ALTER TABLE t_new ADD COLUMN c INT DEFAULT 7",
        "INSERT INTO t_new (id, v, n) SELECT id, v, n FROM t",
        "RENAME TABLE t TO t_old, t_new TO t",
        "UPDATE t SET c = 100 WHERE id = 110",
    ),
)
# A writer session logging as statements (FAILURES.md "Types and settings"): the window cannot know its rows.
STATEMENT_DURING_SNAPSHOT = (
    "SET SESSION binlog_format = 'STATEMENT'",
    ("UPDATE t SET v = 'stmt' WHERE id BETWEEN 30 AND 90",),
)


@pytest.mark.parametrize(
    ("at", "change", "refusal", "metadata"),
    [
        ("after_low_watermark", ADD_DURING_SNAPSHOT, "its schema changed during its snapshot", "FULL"),
        ("before_high_watermark", ADD_DURING_SNAPSHOT, "its schema changed during its snapshot", "FULL"),
        ("after_low_watermark", DROP_DURING_SNAPSHOT, "a column the snapshot reads is gone", "FULL"),
        ("after_low_watermark", SWAP_DURING_SNAPSHOT, "a table replaced by another", "FULL"),
        ("after_low_watermark", STATEMENT_DURING_SNAPSHOT, "logged as SQL text, not as row events", "FULL"),
        # Without column names the rows after the ALTER in the chunk's own window cannot be matched by position
        # with the schema the chunk reads: the chunk read stops there, before the binlog phase would.
        ("after_low_watermark", ADD_DURING_SNAPSHOT, "inside the window of chunk 2, .*binlog_row_metadata", "NO_LOG"),
        ("before_high_watermark", ADD_DURING_SNAPSHOT, "its schema changed during its snapshot", "NO_LOG"),
    ],
    ids=[
        "add-in-window",
        "add-before-high",
        "drop-in-window",
        "swap-in-window",
        "statement-in-window",
        "add-in-window-no-names",
        "add-before-high-no-names",
    ],
)
def test_a_schema_change_during_the_snapshot_stops_the_job_and_resnapshot_recovers(
    spark: Any,
    mariadb: MariaDBServer,
    tmp_path: Path,
    at: str,
    change: tuple[str, tuple[str, ...]],
    refusal: str,
    metadata: str,
) -> None:
    """FAILURES.md "Types and settings": DDL during a chunk window. Chunks read after the statement hold the
    old columns, and the binlog drops their later changes as contained in them: the job must stop, not
    lose the new values (it did: the added column showed the default where the source had 100 and 200)."""
    db = "ddlsnap"
    catalog = f"ddlsnap_{at}_{len(change[1])}_{len(change[0])}_{metadata}"
    _setup(mariadb, db, tmp_path, catalog)
    mariadb.execute(f"CREATE TABLE {db}.ddl_done (x INT)")
    section = {**_section(mariadb, db, tmp_path, catalog), "snapshot": {"chunk_size": 20, "parallelism": 1}}
    config = parse_config(section)
    mariadb.execute(f"SET GLOBAL binlog_row_metadata = '{metadata}'")
    try:
        with pytest.raises(SourceError, match=refusal):
            run(config, spark=spark, until_caught_up=True, hook=AlterDuringSnapshot(mariadb.socket, db, at, *change))
    finally:
        mariadb.execute("SET GLOBAL binlog_row_metadata = 'FULL'")

    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(section))
    unknown = run_ingest("resnapshot", "--config", str(config_file), "--table", f"{db}.nope")
    assert unknown.returncode == 2 and "not a table of pipeline" in unknown.stderr, unknown.stderr[-2000:]
    again = run_ingest("resnapshot", "--config", str(config_file), "--table", f"{db}.t")
    # Into a branch when the columns still fit the target (a statement-format write), else the target is dropped.
    started_over = (f"dropped: {db}.t;", f"meanwhile): {db}.t;")
    assert again.returncode == 0 and any(s in again.stdout for s in started_over), again.stderr[-2000:]
    run(config, spark=spark, until_caught_up=True)
    assert verify(config)
    assert _iceberg_rows(config, db) == _mysql_rows(mariadb, db)
