"""Spark session settings: embedded `local` by default, a cluster master or Spark Connect remote
when configured, and the s3a connector wired for S3 (or an S3-compatible endpoint such as moto).

`session_conf` returns the dict the Dagster resource hands to the builder; for an embedded
driver it may first compile the lake's local file system class, once (`jvm_classes`). Secrets
are not part of it; `s3a_secret_conf` reads them from the environment once the driver runs.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from lake_assets.config_model import DEFAULT_REGION, aws_credentials_from_environment
from lake_assets.errors import ConfigError

S3A_JAR_NAMES = ("hadoop-aws-3.3.1.jar", "aws-java-sdk-bundle-1.11.901.jar")
PYSPARK_CALL_SITES = "spark.python.sql.dataFrameDebugging.enabled"

#: The settings the lake's reads and writes rely on: what its files hold (timestamp types, Parquet
#: TIME and nanosecond columns, UTC), how partitions are written and read back, and how queries
#: run. They are runtime SQL settings, so every kind of session gets them the same way: the
#: builder of a local or cluster driver, `spark.conf.set` on a Spark Connect session (which
#: `build_session` then reads back: a server that refuses one fails the session, it does not
#: write a different lake).
LAKE_SQL_SETTINGS: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    # Partition folder values are the lake's keys (hours, GRAX batch ids) and always text; typed
    # by inference, a GRAX batch of digits alone ("000000123") would read back as the number 123.
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # Parquet TIMESTAMP(NANOS) (vendors write it) reaches Spark as a long; feeds convert it.
    "spark.sql.legacy.parquet.nanosAsLong": "true",
    # GRAX writes time-of-day fields (`_t`) as Parquet TIME, which Spark reads only with this.
    "spark.sql.timeType.enabled": "true",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    # Sized for the 2-core / 24 GiB machines this project runs on: few shuffle partitions keep
    # hourly batches from fanning out into hundreds of tiny tasks and files. A local driver
    # uses one per core (`local_shuffle_partitions`).
    "spark.sql.shuffle.partitions": "4",
    # Spark lists more than 32 given paths with a job of one task per path (up to 10,000): a
    # backfill hands it hundreds of landed files, and the tasks' overhead dwarfs the listing. A
    # few tasks, each listing a share of the paths, do it in a fraction of that
    # (docs/profiling.md, "Figures behind the code").
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
}

#: Settings of a driver JVM this process starts (local or a cluster's driver); a Spark Connect
#: server's JVM and cluster are its operator's.
DRIVER_SETTINGS: dict[str, str] = {
    "spark.default.parallelism": "4",
    "spark.driver.memory": "4g",
    # On for a cluster's driver (its executors gain from merged and split shuffle partitions);
    # a local driver turns it off (`LOCAL_DRIVER_SQL_SETTINGS`).
    "spark.sql.adaptive.enabled": "true",
    # A fold runs ~160 generated-code classes; with Spark's default cache of 100 every hourly
    # run compiled them all again (docs/profiling.md, "Figures behind the code"). Cached, an
    # hour's run compiles almost none.
    # (A static setting: only a JVM's start takes it.)
    "spark.sql.codegen.cache.maxEntries": "2000",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    # On, PySpark wraps every Column function in five extra JVM round trips (look up the active
    # session, read this setting's depth, walk the Python stack, set and clear the call site) so
    # that Spark's errors can name the Python line. A fold builds hundreds of expressions: off,
    # a warm hourly run spends about half the Python CPU (docs/profiling.md, "Figures behind
    # the code"). Errors keep Spark's message and the lake's file and step names. (A
    # setting of PySpark's classic sessions: a Connect server does not know it.)
    PYSPARK_CALL_SITES: "false",
}

#: The Hadoop setting naming the class a driver without S3 writes local files through.
FILE_SYSTEM_SETTING = "spark.hadoop.fs.file.impl"
#: Hadoop's local file system without checksum files (`.<name>.crc`) beside each file. Without
#: Hadoop's native library (PySpark ships none) every file and folder created starts a `chmod`
#: process, and the checksum files add one for each data file; backfills ran faster without
#: them, hours no slower (docs/profiling.md, "Figures behind the code"). No reader of the lake
#: checks them (DuckDB, pyarrow). With S3 the default stays: s3a buffers its uploads through
#: Hadoop's checksummed local file system and refuses another.
RAW_LOCAL_FILE_SYSTEM = "org.apache.hadoop.fs.RawLocalFileSystem"
#: Settings whose files spark-submit looks up through the local file system class before any
#: jar is loaded: named by the config, they keep Hadoop's own class (the lake's is in a jar).
_FILES_LOOKED_UP_AT_SUBMIT = (
    "spark.jars",
    "spark.files",
    "spark.submit.pyFiles",
    "spark.archives",
    "spark.jars.packages",
)


def _local_files_conf() -> dict[str, str]:
    """The local file system an embedded driver without S3 writes through: the lake's own
    (`jvm_classes`), which sets the files' modes without a process, with its jar, where the
    class could be compiled; Hadoop's raw one otherwise."""
    from lake_assets.jvm_classes import LOCAL_FILE_SYSTEM_CLASS, local_file_system_jar

    jar = local_file_system_jar()
    if jar is None:
        return {FILE_SYSTEM_SETTING: RAW_LOCAL_FILE_SYSTEM}
    # `local:` puts the jar on the driver's class path as it starts; a `file:` jar would be
    # looked up through the very file system class it holds, before it can be loaded.
    return {FILE_SYSTEM_SETTING: LOCAL_FILE_SYSTEM_CLASS, "spark.jars": f"local:{jar}"}


