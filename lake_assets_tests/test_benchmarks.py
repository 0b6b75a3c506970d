"""The benchmark's own parts: its generator, its DuckDB reference and its event-log reader.

The figures in the README rest on these: the same landing for the same shape, a reference that
agrees with the engine on untidy data, and profiles that read Spark's event log correctly."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from benchmarks import duckdb_reference, handwritten_spark
from benchmarks import side_by_side as sb
from benchmarks.profile import event_log_files, sql_executions
from benchmarks.unit_landing import LandingShape, write_unit_landing

SHAPE = LandingShape(
    keys=300, events_per_hour=400, hours=4, start=sb.START, duplicate_rate=0.05, delete_rate=0.1
)


def _rows(landing, table="events") -> list[tuple]:
    rows = [
        (str(path.relative_to(landing).parent), *row.values())
        for path in sorted((landing / table).rglob("*.parquet"))
        for row in pq.read_table(path).to_pylist()
    ]
    return sorted(rows, key=repr)  # deletes carry NULL fields


def test_hours_written_together_or_one_by_one_are_the_same(tmp_path):
    write_unit_landing(tmp_path / "together", "events", SHAPE)
    for hour in range(SHAPE.hours):
        one = LandingShape(**{**SHAPE.__dict__, "hours": 1})
        write_unit_landing(tmp_path / "apart", "events", one, first_hour=hour)
    together = _rows(tmp_path / "together")
    assert together == _rows(tmp_path / "apart")
    ops = {row[6] for row in together}
    assert ops == {"INSERT", "UPDATE", "DELETE"}


def test_the_engine_and_the_duckdb_reference_agree_on_untidy_data(spark, tmp_path):
    landing = tmp_path / "landing"
    write_unit_landing(landing, sb.TABLE, SHAPE)
    feed = sb.feed_config(landing)
    sb.run_pipeline(spark, feed, tmp_path / "lake", sb.landed_hours(feed)[:2], "first-half")
    sb.run_pipeline(spark, feed, tmp_path / "lake", sb.landed_hours(feed)[2:], "second-half")
    duckdb_reference.recompute(landing, sb.TABLE, tmp_path / "reference")
    result = duckdb_reference.compare_with_lake(
        tmp_path / "reference", tmp_path / "lake", sb.FEED, sb.TABLE, sb.PAYLOAD
    )
    assert result["equal"], result


def test_the_profile_reads_sql_executions_from_a_rolling_event_log(tmp_path):
    app = "local-1700000000000"
    folder = tmp_path / f"eventlog_v2_{app}"
    folder.mkdir()
    (folder / f"appstatus_{app}").write_text("")
    (folder / f".appstatus_{app}.crc").write_text("crc")
    first = [
        {
            "Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart",
            "executionId": 1,
            "time": 1000,
            "description": "collect at /work/lake_assets/engine/fold.py:134",
            "physicalPlanDescription": "== Physical Plan ==\nAdaptiveSparkPlan (3)\n+- HashAggregate (2)\n   +- Scan parquet  (1)\n",
        },
        {
            "Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart",
            "executionId": 3,
            "time": 1600,
            "description": "parquet at NativeMethodAccessorImpl.java:0",
            "physicalPlanDescription": "== Physical Plan ==\nExecute InsertIntoHadoopFsRelationCommand (2)\n+- Scan parquet  (1)\n\n"
            "(2) Execute InsertIntoHadoopFsRelationCommand\nInput: []\n"
            "Arguments: file:/lake/_staging/bench/events/f1/closed, false, Parquet, Overwrite\n",
        },
        {
            "Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd",
            "executionId": 3,
            "time": 2600,
        },
        {
            "Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart",
            "executionId": 2,
            "time": 1500,
            "description": "count at NativeMethodAccessorImpl.java:0",
            "physicalPlanDescription": "== Physical Plan ==\nAdaptiveSparkPlan (4)\n+- HashAggregate (3)\n   +- Exchange (2)\n      +- Window (1)\n",
        },
    ]
    second = [
        {
            "Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd",
            "executionId": 2,
            "time": 4000,
        },
        {
            "Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd",
            "executionId": 1,
            "time": 1250,
        },
    ]
    (folder / f"events_2_{app}").write_text("\n".join(json.dumps(e) for e in second))
    (folder / f"events_1_{app}").write_text(
        "\n".join(json.dumps(e) for e in first) + '\n{"Event": "half a li'
    )

    logs = event_log_files(tmp_path, app)
    assert [p.name for p in logs] == [f"events_1_{app}", f"events_2_{app}"]
    executions = sql_executions(logs)
    assert [(e["seconds"], e["what"]) for e in executions] == [
        (0.25, "collect at /work/lake_assets/engine/fold.py:134"),
        (2.5, "count: AdaptiveSparkPlan < HashAggregate < Exchange < Window"),
        (1.0, "write …/bench/events/f1/closed"),
    ]


def test_the_handwritten_spark_backfill_agrees_with_the_duckdb_reference(spark, tmp_path):
    """The hand-written baseline is only a fair comparison if it computes the same tables."""
    landing = tmp_path / "landing"
    write_unit_landing(landing, sb.TABLE, SHAPE)
    seconds = handwritten_spark.backfill(spark, landing, sb.TABLE, tmp_path / "lake", sb.FEED)
    duckdb_reference.recompute(landing, sb.TABLE, tmp_path / "reference")
    result = duckdb_reference.compare_with_lake(
        tmp_path / "reference", tmp_path / "lake", sb.FEED, sb.TABLE, sb.PAYLOAD
    )
    assert result["equal"] and result["history"]["rows"] > 0, result
    hours = sorted(
        p.name for p in (tmp_path / "lake" / "changes" / sb.FEED / sb.TABLE).iterdir() if p.is_dir()
    )
    assert hours == [f"hour={key}" for key in sb.landed_hours(sb.feed_config(landing))] and seconds > 0
