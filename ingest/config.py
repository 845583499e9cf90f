"""The pipeline file: one YAML document, validated on load, every key documented in docs/config.md.

Each section is a typed, frozen settings class (pydantic dataclasses): its fields say each key's type, range and
default; what types cannot say (a secret's reference, a pattern, a key that needs another) its validators check.
`parse_config` turns pydantic's errors into one message naming the key, e.g. "`source.port` must be int, got 'x'".

Secrets are never literal strings in the file: they are `{env: NAME}` or `{file: PATH}` references,
resolved into `Secret` values whose repr is redacted, so they cannot leak through logs or errors.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, cast

import yaml
from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import ErrorDetails, PydanticCustomError

from ingest.errors import ConfigError
from ingest.model.position import BinlogPosition, MariadbGtidPos

Flavor = Literal["auto", "mysql", "mariadb"]
TlsMode = Literal["disabled", "required", "verify_ca", "verify_identity"]
StartupMode = Literal["initial", "snapshot_only", "latest", "binlog_position", "gtid", "timestamp"]
# The modes that copy nothing: the first run creates the targets empty and reads the binlog from a point.
BINLOG_START_MODES: tuple[StartupMode, ...] = ("latest", "binlog_position", "gtid", "timestamp")
SchemaChangePolicy = Literal["evolve", "fail", "ignore"]
PurgedPolicy = Literal["stop", "resnapshot"]
DropTablePolicy = Literal["keep", "drop"]
UnfollowablePolicy = Literal["fail", "recopy"]
UnrepresentablePolicy = Literal["null", "stop", "dead_letter"]
UNREPRESENTABLE_POLICIES: tuple[str, ...] = ("null", "stop", "dead_letter")


class Secret:
    """A value that prints as `***`; call `reveal()` only where the value is handed to a client."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value
        self.source = source

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({self.source}, ***)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


# ---------------------------------------------------------------------------------------------------
# What a value's validator says is wrong. The message names the key with `{key}` (the value's own path, such as
# `source.port`) or `{in}` (the path of the section it is checked in, with a trailing dot: `{in}mode` is
# `source.tls.mode`); `parse_config` fills them in, since a validator does not know where its value sits.


def _refuse(message: str) -> PydanticCustomError:
    return PydanticCustomError("settings", "{message}", {"message": message})


def _check(test: Callable[[Any], bool], message: str) -> AfterValidator:
    """A value that passes `test`, or `message`, where `{value}` stands for the value's repr and `{plain}` for its
    text."""

    def checked(value: Any) -> Any:
        if not test(value):
            raise _refuse(message.replace("{value}", repr(value)).replace("{plain}", str(value)))
        return value

    return AfterValidator(checked)


Text = Annotated[str, Strict()]
Flag = Annotated[bool, Strict()]
AtLeastOne = Annotated[int, Strict(), Field(ge=1)]
Seconds = Annotated[float, Strict(), Field(gt=0)]
"""A positive number of seconds (an int is taken as a float)."""
TcpPort = Annotated[
    int, Strict(), _check(lambda p: 1 <= p <= 65535, "`{key}` must be a TCP port, 1-65535; got {plain}")
]


def _secret(value: Any, info: ValidationInfo) -> Secret:
    """`{env: NAME}` or `{file: PATH}` (relative to the pipeline file) into a Secret."""
    if isinstance(value, Secret):
        return value
    base_dir = (info.context or {}).get("base_dir", Path("."))
    return _resolve(value, "{key}", base_dir)


def _resolve(value: Any, key: str, base_dir: Path) -> Secret:
    if isinstance(value, str):
        raise _refuse(
            f"`{key}` must not be written in the file; use `{{env: VARIABLE}}` or `{{file: /path/to/secret}}`"
        )
    if not isinstance(value, Mapping) or len(value) != 1 or next(iter(value)) not in ("env", "file"):
        raise _refuse(f"`{key}` must be `{{env: VARIABLE}}` or `{{file: /path/to/secret}}`")
    kind, ref = next(iter(value.items()))
    if kind == "env":
        if str(ref) not in os.environ:
            raise _refuse(f"`{key}` names environment variable {ref}, which is not set")
        return Secret(os.environ[str(ref)], f"env:{ref}")
    path = Path(str(ref))
    if not path.is_absolute():
        path = base_dir / path
    try:
        return Secret(path.read_text().rstrip("\r\n"), f"file:{path}")
    except OSError as e:
        raise _refuse(f"`{key}` names file {path}, which cannot be read: {e.strerror}") from None


