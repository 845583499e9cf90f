"""The pipeline file: one YAML document, validated on load, every key documented in docs/config.md.

Secrets are never literal strings in the file: they are `{env: NAME}` or `{file: PATH}` references,
resolved into `Secret` values whose repr is redacted, so they cannot leak through logs or errors.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from ingest.errors import ConfigError
from ingest.model.position import BinlogPosition, MariadbGtidPos

Flavor = Literal["auto", "mysql", "mariadb"]
TlsMode = Literal["disabled", "required", "verify_ca", "verify_identity"]
StartupMode = Literal["initial", "snapshot_only", "latest", "binlog_position", "gtid", "timestamp"]
STARTUP_MODES: tuple[StartupMode, ...] = ("initial", "snapshot_only", "latest", "binlog_position", "gtid", "timestamp")
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


@dataclass(frozen=True)
class TlsConfig:
    """TLS to MySQL; `disabled` is an explicit choice, never a silent fallback."""

    mode: TlsMode = "disabled"
    ca_file: str | None = None


@dataclass(frozen=True)
class SourceConfig:
    """Where the MySQL/MariaDB server is and who the job connects as (the least-privilege CDC user)."""

    host: str
    user: str
    password: Secret
    port: int = 3306
    flavor: Flavor = "auto"
    server_id: int = 5400
    tls: TlsConfig = TlsConfig()
    connect_timeout: int = 10


@dataclass(frozen=True)
class TableSelection:
    """Regexes matched against `database.table` (whole name); exclude wins over include."""

    include: tuple[re.Pattern[str], ...]
    exclude: tuple[re.Pattern[str], ...] = ()

    def matches(self, database: str, table: str) -> bool:
        name = f"{database}.{table}"
        return any(p.fullmatch(name) for p in self.include) and not any(p.fullmatch(name) for p in self.exclude)


PartitionTransform = Literal["identity", "years", "months", "days", "hours", "bucket", "truncate"]


@dataclass(frozen=True)
class PartitionField:
    """One field of a target's partition spec: an Iceberg transform of a source column."""

    transform: PartitionTransform
    column: str
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


@dataclass(frozen=True)
class TableOptions:
    """Per-table overrides, keyed by `database.table` in the file."""

    chunk_key: tuple[str, ...] | None = None
    chunk_size: int | None = None
    target: str | None = None
    changelog: bool | None = None
    """Keep a changelog table of this table's changes; None follows `sink.changelog`."""
    on_unrepresentable: UnrepresentablePolicy = "null"
    """A binlog row with a value Iceberg cannot hold exactly (a zero or invalid date): NULL it, stop, or
    write the row to `<target>__rejected` instead of the target (docs/config.md, `table_options`)."""
    partition_by: tuple[PartitionField, ...] = ()
    """The partition spec the job creates the target with; empty: unpartitioned (docs/config.md, "Big tables")."""


@dataclass(frozen=True)
class MaintenanceConfig:
    """The job's upkeep of its targets and changelog tables (ingest/sink/maintenance.py)."""

    every_commits: int = 50
    """Compact a table after this many commits on top of its last rewrite; 0: never (yours to do)."""
    expire_after_hours: float | None = 24.0
    """With each compaction, expire snapshots older than this (the newest 10 always stay); None: never."""


@dataclass(frozen=True)
class SinkConfig:
    """The Iceberg catalog (properties passed through to Iceberg) and how targets are named."""

    catalog_name: str
    catalog: Mapping[str, str | Secret]
    namespace: str = "{database}"
    table_name: str = "{table}"
    state_table: str = "ingest_meta.state"
    format_version: int = 2
    table_properties: Mapping[str, str] = field(default_factory=dict)
    changelog: bool = False
    """Default for `table_options.<table>.changelog`: keep a changelog table next to each target."""
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)


# The changelog table of a target is `<target name><CHANGELOG_SUFFIX>` in the target's namespace.
CHANGELOG_SUFFIX = "_changelog"


@dataclass(frozen=True)
class SourceLoadLimit:
    """`snapshot.max_source_load`: the snapshot waits before reading its next chunks while the source is above
    a bound (ingest/source/throttle.py)."""

    threads_running: int | None = None
    """Pause while the server's `Threads_running` is above this; None: not checked."""
    replica_lag_seconds: float | None = None
    """Pause while the source, a replica, is more than this many seconds behind its primary; None: not checked."""
    check_seconds: float = 2.0
    """First wait before sampling again while paused; each further wait doubles, up to `max_check_seconds`."""
    max_check_seconds: float = 30.0
    """The longest wait between two samples of one pause."""


