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
from typing import Callable

from pyspark.sql import Column, DataFrame, SparkSession, functions as F

from lake_assets import lake_io
from lake_assets.engine import merge, model as m, purges
from lake_assets.engine.merge import ACTIVE, END, START, SYNCED
from lake_assets.engine.names import col
from lake_assets.engine.run_values import with_run_values
from lake_assets.engine.schema import union_all
from lake_assets.engine.state import CommitPlan, Removing, TableState, closed_days, commit, new_fold_id, parquet_files, recover
from lake_assets.storage import Storage

FROM = "__from"
OPEN_FROM = "__open_from"
ROWS_PER_FILE = 2_000_000  # open-set files: few and large; a fold rewrites them all anyway
LARGE_FOLD_EVENTS = 500_000  # from here on, a fold's closed rows are written without a shuffle
ORIGIN = "__origin"
REACHED = "__reached"
BROADCAST_KEYS = 200_000  # late keys up to this many are sent to every task rather than shuffled
KIND = "__kind"
SLICE = "__slice"  # where a stored row is staged: the open set, or its end date (and hour)
OPEN = "open"
COMPACT_AFTER_FILES = 8  # a settled closed day with more files than this is merged into one
COMPACT_LOOKBACK_DAYS = 2  # how many days before the fold's earliest version are looked at


def _one_ms():
    return F.expr("INTERVAL 1 MILLISECOND")


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
    #: closed days whose hour slices the fold merged (they had settled: the fold does not reach them)
    days_compacted: list[str] = dataclasses.field(default_factory=list)
    #: table files the fold's commit put in place (current, history; not the engine's own state)
    files_written: list[str] = dataclasses.field(default_factory=list)
    #: change-log partitions the fold's commit replaced to erase newly purged keys, and their files
    log_partitions_erased: list[str] = dataclasses.field(default_factory=list)
    log_files_written: list[str] = dataclasses.field(default_factory=list)


