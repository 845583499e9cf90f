"""Connections to the source and what we ask of its catalog: flavor, settings, grants, table schemas.

Identifiers are always quoted with `quote`; values are always bound parameters.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Sequence
from typing import Any

import pymysql
import pymysql.cursors

from ingest.config import SourceConfig, TableOptions, TableSelection
from ingest.errors import MissingPrivilegeError, SourceConnectError, SourceError, UnsupportedTableError
from ingest.model.columns import SourceColumn
from ingest.model.osc_tables import osc_helper
from ingest.model.schema import OCCURRENCE_COLUMN, TableSchema, quote
from ingest.source.reconnect import LOST_CONNECTION_CODES

log = logging.getLogger(__name__)

SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


def tls_context(source: SourceConfig) -> ssl.SSLContext | None:
    """The TLS settings of `source.tls` for PyMySQL (None: plaintext)."""
    if source.tls.mode == "disabled":
        return None
    ctx = ssl.create_default_context(cafile=source.tls.ca_file)
    ctx.check_hostname = source.tls.mode == "verify_identity"
    if source.tls.mode == "required":
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def require_tls(conn: pymysql.connections.Connection[Any], source: SourceConfig) -> pymysql.connections.Connection[Any]:
    """`conn`, if it is encrypted as `source.tls` asks. PyMySQL goes on in plaintext when the server does not
    offer TLS; a job told to use TLS must not (the password and every row would cross the network in clear)."""
    if source.tls.mode != "disabled" and not getattr(conn, "_secure", False):
        conn.close()
        raise SourceError(
            f"the MySQL server at {source.host}:{source.port} did not take TLS, and tls.mode is "
            f"{source.tls.mode}: not connecting in plaintext (enable TLS on the server, ssl_cert and ssl_key)"
        )
    return conn


def connect(source: SourceConfig, *, streaming: bool = False, **kwargs: Any) -> pymysql.connections.Connection[Any]:
    """A session as the CDC user: UTC for TIMESTAMP values, utf8mb4, autocommit, TLS as configured."""
    try:
        conn = pymysql.connect(
            host=source.host,
            port=source.port,
            user=source.user,
            password=source.password.reveal(),
            charset="utf8mb4",
            autocommit=True,
            connect_timeout=source.connect_timeout,
            ssl=tls_context(source),
            init_command="SET time_zone = '+00:00'",
            cursorclass=pymysql.cursors.SSCursor if streaming else pymysql.cursors.Cursor,
            **kwargs,
        )
    except pymysql.err.OperationalError as e:
        raise connection_refused(source, e) from None
    return require_tls(conn, source)


_CR_SSL_CONNECTION_ERROR = 2026
"""libmariadb's and libmysqlclient's code for a failed TLS handshake or certificate check (mysqlclient)."""


def tls_failure(error: Exception) -> str | None:
    """What went wrong in the TLS handshake of a failed connection, or None if it failed otherwise.

    PyMySQL wraps the `ssl` error in its "Can't connect" error; mysqlclient reports its own code."""
    original = getattr(error, "original_exception", None)
    if isinstance(original, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {original.verify_message}"
    if isinstance(original, ssl.SSLError):
        return str(original)
    if error.args and error.args[0] == _CR_SSL_CONNECTION_ERROR:
        return str(error.args[-1])
    return None


def connection_refused(source: SourceConfig, error: Exception) -> SourceError:
    """The error for a connection the driver could not open: host, port and user so the user can act (the
    drivers' messages never contain the password), and for a TLS failure what `tls.mode` checks."""
    failure = tls_failure(error)
    if failure is None:
        return SourceConnectError(
            f"cannot connect to MySQL at {source.host}:{source.port} as {source.user}: {error.args[-1]}",
            lost=bool(error.args) and error.args[0] in LOST_CONNECTION_CODES,
        )
    ca = f" (tls.ca_file {source.tls.ca_file})" if source.tls.ca_file else ""
    need = {
        "verify_ca": "the server's certificate must be signed by a CA in tls.ca_file",
        "verify_identity": (
            f"the server's certificate must be signed by a CA in tls.ca_file and be issued for source.host "
            f"({source.host}, in its subjectAltName); verify_ca does not check the name"
        ),
    }.get(source.tls.mode, "the server's TLS handshake must succeed")
    return SourceError(
        f"TLS to the MySQL server at {source.host}:{source.port} failed ({failure}); tls.mode is "
        f"{source.tls.mode}{ca}: not connecting without it. {need[0].upper()}{need[1:]}"
    )


def server_flavor(conn: pymysql.connections.Connection[Any]) -> str:
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        (version,) = cur.fetchone()
    return "mariadb" if "mariadb" in str(version).lower() else "mysql"


def check_binlog_settings(conn: pymysql.connections.Connection[Any]) -> None:
    """Refuse settings that would make CDC silently wrong (FAILURES.md "Types and settings")."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image")
        log_bin, fmt, image = cur.fetchone()
    if not log_bin:
        raise SourceError("the binary log is off on the source; start the server with log_bin")
    if str(fmt).upper() != "ROW":
        raise SourceError(
            f"binlog_format is {fmt}; CDC needs ROW (SET GLOBAL binlog_format = 'ROW' and restart writers)"
        )
    if str(image).upper() != "FULL":
        raise SourceError(
            f"binlog_row_image is {image}; CDC needs FULL so that every column is in every event "
            "(with MINIMAL or NOBLOB, columns missing from an event would be written as NULL)"
        )
    with conn.cursor() as cur:
        # Readable without privileges; MariaDB counts its running replication SQL threads here (MySQL has no
        # such variable, and writes what a replica applies to its binlog by default).
        cur.execute("SHOW GLOBAL STATUS LIKE 'Slaves_running'")
        row = cur.fetchone()
        if row is None or int(row[1]) == 0:
            return
        cur.execute("SELECT @@log_slave_updates")
        (logs_applied,) = cur.fetchone()
    if not logs_applied:
        raise SourceError(
            "the source is a replica with log_slave_updates OFF: what it applies from its primary never reaches "
            "its own binlog, so the job would miss those changes; start it with log_slave_updates=ON, or read "
            "from the primary"
        )


_GLOBAL_GRANT = re.compile(r"GRANT (.+?) ON \*\.\* TO ", re.IGNORECASE)
_ALIASES = {
    "REPLICATION SLAVE": ("REPLICATION SLAVE", "REPLICATION REPLICA"),
    # MariaDB 10.5 renamed REPLICATION CLIENT to BINLOG MONITOR and keeps the old name as an alias.
    "BINLOG MONITOR": ("BINLOG MONITOR", "REPLICATION CLIENT"),
    "REPLICATION CLIENT": ("REPLICATION CLIENT",),
}


def global_privileges(grant_lines: Sequence[str]) -> frozenset[str]:
    """The privileges `SHOW GRANTS` lines give on `*.*`, one name each (`ALL PRIVILEGES` stays one name).

    Whole names, not substrings: `REPLICATION SLAVE ADMIN` (MariaDB: run START SLAVE) is not `REPLICATION SLAVE`
    (read the binlog). MariaDB lists the grants of the session's active roles, and of the roles they were
    granted, in its `SHOW GRANTS`, so privileges given through a default role count; those of a role that is
    granted but not active do not, as they do not in the job's sessions."""
    privileges: set[str] = set()
    for line in grant_lines:
        found = _GLOBAL_GRANT.match(line.strip())
        if found:
            privileges.update(p.strip().upper() for p in found.group(1).split(","))
    return frozenset(privileges)


def check_privileges(conn: pymysql.connections.Connection[Any], flavor: str) -> None:
    """Name the missing grant before anything is read, instead of failing halfway."""
    needed = ["REPLICATION SLAVE", "BINLOG MONITOR" if flavor == "mariadb" else "REPLICATION CLIENT"]
    with conn.cursor() as cur:
        cur.execute("SHOW GRANTS")
        privileges = global_privileges([str(row[0]) for row in cur.fetchall()])
    if "ALL PRIVILEGES" in privileges:
        return
    for grant in needed:
        if not privileges.intersection(_ALIASES[grant]):
            raise MissingPrivilegeError(
                f"the CDC user lacks {grant}; run: GRANT {grant} ON *.* TO <cdc user>{_inactive_roles(conn, flavor)}"
            )


def _inactive_roles(conn: pymysql.connections.Connection[Any], flavor: str) -> str:
    """A hint when the user holds roles its sessions do not use (MariaDB: a role is active only once set as
    the user's DEFAULT ROLE, or with SET ROLE, which the job never runs)."""
    if flavor != "mariadb":
        return ""
    with conn.cursor() as cur:
        cur.execute(
            # Roles granted to the user itself (GRANTEE is `user@host`, as CURRENT_USER() is), not those they hold.
            "SELECT ROLE_NAME FROM information_schema.APPLICABLE_ROLES WHERE GRANTEE = CURRENT_USER() AND ROLE_NAME "
            "NOT IN (SELECT ROLE_NAME FROM information_schema.ENABLED_ROLES WHERE ROLE_NAME IS NOT NULL) "
            "ORDER BY ROLE_NAME"
        )
        roles = [str(row[0]) for row in cur.fetchall()]
    if not roles:
        return ""
    return (
        f" (or, if a role holds it: the user's roles {', '.join(roles)} are not active in its sessions; "
        f"run: SET DEFAULT ROLE {roles[0]} FOR <cdc user>)"
    )


def list_tables(conn: pymysql.connections.Connection[Any], selection: TableSelection) -> list[tuple[str, str]]:
    """The tables `selection` matches, once the CDC user is known to be able to SELECT every column of each.

    A user sees in information_schema only the tables and columns it holds some privilege on: without this
    check a table granted column by column would be captured without its other columns, and a table named in
    `tables.include` but not granted at all would be left out without a word."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES "
            "ORDER BY TABLE_SCHEMA, TABLE_NAME"
        )
        found = [(str(db), str(t), str(kind)) for db, t, kind in cur.fetchall()]
    rows = [(db, t) for db, t, kind in found if kind == "BASE TABLE"]
    _refuse_other_kinds([(db, t, kind) for db, t, kind in found if kind != "BASE TABLE" and selection.matches(db, t)])
    in_database: dict[str, list[str]] = {}
    for db, t in rows:
        in_database.setdefault(db, []).append(t)
    tables = []
    for db, t in rows:
        if db in SYSTEM_SCHEMAS or not selection.matches(db, t):
            continue
        helper = osc_helper(t, in_database[db])
        if helper is not None:
            # Mid-migration: the tool's copy of a table (or its leftover) is never a table of its own.
            log.info("%s.%s: not captured, a helper table of %s for %s.%s", db, t, helper.tool, db, helper.base)
            continue
        tables.append((db, t))
    for db, t in tables:
        _check_select(conn, db, t)
    for pattern in selection.include:
        named = named_in(pattern.pattern)
        if named is None:
            continue
        database, table = named
        if table is None:
            if not any(db == database for db, _ in tables):
                _check_select(conn, database, None)
        elif (database, table) not in tables and selection.matches(database, table):
            # Not visible: it does not exist (it may be created later), or the user holds no privilege on it.
            _check_select(conn, database, table)
    return tables


def _refuse_other_kinds(matched: Sequence[tuple[str, str, str]]) -> None:
    """What the patterns match besides base tables: views are named in the log (their rows are their base
    tables'); any other kind (a system-versioned table, a sequence) stops the job by name, since its rows would
    not be copied."""
    views = [f"{db}.{t}" for db, t, kind in matched if db not in SYSTEM_SCHEMAS and kind in _VIEWS]
    if views:
        log.info("not copied, views have no rows of their own: %s", ", ".join(views))
    refused = [f"{db}.{t} ({kind})" for db, t, kind in matched if db not in SYSTEM_SCHEMAS and kind not in _VIEWS]
    if refused:
        raise UnsupportedTableError(
            f"`tables.include` matches {', '.join(refused)}, which the job cannot copy: a system-versioned "
            "table's binlog rows carry its history (a DELETE is logged as an update of row_end, an UPDATE adds "
            "a history row), and a sequence is not a table of rows. Nothing was written. Leave it out with "
            "`tables.exclude`"
        )


_VIEWS = frozenset({"VIEW", "SYSTEM VIEW"})


_ACCESS_DENIED = frozenset({1142, 1143})
"""ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR."""
_NO_SUCH_TABLE = 1146


def _check_select(conn: pymysql.connections.Connection[Any], database: str, table: str | None) -> None:
    """Ask the server itself (grants may come from the user, a role, a database or a column); LIMIT 0
    reads no row. A table that does not exist passes: the server says so only to a user allowed to read it.
    Without a table, whether the user may read any table of `database` (one the pattern may match later)."""
    probe = table if table is not None else "ingest: no such table"
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {quote(database)}.{quote(probe)} LIMIT 0")
    except pymysql.err.MySQLError as e:
        code = e.args[0] if e.args else None
        if code == _NO_SUCH_TABLE:
            return
        if code in _ACCESS_DENIED:
            what = f"{database}.{table} (on every column)" if table is not None else f"the database {database}"
            grant_on = f"{quote(database)}.{quote(table)}" if table is not None else f"{quote(database)}.*"
            raise MissingPrivilegeError(
                f"the CDC user lacks SELECT on {what}, which `tables.include` selects; run: GRANT SELECT ON "
                f"{grant_on} TO <cdc user>, or leave it out of `tables`"
            ) from None
        raise


_REGEX_SPECIAL = frozenset(".^$*+?{}[]|()\\")


def named_in(pattern: str) -> tuple[str, str | None] | None:
    """The database a `tables.include` pattern names literally (`shop\\..*`), and the table too when the
    whole pattern is literal (`shop\\.orders`); None when its database part is not literal, or it has
    alternatives (`a\\.x|b\\.y`)."""
    if re.search(r"(?<!\\)(\\\\)*\|", pattern):
        return None
    chars: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 == len(pattern) or pattern[i + 1].isalnum():
                break  # \d, \w, \b, ...: a class or an assertion
            c = pattern[i + 1]
            i += 1
        elif c in _REGEX_SPECIAL:
            break
        chars.append(c)
        i += 1
    literal = "".join(chars)
    whole = i == len(pattern)
    if not whole and pattern[i] in "?*+{" and literal:
        literal = literal[:-1]  # a quantifier makes the last character optional or repeated
    database, dot, table = literal.partition(".")
    if not database or not dot:
        return None
    return database, table if whole and table and "." not in table else None


_COLUMNS_SQL = (
    "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE, "
    "DATETIME_PRECISION, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION"
)


def load_schema(
    conn: pymysql.connections.Connection[Any], database: str, table: str, options: TableOptions
) -> TableSchema:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(_COLUMNS_SQL, (database, table))
        column_rows = cur.fetchall()
        if not column_rows:
            raise UnsupportedTableError(f"table {database}.{table} does not exist or the CDC user cannot see it")
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION",
            (database, table),
        )
        primary_key = tuple(str(r["COLUMN_NAME"]) for r in cur.fetchall())
    columns = tuple(SourceColumn.from_information_schema(r) for r in column_rows)
    collation_of = {str(r["COLUMN_NAME"]): r["COLLATION_NAME"] for r in column_rows}
    table_id = f"{database}.{table}"
    by_name = {c.name: c for c in columns}
    chunk_key = options.chunk_key or primary_key or _unique_not_null_key(conn, database, table, by_name)
    if not chunk_key:
        _check_keyless(table_id, columns, options)
        log.info(
            "%s has no primary key and no unique key on NOT NULL columns: it is copied as a multiset of rows "
            "(read in one chunk, its alike rows numbered in %s)",
            table_id,
            OCCURRENCE_COLUMN,
        )
        return TableSchema(database, table, columns, (), (), ())
    for name in chunk_key:
        if name not in by_name:
            raise UnsupportedTableError(f"chunk key column {name!r} of {table_id} does not exist")
        if by_name[name].nullable:
            raise UnsupportedTableError(
                f"chunk key column {name!r} of {table_id} is nullable: rows with NULL keys would never be read; "
                "choose a NOT NULL unique key"
            )
    if primary_key and options.chunk_key and options.chunk_key != primary_key:
        # Rows are identified by the primary key, chunks by the other key: a row whose chunk key changes
        # between two chunk reads would be copied twice, and the binlog phase could not tell which copy to keep.
        raise UnsupportedTableError(
            f"table {table_id} has a primary key ({', '.join(primary_key)}): `chunk_key` is only for tables "
            "without one; remove it from its `table_options`"
        )
    if options.chunk_key and options.chunk_key != primary_key:
        _require_unique_index(conn, database, table, options.chunk_key)
    collations = tuple(str(collation_of[k]) if collation_of.get(k) else None for k in chunk_key)
    return TableSchema(database, table, columns, primary_key or tuple(chunk_key), tuple(chunk_key), collations)


def _check_keyless(table_id: str, columns: Sequence[SourceColumn], options: TableOptions) -> None:
    """What a table without a key cannot have: a column of the job's occurrence name, values set aside by key."""
    if any(c.name.lower() == OCCURRENCE_COLUMN for c in columns):
        raise UnsupportedTableError(
            f"table {table_id} has no key and a column named {OCCURRENCE_COLUMN}, the name the job gives the column "
            "that numbers alike rows of such a table; rename the column or add a key"
        )
    if options.on_unrepresentable != "null":
        raise UnsupportedTableError(
            f"table {table_id} has no key, and `on_unrepresentable: {options.on_unrepresentable}` names the rows it "
            "sets aside by their key; use `null` for this table, or add a key"
        )


def _unique_indexes(conn: pymysql.connections.Connection[Any], database: str, table: str) -> dict[str, tuple[str, ...]]:
    """The table's unique indexes by name: their columns in index order."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX SEPARATOR '\\0') "
            "FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND NON_UNIQUE = 0 "
            "GROUP BY INDEX_NAME",
            (database, table),
        )
        return {str(name): tuple(str(cols).split("\0")) for name, cols in cur.fetchall()}


def _unique_not_null_key(
    conn: pymysql.connections.Connection[Any], database: str, table: str, by_name: dict[str, SourceColumn]
) -> tuple[str, ...]:
    """For a table without a primary key: the unique index on NOT NULL columns that identifies its rows (the
    one with the fewest columns, then the first by name), as InnoDB would cluster it; () when there is none."""
    usable = [
        (len(columns), name, columns)
        for name, columns in _unique_indexes(conn, database, table).items()
        if all(c in by_name and not by_name[c].nullable for c in columns)
    ]
    if not usable:
        return ()
    _, name, columns = min(usable)
    log.info(
        "%s.%s has no primary key: its rows are told apart by its unique key %s (%s)",
        database,
        table,
        name,
        ", ".join(columns),
    )
    return columns


def _require_unique_index(
    conn: pymysql.connections.Connection[Any], database: str, table: str, key: Sequence[str]
) -> None:
    indexes = list(_unique_indexes(conn, database, table).values())
    if tuple(key) not in indexes:
        raise UnsupportedTableError(
            f"chunk key {list(key)} of {database}.{table} is not a unique index; rows could be read twice or lost"
        )


def binlog_files(conn: pymysql.connections.Connection[Any]) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return [str(row[0]) for row in cur.fetchall()]


def binlog_sizes(conn: pymysql.connections.Connection[Any]) -> dict[str, int]:
    """Each binlog file on the server and its size in bytes (`SHOW BINARY LOGS`)."""
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return {str(row[0]): int(row[1]) for row in cur.fetchall()}
