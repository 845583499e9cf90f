"""The metrics endpoint's pure parts: the Prometheus text format, the bookkeeping the job reports to, the
`metrics` config section and `ingest status --watch`'s loop (ingest/metrics.py, ingest/commands/status.py)."""

from __future__ import annotations

import io
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ingest import metrics
from ingest.commands.status import job_from_metrics, watch_status
from ingest.config import MetricsConfig, parse_config
from ingest.errors import ConfigError
from ingest.metrics import CONTENT_TYPE, JobMetrics, MetricFamily, MetricsServer, recording, render
from ingest.model.position import BinlogPosition
from ingest.sink import merge
from ingest.source.reconnect import Reconnect, publish, read_published

POS = BinlogPosition("b.000003", 900)
CONFIG = {
    "source": {"host": "db", "user": "cdc", "password": {"env": "INGEST_UNIT_METRICS_PW"}},
    "tables": {"include": [r"shop\..*"]},
    "sink": {"catalog": {"type": "jdbc", "uri": "jdbc:sqlite:/x/c.db"}},
}


def samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value of every sample line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_the_text_format_has_help_type_and_escaped_labels() -> None:
    family = MetricFamily(
        "x_total",
        "counter",
        "Rows\\copied\nper table.",
        [("", {"table": 'a"b\\c\nd'}, 3), ("", {"table": "db.t"}, 2.5)],
    )
    summary = MetricFamily("d_seconds", "summary", "Time.", [("_sum", {}, 1.25), ("_count", {}, 2)])
    empty = MetricFamily("lag_seconds", "gauge", "Lag.")
    odd = MetricFamily("g", "gauge", "Odd.", [("", {"k": "nan"}, float("nan")), ("", {"k": "inf"}, float("inf"))])
    assert render([family, summary, empty, odd]) == (
        "# HELP x_total Rows\\\\copied\\nper table.\n"
        "# TYPE x_total counter\n"
        'x_total{table="a\\"b\\\\c\\nd"} 3\n'
        'x_total{table="db.t"} 2.5\n'
        "# HELP d_seconds Time.\n"
        "# TYPE d_seconds summary\n"
        "d_seconds_sum 1.25\n"
        "d_seconds_count 2\n"
        "# HELP lag_seconds Lag.\n"
        "# TYPE lag_seconds gauge\n"
        "# HELP g Odd.\n"
        "# TYPE g gauge\n"
        'g{k="nan"} NaN\n'
        'g{k="inf"} +Inf\n'
    )


def test_bookkeeping_adds_up_per_table() -> None:
    job = JobMetrics("p", clock=lambda: 1000.0)
    job.snapshot_progress("db.a", 0, 3)
    job.rows_copied("db.a", 100)
    job.rows_copied("db.a", 50)
    job.snapshot_progress("db.a", 3, 3)
    job.batch_committed({"db.a": 4, "db.b": 1}, 0.5, POS, 990)
    job.batch_committed({"db.a": 2}, 1.5, BinlogPosition("b.000003", 1200), None)  # no source time: kept
    job.commit_retried("lake.db.a")
    got = samples(job.exposition())
    assert got == {
        'ingest_pipeline_info{pipeline="p"}': 1,
        'ingest_snapshot_rows_total{table="db.a"}': 150,
        'ingest_snapshot_chunks_done{table="db.a"}': 3,
        'ingest_snapshot_chunks_planned{table="db.a"}': 3,
        "ingest_snapshot_paused": 0,
        "ingest_snapshot_throttled_seconds_total": 0,
        'ingest_binlog_changes_applied_total{table="db.a"}': 6,
        'ingest_binlog_changes_applied_total{table="db.b"}': 1,
        'ingest_commit_retries_total{target="lake.db.a"}': 1,
        "ingest_batch_duration_seconds_sum": 2.0,
        "ingest_batch_duration_seconds_count": 2,
        "ingest_last_batch_duration_seconds": 1.5,
        "ingest_lag_seconds": 10.0,  # no probe: now minus the source time of the committed offset
        "ingest_source_reconnecting": 0,
        "ingest_source_reconnect_attempts": 0,
    }


