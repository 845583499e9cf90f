"""Benchmarks that measure the job against plain baselines in the same run (see bench/README.md)."""
