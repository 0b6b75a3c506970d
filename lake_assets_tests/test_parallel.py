"""Spark actions submitted together: results in order, every action finishes, the first
failure is raised, and a cached frame that several of them read is computed once."""

import threading
import time

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets.engine.parallel import run_together


def test_results_come_back_in_the_order_of_the_actions():
    assert run_together(lambda: 1, lambda: "two", lambda: [3]) == [1, "two", [3]]
    assert run_together(lambda: "alone") == ["alone"]


def test_every_action_runs_to_its_end_before_the_first_failure_is_raised():
    finished = []

    def slow_success():
        time.sleep(0.2)
        finished.append("slow")

    def first_failure():
        raise ValueError("first")

    def second_failure():
        time.sleep(0.1)
        raise KeyError("second")

    with pytest.raises(ValueError, match="first"):
        run_together(first_failure, slow_success, second_failure)
    assert finished == ["slow"]


def test_actions_run_side_by_side():
    both_started = threading.Barrier(2, timeout=5)
    # Each action waits for the other to start: run one after another, this would time out.
    assert run_together(lambda: both_started.wait() >= 0, lambda: both_started.wait() >= 0) == [True, True]


def test_a_cached_frame_read_by_concurrent_writes_is_computed_once(spark, tmp_path):
    calls = spark.sparkContext.accumulator(0)

    def counted(value):
        calls.add(1)
        return value

    counted_udf = F.udf(counted, T.LongType())
    frame = spark.range(0, 2000, numPartitions=4).select(counted_udf("id").alias("v")).persist()
    try:
        _evens, _odds, total = run_together(
            lambda: frame.where("v % 2 = 0").write.parquet(str(tmp_path / "evens")),
            lambda: frame.where("v % 2 = 1").write.parquet(str(tmp_path / "odds")),
            lambda: frame.agg(F.sum("v")).collect()[0][0],
        )
    finally:
        frame.unpersist()
    assert total == sum(range(2000))
    assert spark.read.parquet(str(tmp_path / "evens")).count() == 1000
    assert spark.read.parquet(str(tmp_path / "odds")).count() == 1000
    assert calls.value == 2000


def test_each_action_runs_with_the_callers_session_active(spark):
    def active_session_is_callers():
        active = spark._jvm.SparkSession.getActiveSession()
        return active.isDefined() and active.get().equals(spark._jsparkSession)

    # Without it, a query built in the thread is analysed with Spark's defaults, not the session's.
    assert run_together(active_session_is_callers, active_session_is_callers, session=spark) == [True, True]
