"""`./dev bench --scale`: how the cost per landed row grows with ten times the data.

Two figures, each the seconds per million landed rows at ten times the full size (10x the keys
and 10x the events an hour, so each key sees as many events as at the full size) divided by the
same at the full size, both sizes measured in the same process:

* `scale_10x_backfill`: the 7-day backfill through the pipeline's calls (catalogue, ingest,
  change log, fold, checks) in one run. The full size is measured before and after the large one
  and its faster sample taken, so the JVM's warm-up and noise on the small side cannot flatter
  the large one (a single large sample can still be a lucky one).
* `scale_10x_hourly`: one more hour folded into 30 days of history; the hours of the two sizes
  alternate (ABBA), and the figure compares their medians after one unmeasured warm-up hour
  each. The 30 days are built beforehand by weekly runs (not measured).

Both sizes land two files an hour and run the same queries, so what a file or a query costs
whatever its rows is spread over ten times the rows at 10x: the figures say how the cost of the
rows grows, which is what the lake must keep flat; a run's fixed cost shows in the other figures.

Correctness as in the other figures: `current` and `history` of every lake equal DuckDB's
recomputation from the same landing, row for row.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
from pyspark.sql import SparkSession

from benchmarks import duckdb_reference
from benchmarks.side_by_side import (
    FEED,
    PAYLOAD,
    TABLE,
    against_goals,
    feed_config,
    hour_keys,
    landed_hours,
    run_pipeline,
)
from benchmarks.unit_landing import LandingShape, write_unit_landing

#: The figures' names say "10x".
FACTOR = 10
GOALS = {"scale_10x_backfill": 1.2, "scale_10x_hourly": 1.2}
#: Spark's driver heap for this run: the largest batch (7 days at 10x, ~17M rows) is cached in
#: memory; the rest of the machine's 24 GiB is left to Python, DuckDB and the page cache.
DRIVER_MEMORY = "12g"
#: DuckDB's share while it recomputes 30 days at 10x (it spills to disk beyond it).
DUCKDB_MEMORY = "6GB"
BACKFILL_HOURS = 7 * 24
HISTORY_DAYS = 30
#: The 30 days of history are built a week per run: at 10x a week is the backfill's ~17M rows,
#: which the driver's heap holds cached; 30 days in one run would not fit.
BUILD_DAYS_PER_RUN = 7


def _shape(base: LandingShape, factor: int, hours: int) -> LandingShape:
    return dataclasses.replace(
        base, keys=base.keys * factor, events_per_hour=base.events_per_hour * factor, hours=hours
    )


def _per_million(seconds: float, rows: int) -> float:
    return seconds / rows * 1_000_000


def _matches_duckdb(landing: Path, lake: Path, scratch: Path) -> dict:
    """Recompute and compare within DuckDB's share of memory: the driver's heap stays allocated
    beside it (a compare without a limit was killed for memory at 10x)."""
    con = duckdb.connect()
    try:
        con.execute(f"SET memory_limit = '{DUCKDB_MEMORY}'")
        con.execute(f"SET temp_directory = '{scratch / 'duckdb-spill'}'")
        duckdb_reference.recompute(landing, TABLE, scratch / "duckdb", con=con)
        return duckdb_reference.compare_with_lake(scratch / "duckdb", lake, FEED, TABLE, PAYLOAD, con=con)
    finally:
        con.close()


def _backfill(spark: SparkSession, root: Path, shape: LandingShape) -> dict[str, Any]:
    landing = root / "landing"
    stats = write_unit_landing(landing, TABLE, shape)
    feed = feed_config(landing)
    partitions = landed_hours(feed)
    lake = root / "lake"
    started = time.perf_counter()
    run_pipeline(spark, feed, lake, partitions, "bench-scale-backfill")
    seconds = time.perf_counter() - started
    return {
        "landing": landing,
        "lake": lake,
        "rows": stats.rows,
        "seconds": seconds,
    }


def _build_history(spark: SparkSession, root: Path, shape: LandingShape) -> tuple[Any, Path, Path]:
    """30 days landed and folded in weekly runs; returns the feed, its landing and its lake."""
    landing, lake = root / "landing30d", root / "lake30d"
    write_unit_landing(landing, TABLE, shape)
    feed = feed_config(landing)
    partitions = landed_hours(feed)
    step = BUILD_DAYS_PER_RUN * 24
    for first in range(0, len(partitions), step):
        run_pipeline(spark, feed, lake, partitions[first : first + step], f"bench-scale-build-{first}")
    return feed, landing, lake


def backfill_figure(spark: SparkSession, root: Path, base: LandingShape) -> dict[str, Any]:
    large_label = f"{FACTOR}x"
    runs: list[tuple[str, dict[str, Any]]] = []
    for label, factor in (("1x", 1), (large_label, FACTOR), ("1x", 1)):
        shape = _shape(base, factor, BACKFILL_HOURS)
        runs.append((label, _backfill(spark, root / f"backfill-{len(runs)}-{label}", shape)))
    small = min((run for label, run in runs if label == "1x"), key=lambda run: run["seconds"])
    large = next(run for label, run in runs if label == large_label)
    per_million = {
        label: _per_million(run["seconds"], run["rows"])
        for label, run in (("1x", small), (large_label, large))
    }
    return {
        "samples": [
            {"size": label, "seconds": round(run["seconds"], 2), "rows": run["rows"]} for label, run in runs
        ],
        "seconds_per_million_rows": {label: round(value, 3) for label, value in per_million.items()},
        "scale_10x_backfill": round(per_million[large_label] / per_million["1x"], 3),
        "correct_vs_duckdb": {
            label: _matches_duckdb(run["landing"], run["lake"], run["lake"].parent)
            for label, run in (("1x", small), (large_label, large))
        },
    }


def hourly_figure(spark: SparkSession, root: Path, base: LandingShape, samples: int) -> dict[str, Any]:
    sizes = {"1x": 1, f"{FACTOR}x": FACTOR}
    history_hours = HISTORY_DAYS * 24
    built = {
        label: _build_history(spark, root / f"hourly-{label}", _shape(base, factor, history_hours))
        for label, factor in sizes.items()
    }
    seconds: dict[str, list[float]] = {label: [] for label in sizes}
    rows: dict[str, list[int]] = {label: [] for label in sizes}
    for sample in range(1 + samples):  # the first hour of each is a warm-up
        hour = history_hours + sample
        in_turn = list(sizes.items())
        for label, factor in in_turn if sample % 2 == 0 else reversed(in_turn):
            feed, landing, lake = built[label]
            stats = write_unit_landing(landing, TABLE, _shape(base, factor, 1), first_hour=hour)
            started = time.perf_counter()
            run_pipeline(spark, feed, lake, hour_keys(hour, 2), f"bench-scale-hour-{sample}")
            seconds[label].append(time.perf_counter() - started)
            rows[label].append(stats.rows)
    per_million = {
        label: statistics.median(
            _per_million(s, r) for s, r in zip(seconds[label][1:], rows[label][1:], strict=True)
        )
        for label in sizes
    }
    correct = {
        label: _matches_duckdb(landing, lake, lake.parent) for label, (_, landing, lake) in built.items()
    }
    return {
        "seconds": {label: [round(s, 3) for s in values] for label, values in seconds.items()},
        "rows": rows,
        "seconds_per_million_rows": {label: round(value, 3) for label, value in per_million.items()},
        "scale_10x_hourly": round(per_million[f"{FACTOR}x"] / per_million["1x"], 3),
        "correct_vs_duckdb": correct,
    }


def run(spark: SparkSession, root: Path, base: LandingShape, samples: int) -> dict[str, Any]:
    backfill = backfill_figure(spark, root, base)
    # The backfill figure on its own first: the hourly part takes far longer.
    print(json.dumps({"backfill_7d": backfill}, default=str), file=sys.stderr, flush=True)
    hourly = hourly_figure(spark, root, base, samples)
    figures = {
        "scale_10x_backfill": backfill["scale_10x_backfill"],
        "scale_10x_hourly": hourly["scale_10x_hourly"],
    }
    correct = all(
        result["equal"] for part in (backfill, hourly) for result in part["correct_vs_duckdb"].values()
    )
    return {
        "figures": figures,
        "context": {},
        **against_goals(figures, GOALS),
        "correct": correct,
        "backfill_7d": backfill,
        "hourly_30d": hourly,
    }
