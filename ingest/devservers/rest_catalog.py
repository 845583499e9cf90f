"""A throwaway Iceberg REST catalog server: Apache Iceberg's own REST catalog server (`RESTCatalogServer` of
the `iceberg-open-api` jar, the server behind the `apache/iceberg-rest-fixture` image), in front of a JDBC
catalog on PostgreSQL, writing metadata to MinIO through S3FileIO. It vends no credentials: every client
(Spark, pyiceberg, Trino) brings its own `s3.*` settings.

Setup fetches the jar from Maven Central into the cache outside git (`scripts/setup.sh`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import PostgresServer
from ingest.devservers.process import LocalService, ServerProcess, free_port
from ingest.errors import ServiceStartError
from ingest.runtime.cache import tools_dir

# The newest release that publishes the runnable server jar (1.11.0 publishes only test fixtures); keep in
# step with scripts/setup.sh and docker/compose.yaml.
REST_SERVER_VERSION = "1.10.1"
SERVER_JAR = f"iceberg-open-api-{REST_SERVER_VERSION}.jar"


def server_jar() -> Path:
    return tools_dir() / "jars" / SERVER_JAR


def _env_key(prop: str) -> str:
    """The server reads catalog property `a.b-c` from the environment variable CATALOG_A_B__C."""
    return "CATALOG_" + prop.replace("-", "__").replace(".", "_").upper()


class RestCatalogServer(LocalService):
    """`with RestCatalogServer(minio, postgres, warehouse="s3://bucket/warehouse") as rest: rest.uri`."""

    def __init__(self, minio: MinioServer, postgres: PostgresServer, warehouse: str, name: str = "rest") -> None:
        self.minio, self.postgres, self.warehouse, self.name = minio, postgres, warehouse, name
        self.host = "127.0.0.1"
        self.port = free_port()
        self.base_dir = Path(tempfile.mkdtemp(prefix="ingest-rest-catalog-"))
        self._process: ServerProcess | None = None

    @property
    def uri(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=2) as reply:
            return isinstance(json.load(reply), dict)

    def start(self) -> RestCatalogServer:
        from ingest.runtime.jars import POSTGRES_JDBC, jar_dir

        jars = [server_jar(), jar_dir() / POSTGRES_JDBC.file_name]
        missing = [str(j) for j in jars if not j.is_file()]
        if missing:
            raise ServiceStartError(f"the REST catalog server needs {', '.join(missing)}; run `make setup`")
        java = shutil.which("java")
        if java is None:
            raise ServiceStartError("java is not installed; run `make setup`")
        props = {
            "rest.port": str(self.port),
            "catalog.name": self.name,
            "uri": self.postgres.jdbc_url,
            "jdbc.user": self.postgres.user,
            "jdbc.password": self.postgres.password,
            "warehouse": self.warehouse,
            "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            "s3.endpoint": self.minio.endpoint,
            "s3.path-style-access": "true",
            "s3.access-key-id": self.minio.access_key,
            "s3.secret-access-key": self.minio.secret_key,
            "client.region": self.minio.region,
        }
        self._process = ServerProcess(
            "iceberg rest catalog",
            [java, "-Xmx512m", "-XX:TieredStopAtLevel=1", "-cp", ":".join(str(j) for j in jars),
             "org.apache.iceberg.rest.RESTCatalogServer"],
            self.base_dir / "rest-catalog.log",
            env={_env_key(k): v for k, v in props.items()},
        )  # fmt: skip
        self._process.wait_until(self._ready, timeout=120)
        return self

    def restart(self, pause_seconds: float) -> None:
        """Stop the server, wait, and start it again on the same port (for fault tests): its catalog is in
        PostgreSQL, so it comes back with every table."""
        self._stop_process()
        time.sleep(pause_seconds)
        self.start()

    def _stop_process(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    def stop(self) -> None:
        self._stop_process()
        shutil.rmtree(self.base_dir, ignore_errors=True)
