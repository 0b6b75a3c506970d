"""Side-by-side figures on the same generated Unit landing data, in one process and one run.

Every figure is a ratio of two timings taken here, interleaved where it matters, so a noisy
machine shifts both sides alike:

* `full_vs_floor`: a single-run Dagster backfill of 7 days (catalog, changes, current, history)
  / plain Spark reading the same landing files and writing them once as Parquet. Beside it,
  `full_vs_handwritten`: the same backfill / a short hand-written PySpark job writing the same
  three tables (`handwritten_spark`), and that job's own multiple of the floor.
* `dagster_overhead`: that Dagster backfill of 168 hourly partitions / the same pipeline calls
  (`lake_assets.pipeline`) made directly.
* `incremental_growth`: folding one more hour into 30 days of history / into 1 day.
* `incremental_vs_duckdb`: folding one more hour into 30 days / DuckDB recomputing current and
  history from all 30 days (what a single-machine user writes by hand). Both incremental
  figures are medians after one unmeasured warm-up run of each side.
* `sensor_scaling`: one landing-sensor tick over 100k landed files / over 1k.
* `cli_noop`: seconds of a whole `lake-assets run` command (a new process) on the 30-day lake
  with nothing new: it must start no Spark session and no Dagster run.
* `cli_one_hour`: `lake-assets run` (in this process, so on the warm Spark session) after one
  new hour landed on the 30-day lake / the same size of hour folded by the pipeline calls
  directly (interleaved samples, medians after a warm-up of each).
* peak driver memory (the Spark driver JVM's peak RSS) while folding an hour into 1 and 30 days.
* correctness: `current` and `history` equal DuckDB's reference row for row.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dagster as dg
from pyspark.sql import SparkSession

from benchmarks import duckdb_reference, handwritten_spark
from benchmarks.unit_landing import LandingShape, write_listing_only_landing, write_unit_landing
from lake_assets import pipeline
from lake_assets.catalog.parquet_store import ParquetCatalogStore
from lake_assets.config import FeedConfig, LakeConfig, SparkConfig, dump_config
from lake_assets.engine.state import TableState
from lake_assets.feeds import format_for
from lake_assets.feeds.base import hour_key
from lake_assets.orchestration.definitions import build_definitions, feed_job_name
from lake_assets.orchestration.resources import LakeResource
from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
from lake_assets.paths import LakeLayout
from lake_assets.runner import run_feeds
from lake_assets.storage import Storage
from lake_assets_tests.spark_servers import StandaloneCluster

FEED, TABLE = "bench", "events"
#: the quick size (`--quick`), also the size of the cluster figure at every size
QUICK = {"keys": 5_000, "rate": 1_000}
PAYLOAD = ["name", "status", "amount", "note"]
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
GOALS = {
    "full_vs_floor": 4.0,
    "full_vs_handwritten": 1.0,
    "dagster_overhead": 1.05,
    "incremental_growth": 1.1,
    "incremental_vs_duckdb": 0.15,
    "sensor_scaling": 1.2,
    "cli_noop": 3.0,
    "cli_one_hour": 1.3,
}


def against_goals(figures: dict[str, float], goals: dict[str, float]) -> dict[str, dict]:
    """Each goal as printed, and whether its figure meets it."""
    return {
        "goals": {name: f"<= {goal}" for name, goal in goals.items()},
        "met": {name: figures[name] <= goal for name, goal in goals.items()},
    }


def hour_keys(first: int, count: int) -> list[str]:
    return [hour_key(START + dt.timedelta(hours=h)) for h in range(first, first + count)]


def landed_hours(feed: FeedConfig) -> list[str]:
    """Every hour folder with files: the generator's disorder puts an hour's late rows in the
    next hour's folder, so data of N hours spans N + 1 folders."""
    return format_for(feed).partition_keys(Storage(), feed.landing, TABLE)


def feed_config(landing: Path, **extra) -> FeedConfig:
    return FeedConfig(
        name=FEED,
        format="unit_cdc",
        landing=f"file://{landing}",
        tables=(TABLE,),
        start=hour_key(START),
        **extra,
    )


def _work(feed: FeedConfig, lake: Path, run_id: str) -> pipeline.TableWork:
    storage = Storage()
    layout = LakeLayout(f"file://{lake}")
    fmt = format_for(feed)
    return pipeline.TableWork(
        feed, fmt, TABLE, storage, layout, ParquetCatalogStore(layout.catalog(), storage), run_id
    )


@contextlib.contextmanager
def _timed(timings: dict[str, float] | None, stage: str):
    started = time.perf_counter()
    yield
    if timings is not None:
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - started


