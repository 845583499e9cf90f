"""The operator's commands besides `ingest run`: `status`, `verify`, `resnapshot`, and the progress `run` shows."""
