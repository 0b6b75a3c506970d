"""Probes for a run's own values (`_ingested_at`, `_fivetran_synced`): what was stamped, and
whether stamping it made Spark compile new code."""

from __future__ import annotations

import datetime as dt

import dagster as dg


def classes_compiled(spark) -> int:
    """Stages Spark has generated and compiled so far (its code cache's misses)."""
    return spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()


def assert_read_during_the_runs(stamps: set, instance: dg.DagsterInstance) -> None:
    """One table's `_ingested_at` values, after one run over it: a single instant, inside the
    time the instance's runs were going."""
    records = instance.get_run_records()
    starts = [r.start_time for r in records if r.start_time is not None]
    ends = [r.end_time for r in records if r.end_time]
    assert records and len(starts) == len(ends) == len(records)
    first = min(starts)
    last = max(ends)
    assert len(stamps) == 1, f"expected one read instant, found {sorted(map(str, stamps))}"
    (stamp,) = stamps
    assert stamp is not None, "change-log rows without _ingested_at"
    when = stamp.replace(tzinfo=dt.UTC).timestamp() if stamp.tzinfo is None else stamp.timestamp()
    assert first <= when <= last, f"read at {stamp}, outside the runs ({first} to {last})"
