"""Spark Parquet tables in the lake: partitioned change logs and whole state tables.

Pure Spark + storage logic (no Dagster), used by the IO manager and the state assets.
"""

from __future__ import annotations

import uuid
from typing import Iterable

from pyspark.sql import DataFrame, SparkSession, functions as F, types as T

from lake_assets.paths import LakeLayout, safe_segment
from lake_assets.storage import Storage


def existing_partitions(storage: Storage, table_uri: str, column: str) -> dict[str, str]:
    """partition value -> folder URI for the Hive partition folders under a table."""
    prefix = f"{column}="
    return {
        e.name[len(prefix):]: e.uri for e in storage.list(table_uri) if e.is_dir and e.name.startswith(prefix)
    }


def read_partitions(
    spark: SparkSession, storage: Storage, table_uri: str, column: str, values: Iterable[str] | None
) -> DataFrame | None:
    """The rows of the given partitions (all when `values` is None) as one DataFrame.

    Only the requested partition folders are handed to Spark, so reading an hour of a long
    log costs the hour, not a listing of the whole log. None when no requested partition exists.
    """
    present = existing_partitions(storage, table_uri, column)
    wanted = sorted(present) if values is None else sorted(set(values) & set(present))
    if not wanted:
        return None
    return (
        spark.read.option("basePath", table_uri)
        .option("mergeSchema", "true")
        .parquet(*[present[v] for v in wanted])
    )


def write_partitions(
    df: DataFrame | None, storage: Storage, table_uri: str, column: str, values: Iterable[str]
) -> dict[str, int]:
    """Replace exactly the partitions `values` of a table with the rows of `df`.

    Partitions in `values` that `df` has no rows for are removed, so re-running a partition
    whose input shrank leaves nothing stale behind. Returns rows written per partition.
    """
    values = sorted(set(values))
    for value in values:
        safe_segment(f"{column}={value}", "partition")
    counts: dict[str, int] = {}
    if df is not None:
        stray = df.where(~F.col(column).isin(values) | F.col(column).isNull()).limit(1).collect()
        if stray:
            raise ValueError(
                f"rows for partition {stray[0][column]!r} do not belong to the partitions being written {values[:3]}…"
            )
        counts = {r[column]: r["n"] for r in df.groupBy(column).agg(F.count(F.lit(1)).alias("n")).collect()}
        if counts:
            # Dynamic overwrite: Spark replaces only the partition folders present in df.
            (
                df.repartition(F.col(column))
                .write.mode("overwrite")
                .option("partitionOverwriteMode", "dynamic")
                .partitionBy(column)
                .parquet(table_uri)
            )
    for value in values:
        if value not in counts:
            storage.delete_tree(f"{table_uri}/{column}={value}")
    return counts


def replace_table(df: DataFrame, storage: Storage, layout: LakeLayout, feed: str, table: str, layer: str) -> str:
    """Write a whole table to staging, then swap it in place of the previous version."""
    target = layout.table(layer, feed, table)
    staging = f"{layout.staging(feed, table, uuid.uuid4().hex)}/{safe_segment(layer)}"
    df.write.mode("overwrite").parquet(staging)
    storage.delete_tree(target)
    storage.move_tree(staging, target)
    storage.delete_tree(staging.rsplit("/", 1)[0])
    return target


def read_table(spark: SparkSession, storage: Storage, table_uri: str) -> DataFrame | None:
    if not storage.exists(table_uri):
        return None
    return spark.read.option("mergeSchema", "true").parquet(table_uri)


def schema_metadata(schema: T.StructType) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]
