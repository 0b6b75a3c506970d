"""Processing what landed, in-process: what `lake-assets run` and `lake-assets demo` do.

A run takes the landed partitions that changed since they were last processed (`processed`:
new files, files rewritten or removed), or every landed partition when asked (`--all`,
`--from/--to`). An hourly feed runs as one Dagster run (a single-run backfill) per stretch of
those hours, over the tables that changed; a batch feed as one run per table over its batches. Runs go to the ephemeral instance, or to
`$DAGSTER_HOME`'s when it is set, so they show up in the UI.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import uuid
from typing import Callable

import dagster as dg

from lake_assets import processed
from lake_assets.config import LakeConfig, check_landings
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
from lake_assets.quarantine import REASON_SUFFIX, UNPARTITIONED, is_quarantined
from lake_assets.status import TableStatus, count_rows, table_status
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
    #: the feed, and the tables of it to run (None: every table the job has)
    feed: str = ""
    tables: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class StepDone:
    """A step of a run finished: the layers of a table it wrote, over which partitions, how
    long it took, what its materialisations recorded (layer -> metadata), or why it failed."""

    what: str  # `feed/table: layers`
    first: str
    last: str
    seconds: float
    metadata: dict[str, dict]
    failure: str | None = None


@dataclasses.dataclass
class Progress:
    """Callbacks a caller of `run_feeds` may give to follow it: the runs planned (with the
    number of steps they will take), then each step as it finishes."""

    planned: Callable[[list[PlannedRun], int], None] = lambda runs, steps: None
    step_done: Callable[[StepDone], None] = lambda step: None


def run_feeds(
    config: LakeConfig,
    instance: dg.DagsterInstance | None = None,
    say: Callable[[str], None] = print,
    first: str | None = None,
    last: str | None = None,
    everything: bool = False,
    progress: Progress | None = None,
) -> list[str]:
    """Process the landed partitions that changed since they were last processed (`processed`);
    with `everything`, or a range [first, last], every landed partition (in the range). Returns
    the run ids. With nothing to process no Dagster run (and no Spark session) starts. A failing
    table or feed stops no other: each runs, and RunFailed at the end names every failure."""
    storage = storage_for(config)
    layout = LakeLayout(config.lake)
    check_landings(config, storage)
    instance = instance or instance_for_cli()
    forced = everything or first is not None or last is not None
    failures: list[str] = []
    pins = _pin_what_landed(config, storage, say, failures)
    planned = [run for feed in config.feeds
               for run in _plan_feed(feed, pins[feed.name], storage, layout, instance, _Selection(first, last, forced),
                                     say, failures)]
    if not planned and not failures:
        say("nothing changed since the last run: no partition to process (--all processes every one again)")
    run_ids = []
    if planned:
        defs = build_definitions(config)
        steps, assets = _what_each_step_writes(defs), _assets_by_table(defs)
        progress = progress or Progress()
        selections = [None if run.tables is None else [key for table in run.tables for key in assets[f"{run.feed}/{table}"]]
                      for run in planned]
        progress.planned(planned, sum(len(_steps_of_run(run, steps)) for run in planned))
        for run, selection in zip(planned, selections):
            run_id, failed = _run(defs.resolve_job_def(run.job), instance, run, steps, say, selection, progress.step_done)
            run_ids += [run_id] if run_id else []
            failures += failed
    if failures:
        raise RunFailed(failures, run_ids)
    return run_ids


@dataclasses.dataclass(frozen=True)
class _Selection:
    """Which landed partitions a run takes: those in [first, last] (either end open), all of them
    when `forced`, else only those that changed since they were processed."""

    first: str | None
    last: str | None
    forced: bool


#: how many changed partitions of a table a run names before summing up the rest
_NAMED_CHANGES = 5


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


def _plan_feed(feed, pin: Pin, storage: Storage, layout: LakeLayout, instance: dg.DagsterInstance, selection: _Selection,
               say: Callable[[str], None], failures: list[str]) -> list[PlannedRun]:
    """The runs that process a feed's selected partitions. A table whose landing cannot be
    listed is a failure (added to `failures`); the feed's other tables still run."""
    try:
        fmt = format_for(feed)
        tables = feed_tables(feed, fmt, pin)
    except Exception as exc:  # reported at the end; the other feeds go on
        failures.append(f"{feed.name}: listing its tables: {_first_line(str(exc))}")
        return []
    landed, selected = {}, {}
    for table in tables:
        try:
            landed[table] = _within(fmt, fmt.partition_keys(storage, feed.landing, table), selection.first, selection.last)
            selected[table] = (landed[table] if selection.forced
                               else _changed_partitions(feed, fmt, storage, layout, table, landed[table], say))
        except Exception as exc:  # reported at the end; the other tables go on
            failures.append(f"{feed.name}/{table}: listing its partitions: {_first_line(str(exc))}")
    if fmt.partitioning == "batch":
        return _plan_batches(feed, instance, landed, selected, say)
    return _plan_hours(feed, landed, selected, say, failures)


