"""Chunk splitting and the lock-free chunk read on a real MariaDB (FAILURES.md "Keys and chunks" and the
three watermark hook points). No Spark here: chunks are read in-process, as an executor would."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pymysql
import pytest

from ingest.config import PipelineConfig, TableOptions, parse_config
from ingest.devservers.mariadb import MariaDBServer
from ingest.errors import SchemaChangeError, SourceError, UnsupportedTableError
from ingest.model.columns import rows_to_record_batch
from ingest.model.schema import TableSchema, quote, source_targets
from ingest.source.mysql import connect, load_schema
from ingest.source.snapshot.chunk_reader import ChunkConnections, ChunkResult, ChunkTask, HookPoint, read_chunk
from ingest.source.snapshot.chunks import Chunk, range_predicate, split_table
from tests.conftest import CDC_USER, embedded_sink, source_section
from tests.type_cases import check_iceberg_rows, create_types_table

pytestmark = pytest.mark.integration

DB = "chunkdb"


@pytest.fixture(scope="module")
def config(mariadb: MariaDBServer, tmp_path_factory: pytest.TempPathFactory) -> PipelineConfig:
    mariadb.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}")
    return parse_config(
        {
            "name": "keys",
            "source": source_section(mariadb),
            "tables": {"include": [r"keys\..*"]},
            "sink": embedded_sink(tmp_path_factory.mktemp("keys")),
        }
    )


def _table(mariadb: MariaDBServer, ddl: str, rows: Sequence[Sequence[Any]]) -> None:
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        cur.execute(ddl)
        if rows:
            table = ddl.split("(")[0].split("TABLE", 1)[1].strip()
            marks = ", ".join(["%s"] * len(rows[0]))
            cur.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)


def _schema(config: PipelineConfig, table: str, options: TableOptions | None = None) -> TableSchema:
    with connect(config.source) as conn:
        return load_schema(conn, DB, table, options or TableOptions())


def _read_all(
    config: PipelineConfig, schema: TableSchema, chunk_size: int, hook: Callable[[HookPoint, Chunk], None] | None = None
) -> tuple[list[Chunk], list[ChunkResult]]:
    """Every chunk of the table, read one after another on one pair of sessions, as a Spark partition does."""
    with connect(config.source) as conn:
        chunks = split_table(conn, schema, chunk_size)
    with ChunkConnections(config.source, "auto") as sessions:
        return chunks, [read_chunk(ChunkTask(config.source, "mariadb", schema, c, hook), sessions) for c in chunks]


def _server_connections(mariadb: MariaDBServer) -> int:
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS LIKE 'Connections'")
        return int(cur.fetchone()[1])


def _table_rows(mariadb: MariaDBServer, schema: TableSchema, chunk: Chunk | None = None) -> list[tuple[Any, ...]]:
    where, params = ("TRUE", []) if chunk is None else range_predicate(schema.chunk_key, chunk.lower, chunk.upper)
    with mariadb.admin() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {schema.quoted} WHERE {where}", params)
        return [tuple(r) for r in cur.fetchall()]


def _as_target(schema: TableSchema, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Driver rows as the Iceberg-side values a chunk result holds."""
    return [tuple(r.values()) for r in rows_to_record_batch(source_targets(schema), rows).to_pylist()]


def _assert_exact_copy(mariadb: MariaDBServer, schema: TableSchema, results: list[ChunkResult]) -> None:
    got = [row for r in results for row in r.rows]
    want = _as_target(schema, _table_rows(mariadb, schema))
    assert len(got) == len(want), "every row exactly once"
    assert sorted(map(repr, got)) == sorted(map(repr, want))


def _uuid(i: int, version: int) -> str:
    """A UUID of `version` (0: not RFC 4122) whose first group falls as `i` rises and whose third rises."""
    raw = bytearray(random.Random(i).randbytes(16))
    raw[0:4] = (0xF0000000 - i * 0x01000000).to_bytes(4, "big")
    raw[4:6] = (i * 0x0101).to_bytes(2, "big")
    if version:
        raw[6] = (version << 4) | (i & 0x0F)
        raw[8] = 0x80 | (raw[8] & 0x3F)
    else:
        raw[6], raw[8] = i & 0x0F, raw[8] & 0x3F
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


UUID_KEYS = [_uuid(i, version) for i in range(1, 13) for version in (0, 1, 4)]

