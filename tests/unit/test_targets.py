"""A target's partition spec from `table_options.<table>.partition_by`, checked against the table, and the
targets' names checked before anything is written (ingest/sink/targets.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ingest.config import PartitionField, parse_config
from ingest.errors import ConfigError
from ingest.model.columns import SourceColumn
from ingest.model.schema import TableSchema
from ingest.sink.targets import check_targets, partition_clause

SCHEMA = TableSchema(
    "db",
    "t",
    (
        SourceColumn("id", "bigint", "bigint(20)", False),
        SourceColumn("created at", "datetime", "datetime(6)", True, datetime_precision=6),
        SourceColumn("day", "date", "date", True),
        SourceColumn("name", "varchar", "varchar(20)", True),
        SourceColumn("ratio", "double", "double", True),
    ),
    ("id",),
    ("id",),
    (None,),
)


def test_partition_fields_become_a_quoted_partitioned_by_list() -> None:
    fields = (
        PartitionField("hours", "created at"),
        PartitionField("bucket", "id", 16),
        PartitionField("truncate", "name", 3),
        PartitionField("identity", "day"),
    )
    assert partition_clause(SCHEMA, fields) == "hours(`created at`), bucket(16, `id`), truncate(3, `name`), `day`"


@pytest.mark.parametrize(
    ("field", "message"),
    [
        (
            PartitionField("days", "created"),
            "`table_options.db.t.partition_by`: db.t has no column 'created' (columns: id, created at, day, name, "
            "ratio)",
        ),
        (
            PartitionField("hours", "day"),
            "`table_options.db.t.partition_by`: hours(day) cannot partition db.t: column 'day' is DATE in Iceberg; "
            "hours takes TIMESTAMP, TIMESTAMP_NTZ",
        ),
        (PartitionField("bucket", "ratio", 4), "column 'ratio' is DOUBLE in Iceberg; bucket takes INT, BIGINT"),
        (PartitionField("identity", "ratio"), "ratio cannot partition db.t: column 'ratio' is DOUBLE"),
    ],
)
def test_a_field_the_table_cannot_take_is_refused_with_the_key(field: PartitionField, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        partition_clause(SCHEMA, (field,))
    assert message in str(raised.value)


@pytest.fixture(autouse=True)
def _password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INGEST_UNIT_TARGETS_PW", "x")


def _config(changelog: bool = False, **extra: Any) -> Any:
    document = {
        "source": {"host": "db", "user": "cdc", "password": {"env": "INGEST_UNIT_TARGETS_PW"}},
        "tables": {"include": [r"db\..*"]},
        "sink": {"catalog": {"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db"}, "changelog": changelog},
        **extra,
    }
    return parse_config(document)


def test_two_tables_writing_one_iceberg_table_are_refused_before_anything_is_written() -> None:
    other = dataclasses.replace(SCHEMA, table="u")
    check_targets(_config(), [SCHEMA, other])
    with pytest.raises(ConfigError, match=r"`db.t` and `db.u` would both write the Iceberg table db.t"):
        check_targets(_config(table_options={"db.u": {"target": "db.t"}}), [SCHEMA, other])
    # A changelog table's name counts too.
    with pytest.raises(ConfigError, match=r"would both write the Iceberg table db.t_changelog"):
        check_targets(_config(True, table_options={"db.u": {"target": "db.t_changelog"}}), [SCHEMA, other])


def test_a_partition_spec_naming_no_column_is_refused_by_the_check_too() -> None:
    config = _config(table_options={"db.t": {"partition_by": ["days(created)"]}})
    with pytest.raises(ConfigError, match="db.t has no column 'created'"):
        check_targets(config.targets, [SCHEMA])
