"""The progress display (ingest/commands/progress.py): the lines it shows, and how it draws them on a terminal."""

from __future__ import annotations

import io
import logging

from ingest.commands.progress import LiveProgress, ProgressView, showing_progress
from ingest.metrics import JobMetrics, Progress
from ingest.model.position import BinlogPosition


def reading(at: float, **kw: object) -> Progress:
    base: dict[str, object] = {
        "chunks": {},
        "rows": {},
        "changes": {},
        "committed": None,
        "lag": None,
        "last_commit_age": None,
        "paused": False,
    }
    return Progress(at=at, **{**base, **kw})  # type: ignore[arg-type]


def test_snapshot_lines_give_rows_per_second_and_an_eta_from_this_runs_pace() -> None:
    view = ProgressView()
    # 10 of 40 chunks were copied by an earlier run: the pace counts only what this run did.
    assert view.lines(reading(100.0, chunks={"shop.orders": (10, 40), "shop.tiny": (1, 1)})) == [
        "snapshot shop.orders  chunks 10/40 (25%), 0 rows, starting",
        "snapshot shop.tiny    complete, 1 chunks",
    ]
    lines = view.lines(
        reading(110.0, chunks={"shop.orders": (20, 40), "shop.tiny": (1, 1)}, rows={"shop.orders": 5000})
    )
    # 10 chunks in 10 s: the 20 left take 20 s; 5,000 rows in 10 s.
    assert lines[0] == "snapshot shop.orders  chunks 20/40 (50%), 5,000 rows, 500 rows/s, ETA 0:00:20"
    paused = view.lines(reading(111.0, chunks={"shop.orders": (20, 40)}, rows={"shop.orders": 5000}, paused=True))
    assert paused[0].endswith(", paused: the source is busy")


def test_the_binlog_line_shows_lag_changes_per_second_over_a_window_and_the_last_commit() -> None:
    view = ProgressView()
    view.lines(reading(0.0, committed="mysql-bin.000001:4", changes={"shop.a": 0}))
    view.lines(reading(5.0, committed="mysql-bin.000001:900", changes={"shop.a": 1000}))
    line = view.lines(
        reading(
            10.0,
            committed="mysql-bin.000001:1800",
            changes={"shop.a": 1500, "shop.b": 500},
            lag=1.25,
            last_commit_age=2.0,
        )
    )[-1]
    assert line == "binlog   lag 1.2 s, 200 changes/s, last commit 2 s ago, at mysql-bin.000001:1800"
    # Older readings leave the window: the rate follows the recent pace, not the run's average.
    view.lines(reading(30.0, committed="mysql-bin.000001:1800", changes={"shop.a": 1500, "shop.b": 500}))
    idle = view.lines(reading(41.0, committed="mysql-bin.000001:1800", changes={"shop.a": 1500, "shop.b": 500}))
    assert idle[-1].startswith("binlog   lag unknown, 0 changes/s")
    away = view.lines(
        reading(42.0, committed="mysql-bin.000001:1800", lag=14.0, reconnecting=(12.4, 3, "OperationalError: (2003")),
    )
    assert away[-1].endswith(
        "at mysql-bin.000001:1800, reconnecting to the source for 0:00:12 (attempt 3: OperationalError: (2003)"
    )


def test_job_metrics_give_what_the_display_reads() -> None:
    clock = [1000.0]
    job = JobMetrics("p", clock=lambda: clock[0], monotonic=lambda: 50.0)
    job.snapshot_progress("shop.a", 2, 4)
    job.rows_copied("shop.a", 300)
    job.batch_committed({"shop.a": 7}, 0.5, BinlogPosition("mysql-bin.000002", 120), source_time=998.0)
    clock[0] = 1003.0
    now = job.progress()
    assert (now.at, now.chunks, now.rows, now.changes) == (50.0, {"shop.a": (2, 4)}, {"shop.a": 300}, {"shop.a": 7})
    assert (now.committed, now.lag, now.last_commit_age, now.paused) == ("mysql-bin.000002:120", 5.0, 3.0, False)


def test_the_live_block_is_drawn_again_in_place_and_log_lines_scroll_above_it() -> None:
    screen = io.StringIO()
    readings = iter(
        [
            reading(0.0, chunks={"shop.a": (0, 2), "shop.b": (0, 1)}),
            reading(1.0, chunks={"shop.a": (1, 2), "shop.b": (1, 1)}, rows={"shop.a": 10}),
        ]
    )
    live = LiveProgress(screen, read=lambda: next(readings))
    live.refresh()
    first = screen.getvalue()
    assert (
        first
        == "snapshot shop.a  chunks 0/2 (0%), 0 rows, starting\nsnapshot shop.b  chunks 0/1 (0%), 0 rows, starting"
    )
    live.write_above("12:00:00 INFO x: a log line\n")
    # Up one line (two drawn), to column 0, clear; the log line; the block again.
    assert screen.getvalue()[len(first) :] == "\r\x1b[1A\x1b[J12:00:00 INFO x: a log line\n" + first
    live.refresh()
    assert screen.getvalue().endswith(
        "\r\x1b[1A\x1b[Jsnapshot shop.a  chunks 1/2 (50%), 10 rows, 10 rows/s, ETA 0:00:01\n"
        "snapshot shop.b  complete, 1 chunks"
    )
    readings = iter([reading(2.0, chunks={"shop.a": (2, 2), "shop.b": (1, 1)}, rows={"shop.a": 20})])
    live.stop()
    # A last look, left on the screen.
    assert screen.getvalue().endswith(
        "\r\x1b[1A\x1b[Jsnapshot shop.a  complete, 2 chunks, 20 rows copied\nsnapshot shop.b  complete, 1 chunks\n"
    )


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_log_records_go_above_the_block_and_the_handler_is_put_back(monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setenv("TERM", "xterm")
    screen = _Terminal()
    handler = logging.StreamHandler(screen)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root = logging.getLogger()
    saved = root.handlers
    root.handlers = [handler]
    try:
        with showing_progress("auto", screen):
            assert root.handlers[0] is not handler
            logging.getLogger("ingest.test").warning("a record")
        assert root.handlers == [handler]
    finally:
        root.handlers = saved
    assert "WARNING a record\n" in screen.getvalue()


def test_off_and_plain_leave_the_handlers_alone() -> None:
    screen = _Terminal()
    root = logging.getLogger()
    before = list(root.handlers)
    for mode in ("off", "plain"):
        with showing_progress(mode, screen):  # type: ignore[arg-type]
            assert root.handlers == before
    assert screen.getvalue() == ""


def test_plain_mode_logs_the_same_lines_every_interval(caplog: object) -> None:
    import time

    import pytest

    from ingest.metrics import recording

    assert isinstance(caplog, pytest.LogCaptureFixture)
    job = JobMetrics("p")
    job.snapshot_progress("shop.a", 1, 3)
    with caplog.at_level(logging.INFO, logger="ingest.commands.progress"), recording(job):
        with showing_progress("plain", _Terminal(), plain_every=0.05):
            time.sleep(0.3)
    lines = [r.getMessage() for r in caplog.records if r.name == "ingest.commands.progress"]
    assert lines and all(line == "progress: snapshot shop.a  chunks 1/3 (33%), 0 rows, starting" for line in lines)


def test_the_last_look_after_a_run_reads_that_runs_metrics() -> None:
    from ingest import metrics

    job = JobMetrics("p")
    with metrics.recording(job):
        assert metrics.latest() is job
    assert metrics.current() is not job and metrics.latest() is job
