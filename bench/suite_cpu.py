"""Where the test suite's CPU goes: runs a command (`make test`, or one pytest run) and charges every process's CPU,
sampled from /proc each second, to the test its pytest process (an xdist worker, or pytest itself) runs at that
moment: the test's own Python, the JVMs and Spark Python processes it starts, the servers of its fixtures.
The suite is CPU-bound on 2 cores, so a test's CPU seconds, not its duration, say what it costs the whole run.

    .venv/bin/python -m bench.suite_cpu -- make test
    .venv/bin/python -m bench.suite_cpu --top 20 -- .venv/bin/pytest tests/integration/test_cut.py

Each pytest process writes the test it starts to SUITE_CPU_DIR (tests/conftest.py). A process that lives less than
a second between two samples is missed; one that ends loses its last second. The sampler's own CPU is not charged.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path

from bench import harness

KINDS = (
    ("java", "jvm"),
    ("spark-class", "jvm"),
    ("ingest.cli", "job"),
    ("bin/ingest", "job"),
    ("ingest_job.py", "job"),
    ("pyspark", "spark-python"),
    ("ingest.runtime.daemon", "spark-python"),
    ("mariadbd", "mariadb"),
    ("minio", "minio"),
    ("postgres", "postgres"),
    ("bin/pytest", "pytest"),
    ("exec(eval(sys.stdin", "pytest"),  # an xdist worker
)


def _kind(cmdline: str) -> str:
    return next((kind for word, kind in KINDS if word in cmdline), "other")


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _running(tests: Path) -> dict[int, str]:
    """The test each pytest process runs now, by its pid: read once per sample."""
    out = {}
    for entry in tests.iterdir():
        with contextlib.suppress(OSError, ValueError):
            out[int(entry.name)] = entry.read_text()
    return out


def _test_of(pid: int, procs: Mapping[int, harness.ProcSample], running: Mapping[int, str]) -> str | None:
    """The test that the nearest pytest process above `pid` (or `pid` itself) runs now."""
    for _ in range(40):
        if pid in running:
            return running[pid] or None
        if pid not in procs:
            return None
        pid = procs[pid].ppid
    return None


def sample(command: list[str], tests: Path) -> tuple[int, dict[str, Counter[str]]]:
    """Run `command`; its exit code and, per test, CPU seconds by kind of process."""
    charged: dict[str, Counter[str]] = defaultdict(Counter)
    last: dict[tuple[int, int], float] = {}
    kinds: dict[tuple[int, int], str] = {}
    job = subprocess.Popen(command, env={**os.environ, "SUITE_CPU_DIR": str(tests)})
    while job.poll() is None:
        procs, running = harness.all_processes(), _running(tests)
        for pid, proc in procs.items():
            process = (pid, proc.start_ticks)
            delta = proc.cpu - last.get(process, 0.0)
            last[process] = proc.cpu
            if delta <= 0:
                continue
            test = _test_of(pid, procs, running)
            if test is not None:
                kind = kinds.setdefault(process, _kind(_command_line(pid)))
                charged[test][kind] += delta
        time.sleep(1)
    return job.returncode, charged


def report(charged: dict[str, Counter[str]], top: int) -> None:
    total = sum(sum(kinds.values()) for kinds in charged.values())
    modules: Counter[str] = Counter()
    for test, kinds in charged.items():
        modules[test.split("::")[0]] += sum(kinds.values())
    print(f"CPU seconds charged to tests: {total:.0f}")
    print("by module:")
    for module, seconds in modules.most_common(top):
        print(f"  {seconds:7.0f}  {100 * seconds / total:4.1f}%  {module}")
    print("by test:")
    for test, kinds in sorted(charged.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
        parts = ", ".join(f"{kind} {seconds:.0f}" for kind, seconds in kinds.most_common())
        print(f"  {sum(kinds.values()):7.0f}  {test}\n           {parts}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=30, help="modules and tests to print (default 30)")
    parser.add_argument("--json", type=Path, help="also write every test's CPU by kind here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name a command after --")
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as tests:
        code, charged = sample(command, Path(tests))
    report(charged, args.top)
    if args.json:
        args.json.write_text(json.dumps(charged, indent=1, sort_keys=True))
    return code


if __name__ == "__main__":
    sys.exit(main())
