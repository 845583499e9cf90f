"""Durable job state, kept in Iceberg only (no Spark checkpoint is needed to resume)."""
