"""Landing sensors: one per feed, a cursor per table, ranged runs for new or late files.

Hourly feeds: new hour folders and files arriving late in a recent hour. Batch feeds (GRAX): new
batches are registered as dynamic partitions; the open (greatest) batch is re-run when it gains
files. Run keys hash the files a run covers, so the same files never run twice. An hourly partition
that another run asked to run again (`reruns.request_rerun`) gets a run of its own, keyed by
its standing requests. Every few minutes each table is also looked at for partitions whose
change-log write kept a purge no fold recorded (`_kept_purges`) and for partitions that runs the
daemon launched left unprocessed when they were cancelled or failed for good
(`_left_unfinished`); both get runs of their own, asked for again a few times if they fail.
"""

import contextlib
import dataclasses
import datetime as dt
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import TypeVar

import dagster as dg

from lake_assets import reruns
from lake_assets.config import FeedConfig
from lake_assets.discovery import (
    Pin,
    describe,
    describe_absent,
    describe_unread,
    discover_feed,
    feed_tables,
    tables_of_every_feed,
)
from lake_assets.engine.purges import seen_files
from lake_assets.engine.state import TableState
from lake_assets.errors import DamagedLakeFile, LakeAssetsError, first_line
from lake_assets.feeds.base import FeedFormat, current_hour, hour_key
from lake_assets.landing_watch import (
    BatchCursor,
    NewFiles,
    SensorLooks,
    TableCursor,
    contiguous_ranges,
    decode_cursor,
    encode_cursor,
    late_window_start,
    scan_batches,
    scan_table,
    short_digest,
    strays_due,
    strays_run_key,
    stretches_in_order,
)
from lake_assets.orchestration.assets import WHOLE_TABLE_RUN_TAG, TableAssets, feed_job_name, table_job_name
from lake_assets.orchestration.resources import LakeResource
from lake_assets.paths import LakeLayout, identifier
from lake_assets.processed import (
    ProcessedWith,
    holding_removed_data,
    read_notes,
    read_notes_of,
    unfolded_notes,
)
from lake_assets.quarantine import unreported_strays
from lake_assets.status import kept_purge_partitions, pending_partitions
from lake_assets.storage import Storage

#: the name Dagster's own job over every asset starts with (a run of it selects its assets)
ASSET_JOB_PREFIX = "__ASSET_JOB"
# The tags Dagster gives runs (`dagster._core.storage.tags`, not exported): a run's partitions,
# what launched it, and whether its failure will be retried.
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
PARTITION_TAG = "dagster/partition"
SENSOR_NAME_TAG = "dagster/sensor_name"
AUTOMATION_CONDITION_TAG = "dagster/from_automation_condition"
WILL_RETRY_TAG = "dagster/will_retry"
AUTO_RETRY_RUN_ID_TAG = "dagster/auto_retry_run_id"
PARENT_RUN_ID_TAG = "dagster/parent_run_id"
RETRY_NUMBER_TAG = "dagster/retry_number"
#: the run tag naming the table a sensor's run is for
TABLE_TAG = "lake_assets/table"


def _watching(feed: FeedConfig, tables: list[TableAssets], kind: str, description: str) -> dict:
    """What every feed's sensor is declared with: its name, how often it ticks, whether it runs
    from the start (`watch`), and the assets its runs may materialise."""
    return {
        "name": f"{identifier(feed.name)}_{kind}_sensor",
        "description": description,
        "minimum_interval_seconds": feed.sensor_interval_seconds,
        "default_status": dg.DefaultSensorStatus.RUNNING if feed.watch else dg.DefaultSensorStatus.STOPPED,
        "asset_selection": [k for t in tables for k in t.processed_keys],
    }


def build_landing_sensor(feed: FeedConfig, fmt: FeedFormat, tables: list[TableAssets]) -> dg.SensorDefinition:
    by_name = {t.table: t for t in tables}

    @dg.sensor(
        **_watching(
            feed,
            tables,
            "landing",
            f"Watches {feed.landing} for new hour folders and for files arriving up to "
            f"{feed.late_hours} h late in an hour already seen (older hours are compared with what "
            "the lake processed once a day); requests one run per table and range of consecutive "
            "hours, keyed by the files it saw so nothing runs twice.",
        )
    )
    def landing_sensor(context: dg.SensorEvaluationContext, lake: LakeResource):
        cursors = decode_cursor(context.cursor)
        tick = _Tick(context, lake.get_storage(), lake.layout(), feed, fmt, _strays_turn(cursors, by_name))
        tick.old_partitions_turn = _old_partitions_turn(cursors, by_name)
        run_requests, observations = [], []
        failures = _ScanFailures(context, feed.name)
        for assets, cursor in tick.tables_in_turn(by_name, cursors, TableCursor):
            with failures.of(assets.table):
                requests, observed, cursors[assets.table] = _hourly_runs(tick, assets, cursor)
                run_requests += requests
                observations += observed
        failures.unless_every_table_failed(tick)
        return dg.SensorResult(
            run_requests=run_requests, asset_events=observations, cursor=encode_cursor(cursors)
        )

    return landing_sensor


_Cursor = TypeVar("_Cursor", bound=SensorLooks)


class _ScanFailures:
    """The tables of a feed whose landing a tick could not scan (a folder it may not list, the
    store out of reach). One such table stops no other table's runs: its failure goes to the
    tick's log, and its cursor keeps what it had seen (marked only with the try, `_Tick.
    tables_in_turn`), so a later tick scans the same files again. When no table could be
    scanned and none waits for its turn, the tick fails, as a tick that can do nothing should."""

    def __init__(self, context: dg.SensorEvaluationContext, feed: str):
        self.context, self.feed = context, feed
        self.failed: list[str] = []

    @contextlib.contextmanager
    def of(self, table: str) -> Iterator[None]:
        try:
            yield
        except Exception as failure:  # noqa: BLE001 - logged; the other tables go on
            self.failed.append(f"{table}: {first_line(failure)}")
            self.context.log.error(
                f"{self.feed}/{table}: its landing could not be scanned, so this tick requests no run of it "
                f"(a later tick tries again): {first_line(failure)}"
            )

    def unless_every_table_failed(self, tick: "_Tick") -> None:
        """Fails the tick when every table it scanned failed and none waits for a later tick. A
        waiting table's first scan comes before the failed one's next try, and only a tick that
        returns saves the cursor recording that try: each failure is in the log as an error."""
        if tick.scanned and len(self.failed) == tick.scanned and not tick.waiting:
            raise LakeAssetsError(
                f"{self.feed}: no table's landing could be scanned: {'; '.join(self.failed)}"
            )


