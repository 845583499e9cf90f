"""Where setup caches what it fetches, outside git."""

from __future__ import annotations

import os
from pathlib import Path


def tools_dir() -> Path:
    """Where setup puts binaries and jars it fetched (outside git): $INGEST_CACHE or ~/.cache/ingest."""
    return Path(os.environ.get("INGEST_CACHE", Path.home() / ".cache" / "ingest"))
