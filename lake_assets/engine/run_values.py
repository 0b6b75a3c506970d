"""Values that change every run (when the batch was read, when a fold synced) as columns.

The obvious `withColumn(name, F.lit(now))` costs more than it seems. Spark writes a timestamp
literal into the Java source it generates for a stage (as a number, where a string would be
passed by reference), and caches compiled stages by their source text. A value that differs
every run therefore makes every run generate and compile those stages again, and the JVM runs
the new classes in its interpreter until it has JIT-compiled them once more, in every warm hourly
run (docs/profiling.md, "Figures behind the code"). Joined in from a one-row table, the value is
data: the stage's code is the same every run and stays compiled.

Small tables of text built on the driver (`text_table`) are inline tables for the same family of
reasons: `createDataFrame` of a Python list makes an RDD, and broadcasting it costs a Spark job.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lake_assets.engine.names import quoted


def with_run_values(frame: DataFrame, values: dict[str, dt.datetime]) -> DataFrame:
    """`frame` with a column per entry of `values`, the same value on every row.

    A column of that name already in `frame` is replaced. Rows, partitioning and order are the
    frame's own: the one-row side is broadcast, so nothing is shuffled.
    """
    spark: SparkSession = frame.sparkSession
    names = list(values)
    params = {f"v{index}": values[name] for index, name in enumerate(names)}
    columns = ", ".join(quoted(name) for name in names)
    # An inline table becomes a local relation: its rows are data, never folded into a literal.
    one_row = spark.sql(
        f"SELECT * FROM VALUES ({', '.join(':' + p for p in params)}) AS run({columns})",  # noqa: S608 - quoted names, bound values
        args=params,
    )
    return frame.drop(*names).crossJoin(F.broadcast(one_row))


def text_table(spark: SparkSession, columns: list[str], rows: list[tuple[str | None, ...]]) -> DataFrame:
    """A small table of text values held in the query plan (a local relation).

    `spark.createDataFrame` of a list is an RDD: a join with it runs a job to broadcast it, a
    noticeable share of an hourly read (docs/profiling.md, "Figures behind the code"). An inline
    table needs none. Each value is
    written as the hex of its UTF-8 bytes, so no character and no parser setting can break it.
    """

    def literal(value: str | None) -> str:
        return "CAST(NULL AS STRING)" if value is None else f"CAST(X'{value.encode().hex()}' AS STRING)"

    if not rows:
        schema = ", ".join(f"{quoted(name)} string" for name in columns)
        return spark.createDataFrame([], schema)
    values = ", ".join("(" + ", ".join(literal(v) for v in row) + ")" for row in rows)
    # Every name goes through quoted() and every value through literal().
    return spark.sql(f"SELECT * FROM VALUES {values} AS t({', '.join(quoted(c) for c in columns)})")  # noqa: S608