#: seconds of a tick after which tables still to be scanned for the first time wait for the next
#: tick. A first scan reads every note the lake keeps of the table (on S3 a request each: some
#: 10-15 s for a year of hours), and Dagster stops a sensor's evaluation after 60 s, which a feed
#: of several long tables would pass, failing every tick, as no cursor would ever be saved.
FIRST_SCANS_SECONDS = 20


@dataclasses.dataclass
class _Tick:
    """What a sensor's tick scans every table of its feed with."""

    context: dg.SensorEvaluationContext
    storage: Storage
    layout: LakeLayout
    feed: FeedConfig
    fmt: FeedFormat
    #: the one table whose turn it is to be walked for strays (`_strays_turn`), if any
    strays_turn: str | None = None
    #: the one table whose partitions the scans no longer list are looked at this tick
    #: (`_old_partitions_turn`), if any
    old_partitions_turn: str | None = None
    started: float = dataclasses.field(default_factory=time.monotonic)
    #: the runs not finished yet, asked of the instance once a tick (`writing`)
    unfinished: list[dg.DagsterRun] | None = None
    #: the end of this tick's look at the runs that ended (`ended_since`): runs settle first
    looked_until: float = dataclasses.field(default_factory=lambda: time.time() - RUN_SETTLE_SECONDS)
    #: run id -> (when last updated, the run) of the runs that ended unsuccessfully from
    #: `_ended_from` to `looked_until`, asked of the instance as the tables' looks need them
    _ended: dict[str, tuple[float, dg.DagsterRun]] = dataclasses.field(default_factory=dict)
    _ended_from: float | None = None
    #: how many more partitions this tick's looks at ended runs may read (`unfinished_share`)
    unfinished_budget: int = dataclasses.field(default_factory=lambda: UNFINISHED_PARTITIONS_PER_TICK)
    first_scans: int = 0
    #: tables this tick scanned, and tables whose first scan waits for a later tick
    scanned: int = 0
    waiting: int = 0

    def tables_in_turn(
        self, by_name: dict[str, TableAssets], cursors: dict[str, _Cursor], blank: Callable[[], _Cursor]
    ) -> Iterator[tuple[TableAssets, _Cursor]]:
        """The tables this tick scans, with their cursors, in `_turn_order`, while
        `takes_first_scan` allows: a first scan that runs long and fails then does not take
        every tick's time ahead of the tables never tried. Each try is marked on the table's
        cursor (a first scan's, and the strays turn as taken), which a scan that succeeds
        replaces; a scan that keeps failing so passes the strays turn on. (A tick that Dagster
        stops at 60 s saves no cursor, and so no mark: `FIRST_SCANS_SECONDS` and `each_request`'s
        stop in an outage keep a tick well inside that.)"""
        for name in sorted(by_name, key=lambda name: _turn_order(name, cursors.get(name))):
            cursor = cursors.get(name) or blank()
            if not self.takes_first_scan(name, cursor.first_scan):
                self.waiting += 1
                continue
            now = time.time()
            cursors[name] = dataclasses.replace(
                cursor,
                first_scan_tried_at=now if cursor.first_scan else cursor.first_scan_tried_at,
                strays_looked_at=now if name == self.strays_turn else cursor.strays_looked_at,
            )
            self.scanned += 1
            yield by_name[name], cursor

    def writing(self, assets: TableAssets) -> bool:
        """Whether a run not finished yet may write the table: one selecting any of its processed
        assets or, with no selection recorded, one of a job over them (its table's, its feed's,
        or Dagster's job over every asset)."""
        return bool(self._in_flight(assets))

    def in_flight_partitions(self, assets: TableAssets) -> set[str] | None:
        """The partitions of the table that runs not finished yet may write; None when one may
        write any (its partitions are not known: no partition tags, or ones no longer valid)."""
        partitions: set[str] = set()
        for run in self._in_flight(assets):
            try:
                covered = _partitions_of(self, assets, run.tags)
            except Exception:  # noqa: BLE001 - not known: it may write any partition
                return None
            if not covered:
                return None
            partitions.update(covered)
        return partitions

    def _in_flight(self, assets: TableAssets) -> list[dg.DagsterRun]:
        if self.unfinished is None:
            records = self.context.instance.get_run_records(filters=dg.RunsFilter(statuses=_UNFINISHED))
            self.unfinished = [r.dagster_run for r in records]
        return [run for run in self.unfinished if self.may_write(assets, run.job_name, run.asset_selection)]

    def ended_since(self, since: float) -> list[dg.DagsterRun]:
        """The runs that ended unsuccessfully (cancelled or failed) and were last updated from
        `since` (less `UNFINISHED_OVERLAP_SECONDS`) to `looked_until`, asked of the instance once
        for every table of the tick."""
        start = since - UNFINISHED_OVERLAP_SECONDS
        if self._ended_from is None or start < self._ended_from:
            records = self.context.instance.get_run_records(
                filters=dg.RunsFilter(
                    statuses=_UNSUCCESSFUL,
                    updated_after=dt.datetime.fromtimestamp(start, dt.UTC),
                    updated_before=dt.datetime.fromtimestamp(
                        self.looked_until if self._ended_from is None else self._ended_from + 1, dt.UTC
                    ),
                )
            )
            for record in records:
                self._ended[record.dagster_run.run_id] = (
                    record.update_timestamp.timestamp(),
                    record.dagster_run,
                )
            self._ended_from = start
        return [run for updated, run in self._ended.values() if updated >= start]

    def unfinished_share(self, partitions: list[str]) -> tuple[list[str], list[str]]:
        """`partitions` split into those a table's look reads this tick, within what is left of
        `UNFINISHED_PARTITIONS_PER_TICK`, and those that wait for its next look."""
        now, later = partitions[: self.unfinished_budget], partitions[self.unfinished_budget :]
        self.unfinished_budget -= len(now)
        return now, later

    def may_write(self, assets: TableAssets, job: str, selection: AbstractSet[dg.AssetKey] | None) -> bool:
        """Whether a run of `job` selecting `selection` may write the table (`writing`)."""
        if selection:
            return bool(set(assets.processed_keys) & selection)
        return job in {table_job_name(self.feed.name, assets.table), feed_job_name(self.feed.name)} or (
            job.startswith(ASSET_JOB_PREFIX)
        )

    def takes_first_scan(self, table: str, first_scan: bool) -> bool:
        """Whether the table is scanned this tick: every table but one scanned for the first
        time once the tick has run `FIRST_SCANS_SECONDS` (the first such table always is)."""
        if not first_scan:
            return True
        elapsed = time.monotonic() - self.started
        if self.first_scans and elapsed >= FIRST_SCANS_SECONDS:
            self.context.log.info(
                f"{self.feed.name}/{table}: its first scan waits for the next tick (this one has "
                f"scanned for {elapsed:.0f} s)"
            )
            return False
        self.first_scans += 1
        return True


