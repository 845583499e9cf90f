#!/usr/bin/env bash
# The compatibility subset (tests marked spark_compat) on the other supported Spark: PySpark 4.0 with the
# Iceberg runtime built for 4.0, against the same real services. setup builds its virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=".venv-spark4.0"
[ -x "$VENV/bin/pytest" ] || { echo "$VENV is missing: run make setup (or make deps)" >&2; exit 1; }
"$VENV/bin/python" -c 'import pyspark, sys; sys.exit(0 if pyspark.__version__.startswith("4.0.") else "expected PySpark 4.0, got " + pyspark.__version__)'
# binlog_row_metadata NO_LOG changes only the Python side: its runs stay in the full suite.
VENV="$VENV" exec scripts/pytest-all.sh tests -m spark_compat -k "not NO_LOG" "$@"
