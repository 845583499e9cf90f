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
