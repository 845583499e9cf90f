"""Reading the binlog on a thread of its own while the driver commits the previous batch.

Parsing row events is Python work; a MERGE is mostly the driver waiting on the JVM. Overlapping them
lets one core parse while the other merges. The reader runs at most `max_changes` row changes ahead,
so memory stays bounded, and every item carries the binlog position the consumer has reached once
it has taken that item: the consumer commits at positions of items it has taken, never at the
reader's own position, which may be ahead (committing that would skip transactions still queued).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ingest.model.position import BinlogPosition, MariadbGtidPos

_POLL_SECONDS = 0.2
_TICK_SECONDS = 1.0


@dataclass(frozen=True)
class Idle:
    """Every change of the captured tables up to `position` has been handed over, and `position` is current
    to the source's time `at` (epoch seconds): now at a heartbeat, or the commit time of another table's
    transaction ending there."""

    position: BinlogPosition
    at: float
    gtid: MariadbGtidPos | None = None
    at_end: bool = False
    """At a heartbeat: the server had sent everything it had written, and all of it is read. Events after
    `position` that end no transaction (a MariaDB binlog checkpoint, say) may lie between it and the binlog's end."""


@dataclass(frozen=True)
class Tick:
    """Nothing arrived for a while (a busy binlog of other tables sends no heartbeats): look at the stop flag."""


@dataclass(frozen=True)
class End:
    """The reader stopped (end of binlog in catch-up mode, or asked to stop) at `position`."""

    position: BinlogPosition
    gtid: MariadbGtidPos | None = None


@dataclass(frozen=True)
class Failed:
    """The reader raised; everything before `position` has been handed over."""

    error: BaseException
    position: BinlogPosition


class Prefetch:
    """Items of `reader.transactions(idle=...)`, produced on a thread, in order.

    `pause_after(item)` makes the reader wait after handing `item` over until `resume()` (a DDL: rows after
    it must be decoded with the schema the consumer installs). `close()` stops the thread.
    """

    def __init__(
        self,
        reader: Any,
        max_changes: int,
        size_of: Callable[[Any], int],
        pause_after: Callable[[Any], bool] = lambda item: False,
    ) -> None:
        self._reader = reader
        self._max = max(1, max_changes)
        self._size_of = size_of
        self._pause_after = pause_after
        self._queue: queue.Queue[Any] = queue.Queue()
        self._ahead = 0
        """Row changes handed over but not yet taken by the consumer."""
        self._room = threading.Condition()
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._thread = threading.Thread(target=self._run, name="binlog-prefetch", daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[Any]:
        while True:
            try:
                item = self._queue.get(timeout=_TICK_SECONDS)
            except queue.Empty:
                yield Tick()
                continue
            yield self._taken(item)
            if isinstance(item, End):
                return

    def poll(self, timeout: float = 0.0) -> Any | None:
        """The next item, waiting for one at most `timeout` seconds; None when none came (a Spark source hands
        over what is ready)."""
        try:
            item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None
        return self._taken(item)

    def _taken(self, item: Any) -> Any:
        if isinstance(item, Failed):
            raise item.error
        if not isinstance(item, Idle | End):
            with self._room:
                self._ahead -= self._size_of(item)
                self._room.notify_all()
        return item

    def has_ready(self) -> bool:
        """Whether an item is waiting to be taken right now (the consumer can take it without waiting)."""
        return not self._queue.empty()

    def resume(self) -> None:
        self._resume.set()

    def close(self) -> None:
        self._stop.set()
        self._resume.set()
        interrupt = getattr(self._reader, "interrupt", None)
        if interrupt is not None:  # a reader waiting to reconnect stops waiting
            interrupt()
        with self._room:
            self._room.notify_all()
        self._thread.join(timeout=30)

    def _idle(self, at: float) -> bool:
        if self._queue.empty():
            self._queue.put(Idle(self._reader.position, at, self._reader.gtid, self._reader.idle_at_end))
        return self._stop.is_set()

    def _wait_for_room(self) -> bool:
        """Wait until the consumer is less than `max_changes` behind; one item of any size fits when none is."""
        with self._room:
            while self._ahead >= self._max and not self._stop.is_set():
                self._room.wait(timeout=_POLL_SECONDS)
        return not self._stop.is_set()

    def _run(self) -> None:
        try:
            for item in self._reader.transactions(idle=self._idle):
                if not self._wait_for_room():
                    return  # the consumer is gone: hand nothing more over
                with self._room:
                    self._ahead += self._size_of(item)
                self._queue.put(item)
                if self._pause_after(item):
                    self._resume.wait()
                    self._resume.clear()
                if self._stop.is_set():
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it in its own thread
            self._queue.put(Failed(e, self._reader.position))
            return
        self._queue.put(End(self._reader.position, self._reader.gtid))