def _changed_partitions(feed, fmt, storage: Storage, layout: LakeLayout, table: str, keys: list[str],
                        say: Callable[[str], None]) -> list[str]:
    """The partitions of a table whose landed files changed since they were processed, and the
    last one if the table has stray files no run has reported yet (every run reports strays)."""
    changes = processed.changed_partitions(
        storage, fmt.partitions_files(storage, feed.landing, table, keys), processed.read_notes(storage, layout, feed.name, table)
    )
    for change in changes[:_NAMED_CHANGES]:
        say(f"{feed.name}/{table}: {change.partition}: {change.reason}")
    if len(changes) > _NAMED_CHANGES:
        say(f"{feed.name}/{table}: and {len(changes) - _NAMED_CHANGES} more partition(s) changed")
    chosen = {change.partition for change in changes}
    unreported = [entry for entry, _ in fmt.stray_files(storage, feed.landing, table)
                  if not is_quarantined(storage, layout, feed.name, table, UNPARTITIONED, entry.uri)]
    if unreported and keys and not chosen:
        say(f"{feed.name}/{table}: {len(unreported)} stray file(s) not reported yet: processing {keys[-1]} reports them")
        chosen.add(keys[-1])
    return sorted(chosen, key=fmt.partition_order)


def _plan_batches(feed, instance: dg.DagsterInstance, landed: dict[str, list[str]], selected: dict[str, list[str]],
                  say: Callable[[str], None]) -> list[PlannedRun]:
    """Each table has its own batches: register them, then one run per table over its selected ones."""
    planned = []
    for table, batches in selected.items():
        if not landed[table]:
            say(f"{feed.name}/{table}: no batches landed")
        if not batches:
            continue
        name = batch_partitions_name(feed.name, table)
        known = set(instance.get_dynamic_partitions(name))
        instance.add_dynamic_partitions(name, [b for b in batches if b not in known])
        say(f"{feed.name}/{table}: batches {batches[0]} .. {batches[-1]} ({len(batches)}) in one run")
        planned.append(PlannedRun(f"{feed.name}/{table}", table_job_name(feed.name, table), batches[0], batches[-1]))
    return planned


def _plan_hours(feed, landed: dict[str, list[str]], selected: dict[str, list[str]], say: Callable[[str], None],
                failures: list[str]) -> list[PlannedRun]:
    """One run of the feed's job per stretch of selected hours, over the tables that selected
    any (a run bridges hours without files, never an hour whose files need no processing)."""
    early = sorted({hour for hours in selected.values() for hour in hours if feed.start and hour < feed.start})
    if early:
        failures.append(f"{feed.name}: {len(early)} hour(s) with files lie before the configured start {feed.start} "
                        f"({early[0]} .. {early[-1]}), outside the feed's partitions: not processed")
    if not any(landed.values()):
        say(f"{feed.name}: nothing landed under {feed.landing}")
        return []
    hours = sorted({hour for keys in selected.values() for hour in keys} - set(early))
    tables = tuple(table for table, keys in selected.items() if set(keys) - set(early))
    if not hours:
        return []
    whole_feed = len(tables) == len(landed)
    what = feed.name if whole_feed else f"{feed.name} ({', '.join(tables)})"
    settled = {hour for table in tables for hour in landed[table]} - set(hours)
    planned = []
    for start, end in contiguous_ranges(hours, max_gap_hours=MAX_EMPTY_HOURS_IN_A_RUN, barriers=settled):
        say(f"{what}: hours {start} .. {end} in one run")
        planned.append(PlannedRun(what, feed_job_name(feed.name), start, end, feed.name, None if whole_feed else tables))
    return planned


def _run(job, instance: dg.DagsterInstance, run: PlannedRun, steps: dict[str, str], say: Callable[[str], None],
         selection: list[dg.AssetKey] | None = None,
         step_done: Callable[[StepDone], None] = lambda step: None) -> tuple[str | None, list[str]]:
    """Execute one planned run (of the `selection` of the job's assets, if given), telling
    `step_done` each step as it ends; returns the run's id (None if Dagster refused it) and a
    line per failure."""
    run_id = str(uuid.uuid4())
    instance.add_event_listener(run_id, _step_listener(run, steps, step_done))
    try:
        result = job.execute_in_process(
            instance=instance, tags={RANGE_START_TAG: run.first, RANGE_END_TAG: run.last}, raise_on_error=False,
            asset_selection=selection, run_id=run_id,
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
        f"{steps.get(event.step_key, f'{run.what}: {event.step_key}')}, partitions {run.first} .. {run.last} "
        f"(run {result.run_id}): {_reason(event.step_failure_data)}"
        for event in result.all_events
        if event.is_step_failure and event.step_failure_data
    ]
    return result.run_id, failed or [f"{run.what}: run {result.run_id} failed; see its event log"]