KEY_CASES: dict[str, tuple[str, list[tuple[Any, ...]]]] = {
    "case_insensitive": (
        "CREATE TABLE ci (k VARCHAR(10) COLLATE utf8mb4_general_ci PRIMARY KEY, n INT)",
        [(k, i) for i, k in enumerate(["a", "B", "c", "D", "é", "F", "g", "H", "ß", "z", "Zz", "Ω", "_", "0"])],
    ),
    "binary_collation": (
        "CREATE TABLE cbin (k VARCHAR(10) COLLATE utf8mb4_bin PRIMARY KEY, n INT)",
        [(k, i) for i, k in enumerate(["a", "A", "b", "B", "é", "É", "z", "Z", "0", "~"])],
    ),
    "no_pad_collation": (
        "CREATE TABLE cnopad (k VARCHAR(10) COLLATE utf8mb4_general_nopad_ci PRIMARY KEY, n INT)",
        [(k, i) for i, k in enumerate(["a", "a ", "a  ", "b", "b ", "B  x", "c"])],
    ),
    "pad_space_trailing_spaces": (
        "CREATE TABLE cpad (k VARCHAR(10) COLLATE utf8mb4_general_ci PRIMARY KEY, n INT)",
        [(k, i) for i, k in enumerate(["a ", "b  ", "c", "d   ", "e", "f ", "g"])],
    ),
    "bigint_unsigned_near_2_64": (
        "CREATE TABLE bigu (k BIGINT UNSIGNED PRIMARY KEY, n INT)",
        [(18446744073709551604 + i, i) for i in range(12)],
    ),
    "bigint_unsigned_sparse": (
        "CREATE TABLE bigus (k BIGINT UNSIGNED PRIMARY KEY, n INT)",
        [(0, 0), (1, 1), (2**63 - 1, 2), (2**63, 3), (2**63 + 1, 4), (2**64 - 2, 5), (2**64 - 1, 6)],
    ),
    "decimal": (
        "CREATE TABLE dec_k (k DECIMAL(30,10) PRIMARY KEY, n INT)",
        [(f"{sign}{i}.{i + 1:010d}", i * 2 + (sign == "-")) for i in range(8) for sign in ("", "-")],
    ),
    "varbinary_random_ids": (
        "CREATE TABLE vbin (k VARBINARY(16) PRIMARY KEY, n INT)",
        [(b"\x00" * 16, 0), (b"\xff" * 16, 1), (b"\x00", 2), (b"\xff", 3)]
        + [(random.Random(i).randbytes(16), 10 + i) for i in range(20)],
    ),
    # MariaDB's UUID orders time-based UUIDs by their swapped groups, and INET4/INET6 by their bytes: not by the
    # text the job holds them as, so the server places them.
    "uuid": ("CREATE TABLE uuid_k (k UUID PRIMARY KEY, n INT)", [(u, i) for i, u in enumerate(UUID_KEYS)]),
    "inet4": (
        "CREATE TABLE inet4_k (k INET4 PRIMARY KEY, n INT)",
        [(f"{a}.{b}.0.{c}", a * 100 + b * 10 + c) for a in (1, 9, 10, 100) for b in (0, 2, 10) for c in (1, 20)],
    ),
    "inet6": (
        "CREATE TABLE inet6_k (k INET6 PRIMARY KEY, n INT)",
        [
            (a, i)
            for i, a in enumerate(
                [
                    "::",
                    "::1",
                    "::ffff:1.2.3.4",
                    "::9",
                    "::10",
                    "1::",
                    "2001:db8::1",
                    "fe80::a",
                    "9::",
                    "10::",
                    "::1.2.3.4",
                    "ff::ff",
                ]
            )
        ],
    ),  # fmt: skip
    "composite_low_cardinality_first": (
        "CREATE TABLE comp (a TINYINT NOT NULL, b INT NOT NULL, v VARCHAR(5), PRIMARY KEY (a, b))",
        [(1 + i % 3, i, f"v{i}") for i in range(30)],
    ),
    "empty": ("CREATE TABLE empty_t (k INT PRIMARY KEY)", []),
    "odd_identifiers": (
        "CREATE TABLE `odd``; DROP TABLE x; --` (`my col` INT PRIMARY KEY, `back``tick` VARCHAR(5), `select` INT)",
        [(i, f"b{i}", i * 2) for i in range(7)],
    ),
}


