"""Spark's Python daemon with the job's executor-side modules imported before it forks a worker.

Spark forks each Python worker (the snapshot's tasks, the reads of the query's source) from a daemon. A forked
worker then imports what the job's pickled functions name (the chunk reader, the binlog source, pyarrow,
pyiceberg): about 0.6 CPU-s in each. Imported here, in the daemon, once, every fork inherits them. (A data source's
creation and planning run in processes forked from daemons of Spark's own, which `spark.python.daemon.module`
does not name.)

`spark.python.daemon.module` names this module (ingest/runtime/session_conf.py); it runs where the job's package is
installed, as it is wherever the job's Python runs (the packed environment of infra/README.md).
"""

from __future__ import annotations

import importlib
import logging

PRELOADED = (
    "pyarrow",
    "ingest.source.snapshot.snapshot_source",
    "ingest.query.binlog_source",
    "ingest.sink.data_files",
    "pyiceberg.io.pyarrow",
)


def preload() -> None:
    """Import `PRELOADED`; one that fails is left to the worker that needs it (which then says why)."""
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - a head start only
            logging.getLogger(__name__).debug("not preloaded: %s: %s", name, e)


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager  # reads the worker module from argv, as Spark launched it

    manager()  # type: ignore[no-untyped-call]
