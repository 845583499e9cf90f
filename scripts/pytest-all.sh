#!/usr/bin/env bash
# Runs pytest; a run that collects no test is a failure (pytest's exit code 5), never a silent pass.
# VENV names another virtualenv to run it in (scripts/test-spark-compat.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
"${VENV:-.venv}/bin/pytest" "$@"
code=$?
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure of the suite, not a pass" >&2
  exit 1
fi
exit "$code"
