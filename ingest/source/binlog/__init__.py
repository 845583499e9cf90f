"""Reading the binlog. Its hot path (`quick_events`, `row_events`) runs compiled where a fresh build is there."""

from ingest.runtime.compiled import search_path

__path__[:] = search_path(__path__)
