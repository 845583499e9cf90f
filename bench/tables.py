"""The source tables the benches share and the writers that change them: `bench.items` (bench.snapshot's one wide
table), bench.binlog's three tables (`orders`, `customers`, `events` with a VARCHAR key) with their key space and
set-based rounds of changes, and the plain read every snapshot is compared with."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import pymysql.cursors

from bench import harness
from ingest.config import PipelineConfig
from ingest.devservers.mariadb import MariaDBServer
from ingest.model.position import BinlogPosition

TABLE = "items"
TABLES = ("orders", "customers", "events")
LOAD_SLICE = 250_000
"""Rows per INSERT ... SELECT when filling bench.items."""
SLICE = 1000
"""Rows per set-based statement when recording the binlog; a transaction holds up to 2 * SLICE row changes."""
STATUSES = ("new", "paid", "shipped", "done")
US_NOW = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
"""The server's wall clock at the statement, in microseconds since the epoch (same host clock as ours)."""
ORDER_COLUMNS = "id, customer_id, status, amount, created_at, updated_us, note"
MIX = (
    ("orders", "insert"),
    ("orders", "update"),
    ("orders", "delete"),
    ("orders", "update"),
    ("orders", "update"),
    ("events", "insert"),
    ("events", "update"),
    ("events", "delete"),
    ("customers", "update"),
    ("customers", "update"),
)
"""The writer's cycle of statements: 2 inserts, 6 updates, 2 deletes in 10; the tables keep their row counts."""


def select_all(server: MariaDBServer, names: list[str]) -> dict[str, Any]:
    """The baseline of a snapshot: one PyMySQL connection as the CDC user streams `SELECT *` of each table with an
    unbuffered SSCursor, rows discarded; rows, seconds, CPU."""

    def body() -> dict[str, Any]:
        conn = pymysql.connect(
            host=server.host,
            port=server.port,
            user=harness.CDC_USER,
            password=os.environ[harness.PASSWORD_ENV],
            charset="utf8mb4",
            init_command="SET time_zone = '+00:00'",
        )
        rows = 0
        try:
            for name in names:
                with conn.cursor(pymysql.cursors.SSCursor) as cur:
                    cur.execute("SELECT * FROM {}.{}".format(*(f"`{part}`" for part in name.split("."))))
                    for _ in cur:
                        rows += 1
        finally:
            conn.close()
        return {"rows": rows}

    return harness.measured_here(server, body)


# ---------------------------------------------------------------------------------------------------
# bench.items

COLUMNS = "id, c_bigint, c_varchar, c_decimal, c_datetime, c_timestamp, c_double, c_tinyint, c_text"


def create_table(server: MariaDBServer, table: str) -> None:
    server.execute(
        f"CREATE DATABASE IF NOT EXISTS {harness.DATABASE}",
        f"DROP TABLE IF EXISTS {harness.DATABASE}.{table}",
        f"""CREATE TABLE {harness.DATABASE}.{table} (
            id INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
            c_bigint BIGINT NOT NULL,
            c_varchar VARCHAR(64) NOT NULL,
            c_decimal DECIMAL(12,2) NULL,
            c_datetime DATETIME(6) NOT NULL,
            c_timestamp TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
            c_double DOUBLE NULL,
            c_tinyint TINYINT NOT NULL,
            c_text TEXT NOT NULL
        ) ENGINE=InnoDB""",
    )


def sequence(offset: int, n: int) -> str:
    """Rows `s` = offset+1 .. offset+n from the sequence engine, for INSERT ... SELECT."""
    return f"(SELECT CAST(seq + {offset} AS SIGNED) AS s FROM {harness.DATABASE}.seq_1_to_{n}) AS g"


def insert_unlogged(
    server: MariaDBServer, rows: int, insert: Callable[[int, int], str], step: int = LOAD_SLICE
) -> float:
    """`insert(offset, n)` for slices of rows 1..`rows`, kept out of the binlog (the snapshot reads the rows, the binlog
    would only cost time and disk); the seconds taken."""
    started = time.perf_counter()
    with server.admin(harness.DATABASE) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        for offset in range(0, rows, step):
            cur.execute(insert(offset, min(step, rows - offset)))
    return time.perf_counter() - started