def run_pipeline(
    spark: SparkSession,
    feed: FeedConfig,
    lake: Path,
    partitions: list[str],
    run_id: str,
    timings: dict[str, float] | None = None,
) -> dict:
    """What one run of the table's assets does, called directly: catalogue, ingest, store the
    change log, fold, check. `timings` (if given) gets the seconds of each step."""
    work = _work(feed, lake, run_id)
    with _timed(timings, "catalogue"):
        pipeline.catalogue_landing(work, partitions)
    with _timed(timings, "ingest"):
        ingested = pipeline.ingest(spark, work, partitions)
    changes = work.layout.table("changes", FEED, TABLE)
    with _timed(timings, "store changes"):
        pipeline.store_partitions(
            work.storage,
            work.store,
            changes,
            ingested.batch.events,
            work.fmt.partition_column,
            partitions,
            feed=FEED,
            table=TABLE,
            run_id=work.run_id,
            keys=work.fmt.table_spec(TABLE).keys,
            state=TableState(work.layout, FEED, TABLE),
        )
        pipeline.record_stored(work, partitions, ingested)
    with _timed(timings, "fold"):
        # What the IO manager hands the state step of the same run: the stored batch, in memory.
        batch = ingested.batch.events
        assert batch is not None, "every benchmark hour lands events"
        report = pipeline.fold_into_state(spark, work, batch, partitions=partitions)
    with _timed(timings, "check"):
        outcomes = pipeline.check_fold(spark, work, batch, report, partitions=partitions)
        batch.unpersist()
    assert all(o.passed for o in outcomes), [o.description for o in outcomes if not o.passed]
    with _timed(timings, "record processed"):
        pipeline.record_processed(work, partitions, work.run_id)
    return {"events": ingested.batch.events_out, "keys_touched": report.keys_touched}


def _floor(spark: SparkSession, landing: Path, out: Path) -> float:
    """Plain Spark: read every landed file once and write it once."""
    started = time.perf_counter()
    spark.read.option("recursiveFileLookup", "true").parquet(str(landing / TABLE)).write.mode(
        "overwrite"
    ).parquet(str(out))
    return time.perf_counter() - started


def _dagster_backfill(feed: FeedConfig, lake: Path, partitions: list[str]) -> float:
    defs = build_definitions(LakeConfig(lake=f"file://{lake}", feeds=(feed,)))
    job = defs.resolve_job_def(feed_job_name(FEED))
    # Each sample's instance is disposed of here: one left to the garbage collector has its
    # SQLite connections closed from whichever thread collects it, and SQLAlchemy prints a
    # traceback for each.
    started = time.perf_counter()
    with dg.DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(
            instance=instance, tags={RANGE_START_TAG: partitions[0], RANGE_END_TAG: partitions[-1]}
        )
        elapsed = time.perf_counter() - started
    assert result.success, "the benchmark's Dagster backfill failed"
    return elapsed


