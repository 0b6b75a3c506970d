"""Invariants of the folded tables, computed from the files a reader sees (not from the fold's
own intermediate results), so a fault in the fold or in the commit shows up here.

Each check reads only what the last fold could have changed: the open set, and the closed files
that may hold rows ending at or after the earliest version the fold touched. Results are plain
data; the Dagster layer turns them into asset check results.

Whether the batch's versions were stored is answered in one of two ways. After a fold into a
table that held nothing, every stored row is one of the batch's versions, so the stored
(key, start) pairs are compared with the batch's as summaries (`VersionSet`) and the batch is
not read again. Otherwise the batch's versions travel with the stored rows and each is looked
for among them.
"""

from __future__ import annotations

import dataclasses

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from lake_assets.engine import merge
from lake_assets.engine import model as m
from lake_assets.engine.names import col
from lake_assets.engine.schema import union_all

#: the 31-bit slices of a pair's 64-bit hash that a `VersionSet` sums (below 2^32 pairs, no sum overflows)
_SLICE_MASK = 0x7FFFFFFF


@dataclasses.dataclass(frozen=True)
class VersionSet:
    """A set of (key, version time) pairs summed up: how many, and the sums of two 31-bit
    slices of each pair's hash. Equal sets give equal summaries; a pair missing, added or
    changed moves the sums, and two changes cancel out with a chance of about 2^-62."""

    count: int
    low: int
    high: int

    @staticmethod
    def sums(keys: list[str], time: Column, where: Column, prefix: str) -> list[Column]:
        """Aggregate columns (`prefix` + count, low, high) summing up the pairs of the rows where
        `where` holds, each row one distinct pair. Each key is hashed as text beside whether it is
        NULL (the hash skips NULLs, so ("a", NULL) and (NULL, "a") would otherwise be one pair),
        and as text an integer key hashes alike at any width."""
        pair = F.xxhash64(
            *[F.struct(col(k).isNull(), col(k).cast("string")) for k in keys], F.unix_micros(time)
        )
        counted = F.when(where, pair)
        return [
            F.count(counted).alias(f"{prefix}count"),
            F.coalesce(F.sum(counted.bitwiseAND(F.lit(_SLICE_MASK))), F.lit(0)).alias(f"{prefix}low"),
            F.coalesce(F.sum(F.shiftright(counted, 32).bitwiseAND(F.lit(_SLICE_MASK))), F.lit(0)).alias(
                f"{prefix}high"
            ),
        ]

    @classmethod
    def of(cls, row, prefix: str) -> VersionSet:
        """The summary in `row`, aggregated by `sums` with the same `prefix`."""
        return cls(int(row[f"{prefix}count"]), int(row[f"{prefix}low"]), int(row[f"{prefix}high"]))


@dataclasses.dataclass(frozen=True)
class StoredVersions:
    """How many of the batch's distinct versions were found among the stored rows, and, when
    they were compared as summaries, whether the stored rows are exactly those versions (then
    `found` is the number of stored rows, which is the number of versions when they are)."""

    found: int
    same_set: bool | None = None  # None: each version was looked up among the stored rows


#: the fold's checks, each with the layer it is about
CURRENT_UNIQUE_KEY, HISTORY_WINDOWS, EVENTS_RECONCILE = (
    "current_unique_key",
    "history_windows",
    "events_reconcile",
)
LAYER_OF_CHECK = {CURRENT_UNIQUE_KEY: "current", HISTORY_WINDOWS: "history", EVENTS_RECONCILE: "history"}


@dataclasses.dataclass(frozen=True)
class Outcome:
    name: str
    passed: bool
    description: str
    metadata: dict


def current_has_unique_keys(current: DataFrame | None, spec: m.TableSpec) -> Outcome:
    if current is None:
        return Outcome(CURRENT_UNIQUE_KEY, True, "current is empty", {"rows": 0})
    row = current.agg(
        F.count(F.lit(1)).alias("rows"), F.count_distinct(*[col(k) for k in spec.keys]).alias("keys")
    ).collect()[0]
    return Outcome(
        CURRENT_UNIQUE_KEY,
        row["rows"] == row["keys"],
        f"{row['rows']} rows for {row['keys']} distinct keys",
        {"rows": row["rows"], "distinct_keys": row["keys"], "duplicate_rows": row["rows"] - row["keys"]},
    )


