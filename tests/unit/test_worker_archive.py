"""The bytecode step for PySpark's worker archive: same modules, imported from `.pyc`, rewritten once."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from ingest.runtime.worker_archive import compile_archive, is_compiled, precompile


def _archive(path: Path) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pyspark/__init__.py", "")
        zf.writestr("wapkg/__init__.py", "")
        zf.writestr("wapkg/mod.py", "def answer():\n    return 42\n\ndef boom():\n    raise ValueError('boom')\n")
        zf.writestr("wapkg/data.txt", "not python")
        zf.writestr("wapkg/tests/__init__.py", "")
        zf.writestr("wapkg/tests/test_mod.py", "import wapkg.mod\n")
    return path


def _import_from(archive: Path, name: str) -> object:
    sys.path.insert(0, str(archive))
    try:
        for loaded in [m for m in sys.modules if m == "wapkg" or m.startswith("wapkg.")]:
            del sys.modules[loaded]
        __import__(name)
        return sys.modules[name]
    finally:
        sys.path.remove(str(archive))
        for loaded in [m for m in sys.modules if m == "wapkg" or m.startswith("wapkg.")]:
            del sys.modules[loaded]


def test_modules_import_from_bytecode_with_sources_and_other_files_kept(tmp_path: Path) -> None:
    source = _archive(tmp_path / "src.zip")
    target = tmp_path / "pyspark.zip"
    assert compile_archive(source, target, target) == 3
    with zipfile.ZipFile(target) as zf:
        assert zf.read("wapkg/data.txt") == b"not python"
        assert "wapkg/mod.py" in zf.namelist() and "wapkg/mod.pyc" in zf.namelist()
        assert not [n for n in zf.namelist() if "/tests/" in n]  # the test suite left out
    plain = _import_from(source, "wapkg.mod")
    compiled = _import_from(target, "wapkg.mod")
    assert plain.__file__.endswith("mod.py")  # type: ignore[attr-defined]
    assert compiled.__file__.endswith("mod.pyc")  # type: ignore[attr-defined]
    assert compiled.answer() == 42  # type: ignore[attr-defined]
    # Tracebacks name the file where zipimport would have compiled it.
    assert compiled.boom.__code__.co_filename == f"{target}/wapkg/mod.py"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="boom"):
        compiled.boom()  # type: ignore[attr-defined]


def test_precompile_rewrites_once(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "pyspark.zip")
    assert not is_compiled(archive)
    assert precompile(archive) is True
    assert is_compiled(archive)
    before = archive.read_bytes()
    assert precompile(archive) is False
    assert archive.read_bytes() == before
    assert not (tmp_path / "pyspark.zip.compiling").exists()