def _hourly_runs(
    tick: _Tick, assets: TableAssets, cursor: TableCursor
) -> tuple[list[dg.RunRequest], list[dg.AssetObservation], TableCursor]:
    """One hourly table's runs for this tick, what it observed, and its cursor after it."""
    context, storage, layout, feed, fmt = tick.context, tick.storage, tick.layout, tick.feed, tick.fmt
    name, first = assets.table, _first_hour(assets)
    first_scan = cursor.first_scan
    processed = _processed_with(tick, name) if first_scan else None
    found, cursor, before_start = scan_table(
        storage, fmt, feed.landing, name, cursor, feed.late_hours, first, processed
    )
    if first_scan:  # it compared every hour with what the lake processed it with
        cursor = dataclasses.replace(cursor, old_partitions_looked_at=time.time())
    old, cursor = _old_hours(tick, assets, cursor, {f.partition for f in found})
    found += old
    if before_start:
        context.log.warning(
            f"{feed.name}/{name}: {len(before_start)} hour(s) with files before the first "
            f"partition {first} are not run: {describe_partitions(before_start)}. `lake-assets "
            "discover` (or the tables sensor) pins the first landed hour, and a reload of the "
            "code location takes them in; an explicit `start` in the configuration leaves them out"
        )
    try:
        standing_requests = reruns.read_reruns(storage, layout, feed.name, name, fmt.is_partition_key)
    except DamagedLakeFile as damaged:  # one table's note stops no other table's runs
        context.log.warning(f"{feed.name}/{name}: its requests to run again are not read: {damaged}")
        standing_requests = {}
    # an hour asked to run again that this tick runs anyway needs no run of its own
    requests = [
        _rerun(feed.name, assets, partition, standing)
        for partition, standing in sorted(standing_requests.items())
        if partition not in {f.partition for f in found}
    ]
    kept, cursor = _kept_purges(tick, assets, cursor, [*(f.partition for f in found), *standing_requests])
    # Not the hours asked to run again: a run of theirs that was cancelled keeps its key, which
    # Dagster runs once; a run asked for here reads what the requests name all the same.
    left, cursor = _left_unfinished(tick, assets, cursor, [*(f.partition for f in found), *kept])
    requests += _kept_purge_runs(tick, assets, kept, _hour_ranges(kept))
    requests += _unfinished_runs(tick, assets, _hour_ranges(left))
    if not found and not requests:
        last = cursor.high_water if cursor.high_water and cursor.high_water >= (first or "") else None
        strays, cursor = _strays_run(tick, assets, cursor, last)
        return strays, [], cursor
    for start, end in contiguous_ranges([f.partition for f in found]):
        in_range = [f for f in found if start <= f.partition <= end]
        requests.append(_range_run(feed.name, assets, start, end, in_range))
    return requests, [_observation(assets, found)] if found else [], _strays_reported(cursor)


#: how often a table's partitions the scans no longer list (hours older than the late window,
#: batches before the open one) are compared with what the lake processed them with
#: (`_old_partitions`): a first scan's work (every processed note read, the whole landing
#: listed), for one table a tick
OLD_PARTITIONS_EVERY_SECONDS = 24 * 3600


def _old_partitions_turn(cursors: dict, tables: Iterable[str]) -> str | None:
    """The table whose old partitions are looked at this tick, if any: of those scanned before
    and due (`OLD_PARTITIONS_EVERY_SECONDS`), the one looked at longest ago."""
    now = time.time()

    def looked_at(table: str) -> float:
        return cursors[table].old_partitions_looked_at or 0.0

    due = [
        table
        for table in tables
        if isinstance(cursors.get(table), SensorLooks)
        and cursors[table].newest is not None  # a table with no partition has none older either
        and looked_at(table) <= now - OLD_PARTITIONS_EVERY_SECONDS
    ]
    return min(due, key=lambda table: (looked_at(table), table), default=None)


def _old_partitions(
    tick: _Tick,
    assets: TableAssets,
    cursor: _Cursor,
    covered: set[str],
    scanned_since_processed: Callable[[ProcessedWith], list[NewFiles]],
    older: Callable[[str], bool],
    described: str,
) -> tuple[list[NewFiles], _Cursor]:
    """On the table's turn (`_old_partitions_turn`): the partitions the scans no longer list
    (`older`: hours older than the late window, batches before the open one) whose files differ
    from those the lake last processed them with (a file landed or was rewritten there, say
    while a backfill ran), found as a first scan finds them (`scanned_since_processed`); less
    the partitions this tick runs anyway (`covered`), those a run in flight may write, and those
    the look at ended runs holds (`unfinished_held`: a retry of theirs may be coming).
    It counts as the tick's first scan, whose work it does: in a tick past
    `FIRST_SCANS_SECONDS` it waits for a later tick. One that fails is logged and waits its next
    turn. `described` names the partitions in the log, e.g. "hour(s) older than the late window"."""
    feed, table = tick.feed, assets.table
    if table != tick.old_partitions_turn or cursor.newest is None:
        return [], cursor
    if tick.first_scans or time.monotonic() - tick.started >= FIRST_SCANS_SECONDS:
        return [], cursor
    tick.first_scans += 1
    # A run in flight whose partitions are not known may write any: what it folds is then run again.
    in_flight = tick.in_flight_partitions(assets) or set()
    looked = dataclasses.replace(cursor, old_partitions_looked_at=time.time())
    processed = _processed_with(
        tick, table, f"its {described} are not looked at (`lake-assets status` names them)"
    )
    if processed is None:
        return [], looked
    try:
        found = scanned_since_processed(processed)
    except Exception as failure:  # noqa: BLE001 - logged; its next turn looks again
        tick.context.log.warning(
            f"{feed.name}/{table}: its {described} could not be looked at: {first_line(failure)}"
        )
        return [], looked
    left_out = covered | in_flight | set(cursor.unfinished_held)
    old = [f for f in found if older(f.partition) and f.partition not in left_out]
    if old:
        tick.context.log.info(
            f"{feed.name}/{table}: {len(old)} {described} changed since the lake processed them: "
            f"{describe_partitions([f.partition for f in old])}; runs of them are asked for"
        )
    return old, looked


