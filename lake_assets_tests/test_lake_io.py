"""Replacing partitions of a lake table: exactly the run's partitions, nothing else."""

import pytest

from lake_assets import lake_io
from lake_assets.storage import Storage


def test_write_partitions_replaces_exactly_the_given_partitions(spark, tmp_path):
    table = f"file://{tmp_path / 't'}"
    storage = Storage()
    first = spark.createDataFrame([("a", "h1"), ("b", "h2"), ("c", "h3")], "id string, hour string")
    assert lake_io.write_partitions(first, storage, table, "hour", ["h1", "h2", "h3"]) == {"h1": 1, "h2": 1, "h3": 1}
    again = spark.createDataFrame([("d", "h2"), ("e", "h2")], "id string, hour string")
    # h2 is replaced, h3 had no rows this time and is emptied, h1 was not part of the run.
    assert lake_io.write_partitions(again, storage, table, "hour", ["h2", "h3"]) == {"h2": 2}
    rows = sorted((r["id"], r["hour"]) for r in spark.read.parquet(table).collect())
    assert rows == [("a", "h1"), ("d", "h2"), ("e", "h2")]


def test_rows_outside_the_run_partitions_are_refused(spark, tmp_path):
    table = f"file://{tmp_path / 't'}"
    frame = spark.createDataFrame([("a", "h1"), ("b", "h9")], "id string, hour string")
    with pytest.raises(ValueError, match="'h9' do not belong"):
        lake_io.write_partitions(frame, Storage(), table, "hour", ["h1"])
    nulls = spark.createDataFrame([("a", None)], "id string, hour string")
    with pytest.raises(ValueError, match="'None' do not belong"):
        lake_io.write_partitions(nulls, Storage(), table, "hour", ["h1"])
