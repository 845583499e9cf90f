"""The ALTER TABLE rule (ingest/source/binlog/alter_rule.py): every clause of the grammar of MariaDB 10.11/11.x and
MySQL 8.4/9.x, as their reference manuals give it, is classified, and the clauses whose old rows' values the server
computes are read again, never followed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ingest.source.binlog.alter_rule import (
    RULES,
    STRICT_ALL_TABLES,
    STRICT_TRANS_TABLES,
    classify,
    column_rule,
    read_alter,
    rules_table,
)
from ingest.source.binlog.ddl import alter_clauses, alter_columns, then

# One example of every clause form of the manuals' ALTER TABLE (alter_specification / alter_option, table_options,
# partition_options, column_definition attributes), with the effect the rule gives it.
CLAUSES: list[tuple[str, str]] = [
    # columns
    ("ADD COLUMN c INT", "columns"),
    ("ADD c INT NULL DEFAULT 3 FIRST", "columns"),
    ("ADD COLUMN IF NOT EXISTS c VARCHAR(10) AFTER b", "columns"),
    ("ADD COLUMN (c INT, d INT)", "columns"),
    ("ADD `select` INT INVISIBLE", "columns"),
    ("CHANGE COLUMN a b BIGINT NOT NULL", "columns"),
    ("CHANGE IF EXISTS a a INT AFTER b", "columns"),
    ("MODIFY COLUMN a BIGINT", "columns"),
    ("MODIFY IF EXISTS a VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin FIRST", "columns"),
    ("DROP COLUMN a", "columns"),
    ("DROP IF EXISTS a CASCADE", "columns"),
    ("DROP a", "columns"),
    ("RENAME COLUMN a TO b", "columns"),
    ("ALTER COLUMN a SET DEFAULT 5", "keeps"),
    ("ALTER a SET DEFAULT (uuid())", "keeps"),
    ("ALTER COLUMN a DROP DEFAULT", "keeps"),
    ("ALTER COLUMN a SET INVISIBLE", "keeps"),
    ("ALTER COLUMN a SET VISIBLE", "keeps"),
    ("CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci", "columns"),
    ("CONVERT TO CHARSET latin1", "columns"),
    # keys, indexes, constraints
    ("ADD PRIMARY KEY (id)", "keys"),
    ("ADD CONSTRAINT pk PRIMARY KEY (id)", "keys"),
    ("ADD UNIQUE KEY u (a)", "keys"),
    ("ADD CONSTRAINT u UNIQUE INDEX (a)", "keys"),
    ("ADD INDEX i (a)", "keeps"),
    ("ADD KEY IF NOT EXISTS i (a) USING BTREE", "keeps"),
    ("ADD FULLTEXT INDEX f (t)", "keeps"),
    ("ADD SPATIAL KEY s (g)", "keeps"),
    ("ADD VECTOR INDEX v (e)", "keeps"),
    ("ADD CONSTRAINT fk FOREIGN KEY (p) REFERENCES parent (id) ON DELETE CASCADE", "keeps"),
    ("ADD FOREIGN KEY (p) REFERENCES parent (id)", "keeps"),
    ("ADD CONSTRAINT c CHECK (a > 0)", "keeps"),
    ("ADD CHECK (a > 0) NOT ENFORCED", "keeps"),
    ("DROP PRIMARY KEY", "keys"),
    ("DROP INDEX i", "keeps"),
    ("DROP KEY IF EXISTS i", "keeps"),
    ("DROP FOREIGN KEY fk", "keeps"),
    ("DROP CONSTRAINT IF EXISTS c", "keeps"),
    ("DROP CHECK c", "keeps"),
    ("ALTER INDEX i IGNORED", "keeps"),
    ("ALTER KEY i NOT IGNORED", "keeps"),
    ("ALTER INDEX i INVISIBLE", "keeps"),
    ("ALTER CHECK c NOT ENFORCED", "keeps"),
    ("ALTER CONSTRAINT c ENFORCED", "keeps"),
    ("RENAME INDEX i TO j", "keeps"),
    ("RENAME KEY i TO j", "keeps"),
    ("DISABLE KEYS", "keeps"),
    ("ENABLE KEYS", "keeps"),
    # periods and system versioning
    ("ADD PERIOD FOR p (s, e)", "keeps"),
    ("DROP PERIOD FOR p", "keeps"),
    ("ADD SYSTEM VERSIONING", "reads"),
    ("ADD PERIOD FOR SYSTEM_TIME (rs, re)", "reads"),
    ("DROP SYSTEM VERSIONING", "reads"),
    ("DROP PERIOD FOR SYSTEM_TIME", "reads"),
    ("WITH SYSTEM VERSIONING", "reads"),
    # the table
    ("RENAME TO u", "table"),
    ("RENAME AS db.u", "table"),
    ("RENAME u", "table"),
    ("ORDER BY a, b", "keeps"),
    ("FORCE", "keeps"),
    ("WITH VALIDATION", "keeps"),
    ("WITHOUT VALIDATION", "keeps"),
    ("SECONDARY_LOAD", "keeps"),
    ("SECONDARY_UNLOAD", "keeps"),
    ("ALGORITHM=INPLACE", "keeps"),
    ("ALGORITHM = INSTANT", "keeps"),
    ("LOCK=NONE", "keeps"),
    ("LOCK SHARED", "keeps"),
    ("ENGINE=InnoDB", "keeps"),
    ("ENGINE = Aria ROW_FORMAT=PAGE", "keeps"),
    ("UNION=(t1, t2)", "reads"),
    ("SEQUENCE=1", "reads"),
    ("AUTO_INCREMENT=100", "keeps"),
    ("AUTOEXTEND_SIZE=4M", "keeps"),
    ("AVG_ROW_LENGTH 100", "keeps"),
    ("DEFAULT CHARACTER SET = utf8mb4", "keeps"),
    ("CHARACTER SET latin1", "keeps"),
    ("DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin", "keeps"),
    ("CHARSET utf8mb4", "keeps"),
    ("COLLATE utf8mb4_bin", "keeps"),
    ("DEFAULT COLLATE utf8mb4_bin", "keeps"),
    ("CHECKSUM=1", "keeps"),
    ("COMMENT 'a table, of things'", "keeps"),
    ("COMMENT = 'x'", "keeps"),
    ("COMPRESSION='zlib'", "keeps"),
    ("CONNECTION='mysql://u@h/db/t'", "keeps"),
    ("DATA DIRECTORY='/data'", "keeps"),
    ("INDEX DIRECTORY='/idx'", "keeps"),
    ("DELAY_KEY_WRITE=1", "keeps"),
    ("ENCRYPTED=YES", "keeps"),
    ("ENCRYPTION='Y'", "keeps"),
    ("ENCRYPTION_KEY_ID=2", "keeps"),
    ("ENGINE_ATTRIBUTE='{}'", "keeps"),
    ("SECONDARY_ENGINE_ATTRIBUTE='{}'", "keeps"),
    ("SECONDARY_ENGINE=RAPID", "keeps"),
    ("IETF_QUOTES=YES", "keeps"),
    ("INSERT_METHOD=LAST", "keeps"),
    ("KEY_BLOCK_SIZE=8", "keeps"),
    ("MAX_ROWS=1000", "keeps"),
    ("MIN_ROWS=10", "keeps"),
    ("PACK_KEYS=DEFAULT", "keeps"),
    ("PAGE_CHECKSUM=1", "keeps"),
    ("PAGE_COMPRESSED=1 PAGE_COMPRESSION_LEVEL=9", "keeps"),
    ("PASSWORD='x'", "keeps"),
    ("ROW_FORMAT=DYNAMIC", "keeps"),
    ("STATS_AUTO_RECALC=0 STATS_PERSISTENT=1 STATS_SAMPLE_PAGES=20", "keeps"),
    ("TABLESPACE ts1", "keeps"),
    ("TRANSACTIONAL=1", "keeps"),
    ("STORAGE DISK", "keeps"),
    # partitions and tablespaces
    ("ADD PARTITION (PARTITION p3 VALUES LESS THAN (30))", "partitions"),
    ("DROP PARTITION p1", "partitions"),
    ("TRUNCATE PARTITION ALL", "partitions"),
    ("COALESCE PARTITION 2", "partitions"),
    ("REORGANIZE PARTITION p1 INTO (PARTITION a VALUES LESS THAN (5), PARTITION b VALUES LESS THAN (9))", "partitions"),
    ("EXCHANGE PARTITION p1 WITH TABLE other", "partitions"),
    ("ANALYZE PARTITION p1", "partitions"),
    ("CHECK PARTITION ALL", "partitions"),
    ("OPTIMIZE PARTITION p1", "partitions"),
    ("REBUILD PARTITION p1", "partitions"),
    ("REPAIR PARTITION p1", "partitions"),
    ("REMOVE PARTITIONING", "partitions"),
    ("PARTITION BY HASH (id) PARTITIONS 4", "partitions"),
    ("CONVERT PARTITION p1 TO TABLE archived", "partitions"),
    ("CONVERT TABLE loose TO PARTITION p9 VALUES LESS THAN (90)", "partitions"),
    ("DISCARD TABLESPACE", "partitions"),
    ("IMPORT TABLESPACE", "partitions"),
    ("DISCARD PARTITION p1 TABLESPACE", "partitions"),
    ("IMPORT PARTITION ALL TABLESPACE", "partitions"),
    ("UPGRADE PARTITIONING", "partitions"),
]


@pytest.mark.parametrize(("clause", "effect"), CLAUSES, ids=[c for c, _ in CLAUSES])
def test_every_clause_of_the_grammar_is_classified(clause: str, effect: str) -> None:
    rule = classify(clause)
    assert rule is not None, clause
    assert rule.effect == effect


def test_every_rule_has_an_example_and_no_example_is_left_to_chance() -> None:
    used = {classify(c) for c, _ in CLAUSES}
    assert [r.clause for r in RULES if r not in used] == []


@pytest.mark.parametrize(
    "clause", ["FROB THE TABLE", "ADD WIDGET", "SPLIT PARTITION p", "DROP EVERYTHING PLEASE", "ENGINE"]
)
def test_a_clause_the_job_does_not_know_is_read_again_never_passed_over(clause: str) -> None:
    reading = read_alter([clause])
    assert reading.reads_again, clause


# Column definitions whose old rows' values the server computes: ADD and MODIFY/CHANGE, each attribute of
# column_definition that does it (generated, AUTO_INCREMENT, system versioning).
COMPUTED = [
    ("ADD COLUMN g INT AS (a * 2) STORED", "'g' is generated"),
    ("ADD g INT GENERATED ALWAYS AS (a * 2) VIRTUAL", "'g' is generated"),
    ("ADD COLUMN g INT AS (a + 1) PERSISTENT AFTER a", "'g' is generated"),
    ("ADD COLUMN g VARCHAR(20) AS (JSON_VALUE(doc, '$.name'))", "'g' is generated"),
    ("ADD COLUMN `we ird` INT GENERATED ALWAYS AS (1) STORED", "'we ird' is generated"),
    ("MODIFY g INT AS (a * 3) STORED", "'g' is generated"),
    ("CHANGE g h INT GENERATED ALWAYS AS (a * 3) VIRTUAL", "'h' is generated"),
    ("ADD COLUMN n BIGINT NOT NULL AUTO_INCREMENT UNIQUE", "'n' is added AUTO_INCREMENT"),
    ("ADD COLUMN v INT WITH SYSTEM VERSIONING", "'v' is made system-versioned"),
    ("ADD COLUMN (x INT, g INT AS (x) VIRTUAL)", "generated, AUTO_INCREMENT"),
]


@pytest.mark.parametrize(("clause", "why"), COMPUTED, ids=[c for c, _ in COMPUTED])
def test_values_the_server_computes_per_row_are_read_again(clause: str, why: str) -> None:
    reading = read_alter([clause])
    assert len(reading.reads_again) == 1 and why in reading.reads_again[0]


@pytest.mark.parametrize(
    "clause",
    [
        "ADD COLUMN c INT DEFAULT 3",
        "ADD COLUMN c VARCHAR(10) NOT NULL DEFAULT 'AS (x)' COMMENT 'GENERATED ALWAYS'",
        "ADD COLUMN c INT DEFAULT (CAST('1' AS SIGNED))",
        "ADD COLUMN c DATETIME DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP",
        "MODIFY a BIGINT NOT NULL",
        "CHANGE a b INT COMMENT 'was AUTO_INCREMENT'",
    ],
)
def test_definitions_the_job_can_derive_are_followed(clause: str) -> None:
    # A default computed at the moment is found by the server's information_schema, not by the text (test_ddl).
    assert read_alter([clause]).reads_again == ()


def test_auto_increment_given_to_a_column_numbers_only_rows_holding_zero_or_null() -> None:
    assert column_rule("MODIFY id BIGINT NOT NULL AUTO_INCREMENT") == (None, "id")
    assert column_rule("CHANGE id `key` BIGINT AUTO_INCREMENT") == (None, "key")
    reading = read_alter(["MODIFY id BIGINT NOT NULL AUTO_INCREMENT"])
    assert reading.reads_again == () and reading.numbered == ("id",)


def test_alter_ignore_with_a_unique_key_deletes_rows_and_is_read_again() -> None:
    said = alter_columns("ALTER IGNORE TABLE t ADD UNIQUE (email)", "db", STRICT_TRANS_TABLES)
    assert said.reads_again and "duplicate key" in said.reads_again[0] and not said.strict
    assert alter_columns("ALTER TABLE t ADD UNIQUE (email)", "db").reads_again == ()
    assert alter_columns("ALTER ONLINE IGNORE TABLE t ADD PRIMARY KEY (id)", "db").reads_again


@pytest.mark.parametrize(
    ("engine", "followed"),
    [("InnoDB", True), ("MyISAM", True), ("Aria", True), ("MEMORY", True), ("BLACKHOLE", False),
     ("MRG_MyISAM", False), ("FEDERATED", False), ("CONNECT", False), ("SPIDER", False), ("`Archive`", True)],
)  # fmt: skip
def test_another_storage_engine_is_followed_only_where_it_keeps_the_rows(engine: str, followed: bool) -> None:
    assert (read_alter([f"ENGINE={engine}"]).reads_again == ()) is followed
    assert (read_alter([f"ROW_FORMAT=DYNAMIC ENGINE {engine} COMMENT 'x'"]).reads_again == ()) is followed


def test_strictness_comes_from_the_statements_sql_mode() -> None:
    query = "ALTER TABLE t MODIFY a INT NOT NULL"
    assert alter_columns(query, "db", STRICT_TRANS_TABLES).strict
    assert alter_columns(query, "db", STRICT_ALL_TABLES | 1).strict
    assert not alter_columns(query, "db", 0).strict
    assert not alter_columns(query, "db", None).strict  # not known: not strict
    assert not alter_columns(f"ALTER IGNORE TABLE t {query[14:]}", "db", STRICT_TRANS_TABLES).strict


def test_two_alters_compose_what_they_say_of_old_rows() -> None:
    first = alter_columns("ALTER TABLE h MODIFY id BIGINT AUTO_INCREMENT", "db", STRICT_TRANS_TABLES)
    second = alter_columns("ALTER TABLE h RENAME COLUMN id TO ident, ADD g INT AS (ident) STORED", "db", 0)
    both = then(first, second)
    assert both.numbered == ("ident",) and len(both.reads_again) == 1 and not both.strict


def test_partition_names_after_a_partition_clause_belong_to_it() -> None:
    clauses = alter_clauses("ALTER TABLE t DROP PARTITION p1, p2, p3")
    assert clauses is not None and read_alter(clauses).reads_again == ()


def test_docs_give_the_rule_table_as_the_code_has_it() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "config.md").read_text()
    table = rules_table()
    assert table in docs, (
        "paste `python -m ingest.source.binlog.alter_rule` into docs/config.md (Every clause of ALTER)"
    )
    assert re.search(r"\| clause \| servers \|", table)
