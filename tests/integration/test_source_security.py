"""FAILURES.md "Security": the grants the CDC user holds, directly or through roles, and TLS to the source.

A refusal happens in `discover`, before Spark starts and before anything is written, so those tests run the
job without Spark and check that the warehouse is still empty; only the role test runs a whole job.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from ingest.commands.verify import verify
from ingest.config import PipelineConfig, parse_config
from ingest.devservers.mariadb import CDC_GRANTS, MariaDBServer
from ingest.errors import ConfigError, MissingPrivilegeError, SourceError
from ingest.query.pipeline import run
from ingest.source.binlog.reader import open_stream
from ingest.source.mysql import connect
from ingest.source.snapshot.chunk_select import open_select
from ingest.source.watermark import read_watermark
from tests.certificates import certificates
from tests.conftest import embedded_sink, source_section

pytestmark = pytest.mark.integration

DB = "secdb"


@pytest.fixture(scope="module")
def secdb(mariadb: MariaDBServer) -> str:
    mariadb.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        "DROP DATABASE IF EXISTS secother",
        f"CREATE DATABASE {DB}",
        "CREATE DATABASE secother",
        f"CREATE TABLE {DB}.a (id INT NOT NULL PRIMARY KEY, v VARCHAR(20))",
        f"CREATE TABLE {DB}.b (id INT NOT NULL PRIMARY KEY, v VARCHAR(20), secret VARCHAR(20))",
        f"CREATE TABLE {DB}.c (id INT NOT NULL PRIMARY KEY, v VARCHAR(20))",
        "CREATE TABLE secother.d (id INT NOT NULL PRIMARY KEY)",
        *(f"INSERT INTO {DB}.{t} (id, v) SELECT seq, CONCAT('v', seq) FROM {DB}.seq_1_to_300" for t in "abc"),
    )
    return DB


def _user(server: MariaDBServer, name: str, password: str, *grants: str) -> str:
    """A user with exactly `grants` (each `PRIVILEGES ON LEVEL`, or a role name)."""
    server.execute(f"DROP USER IF EXISTS '{name}'@'%'")
    with server.admin() as conn, conn.cursor() as cur:
        cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (name, password))
    server.execute(*(f"GRANT {grant} TO '{name}'@'%'" for grant in grants))
    return name


def _config(server: MariaDBServer, user: str, base: Path, *include: str, **source: Any) -> PipelineConfig:
    return parse_config(
        {
            "name": f"sec_{user}",
            "source": {**source_section(server), "user": user, **source},
            "tables": {"include": list(include)},
            "sink": {**embedded_sink(base), "catalog_name": f"sec_{user}_lake"},
            "snapshot": {"chunk_size": 100},
            "stream": {"batch_interval_seconds": 1},
        }
    )


class _NoSpark:
    """Handed to `run` as its Spark session, which it must not come to need."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the job went on past its checks (to Spark's {name})")


def _refused_before_writing(config: PipelineConfig, base: Path, error: type[Exception], message: str) -> None:
    """`ingest run` stops with `error` at its first checks: before Spark, no catalog, no warehouse file."""
    with pytest.raises(error, match=message):
        run(config, spark=_NoSpark())
    assert not (base / "catalog.db").exists()
    assert not (base / "warehouse").exists()


@pytest.mark.parametrize(
    ("grants", "include", "message"),
    [
        pytest.param(
            [f"SELECT ON {DB}.a", f"SELECT (id, v) ON {DB}.b"],
            [rf"{DB}\..*"],
            rf"lacks SELECT on {DB}\.b \(on every column\).*GRANT SELECT ON `{DB}`\.`b` TO",
            id="a-table-granted-column-by-column",
        ),
        pytest.param(
            [f"SELECT ON {DB}.a"],
            [rf"{DB}\.a", rf"{DB}\.c"],
            rf"lacks SELECT on {DB}\.c .*GRANT SELECT ON `{DB}`\.`c` TO",
            id="a-named-table-not-granted",
        ),
        pytest.param(
            [f"SELECT ON {DB}.a"],
            [rf"{DB}\.a", r"secother\..*"],
            r"lacks SELECT on the database secother.*GRANT SELECT ON `secother`\.\* TO",
            id="a-database-not-granted",
        ),
    ],
)
def test_a_missing_select_is_named_with_the_table_before_anything_is_written(
    mariadb: MariaDBServer,
    secdb: str,
    cdc_password: str,
    tmp_path: Path,
    grants: list[str],
    include: list[str],
    message: str,
) -> None:
    """The user sees only what it holds a privilege on: a table granted column by column would be copied
    without its other columns, one not granted at all left out, without a word."""
    user = _user(mariadb, "sec_select", cdc_password, "REPLICATION SLAVE, BINLOG MONITOR ON *.*", *grants)
    _refused_before_writing(_config(mariadb, user, tmp_path, *include), tmp_path, MissingPrivilegeError, message)


