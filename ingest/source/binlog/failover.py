"""Finding recorded binlog points again on the server the job reads now (after a failover, by GTID).

Every offset the job records carries the binlog file/position, the server's `@@server_id` and, on
MariaDB, the GTID position at that point. A file/position only means something on the server that wrote
it: after a failover to a replica (`log_slave_updates`), the replica's binlog has other file names and
offsets, and one with the same base name would even compare without an error, wrongly. So a point
recorded on another server is looked up by its GTID position instead: it becomes the start of the first
event group after it in this server's binlog (or the binlog's end when there is none), found with one
GTID-addressed replication stream for all points at once.

Built for MariaDB with one replication domain, the usual primary/replica setup, where GTID order is
binlog order on every server. Several domains may interleave differently on another server, and MySQL
GTID sets are not tracked per transaction here: both stop with an error instead of guessing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import HeartbeatLogEvent, MariadbGtidEvent

from ingest.config import SourceConfig
from ingest.errors import SourceError
from ingest.model.position import BinlogPosition, MariadbGtid, MariadbGtidPos, Watermark
from ingest.source.binlog.reader import dump_server_id, stream_connection
from ingest.source.watermark import read_watermark

log = logging.getLogger(__name__)

__all__ = ["gtid_at", "locate", "server_id", "to_this_server"]


def server_id(conn: pymysql.connections.Connection[Any]) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT @@server_id")
        return int(cur.fetchone()[0])


def gtid_at(conn: pymysql.connections.Connection[Any], position: BinlogPosition) -> MariadbGtidPos | None:
    """MariaDB's GTID position at a point of its own binlog (`BINLOG_GTID_POS`, which reads the file up to
    it); None when the server cannot tell (the file is gone, or the point is not between event groups)."""
    with conn.cursor() as cur:
        try:
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (position.file, position.pos))
        except pymysql.err.MySQLError as e:
            log.warning("cannot map %s to a GTID position: %s", position, e)
            return None
        row = cur.fetchone()
    return None if row is None or row[0] is None else MariadbGtidPos.parse(str(row[0]))


def to_this_server(
    conn: pymysql.connections.Connection[Any],
    source: SourceConfig,
    flavor: str,
    marks: Sequence[Watermark],
) -> list[BinlogPosition]:
    """Each recorded point as a position in this server's binlog, in the order given.

    Points this server recorded (or whose server is not known: offsets written before server ids were)
    keep their position; the others are located by their GTID position.
    """
    here = server_id(conn)
    foreign = [m for m in marks if m.server_id is not None and m.server_id != here]
    if not foreign:
        return [m.position for m in marks]
    first = foreign[0]
    if flavor != "mariadb":
        raise SourceError(
            f"the job's offsets were recorded on the source with server_id {first.server_id}, but it now reads "
            f"server_id {here}: resuming by GTID after a failover is built for MariaDB only. Point the job back "
            "at the server it read before, or snapshot every table again (`ingest resnapshot`)"
        )
    wanted = []
    for mark in foreign:
        if not isinstance(mark.gtid, MariadbGtidPos):
            raise SourceError(
                f"the offset {mark.position} was recorded on server_id {mark.server_id} without a GTID position, "
                f"so it cannot be found in the binlog of server_id {here}; point the job back at server_id "
                f"{mark.server_id}, or snapshot every table again (`ingest resnapshot`)"
            )
        wanted.append(mark.gtid)
    found = locate(conn, source, wanted)
    log.warning(
        "the source is now server_id %s; %d offset(s) recorded on server_id(s) %s were found again by GTID",
        here,
        len(foreign),
        sorted({m.server_id for m in foreign if m.server_id is not None}),
    )
    located = {id(m): p for m, p in zip(foreign, found, strict=True)}  # a mark may be foreign or not: by id
    return [located.get(id(m), m.position) for m in marks]


def locate(
    conn: pymysql.connections.Connection[Any], source: SourceConfig, points: Sequence[MariadbGtidPos]
) -> list[BinlogPosition]:
    """For each GTID position, where this server's binlog is right after it (one stream for all)."""
    current = read_watermark(conn, "mariadb")  # GTIDs first, then the position: see below
    assert isinstance(current.gtid, MariadbGtidPos)
    domain = _one_domain(points, current.gtid)
    mine = current.gtid.get(domain) if domain is not None else None
    have = 0 if mine is None else mine.seq_no
    seqs = [_seq(p, domain) for p in points]
    missing = max(seqs, default=0)
    if missing > have:
        raise SourceError(
            f"the source (server_id {current.server_id}, GTID position {current.gtid or 'empty'}) lacks "
            f"transactions Iceberg already holds: domain {domain} up to sequence {missing}. It is not a replica "
            "that had applied everything the job committed (asynchronous replication lost them in the failover?). "
            "Point the job at a server that has them, or snapshot every table again (`ingest resnapshot`)"
        )
    # A point with no event group after it in the stream is the binlog's end as read above: every group in
    # the binlog then was in the point (the stream, opened later, shows none newer), and the point's groups
    # were all there (its GTIDs were in the GTID position read before the file/position).
    result: dict[int, BinlogPosition] = {}
    todo = sorted(set(seqs))
    start = min(points, key=lambda p: _seq(p, domain))
    stream = _gtid_stream(source, start)
    try:
        for event in stream:
            if isinstance(event, HeartbeatLogEvent):
                break  # the server has sent all it has: the points left are at the end read above
            if not isinstance(event, MariadbGtidEvent):
                continue
            seq = MariadbGtid.parse(str(event.gtid)).seq_no
            group_start = BinlogPosition(stream.log_file, event.packet.log_pos - event.packet.event_size)
            while todo and todo[0] < seq:
                result[todo.pop(0)] = group_start
            if not todo or group_start >= current.position:
                break
    except pymysql.err.OperationalError as e:
        if e.args and e.args[0] == 1236:
            raise SourceError(
                f"the source (server_id {current.server_id}) cannot stream from GTID position {start}: {e.args[1]}. "
                "Its binlog no longer holds the transactions after the job's offset, or its history differs from "
                "the server the job read before; snapshot every table again (`ingest resnapshot`)"
            ) from None
        raise
    finally:
        stream.close()
    return [result.get(s, current.position) for s in seqs]


