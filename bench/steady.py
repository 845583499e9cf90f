"""Steady load: does one `ingest run` with its defaults keep up with a busy source? The server itself offers
single-row transactions (a stored procedure: no client spends CPU on the load) at each rate in turn, for
`--seconds` each, to one job started once (snapshot, then the binlog); per rate: the job's cores by part (its
driver, its JVM, Spark's Python processes), its CPU per change, the lag while the load runs, and how long after the
writer stops the last change is committed in Iceberg (kept up: within `--kept-up-seconds`). See bench/README.md.

    .venv/bin/python -m bench.steady [--rates 500,2000,5000,10000,20000] [--seconds 60] [--writers 1]

The load: half updates of `orders`, a fifth updates of `customers`, the rest inserts and deletes of `events`
(bench.tables' three tables); the baseline in the same run is the server's own CPU for the same transactions, and
the ratio printed is the job's CPU per change against the server's.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.soak import job_pipeline
from bench.tables import create_tables, load_initial, source_counts
from ingest.config import StreamConfig
from ingest.devservers.mariadb import MariaDBServer

PIPELINE = "bench_steady"
PROCEDURE = f"{harness.DATABASE}.steady_load"
FIRST_EVENT = 1_000_000_000
"""Events the load inserts (and deletes again) are numbered from here, past the initial rows' keys."""
EVENTS_PER_CALL = 10_000_000
"""Each call of the procedure numbers its events in a range of its own."""
DRAIN_TIMEOUT_SECONDS = 600.0
POLL_SECONDS = 0.25

# Every statement is a transaction of its own (autocommit). Of every 10: five updates of orders, two of customers,
# then an insert of a new event, the delete of the oldest event this call inserted, and one more of either in turn.
# The pace: every 50 statements the procedure sleeps until it is no longer ahead of `rate`; it never bursts to
# catch up, it just falls short (the achieved rate is reported).
LOAD_PROCEDURE = f"""
CREATE PROCEDURE {PROCEDURE}(IN rate DOUBLE, IN seconds DOUBLE, IN first_event BIGINT, IN salt INT,
                             IN orders INT, IN customers INT, OUT done BIGINT)
BEGIN
  DECLARE total BIGINT DEFAULT CEIL(rate * seconds);
  DECLARE t0 DOUBLE DEFAULT UNIX_TIMESTAMP(SYSDATE(6));
  DECLARE ahead DOUBLE;
  DECLARE k INT;
  DECLARE ev_hi BIGINT DEFAULT first_event;
  DECLARE ev_lo BIGINT DEFAULT first_event;
  SET done = 0;
  WHILE done < total AND UNIX_TIMESTAMP(SYSDATE(6)) - t0 < seconds + 5 DO
    SET k = done MOD 10;
    IF k < 5 THEN
      UPDATE orders SET status = ELT(1 + done MOD 4, 'new', 'paid', 'shipped', 'done'),
                        amount = IFNULL(amount, 0) + 1,
                        updated_us = CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)
       WHERE id = 1 + (done * 7919 + salt) MOD orders;
    ELSEIF k < 7 THEN
      UPDATE customers SET balance = balance + 1, tier = (tier + 1) MOD 5, updated_at = SYSDATE(6)
       WHERE id = 1 + (done * 104729 + salt) MOD customers;
    ELSEIF k = 7 OR (k = 9 AND (done DIV 10) MOD 2 = 0) OR ev_lo = ev_hi THEN
      INSERT INTO events (event_key, kind, payload, score, seen_at, n)
      VALUES (CONCAT('ev-', LPAD(ev_hi, 12, '0')), 'view', CONCAT('{{"n":', ev_hi, '}}'),
              IF(ev_hi MOD 7 = 0, NULL, ev_hi / 3e0), SYSDATE(3), ev_hi MOD 1000000);
      SET ev_hi = ev_hi + 1;
    ELSE
      DELETE FROM events WHERE event_key = CONCAT('ev-', LPAD(ev_lo, 12, '0'));
      SET ev_lo = ev_lo + 1;
    END IF;
    SET done = done + 1;
    IF done MOD 50 = 0 THEN
      SET ahead = t0 + done / rate - UNIX_TIMESTAMP(SYSDATE(6));
      IF ahead > 0 THEN
        DO SLEEP(ahead);
      END IF;
    END IF;
  END WHILE;
END
"""