def _settle_the_local_file_system(conf: dict[str, str], extra: Mapping[str, str]) -> None:
    """Hadoop's raw local file system instead of the lake's when the config's own settings
    (`extra`) make a master that is not local (its executors would not find the jar) or name
    files spark-submit looks up before the jar is loaded; a file system of the config's own
    stands as it is."""
    from lake_assets.jvm_classes import LOCAL_FILE_SYSTEM_CLASS

    if conf.get(FILE_SYSTEM_SETTING) != LOCAL_FILE_SYSTEM_CLASS or FILE_SYSTEM_SETTING in extra:
        return
    if is_local(conf.get("spark.master", "local")) and not any(
        k in extra for k in _FILES_LOOKED_UP_AT_SUBMIT
    ):
        return
    conf[FILE_SYSTEM_SETTING] = RAW_LOCAL_FILE_SYSTEM
    if "spark.jars" not in extra:
        conf.pop("spark.jars", None)


# The embedded driver JVM runs the tasks too. The JDK's default collector (G1) does part of
# its work in threads of its own beside the application; with two cores those threads take
# them from Spark's tasks. The parallel collector stops the tasks briefly instead and does its
# work on both cores at once: less CPU and a shorter run an hour (docs/profiling.md, "Figures
# behind the code"). A cluster's JVM options are its operator's to set.
EMBEDDED_JVM_OPTIONS = "-XX:+UseParallelGC"
#: The environment variable whose JVM options every embedded driver this process or its
#: children start (Dagster run workers, `lake-assets run`) gets after the lake's own; a
#: `spark.driver.extraJavaOptions` in the config's `spark.conf` replaces both. The test suite
#: uses it for the drivers it starts as processes (`lake_assets_tests/jvm_options.py`).
DRIVER_JAVA_OPTIONS_ENV = "LAKE_ASSETS_DRIVER_JAVA_OPTIONS"

# Adaptive execution runs a query as one job per exchange and plans the rest again after each.
# An hourly fold is a dozen queries over ~10k events and a ~100k-row open set: their tasks take
# tens of milliseconds, and the jobs and re-planning between them cost more than the plan they
# improve. With a few shuffle partitions (one per core of a `local[N]` driver) there is little
# to merge, and no executors for a skewed partition to be spread over. Off, a warm hourly run is
# faster and a backfill no slower (docs/profiling.md, "Figures behind the code").
LOCAL_DRIVER_SQL_SETTINGS: dict[str, str] = {"spark.sql.adaptive.enabled": "false"}

_LOCAL_CORES = re.compile(r"local(?:\[([0-9]+|\*)(?:\s*,\s*[0-9]+)?\])?")


def local_cores(master: str) -> int | None:
    """The cores of a `local`, `local[N]` or `local[*]` master (with or without a retry count);
    None for any other master."""
    found = _LOCAL_CORES.fullmatch(master)
    if found is None:
        return None
    cores = found.group(1) or "1"
    return _usable_cores() if cores == "*" else int(cores)


