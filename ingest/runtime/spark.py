"""Building (or joining) the Spark session with the Iceberg runtime and the sink catalog."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from ingest.config import PipelineConfig
from ingest.runtime.class_archive import driver_options
from ingest.runtime.jars import REQUIRED_JARS, local_jars
from ingest.sink.catalog import spark_catalog_conf

log = logging.getLogger(__name__)

_BASE_CONF = {
    "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
    # All timestamps are handled in UTC; the source's TIMESTAMP columns are read with time_zone '+00:00'.
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # A streaming job runs thousands of small SQL executions; Spark's status store would keep them all.
    "spark.sql.ui.retainedExecutions": "20",
    "spark.ui.retainedJobs": "50",
    "spark.ui.retainedStages": "50",
    "spark.ui.retainedTasks": "2000",
    "spark.sql.ui.retainedQueryExecutions": "20",
    # Snapshot sources declare every column nullable (marker rows carry no data); keys are checked
    # NOT NULL when the rows are converted, before they reach Spark.
    "spark.sql.iceberg.check-nullability": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}

JIT = "-XX:TieredStopAtLevel=1"


def launch_conf() -> dict[str, str]:
    """JVM options for when the job launches the JVM itself (no spark-submit); spark.conf in the pipeline file
    overrides them.

    HotSpot compiles with C1 only: the job's JVM runs many short, different query plans; C2 kept recompiling
    them on one of the two cores and cost more than it gave back (bench/README.md, "JIT"). The driver also
    maps the class archive setup trained, when there is one (`ingest.runtime.class_archive`).
    """
    return {
        "spark.driver.extraJavaOptions": " ".join([JIT, *driver_options()]),
        "spark.executor.extraJavaOptions": JIT,
    }


def jar_conf() -> dict[str, str]:
    """Local jars when setup fetched them, else Maven coordinates that Spark resolves itself."""
    jars = local_jars()
    if jars is not None:
        return {"spark.jars": ",".join(str(p) for p in jars)}
    log.info("Iceberg jars not in the local cache; Spark will resolve them from Maven")
    return {"spark.jars.packages": ",".join(j.coordinate for j in REQUIRED_JARS)}


def spark_session(config: PipelineConfig, app_name: str | None = None, extra: dict[str, str] | None = None) -> Any:
    """The session for this pipeline. Under spark-submit, jars and master come from spark-submit."""
    from pyspark.sql import SparkSession

    under_submit = "SPARK_SUBMIT" in os.environ or os.environ.get("PYSPARK_GATEWAY_PORT") is not None
    builder = SparkSession.builder.appName(app_name or f"ingest-{config.name}")
    conf: dict[str, str] = dict(_BASE_CONF)
    if not under_submit:
        # Python workers must run the interpreter that has this package and its dependencies.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.master(config.spark.master)
        conf.update(jar_conf())
        conf.update(launch_conf())
        conf.setdefault("spark.driver.memory", "2g")
    plain, secret = spark_catalog_conf(config.sink)
    conf.update(plain)
    conf.update(config.spark.conf)
    conf.update(extra or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    return attach_catalog(builder.getOrCreate(), config)


def attach_catalog(session: Any, config: PipelineConfig) -> Any:
    """Register the sink catalog on a running session; Iceberg reads these settings on first use."""
    plain, secret = spark_catalog_conf(config.sink)
    for key, value in {**plain, **secret}.items():
        session.conf.set(key, value)
    return session
