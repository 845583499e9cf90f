"""Named crash points, so tests can kill the job exactly where exactly-once could break.

`INGEST_CRASH_AT=<point>` (or `<point>:<n>` for the n-th time it is reached in one process) makes the
job SIGKILL its whole process group there: driver, JVM and Python workers die at once, as in a
`kill -9` or a lost node. `INGEST_FAIL_AT=<point>[:<n>]` raises `InjectedFailure` there instead: an
error inside the job after everything before the point succeeded (a commit whose outcome the job never
learns), which the job's own error handling must survive. Unset, a point costs two dictionary lookups.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

from ingest.errors import TransientError

ENV = "INGEST_CRASH_AT"
FAIL_ENV = "INGEST_FAIL_AT"
# Spark's Python worker daemon runs in a process group of its own; executors kill the job's group.
JOB_GROUP_ENV = "INGEST_JOB_PGID"
_reached: Counter[str] = Counter()


def mark_job_process_group() -> None:
    """Called by entry points before Spark starts, so that workers inherit the job's process group."""
    os.environ.setdefault(JOB_GROUP_ENV, str(os.getpgid(0)))


class InjectedFailure(TransientError):
    """Raised at a named point by `INGEST_FAIL_AT`."""


def reset() -> None:
    """Forget how often each point was reached (tests that run the job more than once in one process)."""
    _reached.clear()


def crash_point(name: str) -> None:
    for env in (ENV, FAIL_ENV):
        spec = os.environ.get(env)
        if not spec:
            continue
        point, _, nth = spec.partition(":")
        if point != name:
            continue
        _reached[f"{env}:{name}"] += 1
        if _reached[f"{env}:{name}"] != int(nth or 1):
            continue
        if env == FAIL_ENV:
            raise InjectedFailure(f"injected failure at {name}")
        os.killpg(int(os.environ.get(JOB_GROUP_ENV, os.getpgid(0))), signal.SIGKILL)