def _usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one), which
    `local[*]` gets from the JVM too; the machine's count can be more."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def local_shuffle_partitions(master: str) -> dict[str, str]:
    """One shuffle partition per core of a local driver: its cores run a stage's tasks side by
    side, so more partitions than cores only add tasks, and files to every partitioned write;
    backfills and warm hours both ran faster with one per core than with the lake's 4
    (docs/profiling.md, "Figures behind the code")."""
    cores = local_cores(master)
    return {} if cores is None else {"spark.sql.shuffle.partitions": str(cores)}


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
    paths = (
        [p for p in listed.split(",") if p]
        if listed
        else [str(cache_dir() / "jars" / n) for n in S3A_JAR_NAMES]
    )
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
    s3_region: str = DEFAULT_REGION,
    app_name: str = "lake_assets",
) -> dict[str, str]:
    """Spark settings for the lake. `remote` (Spark Connect) wins over `master`. A Connect
    session gets the lake's SQL settings only: the server's JVM, its cluster and its s3a
    connector are configured where the server starts (README: Running on Spark Connect)."""
    conf: dict[str, str] = {"spark.app.name": app_name}
    if remote:
        conf["spark.remote"] = remote
        conf.update(LAKE_SQL_SETTINGS)
    else:
        conf["spark.master"] = master or "local[2]"
        conf.update(LAKE_SQL_SETTINGS)
        conf.update(DRIVER_SETTINGS)
        local = is_local(conf["spark.master"])
        if not local:
            # On a cluster the driver must be reachable by executors: do not pin it to loopback.
            conf.pop("spark.driver.bindAddress")
            conf.pop("spark.driver.host")
        else:
            # Local Python workers must run this interpreter (the virtualenv with lake_assets and
            # its readers), not whatever `python3` is first on PATH.
            conf["spark.pyspark.python"] = sys.executable
            conf["spark.pyspark.driver.python"] = sys.executable
            from lake_assets.jvm_archive import driver_java_options

            conf["spark.driver.extraJavaOptions"] = driver_java_options()
            conf.update(LOCAL_DRIVER_SQL_SETTINGS)
            conf.update(local_shuffle_partitions(conf["spark.master"]))
        if not use_s3:
            conf.update(_local_files_conf() if local else {FILE_SYSTEM_SETTING: RAW_LOCAL_FILE_SYSTEM})
        else:
            conf.update(S3A_DURATIONS)
            conf["spark.jars"] = ",".join(s3a_jars())
            conf["spark.hadoop.fs.s3a.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"
            conf["spark.hadoop.fs.s3a.endpoint.region"] = s3_region
            conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
            )
            # The connector's session-token provider marks itself ready before it is (HADOOP-18233,
            # fixed after hadoop-aws 3.3.1): threads meeting it at once (Spark checks a read's
            # paths from a pool) got "has no credentials". A probe of the bucket while the
            # connector starts asks for the credentials once, before any other thread can.
            conf["spark.hadoop.fs.s3a.bucket.probe"] = "1"
            if s3_endpoint_url:
                conf["spark.hadoop.fs.s3a.endpoint"] = s3_endpoint_url
                conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
                conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
                    s3_endpoint_url.startswith("https")
                ).lower()
    if extra:
        conf.update(extra)
        _settle_the_local_file_system(conf, extra)
    return conf


def is_local(master: str) -> bool:
    """Whether the master runs the tasks in the driver's own JVM and Python."""
    return master.startswith("local")


def s3a_secret_conf() -> dict[str, str]:
    """Access keys for s3a from the environment, as Hadoop settings (`_give_s3a_its_keys`);
    kept out of every displayed config."""
    credentials = aws_credentials_from_environment()
    if credentials is None:
        return {}
    conf = {
        "fs.s3a.access.key": credentials.key,
        "fs.s3a.secret.key": credentials.secret,
    }
    if credentials.token:
        conf["fs.s3a.session.token"] = credentials.token
        conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    return conf


def _give_s3a_its_keys(session) -> None:
    """The environment's access keys, set on the running driver's Hadoop configuration, which
    every read and write hands to its tasks (on a cluster's executors too). Given as settings
    before the start, PySpark would pass each as a `--conf` argument of the driver JVM's
    command, which every local user can read (`ps`, `/proc/<pid>/cmdline`) for the whole run."""
    hadoop = session.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_secret_conf().items():
        hadoop.set(key, value)


def build_session(conf: Mapping[str, str]):
    """Create (or reuse) the process's SparkSession from settings plus environment secrets.

    Where the tasks do not run in this process (a cluster master, Spark Connect), the session
    also gets this process's `lake_assets` (`executors.ship_package`) and checks that the
    executors' Python can import what the lake's Python functions need, so that a missing
    module is one clear error at the start rather than a failed task deep in a run."""
    from pyspark.sql import SparkSession

    settings = dict(conf)
    remote = settings.pop("spark.remote", None)
    if remote:
        session = SparkSession.builder.remote(connect_url(remote)).getOrCreate()
        # Closed before the interpreter's last garbage collection: a Connect DataFrame cached on
        # the server (a local checkpoint) releases itself when collected, with a call that
        # cannot run once Python is shutting down, and the process would never exit.
        atexit.register(session.stop)
        apply_sql_settings(session, {k: v for k, v in settings.items() if k != "spark.app.name"})
    else:
        with DRIVER_LOCK:
            if driver_ended():
                logging.getLogger(__name__).warning("the Spark driver JVM had ended: starting a new one")
                forget_ended_driver()
        builder = SparkSession.builder
        worker_python = settings.get("spark.pyspark.python")
        if worker_python:
            # PySpark takes its workers' interpreter from this variable when the context starts;
            # the configured one wins over a value inherited from the calling environment.
            os.environ["PYSPARK_PYTHON"] = worker_python
        _unless_its_jar_is_gone(settings)
        for key, value in settings.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        if any(k.startswith("spark.hadoop.fs.s3a") for k in settings):
            _give_s3a_its_keys(session)
        if is_local(settings.get("spark.master", "local")):
            return session
    from lake_assets.executors import prepare_executors

    prepare_executors(session)
    return session


