"""Folding a batch of change events into a table's state, touching only what the batch touches.

For the keys in the batch, the fold recomputes each key's timeline from its earliest touched
version on. The rows it needs are the key's open row (its last event: `history/active` or the
open deletes) and, only when the batch holds events older than that open row (late data), the
closed rows ending at or after the earliest late version, found in the closed files whose
footers say they may hold such rows. Everything else stays where it is: untouched keys' open
rows are carried over, closed files older than the late data are never rewritten (a settled
day's hour files are merged once, rows unchanged: see `settled_days_to_compact`).

Folding the same batch twice, folding batches in any order, or folding the whole log at once
gives the same tables: the window of a key always starts at an anchor row (its last event
before the batch's earliest version) whose values are final, and every event from there on is
either in the state or in the batch.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Collection, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets import lake_io
from lake_assets.engine import merge, purges
from lake_assets.engine import model as m
from lake_assets.engine.checks import VersionSet
from lake_assets.engine.merge import ACTIVE, END, START, SYNCED
from lake_assets.engine.names import col, same_name
from lake_assets.engine.run_values import with_run_values
from lake_assets.engine.schema import system_fields, unified_fields, union_all
from lake_assets.engine.state import (
    CommitPlan,
    Removing,
    TableState,
    closed_days,
    commit,
    new_fold_id,
    parquet_files,
    recover,
)
from lake_assets.storage import Storage, each_request

FROM = "__from"
OPEN_FROM = "__open_from"
ROWS_PER_FILE = 2_000_000  # open-set files: few and large; a fold rewrites them all anyway
LARGE_FOLD_EVENTS = 500_000  # from here on, a fold's closed rows are written without a shuffle
ORIGIN = "__origin"
PRIOR_SYNCED = "__prior_synced"  # a stored row's `_fivetran_synced`, kept while only its window changes
REACHED = "__reached"
BROADCAST_KEYS = 200_000  # late keys up to this many are sent to every task rather than shuffled
VERSIONS = "versions_"  # prefix of the totals that sum up the batch's versions
KIND = "__kind"
SLICE = "__slice"  # where a stored row is staged: the open set, or its end date (and hour)
OPEN = "open"
COMPACT_AFTER_FILES = 8  # a settled closed day with more files than this is merged into one
COMPACT_LOOKBACK_DAYS = 2  # how many days before the fold's earliest version are looked at
#: (kind, end date) -> closed history ("history") or delete ("delete") files of that end date
ClosedFiles = dict[tuple[str, str], list[str]]
#: a version at `t` closes the one before it at `t - _END_GAP`: its closed rows end from there on
_END_GAP = dt.timedelta(milliseconds=m.END_GAP_MS)


@dataclasses.dataclass
class FoldReport:
    fold_id: str
    events_in: int = 0
    keys_touched: int = 0
    late_keys: int = 0
    newly_purged: list = dataclasses.field(default_factory=list)
    days_rewritten: list[str] = dataclasses.field(default_factory=list)
    days_appended: list[str] = dataclasses.field(default_factory=list)
    closed_files_rewritten: int = 0
    current_rows: int = 0
    recovered_folds: list[str] = dataclasses.field(default_factory=list)
    #: batch bookkeeping for reconciliation: rows in = versions + duplicates + superseded writes
    batch_rows: int = 0
    identical_duplicates: int = 0
    superseded_writes: int = 0
    #: the earliest version time the fold touched (state from there on was rewritten)
    touched_since: dt.datetime | None = None
    #: the batch's distinct versions summed up; with `into_empty`, the stored rows must be exactly these
    batch_versions: VersionSet | None = None
    #: the table held no rows, open or closed, and no purged keys before the fold
    into_empty: bool = False
    #: closed days whose hour slices the fold merged (they had settled: the fold does not reach them)
    days_compacted: list[str] = dataclasses.field(default_factory=list)
    #: table files the fold's commit put in place (current, history; not the engine's own state)
    files_written: list[str] = dataclasses.field(default_factory=list)
    #: change-log partitions the fold's commit replaced to erase newly purged keys, and their files
    log_partitions_erased: list[str] = dataclasses.field(default_factory=list)
    log_files_written: list[str] = dataclasses.field(default_factory=list)


def _report_files_put_in_place(
    report: FoldReport,
    state: TableState,
    plans: list[CommitPlan],
    replaced: Sequence[str] = (),
) -> None:
    """The table files and change-log files the commits of `plans` put in place and that are
    still there (a later plan's `replaced` files are gone again)."""
    gone = set(replaced)
    finals = [final for plan in plans for _, final in plan.adds if final not in gone]
    report.files_written = [final for final in finals if state.publishes(final)]
    report.log_files_written = [final for final in finals if final.startswith(f"{state.changes}/")]


def from_persisted(stored: DataFrame, spec: m.TableSpec) -> DataFrame:
    hc = spec.history_columns
    return (
        stored.withColumnRenamed(hc.start, START)
        .withColumnRenamed(hc.end, END)
        .withColumnRenamed(hc.active, ACTIVE)
        .withColumnRenamed(hc.synced, SYNCED)
    )


def _read(spark: SparkSession, storage: Storage, paths: list[str], spec: m.TableSpec) -> DataFrame | None:
    """Stored rows of the given folders or files, with the engine's column names; None for no paths."""
    return _read_stored(spark, storage, paths, spec) if paths else None


def _read_stored(spark: SparkSession, storage: Storage, paths: list[str], spec: m.TableSpec) -> DataFrame:
    return from_persisted(lake_io.read_drifting(spark, storage, paths, table=spec.name, keys=spec.keys), spec)


def _union(frames: list[DataFrame | None], spec: m.TableSpec) -> DataFrame | None:
    present = [f for f in frames if f is not None]
    return union_all(spec.name, present, spec.keys) if present else None


def fold(
    spark: SparkSession,
    storage: Storage,
    state: TableState,
    batch: DataFrame | None,
    spec: m.TableSpec,
    *,
    synced_at: dt.datetime | None = None,
    on_commit_step: Callable[[str], None] | None = None,
    log_column: str | None = None,
    removing: Removing | None = None,
    delivered: Callable[[], Collection[str]] = lambda: (),
) -> FoldReport:
    """Fold `batch` (change-model events) into the state of one table and commit it.

    With `log_column` (the change log's partition column), keys the batch purges for the first
    time are also erased from the change log and recorded as purged (`purges`), in the same commit.
    `removing` is told the files a commit (this fold's, or an interrupted one's) deletes.
    `delivered` gives the landed files the batch was read from (asked only once a state is
    stored); a stored copy of a write read from another file of their folders (one
    removed since) gives way to the batch's (`merge.copy_rank`).
    """
    recovered = recover(storage, state, removing)
    report = FoldReport(fold_id=new_fold_id(), recovered_folds=[plan.fold_id for plan in recovered])
    # The files an interrupted fold put in place are this run's to report (and catalogue).
    _report_files_put_in_place(report, state, recovered)
    synced_at, keys = synced_at or dt.datetime.now(dt.UTC), list(spec.keys)
    # Keys a change-log write erased for a purge its rows carried, not recorded yet: purged too.
    seen_files = purges.seen_files(storage, state)
    seen = purges.seen(spark, storage, state, keys, seen_files)
    if batch is None or _nothing_to_fold(batch, spec):
        if seen is None:
            return report
        # A fold without events still records and applies them: the change log may hold nothing
        # else that would (the purge's own batch gone from the landing, nothing new landed).
        batch = _without_events(spark, seen, log_column)
    ledger = purges.ledger(spark, storage, state, keys)
    recorded = ledger.select(*keys) if ledger is not None else None
    purged_before = purges.either(keys, [recorded, seen])
    with lake_io.released_after([]) as cached:
        # Keys seen purged only (no ledger yet) are few and joined cheaply: as in a first backfill
        # that carries a purge, the marks are read from the cached batch (or computed on top of
        # it), not kept.
        marked = kept_marks(batch, marked_batch(batch, spec, purged_before), recorded, cached)
        events = marked.where(F.col(merge.KEPT)).drop(*merge.COLLAPSE_MARKS)
        touched = touched_keys(marked, spec)
        open_set = read_open_set(spark, storage, state, spec, touched)
        totals = _totals(marked, open_set.rows, keys)
        _report_counts(report, totals)
        # Keys seen purged keep their versions: the stored rows are still the batch's versions.
        report.into_empty = open_set.rows is None and ledger is None and not _any_closed_days(storage, state)
        if report.events_in == 0 and seen is None:
            return report
        report.newly_purged, purged = purged_now(spark, events, recorded, keys, totals["purge_markers"], seen)
        rewrite = closed_files_to_redo(storage, state, spec, totals["late_since"], erasing=purged is not None)
        to_redo = _read(spark, storage, _files_of(rewrite), spec)
        kept, late_window = split_closed_rows(to_redo, open_set.touched, report.late_keys, spec)
        widened = widens_stored_types(open_set.rows, events, spec)
        # A widening rewrites every closed file: written as a backfill's are, from each partition.
        large = report.events_in >= LARGE_FOLD_EVENTS or widened
        compact = {} if large else settled_days_to_compact(storage, state, report.touched_since, skip=rewrite)
        if widened:
            compact = every_closed_file_besides(storage, state, spec, rewrite)
        settled = _read(spark, storage, _files_of(compact), spec)
        stored = _union([open_set.touched, late_window], spec)
        windows = key_windows(events, touched, stored, spec, delivered() if stored is not None else ())
        rows = timeline_rows(windows, spec, synced_at, batch_purges=totals["purge_markers"] > 0)
        carried, kept = _erased(open_set.carried, keys, purged), _erased(kept, keys, purged)
        state_rows = laid_out(spec, [carried, rows, kept], settled, large)
        stage = state.staging(report.fold_id)
        report.current_rows = stage_state(
            spark, storage, spec, state_rows, stage, open_set, report.keys_touched, large=large
        )
        plan = CommitPlan(report.fold_id)
        report.log_partitions_erased = stage_purges(
            spark, storage, state, plan, stage, ledger, purged, synced_at=synced_at, log_column=log_column
        )
        if seen is not None and _every_key_fits(seen, events, keys):  # recorded in the ledger now (or before)
            plan.deletes.extend(seen_files)
        report.days_appended = plan_state_commit(storage, state, plan, stage, rewrite, compact)
        _report_closed_days(report, rewrite, compact)
        commit(storage, state, plan, on_step=on_commit_step, removing=removing)
    _report_files_put_in_place(report, state, [*recovered, plan], replaced=plan.deletes)
    return report


def _without_events(spark: SparkSession, seen: DataFrame, log_column: str | None) -> DataFrame:
    """A batch without events: the seen keys' columns, typed as they were written, and the change
    model's (and the change log's partition column)."""
    fields = [*seen.schema.fields, *system_fields(ingested_at=False)]
    if log_column is not None:
        fields.append(T.StructField(log_column, T.StringType()))
    return spark.createDataFrame([], T.StructType(fields))


def _nothing_to_fold(batch: DataFrame, spec: m.TableSpec) -> bool:
    """A frame of empty partitions that lacks even the keys. With the keys present, emptiness
    shows in the fold's counts, so no job of its own is spent on it."""
    return not set(spec.keys) <= set(batch.columns) and batch.isEmpty()


def _without_ingest_time(batch: DataFrame) -> DataFrame:
    # The change log's partition column stays: it tells the deliveries of identical copies apart
    # (`merge.mark_identical`), and no projection of stored rows takes it.
    return batch.drop(m.INGESTED_AT)


def _erased(frame: DataFrame | None, keys: list[str], purged: DataFrame | None) -> DataFrame | None:
    """`frame` with the rows of the `purged` keys erased (`merge.erase_keys`), when there are any."""
    return None if frame is None else _without_keys(frame, keys, purged)


def _without_keys(frame: DataFrame, keys: list[str], purged: DataFrame | None) -> DataFrame:
    return frame if purged is None else merge.erase_keys(frame, keys, purged)


def marked_batch(batch: DataFrame, spec: m.TableSpec, recorded: DataFrame | None) -> DataFrame:
    """The batch as change-model events, the keys of the ledger (`recorded`) erased (a key purged
    before stays purged, whatever the batch says), with the marks of `merge.mark_identical`."""
    return (
        batch.transform(_without_ingest_time)
        .transform(merge.with_optional_columns)
        .transform(_without_keys, list(spec.keys), recorded)
        .transform(merge.mark_identical, spec)
    )


def kept_marks(
    batch: DataFrame, marked: DataFrame, recorded: DataFrame | None, cached: list[DataFrame]
) -> DataFrame:
    """`marked`, persisted (and added to `cached`, for the caller to release) when recomputing it
    would cost more than keeping it.

    The marks are read by the totals, the touched keys and the timeline. A batch handed over in
    memory (the run's stored change batch) is already cached, collapsed and in the marks' order,
    and carries the collapse's marks (`merge.carries_marks`), so they are read from it: caching
    them as a second copy of the batch cost more (docs/profiling.md, "Figures behind the
    code"). Joined with the purged keys (a table that has purges), they are computed once and
    kept."""
    if lake_io.is_cached(batch) and recorded is None:
        return marked
    cached.append(marked.persist())
    return marked


def touched_keys(marked: DataFrame, spec: m.TableSpec) -> DataFrame:
    """Each touched key with its earliest version (`FROM`): its first event in the marked order
    (an identical copy dropped from the events has the same version as the one kept)."""
    first_events = marked.where(F.col(merge.FIRST_OF_KEY))
    return first_events.select(*merge.key_cols(spec), F.col(m.VERSION_AT).alias(FROM))


@dataclasses.dataclass(frozen=True)
class OpenSet:
    """The stored open rows (`history/active` and the open deletes), split by the batch's keys."""

    paths: list[str]
    rows: DataFrame | None = None  # all of them
    touched: DataFrame | None = None  # those of touched keys, with the key's `FROM`
    carried: DataFrame | None = None  # those of the other keys: carried over as they are


def read_open_set(
    spark: SparkSession, storage: Storage, state: TableState, spec: m.TableSpec, touched: DataFrame
) -> OpenSet:
    """The stored open rows, split by the `touched` keys (with their `FROM`)."""
    paths = state.open_folders(storage)
    rows = _read(spark, storage, paths, spec)
    if rows is None:
        return OpenSet(paths)
    keys = list(spec.keys)
    return OpenSet(paths, rows, rows.join(touched, keys, "inner"), rows.join(touched, keys, "left_anti"))


def _report_counts(report: FoldReport, totals: dict) -> None:
    """The batch's counts (all zero, and no times, for a batch without events)."""
    report.batch_rows, report.events_in = totals["rows"], totals["events"]
    report.identical_duplicates = report.batch_rows - report.events_in
    report.superseded_writes = report.events_in - totals["versions"]
    report.keys_touched = totals["keys"]
    report.touched_since = totals["since"]
    report.late_keys = totals["late_keys"]
    report.batch_versions = VersionSet.of(totals, prefix=VERSIONS)


def _every_key_fits(keys_frame: DataFrame, events: DataFrame, keys: list[str]) -> bool:
    """Whether every key of `keys_frame` can take the type the batch's keys have now: one that
    cannot (a key type that drifted) is not recorded by this fold, so what holds it must stay."""
    return merge.keys_typed_as(keys_frame, events, keys).dropna(subset=keys).count() == keys_frame.count()


def purged_now(
    spark: SparkSession,
    events: DataFrame,
    recorded: DataFrame | None,
    keys: list[str],
    purge_markers: int,
    seen: DataFrame | None = None,
) -> tuple[list[tuple], DataFrame | None]:
    """The keys purged for the first time: those the batch purges (none unless it counted purge
    markers), and those a change-log write saw purged (`seen`), that the ledger (`recorded`) does
    not hold; and the same as a frame of the key columns (None when there are none)."""
    found = purges.newly_purged(events, recorded, keys) if purge_markers else []
    if seen is not None:
        # As the batch's keys are typed now: a seen key whose type cannot hold it matches nothing.
        unrecorded = merge.keys_typed_as(seen, events, keys).dropna(subset=keys)
        if recorded is not None:
            unrecorded = unrecorded.join(merge.keys_typed_as(recorded, events, keys), keys, "left_anti")
        found = sorted({*found, *(tuple(row) for row in unrecorded.distinct().collect())}, key=repr)
    return found, spark.createDataFrame(found, schema=events.select(*keys).schema) if found else None


def late_keys(open_touched: DataFrame, spec: m.TableSpec) -> DataFrame:
    """The touched keys whose batch reaches back to or before their open row (late data), with
    their earliest batch version (`FROM`)."""
    return open_touched.where(_reaches_back(F.col(START), F.col(FROM))).select(*merge.key_cols(spec), FROM)


def closed_files_to_redo(
    storage: Storage, state: TableState, spec: m.TableSpec, late_since: dt.datetime | None, *, erasing: bool
) -> ClosedFiles:
    """(kind, end date) -> the closed files the fold rewrites. Late data (its earliest version
    `late_since`) reaches the closed rows ending at or after that version, less the millisecond
    between a version's end and the next start; older files stay as they are. Erasing a key's
    fields reaches every closed file that may hold it. Without either, none."""
    if erasing:
        return closed_files_ending_from(storage, state, spec, None)
    if late_since is None:
        return {}
    return closed_files_ending_from(storage, state, spec, _earlier(late_since, _END_GAP))


def _files_of(days: ClosedFiles) -> list[str]:
    return [uri for files in days.values() for uri in files]


def split_closed_rows(
    closed: DataFrame | None, open_touched: DataFrame | None, late_count: int, spec: m.TableSpec
) -> tuple[DataFrame | None, DataFrame | None]:
    """The closed rows of the files to redo as (kept, late window): with late data, its keys'
    rows ending at or after (a millisecond before) their earliest batch version are redone in the
    window, with that version (`FROM`); the rest are kept as they are. One pass over the closed
    rows splits them: no anti-join of the two, no third read. `late_count` is the number of
    `late_keys` of the touched keys' open rows (`open_touched`), counted by the totals."""
    if closed is None or open_touched is None or not late_count:
        return closed, None
    late = late_keys(open_touched, spec)
    late = F.broadcast(late) if late_count <= BROADCAST_KEYS else late
    reached = F.coalesce(F.col(END) >= merge.before_next(F.col(FROM)), F.lit(False))
    flagged = closed.join(late, list(spec.keys), "left").withColumn(REACHED, reached)
    return flagged.where(~F.col(REACHED)).drop(REACHED, FROM), flagged.where(F.col(REACHED)).drop(REACHED)


@dataclasses.dataclass(frozen=True)
class KeyWindows:
    """The events of every touched key's window: its anchor and later stored rows, plus the batch.

    `anchor` holds on the stored rows before the batch's earliest version (their values are
    final); `tie_break` puts a stored row before the batch's copy of the same write, so that the
    batch's copy keeps its markers, then keeps each delivery's copies together, in the order the
    batch was marked in. `anchor` is None when nothing is stored for the keys; `undelivered`
    holds on stored rows whose files their partitions no longer deliver (`merge.copy_rank`)."""

    events: DataFrame
    anchor: Column | None = None
    tie_break: list[Column] | None = None
    undelivered: Column | None = None


def key_windows(
    events: DataFrame,
    touched: DataFrame,
    stored: DataFrame | None,
    spec: m.TableSpec,
    delivered: Collection[str] = (),
) -> KeyWindows:
    """The windows of the touched keys from their `stored` anchor and later rows (with `FROM`)
    and the batch's `events`, read from the landed files `delivered`."""
    if stored is None:  # nothing stored for these keys yet: their timelines are the batch's
        # The cached batch is already partitioned by key and sorted in the rules' event order
        # (`mark_identical` did it, the delivery as its tie-break), and Spark keeps that order
        # for a cached frame: the timeline's windows read it as it is, without another sort.
        return KeyWindows(events, tie_break=merge.delivery_order(events) or None)
    # A stored row after the anchor whose columns were carried from the version before it is
    # filled again (`merge.fill_unmodified`): its values may change, so it takes the fold's time.
    refilled = (F.col(START) >= F.col(FROM)) & F.coalesce(F.size(F.col(m.UNMODIFIED)) > 0, F.lit(False))
    stored = stored.withColumn(PRIOR_SYNCED, F.when(~refilled, F.col(SYNCED)))
    stored = stored.drop(END, ACTIVE, SYNCED).withColumn(ORIGIN, F.lit(0))
    batch = events.join(touched, list(spec.keys), "inner").withColumn(ORIGIN, F.lit(1))
    anchor = (F.col(ORIGIN) == 0) & (F.col(START) < F.col(FROM))
    tie_break = [F.col(ORIGIN), *merge.delivery_order(events)]
    undelivered = _no_longer_delivered(delivered)
    return KeyWindows(union_all(spec.name, [stored, batch], spec.keys), anchor, tie_break, undelivered)


def _no_longer_delivered(delivered: Collection[str]) -> Column | None:
    """Stored rows read from a file in the folder of a file `delivered` that is not one of them:
    the folder (a partition the batch read again) no longer delivers it."""
    if not delivered:
        return None
    folders = sorted({uri.rsplit("/", 1)[0] for uri in delivered})
    folder = F.regexp_extract(F.col(m.SOURCE_FILE), "^(.*)/[^/]*$", 1)
    gone = folder.isin(folders) & ~F.col(m.SOURCE_FILE).isin(sorted(delivered))
    return (F.col(ORIGIN) == 0) & F.coalesce(gone, F.lit(False))


def timeline_rows(
    windows: KeyWindows, spec: m.TableSpec, synced_at: dt.datetime, *, batch_purges: bool
) -> DataFrame:
    """The touched keys' new timeline rows, synced at `synced_at`: the rows of new versions, and
    the rows of purged keys (their fields erased now). A stored version whose window alone
    changes (closed by a later one, or reopened up to late data) keeps its `_fivetran_synced`,
    as Fivetran's history mode does.

    Stored rows may carry a purge marker; a batch alone can only if it counted one
    (`batch_purges`). The timeline is read by one write only (current follows from the staged
    open set), so it is computed once without being kept."""
    internal = (FROM, ORIGIN, PRIOR_SYNCED)
    payload = spec.payload_columns([c for c in windows.events.columns if c not in internal])
    may_purge = windows.anchor is not None or batch_purges
    rows = merge.timeline(
        windows.events,
        spec,
        payload,
        tie_break=windows.tie_break,
        settled=windows.anchor,
        purges=may_purge,
        undelivered=windows.undelivered,
    )
    if windows.anchor is None:  # no stored row among them
        return with_run_values(rows.drop(FROM, ORIGIN), {SYNCED: synced_at})
    # A purged key's rows from the batch's earliest version on are derived again, erased, now;
    # its anchor is older, and keeps its time as the key's closed rows do.
    rows = rows.withColumn(_REDERIVED, ~F.coalesce(windows.anchor, F.lit(False)))
    rows = with_run_values(rows.drop(FROM, ORIGIN), {SYNCED: synced_at})
    kept_sync = F.when(F.col(m.PURGED) & F.col(_REDERIVED), F.col(SYNCED)).otherwise(
        F.coalesce(F.col(PRIOR_SYNCED), F.col(SYNCED))
    )
    return rows.withColumn(SYNCED, kept_sync).drop(PRIOR_SYNCED, _REDERIVED)


_REDERIVED = "__rederived"  # in `timeline_rows`: a row from its key's batch's earliest version on


def laid_out(
    spec: m.TableSpec, rows: list[DataFrame | None], settled: DataFrame | None, large: bool
) -> DataFrame:
    """Every stored row of the new state, open and closed, in one frame with its `KIND` (history
    or delete) and `SLICE`: the open set, or the end hour (the end day for a large fold) of a
    closed row; a settled day's rows being compacted keep their day. They share a shape, so one
    write (one job, one read of the carried open set) lays them all out by kind and slice."""
    closed_slice = F.date_format(F.col(END), "yyyy-MM-dd" if large else "yyyy-MM-dd'T'HH")
    by_end = F.when(F.col(ACTIVE), F.lit(OPEN)).otherwise(closed_slice)
    sliced = [f.withColumn(SLICE, by_end) for f in rows if f is not None]
    if settled is not None:
        sliced.append(settled.withColumn(SLICE, F.date_format(F.col(END), "yyyy-MM-dd")))
    kind = F.when(F.col(m.OP) == m.DELETE, "delete").otherwise("history")
    return union_all(spec.name, sliced, spec.keys).withColumn(KIND, kind)


def _staged_slice(stage: str, kind: str, slice_: str) -> str:
    return f"{stage}/rows/{KIND}={kind}/{SLICE}={slice_}"


def stage_state(
    spark: SparkSession,
    storage: Storage,
    spec: m.TableSpec,
    state_rows: DataFrame,
    stage: str,
    open_set: OpenSet,
    keys_touched: int,
    *,
    large: bool,
) -> int:
    """Write the new state's rows (`laid_out`) under `stage`/rows and current under `stage`/current;
    returns current's row count."""
    # The open set has at most its stored rows plus one row per new key.
    stored_open_files = [uri for folder in open_set.paths for uri in parquet_files(storage, folder)]
    stored_open_rows = lake_io.rows_in(storage, stored_open_files)
    files = max(1, (stored_open_rows + keys_touched) // ROWS_PER_FILE)
    _write_state_rows(state_rows, spec, f"{stage}/rows", files, large=large)
    staged_open = _staged_slice(stage, "history", OPEN)
    return _write_current(spark, storage, spec, state_rows, staged_open, f"{stage}/current", files)


def stage_purges(
    spark: SparkSession,
    storage: Storage,
    state: TableState,
    plan: CommitPlan,
    stage: str,
    ledger: DataFrame | None,
    purged: DataFrame | None,
    *,
    synced_at: dt.datetime,
    log_column: str | None,
) -> list[str]:
    """Stage in `plan` the ledger with the newly `purged` keys and, with `log_column`, the change
    log with them erased: recorded and erased in the fold's commit, all of it or none. Returns
    the change-log partitions erased."""
    if purged is None:
        return []
    purges.stage_ledger(storage, state, plan, stage, ledger, purged, synced_at)
    if log_column is None:
        return []
    keys = list(purged.columns)  # a frame of the key columns
    return purges.stage_log_erasure(spark, storage, state, plan, stage, log_column, keys, purged)


def plan_state_commit(
    storage: Storage,
    state: TableState,
    plan: CommitPlan,
    stage: str,
    rewrite: ClosedFiles,
    compact: ClosedFiles,
) -> list[str]:
    """Put the staged state in `plan`: the open sets and current replace theirs, the closed files
    the fold rewrote or compacted go, and the staged closed rows join the folders of their end
    days. Returns the closed days ("kind:day") that only gain files."""
    for staged, final in (
        (_staged_slice(stage, "history", OPEN), state.history_active),
        (_staged_slice(stage, "delete", OPEN), state.deletes_active),
        (f"{stage}/current", state.current),
    ):
        plan.replace_folder(storage, final)
        plan.stage_folder(storage, staged, final)
    for files in (*rewrite.values(), *compact.values()):
        plan.deletes.extend(files)
    appended = []
    for kind, final_root in state.closed_roots:
        for day, staged_files in sorted(_staged_closed_days(storage, stage, kind).items()):
            plan.stage_files(staged_files, f"{final_root}/{day}")
            if (kind, day) not in rewrite and (kind, day) not in compact:
                appended.append(f"{kind}:{day}")
    return appended


def _staged_closed_days(storage: Storage, stage: str, kind: str) -> dict[str, list[str]]:
    """End day -> the staged closed files of `kind` (a small fold stages a slice per end hour)."""
    slices = [
        entry
        for entry in storage.list(f"{stage}/rows/{KIND}={kind}")
        if entry.is_dir and entry.name.startswith(f"{SLICE}=") and entry.name != f"{SLICE}={OPEN}"
    ]
    by_day: dict[str, list[str]] = {}
    for entry, files in zip(
        slices, each_request(lambda e: parquet_files(storage, e.uri), slices), strict=True
    ):
        by_day.setdefault(entry.name.split("=", 1)[1][:10], []).extend(files)
    return by_day


def _report_closed_days(report: FoldReport, rewrite: ClosedFiles, compact: ClosedFiles) -> None:
    report.days_rewritten = [f"{kind}:{day}" for kind, day in rewrite]
    report.closed_files_rewritten = sum(len(files) for files in rewrite.values())
    report.days_compacted = [f"{kind}:{day}" for kind, day in compact]


def _reaches_back(open_start: Column, earliest: Column) -> Column:
    """Late data: the batch holds a version at or before the key's open row's start, so the
    key's closed rows from there on must be redone (the totals count these keys, the fold
    redoes their rows: one rule for both)."""
    return open_start >= earliest


def _totals(marked: DataFrame, open_rows: DataFrame | None, keys: list[str]) -> dict:
    """Every count the fold reports, reconciles and decides on, from one aggregate over the
    marked batch joined with the stored open rows' starts: the batch's rows, events, versions,
    keys, purge markers and earliest version, and the keys whose batch events reach back before
    their open row (late data) with the earliest such version."""
    late = F.lit(False)
    if open_rows is not None:
        # One start per key, so that the join cannot multiply the batch's rows in the counts.
        open_starts = open_rows.groupBy(*[col(k) for k in keys]).agg(F.max(START).alias(OPEN_FROM))
        marked = marked.join(open_starts, keys, "left")
        late = F.col(merge.FIRST_OF_KEY) & F.coalesce(
            _reaches_back(F.col(OPEN_FROM), F.col(m.VERSION_AT)), F.lit(False)
        )
    row = marked.agg(
        F.count(F.lit(1)).alias("rows"),
        F.count(F.when(F.col(merge.LAST_OF_EVENT), 1)).alias("events"),
        F.count(F.when(F.col(merge.KEPT) & F.col(merge.LAST_OF_VERSION), 1)).alias("versions"),
        F.count(F.when(F.col(merge.FIRST_OF_KEY), 1)).alias("keys"),
        F.count(F.when(F.coalesce(F.col(m.PURGED), F.lit(False)), 1)).alias("purge_markers"),
        F.unix_micros(F.min(m.VERSION_AT)).alias("since"),
        F.count(F.when(late, 1)).alias("late_keys"),
        F.unix_micros(F.min(F.when(late, F.col(m.VERSION_AT)))).alias("late_since"),
        *VersionSet.sums(
            keys, F.col(m.VERSION_AT), F.col(merge.KEPT) & F.col(merge.LAST_OF_VERSION), VERSIONS
        ),
    ).collect()[0]
    # Times come back as UTC microseconds: PySpark would hand a timestamp over as a naive
    # datetime in the Python process's local zone, which is not the lake's (UTC).
    return {**row.asDict(), "since": _utc(row["since"]), "late_since": _utc(row["late_since"])}


def _any_closed_days(storage: Storage, state: TableState) -> bool:
    return any(closed_days(storage, root) for _, root in state.closed_roots)


def _earlier(moment, delta: dt.timedelta):
    """`moment - delta` (a date or an aware datetime), or the first instant of the year 1 when
    that is before it: a vendor's row may be dated 0001-01-01."""
    try:
        return moment - delta
    except OverflowError:
        return moment.min.replace(tzinfo=moment.tzinfo) if isinstance(moment, dt.datetime) else moment.min


def _utc(micros: int | None) -> dt.datetime | None:
    return (
        None if micros is None else dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    )


def _plain_columns(spec: m.TableSpec) -> dict[str, str]:
    """Writer options for both of a fold's writes: columns stored without a Parquet dictionary
    (keys, version times, starts, sequences: they differ on nearly every row of current and of
    history's files). The two writes run at once, and in one session concurrent writes were seen
    to pick up each other's Parquet options (1 in 2 folds in a test), so they share one set. The
    history ends are left to Parquet: the open set's are all the end of time."""
    return lake_io.without_dictionary([*spec.keys, *m.PER_EVENT_COLUMNS, spec.history_columns.start])


def _write_state_rows(
    state_rows: DataFrame, spec: m.TableSpec, target: str, open_files: int, large: bool
) -> None:
    """Stage the open set and the closed rows in one write, a folder per kind and slice.

    A small fold slices its closed rows by end hour, so that the next fold's late data, which
    reaches back an hour or two, rewrites those hours' files and not the whole day's rows. It
    writes from one task (one file per slice) unless the open set needs several files. A large
    fold (a backfill) slices by day and writes from each of its few partitions instead of
    shuffling everything once more."""
    payload = spec.payload_columns(state_rows.columns)
    out = state_rows.select(
        *merge.history_projection(spec, payload, start=START, purged=True), F.col(KIND), F.col(SLICE)
    )
    if not large:
        if open_files == 1:
            out = out.coalesce(1)
        else:
            spread = F.when(
                F.col(SLICE) == OPEN, F.pmod(F.xxhash64(*merge.key_cols(spec)), F.lit(open_files))
            ).otherwise(0)
            out = out.repartition(F.col(KIND), F.col(SLICE), spread)
    out.write.options(**_plain_columns(spec)).mode("overwrite").option(
        "maxRecordsPerFile", ROWS_PER_FILE
    ).partitionBy(KIND, SLICE).parquet(target)


def _write_current(
    spark: SparkSession,
    storage: Storage,
    spec: m.TableSpec,
    state_rows: DataFrame,
    staged_open: str,
    target: str,
    files: int,
) -> int:
    """Stage current from the staged open set, whose versions it is (its deletes are staged
    apart), and return its row count.

    Read back from the open set's ~100k rows rather than computed beside it, the timeline is
    computed once, by the state rows' write, and not kept: keeping it (a local checkpoint) so
    that two writes could share it cost more than this read, and warm hours are no slower
    (docs/profiling.md, "Figures behind the code"). With no open version (every key deleted) current
    is empty, in its shape."""
    if storage.exists(staged_open):
        open_versions = _read_stored(spark, storage, [staged_open], spec)
    else:
        open_versions = state_rows.limit(0)
    current = merge.current_of(open_versions, spec, spec.payload_columns(open_versions.columns))
    current.coalesce(files).write.options(**_plain_columns(spec)).mode("overwrite").parquet(target)
    return lake_io.rows_in(storage, parquet_files(storage, target))


def closed_files_ending_from(
    storage: Storage, state: TableState, spec: m.TableSpec, ending_from: dt.datetime | None
) -> ClosedFiles:
    """(kind, end date) -> the closed history and delete files that may hold rows ending at or
    after `ending_from` (every closed file when None). A fold adds new files to the days it
    closes rows in, so late data reaches the last few files of a day, not the whole day; the
    footers' statistics of the days from that date on say which."""
    floor = ending_from.date().isoformat() if ending_from else ""
    candidates = {
        (kind, day): parquet_files(storage, uri)
        for kind, root in state.closed_roots
        for day, uri in closed_days(storage, root).items()
        if day >= floor
    }
    if ending_from is not None:
        every = [uri for files in candidates.values() for uri in files]
        reaching = set(lake_io.files_reaching(storage, every, spec.history_columns.end, ending_from))
        candidates = {where: [uri for uri in files if uri in reaching] for where, files in candidates.items()}
    return {where: files for where, files in candidates.items() if files}


def widens_stored_types(stored: DataFrame | None, events: DataFrame, spec: m.TableSpec) -> bool:
    """Whether the batch's `events` widen the type of a column the `stored` open set holds (an
    integer column meeting doubles or text, say: `schema.widen`). History keeps one type per
    column, so that a reader merging its files' schemas (Spark's `mergeSchema` cannot merge a
    double with text) reads it whole: the closed files, which the fold would not otherwise
    rewrite, are then rewritten in the new types, once."""
    if stored is None:
        return False
    before = {same_name(field.name): field.dataType for field in stored.schema.fields}
    return any(
        before.get(same_name(field.name), field.dataType) != field.dataType
        for field in unified_fields(spec.name, [stored.schema, events.schema], spec.keys)
    )


def every_closed_file_besides(
    storage: Storage, state: TableState, spec: m.TableSpec, skip: ClosedFiles
) -> ClosedFiles:
    """(kind, end date) -> every closed history and delete file but those in `skip` (a day's
    late data may reach only some of its files: the others are still taken)."""
    skipped = set(_files_of(skip))
    every = closed_files_ending_from(storage, state, spec, None)
    kept = {where: [uri for uri in files if uri not in skipped] for where, files in every.items()}
    return {where: files for where, files in kept.items() if files}


def settled_days_to_compact(
    storage: Storage, state: TableState, since: dt.datetime | None, skip: ClosedFiles
) -> ClosedFiles:
    """(kind, end date) -> the files of closed days that ended before `since`'s date (within
    `COMPACT_LOOKBACK_DAYS`) and hold more than `COMPACT_AFTER_FILES` files; days in `skip`
    (rewritten by the fold anyway) are left out. Nothing when no version was touched (`since` None)."""
    if since is None:
        return {}
    last = since.date()
    first = _earlier(last, dt.timedelta(days=COMPACT_LOOKBACK_DAYS)).isoformat()
    found = {}
    for kind, root in state.closed_roots:
        for day, uri in closed_days(storage, root).items():
            if first <= day < last.isoformat() and (kind, day) not in skip:
                files = parquet_files(storage, uri)
                if len(files) > COMPACT_AFTER_FILES:
                    found[(kind, day)] = files
    return found


def stored_rows_since(
    spark: SparkSession, storage: Storage, state: TableState, spec: m.TableSpec, since: dt.datetime | None
) -> DataFrame | None:
    """Stored history and delete rows (in their stored shape) that may end at or after `since`:
    the open set plus the closed files from `since` on. What the last fold could have changed."""
    ending_from = _earlier(since, _END_GAP) if since else None
    closed = closed_files_ending_from(storage, state, spec, ending_from)
    paths = state.open_folders(storage)
    paths += [uri for files in closed.values() for uri in files]
    if not paths:
        return None
    return lake_io.read_drifting(spark, storage, paths, table=spec.name, keys=spec.keys)