def _report_files_put_in_place(
    report: FoldReport, state: TableState, plans: list[CommitPlan], replaced: list[str] = (),
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
    """Stored rows of the given folders or files, with the engine's column names."""
    if not paths:
        return None
    return from_persisted(lake_io.read_drifting(spark, storage, paths, table=spec.name), spec)


def _union(frames: list[DataFrame | None], table: str) -> DataFrame | None:
    present = [f for f in frames if f is not None]
    return union_all(table, present) if present else None


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
) -> FoldReport:
    """Fold `batch` (change-model events) into the state of one table and commit it.

    With `log_column` (the change log's partition column), keys the batch purges for the first
    time are also erased from the change log and recorded as purged (`purges`), in the same commit.
    `removing` is told the files a commit (this fold's, or an interrupted one's) deletes.
    """
    recovered = recover(storage, state, removing)
    report = FoldReport(fold_id=new_fold_id(), recovered_folds=[plan.fold_id for plan in recovered])
    # The files an interrupted fold put in place are this run's to report (and catalogue).
    _report_files_put_in_place(report, state, recovered)
    keys = list(spec.keys)
    # A frame of empty partitions may lack even the keys. With the keys present, emptiness shows
    # in the counts below, so no job of its own is spent on it.
    if batch is None or (not set(keys) <= set(batch.columns) and batch.isEmpty()):
        return report
    synced_at = synced_at or dt.datetime.now(dt.timezone.utc)
    drop = [c for c in batch.columns if c in m.PARTITION_COLUMNS or c == m.INGESTED_AT]
    incoming = merge.with_optional_columns(batch.drop(*drop))
    ledger = purges.ledger(spark, storage, state)
    recorded = ledger.select(*keys) if ledger is not None else None
    if recorded is not None:  # a key purged before stays purged, whatever the batch says
        incoming = merge.erase_keys(incoming, keys, recorded)
    marked = merge.mark_identical(incoming, spec)
    # The marks are read by the totals, the touched keys and the timeline. A batch handed over
    # in memory (the run's stored change batch) is already cached, collapsed and in the marks'
    # order, so they are recomputed from it without a sort: caching them as a second copy of
    # the batch cost more (docs/profiling.md, "Figures behind the code"). Joined with
    # the purged keys (a table that has purges), they are computed once and kept.
    owns_cache = not lake_io.is_cached(batch) or recorded is not None
    if owns_cache:
        marked = marked.persist()
    events = marked.where(F.col(merge.KEPT)).drop(*merge.COLLAPSE_MARKS)
    # Each touched key with its earliest version: its first event in the marked order (an
    # identical copy dropped from `events` has the same version as the one kept).
    touched = marked.where(F.col(merge.FIRST_OF_KEY)).select(*merge.key_cols(spec), F.col(m.VERSION_AT).alias(FROM))
    open_paths = [f for f in (state.history_active, state.deletes_active) if storage.exists(f)]
    open_rows = _read(spark, storage, open_paths, spec)
    open_touched = open_rows.join(touched, keys, "inner") if open_rows is not None else None
    late_keys = open_touched.where(_reaches_back(F.col(START), F.col(FROM))).select(*merge.key_cols(spec), FROM) if open_touched is not None else None

    totals = _totals(marked, open_rows, keys)
    report.batch_rows, report.events_in = totals["rows"], totals["events"]
    if report.events_in == 0:
        if owns_cache:
            marked.unpersist()
        return report
    report.identical_duplicates = report.batch_rows - report.events_in
    report.superseded_writes = report.events_in - totals["versions"]
    report.keys_touched = totals["keys"]
    report.touched_since = totals["since"]
    report.late_keys = totals["late_keys"]

    late_window, rewrite = None, {}
    newly_purged = purges.newly_purged(events, recorded, keys) if totals["purge_markers"] else []
    report.newly_purged = newly_purged
    if report.late_keys or newly_purged:
        # Late data reaches the closed rows ending at or after its earliest version (less the
        # millisecond between a version's end and the next start); older files stay as they
        # are. Erasing a key's fields reaches every closed file that may hold it.
        ending_from = None if newly_purged else _earlier(totals["late_since"], dt.timedelta(milliseconds=1))
        rewrite = closed_files_ending_from(storage, state, spec, ending_from)
        kept = _read(spark, storage, [uri for files in rewrite.values() for uri in files], spec)
        if kept is not None and report.late_keys:
            # One pass over the closed rows splits them: those the late data reaches are redone in
            # the window, the rest are kept as they are (no anti-join of the two, no third read).
            late = F.broadcast(late_keys) if report.late_keys <= BROADCAST_KEYS else late_keys
            reached = F.coalesce(F.col(END) >= F.col(FROM) - _one_ms(), F.lit(False))
            flagged = kept.join(late, keys, "left").withColumn(REACHED, reached)
            late_window = flagged.where(F.col(REACHED)).drop(REACHED)
            kept = flagged.where(~F.col(REACHED)).drop(REACHED, FROM)
    else:
        kept = None

    large = report.events_in >= LARGE_FOLD_EVENTS
    # A small fold writes its closed rows by end hour, so a day gathers a file per hour; once the
    # folds have moved past a day, its files are merged in the same write and commit.
    compact = {} if large else settled_days_to_compact(storage, state, report.touched_since, skip=rewrite)
    settled = _read(spark, storage, [uri for files in compact.values() for uri in files], spec)

    # The window of every touched key: its anchor and later stored rows, plus the batch.
    stored = _union([open_touched, late_window], spec.name)
    if stored is None:  # nothing stored for these keys yet: their timelines are the batch's
        # The cached batch is already partitioned by key and sorted in the rules' event order
        # (`mark_identical` did it), and Spark keeps that order for a cached frame: with no
        # tie-break to add, the timeline's windows read it as it is, without another sort.
        window_events, anchor, tie_break = events, None, None
    else:
        stored = stored.drop(END, ACTIVE, SYNCED).withColumn(ORIGIN, F.lit(0))
        window_events = union_all(spec.name, [stored, events.join(touched, keys, "inner").withColumn(ORIGIN, F.lit(1))])
        # Stored rows before the batch's earliest version are anchors: their values are final.
        anchor = (F.col(ORIGIN) == 0) & (F.col(START) < F.col(FROM))
        # A stored row and a batch event for the same write: the batch's copy keeps its markers.
        tie_break = [F.col(ORIGIN)]
    payload = spec.payload_columns([c for c in window_events.columns if c not in (FROM, ORIGIN)])
    # Stored rows may carry a purge marker; a batch alone can only if it counted one.
    may_purge = stored is not None or totals["purge_markers"] > 0
    rows = merge.timeline(window_events, spec, payload, tie_break=tie_break, settled=anchor, purges=may_purge)
    # The timeline is read by one write only (current follows from the staged open set), so it
    # is computed once without being kept.
    rows = with_run_values(rows.drop(FROM, ORIGIN), {SYNCED: synced_at})
    carried = open_rows.join(touched, keys, "left_anti") if open_rows is not None else None

    # Every stored row of the new state, open and closed, in one frame: they share a shape, so
    # one write (one job, one read of the carried open set) lays them all out by kind and slice.
    purged_now = spark.createDataFrame(newly_purged, schema=events.select(*keys).schema) if newly_purged else None
    if kept is not None and purged_now is not None:
        kept = merge.erase_keys(kept, keys, purged_now)
    closed_slice = F.date_format(F.col(END), "yyyy-MM-dd" if large else "yyyy-MM-dd'T'HH")
    state_rows = _union([
        *[f.withColumn(SLICE, F.when(F.col(ACTIVE), F.lit(OPEN)).otherwise(closed_slice)) for f in (carried, rows, kept) if f is not None],
        settled.withColumn(SLICE, F.date_format(F.col(END), "yyyy-MM-dd")) if settled is not None else None,
    ], spec.name).withColumn(KIND, F.when(F.col(m.OP) == m.DELETE, "delete").otherwise("history"))

    fold_id = report.fold_id
    stage = state.staging(fold_id)
    # The open set has at most its stored rows plus one row per new key.
    stored_open_rows = lake_io.rows_in(storage, [uri for folder in open_paths for uri in parquet_files(storage, folder)])
    files = max(1, (stored_open_rows + report.keys_touched) // ROWS_PER_FILE)
    _write_state_rows(state_rows, spec, f"{stage}/rows", files, large=large)
    report.current_rows = _write_current(spark, storage, spec, state_rows, f"{stage}/rows/{KIND}=history/{SLICE}={OPEN}",
                                         f"{stage}/current", files)

    plan = CommitPlan(fold_id)
    if purged_now is not None:
        # Recorded and erased from the change log in this fold's commit: all of it, or none.
        purges.stage_ledger(storage, state, plan, stage, ledger, purged_now, synced_at)
        if log_column is not None:
            report.log_partitions_erased = purges.stage_log_erasure(
                spark, storage, state, plan, stage, log_column, keys, purged_now)
    for staged, final in (
        (f"{stage}/rows/{KIND}=history/{SLICE}={OPEN}", state.history_active),
        (f"{stage}/rows/{KIND}=delete/{SLICE}={OPEN}", state.deletes_active),
        (f"{stage}/current", state.current),
    ):
        plan.replace_folder(storage, final)
        plan.stage_folder(storage, staged, final)
    for (kind, day), files in rewrite.items():
        plan.deletes.extend(files)
        report.days_rewritten.append(f"{kind}:{day}")
        report.closed_files_rewritten += len(files)
    for (kind, day), files in compact.items():
        plan.deletes.extend(files)
        report.days_compacted.append(f"{kind}:{day}")
    for kind, final_root in (("history", state.history_closed), ("delete", state.deletes_closed)):
        staged_by_day: dict[str, list[str]] = {}
        for entry in storage.list(f"{stage}/rows/{KIND}={kind}"):
            if entry.is_dir and entry.name.startswith(f"{SLICE}=") and entry.name != f"{SLICE}={OPEN}":
                day = entry.name.split("=", 1)[1][:10]
                staged_by_day.setdefault(day, []).extend(parquet_files(storage, entry.uri))
        for day, staged in sorted(staged_by_day.items()):
            plan.stage_files(staged, f"{final_root}/{day}")
            if (kind, day) not in rewrite and (kind, day) not in compact:
                report.days_appended.append(f"{kind}:{day}")
    commit(storage, state, plan, on_step=on_commit_step, removing=removing)
    _report_files_put_in_place(report, state, [*recovered, plan], replaced=plan.deletes)
    if owns_cache:
        marked.unpersist()
    return report


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
        late = F.col(merge.FIRST_OF_KEY) & F.coalesce(_reaches_back(F.col(OPEN_FROM), F.col(m.VERSION_AT)), F.lit(False))
    row = marked.agg(
        F.count(F.lit(1)).alias("rows"),
        F.count(F.when(F.col(merge.KEPT), 1)).alias("events"),
        F.count(F.when(F.col(merge.KEPT) & F.col(merge.LAST_OF_VERSION), 1)).alias("versions"),
        F.count(F.when(F.col(merge.FIRST_OF_KEY), 1)).alias("keys"),
        F.count(F.when(F.coalesce(F.col(m.PURGED), F.lit(False)), 1)).alias("purge_markers"),
        F.unix_micros(F.min(m.VERSION_AT)).alias("since"),
        F.count(F.when(late, 1)).alias("late_keys"),
        F.unix_micros(F.min(F.when(late, F.col(m.VERSION_AT)))).alias("late_since"),
    ).collect()[0]
    # Times come back as UTC microseconds: PySpark would hand a timestamp over as a naive
    # datetime in the Python process's local zone, which is not the lake's (UTC).
    return {**row.asDict(), "since": _utc(row["since"]), "late_since": _utc(row["late_since"])}


def _earlier(moment, delta: dt.timedelta):
    """`moment - delta` (a date or an aware datetime), or the first instant of the year 1 when
    that is before it: a vendor's row may be dated 0001-01-01."""
    try:
        return moment - delta
    except OverflowError:
        return moment.min.replace(tzinfo=moment.tzinfo) if isinstance(moment, dt.datetime) else moment.min


def _utc(micros: int | None) -> dt.datetime | None:
    return None if micros is None else dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=micros)


