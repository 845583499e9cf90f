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
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ingest.model.position import BinlogPosition, MariadbGtidPos

_POLL_SECONDS = 0.2
_TICK_SECONDS = 1.0
_GROUP_ITEMS = 4096
"""A group is handed over at this many items at the latest (a catch-up reads without waiting)."""


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
    """Items of `reader.transactions(idle=..., waiting=...)`, produced on a thread, in order.

    The items are handed over in groups: what the reader gathers while the server's bytes are at hand goes over
    at once when the reader is about to wait for more (`waiting`), at an idle report, and when the consumer would
    be `max_changes` behind with it.
    At a steady load of small transactions a handover per transaction (a lock, a wake-up of the consumer, the GIL
    passed back and forth) cost as much as reading the transaction (bench.steady).

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
        self._queue: queue.SimpleQueue[tuple[list[Any], int]] = queue.SimpleQueue()
        """Groups of items handed over, each with its row changes."""
        self._group: list[Any] = []
        self._group_changes = 0
        """The reading thread's items not yet handed over, and their row changes."""
        self._taken: deque[Any] = deque()
        """The consumer's: items of the groups it took, not yet returned."""
        self._handed = self._took = 0
        """Row changes handed over (written by the reading thread only) and taken (by the consumer only)."""
        self._room = threading.Condition()
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._thread = threading.Thread(target=self._run, name="binlog-prefetch", daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self.poll(_TICK_SECONDS)
            if item is None:
                yield Tick()
                continue
            yield item
            if isinstance(item, End):
                return

    def poll(self, timeout: float = 0.0) -> Any | None:
        """The next item, waiting for one at most `timeout` seconds; None when none came (a Spark source hands
        over what is ready)."""
        if not self._taken:
            try:
                group, changes = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                return None
            self._taken.extend(group)
            if changes:
                with self._room:
                    self._took += changes
                    self._room.notify_all()
        item = self._taken.popleft()
        if isinstance(item, Failed):
            raise item.error
        return item

    def has_ready(self) -> bool:
        """Whether an item is waiting to be taken right now (the consumer can take it without waiting)."""
        return bool(self._taken) or not self._queue.empty()

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
        if self._group or self._queue.empty():
            reader = self._reader
            self._group.append(Idle(reader.position, at, reader.gtid, reader.idle_at_end))
            self._hand_over()
        return self._stop.is_set()

    def _hand_over(self) -> None:
        """Hand the group over once the consumer is less than `max_changes` behind (a group of any size fits when
        it is not); nothing when the consumer is gone."""
        if not self._group:
            return
        with self._room:
            while self._handed - self._took >= self._max and not self._stop.is_set():
                self._room.wait(timeout=_POLL_SECONDS)
        if self._stop.is_set():
            return
        self._handed += self._group_changes
        self._queue.put((self._group, self._group_changes))
        self._group, self._group_changes = [], 0

    def _run(self) -> None:
        try:
            for item in self._reader.transactions(idle=self._idle, waiting=self._hand_over):
                self._group.append(item)
                self._group_changes += self._size_of(item)
                if self._pause_after(item):
                    self._hand_over()
                    self._resume.wait()
                    self._resume.clear()
                elif self._group_changes + self._handed - self._took >= self._max or len(self._group) >= _GROUP_ITEMS:
                    self._hand_over()  # (gathered and handed over together, at most `max_changes` and an item ahead)
                if self._stop.is_set():
                    return
            last: Any = End(self._reader.position, self._reader.gtid)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it in its own thread
            last = Failed(e, self._reader.position)
        self._group.append(last)
        self._hand_over()
