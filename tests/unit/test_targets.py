"""A target's partition spec from `table_options.<table>.partition_by`, checked against the table
(ingest/sink/targets.py)."""

from __future__ import annotations

import pytest

from ingest.config import PartitionField
from ingest.errors import ConfigError
from ingest.model.columns import SourceColumn
from ingest.model.schema import TableSchema
from ingest.sink.targets import partition_clause

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
