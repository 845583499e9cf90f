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


def start_warm_up(spark: Any) -> threading.Thread:
    """Read an empty Python data source on a thread, so the Python processes a chunk read needs (data
    source lookup, creation, planning, the worker; each a daemon that imports pyspark, then this
    package) start while the driver creates the target and plans chunks, not after."""

    def warm() -> None:
        try:
            if spark not in _REGISTERED:
                spark.dataSource.register(_warm_up_source())
                _REGISTERED.add(spark)
            spark.read.format("ingest_warm_up").load().collect()
        except Exception as e:  # noqa: BLE001 - only a head start; the real read reports real errors
            log.debug("warm-up read failed: %s", e)

    thread = threading.Thread(target=warm, name="ingest-warm-up", daemon=True)
    thread.start()
    return thread