@pytest.mark.parametrize(
    ("grants", "message"),
    [
        pytest.param(
            ["SELECT, BINLOG MONITOR, REPLICATION SLAVE ADMIN ON *.*"],
            r"lacks REPLICATION SLAVE; run: GRANT REPLICATION SLAVE ON \*\.\* TO <cdc user>$",
            id="replication-slave-admin-is-not-replication-slave",
        ),
        pytest.param(
            ["SELECT, REPLICATION SLAVE ON *.*"],
            r"lacks BINLOG MONITOR; run: GRANT BINLOG MONITOR ON \*\.\* TO <cdc user>$",
            id="binlog-monitor",
        ),
        pytest.param(
            ["sec_inactive_role"],
            r"lacks REPLICATION SLAVE; .*roles sec_inactive_role are not active.*SET DEFAULT ROLE sec_inactive_role",
            id="a-role-granted-but-not-the-default",
        ),
    ],
)
def test_a_missing_replication_grant_is_named_before_anything_is_written(
    mariadb: MariaDBServer, secdb: str, cdc_password: str, tmp_path: Path, grants: list[str], message: str
) -> None:
    mariadb.execute(
        "DROP ROLE IF EXISTS sec_inactive_role",
        "CREATE ROLE sec_inactive_role",
        f"GRANT {CDC_GRANTS} ON *.* TO sec_inactive_role",
    )
    user = _user(mariadb, "sec_repl", cdc_password, *grants)
    config = _config(mariadb, user, tmp_path, rf"{DB}\.a")
    _refused_before_writing(config, tmp_path, MissingPrivilegeError, message)


def test_grants_through_a_default_role_pass_and_the_job_snapshots_and_streams(
    spark: Any, mariadb: MariaDBServer, secdb: str, cdc_password: str, tmp_path: Path
) -> None:
    """Every privilege comes through roles (one granted to another), none to the user itself."""
    mariadb.execute(
        *(f"DROP ROLE IF EXISTS {r}" for r in ("sec_reader", "sec_binlog", "sec_cdc")),
        "CREATE ROLE sec_reader",
        f"GRANT SELECT ON {DB}.* TO sec_reader",
        "CREATE ROLE sec_binlog",
        "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO sec_binlog",
        "CREATE ROLE sec_cdc",
        "GRANT sec_reader TO sec_cdc",
        "GRANT sec_binlog TO sec_cdc",
    )
    user = _user(mariadb, "sec_by_role", cdc_password, "sec_cdc")
    mariadb.execute(f"SET DEFAULT ROLE sec_cdc FOR '{user}'@'%'")
    config = _config(mariadb, user, tmp_path, rf"{DB}\.a", rf"{DB}\.c")
    with connect(config.source) as conn, conn.cursor() as cur:
        cur.execute("SHOW GRANTS")
        own = [str(r[0]) for r in cur.fetchall() if f"TO `{user}`" in str(r[0])]
    assert all(re.match(r"GRANT (`sec_cdc`|USAGE ON \*\.\*) TO", g) for g in own), own

    run(config, spark=spark, until_caught_up=True)  # the snapshot
    mariadb.execute(
        f"UPDATE {DB}.a SET v = 'changed' WHERE id <= 20",
        f"DELETE FROM {DB}.c WHERE id > 280",
        f"INSERT INTO {DB}.c VALUES (1000, 'new')",
    )
    run(config, spark=spark, until_caught_up=True)  # the binlog
    assert verify(config)


# TLS. The server takes TLS with a certificate for 127.0.0.1 and listens on 127.0.0.2 too, which reaches it
# under a name its certificate does not hold.


class TlsSource(NamedTuple):
    server: MariaDBServer
    ca: Path
    """The CA that signed the server's certificate."""


@pytest.fixture(scope="module")
def tls_source(tmp_path_factory: pytest.TempPathFactory, cdc_password: str) -> Iterator[TlsSource]:
    ca, cert, key = certificates(tmp_path_factory.mktemp("tls") / "server")
    tls_args = (f"--ssl-ca={ca}", f"--ssl-cert={cert}", f"--ssl-key={key}", "--bind-address=127.0.0.1,127.0.0.2")
    with MariaDBServer(server_id=31, extra_args=tls_args) as server:
        # Refusals are asked of a user the server would also take in plaintext, so that a fallback would
        # connect; the user that must get through takes TLS only.
        _user(server, "tls_any", cdc_password, f"{CDC_GRANTS} ON *.*")
        _user(server, "tls_only", cdc_password, f"{CDC_GRANTS} ON *.*")
        server.execute(
            "ALTER USER 'tls_only'@'%' REQUIRE SSL",
            "CREATE DATABASE tlsdb",
            "CREATE TABLE tlsdb.t (id INT NOT NULL PRIMARY KEY, v VARCHAR(20))",
            "INSERT INTO tlsdb.t SELECT seq, CONCAT('v', seq) FROM tlsdb.seq_1_to_100",
        )
        yield TlsSource(server, ca)