def _jvm_peak_rss_mb(spark: SparkSession, reset: bool = False) -> float:
    """Peak resident memory of the driver JVM (local mode: the executors live in it too)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "the benchmarks run a classic (JVM) session"
    pid = jvm.java.lang.ProcessHandle.current().pid()
    if reset:  # writing 5 to clear_refs restarts the peak (VmHWM) from the current size
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def full_backfill(spark: SparkSession, root: Path, shape: LandingShape, rounds: int) -> dict:
    landing = root / "landing7"
    stats = write_unit_landing(landing, TABLE, shape)
    feed = feed_config(landing)
    partitions = landed_hours(feed)
    _floor(spark, landing, root / "warm-up")  # JVM and page-cache warm-up, not measured
    timings: dict[str, list[float]] = {"floor": [], "engine": [], "dagster": [], "handwritten": []}
    # Rounds interleave the four so machine noise and warm-up fall on all of them; best of each.
    # The floor, a tenth of the others' time, swings by half from run to run (GC, page cache):
    # it is measured at both ends of a round, so its best is steadier (and never flatters us).
    for attempt in range(rounds):
        timings["floor"].append(_floor(spark, landing, root / f"floor-{attempt}"))
        started = time.perf_counter()
        run_pipeline(spark, feed, root / f"lake-engine-{attempt}", partitions, "bench-engine")
        timings["engine"].append(time.perf_counter() - started)
        timings["dagster"].append(_dagster_backfill(feed, root / f"lake-dagster-{attempt}", partitions))
        timings["handwritten"].append(
            handwritten_spark.backfill(spark, landing, TABLE, root / f"lake-handwritten-{attempt}", FEED)
        )
        timings["floor"].append(_floor(spark, landing, root / f"floor-{attempt}-again"))
    floor, engine, dagster, handwritten = (
        min(timings[k]) for k in ("floor", "engine", "dagster", "handwritten")
    )
    reference = root / "duckdb7"
    duckdb_reference.recompute(landing, TABLE, reference)
    correct = duckdb_reference.compare_with_lake(reference, root / "lake-dagster-0", FEED, TABLE, PAYLOAD)
    handwritten_correct = duckdb_reference.compare_with_lake(
        reference, root / "lake-handwritten-0", FEED, TABLE, PAYLOAD
    )
    return {
        "landing_rows": stats.rows,
        "landing_files": stats.files,
        "hours": shape.hours,
        "partitions": len(partitions),
        "rounds": rounds,
        "seconds": {k: [round(v, 2) for v in vs] for k, vs in timings.items()},
        "floor_seconds": round(floor, 2),
        "engine_seconds": round(engine, 2),
        "dagster_seconds": round(dagster, 2),
        "handwritten_seconds": round(handwritten, 2),
        "full_vs_floor": round(dagster / floor, 3),
        "dagster_overhead": round(dagster / engine, 3),
        "full_vs_handwritten": round(dagster / handwritten, 3),
        "handwritten_vs_floor": round(handwritten / floor, 3),
        "correct_vs_duckdb": correct,
        "handwritten_correct_vs_duckdb": handwritten_correct,
    }


def _built_lake(spark: SparkSession, root: Path, shape: LandingShape, days: int) -> tuple[FeedConfig, float]:
    """A landing of `days` days under `root`, the lake built from it in one run (`lake<days>d`),
    and the seconds the run took (the landing's writing not counted)."""
    landing = root / f"landing{days}d"
    write_unit_landing(landing, TABLE, LandingShape(**{**shape.__dict__, "hours": 24 * days}))
    feed = feed_config(landing)
    started = time.perf_counter()
    run_pipeline(spark, feed, root / f"lake{days}d", landed_hours(feed), f"bench-build-{days}d")
    return feed, time.perf_counter() - started


def incremental(
    spark: SparkSession, root: Path, shape: LandingShape, samples: int, warm_ups: int = 1
) -> dict:
    """Fold one more hour into 1 and 30 days of history, and DuckDB's recompute of 30 days.

    Each side first gets `warm_ups` unmeasured runs (reported, not counted): the first hourly
    fold after a build runs code the build never did, so the JVM is still compiling it. The
    figure is the steady state of a long-lived driver; the warm-up times show the first run."""
    results: dict[int, dict[str, Any]] = {}
    feeds: dict[int, FeedConfig] = {}
    for days in (1, 30):
        feeds[days], build_seconds = _built_lake(spark, root, shape, days)
        results[days] = {
            "history_hours": 24 * days,
            "build_seconds": round(build_seconds, 2),
            "warm_up_seconds": [],
            "fold_one_hour_seconds": [],
            "peak_driver_rss_mb": 0.0,
        }
    # Interleaved, so JVM warm-up and machine noise fall on both sides alike.
    for sample in range(warm_ups + samples):
        for days in (1, 30):
            hour = 24 * days + sample
            write_unit_landing(
                root / f"landing{days}d",
                TABLE,
                LandingShape(**{**shape.__dict__, "hours": 1}),
                first_hour=hour,
            )
            _jvm_peak_rss_mb(spark, reset=True)
            started = time.perf_counter()
            # The new hour's folder, and the next one, which holds the hour's late rows.
            run_pipeline(
                spark, feeds[days], root / f"lake{days}d", hour_keys(hour, 2), f"bench-hour-{sample}"
            )
            seconds = round(time.perf_counter() - started, 3)
            results[days]["warm_up_seconds" if sample < warm_ups else "fold_one_hour_seconds"].append(seconds)
            results[days]["peak_driver_rss_mb"] = max(
                results[days]["peak_driver_rss_mb"], _jvm_peak_rss_mb(spark)
            )
    for entry in results.values():
        entry["fold_one_hour_median"] = round(statistics.median(entry["fold_one_hour_seconds"]), 3)

    duck_seconds = []
    for attempt in range(warm_ups + samples):
        started = time.perf_counter()
        duckdb_reference.recompute(root / "landing30d", TABLE, root / f"duckdb30-{attempt}")
        duck_seconds.append(time.perf_counter() - started)
    duck = statistics.median(duck_seconds[warm_ups:])
    correct = duckdb_reference.compare_with_lake(root / "duckdb30-0", root / "lake30d", FEED, TABLE, PAYLOAD)
    one_day, thirty_days = results[1]["fold_one_hour_median"], results[30]["fold_one_hour_median"]
    return {
        "1d": results[1],
        "30d": results[30],
        "duckdb_recompute_30d_seconds": round(duck, 3),
        "duckdb_warm_up_seconds": [round(v, 3) for v in duck_seconds[:warm_ups]],
        "incremental_growth": round(thirty_days / one_day, 3),
        "incremental_vs_duckdb": round(thirty_days / duck, 3),
        "correct_vs_duckdb": correct,
    }


def cli_runs(spark: SparkSession, root: Path, shape: LandingShape, samples: int, warm_ups: int = 1) -> dict:
    """`lake-assets run` on the 30-day lake `incremental` left (every hour processed): with
    nothing new, as a command of its own; and after one new hour, against the pipeline calls
    folding a new hour of the same size, alternating hours between the two sides. Measured on
    its own (`--only cli`), it builds that lake first."""
    landing, lake = root / "landing30d", root / "lake30d"
    if not lake.exists():
        _built_lake(spark, root, shape, 30)
    config = LakeConfig(lake=f"file://{lake}", feeds=(feed_config(landing),))
    config_file = root / "cli.yaml"
    config_file.write_text(dump_config(config))
    noop = []
    for _ in range(3):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "lake_assets.cli", "run", "--config", str(config_file)],
            capture_output=True,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"},
            check=False,
        )
        noop.append(round(time.perf_counter() - started, 3))
        assert done.returncode == 0 and "nothing changed" in done.stdout, done.stdout + done.stderr
    first_hour = 24 * 30 + 100  # after the hours `incremental` folded
    sides: dict[str, list[float]] = {"cli": [], "pipeline": []}
    for sample in range(warm_ups + samples):
        for offset, side in enumerate(sides):
            hour = first_hour + 2 * sample + offset
            write_unit_landing(
                landing, TABLE, LandingShape(**{**shape.__dict__, "hours": 1}), first_hour=hour
            )
            started = time.perf_counter()
            if side == "cli":
                with dg.DagsterInstance.ephemeral() as instance:  # disposed of as in `_dagster_backfill`
                    run_ids = run_feeds(config, instance=instance, say=lambda _: None)
                    elapsed = time.perf_counter() - started
                assert len(run_ids) == 1, "one new hour should be one run"
            else:
                run_pipeline(spark, config.feeds[0], lake, hour_keys(hour, 2), f"bench-cli-{sample}")
                elapsed = time.perf_counter() - started
            if sample >= warm_ups:
                sides[side].append(round(elapsed, 3))
    cli, direct = statistics.median(sides["cli"]), statistics.median(sides["pipeline"])
    return {
        "noop_seconds": noop,
        "one_hour_cli_seconds": sides["cli"],
        "one_hour_pipeline_seconds": sides["pipeline"],
        "cli_noop": statistics.median(noop),
        "cli_one_hour": round(cli / direct, 3),
    }


