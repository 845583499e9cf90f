"""How `ingest` ends on an error it did not raise on purpose (ingest/cli.py `_unexpected`): one line, exit 4 when a
server could not be reached (retrying may succeed), 3 otherwise."""

from __future__ import annotations

import pymysql
import pytest

from ingest.cli import EXIT_TERMINAL, EXIT_TRANSIENT, _unexpected


class Py4JJavaError(Exception):
    """As py4j names it: told apart by its text only."""


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query"), EXIT_TRANSIENT),
        (
            OSError("When writing to key 'k' in bucket 'b': AWS Error NETWORK_CONNECTION during PutObject"),
            EXIT_TRANSIENT,
        ),
        (Exception("(psycopg2.OperationalError) server closed the connection unexpectedly"), EXIT_TRANSIENT),
        (
            Py4JJavaError("An error occurred while calling o98.sql.\n: ... Unable to execute HTTP request"),
            EXIT_TRANSIENT,
        ),
        (ValueError("a bug"), EXIT_TERMINAL),
        (Py4JJavaError("An error occurred while calling o98.sql.\n: [TABLE_OR_VIEW_NOT_FOUND] ..."), EXIT_TERMINAL),
    ],
)
def test_an_unexpected_error_is_one_line_and_transient_when_a_server_was_away(
    error: Exception, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _unexpected(error) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ingest: transient error: " if code == 4 else "ingest: unexpected ")
    assert "Traceback" not in err