def _one_domain(points: Sequence[MariadbGtidPos], server: MariadbGtidPos) -> int | None:
    domains = {g.domain_id for p in (*points, server) for g in p.entries}
    if len(domains) > 1:
        raise SourceError(
            f"resuming by GTID after a failover needs one replication domain, but the offsets and the source use "
            f"domains {sorted(domains)}: their transactions may be in another order on this server than on the "
            "one the job read before. Point the job back at that server, or snapshot every table again "
            "(`ingest resnapshot`)"
        )
    return next(iter(domains), None)


def _seq(point: MariadbGtidPos, domain: int | None) -> int:
    gtid = point.get(domain) if domain is not None else None
    return 0 if gtid is None else gtid.seq_no


def _gtid_stream(source: SourceConfig, start: MariadbGtidPos) -> BinLogStreamReader:
    """A replication stream of the event groups after `start` (MariaDB GTID addressing), with a heartbeat once
    it has sent everything.

    Blocking: MariaDB (10.11) resets a non-blocking GTID dump connection part-way through a busy binlog, and
    python-mysql-replication reconnects from `start` each time, so a non-blocking stream never ended (seen
    on 20,000 small transactions: reset after 400 to 5,000 of them, every time)."""
    return BinLogStreamReader(
        **stream_connection(source),
        # A dump connection of its own needs its own server id, or the server drops the job's other one.
        server_id=dump_server_id(),
        is_mariadb=True,
        auto_position=str(start),
        blocking=True,
        slave_heartbeat=1.0,
        only_events=[MariadbGtidEvent, HeartbeatLogEvent],
    )
