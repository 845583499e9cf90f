"""What the source checks read from the server's answers: grants, literal table patterns, TLS failures."""

from __future__ import annotations

import ssl

import pymysql
import pytest

from ingest.config import Secret, SourceConfig, TlsConfig
from ingest.source.mysql import connection_refused, global_privileges, named_in, tls_failure


def test_global_privileges_are_whole_names_from_the_user_and_its_active_roles() -> None:
    lines = [
        "GRANT `cdc_role` TO `cdc`@`%`",
        "GRANT USAGE ON *.* TO `cdc`@`%` IDENTIFIED BY PASSWORD '*0123'",
        "GRANT SELECT ON `shop`.* TO `cdc`@`%`",
        "GRANT REPLICATION SLAVE ADMIN, BINLOG MONITOR ON *.* TO `cdc_role`",
        "SET DEFAULT ROLE `cdc_role` FOR `cdc`@`%`",
    ]
    assert global_privileges(lines) == {"USAGE", "REPLICATION SLAVE ADMIN", "BINLOG MONITOR"}
    assert "REPLICATION SLAVE" not in global_privileges(lines)
    assert global_privileges(["GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION"]) == {
        "ALL PRIVILEGES"
    }


@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        (r"shop\.orders", ("shop", "orders")),
        (r"my\-db\.t\-1", ("my-db", "t-1")),
        (r"shop\..*", ("shop", None)),
        (r"shop\.orders_\d+", ("shop", None)),
        (r"shop\.orders?", ("shop", None)),  # the `s` is optional: not one name
        (r"shop.orders", None),  # an unescaped dot matches any character
        (r"shop\.a|other\.b", None),
        (r"(?i)shop\.orders", None),
        (r"\w+\.orders", None),
        (r"shop\.?x", None),
        (r"a\.b\.c", ("a", None)),  # which dot ends the database is not known
    ],
)
def test_named_in_finds_the_literal_database_and_table_of_a_pattern(
    pattern: str, named: tuple[str, str | None] | None
) -> None:
    assert named_in(pattern) == named


def _source(mode: str, host: str = "db.internal") -> SourceConfig:
    ca = None if mode == "required" else "/etc/ca.pem"
    return SourceConfig(host, "cdc", Secret("pw", "test"), port=3306, tls=TlsConfig(mode, ca))  # type: ignore[arg-type]


def _pymysql_error(original: Exception) -> pymysql.err.OperationalError:
    error = pymysql.err.OperationalError(2003, f"Can't connect to MySQL server on 'db.internal' ({original})")
    error.original_exception = original  # type: ignore[attr-defined]  # as PyMySQL sets it
    return error


def test_a_tls_failure_names_the_mode_and_what_it_checks() -> None:
    mismatch = ssl.SSLCertVerificationError(1, "certificate verify failed")
    mismatch.verify_message = "Hostname mismatch, certificate is not valid for 'db.internal'."
    error = connection_refused(_source("verify_identity"), _pymysql_error(mismatch))
    assert str(error) == (
        "TLS to the MySQL server at db.internal:3306 failed (certificate verify failed: Hostname mismatch, "
        "certificate is not valid for 'db.internal'.); tls.mode is verify_identity (tls.ca_file /etc/ca.pem): "
        "not connecting without it. The server's certificate must be signed by a CA in tls.ca_file and be issued "
        "for source.host (db.internal, in its subjectAltName); verify_ca does not check the name"
    )
    mysqlclient = pymysql.err.OperationalError(2026, "TLS/SSL error: self-signed certificate in certificate chain")
    assert tls_failure(mysqlclient) == "TLS/SSL error: self-signed certificate in certificate chain"
    assert "must be signed by a CA in tls.ca_file" in str(connection_refused(_source("verify_ca"), mysqlclient))


def test_a_connection_failure_without_tls_trouble_keeps_the_driver_message() -> None:
    refused = _pymysql_error(ConnectionRefusedError(111, "Connection refused"))
    assert tls_failure(refused) is None
    assert str(connection_refused(_source("required"), refused)).startswith(
        "cannot connect to MySQL at db.internal:3306 as cdc: Can't connect"
    )