@pytest.mark.parametrize("case", list(KEY_CASES))
@pytest.mark.parametrize("chunk_size", [2, 3])
def test_every_row_is_read_exactly_once_and_chunks_stay_small(
    mariadb: MariaDBServer, config: PipelineConfig, case: str, chunk_size: int
) -> None:
    ddl, rows = KEY_CASES[case]
    table = f"{case[:20]}_{chunk_size}" if case != "odd_identifiers" else f"odd`; DROP TABLE x; -- {chunk_size}"
    ddl = ddl.replace(ddl.split("(")[0].split("TABLE", 1)[1].strip(), quote(table), 1)
    _table(mariadb, ddl, rows)
    schema = _schema(config, table)
    chunks, results = _read_all(config, schema, chunk_size)
    _assert_exact_copy(mariadb, schema, results)
    assert len(_table_rows(mariadb, schema)) == len(rows)
    # No giant chunk: server-ordered boundaries keep every chunk at chunk_size rows, dense ranges near it.
    assert max((len(r.rows) for r in results), default=0) <= 2 * chunk_size
    assert len(chunks) >= len(rows) // (2 * chunk_size)
    assert chunks[0].lower is None and chunks[-1].upper is None
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert a.upper == b.lower, "chunks tile the key space"


def test_a_nullable_chunk_key_is_refused(mariadb: MariaDBServer, config: PipelineConfig) -> None:
    _table(mariadb, "CREATE TABLE nullable_k (k INT NULL, v INT, UNIQUE KEY (k))", [(None, 1), (1, 2)])
    with pytest.raises(UnsupportedTableError, match=r"chunk key column 'k' of chunkdb.nullable_k is nullable"):
        _schema(config, "nullable_k", TableOptions(chunk_key=("k",)))


def test_a_table_without_primary_key_is_told_apart_by_its_unique_not_null_key_or_refused(
    mariadb: MariaDBServer, config: PipelineConfig
) -> None:
    _table(
        mariadb,
        "CREATE TABLE no_pk (a INT NOT NULL, b INT NOT NULL, c INT, UNIQUE KEY wide (a, b), UNIQUE KEY nullable (c), "
        "UNIQUE KEY narrow (b))",
        [(1, 3, 1), (2, 2, None), (3, 1, None)],
    )
    schema = _schema(config, "no_pk")
    assert schema.chunk_key == schema.primary_key == ("b",)  # the narrowest unique key on NOT NULL columns
    _, results = _read_all(config, schema, 2)
    _assert_exact_copy(mariadb, schema, results)
    named = _schema(config, "no_pk", TableOptions(chunk_key=("a", "b")))  # a key named in its options wins
    assert named.chunk_key == ("a", "b")
    _table(mariadb, "CREATE TABLE no_key (a INT NOT NULL, c INT, UNIQUE KEY (c), KEY (a))", [(1, 1), (1, 2)])
    keyless = _schema(config, "no_key")  # a unique key over a nullable column tells no rows apart
    assert keyless.keyless and keyless.primary_key == keyless.chunk_key == ()
    _table(mariadb, "CREATE TABLE no_key_named (a INT, _ingest_occurrence INT)", [(1, 1)])
    with pytest.raises(UnsupportedTableError, match=r"no_key_named has no key and a column named _ingest_occurrence"):
        _schema(config, "no_key_named")
    with pytest.raises(UnsupportedTableError, match=r"no_key has no key, and `on_unrepresentable: stop` names the"):
        _schema(config, "no_key", TableOptions(on_unrepresentable="stop"))


def test_a_named_chunk_key_must_be_unique(mariadb: MariaDBServer, config: PipelineConfig) -> None:
    _table(mariadb, "CREATE TABLE not_unique (a INT NOT NULL, b INT NOT NULL, KEY (b))", [(1, 1), (2, 1)])
    with pytest.raises(UnsupportedTableError, match="not a unique index"):
        _schema(config, "not_unique", TableOptions(chunk_key=("b",)))


def test_a_chunk_key_other_than_the_primary_key_is_refused(mariadb: MariaDBServer, config: PipelineConfig) -> None:
    """Rows are identified by the primary key: split on another key, a row whose chunk key changed between two
    chunk reads would be copied twice."""
    _table(mariadb, "CREATE TABLE other_k (id INT PRIMARY KEY, u INT NOT NULL, UNIQUE KEY (u))", [(1, 5), (2, 6)])
    with pytest.raises(UnsupportedTableError, match=r"chunkdb.other_k has a primary key \(id\): `chunk_key` is only"):
        _schema(config, "other_k", TableOptions(chunk_key=("u",)))
    assert _schema(config, "other_k", TableOptions(chunk_key=("id",))).chunk_key == ("id",)


# --- DML at the three hook points (FAILURES.md "Watermarks, positions, GTIDs") -----------------------