def resolve_secret(value: Any, key: str, base_dir: Path) -> Secret:
    """`{env: NAME}` or `{file: PATH}` into a Secret, outside a pipeline file (a ConfigError names `key`)."""
    try:
        return _resolve(value, key, base_dir)
    except PydanticCustomError as e:
        raise ConfigError(str((e.context or {})["message"])) from None


SecretValue = Annotated[Secret, BeforeValidator(_secret)]


def _none_or_one_or_many(value: Any) -> list[Any] | None:
    """`_one_or_many` for a key whose None means "not set" (`chunk_key: null`, or a copy of options made with
    `dataclasses.replace`)."""
    return None if value is None else _one_or_many(value)


def _one_or_many(value: Any) -> list[Any]:
    """A key that takes one value or a list of them (`include`, `chunk_key`, `partition_by`), as a list."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise _refuse(f"`{{key}}` must be list or str, got {value!r}")
    return list(value)


def _patterns(value: Any) -> tuple[re.Pattern[str], ...]:
    """One regular expression or a list of them, compiled."""
    if isinstance(value, tuple) and all(isinstance(p, re.Pattern) for p in value):
        return value
    value = _one_or_many(value)
    if not all(isinstance(p, str) for p in value):
        raise _refuse("`{key}` must be a list of regular expressions")
    compiled = []
    for i, p in enumerate(value):
        try:
            compiled.append(re.compile(p))
        except re.error as e:
            raise _refuse(f"`{{key}}[{i}]` is not a valid regular expression ({p!r}): {e}") from None
    return tuple(compiled)


Patterns = Annotated[tuple[re.Pattern[str], ...], BeforeValidator(_patterns)]


def _strings(value: Any) -> Any:
    """A mapping passed through as text (`spark.conf`, `sink.table_properties`)."""
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else value


StringMap = Annotated[Mapping[str, str], BeforeValidator(_strings)]


_SECTION = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
"""Every section refuses keys it does not know; `Secret` and the binlog positions are checked as instances."""


@dataclass(frozen=True, config=_SECTION)
class _Settings:
    """A section of the pipeline file. A key written as null (YAML `key:` and nothing) takes its default, except
    those in `NULL_MEANS` (where null says something: `expire_after_hours: null` is "never")."""

    NULL_MEANS: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {k: v for k, v in data.items() if v is not None or k in cls.NULL_MEANS}
        return data


@dataclass(frozen=True, config=_SECTION)
class TlsConfig(_Settings):
    """TLS to MySQL; `disabled` is an explicit choice, never a silent fallback."""

    mode: TlsMode = "disabled"
    ca_file: Text | None = None

    def __post_init__(self) -> None:
        if self.mode in ("verify_ca", "verify_identity") and not self.ca_file:
            raise _refuse(f"`{{in}}ca_file` is required when `{{in}}mode` is {self.mode}")


@dataclass(frozen=True, config=_SECTION)
class SourceConfig(_Settings):
    """Where the MySQL/MariaDB server is and who the job connects as (the least-privilege CDC user)."""

    NULL_MEANS: ClassVar[tuple[str, ...]] = ("password",)  # written but empty: told what a reference looks like

    host: Text
    user: Text
    password: SecretValue
    port: TcpPort = 3306
    flavor: Flavor = "auto"
    server_id: AtLeastOne = 5400
    tls: TlsConfig = TlsConfig()
    connect_timeout: AtLeastOne = 10
    reconnect_seconds: Seconds = 300.0


@dataclass(frozen=True, config=_SECTION)
class TableSelection(_Settings):
    """Regexes matched against `database.table` (whole name); exclude wins over include."""

    include: Patterns
    exclude: Patterns = ()

    def matches(self, database: str, table: str) -> bool:
        name = f"{database}.{table}"
        return any(p.fullmatch(name) for p in self.include) and not any(p.fullmatch(name) for p in self.exclude)


PartitionTransform = Literal["identity", "years", "months", "days", "hours", "bucket", "truncate"]


@dataclass(frozen=True, config=_SECTION)
class PartitionField(_Settings):
    """One field of a target's partition spec: an Iceberg transform of a source column."""

    transform: PartitionTransform
    column: Text
    width: int | None = None
    """The number of buckets (`bucket`) or the width (`truncate`); None for the others."""

    def render(self, column: str) -> str:
        """The field as Iceberg's DDL writes it, with `column` standing for the column (quoted or not)."""
        if self.transform == "identity":
            return column
        if self.width is not None:
            return f"{self.transform}({self.width}, {column})"
        return f"{self.transform}({column})"

    def __str__(self) -> str:
        return self.render(self.column)