class ServerLoad:
    """`--writers` connections, each calling the load procedure at its share of the rate, in threads."""

    def __init__(self, server: MariaDBServer, rate: float, seconds: float, writers: int, call: int, sizes: Any):
        self.server, self.rate, self.seconds, self.writers = server, rate, seconds, writers
        self.call, self.sizes = call, sizes
        self.done: list[int] = [0] * writers
        self.errors: list[str] = []
        self.started = self.ended = 0.0
        self._threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(writers)]

    def _run(self, w: int) -> None:
        first = FIRST_EVENT + (self.call * self.writers + w) * EVENTS_PER_CALL
        try:
            with self.server.admin(harness.DATABASE) as conn, conn.cursor() as cur:
                cur.execute(
                    f"CALL {PROCEDURE}(%s, %s, %s, %s, %s, %s, @done)",
                    (self.rate / self.writers, self.seconds, first, w, self.sizes["orders"], self.sizes["customers"]),
                )
                cur.execute("SELECT @done")
                row = cur.fetchone()
                self.done[w] = int(row[0]) if row else 0
        except Exception as e:  # reported with the results
            self.errors.append(f"{type(e).__name__}: {e}")

    def run(self) -> None:
        """Start every writer and wait for them all; `started`/`ended` are monotonic times."""
        self.started = time.monotonic()
        for t in self._threads:
            t.start()
        for t in self._threads:
            t.join()
        self.ended = time.monotonic()

    @property
    def transactions(self) -> int:
        return sum(self.done)


def drained_after(job: harness.JobProcess, ended: float) -> float | None:
    """Seconds from `ended` until the job reports no binlog byte behind the source's end (the last change is
    committed in Iceberg), or None if it did not within DRAIN_TIMEOUT_SECONDS."""
    while time.monotonic() - ended < DRAIN_TIMEOUT_SECONDS and job.alive():
        m = harness.read_metrics(job.port, timeout=2.0)
        if m is not None and m.get("ingest_binlog_bytes_behind") == 0.0:
            return round(time.monotonic() - ended, 3)
        time.sleep(POLL_SECONDS)
    return None


def one_rate(server: MariaDBServer, job: harness.JobProcess, args: argparse.Namespace, k: int, rate: float) -> Any:
    """The load at `rate` for `--seconds`, then the drain; the figures of this rate."""
    assert job.scraper is not None
    sizes = source_counts(server)
    load = ServerLoad(server, rate, args.seconds, args.writers, k, sizes)
    harness.progress(f"offering {rate:,.0f} transactions/s for {args.seconds:g} s")
    out: dict[str, Any] = {"offered_per_s": rate}
    cpu_before, server_before = harness.tree_cpu(job.pid), harness.mariadb_cpu(server)
    load.run()
    cpu_load, server_after = harness.tree_cpu(job.pid), harness.mariadb_cpu(server)
    drain = drained_after(job, load.ended)
    cpu_after = harness.tree_cpu(job.pid)
    seconds = load.ended - load.started
    n = load.transactions
    during = harness.cpu_delta(cpu_before, cpu_load)
    whole = sum(harness.cpu_delta(cpu_before, cpu_after).values())
    start_at, end_at = load.started - job.scraper.t0, load.ended - job.scraper.t0
    out.update(
        transactions=n,
        achieved_per_s=round(n / seconds, 1) if seconds else None,
        load_s=round(seconds, 3),
        cores_by_part={part: round(cpu / seconds, 3) for part, cpu in during.items()},
        cores=round(sum(during.values()) / seconds, 3),
        job_cpu_s=round(whole, 3),
        us_per_change=round(whole / n * 1e6, 1) if n else None,
        server_cpu_s=None if server_before is None or server_after is None else round(server_after - server_before, 3),
        lag=job.scraper.lag(start_at + min(10.0, seconds / 2), end_at),  # after the first batches' start
        drain_s=drain,
        kept_up=drain is not None and drain <= args.kept_up_seconds,
        errors=load.errors,
    )
    if out["server_cpu_s"] is not None and n:
        out["server_us_per_change"] = round(out["server_cpu_s"] / n * 1e6, 1)
    return out


def measure(server: MariaDBServer, args: argparse.Namespace, scratch: Path, results: dict[str, Any]) -> None:
    interval = StreamConfig().batch_interval_seconds
    results["job_settings"] = {"spark_master": "local[2]", "batch_interval_seconds": interval}
    results["cpu_method"] = harness.CPU_METHOD
    create_tables(server)
    load_initial(server, args.initial_rows)
    server.execute(LOAD_PROCEDURE)
    results["initial_rows"] = source_counts(server)
    config_path, _, port = job_pipeline(server, scratch, PIPELINE, interval)
    harness.progress(f"ingest run (snapshot, then the binlog; log {scratch}/job.log), metrics on :{port}")
    results["rates"] = []
    with harness.JobProcess(config_path, scratch / "job.log", port) as job:
        results["ready_s"] = job.ready()
        job.scrape()
        time.sleep(args.settle_seconds)
        results["idle"] = idle(job, args.settle_seconds)
        for k, rate in enumerate(args.rates):
            figures = one_rate(server, job, args, k, rate)
            results["rates"].append(figures)
            harness.progress(
                f"{rate:,.0f}/s: {figures['cores']:.2f} cores, {harness.fmt(figures['us_per_change'], '.0f')} us per "
                f"change, drained {harness.fmt(figures['drain_s'], '.1f')} s after the writer's end"
            )
            if figures["drain_s"] is None or figures["errors"]:
                results["failure"] = f"at {rate:,.0f}/s: " + (
                    "; ".join(figures["errors"]) or f"not caught up {DRAIN_TIMEOUT_SECONDS:.0f} s after the load"
                )
                break
            time.sleep(args.settle_seconds)
        code = job.stop()
        if code != 0 and "failure" not in results:
            results["failure"] = f"the job exited with code {code} after SIGTERM (None: killed)"
        if "failure" in results:
            results["job_log_tail"] = job.tail().splitlines()
            return
    harness.progress("ingest verify")
    results["verify"] = harness.run_verify(config_path)
    if not results["verify"]["ok"]:
        results["failure"] = "ingest verify found the copy unequal"


