"""SQL run from a chunk hook, on a Spark executor (pickled with the hook, so only plain values)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def run_once(socket: str, db: str, marker: str, statements: Sequence[tuple[str, Sequence[Any] | None]]) -> None:
    """Run `statements` as root through the server's socket unless the table `marker` says they ran: Spark may
    run a task again, and the DML must happen once."""
    import pymysql

    with pymysql.connect(unix_socket=socket, user="root", database=db, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {marker}")
            if cur.fetchone()[0]:
                return
            cur.execute(f"INSERT INTO {marker} VALUES (1)")
            for statement, params in statements:
                cur.execute(statement, params)