HOOK_DML = [
    "UPDATE {t} SET v = 'lower-edge' WHERE id = 8",  # the chunk's lower boundary row
    "INSERT INTO {t} VALUES (9, 'inserted')",
    "DELETE FROM {t} WHERE id = 12",
    "INSERT INTO {t} VALUES (13, 'upper-edge')",  # just below the next chunk's first key
    "UPDATE {t} SET v = 'next-chunk' WHERE id = 14",  # the next chunk's first row: not ours
    "UPDATE {t} SET id = 11 WHERE id = 2",  # a key moving into this chunk from the first one
]


@pytest.mark.parametrize("point", ["after_low_watermark", "before_high_watermark", "after_high_watermark"])
def test_dml_at_each_hook_point_leaves_the_chunk_equal_to_the_table_at_its_high_watermark(
    mariadb: MariaDBServer, config: PipelineConfig, point: str
) -> None:
    table = f"hook_{point}"
    _table(
        mariadb, f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(20))", [(i, f"v{i}") for i in range(2, 26, 2)]
    )
    schema = _schema(config, table)
    with connect(config.source) as conn:
        chunks = split_table(conn, schema, 3)
    target = next(c for c in chunks if c.lower == (8,))
    assert target.upper == (14,)
    before_dml: list[tuple[Any, ...]] = []

    def hook(at: HookPoint, chunk: Chunk) -> None:
        if at == point and chunk == target:
            before_dml.extend(_table_rows(mariadb, schema, target))
            mariadb.execute(*(s.format(t=table) for s in HOOK_DML), database=DB)

    result = read_chunk(ChunkTask(config.source, "mariadb", schema, target, hook))
    after_dml = _table_rows(mariadb, schema, target)
    assert before_dml and before_dml != after_dml
    expected = before_dml if point == "after_high_watermark" else after_dml
    assert sorted(result.rows) == sorted(_as_target(schema, expected))
    assert result.high.position >= result.low.position
    if point == "after_high_watermark":
        assert result.window_events == 0
    else:
        # The changes reached the chunk through the binlog window, not only through the SELECT.
        assert result.window_events >= len(HOOK_DML)


ALIKE_DML = [
    "DELETE FROM {t} WHERE a = 1 LIMIT 1",  # one of three alike rows
    "UPDATE {t} SET b = 'y' WHERE a = 2 LIMIT 1",  # one of two alike rows becomes another value
    "INSERT INTO {t} VALUES (1, 'x', 1.5), (NULL, NULL, NULL), (5, 'z', NULL)",  # more of held values, and a new one
    "UPDATE {t} SET a = 3, b = 'w', c = 0.5 WHERE a IS NULL LIMIT 1",  # a row of NULLs becomes a held value
    "DELETE FROM {t} WHERE a = 4",  # every row of a value
    "UPDATE {t} SET c = c WHERE a = 3",  # no change: MariaDB logs no row event for it
]


@pytest.mark.parametrize("point", ["after_low_watermark", "before_high_watermark", "after_high_watermark"])
def test_a_table_without_a_key_is_one_chunk_holding_the_table_at_its_high_watermark_as_a_multiset(
    mariadb: MariaDBServer, config: PipelineConfig, point: str
) -> None:
    """A table without a key is read in one chunk, in a read view that begins at a binlog position MariaDB names:
    the window's changes are whole rows added or removed from that point, so the chunk is the table at its high
    watermark as a multiset (alike rows as many times as MySQL holds them), its alike rows numbered 1..n."""
    table = f"alike_{point}"
    _table(
        mariadb,
        f"CREATE TABLE {table} (a INT, b VARCHAR(5), c DECIMAL(4,1), KEY (a))",
        [(1, "x", 1.5)] * 3 + [(2, "x", None)] * 2 + [(None, None, None)] * 2 + [(3, "w", 0.5), (4, "v", 2)] * 2,
    )
    schema = _schema(config, table)
    assert schema.keyless
    with connect(config.source) as conn:
        chunks = split_table(conn, schema, 2)
    assert chunks == [Chunk(schema.table_id, 0, None, None)]
    before_dml: list[tuple[Any, ...]] = []

    def hook(at: HookPoint, chunk: Chunk) -> None:
        if at == point:
            before_dml.extend(_table_rows(mariadb, schema))
            mariadb.execute(*(s.format(t=table) for s in ALIKE_DML), database=DB)

    result = read_chunk(ChunkTask(config.source, "mariadb", schema, chunks[0], hook))
    after_dml = _table_rows(mariadb, schema)
    assert Counter(before_dml) != Counter(after_dml)
    expected = before_dml if point == "after_high_watermark" else after_dml
    assert result.table.column_names == [*schema.column_names, "_ingest_occurrence"]
    assert Counter(row[:-1] for row in result.rows) == Counter(_as_target(schema, expected))
    numbers: dict[tuple[Any, ...], list[int]] = {}
    for row in result.rows:
        numbers.setdefault(row[:-1], []).append(row[-1])
    assert all(sorted(held) == list(range(1, len(held) + 1)) for held in numbers.values()), numbers
    if point == "after_high_watermark":
        assert result.window_events == 0
    else:
        assert result.window_events == 8  # every changed row reached the chunk through the binlog window


