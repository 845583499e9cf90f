"""Where the test suite's CPU goes: runs a command (`make test`, or one pytest run) and charges every process's CPU,
sampled from /proc each second, to the test its pytest process (an xdist worker, or pytest itself) runs at that
moment: the test's own Python, the JVMs and Spark Python processes it starts, the servers of its fixtures.
The suite is CPU-bound on 2 cores, so a test's CPU seconds, not its duration, say what it costs the whole run.

    .venv/bin/python scripts/suite_cpu.py -- make test
    .venv/bin/python scripts/suite_cpu.py --top 20 -- .venv/bin/pytest tests/integration/test_cut.py

Each pytest process writes the test it starts to SUITE_CPU_DIR (tests/conftest.py). A process that lives less than
a second between two samples is missed; one that ends loses its last second. The sampler's own CPU is not charged.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
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


def _processes() -> dict[int, tuple[int, int, int, str]]:
    """pid -> (parent pid, CPU ticks, start ticks, command line)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19]), cmdline)
    return out


def _test_of(pid: int, procs: dict[int, tuple[int, int, int, str]], tests: Path) -> str | None:
    """The test that the nearest pytest process above `pid` (or `pid` itself) runs now."""
    for _ in range(40):
        current = tests / str(pid)
        if current.exists():
            return current.read_text() or None
        if pid not in procs:
            return None
        pid = procs[pid][0]
    return None


def sample(command: list[str], tests: Path) -> tuple[int, dict[str, Counter[str]]]:
    """Run `command`; its exit code and, per test, CPU seconds by kind of process."""
    charged: dict[str, Counter[str]] = defaultdict(Counter)
    last: dict[tuple[int, int], int] = {}
    me = os.getpid()
    job = subprocess.Popen(command, env={**os.environ, "SUITE_CPU_DIR": str(tests)})
    while job.poll() is None:
        procs = _processes()
        for pid, (_, ticks, start, cmdline) in procs.items():
            delta = ticks - last.get((pid, start), 0)
            last[(pid, start)] = ticks
            if delta <= 0 or pid == me:
                continue
            test = _test_of(pid, procs, tests)
            if test is not None:
                charged[test][_kind(cmdline)] += delta / HZ
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
