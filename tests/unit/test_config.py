"""Unit tests of ingest/config.py: parsing, defaults, validation messages, secrets and target naming."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.config import (
    MaintenanceConfig,
    PartitionField,
    PipelineConfig,
    Secret,
    SnapshotConfig,
    SparkConfig,
    StartupConfig,
    TableOptions,
    TableSelection,
    TlsConfig,
    load_config,
    parse_config,
    resolve_secret,
)
from ingest.errors import ConfigError
from ingest.model.position import BinlogPosition, MariadbGtidPos

PW_ENV = "INGEST_UT_SOURCE_PASSWORD"
PW = "pw-Zq8vX3rT"
S3_ENV = "INGEST_UT_S3_SECRET"
S3_SECRET = "s3-Kk2mW9pL"
TOKEN_ENV = "INGEST_UT_REST_TOKEN"
TOKEN = "tok-Yb7nC4dE"

MINIMAL: dict[str, Any] = {
    "source": {"host": "db.example", "user": "cdc", "password": {"env": PW_ENV}},
    "tables": {"include": [r"shop\..*"]},
    "sink": {"catalog": {"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db"}},
}


@pytest.fixture(autouse=True)
def _secrets_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PW_ENV, PW)
    monkeypatch.setenv(S3_ENV, S3_SECRET)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)


def cfg(**sections: Any) -> dict[str, Any]:
    """The minimal config with some top-level sections replaced (None removes one)."""
    data = copy.deepcopy(MINIMAL)
    for key, value in sections.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def with_source(**keys: Any) -> dict[str, Any]:
    data = cfg()
    data["source"].update(keys)
    return data


def with_sink(**keys: Any) -> dict[str, Any]:
    data = cfg()
    data["sink"].update(keys)
    return data


def with_catalog(**keys: Any) -> dict[str, Any]:
    data = cfg()
    data["sink"]["catalog"].update(keys)
    return data


def error_of(data: Any, base_dir: Path = Path(".")) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, base_dir)
    return str(info.value)


# --------------------------------------------------------------------------------------------------
# A minimal config and every default
# --------------------------------------------------------------------------------------------------


def test_minimal_config_takes_every_default() -> None:
    config = parse_config(cfg())
    assert config.name == "pipeline"
    assert config.startup_mode == "initial"
    assert config.table_options == {}

    source = config.source
    assert source.host == "db.example"
    assert source.user == "cdc"
    assert source.password.reveal() == PW
    assert source.password.source == f"env:{PW_ENV}"
    assert source.port == 3306
    assert source.flavor == "auto"
    assert source.server_id == 5400
    assert source.tls == TlsConfig(mode="disabled", ca_file=None)
    assert source.connect_timeout == 10

    assert [p.pattern for p in config.tables.include] == [r"shop\..*"]
    assert config.tables.exclude == ()

    sink = config.sink
    assert sink.catalog_name == "lake"
    assert dict(sink.catalog) == {"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db"}
    assert sink.namespace == "{database}"
    assert sink.table_name == "{table}"
    assert sink.state_table == "ingest_meta.state"
    assert sink.format_version == 2
    assert dict(sink.table_properties) == {}

    assert config.snapshot == SnapshotConfig(chunk_size=8192, parallelism=2, chunks_per_commit=128)
    assert config.spark.master == "local[2]"
    assert dict(config.spark.conf) == {}


def test_every_key_set_explicitly_is_kept() -> None:
    data = {
        "name": "orders-cdc_1",
        "source": {
            "host": "h",
            "port": 3307,
            "user": "u",
            "password": {"env": PW_ENV},
            "flavor": "mariadb",
            "server_id": 77,
            "tls": {"mode": "verify_identity", "ca_file": "/etc/ca.pem"},
            "connect_timeout": 3,
        },
        "tables": {"include": "shop\\.orders", "exclude": ["shop\\.tmp_.*"]},
        "sink": {
            "catalog_name": "warehouse_1",
            "catalog": {"type": "rest", "uri": "http://rest:8181"},
            "namespace": "raw.{database}",
            "table_name": "{pipeline}_{table}",
            "state_table": "meta.state",
            "format_version": 3,
            "table_properties": {"write.target-file-size-bytes": 1024},
        },
        "snapshot": {"chunk_size": 100, "parallelism": 4, "chunks_per_commit": 8},
        "spark": {"master": "local[8]", "conf": {"spark.sql.shuffle.partitions": 4}},
        "startup_mode": "snapshot_only",
        "table_options": {"shop.orders": {"chunk_key": "order_no", "chunk_size": 500}},
    }
    config = parse_config(data)
    assert config.name == "orders-cdc_1"
    assert (config.source.port, config.source.flavor, config.source.server_id) == (3307, "mariadb", 77)
    assert config.source.tls == TlsConfig("verify_identity", "/etc/ca.pem")
    assert config.source.connect_timeout == 3
    assert [p.pattern for p in config.tables.include] == ["shop\\.orders"]
    assert [p.pattern for p in config.tables.exclude] == ["shop\\.tmp_.*"]
    assert config.sink.catalog_name == "warehouse_1"
    assert config.sink.state_table == "meta.state"
    assert config.sink.format_version == 3
    assert dict(config.sink.table_properties) == {"write.target-file-size-bytes": "1024"}
    assert config.snapshot == SnapshotConfig(100, 4, 8)
    assert config.spark == SparkConfig("local[8]", {"spark.sql.shuffle.partitions": "4"})
    assert config.startup_mode == "snapshot_only"
    assert config.table_options == {"shop.orders": TableOptions(chunk_key=("order_no",), chunk_size=500)}
    assert config.options_for("shop", "orders").chunk_size == 500
    assert config.options_for("shop", "items") == TableOptions()
    assert config.target_for("shop", "orders") == ("raw.shop", "orders-cdc_1_orders")
    # A copy with one option changed keeps the others (bench.apply makes one so; None was refused as a chunk key).
    assert dataclasses.replace(TableOptions(), target="a.b") == TableOptions(target="a.b")


# --------------------------------------------------------------------------------------------------
# Unknown keys name the full key path
# --------------------------------------------------------------------------------------------------


def test_unknown_top_level_key() -> None:
    data = cfg(snapshots={"chunk_size": 5})
    assert error_of(data) == "unknown key `snapshots`; see docs/config.md for the valid keys"


def test_unknown_key_next_to_the_catalog_names_sink_catalgo() -> None:
    data = with_sink(catalgo={"type": "rest"})
    assert error_of(data) == "unknown key `sink.catalgo` in `sink`; see docs/config.md for the valid keys"


def test_misspelled_catalog_section_is_reported_as_the_unknown_key() -> None:
    # docs/config.md promises `unknown key `sink.catalgo`` for exactly this typo.
    data = cfg(sink={"catalgo": {"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db"}})
    assert "unknown key `sink.catalgo`" in error_of(data)


def test_unknown_nested_tls_key() -> None:
    data = with_source(tls={"modee": "required"})
    assert error_of(data) == "unknown key `source.tls.modee` in `source.tls`; see docs/config.md for the valid keys"


def test_unknown_source_key() -> None:
    data = with_source(hostname="x")
    assert error_of(data) == "unknown key `source.hostname` in `source`; see docs/config.md for the valid keys"


def test_unknown_table_option_key() -> None:
    data = cfg(table_options={"db.t": {"chunk_sise": 10}})
    assert (
        error_of(data)
        == "unknown key `table_options.db.t.chunk_sise` in `table_options.db.t`; see docs/config.md for the valid keys"
    )


def test_unknown_snapshot_and_spark_keys() -> None:
    assert "unknown key `snapshot.chunksize` in `snapshot`" in error_of(cfg(snapshot={"chunksize": 1}))
    assert "unknown key `spark.mastr` in `spark`" in error_of(cfg(spark={"mastr": "local"}))


def test_spark_log_level_is_error_unless_asked_and_names_its_choices() -> None:
    assert parse_config(cfg()).spark.log_level == "ERROR"
    assert parse_config(cfg(spark={"log_level": "WARN"})).spark.log_level == "WARN"
    error = error_of(cfg(spark={"log_level": "warning"}))
    assert error == "`spark.log_level` must be one of ERROR, WARN, INFO, DEBUG; got 'warning'"


def test_target_maintenance_defaults_off_switches_and_bad_values() -> None:
    def maintenance(**values: Any) -> Any:
        return parse_config(cfg(sink={**MINIMAL["sink"], "maintenance": values})).sink.maintenance

    assert parse_config(cfg()).sink.maintenance == MaintenanceConfig(every_commits=50, expire_after_hours=24.0)
    assert maintenance(every_commits=0, expire_after_hours=None) == MaintenanceConfig(0, None)
    assert maintenance(expire_after_hours=0.5) == MaintenanceConfig(50, 0.5)
    sink = MINIMAL["sink"]
    assert "`sink.maintenance.every_commits` must be 0 (never) or more" in error_of(
        cfg(sink={**sink, "maintenance": {"every_commits": -1}})
    )
    assert "`sink.maintenance.expire_after_hours` must be 0 or more" in error_of(
        cfg(sink={**sink, "maintenance": {"expire_after_hours": -2}})
    )
    assert "unknown key `sink.maintenance.every`" in error_of(cfg(sink={**sink, "maintenance": {"every": 3}}))


# --------------------------------------------------------------------------------------------------
# Wrong types and values
# --------------------------------------------------------------------------------------------------


def test_port_must_be_int() -> None:
    assert error_of(with_source(port="x")) == "`source.port` must be int, got 'x'"


@pytest.mark.parametrize("port", [0, 65536, -1])
def test_port_range(port: int) -> None:
    assert error_of(with_source(port=port)) == f"`source.port` must be a TCP port, 1-65535; got {port}"


def test_boolean_is_not_an_int() -> None:
    assert error_of(with_source(port=True)) == "`source.port` must be int, got True"
    assert error_of(with_source(server_id=False)) == "`source.server_id` must be int, got False"
    assert error_of(cfg(snapshot={"parallelism": True})) == "`snapshot.parallelism` must be int, got True"
    assert (
        error_of(cfg(table_options={"db.t": {"chunk_size": True}}))
        == "`table_options.db.t.chunk_size` must be int, got True"
    )


def test_float_is_not_an_int() -> None:
    assert error_of(cfg(snapshot={"chunk_size": 1.5})) == "`snapshot.chunk_size` must be int, got 1.5"


@pytest.mark.parametrize("key", ["chunk_size", "parallelism", "chunks_per_commit"])
def test_snapshot_values_must_be_positive(key: str) -> None:
    assert error_of(cfg(snapshot={key: 0})) == f"`snapshot.{key}` must be at least 1, got 0"


def test_source_positive_ints() -> None:
    assert error_of(with_source(server_id=0)) == "`source.server_id` must be at least 1, got 0"
    assert error_of(with_source(connect_timeout=-5)) == "`source.connect_timeout` must be at least 1, got -5"


def test_table_option_chunk_size_must_be_positive() -> None:
    data = cfg(table_options={"db.t": {"chunk_size": 0}})
    assert error_of(data) == "`table_options.db.t.chunk_size` must be at least 1, got 0"


def test_required_source_keys() -> None:
    data = cfg()
    del data["source"]["host"]
    assert error_of(data) == "`source.host` is required"
    data = cfg()
    del data["source"]["user"]
    assert error_of(data) == "`source.user` is required"
    data = cfg()
    del data["source"]["password"]
    assert error_of(data) == "`source.password` is required (`{env: VARIABLE}` or `{file: PATH}`)"


def test_required_tables_include() -> None:
    assert error_of(cfg(tables={"exclude": ["x"]})) == "`tables.include` is required"


def test_section_must_be_a_mapping() -> None:
    assert error_of(cfg(source="db.example")) == "`source` must be a mapping, got str"
    assert error_of(cfg(snapshot=[1, 2])) == "`snapshot` must be a mapping, got list"


def test_choices_name_the_key_and_the_allowed_values() -> None:
    assert (
        error_of(with_source(flavor="percona")) == "`source.flavor` must be one of auto, mysql, mariadb; got 'percona'"
    )
    assert (
        error_of(with_source(tls={"mode": "on"}))
        == "`source.tls.mode` must be one of disabled, required, verify_ca, verify_identity; got 'on'"
    )
    assert error_of(cfg(startup_mode="forever")) == (
        "`startup_mode` must be one of initial, snapshot_only, latest, binlog_position, gtid, timestamp; got 'forever'"
    )


def test_bad_pipeline_name() -> None:
    assert error_of(cfg(name="my pipeline")) == "`name` must be 1-64 letters, digits, '_' or '-'; got 'my pipeline'"
    assert "`name` must be 1-64" in error_of(cfg(name="x" * 65))
    assert parse_config(cfg(name="x" * 64)).name == "x" * 64


def test_bad_catalog_name_and_state_table() -> None:
    assert error_of(with_sink(catalog_name="1lake")) == "`sink.catalog_name` must be a plain identifier, got '1lake'"
    assert error_of(with_sink(state_table="state")) == "`sink.state_table` must be `namespace.table`, got 'state'"


@pytest.mark.parametrize("version", [1, 4])
def test_format_version_must_be_2_or_3(version: int) -> None:
    assert error_of(with_sink(format_version=version)) == f"`sink.format_version` must be 2 or 3, got {version}"


# --------------------------------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["verify_ca", "verify_identity"])
def test_verifying_tls_needs_a_ca_file(mode: str) -> None:
    assert (
        error_of(with_source(tls={"mode": mode}))
        == f"`source.tls.ca_file` is required when `source.tls.mode` is {mode}"
    )


@pytest.mark.parametrize("mode", ["required", "verify_ca"])
def test_mysqlclient_is_refused_under_a_tls_mode_it_cannot_keep_to(mode: str) -> None:
    data = with_source(tls={"mode": mode, "ca_file": "/ca.pem"})
    data["snapshot"] = {"driver": "mysqlclient"}
    assert error_of(data).startswith(f"`snapshot.driver: mysqlclient` cannot keep to `source.tls.mode: {mode}`")
    data["snapshot"] = {"driver": "auto"}
    assert parse_config(data).snapshot.driver == "auto"  # reads with PyMySQL (ingest.source.snapshot.chunk_select)
    data["source"]["tls"]["mode"] = "verify_identity"
    data["snapshot"] = {"driver": "mysqlclient"}
    assert parse_config(data).snapshot.driver == "mysqlclient"


def test_tls_required_needs_no_ca_file() -> None:
    assert parse_config(with_source(tls={"mode": "required"})).source.tls == TlsConfig("required", None)
    assert parse_config(with_source(tls={"mode": "verify_ca", "ca_file": "/ca.pem"})).source.tls == TlsConfig(
        "verify_ca", "/ca.pem"
    )


# --------------------------------------------------------------------------------------------------
# Table selection
# --------------------------------------------------------------------------------------------------


def test_bad_regex_names_the_list_index() -> None:
    message = error_of(cfg(tables={"include": ["shop\\..*", "(unclosed"]}))
    assert message.startswith("`tables.include[1]` is not a valid regular expression ('(unclosed'): ")
    assert "missing )" in message


def test_bad_exclude_regex_names_the_list_index() -> None:
    message = error_of(cfg(tables={"include": ".*", "exclude": ["[z-a]"]}))
    assert message.startswith("`tables.exclude[0]` is not a valid regular expression ('[z-a]'): ")


def test_include_must_be_regexes() -> None:
    assert error_of(cfg(tables={"include": 5})) == "`tables.include` must be list or str, got 5"
    assert error_of(cfg(tables={"include": ["a", 5]})) == "`tables.include` must be a list of regular expressions"


def test_selection_is_a_full_match() -> None:
    selection = TableSelection(include=(re.compile(r"shop\..*"),))
    assert selection.matches("shop", "orders") is True
    assert selection.matches("shopx", "orders") is False
    assert selection.matches("xshop", "orders") is False
    assert selection.matches("shop", "") is True


def test_selection_from_config_full_match_and_exclude_wins() -> None:
    config = parse_config(cfg(tables={"include": ["shop\\..*", "crm\\.customers"], "exclude": "shop\\.tmp_.*"}))
    assert config.tables.matches("shop", "orders") is True
    assert config.tables.matches("crm", "customers") is True
    assert config.tables.matches("crm", "customers_old") is False
    assert config.tables.matches("shop", "tmp_import") is False
    assert config.tables.matches("shopx", "orders") is False
    assert config.tables.matches("xshop", "orders") is False


def test_exclude_wins_over_include_of_the_same_table() -> None:
    selection = TableSelection(include=(re.compile("db\\.t"),), exclude=(re.compile("db\\.t"),))
    assert selection.matches("db", "t") is False


# --------------------------------------------------------------------------------------------------
# Secrets
# --------------------------------------------------------------------------------------------------


def test_literal_password_is_refused_with_the_env_hint() -> None:
    message = error_of(with_source(password="hunter2-literal"))
    assert message == (
        "`source.password` must not be written in the file; use `{env: VARIABLE}` or `{file: /path/to/secret}`"
    )
    assert "hunter2-literal" not in message


@pytest.mark.parametrize("value", [{"vault": "x"}, {"env": "A", "file": "b"}, 1234, ["x"], None])
def test_secret_must_be_a_reference(value: Any) -> None:
    message = error_of(with_source(password=value))
    assert message == "`source.password` must be `{env: VARIABLE}` or `{file: /path/to/secret}`"


def test_env_secret_with_unset_variable_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INGEST_UT_NOT_SET", raising=False)
    message = error_of(with_source(password={"env": "INGEST_UT_NOT_SET"}))
    assert message == "`source.password` names environment variable INGEST_UT_NOT_SET, which is not set"


def test_env_secret_may_be_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INGEST_UT_EMPTY", "")
    assert resolve_secret({"env": "INGEST_UT_EMPTY"}, "k", Path(".")).reveal() == ""


def test_file_secret_is_relative_to_the_base_dir_and_loses_its_trailing_newline(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "pw.txt").write_text("  file pw \n")
    config = parse_config(with_source(password={"file": "secrets/pw.txt"}), tmp_path)
    assert config.source.password.reveal() == "  file pw "
    assert config.source.password.source == f"file:{tmp_path / 'secrets' / 'pw.txt'}"


def test_file_secret_strips_crlf_only_at_the_end(tmp_path: Path) -> None:
    (tmp_path / "pw").write_bytes(b"a\nb\r\n")
    assert resolve_secret({"file": "pw"}, "k", tmp_path).reveal() == "a\nb"


def test_absolute_file_secret_ignores_the_base_dir(tmp_path: Path) -> None:
    path = tmp_path / "abs.txt"
    path.write_text("abs-pw\n")
    secret = resolve_secret({"file": str(path)}, "source.password", Path("/nonexistent-base"))
    assert secret.reveal() == "abs-pw"


def test_missing_file_secret_names_the_key_and_path(tmp_path: Path) -> None:
    message = error_of(with_source(password={"file": "nope.txt"}), tmp_path)
    assert message == (
        f"`source.password` names file {tmp_path / 'nope.txt'}, which cannot be read: No such file or directory"
    )


def test_directory_as_file_secret_is_unreadable(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    message = error_of(with_source(password={"file": "dir"}), tmp_path)
    assert message == f"`source.password` names file {tmp_path / 'dir'}, which cannot be read: Is a directory"


def test_secret_repr_and_str_hide_the_value() -> None:
    secret = Secret("very-secret-value", "env:X")
    assert repr(secret) == "Secret(env:X, ***)"
    assert str(secret) == "Secret(env:X, ***)"
    assert f"{secret}" == "Secret(env:X, ***)"
    assert "very-secret-value" not in repr([secret, {"k": secret}])
    assert secret.reveal() == "very-secret-value"


def test_secret_equality_is_by_value() -> None:
    assert Secret("a", "env:X") == Secret("a", "file:/y")
    assert Secret("a", "env:X") != Secret("b", "env:X")
    assert Secret("a", "env:X") != "a"
    assert len({Secret("a", "env:X"), Secret("a", "env:Y")}) == 1


def test_repr_of_a_whole_config_contains_no_secret() -> None:
    data = with_catalog(
        **{
            "s3.secret-access-key": {"env": S3_ENV},
            "token": {"env": TOKEN_ENV},
            "uri": {"env": S3_ENV},
        }
    )
    config = parse_config(data)
    assert isinstance(config, PipelineConfig)
    text = repr(config) + str(config) + repr(config.sink) + repr(config.source)
    assert PW not in text
    assert S3_SECRET not in text
    assert TOKEN not in text
    assert f"Secret(env:{PW_ENV}, ***)" in repr(config)


# --------------------------------------------------------------------------------------------------
# Catalog properties
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["jdbc.password", "s3.secret-access-key", "token", "credential", "rest.auth.Token", "PASSWORD", "oauth2-secret"],
)
def test_secret_looking_catalog_keys_must_be_references(key: str) -> None:
    message = error_of(with_catalog(**{key: "plain-value-123"}))
    assert message == (
        f"`sink.catalog.{key}` must not be written in the file; use `{{env: VARIABLE}}` or `{{file: /path/to/secret}}`"
    )
    assert "plain-value-123" not in message


def test_secret_catalog_key_as_reference_and_plain_access_key_id() -> None:
    config = parse_config(
        with_catalog(
            **{
                "s3.access-key-id": "AKIAEXAMPLE",
                "s3.secret-access-key": {"env": S3_ENV},
                "client.credentials-provider": "software.amazon.awssdk.auth.credentials.AnonymousCredentialsProvider",
            }
        )
    )
    catalog = config.sink.catalog
    assert catalog["s3.access-key-id"] == "AKIAEXAMPLE"
    secret = catalog["s3.secret-access-key"]
    assert isinstance(secret, Secret)
    assert secret.reveal() == S3_SECRET
    assert secret.source == f"env:{S3_ENV}"
    assert catalog["client.credentials-provider"] == (
        "software.amazon.awssdk.auth.credentials.AnonymousCredentialsProvider"
    )


def test_catalog_env_reference_on_any_key_is_a_secret() -> None:
    catalog = parse_config(with_catalog(warehouse={"env": S3_ENV})).sink.catalog
    assert isinstance(catalog["warehouse"], Secret)
    assert catalog["warehouse"].reveal() == S3_SECRET


def test_catalog_scalars_become_strings_and_booleans_lowercase() -> None:
    catalog = parse_config(
        with_catalog(**{"s3.path-style-access": True, "cache-enabled": False, "clients": 4, "ratio": 0.5})
    ).sink.catalog
    assert catalog["s3.path-style-access"] == "true"
    assert catalog["cache-enabled"] == "false"
    assert catalog["clients"] == "4"
    assert catalog["ratio"] == "0.5"


def test_catalog_value_of_a_bad_type() -> None:
    assert (
        error_of(with_catalog(warehouse=["a", "b"])) == "`sink.catalog.warehouse` must be a string, number or boolean"
    )


def test_catalog_needs_a_type_or_impl() -> None:
    assert (
        error_of(with_sink(catalog={"uri": "http://x"}))
        == "`sink.catalog.type` is required (jdbc, rest, glue, hive, hadoop)"
    )
    impl = "org.apache.iceberg.nessie.NessieCatalog"
    assert parse_config(with_sink(catalog={"catalog-impl": impl})).sink.catalog == {"catalog-impl": impl}


# --------------------------------------------------------------------------------------------------
# Target naming
# --------------------------------------------------------------------------------------------------


def test_default_templates() -> None:
    assert parse_config(cfg()).target_for("shop", "orders") == ("shop", "orders")


def test_templates_use_database_table_and_pipeline() -> None:
    config = parse_config(
        {**with_sink(namespace="raw.{pipeline}_{database}", table_name="{database}__{table}"), "name": "p1"}
    )
    assert config.target_for("shop", "orders") == ("raw.p1_shop", "shop__orders")


@pytest.mark.parametrize(
    ("template", "reason"),
    [("{schema}", "'schema'"), ("{0}", "Replacement index 0 out of range for positional args tuple")],
)
def test_bad_namespace_template_names_sink_namespace(template: str, reason: str) -> None:
    assert error_of(with_sink(namespace=template)) == (
        f"`sink.namespace` may use only {{database}}, {{table}} and {{pipeline}}; {template!r}: {reason}"
    )


def test_bad_table_name_template_names_sink_table_name() -> None:
    message = error_of(with_sink(table_name="{table"))
    assert message.startswith("`sink.table_name` may use only {database}, {table} and {pipeline}; '{table': ")


def test_attribute_access_in_a_template_is_a_config_error() -> None:
    # "{table.x}".format(...) raises AttributeError, which parse_config does not turn into a ConfigError.
    message = error_of(with_sink(table_name="{table.x}"))
    assert message.startswith("`sink.table_name` may use only {database}, {table} and {pipeline}")


def test_table_options_key_without_a_dot() -> None:
    assert error_of(cfg(table_options={"orders": {}})) == "`table_options` keys are `database.table`, got 'orders'"
    assert error_of(cfg(table_options={"a.b.c": {}})) == "`table_options` keys are `database.table`, got 'a.b.c'"


def test_target_override() -> None:
    config = parse_config(
        {
            **with_sink(namespace="raw_{database}"),
            "table_options": {"shop.orders": {"target": "lake_ns.sub.orders_v2", "chunk_key": ["a", "b"]}},
        }
    )
    assert config.target_for("shop", "orders") == ("lake_ns.sub", "orders_v2")
    assert config.target_for("shop", "items") == ("raw_shop", "items")
    assert config.options_for("shop", "orders") == TableOptions(
        chunk_key=("a", "b"), chunk_size=None, target="lake_ns.sub.orders_v2"
    )


def test_target_override_needs_a_namespace() -> None:
    data = cfg(table_options={"shop.orders": {"target": "orders"}})
    assert error_of(data) == "`table_options.shop.orders.target` must be `namespace.table`, got 'orders'"


# --------------------------------------------------------------------------------------------------
# load_config
# --------------------------------------------------------------------------------------------------


def test_load_config_reads_yaml_and_resolves_files_next_to_it(tmp_path: Path) -> None:
    (tmp_path / "pw.txt").write_text("from-file\n")
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        "name: demo\n"
        "source:\n"
        "  host: db\n"
        "  user: cdc\n"
        "  password: {file: pw.txt}\n"
        "tables:\n"
        "  include: ['shop\\..*']\n"
        "sink:\n"
        "  catalog: {type: jdbc, uri: 'jdbc:sqlite:/x/c.db', s3.path-style-access: true}\n"
    )
    config = load_config(str(path))
    assert config.name == "demo"
    assert config.source.password.reveal() == "from-file"
    assert config.sink.catalog["s3.path-style-access"] == "true"
    assert config.tables.matches("shop", "orders") is True


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"cannot read pipeline file {path}: No such file or directory"


def test_load_config_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("source: [unclosed\n  host: x\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"pipeline file {path} is not valid YAML: ")


def test_load_config_of_a_list_document(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "must be a mapping, got list" in str(info.value)


# --------------------------------------------------------------------------------------------------
# Changelog tables
# --------------------------------------------------------------------------------------------------


def test_changelog_is_off_by_default() -> None:
    config = parse_config(cfg())
    assert config.sink.changelog is False
    assert config.changelog_for("shop", "orders") is None


def test_changelog_per_table_sits_next_to_the_target() -> None:
    data = cfg(table_options={"shop.orders": {"changelog": True}, "shop.items": {"target": "lake.items_v2"}})
    config = parse_config(data)
    assert config.table_options["shop.orders"] == TableOptions(changelog=True)
    assert config.changelog_for("shop", "orders") == ("shop", "orders_changelog")
    assert config.changelog_for("shop", "items") is None


def test_changelog_global_default_and_per_table_opt_out() -> None:
    data = with_sink(changelog=True, namespace="raw_{database}")
    data["table_options"] = {"shop.items": {"changelog": False, "target": "lake.sub.items_v2"}}
    config = parse_config(data)
    assert config.changelog_for("shop", "orders") == ("raw_shop", "orders_changelog")
    assert config.changelog_for("shop", "items") is None
    data["table_options"]["shop.items"]["changelog"] = True
    assert parse_config(data).changelog_for("shop", "items") == ("lake.sub", "items_v2_changelog")


def test_changelog_must_be_a_boolean() -> None:
    assert error_of(with_sink(changelog="yes")) == "`sink.changelog` must be bool, got 'yes'"
    data = cfg(table_options={"db.t": {"changelog": 1}})
    assert error_of(data) == "`table_options.db.t.changelog` must be bool, got 1"


def test_schema_change_policy_defaults_to_evolve_and_names_its_choices() -> None:
    assert parse_config(cfg()).stream.on_schema_change == "evolve"
    for policy in ("evolve", "fail", "ignore"):
        assert parse_config(cfg(stream={"on_schema_change": policy})).stream.on_schema_change == policy
    assert (
        error_of(cfg(stream={"on_schema_change": "apply"}))
        == "`stream.on_schema_change` must be one of evolve, fail, ignore; got 'apply'"
    )


def test_a_purged_binlog_stops_the_job_unless_told_to_copy_every_table_again() -> None:
    assert parse_config(cfg()).stream.on_purged == "stop"
    assert parse_config(cfg(stream={"on_purged": "resnapshot"})).stream.on_purged == "resnapshot"
    assert (
        error_of(cfg(stream={"on_purged": "skip"})) == "`stream.on_purged` must be one of stop, resnapshot; got 'skip'"
    )


def test_a_checkpoint_is_optional_and_a_file_that_still_names_an_engine_is_told_to_drop_it() -> None:
    assert parse_config(cfg()).stream.checkpoint_location is None
    assert parse_config(cfg(stream={"checkpoint_location": "s3a://b/ck"})).stream.checkpoint_location == "s3a://b/ck"
    for engine in ("loop", "structured"):
        assert error_of(cfg(stream={"engine": engine})) == (
            "`stream.engine` is gone: the job always runs as one Spark Structured Streaming query (the driver loop, "
            "`loop`, was removed, and `structured` is what runs); delete the setting"
        )


def test_snapshot_requests_are_looked_for_every_ten_seconds_unless_set() -> None:
    assert parse_config(cfg()).stream.signal_poll_seconds == 10.0
    assert parse_config(cfg(stream={"signal_poll_seconds": 0.5})).stream.signal_poll_seconds == 0.5
    assert error_of(cfg(stream={"signal_poll_seconds": 0})) == "`stream.signal_poll_seconds` must be positive, got 0.0"


# --------------------------------------------------------------------------------------------------
# Startup modes that copy nothing: `startup_mode` and the `startup` section
# --------------------------------------------------------------------------------------------------


def test_latest_needs_no_startup_keys_and_initial_has_none() -> None:
    config = parse_config(cfg(startup_mode="latest"))
    assert config.startup_mode == "latest"
    assert config.startup == StartupConfig()
    assert parse_config(cfg()).startup == StartupConfig()


def test_binlog_position_is_parsed_into_a_position() -> None:
    config = parse_config(
        cfg(startup_mode="binlog_position", startup={"binlog_file": "mysql-bin.000003", "binlog_position": 1234})
    )
    assert config.startup.position == BinlogPosition("mysql-bin.000003", 1234)


def test_gtid_is_parsed_into_a_mariadb_gtid_position() -> None:
    config = parse_config(cfg(startup_mode="gtid", startup={"gtid": "0-1-100, 1-2-5"}))
    assert config.startup.gtid == MariadbGtidPos.parse("0-1-100,1-2-5")


@pytest.mark.parametrize(
    "value",
    ["2026-11-25T14:00:00Z", "2026-11-25T15:00:00+01:00", dt.datetime(2026, 11, 25, 14, tzinfo=dt.UTC)],
)
def test_timestamp_is_an_aware_time_in_utc(value: Any) -> None:
    config = parse_config(cfg(startup_mode="timestamp", startup={"timestamp": value}))
    assert config.startup.timestamp == dt.datetime(2026, 11, 25, 14, tzinfo=dt.UTC)


def test_timestamp_written_in_yaml_without_quotes_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    data = cfg(startup_mode="timestamp")
    path.write_text(yaml.safe_dump(data) + "startup:\n  timestamp: 2026-11-25T14:00:00Z\n")
    assert load_config(path).startup.timestamp == dt.datetime(2026, 11, 25, 14, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("mode", "startup", "message"),
    [
        ("binlog_position", None, "`startup.binlog_file` is required with `startup_mode: binlog_position`"),
        (
            "binlog_position",
            {"binlog_file": "mysql-bin.000003"},
            "`startup.binlog_position` is required with `startup_mode: binlog_position`",
        ),
        (
            "binlog_position",
            {"binlog_file": "mysql-bin.000003", "binlog_position": 2},
            "`startup.binlog_position` must be 4 or more (a binlog's first event), got 2",
        ),
        (
            "binlog_position",
            {"binlog_file": "mysql-bin.000003", "binlog_position": "12"},
            "`startup.binlog_position` must be int, got '12'",
        ),
        (
            "binlog_position",
            {"binlog_file": "mysql-bin", "binlog_position": 4},
            "`startup.binlog_file`: invalid binlog file 'mysql-bin': expected 'name.N' like 'mysql-bin.000003'",
        ),
        ("gtid", None, "`startup.gtid` is required with `startup_mode: gtid`"),
        ("gtid", {"gtid": " "}, "`startup.gtid` must name a GTID position like '0-1-100', got ' '"),
        ("timestamp", {"timestamp": "yesterday"}, "`startup.timestamp` must be an ISO 8601 time with its time zone"),
        ("timestamp", {"timestamp": "2026-11-25T14:00:00"}, "`startup.timestamp` must say its time zone"),
        ("timestamp", {"timestamp": dt.date(2026, 11, 25)}, "not a date alone"),
        ("timestamp", {"timestamp": 1764079200}, "`startup.timestamp` must be str or datetime or date, got 1764079200"),
        ("latest", {"gtid": "0-1-1"}, "`startup.gtid` is only used with `startup_mode: gtid` (it is latest)"),
        ("initial", {"timestamp": "2026-11-25T14:00:00Z"}, "`startup.timestamp` is only used with `startup_mode: t"),
        (
            "gtid",
            {"gtid": "0-1-1", "binlog_position": 4},
            "`startup.binlog_position` is only used with `startup_mode: binlog_position` (it is gtid)",
        ),
    ],
)
def test_startup_keys_must_fit_the_mode(mode: str, startup: Any, message: str) -> None:
    assert message in error_of(cfg(startup_mode=mode, startup=startup))


def test_a_mysql_gtid_set_is_refused_with_a_hint() -> None:
    message = error_of(cfg(startup_mode="gtid", startup={"gtid": "3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5"}))
    assert message.startswith("`startup.gtid`: invalid MariaDB GTID position")
    assert "MySQL GTID set" in message


def test_unknown_startup_key() -> None:
    assert error_of(cfg(startup_mode="latest", startup={"offset": 1})).startswith("unknown key `startup.offset`")


def test_partition_by_takes_iceberg_transforms_of_columns() -> None:
    data = cfg(
        table_options={
            "db.t": {"partition_by": ["days(created_at)", "bucket(16, id)", "truncate( 10 ,name)", "region"]}
        }
    )
    fields = parse_config(data).options_for("db", "t").partition_by
    assert fields == (
        PartitionField("days", "created_at"),
        PartitionField("bucket", "id", 16),
        PartitionField("truncate", "name", 10),
        PartitionField("identity", "region"),
    )
    assert [str(f) for f in fields] == ["days(created_at)", "bucket(16, id)", "truncate(10, name)", "region"]
    assert parse_config(cfg(table_options={"db.t": {"partition_by": "hours(at)"}})).options_for(
        "db", "t"
    ).partition_by == (PartitionField("hours", "at"),)
    assert parse_config(cfg()).options_for("db", "t").partition_by == ()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["weeks(at)"], "`table_options.db.t.partition_by`: 'weeks(at)' is not a partition field; write `column`"),
        (["bucket(id)"], "'bucket(id)' is not a partition field"),
        (["bucket(0, id)"], "the width of 'bucket(0, id)' must be at least 1"),
        (["days(at)", "days(at)"], "`table_options.db.t.partition_by` names a partition field twice"),
        (["at", "days(at)"], "column 'at' is partitioned by identity and by a transform"),
        ([7], "`table_options.db.t.partition_by` must be a list of partition fields such as 'days(created_at)', got 7"),
    ],
)
def test_partition_by_errors_name_the_key(given: list[Any], message: str) -> None:
    assert message in error_of(cfg(table_options={"db.t": {"partition_by": given}}))


def test_dropped_tables_and_ddl_evolve_cannot_follow_have_their_policies() -> None:
    stream = parse_config(cfg()).stream
    assert (stream.on_drop_table, stream.on_unfollowable) == ("keep", "fail")
    chosen = parse_config(cfg(stream={"on_drop_table": "drop", "on_unfollowable": "recopy"})).stream
    assert (chosen.on_drop_table, chosen.on_unfollowable) == ("drop", "recopy")
    assert error_of(cfg(stream={"on_drop_table": "purge"})) == (
        "`stream.on_drop_table` must be one of keep, drop; got 'purge'"
    )
    assert "which only `stream.on_schema_change: evolve` follows" in error_of(
        cfg(stream={"on_unfollowable": "recopy", "on_schema_change": "fail"})
    )
