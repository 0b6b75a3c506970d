"""The rules that turn change events into a per-key timeline, and current / history from it.

Per key, in (version time, sequence) order (docs/semantics.md, "Versions and order" and
"History windows"):
1. identical events collapse: one event per (key, version time, sequence) in each delivery (the
   change log's partition), so that a partition's events do not depend on the others;
2. several writes of one version collapse to the greatest sequence;
3. a partial update's unmodified columns take the previous version's values; after a delete
   (or with no previous version) they are NULL;
4. every event becomes a timeline row that ends 1 ms before the next event starts, or at the
   next event's time when that is a delete, or at the end of time when it is the last;
5. history = the timeline's non-delete rows; current = each key's last row unless a delete;
6. a purged key keeps its key and system columns, every field is erased.

The functions here know nothing of storage: `fold.py` applies them to a whole log or to the
window of touched keys.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Observation, Window, WindowSpec
from pyspark.sql import functions as F

from lake_assets.engine import model as m
from lake_assets.engine.names import col

START = "_version_at"  # in a timeline, a row starts at its version time
END = "__end"
ACTIVE = "__active"
SYNCED = "__synced"


def key_cols(spec: m.TableSpec) -> list[Column]:
    return [col(k) for k in spec.keys]


def with_optional_columns(events: DataFrame) -> DataFrame:
    """Events with every optional model column: a feed that never sends partial updates, purges
    or file names may leave them out."""
    defaults = {
        m.UNMODIFIED: F.lit(None).cast("array<string>"),
        m.PURGED: F.lit(False),
        m.SOURCE_FILE: F.lit(None).cast("string"),
    }
    missing = {column: value for column, value in defaults.items() if column not in events.columns}
    return events.withColumns(missing) if missing else events


def event_order(tie_break: list[Column] | None = None) -> list[Column]:
    """The order every rule reads a key's events in: version time, then `_within_version`.

    Every window below partitions by the key (or by the key and version time) and orders by the
    rest of this, so Spark shuffles the events once and sorts them once for the whole timeline;
    a window ordered in reverse, or on other columns, would cost a sort of its own.
    """
    return [F.col(m.VERSION_AT), *_within_version(tie_break)]


def _within_version(tie_break: list[Column] | None) -> list[Column]:
    """Writes of one version time: by sequence, then the tie-break columns (a stored row before
    the batch's, the delivery), then the purge marker and `copy_rank`'s columns, so that within
    a delivery the copy with a marker, and of those the best, comes last: the collapse keeps
    the last copy, and so the marker (`copy_rank`, between deliveries, does not rank by it)."""
    return [
        F.col(m.SEQ),
        *(tie_break or []),
        F.col(m.PURGED).asc_nulls_first(),
        F.col(m.SOURCE_FILE).asc_nulls_first(),
        F.col(m.OP),
    ]


def copy_rank(tie_break: list[Column] | None = None, undelivered: Column | None = None) -> Column:
    """What decides between copies of one write (same key, version time and sequence) that
    `current` and `history` keep: a copy its partition still delivers over a stored one whose
    file it no longer does (`undelivered`), then the greatest file name, then, of copies from
    one file, the one read last (`tie_break`: a stored copy before the batch's), then the
    operation. History stores all three with the copy, so the pick is the same whichever run met
    which copy first, and whichever partition ran last. The purge marker does not decide: a key
    is purged when any of its events says so, whichever copy is kept, and once a key is purged
    every row of it carries the marker, the stored copy and a later fold's alike, so a rank by
    the marker would keep the copy met first. A file
    rewritten in place, or removed while another file of its partition holds the write again
    (a writer naming each export anew), is the vendor's correction: its new copy of a write wins
    over the one folded from it before, as if the old content had never landed (one run over
    the landing as it is now keeps only the new one)."""
    still_delivered = [] if undelivered is None else [~undelivered]
    return F.struct(
        *still_delivered,
        F.col(m.SOURCE_FILE),
        *(tie_break or []),
        F.col(m.OP),
    )


def _per_key(spec: m.TableSpec, order: list[Column]) -> WindowSpec:
    return Window.partitionBy(*key_cols(spec)).orderBy(*order)


def _last_of_run(window: WindowSpec, columns: list[str]) -> Column:
    """True on the last row of each run of rows with equal `columns` in the window's order."""
    has_next = F.lead(F.lit(1)).over(window).isNotNull()
    same_as_next = has_next
    for column in columns:
        same_as_next = same_as_next & F.lead(column).over(window).eqNullSafe(F.col(column))
    return ~same_as_next


KEPT = "__kept"  # the copy kept of identical events delivered in one partition
LAST_OF_EVENT = "__last_of_event"  # the last copy of its (key, version time, sequence), any partition
LAST_OF_VERSION = "__last_of_version"  # the last write of its (key, version time)
FIRST_OF_KEY = "__first_of_key"  # the key's first event: its copy kept in its first delivery
#: the marks a collapse can hand on with the events it kept (`collapse_identical`)
CARRIED_MARKS = (LAST_OF_EVENT, LAST_OF_VERSION, FIRST_OF_KEY)
COLLAPSE_MARKS = (KEPT, *CARRIED_MARKS)


def delivered_in(events: DataFrame) -> list[str]:
    """The change-log partition column `events` carry (none for stored rows): the delivery
    each event came in."""
    return [c for c in m.PARTITION_COLUMNS if c in events.columns]


def delivery_order(events: DataFrame) -> list[Column]:
    """The tie-break that keeps the copies of one delivery together in `event_order`."""
    return [F.col(c) for c in delivered_in(events)]


def mark_identical(events: DataFrame, spec: m.TableSpec) -> DataFrame:
    """`events` with the `COLLAPSE_MARKS` columns, from one sort: what `collapse_identical`
    keeps, and what a fold counts (events, versions, keys) without another pass.

    Copies are collapsed within their delivery only: a re-delivery in a later partition is kept
    there too, so a partition's events are the same whichever partitions a run reads with it.
    The delivery sorts before the purge marker, so each delivery keeps its copy with a marker.
    Each mark but `KEPT` falls on a copy kept (the last of a run of copies is the one kept), so
    the events a collapse kept carry on the marks this would give them (`carries_marks`): they
    are not computed again.
    """
    if carries_marks(events):
        return events.withColumn(KEPT, F.lit(True))
    delivery = delivered_in(events)
    window = _per_key(spec, event_order(delivery_order(events)))
    copy_of = F.struct(F.col(m.VERSION_AT), F.col(m.SEQ), *[F.col(c) for c in delivery])
    kept = _last_of_run(window, [m.VERSION_AT, m.SEQ, *delivery])
    # One projection (withColumns), not several: each projection re-analyses the whole plan.
    return events.withColumns(
        {
            KEPT: kept,
            LAST_OF_EVENT: _last_of_run(window, [m.VERSION_AT, m.SEQ]),
            LAST_OF_VERSION: _last_of_run(window, [m.VERSION_AT]),
            FIRST_OF_KEY: kept & F.first(copy_of).over(window).eqNullSafe(copy_of),
        }
    )


def carries_marks(events: DataFrame) -> bool:
    """Whether `events` are a collapse's kept events with its marks (`collapse_identical`).

    The marks hold for the rows the collapse kept, per key: such a frame may lose or change a
    key's rows all alike (a ledger's purged keys have their fields erased, every row marked
    purged), never drop some rows of a key, and is not joined with other events, or the marks
    read would be stale."""
    return set(CARRIED_MARKS) <= set(events.columns) and KEPT not in events.columns


def without_marks(events: DataFrame) -> DataFrame:
    """`events` without the marks a collapse handed on with them: as the change log stores them."""
    return events.drop(*COLLAPSE_MARKS)


#: the metric under which `collapse_identical` reports the events it dropped
DROPPED_IDENTICAL = "identical_dropped"


def collapse_identical(
    events: DataFrame,
    spec: m.TableSpec,
    count_dropped: Observation | None = None,
    *,
    keep_marks: bool = False,
) -> DataFrame:
    """One event per (key, version time, sequence) and delivery; a deterministic pick if
    re-deliveries differ.

    With `count_dropped`, the events the collapse drops are counted as it drops them
    (`DROPPED_IDENTICAL`, in the same pass), so a reader can check its row equation rather than
    infer the duplicates from it. With `keep_marks`, the events keep the `CARRIED_MARKS`, so
    that a fold of them (which marks them again, `mark_identical`) runs no window for them
    (docs/profiling.md, "Figures behind the code"); whatever stores them drops the marks
    (`without_marks`).
    """
    marked = mark_identical(events, spec)
    if count_dropped is not None:
        marked = marked.observe(
            count_dropped, F.count(F.when(~F.col(KEPT), F.lit(1))).alias(DROPPED_IDENTICAL)
        )
    kept = marked.where(F.col(KEPT))
    return kept.drop(KEPT) if keep_marks else without_marks(kept)


def latest_write_per_version(
    events: DataFrame,
    spec: m.TableSpec,
    tie_break: list[Column] | None = None,
    undelivered: Column | None = None,
) -> DataFrame:
    """Several writes of one version: the greatest sequence wins, and of its copies the best by
    `copy_rank` (with the tie-break between copies of one file).

    One window, partitioned by key and version time and ordered like `event_order`, so it reads
    the events in the order they are already sorted in, and picks in one pass over them: a
    write is kept when it ranks highest in its version (the rank holds every column of the
    order, the purge marker as stored last, so that rows of equal rank are equal in every
    column of the order, and so next to each other), and the next write does not rank the same. Three
    windows over the wide rows cost measurably more (docs/profiling.md, "Figures behind the
    code")."""
    version = Window.partitionBy(*key_cols(spec), F.col(m.VERSION_AT)).orderBy(*_within_version(tie_break))
    whole_version = version.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    rank = F.struct(F.col(m.SEQ), copy_rank(tie_break, undelivered), F.col(m.PURGED))
    kept = rank.eqNullSafe(F.max(rank).over(whole_version)) & ~F.lead(rank).over(version).eqNullSafe(rank)
    return events.withColumn(_KEEP, kept).where(F.col(_KEEP)).drop(_KEEP)


_KEEP = "__keep"  # in `latest_write_per_version`: the one write a version keeps


def fill_unmodified(
    events: DataFrame,
    spec: m.TableSpec,
    payload: list[str],
    order: list[Column],
    settled: Column | None = None,
) -> DataFrame:
    """Columns listed in `_unmodified` take the value of the key's previous version in its life.

    A life is the run of events between deletes: a delete resets what can be carried forward.
    Rows where `settled` holds already carry their filled values (an incremental fold's anchor
    rows): nothing is carried into them, but their `_unmodified` marker is kept, because a later
    fold that reaches further back must be able to fill them again.
    """
    if not spec.partial_updates or not payload:
        return events
    window = _per_key(spec, order)
    is_delete = (F.col(m.OP) == m.DELETE).cast("int")
    before = window.rowsBetween(Window.unboundedPreceding, -1)
    events = events.withColumn("__life", F.coalesce(F.sum(is_delete).over(before), F.lit(0)))
    so_far = window.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    filled = []
    for column in payload:
        value = col(column)
        unmodified = F.coalesce(F.array_contains(F.col(m.UNMODIFIED), column), F.lit(False))
        if settled is not None:
            unmodified = unmodified & ~F.coalesce(settled, F.lit(False))
        # The value travels with its life: one set before the last delete is not carried past it.
        # The struct also keeps an explicit NULL apart from "not set here".
        set_here = F.struct(F.col("__life").alias("life"), value.alias("v"))
        carried = F.last(F.when(~unmodified, set_here), ignorenulls=True).over(so_far)
        in_this_life = F.when(carried.getField("life") == F.col("__life"), carried.getField("v"))
        filled.append(F.when(unmodified, in_this_life).otherwise(value).alias(column))
    others = [col(c) for c in events.columns if c not in payload and c != "__life"]
    return events.select(*others, *filled).select(*[col(c) for c in events.drop("__life").columns])


def before_next(next_start: Column) -> Column:
    """The end of a version that the version starting at `next_start` closes (`m.END_GAP_MS`)."""
    return next_start - F.expr(f"INTERVAL {m.END_GAP_MS} MILLISECOND")


def with_windows(events: DataFrame, spec: m.TableSpec, order: list[Column] | None = None) -> DataFrame:
    """Add each row's end (see rule 4) and whether it is the key's last event."""
    window = _per_key(spec, order or event_order())
    next_at, next_op = F.lead(m.VERSION_AT).over(window), F.lead(m.OP).over(window)
    end = (
        F.when(next_at.isNull(), F.to_timestamp(F.lit(m.END_OF_TIME)))
        .when((next_op == m.DELETE) & (F.col(m.OP) != m.DELETE), next_at)
        .otherwise(before_next(next_at))
    )
    return events.withColumns({END: end, ACTIVE: next_at.isNull()})


def erase_fields(frame: DataFrame, payload: list[str], erase: Column) -> DataFrame:
    """NULL the payload columns of rows where `erase` holds (purged keys)."""
    if not payload:
        return frame
    types = {f.name: f.dataType for f in frame.schema.fields}
    return frame.select(
        *[
            F.when(erase, F.lit(None).cast(types[c])).otherwise(col(c)).alias(c) if c in payload else col(c)
            for c in frame.columns
        ]
    )


def keys_typed_as(purged: DataFrame, frame: DataFrame, keys: list[str]) -> DataFrame:
    """The key columns of `purged` with the types they have in `frame`, to join the two: a key
    whose type drifted since it was purged still matches, and a value that cannot have the
    frame's type matches nothing (rather than failing a cast inside the join)."""
    types = {f.name: f.dataType for f in frame.schema.fields}
    return purged.select(*[col(k).try_cast(types[k]).alias(k) for k in keys])


def erase_keys(frame: DataFrame, keys: list[str], purged: DataFrame) -> DataFrame:
    """`frame` with every row of the keys in `purged` (a frame of the key columns, small: it is
    broadcast) erased: payload NULL, `_purged` set. Columns keep their order; other rows are
    left as they are."""
    hit = "__erase"
    wanted = F.broadcast(keys_typed_as(purged, frame, keys).distinct().withColumn(hit, F.lit(True)))
    erase = F.coalesce(F.col(hit), F.lit(False))
    joined = erase_fields(frame.join(wanted, keys, "left"), m.payload_columns(frame.columns, keys), erase)
    marked = F.coalesce(F.col(m.PURGED), F.lit(False)) | erase if m.PURGED in frame.columns else erase
    columns = [*frame.columns, *([] if m.PURGED in frame.columns else [m.PURGED])]
    return joined.withColumn(m.PURGED, marked).select(*[col(c) for c in columns])


def purged_anywhere(spec: m.TableSpec, order: list[Column]) -> Column:
    """True on every row of a key that has a purge marker on any of its rows."""
    flag = F.coalesce(F.col(m.PURGED), F.lit(False)).cast("int")
    # Ordered like the other windows (over the whole key), so it shares their sort.
    whole_key = _per_key(spec, order).rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    return F.max(flag).over(whole_key) == 1


def timeline(
    events: DataFrame,
    spec: m.TableSpec,
    payload: list[str],
    tie_break: list[Column] | None = None,
    settled: Column | None = None,
    purges: bool = True,
    undelivered: Column | None = None,
) -> DataFrame:
    """Rules 2–4 and 6 over the events of whole keys (or of a key's window from its anchor).

    `purges=False` says no event carries a purge marker (a fold knows it from its counts), which
    spares a window over whole keys.

    A key counts as purged when any of its writes carries the marker, superseded ones included,
    so the flag is settled before writes of one version collapse. `tie_break` orders copies of
    one write that `copy_rank` cannot tell apart (the last wins); `undelivered` marks stored
    copies whose files their partitions no longer deliver (`copy_rank`).
    """
    order = event_order(tie_break)
    if not purges:
        events = latest_write_per_version(events, spec, tie_break, undelivered)
        events = fill_unmodified(events, spec, payload, order, settled)
        return with_windows(events, spec, order).withColumn(m.PURGED, F.lit(False))
    # The key's flag goes under a name of its own until the windows are done: they order by
    # each event's own marker (`event_order`), and a column replaced midway would be another
    # order to sort by.
    events = events.withColumn(_KEY_PURGED, purged_anywhere(spec, order))
    events = latest_write_per_version(events, spec, tie_break, undelivered)
    events = fill_unmodified(events, spec, payload, order, settled)
    events = with_windows(events, spec, order)
    return (
        erase_fields(events, payload, F.col(_KEY_PURGED))
        .withColumn(m.PURGED, F.col(_KEY_PURGED))
        .drop(_KEY_PURGED)
    )


_KEY_PURGED = "__key_purged"  # in `timeline`: whether any event of the row's key carries the marker


def history_projection(spec: m.TableSpec, payload: list[str], *, start: str, purged: bool) -> list[Column]:
    """History rows' columns under the table's history-mode names: keys, payload, the window
    (opening at column `start`) and the system columns; `_purged` only where it is kept (the
    fold's own stored rows, which must remember it for later late data)."""
    hc = spec.history_columns
    return [
        *[col(c) for c in (*spec.keys, *payload)],
        F.col(start).alias(hc.start),
        F.col(END).alias(hc.end),
        F.col(ACTIVE).alias(hc.active),
        F.col(SYNCED).alias(hc.synced),
        F.col(m.OP),
        F.col(m.SEQ),
        F.col(m.UNMODIFIED),
        *([F.col(m.PURGED)] if purged else []),
        F.col(m.SOURCE_FILE),
    ]


def current_of(rows: DataFrame, spec: m.TableSpec, payload: list[str]) -> DataFrame:
    """Published current columns from timeline rows: last rows that are not deletes."""
    return rows.where(F.col(ACTIVE) & (F.col(m.OP) != m.DELETE)).select(
        *[col(c) for c in (*spec.keys, *payload)],
        F.col(m.VERSION_AT),
        F.col(m.SEQ),
        F.col(m.SOURCE_FILE),
        F.col(SYNCED).alias(spec.history_columns.synced),
    )