def _plain_columns(spec: m.TableSpec) -> dict[str, str]:
    """Writer options for both of a fold's writes: columns stored without a Parquet dictionary
    (keys, version times, starts, sequences: they differ on nearly every row of current and of
    history's files). The two writes run at once, and in one session concurrent writes were seen
    to pick up each other's Parquet options (1 in 2 folds in a test), so they share one set. The
    history ends are left to Parquet: the open set's are all the end of time."""
    return lake_io.without_dictionary([*spec.keys, *m.PER_EVENT_COLUMNS, spec.history_columns.start])


def _write_state_rows(state_rows: DataFrame, spec: m.TableSpec, target: str, open_files: int, large: bool) -> None:
    """Stage the open set and the closed rows in one write, a folder per kind and slice.

    A small fold slices its closed rows by end hour, so that the next fold's late data, which
    reaches back an hour or two, rewrites those hours' files and not the whole day's rows. It
    writes from one task (one file per slice) unless the open set needs several files. A large
    fold (a backfill) slices by day and writes from each of its few partitions instead of
    shuffling everything once more."""
    payload = spec.payload_columns(state_rows.columns)
    out = state_rows.select(*merge.history_projection(spec, payload, start=START, purged=True), F.col(KIND), F.col(SLICE))
    if not large:
        if open_files == 1:
            out = out.coalesce(1)
        else:
            spread = F.when(F.col(SLICE) == OPEN, F.pmod(F.xxhash64(*merge.key_cols(spec)), F.lit(open_files))).otherwise(0)
            out = out.repartition(F.col(KIND), F.col(SLICE), spread)
    out.write.options(**_plain_columns(spec)).mode("overwrite").option("maxRecordsPerFile", ROWS_PER_FILE).partitionBy(KIND, SLICE).parquet(target)