def _unless_its_jar_is_gone(settings: dict[str, str]) -> None:
    """Hadoop's raw local file system if the lake's class's jar left the cache since the
    settings were made (a driver named a missing jar's class would fail every file access)."""
    from lake_assets.jvm_classes import LOCAL_FILE_SYSTEM_CLASS

    jar = settings.get("spark.jars", "")
    if settings.get(FILE_SYSTEM_SETTING) != LOCAL_FILE_SYSTEM_CLASS or not jar.startswith("local:"):
        return
    if not Path(jar.removeprefix("local:")).is_file():
        settings[FILE_SYSTEM_SETTING] = RAW_LOCAL_FILE_SYSTEM
        del settings["spark.jars"]


#: held while a session is checked and, its driver ended, forgotten and built again
DRIVER_LOCK = threading.RLock()


def driver_ended(session=None) -> bool:
    """Whether the driver JVM this process started has ended (killed, or out of memory), or, given
    a `session`, whether that session's driver has: every call to it would fail to connect. A
    Spark Connect session's driver is the server's, never this process's; a driver whose JVM
    this process did not launch (a `spark-submit` that started Python) is never taken for ended."""
    from pyspark import SparkContext

    if session is not None:
        context = getattr(session, "_sc", None)  # a classic session's context; Connect has none
        if context is None:
            return False
        if context is not SparkContext._active_spark_context:
            return True  # forgotten after it ended (`forget_ended_driver`)
    process = getattr(SparkContext._gateway, "proc", None)  # the JVM PySpark launched, if it did
    return process is not None and process.poll() is not None


def forget_ended_driver() -> None:
    """Forget the session, context and gateway of an ended driver, so that the next session starts
    a new JVM. PySpark keeps them at class level and would hand them out again (`getOrCreate`),
    and offers no public call that works once the JVM is gone, so one table's run that ended the
    JVM would fail every table after it in this process."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway, context = SparkContext._gateway, SparkContext._active_spark_context
    with SparkContext._lock:
        SparkContext._active_spark_context = None
        SparkContext._gateway = None
        SparkContext._jvm = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    if gateway is not None:
        with contextlib.suppress(Exception):  # its sockets, on this side only: the other end is gone
            gateway.close()
    # The ended context's accumulator server (a socket and a thread of this process) is what
    # `SparkContext.stop` would close after its call to the JVM, which cannot be made now.
    server = getattr(context, "_accumulatorServer", None)
    if context is not None and server is not None:
        context._accumulatorServer = None  # type: ignore[assignment]
        with contextlib.suppress(Exception):
            server.shutdown()


def release_cached(frame) -> None:
    """Free a cached frame's memory, unless its driver has ended (and the memory with it): a call
    to an ended driver would fail, and replace the error that ended it in a step's failure."""
    if not driver_ended(frame.sparkSession):
        frame.unpersist()


def connect_url(remote: str) -> str:
    """The URL the Connect client is given. With a token (from SPARK_CONNECT_AUTHENTICATE_TOKEN)
    and no `use_ssl`, PySpark's client speaks plain gRPC with the token only to a host named
    `localhost`; any other name, 127.0.0.1 included, makes it use TLS, which a server on the
    same machine does not offer (the client then retries for ever). A loopback address is
    therefore addressed as `localhost`."""
    head, sep, params = remote.partition("/;")
    host_port = head[len("sc://") :]
    host, _, port = host_port.rpartition(":") if ":" in host_port.strip("[]") else (host_port, "", "")
    token = os.environ.get("SPARK_CONNECT_AUTHENTICATE_TOKEN")
    if token and "use_ssl=true" not in params.lower() and host in ("127.0.0.1", "[::1]"):
        return f"sc://localhost{':' + port if port else ''}{sep}{params}"
    return remote


def apply_sql_settings(session, settings: Mapping[str, str]) -> None:
    """Set the lake's SQL settings on a Connect session and read them back: a server that keeps
    another value (a static setting, a locked one) would write a different lake."""
    differing = []
    for key, value in settings.items():
        try:
            session.conf.set(key, value)
        except Exception:  # noqa: BLE001, S110 - refused (e.g. static); what counts is the value the session has
            pass
        kept = session.conf.get(key, None)
        if kept != value:
            differing.append(f"{key} is {kept!r} on the server, the lake needs {value!r}")
    if differing:
        raise ConfigError(
            "the Spark Connect session does not take the lake's settings: "
            + "; ".join(differing)
            + " (set them where the server starts: --conf KEY=VALUE)"
        )