XA_CASES = {
    # prepared before the low watermark, committed inside the window: the SELECT may not see the rows
    "prepared_before_committed_inside": (("before", "prepare"), ("after_low_watermark", "commit")),
    # prepared inside the window, committed after the high watermark: not the table at the high watermark
    "prepared_inside_committed_after": (("after_low_watermark", "prepare"), ("after", "commit")),
    "prepared_and_rolled_back_inside": (("after_low_watermark", "prepare"), ("before_high_watermark", "rollback")),
    "prepared_and_committed_inside": (("after_low_watermark", "prepare"), ("before_high_watermark", "commit")),
}


@pytest.mark.parametrize("case", list(XA_CASES))
def test_an_xa_transaction_counts_in_a_chunk_at_its_commit(
    mariadb: MariaDBServer, config: PipelineConfig, case: str
) -> None:
    """An XA transaction writes its rows at XA PREPARE and becomes visible at XA COMMIT: the chunk is the table at
    its high watermark whichever side of the window each half falls on."""
    table = f"xa_{case}"
    _table(
        mariadb, f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(20))", [(i, f"v{i}") for i in range(2, 26, 2)]
    )
    schema = _schema(config, table)
    with connect(config.source) as conn:
        target = next(c for c in split_table(conn, schema, 3) if c.lower == (8,))
    (prepare_at, first), (decide_at, decision) = XA_CASES[case]
    assert first == "prepare"
    with mariadb.admin(DB) as xa, xa.cursor() as cur:
        at_high: list[tuple[Any, ...]] = []

        def prepare() -> None:
            for statement in (
                "XA START 'chunk'",
                f"INSERT INTO {table} VALUES (9, 'xa')",
                f"UPDATE {table} SET v = 'xa' WHERE id = 10",
                "XA END 'chunk'",
                "XA PREPARE 'chunk'",
            ):
                cur.execute(statement)

        def decide() -> None:
            cur.execute(f"XA {decision.upper()} 'chunk'")

        def hook(at: HookPoint, chunk: Chunk) -> None:
            if chunk != target:
                return
            if at == prepare_at:
                prepare()
            if at == decide_at:
                decide()
            if at == "after_high_watermark":
                at_high.extend(_table_rows(mariadb, schema, target))

        if prepare_at == "before":
            prepare()
        result = read_chunk(ChunkTask(config.source, "mariadb", schema, target, hook))
        if decide_at == "after":
            decide()
    assert sorted(result.rows) == sorted(_as_target(schema, at_high))
    expected_xa = decision == "commit" and decide_at != "after"
    assert ((9, "xa") in _as_target(schema, at_high)) == expected_xa


def test_a_parent_delete_inside_a_chunks_window_whose_action_reaches_the_table_stops_the_read(
    mariadb: MariaDBServer, config: PipelineConfig
) -> None:
    """InnoDB does not log the child rows ON DELETE CASCADE removes: the window cannot apply them."""
    _table(mariadb, "CREATE TABLE fk_parent (id INT PRIMARY KEY)", [(i,) for i in range(2, 26, 2)])
    _table(
        mariadb,
        "CREATE TABLE fk_child (id INT PRIMARY KEY, pid INT, "
        "FOREIGN KEY fk_child_parent (pid) REFERENCES fk_parent (id) ON DELETE CASCADE)",
        [(i, i) for i in range(2, 26, 2)],
    )
    schema = _schema(config, "fk_child")
    with connect(config.source) as conn:
        target = next(c for c in split_table(conn, schema, 3) if c.lower == (8,))

    def hook(at: HookPoint, chunk: Chunk) -> None:
        if at == "after_low_watermark" and chunk == target:
            mariadb.execute("DELETE FROM fk_parent WHERE id = 10", database=DB)

    with pytest.raises(
        SourceError, match=r"may have changed chunkdb.fk_child through the foreign key `fk_child_parent`"
    ):
        read_chunk(ChunkTask(config.source, "mariadb", schema, target, hook))


