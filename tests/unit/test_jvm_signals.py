"""The JVM the job launches ignores SIGTERM (ingest.runtime.spark.launching_jvm): a SIGTERM to the job's whole
process group reaches only the job, which stops after its commit. Tried on a stand-in process, launched the way
pyspark launches its gateway (through `pyspark.java_gateway.Popen`, with pyspark's own preexec function)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pyspark.java_gateway

from ingest.runtime.spark import launching_jvm

PRINT_DISPOSITIONS = (
    "import signal; print(*(getattr(signal.getsignal(s), 'name', 'handler') for s in (signal.SIGTERM, signal.SIGINT)))"
)


def _launch(**kwargs: object) -> str:
    gateway: object = pyspark.java_gateway
    popen = gateway.Popen  # type: ignore[attr-defined]
    child = popen([sys.executable, "-c", PRINT_DISPOSITIONS], stdout=subprocess.PIPE, text=True, **kwargs)
    out, _ = child.communicate(timeout=30)
    return str(out).strip()


def test_the_gateway_launched_inside_ignores_sigterm_and_keeps_pysparks_own_preexec() -> None:
    def pysparks() -> None:  # what pyspark passes: SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    assert _launch(preexec_fn=pysparks) == "SIG_DFL SIG_IGN"
    with launching_jvm():
        assert _launch(preexec_fn=pysparks) == "SIG_IGN SIG_IGN"
        assert _launch() == "SIG_IGN handler"
    assert _launch() == "SIG_DFL handler"  # put back


NOTICE = "import sys; sys.stderr.write('WARNING: Using incubator modules: jdk.incubator.vector\\nan error\\n')"


def test_the_gateways_stderr_reaches_the_jobs_without_the_incubator_notice() -> None:
    """Run in a child interpreter, so that the forwarded bytes land on a real file descriptor 2 the test reads."""
    script = (
        "import subprocess, sys, pyspark.java_gateway as g\n"
        "from ingest.runtime.spark import launching_jvm\n"
        "with launching_jvm():\n"
        f"    child = g.Popen([sys.executable, '-c', {NOTICE!r}])\n"
        "child.wait(timeout=30)\n"
        "child.forwarding.join(timeout=30)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "an error\n"


# EarlySession: the JVM started as the pipeline file is read, ended with a job that never asked for it.
EARLY = (
    "import subprocess, sys, pyspark.java_gateway as g\n"
    "import ingest.runtime.spark as s\n"
    "def stand_in(settings, sink, app_name, extra=None, launched=None):\n"
    "    with s.launching_jvm(launched):\n"
    "        child = g.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], stdout=subprocess.DEVNULL)\n"
    "    print(child.pid, flush=True)\n"
    "    if sys.argv[1] == 'fails':\n"
    "        raise RuntimeError('the JVM did not start')\n"
    "    return 'session'\n"
    "s.spark_session = stand_in\n"
    "early = s.EarlySession(None, None, 'app', warm_up=False)\n"
    "if sys.argv[1] == 'fails':\n"
    "    try:\n"
    "        early.session()\n"
    "    except RuntimeError as e:\n"
    "        print(e)\n"
    "elif sys.argv[1] == 'taken':\n"
    "    print(early.session())\n"
    "else:\n"
    "    early._thread.join()\n"  # a job refused before it asks: exits with the JVM's start done, or under way
)


def _early(mode: str) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, "-c", EARLY, mode], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    pid, *rest = done.stdout.split("\n", 1)
    return int(pid), rest[0].splitlines() if rest else []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_job_that_never_asks_for_its_early_session_ends_the_jvm_it_started() -> None:
    pid, _ = _early("untaken")
    assert not _alive(pid)


def test_an_early_session_asked_for_is_left_running_and_its_start_error_is_raised_where_asked() -> None:
    pid, out = _early("taken")
    try:
        assert out == ["session"] and _alive(pid)  # the job's own: it ends with the job's stdin, not killed
    finally:
        subprocess.run(["kill", "-9", str(pid)], check=False)
    pid, out = _early("fails")
    subprocess.run(["kill", "-9", str(pid)], check=False)
    assert out == ["the JVM did not start"]
