"""Starting and stopping one local server process."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from ingest.errors import ServiceStartError


def free_port() -> int:
    """A TCP port the OS says is free right now on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_program(name: str, *extra_dirs: Path) -> str:
    """The path of a server binary that setup installed, or a ServiceStartError saying how to get it."""
    for d in extra_dirs:
        candidate = d / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/usr/local/bin")
    if found:
        return found
    raise ServiceStartError(f"{name} is not installed; run `make setup` (scripts/setup.sh) first")


class ServerProcess:
    """A child process with its log file; `stop()` is idempotent."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None, user: str | None = None
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            user=user,
            start_new_session=True,  # a Ctrl-C in the terminal must not kill it before we clean up
        )

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_until(self, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceStartError(
                    f"{self.name} exited with code {self.proc.returncode} while starting; log tail:\n" + self.log_tail()
                )
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.2)
        self.stop()
        raise ServiceStartError(f"{self.name} was not ready after {timeout:.0f}s; log tail:\n" + self.log_tail())

    def stop(self, timeout: float = 20.0, how: signal.Signals = signal.SIGTERM) -> None:
        """Stop the server with the signal `how` (then SIGKILL after `timeout` seconds)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, how)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._log.close()


class LocalService:
    """A server the tests start and stop: `with Service(...) as service:` starts it, and stops it even when
    starting fails half-way (what was started is torn down). Subclasses define `start` and `stop`."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