def test_the_chunks_of_a_partition_share_two_sessions_and_read_the_same_as_fresh_ones(
    mariadb: MariaDBServer, config: PipelineConfig
) -> None:
    _table(mariadb, "CREATE TABLE shared (id INT PRIMARY KEY, v VARCHAR(8))", [(i, f"v{i}") for i in range(40)])
    schema = _schema(config, "shared")
    before = _server_connections(mariadb)
    chunks, shared = _read_all(config, schema, 7)
    opened = _server_connections(mariadb) - before - 2  # split_table's session, and the admin one counting
    assert len(chunks) == 6 and opened == 2, opened
    fresh = [read_chunk(ChunkTask(config.source, "mariadb", schema, c)) for c in chunks]
    assert [r.rows for r in shared] == [r.rows for r in fresh]
    _assert_exact_copy(mariadb, schema, shared)


@pytest.mark.parametrize(
    ("table", "key_type", "names"),
    [
        ("hwf", "VARCHAR(10) COLLATE utf8mb4_general_ci", list("aBcDeFgHiJkLmNoPqR")),
        ("hwf_uuid", "UUID", UUID_KEYS[:18]),
        ("hwf_inet4", "INET4", [f"{a}.0.0.{b}" for a in (1, 9, 10, 100, 200, 255) for b in (1, 2, 30)]),
    ],
    ids=["case-insensitive", "uuid", "inet4"],
)
def test_the_high_watermark_filter_places_keys_by_the_servers_order_in_few_queries(
    mariadb: MariaDBServer, config: PipelineConfig, table: str, key_type: str, names: list[str]
) -> None:
    """The binlog phase drops a change its chunk already holds: which chunk is the server's call (a collation, or
    a type the job holds as text that the server orders otherwise)."""
    from ingest.model.changes import RowChange
    from ingest.model.position import BinlogPosition
    from ingest.query.batch import HighWatermarkFilter, TableStream

    _table(
        mariadb,
        f"CREATE TABLE {table} (name {key_type} PRIMARY KEY, n INT)",
        [(name, i) for i, name in enumerate(names)],
    )
    schema = _schema(config, table)
    assert not schema.keys_ordered_in_python
    with connect(config.source) as conn:
        chunks = split_table(conn, schema, 3)
    assert len(chunks) >= 6
    chunk_of = {row[0]: i for i, c in enumerate(chunks) for row in _table_rows(mariadb, schema, c)}
    assert sorted(chunk_of) == sorted(names)
    # Chunk i was read at position 1000 * (i + 1); every key changes once just before and once just after.
    highs = [BinlogPosition("mysql-bin.000001", 1000 * (i + 1)) for i in range(len(chunks))]
    stream = TableStream(schema, "unused", chunks, highs, None)
    changes = []
    for name, i in chunk_of.items():
        for delta in (-1, 1):
            position = BinlogPosition("mysql-bin.000001", 1000 * (i + 1) + delta)
            changes.append(RowChange(schema.table_id, position, 0, (name, 1), (name, 2)))

    def questions(cur: Any) -> int:
        cur.execute("SHOW SESSION STATUS LIKE 'Questions'")
        return int(cur.fetchone()[1])

    with connect(config.source) as conn, conn.cursor() as cur:
        before = questions(cur)
        kept = HighWatermarkFilter(conn, stream).keep(changes)
        asked = questions(cur) - before - 1  # the second SHOW counts itself
    assert sorted((c.after[0], c.position.pos) for c in kept) == sorted(
        (name, 1000 * (i + 1) + 1) for name, i in chunk_of.items()
    )
    assert asked <= len(chunks), asked  # one query per chunk at most, not one per key and chunk


def test_equal_watermarks_skip_the_binlog_read(mariadb: MariaDBServer, config: PipelineConfig) -> None:
    _table(mariadb, "CREATE TABLE quiet (id INT PRIMARY KEY)", [(i,) for i in range(5)])
    schema = _schema(config, "quiet")
    _, results = _read_all(config, schema, 10)
    assert all(r.low.position == r.high.position and r.window_events == 0 for r in results)


def test_string_keys_moving_across_chunks_under_a_case_insensitive_collation(
    mariadb: MariaDBServer, config: PipelineConfig
) -> None:
    """A row whose key changes while its old and new chunks are read: it ends up exactly once."""
    _table(
        mariadb,
        "CREATE TABLE moving (k VARCHAR(10) COLLATE utf8mb4_general_ci PRIMARY KEY, n INT)",
        [(k, i) for i, k in enumerate(["a", "C", "e", "G", "i", "K", "m", "O", "q", "S"])],
    )
    schema = _schema(config, "moving")

    def hook(at: HookPoint, chunk: Chunk) -> None:
        if at == "after_low_watermark" and chunk.index == 0:
            # 'q' (a later chunk) becomes 'B' (this chunk): case decides nothing, the server's order does.
            mariadb.execute("UPDATE moving SET k = 'B' WHERE k = 'Q'", database=DB)

    _, results = _read_all(config, schema, 3, hook)
    _assert_exact_copy(mariadb, schema, results)
    assert [r for res in results for r in res.rows if r[0] == "B"] == [("B", 8)]


