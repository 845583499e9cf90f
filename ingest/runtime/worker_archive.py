"""Give PySpark's worker archive compiled bytecode, so each Python daemon Spark starts imports faster.

Spark starts its Python workers, and the planners of Python data sources, with `pyspark.zip` first
on their path. Python cannot cache bytecode for modules imported from a zip, so every such process
compiles pyspark from source: about 0.5 s of CPU each, and a job starts four of them. Setup rewrites
the archive of the virtualenv's pyspark once with an unchecked hash-based `.pyc` beside every `.py`
(PEP 552); sources stay for tracebacks. An interpreter of another version ignores the `.pyc` files
and compiles as before. Clusters (EMR, Dataproc) ship their own archive and are not touched.

The rewrite also leaves out pyspark's own test suites (`*/tests/*`, two thirds of the archive's entries): every
worker reads the archive's whole directory when it starts and again when Spark has it invalidate its import caches
(`setup_spark_files`), 0.2-0.4 s of CPU per process under load (py-spy, issue 51), and nothing imports them.

    python -m ingest.runtime.worker_archive     # idempotent
"""

from __future__ import annotations

import importlib.util
import logging
import marshal
import os
import sys
import types
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

MARKER = "pyspark/__init__.pyc"
TESTS = "/tests/"
"""Entries under a directory of this name are pyspark's test suites, left out."""
UNCHECKED_HASH = (1).to_bytes(4, "little")  # PEP 552 flags: hash-based, source not checked


def hash_pyc(code: types.CodeType, source: bytes) -> bytes:
    """A `.pyc` for `source` that the importer takes without comparing it to the source (PEP 552)."""
    return importlib.util.MAGIC_NUMBER + UNCHECKED_HASH + importlib.util.source_hash(source) + marshal.dumps(code)


def pyspark_archive() -> Path:
    """`pyspark.zip` of the installed pyspark (what Spark puts on its Python workers' path)."""
    import pyspark

    return Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"


def is_compiled(archive: Path) -> bool:
    """Rewritten already: bytecode in it, and no test suite."""
    with zipfile.ZipFile(archive) as zf:
        return MARKER in zf.NameToInfo and not any(TESTS in name for name in zf.NameToInfo)


def compile_archive(source: Path, target: Path, installed_as: Path) -> int:
    """Copy `source` to `target` without its test suites, adding a `.pyc` for every `.py`; returns how many were
    compiled.

    Code objects name their file as zipimport would (`<installed_as>/<module path>`), for tracebacks."""
    compiled = 0
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w") as zout:
        names = set(zin.namelist())
        for info in zin.infolist():
            if TESTS in f"/{info.filename}":
                continue
            data = zin.read(info)
            zout.writestr(info, data)
            if not info.filename.endswith(".py") or info.filename + "c" in names:
                continue
            code = compile(data, f"{installed_as}{os.sep}{info.filename}", "exec", dont_inherit=True)
            zout.writestr(zipfile.ZipInfo(info.filename + "c", info.date_time), hash_pyc(code, data))
            compiled += 1
    return compiled


def precompile(archive: Path) -> bool:
    """Rewrite `archive` in place (atomically) unless it already has bytecode; True if it was rewritten."""
    if is_compiled(archive):
        return False
    staged = archive.with_name(archive.name + ".compiling")
    count = compile_archive(archive, staged, archive)
    os.replace(staged, archive)
    log.info("compiled %d modules into %s", count, archive)
    return True


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    archive = pyspark_archive()
    if not archive.exists():
        log.info("no %s: nothing to compile", archive)
        return 0
    if not precompile(archive):
        log.info("%s already holds bytecode", archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