def idle(job: harness.JobProcess, seconds: float) -> dict[str, Any]:
    """The job's cores and lag with no load, over `seconds`."""
    assert job.scraper is not None
    before = harness.tree_cpu(job.pid)
    start = job.scraper.elapsed()
    time.sleep(seconds)
    cpu = sum(harness.cpu_delta(before, harness.tree_cpu(job.pid)).values())
    return {"cores": round(cpu / seconds, 3), "lag": job.scraper.lag(start, job.scraper.elapsed())}


COLUMNS = harness.columns(
    "offered/s:10; achieved/s:10; cores:6:.2f; driver:6:.2f; JVM:6:.2f; workers:7:.2f; us/chg:7; "
    "server us:9; lag p50:7:.1f; p95:6:.1f; drain s:7:.1f; kept up:7"
)


def render(results: dict[str, Any]) -> str:
    a = results["args"]
    lines = [
        f"Steady load: single-row transactions offered by the server for {a['seconds']:g} s per rate "
        f"({a['writers']} writer connection(s)) to one `ingest run` with its defaults (local[2], batch interval "
        f"{results['job_settings']['batch_interval_seconds']:g} s); {results['host']['cpus']} CPUs, the server on them",
        f"initial rows {results.get('initial_rows')}; binlog phase reached after "
        f"{harness.fmt(results.get('ready_s'), '.1f')} s",
    ]
    if idle_ := results.get("idle"):
        lines.append(f"idle: {idle_['cores']:.3f} cores, lag p50 {harness.fmt(idle_['lag']['p50'], '.1f')} s")
    rows = []
    for r in results.get("rates", []):
        parts = r["cores_by_part"]
        rows.append(
            [
                f"{r['offered_per_s']:,.0f}",
                r["achieved_per_s"],
                r["cores"],
                parts.get("driver", 0.0),
                parts.get("jvm", 0.0),
                parts.get("python_workers", 0.0),
                r["us_per_change"],
                r.get("server_us_per_change"),
                r["lag"]["p50"],
                r["lag"]["p95"],
                r["drain_s"],
                "yes" if r["kept_up"] else "NO",
            ]
        )
    lines += [
        "",
        "cores: the job's whole tree while the load runs, by part; us/chg: the job's CPU from the load's start to",
        "the drain's end per transaction; server us: the server's CPU per transaction (the baseline); lag: the job's",
        f"ingest_lag_seconds while the load runs; drain: the writer's end to no byte behind (kept up: <= "
        f"{a['kept_up_seconds']:g} s)",
        *harness.text_table(COLUMNS, rows),
    ]
    ratios = {
        f"job / server CPU per change at {r['offered_per_s']:,.0f}/s": harness.ratio(
            r["us_per_change"], r.get("server_us_per_change")
        )
        for r in results.get("rates", [])
    }
    lines += harness.ratio_lines(ratios)
    kept = [r["offered_per_s"] for r in results.get("rates", []) if r["kept_up"]]
    lines.append(f"highest offered rate kept up: {harness.fmt(max(kept) if kept else None)}/s")
    if results.get("failure"):
        lines += ["", f"FAILED: {results['failure']}", *results.get("job_log_tail", [])]
    if v := results.get("verify"):
        lines += ["", f"ingest verify: {'OK' if v['ok'] else 'FAILED'} (exit code {v['exit_code']})"]
        lines += [f"  {line}" for line in v["output"]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.parser_for("bench.steady", __doc__)
    parser.add_argument(
        "--rates",
        type=harness.int_list,
        default=[500, 2000, 5000, 10000, 20000],
        help="offered transactions per second, in turn (500,2000,5000,10000,20000)",
    )
    parser.add_argument("--seconds", type=harness.positive_float, default=60.0, help="seconds of load per rate (60)")
    parser.add_argument(
        "--writers", type=harness.positive, default=1, help="server connections sharing each rate's load (1)"
    )
    parser.add_argument(
        "--initial-rows", type=harness.positive, default=20_000, help="initial orders (customers 1/4, events 1/2)"
    )
    parser.add_argument(
        "--kept-up-seconds",
        type=harness.positive_float,
        default=15.0,
        help="kept up: the last change committed within this many seconds of the writer's end (15)",
    )
    parser.add_argument(
        "--settle-seconds", type=harness.positive_float, default=10.0, help="idle seconds before each rate (10)"
    )
    harness.add_common_options(parser, spark_conf=False)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    results = harness.run_bench("steady", parse_args(argv), measure, render, mariadb={})
    return 0 if not results.get("failure") else 1


if __name__ == "__main__":
    raise SystemExit(main())