def test_the_cdc_user_holds_no_metadata_lock_between_chunks(mariadb: MariaDBServer, config: PipelineConfig) -> None:
    """An application ALTER TABLE must not wait on us (FAILURES.md "Types and settings")."""
    _table(mariadb, "CREATE TABLE mdl (id INT PRIMARY KEY, v INT)", [(i, i) for i in range(10)])
    schema = _schema(config, "mdl")

    altered: list[int] = []

    def hook(at: HookPoint, chunk: Chunk) -> None:
        if at == "before_high_watermark":
            with mariadb.admin(DB) as conn, conn.cursor() as cur:
                cur.execute("SET SESSION lock_wait_timeout = 5")
                cur.execute(f"ALTER TABLE mdl COMMENT = 'touched at chunk {chunk.index}'")
            altered.append(chunk.index)

    chunks, _ = _read_all(config, schema, 4, hook)  # an ALTER blocked by our read would time out and raise
    # Each ALTER ran, inside each chunk's window: the table carries the last one's comment.
    assert len(chunks) >= 3 and altered == [c.index for c in chunks], altered
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_COMMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'mdl'", (DB,)
        )
        assert cur.fetchone() == (f"touched at chunk {altered[-1]}",)


def test_the_cdc_user_cannot_lock_tables(mariadb: MariaDBServer, config: PipelineConfig) -> None:
    with connect(config.source) as conn, conn.cursor() as cur, pytest.raises(pymysql.err.OperationalError):
        cur.execute("FLUSH TABLES WITH READ LOCK")


def test_both_drivers_read_every_type_case_to_the_same_exact_values(
    mariadb: MariaDBServer, config: PipelineConfig
) -> None:
    """mysqlclient's text path (Arrow parses the server's text) and PyMySQL's converters agree, value for value."""
    with mariadb.admin(DB) as conn:
        create_types_table(conn, "typed")
    schema = _schema(config, "typed")
    with connect(config.source) as conn:
        chunks = split_table(conn, schema, 2)
    tables = {}
    for driver in ("mysqlclient", "pymysql"):
        results = [read_chunk(ChunkTask(config.source, "mariadb", schema, c, driver=driver)) for c in chunks]
        rows = [row for r in results for row in r.table.to_pylist()]
        assert check_iceberg_rows(rows) == [], driver
        tables[driver] = pa.concat_tables([r.table for r in results])
    assert tables["mysqlclient"].equals(tables["pymysql"])


MILLION = 1_000_000


