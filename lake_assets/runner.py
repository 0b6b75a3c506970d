"""What `lake-assets run` and `lake-assets demo` process, and the run of it.

A run takes the landed partitions that changed since they were last processed (`processed`:
new files, files rewritten or removed), or every landed partition when asked (`--all`,
`--from/--to`). Planning reads listings and the lake's notes only: an hourly feed becomes one
run (a single-run backfill) per stretch of those hours, over the tables that changed; a batch
feed one run per table over its batches. The plan is carried out by
`orchestration.execution`, which this module loads only when there is something to run, so a
run with nothing new starts neither Dagster nor Spark (docs/incremental-runs.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from lake_assets import processed, reruns
from lake_assets.config import LakeConfig, check_landings
from lake_assets.discovery import (
    Pin,
    describe,
    describe_absent,
    describe_unread,
    discover,
    tables_of_every_feed,
)
from lake_assets.errors import LakeAssetsError, LandingEmptied, first_line
from lake_assets.feeds import format_for
from lake_assets.landing_watch import contiguous_ranges
from lake_assets.paths import LakeLayout
from lake_assets.quarantine import unreported_strays
from lake_assets.status import pending_partitions
from lake_assets.storage import Storage

if TYPE_CHECKING:
    import dagster as dg


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

#: Rounds of runs that partitions asked to run again (`reruns.request_rerun`) get after a
#: command's own runs. One is what a late fragment takes: a round's runs read what the requests
#: name, so only a file landing meanwhile asks again.
MAX_FOLLOW_UP_ROUNDS = 3


def _within(fmt, keys: list[str], first: str | None, last: str | None) -> list[str]:
    """The partition keys inside [first, last] (either end open), in the format's order."""
    order = fmt.partition_order
    return [
        k
        for k in sorted(keys, key=order)
        if (first is None or order(k) >= order(first)) and (last is None or order(k) <= order(last))
    ]


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One single-run backfill of a feed over the partitions `first` .. `last`: of its tables
    `tables` (None: every one), or, for a batch feed, of its table `batch_table` over `batches`."""

    what: str  # the feed (and its tables when not all of them), or feed/table for a batch table
    feed: str
    first: str
    last: str
    tables: tuple[str, ...] | None = None
    batch_table: str | None = None
    batches: tuple[str, ...] = ()


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
    failures: list[str] = []
    planned = plan_runs(
        config, _Selection(first, last, everything or first is not None or last is not None), say, failures
    )
    if not planned and not failures:
        if first is not None or last is not None:
            say("no landed partition in the window: nothing to process")
        else:
            say(
                "nothing changed since the last run: no partition to process (--all processes every one again)"
            )
    run_ids: list[str] = []
    progress = progress or Progress()
    asked: list[str] = []

    def step_done(step: StepDone) -> None:
        asked.extend(p for layer in step.metadata.values() for p in layer.get(reruns.RERUNS_ASKED, []))
        progress.step_done(step)

    following = dataclasses.replace(progress, step_done=step_done)
    for _ in range(1 + MAX_FOLLOW_UP_ROUNDS):
        if not planned:
            break
        from lake_assets.orchestration.execution import execute  # Dagster loads only when there is work

        asked.clear()
        ids, failed = execute(config, planned, instance, say, following)
        run_ids += ids
        failures += failed
        if failed or not asked:
            break
        # A run asked for partitions it does not own to run again (a Flow transaction that a
        # late fragment completed is committed in its acknowledgement's hour): done here, so
        # the command ends with every landed row in place.
        planned = plan_runs(config, _Selection(None, None, False, reruns_only=True), say, failures)
    else:
        if planned:
            failures.append(
                f"partitions still asked to run again after {MAX_FOLLOW_UP_ROUNDS} follow-up round(s): "
                + ", ".join(f"{run.what} {run.first} .. {run.last}" for run in planned)
            )
    if failures:
        raise RunFailed(list(dict.fromkeys(failures)), run_ids)  # a follow-up round plans again
    return run_ids


def plan_runs(
    config: LakeConfig, selection: _Selection, say: Callable[[str], None], failures: list[str]
) -> list[PlannedRun]:
    """The runs that process the selected partitions of every feed; what cannot be listed is
    added to `failures` and stops nothing else."""
    storage = config.storage()
    layout = LakeLayout(config.lake)
    check_landings(config, storage)
    pins = _pin_what_landed(config, storage, say, failures)
    tables_of, left_out = tables_of_every_feed(config.feeds, pins)
    failures += left_out.values()
    return [
        run
        for feed in config.feeds
        for run in _plan_feed(feed, tables_of[feed.name], storage, layout, selection, say, failures)
    ]


@dataclasses.dataclass(frozen=True)
class _Selection:
    """Which landed partitions a run takes: those in [first, last] (either end open), all of them
    when `forced`, else only those that changed since they were processed."""

    first: str | None
    last: str | None
    forced: bool
    #: only the partitions a run asked to run again (a command's follow-up round)
    reruns_only: bool = False

    @property
    def windowed(self) -> bool:
        return self.first is not None or self.last is not None

    def for_format(self, fmt) -> _Selection | None:
        """The selection as a feed of `fmt` takes it: the window when its ends name the format's
        partitions (hours, or GRAX batches; the CLI refuses ends of two kinds), None when they
        name none of them. An end of the other kind (a caller's own window) is left open."""
        first, last = (
            key if key is not None and fmt.is_partition_key(key) else None for key in (self.first, self.last)
        )
        if self.windowed and first is None and last is None:
            return None
        return dataclasses.replace(self, first=first, last=last)

    def describe(self) -> str:
        """The window in words, for a message (empty when there is none)."""
        ends = []
        if self.first is not None:
            ends.append(f" from {self.first}")
        if self.last is not None:
            ends.append(f" up to {self.last}")
        return "".join(ends)


#: how many changed partitions of a table a run names before summing up the rest
NAMED_CHANGES = 5


def _pin_what_landed(
    config: LakeConfig, storage: Storage, say: Callable[[str], None], failures: list[str]
) -> dict[str, Pin]:
    """Discovery, before the definitions are built: the landing is listed to plan anyway, so what
    it holds is pinned and the definitions have it. A landing that cannot be listed is a failure
    (a table whose hours cannot be, planning reports)."""
    pins = {}
    for found in discover(config, storage):
        pins[found.feed.name] = found.pin
        if found.changed:
            say(describe(found))
        for note in (describe_unread(found), describe_absent(found)):
            if note:
                say(note)
        failures += [f"{found.feed.name}: {found.problem}"] if found.problem else []
    return pins


def _plan_feed(
    feed,
    tables: list[str],
    storage: Storage,
    layout: LakeLayout,
    selection: _Selection,
    say: Callable[[str], None],
    failures: list[str],
) -> list[PlannedRun]:
    """The runs that process the selected partitions of a feed's `tables`. A table whose
    landing cannot be listed is a failure (added to `failures`); the feed's other tables
    still run."""
    fmt = format_for(feed)
    fitting = selection.for_format(fmt)
    if fitting is None:
        kind = "GRAX batches" if fmt.partitioning == "batch" else "hours"
        say(f"{feed.name}: not run: --from/--to{selection.describe()} names none of its partitions ({kind})")
        return []
    selection = fitting
    landed, selected = {}, {}
    for table in tables:
        try:
            landed[table] = _within(
                fmt, fmt.partition_keys(storage, feed.landing, table), selection.first, selection.last
            )
            if selection.forced:
                selected[table] = landed[table]
            elif selection.reruns_only:
                selected[table] = _asked_partitions(feed, storage, layout, table, landed[table], say)
            else:
                selected[table] = _changed_partitions(
                    feed,
                    fmt,
                    storage,
                    layout,
                    table,
                    landed[table],
                    say,
                    lambda key: bool(_within(fmt, [key], selection.first, selection.last)),
                )
            if not landed[table] and not selection.reruns_only:
                # No partition to run (only folders dated ahead, say): no run reports the
                # table's strays, so each file is named here.
                for entry, reason in unreported_strays(storage, layout, fmt, feed.landing, feed.name, table):
                    say(f"{feed.name}/{table}: {entry.uri} is not read: {reason}")
        except LandingEmptied as refused:  # reported at the end; the other tables go on
            failures.append(str(refused))
        except Exception as exc:  # noqa: BLE001 - reported at the end; the other tables go on
            failures.append(f"{feed.name}/{table}: listing its partitions: {first_line(exc)}")
    if fmt.partitioning == "batch":
        return _plan_batches(feed, landed, selected, say)
    return _plan_hours(feed, landed, selected, say, failures, selection.describe())


def _changed_partitions(
    feed,
    fmt,
    storage: Storage,
    layout: LakeLayout,
    table: str,
    keys: list[str],
    say: Callable[[str], None],
    within: Callable[[str], bool],
) -> list[str]:
    """The partitions of a table (inside the run's window, `within`: the notes of partitions
    outside it are not read, so their files do not look removed) whose landed files changed
    since they were processed or that a run asked to run again, and the last one if the table
    has stray files no run has reported yet (every run reports strays). A partition holding
    data of a file removed from another is chosen too; the run of the other partition asks it
    to run again, in a request that stands until it is read again and folded
    (`pipeline.ingest`)."""
    every_note = processed.read_notes(storage, layout, feed.name, table, fmt.is_partition_key)
    notes = {partition: note for partition, note in every_note.items() if within(partition)}
    changes, listed = pending_partitions(
        storage,
        layout,
        fmt,
        landing=feed.landing,
        feed=feed.name,
        table=table,
        keys=keys,
        notes=notes,
        within=within,
    )
    _name_changes(feed.name, table, changes, say)
    # Asked of all the partitions the table's runs take at once: the runs, and their steps'
    # own check, see only theirs, and a new file in one would vouch for the others' removal.
    refusal = processed.refusal_for_a_blank_landing(
        fmt,
        storage,
        layout,
        landing=feed.landing,
        feed=feed.name,
        table=table,
        read={key: set(note) for key, note in notes.items()},
        listed=listed,
        allowed=feed.allow_empty_landing,
        read_elsewhere=lambda key: every_note.get(key, {}).keys(),
    )
    if refusal:
        raise LandingEmptied(refusal)
    chosen = {change.partition for change in changes}
    unreported = (
        unreported_strays(storage, layout, fmt, feed.landing, feed.name, table) if keys and not chosen else []
    )
    if unreported:
        say(
            f"{feed.name}/{table}: {len(unreported)} stray file(s) not reported yet: processing {keys[-1]} reports them"
        )
        chosen.add(keys[-1])
    return sorted(chosen, key=fmt.partition_order)


def _asked_partitions(
    feed, storage: Storage, layout: LakeLayout, table: str, keys: list[str], say: Callable[[str], None]
) -> list[str]:
    """The landed partitions of a table that a run asked to run again (a follow-up round)."""
    # only landed partitions are taken, so a folder named like none is no harm here
    asked = reruns.asked(reruns.read_reruns(storage, layout, feed.name, table))
    changes = [processed.Change(key, f"to run again: {asked[key]}") for key in keys if key in asked]
    _name_changes(feed.name, table, changes, say)
    return [change.partition for change in changes]


def _name_changes(feed: str, table: str, changes: list[processed.Change], say: Callable[[str], None]) -> None:
    for change in changes[:NAMED_CHANGES]:
        say(f"{feed}/{table}: {change.partition}: {change.reason}")
    if len(changes) > NAMED_CHANGES:
        say(f"{feed}/{table}: and {len(changes) - NAMED_CHANGES} more partition(s) changed")


def _plan_batches(
    feed, landed: dict[str, list[str]], selected: dict[str, list[str]], say: Callable[[str], None]
) -> list[PlannedRun]:
    """Each table has its own batches: one run per table over its selected ones."""
    planned = []
    for table, batches in selected.items():
        if not landed[table]:
            say(f"{feed.name}/{table}: no batches landed")
        if not batches:
            continue
        say(f"{feed.name}/{table}: batches {batches[0]} .. {batches[-1]} ({len(batches)})")
        planned.append(
            PlannedRun(
                f"{feed.name}/{table}",
                feed.name,
                batches[0],
                batches[-1],
                batch_table=table,
                batches=tuple(batches),
            )
        )
    return planned


def _plan_hours(
    feed,
    landed: dict[str, list[str]],
    selected: dict[str, list[str]],
    say: Callable[[str], None],
    failures: list[str],
    window: str = "",
) -> list[PlannedRun]:
    """One run of the feed's job per stretch of selected hours, over the tables that selected
    any (a run bridges hours without files, never an hour whose files need no processing);
    `window` says the run's window, if any, in words."""
    early = sorted(
        {hour for hours in selected.values() for hour in hours if feed.start and hour < feed.start}
    )
    if early:
        failures.append(
            f"{feed.name}: {len(early)} hour(s) with files lie before the configured start {feed.start} "
            f"({early[0]} .. {early[-1]}), outside the feed's partitions: not processed"
        )
    if not any(landed.values()) and not any(selected.values()):
        say(f"{feed.name}: nothing landed{window} under {feed.landing}")
        return []
    # An hour whose files are all gone is still selected (its note remains): it runs once more,
    # so that its rows leave `changes`, even when no file of the table is left at all.
    hours = sorted({hour for keys in selected.values() for hour in keys} - set(early))
    tables = tuple(table for table, keys in selected.items() if set(keys) - set(early))
    if not hours:
        return []
    whole_feed = len(tables) == len(landed)
    what = feed.name if whole_feed else f"{feed.name} ({', '.join(tables)})"
    settled = {hour for table in tables for hour in landed.get(table, [])} - set(hours)
    planned = []
    for start, end in contiguous_ranges(hours, max_gap_hours=MAX_EMPTY_HOURS_IN_A_RUN, barriers=settled):
        say(f"{what}: hours {start} .. {end} in one run")
        planned.append(PlannedRun(what, feed.name, start, end, None if whole_feed else tables))
    return planned
