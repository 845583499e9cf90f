"""A head start for Spark's Python processes: an empty Python data source read on a thread."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Sessions the warm-up source is registered on: once each (Spark warns when a name is registered again, as a
process that runs pipelines in turn would)."""


def _warm_up_source() -> Any:
    from pyspark.sql.datasource import DataSource, DataSourceReader

    class WarmUpReader(DataSourceReader):
        def read(self, partition: Any) -> Iterator[Any]:
            return iter(())

    class WarmUpSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "ingest_warm_up"

        def schema(self) -> str:
            return "x INT"

        def reader(self, schema: Any) -> Any:
            return WarmUpReader()

    return WarmUpSource


def start_warm_up(spark: Any, read: bool = False) -> threading.Thread:
    """Plan a read of an empty Python data source on a thread (`read`: run it too), so the Python processes every
    run needs on the driver (data source lookup, creation, planning; each a daemon that imports pyspark) start,
    and leave a worker each for the job's own source, while the driver opens the state and plans the tables, not
    after. Tasks on executors need the job's own daemon: `start_executor_warm_up`."""

    def warm() -> None:
        try:
            if spark not in _REGISTERED:
                spark.dataSource.register(_warm_up_source())
                _REGISTERED.add(spark)
            frame = spark.read.format("ingest_warm_up").load()
            if read:
                frame.collect()
            else:
                frame._jdf.queryExecution().toRdd().getNumPartitions()  # plans: the partitions, no task
        except Exception as e:  # noqa: BLE001 - only a head start; the real read reports real errors
            log.debug("warm-up read failed: %s", e)

    return _started(warm)


def start_executor_warm_up(spark: Any) -> threading.Thread:
    """Run one task of nothing on a thread: it starts the job's Python daemon, which imports the executor-side
    modules as it starts (`ingest.runtime.daemon`, about 2 CPU-s), before the first chunk is read. A run that
    reads no chunks needs no Python on the executors (a binlog batch reaches the sink from Spark's cache)."""

    def warm() -> None:
        try:
            spark.sparkContext.parallelize([0], 1).map(_nothing).count()
        except Exception as e:  # noqa: BLE001 - only a head start
            log.debug("executor warm-up failed: %s", e)

    return _started(warm)


def _started(warm: Any) -> threading.Thread:
    thread = threading.Thread(target=warm, name="ingest-warm-up", daemon=True)
    thread.start()
    return thread


def _nothing(value: int) -> int:
    return value
