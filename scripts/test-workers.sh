#!/usr/bin/env bash
# How many pytest-xdist workers make test runs (Makefile's TEST_WORKERS, which overrides it): one more than the
# machine's cores, as measured on 2 cores (3 workers keep both busy while a worker waits for a job or a server),
# at least 3, and no more than one per 4 GiB of available memory (a worker's MariaDB, MinIO, its Spark and the
# jobs it starts).
set -euo pipefail
cores=$(nproc)
mem_gib=$(awk '/^MemAvailable:/ {print int($2 / 1048576)}' /proc/meminfo)
by_memory=$((mem_gib / 4))
workers=$((cores + 1 > 3 ? cores + 1 : 3))
if [ "$by_memory" -ge 1 ] && [ "$workers" -gt "$by_memory" ]; then
  workers=$by_memory
fi
echo "$workers"
