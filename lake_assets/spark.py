"""Spark session settings: embedded `local` by default, a cluster master or Spark Connect remote
when configured, and the s3a connector wired for S3 (or an S3-compatible endpoint such as moto).

Pure settings logic: `session_conf` returns the dict the Dagster resource hands to the builder.
Secrets are not part of it; `s3a_secret_conf` reads them from the environment at session start.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping

from lake_assets.errors import ConfigError

S3A_JAR_NAMES = ("hadoop-aws-3.3.1.jar", "aws-java-sdk-bundle-1.11.901.jar")
PYSPARK_CALL_SITES = "spark.python.sql.dataFrameDebugging.enabled"

# Sized for the 2-core / 24 GiB machines this project runs on: few shuffle partitions keep
# hourly batches from fanning out into hundreds of tiny tasks and files.
EMBEDDED_DEFAULTS: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "4g",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    # Partition folder values are the lake's keys (hours, GRAX batch ids) and always text; typed
    # by inference, a GRAX batch of digits alone ("000000123") would read back as the number 123.
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # On for a cluster's driver (its executors gain from merged and split shuffle partitions);
    # a local driver turns it off (`LOCAL_DRIVER_SQL_SETTINGS`).
    "spark.sql.adaptive.enabled": "true",
    # A fold runs ~160 generated-code classes; with Spark's default cache of 100 every hourly
    # run compiled them all again (~2.5 s a run). Cached, an hour's run compiles almost none.
    "spark.sql.codegen.cache.maxEntries": "2000",
    # Spark lists more than 32 given paths with a job of one task per path (up to 10,000): a
    # 7-day backfill hands it 504 landed files, 1.6 s of task overhead for a listing. A few
    # tasks, each listing a share of the paths, do it in a fraction of that.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    # Parquet TIMESTAMP(NANOS) (vendors write it) reaches Spark as a long; feeds convert it.
    "spark.sql.legacy.parquet.nanosAsLong": "true",
    # GRAX writes time-of-day fields (`_t`) as Parquet TIME, which Spark reads only with this.
    "spark.sql.timeType.enabled": "true",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    # On, PySpark wraps every Column function in five extra JVM round trips (look up the active
    # session, read this setting's depth, walk the Python stack, set and clear the call site) so
    # that Spark's errors can name the Python line. A fold builds hundreds of expressions: off,
    # a warm hourly run spends half the Python CPU (0.3 s against 0.55-0.6 s;
    # docs/profiling.md). Errors keep Spark's message and the lake's file and step names.
    PYSPARK_CALL_SITES: "false",
}

# The embedded driver JVM runs the tasks too. The JDK's default collector (G1) does part of
# its work in threads of its own beside the application; with two cores those threads take
# them from Spark's tasks. The parallel collector stops the tasks briefly instead and does its
# work on both cores at once. Warm hourly runs, interleaved processes: ~0.3-0.5 s and ~0.8 s of
# CPU less an hour (docs/profiling.md). A cluster's JVM options are its operator's to set.
EMBEDDED_JVM_OPTIONS = "-XX:+UseParallelGC"

# Adaptive execution runs a query as one job per exchange and plans the rest again after each.
# An hourly fold is a dozen queries over ~10k events and a ~100k-row open set: their tasks take
# tens of milliseconds, and the jobs and re-planning between them cost more than the plan they
# improve. On two cores with 4 shuffle partitions there is little to merge, and no executors
# for a skewed partition to be spread over. Off, a warm hourly run went 3.38 -> 2.97 s (12
# interleaved a side); a 7-day backfill was no slower (31.7 s against 32.7 s; docs/profiling.md).
LOCAL_DRIVER_SQL_SETTINGS: dict[str, str] = {"spark.sql.adaptive.enabled": "false"}

# hadoop-aws 3.3.x parses these as plain numbers; Spark 4's Hadoop defaults use unit suffixes
# ("60s") that the 3.3 connector rejects, so they are restated as milliseconds / seconds.
S3A_DURATIONS: dict[str, str] = {
    "spark.hadoop.fs.s3a.connection.timeout": "200000",
    "spark.hadoop.fs.s3a.connection.establish.timeout": "30000",
    "spark.hadoop.fs.s3a.threads.keepalivetime": "60",
    "spark.hadoop.fs.s3a.multipart.purge.age": "86400",
    "spark.hadoop.fs.s3a.connection.ttl": "300000",
    "spark.hadoop.fs.s3a.connection.idle.time": "60000",
    "spark.hadoop.fs.s3a.connection.acquisition.timeout": "60000",
    "spark.hadoop.fs.s3a.connection.request.timeout": "60000",
    "spark.hadoop.fs.s3a.retry.interval": "500",
    "spark.hadoop.fs.s3a.retry.throttle.interval": "1000",
}


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lake_assets"


def s3a_jars() -> list[str]:
    """The s3a connector jars fetched by `./dev setup`; a clear error when they are missing."""
    listed = os.environ.get("LAKE_ASSETS_S3A_JARS")
    paths = [p for p in listed.split(",") if p] if listed else [str(cache_dir() / "jars" / n) for n in S3A_JAR_NAMES]
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise ConfigError(
            f"S3 needs Spark's s3a connector jars, missing: {missing}. Run './dev setup' "
            "(it caches them), or set LAKE_ASSETS_S3A_JARS to a comma-separated list of jar paths."
        )
    return paths


def session_conf(
    *,
    master: str | None = None,
    remote: str | None = None,
    extra: Mapping[str, str] | None = None,
    use_s3: bool = False,
    s3_endpoint_url: str | None = None,
    s3_region: str = "us-east-1",
    app_name: str = "lake_assets",
) -> dict[str, str]:
    """Spark settings for the lake. `remote` (Spark Connect) wins over `master`."""
    conf: dict[str, str] = {"spark.app.name": app_name}
    if remote:
        # A Connect server owns its cluster settings; only session SQL settings apply.
        conf["spark.remote"] = remote
        for setting in (
            "spark.sql.session.timeZone",
            "spark.sql.sources.partitionOverwriteMode",
            "spark.sql.sources.partitionColumnTypeInference.enabled",
            "spark.sql.shuffle.partitions",
            PYSPARK_CALL_SITES,
        ):
            conf[setting] = EMBEDDED_DEFAULTS[setting]
    else:
        conf["spark.master"] = master or "local[2]"
        conf.update(EMBEDDED_DEFAULTS)
        if not (master or "local").startswith("local"):
            # On a cluster the driver must be reachable by executors: do not pin it to loopback.
            conf.pop("spark.driver.bindAddress")
            conf.pop("spark.driver.host")
        else:
            # Local Python workers must run this interpreter (the virtualenv with lake_assets and
            # its readers), not whatever `python3` is first on PATH.
            conf["spark.pyspark.python"] = sys.executable
            conf["spark.pyspark.driver.python"] = sys.executable
            conf["spark.driver.extraJavaOptions"] = EMBEDDED_JVM_OPTIONS
            conf.update(LOCAL_DRIVER_SQL_SETTINGS)
        if use_s3:
            conf.update(S3A_DURATIONS)
            conf["spark.jars"] = ",".join(s3a_jars())
            conf["spark.hadoop.fs.s3a.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"
            conf["spark.hadoop.fs.s3a.endpoint.region"] = s3_region
            conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
            )
            if s3_endpoint_url:
                conf["spark.hadoop.fs.s3a.endpoint"] = s3_endpoint_url
                conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
                conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
                    s3_endpoint_url.startswith("https")
                ).lower()
    if extra:
        conf.update(extra)
    return conf


def s3a_secret_conf() -> dict[str, str]:
    """Access keys for s3a from the environment; kept out of every displayed config."""
    key = os.environ.get("AWS_ACCESS_KEY_ID")
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        return {}
    conf = {"spark.hadoop.fs.s3a.access.key": key, "spark.hadoop.fs.s3a.secret.key": secret}
    token = os.environ.get("AWS_SESSION_TOKEN")
    if token:
        conf["spark.hadoop.fs.s3a.session.token"] = token
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        )
    return conf


def build_session(conf: Mapping[str, str]):
    """Create (or reuse) the process's SparkSession from settings plus environment secrets."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    settings = dict(conf)
    worker_python = settings.get("spark.pyspark.python")
    if worker_python:
        # PySpark picks its workers' interpreter from the environment when it starts the JVM.
        os.environ.setdefault("PYSPARK_PYTHON", worker_python)
    if "spark.jars" in settings or any(k.startswith("spark.hadoop.fs.s3a") for k in settings):
        settings.update(s3a_secret_conf())
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
