# Every target is a one-liner; `make help` lists them.
PY := .venv/bin/python
PYTEST := .venv/bin/pytest
# make test runs whole test modules on this many workers (pytest-xdist): each worker starts its own servers and
# Spark sessions. On 2 cores 3 keep both busy (load about 10 on 2026-11-29; 2 workers were not tried); a machine
# with more cores gets one more worker than it has cores, as far as its memory goes (scripts/test-workers.sh).
TEST_WORKERS ?= $(shell scripts/test-workers.sh)
# Whole modules to each worker, in collection order: the longest first (tests/conftest.py, LONGEST_FIRST).
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: help setup deps demo compiled test test-unit test-integration lint bench chaos soak

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' Makefile | sed 's/:.*## /\t/'

setup: deps demo  ## install everything (system packages, MinIO, venv, jars), then run the demo

deps:  ## install everything, no demo
	scripts/setup.sh

demo:  ## ingest a sample MariaDB database into a local Iceberg warehouse and show the result
	.venv/bin/ingest demo

compiled:  ## compile the binlog reader's hot path with mypyc again if its sources changed (ingest/runtime/compiled.py)
	$(PY) -m ingest.runtime.compiled

test: lint compiled  ## lint, type-check, every test (unit and integration, real services), then the Spark 4.0 subset
	scripts/pytest-all.sh tests $(XDIST)
	scripts/test-spark-compat.sh $(XDIST)

test-unit: compiled  ## the fast tests only (no servers)
	scripts/pytest-all.sh tests -m "not integration"

test-integration: compiled  ## the integration tests only (real MariaDB, MinIO, PostgreSQL, Spark, Iceberg)
	scripts/pytest-all.sh tests -m integration $(XDIST)

soak:  ## the job for 60 minutes at 500 changes/s: memory, Iceberg files and lag over time (bench/README.md)
	$(PY) -m bench.soak

chaos:  ## the chaos test at full length: 50 SIGKILLs at each binlog row metadata setting (make test runs 6, at NO_LOG)
	CHAOS_KILLS=50 scripts/pytest-all.sh tests/integration/test_chaos.py -s

lint:  ## ruff and mypy --strict
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

bench:  ## the benchmarks of bench/ (snapshot, binlog, apply, then osc; print ratios against baselines in the same run)
	$(PY) -m bench.snapshot
	$(PY) -m bench.binlog
	$(PY) -m bench.apply
	$(PY) -m bench.osc
