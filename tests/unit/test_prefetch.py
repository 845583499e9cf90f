"""The binlog prefetch thread: order, bounded read-ahead, positions the consumer may commit at, errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ingest.model.position import BinlogPosition
from ingest.source.binlog.prefetch import End, Idle, Prefetch


def pos(n: int) -> BinlogPosition:
    return BinlogPosition("mysql-bin.000001", n)


class FakeReader:
    """Yields ("tx", n, size) items; `script` entries "idle" call the idle callback, "wait" the waiting callback
    and then wait for `go`; exceptions are raised."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.position = pos(4)
        self.gtid = None
        self.idle_at_end = False
        self.read = 0
        self.go = threading.Event()

    def transactions(
        self, idle: Callable[[float], bool] | None = None, waiting: Callable[[], None] | None = None
    ) -> Iterator[Any]:
        for entry in self.script:
            if entry == "wait":
                if waiting is not None:
                    waiting()
                self.go.wait(10)
                continue
            if entry == "idle":
                if idle is not None and idle(1234.5):
                    return
                continue
            if isinstance(entry, BaseException):
                raise entry
            self.read += 1
            self.position = pos(entry[1])
            yield entry


def size(item: Any) -> int:
    return int(item[2])


def test_items_arrive_in_order_then_end_at_the_last_position() -> None:
    reader = FakeReader([("tx", 10, 1), ("tx", 20, 3), "idle", ("tx", 30, 2)])
    items = list(Prefetch(reader, 100, size))
    txs = [i for i in items if isinstance(i, tuple)]
    assert [t[1] for t in txs] == [10, 20, 30]
    assert items[-1] == End(pos(30))
    idles = [i for i in items if isinstance(i, Idle)]
    assert all(i.position == pos(20) and i.at == 1234.5 for i in idles)


def test_the_reader_stays_at_most_max_changes_ahead() -> None:
    reader = FakeReader([("tx", 10 * i, 5) for i in range(1, 21)])
    prefetch = Prefetch(reader, 10, size)
    it = iter(prefetch)
    first = next(it)
    time.sleep(0.5)  # give the thread every chance to run ahead
    # Handed over in groups of up to 10 changes ahead of the consumer: the first group (2 items) taken, the
    # second (2 items, 10 changes ahead) not taken, and one more item read, waiting for room.
    assert first[1] == 10
    assert reader.read == 2 + 2 + 1
    rest = [i for i in it if isinstance(i, tuple)]
    assert len(rest) == 19
    prefetch.close()


def test_what_is_read_before_the_reader_waits_is_handed_over_before_the_wait() -> None:
    """Items go over in groups, but none is held while the reader waits for the server: a batch due meanwhile
    has them."""
    reader = FakeReader([("tx", 10, 1), ("tx", 20, 1), "wait", ("tx", 30, 1)])
    prefetch = Prefetch(reader, 100, size)
    assert prefetch.poll(5.0) == ("tx", 10, 1)
    assert prefetch.poll(5.0) == ("tx", 20, 1)
    assert prefetch.poll(0.2) is None  # the reader waits
    reader.go.set()
    assert prefetch.poll(5.0) == ("tx", 30, 1)
    assert prefetch.poll(5.0) == End(pos(30))
    prefetch.close()


def test_an_oversized_transaction_still_passes() -> None:
    reader = FakeReader([("tx", 10, 50), ("tx", 20, 1)])
    assert [i[1] for i in Prefetch(reader, 10, size) if isinstance(i, tuple)] == [10, 20]


def test_an_error_reaches_the_consumer_after_everything_read_before_it() -> None:
    reader = FakeReader([("tx", 10, 1), ("tx", 20, 1), RuntimeError("boom")])
    got: list[Any] = []
    with pytest.raises(RuntimeError, match="boom"):
        for item in Prefetch(reader, 100, size):
            got.append(item)
    assert [i[1] for i in got if isinstance(i, tuple)] == [10, 20]


def test_pause_after_holds_the_reader_until_resumed() -> None:
    reader = FakeReader([("ddl", 10, 0), ("tx", 20, 1)])
    prefetch = Prefetch(reader, 100, size, pause_after=lambda item: item[0] == "ddl")
    it = iter(prefetch)
    assert next(it)[0] == "ddl"
    time.sleep(0.3)
    assert reader.read == 1, "the row after the DDL must wait for the new schema"
    prefetch.resume()
    assert next(it)[1] == 20
    assert next(it) == End(pos(20))


def test_close_stops_a_reader_that_waits_for_room() -> None:
    reader = FakeReader([("tx", 10 * i, 5) for i in range(1, 1000)])
    prefetch = Prefetch(reader, 5, size)
    next(iter(prefetch))
    started = time.monotonic()
    prefetch.close()
    assert time.monotonic() - started < 5
    assert not any(t.name == "binlog-prefetch" and t.is_alive() for t in threading.enumerate())


def test_has_ready_tells_whether_an_item_waits_to_be_taken() -> None:
    reader = FakeReader([("ddl", 10, 0), ("tx", 20, 1), ("tx", 30, 1)])
    prefetch = Prefetch(reader, 100, size, pause_after=lambda item: item[0] == "ddl")
    it = iter(prefetch)
    assert next(it)[0] == "ddl"
    time.sleep(0.2)
    assert not prefetch.has_ready()  # the reader waits after the DDL: nothing parsed yet
    prefetch.resume()
    deadline = time.monotonic() + 5
    while not prefetch.has_ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert prefetch.has_ready()
    assert [i[1] for i in it if isinstance(i, tuple)] == [20, 30]
    assert not prefetch.has_ready()
