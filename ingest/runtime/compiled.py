"""The binlog reader's hot path compiled with mypyc: built by `make setup`, used where it is fresh, else interpreted.

`quick_events` (the everyday events read in place from the connection's buffer) and `row_events` (row images
decoded into the job's tuples) are plain, typed Python; mypyc compiles them into C extension modules as they are
(issue 65: the reader per single-row transaction, bench.reader). One source, two ways to run it:

- The build (`python -m ingest.runtime.compiled`, run by `make setup` and `make test`, and by infra/package.sh
  for a cluster's environment) writes the extension modules into `ingest/source/binlog/_compiled/` with a stamp:
  the SHA-256 of each module's source and the interpreter's extension suffix. It needs mypy (which carries mypyc),
  setuptools, a C compiler and the interpreter's headers.
- `ingest.source.binlog` puts that directory first on its `__path__` only when the stamp matches the sources
  beside it now (`search_path`): a module edited since the build runs interpreted, with a warning naming it, never
  as a stale build. Where no build exists (another architecture, a checkout without a compiler, the package read
  from a zip) the same modules run interpreted. `INGEST_COMPILED=0` runs them interpreted on purpose.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PACKAGE = ("source", "binlog")
"""The package of the compiled modules, under `ingest`."""
MODULES = ("quick_events", "row_events")
DIRECTORY = "_compiled"
"""Where the build goes, in the package's directory (git-ignored)."""
GROUP = "ingest.source.binlog.hot_path"
"""mypyc's name for the modules' shared library (`hot_path__mypyc`, found through the package's path too)."""
STAMP = "stamp.json"
SWITCH = "INGEST_COMPILED"
"""`0`: run the modules interpreted even where a fresh build exists."""

_warned: set[str] = set()


def stamp(package_dir: Path) -> dict[str, Any]:
    """What a build of the modules in `package_dir` is made from: their sources' digests and the interpreter's
    extension suffix (a build for another Python or platform does not load)."""
    return {
        "suffix": importlib.machinery.EXTENSION_SUFFIXES[0],
        "sources": {m: hashlib.sha256((package_dir / f"{m}.py").read_bytes()).hexdigest() for m in MODULES},
    }


def stale(package_dir: Path) -> str | None:
    """Why the build in `package_dir` cannot be used ("" for no build there), or None: it is fresh."""
    try:
        recorded = json.loads((package_dir / DIRECTORY / STAMP).read_text())
        current = stamp(package_dir)
    except (OSError, ValueError):  # no build here (or the package is read from a zip)
        return ""
    if recorded == current:
        return None
    if recorded.get("suffix") != current["suffix"]:
        return f"it was built for another Python ({recorded.get('suffix')}, this one loads {current['suffix']})"
    changed = [m for m in MODULES if recorded.get("sources", {}).get(m) != current["sources"][m]]
    return f"the sources of {', '.join(changed)} changed since it was built"


def search_path(path: Sequence[str]) -> list[str]:
    """The package's `__path__`, with the compiled modules' directory first when their build is fresh."""
    if not path or os.environ.get(SWITCH, "1") == "0":
        return list(path)
    package_dir = Path(path[0])
    why = stale(package_dir)
    if why is None:
        return [str(package_dir / DIRECTORY), *path]
    if why and str(package_dir) not in _warned:
        _warned.add(str(package_dir))
        log.warning(
            "the compiled binlog reader in %s is not used: %s. It runs interpreted, slower; build it again with "
            "`python -m ingest.runtime.compiled`",
            package_dir / DIRECTORY,
            why,
        )
    return list(path)


def build(ingest_dir: Path) -> Path:
    """Compile the modules of the `ingest` package at `ingest_dir` into its `_compiled` directory; returns it."""
    package_dir = ingest_dir.joinpath(*PACKAGE)
    target = package_dir / DIRECTORY
    sources = [f"ingest/{'/'.join(PACKAGE)}/{m}.py" for m in MODULES]
    with tempfile.TemporaryDirectory(prefix="ingest-compiled-") as work:
        # From a copy: setuptools writes build/ next to what it builds, and the checkout may be read-only.
        shutil.copytree(ingest_dir, Path(work) / "ingest", ignore=shutil.ignore_patterns("__pycache__", DIRECTORY))
        script = (
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            f"setup(name='ingest-compiled', ext_modules=mypycify({['--ignore-missing-imports', *sources]!r}, "
            f"opt_level='3', group_name={GROUP!r}), script_args=['-q', 'build_ext', '--inplace'])\n"
        )
        # Its own process, in the copy: mypyc reads no project configuration there, and its output goes there.
        done = subprocess.run([sys.executable, "-c", script], cwd=work, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"mypyc could not build {', '.join(sources)}:\n{done.stdout}{done.stderr}")
        built = Path(work, "ingest", *PACKAGE)
        fresh = Path(work) / DIRECTORY
        fresh.mkdir()
        for library in built.glob(f"*{importlib.machinery.EXTENSION_SUFFIXES[0]}"):
            shutil.copy2(library, fresh / library.name)
        (fresh / STAMP).write_text(json.dumps(stamp(package_dir), indent=2, sort_keys=True) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(fresh, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ingest.runtime.compiled", description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="build even if the build there is fresh")
    parser.add_argument(
        "--ingest-dir",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the `ingest` package to build in (default: this one)",
    )
    args = parser.parse_args(argv)
    if not args.force and stale(args.ingest_dir.joinpath(*PACKAGE)) is None:
        print(f"the compiled binlog reader is up to date in {args.ingest_dir.joinpath(*PACKAGE, DIRECTORY)}")
        return 0
    target = build(args.ingest_dir)
    print(f"compiled {', '.join(MODULES)} with mypyc into {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