def fill_table(server: MariaDBServer, table: str, rows: int) -> float:
    """bench.items' rows 1..`rows`; the seconds taken."""
    return insert_unlogged(
        server,
        rows,
        lambda offset, n: (
            f"INSERT INTO {harness.DATABASE}.{table} ({COLUMNS}) SELECT "
            "s, s * 2654435761, CONCAT('item-', s, '-', LEFT(MD5(s), 16)), IF(s % 17 = 0, NULL, (s % 10000000) / 100), "
            "TIMESTAMP'2020-01-01 00:00:00' + INTERVAL s * 1000003 MICROSECOND, "
            "FROM_UNIXTIME(1600000000 + s), IF(s % 13 = 0, NULL, s / 7e0), s % 256 - 128, "
            f"RPAD(CONCAT('note ', s, ': '), 60, 'lorem ipsum dolor sit amet ') FROM {sequence(offset, n)}"
        ),
    )


def drop_table(server: MariaDBServer, table: str) -> None:
    server.execute(f"DROP TABLE IF EXISTS {harness.DATABASE}.{table}")


# ---------------------------------------------------------------------------------------------------
# bench.binlog's three tables


def create_tables(server: MariaDBServer) -> None:
    server.execute(
        f"CREATE DATABASE IF NOT EXISTS {harness.DATABASE}",
        *(f"DROP TABLE IF EXISTS {harness.DATABASE}.{t}" for t in TABLES),
        f"""CREATE TABLE {harness.DATABASE}.orders (
            id INT NOT NULL PRIMARY KEY,
            customer_id BIGINT NOT NULL,
            status VARCHAR(16) NOT NULL,
            amount DECIMAL(12,2) NULL,
            created_at DATETIME(6) NOT NULL,
            updated_us BIGINT NOT NULL,
            note VARCHAR(64) NULL
        ) ENGINE=InnoDB""",
        f"""CREATE TABLE {harness.DATABASE}.customers (
            id BIGINT NOT NULL PRIMARY KEY,
            name VARCHAR(64) NOT NULL,
            email VARCHAR(128) NOT NULL,
            balance DECIMAL(14,2) NOT NULL,
            tier TINYINT NOT NULL,
            updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
        ) ENGINE=InnoDB""",
        f"""CREATE TABLE {harness.DATABASE}.events (
            event_key VARCHAR(40) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY,
            kind VARCHAR(16) NOT NULL,
            payload TEXT NOT NULL,
            score DOUBLE NULL,
            seen_at DATETIME(3) NOT NULL,
            n INT NOT NULL
        ) ENGINE=InnoDB""",
    )


def event_key(n: int) -> str:
    """Zero-padded, so the keys' collation order is their numeric order and ranges are BETWEEN two keys."""
    return f"ev-{n:012d}"


@dataclass
class KeySpace:
    """The live key ranges of the three tables: deletes take keys from the bottom, inserts add at the top."""

    orders_lo: int = 1
    orders_hi: int = 1
    """Next new order id."""
    customers_hi: int = 1
    events_lo: int = 1
    events_hi: int = 1


def _orders_select(first: int, n: int, version: str) -> str:
    return (
        f"SELECT s, s % 5000 + 1, ELT(1 + s % 4, {', '.join(repr(s) for s in STATUSES)}), "
        "IF(s % 11 = 0, NULL, (s % 100000) / 100), TIMESTAMP'2024-01-01 00:00:00' + INTERVAL s SECOND, "
        f"{US_NOW}, CONCAT('order ', s, ' {version}') "
        f"FROM {sequence(first - 1, n)}"
    )


def _customers_select(first: int, n: int) -> str:
    return (
        "SELECT s, CONCAT('customer ', s), CONCAT('c', s, '@example.com'), s * 1.25, s % 5, NOW(6) "
        f"FROM {sequence(first - 1, n)}"
    )


def _events_select(first: int, n: int) -> str:
    return (
        "SELECT CONCAT('ev-', LPAD(s, 12, '0')), ELT(1 + s % 3, 'click', 'view', 'buy'), "
        "CONCAT('{\"n\":', s, ',\"tag\":\"', MD5(s), '\"}'), IF(s % 7 = 0, NULL, s / 3e0), NOW(3), s "
        f"FROM {sequence(first - 1, n)}"
    )


