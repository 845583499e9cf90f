"""A class-data-sharing archive of the driver JVM's classes, trained once by setup.

Starting Spark loads and verifies thousands of classes, and a fresh JVM's first MERGE loads thousands
more. A dynamic CDS archive (JDK 13+) holds them already parsed and verified, mapped from one file: on the
2-core machine Spark starts in about half the time and a fresh JVM's first MERGEs finish seconds sooner
(bench/README.md, "The JVM class archive"). It applies only where the job launches its JVM itself (local
runs, the demo, the tests); under spark-submit the JVM options are the cluster's.

An archive is valid for one JVM build and one class path; the JVM checks both and runs without the archive
when they differ (its warning is switched off: nothing changes but speed). The file name carries the
PySpark version and the java binary, so an upgrade of either gets a new archive at the next setup. A
truncated archive crashes the JVM (SIGBUS), so training writes a temporary file, checks that a JVM maps it
with the same class path, and only then renames it into place.

`python -m ingest.runtime.class_archive` trains it (setup runs this): a Spark session with the job's
settings creates an Iceberg table in a temporary warehouse, appends and MERGEs Arrow batches into it, reads
a Python data source, and exits; the JVM writes the classes it loaded on its way out.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

from ingest.runtime.cache import tools_dir

log = logging.getLogger(__name__)

QUIET = "-Xlog:cds*=off"


def java_binary() -> Path | None:
    """The java PySpark launches: $JAVA_HOME/bin/java, else the one on PATH (symlinks resolved)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).is_file() else None


def archive_path() -> Path | None:
    """Where the archive for this PySpark and this java lives (None without java)."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    stat = java.stat()
    tag = hashlib.blake2b(f"{java}|{stat.st_size}|{stat.st_mtime_ns}".encode(), digest_size=6).hexdigest()
    return tools_dir() / "jvm" / f"spark-{pyspark.__version__}-{tag}.jsa"


def driver_options() -> list[str]:
    """JVM options that map the archive, or none when setup has not trained one."""
    path = archive_path()
    if path is None or not path.is_file():
        return []
    return [f"-XX:SharedArchiveFile={path}", QUIET]


def train(jit_options: str) -> Path | None:
    """Train the archive unless it exists; return its path (None without java or when training failed)."""
    path = archive_path()
    if path is None:
        log.warning("no java found: no class archive")
        return None
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob("*.partial"):  # left by a training that was killed
        stale.unlink(missing_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        class_path = _run_workload(f"{jit_options} -XX:ArchiveClassesAtExit={partial} {QUIET}")
        if not partial.is_file() or not _maps(partial, class_path):
            log.warning("the trained class archive does not map; Spark starts without one")
            return None
        partial.replace(path)
        for old in stale_archives(path):
            old.unlink(missing_ok=True)
        return path
    finally:
        partial.unlink(missing_ok=True)


def stale_archives(path: Path) -> list[Path]:
    """The archives of this PySpark built for another java: never mapped again. Those of other PySpark versions
    stay; setup trains one per virtualenv (the suite's Spark 4.1 and the compatibility subset's 4.0), and each
    virtualenv maps its own."""
    version = path.name.rsplit("-", 1)[0]
    return [old for old in path.parent.glob(f"{version}-*.jsa") if old != path]


def _maps(archive: Path, class_path: str) -> bool:
    java = java_binary()
    assert java is not None
    done = subprocess.run(
        [str(java), "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", class_path, "-version"],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def _run_workload(java_options: str) -> str:
    """Run the job's kinds of Spark work in a JVM of its own and wait until it has exited; return its class path."""
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from ingest.runtime.jars import installed_spark
    from ingest.runtime.session_conf import BASE_CONF, jar_conf
    from ingest.runtime.warm_up import start_warm_up

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="ingest-class-archive-") as base:
        builder = SparkSession.builder.master("local[2]").appName("ingest-class-archive")
        conf = {
            **BASE_CONF,
            **jar_conf(installed_spark()),
            "spark.driver.memory": "1g",
            "spark.driver.extraJavaOptions": java_options,
            "spark.sql.catalog.train": "org.apache.iceberg.spark.SparkCatalog",
            "spark.sql.catalog.train.type": "jdbc",
            "spark.sql.catalog.train.uri": f"jdbc:sqlite:{base}/catalog.db",
            "spark.sql.catalog.train.warehouse": f"file://{base}/warehouse",
        }
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        class_path = str(jvm.System.getProperty("java.class.path"))
        start_warm_up(spark, read=True).join()  # the Python data source path of the snapshot
        spark.sql("CREATE NAMESPACE IF NOT EXISTS train.n")
        spark.sql(
            "CREATE TABLE train.n.t (id BIGINT NOT NULL, s STRING, d DECIMAL(12,2), ts TIMESTAMP, b BINARY, "
            "__op STRING) USING iceberg TBLPROPERTIES ('format-version' = '2', 'write.delete.mode' = "
            "'merge-on-read', 'write.update.mode' = 'merge-on-read', 'write.merge.mode' = 'merge-on-read')"
        )
        for offset in (0, 500, 1000):  # an append, then MERGEs that update, delete and insert
            spark.createDataFrame(_batch(pa, offset, 1000)).createOrReplaceTempView("batch")
            if offset == 0:
                spark.sql("INSERT INTO train.n.t SELECT * FROM batch")
                continue
            spark.sql(
                "MERGE INTO train.n.t t USING batch s ON t.id = s.id "
                "WHEN MATCHED AND s.__op = 'D' THEN DELETE WHEN MATCHED THEN UPDATE SET * "
                "WHEN NOT MATCHED AND s.__op = 'U' THEN INSERT *"
            )
        spark.sql("SELECT count(*), max(ts) FROM train.n.t").collect()
        spark.sql("SELECT snapshot_id, summary FROM train.n.t.snapshots").collect()
        process = _gateway_process(spark)
        spark.stop()
        # PySpark's JVM exits when its stdin closes; the archive is written on the way out.
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=600)
    return class_path


def _gateway_process(spark: Any) -> subprocess.Popen[bytes]:
    return spark.sparkContext._gateway.proc  # type: ignore[no-any-return]


def _batch(pa: Any, offset: int, rows: int) -> Any:
    ids = range(offset, offset + rows)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "s": pa.array([f"row {i}" for i in ids]),
            "d": pa.array([Decimal(i) / 4 for i in ids], pa.decimal128(12, 2)),
            "ts": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC)] * rows, pa.timestamp("us", tz="UTC")),
            "b": pa.array([i.to_bytes(4, "big") for i in ids], pa.binary()),
            "__op": pa.array(["D" if i % 7 == 0 else "U" for i in ids]),
        }
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from ingest.runtime.session_conf import JIT

    trained = train(JIT)
    print(f"class archive: {trained if trained is not None else 'none (Spark starts without one)'}")
    sys.exit(0)
