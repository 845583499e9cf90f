"""The Spark settings every session of the job starts from, whoever builds it: the job (ingest.runtime.spark),
the class-archive trainer (ingest.runtime.class_archive) and the tests. Below both, so neither imports the other
for them."""

from __future__ import annotations

import logging

from ingest.runtime.jars import local_jars, maven_packages

log = logging.getLogger(__name__)

BASE_CONF = {
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
    # Every batch the job MERGEs or appends is a DataFrame made on the driver from Arrow (a local relation). This
    # optimizer rule evaluates the projections over such a relation row by row, interpreted, while the statement
    # is planned (more than once for a MERGE); left to execution they run as generated code. Measured on 2 cores:
    # MERGE of 50,000 changes 1.01-1.06 s -> 0.64-0.73 s, catch-up of 204,000 changes 9.1 s -> 7.8 s.
    "spark.sql.optimizer.excludedRules": "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation",
    # A MERGE reads only the target's rows of the batch's keys (ingest/sink/pruning.py): for a batch of many keys
    # Spark builds a Bloom filter of them at run time and drops the target's other rows right after its scan, before
    # the join's shuffle (InjectRuntimeFilter). Spark does that only for a join it expects to shuffle, and it
    # expects to broadcast any side smaller than autoBroadcastJoinThreshold, although a MERGE's right outer join
    # cannot broadcast its batch; the job's sessions run no other joins. Measured (bench/apply.py, 20,000 changes
    # spread over a table of 20 M rows, v2): 23.3 s without the pruning of issue 31, 7.9 s with it.
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.sql.optimizer.runtime.bloomFilter.applicationSideScanSizeThreshold": "64MB",
    "spark.sql.optimizer.runtime.bloomFilter.creationSideThreshold": "1GB",
    # Spark forks each of the job's Python workers (the snapshot's tasks, the reads of the query's source) from a
    # daemon; this one has imported the modules they all import (ingest/runtime/daemon.py). Measured (bench.snapshot,
    # 1 M rows, p=2): the Python processes' CPU 7.6 -> 6.5 s.
    "spark.python.daemon.module": "ingest.runtime.daemon",
}

JIT = "-XX:TieredStopAtLevel=1"
"""C1 only (see ingest.runtime.spark.launch_conf)."""


def jar_conf(spark_version: str) -> dict[str, str]:
    """Local jars when setup fetched them, else Maven coordinates that Spark resolves itself."""
    jars = local_jars(spark_version)
    if jars is not None:
        return {"spark.jars": ",".join(str(p) for p in jars)}
    log.info("Iceberg jars not in the local cache; Spark will resolve them from Maven")
    return {"spark.jars.packages": maven_packages(spark_version)}