SIDE = "__side"  # in the one pass over stored rows and batch versions: which of the two a row is
STORED, BATCH = 0, 1


def windows_and_versions_stored(
    rows: DataFrame | None, batch: DataFrame | VersionSet | None, spec: m.TableSpec
) -> tuple[Outcome, StoredVersions]:
    """The `history_windows` check, and how many distinct (key, version time) of `batch` are
    among the stored rows (for `events_reconcile`), from one shuffle of both by key.

    `batch` is the batch's events, or the summary of its distinct versions when `rows` are
    every stored row of a table the batch was folded into empty: the stored rows are then
    summed up alike and only they are shuffled.

    The windows check, over history versions and delete events (`_op`), per key in start
    order: at most one active version, no inverted window, no overlap, and each end equal to
    the next version's start − 1 ms or to the time of the delete that follows it. `rows` is the
    open set and the closed files the last fold could have changed.

    As two queries each read and shuffled the stored rows, one by key and one by key and time:
    in a backfill, every stored row twice (docs/profiling.md, "Figures behind the code"). Here the
    batch's versions travel with the stored rows, marked by `SIDE`, in one shuffle by key and
    one sort by (start, side): a batch version is found when the row before it is a stored row
    with its start.
    """
    summary, versions = (batch, None) if isinstance(batch, VersionSet) else (None, batch)
    if rows is None:
        nothing = StoredVersions(0, same_set=None if summary is None else summary.count == 0)
        return Outcome(HISTORY_WINDOWS, True, "history is empty", {}), nothing
    hc = spec.history_columns
    marked = _marked_rows(rows, versions, spec)
    is_version = (F.col(SIDE) == STORED) & ~(F.col(m.OP) == m.DELETE)

    def versions_where(condition) -> F.Column:
        return F.count(F.when(is_version & condition, 1))

    stats = marked.agg(
        versions_where(F.col(hc.end) < F.col(hc.start)).alias("inverted"),
        versions_where(
            F.col("__next_start").isNotNull()
            & (F.col(hc.end) >= F.col("__next_start"))
            & (F.col("__next_op") != m.DELETE)
        ).alias("overlapping"),
        versions_where(
            F.col("__next_start").isNotNull()
            & ~(
                (
                    (F.col("__next_op") != m.DELETE)
                    & (F.col(hc.end) == merge.before_next(F.col("__next_start")))
                )
                | ((F.col("__next_op") == m.DELETE) & (F.col(hc.end) == F.col("__next_start")))
            )
        ).alias("inconsistent_end"),
        versions_where(F.col("__next_start").isNull() != F.col(hc.active)).alias("wrong_active_flag"),
        versions_where(F.lit(True)).alias("versions_checked"),
        # counted on each key's first version only, so a key counts once
        versions_where(
            (F.col("__active_versions") > 1) & F.coalesce(F.col("__versions_before") == 0, F.lit(True))
        ).alias("several_active"),
        # each distinct batch version once: the first of equal ones
        F.count(F.when((F.col(SIDE) == BATCH) & ~F.col("__repeated") & F.col("__found"), 1)).alias(
            "batch_versions_stored"
        ),
        *(
            VersionSet.sums(list(spec.keys), F.col(hc.start), F.col(SIDE) == STORED, prefix="stored_")
            if summary is not None
            else []
        ),
    ).collect()[0]
    metadata = {
        k: int(stats[k])
        for k in ("inverted", "overlapping", "inconsistent_end", "wrong_active_flag", "versions_checked")
    }
    metadata["keys_with_several_active_versions"] = int(stats["several_active"])
    bad = sum(v for k, v in metadata.items() if k != "versions_checked")
    outcome = Outcome(
        HISTORY_WINDOWS,
        bad == 0,
        f"{metadata['versions_checked']} versions checked, {bad} violations",
        metadata,
    )
    if summary is None:
        return outcome, StoredVersions(int(stats["batch_versions_stored"]))
    stored = VersionSet.of(stats, prefix="stored_")
    return outcome, StoredVersions(stored.count, same_set=stored == summary)


