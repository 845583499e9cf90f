"""Every error the job raises on purpose.

Errors are split the dlt way: ``TerminalError`` needs a person (bad config, missing grant, purged
binlog); ``TransientError`` may succeed when retried (lost connection, Iceberg commit conflict).
Each message says what happened, to which table/chunk/position, and what the user can do.
"""

from __future__ import annotations


class IngestError(Exception):
    """Base class of every error raised by this project."""


class TerminalError(IngestError):
    """Retrying will not help; a person must act."""


class TransientError(IngestError):
    """The same operation may succeed when retried from fresh state."""


class ConfigError(TerminalError):
    """The pipeline file or the command line is invalid; the message names the key."""


class SourceError(TerminalError):
    """MySQL/MariaDB is set up in a way the job cannot work with (settings, grants, schema)."""


class SourceConnectError(SourceError):
    """A session to the source could not be opened. `lost`: the server could not be reached (it may be restarting),
    as opposed to refused for a reason a person must fix (password, grant, TLS); a chunk read retries the former."""

    def __init__(self, message: str, lost: bool = False) -> None:
        super().__init__(message)
        self.lost = lost


class SchemaChangeError(SourceError):
    """A captured table's schema changed in the binlog in a way the job must not (or was told not to) follow."""


class MissingPrivilegeError(SourceError):
    """The CDC user lacks a grant the job needs; the message names it."""


class UnsupportedTableError(SourceError):
    """A captured table cannot be chunked as configured (no usable key, unsupported key type)."""


class BinlogPurgedError(TerminalError):
    """The position to resume from is no longer on the server."""


class SinkError(TerminalError):
    """The Iceberg side refused something that retrying will not fix."""


class SourceUnreachableError(TransientError):
    """The source stayed unreachable for longer than the job reconnects (`source.reconnect_seconds`)."""


class SinkUnreachableError(TransientError):
    """The catalog or the object store stayed unreachable for longer than the job waits (`sink.reconnect_seconds`)."""


class CommitConflictError(TransientError):
    """Another writer committed first; the batch is retried from fresh table state."""


class ServiceStartError(TerminalError):
    """A local service (demo or test MariaDB, MinIO, PostgreSQL) did not start; the log tail is included."""
