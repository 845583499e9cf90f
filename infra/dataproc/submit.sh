#!/usr/bin/env bash
# Submit the ingestion job to Google Cloud Dataproc (a cluster job) or Dataproc Serverless (a batch).
#
# Usage:
#   infra/dataproc/submit.sh --config FILE --gcs-prefix gs://BUCKET/PREFIX --cluster NAME [--region REGION]
#   infra/dataproc/submit.sh --config FILE --gcs-prefix gs://BUCKET/PREFIX --serverless [--batch ID] [--region REGION]
#     [--archive dist/ingest-env.tar.gz] [--job jobs/ingest_job.py] [--no-archive]
#     [--property KEY=VALUE]... [--dry-run] [-- GCLOUD_FLAG...]
#
#   --config FILE        the pipeline YAML file; shipped with --files, the job gets `--config <its name>`
#   --gcs-prefix URI     where the archive, the job and the pipeline file are copied (gcloud storage cp)
#   --cluster NAME       `gcloud dataproc jobs submit pyspark` to this cluster (YARN, cluster deploy mode)
#   --serverless         `gcloud dataproc batches submit pyspark` (Dataproc Serverless)
#   --batch ID           Serverless batch ID (default: gcloud picks one)
#   --archive PATH       packed environment from infra/package.sh (default dist/ingest-env.tar.gz)
#   --no-archive         ship no environment: the image (--container-image) or cluster already has the project
#   --property KEY=VALUE extra Spark property (repeatable; never a secret: properties are readable by job viewers)
#   --dry-run            print the commands, run nothing
#   -- GCLOUD_FLAG...    passed to gcloud as is, e.g. -- --project=my-project --container-image=IMAGE
#
# The job runs as `ingest_job.py --config <pipeline file name> --until-caught-up`, with
# spark.jars.packages = the jars of ingest.runtime.jars (read from it, never copied). See infra/README.md.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "infra/dataproc/submit.sh: $*" >&2; exit 2; }

config="" prefix="" cluster="" serverless=0 batch="" region="" dry_run=0 use_archive=1
archive="$ROOT/dist/ingest-env.tar.gz"
job="$ROOT/jobs/ingest_job.py"
properties=()
gcloud_flags=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="${2:?--config needs a file}"; shift 2 ;;
    --gcs-prefix) prefix="${2:?--gcs-prefix needs gs://bucket/prefix}"; shift 2 ;;
    --cluster) cluster="${2:?--cluster needs a name}"; shift 2 ;;
    --serverless) serverless=1; shift ;;
    --batch) batch="${2:?--batch needs an id}"; shift 2 ;;
    --region) region="${2:?--region needs a region}"; shift 2 ;;
    --archive) archive="${2:?--archive needs a file}"; shift 2 ;;
    --no-archive) use_archive=0; shift ;;
    --job) job="${2:?--job needs a file}"; shift 2 ;;
    --property) properties+=("${2:?--property needs KEY=VALUE}"); shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; gcloud_flags=("$@"); break ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
  esac
done

[ -n "$config" ] || die "--config is required"
[ -n "$prefix" ] || die "--gcs-prefix is required"
[[ "$prefix" =~ ^gs://[a-z0-9][a-z0-9._-]*[a-z0-9](/.*)?$ ]] || die "--gcs-prefix must be gs://bucket[/prefix], got $prefix"
prefix="${prefix%/}"
if [ "$serverless" -eq 1 ]; then
  [ -z "$cluster" ] || die "give --cluster or --serverless, not both"
else
  [ -n "$cluster" ] || die "give --cluster NAME or --serverless"
  [ -z "$batch" ] || die "--batch is for --serverless"
fi
[ -f "$config" ] || die "no pipeline file $config"
for p in "${properties[@]}"; do
  [[ "$p" == *=* && "$p" != *"#"* ]] || die "--property takes KEY=VALUE (without '#'), got $p"
  key="${p%%=*}"
  if [[ "$key" =~ [Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]|[Ss][Ee][Cc][Rr][Ee][Tt]|[Tt][Oo][Kk][Ee][Nn]|[Cc][Rr][Ee][Dd][Ee][Nn][Tt][Ii][Aa][Ll] ]] \
      && [[ "$key" != *provider ]]; then
    die "--property $key=... would put a secret into the job's properties; see infra/README.md (Secrets)"
  fi
done

if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY=python3
fi
# The jars, as ingest/runtime/jars.py pins them (the checkout is importable even without `pip install -e .`).
packages="$(PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
  'from ingest.runtime.jars import REQUIRED_JARS; print(",".join(j.coordinate for j in REQUIRED_JARS))')"
[ -n "$packages" ] || die "could not read the jar coordinates from ingest.runtime.jars"

# Warn about plain-text passwords: the file is copied to Cloud Storage as is (and the job refuses them).
"$PY" - "$config" <<'EOF' || true
import sys

import yaml


def walk(data, path=""):
    if isinstance(data, dict):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if "password" in str(key).lower() and isinstance(value, str):
                yield where
            else:
                yield from walk(value, where)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from walk(value, f"{path}[{i}]")


with open(sys.argv[1]) as f:
    for key in walk(yaml.safe_load(f)):
        print(f"WARNING: {sys.argv[1]}: `{key}` is a plain-text password; use {{env: NAME}} or {{file: PATH}}"
              " (infra/README.md, Secrets)", file=sys.stderr)
EOF

config_name="$(basename "$config")"
uploads=("$job" "$config")
props=()
if [ "$use_archive" -eq 1 ]; then
  uploads=("$archive" "${uploads[@]}")
  props+=("spark.pyspark.python=./environment/bin/python")
fi
props+=("spark.jars.packages=$packages")
if [ "$serverless" -eq 1 ]; then
  cmd=(gcloud dataproc batches submit pyspark "$prefix/$(basename "$job")")
  [ -z "$batch" ] || cmd+=("--batch=$batch")
else
  # Cluster deploy mode: the driver runs in a YARN container, where the archive and the pipeline file are.
  props=("spark.submit.deployMode=cluster" "${props[@]}")
  cmd=(gcloud dataproc jobs submit pyspark "$prefix/$(basename "$job")" "--cluster=$cluster")
fi
[ -z "$region" ] || cmd+=("--region=$region")
[ "$use_archive" -eq 0 ] || cmd+=("--archives=$prefix/$(basename "$archive")#environment")
cmd+=("--files=$prefix/$config_name")
props+=("${properties[@]}")
# '#' separates the properties (gcloud topic escaping): spark.jars.packages itself contains commas.
cmd+=("--properties=^#^$(IFS='#'; echo "${props[*]}")")
cmd+=("${gcloud_flags[@]}" -- --config "$config_name" --until-caught-up)
copy=(gcloud storage cp "${uploads[@]}" "$prefix/")

if [ "$dry_run" -eq 1 ]; then
  printf '%q ' "${copy[@]}"; echo
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
for f in "${uploads[@]}"; do
  [ -f "$f" ] || die "missing $f (build the archive with infra/package.sh, or pass --no-archive)"
done
"${copy[@]}"
"${cmd[@]}"
