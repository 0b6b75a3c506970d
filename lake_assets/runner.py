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
from lake_assets.discovery import Pin, describe, discover, feed_tables, load_pins
from lake_assets.errors import LakeAssetsError
from lake_assets.feeds import format_for
from lake_assets.landing_watch import contiguous_ranges
from lake_assets.orchestration.definitions import (
    batch_partitions_name,
    build_definitions,
    feed_job_name,
    table_job_name,
)
from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
from lake_assets.paths import LakeLayout
from lake_assets.storage import S3Settings, Storage


class RunFailed(LakeAssetsError):
    """Feeds or tables that failed, after every other one ran: a line per failure naming the
    feed/table, the step and the reason."""

    def __init__(self, failures: list[str], run_ids: list[str]):
        super().__init__(f"{len(failures)} failure(s):\n" + "\n".join(failures))
        self.failures = failures
        self.run_ids = run_ids


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


def _within(fmt, keys: list[str], first: str | None, last: str | None) -> list[str]:
    """The partition keys inside [first, last] (either end open), in the format's order."""
    order = fmt.partition_order
    return [
        k for k in sorted(keys, key=order)
        if (first is None or order(k) >= order(first)) and (last is None or order(k) <= order(last))
    ]


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One single-run backfill: `job` over the partitions `first` .. `last`."""

    what: str  # the feed, or feed/table for a table of a batch feed
    job: str
    first: str
    last: str


def run_feeds(
    config: LakeConfig,
    instance: dg.DagsterInstance | None = None,
    say: Callable[[str], None] = print,
    first: str | None = None,
    last: str | None = None,
) -> list[str]:
    """Materialise every landed partition of every feed, or those in [first, last]; returns the
    run ids. A failing table or feed stops no other: each runs, and RunFailed at the end names
    every failure."""
    storage = storage_for(config)
    run_ids, failures = [], []
    pins = _pin_what_landed(config, storage, say, failures)
    defs = build_definitions(config)
    instance = instance or instance_for_cli()
    steps = _what_each_step_writes(defs)
    for feed in config.feeds:
        for run in _plan_feed(feed, pins[feed.name], storage, instance, first, last, say, failures):
            run_id, failed = _run(defs.resolve_job_def(run.job), instance, run, steps, say)
            run_ids += [run_id] if run_id else []
            failures += failed
    if failures:
        raise RunFailed(failures, run_ids)
    return run_ids


def _pin_what_landed(config: LakeConfig, storage: Storage, say: Callable[[str], None],
                     failures: list[str]) -> dict[str, Pin]:
    """Discovery, before the definitions are built: the landing is listed to plan anyway, so what
    it holds is pinned and the definitions have it. A landing that cannot be listed is a failure
    (a table whose hours cannot be, planning reports)."""
    pins = {}
    for found in discover(config, storage):
        pins[found.feed.name] = found.pin
        if found.changed:
            say(describe(found))
        failures += [f"{found.feed.name}: {found.problem}"] if found.problem else []
    return pins


def _plan_feed(feed, pin: Pin, storage: Storage, instance: dg.DagsterInstance, first: str | None, last: str | None,
               say: Callable[[str], None], failures: list[str]) -> list[PlannedRun]:
    """The runs that process a feed's landed partitions in [first, last]. A table whose landing
    cannot be listed is a failure (added to `failures`); the feed's other tables still run."""
    try:
        fmt = format_for(feed)
        tables = feed_tables(feed, fmt, pin)
    except Exception as exc:  # reported at the end; the other feeds go on
        failures.append(f"{feed.name}: listing its tables: {_first_line(str(exc))}")
        return []
    landed = {}
    for table in tables:
        try:
            landed[table] = _within(fmt, fmt.partition_keys(storage, feed.landing, table), first, last)
        except Exception as exc:  # reported at the end; the other tables go on
            failures.append(f"{feed.name}/{table}: listing its partitions: {_first_line(str(exc))}")
    if fmt.partitioning == "batch":
        # Each table has its own batches: register them, then one run per table.
        planned = []
        for table, batches in landed.items():
            if not batches:
                say(f"{feed.name}/{table}: no batches landed")
                continue
            name = batch_partitions_name(feed.name, table)
            known = set(instance.get_dynamic_partitions(name))
            instance.add_dynamic_partitions(name, [b for b in batches if b not in known])
            say(f"{feed.name}/{table}: batches {batches[0]} .. {batches[-1]} ({len(batches)}) in one run")
            planned.append(PlannedRun(f"{feed.name}/{table}", table_job_name(feed.name, table), batches[0], batches[-1]))
        return planned
    hours = sorted({hour for keys in landed.values() for hour in keys})
    early = [hour for hour in hours if feed.start and hour < feed.start]
    if early:
        failures.append(f"{feed.name}: {len(early)} hour(s) with files lie before the configured start {feed.start} "
                        f"({early[0]} .. {early[-1]}), outside the feed's partitions: not processed")
        hours = hours[len(early):]
    if not hours:
        say(f"{feed.name}: nothing landed under {feed.landing}")
        return []
    say(f"{feed.name}: {len(landed)} table(s) {', '.join(landed)}; {len(hours)} hour(s) with files")
    stretches = contiguous_ranges(hours, max_gap_hours=MAX_EMPTY_HOURS_IN_A_RUN)
    for start, end in stretches:
        say(f"{feed.name}: hours {start} .. {end} in one run")
    return [PlannedRun(feed.name, feed_job_name(feed.name), start, end) for start, end in stretches]


