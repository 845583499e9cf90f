"""Real servers started on demand for the demo and the integration tests.

Each server runs as a child process on a free port with a private data directory, and is stopped
(and its directory removed) when its context ends. Nothing here is used in production runs.
"""