@dataclass(frozen=True)
class SnapshotConfig:
    """The lock-free chunked snapshot."""

    chunk_size: int = 8192
    parallelism: int = 2
    chunks_per_commit: int = 128
    driver: Literal["auto", "mysqlclient", "pymysql"] = "auto"
    max_source_load: SourceLoadLimit | None = None
    """Pause the snapshot while the source is busy; None: never."""


@dataclass(frozen=True)
class StreamConfig:
    """The binlog phase after the snapshot."""

    batch_max_changes: int = 100_000
    batch_interval_seconds: float = 5.0
    heartbeat_seconds: float = 1.0
    on_schema_change: SchemaChangePolicy = "evolve"
    """DDL on a captured table: evolve the target where Iceberg allows it (else stop), stop, or ignore."""
    concurrent_merges: int = 4
    """Tables of one batch MERGEd at the same time (each is its own Iceberg commit)."""
    checkpoint_location: str | None = None
    """Spark's checkpoint directory for the job's streaming query (None: a fresh one per run)."""
    signal_poll_seconds: float = 10.0
    """How often the query looks for snapshots asked with `ingest snapshot` (between batches), and its source
    for pauses."""
    on_purged: PurgedPolicy = "stop"
    """The binlog to resume from is purged: stop with the way out, or copy every table again and go on."""
    on_unfollowable: UnfollowablePolicy = "fail"
    """A DDL `evolve` cannot follow: stop the job (fail), or copy that table again while the others stream."""
    on_drop_table: DropTablePolicy = "keep"
    """A captured table dropped or renamed away (with `on_schema_change: evolve`): its capture ends, and its
    target is kept as it was at the statement, or dropped."""


@dataclass(frozen=True)
class StartupConfig:
    """Where the first run of `binlog_position`, `gtid` or `timestamp` starts reading the binlog (only the key
    of the chosen mode is set; later runs resume from what Iceberg holds)."""

    position: BinlogPosition | None = None
    """`startup.binlog_file` and `startup.binlog_position`: the start of an event group in that file."""
    gtid: MariadbGtidPos | None = None
    """`startup.gtid`: MariaDB GTID position of the last transaction already applied; reading starts after it."""
    timestamp: dt.datetime | None = None
    """`startup.timestamp` (time-zone aware): reading starts at the first transaction committed at or after it."""


@dataclass(frozen=True)
class MetricsConfig:
    """The job's Prometheus endpoint (ingest/metrics.py)."""

    port: int | None = None
    """TCP port serving http://host:port/metrics while the job runs; None: no endpoint."""
    host: str = "127.0.0.1"
    """Address to listen on (`0.0.0.0` for every interface)."""


@dataclass(frozen=True)
class SparkConfig:
    """Used when the job starts its own Spark session (not under spark-submit, which decides itself)."""

    master: str = "local[2]"
    conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineConfig:
    """One pipeline: a source, the tables to capture, and an Iceberg sink."""

    name: str
    source: SourceConfig
    tables: TableSelection
    sink: SinkConfig
    snapshot: SnapshotConfig = SnapshotConfig()
    spark: SparkConfig = SparkConfig()
    startup_mode: StartupMode = "initial"
    table_options: Mapping[str, TableOptions] = field(default_factory=dict)
    stream: StreamConfig = StreamConfig()
    startup: StartupConfig = StartupConfig()
    metrics: MetricsConfig = MetricsConfig()

    def options_for(self, database: str, table: str) -> TableOptions:
        return self.table_options.get(f"{database}.{table}", TableOptions())

    def target_for(self, database: str, table: str) -> tuple[str, str]:
        """(namespace, table name) of the Iceberg target of one source table."""
        override = self.options_for(database, table).target
        if override:
            namespace, _, name = override.rpartition(".")
            return namespace, name
        values = {"database": database, "table": table, "pipeline": self.name}
        return self.sink.namespace.format(**values), self.sink.table_name.format(**values)

    def changelog_for(self, database: str, table: str) -> tuple[str, str] | None:
        """(namespace, table name) of the changelog table of one source table, or None when it has none."""
        enabled = self.options_for(database, table).changelog
        if not (self.sink.changelog if enabled is None else enabled):
            return None
        namespace, name = self.target_for(database, table)
        return namespace, name + CHANGELOG_SUFFIX


