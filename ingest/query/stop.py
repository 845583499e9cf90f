"""How the job stops when asked (SIGTERM, SIGINT): after the current commit, never inside a batch, once what the
source held at the signal is read or a grace period has passed."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from ingest.model.position import BinlogPosition

log = logging.getLogger(__name__)


class StopSignal:
    """SIGTERM/SIGINT ask for a stop after the current commit (graceful, never mid-batch)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, lambda *_: self.event.set())

    def uninstall(self) -> None:
        """Give the process its own handlers back (the job may run inside a longer-lived process)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


STOP_GRACE_SECONDS = 10.0
"""How long a stop (SIGTERM) waits at most for the reader to catch up before the last commit."""


class StopPoint:
    """Where a stop asked by SIGTERM ends.

    At the first look after the signal the source's position is read: the stop comes once everything up to it
    is taken (a transaction or an idle heartbeat at or past it), and at the latest STOP_GRACE_SECONDS later,
    so that a job far behind does not hold the stop up.
    """

    def __init__(self, source_position: Callable[[], BinlogPosition]) -> None:
        self.deadline = time.monotonic() + STOP_GRACE_SECONDS
        self.position: BinlogPosition | None = None
        try:
            self.position = source_position()
            log.info("asked to stop: reading up to %s, the source's position now", self.position)
        except Exception as e:  # noqa: BLE001 - the source being gone must not turn a stop into a failure
            log.warning("asked to stop; cannot read the source's position (%s)", e)

    def reached(self, taken: BinlogPosition) -> bool:
        if self.position is not None and taken >= self.position:
            log.info("stopping: everything up to %s is read", self.position)
            return True
        if time.monotonic() >= self.deadline:
            log.info("stopping: %.0f s after the signal, before reaching %s", STOP_GRACE_SECONDS, self.position)
            return True
        return False
