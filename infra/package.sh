#!/usr/bin/env bash
# Build what a Spark cluster needs to run the job, into dist/ (git-ignored, never committed).
#
# Usage:
#   infra/package.sh                      # build with python3
#   PYTHON=/usr/bin/python3.11 infra/package.sh
#
# Output:
#   dist/mysql_iceberg_ingest-<version>-py3-none-any.whl   the project wheel
#   dist/ingest-env.tar.gz   a virtualenv packed with venv-pack: the project and its runtime dependencies
#                            from pyproject.toml, WITHOUT pyspark (the cluster's Spark provides it). Ship it
#                            with `spark-submit --archives .../ingest-env.tar.gz#environment` and
#                            `--conf spark.pyspark.python=./environment/bin/python` (infra/emr, infra/dataproc).
#
# venv-pack does not pack the Python interpreter or its standard library: the environment points at the
# interpreter it was built with, so the cluster nodes need that same Python version at the same path, and
# the same OS family and CPU architecture (pyarrow and other wheels are native code). Build it on, or in a
# container of, the cluster's image (infra/README.md says how).
#
# PYTHON   interpreter to build with (default python3); 3.11 or newer (pyproject.toml). Use the path the
#          cluster nodes have (e.g. /usr/bin/python3.11): the packed environment links to it by that path.
# FAST     auto (default) | yes | no: pack the `fast` extra (mysqlclient, the C driver of the chunk reads,
#          snapshot.driver). It is built against libmariadb/libmysqlclient, which the build host needs
#          (libmariadb-dev, pkg-config, a C compiler) and the cluster nodes need at run time (libmariadb3).
#          auto packs it when it builds and otherwise warns (the job then reads chunks with PyMySQL).
# COMPILED auto (default) | yes: the binlog reader's hot path compiled with mypyc (ingest/runtime/compiled.py), which
#          needs a C compiler and Python's headers on the build host only. auto packs without it where it does not
#          build, with a warning (the reader then runs interpreted); yes fails instead.
# OUT      directory to build into (default dist)
# Pins in constraints.txt, when present, apply to every dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
# A PYTHONPATH that reaches this checkout would make pip take the project as installed already (its
# egg-info is here) and leave it out of the archive, and the import check below would pass anyway.
unset PYTHONPATH

PY="${PYTHON:-python3}"
OUT="${OUT:-dist}"
ARCHIVE="$OUT/ingest-env.tar.gz"
VENV_PACK="venv-pack==0.2.0"
FAST="${FAST:-auto}"
case "$FAST" in auto|yes|no) ;; *) echo "FAST must be auto, yes or no, got ${FAST}" >&2; exit 2 ;; esac

step() { printf '==> %s\n' "$*"; }

"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required, got " + sys.version)'

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

step "build tools ($VENV_PACK) in a temporary virtualenv"
"$PY" -m venv "$work/build"
"$work/build/bin/python" -m pip install -q --upgrade pip
"$work/build/bin/python" -m pip install -q "$VENV_PACK"