# ---------------------------------------------------------------------------------------------------
# Loading and validation. Every error names the key path, e.g. `source.port`.


class _Section:
    """Reads one mapping of the file, remembering its path and refusing keys nobody read."""

    def __init__(self, data: Any, path: str, allowed: tuple[str, ...] | None = None) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"`{path}` must be a mapping, got {type(data).__name__}")
        self.data = data
        self.path = path
        self.seen: set[str] = set()
        if allowed is not None:
            # Unknown keys first: a misspelled section must be named, not reported as a missing one.
            self.seen.update(k for k in data if k in allowed)
            self.done()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = None, required: bool = False) -> Any:
        self.seen.add(name)
        if name not in self.data or self.data[name] is None:
            if required:
                raise ConfigError(f"`{self.key(name)}` is required")
            return default
        value = self.data[name]
        if kind is int and isinstance(value, bool) or not isinstance(value, kind):
            expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise ConfigError(f"`{self.key(name)}` must be {expected}, got {value!r}")
        return value

    def positive_int(self, name: str, default: int) -> int:
        value = int(self.get(name, int, default))
        if value < 1:
            raise ConfigError(f"`{self.key(name)}` must be at least 1, got {value}")
        return value

    def choice(self, name: str, allowed: tuple[str, ...], default: str) -> str:
        value = str(self.get(name, str, default))
        if value not in allowed:
            raise ConfigError(f"`{self.key(name)}` must be one of {', '.join(allowed)}; got {value!r}")
        return value

    def section(self, name: str, allowed: tuple[str, ...] | None = None) -> _Section:
        self.seen.add(name)
        return _Section(self.data.get(name), self.key(name), allowed)

    def done(self) -> None:
        unknown = sorted(str(k) for k in self.data if k not in self.seen)
        if unknown:
            where = f" in `{self.path}`" if self.path else ""
            raise ConfigError(f"unknown key `{self.key(unknown[0])}`{where}; see docs/config.md for the valid keys")


def _maintenance(section: _Section) -> MaintenanceConfig:
    every = int(section.get("every_commits", int, 50))
    if every < 0:
        raise ConfigError(f"`{section.key('every_commits')}` must be 0 (never) or more, got {every}")
    expire: float | None = 24.0
    if "expire_after_hours" in section.data and section.data["expire_after_hours"] is None:
        expire = None  # written as null: never expire
    else:
        expire = float(section.get("expire_after_hours", (int, float), 24.0))
        if expire < 0:
            raise ConfigError(f"`{section.key('expire_after_hours')}` must be 0 or more (or null: never), got {expire}")
    return MaintenanceConfig(every, expire)


def resolve_secret(value: Any, key: str, base_dir: Path) -> Secret:
    """`{env: NAME}` or `{file: PATH}` (relative to the pipeline file) into a Secret."""
    if isinstance(value, str):
        raise ConfigError(
            f"`{key}` must not be written in the file; use `{{env: VARIABLE}}` or `{{file: /path/to/secret}}`"
        )
    if not isinstance(value, Mapping) or len(value) != 1 or next(iter(value)) not in ("env", "file"):
        raise ConfigError(f"`{key}` must be `{{env: VARIABLE}}` or `{{file: /path/to/secret}}`")
    kind, ref = next(iter(value.items()))
    if kind == "env":
        if str(ref) not in os.environ:
            raise ConfigError(f"`{key}` names environment variable {ref}, which is not set")
        return Secret(os.environ[str(ref)], f"env:{ref}")
    path = Path(str(ref))
    if not path.is_absolute():
        path = base_dir / path
    try:
        return Secret(path.read_text().rstrip("\r\n"), f"file:{path}")
    except OSError as e:
        raise ConfigError(f"`{key}` names file {path}, which cannot be read: {e.strerror}") from None