_PARTITION_FIELD = re.compile(
    r"\s*(?:(?P<fn>years|months|days|hours)\((?P<col>[^,()]+)\)"
    r"|(?P<wfn>bucket|truncate)\(\s*(?P<width>\d+)\s*,(?P<wcol>[^,()]+)\)"
    r"|(?P<plain>[^,()]+))\s*"
)


def parse_partition_field(text: str, key: str) -> PartitionField:
    """`days(created_at)`, `bucket(16, id)`, `truncate(1000, id)` or a bare column (identity)."""
    match = _PARTITION_FIELD.fullmatch(text)
    if match is None:
        raise ConfigError(
            f"`{key}`: {text!r} is not a partition field; write `column`, `years(column)`, `months(column)`, "
            "`days(column)`, `hours(column)`, `bucket(N, column)` or `truncate(W, column)`"
        )
    if match["fn"]:
        return PartitionField(cast(PartitionTransform, match["fn"]), match["col"].strip())
    if match["wfn"]:
        width = int(match["width"])
        if width < 1:
            raise ConfigError(f"`{key}`: the width of {text!r} must be at least 1")
        return PartitionField(cast(PartitionTransform, match["wfn"]), match["wcol"].strip(), width)
    return PartitionField("identity", match["plain"].strip())


def _partition_by(value: Any) -> Any:
    """`partition_by`: partition fields, each written as `parse_partition_field` reads it."""
    if isinstance(value, tuple):
        return value
    parsed = []
    for item in _one_or_many(value):
        if not isinstance(item, str):
            raise _refuse(f"`{{key}}` must be a list of partition fields such as 'days(created_at)', got {item!r}")
        try:
            parsed.append(parse_partition_field(item, "{key}"))
        except ConfigError as e:
            raise _refuse(str(e)) from None
    columns = [f.column for f in parsed]
    for field_ in parsed:
        if columns.count(field_.column) > 1 and field_.transform == "identity":
            raise _refuse(f"`{{key}}`: column {field_.column!r} is partitioned by identity and by a transform")
    if len(set(map(str, parsed))) < len(parsed):
        raise _refuse("`{key}` names a partition field twice")
    return tuple(parsed)


def _namespaced(value: str) -> bool:
    return "." in value


@dataclass(frozen=True, config=_SECTION)
class TableOptions(_Settings):
    """Per-table overrides, keyed by `database.table` in the file."""

    chunk_key: Annotated[tuple[Text, ...] | None, BeforeValidator(_none_or_one_or_many)] = None
    chunk_size: AtLeastOne | None = None
    target: Annotated[Text, _check(_namespaced, "`{key}` must be `namespace.table`, got {value}")] | None = None
    changelog: Flag | None = None
    """Keep a changelog table of this table's changes; None follows `sink.changelog`."""
    on_unrepresentable: UnrepresentablePolicy = "null"
    """A binlog row with a value Iceberg cannot hold exactly (a zero or invalid date): NULL it, stop, or
    write the row to `<target>__rejected` instead of the target (docs/config.md, `table_options`)."""
    partition_by: Annotated[tuple[PartitionField, ...], BeforeValidator(_partition_by)] = ()
    """The partition spec the job creates the target with; empty: unpartitioned (docs/config.md, "Big tables")."""


