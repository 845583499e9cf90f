"""The Iceberg runtime is chosen from the Spark that runs the job; any other Spark is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ingest.runtime.jars import (
    SUPPORTED_SPARK,
    UnsupportedSpark,
    check_spark,
    iceberg_runtime,
    maven_packages,
    spark_minor,
)
from ingest.runtime.spark import check_submitted_runtime

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("version", "minor"),
    [("4.0.1", "4.0"), ("4.1.4", "4.1"), ("4.0.2-amzn-0", "4.0"), ("4.1", "4.1"), ("10.12.0", "10.12")],
)
def test_the_minor_version_is_read_from_platform_version_strings(version: str, minor: str) -> None:
    assert spark_minor(version) == minor


@pytest.mark.parametrize("version", ["", "4", "four.one", "v4.1.0"])
def test_a_version_without_two_leading_numbers_is_refused(version: str) -> None:
    with pytest.raises(UnsupportedSpark, match="cannot read a Spark version"):
        spark_minor(version)


@pytest.mark.parametrize(
    ("version", "artifact"), [("4.0.1", "iceberg-spark-runtime-4.0_2.13"), ("4.1.4", "iceberg-spark-runtime-4.1_2.13")]
)
def test_each_supported_spark_gets_the_runtime_built_for_it(version: str, artifact: str) -> None:
    assert iceberg_runtime(version).artifact == artifact
    assert maven_packages(version).split(",")[0] == f"org.apache.iceberg:{artifact}:1.11.0"


@pytest.mark.parametrize("version", ["3.5.2", "3.3.4", "4.2.0", "5.0.0"])
def test_any_other_spark_is_refused_naming_the_versions_that_work(version: str) -> None:
    with pytest.raises(UnsupportedSpark) as refused:
        check_spark(version)
    works = " and ".join(SUPPORTED_SPARK)
    assert (
        str(refused.value)
        == f"Spark {version} is not supported: the job runs on Spark {works} (Scala 2.13, Iceberg 1.11.0)"
    )


def test_a_submitted_runtime_built_for_another_spark_is_refused_with_the_packages_to_submit() -> None:
    jars = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.11.0,org.apache.iceberg:iceberg-aws-bundle:1.11.0"
    with pytest.raises(
        UnsupportedSpark, match=r"built for Spark 4\.1, but this is Spark 4\.0\.2.*iceberg-spark-runtime-4\.0_2\.13"
    ):
        check_submitted_runtime("4.0.2", jars)
    check_submitted_runtime("4.1.4", jars)
    check_submitted_runtime("4.0.2", "/opt/jars/iceberg-spark-runtime-4.0_2.13-1.11.0.jar")
    check_submitted_runtime("4.0.2", "")  # the platform's own Iceberg, or none: nothing to compare


def test_ingest_run_on_spark_3_5_exits_2_with_one_line_before_connecting_anywhere(tmp_path: Path) -> None:
    config = tmp_path / "pipeline.yaml"
    # An unreachable source: were it tried first, the error would name it instead.
    config.write_text(
        "name: p\nsource: {host: 192.0.2.1, port: 9, user: u, password: {env: NO_SUCH_VAR_FOR_TEST}}\n"
        "tables: {include: ['a\\\\..*']}\n"
        f"sink: {{catalog: {{type: jdbc, uri: 'jdbc:sqlite:{tmp_path}/c.db', warehouse: 'file://{tmp_path}/w'}}}}\n"
    )
    script = textwrap.dedent(
        f"""
        import sys
        import pyspark
        pyspark.__version__ = "3.5.2"  # what the cluster's Spark 3.5 reports
        from ingest.cli import main
        sys.exit(main(["run", "--config", {str(config)!r}]))
        """
    )
    env = {**os.environ, "NO_SUCH_VAR_FOR_TEST": "x"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    refusal = "Spark 3.5.2 is not supported: the job runs on Spark 4.0 and 4.1 (Scala 2.13, Iceberg 1.11.0)"
    assert lines == [f"ingest: config error: {refusal}"], lines
