"""The same lake from a Spark standalone cluster and from a Spark Connect server as from the
embedded local driver: the three feeds end to end through `lake-assets run` (a process of its
own, as a user runs it), on a local lake and, for the Unit feed, on S3 through s3a.

The servers are started here from pyspark's own distribution, on 127.0.0.1 (`spark_servers`);
the data is small (a few hours, batches and journals): what is tested is that every Spark path
(executors in their own JVMs and Python workers, Connect's client-server split) writes the same
files, schema and rows, as the local one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from lake_assets.config import CollectionConfig, FeedConfig, LakeConfig, S3Config, SparkConfig, dump_config
from lake_assets.demo.flow_sample import write_flow_landing
from lake_assets.demo.grax_sample import write_grax_landing
from lake_assets.demo.unit_sample import write_unit_landing
from lake_assets.runner import run_feeds
from lake_assets_tests.deployed_lake import lake_table
from lake_assets_tests.hostile_landings import garble_data_pages, quarantine_notes
from lake_assets_tests.jvm_options import TEST_JVM_OPTIONS
from lake_assets_tests.s3_faults import FEW_RETRIES, THROTTLE, FaultyS3, landing_on_s3
from lake_assets_tests.spark_servers import ConnectServer, StandaloneCluster

pytestmark = [pytest.mark.e2e, pytest.mark.scale_out, pytest.mark.minutes(8)]

LAYERS = ("changes", "current", "history")
RUN_TIMEOUT = 1200


class Landings:
    """Small landings of the three feeds, written once for the module."""

    def __init__(self, root: Path):
        self.root = root
        unit = write_unit_landing(root / "landing" / "unit", hours=3, tables=("accounts",))
        grax = write_grax_landing(root / "landing" / "grax", batches=4)
        flow = write_flow_landing(root / "landing" / "flow")
        self.feeds = (
            FeedConfig(name="unit", format="unit_cdc", landing=f"file://{unit.landing_dir}"),
            # the object with deletes and purges; one object is one run of its own on every path
            FeedConfig(
                name="grax", format="grax_v2", landing=f"file://{grax.landing_dir}", objects=("Account",)
            ),
            FeedConfig(
                name="flow",
                format="flow_journal",
                landing=f"file://{flow.landing_dir}",
                collections=tuple(
                    CollectionConfig(name=name, key=tuple(key)) for name, key in flow.collections.items()
                ),
            ),
        )
        self.unit_dir = unit.landing_dir
        # a file Spark fails on only as it reads its rows: set aside with the same reason, its
        # root cause named, by the local driver, the cluster and a Connect server alike
        first = min((unit.landing_dir / "accounts").rglob("*.parquet"))
        garbled = first.with_name("pages-garbled.parquet")
        pq.write_table(pq.read_table(first), garbled)
        garble_data_pages(garbled)

    def config(self, lake: Path, spark: SparkConfig = SparkConfig()) -> LakeConfig:
        return LakeConfig(lake=f"file://{lake}", feeds=self.feeds, spark=spark)


@pytest.fixture(scope="module")
def landings(tmp_path_factory) -> Landings:
    return Landings(tmp_path_factory.mktemp("scale-out"))


@pytest.fixture(scope="module")
def local_lake(landings, spark) -> Path:
    """The reference: the embedded local driver (the test run's session) over every feed."""
    lake = landings.root / "lake-local"
    run_feeds(landings.config(lake), instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
    return lake


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = StandaloneCluster(tmp_path_factory.mktemp("standalone")).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory, moto_server):
    started = ConnectServer(tmp_path_factory.mktemp("connect"), s3_endpoint=moto_server.url).start(
        sys.executable, TEST_JVM_OPTIONS
    )
    yield started
    started.stop()


def run_cli(config: LakeConfig, work: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`lake-assets run --config FILE` in a process of its own, Dagster and Spark output in `work`."""
    work.mkdir(parents=True, exist_ok=True)
    config_file = work / "lake.yaml"
    config_file.write_text(dump_config(config))
    return subprocess.run(
        [sys.executable, "-m", "lake_assets.cli", "run", "--config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env={
            **os.environ,
            "LAKE_ASSETS_LOG_DIR": str(work / "logs"),
            "SPARK_LOCAL_IP": "127.0.0.1",
            **(env or {}),
        },
        check=False,
    )


def assert_ran(done: subprocess.CompletedProcess, work: Path) -> None:
    logs = "\n".join(p.read_text(errors="replace")[-4000:] for p in (work / "logs").glob("*.log"))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- log ---\n{logs}"


def parquet_schemas(lake: Path, layer: str, feed: str, table: str) -> set[str]:
    """The Parquet schemas (physical types included: INT96 against TIMESTAMP_MICROS shows) of a table's files."""
    return {
        _physical(pq.ParquetFile(path).schema) for path in (lake / layer / feed / table).rglob("*.parquet")
    }


def _physical(schema: pq.ParquetSchema) -> str:
    """The schema as Parquet writes it (its text, less the first line: the object's address)."""
    return "\n".join(str(schema).splitlines()[1:])


def assert_same_lake(lake: Path, reference: Path) -> None:
    tables = _tables(reference)
    assert {feed for feed, _ in tables} == {"unit", "grax", "flow"}, tables
    assert _tables(lake) == tables
    for feed, table in tables:
        for layer in LAYERS:
            assert parquet_schemas(lake, layer, feed, table) == parquet_schemas(
                reference, layer, feed, table
            ), f"{feed}/{table}/{layer}: the Parquet schema differs from the local driver's"
            rows, expected = lake_table(lake, layer, feed, table), lake_table(reference, layer, feed, table)
            assert rows == expected, (
                f"{feed}/{table}/{layer}: {len(rows)} rows, the local driver wrote {len(expected)}"
            )
            assert expected, f"{feed}/{table}/{layer} is empty"
    reasons, expected_reasons = set_aside(lake), set_aside(reference)
    assert any("pages-garbled.parquet" in file for file in expected_reasons), expected_reasons
    assert reasons == expected_reasons


def set_aside(lake: Path) -> dict[str, str]:
    """Landed file -> why the lake set it aside."""
    return {file: note["reason"] for file, note in quarantine_notes(lake).items()}


def _tables(lake: Path) -> list[tuple[str, str]]:
    """(feed, table) of every table in a lake's `current` layer (a GRAX table is `org/object`)."""
    found = []
    for path in sorted((lake / "current").rglob("*.parquet")):
        parts = path.relative_to(lake / "current").parts
        table_parts = [p for p in parts[1:-1] if "=" not in p]
        found.append((parts[0], "/".join(table_parts)))
    return sorted(set(found))


def test_a_standalone_cluster_writes_the_lake_the_local_driver_writes(landings, local_lake, cluster):
    work = landings.root / "cluster-run"
    config = landings.config(
        work / "lake",
        SparkConfig(master=cluster.master_url, conf=cluster.spark_conf(sys.executable, TEST_JVM_OPTIONS)),
    )
    done = run_cli(config, work)
    assert_ran(done, work)
    assert_same_lake(work / "lake", local_lake)


def test_a_spark_connect_server_writes_the_lake_the_local_driver_writes(landings, local_lake, connect_server):
    work = landings.root / "connect-run"
    config = landings.config(work / "lake", SparkConfig(remote=connect_server.url))
    done = run_cli(config, work, env={"SPARK_CONNECT_AUTHENTICATE_TOKEN": connect_server.token})
    assert_ran(done, work)
    assert connect_server.token not in done.stdout + done.stderr
    assert_same_lake(work / "lake", local_lake)


def test_a_connect_server_that_wants_a_token_it_was_not_given_says_so_in_the_failure_line(
    landings, connect_server, monkeypatch
):
    """gRPC's first line ("<_InactiveRpcError of RPC that terminated with:") named nothing: the
    failure line now carries the server's details and what to do."""
    monkeypatch.delenv("SPARK_CONNECT_AUTHENTICATE_TOKEN", raising=False)
    work = landings.root / "connect-without-token"

    done = run_cli(landings.config(work / "lake", SparkConfig(remote=connect_server.url)), work)

    assert done.returncode != 0
    failures = [line for line in done.stderr.splitlines() if "failed:" in line]
    assert failures, done.stderr
    assert all(
        "No authentication token provided" in line and "set SPARK_CONNECT_AUTHENTICATE_TOKEN" in line
        for line in failures
    ), failures


def _without_source(rows: list[tuple]) -> list[tuple]:
    """Rows without `_source_file`: the same files read from S3 and from a folder have other URLs."""
    return sorted(tuple(pair for pair in row if pair[0] != "_source_file") for row in rows)


def _download(client, bucket: str, prefix: str, target: Path) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if not item["Key"].endswith("/"):
                path = target / item["Key"][len(prefix) :].lstrip("/")
                path.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, item["Key"], str(path))


@pytest.mark.s3
@pytest.mark.parametrize("server", ["cluster", "connect_server"])
def test_the_unit_feed_on_s3_through_s3a_equals_the_local_driver(
    landings, local_lake, moto_server, s3_bucket, request, server
):
    """Landing and lake on S3 (moto): a cluster's executors get s3a and the keys from the driver's
    session; a Connect server has its own s3a settings and takes the keys from its environment."""
    started = request.getfixturevalue(server)
    client = moto_server.client("s3")
    moto_server.upload(s3_bucket, landings.unit_dir, "landing/unit")
    if server == "cluster":
        spark, env = (
            SparkConfig(master=started.master_url, conf=started.spark_conf(sys.executable, TEST_JVM_OPTIONS)),
            {},
        )
    else:
        spark, env = SparkConfig(remote=started.url), {"SPARK_CONNECT_AUTHENTICATE_TOKEN": started.token}
    config = LakeConfig(
        lake=f"s3a://{s3_bucket}/lake",
        s3=S3Config(endpoint_url=moto_server.url),
        spark=spark,
        feeds=(FeedConfig(name="unit", format="unit_cdc", landing=f"s3a://{s3_bucket}/landing/unit"),),
    )
    work = landings.root / f"{server}-s3-run"
    assert_ran(run_cli(config, work, env), work)
    _download(client, s3_bucket, "lake/", work / "lake")
    for table in ("accounts",):
        for layer in LAYERS:
            assert parquet_schemas(work / "lake", layer, "unit", table) == parquet_schemas(
                local_lake, layer, "unit", table
            )
            assert _without_source(lake_table(work / "lake", layer, "unit", table)) == _without_source(
                lake_table(local_lake, layer, "unit", table)
            ), f"unit/{table}/{layer} on S3 differs from the local driver's"


@pytest.mark.s3
def test_on_connect_with_server_traces_hidden_a_throttled_read_fails_the_run_and_sets_no_file_aside(
    tmp_path, moto_server, s3_bucket
):
    """A Connect server whose store throttles its reads of a good file (503 SlowDown) past its
    retries, with the client not shown the server's stack traces: the run fails and sets no file
    aside, and once the store answers again the next run reads every row. The failure reaches
    the client as an error whose text names no class of the server's chain of causes; taken for
    a damaged file, the file's rows would leave `changes` in a run that exits 0."""
    landing = landing_on_s3(moto_server, s3_bucket, tmp_path, "unit")
    few_retries = {f"spark.hadoop.fs.s3a.{name}": value for name, value in FEW_RETRIES.items()}
    with FaultyS3(moto_server.url).serving() as s3:
        server = ConnectServer(tmp_path / "connect", s3_endpoint=s3.url, conf=few_retries)
        server.start(sys.executable, TEST_JVM_OPTIONS)
        try:
            hidden = SparkConfig(
                remote=server.url, conf={"spark.sql.connect.serverStacktrace.enabled": "false"}
            )
            config = landing.config(moto_server.url).model_copy(update={"spark": hidden})
            token = {"SPARK_CONNECT_AUTHENTICATE_TOKEN": server.token}
            s3.fail(s3_bucket, landing.victim, THROTTLE)
            failed = run_cli(config, tmp_path / "throttled", token)
            assert failed.returncode != 0 and s3.delivered(THROTTLE) > 0, failed.stderr
            assert "failed on a request to the store" in failed.stderr and "SlowDown" in failed.stderr, (
                failed.stderr
            )
            assert not quarantine_notes(landing.lake)

            s3.heal()
            healed = run_cli(config, tmp_path / "healed", token)
            assert_ran(healed, tmp_path / "healed")
        finally:
            server.stop()
    assert not quarantine_notes(landing.lake)
    assert f"s3a://{s3_bucket}/{landing.victim}" in landing.files_in_changes()


def test_executors_that_cannot_import_the_lake_fail_the_run_in_one_line_saying_how_to_fix_it(
    landings, cluster
):
    """Executors running a Python without the project's packages (the system's): the session's
    first job says which module is missing and where the README tells how to provide it. The
    calling environment names the project's Python in PYSPARK_PYTHON: the configured
    `spark.pyspark.python` must still be the one the executors run."""
    system_python = "/usr/bin/python3"
    assert Path(system_python).exists(), (
        "this test needs the system's Python (without the project's packages)"
    )
    work = landings.root / "cluster-bare-python"
    # one attempt per task: Spark's default of four only repeats the same failure
    conf = {**cluster.spark_conf(system_python, TEST_JVM_OPTIONS), "spark.task.maxFailures": "1"}
    config = LakeConfig(
        lake=f"file://{work / 'lake'}",
        feeds=landings.feeds[:1],
        spark=SparkConfig(master=cluster.master_url, conf=conf),
    )
    done = run_cli(config, work, env={"PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 1, done.stdout + done.stderr
    failures = [line for line in done.stderr.splitlines() if line.startswith("lake-assets: failed:")]
    assert failures, done.stderr
    assert all(
        "the executors' Python cannot" in line and "pack-env" in line and "Traceback" not in line
        for line in failures
    ), failures
