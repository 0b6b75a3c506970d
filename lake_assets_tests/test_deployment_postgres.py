"""The deployment as `deploy/dagster.yaml` describes it: run, event log and schedule storage in a
PostgreSQL server (started from the machine's binaries on 127.0.0.1), webserver and daemon."""

from __future__ import annotations

import pytest

from lake_assets.config import FeedConfig, LakeConfig, dump_config
from lake_assets_tests.deployed_lake import (
    LAYERS,
    RUN_TIMEOUT,
    START,
    TABLES,
    Landing,
    assert_lake_equals_a_clean_run,
    hour_key,
)
from lake_assets_tests.deployment import ROOT, Deployment, PostgresServer

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(2)]


@pytest.fixture(scope="module")
def postgres_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("postgres_deployment")
    landing = Landing(root)
    config = LakeConfig(
        lake=f"file://{root / 'lake'}",
        feeds=(
            FeedConfig(
                "unit",
                "unit_cdc",
                f"file://{landing.dir}",
                tables=TABLES,
                start=START,
                sensor_interval_seconds=5,
            ),
        ),
    )
    config_file = root / "lake_assets.yaml"
    config_file.write_text(dump_config(config))
    server = PostgresServer().start()
    deployment = Deployment(
        root / "dagster_home", config_file, ROOT / "deploy" / "dagster.yaml", env=server.env()
    )
    try:
        deployment.start()
        yield root, landing, config, deployment, server
    finally:
        deployment.stop()
        server.stop()


def test_sensor_driven_runs_on_postgres_storage(postgres_world, spark):
    root, landing, config, deployment, server = postgres_world
    landing.land(range(3))
    runs = deployment.wait_until_idle(RUN_TIMEOUT)
    assert runs and {r["status"] for r in runs} == {"SUCCESS"}, deployment.logs()
    for table in TABLES:
        for layer in LAYERS:
            done = {m["partition"] for m in deployment.materialised_partitions(["unit", table, layer])}
            assert done == {hour_key(h) for h in range(3)}, f"{table}/{layer}"
    # The runs and their events are in PostgreSQL, not in files under DAGSTER_HOME.
    assert int(server.scalar("SELECT count(*) FROM runs")) == len(runs)
    assert (
        int(
            server.scalar(
                "SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'"
            )
        )
        > 0
    )
    assert int(server.scalar("SELECT count(*) FROM instigators")) > 0  # sensor state (schedule storage)
    assert not list((root / "dagster_home").glob("history/runs.db"))
    assert_lake_equals_a_clean_run(root, config, "unit")
