"""python -m benchmarks.profile: where a run's time goes, from Spark's own event log.

Generates Unit landing data, runs the table's pipeline as a backfill over all of it, then folds
`--fold-hours` more hours one at a time, each with the Spark event log on. For the last backfill
(the first one only warms the JVM) and the last fold it prints the seconds of each step
(catalogue, ingest, store changes, fold, check) and the Spark SQL executions that took longest,
named by the Python line that started them (`collect at lake_assets/...`) or, where Spark knows
none (writes, counts), by the top of their physical plan. The event log stays in
`<workdir>/spark-events` for the Spark history server (`spark.history.fs.logDirectory`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import tempfile
from pathlib import Path

from benchmarks import side_by_side as sb
from benchmarks.unit_landing import LandingShape, write_unit_landing
from lake_assets import spark as spark_settings


def event_log_files(events_dir: Path, app_id: str) -> list[Path]:
    """The event log of one application: a single file, or a rolling log's `events_<n>_…` parts."""
    files = [
        p
        for p in events_dir.rglob("*")
        if p.is_file()
        and ((p.name.startswith("events_") and p.name.endswith(app_id)) or p.name.split(".")[0] == app_id)
    ]
    return sorted(files, key=lambda p: int(p.name.split("_")[1]) if p.name.startswith("events_") else 0)


def _write_target(plan: list[str]) -> str | None:
    """The folder a write execution writes to (its last path segments), from the plan details."""
    for index, row in enumerate(plan):
        if row.startswith("(") and row.endswith("InsertIntoHadoopFsRelationCommand"):
            for detail in plan[index + 1 : index + 4]:
                if detail.startswith("Arguments: "):
                    path = detail[len("Arguments: ") :].split(",")[0]
                    return "…/" + "/".join(path.rstrip("/").split("/")[-4:])
    return None


def sql_executions(event_logs: list[Path]) -> list[dict]:
    """Every SQL execution in an (uncompressed) Spark event log: start (ms), seconds, what."""
    started, done = {}, []
    for event_log in event_logs:
        for line in event_log.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # the last line of a log Spark is still writing
                continue
            kind = event["Event"]
            if kind.endswith("SQLExecutionStart"):
                plan = [
                    row.strip()
                    for row in event.get("physicalPlanDescription", "").splitlines()
                    if row.strip()
                ]
                operators = [
                    row.lstrip("+- :").split(" (")[0] for row in plan[1:8] if not row.startswith(("=", "("))
                ]
                started[event["executionId"]] = (
                    int(event["time"]),
                    event.get("description", ""),
                    operators,
                    _write_target(plan),
                )
            elif kind.endswith("SQLExecutionEnd") and event["executionId"] in started:
                begin, description, operators, target = started.pop(event["executionId"])
                if " at /" in description:  # a Python call site
                    what = description
                elif target:
                    what = f"write {target}"
                else:
                    what = f"{description.split(' at ')[0]}: " + " < ".join(operators[:5])
                done.append({"start_ms": begin, "seconds": (int(event["time"]) - begin) / 1000, "what": what})
    return sorted(done, key=lambda e: e["start_ms"])


def _report(title: str, timings: dict[str, float], executions: list[dict], top: int) -> None:
    total = sum(timings.values())
    print(f"\n{title}: {total:.2f} s")
    for step, seconds in timings.items():
        print(f"  {step:<14} {seconds:7.2f} s")
    spark_seconds = sum(e["seconds"] for e in executions)
    print(f"  {len(executions)} Spark SQL executions, {spark_seconds:.2f} s; the longest:")
    for execution in sorted(executions, key=lambda e: -e["seconds"])[:top]:
        print(f"    {execution['seconds']:6.2f} s  {execution['what'][:110]}")


def _run(
    spark, feed, lake: Path, partitions: list[str], run_id: str, events_dir: Path
) -> tuple[dict, list[dict]]:
    timings: dict[str, float] = {}
    began_ms = int(dt.datetime.now().timestamp() * 1000)
    sb.run_pipeline(spark, feed, lake, partitions, run_id, timings=timings)
    logs = event_log_files(events_dir, spark.sparkContext.applicationId)
    return timings, [e for e in sql_executions(logs) if e["start_ms"] >= began_ms]


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--rate", type=int, default=1_000, help="events an hour")
    parser.add_argument("--hours", type=int, default=168, help="hours of landing data in the backfill")
    parser.add_argument("--fold-hours", type=int, default=2, help="hours then folded one at a time")
    parser.add_argument("--top", type=int, default=8, help="how many of the longest executions to show")
    parser.add_argument("--workdir", type=Path, help="where data and event log go (default: a new temp dir)")
    args = parser.parse_args()

    root = args.workdir or Path(tempfile.mkdtemp(prefix="lake_assets_profile_"))
    events = root / "spark-events"
    events.mkdir(parents=True, exist_ok=True)
    conf = spark_settings.session_conf(app_name="lake_assets_profile")
    conf.update(
        {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false",
        }
    )
    spark = spark_settings.build_session(conf)
    spark.sparkContext.setLogLevel("ERROR")

    shape = LandingShape(keys=args.keys, events_per_hour=args.rate, hours=args.hours, start=sb.START)
    landing = root / "landing"
    stats = write_unit_landing(landing, sb.TABLE, shape)
    feed = sb.feed_config(landing)
    partitions = sb.landed_hours(feed)
    print(f"{stats.rows} landed rows in {stats.files} files, {len(partitions)} hour folders; work dir {root}")
    for attempt in ("warm-up", "measured"):
        timings, executions = _run(
            spark, feed, root / f"lake-{attempt}", partitions, f"profile-{attempt}", events
        )
    _report(f"backfill of {len(partitions)} hours", timings, executions, args.top)
    for offset in range(args.fold_hours):
        hour = args.hours + offset
        write_unit_landing(landing, sb.TABLE, LandingShape(**{**shape.__dict__, "hours": 1}), first_hour=hour)
        timings, executions = _run(
            spark, feed, root / "lake-measured", sb.hour_keys(hour, 2), f"profile-hour-{hour}", events
        )
    if args.fold_hours:
        _report(f"fold of one more hour into {args.hours} hours", timings, executions, args.top)
    print(f"\nevent log: {events}")
    spark.stop()


if __name__ == "__main__":
    main()