def cluster_vs_local(root: Path, samples: int = 2) -> dict:
    """The quick 7-day backfill as a user runs it (`lake-assets run`, a process of its own) on a
    standalone cluster (a master and one 2-core worker on 127.0.0.1, executors in their own
    JVMs) against the embedded local driver, alternating sides. On one machine the cluster
    cannot win (same cores, more processes, task results over the network): the figure is
    context, and it makes the benchmark exercise the distributed path."""
    shape = LandingShape(keys=QUICK["keys"], events_per_hour=QUICK["rate"], hours=168, start=START)
    landing = root / "landing-cluster"
    write_unit_landing(landing, TABLE, shape)
    cluster = StandaloneCluster(root / "standalone", worker_memory="6g").start()
    sides: dict[str, list[float]] = {"local": [], "cluster": []}
    try:
        for sample in range(samples):
            for side in sides:
                spark = (
                    SparkConfig(master=cluster.master_url, conf=cluster.spark_conf(sys.executable))
                    if side == "cluster"
                    else SparkConfig()
                )
                config = LakeConfig(
                    lake=f"file://{root / f'lake-{side}-{sample}'}",
                    feeds=(feed_config(landing),),
                    spark=spark,
                )
                config_file = root / f"{side}-{sample}.yaml"
                config_file.write_text(dump_config(config))
                started = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-m", "lake_assets.cli", "run", "--config", str(config_file)],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
                    check=False,
                )
                sides[side].append(round(time.perf_counter() - started, 3))
                assert done.returncode == 0, done.stdout + done.stderr
    finally:
        cluster.stop()
    return {
        "local_seconds": sides["local"],
        "cluster_seconds": sides["cluster"],
        "cluster_vs_local": round(statistics.median(sides["cluster"]) / statistics.median(sides["local"]), 3),
    }


