"""After the binlog source's reader is stopped, pyspark's runner dying of the socket Spark closed leaves no
traceback on the job's terminal; any other error still prints one (ingest.query.binlog_source)."""

from __future__ import annotations

import subprocess
import sys

import pytest

RUNNER = """
from ingest.query.binlog_source import quiet_closed_socket_exit
quiet_closed_socket_exit()
try:
    raise EOFError
except EOFError:
    raise {error}("after the stop")
"""


@pytest.mark.parametrize(("error", "printed"), [("BrokenPipeError", False), ("ValueError", True)])
def test_only_a_closed_socket_dies_quietly(error: str, printed: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-c", RUNNER.format(error=error)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert ("Traceback" in done.stderr) == printed, done.stderr