def load_initial(server: MariaDBServer, orders: int) -> KeySpace:
    """The initial rows (kept out of the binlog: the snapshot reads them); customers and events are smaller."""
    customers, events = max(orders // 4, SLICE), max(orders // 2, SLICE)
    with server.admin(harness.DATABASE) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"INSERT INTO orders ({ORDER_COLUMNS}) {_orders_select(1, orders, 'v0')}")
        columns = "id, name, email, balance, tier, updated_at"
        cur.execute(f"INSERT INTO customers ({columns}) {_customers_select(1, customers)}")
        cur.execute(f"INSERT INTO events (event_key, kind, payload, score, seen_at, n) {_events_select(1, events)}")
    return KeySpace(1, orders + 1, customers + 1, 1, events + 1)


def _window(lo: int, hi: int, size: int, step: int) -> int:
    """The first key of a window of `size` live keys in [lo, hi), moving by `step` per call (wrapping)."""
    span = hi - lo - size
    return lo if span <= 0 else lo + step % (span + 1)


def round_transactions(keys: KeySpace, r: int) -> list[list[str]]:
    """One round of transactions, about 4.25 * SLICE row changes over the three tables; updates `keys`."""
    k, half, quarter = SLICE, SLICE // 2, SLICE // 4
    db = harness.DATABASE
    txs: list[list[str]] = []
    # 1. k new orders.
    txs.append([f"INSERT INTO {db}.orders ({ORDER_COLUMNS}) {_orders_select(keys.orders_hi, k, f'r{r}')}"])
    keys.orders_hi += k
    # 2. One transaction over the three tables: k order updates, k/2 customer updates, k/2 new events.
    u = _window(keys.orders_lo, keys.orders_hi, k, r * 7919)
    c = _window(1, keys.customers_hi, half, r * 3571)
    txs.append(
        [
            f"UPDATE {db}.orders SET status = ELT(1 + (id + {r}) % 4, 'new', 'paid', 'shipped', 'done'), "
            f"amount = IFNULL(amount, 0) + 1, updated_us = {US_NOW} WHERE id BETWEEN {u} AND {u + k - 1}",
            f"UPDATE {db}.customers SET balance = balance + 1, tier = (tier + 1) % 5, updated_at = NOW(6) "
            f"WHERE id BETWEEN {c} AND {c + half - 1}",
            f"INSERT INTO {db}.events (event_key, kind, payload, score, seen_at, n) "
            f"{_events_select(keys.events_hi, half)}",
        ]
    )
    keys.events_hi += half
    # 3. k/2 event updates by a VARCHAR key range.
    e = _window(keys.events_lo, keys.events_hi, half, r * 4093)
    txs.append(
        [
            f"UPDATE {db}.events SET n = n + 1, score = IFNULL(score, 0) + 0.5, seen_at = NOW(3) "
            f"WHERE event_key BETWEEN '{event_key(e)}' AND '{event_key(e + half - 1)}'"
        ]
    )
    # 4. Deletes of the oldest k/4 orders and k/4 events.
    txs.append(
        [
            f"DELETE FROM {db}.orders WHERE id BETWEEN {keys.orders_lo} AND {keys.orders_lo + quarter - 1}",
            f"DELETE FROM {db}.events WHERE event_key BETWEEN '{event_key(keys.events_lo)}' "
            f"AND '{event_key(keys.events_lo + quarter - 1)}'",
        ]
    )
    keys.orders_lo += quarter
    keys.events_lo += quarter
    # 5. k/4 new customers.
    txs.append(
        [
            f"INSERT INTO {db}.customers (id, name, email, balance, tier, updated_at) "
            f"{_customers_select(keys.customers_hi, quarter)}"
        ]
    )
    keys.customers_hi += quarter
    return txs


def binlog_position(config: PipelineConfig) -> BinlogPosition:
    """The source's binlog position now, read as the job reads its watermarks."""
    from ingest.source.mysql import connect
    from ingest.source.watermark import read_watermark

    with connect(config.source) as conn:
        return read_watermark(conn, "mariadb").position