def sensor_scaling(root: Path, files_per_hour: int = 10) -> dict:
    """A steady-state tick (the sensor has seen everything, one new hour lands) over a landing
    area holding 1k files and one holding 100k: the tick should cost the window, not the area."""
    timings = {}
    for total in (1_000, 100_000):
        landing = root / f"sensor{total}"
        hours = total // files_per_hour
        write_listing_only_landing(landing, TABLE, hours, files_per_hour, start=START)
        feed = feed_config(landing)
        defs = build_definitions(LakeConfig(lake=f"file://{root / 'sensor-lake'}", feeds=(feed,)))
        sensor = defs.resolve_sensor_def(f"{FEED}_landing_sensor")
        resources = {"lake": LakeResource(root=f"file://{root / 'sensor-lake'}")}
        started = time.perf_counter()
        with dg.build_sensor_context(resources=resources, definitions=defs) as context:
            first = sensor(context)
        assert isinstance(first, dg.SensorResult), first
        first_tick = time.perf_counter() - started
        write_listing_only_landing(landing, TABLE, 1, files_per_hour, start=START + dt.timedelta(hours=hours))
        ticks = []
        for _ in range(3):
            started = time.perf_counter()
            with dg.build_sensor_context(
                resources=resources, definitions=defs, cursor=first.cursor
            ) as context:
                result = sensor(context)
            assert isinstance(result, dg.SensorResult), result
            ticks.append(time.perf_counter() - started)
            assert len(result.run_requests or ()) == 1, (
                "the benchmark's sensor tick should request the new hour"
            )
        timings[total] = {
            "first_tick_seconds": round(first_tick, 3),
            "tick_seconds": round(statistics.median(ticks), 4),
        }
    return {
        "1k": timings[1_000],
        "100k": timings[100_000],
        "sensor_scaling": round(timings[100_000]["tick_seconds"] / timings[1_000]["tick_seconds"], 3),
    }


#: the benchmark's parts by name, for measuring one on its own (`./dev bench --only NAME`)
PARTS = {
    "full_backfill": lambda spark, root, shape, samples: full_backfill(spark, root, shape, rounds=3),
    "incremental": incremental,
    "cli": cli_runs,
    "sensor": lambda spark, root, shape, samples: sensor_scaling(root),
    "cluster": lambda spark, root, shape, samples: cluster_vs_local(root),
}


def run_part(
    name: str, spark: SparkSession, *, keys: int, rate: int, samples: int, workdir: Path | None = None
) -> dict:
    """One part's figures and timings, as `run` reports them under that part's name."""
    shape = LandingShape(keys=keys, events_per_hour=rate, hours=168, start=START)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        return {"keys": keys, "events_per_hour": rate, name: PARTS[name](spark, Path(tmp), shape, samples)}


def run(spark: SparkSession, *, keys: int, rate: int, samples: int, workdir: Path | None = None) -> dict:
    shape = LandingShape(keys=keys, events_per_hour=rate, hours=168, start=START)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        root = Path(tmp)
        full, inc, cli, sensor, cluster = (PARTS[name](spark, root, shape, samples) for name in PARTS)
    figures = {
        "full_vs_floor": full["full_vs_floor"],
        "full_vs_handwritten": full["full_vs_handwritten"],
        "dagster_overhead": full["dagster_overhead"],
        "incremental_growth": inc["incremental_growth"],
        "incremental_vs_duckdb": inc["incremental_vs_duckdb"],
        "sensor_scaling": sensor["sensor_scaling"],
        "cli_noop": cli["cli_noop"],
        "cli_one_hour": cli["cli_one_hour"],
    }
    return {
        "keys": keys,
        "events_per_hour": rate,
        "figures": figures,
        # no goal of their own: where hand-written Spark stands against the floor, and the cluster
        "context": {
            "handwritten_vs_floor": full["handwritten_vs_floor"],
            "cluster_vs_local": cluster["cluster_vs_local"],
        },
        **against_goals(figures, GOALS),
        "peak_driver_rss_mb": {
            "1d": inc["1d"]["peak_driver_rss_mb"],
            "30d": inc["30d"]["peak_driver_rss_mb"],
        },
        "correct": bool(full["correct_vs_duckdb"]["equal"] and inc["correct_vs_duckdb"]["equal"]),
        "handwritten_correct": bool(full["handwritten_correct_vs_duckdb"]["equal"]),
        "full_backfill_7d": full,
        "incremental": inc,
        "sensor": sensor,
        "cli": cli,
        "cluster": cluster,
    }
