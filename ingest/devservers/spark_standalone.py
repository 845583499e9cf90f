"""A Spark standalone cluster on this machine: one master and N workers, each a JVM of its own, started from
the installed Spark (PySpark's `bin/spark-class`) on free ports and stopped afterwards.

It is the smallest real cluster manager: executors are granted by the master, run in the workers' JVMs with
their own working directories, and get the application's files and archives the way YARN or Kubernetes
would give them. `spark-submit --master spark://...` against it runs the job as `infra/README.md` tells a
user with a cluster of their own.
"""

from __future__ import annotations

import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from ingest.devservers.process import LocalService, ServerProcess, free_port
from ingest.errors import ServiceStartError


def spark_home() -> Path:
    """The Spark installation PySpark brings (its `bin/spark-class`, `bin/spark-submit`, `jars/`)."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise ServiceStartError(f"no bin/spark-class under {home}: PySpark is not installed from its pip package")
    return home


class SparkStandalone(LocalService):
    """`with SparkStandalone(workers=2) as cluster:` then `spark-submit --master cluster.url`."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g", base: Path | None = None) -> None:
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self._tmp = None if base is not None else tempfile.TemporaryDirectory(prefix="ingest-spark-standalone-")
        self.base = base if base is not None else Path(self._tmp.name)  # type: ignore[union-attr]
        self.base.mkdir(parents=True, exist_ok=True)
        self.host = "127.0.0.1"
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://{self.host}:{self.port}"
        self._processes: list[ServerProcess] = []

    def work_dir(self, worker: int) -> Path:
        """Where worker `worker` (0-based) keeps each application's executor directories and logs."""
        return self.base / f"worker-{worker}"

    def _env(self) -> dict[str, str]:
        # Everything on the loopback interface; daemons log to their own files, not to the caller's terminal.
        return {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": self.host,
            "SPARK_LOG_DIR": str(self.base / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
        }

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's JSON): workers, cores, running and completed applications."""
        with urllib.request.urlopen(f"http://{self.host}:{self.ui_port}/json/", timeout=5) as reply:
            return dict(json.load(reply))

    def alive_workers(self) -> int:
        return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")

    def start(self) -> SparkStandalone:
        spark_class = str(spark_home() / "bin" / "spark-class")
        master = ServerProcess(
            "spark master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ],
            self.base / "master.log",
            env=self._env(),
        )
        self._processes.append(master)
        master.wait_until(lambda: "workers" in self.state(), timeout=90)
        for n in range(self.workers):
            self.work_dir(n).mkdir(parents=True, exist_ok=True)
            worker = ServerProcess(
                f"spark worker {n}",
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    self.host,
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    str(self.work_dir(n)),
                    self.url,
                ],
                self.base / f"worker-{n}.log",
                env=self._env(),
            )
            self._processes.append(worker)
        master.wait_until(lambda: self.alive_workers() == self.workers, timeout=90)
        return self

    def stop(self) -> None:
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
