"""Unit tests of ingest/sink/catalog.py: one catalog definition seen from Spark and from pyiceberg."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ingest.config import Secret, SinkConfig
from ingest.errors import ConfigError
from ingest.sink.catalog import catalog_password, pyiceberg_properties, spark_catalog_conf

PG_PW = "pg-Vn5tR8wQ"
S3_PW = "s3-Hj3kL6zX"


def sink(catalog: dict[str, str | Secret], name: str = "lake") -> SinkConfig:
    return SinkConfig(catalog_name=name, catalog=catalog)


@pytest.fixture
def pgpassword(monkeypatch: pytest.MonkeyPatch) -> str:
    """PGPASSWORD set to a sentinel, restored (or removed) after the test whatever the code does: the job must
    not put the catalog's password in its environment, which the JVM and every Python worker inherit."""
    monkeypatch.setenv("PGPASSWORD", "sentinel-before")
    return "sentinel-before"


# --------------------------------------------------------------------------------------------------
# Spark
# --------------------------------------------------------------------------------------------------


def test_spark_conf_splits_plain_and_secret_settings() -> None:
    plain, secret = spark_catalog_conf(
        sink(
            {
                "type": "jdbc",
                "uri": "jdbc:postgresql://h:5432/db",
                "jdbc.user": "u",
                "jdbc.password": Secret(PG_PW, "env:PG"),
                "s3.access-key-id": "AKIA",
                "s3.secret-access-key": Secret(S3_PW, "env:S3"),
            },
            name="s3lake",
        )
    )
    assert plain == {
        "spark.sql.catalog.s3lake": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.s3lake.cache-enabled": "false",
        "spark.sql.catalog.s3lake.jdbc.schema-version": "V1",
        "spark.sql.catalog.s3lake.type": "jdbc",
        "spark.sql.catalog.s3lake.uri": "jdbc:postgresql://h:5432/db",
        "spark.sql.catalog.s3lake.jdbc.user": "u",
        "spark.sql.catalog.s3lake.s3.access-key-id": "AKIA",
    }
    assert secret == {
        "spark.sql.catalog.s3lake.jdbc.password": PG_PW,
        "spark.sql.catalog.s3lake.s3.secret-access-key": S3_PW,
    }
    assert PG_PW not in repr(plain)
    assert S3_PW not in repr(plain)


def test_spark_conf_without_secrets() -> None:
    plain, secret = spark_catalog_conf(sink({"type": "rest", "uri": "http://rest:8181"}))
    assert plain == {
        "spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.lake.type": "rest",
        "spark.sql.catalog.lake.uri": "http://rest:8181",
        "spark.sql.catalog.lake.cache-enabled": "false",
    }
    assert secret == {}
    # The user may turn Spark's table cache back on.
    plain, _ = spark_catalog_conf(sink({"type": "rest", "uri": "http://rest:8181", "cache-enabled": "true"}))
    assert plain["spark.sql.catalog.lake.cache-enabled"] == "true"


# --------------------------------------------------------------------------------------------------
# pyiceberg
# --------------------------------------------------------------------------------------------------


def test_sqlite_jdbc_becomes_sql_catalog(pgpassword: str) -> None:
    props = pyiceberg_properties(
        sink(
            {
                "type": "jdbc",
                "uri": "jdbc:sqlite:/x/c.db",
                "warehouse": "file:///x/wh",
                "jdbc.password": Secret("p", "e"),
            }
        )
    )
    assert props == {
        "type": "sql",
        "uri": "sqlite:////x/c.db",
        "warehouse": "file:///x/wh",
        "schema_version": "v1",
        "pool_pre_ping": "true",
    }
    assert os.environ["PGPASSWORD"] == pgpassword


def test_sqlite_jdbc_with_file_prefix() -> None:
    assert pyiceberg_properties(sink({"type": "jdbc", "uri": "jdbc:sqlite:file:/x/c.db"})) == {
        "type": "sql",
        "uri": "sqlite:////x/c.db",
        "schema_version": "v1",
        "pool_pre_ping": "true",
    }