def _compile(patterns: Any, key: str) -> tuple[re.Pattern[str], ...]:
    if isinstance(patterns, str):
        patterns = [patterns]
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError(f"`{key}` must be a list of regular expressions")
    compiled = []
    for i, p in enumerate(patterns):
        try:
            compiled.append(re.compile(p))
        except re.error as e:
            raise ConfigError(f"`{key}[{i}]` is not a valid regular expression ({p!r}): {e}") from None
    return tuple(compiled)


SECRET_CATALOG_KEYS = re.compile(r"(?i)(password|secret|token|credential)")


def parse_config(data: Any, base_dir: Path = Path(".")) -> PipelineConfig:
    """The pipeline file's contents, checked: every key known, every value of its type and range, or a
    `ConfigError` that names the key. Sections are read in the file's documented order."""
    top = _Section(
        data,
        "",
        (
            *("name", "source", "tables", "sink", "snapshot", "spark", "stream", "startup_mode", "startup"),
            *("table_options", "metrics"),
        ),
    )
    name = str(top.get("name", str, "pipeline"))
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ConfigError(f"`name` must be 1-64 letters, digits, '_' or '-'; got {name!r}")
    source = _source(top, base_dir)
    tables = _tables(top)
    sink = _sink(top, base_dir)
    snapshot = _snapshot(top, source.tls.mode)
    spark = _spark(top)
    stream = _stream(top)
    startup_mode = cast(StartupMode, top.choice("startup_mode", STARTUP_MODES, "initial"))
    startup = _startup(top.section("startup", _STARTUP_KEYS), startup_mode)
    table_options = _table_options(top)
    metrics = _metrics(top.section("metrics", ("port", "host")))
    top.done()
    return PipelineConfig(
        name, source, tables, sink, snapshot, spark, startup_mode, table_options, stream, startup, metrics
    )


def _source(top: _Section, base_dir: Path) -> SourceConfig:
    """`source`: the MySQL server and the CDC user."""
    src = top.section("source", ("host", "port", "user", "password", "flavor", "server_id", "tls", "connect_timeout"))
    tls = src.section("tls", ("mode", "ca_file"))
    tls_mode = cast(TlsMode, tls.choice("mode", ("disabled", "required", "verify_ca", "verify_identity"), "disabled"))
    tls_config = TlsConfig(tls_mode, tls.get("ca_file", str))
    if tls_mode in ("verify_ca", "verify_identity") and not tls_config.ca_file:
        raise ConfigError(f"`source.tls.ca_file` is required when `source.tls.mode` is {tls_mode}")
    tls.done()
    src.seen.add("password")
    if "password" not in src.data:
        raise ConfigError("`source.password` is required (`{env: VARIABLE}` or `{file: PATH}`)")
    port = int(src.get("port", int, 3306))
    if not 0 < port < 65536:
        raise ConfigError(f"`source.port` must be a TCP port, got {port}")
    source = SourceConfig(
        host=src.get("host", str, required=True),
        user=src.get("user", str, required=True),
        password=resolve_secret(src.data["password"], "source.password", base_dir),
        port=port,
        flavor=cast(Flavor, src.choice("flavor", ("auto", "mysql", "mariadb"), "auto")),
        server_id=src.positive_int("server_id", 5400),
        tls=tls_config,
        connect_timeout=src.positive_int("connect_timeout", 10),
    )
    src.done()
    return source


def _tables(top: _Section) -> TableSelection:
    """`tables`: the patterns of the tables to capture."""
    tab = top.section("tables", ("include", "exclude"))
    tables = TableSelection(
        include=_compile(tab.get("include", (list, str), required=True), "tables.include"),
        exclude=_compile(tab.get("exclude", (list, str), []), "tables.exclude"),
    )
    tab.done()
    return tables