@dataclass(frozen=True, config=_SECTION)
class MaintenanceConfig(_Settings):
    """The job's upkeep of its targets and changelog tables (ingest/sink/maintenance.py)."""

    NULL_MEANS: ClassVar[tuple[str, ...]] = ("expire_after_hours",)

    every_commits: Annotated[
        int, Strict(), _check(lambda n: n >= 0, "`{key}` must be 0 (never) or more, got {plain}")
    ] = 50
    """Compact a table after this many commits on top of its last rewrite; 0: never (yours to do)."""
    expire_after_hours: (
        Annotated[float, Strict(), _check(lambda h: h >= 0, "`{key}` must be 0 or more (or null: never), got {plain}")]
        | None
    ) = 24.0
    """With each compaction, expire snapshots older than this (the newest 10 always stay); None: never."""


SECRET_CATALOG_KEYS = re.compile(r"(?i)(password|secret|token|credential)")


def _catalog(value: Any, info: ValidationInfo) -> Any:
    """`sink.catalog`: Iceberg catalog properties, passed on as they are; secrets resolved (never kept as text)."""
    if not isinstance(value, Mapping):
        return value
    base_dir = (info.context or {}).get("base_dir", Path("."))
    catalog: dict[str, str | Secret] = {}
    for k, v in value.items():
        key = f"{{key}}.{k}"
        if isinstance(v, Secret):
            catalog[str(k)] = v
        elif isinstance(v, Mapping) or SECRET_CATALOG_KEYS.search(str(k)) and not str(k).endswith("-provider"):
            catalog[str(k)] = _resolve(v, key, base_dir)
        elif isinstance(v, (str, int, float, bool)):
            catalog[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
        else:
            raise _refuse(f"`{key}` must be a string, number or boolean")
    if "type" not in catalog and "catalog-impl" not in catalog:
        raise _refuse("`{key}.type` is required (jdbc, rest, glue, hive, hadoop)")
    return catalog


def _template(value: Any) -> Any:
    """A target name template: only {database}, {table} and {pipeline} may be used."""
    if isinstance(value, str):
        try:
            value.format(database="d", table="t", pipeline="p")
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            raise _refuse(f"`{{key}}` may use only {{database}}, {{table}} and {{pipeline}}; {value!r}: {e}") from None
    return value


Template = Annotated[Text, AfterValidator(_template)]


@dataclass(frozen=True, config=_SECTION, kw_only=True)
class SinkConfig(_Settings):
    """The Iceberg catalog (properties passed through to Iceberg) and how targets are named."""

    catalog_name: Annotated[
        Text,
        _check(lambda n: re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n), "`{key}` must be a plain identifier, got {value}"),
    ] = "lake"
    catalog: Annotated[Mapping[str, str | Secret], BeforeValidator(_catalog)]
    namespace: Template = "{database}"
    table_name: Template = "{table}"
    state_table: Annotated[Text, _check(_namespaced, "`{key}` must be `namespace.table`, got {value}")] = (
        "ingest_meta.state"
    )
    format_version: Annotated[int, Strict(), _check(lambda v: v in (2, 3), "`{key}` must be 2 or 3, got {plain}")] = 2
    table_properties: StringMap = field(default_factory=dict)
    changelog: Flag = False
    """Default for `table_options.<table>.changelog`: keep a changelog table next to each target."""
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    reconnect_seconds: Seconds = 300.0
    """How long a binlog batch's commit waits for a catalog or object store that cannot be reached
    (ingest.sink.outage)."""
    one_commit: Flag = True
    """A binlog batch lands in one commit across its tables where the catalog can (ingest/sink/atomic.py); False:
    table by table, then the offset, as on catalogs that cannot."""


# The changelog table of a target is `<target name><CHANGELOG_SUFFIX>` in the target's namespace.
CHANGELOG_SUFFIX = "_changelog"