def _connection_kinds(server: MariaDBServer, config: PipelineConfig) -> dict[str, Any]:
    """Every kind of connection the job opens, each a callable that opens, uses and closes one."""
    with server.admin() as conn:
        now = read_watermark(conn, "mariadb").position

    def session() -> None:
        with connect(config.source) as conn, conn.cursor() as cur:
            cur.execute("SHOW SESSION STATUS LIKE 'Ssl_version'")
            assert cur.fetchone()[1].startswith("TLS")

    def chunk_select(driver: str) -> Any:
        def opened() -> None:
            select = open_select(config.source, driver)
            select.begin("mariadb")
            select.end()
            select.close()

        return opened

    def stream() -> None:
        reader = open_stream(config.source, now, 98)
        try:
            assert next(iter(reader)) is not None
        finally:
            reader.close()

    kinds = {"session": session, "stream": stream, "chunk select (pymysql)": chunk_select("pymysql")}
    if config.source.tls.mode == "verify_identity":
        kinds["chunk select (mysqlclient)"] = chunk_select("mysqlclient")
    else:  # mysqlclient cannot keep to it: `auto` reads with PyMySQL
        kinds["chunk select (auto)"] = chunk_select("auto")
    return kinds


def _tls_config(server: MariaDBServer, user: str, base: Path, host: str, mode: str, ca: Path) -> PipelineConfig:
    return _config(server, user, base, r"tlsdb\.t", host=host, tls={"mode": mode, "ca_file": str(ca)})


def test_a_certificate_another_ca_signed_is_refused_under_verify_ca_on_every_connection(
    tls_source: TlsSource, tmp_path: Path
) -> None:
    server = tls_source.server
    other_ca, _, _ = certificates(tmp_path / "other")
    config = _tls_config(server, "tls_any", tmp_path, "127.0.0.1", "verify_ca", other_ca)
    refusal = (
        rf"TLS to the MySQL server at 127\.0\.0\.1:{server.port} failed \(.+\); tls\.mode is verify_ca "
        rf"\(tls\.ca_file {re.escape(str(other_ca))}\): not connecting without it\. The server's certificate must "
        "be signed by a CA in tls.ca_file"
    )
    _refused_on_every_connection(server, config, refusal)
    _refused_before_writing(config, tmp_path, SourceError, refusal)


def test_a_host_name_the_certificate_does_not_hold_is_refused_under_verify_identity_not_under_verify_ca(
    tls_source: TlsSource, tmp_path: Path
) -> None:
    server, ca = tls_source
    config = _tls_config(server, "tls_any", tmp_path, "127.0.0.2", "verify_identity", ca)
    refusal = (
        rf"TLS to the MySQL server at 127\.0\.0\.2:{server.port} failed \(.+\); tls\.mode is verify_identity "
        r".*be issued for source\.host \(127\.0\.0\.2, in its subjectAltName\)"
    )
    _refused_on_every_connection(server, config, refusal)
    _refused_before_writing(config, tmp_path, SourceError, refusal)

    # The certificate is the server's, signed by the CA: verify_ca does not ask for the name.
    for open_one in _connection_kinds(
        server, _tls_config(server, "tls_only", tmp_path, "127.0.0.2", "verify_ca", ca)
    ).values():
        open_one()


def test_the_right_ca_and_host_name_connect_under_verify_identity_on_every_connection(
    tls_source: TlsSource, tmp_path: Path
) -> None:
    server, ca = tls_source
    kinds = _connection_kinds(server, _tls_config(server, "tls_only", tmp_path, "127.0.0.1", "verify_identity", ca))
    assert "chunk select (mysqlclient)" in kinds
    for open_one in kinds.values():
        open_one()


def _refused_on_every_connection(server: MariaDBServer, config: PipelineConfig, refusal: str) -> None:
    for kind, open_one in _connection_kinds(server, config).items():
        with pytest.raises(SourceError, match=refusal):
            open_one()
            pytest.fail(f"{kind}: connected")


def test_mysqlclient_never_reads_in_plaintext_when_tls_is_required(
    mariadb: MariaDBServer, secdb: str, tmp_path: Path
) -> None:
    """Linked to MariaDB Connector/C, mysqlclient goes on in plaintext under `required` when the server has no
    TLS; the job's chunk reads (`auto`) take PyMySQL then, which refuses, and naming mysqlclient is refused."""
    config = _config(mariadb, "cdc", tmp_path, rf"{DB}\.a", tls={"mode": "required"})
    with pytest.raises(SourceError, match="did not take TLS, and tls.mode is required: not connecting in plaintext"):
        open_select(config.source, "auto")
    data = {
        "name": "sec",
        "source": {**source_section(mariadb), "tls": {"mode": "required"}},
        "tables": {"include": [rf"{DB}\.a"]},
        "sink": embedded_sink(tmp_path),
        "snapshot": {"driver": "mysqlclient"},
    }
    with pytest.raises(ConfigError, match=r"`snapshot.driver: mysqlclient` cannot keep to `source.tls.mode: required`"):
        parse_config(data)
