"""What the benches that run the job against a MariaDB of their own share: the server with bench.soak's tables, the
CDC user's password in the environment, a scratch directory kept when a run fails, and the results printed and
written (bench/results/)."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.binlog import create_tables, load_initial
from bench.snapshot import CDC_USER, PASSWORD_ENV, BenchError, _progress, host_info, write_results
from ingest.devservers.mariadb import MariaDBServer

Measure = Callable[[MariaDBServer, argparse.Namespace, Path, dict[str, Any]], None]


def on_private_mariadb(
    benchmark: str, args: argparse.Namespace, measure: Measure, render: Callable[[dict[str, Any]], str]
) -> dict[str, Any]:
    """`measure(server, args, scratch, results)` on a MariaDB of its own holding bench.soak's tables (`args.rows`
    orders; `args.keys` their key space), its data in the scratch directory (so it survives a stop and start); then
    the results rendered and written. The scratch directory (logs, warehouse) is kept after a failure."""
    os.environ[PASSWORD_ENV] = "bench-" + secrets.token_hex(8)
    results: dict[str, Any] = {"benchmark": benchmark, "host": host_info(), "args": vars(args).copy()}
    scratch = Path(tempfile.mkdtemp(prefix=f"ingest-bench-{benchmark}-"))
    try:
        with MariaDBServer(base_dir=scratch / "mariadb") as server:
            server.create_cdc_user(CDC_USER, os.environ[PASSWORD_ENV])
            create_tables(server)
            args.keys = load_initial(server, args.rows)
            measure(server, args, scratch, results)
    except BaseException:
        _progress(f"failed; logs and warehouse kept in {scratch}")
        raise
    shutil.rmtree(scratch, ignore_errors=True)
    print(render(results))
    print(f"results: {write_results(results, benchmark)}")
    return results


def catch_up(config_path: Path) -> float:
    """`ingest run --until-caught-up` of the pipeline, as a user's next run after a stop; its seconds. A SIGTERM reads
    on for at most 10 s: a job behind its writer stops short of the source, which verify would report."""
    _progress("ingest run --until-caught-up, then ingest verify")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ingest.cli", "run", "--config", str(config_path), "--until-caught-up"],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"the catch-up after the stop failed:\n{done.stderr[-3000:]}")
    return round(time.monotonic() - started, 3)