def test_nothing_known_yet_gives_families_without_samples() -> None:
    text = JobMetrics("p").exposition()
    assert "# TYPE ingest_lag_seconds gauge" in text and "# TYPE ingest_binlog_bytes_behind gauge" in text
    assert samples(text) == {
        'ingest_pipeline_info{pipeline="p"}': 1,
        "ingest_snapshot_paused": 0,
        "ingest_snapshot_throttled_seconds_total": 0,
        "ingest_batch_duration_seconds_sum": 0,
        "ingest_batch_duration_seconds_count": 0,
        "ingest_source_reconnecting": 0,
        "ingest_source_reconnect_attempts": 0,
    }


def test_a_reconnecting_reader_shows_since_when_its_attempts_and_last_error_and_the_lag_keeps_counting(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    job = JobMetrics("p", clock=lambda: now[0])
    file = tmp_path / "reconnecting.json"
    job.reconnecting_probe = lambda: read_published(file)
    job.offset_committed(POS, 990)
    reconnect = Reconnect(300, "db:3306", clock=lambda: now[0])
    reconnect.next_wait(OSError("Connection refused"), "")
    reconnect.next_wait(OSError("Connection refused"), "")
    reconnect.since_wall = 995.0
    publish(file, reconnect)
    got = samples(job.exposition())
    assert got['ingest_source_reconnecting{error="OSError: Connection refused"}'] == 1
    assert got["ingest_source_reconnect_attempts"] == 2 and got["ingest_source_reconnecting_since_seconds"] == 995.0
    assert got["ingest_lag_seconds"] == 10.0
    now[0] = 1030.0
    assert samples(job.exposition())["ingest_lag_seconds"] == 40.0  # no batch while it reconnects: the lag grows
    assert job.progress().reconnecting == (35.0, 2, "OSError: Connection refused")
    # `ingest status` reads the same page.
    assert job_from_metrics(job.exposition()) == {
        "running": True,
        "reconnecting": {"since": "1970-01-01T00:16:35+00:00", "attempts": 2, "error": "OSError: Connection refused"},
    }
    reconnect.recovered()
    publish(file, reconnect)
    assert not file.exists() and job.progress().reconnecting is None
    assert samples(job.exposition())["ingest_source_reconnecting"] == 0
    assert job_from_metrics(job.exposition()) == {"running": True, "reconnecting": None}


def test_status_reads_an_error_label_with_quotes_and_line_breaks_back() -> None:
    family = MetricFamily("ingest_source_reconnecting", "gauge", "h", [("", {"error": 'a "b"\\c\nd'}, 1)])
    assert job_from_metrics(render([family]))["reconnecting"]["error"] == 'a "b"\\c\nd'


def test_bytes_behind_comes_from_the_probe_and_zero_means_no_lag() -> None:
    job = JobMetrics(clock=lambda: 1000.0)
    asked: list[BinlogPosition] = []
    answers = [0, 4096]

    def probe(committed: BinlogPosition) -> int | None:
        asked.append(committed)
        return answers.pop(0)

    job.bytes_behind_probe = probe
    assert "ingest_binlog_bytes_behind" not in samples(job.exposition())  # no committed offset: not asked
    job.offset_committed(POS, 900)
    got = samples(job.exposition())
    assert (got["ingest_binlog_bytes_behind"], got["ingest_lag_seconds"]) == (0, 0)  # caught up, however old
    assert samples(job.exposition())["ingest_lag_seconds"] == 0  # within a second: the same answer, not asked
    job.offset_committed(BinlogPosition("b.000004", 4), None)  # a new offset is asked at once
    got = samples(job.exposition())
    assert (got["ingest_binlog_bytes_behind"], got["ingest_lag_seconds"]) == (4096, 100)
    assert asked == [POS, BinlogPosition("b.000004", 4)]


def test_a_source_that_cannot_be_asked_leaves_bytes_behind_out(caplog: pytest.LogCaptureFixture) -> None:
    job = JobMetrics(clock=lambda: 1000.0)

    def probe(committed: BinlogPosition) -> int | None:
        raise OSError("connection refused")

    job.bytes_behind_probe = probe
    job.offset_committed(POS, 995)
    for _ in range(3):
        got = samples(job.exposition())
    assert "ingest_binlog_bytes_behind" not in got and got["ingest_lag_seconds"] == 5
    assert sum("connection refused" in r.getMessage() for r in caplog.records) == 1  # said once, not per scrape


def test_the_current_metrics_are_those_of_the_run_and_the_merge_retry_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.test_merge_retry import CONFLICT, END, SCHEMA, RecordingSpark, _offsets

    monkeypatch.setattr(merge.time, "sleep", lambda _: None)
    outside = metrics.current()
    with recording(JobMetrics()) as job:
        assert metrics.current() is job
        spark = RecordingSpark([CONFLICT, CONFLICT, None])
        assert merge.merge_into(spark, "lake.db.t", SCHEMA, {(1,): (1, 5)}, END, _offsets(None, None, None))
    assert metrics.current() is outside
    assert samples(job.exposition())['ingest_commit_retries_total{target="lake.db.t"}'] == 2


def test_the_server_answers_metrics_and_nothing_else() -> None:
    job = JobMetrics("p")
    job.rows_copied("db.t", 7)
    with MetricsServer(job, "127.0.0.1", 0) as server:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as answer:
            assert answer.headers["Content-Type"] == CONTENT_TYPE
            assert samples(answer.read().decode())['ingest_snapshot_rows_total{table="db.t"}'] == 7
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/other", timeout=5)
        assert info.value.code == 404


def test_a_port_already_taken_stops_the_job_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from ingest.query.pipeline import _metrics_server

    monkeypatch.setenv("INGEST_UNIT_METRICS_PW", "x")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = parse_config({**CONFIG, "metrics": {"port": port}})
        with pytest.raises(ConfigError, match=rf"`metrics.port`: cannot serve metrics on 127.0.0.1:{port}"):
            with _metrics_server(config, JobMetrics()):
                pass


def test_the_metrics_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INGEST_UNIT_METRICS_PW", "x")
    assert parse_config(CONFIG).metrics == MetricsConfig(None, "127.0.0.1")
    assert parse_config({**CONFIG, "metrics": {"port": 9400, "host": "0.0.0.0"}}).metrics == MetricsConfig(
        9400, "0.0.0.0"
    )
    for bad, message in (
        ({"port": 0}, "`metrics.port` must be a TCP port"),
        ({"port": "9400"}, "`metrics.port` must be int"),
        ({"prot": 9400}, "unknown key `metrics.prot`"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_config({**CONFIG, "metrics": bad})


def _watch(clear: bool, renders: list[Any]) -> str:
    out = io.StringIO()
    sleeps: list[float] = []

    def render() -> str:
        item = renders.pop(0)
        if isinstance(item, Exception):
            raise item
        return str(item)

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if not renders:
            raise KeyboardInterrupt  # Ctrl-C

    watch_status(render, 2.0, out, clear, sleep=sleep, now=lambda: 0.0)
    assert sleeps == [2.0] * len(sleeps)
    return out.getvalue()


def test_watch_prints_blocks_one_after_another_until_ctrl_c() -> None:
    text = _watch(False, ["one\n", RuntimeError("catalog away"), "three\n"])
    header = "1970-01-01T00:00:00+00:00 (every 2 s; Ctrl-C stops)\n"
    assert text == (f"{header}one\n\n{header}ingest: cannot read the status: catalog away\n\n{header}three\n\n")


def test_watch_on_a_terminal_redraws_the_screen() -> None:
    text = _watch(True, ["one\n", "two\n"])
    assert text.count("\x1b[H\x1b[2J") == 2 and text.endswith("two\n")