def _old_hours(
    tick: _Tick, assets: TableAssets, cursor: TableCursor, covered: set[str]
) -> tuple[list[NewFiles], TableCursor]:
    """`_old_partitions` of an hourly table: the hours older than its late window."""
    feed, first = tick.feed, _first_hour(assets)

    def scanned(processed: ProcessedWith) -> list[NewFiles]:
        return scan_table(
            tick.storage,
            tick.fmt,
            feed.landing,
            assets.table,
            TableCursor(),
            feed.late_hours,
            first,
            processed,
        ).found

    # No hour seen, no turn (`_old_partitions_turn`): then nothing is older than the window.
    window = late_window_start(cursor.high_water, feed.late_hours) if cursor.high_water else ""
    return _old_partitions(
        tick,
        assets,
        cursor,
        covered,
        scanned,
        lambda hour: hour < window,
        "hour(s) older than the late window",
    )


def _old_batches(
    tick: _Tick, assets: TableAssets, cursor: BatchCursor, covered: set[str]
) -> tuple[list[NewFiles], BatchCursor]:
    """`_old_partitions` of a batch table: the batches before the open (greatest) one, which
    the scans list no more."""
    feed, fmt = tick.feed, tick.fmt

    def scanned(processed: ProcessedWith) -> list[NewFiles]:
        return scan_batches(tick.storage, fmt, feed.landing, assets.table, BatchCursor(), processed)[0]

    def before_open(batch: str) -> bool:
        return cursor.last is not None and fmt.partition_order(batch) < fmt.partition_order(cursor.last)

    return _old_partitions(
        tick, assets, cursor, covered, scanned, before_open, "batch(es) before the open one"
    )


def _hour_ranges(hours: Iterable[str]) -> list[tuple[str, ...]]:
    """`hours` in ranges of consecutive hours, each the hours of one run."""
    keys = sorted(hours)
    return [tuple(h for h in keys if start <= h <= end) for start, end in contiguous_ranges(keys)]


def _processed_with(
    tick: _Tick, table: str, unread: str = "this first scan runs every partition with files"
) -> ProcessedWith | None:
    """For a table's first scan (or its look at its old partitions, `_old_partitions`): what the lake
    processed, from its notes (read once), and the partitions whose changes were stored but
    never folded; less the partitions a run asked to run again and, for a format whose files
    share data (Flow), those holding data of a file removed from another partition (which
    planning over every hour runs again though their own files are unchanged). None (a first
    scan then runs every partition with files, as it always did; `unread` says what follows, in
    the tick's log) when a processed note or request is damaged: no reason to stop watching. A
    damaged note of changes stored and never folded costs only what it names: the partitions
    whose files are all gone are then not found. (The partitions of purges a write kept are
    `_kept_purges`' to run, on a first scan as on any tick.)"""
    storage, layout, feed, fmt = tick.storage, tick.layout, tick.feed.name, tick.fmt
    try:
        notes = read_notes(storage, layout, feed, table, fmt.is_partition_key)
        to_run = set(reruns.read_reruns(storage, layout, feed, table, fmt.is_partition_key))
    except DamagedLakeFile as damaged:
        tick.context.log.warning(f"{feed}/{table}: its processed notes are not read, so {unread}: {damaged}")
        return None
    try:
        unfolded = unfolded_notes(storage, layout, feed, table, notes.keys(), fmt.is_partition_key)
    except DamagedLakeFile as damaged:
        tick.context.log.warning(
            f"{feed}/{table}: the notes of its changes stored and never folded are not read, so this "
            f"scan finds no such partition whose files are all gone (`lake-assets run` does): {damaged}"
        )
        unfolded = {}
    if fmt.files_share_data:  # one walk (no window), where `partitions_files` lists each hour's folders
        landed = {
            key: list(files)
            for key, files in fmt.landed_hours(storage, tick.feed.landing, table, None).items()
        }
        to_run |= holding_removed_data(landed, notes, fmt.holding_removed_data).keys()
    return ProcessedWith(storage, notes, frozenset(to_run), unfolded)


#: how often a table's purges kept by a change-log write are looked for (`_kept_purges`): a
#: listing of its `purges_seen` folder each time
KEPT_PURGES_EVERY_SECONDS = 300
#: the runs asked for a set of kept purges (`_kept_purge_runs`), or for a partition cancelled or
#: failed runs left (`_within_attempts`), that may fail before the sensor stops asking for them
RUN_AGAIN_ATTEMPTS = 3
#: the run tag naming the kept purges a run was asked for, by which its attempts are counted
KEPT_PURGE_TAG = "lake_assets/kept_purges"
#: how often a table's runs that ended unsuccessfully are looked at (`_left_unfinished`)
UNFINISHED_EVERY_SECONDS = 300
#: the most partitions a tick's looks at ended runs read the notes and landed files of, for
#: all tables together (on S3, about three requests each, 16 at a time); those beyond wait on
#: their table's cursor for its next look, so that cancelled runs over a year of hours keep each
#: tick well inside Dagster's 60 s
UNFINISHED_PARTITIONS_PER_TICK = 720
#: how long after a run's last update it is looked at: Dagster tags a failed run it will retry
#: (`dagster/will_retry`) just after the failure
RUN_SETTLE_SECONDS = 30
#: how far each look at the runs that ended reaches back into the one before: a run's update
#: time comes from the clock of the process that ran it, which may lag the daemon's; a run seen
#: twice costs a look at notes already read (its partitions are processed by then, held back
#: for a run of them in flight, or counted as an attempt)
UNFINISHED_OVERLAP_SECONDS = 120
#: the run tag of the runs asked for the partitions cancelled or failed runs left, by which
#: their attempts are counted
UNFINISHED_TAG = "lake_assets/unfinished"
#: how far back the failed runs asked for a partition count as its attempts: a partition whose
#: runs keep failing is asked for again at most `RUN_AGAIN_ATTEMPTS` times in it
ATTEMPTS_WINDOW_SECONDS = 24 * 3600
_FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
_UNFINISHED = [status for status in dg.DagsterRunStatus if status not in _FINISHED]
_UNSUCCESSFUL = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


def _kept_purges(
    tick: _Tick, assets: TableAssets, cursor: _Cursor, covered: Iterable[str]
) -> tuple[dict[str, list[str]], _Cursor]:
    """The partitions whose change-log write kept a purge that no fold has recorded
    (`kept_purge_partitions`), each with the files keeping it, for runs of their own; and the
    cursor after the look. A run stopped between its write and its fold (killed, or failed
    there with its retries spent) otherwise leaves the purged record's fields in current and
    history until something new lands: a tick compares the landing with its cursor only.

    Looked for every `KEPT_PURGES_EVERY_SECONDS`, and only while no run that may write the
    table is in flight (its fold may record them yet: looked for again the next tick). Leaves
    out the partitions this tick runs anyway (`covered`) and those no run can name (an hour
    before the table's first, or yet to come). Never raises: a failure is logged and the next
    tick looks again, so it costs none of the runs the tick found."""
    now = time.time()
    if cursor.purges_looked_at is not None and now - cursor.purges_looked_at < KEPT_PURGES_EVERY_SECONDS:
        return {}, cursor
    feed, table = tick.feed.name, assets.table
    try:
        files = seen_files(tick.storage, TableState(tick.layout, feed, table))
        if files and tick.writing(assets):
            return {}, cursor
        kept = kept_purge_partitions(tick.storage, tick.layout, tick.fmt, feed, table, files) if files else {}
    except Exception as failure:  # noqa: BLE001 - logged; the runs this tick found go on
        tick.context.log.warning(
            f"{feed}/{table}: the purges its change log kept could not be looked for (the next tick "
            f"tries again): {first_line(failure)}"
        )
        return {}, cursor
    first, last, covered = _first_hour(assets), hour_key(current_hour()), set(covered)
    runnable = {
        partition: names
        for partition, names in kept.items()
        if partition not in covered
        and (tick.fmt.partitioning != "hourly" or (first or partition) <= partition <= last)
    }
    return runnable, dataclasses.replace(cursor, purges_looked_at=now)


