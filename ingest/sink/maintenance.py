"""The job's own upkeep of the tables it streams into: compaction and snapshot expiry.

Each batch adds a few small data files and, for updates and deletes, delete files to every table it
touches, and a snapshot. Left alone, the next MERGE plans and reads all of them (it slows down commit by
commit) and the table's metadata grows without end. So every `sink.maintenance.every_commits` commits a
table gets, right after the batch is recorded:

1. small data files are compacted, their deleted rows dropped (Iceberg's `rewriteDataFiles`, bin-pack
   with its defaults: files under 75% of the 512 MB target, once a group has 5 of them);
2. on format v2, every position-delete file is rewritten, which drops those that only point at files
   step 1 removed (`rewritePositionDeletes` with `rewrite-all`); v3 deletion vectors are one per data
   file already;
3. the manifests are merged (`rewriteManifests`): every batch's commit adds one, and a reader's planning
   opens each (pyiceberg's point query of a target of 50 batches took 17-21 times that of a compacted copy);
4. snapshots older than `expire_after_hours` are expired (the newest `RETAIN_LAST` always stay), and
   the files only they referenced deleted.

The rewrite commits carry the batch's offset in their summaries, as the MERGE below them does: the table
holds the same rows, and the offset stays on the newest snapshot even once expiry removed the MERGE's.
Maintenance never fails a batch: the batch is committed and recorded before it starts, and an error is
logged and tried again after the next `every_commits` commits.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ingest.config import MaintenanceConfig
from ingest.faults import crash_point
from ingest.model.position import Watermark
from ingest.sink.merge import stream_offset_properties
from ingest.sink.targets import lineage

log = logging.getLogger(__name__)

RETAIN_LAST = 10
"""Snapshots every expiry keeps whatever their age."""
SUMMARY_MAINTENANCE = "ingest.maintenance"
"""Snapshot summary key of a rewrite the job made: which step."""
MAINTAINED_AT = "ingest.maintained-at-snapshot"
"""Table property: the snapshot the job's last maintenance of the table ended at. A maintenance with nothing to
rewrite (a small target rewritten whole by each batch) commits no snapshot: without this mark, every later run would
count the same commits again and maintain the table at its first batch."""


def commits_since_compaction(iceberg_table: Any, limit: int) -> int:
    """Snapshots on top of the table's newest rewrite (ours or anyone's) or of the snapshot the job's last
    maintenance ended at (`MAINTAINED_AT`), walking back at most `limit`.

    A walk cut short by expiry counts what it saw. Read once per run; the job counts on from there.
    """
    maintained = iceberg_table.properties.get(MAINTAINED_AT)
    count = 0
    for snapshot in lineage(iceberg_table):
        if count >= limit or str(snapshot.snapshot_id) == maintained:
            break
        if snapshot.summary is not None and snapshot.summary.operation.value == "replace":
            break
        count += 1
    return count


def maintain(spark: Any, table: str, pipeline: str, end: Watermark, settings: MaintenanceConfig) -> None:
    """Compact `table` (a qualified Spark name), then expire its old snapshots. Errors are logged, not raised:
    the table already holds and the state table already records the batch ending at `end`."""
    started = time.monotonic()
    log.info("%s: maintenance starts", table)
    try:
        done = _maintain(spark, table, pipeline, end, settings)
    except Exception as e:  # noqa: BLE001 - upkeep must never fail a batch that is committed and recorded
        log.warning("%s: maintenance failed, will try again later: %s", table, str(e).splitlines()[0][:300])
        return
    log.info("%s: maintenance in %.1f s: %s", table, time.monotonic() - started, "; ".join(done))


def _manifests(jtable: Any) -> int:
    head = jtable.currentSnapshot()
    return 0 if head is None else int(head.allManifests(jtable.io()).size())


def _maintain(spark: Any, table: str, pipeline: str, end: Watermark, settings: MaintenanceConfig) -> list[str]:
    jvm = spark._jvm
    session = spark._jsparkSession
    actions = jvm.org.apache.iceberg.spark.actions.SparkActions.get(session)
    jtable = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(session, table)
    summary = stream_offset_properties(pipeline, end)

    def tagged(action: Any, step: str) -> Any:
        for key, value in {**summary, SUMMARY_MAINTENANCE: step}.items():
            action = action.snapshotProperty(key, value)
        return action

    done = []
    data = tagged(actions.rewriteDataFiles(jtable), "rewrite-data-files").execute()
    done.append(f"{data.rewrittenDataFilesCount()} data files rewritten into {data.addedDataFilesCount()}")
    crash_point("maintenance.after_data_rewrite")
    if jvm.org.apache.iceberg.TableUtil.formatVersion(jtable) == 2:
        jtable.refresh()
        # rewrite-all: delete files are small next to data files, and only a rewrite drops the dangling ones.
        deletes = tagged(actions.rewritePositionDeletes(jtable), "rewrite-position-deletes")
        result = deletes.option("rewrite-all", "true").execute()
        done.append(
            f"{result.rewrittenDeleteFilesCount()} delete files rewritten into {result.addedDeleteFilesCount()}"
        )
    jtable.refresh()
    manifests = _manifests(jtable)
    if manifests > 1:  # each batch's commit added one; a reader's planning opens every one
        tagged(actions.rewriteManifests(jtable), "rewrite-manifests").execute()
        jtable.refresh()
        done.append(f"{manifests} manifests rewritten into {_manifests(jtable)}")
    crash_point("maintenance.before_expiry")
    if settings.expire_after_hours is not None:  # the table is fresh: refreshed after the last rewrite above
        older_than = int((time.time() - settings.expire_after_hours * 3600) * 1000)
        expired = actions.expireSnapshots(jtable).expireOlderThan(older_than).retainLast(RETAIN_LAST).execute()
        done.append(
            f"snapshots expired, {expired.deletedDataFilesCount()} data and "
            f"{expired.deletedPositionDeleteFilesCount()} delete files deleted"
        )
    jtable.refresh()
    head = jtable.currentSnapshot()
    if head is not None:
        jtable.updateProperties().set(MAINTAINED_AT, str(head.snapshotId())).commit()
    return done