def _steps_of_run(run: PlannedRun, steps: dict[str, str]) -> list[str]:
    """The steps a run takes: those of its tables (or of every table of its feed or table)."""
    tables = [f"{run.feed}/{table}" for table in run.tables] if run.tables is not None else [run.what]
    return [step for step, what in steps.items() if any(what.startswith(f"{table}/") or what.startswith(f"{table}:")
                                                        for table in tables)]


def _step_listener(run: PlannedRun, steps: dict[str, str], step_done: Callable[[StepDone], None]):
    """A Dagster event listener turning a run's events into `StepDone`s."""
    recorded: dict[str, dict[str, dict]] = {}

    def listen(entry) -> None:
        event = entry.dagster_event
        if event is None or event.step_key is None:
            return
        what = steps.get(event.step_key, f"{run.what}: {event.step_key}")
        if event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            materialization = event.event_specific_data.materialization
            recorded.setdefault(event.step_key, {})[materialization.asset_key.path[-1]] = {
                name: value.value for name, value in materialization.metadata.items()
            }
        elif event.is_step_success:
            seconds = event.event_specific_data.duration_ms / 1000
            step_done(StepDone(what, run.first, run.last, seconds, recorded.pop(event.step_key, {})))
        elif event.is_step_failure:
            step_done(StepDone(what, run.first, run.last, 0.0, recorded.pop(event.step_key, {}),
                               failure=_reason(event.step_failure_data)))

    return listen


def _assets_by_table(defs: dg.Definitions) -> dict[str, list[dg.AssetKey]]:
    """`feed/table` -> the assets a run of it materialises."""
    found: dict[str, list[dg.AssetKey]] = {}
    for assets_def in defs.resolve_asset_graph().assets_defs:
        if assets_def.is_executable:
            for key in assets_def.keys:
                found.setdefault(_table_of(key), []).append(key)
    return found


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


def summarise(config: LakeConfig) -> list[TableSummary]:
    storage = storage_for(config)
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
                    quarantined=sum(1 for e in storage.walk_files(quarantine) if e.name.endswith(REASON_SUFFIX)),
                )
            )
    return rows


def lake_status(config: LakeConfig, instance: dg.DagsterInstance | None = None) -> list[TableStatus]:
    """Where every table stands (`status`), with its last Dagster run when the instance keeps
    runs (`$DAGSTER_HOME`); a table whose landing cannot be listed raises."""
    storage = storage_for(config)
    layout = LakeLayout(config.lake)
    instance = instance or instance_for_cli()
    pins = load_pins(config, storage)
    found = []
    for feed in config.feeds:
        fmt = format_for(feed)
        for table in feed_tables(feed, fmt, pins[feed.name]):
            status = table_status(storage, layout, feed.landing, feed.name, fmt, table)
            job = table_job_name(feed.name, table) if fmt.partitioning == "batch" else feed_job_name(feed.name)
            status.last_run = _last_run(instance, job, f"{feed.name}/{table}")
            found.append(status)
    return found


def _last_run(instance: dg.DagsterInstance, job: str, table: str) -> dict | None:
    """The newest run of `job` that took the table (a run of some tables of a feed names them)."""
    for record in instance.get_run_records(filters=dg.RunsFilter(job_name=job), limit=20):
        run = record.dagster_run
        selected = run.asset_selection
        if not selected or any(_table_of(key) == table for key in selected):
            return {"run_id": run.run_id, "job": job, "status": run.status.value,
                    "started": dt.datetime.fromtimestamp(record.start_time, dt.timezone.utc).isoformat() if record.start_time else None,
                    "partitions": f"{run.tags.get(RANGE_START_TAG, '?')} .. {run.tags.get(RANGE_END_TAG, '?')}"}
    return None


def format_status(tables: list[TableStatus], keeps_runs: bool) -> str:
    """The status as a person reads it: one line per table, then what waits and what was set aside."""
    header = ("feed", "table", "last processed", "pending", "quarantined", "current", "history", "last run")
    body = [
        (s.feed, s.table, s.last_processed or "-", str(len(s.pending)), str(len(s.quarantined)), str(s.current_rows),
         str(s.history_rows), f"{s.last_run['status']} {s.last_run['started'][:19]}" if s.last_run else "-")
        for s in tables
    ]
    lines = [_table(header, body, 3)]
    if not keeps_runs:
        lines.append("(last runs are kept only by a Dagster instance: set DAGSTER_HOME)")
    for s in tables:
        for item in s.pending[:_NAMED_CHANGES]:
            lines.append(f"{s.feed}/{s.table}: not processed: {item['partition']} ({item['files']} file(s)): {item['reason']}")
        if len(s.pending) > _NAMED_CHANGES:
            lines.append(f"{s.feed}/{s.table}: and {len(s.pending) - _NAMED_CHANGES} more partition(s) not processed")
        for item in s.quarantined:
            lines.append(f"{s.feed}/{s.table}: quarantined: {item['file']}: {item['reason']}")
    return "\n".join(lines)


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
