"""The JVM class archive: mapped only once trained, never half-written (ingest/runtime/class_archive.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ingest.runtime import class_archive
from ingest.runtime.session_conf import JIT
from ingest.runtime.spark import launch_conf, log_options


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INGEST_CACHE", str(tmp_path))
    return tmp_path


def test_the_driver_maps_the_archive_only_once_setup_trained_it(cache: Path) -> None:
    assert class_archive.driver_options() == []
    assert launch_conf()["spark.driver.extraJavaOptions"].split() == [JIT, *log_options("ERROR")]
    path = class_archive.archive_path()
    assert path is not None and path.parent == cache / "jvm"
    path.parent.mkdir()
    path.write_bytes(b"trained")
    driver = launch_conf()["spark.driver.extraJavaOptions"].split()
    assert driver == [JIT, f"-XX:SharedArchiveFile={path}", class_archive.QUIET, *log_options("ERROR")]
    # Executors of a cluster have other class paths: they only get the JIT setting.
    assert launch_conf()["spark.executor.extraJavaOptions"] == JIT


def test_spark_logs_at_the_level_asked_from_the_jobs_own_log4j_file() -> None:
    driver = launch_conf("WARN")["spark.driver.extraJavaOptions"].split()
    assert "-Dingest.spark.log.level=WARN" in driver
    (config,) = [o.removeprefix("-Dlog4j2.configurationFile=file:") for o in driver if "configurationFile" in o]
    assert "${sys:ingest.spark.log.level:-ERROR}" in Path(config).read_text()


def test_the_archive_name_follows_the_java_binary(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = class_archive.archive_path()
    java = class_archive.java_binary()
    assert here is not None and java is not None
    other_home = tmp_path / "jdk"
    (other_home / "bin").mkdir(parents=True)
    shutil.copy(java, other_home / "bin" / "java")
    monkeypatch.setenv("JAVA_HOME", str(other_home))
    assert class_archive.java_binary() == (other_home / "bin" / "java").resolve()
    assert class_archive.archive_path() not in (None, here)


def test_a_training_whose_archive_does_not_map_puts_nothing_in_place(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncated archive would crash every later JVM (SIGBUS): `java -Xshare:on` must map it first."""

    def truncated_dump(java_options: str) -> str:
        partial = next(o for o in java_options.split() if o.startswith("-XX:ArchiveClassesAtExit="))
        Path(partial.split("=", 1)[1]).write_bytes(b"\x00" * 4096)
        return "."

    monkeypatch.setattr(class_archive, "_run_workload", truncated_dump)
    assert class_archive.train(JIT) is None
    assert class_archive.driver_options() == []
    assert list((cache / "jvm").iterdir()) == []  # no archive, no partial file left


def test_training_keeps_the_archive_of_the_other_virtualenvs_spark(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setup trains the suite's Spark and then the compatibility subset's: the second must not delete the first
    (it did, and every Spark 4.1 start in `make test` ran without its archive). An archive of this PySpark for
    another java is never mapped again and goes."""
    path = class_archive.archive_path()
    assert path is not None
    path.parent.mkdir()
    other_spark = path.parent / "spark-3.9.9-0123456789ab.jsa"
    other_java = path.with_name(path.name.rsplit("-", 1)[0] + "-0123456789ab.jsa")
    for old in (other_spark, other_java):
        old.write_bytes(b"trained")

    def dump(java_options: str) -> str:
        partial = next(o for o in java_options.split() if o.startswith("-XX:ArchiveClassesAtExit="))
        Path(partial.split("=", 1)[1]).write_bytes(b"trained")
        return "."

    monkeypatch.setattr(class_archive, "_run_workload", dump)
    monkeypatch.setattr(class_archive, "_maps", lambda archive, class_path: True)
    assert class_archive.train(JIT) == path
    assert sorted((cache / "jvm").iterdir()) == sorted([path, other_spark])