@dataclass(frozen=True, config=_SECTION)
class SourceLoadLimit(_Settings):
    """`snapshot.max_source_load`: the snapshot waits before reading its next chunks while the source is above
    a bound (ingest/source/snapshot/throttle.py)."""

    threads_running: AtLeastOne | None = None
    """Pause while the server's `Threads_running` is above this; None: not checked."""
    replica_lag_seconds: (
        Annotated[float, Strict(), _check(lambda s: s >= 0, "`{key}` must be 0 or more, got {plain}")] | None
    ) = None
    """Pause while the source, a replica, is more than this many seconds behind its primary; None: not checked."""
    check_seconds: Seconds = 2.0
    """First wait before sampling again while paused; each further wait doubles, up to `max_check_seconds`."""
    max_check_seconds: Seconds = 30.0
    """The longest wait between two samples of one pause (in the file: 30, or `check_seconds` if longer)."""

    @model_validator(mode="before")
    @classmethod
    def _longest_at_least_first(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("max_check_seconds") is None:
            check = data.get("check_seconds")
            if isinstance(check, (int, float)) and not isinstance(check, bool):
                return {**data, "max_check_seconds": max(30.0, float(check))}
        return data

    def __post_init__(self) -> None:
        if self.threads_running is None and self.replica_lag_seconds is None:
            raise _refuse(
                "`{in}threads_running` or `{in}replica_lag_seconds` is required (the bound the snapshot pauses above)"
            )
        if self.max_check_seconds < self.check_seconds:
            raise _refuse(
                f"`{{in}}max_check_seconds` must be at least `check_seconds` ({self.check_seconds}), got "
                f"{self.max_check_seconds}"
            )


@dataclass(frozen=True, config=_SECTION)
class SnapshotConfig(_Settings):
    """The lock-free chunked snapshot."""

    chunk_size: AtLeastOne = 8192
    parallelism: AtLeastOne = 2
    chunks_per_commit: AtLeastOne = 128
    driver: Literal["auto", "mysqlclient", "pymysql"] = "auto"
    max_source_load: SourceLoadLimit | None = None
    """Pause the snapshot while the source is busy; None: never."""


@dataclass(frozen=True, config=_SECTION)
class StreamConfig(_Settings):
    """The binlog phase after the snapshot."""

    batch_max_changes: AtLeastOne = 100_000
    batch_interval_seconds: Seconds = 5.0
    heartbeat_seconds: Seconds = 1.0
    on_schema_change: SchemaChangePolicy = "evolve"
    """DDL on a captured table: evolve the target where Iceberg allows it (else stop), stop, or ignore."""
    concurrent_merges: AtLeastOne = 4
    """Tables of one batch MERGEd at the same time (each is its own Iceberg commit)."""
    driver_apply_max_rows: Annotated[int, Strict(), Field(ge=0)] = 100_000
    """A target of at most this many rows takes a batch from the driver (pyiceberg), not by a Spark MERGE, where
    ingest/sink/driver_apply.py can; 0: never (every batch is MERGEd by Spark)."""
    position_deletes: Flag = True
    """A bigger target (or a part of more keys) takes a batch as position deletes and a data file the driver
    writes (ingest/sink/position_deletes.py), where ingest/sink/driver_apply.py can; False: a Spark MERGE."""
    checkpoint_location: Text | None = None
    """Spark's checkpoint directory for the job's streaming query (None: a fresh one per run)."""
    signal_poll_seconds: Seconds = 10.0
    """How often the query looks for snapshots asked with `ingest snapshot` (between batches), and its source
    for pauses."""
    on_purged: PurgedPolicy = "stop"
    """The binlog to resume from is purged: stop with the way out, or copy every table again and go on."""
    on_unfollowable: UnfollowablePolicy = "fail"
    """A DDL `evolve` cannot follow: stop the job (fail), or copy that table again while the others stream."""
    on_drop_table: DropTablePolicy = "keep"
    """A captured table dropped or renamed away (with `on_schema_change: evolve`): its capture ends, and its
    target is kept as it was at the statement, or dropped."""

    @model_validator(mode="before")
    @classmethod
    def _no_engine(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "engine" in data:
            raise _refuse(
                "`{in}engine` is gone: the job always runs as one Spark Structured Streaming query (the driver loop, "
                "`loop`, was removed, and `structured` is what runs); delete the setting"
            )
        return data

    def __post_init__(self) -> None:
        if self.on_unfollowable == "recopy" and self.on_schema_change != "evolve":
            raise _refuse(
                "`{in}on_unfollowable: recopy` copies a table again when a DDL cannot be followed, which only "
                "`{in}on_schema_change: evolve` follows"
            )


def _binlog_file(name: str) -> str:
    try:
        BinlogPosition(name, 4)
    except ValueError as e:
        raise _refuse(f"`{{key}}`: {e}") from None
    return name


def _gtid_position(text: str) -> MariadbGtidPos:
    try:
        gtid = MariadbGtidPos.parse(text)
    except ValueError as e:
        raise _refuse(f"`{{key}}`: {e}") from None
    if gtid.is_empty():
        raise _refuse(f"`{{key}}` must name a GTID position like '0-1-100', got {text!r}")
    return gtid


def _aware_time(value: Any) -> dt.datetime:
    """An ISO 8601 time with its time zone (YAML may have parsed it already); a time without one is refused."""
    form = "an ISO 8601 time with its time zone, e.g. 2026-11-25T14:00:00Z"
    if not isinstance(value, (str, dt.date)):
        raise _refuse(f"`{{key}}` must be str or datetime or date, got {value!r}")
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise _refuse(f"`{{key}}` must be {form}; got {value!r}") from None
    if not isinstance(value, dt.datetime):
        raise _refuse(f"`{{key}}` must be {form}, not a date alone; got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise _refuse(f"`{{key}}` must say its time zone (e.g. a trailing Z for UTC); got {value}")
    return value.astimezone(dt.UTC)


# The mode each `startup` key belongs to; a key of another mode is refused rather than ignored.
_STARTUP_MODE_OF: dict[str, StartupMode] = {
    "binlog_file": "binlog_position",
    "binlog_position": "binlog_position",
    "gtid": "gtid",
    "timestamp": "timestamp",
}


@dataclass(frozen=True, config=_SECTION)
class StartupConfig(_Settings):
    """Where the first run of `binlog_position`, `gtid` or `timestamp` starts reading the binlog (only the keys
    of the chosen mode are set, which `PipelineConfig` checks; later runs resume from what Iceberg holds)."""

    binlog_file: Annotated[Text, AfterValidator(_binlog_file)] | None = None
    """With `binlog_position`: the file of an event group's start, like `mysql-bin.000003`."""
    binlog_position: (
        Annotated[
            int, Strict(), _check(lambda p: p >= 4, "`{key}` must be 4 or more (a binlog's first event), got {plain}")
        ]
        | None
    ) = None
    """With `binlog_file`: the offset of that event group's start."""
    gtid: Annotated[MariadbGtidPos, BeforeValidator(_gtid_position)] | None = None
    """MariaDB GTID position of the last transaction already applied; reading starts after it."""
    timestamp: Annotated[dt.datetime, BeforeValidator(_aware_time)] | None = None
    """Time-zone aware: reading starts at the first transaction committed at or after it."""

    @property
    def position(self) -> BinlogPosition | None:
        """`binlog_file` and `binlog_position` as one position (None unless both are set)."""
        if self.binlog_file is None or self.binlog_position is None:
            return None
        return BinlogPosition(self.binlog_file, self.binlog_position)

    def check_mode(self, mode: StartupMode) -> None:
        """Exactly the keys `mode` needs are set."""
        for name, its_mode in _STARTUP_MODE_OF.items():
            given = getattr(self, name) is not None
            if given and its_mode != mode:
                raise _refuse(f"`startup.{name}` is only used with `startup_mode: {its_mode}` (it is {mode})")
            if not given and its_mode == mode:
                raise _refuse(f"`startup.{name}` is required with `startup_mode: {mode}`")


@dataclass(frozen=True, config=_SECTION)
class MetricsConfig(_Settings):
    """The job's Prometheus endpoint (ingest/metrics.py)."""

    port: TcpPort | None = None
    """TCP port serving http://host:port/metrics while the job runs; None: no endpoint."""
    host: Text = "127.0.0.1"
    """Address to listen on (`0.0.0.0` for every interface)."""


@dataclass(frozen=True, config=_SECTION)
class SparkConfig(_Settings):
    """Used when the job starts its own Spark session (not under spark-submit, which decides itself)."""

    master: Text = "local[2]"
    conf: StringMap = field(default_factory=dict)
    log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = "ERROR"
    """Spark's own JVM log on stderr when the job starts Spark itself (under spark-submit the cluster decides)."""


def _table_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        for name in value:
            if not re.fullmatch(r"[^.]+\.[^.]+", str(name)):
                raise _refuse(f"`table_options` keys are `database.table`, got {name!r}")
    return value


@dataclass(frozen=True, config=_SECTION, kw_only=True)
class PipelineConfig(_Settings):
    """One pipeline: a source, the tables to capture, and an Iceberg sink (the file's sections, in its order)."""

    name: Annotated[
        Text,
        _check(
            lambda n: re.fullmatch(r"[A-Za-z0-9_-]{1,64}", n),
            "`{key}` must be 1-64 letters, digits, '_' or '-'; got {value}",
        ),
    ] = "pipeline"
    source: SourceConfig
    tables: TableSelection
    sink: SinkConfig
    snapshot: SnapshotConfig = SnapshotConfig()
    spark: SparkConfig = SparkConfig()
    stream: StreamConfig = StreamConfig()
    startup_mode: StartupMode = "initial"
    startup: StartupConfig = StartupConfig()
    table_options: Annotated[Mapping[str, TableOptions], BeforeValidator(_table_keys)] = field(default_factory=dict)
    metrics: MetricsConfig = MetricsConfig()

    def __post_init__(self) -> None:
        self.startup.check_mode(self.startup_mode)
        tls_mode = self.source.tls.mode
        if self.snapshot.driver == "mysqlclient" and tls_mode in ("required", "verify_ca"):
            # ingest.source.snapshot.chunk_select.MYSQLCLIENT_TLS_MODES; `auto` reads with PyMySQL under these modes.
            raise _refuse(
                f"`snapshot.driver: mysqlclient` cannot keep to `source.tls.mode: {tls_mode}` (linked to MariaDB "
                "Connector/C it would read in plaintext from a server without TLS, or check the host name too); "
                "use `auto` or `pymysql`, or `tls.mode: verify_identity`"
            )

    @property
    def targets(self) -> Targets:
        """What the pipeline's Iceberg tables are called and how each is kept: the sink's part and `table_options`,
        for the stages that create, name or write them."""
        return Targets(self.name, self.sink, self.table_options)

    def options_for(self, database: str, table: str) -> TableOptions:
        return options_for(self.table_options, database, table)

    def snapshot_only(self, asked: bool) -> bool:
        """Whether a run copies the tables and stops, without a query: `asked` (`--snapshot-only`) or the startup
        mode says so."""
        return asked or self.startup_mode == "snapshot_only"

    def target_for(self, database: str, table: str) -> tuple[str, str]:
        """(namespace, table name) of the Iceberg target of one source table."""
        return self.targets.target_for(database, table)

    def changelog_for(self, database: str, table: str) -> tuple[str, str] | None:
        """(namespace, table name) of the changelog table of one source table, or None when it has none."""
        return self.targets.changelog_for(database, table)


@dataclasses.dataclass(frozen=True)
class Targets:
    """The Iceberg tables of one pipeline: named by the sink's templates or a table's `target`, kept as the sink
    and the table's options say."""

    pipeline: str
    sink: SinkConfig
    table_options: Mapping[str, TableOptions]

    def options_for(self, database: str, table: str) -> TableOptions:
        return options_for(self.table_options, database, table)

    def target_for(self, database: str, table: str) -> tuple[str, str]:
        """(namespace, table name) of the Iceberg target of one source table."""
        override = self.options_for(database, table).target
        if override:
            namespace, _, name = override.rpartition(".")
            return namespace, name
        values = {"database": database, "table": table, "pipeline": self.pipeline}
        return self.sink.namespace.format(**values), self.sink.table_name.format(**values)

    def changelog_for(self, database: str, table: str) -> tuple[str, str] | None:
        """(namespace, table name) of the changelog table of one source table, or None when it has none."""
        enabled = self.options_for(database, table).changelog
        if not (self.sink.changelog if enabled is None else enabled):
            return None
        namespace, name = self.target_for(database, table)
        return namespace, name + CHANGELOG_SUFFIX


def options_for(table_options: Mapping[str, TableOptions], database: str, table: str) -> TableOptions:
    """One table's `table_options` entry, or the defaults."""
    return table_options.get(f"{database}.{table}", TableOptions())


# ---------------------------------------------------------------------------------------------------
# Loading. Every error names the key path, e.g. `source.port`.

_PIPELINE = TypeAdapter(PipelineConfig)

_REQUIRED_HINTS = {"source.password": " (`{env: VARIABLE}` or `{file: PATH}`)"}
_TYPE_NAMES = {
    "int_type": "int",
    "int_parsing": "int",
    "int_from_float": "int",
    "string_type": "str",
    "bool_type": "bool",
    "float_type": "int or float",
    "float_parsing": "int or float",
    "list_type": "list",
    "tuple_type": "list",
}
_NOT_A_MAPPING = ("dataclass_type", "dataclass_args_type", "dict_type", "mapping_type", "model_type")
_UNKNOWN_KEY = ("unexpected_keyword_argument", "extra_forbidden")


def parse_config(data: Any, base_dir: Path = Path(".")) -> PipelineConfig:
    """The pipeline file's contents, checked: every key known, every value of its type and range, or a
    `ConfigError` that names the key (a misspelled key first: it is named, not reported as a missing one)."""
    try:
        return _PIPELINE.validate_python({} if data is None else data, context={"base_dir": base_dir})
    except ValidationError as e:
        errors = sorted(e.errors(), key=lambda err: err["type"] not in _UNKNOWN_KEY)
        raise ConfigError(_message(errors[0])) from None


def _message(error: ErrorDetails) -> str:
    """One of pydantic's errors as the pipeline file's user reads it."""
    loc = [str(p) for p in error["loc"] if not isinstance(p, int)]
    key = ".".join(loc)
    kind, value, ctx = error["type"], error["input"], error.get("ctx") or {}
    if kind == "settings":
        text = str(ctx["message"])
        return text.replace("{key}", key).replace("{in}", f"{key}." if key else "")
    if kind in _UNKNOWN_KEY:
        return _unknown_key(loc)
    if kind in ("missing", "missing_keyword_argument", "missing_argument"):
        return f"`{key}` is required{_REQUIRED_HINTS.get(key, '')}"
    if kind in _NOT_A_MAPPING:
        return f"{f'`{key}`' if key else 'the pipeline file'} must be a mapping, got {type(value).__name__}"
    if kind in _TYPE_NAMES:
        return f"`{key}` must be {_TYPE_NAMES[kind]}, got {value!r}"
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'|(\d+)", str(ctx["expected"]))
        return f"`{key}` must be one of {', '.join(a or b for a, b in allowed)}; got {value!r}"
    if kind == "greater_than_equal":
        return f"`{key}` must be at least {ctx['ge']}, got {value}"
    if kind == "greater_than" and ctx.get("gt") == 0:
        return f"`{key}` must be positive, got {float(value)}"
    return f"`{key}`: {error['msg']}"


def _unknown_key(loc: list[str]) -> str:
    where = f" in `{'.'.join(loc[:-1])}`" if len(loc) > 1 else ""
    return f"unknown key `{'.'.join(loc)}`{where}; see docs/config.md for the valid keys"


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a pipeline file; a ConfigError names the bad key."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read pipeline file {p}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"pipeline file {p} is not valid YAML: {e}") from None
    return parse_config(data, p.parent.resolve())
