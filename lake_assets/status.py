"""Where each table of a lake stands: what `lake-assets status` prints.

Read from the lake and the landing only (no Spark, no Dagster): the processed notes
(`processed`) give the last processed partition and, against a listing of the landing, the
partitions landed but not processed yet; the quarantine notes give the files set aside and why;
the tables' Parquet footers give their row counts. `orchestration.execution` adds the last
Dagster run. `summarise` is the table a run prints at its end.
"""

from __future__ import annotations

import dataclasses
import json

import pyarrow.parquet as pq

from lake_assets import processed, reruns
from lake_assets.config import LakeConfig
from lake_assets.discovery import feed_tables, load_pins
from lake_assets.feeds import format_for
from lake_assets.feeds.base import FeedFormat
from lake_assets.paths import LakeLayout
from lake_assets.quarantine import notes_under, unreported_strays
from lake_assets.storage import Storage


@dataclasses.dataclass
class TableStatus:
    feed: str
    table: str
    last_processed: str | None
    #: partitions landed but not processed yet (or changed since): partition, reason, files
    pending: list[dict]
    #: files set aside: file, partition, reason
    quarantined: list[dict]
    #: stray files no run has set aside yet (a table without partitions has no run to): file, reason
    not_read: list[dict]
    changes_rows: int
    current_rows: int
    history_rows: int
    #: the last Dagster run of the table, when the instance keeps runs: id, job, status, started
    last_run: dict | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def count_rows(storage: Storage, uri: str) -> int:
    """Rows of a lake table as any Hive-aware reader sees them: the row counts in the footers
    of its Parquet files, leaving out hidden entries (names starting with `.` or `_`, which
    Spark and pyarrow skip too). Footers only: no data page is read."""
    if not storage.exists(uri):
        return 0
    rows = 0
    for entry in storage.walk_files(uri, skip=lambda name: name.startswith((".", "_"))):
        with storage.open_input_file(entry.uri) as handle:
            rows += pq.ParquetFile(handle).metadata.num_rows
    return rows


def quarantined_files(storage: Storage, layout: LakeLayout, feed: str, table: str) -> list[dict]:
    """The notes of a table's quarantined files, oldest partition first."""
    notes = [
        json.loads(storage.read_bytes(entry.uri))
        for entry in notes_under(storage, layout.quarantine(feed, table))
    ]
    return sorted(
        ({"file": n["file"], "partition": n.get("partition"), "reason": n["reason"]} for n in notes),
        key=lambda n: (str(n["partition"]), n["file"]),
    )


def table_status(
    storage: Storage, layout: LakeLayout, landing: str, feed: str, fmt: FeedFormat, table: str
) -> TableStatus:
    notes = processed.read_notes(storage, layout, feed, table)
    keys = fmt.partition_keys(storage, landing, table)
    landed = fmt.partitions_files(storage, landing, table, keys)
    pending = [
        {
            "partition": change.partition,
            "reason": change.reason,
            "files": len(landed.get(change.partition, [])),
        }
        for change in processed.changed_partitions(
            storage, landed, notes, reruns.asked(reruns.read_reruns(storage, layout, feed, table))
        )
    ]
    return TableStatus(
        feed=feed,
        table=table,
        last_processed=max(notes, key=fmt.partition_order) if notes else None,
        pending=pending,
        quarantined=quarantined_files(storage, layout, feed, table),
        not_read=[
            {"file": entry.uri, "reason": reason}
            for entry, reason in unreported_strays(storage, layout, fmt, landing, feed, table)
        ],
        changes_rows=count_rows(storage, layout.table("changes", feed, table)),
        current_rows=count_rows(storage, layout.table("current", feed, table)),
        history_rows=count_rows(storage, layout.table("history", feed, table)),
    )


@dataclasses.dataclass(frozen=True)
class TableSummary:
    feed: str
    table: str
    changes: int
    current: int
    history: int
    quarantined: int


def summarise(config: LakeConfig) -> list[TableSummary]:
    """Rows of each table's layers and its quarantined files, as the lake holds them now."""
    storage = config.storage()
    layout = LakeLayout(config.lake)
    pins = load_pins(config, storage)
    rows = []
    for feed in config.feeds:
        fmt = format_for(feed)
        for table in feed_tables(feed, fmt, pins[feed.name]):
            quarantine = layout.quarantine(feed.name, table)
            rows.append(
                TableSummary(
                    feed=feed.name,
                    table=table,
                    changes=count_rows(storage, layout.table("changes", feed.name, table)),
                    current=count_rows(storage, layout.table("current", feed.name, table)),
                    history=count_rows(storage, layout.table("history", feed.name, table)),
                    quarantined=len(notes_under(storage, quarantine)),
                )
            )
    return rows