def _left_unfinished(
    tick: _Tick, assets: TableAssets, cursor: _Cursor, covered: Iterable[str]
) -> tuple[dict[str, list[str]], _Cursor]:
    """The partitions that runs of the table the daemon launched (a sensor's, automation's, or
    their retries) left unprocessed, cancelled or failed with no retry to come (or one promised
    that never came), each with the names of its landed files; and the cursor after the look.
    The sensor saw those files when it asked for the runs, and a tick compares the landing with
    its cursor only: without this look they would wait for a person. A person's runs (a UI
    backfill, the launchpad, a re-execution) are theirs to run again, and the runs for kept
    purges are `_kept_purges`' to ask for again.

    Looked at every `UNFINISHED_EVERY_SECONDS`, over the runs that ended since the last look;
    the first look of a table only starts the watch (a first scan runs what is unprocessed
    itself, and runs cancelled before an upgrade are not brought back). Leaves out the
    partitions this tick runs anyway (`covered`), those whose runs asked for here failed
    `RUN_AGAIN_ATTEMPTS` times (`_within_attempts`), and those a run in flight may write: it
    may process them yet, so they are kept on the cursor for the next look (with a run in
    flight that may write any partition, the look waits), as are those of a failure Dagster
    has yet to launch the retry of, and those beyond the tick's share
    (`UNFINISHED_PARTITIONS_PER_TICK`). Never raises: a failure is logged and the next tick
    looks again."""
    since, until = cursor.unfinished_looked_until, tick.looked_until
    if since is None:
        return {}, dataclasses.replace(cursor, unfinished_looked_until=until)
    if until - since < UNFINISHED_EVERY_SECONDS:
        return {}, cursor
    feed, table = tick.feed.name, assets.table
    try:
        in_flight = tick.in_flight_partitions(assets)
        if in_flight is None:
            return {}, cursor
        waited = set(cursor.unfinished_held)
        ended, retry_due = _ended_unsuccessfully(tick, assets, since)
        # A failure whose retry Dagster has yet to launch is waited for one look (a run seen
        # again, the looks overlapping, is not waited for twice; each run of a chain of retries
        # is, however soon after the one before it fails); then its partitions are looked at
        # as any others, held while its retry is in flight.
        awaited = sorted(set(retry_due) - set(cursor.retries_awaited))
        for_retry = {partition for run_id in awaited for partition in retry_due[run_id]}
        ended |= waited | {partition for partitions in retry_due.values() for partition in partitions}
        held = (ended & in_flight) | for_retry
        # Those kept from earlier looks first: a run seen again never keeps them waiting.
        candidates = sorted(
            (p for p in ended - held - set(covered) if tick.fmt.is_partition_key(p)),
            key=lambda p: (p not in waited, p),
        )
        now, later = tick.unfinished_share(candidates)
        held |= set(later)
        left = _within_attempts(tick, assets, _unprocessed(tick, assets, now))
    except Exception as failure:  # noqa: BLE001 - logged; the runs this tick found go on
        tick.context.log.warning(
            f"{feed}/{table}: the runs that left its partitions unprocessed could not be looked at "
            f"(the next tick tries again): {first_line(failure)}"
        )
        return {}, cursor
    return left, dataclasses.replace(
        cursor,
        unfinished_looked_until=until,
        unfinished_held=sorted(held),
        retries_awaited=awaited,
    )


def _ended_unsuccessfully(
    tick: _Tick, assets: TableAssets, since: float
) -> tuple[set[str], dict[str, list[str]]]:
    """The partitions of the runs the daemon launched that may write the table and ended since
    `since` (seconds since the epoch): (those of the runs cancelled, or failed with no retry to
    come; run id -> those of each failed run whose retry Dagster has yet to launch). The second
    are held for a look: should the retry never be launched (retries turned off since, the
    daemon stopped), the next look finds them unprocessed and asks for them."""
    partitions: set[str] = set()
    retry_due: dict[str, list[str]] = {}
    for run in tick.ended_since(since):
        tags = run.tags
        if KEPT_PURGE_TAG in tags or AUTO_RETRY_RUN_ID_TAG in tags:
            continue
        if not _launched_by_daemon(tick.context.instance, run):
            continue
        if not tick.may_write(assets, run.job_name, run.asset_selection):
            continue
        try:
            if tags.get(WILL_RETRY_TAG) == "true":
                retry_due[run.run_id] = _partitions_of(tick, assets, tags)
            else:
                partitions.update(_partitions_of(tick, assets, tags))
        except Exception as failure:  # noqa: BLE001 - logged; one run's tags stop no other's
            tick.context.log.warning(
                f"{tick.feed.name}/{assets.table}: the partitions of run {run.run_id} are not known, so "
                f"they are not asked for again: {first_line(failure)}"
            )
    return partitions, retry_due