step "project wheel"
mkdir -p "$OUT"
rm -f "$OUT"/mysql_iceberg_ingest-*.whl "$ARCHIVE"
# From a copy of what the wheel is made of: setuptools writes build/ and *.egg-info/ next to the sources it
# builds, and a read-only checkout could not be packaged.
mkdir -p "$work/src"
cp -R pyproject.toml README.md ingest "$work/src/"
find "$work/src" \( -name __pycache__ -o -name _compiled \) -type d -prune -exec rm -rf {} +
out_dir="$(cd "$OUT" && pwd)"
"$work/build/bin/python" -m pip wheel -q --no-deps -w "$out_dir" "$work/src"
wheels=("$OUT"/mysql_iceberg_ingest-*.whl)
if [ "${#wheels[@]}" -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
  echo "expected one project wheel in $OUT/, got: ${wheels[*]}" >&2
  exit 1
fi
wheel="${wheels[0]}"

# Runtime dependencies as pyproject.toml declares them, minus pyspark.
mapfile -t deps < <("$PY" - <<'EOF'
import re
import tomllib

with open("pyproject.toml", "rb") as f:
    for requirement in tomllib.load(f)["project"]["dependencies"]:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        if name is None or re.sub(r"[-_.]+", "-", name.group(0)).lower() != "pyspark":
            print(requirement)
EOF
)
[ "${#deps[@]}" -gt 0 ] || { echo "no runtime dependencies found in pyproject.toml" >&2; exit 1; }
constraints=()
[ -f constraints.txt ] && constraints=(-c constraints.txt)

step "runtime virtualenv: ${wheel#"$OUT"/} + ${deps[*]}"
"$PY" -m venv "$work/env"
"$work/env/bin/python" -m pip install -q --upgrade pip
"$work/env/bin/python" -m pip install -q "${constraints[@]}" "${deps[@]}"
"$work/env/bin/python" -m pip install -q --no-deps "$wheel"

mapfile -t fast < <("$PY" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["fast"], sep="\n")')
case "$FAST" in
  no) step "fast extra: not packed (FAST=no); chunk reads will use PyMySQL" ;;
  yes|auto)
    step "fast extra: ${fast[*]}"
    if ! "$work/env/bin/python" -m pip install -q "${constraints[@]}" "${fast[@]}"; then
      [ "$FAST" = yes ] && { echo "FAST=yes: the fast extra does not build here" >&2; exit 1; }
      echo "warning: the fast extra (${fast[*]}) does not build here (needs libmariadb-dev, pkg-config, cc);" \
        "packing without it: chunk reads will use PyMySQL (snapshot.driver: auto)" >&2
    fi ;;
esac

# The binlog reader's hot path compiled with mypyc for this Python and architecture, into the installed package
# (ingest/runtime/compiled.py). mypy and setuptools stay in the build virtualenv; the environment only loads it.
# Where it does not build, the job runs the same modules interpreted (slower: docs/config.md).
step "compiled binlog reader (mypyc)"
site="$("$work/env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$work/build/bin/python" -m pip install -q "${constraints[@]}" mypy setuptools
if ! PYTHONPATH="$site" "$work/build/bin/python" -m ingest.runtime.compiled --ingest-dir "$site/ingest" \
    >"$work/compiled.log" 2>&1; then
  [ "${COMPILED:-auto}" = yes ] && { cat "$work/compiled.log" >&2; echo "COMPILED=yes: it does not build here" >&2; exit 1; }
  echo "warning: the compiled binlog reader does not build here (needs a C compiler and Python's headers);" \
    "packing without it: the reader runs interpreted (log: $(tail -3 "$work/compiled.log"))" >&2
fi
# (From another directory: the checkout's own ingest/ is not the one asked about.)
(cd "$work" && "$work/env/bin/python" -c 'from ingest.source.binlog import row_events as r; print("binlog reader:", "compiled" if r.__file__.endswith(".so") else "interpreted")')

# The job must import, and pyspark must not be there (a second, different Spark would shadow the cluster's).
"$work/env/bin/python" -c 'import ingest.cli, ingest.config, ingest.runtime.jars, pyiceberg, pyarrow, pymysql, pymysqlreplication, yaml, boto3'
"$work/env/bin/python" -c 'import importlib.util, sys; sys.exit("pyspark must not be packed" if importlib.util.find_spec("pyspark") else 0)'

step "pack $ARCHIVE"
# (venv-pack 0.2.0's --python-prefix writes wrong links for Python 3.10+, so the build interpreter's path is kept.)
"$work/build/bin/venv-pack" -p "$work/env" -o "$ARCHIVE" --quiet
chmod 0644 "$ARCHIVE"

target="$(readlink -f "$work/env/bin/python")"
version="$("$work/env/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
step "done"
ls -l "$wheel" "$ARCHIVE"
echo "The packed environment runs Python $version from $target: the cluster nodes need it there."