def _sink(top: _Section, base_dir: Path) -> SinkConfig:
    """`sink`: the Iceberg catalog and how targets are named and kept."""
    snk = top.section(
        "sink",
        (
            "catalog_name",
            "catalog",
            "namespace",
            "table_name",
            "state_table",
            "format_version",
            "table_properties",
            "changelog",
            "maintenance",
        ),
    )
    catalog = _catalog(snk.section("catalog"), base_dir)
    props = snk.section("table_properties")
    table_properties = {str(k): str(v) for k, v in props.data.items()}
    props.seen.update(props.data)
    format_version = int(snk.get("format_version", int, 2))
    if format_version not in (2, 3):
        raise ConfigError(f"`sink.format_version` must be 2 or 3, got {format_version}")
    catalog_name = str(snk.get("catalog_name", str, "lake"))
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", catalog_name):
        raise ConfigError(f"`sink.catalog_name` must be a plain identifier, got {catalog_name!r}")
    state_table = str(snk.get("state_table", str, "ingest_meta.state"))
    if "." not in state_table:
        raise ConfigError(f"`sink.state_table` must be `namespace.table`, got {state_table!r}")
    sink = SinkConfig(
        catalog_name=catalog_name,
        catalog=catalog,
        namespace=str(snk.get("namespace", str, "{database}")),
        table_name=str(snk.get("table_name", str, "{table}")),
        state_table=state_table,
        format_version=format_version,
        table_properties=table_properties,
        changelog=bool(snk.get("changelog", bool, False)),
        maintenance=_maintenance(snk.section("maintenance", ("every_commits", "expire_after_hours"))),
    )
    for template_key, template in (("namespace", sink.namespace), ("table_name", sink.table_name)):
        try:
            template.format(database="d", table="t", pipeline="p")
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            raise ConfigError(
                f"`sink.{template_key}` may use only {{database}}, {{table}} and {{pipeline}}; {template!r}: {e}"
            ) from None
    snk.done()
    return sink


