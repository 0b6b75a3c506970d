"""Does folding one more hour cost the hour, or the history?

Builds two lakes over the same key space and hourly rate, one with 1 day of history and one
with 7 days, then times folding the next hour into each (median of several hours). The goal is
a ratio (7 days / 1 day) of at most 1.3: cost follows the batch and the number of keys, not the
length of history.
"""

from __future__ import annotations

import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, functions as F

from lake_assets.engine import model as m
from lake_assets.engine.fold import fold
from lake_assets.engine.state import TableState
from lake_assets.paths import LakeLayout
from lake_assets.storage import Storage

BASE = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
SPEC = m.TableSpec(name="bench", keys=("id",))


def hourly_events(spark: SparkSession, first_hour: int, hours: int, keys: int, rate: int, seed: int) -> DataFrame:
    """`rate` events an hour over `keys` keys: mostly updates, some inserts and deletes."""
    roll = F.rand(seed)
    hour = F.lit(first_hour) + (F.col("id") / rate).cast("long")
    return spark.range(rate * hours).select(
        F.concat(F.lit("k"), F.lpad((F.rand(seed + 1) * keys).cast("long").cast("string"), 8, "0")).alias("id"),
        F.concat(F.lit("name-"), (F.rand(seed + 2) * 1000).cast("int").cast("string")).alias("name"),
        (F.rand(seed + 3) * 100000).cast("long").alias("amount"),
        F.when(roll < 0.05, m.DELETE).when(roll < 0.15, m.INSERT).otherwise(m.UPDATE).alias(m.OP),
        (F.lit(BASE).cast("timestamp") + F.make_interval(hours=hour.cast("int"), secs=F.rand(seed + 4) * 3600)).alias(m.VERSION_AT),
        (F.lit(first_hour * rate) + F.col("id")).alias(m.SEQ),
        F.lit(None).cast("array<string>").alias(m.UNMODIFIED),
        F.lit(False).alias(m.PURGED),
        F.lit("file:///bench").alias(m.SOURCE_FILE),
    )


def _time_fold(spark, storage, state, batch) -> float:
    batch = batch.localCheckpoint(eager=True)  # generating the batch is not part of the fold
    started = time.perf_counter()
    fold(spark, storage, state, batch, SPEC)
    return time.perf_counter() - started


def run(spark: SparkSession, *, keys: int, rate: int, samples: int, workdir: Path | None = None) -> dict:
    storage = Storage()
    lakes, results = {}, {}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for days in (1, 7):
            state = TableState(LakeLayout(f"file://{tmp}/lake{days}"), "bench", "bench")
            started = time.perf_counter()
            fold(spark, storage, state, hourly_events(spark, 0, 24 * days, keys, rate, seed=days), SPEC)
            lakes[days] = state
            results[f"{days}d"] = {
                "history_hours": 24 * days,
                "history_events": 24 * days * rate,
                "build_seconds": round(time.perf_counter() - started, 2),
                "fold_one_hour_seconds": [],
            }
        # Interleaved, so JVM warm-up and machine noise fall on both sides alike.
        for i in range(samples):
            for days, state in lakes.items():
                batch = hourly_events(spark, 24 * days + i, 1, keys, rate, seed=100 + i)
                results[f"{days}d"]["fold_one_hour_seconds"].append(round(_time_fold(spark, storage, state, batch), 3))
    for entry in results.values():
        entry["fold_one_hour_median"] = round(statistics.median(entry["fold_one_hour_seconds"]), 3)
    ratio = results["7d"]["fold_one_hour_median"] / results["1d"]["fold_one_hour_median"]
    return {
        "benchmark": "incremental_growth_7d_vs_1d",
        "keys": keys,
        "events_per_hour": rate,
        "samples": samples,
        **results,
        "ratio_7d_over_1d": round(ratio, 3),
        "goal": "<= 1.3",
        "met": ratio <= 1.3,
    }
