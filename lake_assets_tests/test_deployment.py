"""End to end on a real deployment: dagster-webserver and dagster-daemon on 127.0.0.1, the
project's own `deploy/dagster.local.yaml`, files dropped into a landing folder.

The tests run in order on one deployment, as a user's day would: files land and every layer
follows; a late file re-runs exactly its hour; a backfill launched through GraphQL; the daemon
stopped mid-run (its run worker killed) and started again; a damaged lake file fails its run,
which names the file. After each step the deployed lake must equal a clean `run_feeds` over
everything landed so far.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster_graphql.client.query import LAUNCH_PARTITION_BACKFILL_MUTATION

from lake_assets.config import FeedConfig, LakeConfig, dump_config
from lake_assets.demo.unit_sample import write_unit_landing
from lake_assets_tests.deployed_lake import (
    LAYERS,
    RUN_TIMEOUT,
    START,
    TABLES,
    Landing,
    assert_lake_equals_a_clean_run,
    hour_key,
    lake_table,
    partitions_since,
    runs_since,
)
from lake_assets_tests.deployment import ROOT, Deployment, command_line, descendants, parent_of, wait_for
from lake_assets_tests.unit_files import at, event, write_events

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(19)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("deployment")
    landing = Landing(root)
    backfill_landing = root / "landing" / "unit_backfill"
    write_unit_landing(backfill_landing, hours=4, tables=("accounts",), seed=11)
    feeds = (
        FeedConfig(
            "unit",
            "unit_cdc",
            f"file://{landing.dir}",
            tables=TABLES,
            start=START,
            late_hours=48,
            sensor_interval_seconds=5,
        ),
        FeedConfig(
            "unit_backfill",
            "unit_cdc",
            f"file://{backfill_landing}",
            tables=("accounts",),
            start=START,
            sensor_interval_seconds=5,
            watch=False,
        ),
    )
    config = LakeConfig(lake=f"file://{root / 'lake'}", feeds=feeds)
    config_file = root / "lake_assets.yaml"
    config_file.write_text(dump_config(config))
    deployment = Deployment(root / "dagster_home", config_file, ROOT / "deploy" / "dagster.local.yaml")
    deployment.start()
    try:
        yield root, landing, config, deployment
    finally:
        deployment.stop()


def test_landed_files_bring_every_layer_up_to_date_without_a_manual_step(world, spark):
    root, landing, config, deployment = world
    landing.land(range(4))
    runs = deployment.wait_until_idle(RUN_TIMEOUT)
    assert runs, deployment.logs()
    assert {r["status"] for r in runs} == {"SUCCESS"}, deployment.logs()
    assert any(r["tags"].get("dagster/sensor_name") == "unit_landing_sensor" for r in runs)
    for table in TABLES:
        for layer in LAYERS:
            done = {m["partition"] for m in deployment.materialised_partitions(["unit", table, layer])}
            assert done == {hour_key(h) for h in range(4)}, f"{table}/{layer}: {sorted(done)}"
        # The asset checks ran with the folds and show in the UI as passed. A ranged run checks
        # the table once (its partitions' own entries show as skipped), and nothing failed.
        for layer, check in (
            ("changes", "landing_complete"),
            ("current", "current_unique_key"),
            ("history", "history_windows"),
            ("history", "events_reconcile"),
        ):
            statuses = deployment.check_statuses(["unit", table, layer], check)
            assert "SUCCEEDED" in statuses, (table, check, statuses)
            assert not {"FAILED", "EXECUTION_FAILED"} & set(statuses), (table, check, statuses)
    assert_lake_equals_a_clean_run(root, config, "unit")


def test_a_late_file_for_an_old_hour_rematerialises_exactly_that_hour(world, spark):
    root, landing, config, deployment = world
    before = time.time()
    write_events(
        landing.dir,
        "accounts",
        1,
        "part-late.parquet",
        [event("acct-late", "INSERT", 9_000_001, at(1, 59), name="late")],
    )
    deployment.wait_until_idle(RUN_TIMEOUT)
    for layer in LAYERS:
        for table, expected in (("accounts", {hour_key(1)}), ("customers", set())):
            key = ["unit", table, layer]
            assert partitions_since(deployment, key, before) == expected, (
                layer,
                runs_since(deployment, key, before),
            )
    assert_lake_equals_a_clean_run(root, config, "unit")


def test_a_backfill_launched_through_graphql_is_one_run_and_matches_the_cli(world, spark):
    root, _, config, deployment = world
    keys = [{"path": ["unit_backfill", "accounts", layer]} for layer in LAYERS]
    launched = deployment.query(
        LAUNCH_PARTITION_BACKFILL_MUTATION,
        {
            "backfillParams": {
                "partitionNames": [hour_key(h) for h in range(4)],
                "assetSelection": keys,
                "title": "end-to-end backfill",
            }
        },
    )["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill_id = launched["backfillId"]
    assert deployment.wait_for_backfill(backfill_id, RUN_TIMEOUT) in ("COMPLETED", "COMPLETED_SUCCESS")
    runs = deployment.wait_until_idle(RUN_TIMEOUT)
    backfill_runs = [r for r in runs if r["tags"].get("dagster/backfill") == backfill_id]
    assert len(backfill_runs) == 1 and backfill_runs[0]["status"] == "SUCCESS", backfill_runs
    assert backfill_runs[0]["tags"]["dagster/asset_partition_range_start"] == hour_key(0)
    assert backfill_runs[0]["tags"]["dagster/asset_partition_range_end"] == hour_key(3)

    # The same tables as `lake-assets run` produces from the same landing folder.
    cli_lake = root / "cli-lake"
    subset = root / "backfill-only.yaml"
    subset.write_text(
        dump_config(
            LakeConfig(
                lake=f"file://{cli_lake}", feeds=tuple(f for f in config.feeds if f.name == "unit_backfill")
            )
        )
    )
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "lake-assets"), "run", "--config", str(subset)],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    for layer in ("changes", "current", "history"):
        deployed = lake_table(root / "lake", layer, "unit_backfill", "accounts")
        assert deployed and deployed == lake_table(cli_lake, layer, "unit_backfill", "accounts"), layer


def _overlap(a: dict, b: dict) -> bool:
    return a["startTime"] < b["endTime"] and b["startTime"] < a["endTime"]


def test_one_writer_per_table_while_other_tables_run_in_parallel(world):
    _, _, _, deployment = world
    known = {r["runId"] for r in deployment.runs()}
    # Two runs that write unit/accounts and one that writes unit/customers, launched together.
    for table, hour in (("accounts", 0), ("accounts", 1), ("customers", 0)):
        launched = deployment.query(
            LAUNCH_PARTITION_BACKFILL_MUTATION,
            {
                "backfillParams": {
                    "partitionNames": [hour_key(hour)],
                    "assetSelection": [{"path": ["unit", table, layer]} for layer in LAYERS],
                }
            },
        )["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
    # While one accounts run works, the other waits in the queue, and the UI can say on what:
    # the table's pool.
    waiting = wait_for(
        lambda: [
            r
            for r in deployment.runs()
            if r["runId"] not in known
            and r["status"] == "QUEUED"
            and "lake_table__unit__accounts" in (r["allPools"] or [])
            and any(
                o["status"] == "STARTED" and "lake_table__unit__accounts" in (o["allPools"] or [])
                for o in deployment.runs()
            )
        ],
        300,
        "an accounts run waiting on its table's pool",
        every=1.0,
    )
    assert waiting
    runs = [r for r in deployment.wait_until_idle(RUN_TIMEOUT) if r["runId"] not in known]
    by_table = {}
    for run in runs:
        assert run["status"] == "SUCCESS", run
        by_table.setdefault(run["assetSelection"][0]["path"][1], []).append(run)
    assert sorted(len(v) for v in by_table.values()) == [1, 2], by_table
    first, second = by_table["accounts"]
    assert not _overlap(first, second), "two runs wrote unit/accounts at the same time"
    assert any(_overlap(a, by_table["customers"][0]) for a in by_table["accounts"]), (
        "the customers run waited for accounts although it writes another table"
    )


CHROMIUM = os.environ.get("LAKE_ASSETS_CHROMIUM", "/usr/bin/chromium")
# Headless Chromium on a machine without outside network: no background fetches, no sandbox
# (tests may run as root), a fresh profile per launch.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Where the UI test saves its screenshots; `LAKE_ASSETS_SCREENSHOTS=docs` refreshes the README's.
SCREENSHOTS = os.environ.get("LAKE_ASSETS_SCREENSHOTS")


def test_a_partition_materialised_from_the_ui_succeeds_and_the_layers_below_follow(world, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    _, _, _, deployment = world
    assert Path(CHROMIUM).exists(), (
        f"Chromium is not installed at {CHROMIUM} (Debian: apt-get install chromium)"
    )
    partition = hour_key(2)
    before_ui = time.time()
    known = {r["runId"] for r in deployment.runs()}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{deployment.url}/assets/unit/customers/catalog")
            materialize = page.get_by_role("button", name="Materialize…")
            materialize.wait_for(timeout=120_000)
            page.wait_for_timeout(2000)
            skip = page.get_by_role("button", name="Skip")  # a first-visit newsletter prompt
            if skip.is_visible():
                skip.click()
            materialize.click()
            dialog = page.get_by_role("dialog")
            expect(dialog).to_contain_text(
                "Launch runs to materialize unit / customers / catalog", timeout=60_000
            )
            # The dialog opens on the last 90 days of hours; the sample is older.
            dialog.get_by_text("Show all partitions").click(timeout=60_000)
            selection = dialog.locator("input:not([type=checkbox])").first
            expect(selection).to_have_attribute("placeholder", re.compile("^ex: "), timeout=60_000)
            selection.fill(partition)
            selection.press("Enter")
            dialog.get_by_role("button", name="Launch 1 run").click()

            launched = wait_for(
                lambda: [r for r in deployment.runs() if r["runId"] not in known],
                120,
                "the run launched from the UI",
            )
            run_id = launched[0]["runId"]
            assert launched[0]["tags"].get("dagster/partition") == partition, launched[0]["tags"]
            page.goto(f"{deployment.url}/runs/{run_id}")
            # The run page's status tag turns from "Started" to "Success".
            expect(page.get_by_text("Success", exact=True).first).to_be_visible(timeout=RUN_TIMEOUT * 1000)
            # The page may show a step's success a moment before the run's status is written.
            ended = wait_for(
                lambda: [
                    r["status"]
                    for r in deployment.runs()
                    if r["runId"] == run_id and r["status"] not in ("QUEUED", "STARTING", "STARTED")
                ],
                120,
                "the run launched from the UI to end",
            )
            assert ended == ["SUCCESS"]
            page.screenshot(path=str(tmp_path / "run.png"))

            # Automation carries the new catalog partition down to the other layers.
            deployment.wait_until_idle(RUN_TIMEOUT)
            for layer in ("changes", "current", "history"):
                assert partition in partitions_since(deployment, ["unit", "customers", layer], before_ui), (
                    layer
                )
            automated = [r for r in deployment.runs() if r["runId"] not in known and r["runId"] != run_id]
            assert automated and all(r["status"] == "SUCCESS" for r in automated)

            page.goto(f"{deployment.url}/assets/unit/customers/history")
            expect(page.get_by_text("Latest materialization")).to_be_visible(timeout=60_000)
            page.wait_for_timeout(3000)
            shots = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "ui-asset.png"))
        finally:
            browser.close()


def _run_worker(daemon_pid: int) -> int | None:
    """The Python process below the daemon that drives a Spark JVM: a run's worker."""
    for pid in descendants(daemon_pid):
        if "org.apache.spark.deploy.SparkSubmit" in command_line(pid):
            return parent_of(pid)
    return None