def _catalog(cat: _Section, base_dir: Path) -> dict[str, str | Secret]:
    """`sink.catalog`: Iceberg catalog properties, passed on as they are; secrets resolved (never kept as text)."""
    catalog: dict[str, str | Secret] = {}
    for k, v in cat.data.items():
        cat.seen.add(k)
        key = f"sink.catalog.{k}"
        if isinstance(v, Mapping):
            catalog[str(k)] = resolve_secret(v, key, base_dir)
        elif SECRET_CATALOG_KEYS.search(str(k)) and not str(k).endswith("-provider"):
            catalog[str(k)] = resolve_secret(v, key, base_dir)
        elif isinstance(v, (str, int, float, bool)):
            catalog[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
        else:
            raise ConfigError(f"`{key}` must be a string, number or boolean")
    if "type" not in catalog and "catalog-impl" not in catalog:
        raise ConfigError("`sink.catalog.type` is required (jdbc, rest, glue, hive, hadoop)")
    return catalog


def _snapshot(top: _Section, tls_mode: TlsMode) -> SnapshotConfig:
    """`snapshot`: how chunks are cut and read (`tls_mode`: the source's, which a driver may not keep to)."""
    snp = top.section("snapshot", ("chunk_size", "parallelism", "chunks_per_commit", "driver", "max_source_load"))
    snapshot = SnapshotConfig(
        chunk_size=snp.positive_int("chunk_size", 8192),
        parallelism=snp.positive_int("parallelism", 2),
        chunks_per_commit=snp.positive_int("chunks_per_commit", 128),
        driver=cast(
            Literal["auto", "mysqlclient", "pymysql"],
            snp.choice("driver", ("auto", "mysqlclient", "pymysql"), "auto"),
        ),
        max_source_load=_source_load_limit(snp) if snp.data.get("max_source_load") is not None else None,
    )
    if snapshot.driver == "mysqlclient" and tls_mode in ("required", "verify_ca"):
        # ingest.source.chunk_select.MYSQLCLIENT_TLS_MODES; `auto` reads with PyMySQL under these modes.
        raise ConfigError(
            f"`snapshot.driver: mysqlclient` cannot keep to `source.tls.mode: {tls_mode}` (linked to MariaDB "
            "Connector/C it would read in plaintext from a server without TLS, or check the host name too); "
            "use `auto` or `pymysql`, or `tls.mode: verify_identity`"
        )
    snp.done()
    return snapshot


def _spark(top: _Section) -> SparkConfig:
    """`spark`: the master and settings of the session the job starts."""
    spk = top.section("spark", ("master", "conf"))
    conf = spk.section("conf")
    conf.seen.update(conf.data)
    spark = SparkConfig(
        master=str(spk.get("master", str, "local[2]")),
        conf={str(k): str(v) for k, v in conf.data.items()},
    )
    spk.done()
    return spark


def _stream(top: _Section) -> StreamConfig:
    """`stream`: the binlog phase."""
    stm = top.section(
        "stream",
        (
            "batch_max_changes",
            "batch_interval_seconds",
            "heartbeat_seconds",
            "on_schema_change",
            "concurrent_merges",
            "engine",
            "checkpoint_location",
            "signal_poll_seconds",
            "on_purged",
            "on_drop_table",
            "on_unfollowable",
        ),
    )
    stream = StreamConfig(
        batch_max_changes=stm.positive_int("batch_max_changes", 100_000),
        batch_interval_seconds=_positive_float(stm, "batch_interval_seconds", 5.0),
        heartbeat_seconds=_positive_float(stm, "heartbeat_seconds", 1.0),
        on_schema_change=cast(
            SchemaChangePolicy, stm.choice("on_schema_change", ("evolve", "fail", "ignore"), "evolve")
        ),
        concurrent_merges=stm.positive_int("concurrent_merges", 4),
        checkpoint_location=stm.get("checkpoint_location", str),
        signal_poll_seconds=_positive_float(stm, "signal_poll_seconds", 10.0),
        on_purged=cast(PurgedPolicy, stm.choice("on_purged", ("stop", "resnapshot"), "stop")),
        on_drop_table=cast(DropTablePolicy, stm.choice("on_drop_table", ("keep", "drop"), "keep")),
        on_unfollowable=cast(UnfollowablePolicy, stm.choice("on_unfollowable", ("fail", "recopy"), "fail")),
    )
    if stream.on_unfollowable == "recopy" and stream.on_schema_change != "evolve":
        raise ConfigError(
            f"`{stm.key('on_unfollowable')}: recopy` copies a table again when a DDL cannot be followed, which only "
            f"`{stm.key('on_schema_change')}: evolve` follows"
        )
    if "engine" in stm.data:
        raise ConfigError(
            f"`{stm.key('engine')}` is gone: the job always runs as one Spark Structured Streaming query (the driver "
            "loop, `loop`, was removed, and `structured` is what runs); delete the setting"
        )
    stm.done()
    return stream


def _table_options(top: _Section) -> dict[str, TableOptions]:
    """`table_options`: per `database.table`."""
    opts = top.section("table_options")
    table_options: dict[str, TableOptions] = {}
    for table_name, raw in opts.data.items():
        opts.seen.add(table_name)
        if not re.fullmatch(r"[^.]+\.[^.]+", str(table_name)):
            raise ConfigError(f"`table_options` keys are `database.table`, got {table_name!r}")
        o = _Section(
            raw,
            f"table_options.{table_name}",
            ("chunk_key", "chunk_size", "target", "changelog", "on_unrepresentable", "partition_by"),
        )
        chunk_key = o.get("chunk_key", (list, str))
        if isinstance(chunk_key, str):
            chunk_key = [chunk_key]
        target = o.get("target", str)
        if target is not None and "." not in target:
            raise ConfigError(f"`{o.key('target')}` must be `namespace.table`, got {target!r}")
        table_options[str(table_name)] = TableOptions(
            chunk_key=tuple(str(c) for c in chunk_key) if chunk_key else None,
            chunk_size=o.positive_int("chunk_size", 0) if "chunk_size" in o.data else None,
            target=target,
            changelog=o.get("changelog", bool),
            on_unrepresentable=cast(
                UnrepresentablePolicy, o.choice("on_unrepresentable", UNREPRESENTABLE_POLICIES, "null")
            ),
            partition_by=_partition_by(o),
        )
        o.done()
    return table_options


def _partition_by(options: _Section) -> tuple[PartitionField, ...]:
    fields = options.get("partition_by", (list, str), [])
    if isinstance(fields, str):
        fields = [fields]
    key = options.key("partition_by")
    parsed = []
    for item in fields:
        if not isinstance(item, str):
            raise ConfigError(f"`{key}` must be a list of partition fields such as 'days(created_at)', got {item!r}")
        parsed.append(parse_partition_field(item, key))
    columns = [f.column for f in parsed]
    for field_ in parsed:
        if columns.count(field_.column) > 1 and field_.transform == "identity":
            raise ConfigError(f"`{key}`: column {field_.column!r} is partitioned by identity and by a transform")
    if len(set(map(str, parsed))) < len(parsed):
        raise ConfigError(f"`{key}` names a partition field twice")
    return tuple(parsed)


def _source_load_limit(snapshot: _Section) -> SourceLoadLimit:
    section = snapshot.section(
        "max_source_load", ("threads_running", "replica_lag_seconds", "check_seconds", "max_check_seconds")
    )
    threads = section.positive_int("threads_running", 0) if section.data.get("threads_running") is not None else None
    lag = section.get("replica_lag_seconds", (int, float))
    if lag is not None and lag < 0:
        raise ConfigError(f"`{section.key('replica_lag_seconds')}` must be 0 or more, got {lag}")
    if threads is None and lag is None:
        raise ConfigError(
            f"`{section.key('threads_running')}` or `{section.key('replica_lag_seconds')}` is required (the bound "
            "the snapshot pauses above)"
        )
    check = _positive_float(section, "check_seconds", 2.0)
    longest = _positive_float(section, "max_check_seconds", max(30.0, check))
    if longest < check:
        raise ConfigError(
            f"`{section.key('max_check_seconds')}` must be at least `check_seconds` ({check}), got {longest}"
        )
    section.done()
    return SourceLoadLimit(threads, None if lag is None else float(lag), check, longest)


def _metrics(section: _Section) -> MetricsConfig:
    port = section.get("port", int)
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"`{section.key('port')}` must be a TCP port, 1-65535; got {port}")
    return MetricsConfig(port, str(section.get("host", str, "127.0.0.1")))