def _marked_rows(rows: DataFrame, batch: DataFrame | None, spec: m.TableSpec) -> DataFrame:
    """Stored rows and batch versions (`SIDE`), each with what the checks read of its neighbours.

    Every neighbour is read in one order per key, by start and then side (a stored row before
    the batch versions of its time), so one sort serves both sides: a stored row's next stored
    row is found by skipping the batch rows between them (`lead` ignoring NULLs)."""
    hc = spec.history_columns
    stored = rows.select(
        *[col(k) for k in spec.keys], hc.start, hc.end, hc.active, m.OP, F.lit(STORED).alias(SIDE)
    )
    if batch is not None:
        versions = batch.select(
            *[col(k) for k in spec.keys],
            F.col(m.VERSION_AT).alias(hc.start),
            *[F.lit(None).cast(stored.schema[c].dataType).alias(c) for c in (hc.end, hc.active, m.OP)],
            F.lit(BATCH).alias(SIDE),
        )
        stored = union_all(spec.name, [stored, versions], spec.keys)
    ordered = Window.partitionBy(*[col(k) for k in spec.keys]).orderBy(F.col(hc.start), F.col(SIDE))
    whole_key = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)  # shares the sort
    is_stored, is_delete = F.col(SIDE) == STORED, F.col(m.OP) == m.DELETE
    # The stored row's start and operation, NULL on a batch row: what the next stored row has.
    stored_here = "__stored_here"
    stored = stored.withColumn(
        stored_here, F.when(is_stored, F.struct(F.col(hc.start).alias("start"), F.col(m.OP).alias("op")))
    )
    next_stored = F.expr(f"lead(`{stored_here}`, 1, NULL, true)").over(ordered)  # NULLs skipped
    before, before_side = F.lag(hc.start).over(ordered), F.lag(SIDE).over(ordered)
    same_start = before == F.col(hc.start)
    # One projection, not seven: each projection analyses the whole plan again.
    return stored.withColumns(
        {
            "__next_start": next_stored.getField("start"),
            "__next_op": next_stored.getField("op"),
            "__active_versions": F.sum((is_stored & F.col(hc.active) & ~is_delete).cast("int")).over(
                whole_key
            ),
            "__versions_before": F.sum((is_stored & ~is_delete).cast("int")).over(
                ordered.rowsBetween(Window.unboundedPreceding, -1)
            ),
            # batch versions of one time are next to each other, after the stored rows of that time
            "__repeated": F.coalesce(same_start & (before_side == BATCH), F.lit(False)),
            "__found": F.coalesce(same_start & (before_side == STORED), F.lit(False)),
        }
    ).drop(stored_here)


def batch_reconciles(
    batch_rows: int, identical_duplicates: int, superseded: int, stored: StoredVersions
) -> Outcome:
    """Events in = distinct versions stored + identical duplicates + superseded writes, and,
    when the stored rows were compared with the batch's versions as summaries, they are exactly
    those versions (what decides then: the count equation follows from it)."""
    accounted = stored.found + identical_duplicates + superseded
    description = (
        f"{batch_rows} events in; {stored.found} versions stored, {identical_duplicates} duplicates, "
        f"{superseded} superseded writes"
    )
    metadata = {
        "events_in": batch_rows,
        "versions_stored": stored.found,
        "identical_duplicates": identical_duplicates,
        "superseded_writes": superseded,
    }
    if stored.same_set is not None:
        metadata["stored_rows_match_batch_versions"] = stored.same_set
    if stored.same_set is False:
        description += "; the stored (key, start) pairs are not the batch's versions"
    return Outcome(
        EVENTS_RECONCILE, batch_rows == accounted and stored.same_set is not False, description, metadata
    )
