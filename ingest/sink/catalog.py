"""One Iceberg catalog, seen from Spark (Java) and from pyiceberg (Python), built from the same properties.

The user writes Iceberg catalog properties once (`sink.catalog`); Spark gets them as
`spark.sql.catalog.<name>.*`. pyiceberg takes the same names except for the JDBC catalog, which it
calls `sql` and addresses with a SQLAlchemy URL.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from ingest.config import Secret, SinkConfig
from ingest.errors import ConfigError, SinkError
from ingest.sink.manifests import keep_manifest_entries
from ingest.sink.table_metadata import keep_table_metadata

# pyiceberg's SQL catalog must reach the same database; a MySQL-backed one would need the password in its
# URL, so only the two whose password can stay out of every URL are supported.
_JDBC_TO_SQLALCHEMY = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg2"}
SCHEMA_VERSION = "jdbc.schema-version"
"""The JDBC catalog's own tables: V1 (the default here; a V0 catalog is migrated, one column added) has views."""


def spark_catalog_conf(sink: SinkConfig) -> tuple[dict[str, str], dict[str, str]]:
    """Spark settings that register the sink catalog: (plain settings, secret settings).

    Secret settings must be set on the running session (`spark.conf.set`), never passed to the JVM's
    launch command line, where `ps` would show them. Iceberg reads them when the catalog is first used.
    """
    prefix = f"spark.sql.catalog.{sink.catalog_name}"
    # No table cache: the job must see commits made outside its session (compaction, `ingest resnapshot`
    # dropping a target) at once; it loads each table once per MERGE, which costs little next to the MERGE.
    plain = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.cache-enabled": "false"}
    secret: dict[str, str] = {}
    if sink.catalog.get("type") == "jdbc":
        # Iceberg's JDBC catalog creates (and keeps) its tables without view support unless asked: Spark's
        # tableExists then fails for every table not there yet, since it also asks for a view of that name.
        plain[f"{prefix}.{SCHEMA_VERSION}"] = "V1"
    for key, value in sink.catalog.items():
        if isinstance(value, Secret):
            secret[f"{prefix}.{key}"] = value.reveal()
        else:
            plain[f"{prefix}.{key}"] = value
    return plain, secret


def _jdbc_to_sqlalchemy(uri: str, props: Mapping[str, str | Secret]) -> str:
    if not uri.startswith("jdbc:"):
        raise ConfigError(f"`sink.catalog.uri` of a jdbc catalog must start with jdbc:, got {uri.split('?')[0]!r}")
    rest = uri[len("jdbc:") :]
    scheme, _, location = rest.partition(":")
    if scheme not in _JDBC_TO_SQLALCHEMY:
        raise ConfigError(f"`sink.catalog.uri`: JDBC catalogs on {scheme} are not supported (sqlite, postgresql)")
    if scheme == "sqlite":
        path = location.removeprefix("file:")
        return f"sqlite:///{path}"
    location = location.removeprefix("//")
    user = props.get("jdbc.user")
    if isinstance(user, str):
        location = f"{user}@{location}"
    return f"{_JDBC_TO_SQLALCHEMY[scheme]}://{location}"


def pyiceberg_properties(sink: SinkConfig) -> dict[str, str]:
    """pyiceberg catalog properties equivalent to the Spark catalog's, without a JDBC catalog's password
    (`catalog_password`): it is handed to the database driver alone, never put in a URL."""
    props: dict[str, str] = {}
    for key, value in sink.catalog.items():
        if key == "jdbc.password":
            continue
        props[key] = value.reveal() if isinstance(value, Secret) else value
    if props.get("type") == "jdbc":
        props["type"] = "sql"
        props["uri"] = _jdbc_to_sqlalchemy(props.get("uri", ""), sink.catalog)
        props.pop("jdbc.user", None)
        props["schema_version"] = props.pop(SCHEMA_VERSION, "V1").lower()
        # A pooled connection the database dropped (a restart, a failover) is replaced before use, not failed on.
        props.setdefault("pool_pre_ping", "true")
    return props


def catalog_password(sink: SinkConfig) -> str | None:
    """The password pyiceberg's SQL catalog must give PostgreSQL, if there is one."""
    password = sink.catalog.get("jdbc.password")
    if not isinstance(password, Secret) or not str(sink.catalog.get("uri", "")).startswith("jdbc:postgresql:"):
        return None
    return password.reveal()


