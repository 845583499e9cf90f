"""A throwaway PostgreSQL that holds the Iceberg JDBC catalog of the S3 (MinIO) profile."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from ingest.devservers.process import ServerProcess, free_port
from ingest.errors import ServiceStartError

CATALOG_DB = "iceberg_catalog"


def _pg_bin(name: str) -> str:
    for version_dir in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (version_dir / name).exists():
            return str(version_dir / name)
    found = shutil.which(name)
    if not found:
        raise ServiceStartError(f"PostgreSQL's {name} is not installed; run `make setup` first")
    return found


class PostgresServer:
    """PostgreSQL on a free port with a password user; `jdbc_url` and `sqlalchemy_url` point at its catalog DB."""

    def __init__(self, user: str = "iceberg", password: str = "iceberg-catalog") -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self.user = user
        self.password = password
        self.base_dir = Path(tempfile.mkdtemp(prefix="ingest-postgres-"))
        self._process: ServerProcess | None = None
        # PostgreSQL refuses to run as root; use the account the Debian package created.
        self._run_as = "postgres" if os.geteuid() == 0 else None

    def start(self) -> PostgresServer:
        data = self.base_dir / "data"
        if not data.exists():
            self._init(data)
        self._process = ServerProcess(
            "postgres",
            [
                _pg_bin("postgres"),
                "-D",
                str(data),
                "-p",
                str(self.port),
                "-h",
                self.host,
                "-k",
                str(self.base_dir),
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ],
            self.base_dir / "postgres.log",
            user=self._run_as,
        )
        self._process.wait_until(self._create_catalog_db, timeout=60)
        return self

    def _init(self, data: Path) -> None:
        pwfile = self.base_dir / "pw"
        pwfile.write_text(self.password)
        if self._run_as:
            entry = pwd.getpwnam(self._run_as)
            for p in (self.base_dir, pwfile):
                os.chown(p, entry.pw_uid, entry.pw_gid)
        init = subprocess.run(
            [
                _pg_bin("initdb"),
                "-D",
                str(data),
                "-U",
                self.user,
                f"--pwfile={pwfile}",
                "-A",
                "scram-sha-256",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ],
            capture_output=True,
            text=True,
            user=self._run_as,
            check=False,
        )
        if init.returncode != 0:
            raise ServiceStartError(f"initdb failed:\n{init.stdout[-2000:]}{init.stderr[-2000:]}")

    def restart(self, pause_seconds: float) -> None:
        """Stop the server, wait, and start it again on the same port with the same data (for fault tests)."""
        if self._process is not None:
            # SIGINT: PostgreSQL's fast shutdown (pg_ctl's default), which ends the sessions still open; SIGTERM's
            # smart shutdown would wait for every client to leave.
            self._process.stop(how=signal.SIGINT)
            self._process = None
        time.sleep(pause_seconds)
        self.start()

    def _create_catalog_db(self) -> bool:
        import psycopg2

        conn = psycopg2.connect(
            host=self.host, port=self.port, user=self.user, password=self.password, dbname="postgres", connect_timeout=2
        )
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (CATALOG_DB,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{CATALOG_DB}"')
        finally:
            conn.close()
        return True

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{CATALOG_DB}"

    @property
    def sqlalchemy_url(self) -> str:
        """Without the password: it is passed separately so that it never lands in a logged URL."""
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{CATALOG_DB}"

    def stop(self) -> None:
        if self._process is not None:
            # SIGINT: PostgreSQL's fast shutdown (pg_ctl's default), which ends the sessions still open; SIGTERM's
            # smart shutdown would wait for every client to leave.
            self._process.stop(how=signal.SIGINT)
            self._process = None
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