def test_stopping_the_daemon_mid_run_loses_nothing(world, spark):
    root, landing, config, deployment = world
    landing.land(range(4, 6))
    wait_for(lambda: any(r["status"] == "STARTED" for r in deployment.runs()), 300, "a run to start")
    daemon_pid = deployment.daemon.pid
    worker = wait_for(lambda: _run_worker(daemon_pid), 300, "a run's Spark driver", every=0.5)
    # The operator restarts the daemon while the run works; the machine also loses the run's
    # process. Its code server reports the run failed; the new daemon retries it.
    deployment.stop_daemon()
    os.kill(worker, signal.SIGKILL)
    time.sleep(5)
    deployment.start_daemon()
    runs = deployment.wait_until_idle(RUN_TIMEOUT)
    retried = [r for r in runs if "dagster/parent_run_id" in r["tags"]]
    assert retried and all(r["status"] == "SUCCESS" for r in retried), [
        (r["status"], r["tags"]) for r in runs
    ]
    for table in TABLES:
        for layer in LAYERS:
            done = {m["partition"] for m in deployment.materialised_partitions(["unit", table, layer])}
            assert {hour_key(4), hour_key(5)} <= done, f"{table}/{layer}"
    assert_lake_equals_a_clean_run(root, config, "unit")


def test_a_failed_run_names_the_damaged_lake_file_and_the_reason(world):
    """A file of the lake's own (customers' open history, which every fold reads) damaged
    outside a run: the sensor's next run of that table fails, and its failure names the file."""
    root, landing, _, deployment = world
    before = {r["runId"] for r in deployment.runs()}
    (damaged,) = (root / "lake" / "history" / "unit" / "customers" / "active").glob("*.parquet")
    damaged.write_bytes(b"not parquet")
    write_events(
        landing.dir,
        "customers",
        7,
        "part-late.parquet",
        [event("cust-x", "INSERT", 9_000_002, at(7), tier="gold")],
    )
    runs = deployment.wait_until_idle(RUN_TIMEOUT)
    failed = [r for r in runs if r["runId"] not in before and r["status"] == "FAILURE"]
    assert len(failed) == 1, [(r["status"], r["tags"]) for r in runs if r["runId"] not in before]
    messages = deployment.failure_messages(failed[0]["runId"])
    assert any(f"the lake file file://{damaged} cannot be read" in m for m in messages), messages
