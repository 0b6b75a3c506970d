"""Processing everything landed, in-process: what `lake-assets run` and `lake-assets demo` do.

An hourly feed runs as one Dagster run (a single-run backfill) per stretch of hours with landed
files, a batch feed as one run per table over its batches; on the ephemeral instance or on
`$DAGSTER_HOME`'s when it is set, so the runs show up in the UI.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from typing import Callable

import dagster as dg
import pyarrow.dataset as pads

from lake_assets.config import LakeConfig
from lake_assets.errors import LakeAssetsError
from lake_assets.feeds import format_for
from lake_assets.landing_watch import contiguous_ranges
from lake_assets.orchestration.definitions import (
    batch_partitions_name,
    build_definitions,
    feed_job_name,
    feed_tables,
    table_job_name,
)
from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
from lake_assets.paths import LakeLayout
from lake_assets.storage import S3Settings, Storage


class RunFailed(LakeAssetsError):
    pass


#: Hours without files that one run of an hourly feed may span. A run per stretch of landed
#: hours keeps one stray old hour from making a run of every hour since (one hour from 1990:
#: 300,000 empty partitions); bridging short gaps keeps a sparse landing (a file every few
#: hours, a quiet night) to one run, where a run costs far more than an empty hour in it.
MAX_EMPTY_HOURS_IN_A_RUN = 24


@dataclasses.dataclass(frozen=True)
class TableSummary:
    feed: str
    table: str
    changes: int
    current: int
    history: int
    quarantined: int


def instance_for_cli() -> dg.DagsterInstance:
    return dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral()


def _failure_messages(result) -> list[str]:
    messages = []
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            messages.append(f"{event.step_key}: {event.step_failure_data.error.message.strip()}")
    return messages or ["the run failed; see its event log"]


def _within(fmt, keys: list[str], first: str | None, last: str | None) -> list[str]:
    """The partition keys inside [first, last] (either end open), in the format's order."""
    order = fmt.partition_order
    return [
        k for k in sorted(keys, key=order)
        if (first is None or order(k) >= order(first)) and (last is None or order(k) <= order(last))
    ]


def run_feeds(
    config: LakeConfig,
    instance: dg.DagsterInstance | None = None,
    say: Callable[[str], None] = print,
    first: str | None = None,
    last: str | None = None,
) -> list[str]:
    """Materialise every landed partition of every feed, or those in [first, last]; returns the run ids."""
    defs = build_definitions(config)
    storage = storage_for(config)
    instance = instance or instance_for_cli()
    run_ids = []
    for feed in config.feeds:
        fmt = format_for(feed)
        tables = feed_tables(feed, fmt, storage)
        if fmt.partitioning == "batch":
            # Each table has its own batches: register them, then one run per table.
            for table in tables:
                batches = _within(fmt, fmt.partition_keys(storage, feed.landing, table), first, last)
                if not batches:
                    say(f"{feed.name}/{table}: no batches landed")
                    continue
                name = batch_partitions_name(feed.name, table)
                known = set(instance.get_dynamic_partitions(name))
                instance.add_dynamic_partitions(name, [b for b in batches if b not in known])
                say(f"{feed.name}/{table}: batches {batches[0]} .. {batches[-1]} ({len(batches)}) in one run")
                run_ids.append(_run(defs.resolve_job_def(table_job_name(feed.name, table)), instance, batches, f"{feed.name}/{table}", say))
            continue
        hours = _within(fmt, list({h for t in tables for h in fmt.partition_keys(storage, feed.landing, t)}), first, last)
        if not hours:
            say(f"{feed.name}: nothing landed under {feed.landing}")
            continue
        say(f"{feed.name}: {len(tables)} table(s) {', '.join(tables)}; {len(hours)} hour(s) with files")
        for start, end in contiguous_ranges(hours, max_gap_hours=MAX_EMPTY_HOURS_IN_A_RUN):
            say(f"{feed.name}: hours {start} .. {end} in one run")
            run_ids.append(_run(defs.resolve_job_def(feed_job_name(feed.name)), instance, [start, end], feed.name, say))
    return run_ids


def _run(job, instance: dg.DagsterInstance, partitions: list[str], what: str, say: Callable[[str], None]) -> str:
    """One single-run backfill over a range of partitions; RunFailed names the failing step."""
    result = job.execute_in_process(
        instance=instance, tags={RANGE_START_TAG: partitions[0], RANGE_END_TAG: partitions[-1]}, raise_on_error=False
    )
    if not result.success:
        raise RunFailed(f"{what}: run {result.run_id} failed: " + "; ".join(_failure_messages(result)))
    say(f"{what}: run {result.run_id} succeeded")
    return result.run_id



def storage_for(config: LakeConfig) -> Storage:
    return Storage(S3Settings(endpoint_url=config.s3.endpoint_url, region=config.s3.region))


def count_rows(storage: Storage, uri: str) -> int:
    """Rows of a lake table as any Hive-aware reader sees them (pyarrow, independent of Spark)."""
    if not storage.exists(uri):
        return 0
    fs, path = storage.resolve(uri)
    dataset = pads.dataset(path, filesystem=fs, format="parquet", partitioning="hive", exclude_invalid_files=False)
    return dataset.count_rows()


def summarise(config: LakeConfig) -> list[TableSummary]:
    storage = storage_for(config)
    layout = LakeLayout(config.lake)
    rows = []
    for feed in config.feeds:
        fmt = format_for(feed)
        for table in feed_tables(feed, fmt, storage):
            quarantine = f"{layout.root}/_quarantine/{feed.name}/{table}"
            quarantined = sum(1 for e in storage.walk_files(quarantine) if e.name.endswith(".reason.json"))
            rows.append(
                TableSummary(
                    feed=feed.name,
                    table=table,
                    changes=count_rows(storage, layout.table("changes", feed.name, table)),
                    current=count_rows(storage, layout.table("current", feed.name, table)),
                    history=count_rows(storage, layout.table("history", feed.name, table)),
                    quarantined=quarantined,
                )
            )
    return rows


def _table(header: tuple[str, ...], body: list[tuple[str, ...]], text_columns: int) -> str:
    """Aligned columns: the first `text_columns` left-aligned, the rest (numbers) right-aligned."""
    widths = [max(len(x) for x in col) for col in zip(header, *body)]
    return "\n".join(
        "  ".join(v.ljust(w) if i < text_columns else v.rjust(w) for i, (v, w) in enumerate(zip(line, widths)))
        for line in (header, *body)
    )


def format_summary(rows: list[TableSummary]) -> str:
    header = ("feed", "table", "changes", "current", "history", "quarantined")
    body = [(r.feed, r.table, str(r.changes), str(r.current), str(r.history), str(r.quarantined)) for r in rows]
    return _table(header, body, 2)


def format_records(records: list[dict]) -> str:
    """Catalog records as a table a person reads: span, where, what, run, size, file."""
    def when(ms):
        return "-" if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

    body = [
        (when(r["metadata"]["start"]), when(r["metadata"]["end"]), r["metadata"]["where"], r["metadata"]["what"],
         r["metadata"]["work_id"] or "-", r["url"], str(r["size"]))
        for r in records
    ]
    return _table(("start", "end", "where", "what", "work_id", "url", "bytes"), body, 6) + f"\n{len(records)} file(s)"
