"""`ingest snapshot`: ask the running job (or the next run) to copy tables, copy them again, or pause or resume
their copy; the job takes the request from the state table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ingest.config import PipelineConfig
from ingest.errors import ConfigError
from ingest.source.mysql import connect, list_tables
from ingest.state.table import StateTable

Action = Literal["snapshot", "again", "pause", "resume"]


@dataclass(frozen=True)
class Asked:
    """What `ingest snapshot` did."""

    tables: tuple[str, ...]
    """The tables it wrote a request for."""
    copying: dict[str, str]
    """Tables asked without `--again` whose copy the job has begun by itself (no request needed): progress."""


def ask_snapshot(config: PipelineConfig, tables: Sequence[str], action: Action = "snapshot") -> Asked:
    """`ingest snapshot`: record the request for the running job, or for the next `ingest run`."""
    if not tables:
        raise ConfigError("name at least one table: --table DB.TABLE")
    with connect(config.source) as conn:
        matched = {f"{db}.{t}" for db, t in list_tables(conn, config.tables)}
    unknown = [t for t in tables if t not in matched]
    if unknown:
        raise ConfigError(
            f"{', '.join(unknown)}: not a table the CDC user can see that `tables.include` of pipeline "
            f"{config.name!r} matches (patterns: {[p.pattern for p in config.tables.include]})"
        )
    state = StateTable.open(config.sink, config.name)
    progress: dict[str, str] = {}
    if action == "snapshot":
        # The job copies a table created or renamed into its patterns by itself, so it may have begun before
        # the request came: the copy asked for is under way, which is what the user wanted.
        copying = {t for t in tables if state.plan(t) is not None and state.unfinished(t)}
        captured = [t for t in tables if state.plan(t) is not None and t not in copying]
        if captured:
            raise ConfigError(
                f"{', '.join(captured)}: already captured by pipeline {config.name!r}; add --again to drop what "
                "it holds and copy it again"
            )
        progress = {t: f"chunks {len(state.done(t))}/{len(state.plan(t) or [])} read" for t in sorted(copying)}
        tables = [t for t in tables if t not in copying]
        if not tables:
            return Asked((), progress)
    if action == "pause":
        complete = [t for t in tables if state.plan(t) is not None and not state.unfinished(t)]
        if complete:
            raise ConfigError(f"{', '.join(complete)}: its snapshot is complete, there is nothing to pause")
        state.pause(tables)
    elif action == "resume":
        state.resume(tables)
    else:
        state.ask_snapshot(tables, again=action == "again")
    return Asked(tuple(tables), progress)