def test_postgresql_jdbc_keeps_the_password_out_of_every_property(pgpassword: str) -> None:
    props = pyiceberg_properties(
        sink(
            {
                "type": "jdbc",
                "uri": "jdbc:postgresql://h:5432/db",
                "jdbc.user": "u",
                "jdbc.password": Secret(PG_PW, "env:PG"),
                "warehouse": "s3://bucket/wh",
            }
        )
    )
    assert props == {
        "type": "sql",
        "uri": "postgresql+psycopg2://u@h:5432/db",
        "warehouse": "s3://bucket/wh",
        "schema_version": "v1",
        "pool_pre_ping": "true",
    }
    assert all(PG_PW not in value for value in props.values())
    assert all(PG_PW not in key for key in props)
    assert os.environ["PGPASSWORD"] == pgpassword  # not handed to child processes either
    assert PG_PW not in repr(dict(os.environ))


def test_the_postgresql_password_is_given_to_the_driver_alone() -> None:
    catalog: dict[str, str | Secret] = {
        "type": "jdbc",
        "uri": "jdbc:postgresql://h/db",
        "jdbc.password": Secret(PG_PW, "e"),
    }
    assert catalog_password(sink(catalog)) == PG_PW
    assert catalog_password(sink({**catalog, "uri": "jdbc:sqlite:/x/c.db"})) is None
    assert catalog_password(sink({"type": "jdbc", "uri": "jdbc:postgresql://h/db"})) is None


def test_postgresql_jdbc_without_user_or_password(pgpassword: str) -> None:
    props = pyiceberg_properties(sink({"type": "jdbc", "uri": "jdbc:postgresql://h/db"}))
    assert props == {
        "type": "sql",
        "uri": "postgresql+psycopg2://h/db",
        "schema_version": "v1",
        "pool_pre_ping": "true",
    }
    assert os.environ["PGPASSWORD"] == pgpassword


def test_other_secrets_are_revealed_to_pyiceberg(pgpassword: str) -> None:
    props = pyiceberg_properties(
        sink(
            {
                "type": "jdbc",
                "uri": "jdbc:postgresql://h:5432/db",
                "jdbc.password": Secret(PG_PW, "env:PG"),
                "s3.secret-access-key": Secret(S3_PW, "env:S3"),
            }
        )
    )
    assert props == {
        "type": "sql",
        "uri": "postgresql+psycopg2://h:5432/db",
        "s3.secret-access-key": S3_PW,
        "schema_version": "v1",
        "pool_pre_ping": "true",
    }


def test_a_jdbc_catalog_keeps_its_tables_with_view_support_unless_the_user_says_otherwise() -> None:
    # V1: Spark's tableExists asks for a view too, which a V0 catalog refuses (UnsupportedOperationException).
    plain, _ = spark_catalog_conf(sink({"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db"}))
    assert plain["spark.sql.catalog.lake.jdbc.schema-version"] == "V1"
    assert pyiceberg_properties(sink({"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db"}))["schema_version"] == "v1"
    own = sink({"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db", "jdbc.schema-version": "V0"})
    assert spark_catalog_conf(own)[0]["spark.sql.catalog.lake.jdbc.schema-version"] == "V0"
    assert pyiceberg_properties(own)["schema_version"] == "v0"
    assert "spark.sql.catalog.lake.jdbc.schema-version" not in spark_catalog_conf(sink({"type": "rest"}))[0]


def test_mysql_jdbc_catalog_is_refused_by_name(pgpassword: str) -> None:
    # Its password could only reach pyiceberg inside a URL, so it is not supported.
    with pytest.raises(ConfigError, match=r"^`sink.catalog.uri`: JDBC catalogs on mysql are not supported"):
        pyiceberg_properties(sink({"type": "jdbc", "uri": "jdbc:mysql://h:3306/cat", "jdbc.user": "u"}))
    assert os.environ["PGPASSWORD"] == pgpassword


def test_mysql_jdbc_password_is_not_silently_dropped(pgpassword: str) -> None:
    # docs/config.md lists MySQL among the JDBC catalogs pyiceberg is derived for. The password must reach
    # pyiceberg somehow (PyMySQL reads no environment variable), or the catalog must be refused by name.
    catalog: dict[str, str | Secret] = {
        "type": "jdbc",
        "uri": "jdbc:mysql://h:3306/cat",
        "jdbc.user": "u",
        "jdbc.password": Secret("my-Pw7", "env:MY"),
    }
    try:
        props = pyiceberg_properties(sink(catalog))
    except ConfigError as e:
        assert "sink.catalog" in str(e)
    else:
        assert any("my-Pw7" in value for value in props.values()), props


