"""The binlog reader's compiled build (ingest.runtime.compiled): used only where fresh, the same modules otherwise."""

from __future__ import annotations

import importlib.machinery
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ingest.runtime import compiled
from ingest.source.binlog import quick_events, row_events

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A package directory with the modules' sources and a fresh build's stamp."""
    for m in compiled.MODULES:
        (tmp_path / f"{m}.py").write_text(f'"""{m}"""\n')
    (tmp_path / compiled.DIRECTORY).mkdir()
    (tmp_path / compiled.DIRECTORY / compiled.STAMP).write_text(json.dumps(compiled.stamp(tmp_path)))
    return tmp_path


def test_a_fresh_build_comes_first_on_the_packages_path(package: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert compiled.search_path([str(package), "/other"]) == [str(package / compiled.DIRECTORY), str(package), "/other"]
    assert compiled.stale(package) is None and not caplog.records


def test_without_a_build_the_modules_run_interpreted_and_nothing_is_said(
    package: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (package / compiled.DIRECTORY / compiled.STAMP).unlink()
    assert compiled.search_path([str(package)]) == [str(package)]
    assert compiled.stale(package) == "" and not caplog.records


def test_a_module_edited_since_the_build_is_named_and_runs_interpreted(
    package: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (package / "row_events.py").write_text('"""edited"""\n')
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        assert compiled.search_path([str(package)]) == [str(package)]
    assert compiled.stale(package) == "the sources of row_events changed since it was built"
    assert "not used: the sources of row_events changed" in caplog.text
    assert "python -m ingest.runtime.compiled" in caplog.text


def test_a_build_for_another_python_is_not_loaded(package: Path) -> None:
    stamp = compiled.stamp(package) | {"suffix": ".cpython-312-aarch64-linux-gnu.so"}
    (package / compiled.DIRECTORY / compiled.STAMP).write_text(json.dumps(stamp))
    assert compiled.search_path([str(package)]) == [str(package)]
    assert "built for another Python (.cpython-312-aarch64-linux-gnu.so" in (compiled.stale(package) or "")


def test_the_switch_runs_the_modules_interpreted_even_where_a_build_is_fresh(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(compiled.SWITCH, "0")
    assert compiled.search_path([str(package)]) == [str(package)]


def test_the_suite_reads_the_binlog_with_the_build_setup_made() -> None:
    """`make setup` and `make test` build the modules: the suite tests them compiled (INGEST_COMPILED=0: not)."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    if os.environ.get(compiled.SWITCH) == "0":
        assert quick_events.__file__.endswith(".py") and row_events.__file__.endswith(".py")
        return
    package = ROOT / "ingest" / "source" / "binlog"
    assert compiled.stale(package) is None, "build it: python -m ingest.runtime.compiled"
    for module in (quick_events, row_events):
        assert Path(module.__file__).parent == package / compiled.DIRECTORY and module.__file__.endswith(suffix)


def test_the_same_modules_interpreted_pass_their_unit_tests() -> None:
    """Where no build exists the same sources run interpreted: their unit tests pass that way too."""
    tests = [
        "tests/unit/test_quick_events.py",
        "tests/unit/test_row_events.py",
        "tests/unit/test_rejects.py",
        "tests/unit/test_table_maps.py",
        "tests/unit/test_compiled.py::test_the_suite_reads_the_binlog_with_the_build_setup_made",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env={**os.environ, compiled.SWITCH: "0"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
