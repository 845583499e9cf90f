"""The `ingest` command: run, status, verify, snapshot, resnapshot, demo.

Exit codes: 0 success; 1 `verify` found a difference; 2 bad config or usage; 3 an error a person must
fix (terminal); 4 an error that may pass on retry (transient); 130 interrupted.
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ingest.errors import ConfigError, IngestError, TransientError
from ingest.faults import mark_job_process_group

if TYPE_CHECKING:
    from ingest.config import PipelineConfig

log = logging.getLogger("ingest")

EXIT_OK, EXIT_DIFFERENT, EXIT_CONFIG, EXIT_TERMINAL, EXIT_TRANSIENT = 0, 1, 2, 3, 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ingest",
        description="Lock-free, exactly-once MySQL/MariaDB to Apache Iceberg ingestion on Spark.",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level of the job's own messages (default INFO)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _run_arguments(sub.add_parser("run", help="snapshot the selected tables, then stream the binlog"))
    _status_arguments(
        sub.add_parser("status", help="per-table phase, chunk progress, last commit and offsets; binlog lag")
    )
    verify = sub.add_parser("verify", help="compare MySQL and Iceberg: row counts and checksums per key range")
    verify.add_argument("--config", required=True, help="the pipeline YAML file")
    verify.add_argument(
        "--table", action="append", default=[], metavar="DB.TABLE", help="verify only this table (repeatable)"
    )
    verify.add_argument("--ranges", type=int, default=16, help="key ranges per table (default 16)")
    _snapshot_arguments(sub)
    cut = sub.add_parser(
        "cut",
        help="the newest consistent cut: per table, the Iceberg snapshot to read it at, all as of one binlog offset",
    )
    cut.add_argument("--config", required=True, help="the pipeline YAML file")
    cut.add_argument("--json", action="store_true", help="print JSON instead of a table")
    demo = sub.add_parser("demo", help="ingest a sample MariaDB database into a local Iceberg warehouse")
    demo.add_argument("--dir", default=".demo", help="where the demo keeps its warehouse (default .demo)")
    return parser


def _run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--config", required=True, help="the pipeline YAML file (see docs/config.md)")
    run.add_argument(
        "--snapshot-only", action="store_true", help="stop after the snapshot (same as startup_mode: snapshot_only)"
    )
    run.add_argument(
        "--until-caught-up",
        action="store_true",
        help="stop once everything up to the binlog position current at start is committed",
    )
    run.add_argument(
        "--progress",
        choices=["auto", "live", "plain", "off"],
        default="auto",
        help="progress per table (chunks, rows/s, ETA; binlog lag, changes/s): live at the bottom of a terminal, "
        "plain as log lines every 30 s; auto: live when stderr is a terminal (default)",
    )


def _status_arguments(status: argparse.ArgumentParser) -> None:
    status.add_argument("--config", required=True, help="the pipeline YAML file")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument("--watch", action="store_true", help="print it again every --interval seconds until Ctrl-C")
    status.add_argument(
        "--interval", type=float, default=5.0, metavar="S", help="seconds between two --watch refreshes (default 5)"
    )


def _snapshot_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`snapshot` (asks the job to copy tables) and `resnapshot` (forgets their snapshot state)."""
    snap = sub.add_parser(
        "snapshot",
        help="ask the running job (or the next run) to copy tables now while the binlog keeps flowing: tables "
        "created since it started, or, with --again, tables it holds",
    )
    snap.add_argument("--config", required=True, help="the pipeline YAML file")
    snap.add_argument(
        "--table", action="append", default=[], metavar="DB.TABLE", help="a table to snapshot (repeatable)"
    )
    what = snap.add_mutually_exclusive_group()
    what.add_argument(
        "--again",
        action="store_true",
        help="copy the tables again (readers keep the old rows until the copy is complete, see docs/config.md)",
    )
    what.add_argument("--pause", action="store_true", help="read no more chunks of the tables until --resume")
    what.add_argument("--resume", action="store_true", help="read their chunks again")
    again = sub.add_parser(
        "resnapshot",
        help="forget the snapshot state of some tables: the next run copies them again (into a branch of the "
        "target that readers do not see until the copy is complete, or after dropping a target whose schema no "
        "longer fits)",
    )
    again.add_argument("--config", required=True, help="the pipeline YAML file")
    again.add_argument(
        "--table", action="append", default=[], metavar="DB.TABLE", help="a table to snapshot again (repeatable)"
    )


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    # py4j echoes every command sent to the JVM at DEBUG, secrets set on the session included: never below INFO. It
    # logs an error raised in a batch's callback with its trace, which the job reports itself in one line: that trace
    # shows at DEBUG only.
    logging.getLogger("py4j").setLevel(logging.WARNING if level == "DEBUG" else logging.CRITICAL)
    if level != "DEBUG":
        # Spark's Python side and the clients are chatty; the job's own messages are what a user follows.
        for noisy in ("pyspark", "urllib3", "botocore", "pyiceberg", "sqlalchemy", "pymysqlreplication"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def _unexpected(error: Exception) -> int:
    """An error the job did not raise on purpose, in one line: exit 4 when it says a server could not be reached (a
    lost connection to the source, a catalog or object store away: retrying may succeed), 3 otherwise. Spark's
    errors carry the query's plan and a Java trace: only their first line is shown."""
    from ingest.sink.outage import sink_unreachable
    from ingest.source.reconnect import lost_connection

    log.debug("the error's traceback", exc_info=error)
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    transient = lost_connection(error) or sink_unreachable(error)
    print(
        f"ingest: {'transient' if transient else 'unexpected'} error: {type(error).__name__}: {first[:500]} "
        "(`--log-level DEBUG` logs its traceback)",
        file=sys.stderr,
    )
    return EXIT_TRANSIENT if transient else EXIT_TERMINAL


def _run(args: argparse.Namespace, config: PipelineConfig) -> int:
    from ingest.runtime.spark import EarlySession

    # Before the imports below. A snapshot-only run starts no query, so no warm-up of its Python processes.
    query = not config.snapshot_only(args.snapshot_only)
    early = EarlySession(config.spark, config.sink, f"ingest-{config.name}", warm_up=query)
    from ingest.commands.progress import showing_progress
    from ingest.query.pipeline import run

    with showing_progress(args.progress, sys.stderr):
        run(config, snapshot_only=args.snapshot_only, until_caught_up=args.until_caught_up, early=early)
    return EXIT_OK


def _status(args: argparse.Namespace, config: PipelineConfig) -> int:
    from ingest.commands.status import print_status, watch_status

    if not args.watch:
        print_status(config, as_json=args.json)
        return EXIT_OK
    if args.interval <= 0:
        raise ConfigError(f"--interval must be more than 0 seconds, got {args.interval:g}")

    def render() -> str:
        text = io.StringIO()
        print_status(config, as_json=args.json, out=text)
        return text.getvalue()

    watch_status(render, args.interval, sys.stdout, clear=sys.stdout.isatty(), header=not args.json)
    return EXIT_OK


def _verify(args: argparse.Namespace, config: PipelineConfig) -> int:
    from ingest.commands.verify import verify

    return EXIT_OK if verify(config, tables=args.table, ranges=args.ranges) else EXIT_DIFFERENT


def _snapshot(args: argparse.Namespace, config: PipelineConfig) -> int:
    from ingest.commands.snapshot import Action, ask_snapshot

    action: Action = "again" if args.again else "pause" if args.pause else "resume" if args.resume else "snapshot"
    done = ask_snapshot(config, args.table, action)
    for table_id, progress in done.copying.items():
        print(
            f"{table_id}: pipeline {config.name!r} is copying it already ({progress}); nothing to ask "
            "(`ingest status` follows the copy; --again drops what it holds and copies it anew)"
        )
    if done.tables:
        asked = {"snapshot": "snapshot", "again": "snapshot again", "pause": "pause", "resume": "resume"}[action]
        print(
            f"asked pipeline {config.name!r} to {asked} {', '.join(done.tables)}: a running job takes it "
            f"within {config.stream.signal_poll_seconds:g} s (`stream.signal_poll_seconds`), else the next "
            "run does"
        )
    return EXIT_OK


def _cut(args: argparse.Namespace, config: PipelineConfig) -> int:
    from ingest.commands.cut import print_cut

    print_cut(config, as_json=args.json)
    return EXIT_OK


def _resnapshot(args: argparse.Namespace, config: PipelineConfig) -> int:
    from ingest.commands.resnapshot import resnapshot

    over = resnapshot(config, args.table)
    branched = f"copied again into a branch (readers keep the old rows meanwhile): {', '.join(over.branched)}; "
    print(
        f"{branched if over.branched else ''}dropped: {', '.join(over.dropped) or 'nothing'}; the next "
        f"`ingest run` snapshots {', '.join(args.table)} again"
    )
    return EXIT_OK


_COMMANDS: dict[str, Callable[[argparse.Namespace, PipelineConfig], int]] = {
    "run": _run,
    "status": _status,
    "verify": _verify,
    "snapshot": _snapshot,
    "resnapshot": _resnapshot,
    "cut": _cut,
}
"""The commands that act on a pipeline file (`demo` makes its own)."""


def _command(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from ingest.demo import run_demo

        return run_demo(args.dir)
    from ingest.config import load_config

    command = _COMMANDS.get(args.command)
    if command is None:
        raise AssertionError(f"unhandled command {args.command}")
    return command(args, load_config(args.config))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.log_level)
    mark_job_process_group()
    try:
        return _command(args)
    except ConfigError as e:
        print(f"ingest: config error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except TransientError as e:
        print(f"ingest: {e} (transient: retrying may succeed)", file=sys.stderr)
        return EXIT_TRANSIENT
    except IngestError as e:
        print(f"ingest: {e}", file=sys.stderr)
        return EXIT_TERMINAL
    except KeyboardInterrupt:
        print("ingest: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - one line on the terminal; the traceback goes to the log at DEBUG
        return _unexpected(e)


if __name__ == "__main__":
    sys.exit(main())