def _write_current(
    spark: SparkSession, storage: Storage, spec: m.TableSpec, state_rows: DataFrame, staged_open: str, target: str, files: int
) -> int:
    """Stage current from the staged open set, whose versions it is (its deletes are staged
    apart), and return its row count.

    Read back from the open set's ~100k rows rather than computed beside it, the timeline is
    computed once, by the state rows' write, and not kept: keeping it (a local checkpoint) so
    that two writes could share it cost more than this read, and warm hours are no slower
    (docs/profiling.md, "Figures behind the code"). With no open version (every key deleted) current
    is empty, in its shape."""
    if storage.exists(staged_open):
        open_versions = _read(spark, storage, [staged_open], spec)
    else:
        open_versions = state_rows.limit(0)
    current = merge.current_of(open_versions, spec, spec.payload_columns(open_versions.columns))
    current.coalesce(files).write.options(**_plain_columns(spec)).mode("overwrite").parquet(target)
    return lake_io.rows_in(storage, parquet_files(storage, target))


def closed_files_ending_from(
    storage: Storage, state: TableState, spec: m.TableSpec, ending_from: dt.datetime | None
) -> dict[tuple[str, str], list[str]]:
    """(kind, end date) -> the closed history and delete files that may hold rows ending at or
    after `ending_from` (every closed file when None). A fold adds new files to the days it
    closes rows in, so late data reaches the last few files of a day, not the whole day; the
    footers' statistics of the days from that date on say which."""
    floor = ending_from.date().isoformat() if ending_from else ""
    candidates = {
        (kind, day): parquet_files(storage, uri)
        for kind, root in (("history", state.history_closed), ("delete", state.deletes_closed))
        for day, uri in closed_days(storage, root).items()
        if day >= floor
    }
    if ending_from is not None:
        every = [uri for files in candidates.values() for uri in files]
        reaching = set(lake_io.files_reaching(storage, every, spec.history_columns.end, ending_from))
        candidates = {where: [uri for uri in files if uri in reaching] for where, files in candidates.items()}
    return {where: files for where, files in candidates.items() if files}


def settled_days_to_compact(
    storage: Storage, state: TableState, since: dt.datetime, skip: dict[tuple[str, str], list[str]]
) -> dict[tuple[str, str], list[str]]:
    """(kind, end date) -> the files of closed days that ended before `since`'s date (within
    `COMPACT_LOOKBACK_DAYS`) and hold more than `COMPACT_AFTER_FILES` files; days in `skip`
    (rewritten by the fold anyway) are left out."""
    last = since.date()
    first = _earlier(last, dt.timedelta(days=COMPACT_LOOKBACK_DAYS)).isoformat()
    found = {}
    for kind, root in (("history", state.history_closed), ("delete", state.deletes_closed)):
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
    ending_from = _earlier(since, dt.timedelta(milliseconds=1)) if since else None
    closed = closed_files_ending_from(storage, state, spec, ending_from)
    paths = [f for f in (state.history_active, state.deletes_active) if storage.exists(f)]
    paths += [uri for files in closed.values() for uri in files]
    if not paths:
        return None
    return lake_io.read_drifting(spark, storage, paths, table=spec.name)
