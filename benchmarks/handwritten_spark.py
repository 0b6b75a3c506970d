"""The hand-written PySpark alternative to a full backfill: the three tables of a Unit table in
one short job, the way a data engineer would write it for a one-off load.

It reads every landed file once (the hour from the Hive folders, as Spark discovers them),
collapses identical re-deliveries within their hour, writes the change log by hour, keeps the
last write of each version and writes history and current from one window per key. It has none of the rest: no
catalog, no vetting or quarantine of bad files, no reconciliation or checks read back, no commit
protocol, no state for the next hour, no schema drift. It is the lower bound of what any Spark
backfill that writes this lake layout costs, and so says how far from it `full_vs_floor`'s
goal lies. Its current and history are compared with DuckDB's like the lake's; it shares no code
with the engine.
"""

from __future__ import annotations

import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

KEY = "id"
OPERATIONS = {
    "INSERT": "insert",
    "I": "insert",
    "UPDATE": "update",
    "U": "update",
    "DELETE": "delete",
    "D": "delete",
}
END_OF_TIME = "9999-12-31 23:59:59.999"
LEVELS = ("year", "month", "day", "hour")


def _events(spark: SparkSession, table_dir: Path) -> DataFrame:
    landed = spark.read.option("basePath", str(table_dir)).parquet(str(table_dir))
    payload = [c for c in landed.columns if c not in (KEY, *LEVELS) and not c.startswith("cdc_")]
    op = F.upper(F.trim("cdc_operation_type"))
    return landed.select(
        KEY,
        *payload,
        F.coalesce(*[F.when(op == spelling, F.lit(name)) for spelling, name in OPERATIONS.items()]).alias(
            "_op"
        ),
        F.date_trunc("millisecond", F.col("cdc_commit_timestamp")).alias("_version_at"),
        F.col("cdc_change_seq").cast("long").alias("_seq"),
        F.concat_ws("-", *[F.lpad(level, 4 if level == "year" else 2, "0") for level in LEVELS]).alias(
            "hour"
        ),
    )


def backfill(spark: SparkSession, landing: Path, table: str, lake: Path, feed: str) -> float:
    """Write `<lake>/{changes,current,history}/<feed>/<table>` from every landed file of
    `table`; returns the seconds it took."""
    started = time.perf_counter()
    events = _events(spark, landing / table)
    # Re-deliveries collapse within their hour, as the lake's change log does.
    by_key = Window.partitionBy(KEY).orderBy("_version_at", "_seq", "hour")
    same_write = F.lit(True)
    for column in ("_version_at", "_seq", "hour"):
        same_write = same_write & F.lead(column).over(by_key).eqNullSafe(F.col(column))
    changes = (
        events.withColumn("__repeat", F.coalesce(same_write, F.lit(False)))
        .where("NOT __repeat")
        .drop("__repeat")
        .persist()
    )
    try:
        changes.repartition("hour").write.mode("overwrite").partitionBy("hour").parquet(
            str(lake / "changes" / feed / table)
        )
        same_version = F.coalesce(
            F.lead("_version_at").over(by_key).eqNullSafe(F.col("_version_at")), F.lit(False)
        )
        versions = (
            changes.withColumn("__superseded", same_version).where("NOT __superseded").drop("__superseded")
        )
        next_at, next_op = F.lead("_version_at").over(by_key), F.lead("_op").over(by_key)
        timeline = (
            versions.withColumns(
                {
                    "_fivetran_end": F.when(next_at.isNull(), F.to_timestamp(F.lit(END_OF_TIME)))
                    .when(next_op == "delete", next_at)
                    .otherwise(next_at - F.expr("INTERVAL 1 MILLISECOND")),
                    "_fivetran_active": next_at.isNull(),
                    "_fivetran_synced": F.current_timestamp(),
                }
            )
            .where(F.col("_op") != "delete")
            .drop("hour")
            .localCheckpoint()
        )
        timeline.withColumnRenamed("_version_at", "_fivetran_start").write.mode("overwrite").parquet(
            str(lake / "history" / feed / table)
        )
        timeline.where("_fivetran_active").drop("_fivetran_end", "_fivetran_active").write.mode(
            "overwrite"
        ).parquet(str(lake / "current" / feed / table))
    finally:
        changes.unpersist()
    return time.perf_counter() - started
