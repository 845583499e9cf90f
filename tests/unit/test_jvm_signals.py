"""The JVM the job launches ignores SIGTERM (ingest.runtime.spark.jvm_ignoring_sigterm): a SIGTERM to the job's whole
process group reaches only the job, which stops after its commit. Tried on a stand-in process, launched the way
pyspark launches its gateway (through `pyspark.java_gateway.Popen`, with pyspark's own preexec function)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pyspark.java_gateway

from ingest.runtime.spark import jvm_ignoring_sigterm

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
    with jvm_ignoring_sigterm():
        assert _launch(preexec_fn=pysparks) == "SIG_IGN SIG_IGN"
        assert _launch() == "SIG_IGN handler"
    assert _launch() == "SIG_DFL handler"  # put back
