"""The "bring your own cluster" path of infra/README.md, on a real cluster manager: a Spark standalone master
and two workers (JVMs of their own, from the installed Spark), the artifacts built by `infra/package.sh`, and
`spark-submit --master spark://...` as the README writes it, on the S3 profile (MinIO + the PostgreSQL
catalog). Nothing of the checkout reaches the job but its entry point: the driver and the executors run
the packed environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.config import parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.devservers.minio import MinioServer
from ingest.devservers.postgres import PostgresServer
from ingest.devservers.spark_standalone import SparkStandalone, spark_home
from ingest.runtime.jars import installed_spark, maven_packages
from ingest.state.table import StateTable
from tests.conftest import minio_sink, run_ingest, source_section

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# What the test's own process puts in the environment for local Spark sessions; a submitted job must not
# pick up the checkout or the test's interpreter through them.
NOT_INHERITED = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "SPARK_HOME")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`infra/package.sh`, built with the interpreter the nodes (this machine) have."""
    out = tmp_path_factory.mktemp("dist")
    python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    build_dir_before = (ROOT / "build").exists()
    built = subprocess.run(
        [str(ROOT / "infra" / "package.sh")],
        env={**{k: v for k, v in os.environ.items() if k not in NOT_INHERITED}, "OUT": str(out), "PYTHON": str(python)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert (out / "ingest-env.tar.gz").is_file()
    # The binlog reader's hot path is compiled into the packed environment (ingest/runtime/compiled.py).
    assert "binlog reader: compiled" in built.stdout, built.stdout[-3000:] + built.stderr[-3000:]
    # It builds from a copy: the checkout it packages gets no setuptools build/ directory (nor is written at all).
    assert (ROOT / "build").exists() == build_dir_before
    return out


def _submit_dir(path: Path, artifacts: Path, config_file: Path) -> Path:
    """A directory to submit from, as infra/README.md sets one up for client deploy mode: the pipeline file,
    and the packed environment unpacked as ./environment, the same relative path the executors get from
    --archives (Spark runs the Python data sources' planning on the driver with spark.pyspark.python)."""
    path.mkdir()
    (path / "pipeline.yaml").write_text(config_file.read_text())
    (path / "environment").mkdir()
    subprocess.run(["tar", "-xzf", str(artifacts / "ingest-env.tar.gz"), "-C", str(path / "environment")], check=True)
    return path


def _submit(cluster: SparkStandalone, artifacts: Path, workdir: Path) -> str:
    """One `spark-submit` of the job from `workdir` (see `_submit_dir`); its output."""
    argv = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master", cluster.url,
        "--archives", f"{artifacts / 'ingest-env.tar.gz'}#environment",
        "--conf", "spark.pyspark.python=./environment/bin/python",
        "--conf", "spark.executor.cores=1",
        "--conf", "spark.cores.max=2",
        "--conf", "spark.executor.memory=1g",
        "--packages", maven_packages(installed_spark()),
        str(ROOT / "jobs" / "ingest_job.py"), "--config", "pipeline.yaml", "--until-caught-up",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=900, check=False)
    output = done.stdout + done.stderr
    (workdir / "spark-submit.log").write_text(output)
    telling = [line for line in output.splitlines() if " INFO " not in line and not line.startswith("\tat ")]
    assert done.returncode == 0, f"{workdir / 'spark-submit.log'}:\n" + "\n".join(telling[-60:])
    return output


def _executors(cluster: SparkStandalone, worker: int) -> list[Path]:
    """The working directory of every executor this worker ran, for every application."""
    return sorted(p.parent for p in cluster.work_dir(worker).glob("app-*/*/stderr"))


def _verify(config_file: Path) -> None:
    checked = run_ingest("verify", "--config", str(config_file))
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]


@pytest.fixture
def pipeline(mariadb: MariaDBServer, minio: MinioServer, postgres: PostgresServer, tmp_path: Path) -> Iterator[Any]:
    mariadb.execute(
        "DROP DATABASE IF EXISTS byoc",
        "CREATE DATABASE byoc",
        "CREATE TABLE byoc.orders (id BIGINT UNSIGNED PRIMARY KEY, customer VARCHAR(20) NOT NULL, "
        "total DECIMAL(12,2), placed DATETIME(3) NOT NULL)",
        "INSERT INTO byoc.orders SELECT seq, CONCAT('c', seq % 37), seq / 7, "
        "TIMESTAMP('2026-01-01') + INTERVAL seq MINUTE FROM byoc.seq_1_to_3000",
    )
    data = {
        "name": "byoc",
        "source": source_section(mariadb),
        "tables": {"include": [r"byoc\..*"]},
        "sink": {**minio_sink(minio, postgres, minio.bucket("byoc")), "state_table": "ingest_meta.state_byoc"},
        "snapshot": {"chunk_size": 250, "parallelism": 2, "chunks_per_commit": 4},
    }
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(data))
    yield parse_config(data), config_file


def test_spark_submit_to_a_standalone_cluster_snapshots_on_both_workers_then_resumes_from_iceberg_alone(
    artifacts: Path, pipeline: Any, mariadb: MariaDBServer, tmp_path: Path
) -> None:
    config, config_file = pipeline
    first = _submit_dir(tmp_path / "submit-1", artifacts, config_file)
    with SparkStandalone(workers=2, cores=1, memory="1g", base=tmp_path / "cluster") as cluster:
        _submit(cluster, artifacts, first)
        apps = cluster.state()["completedapps"]
        executors = [_executors(cluster, n) for n in (0, 1)]
        for n, worker in enumerate(executors):  # executors on both workers, each ran tasks of the job
            assert worker, f"worker {n} ran no executor"
            assert any("Finished task" in (e / "stderr").read_text(errors="replace") for e in worker), f"worker {n}"
            # ... with the packed environment the archive brought into its own working directory
            assert all((e / "environment" / "bin" / "python").exists() for e in worker)
        assert len(apps) == 1 and apps[0]["state"] == "FINISHED", apps
        _verify(config_file)
        state = StateTable.open(config.sink, config.name)
        assert set(state.times_recorded("byoc.orders").values()) == {1}
        assert sum(r.row_count for r in state.done("byoc.orders").values()) == 3000

        with mariadb.admin() as conn, conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("UPDATE byoc.orders SET total = NULL WHERE id % 10 = 0")
            cur.execute("UPDATE byoc.orders SET id = id + 100000 WHERE id BETWEEN 100 AND 120")  # key moves
            cur.execute("DELETE FROM byoc.orders WHERE id BETWEEN 500 AND 540")
            cur.execute("COMMIT")
            cur.execute("INSERT INTO byoc.orders VALUES (510, 'back', 1.5, '2026-06-01 00:00:00.123')")
        # A new application (its own driver and executors) from a new working directory: nothing of the first run
        # is left to it but Iceberg. The cluster's daemons hold no state of the job's.
        second = _submit_dir(tmp_path / "submit-2", artifacts, config_file)
        _submit(cluster, artifacts, second)
        assert [a["state"] for a in cluster.state()["completedapps"]] == ["FINISHED", "FINISHED"]
    _verify(config_file)
    state = StateTable.open(config.sink, config.name)
    assert set(state.times_recorded("byoc.orders").values()) == {1}, "a chunk was read again"
    offset = state.stream_offset()
    assert offset is not None  # the binlog phase committed the changes above