def test_a_million_rows_under_a_composite_key_whose_first_column_has_three_values_split_in_linear_work(
    mariadb: MariaDBServer, config: PipelineConfig
) -> None:
    """FAILURES.md "Composite key, first column with three values, a million rows": a planner whose range
    predicate the server cannot seek with scans the table once per chunk (quadratic). The split must cost the
    server work in proportion to the table (its handler reads, counted on the planning session), and every chunk
    hold chunk_size rows."""
    with mariadb.admin(DB) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE million (a TINYINT NOT NULL, b INT NOT NULL, v CHAR(1), PRIMARY KEY (a, b))")
        cur.execute(f"INSERT INTO million SELECT seq % 3, seq, 'v' FROM seq_1_to_{MILLION}")
        conn.commit()
    schema = _schema(config, "million")
    chunk_size = 20_000

    def handler_reads(cur: Any) -> int:
        cur.execute("SHOW SESSION STATUS WHERE Variable_name LIKE 'Handler_read%'")
        return sum(int(value) for _, value in cur.fetchall())

    with connect(config.source) as conn, conn.cursor() as cur:
        before = handler_reads(cur)
        chunks = split_table(conn, schema, chunk_size)
        reads = handler_reads(cur) - before
        counts = []
        for chunk in chunks:
            where, params = range_predicate(schema.chunk_key, chunk.lower, chunk.upper)
            cur.execute(f"SELECT COUNT(*) FROM {schema.quoted} WHERE {where}", params)
            counts.append(int(cur.fetchone()[0]))
    print(f"{len(chunks)} chunks, {reads:,} handler reads to plan them")
    assert sum(counts) == MILLION
    assert len(chunks) == -(-MILLION // chunk_size)
    assert all(count == chunk_size for count in counts[:-1]) and 0 < counts[-1] <= chunk_size, counts
    # Each bound query walks its chunk's index entries once: about one read per row (a scan per chunk: 25x more).
    # A work bound, not a time bound: the server's own count of rows it touched.
    assert reads < 2 * MILLION, reads
    mariadb.execute(f"DROP TABLE {DB}.million")  # a million rows the later tests need not carry


@pytest.mark.parametrize("at", ["after_low_watermark", "before_high_watermark"])
def test_a_column_renamed_inside_a_chunks_window_stops_the_copy_naming_the_table(
    mariadb: MariaDBServer, config: PipelineConfig, row_metadata: str, at: HookPoint
) -> None:
    """FAILURES.md "DDL during a chunk window: rename column": renamed before the chunk's SELECT, the SELECT
    names a column that is gone; renamed after it, with a change to the chunk's rows behind the rename in the
    window, that row's values cannot be placed with certainty (by name: a column the schema does not have; by
    position: the server logged no names). Either way the copy stops naming the table and what to do, and
    never writes a row under the wrong column."""
    table = f"ren_{row_metadata}_{at}"[:40]
    _table(mariadb, f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT, s VARCHAR(5))", [(i, i, "s") for i in range(8)])
    schema = _schema(config, table)

    def hook(point: HookPoint, chunk: Chunk) -> None:
        if point == at and chunk.index == 0:
            with mariadb.admin(DB) as conn, conn.cursor() as cur:
                cur.execute(f"ALTER TABLE {table} RENAME COLUMN v TO w")
                cur.execute(f"UPDATE {table} SET w = -1 WHERE id = 0")
                conn.commit()

    with pytest.raises(SchemaChangeError) as refused:
        _read_all(config, schema, 4, hook)
    message = str(refused.value)
    assert message.startswith(f"{DB}.{table}: ") and f"ingest resnapshot --config ... --table {DB}.{table}" in message


@pytest.mark.parametrize(
    ("point", "again"), [("after_low_watermark", 1), ("before_high_watermark", 1), ("after_high_watermark", 2)]
)
def test_a_chunk_whose_sessions_are_killed_is_read_again_on_new_ones_and_the_others_are_kept(
    mariadb: MariaDBServer, config: PipelineConfig, point: HookPoint, again: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 53: the server kills every session of the CDC user during chunk 1's read (as an operator's KILL, a
    proxy's reset or a restart does): before its SELECT or after it, the chunk is read again whole on new sessions,
    with a change made meanwhile. Killed after its high watermark (between two chunks), chunk 1 is done and the
    next chunk finds its sessions dead and is read on new ones. The other chunks are read once; every row once."""
    table = f"killed_{point}"
    _table(mariadb, f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(20))", [(i, f"v{i}") for i in range(30)])
    schema = _schema(config, table)
    selects: Counter[int] = Counter()
    killed: list[int] = []

    def hook(at: HookPoint, chunk: Chunk) -> None:
        if at == "before_high_watermark":
            selects[chunk.index] += 1
        if at == point and chunk.index == 1 and not killed:
            with mariadb.admin() as conn, conn.cursor() as cur:
                cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", (CDC_USER,))
                sessions = [int(row[0]) for row in cur.fetchall()]
                assert sessions, "the chunk reader's sessions"
                killed.extend(sessions)
                for session in sessions:
                    cur.execute(f"KILL CONNECTION {session}")
                cur.execute(f"UPDATE {DB}.{table} SET v = 'after the kill' WHERE id = %s", (10 * again + 2,))
                conn.commit()

    opened = _server_connections(mariadb)
    with caplog.at_level("WARNING", logger="ingest.source.snapshot.chunk_reader"):
        chunks, results = _read_all(config, schema, 10, hook)
    # A chunk killed before its SELECT ends selects once; after it, twice; the chunk after a kill between two, once.
    assert len(chunks) == 3 and selects == {0: 1, 1: 2 if point == "before_high_watermark" else 1, 2: 1}, selects
    _assert_exact_copy(mariadb, schema, results)
    assert any(row[1] == "after the kill" for row in results[again].rows)
    assert f"{DB}.{table} chunk {again}: lost the connection to 127.0.0.1:" in caplog.text, caplog.text
    assert f"{DB}.{table} chunk {again} read after 1 reconnect attempt(s)" in caplog.text, caplog.text
    assert caplog.text.count("reading the chunk again") == 1, caplog.text
    # One split session, the first pair, the pair after the kill, and the window's binlog streams: no more.
    assert _server_connections(mariadb) - opened <= 8