def _sql_catalog_with_password(name: str, password: str, props: dict[str, str]) -> Any:
    """pyiceberg's SQL catalog whose database connections get the password as a driver argument. Neither
    a URL (which errors and logs print) nor the environment (which every child process, the JVM and its
    Python workers, would inherit) ever holds it."""
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy import create_engine

    class PasswordSqlCatalog(SqlCatalog):
        def _init_catalog(self) -> None:
            # SqlCatalog.__init__ builds an engine (which connects lazily) and then calls this, which is
            # where it first connects: swap in an engine that passes the password, then go on as pyiceberg does.
            self.engine = create_engine(
                self.engine.url, connect_args={"password": password}, pool_pre_ping=self.engine.pool._pre_ping
            )
            super()._init_catalog()

    return PasswordSqlCatalog(name, **props)


def load_pyiceberg_catalog(sink: SinkConfig) -> Any:
    """The sink catalog through pyiceberg. A catalog that cannot be opened (its database or service down or
    unreachable, a wrong address) is a SinkError naming it, without the secrets of its configuration."""
    from pyiceberg.catalog import load_catalog

    keep_manifest_entries()
    keep_table_metadata()
    props = pyiceberg_properties(sink)
    password = catalog_password(sink)
    try:
        # pyiceberg connects here: a SQL catalog makes sure its tables exist, a REST catalog fetches its config.
        # Two processes opening a new SQL catalog at once (the job and `ingest status`) can both find its tables
        # missing; the second to create them fails, and finds them the next time.
        for attempt in (1, 2):
            try:
                if password is not None:
                    catalog = _sql_catalog_with_password(sink.catalog_name, password, props)
                else:
                    catalog = load_catalog(sink.catalog_name, **props)
                break
            except Exception as e:  # noqa: BLE001
                if attempt == 2 or "already exists" not in str(e):
                    raise
    except Exception as e:  # noqa: BLE001 - drivers (SQLAlchemy, requests, sqlite) raise their own types
        raise SinkError(
            f"cannot open the Iceberg catalog `{sink.catalog_name}` at {catalog_address(props)}: "
            f"{_without_secrets(_first_line(e), sink)}. Check that it is running and reachable, and "
            "`sink.catalog` in the pipeline file"
        ) from None
    if props.get("type") == "rest":
        _quiet_second_delete()
    return catalog


class _ServerDeletedOldMetadata(logging.Filter):
    """A REST catalog's server deletes a table's old metadata files itself when it commits (what the table's
    `write.metadata.delete-after-commit.enabled` asks); pyiceberg, deleting them after, finds them gone and would
    warn at every commit of the state table."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to delete metadata file")


def _quiet_second_delete() -> None:
    logger = logging.getLogger("pyiceberg.catalog")
    if not any(isinstance(f, _ServerDeletedOldMetadata) for f in logger.filters):
        logger.addFilter(_ServerDeletedOldMetadata())


def catalog_address(props: Mapping[str, str]) -> str:
    """Where the catalog is, for an error message: its URI without credentials or query."""
    uri = props.get("uri", "")
    scheme, sep, rest = uri.partition("://")
    if sep:
        rest = rest.rpartition("@")[2]  # user[:password]@ dropped
        uri = f"{scheme}://{rest}"
    return repr(uri.split("?")[0]) if uri else f"(type {props.get('type', '?')}, no uri)"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


def _without_secrets(text: str, sink: SinkConfig) -> str:
    for value in sink.catalog.values():
        if isinstance(value, Secret) and value.reveal():
            text = text.replace(value.reveal(), "***")
    return text


_cached: OrderedDict[str, Any] = OrderedDict()
CACHED_CATALOGS = 4
"""How many sinks' catalogs one process keeps open: a job has one; a process that runs many pipelines in turn
(tests, a notebook) would otherwise keep a database connection per sink it ever saw."""


def cached_pyiceberg_catalog(sink: SinkConfig) -> Any:
    """One pyiceberg catalog per sink for the whole run (loading one opens a database connection). The least
    recently used beyond CACHED_CATALOGS is let go: its pooled connections closed (it reconnects if still used)."""
    key = repr((sink.catalog_name, sorted((k, repr(v)) for k, v in sink.catalog.items())))
    if key in _cached:
        _cached.move_to_end(key)
        return _cached[key]
    _cached[key] = load_pyiceberg_catalog(sink)
    while len(_cached) > CACHED_CATALOGS:
        _, old = _cached.popitem(last=False)
        engine = getattr(old, "engine", None)  # a SQL catalog's SQLAlchemy engine and its connection pool
        if engine is not None:
            engine.dispose()
    return _cached[key]