def record_binlog(server: MariaDBServer, config: PipelineConfig, keys: KeySpace, changes: int) -> dict[str, Any]:
    """Write at least `changes` row changes in multi-row transactions; the binlog range they occupy."""
    start = binlog_position(config)
    affected = transactions = rounds = 0
    started = time.perf_counter()
    with server.admin(harness.DATABASE) as conn, conn.cursor() as cur:
        while affected < changes:
            for tx in round_transactions(keys, rounds):
                cur.execute("BEGIN")
                for statement in tx:
                    affected += int(cur.execute(statement))
                cur.execute("COMMIT")
                transactions += 1
            rounds += 1
    seconds = time.perf_counter() - started
    end = binlog_position(config)
    return {
        "start": str(start),
        "end": str(end),
        "bytes": end.pos - start.pos if end.file == start.file else None,
        "rows_affected": affected,
        "transactions": transactions,
        "rounds": rounds,
        "seconds": round(seconds, 3),
    }


def three_tables_document(
    name: str, server_id: int, host: str, port: int, warehouse: Path, **sections: Any
) -> dict[str, Any]:
    """The pipeline over the three tables into an embedded warehouse, snapshot parallelism 2, Spark local[2]."""
    include = rf"{harness.DATABASE}\.({'|'.join(TABLES)})"
    sections = {"snapshot": {"parallelism": 2}, "spark": {"master": "local[2]"}, **sections}
    return harness.pipeline_document(name, host, port, include, warehouse, server_id, **sections)


def source_counts(server: MariaDBServer) -> dict[str, int]:
    with server.admin(harness.DATABASE) as conn, conn.cursor() as cur:
        out = {}
        for t in TABLES:
            cur.execute(f"SELECT COUNT(*) FROM {t}")
            row = cur.fetchone()
            out[t] = int(row[0]) if row else 0
        return out


class MixedWriter(harness.PacedWriter):
    """Single-row autocommit statements at about `rate` per second, cycling through MIX: new orders and events
    at the top of their key ranges, deletes of the oldest, updates of random live keys, customer updates."""

    def __init__(self, server: MariaDBServer, keys: KeySpace, rate: float) -> None:
        super().__init__(server, rate, "mixed-writer")
        self.keys = keys
        self.by_kind: dict[str, int] = {"insert": 0, "update": 0, "delete": 0}
        self._rng = random.Random(20261125)
        db = harness.DATABASE
        self._sql = {
            ("orders", "insert"): f"INSERT INTO {db}.orders ({ORDER_COLUMNS}) "
            f"VALUES (%s, %s, 'new', 1.00, NOW(6), {US_NOW}, 'soak')",
            ("orders", "update"): f"UPDATE {db}.orders SET status = %s, amount = IFNULL(amount, 0) + 1, "
            f"updated_us = {US_NOW} WHERE id = %s",
            ("orders", "delete"): f"DELETE FROM {db}.orders WHERE id = %s",
            ("events", "insert"): f"INSERT INTO {db}.events (event_key, kind, payload, score, seen_at, n) "
            "VALUES (%s, 'view', %s, %s, NOW(3), %s)",
            ("events", "update"): f"UPDATE {db}.events SET n = n + 1, score = IFNULL(score, 0) + 0.5, "
            "seen_at = NOW(3) WHERE event_key = %s",
            ("events", "delete"): f"DELETE FROM {db}.events WHERE event_key = %s",
            ("customers", "update"): f"UPDATE {db}.customers SET balance = balance + 1, tier = (tier + 1) %% 5, "
            "updated_at = NOW(6) WHERE id = %s",
        }

    def write(self, cur: Any) -> None:
        table, kind = MIX[self.written % len(MIX)]
        k = self.keys
        params: tuple[Any, ...]
        if table == "orders":
            if kind == "insert":
                params = (k.orders_hi, k.orders_hi % 5000 + 1)
                k.orders_hi += 1
            elif kind == "delete":
                params = (k.orders_lo,)
                k.orders_lo += 1
            else:
                params = (self._rng.choice(STATUSES), self._rng.randrange(k.orders_lo, k.orders_hi))
        elif table == "events":
            if kind == "insert":
                n = k.events_hi
                params = (event_key(n), f'{{"n":{n}}}', None if n % 7 == 0 else n / 3, n)
                k.events_hi += 1
            elif kind == "delete":
                params = (event_key(k.events_lo),)
                k.events_lo += 1
            else:
                params = (event_key(self._rng.randrange(k.events_lo, k.events_hi)),)
        else:
            params = (self._rng.randrange(1, k.customers_hi),)
        cur.execute(self._sql[table, kind], params)
        self.by_kind[kind] += 1