_STARTUP_KEYS = ("binlog_file", "binlog_position", "gtid", "timestamp")
# The `startup` keys each mode needs; a key of another mode is refused rather than ignored.
_STARTUP_KEYS_OF: dict[str, tuple[str, ...]] = {
    "binlog_position": ("binlog_file", "binlog_position"),
    "gtid": ("gtid",),
    "timestamp": ("timestamp",),
}


def _startup(section: _Section, mode: StartupMode) -> StartupConfig:
    """The `startup` section: exactly the keys `startup_mode` needs, each checked for its form."""
    needed = _STARTUP_KEYS_OF.get(mode, ())
    for name in _STARTUP_KEYS:
        given = section.data.get(name) is not None
        if given and name not in needed:
            modes = [m for m, keys in _STARTUP_KEYS_OF.items() if name in keys]
            raise ConfigError(f"`{section.key(name)}` is only used with `startup_mode: {modes[0]}` (it is {mode})")
        if not given and name in needed:
            raise ConfigError(f"`{section.key(name)}` is required with `startup_mode: {mode}`")
    if mode == "binlog_position":
        file = str(section.get("binlog_file", str))
        pos = int(section.get("binlog_position", int))
        if pos < 4:
            key = section.key("binlog_position")
            raise ConfigError(f"`{key}` must be 4 or more (a binlog's first event), got {pos}")
        try:
            return StartupConfig(position=BinlogPosition(file, pos))
        except ValueError as e:
            raise ConfigError(f"`{section.key('binlog_file')}`: {e}") from None
    if mode == "gtid":
        text = section.get("gtid", str)
        try:
            gtid = MariadbGtidPos.parse(text)
        except ValueError as e:
            raise ConfigError(f"`{section.key('gtid')}`: {e}") from None
        if gtid.is_empty():
            raise ConfigError(f"`{section.key('gtid')}` must name a GTID position like '0-1-100', got {text!r}")
        return StartupConfig(gtid=gtid)
    if mode == "timestamp":
        return StartupConfig(timestamp=_aware_time(section, "timestamp"))
    return StartupConfig()


def _aware_time(section: _Section, name: str) -> dt.datetime:
    """An ISO 8601 time with its time zone (YAML may have parsed it already); a time without one is refused."""
    value = section.get(name, (str, dt.datetime, dt.date))
    form = "an ISO 8601 time with its time zone, e.g. 2026-11-25T14:00:00Z"
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ConfigError(f"`{section.key(name)}` must be {form}; got {value!r}") from None
    if not isinstance(value, dt.datetime):
        raise ConfigError(f"`{section.key(name)}` must be {form}, not a date alone; got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ConfigError(f"`{section.key(name)}` must say its time zone (e.g. a trailing Z for UTC); got {value}")
    return value.astimezone(dt.UTC)


def _positive_float(section: _Section, name: str, default: float) -> float:
    value = float(section.get(name, (int, float), default))
    if value <= 0:
        raise ConfigError(f"`{section.key(name)}` must be positive, got {value}")
    return value


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
