"""The Dagster side of `lake-assets run`: the planned runs (`lake_assets.runner`) executed
in-process as single-run backfills, each step's end reported as it happens, every failure named
by table, step and partitions; and the last run of each table for `lake-assets status`.

Runs go to the ephemeral instance, or to `$DAGSTER_HOME`'s when it is set, so they show up in
the UI. The runner imports this module only when there is something to run: a run with nothing
new costs a listing of the landing, not Dagster's start-up.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import uuid
from collections.abc import Callable

import dagster as dg

from lake_assets.config import LakeConfig
from lake_assets.discovery import feed_tables, load_pins, tables_of_every_feed
from lake_assets.errors import ConfigError, LakeAssetsError, first_line
from lake_assets.feeds import format_for
from lake_assets.landing_watch import stretches_in_order
from lake_assets.orchestration.assets import asset_key
from lake_assets.orchestration.definitions import (
    batch_partitions_name,
    build_definitions,
    feed_job_name,
    table_job_name,
)
from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
from lake_assets.paths import LakeLayout
from lake_assets.runner import PlannedRun, Progress, StepDone
from lake_assets.status import TableStatus, table_status


def instance_for_cli() -> dg.DagsterInstance:
    """The Dagster instance of `$DAGSTER_HOME`, else one in memory for this command."""
    if not os.environ.get("DAGSTER_HOME"):
        return dg.DagsterInstance.ephemeral()
    try:
        return dg.DagsterInstance.get()
    except dg.DagsterInvariantViolationError as exc:  # not an absolute path, or no such folder
        raise ConfigError(f"DAGSTER_HOME: {first_line(exc)}") from None


def execute(
    config: LakeConfig,
    planned: list[PlannedRun],
    instance: dg.DagsterInstance | None,
    say: Callable[[str], None],
    progress: Progress,
) -> tuple[list[str], list[str]]:
    """Run the planned runs one after the other (a failed one stops none of the others);
    returns the run ids and a line per failure."""
    instance = instance or instance_for_cli()
    defs = build_definitions(config)
    steps, assets = _what_each_step_writes(defs), _assets_by_table(defs)
    runs = [part for run in planned for part in _as_registered_ranges(instance, run)]
    progress.planned(runs, sum(len(_steps_of_run(run, steps)) for run in runs))
    run_ids, failures = [], []
    for run in runs:
        selection = (
            None
            if run.tables is None
            else [key for table in run.tables for key in assets[f"{run.feed}/{table}"]]
        )
        run_id, failed = _run(
            defs.resolve_job_def(_job_of(run)), instance, run, steps, say, selection, progress.step_done
        )
        run_ids += [run_id] if run_id else []
        failures += failed
    return run_ids, failures


def _job_of(run: PlannedRun) -> str:
    return feed_job_name(run.feed) if run.batch_table is None else table_job_name(run.feed, run.batch_table)


def _as_registered_ranges(instance: dg.DagsterInstance, run: PlannedRun) -> list[PlannedRun]:
    """A planned run as Dagster runs: one for an hourly feed; for a batch table, its batches are
    registered (a batch table's partitions are dynamic) and the run is cut into ranges that are
    contiguous in the order the instance holds them in, which is not always the batches' order."""
    if run.batch_table is None:
        return [run]
    name = batch_partitions_name(run.feed, run.batch_table)
    registered = set(instance.get_dynamic_partitions(name))
    instance.add_dynamic_partitions(name, [b for b in dict.fromkeys(run.batches) if b not in registered])
    order = instance.get_dynamic_partitions(name)  # read again: another process may have added some
    return [
        dataclasses.replace(run, first=stretch[0], last=stretch[-1], batches=stretch)
        for stretch in stretches_in_order(order, run.batches)
    ]


def _run(
    job,
    instance: dg.DagsterInstance,
    run: PlannedRun,
    steps: dict[str, str],
    say: Callable[[str], None],
    selection: list[dg.AssetKey] | None = None,
    step_done: Callable[[StepDone], None] = lambda step: None,
) -> tuple[str | None, list[str]]:
    """Execute one planned run (of the `selection` of the job's assets, if given), telling
    `step_done` each step as it ends; returns the run's id (None if Dagster refused it) and a
    line per failure."""
    run_id = str(uuid.uuid4())
    instance.add_event_listener(run_id, _step_listener(run, steps, step_done))
    try:
        result = job.execute_in_process(
            instance=instance,
            tags={RANGE_START_TAG: run.first, RANGE_END_TAG: run.last},
            raise_on_error=False,
            asset_selection=selection,
            run_id=run_id,
        )
    except Exception as exc:  # noqa: BLE001 - Dagster refused the run (e.g. partitions the job lacks): reported at the end
        return None, [f"{run.what}: partitions {run.first} .. {run.last}: {first_line(exc)}"]
    for evaluation in result.get_asset_check_evaluations():
        if not evaluation.passed:
            say(
                f"{_table_of(evaluation.asset_key)}: check {evaluation.check_name} failed: {evaluation.description}"
            )
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
    return [
        step
        for step, what in steps.items()
        if any(what.startswith((f"{table}/", f"{table}:")) for table in tables)
    ]


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
            step_done(
                StepDone(
                    what,
                    run.first,
                    run.last,
                    0.0,
                    recorded.pop(event.step_key, {}),
                    failure=_reason(event.step_failure_data),
                )
            )

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
            keys = sorted(assets_def.keys, key=lambda k: k.to_user_string())
            named[assets_def.op.name] = f"{_table_of(keys[0])}: {'+'.join(k.path[-1] for k in keys)}"
    return named


def _reason(failure) -> str:
    """A step's failure in one line: its Failure's own description, else the message of the
    first lake_assets error in the chain (written to be read; what it was raised from is in the
    run's log), else the innermost error's."""
    if failure.user_failure_data is not None and failure.user_failure_data.description:
        return first_line(failure.user_failure_data.description)
    own = _subclass_names(LakeAssetsError)  # asked now: every module that defines one is loaded
    error = failure.error
    while error is not None and error.cause is not None and error.cls_name not in own:
        error = error.cause
    if error is None:
        return "no error recorded; see the run's event log"
    if _driver_unreachable(error):
        return f"the Spark driver's JVM is gone (killed, or out of memory; the next run starts another): {first_line(error.message)}"
    return first_line(error.message)


#: what PySpark's gateway raises when the driver JVM is gone: py4j wraps most socket failures
#: as `Py4JNetworkError`, but a bare socket error can pass when it (re)connects
_GATEWAY_LOST = frozenset(
    {
        "ConnectionRefusedError",
        "ConnectionResetError",
        "ConnectionAbortedError",
        "BrokenPipeError",
        "Py4JNetworkError",
    }
)


def _driver_unreachable(error) -> bool:
    """Whether an error is PySpark's gateway failing to reach the driver JVM: said plainly, a
    bare 'Connection refused' reads like the store's fault."""
    return error.cls_name in _GATEWAY_LOST and any("/py4j/" in frame for frame in error.stack)


def _subclass_names(base: type[Exception]) -> set[str]:
    names = {base.__name__}
    for subclass in base.__subclasses__():
        names |= _subclass_names(subclass)
    return names


def lake_status(config: LakeConfig, instance: dg.DagsterInstance | None = None) -> list[TableStatus]:
    """Where every table stands (`status`), with its last Dagster run when the instance keeps
    runs (`$DAGSTER_HOME`); a table whose landing cannot be listed raises."""
    storage = config.storage()
    layout = LakeLayout(config.lake)
    instance = instance or instance_for_cli()
    pins = load_pins(config, storage)
    _, left_out = tables_of_every_feed(config.feeds, pins)
    found = []
    for feed in config.feeds:
        fmt = format_for(feed)
        for table in feed_tables(feed, fmt, pins[feed.name]):
            status = table_status(
                storage,
                layout,
                feed.landing,
                feed.name,
                fmt,
                table,
                allow_empty_landing=feed.allow_empty_landing,
            )
            job = (
                table_job_name(feed.name, table) if fmt.partitioning == "batch" else feed_job_name(feed.name)
            )
            status.last_run = _last_run(instance, job, feed.name, table)
            status.not_loaded = left_out.get(f"{feed.name}/{table}")
            found.append(status)
    return found


#: the layers a run of a table materialises (its `raw` source is only observed)
_RUN_LAYERS = ("catalog", "changes", "current", "history")


def _last_run(instance: dg.DagsterInstance, job: str, feed: str, table: str) -> dict | None:
    """The newest run that took the table, whichever job it ran: the command's (`job`), or
    Dagster's own asset job, which the UI's backfills, the sensors and automation launch and
    which every table shares. Those are found by the table's assets (the run that last planned
    or materialised each layer), so a quiet table's run is found however many others ran since."""
    keys = [asset_key(feed, table, layer) for layer in _RUN_LAYERS]
    run_ids = {
        run_id
        for record in instance.get_asset_records(keys)
        for run_id in (record.asset_entry.last_run_id, record.asset_entry.last_planned_materialization_run_id)
        if run_id
    }
    found = list(instance.get_run_records(filters=dg.RunsFilter(run_ids=sorted(run_ids)))) if run_ids else []
    command_run = _newest_run_taking(instance, job, f"{feed}/{table}")
    if command_run is not None:
        found.append(command_run)
    if not found:
        return None
    record = max(found, key=lambda r: r.create_timestamp)
    run = record.dagster_run
    return {
        "run_id": run.run_id,
        "job": run.job_name,
        "status": run.status.value,
        "started": dt.datetime.fromtimestamp(record.start_time, dt.UTC).isoformat()
        if record.start_time
        else None,
        "partitions": f"{run.tags.get(RANGE_START_TAG, '?')} .. {run.tags.get(RANGE_END_TAG, '?')}",
    }


def _newest_run_taking(instance: dg.DagsterInstance, job: str, table: str) -> dg.RunRecord | None:
    """The newest of `job`'s recent runs that took the table (a run selecting assets names them)."""
    for record in instance.get_run_records(filters=dg.RunsFilter(job_name=job), limit=20):
        selected = record.dagster_run.asset_selection
        if not selected or any(_table_of(key) == table for key in selected):
            return record
    return None
