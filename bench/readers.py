"""What the job's tables cost their readers (issue 51): a full scan and a point query of each target as the job
left it, against a compacted copy of the same rows (one `CREATE TABLE ... AS SELECT`: a few data files, no
delete files), with Spark, Trino and pyiceberg, in the bench's process after the job has stopped. Trino (the
pinned server setup installed) reads the embedded warehouse's files where they are: both tables are registered
in a file metastore of its own (`register_table`), so it plans from the same metadata files. Medians of a few
rounds after one unmeasured round; no timing is asserted. Used by bench.soak."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench import harness

KEYS = {"orders": "id", "customers": "id", "events": "event_key"}
"""The primary key of each of bench.tables' three tables: what the point query selects on."""
QUERIES = ("spark scan", "spark point", "trino scan", "trino point", "pyiceberg scan", "pyiceberg point")
TRINO_CATALOG = "readers"


def _median_seconds(run: Callable[[], object], rounds: int) -> float:
    run()  # unmeasured: caches, the JVM's code, the metadata files read once
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 4)


def _costs(
    spark: Any, trino: Any, catalog: Any, spark_name: str, names: tuple[str, str], key: str, value: Any, rounds: int
) -> Any:
    from pyiceberg.expressions import EqualTo

    table = catalog.load_table(names)
    literal = f"'{value}'" if isinstance(value, str) else str(value)
    trino_name = f'{TRINO_CATALOG}."{names[0]}"."{names[1]}"'
    # Trino has no hash of a whole row: a checksum of each column makes it read every column, as Spark's does.
    checksums = ", ".join(f'checksum("{field.name}")' for field in table.schema().fields)
    runs: dict[str, Callable[[], object]] = {
        "spark scan": lambda: spark.sql(f"SELECT count(*), sum(hash(*)) FROM {spark_name}").collect(),
        "spark point": lambda: spark.sql(f"SELECT * FROM {spark_name} WHERE {key} = {literal}").collect(),
        "trino scan": lambda: trino.query(f"SELECT count(*), {checksums} FROM {trino_name}"),
        "trino point": lambda: trino.query(f'SELECT * FROM {trino_name} WHERE "{key}" = {literal}'),
        "pyiceberg scan": lambda: table.scan().to_arrow(),
        "pyiceberg point": lambda: table.scan(row_filter=EqualTo(key, value)).to_arrow(),
    }
    return {name: _median_seconds(run, rounds) for name, run in runs.items()}


@contextlib.contextmanager
def _trino(scratch: Path) -> Iterator[Any]:
    """A Trino server whose catalog TRINO_CATALOG is an Iceberg file metastore under `scratch`, reading local
    files (`register` puts a table in it)."""
    from ingest.devservers.trino import TrinoServer

    metastore = scratch / "trino-metastore"
    metastore.mkdir(parents=True, exist_ok=True)
    catalog = {
        "connector.name": "iceberg",
        "iceberg.catalog.type": "testing_file_metastore",
        "hive.metastore.catalog.dir": f"local://{metastore}",
        "fs.native-local.enabled": "true",
        "local.location": "/",
        "iceberg.register-table-procedure.enabled": "true",
    }
    with TrinoServer({TRINO_CATALOG: catalog}) as server:
        yield server


def _register(trino: Any, names: tuple[str, str], location: str) -> None:
    trino.query(
        f"CALL {TRINO_CATALOG}.system.register_table(schema_name => '{names[0]}', table_name => '{names[1]}', "
        f"table_location => '{location}')",
    )


def reader_costs(config: Any, tables: Sequence[str], rounds: int, scratch: Path) -> dict[str, Any]:
    """Per table, the seconds of each query (`QUERIES`) of the target and of its compacted copy, their ratio, and
    both tables' data and delete files."""
    from ingest.sink.catalog import load_pyiceberg_catalog
    from ingest.sink.targets import qualified

    spark, _ = harness.start_spark(config, "readers")
    catalog = load_pyiceberg_catalog(config.sink)
    out: dict[str, Any] = {}
    try:
        with _trino(scratch) as trino:
            namespaces = {config.target_for(harness.DATABASE, t)[0] for t in tables}
            for namespace in sorted(namespaces):
                trino.query(f'CREATE SCHEMA IF NOT EXISTS {TRINO_CATALOG}."{namespace}"')
            for t in tables:
                namespace, name = config.target_for(harness.DATABASE, t)
                target, copy = qualified(config, namespace, name), qualified(config, namespace, f"{name}_compacted")
                spark.sql(f"DROP TABLE IF EXISTS {copy} PURGE")
                spark.sql(f"CREATE TABLE {copy} USING iceberg AS SELECT * FROM {target}")
                for registered in (name, f"{name}_compacted"):
                    _register(trino, (namespace, registered), catalog.load_table((namespace, registered)).location())
                key = KEYS[t]
                value = spark.sql(f"SELECT max({key}) FROM {target}").first()[0]
                job = _costs(spark, trino, catalog, target, (namespace, name), key, value, rounds)
                compacted = _costs(spark, trino, catalog, copy, (namespace, f"{name}_compacted"), key, value, rounds)
                out[t] = {
                    "target_s": job,
                    "compacted_s": compacted,
                    "ratio": {q: round(job[q] / compacted[q], 3) if compacted[q] else None for q in QUERIES},
                    "target_files": _files(catalog, (namespace, name)),
                    "compacted_files": _files(catalog, (namespace, f"{name}_compacted")),
                }
                spark.sql(f"DROP TABLE IF EXISTS {copy} PURGE")
    finally:
        spark.stop()
    return out


def _files(catalog: Any, names: tuple[str, str]) -> dict[str, int]:
    """The table's data and delete files, rows and manifests (each a file a reader's planning opens)."""
    table = catalog.load_table(names)
    snapshot = table.current_snapshot()
    summary = {} if snapshot is None or snapshot.summary is None else snapshot.summary.additional_properties
    counts = {k: int(summary.get(f"total-{k}", 0)) for k in ("data-files", "delete-files", "records")}
    return {**counts, "manifests": 0 if snapshot is None else len(snapshot.manifests(table.io))}


def render(costs: dict[str, Any]) -> list[str]:
    """The lines bench.soak prints: per table and query, the target's seconds, the copy's, and their ratio."""
    columns = harness.columns("table:10; query:16; target s:10:.3f; compacted s:12:.3f; ratio:8:.2f")
    rows = []
    for t, c in costs.items():
        for q in QUERIES:
            rows.append([t, q, c["target_s"][q], c["compacted_s"][q], c["ratio"][q]])
    files = "; ".join(
        f"{t} {_counted(c['target_files'])} (copy {_counted(c['compacted_files'])})" for t, c in costs.items()
    )
    return [
        "",
        "What the targets cost their readers, against a compacted copy of the same rows (medians, seconds):",
        *harness.text_table(columns, rows, rule=False),
        f"files: {files}",
    ]


def _counted(files: dict[str, int]) -> str:
    return f"{files['data-files']} data + {files['delete-files']} delete files, {files['manifests']} manifests"