def _run(job, instance: dg.DagsterInstance, run: PlannedRun, steps: dict[str, str],
         say: Callable[[str], None]) -> tuple[str | None, list[str]]:
    """Execute one planned run; returns its id (None if Dagster refused it) and a line per failure."""
    try:
        result = job.execute_in_process(
            instance=instance, tags={RANGE_START_TAG: run.first, RANGE_END_TAG: run.last}, raise_on_error=False
        )
    except Exception as exc:  # Dagster refused the run (e.g. partitions the job lacks): reported at the end
        return None, [f"{run.what}: partitions {run.first} .. {run.last}: {_first_line(str(exc))}"]
    for evaluation in result.get_asset_check_evaluations():
        if not evaluation.passed:
            say(f"{_table_of(evaluation.asset_key)}: check {evaluation.check_name} failed: {evaluation.description}")
    if result.success:
        say(f"{run.what}: run {result.run_id} succeeded")
        return result.run_id, []
    say(f"{run.what}: run {result.run_id} failed")
    failed = [
        f"{steps.get(event.step_key, f'{run.what}: {event.step_key}')} (run {result.run_id}): {_reason(event.step_failure_data)}"
        for event in result.all_events
        if event.is_step_failure and event.step_failure_data
    ]
    return result.run_id, failed or [f"{run.what}: run {result.run_id} failed; see its event log"]


def _table_of(key: dg.AssetKey) -> str:
    """`feed/table` of an asset keyed `[feed, (group,) table, layer]`."""
    return "/".join(key.path[:-1])


def _what_each_step_writes(defs: dg.Definitions) -> dict[str, str]:
    """Step (op) name -> `feed/table: layers` it writes, to name a failed step in words."""
    named = {}
    for assets_def in defs.resolve_asset_graph().assets_defs:
        if assets_def.is_executable:
            keys = sorted(assets_def.keys, key=lambda k: k.path)
            named[assets_def.op.name] = f"{_table_of(keys[0])}: {'+'.join(k.path[-1] for k in keys)}"
    return named


def _reason(failure) -> str:
    """A step's failure in one line: its Failure's own description, else the innermost error's."""
    if failure.user_failure_data is not None and failure.user_failure_data.description:
        return _first_line(failure.user_failure_data.description)
    error = failure.error
    while error is not None and error.cause is not None:
        error = error.cause
    return _first_line(error.message) if error is not None else "no error recorded; see the run's event log"


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text.strip())


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
    pins = load_pins(config, storage)
    rows = []
    for feed in config.feeds:
        fmt = format_for(feed)
        for table in feed_tables(feed, fmt, pins[feed.name]):
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
