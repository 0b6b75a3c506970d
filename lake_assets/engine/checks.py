"""Invariants of the folded tables, computed from the files a reader sees (not from the fold's
own intermediate results), so a fault in the fold or in the commit shows up here.

Each check reads only what the last fold could have changed: the open set, and the closed files
that may hold rows ending at or after the earliest version the fold touched. Results are plain
data; the Dagster layer turns them into asset check results.
"""

from __future__ import annotations

import dataclasses

from pyspark.sql import DataFrame, Window, functions as F

from lake_assets.engine import model as m
from lake_assets.engine.schema import union_all


@dataclasses.dataclass(frozen=True)
class Outcome:
    name: str
    passed: bool
    description: str
    metadata: dict


def current_has_unique_keys(current: DataFrame | None, spec: m.TableSpec) -> Outcome:
    if current is None:
        return Outcome("current_unique_key", True, "current is empty", {"rows": 0})
    row = current.agg(F.count(F.lit(1)).alias("rows"), F.count_distinct(*[F.col(f"`{k}`") for k in spec.keys]).alias("keys")).collect()[0]
    return Outcome(
        "current_unique_key",
        row["rows"] == row["keys"],
        f"{row['rows']} rows for {row['keys']} distinct keys",
        {"rows": row["rows"], "distinct_keys": row["keys"], "duplicate_rows": row["rows"] - row["keys"]},
    )


def history_windows_are_consistent(rows: DataFrame | None, spec: m.TableSpec) -> Outcome:
    """Over history versions and delete events (`_op`), per key in start order:
    at most one active version, no inverted window, no overlap, and each end equal to the next
    version's start − 1 ms or to the time of the delete that follows it.
    `rows` is the open set and the closed files the last fold could have changed."""
    hc = spec.history_columns
    if rows is None:
        return Outcome("history_windows", True, "history is empty", {})
    keys = [F.col(f"`{k}`") for k in spec.keys]
    order = Window.partitionBy(*keys).orderBy(F.col(hc.start))
    whole_key = order.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)  # shares the sort
    is_delete = F.col(m.OP) == m.DELETE
    # One projection, not four: each projection analyses the whole plan again.
    rows = rows.withColumns({
        "__next_start": F.lead(hc.start).over(order),
        "__next_op": F.lead(m.OP).over(order),
        "__active_versions": F.sum((F.col(hc.active) & ~is_delete).cast("int")).over(whole_key),
        "__versions_before": F.sum((~is_delete).cast("int")).over(order.rowsBetween(Window.unboundedPreceding, -1)),
    })
    versions = rows.where(~is_delete)
    one_ms = F.expr("INTERVAL 1 MILLISECOND")
    stats = versions.agg(
        F.sum(F.when(F.col(hc.end) < F.col(hc.start), 1).otherwise(0)).alias("inverted"),
        F.sum(F.when(F.col("__next_start").isNotNull() & (F.col(hc.end) >= F.col("__next_start")) & (F.col("__next_op") != m.DELETE), 1).otherwise(0)).alias("overlapping"),
        F.sum(
            F.when(
                F.col("__next_start").isNotNull()
                & ~(((F.col("__next_op") != m.DELETE) & (F.col(hc.end) == F.col("__next_start") - one_ms))
                    | ((F.col("__next_op") == m.DELETE) & (F.col(hc.end) == F.col("__next_start")))),
                1,
            ).otherwise(0)
        ).alias("inconsistent_end"),
        F.sum(F.when(F.col("__next_start").isNull() != F.col(hc.active), 1).otherwise(0)).alias("wrong_active_flag"),
        F.count(F.lit(1)).alias("versions_checked"),
        # counted on each key's first version only, so a key counts once
        F.sum(F.when((F.col("__active_versions") > 1) & F.coalesce(F.col("__versions_before") == 0, F.lit(True)), 1).otherwise(0)).alias("several_active"),
    ).collect()[0]
    metadata = {k: int(stats[k] or 0) for k in ("inverted", "overlapping", "inconsistent_end", "wrong_active_flag", "versions_checked")}
    metadata["keys_with_several_active_versions"] = int(stats["several_active"] or 0)
    bad = sum(v for k, v in metadata.items() if k != "versions_checked")
    return Outcome("history_windows", bad == 0, f"{metadata['versions_checked']} versions checked, {bad} violations", metadata)


def versions_stored(batch: DataFrame, rows: DataFrame, spec: m.TableSpec) -> int:
    """How many distinct (key, version time) of the batch are among the stored rows (by start),
    found with one aggregation over both sides."""
    start = spec.history_columns.start
    sides = union_all(spec.name, [
        batch.select(*spec.keys, F.col(m.VERSION_AT).alias(start), F.lit(True).alias("__batch"), F.lit(False).alias("__stored")),
        rows.select(*spec.keys, start, F.lit(False).alias("__batch"), F.lit(True).alias("__stored")),
    ])
    found = sides.groupBy(*spec.keys, start).agg(F.max("__batch").alias("b"), F.max("__stored").alias("s"))
    return found.where(F.col("b") & F.col("s")).count()


def batch_reconciles(batch_rows: int, identical_duplicates: int, superseded: int, stored_versions: int) -> Outcome:
    """Events in = distinct versions stored + identical duplicates + superseded writes."""
    accounted = stored_versions + identical_duplicates + superseded
    return Outcome(
        "events_reconcile",
        batch_rows == accounted,
        f"{batch_rows} events in; {stored_versions} versions stored, {identical_duplicates} duplicates, {superseded} superseded writes",
        {
            "events_in": batch_rows,
            "versions_stored": stored_versions,
            "identical_duplicates": identical_duplicates,
            "superseded_writes": superseded,
        },
    )