def _launched_by_daemon(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """Whether a sensor or automation launched the run, or Dagster retried such a run. A
    re-execution a person launched keeps its parent's tags, but no retry number; Dagster's
    retries of it are judged by it."""
    while RETRY_NUMBER_TAG in run.tags and PARENT_RUN_ID_TAG in run.tags:
        parent = instance.get_run_by_id(run.tags[PARENT_RUN_ID_TAG])
        if parent is None:
            break
        run = parent
    by_daemon = SENSOR_NAME_TAG in run.tags or AUTOMATION_CONDITION_TAG in run.tags
    re_executed_by_hand = PARENT_RUN_ID_TAG in run.tags and RETRY_NUMBER_TAG not in run.tags
    return by_daemon and not re_executed_by_hand


def _partitions_of(tick: _Tick, assets: TableAssets, tags: Mapping[str, str]) -> list[str]:
    """The table's partitions a run covers, from its tags: a range's, or its one partition's."""
    start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
    if start is not None and end is not None:
        partitions_def = assets.changes.partitions_def
        if partitions_def is None:
            return []
        # a batch table's partitions are dynamic: the instance holds them, in their order
        with dg.partition_loading_context(dynamic_partitions_store=tick.context.instance):
            return list(partitions_def.get_partition_keys_in_range(dg.PartitionKeyRange(start, end)))
    single = tags.get(PARTITION_TAG)
    return [single] if single is not None else []


def _unprocessed(tick: _Tick, assets: TableAssets, partitions: list[str]) -> dict[str, list[str]]:
    """Of `partitions`, those a run of the table takes (`pending_partitions`: files not
    processed as they are now), each with the names of its landed files. A note of the table
    that cannot be read (a request to run again, a note of stored changes) leaves the
    partitions without a processed note that reads."""
    if not partitions:
        return {}
    storage, layout, feed, table = tick.storage, tick.layout, tick.feed.name, assets.table
    wanted = set(partitions)
    # a damaged processed note is left out, so its partition is run, which writes it again
    notes = read_notes_of(storage, layout, feed, table, partitions, damaged=lambda _: None)
    try:
        changes, landed = pending_partitions(
            storage,
            layout,
            tick.fmt,
            landing=tick.feed.landing,
            feed=feed,
            table=table,
            keys=partitions,
            notes=notes,
            within=wanted.__contains__,
        )
    except DamagedLakeFile as damaged:
        tick.context.log.warning(
            f"{feed}/{table}: {damaged}; the partitions cancelled or failed runs left are those without a "
            "processed note"
        )
        landed = tick.fmt.partitions_files(storage, tick.feed.landing, table, partitions)
        return {p: sorted(entry.name for entry in landed.get(p, [])) for p in partitions if p not in notes}
    return {
        change.partition: sorted(entry.name for entry in landed.get(change.partition, []))
        for change in changes
        if change.partition in wanted
    }


def _within_attempts(tick: _Tick, assets: TableAssets, left: dict[str, list[str]]) -> dict[str, list[str]]:
    """`left` less the partitions that runs asked for them (`UNFINISHED_TAG`) failed to process
    `RUN_AGAIN_ATTEMPTS` times within `ATTEMPTS_WINDOW_SECONDS`, counted per partition (a range
    asked for later may hold more partitions); those wait for `lake-assets run`, a run from the
    UI, or the window to pass, which an error in the tick's log says."""
    if not left:
        return left
    records = tick.context.instance.get_run_records(
        filters=dg.RunsFilter(
            tags={TABLE_TAG: assets.table, UNFINISHED_TAG: "true"},
            statuses=_UNSUCCESSFUL,
            created_after=dt.datetime.fromtimestamp(tick.looked_until - ATTEMPTS_WINDOW_SECONDS, dt.UTC),
        )
    )
    attempts: Counter[str] = Counter()
    for run in (record.dagster_run for record in records):
        if not _an_attempt(run) or not tick.may_write(assets, run.job_name, run.asset_selection):
            continue
        with contextlib.suppress(Exception):  # a run whose partitions are no longer valid counts for none
            attempts.update(p for p in _partitions_of(tick, assets, run.tags) if p in left)
    spent = sorted(p for p in left if attempts[p] >= RUN_AGAIN_ATTEMPTS)
    if spent:
        tick.context.log.error(
            f"{tick.feed.name}/{assets.table}: {RUN_AGAIN_ATTEMPTS} runs of {describe_partitions(spent)} failed to "
            "process what cancelled or failed runs left; the sensor asks for no more: `lake-assets run` (or "
            "a run of the partitions from the UI) does it"
        )
    return {p: names for p, names in left.items() if p not in spent}


def _retry_awaited(tick: _Tick, record: dg.RunRecord) -> bool:
    """Whether a failed run's retry is still to be launched by Dagster: promised, not launched,
    and the failure recent (`UNFINISHED_EVERY_SECONDS`); after that it is not waited for."""
    tags = record.dagster_run.tags
    promised = tags.get(WILL_RETRY_TAG) == "true" and AUTO_RETRY_RUN_ID_TAG not in tags
    return promised and record.update_timestamp.timestamp() > tick.looked_until - UNFINISHED_EVERY_SECONDS


def _an_attempt(run: dg.DagsterRun) -> bool:
    """Whether a failed run asked for again counts as an attempt: a failure Dagster retried
    counts once, by its retry; one whose retry never came counts."""
    return AUTO_RETRY_RUN_ID_TAG not in run.tags


def _unfinished_runs(tick: _Tick, assets: TableAssets, ranges: list[tuple[str, ...]]) -> list[dg.RunRequest]:
    """A run of each range of partitions cancelled or failed runs left (`_left_unfinished`),
    keyed by the look that found them: a later look finds them again only when that run fails
    too, or another leaves them."""
    feed, table, looked = tick.feed.name, assets.table, int(tick.looked_until)
    requests = []
    for partitions in ranges:
        span = f"{partitions[0]}..{partitions[-1]}"
        tick.context.log.info(
            f"{feed}/{table}: a run the daemon launched left {span} unprocessed (cancelled, or failed with "
            "no retry to come, or one promised that never came): a run of it is asked for"
        )
        key = f"{feed}:{table}:unfinished:{span}:{looked}"
        requests.append(
            _whole_table_run(key, assets, partitions[0], partitions[-1], {UNFINISHED_TAG: "true"})
        )
    return requests


def _kept_purge_runs(
    tick: _Tick, assets: TableAssets, kept: dict[str, list[str]], ranges: list[tuple[str, ...]]
) -> list[dg.RunRequest]:
    """A run of each range of `kept` partitions (`_kept_purges`), keyed by the files keeping
    their purges and by the attempt: a run that fails is asked for again, up to
    `RUN_AGAIN_ATTEMPTS` runs, after which the purges wait for `lake-assets run` or a run from
    the UI (an error in the tick's log says so)."""
    feed, table = tick.feed.name, assets.table
    requests = []
    for partitions in ranges:
        files = sorted({name for partition in partitions for name in kept[partition]})
        digest = short_digest(",".join([*partitions, *files]))
        span = f"{partitions[0]}..{partitions[-1]}"
        try:
            records = tick.context.instance.get_run_records(
                filters=dg.RunsFilter(tags={KEPT_PURGE_TAG: digest}, statuses=_UNSUCCESSFUL)
            )
            failed = [record for record in records if _an_attempt(record.dagster_run)]
            if any(_retry_awaited(tick, record) for record in records):
                continue  # a run beside Dagster's retry would fold the same purges twice
        except Exception as failure:  # noqa: BLE001 - logged; the next tick asks again
            tick.context.log.warning(
                f"{feed}/{table}: the runs for the purges kept in {span} are not known: {first_line(failure)}"
            )
            continue
        if len(failed) >= RUN_AGAIN_ATTEMPTS:
            tick.context.log.error(
                f"{feed}/{table}: {len(failed)} runs of {span} failed to record the purges its change-log "
                "write kept; the sensor asks for no more: `lake-assets run` (or a run of the partitions "
                "from the UI) records them"
            )
            continue
        tick.context.log.info(
            f"{feed}/{table}: no fold recorded the purges the change-log write of {span} kept (its run "
            "stopped before its fold): a run records them"
        )
        key = f"{feed}:{table}:kept-purges:{span}:{digest}:{len(failed)}"
        requests.append(
            _whole_table_run(key, assets, partitions[0], partitions[-1], {KEPT_PURGE_TAG: digest})
        )
    return requests


def _strays_run(
    tick: _Tick, assets: TableAssets, cursor: _Cursor, last: str | None
) -> tuple[list[dg.RunRequest], _Cursor]:
    """For a table no run of which starts this tick: a run of its `last` partition when the
    table holds stray files no run has reported yet (a vendor's new layout, files no one can
    open), as only a run reports them, and no partition changed to start one. The table is
    walked for them at most every `STRAYS_EVERY_SECONDS`, one table a tick (`_strays_turn`);
    with no `last` partition to run, none is asked for. A walk that fails is logged and waits
    its next turn like one that found nothing, so it cannot keep the turn from the others."""
    if assets.table != tick.strays_turn:
        return [], cursor
    cursor = dataclasses.replace(cursor, strays_looked_at=time.time())
    feed = tick.feed
    try:
        strays = unreported_strays(tick.storage, tick.layout, tick.fmt, feed.landing, feed.name, assets.table)
    except Exception as failure:  # noqa: BLE001 - logged; its next turn tries again
        tick.context.log.warning(
            f"{feed.name}/{assets.table}: could not be walked for strays: {first_line(failure)}"
        )
        return [], cursor
    unreported = [entry.uri for entry, _ in strays]
    if not unreported:
        return [], cursor
    if last is None:
        tick.context.log.warning(
            f"{feed.name}/{assets.table}: {len(unreported)} file(s) no partition reads, and no partition "
            f"to run that would report them; `lake-assets run` reports them: {', '.join(unreported[:5])}"
        )
        return [], cursor
    tick.context.log.info(
        f"{feed.name}/{assets.table}: {len(unreported)} file(s) no partition reads and no run reported yet: "
        f"a run of {last} reports them"
    )
    return [
        _whole_table_run(strays_run_key(feed.name, assets.table, last, unreported), assets, last, last)
    ], cursor


def _strays_reported(cursor: _Cursor) -> _Cursor:
    """The cursor of a table a run is asked for this tick: every run reports the table's strays,
    so its next walk for them waits its hour (and a busy table does not keep the turn)."""
    return dataclasses.replace(cursor, strays_looked_at=time.time())


def _strays_turn(cursors: dict, tables: Iterable[str]) -> str | None:
    """The table to walk for strays this tick, if any: of those due (`strays_due`), the first in
    `_turn_order`, which for tables scanned before is the one walked longest ago. One a tick
    keeps a tick short however many tables are due (after an upgrade, every one is), and each
    gets its turn."""
    now = time.time()
    due = [
        table for table in tables if strays_due(getattr(cursors.get(table), "strays_looked_at", None), now)
    ]
    return min(due, key=lambda table: _turn_order(table, cursors.get(table)), default=None)


def _turn_order(table: str, cursor: SensorLooks | None) -> tuple[bool, float, str]:
    """Where a table comes in a tick's turns: the tables scanned before first, by when they
    were last walked for strays; then those never scanned, by when their first scan was last
    tried. A table never scanned goes after the others for the strays turn, too: the tick's
    first first scan is always taken, but a later one may wait for another tick and would
    leave the turn unused, tick after tick."""
    if cursor is None or cursor.first_scan:
        return True, getattr(cursor, "first_scan_tried_at", None) or 0.0, table
    return False, cursor.strays_looked_at or 0.0, table


def _first_hour(assets: TableAssets) -> str | None:
    """The key of a table's first hourly partition (None for other partitions)."""
    partitions = assets.changes.partitions_def
    if isinstance(partitions, dg.TimeWindowPartitionsDefinition):
        return hour_key(partitions.start.replace(tzinfo=None))
    return None


def describe_partitions(keys: list[str], shown: int = 5) -> str:
    """The first partition keys (hours or batches), and how many more."""
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


def build_batch_sensor(feed: FeedConfig, fmt: FeedFormat, tables: list[TableAssets]) -> dg.SensorDefinition:
    by_name = {t.table: t for t in tables}

    @dg.sensor(
        **_watching(
            feed,
            tables,
            "batch",
            f"Watches {feed.landing} for new batches of every object: registers them as partitions "
            "and requests one run per table over the new batches, and again for the open "
            "(greatest) batch when it gains, rewrites or loses files (older batches are compared "
            "with what the lake processed once a day).",
        )
    )
    def batch_sensor(context: dg.SensorEvaluationContext, lake: LakeResource):
        cursors = decode_cursor(context.cursor, BatchCursor)
        tick = _Tick(context, lake.get_storage(), lake.layout(), feed, fmt, _strays_turn(cursors, by_name))
        tick.old_partitions_turn = _old_partitions_turn(cursors, by_name)
        run_requests, observations, additions = [], [], []
        failures = _ScanFailures(context, feed.name)
        for assets, cursor in tick.tables_in_turn(by_name, cursors, BatchCursor):
            with failures.of(assets.table):
                requests, observed, added, cursors[assets.table] = _batch_runs(tick, assets, cursor)
                run_requests += requests
                observations += observed
                additions += added
        failures.unless_every_table_failed(tick)
        return dg.SensorResult(
            run_requests=run_requests,
            asset_events=observations,
            dynamic_partitions_requests=additions,
            cursor=encode_cursor(cursors),
        )

    return batch_sensor


def _batch_runs(
    tick: _Tick, assets: TableAssets, cursor: BatchCursor
) -> tuple[list[dg.RunRequest], list[dg.AssetObservation], list[dg.AddDynamicPartitionsRequest], BatchCursor]:
    """One batch table's runs for this tick, what it observed, the batches it registers, and
    its cursor after it."""
    feed = tick.feed
    first_scan = cursor.first_scan
    processed = _processed_with(tick, assets.table) if first_scan else None
    found, cursor = scan_batches(tick.storage, tick.fmt, feed.landing, assets.table, cursor, processed)
    if first_scan:  # it compared every batch with what the lake processed it with
        cursor = dataclasses.replace(cursor, old_partitions_looked_at=time.time())
    old, cursor = _old_batches(tick, assets, cursor, {f.partition for f in found})
    found = sorted([*found, *old], key=lambda new: tick.fmt.partition_order(new.partition))
    kept, cursor = _kept_purges(tick, assets, cursor, [f.partition for f in found])
    left, cursor = _left_unfinished(tick, assets, cursor, [*(f.partition for f in found), *kept])
    if not found and not kept and not left and not first_scan:
        strays, cursor = _strays_run(tick, assets, cursor, cursor.last)
        return strays, [], [], cursor
    partitions = _batch_partitions(assets)
    known = tick.context.instance.get_dynamic_partitions(partitions)
    registered = set(known)
    # A first scan registers the batches it found processed too: the UI can then re-run them; a
    # kept purge's batch (or an unfinished run's) is registered again if the instance lost it.
    landed = tick.fmt.partition_keys(tick.storage, feed.landing, assets.table) if first_scan else []
    added = sorted(
        {*landed, *(f.partition for f in found), *kept, *left} - registered, key=tick.fmt.partition_order
    )
    additions = [dg.AddDynamicPartitionsRequest(partitions, added)] if added else []
    # One run per stretch the instance holds in a row: batches registered out of order
    # (by a `--from/--to` run) make more than one.
    order = [*known, *added]
    requests = [
        *_kept_purge_runs(
            tick, assets, kept, stretches_in_order(order, sorted(kept, key=tick.fmt.partition_order))
        ),
        *_unfinished_runs(
            tick, assets, stretches_in_order(order, sorted(left, key=tick.fmt.partition_order))
        ),
    ]
    if not found:
        strays, cursor = (
            _strays_run(tick, assets, cursor, cursor.last) if not requests else ([], _strays_reported(cursor))
        )
        return strays + requests, [], additions, cursor
    cursor = _strays_reported(cursor)
    requests += [
        _range_run(feed.name, assets, stretch[0], stretch[-1], [f for f in found if f.partition in stretch])
        for stretch in stretches_in_order(order, [f.partition for f in found])
    ]
    return requests, [_observation(assets, found)], additions, cursor


def build_tables_sensor(
    feed: FeedConfig, fmt: FeedFormat, loaded: Pin, siblings: tuple[FeedConfig, ...] = ()
) -> dg.SensorDefinition:
    """Discovery in the daemon: pins the tables that land after the code location loaded (and an
    earlier first hour), and says a reload adds them. Loading itself never lists the landing.
    `siblings`: the feeds sharing its landing (`discovery.sharing_landing`)."""

    @dg.sensor(
        name=f"{identifier(feed.name)}_tables_sensor",
        description=f"Watches {feed.landing} for new tables and pins them in the lake, as "
        "`lake-assets discover` does; reloading the code location then adds their assets.",
        minimum_interval_seconds=feed.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING if feed.watch else dg.DefaultSensorStatus.STOPPED,
    )
    def tables_sensor(context: dg.SensorEvaluationContext, lake: LakeResource):
        found = discover_feed(lake.get_storage(), lake.layout(), feed, every_table=False, siblings=siblings)
        if found.problem:
            raise LakeAssetsError(f"{feed.name}: {found.problem}")
        if found.changed:
            context.log.info(describe(found))
        # a clash within the feed (GRAX orgs that differ only in case); one across feeds is
        # logged where the code location loads
        clashes = tables_of_every_feed([feed], {feed.name: found.pin})[1].values()
        notes = [note for note in (describe_unread(found), describe_absent(found), *clashes) if note]
        # Said once for each new set of notes, not on every tick: the cursor keeps a digest of
        # them and of every unread entry (a note names the first few only).
        notes_digest = short_digest("\n".join([*notes, *found.unread]))
        if notes and notes_digest != context.cursor:
            for note in notes:
                context.log.warning(note)
        context.update_cursor(notes_digest)
        unloaded = [t for t in found.tables if t not in feed_tables(feed, fmt, loaded)]
        moved = fmt.partitioning == "hourly" and not feed.start and found.pin.first_hour != loaded.first_hour
        pinned = []
        if unloaded:
            pinned.append(f"table(s) {', '.join(unloaded)}")
        if moved:
            pinned.append(f"hours from {found.pin.first_hour}")
        if pinned:
            return dg.SkipReason(
                f"{' and '.join(pinned)} pinned since the code location loaded: reload it to add them"
            )
        return dg.SkipReason(f"no new table under {feed.landing}")

    return tables_sensor


def _batch_partitions(assets: TableAssets) -> str:
    """The name of the dynamic partitions (one per batch) a batch table's change log has."""
    partitions = assets.changes.partitions_def
    if isinstance(partitions, dg.DynamicPartitionsDefinition) and partitions.name:
        return partitions.name
    raise LakeAssetsError(f"{assets.feed.name}/{assets.table}: the change log is not partitioned by batch")


def _range_run(feed: str, assets: TableAssets, start: str, end: str, found: list[NewFiles]) -> dg.RunRequest:
    """One run over the partitions `start` .. `end`, which hold the new files `found`, keyed by
    every file name they hold."""
    digest = short_digest("".join(f"{f.partition}={f.fingerprint}" for f in found))
    return _whole_table_run(f"{feed}:{assets.table}:{start}..{end}:{digest}", assets, start, end)


def _rerun(feed: str, assets: TableAssets, hour: str, standing: list[reruns.RerunRequest]) -> dg.RunRequest:
    """A run of an hour other runs asked to run again, keyed by their requests (each has a name
    of its own, so a new request makes a new run)."""
    digest = short_digest(",".join(sorted(r.name for r in standing)))
    return _whole_table_run(f"{feed}:{assets.table}:again:{hour}:{digest}", assets, hour, hour)


def _whole_table_run(
    run_key: str, assets: TableAssets, start: str, end: str, tags: Mapping[str, str] | None = None
) -> dg.RunRequest:
    return dg.RunRequest(
        run_key=run_key,
        asset_selection=assets.processed_keys,
        tags={
            RANGE_START_TAG: start,
            RANGE_END_TAG: end,
            TABLE_TAG: assets.table,
            WHOLE_TABLE_RUN_TAG: "true",
            **(tags or {}),
        },
    )


def _observation(assets: TableAssets, found: list[NewFiles]) -> dg.AssetObservation:
    return dg.AssetObservation(
        asset_key=assets.raw.key,
        metadata={
            "new_files": sum(len(f.new_names) for f in found),
            "files_removed_or_rewritten": sum(len(f.removed) for f in found),
            "partitions_with_new_files": dg.MetadataValue.json([f.partition for f in found]),
        },
    )
