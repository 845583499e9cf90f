"""Fixtures for real services. Integration tests fail (never skip) when a service cannot start."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import PostgresServer

CDC_USER = "cdc"
CDC_PASSWORD_ENV = "INGEST_TEST_MYSQL_PASSWORD"


@pytest.fixture(scope="session")
def cdc_password() -> str:
    password = "cdc-" + secrets.token_hex(8)
    os.environ[CDC_PASSWORD_ENV] = password
    return password


@pytest.fixture(scope="session")
def mariadb(cdc_password: str) -> Iterator[MariaDBServer]:
    with MariaDBServer(server_id=1) as server:
        server.create_cdc_user(CDC_USER, cdc_password)
        yield server


@pytest.fixture(scope="session")
def minio() -> Iterator[MinioServer]:
    with MinioServer() as server:
        yield server


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


def source_section(server: MariaDBServer) -> dict[str, Any]:
    return {
        "host": server.host,
        "port": server.port,
        "user": CDC_USER,
        "password": {"env": CDC_PASSWORD_ENV},
        "flavor": "mariadb",
        "server_id": 5401,
    }


def embedded_sink(base: Path) -> dict[str, Any]:
    """The embedded default: SQLite-backed JDBC catalog and a local warehouse directory."""
    return {
        "catalog_name": "lake",
        "catalog": {"type": "jdbc", "uri": f"jdbc:sqlite:{base}/catalog.db", "warehouse": f"file://{base}/warehouse"},
    }


def minio_sink(minio: MinioServer, postgres: PostgresServer, bucket: str) -> dict[str, Any]:
    """The S3 profile: MinIO through S3FileIO, JDBC catalog on a real PostgreSQL server."""
    os.environ["INGEST_TEST_S3_SECRET"] = minio.secret_key
    os.environ["INGEST_TEST_PG_PASSWORD"] = postgres.password
    # Its own catalog name: a Spark session caches catalogs by name, and tests share one session per module.
    return {
        "catalog_name": "s3lake",
        "catalog": {
            "type": "jdbc",
            "uri": postgres.jdbc_url,
            "jdbc.user": postgres.user,
            "jdbc.password": {"env": "INGEST_TEST_PG_PASSWORD"},
            "warehouse": f"s3://{bucket}/warehouse",
            "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            "s3.endpoint": minio.endpoint,
            "s3.path-style-access": "true",
            "s3.region": minio.region,
            "client.region": minio.region,
            "s3.access-key-id": minio.access_key,
            "s3.secret-access-key": {"env": "INGEST_TEST_S3_SECRET"},
        },
    }
