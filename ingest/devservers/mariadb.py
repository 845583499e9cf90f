"""A throwaway MariaDB server set up the way CDC needs it: ROW binlog, FULL images, GTIDs.

`binlog_row_metadata` is FULL unless asked otherwise; None leaves the server's default (NO_LOG), as on a
server nobody tuned for CDC.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import pymysql

from ingest.devservers.process import ServerProcess, find_program, free_port
from ingest.errors import ServiceStartError

# The least privileges the job needs (MISSION.md "Lock-free chunk read"): no RELOAD, no LOCK TABLES.
CDC_GRANTS = "SELECT, REPLICATION SLAVE, BINLOG MONITOR"


class MariaDBServer:
    """A MariaDB on a free port; `admin()` is root over the socket, `create_cdc_user()` the job's user."""

    def __init__(
        self,
        server_id: int = 1,
        time_zone: str | None = None,
        extra_args: tuple[str, ...] = (),
        base_dir: Path | None = None,
        row_metadata: str | None = "FULL",
    ) -> None:
        self.server_id = server_id
        self.row_metadata = row_metadata
        self.time_zone = time_zone
        self.extra_args = extra_args
        self.host = "127.0.0.1"
        self.port = free_port()
        self._owns_dir = base_dir is None
        self.base_dir = Path(tempfile.mkdtemp(prefix="ingest-mariadb-")) if base_dir is None else base_dir
        self.data_dir = self.base_dir / "data"
        self.socket = str(self.base_dir / "mysqld.sock")
        # Its own: a starting MariaDB deletes every `#sql*` file in its tmpdir, so servers sharing /tmp (the
        # test workers', a failover replica) remove each other's temporary tables.
        self.tmp_dir = self.base_dir / "tmp"
        self._process: ServerProcess | None = None

    def start(self) -> MariaDBServer:
        mariadbd = find_program("mariadbd")
        install_db = find_program("mariadb-install-db")
        as_root = ["--user=root"]
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        if not (self.data_dir / "mysql").is_dir():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(
                [
                    install_db,
                    "--no-defaults",
                    f"--datadir={self.data_dir}",
                    f"--tmpdir={self.tmp_dir}",
                    *as_root,
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise ServiceStartError(f"mariadb-install-db failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        args = [
            mariadbd,
            "--no-defaults",
            *as_root,
            f"--datadir={self.data_dir}",
            f"--socket={self.socket}",
            f"--tmpdir={self.tmp_dir}",
            f"--port={self.port}",
            f"--pid-file={self.base_dir / 'mysqld.pid'}",
            "--bind-address=127.0.0.1",
            "--skip-name-resolve",
            f"--server-id={self.server_id}",
            f"--log-bin={self.data_dir / 'mysql-bin'}",
            "--binlog-format=ROW",
            "--binlog-row-image=FULL",
            "--log-slave-updates=ON",
            "--gtid-strict-mode=ON",
            "--gtid-domain-id=0",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
            # Throwaway data: trade durability for test speed.
            "--innodb-buffer-pool-size=256M",
            "--innodb-flush-log-at-trx-commit=2",
            "--sync-binlog=0",
            "--innodb-doublewrite=0",
            "--performance-schema=OFF",
            "--max-connections=500",
        ]
        if self.row_metadata:
            args.append(f"--binlog-row-metadata={self.row_metadata}")
        if self.time_zone:
            args.append(f"--default-time-zone={self.time_zone}")
        args.extend(self.extra_args)
        self._process = ServerProcess("mariadb", args, self.base_dir / "mariadb.log")
        self._process.wait_until(self._ping, timeout=90)
        return self

    def _ping(self) -> bool:
        with self.admin() as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")
        return True

    def admin(self, database: str | None = None, **kwargs: Any) -> pymysql.connections.Connection[Any]:
        """Root over the unix socket, autocommit on: for test DML and setup, never for the job itself."""
        return pymysql.connect(
            unix_socket=self.socket, user="root", database=database, autocommit=True, charset="utf8mb4", **kwargs
        )

    def execute(self, *statements: str, database: str | None = None) -> None:
        with self.admin(database) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def create_cdc_user(self, user: str, password: str) -> None:
        """The job's user with only the grants CDC needs (and nothing else)."""
        with self.admin() as conn, conn.cursor() as cur:
            cur.execute("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (user, password))
            cur.execute(f"GRANT {CDC_GRANTS} ON *.* TO %s@'%%'", (user,))

    def replicate_from(self, primary: MariaDBServer) -> None:
        """Become a GTID replica of `primary` from its first binlog event (set up before any data)."""
        password = secrets.token_hex(12)
        with primary.admin() as conn, conn.cursor() as cur:
            cur.execute("CREATE USER IF NOT EXISTS 'repl'@'%%' IDENTIFIED BY %s", (password,))
            cur.execute("GRANT REPLICATION SLAVE ON *.* TO 'repl'@'%'")
        with self.admin() as conn, conn.cursor() as cur:
            cur.execute(
                "CHANGE MASTER TO MASTER_HOST = %s, MASTER_PORT = %s, MASTER_USER = 'repl', MASTER_PASSWORD = %s, "
                "MASTER_USE_GTID = slave_pos",
                (primary.host, primary.port, password),
            )
            cur.execute("START SLAVE")

    def wait_for(self, primary: MariaDBServer, timeout: int = 60) -> None:
        """Wait until this replica has applied everything `primary` has written so far."""
        with primary.admin() as conn, conn.cursor() as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            (position,) = cur.fetchone()
        with self.admin() as conn, conn.cursor() as cur:
            cur.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (position, timeout))
            (waited,) = cur.fetchone()
            if waited != 0:
                cur.execute("SHOW SLAVE STATUS")
                raise ServiceStartError(f"the replica did not reach {position} in {timeout} s: {cur.fetchone()}")

    def promote(self) -> None:
        """Stop replicating and take writes: this replica is the primary now (a failover)."""
        self.execute("STOP SLAVE", "RESET SLAVE ALL")

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> MariaDBServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