def test_non_jdbc_uri_for_a_jdbc_catalog_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        pyiceberg_properties(sink({"type": "jdbc", "uri": "postgresql://h/db?password=leaky"}))
    assert str(info.value) == "`sink.catalog.uri` of a jdbc catalog must start with jdbc:, got 'postgresql://h/db'"


def test_missing_uri_for_a_jdbc_catalog_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        pyiceberg_properties(sink({"type": "jdbc"}))
    assert str(info.value) == "`sink.catalog.uri` of a jdbc catalog must start with jdbc:, got ''"


def test_unsupported_jdbc_database_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        pyiceberg_properties(sink({"type": "jdbc", "uri": "jdbc:oracle:thin:@h:1521/x"}))
    assert str(info.value) == "`sink.catalog.uri`: JDBC catalogs on oracle are not supported (sqlite, postgresql)"


def test_rest_catalog_passes_through_unchanged(pgpassword: str) -> None:
    catalog: dict[str, str | Secret] = {
        "type": "rest",
        "uri": "http://rest:8181",
        "warehouse": "wh",
        "jdbc.user": "not-touched",
        "credential": Secret("id:sec", "env:C"),
    }
    props = pyiceberg_properties(sink(catalog))
    assert props == {
        "type": "rest",
        "uri": "http://rest:8181",
        "warehouse": "wh",
        "jdbc.user": "not-touched",
        "credential": "id:sec",
    }
    assert os.environ["PGPASSWORD"] == pgpassword


def test_pyiceberg_properties_does_not_modify_the_sink() -> None:
    catalog: dict[str, str | Secret] = {"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db", "jdbc.user": "u"}
    pyiceberg_properties(sink(catalog))
    assert catalog == {"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db", "jdbc.user": "u"}


def test_the_redaction_pattern_names_every_secret_setting_and_keeps_the_given_one() -> None:
    import re

    from ingest.runtime.spark import SPARK_REDACTION_DEFAULT, redaction_regex

    secret = {"spark.sql.catalog.lake.credential": "c", "spark.sql.catalog.lake.jdbc.password": "p"}
    pattern = redaction_regex(None, secret)
    assert pattern.startswith(SPARK_REDACTION_DEFAULT + "|")
    # Java's \Q...\E quoting reads like re.escape here: the names hold dots and dashes only.
    python = re.compile(pattern.replace(r"\Q", "").replace(r"\E", "").replace(".", r"\."))
    assert python.search("spark.sql.catalog.lake.credential")  # a name Spark's default misses
    assert not python.search("spark.sql.catalog.lake.uri")
    assert redaction_regex("(?i)mine", {}) == "(?i)mine"
    assert redaction_regex(pattern, secret) == pattern  # applied twice (a second pipeline): not repeated


def test_a_process_that_sees_many_sinks_keeps_a_few_catalogs_open(tmp_path: Path) -> None:
    """Each SQL catalog holds a database connection: a process running pipeline after pipeline (tests, a notebook)
    must not keep one per sink it ever saw (CI's test process once ran out of descriptors below 1024 for select)."""
    from ingest.sink import catalog

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    sinks = [
        sink({"type": "jdbc", "uri": f"jdbc:sqlite:{tmp_path}/c{i}.db", "warehouse": f"file://{tmp_path}/w"}, f"c{i}")
        for i in range(catalog.CACHED_CATALOGS + 6)
    ]
    before = open_fds()
    first = catalog.cached_pyiceberg_catalog(sinks[0])
    first.create_namespace("ns")
    for s in sinks[1:]:
        catalog.cached_pyiceberg_catalog(s).list_namespaces()
    assert open_fds() - before <= catalog.CACHED_CATALOGS
    assert first.list_namespaces() == [("ns",)]  # let go, not broken: a caller holding it still reads
    assert catalog.cached_pyiceberg_catalog(sinks[-1]) is catalog.cached_pyiceberg_catalog(sinks[-1])
