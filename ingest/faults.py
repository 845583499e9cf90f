"""Named crash points, so tests can kill the job exactly where exactly-once could break.

`INGEST_CRASH_AT=<point>` (or `<point>:<n>` for the n-th time it is reached in one process) makes the
job SIGKILL its whole process group there: driver, JVM and Python workers die at once, as in a
`kill -9` or a lost node. Unset, a crash point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV = "INGEST_CRASH_AT"
# Spark's Python worker daemon runs in a process group of its own; executors kill the job's group.
JOB_GROUP_ENV = "INGEST_JOB_PGID"
_reached: Counter[str] = Counter()


def mark_job_process_group() -> None:
    """Called by entry points before Spark starts, so that workers inherit the job's process group."""
    os.environ.setdefault(JOB_GROUP_ENV, str(os.getpgid(0)))


def crash_point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    _reached[name] += 1
    if _reached[name] == int(nth or 1):
        os.killpg(int(os.environ.get(JOB_GROUP_ENV, os.getpgid(0))), signal.SIGKILL)
