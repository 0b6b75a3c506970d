"""A run's own times (`_ingested_at`, `_fivetran_synced`) reach Spark as data, not as code."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import functions as F

from lake_assets.engine.run_values import text_table, with_run_values
from lake_assets_tests.run_value_probes import classes_compiled


def test_a_new_value_each_run_compiles_no_new_code(spark):
    frame = spark.range(3000).select((F.col("id") % 7).alias("k"), F.lit(None).cast("timestamp").alias("at"))
    seen = []
    for moment in (
        dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        dt.datetime(2026, 1, 1, 0, 0, 1, 5000, tzinfo=dt.UTC),
    ):
        stamped = with_run_values(frame, {"at": moment, "other": moment + dt.timedelta(hours=1)})
        before = classes_compiled(spark)
        rows = (
            stamped.groupBy("k")
            .agg(
                *[F.min(F.unix_micros(c)).alias(f"min_{c}") for c in ("at", "other")],
                *[F.max(F.unix_micros(c)).alias(f"max_{c}") for c in ("at", "other")],
            )
            .collect()
        )
        seen.append((classes_compiled(spark) - before, stamped.columns, rows))
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    for (_, columns, rows), moment in zip(
        seen, (dt.datetime(2026, 1, 1), dt.datetime(2026, 1, 1, 0, 0, 1, 5000)), strict=True
    ):
        micros = (moment.replace(tzinfo=dt.UTC) - epoch) // dt.timedelta(microseconds=1)
        assert columns == ["k", "at", "other"]  # the existing `at` was replaced, not doubled
        assert len(rows) == 7 and all(
            (r["min_at"], r["max_at"], r["min_other"], r["max_other"])
            == (micros, micros, micros + 3_600_000_000, micros + 3_600_000_000)
            for r in rows
        )
    # The first run may compile (the cache may not hold this plan yet); the second must not.
    assert seen[1][0] == 0, f"the second run compiled {seen[1][0]} new class(es)"


def test_a_text_table_is_held_in_the_plan_and_keeps_every_character(spark):
    rows = [("file:///a/it's \\ 'q' \"d\"\n ä %20+.parquet", "2024-01-01-00"), ("s3a://b/k", None)]
    table = text_table(spark, ["uri", "partition"], rows)
    assert [tuple(r) for r in table.collect()] == rows
    assert table._jdf.queryExecution().optimizedPlan().getClass().getSimpleName() == "LocalRelation"
    # What it replaces: a list handed to createDataFrame is an RDD, which a broadcast must collect with a job.
    listed = spark.createDataFrame(rows, "uri string, partition string")
    assert listed._jdf.queryExecution().optimizedPlan().getClass().getSimpleName() == "LogicalRDD"
    assert text_table(spark, ["uri"], []).columns == ["uri"]
