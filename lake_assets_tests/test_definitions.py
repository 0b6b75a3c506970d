"""The code location as Dagster loads it: validation, asset graph shape, the landing sensor."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from lake_assets.config import FeedConfig, LakeConfig, dump_config
from lake_assets.discovery import discover
from lake_assets.errors import LakeAssetsError
from lake_assets.landing_watch import (
    STRAYS_EVERY_SECONDS,
    BatchCursor,
    TableCursor,
    decode_cursor,
    encode_cursor,
)
from lake_assets.orchestration import sensors
from lake_assets.orchestration.assets import WHOLE_TABLE_RUN_TAG, feed_job_name, follow_upstream
from lake_assets.orchestration.resources import LakeResource
from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
from lake_assets.paths import LakeLayout
from lake_assets.runner import run_feeds
from lake_assets.storage import Storage
from lake_assets_tests.discovered import discovered_definitions
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, hour_dir, write_events

ROOT = Path(__file__).resolve().parent.parent


def _landing(tmp_path):
    landing = tmp_path / "landing" / "unit"
    for hour in (3, 4, 5, 9):
        write_events(
            landing,
            "accounts",
            hour,
            "part-0.parquet",
            [event("a", "I", hour, at(hour), name="x", balance=1)],
            ACCOUNT_SCHEMA,
        )
    write_events(
        landing,
        "cards",
        4,
        "part-0.parquet",
        [event("c", "I", 1, at(4), name="x", balance=1)],
        ACCOUNT_SCHEMA,
    )
    return landing


def _config(tmp_path, landing):
    return LakeConfig(
        lake=f"file://{tmp_path / 'lake'}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),)
    )


def _unit_landing_sensor(tmp_path):
    """The `_landing` of two Unit tables, and (landing, definitions, its landing sensor, the
    sensor's resources)."""
    landing = _landing(tmp_path)
    config = _config(tmp_path, landing)
    defs = discovered_definitions(config)
    return (
        landing,
        defs,
        defs.resolve_sensor_def("unit_landing_sensor"),
        {"lake": LakeResource(root=config.lake)},
    )


WARNINGS_PROBE = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import lake_assets.definitions as location
    defs = location.code_location()
    defs.resolve_asset_graph()
    defs.resolve_all_job_defs()
for w in caught:
    print(f"WARNING {w.category.__name__}: {w.message} ({w.filename}:{w.lineno})")
print("LOADED", len(list(defs.resolve_asset_graph().get_all_asset_keys())))
"""


def test_dagster_validates_the_code_location_without_deprecation_warnings(tmp_path):
    landing = _landing(tmp_path)
    config = _config(tmp_path, landing)
    discover(config, config.storage())  # the tables the code location loads are pinned
    landing.rename(tmp_path / "elsewhere")  # loading never looks at the landing
    config_file = tmp_path / "lake_assets.yaml"
    config_file.write_text(dump_config(config))
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")
    env = {**os.environ, "LAKE_ASSETS_CONFIG": str(config_file), "DAGSTER_HOME": str(home)}
    dagster = Path(sys.executable).parent / "dagster"

    def run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
        )

    proc = run(str(dagster), "definitions", "validate", "-w", str(ROOT / "workspace.yaml"))
    assert (
        proc.returncode == 0
        and "Validation successful for code location lake_assets" in proc.stderr + proc.stdout
    ), proc.stderr

    # Every deprecation warning raised while Dagster builds our definitions, from any module.
    probe = run(sys.executable, "-c", WARNINGS_PROBE)
    assert probe.returncode == 0, probe.stderr
    assert "LOADED 10" in probe.stdout  # 2 tables x raw, catalog, changes, current, history
    # BackfillPolicy is marked beta by Dagster; it is what the single-run backfills need.
    deprecations = [
        line for line in probe.stdout.splitlines() if "Deprecation" in line or "Supersession" in line
    ]
    assert deprecations == [], probe.stdout


def test_asset_graph_per_table(tmp_path):
    defs = discovered_definitions(_config(tmp_path, _landing(tmp_path)))
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    for table in ("accounts", "cards"):  # discovered in the landing folder
        assert {
            f"unit/{table}/{layer}" for layer in ("raw", "catalog", "changes", "current", "history")
        } <= keys
    changes = graph.get(dg.AssetKey(["unit", "accounts", "changes"]))
    assert changes.partitions_def.get_first_partition_key() == "2024-03-01-03"
    assert changes.backfill_policy == dg.BackfillPolicy.single_run()
    history = graph.get(dg.AssetKey(["unit", "accounts", "history"]))
    assert history.parent_keys == {dg.AssetKey(["unit", "accounts", "changes"])}
    for key in keys:
        assert graph.get(dg.AssetKey.from_user_string(key)).description, key


def test_landing_sensor_requests_ranged_runs_once_and_late_files_again(tmp_path):
    landing, defs, sensor, resources = _unit_landing_sensor(tmp_path)

    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        result = sensor(context)
    requests = {
        (r.tags["lake_assets/table"], r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]): r
        for r in result.run_requests
    }
    assert set(requests) == {
        ("accounts", "2024-03-01-03", "2024-03-01-05"),
        ("accounts", "2024-03-01-09", "2024-03-01-09"),
        ("cards", "2024-03-01-04", "2024-03-01-04"),
    }
    assert len({r.run_key for r in result.run_requests}) == 3
    assert all(r.tags[WHOLE_TABLE_RUN_TAG] == "true" for r in result.run_requests)
    assert {o.asset_key for o in result.asset_events} == {
        dg.AssetKey(["unit", "accounts", "raw"]),
        dg.AssetKey(["unit", "cards", "raw"]),
    }

    with dg.build_sensor_context(resources=resources, definitions=defs, cursor=result.cursor) as context:
        quiet = sensor(context)
    assert quiet.run_requests == []

    write_events(
        landing,
        "accounts",
        5,
        "part-late.parquet",
        [event("b", "I", 99, at(5, 30), name="late", balance=2)],
        ACCOUNT_SCHEMA,
    )
    with dg.build_sensor_context(resources=resources, definitions=defs, cursor=quiet.cursor) as context:
        late = sensor(context)
    assert [(r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]) for r in late.run_requests] == [
        ("2024-03-01-05", "2024-03-01-05")
    ]
    assert set(late.run_requests[0].asset_selection) == {
        dg.AssetKey(["unit", "accounts", layer]) for layer in ("catalog", "changes", "current", "history")
    }


def _keep_a_purge(tmp_path, table: str, *partitions: str) -> Path:
    """A kept purge (`purges_seen`) naming `partitions`, as a change-log write leaves it before
    its fold records it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lake_assets.engine.purges import SEEN_IN_PARTITIONS

    folder = tmp_path / "lake" / "_state" / "unit" / table / "purges_seen"
    folder.mkdir(parents=True, exist_ok=True)
    kept = folder / f"part-{len(list(folder.iterdir()))}.parquet"
    named = {SEEN_IN_PARTITIONS: json.dumps(list(partitions)).encode()}
    pq.write_table(pa.table({"id": ["a"]}).replace_schema_metadata(named), kept)
    return kept


class _KeptPurgeTicks:
    """Ticks of the Unit landing sensor on one instance, the kept purges looked for on each."""

    def __init__(self, tmp_path):
        self.landing, self.defs, self.sensor, self.resources = _unit_landing_sensor(tmp_path)
        self.instance = dg.DagsterInstance.ephemeral()
        self.first = self.tick()
        self.cursor = self.first.cursor

    def tick(self, cursor: str | None = None) -> dg.SensorResult:
        """A tick from `cursor` (the one kept, by default), as though the kept purges were last
        looked for long ago."""
        cursors = decode_cursor(cursor or getattr(self, "cursor", None))
        for table, kept in cursors.items():
            cursors[table] = dataclasses.replace(kept, purges_looked_at=None)
        with dg.build_sensor_context(
            resources=self.resources,
            definitions=self.defs,
            cursor=encode_cursor(cursors),
            instance=self.instance,
        ) as context:
            return self.sensor(context)

    def run(self, status: dg.DagsterRunStatus, selection=None, job=None, tags=None) -> dg.DagsterRun:
        """A run on the instance, as Dagster records one of `job` (its asset job by default)."""
        return self.instance.create_run_for_job(
            job or self.defs.resolve_implicit_global_asset_job_def(),
            asset_selection=frozenset(selection) if selection is not None else None,
            status=status,
            tags=tags,
        )


def _ranges(requests) -> list[tuple[str, str, str]]:
    return sorted(
        (r.tags["lake_assets/table"], r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]) for r in requests
    )


def test_a_running_landing_sensor_runs_the_hours_of_a_purge_no_fold_recorded_once_no_run_writes_the_table(
    tmp_path,
):
    """A run stopped between its change-log write and its fold (killed, its retries spent) left
    a kept purge: a later tick runs the hours it names, as one range where they follow each
    other, unless a run that may write the table is in flight (its own fold is yet to come).
    Looked for every `KEPT_PURGES_EVERY_SECONDS`; the same kept files make the same request."""
    ticks = _KeptPurgeTicks(tmp_path)
    _keep_a_purge(tmp_path, "accounts", "2024-03-01-04", "2024-03-01-05")
    with dg.build_sensor_context(
        resources=ticks.resources, definitions=ticks.defs, cursor=ticks.cursor, instance=ticks.instance
    ) as context:
        assert ticks.sensor(context).run_requests == []  # looked for by the first tick, moments ago
    accounts = [dg.AssetKey(["unit", "accounts", "changes"])]
    in_flight = ticks.run(dg.DagsterRunStatus.STARTED, accounts)
    assert ticks.tick().run_requests == []  # its fold may yet record them

    ticks.instance.report_run_failed(in_flight)
    requested = ticks.tick()
    assert _ranges(requested.run_requests) == [("accounts", "2024-03-01-04", "2024-03-01-05")]
    assert decode_cursor(requested.cursor)["accounts"].purges_looked_at is not None
    assert [r.run_key for r in ticks.tick().run_requests] == [requested.run_requests[0].run_key]

    _keep_a_purge(tmp_path, "accounts", "2024-03-01-09")
    late = [event("b", "I", 9, at(9), name="y", balance=2)]
    write_events(ticks.landing, "accounts", 9, "part-late.parquet", late, ACCOUNT_SCHEMA)
    # 09 runs for its late file, which takes its kept purge in
    assert _ranges(ticks.tick().run_requests) == [
        ("accounts", "2024-03-01-04", "2024-03-01-05"),
        ("accounts", "2024-03-01-09", "2024-03-01-09"),
    ]


def test_only_a_run_that_may_write_the_table_holds_back_its_kept_purges_run(tmp_path):
    """A run of another table, or of another table's job, does not hold the run back; one of
    the feed's job over every table, which records no selection, does."""
    ticks = _KeptPurgeTicks(tmp_path)
    _keep_a_purge(tmp_path, "accounts", "2024-03-01-04")
    ticks.run(dg.DagsterRunStatus.STARTED, [dg.AssetKey(["unit", "cards", "changes"])])
    ticks.run(dg.DagsterRunStatus.NOT_STARTED, selection=[])  # Dagster's job over every asset: all of them
    assert ticks.tick().run_requests == []
    for run in ticks.instance.get_runs():
        if not run.asset_selection:
            ticks.instance.report_run_canceled(run)
    assert _ranges(ticks.tick().run_requests) == [("accounts", "2024-03-01-04", "2024-03-01-04")]

    feed_run = ticks.run(dg.DagsterRunStatus.STARTING, job=ticks.defs.resolve_job_def(feed_job_name("unit")))
    assert ticks.tick().run_requests == []
    ticks.instance.report_run_failed(feed_run)
    assert len(ticks.tick().run_requests) == 1


def test_a_failed_kept_purges_run_is_asked_for_again_a_few_times_then_left_to_the_operator(tmp_path, capfd):
    ticks = _KeptPurgeTicks(tmp_path)
    _keep_a_purge(tmp_path, "accounts", "2024-03-01-04")
    keys = []
    for _ in range(sensors.RUN_AGAIN_ATTEMPTS):
        (request,) = ticks.tick().run_requests
        keys.append(request.run_key)
        ticks.run(dg.DagsterRunStatus.FAILURE, request.asset_selection, tags=request.tags)
    assert len(set(keys)) == sensors.RUN_AGAIN_ATTEMPTS  # each failure makes a new request

    assert ticks.tick().run_requests == []
    assert "the sensor asks for no more: `lake-assets run`" in capfd.readouterr().err


def test_a_kept_purges_run_whose_retry_dagster_will_launch_is_not_asked_for_beside_it(tmp_path):
    """A run asked for kept purges failed and Dagster will retry it: until the retry is launched
    no run writes the table, yet a run asked for then would fold the same purges beside the
    retry. The retry is waited for; its own failure is then the one attempt."""
    ticks = _KeptPurgeTicks(tmp_path)
    _keep_a_purge(tmp_path, "accounts", "2024-03-01-04")
    (request,) = ticks.tick().run_requests
    failed = ticks.run(
        dg.DagsterRunStatus.FAILURE,
        request.asset_selection,
        tags={**request.tags, sensors.WILL_RETRY_TAG: "true"},
    )
    assert ticks.tick().run_requests == []

    ticks.instance.add_run_tags(failed.run_id, {sensors.AUTO_RETRY_RUN_ID_TAG: "the-retry"})
    retry = {sensors.RETRY_NUMBER_TAG: "1", sensors.PARENT_RUN_ID_TAG: failed.run_id}
    ticks.run(dg.DagsterRunStatus.FAILURE, request.asset_selection, tags={**request.tags, **retry})
    (again,) = ticks.tick().run_requests
    assert again.run_key.endswith(":1")


def _processed(tmp_path, table: str, hour: int) -> None:
    """A processed note of the hour's landed files as they are, as a run's fold writes it."""
    from lake_assets.processed import ProcessedFile, write_notes

    files = {
        f"file://{path}": ProcessedFile(path.stat().st_size, "hash", int(time.time() * 1000) + 60_000)
        for path in hour_dir(tmp_path / "landing" / "unit", table, hour).glob("*.parquet")
    }
    assert files
    write_notes(
        Storage(), LakeLayout(f"file://{tmp_path / 'lake'}"), "unit", table, {f"2024-03-01-{hour:02d}": files}
    )


def _launched_by(sensor: str, request: dg.RunRequest, **more: str) -> dict[str, str]:
    """A requested run's tags as the daemon launches it for `sensor`."""
    return {**request.tags, sensors.SENSOR_NAME_TAG: sensor, **more}


def _cancel_the_sensors_run_of_three_to_five(ticks: _KeptPurgeTicks) -> None:
    """The landing sensor's first run of accounts (03..05), cancelled."""
    three_to_five = next(r for r in ticks.first.run_requests if r.tags[RANGE_START_TAG] == "2024-03-01-03")
    ticks.run(
        dg.DagsterRunStatus.CANCELED,
        three_to_five.asset_selection,
        tags=_launched_by("unit_landing_sensor", three_to_five),
    )


@pytest.fixture
def looking_every_tick(monkeypatch):
    """Each tick looks at the runs that ended, up to its own start."""
    monkeypatch.setattr(sensors, "RUN_SETTLE_SECONDS", 0)
    monkeypatch.setattr(sensors, "UNFINISHED_EVERY_SECONDS", 0)


def test_dagsters_run_tags_are_spelled_as_dagster_spells_them():
    from dagster._core.storage import tags

    assert sensors.SENSOR_NAME_TAG == tags.SENSOR_NAME_TAG
    assert sensors.AUTOMATION_CONDITION_TAG == tags.AUTOMATION_CONDITION_TAG
    assert sensors.WILL_RETRY_TAG == tags.WILL_RETRY_TAG
    assert sensors.AUTO_RETRY_RUN_ID_TAG == tags.AUTO_RETRY_RUN_ID_TAG
    assert sensors.PARTITION_TAG == tags.PARTITION_NAME_TAG
    assert sensors.PARENT_RUN_ID_TAG == tags.PARENT_RUN_ID_TAG
    assert sensors.RETRY_NUMBER_TAG == tags.RETRY_NUMBER_TAG
    assert (sensors.RANGE_START_TAG, sensors.RANGE_END_TAG) == (
        tags.ASSET_PARTITION_RANGE_START_TAG,
        tags.ASSET_PARTITION_RANGE_END_TAG,
    )


@pytest.mark.usefixtures("looking_every_tick")
def test_the_hours_a_cancelled_or_finally_failed_daemon_run_left_unprocessed_are_asked_for_again(tmp_path):
    """The sensor saw a run's files when it asked for it, and a tick compares the landing with
    its cursor only: the hours of a sensor's run that was cancelled, or failed with its retries
    spent, were never asked for again. The next look asks for those still unprocessed; not for
    a person's run (a UI backfill, a re-execution), nor for a failure Dagster will retry, nor
    for a run that succeeded, nor for an hour processed since, nor for a kept purge's run."""
    ticks = _KeptPurgeTicks(tmp_path)
    asked = {(r.tags["lake_assets/table"], r.tags[RANGE_START_TAG]): r for r in ticks.first.run_requests}
    assert sorted(asked) == [
        ("accounts", "2024-03-01-03"),
        ("accounts", "2024-03-01-09"),
        ("cards", "2024-03-01-04"),
    ]
    three_to_five, nine = asked["accounts", "2024-03-01-03"], asked["accounts", "2024-03-01-09"]
    cards = asked["cards", "2024-03-01-04"]
    landing = "unit_landing_sensor"
    ticks.run(
        dg.DagsterRunStatus.CANCELED, three_to_five.asset_selection, tags=_launched_by(landing, three_to_five)
    )
    _processed(tmp_path, "accounts", 3)  # its fold of 03 finished before the cancel
    ticks.run(dg.DagsterRunStatus.SUCCESS, nine.asset_selection, tags=_launched_by(landing, nine))
    ticks.run(dg.DagsterRunStatus.CANCELED, nine.asset_selection, tags=dict(nine.tags))  # from the UI
    by_hand = _launched_by(landing, nine, **{sensors.PARENT_RUN_ID_TAG: "a-run"})
    ticks.run(dg.DagsterRunStatus.FAILURE, nine.asset_selection, tags=by_hand)  # re-executed by a person
    kept = _launched_by(landing, nine, **{sensors.KEPT_PURGE_TAG: "digest"})
    ticks.run(dg.DagsterRunStatus.FAILURE, nine.asset_selection, tags=kept)  # `_kept_purges`' to ask again
    retried = _launched_by(landing, cards, **{sensors.WILL_RETRY_TAG: "true"})
    ticks.run(dg.DagsterRunStatus.FAILURE, cards.asset_selection, tags=retried)

    result = ticks.tick()

    assert _ranges(result.run_requests) == [("accounts", "2024-03-01-04", "2024-03-01-05")]
    (again,) = result.run_requests
    assert again.tags[sensors.UNFINISHED_TAG] == "true"
    with pytest.MonkeyPatch.context() as patched:  # not looked at again within the interval
        patched.setattr(sensors, "UNFINISHED_EVERY_SECONDS", 300)
        assert ticks.tick(result.cursor).run_requests == []

    # asked for, 04..05 are in flight: held back; cards' retry, Dagster's last, failed too
    in_flight = ticks.run(
        dg.DagsterRunStatus.STARTING, again.asset_selection, tags=_launched_by(landing, again)
    )
    last_retry = _launched_by(
        landing, cards, **{sensors.RETRY_NUMBER_TAG: "2", sensors.PARENT_RUN_ID_TAG: "r"}
    )
    ticks.run(dg.DagsterRunStatus.FAILURE, cards.asset_selection, tags=last_retry)
    assert _ranges(ticks.tick(result.cursor).run_requests) == [("cards", "2024-03-01-04", "2024-03-01-04")]
    ticks.instance.report_run_canceled(in_flight)
    assert _ranges(ticks.tick(result.cursor).run_requests) == [
        ("accounts", "2024-03-01-04", "2024-03-01-05"),
        ("cards", "2024-03-01-04", "2024-03-01-04"),
    ]


@pytest.mark.usefixtures("looking_every_tick")
def test_a_failure_whose_promised_retry_is_never_launched_has_its_hours_asked_for_a_look_later(tmp_path):
    """Dagster tags a failed run it will retry (`dagster/will_retry`), and the retry, once
    launched, on it (`dagster/auto_retry_run_id`). A look holds the hours of a failure whose
    retry is still to come; at the next look, with no retry launched (retries turned off, the
    daemon stopped), they are asked for. A failure whose retry was launched is left to it."""
    ticks = _KeptPurgeTicks(tmp_path)
    asked = {
        r.tags["lake_assets/table"]: r
        for r in ticks.first.run_requests
        if r.tags[RANGE_START_TAG] != "2024-03-01-09"
    }
    accounts, cards = asked["accounts"], asked["cards"]
    promised = {sensors.WILL_RETRY_TAG: "true"}
    ticks.run(
        dg.DagsterRunStatus.FAILURE,
        accounts.asset_selection,
        tags=_launched_by("unit_landing_sensor", accounts, **promised),
    )
    launched = {**promised, sensors.AUTO_RETRY_RUN_ID_TAG: "its-retry"}
    ticks.run(
        dg.DagsterRunStatus.FAILURE,
        cards.asset_selection,
        tags=_launched_by("unit_landing_sensor", cards, **launched),
    )

    held = ticks.tick()
    assert held.run_requests == []
    assert decode_cursor(held.cursor)["accounts"].unfinished_held == [
        "2024-03-01-03",
        "2024-03-01-04",
        "2024-03-01-05",
    ]
    assert decode_cursor(held.cursor)["cards"].unfinished_held == []
    assert _ranges(ticks.tick(held.cursor).run_requests) == [("accounts", "2024-03-01-03", "2024-03-01-05")]


def _failed_with_a_retry_promised(
    ticks: "_KeptPurgeTicks",
) -> tuple[dg.RunRequest, dg.DagsterRun, dg.SensorResult]:
    """The sensor's run of 03..05 failed with a Dagster retry promised, and the look that waits
    for it: (that run's request, the failed run, the look)."""
    three_to_five = next(r for r in ticks.first.run_requests if r.tags[RANGE_START_TAG] == "2024-03-01-03")
    first = ticks.run(
        dg.DagsterRunStatus.FAILURE,
        three_to_five.asset_selection,
        tags=_launched_by("unit_landing_sensor", three_to_five, **{sensors.WILL_RETRY_TAG: "true"}),
    )
    waiting = ticks.tick()
    assert waiting.run_requests == []
    return three_to_five, first, waiting


@pytest.mark.usefixtures("looking_every_tick")
def test_each_failure_in_a_chain_of_dagster_retries_is_waited_for_its_retry(tmp_path):
    """A sensor's run fails and Dagster will retry it; the retry runs while the next look comes,
    then fails with another retry promised. Each promise is waited for a look, however long the
    hours were held: only when the last retry never comes are they asked for."""
    ticks = _KeptPurgeTicks(tmp_path)
    three_to_five, first, waiting = _failed_with_a_retry_promised(ticks)
    sensor, promised = "unit_landing_sensor", {sensors.WILL_RETRY_TAG: "true"}
    retry = {sensors.RETRY_NUMBER_TAG: "1", sensors.PARENT_RUN_ID_TAG: first.run_id}
    ticks.instance.add_run_tags(first.run_id, {sensors.AUTO_RETRY_RUN_ID_TAG: "the-retry"})
    running = ticks.run(
        dg.DagsterRunStatus.STARTED,
        three_to_five.asset_selection,
        tags=_launched_by(sensor, three_to_five, **retry),
    )
    in_flight = ticks.tick(waiting.cursor)
    assert in_flight.run_requests == []
    ticks.instance.report_run_failed(running)  # with another retry promised
    ticks.instance.add_run_tags(running.run_id, promised)
    waiting_again = ticks.tick(in_flight.cursor)
    assert waiting_again.run_requests == []
    assert _ranges(ticks.tick(waiting_again.cursor).run_requests) == [
        ("accounts", "2024-03-01-03", "2024-03-01-05")
    ]


@pytest.mark.usefixtures("looking_every_tick")
def test_a_retry_failing_before_the_next_look_is_waited_for_as_well(tmp_path):
    """A slow daemon: the run fails with a retry promised, the look waits; before the next look
    the retry was launched and failed too, with another promised. That promise is another run's:
    it is waited for too (the hours were not asked for beside the third attempt), and only when
    the third attempt never comes are the hours asked for."""
    ticks = _KeptPurgeTicks(tmp_path)
    three_to_five, first, waiting = _failed_with_a_retry_promised(ticks)
    sensor, promised = "unit_landing_sensor", {sensors.WILL_RETRY_TAG: "true"}
    retry = {sensors.RETRY_NUMBER_TAG: "1", sensors.PARENT_RUN_ID_TAG: first.run_id, **promised}
    second = ticks.run(
        dg.DagsterRunStatus.FAILURE,
        three_to_five.asset_selection,
        tags=_launched_by(sensor, three_to_five, **retry),
    )
    ticks.instance.add_run_tags(first.run_id, {sensors.AUTO_RETRY_RUN_ID_TAG: second.run_id})
    waiting_again = ticks.tick(waiting.cursor)
    assert waiting_again.run_requests == []
    assert decode_cursor(waiting_again.cursor)["accounts"].retries_awaited == [second.run_id]
    assert _ranges(ticks.tick(waiting_again.cursor).run_requests) == [
        ("accounts", "2024-03-01-03", "2024-03-01-05")
    ]


@pytest.mark.usefixtures("looking_every_tick")
def test_a_failure_dagster_retried_counts_once_and_one_whose_retry_never_came_counts(tmp_path, capfd):
    """Runs asked for an hour range fail, each with Dagster's word that it will retry and its
    retry never launched, and beside each a failure Dagster did retry (its retry counts for
    it). Each look holds the range for the retry to come, the next asks for it again, until
    `RUN_AGAIN_ATTEMPTS` such failures: then the sensor asks for no more."""
    ticks = _KeptPurgeTicks(tmp_path)
    three_to_five = next(r for r in ticks.first.run_requests if r.tags[RANGE_START_TAG] == "2024-03-01-03")
    asked_again = {sensors.UNFINISHED_TAG: "true", sensors.WILL_RETRY_TAG: "true"}
    cursor, requests = ticks.cursor, []
    for _ in range(sensors.RUN_AGAIN_ATTEMPTS):
        for retried in ({}, {sensors.AUTO_RETRY_RUN_ID_TAG: "its-retry"}):
            tags = _launched_by("unit_landing_sensor", three_to_five, **asked_again, **retried)
            ticks.run(dg.DagsterRunStatus.FAILURE, three_to_five.asset_selection, tags=tags)
        held = ticks.tick(cursor)  # the retry may yet come
        assert held.run_requests == []
        looked = ticks.tick(held.cursor)
        requests.append(_ranges(looked.run_requests))
        cursor = looked.cursor
    three_hours = [("accounts", "2024-03-01-03", "2024-03-01-05")]
    assert requests == [three_hours, three_hours, []]
    assert "the sensor asks for no more" in capfd.readouterr().err


@pytest.mark.usefixtures("looking_every_tick")
def test_a_tick_reads_a_bounded_number_of_hours_and_leaves_the_rest_to_the_next(tmp_path, monkeypatch):
    """Cancelled runs over long ranges: a tick's looks read the notes of a bounded number of
    hours, for all tables together (about three requests each on S3), so that the tick stays
    inside Dagster's 60 s; the rest wait on their table's cursor, and go first at its next look
    (the cancelled run, seen again by it, would otherwise take the share again)."""
    monkeypatch.setattr(sensors, "UNFINISHED_PARTITIONS_PER_TICK", 2)
    ticks = _KeptPurgeTicks(tmp_path)
    _cancel_the_sensors_run_of_three_to_five(ticks)
    cards = next(r for r in ticks.first.run_requests if r.tags["lake_assets/table"] == "cards")
    ticks.run(
        dg.DagsterRunStatus.CANCELED, cards.asset_selection, tags=_launched_by("unit_landing_sensor", cards)
    )

    first = ticks.tick()
    assert _ranges(first.run_requests) == [("accounts", "2024-03-01-03", "2024-03-01-04")]
    held = {table: cursor.unfinished_held for table, cursor in decode_cursor(first.cursor).items()}
    assert held == {"accounts": ["2024-03-01-05"], "cards": ["2024-03-01-04"]}
    for hour in (3, 4):  # the run asked for processed them
        _processed(tmp_path, "accounts", hour)
    assert _ranges(ticks.tick(first.cursor).run_requests) == [
        ("accounts", "2024-03-01-05", "2024-03-01-05"),
        ("cards", "2024-03-01-04", "2024-03-01-04"),
    ]


def test_a_file_landing_in_an_hour_older_than_the_late_window_is_found_by_the_daily_look(
    tmp_path, monkeypatch, capfd
):
    """The scans list the late window only (from 05, the latest hour 09 less 4). A file that
    lands in 03 after it was processed, say while a backfill ran, is found by the table's look at
    its old hours (once a day, one table a tick), as a first scan would find it: a run of 03 alone.
    An hour a run in flight may write is left to it."""
    ticks = _KeptPurgeTicks(tmp_path)
    for hour in (3, 4, 5, 9):
        _processed(tmp_path, "accounts", hour)
    _processed(tmp_path, "cards", 4)
    late = [event("b", "I", 30, at(3, 30), name="late", balance=2)]
    write_events(ticks.landing, "accounts", 3, "part-late.parquet", late, ACCOUNT_SCHEMA)
    assert ticks.tick().run_requests == []  # looked at by the first scan, moments ago

    monkeypatch.setattr(sensors, "OLD_PARTITIONS_EVERY_SECONDS", 0)
    in_flight = ticks.run(
        dg.DagsterRunStatus.STARTED,
        [dg.AssetKey(["unit", "accounts", "changes"])],
        tags={sensors.PARTITION_TAG: "2024-03-01-03"},
    )
    assert ticks.tick().run_requests == []
    ticks.instance.report_run_failed(in_flight)
    looked = ticks.tick()
    assert _ranges(looked.run_requests) == [("accounts", "2024-03-01-03", "2024-03-01-03")]
    assert (
        "1 hour(s) older than the late window changed since the lake processed them" in capfd.readouterr().err
    )
    assert decode_cursor(looked.cursor)["accounts"].old_partitions_looked_at is not None


def test_the_daily_look_at_old_partitions_is_the_turn_of_a_table_holding_partitions():
    """A table scanned whose landing holds no hour has no old hour to look at: it never takes
    the turn (it would keep it, tick after tick, from every other table)."""
    cursors = {
        "empty": TableCursor(scanned=True),
        "long": TableCursor(scanned=True, high_water="2024-03-01-09", old_partitions_looked_at=5.0),
    }
    assert sensors._old_partitions_turn(cursors, ["empty", "long"]) == "long"
    batches = {"none": BatchCursor(scanned=True), "two": BatchCursor(scanned=True, last="065e11a81")}
    assert sensors._old_partitions_turn(batches, ["none", "two"]) == "two"


@pytest.mark.usefixtures("looking_every_tick")
def test_a_damaged_note_leaves_the_look_the_hours_without_a_processed_note(tmp_path, capfd):
    """A note the look reads besides the processed notes cannot be read (here the table's
    requests to run again: a folder named like no partition). The hours a cancelled daemon run
    left are still asked for, those without a processed note, and the tick's log says why."""
    from lake_assets import reruns

    ticks = _KeptPurgeTicks(tmp_path)
    _cancel_the_sensors_run_of_three_to_five(ticks)
    _processed(tmp_path, "accounts", 3)
    requests = reruns.reruns_folder(LakeLayout(f"file://{tmp_path / 'lake'}"), "unit", "accounts")
    (Path(requests.removeprefix("file://")) / "not-an-hour").mkdir(parents=True)

    assert _ranges(ticks.tick().run_requests) == [("accounts", "2024-03-01-04", "2024-03-01-05")]
    assert "the partitions cancelled or failed runs left are those without a processed note" in (
        capfd.readouterr().err
    )


def test_a_tick_asks_the_instance_again_only_for_a_look_reaching_further_back():
    """The tables of a tick share one question to the instance about the runs that ended; a
    table whose last look was earlier than the others' asks only for the stretch before it."""
    import datetime as dt
    from types import SimpleNamespace

    class Instance:
        def __init__(self, updated: dict[str, float]):
            self.updated = updated
            self.asked: list[tuple[float, float]] = []

        def get_run_records(self, filters):
            after, before = filters.updated_after.timestamp(), filters.updated_before.timestamp()
            self.asked.append((after, before))
            return [
                SimpleNamespace(
                    update_timestamp=dt.datetime.fromtimestamp(at, dt.UTC),
                    dagster_run=SimpleNamespace(run_id=run),
                )
                for run, at in self.updated.items()
                if after < at < before
            ]

    overlap = sensors.UNFINISHED_OVERLAP_SECONDS
    instance = Instance({"old": 1_000.0, "recent": 5_000.0, "late-clock": 4_000.0 - overlap / 2})
    tick = sensors._Tick(
        context=SimpleNamespace(instance=instance),
        storage=Storage(),
        layout=LakeLayout("file:///lake"),
        feed=None,
        fmt=None,
        looked_until=6_000.0,
    )

    def ended(since: float) -> list[str]:
        return sorted(run.run_id for run in tick.ended_since(since))

    assert ended(4_000.0) == ["late-clock", "recent"]
    assert ended(4_500.0) == ["recent"]  # from what was asked already
    assert len(instance.asked) == 1
    assert ended(500.0) == ["late-clock", "old", "recent"]
    assert instance.asked == [(4_000.0 - overlap, 6_000.0), (500.0 - overlap, 4_000.0 - overlap + 1)]


@pytest.mark.usefixtures("looking_every_tick")
def test_hours_a_run_in_flight_may_write_are_looked_at_again_when_it_ends(tmp_path):
    """A sensor's run over 03..05 was cancelled while a person's run of 04 was in flight: 03 and
    05 are asked for, 04 waits for that run. The person's run failed too: 04 is asked for then,
    though the cancelled run ended before the look that finds it."""
    ticks = _KeptPurgeTicks(tmp_path)
    three_to_five = next(r for r in ticks.first.run_requests if r.tags[RANGE_START_TAG] == "2024-03-01-03")
    person = ticks.run(
        dg.DagsterRunStatus.STARTED,
        three_to_five.asset_selection,
        tags={sensors.PARTITION_TAG: "2024-03-01-04"},
    )
    ticks.run(
        dg.DagsterRunStatus.CANCELED,
        three_to_five.asset_selection,
        tags=_launched_by("unit_landing_sensor", three_to_five),
    )

    first = ticks.tick()
    assert _ranges(first.run_requests) == [
        ("accounts", "2024-03-01-03", "2024-03-01-03"),
        ("accounts", "2024-03-01-05", "2024-03-01-05"),
    ]
    assert decode_cursor(first.cursor)["accounts"].unfinished_held == ["2024-03-01-04"]
    for request in first.run_requests:  # both succeed
        _processed(tmp_path, "accounts", int(request.tags[RANGE_START_TAG][-2:]))
    ticks.instance.report_run_failed(person)

    assert _ranges(ticks.tick(first.cursor).run_requests) == [("accounts", "2024-03-01-04", "2024-03-01-04")]


@pytest.mark.usefixtures("looking_every_tick")
def test_an_automation_run_that_ended_unsuccessfully_has_its_partition_asked_for_again(tmp_path):
    ticks = _KeptPurgeTicks(tmp_path)
    for hour in (3, 4, 5):
        _processed(tmp_path, "accounts", hour)
    state = [dg.AssetKey(["unit", "accounts", layer]) for layer in ("current", "history")]
    automation = {sensors.AUTOMATION_CONDITION_TAG: "true", sensors.PARTITION_TAG: "2024-03-01-09"}
    ticks.run(dg.DagsterRunStatus.FAILURE, state, tags=automation)
    assert _ranges(ticks.tick().run_requests) == [("accounts", "2024-03-01-09", "2024-03-01-09")]


@pytest.mark.usefixtures("looking_every_tick")
def test_a_sensors_first_look_at_ended_runs_only_starts_the_watch(tmp_path):
    """Runs cancelled before the look began (a deployment upgraded to it) are not brought back."""
    ticks = _KeptPurgeTicks(tmp_path)
    nine = next(r for r in ticks.first.run_requests if r.tags[RANGE_START_TAG] == "2024-03-01-09")
    ticks.run(
        dg.DagsterRunStatus.CANCELED, nine.asset_selection, tags=_launched_by("unit_landing_sensor", nine)
    )
    cursors = {
        table: dataclasses.replace(cursor, unfinished_looked_until=None)
        for table, cursor in decode_cursor(ticks.cursor).items()
    }
    started = ticks.tick(encode_cursor(cursors))
    assert not [r for r in started.run_requests if sensors.UNFINISHED_TAG in r.tags]
    assert decode_cursor(started.cursor)["accounts"].unfinished_looked_until is not None


@pytest.mark.usefixtures("looking_every_tick")
def test_unfinished_hours_are_asked_for_a_few_times_counted_per_hour(tmp_path, capfd):
    """Each failed run asked for an hour counts for that hour, whatever range it was asked in: a
    new failing hour beside spent ones does not start their count again."""
    ticks = _KeptPurgeTicks(tmp_path)
    for hour in (3, 4, 5):
        _processed(tmp_path, "accounts", hour)
    nine = next(r for r in ticks.first.run_requests if r.tags[RANGE_START_TAG] == "2024-03-01-09")
    ticks.run(
        dg.DagsterRunStatus.CANCELED, nine.asset_selection, tags=_launched_by("unit_landing_sensor", nine)
    )
    in_flight = ticks.run(dg.DagsterRunStatus.STARTED, selection=[])  # may write any partition
    assert ticks.tick().run_requests == []
    ticks.instance.report_run_canceled(in_flight)  # a person's run: not asked for again

    for _ in range(sensors.RUN_AGAIN_ATTEMPTS):
        (request,) = ticks.tick().run_requests
        assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == ("2024-03-01-09",) * 2
        ticks.run(
            dg.DagsterRunStatus.FAILURE,
            request.asset_selection,
            tags=_launched_by("unit_landing_sensor", request),
        )
    assert ticks.tick().run_requests == []
    assert "failed to process what cancelled or failed runs left; the sensor asks for no more" in (
        capfd.readouterr().err
    )

    write_events(
        ticks.landing, "accounts", 10, "part-0.parquet", [event("z", "I", 10, at(10))], ACCOUNT_SCHEMA
    )
    landed = ticks.tick()
    (ten,) = landed.run_requests  # the sensor's run of the new hour
    assert ten.tags[RANGE_START_TAG] == "2024-03-01-10"
    ranged = {**_launched_by("unit_landing_sensor", ten), RANGE_START_TAG: "2024-03-01-09"}
    ticks.run(dg.DagsterRunStatus.FAILURE, ten.asset_selection, tags=ranged)  # over 09..10, failed
    assert _ranges(ticks.tick(landed.cursor).run_requests) == [("accounts", "2024-03-01-10", "2024-03-01-10")]


@pytest.mark.usefixtures("looking_every_tick")
def test_the_batches_a_cancelled_batch_sensor_run_left_are_asked_for_again(tmp_path):
    """The same for GRAX: the run's range of batches is read from the instance's batches."""
    from lake_assets_tests import grax_lake

    landing, batches = tmp_path / "landing", ("065e11a80", "065e11a81")
    for batch in batches:
        grax_lake.land(landing, batch, "data-0.parquet", [grax_lake.version("A", 1, "0001", name="a")])
    config = grax_lake.config_for(landing, tmp_path / "lake")
    defs = discovered_definitions(config)
    sensor, instance = defs.resolve_sensor_def("grax_batch_sensor"), dg.DagsterInstance.ephemeral()

    def tick(cursor: str | None) -> dg.SensorResult:
        with dg.build_sensor_context(
            resources={"lake": LakeResource(root=config.lake)},
            definitions=defs,
            cursor=cursor,
            instance=instance,
        ) as context:
            result = sensor(context)
        for request in result.dynamic_partitions_requests or ():
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return result

    first = tick(None)
    (run,) = first.run_requests
    assert (run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]) == batches
    instance.create_run_for_job(
        defs.resolve_implicit_global_asset_job_def(),
        asset_selection=frozenset(run.asset_selection or ()),
        status=dg.DagsterRunStatus.CANCELED,
        tags=_launched_by("grax_batch_sensor", run),
    )

    (again,) = tick(first.cursor).run_requests

    assert (again.tags[RANGE_START_TAG], again.tags[RANGE_END_TAG]) == batches
    assert again.tags[sensors.UNFINISHED_TAG] == "true"


def test_a_tick_that_cannot_ask_the_instance_for_runs_in_flight_still_runs_the_files_it_found(
    tmp_path, monkeypatch
):
    """The look for kept purges fails (the instance's run storage out of reach): the late file
    found in the same tick still gets its run, and the next tick looks for the purges again."""
    ticks = _KeptPurgeTicks(tmp_path)
    _keep_a_purge(tmp_path, "accounts", "2024-03-01-04")
    late = [event("b", "I", 9, at(9), name="y", balance=2)]
    write_events(ticks.landing, "accounts", 9, "part-late.parquet", late, ACCOUNT_SCHEMA)

    def out_of_reach(*args, **kwargs):
        raise ConnectionError("run storage out of reach")

    with monkeypatch.context() as patched:
        patched.setattr(ticks.instance, "get_run_records", out_of_reach)
        failing = ticks.tick()
    assert _ranges(failing.run_requests) == [("accounts", "2024-03-01-09", "2024-03-01-09")]
    assert _ranges(ticks.tick(failing.cursor).run_requests) == [
        ("accounts", "2024-03-01-04", "2024-03-01-04")
    ]


def test_a_landing_sensor_started_after_a_cli_backfill_runs_only_what_changed_since(tmp_path, spark):
    """The README's deployment: `lake-assets run` does the backfill, then the daemon starts. The
    sensor's first tick (no cursor) must not take every landed hour for new: it folded the whole
    history again, ahead of the hours that were really new. It runs the hours whose files differ
    from those the lake processed them with (a late file, a new hour), and remembers the rest."""
    landing, defs, sensor, resources = _unit_landing_sensor(tmp_path)
    run_feeds(_config(tmp_path, landing), instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
    late = [event("b", "I", 99, at(5, 30), name="late", balance=2)]
    write_events(landing, "accounts", 5, "part-late.parquet", late, ACCOUNT_SCHEMA)
    write_events(
        landing,
        "accounts",
        10,
        "part-0.parquet",
        [event("n", "I", 1, at(10), name="new", balance=1)],
        ACCOUNT_SCHEMA,
    )

    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        first = sensor(context)
    assert sorted(
        (r.tags["lake_assets/table"], r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG])
        for r in first.run_requests
    ) == [("accounts", "2024-03-01-05", "2024-03-01-05"), ("accounts", "2024-03-01-10", "2024-03-01-10")]

    # every hour is remembered now: only a change since this tick runs
    with dg.build_sensor_context(resources=resources, definitions=defs, cursor=first.cursor) as context:
        assert sensor(context).run_requests == []
    write_events(landing, "accounts", 9, "part-late.parquet", late, ACCOUNT_SCHEMA)
    with dg.build_sensor_context(resources=resources, definitions=defs, cursor=first.cursor) as context:
        assert [r.tags[RANGE_START_TAG] for r in sensor(context).run_requests] == ["2024-03-01-09"]


def test_tables_still_to_scan_for_the_first_time_wait_for_the_next_tick_once_one_has_run_long(
    tmp_path, monkeypatch, capfd
):
    """A first scan reads every note the lake keeps of the table: a feed of several long tables
    would pass the 60 s Dagster gives a sensor's evaluation on every tick, and no cursor would
    ever be saved. Past `FIRST_SCANS_SECONDS` (here at once), the tick leaves the other tables'
    first scans to the next tick, and says so; the next tick takes them, and the tables already
    scanned go on as usual."""
    monkeypatch.setattr(sensors, "FIRST_SCANS_SECONDS", 0)
    landing, defs, sensor, resources = _unit_landing_sensor(tmp_path)

    def tables_run(cursor):
        with dg.build_sensor_context(resources=resources, definitions=defs, cursor=cursor) as context:
            result = sensor(context)
        return sorted({r.tags["lake_assets/table"] for r in result.run_requests}), result.cursor

    first, cursor = tables_run(None)
    assert first == ["accounts"]
    assert "unit/cards: its first scan waits for the next tick" in capfd.readouterr().err
    write_events(
        landing,
        "accounts",
        10,
        "part-0.parquet",
        [event("n", "I", 10, at(10), name="x", balance=1)],
        ACCOUNT_SCHEMA,
    )
    second, cursor = tables_run(cursor)
    assert second == ["accounts", "cards"]
    assert tables_run(cursor)[0] == []


def test_a_first_scan_that_runs_long_and_fails_lets_the_tables_waiting_behind_it_go_first(
    tmp_path, monkeypatch, capfd
):
    """Tables waiting for a first scan took them in name order: a first table whose scan ran
    past `FIRST_SCANS_SECONDS` (here at once) and then failed took every tick's time, and the
    tables after it were never scanned. The failed try is now kept on its cursor, the tables
    not tried yet go before it on the next tick, and a tick that leaves tables waiting does
    not fail, so the try is saved."""
    monkeypatch.setattr(sensors, "FIRST_SCANS_SECONDS", 0)
    _landing, defs, sensor, resources = _unit_landing_sensor(tmp_path)
    processed_with = sensors._processed_with

    def accounts_cannot_be_scanned(tick, table):
        if table == "accounts":
            raise LakeAssetsError("the store timed out listing accounts' notes")
        return processed_with(tick, table)

    monkeypatch.setattr(sensors, "_processed_with", accounts_cannot_be_scanned)

    def tick(cursor):
        with dg.build_sensor_context(resources=resources, definitions=defs, cursor=cursor) as context:
            result = sensor(context)
        return sorted({r.tags["lake_assets/table"] for r in result.run_requests}), result.cursor

    first, cursor = tick(None)
    assert first == []
    logged = capfd.readouterr().err
    assert "unit/accounts: its landing could not be scanned" in logged
    assert "unit/cards: its first scan waits for the next tick" in logged
    second, cursor = tick(cursor)
    assert second == ["cards"]
    assert "unit/accounts: its first scan waits for the next tick" in capfd.readouterr().err
    monkeypatch.setattr(sensors, "_processed_with", processed_with)  # the store answers again
    third, _ = tick(cursor)
    assert third == ["accounts"]


def test_a_table_whose_scan_keeps_failing_passes_the_strays_turn_on(tmp_path, monkeypatch):
    """The strays turn goes to the due table walked longest ago, and only a scan that got as
    far as the walk marked it walked: a table whose scan failed every tick kept the turn, and
    no other table's strays were ever looked for. The turn is now marked taken when the scan
    begins."""
    _landing, defs, sensor, resources = _unit_landing_sensor(tmp_path)

    def tick(cursor):
        with dg.build_sensor_context(resources=resources, definitions=defs, cursor=cursor) as context:
            return sensor(context).cursor

    cursors = decode_cursor(tick(None))
    both_due = encode_cursor(
        {name: dataclasses.replace(c, strays_looked_at=None) for name, c in cursors.items()}
    )
    assert sensors._strays_turn(decode_cursor(both_due), ["accounts", "cards"]) == "accounts"
    scan_table = sensors.scan_table

    def accounts_cannot_be_scanned(storage, fmt, landing, table, *rest):
        if table == "accounts":
            raise LakeAssetsError("the store timed out listing accounts")
        return scan_table(storage, fmt, landing, table, *rest)

    monkeypatch.setattr(sensors, "scan_table", accounts_cannot_be_scanned)
    after = decode_cursor(tick(both_due))

    assert sensors._strays_turn(after, ["accounts", "cards"]) == "cards"
    assert after["accounts"].high_water == cursors["accounts"].high_water  # what it had seen is kept


def test_the_strays_turn_goes_to_a_table_the_tick_scans():
    """The strays turn went to the due table walked longest ago, and a table never scanned
    counts as never walked: when its first scan then waited for a later tick, no table was
    walked for strays, tick after tick. Tables scanned before now come first; among tables
    never scanned, the one the tick scans first."""
    now = time.time()
    walked_long_ago = TableCursor(scanned=True, strays_looked_at=now - 2 * STRAYS_EVERY_SECONDS)
    assert sensors._strays_turn({"cards": walked_long_ago}, ["accounts", "cards"]) == "cards"
    tried = TableCursor(first_scan_tried_at=now - 60)
    assert sensors._strays_turn({"accounts": tried}, ["accounts", "cards"]) == "cards"
    walked_just_now = TableCursor(scanned=True, strays_looked_at=now)
    assert (
        sensors._strays_turn({"accounts": tried, "cards": walked_just_now}, ["accounts", "cards"])
        == "accounts"
    )


def test_a_landing_gone_blank_is_scanned_for_the_first_time_once(tmp_path, monkeypatch):
    """Every file of a table went after `lake-assets run` processed it. The first tick finds its
    hours emptied (their runs meet the blank-landing rule); its cursor, which has seen no file,
    must still say the table was scanned, or every tick would be a first one and read every
    note the lake keeps of the table again."""
    landing, defs, sensor, resources = _unit_landing_sensor(tmp_path)
    run_feeds(_config(tmp_path, landing), instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
    shutil.rmtree(landing / "cards")
    notes_read, read_notes = [], sensors.read_notes
    monkeypatch.setattr(sensors, "read_notes", lambda *args: notes_read.append(args[3]) or read_notes(*args))

    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        first = sensor(context)
    assert [(r.tags["lake_assets/table"], r.tags[RANGE_START_TAG]) for r in first.run_requests] == [
        ("cards", "2024-03-01-04")
    ]
    with dg.build_sensor_context(resources=resources, definitions=defs, cursor=first.cursor) as context:
        assert sensor(context).run_requests == []

    assert notes_read == ["accounts", "cards"]


def test_a_first_tick_runs_an_hour_stored_and_never_folded_whose_files_went_and_removes_its_changes(tmp_path):
    """An hour's change log was written and its fold never ran (a run killed before it, or
    `changes` materialised alone); then its files went. A first tick remembers no file of it:
    it finds the hour from its note of changes stored, and the run removes its changes, as
    `lake-assets run` does."""
    from lake_assets.orchestration.definitions import feed_job_name

    landing, defs, sensor, resources = _unit_landing_sensor(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    run_feeds(_config(tmp_path, landing), instance=instance, say=lambda _: None)
    hour_6 = write_events(
        landing,
        "cards",
        6,
        "part-0.parquet",
        [event("z", "I", 6, at(6), name="z", balance=1)],
        ACCOUNT_SCHEMA,
    )
    job = defs.resolve_job_def(feed_job_name("unit"))
    changes_alone = [dg.AssetKey(["unit", "cards", layer]) for layer in ("catalog", "changes")]
    assert job.execute_in_process(
        instance=instance, partition_key="2024-03-01-06", asset_selection=changes_alone
    ).success
    changes = tmp_path / "lake" / "changes" / "unit" / "cards"
    assert "z" in _keys_in(changes)
    shutil.rmtree(hour_6.parent)

    with dg.build_sensor_context(resources=resources, definitions=defs, instance=instance) as context:
        first = sensor(context)
    assert [(r.tags["lake_assets/table"], r.tags[RANGE_START_TAG]) for r in first.run_requests] == [
        ("cards", "2024-03-01-06")
    ]
    (request,) = first.run_requests
    assert job.execute_in_process(
        instance=instance, tags=request.tags, asset_selection=request.asset_selection
    ).success
    assert "z" not in _keys_in(changes) and "c" in _keys_in(changes)


def _keys_in(layer: Path) -> set[str]:
    """The keys of the rows a layer's Parquet files hold."""
    import pyarrow.parquet as pq

    return {
        key
        for path in layer.rglob("*.parquet")
        for key in pq.read_table(path, columns=["id"])["id"].to_pylist()
    }


def test_a_damaged_note_of_changes_never_folded_costs_a_first_scan_only_what_it_names(tmp_path, capfd):
    """A first scan reads the notes of changes stored and never folded to find such partitions
    whose files are all gone. One of them damaged must not make the scan take every landed hour
    for new (what a damaged processed note does, since nothing then says what was processed):
    the scan goes on without it, and says so."""
    landing, defs, sensor, resources = _unit_landing_sensor(tmp_path)
    run_feeds(_config(tmp_path, landing), instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
    stored = tmp_path / "lake" / "_state" / "unit" / "accounts" / "stored"
    (stored / "2024-03-01-01.json").write_text("{not json")  # an hour no run processed

    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        assert sensor(context).run_requests == []
    assert "the notes of its changes stored and never folded are not read" in capfd.readouterr().err


def test_the_landing_sensor_runs_no_hour_before_the_first_partition_and_says_so(tmp_path, capfd):
    """With `start` after the first landed hours, the sensor asked for one run over 03..05,
    which Dagster refused whole (03 is no partition): 04 and 05 were never run, and the next
    tick asked for nothing. The hours from `start` run; the others are named in the tick's log."""
    landing = _landing(tmp_path)
    config = _config(tmp_path, landing)
    config = config.replace(feeds=[config.feeds[0].model_copy(update={"start": "2024-03-01-04"})])
    defs = discovered_definitions(config)
    sensor = defs.resolve_sensor_def("unit_landing_sensor")
    resources = {"lake": LakeResource(root=config.lake)}
    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        result = sensor(context)
    assert {
        (r.tags["lake_assets/table"], r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG])
        for r in result.run_requests
    } == {
        ("accounts", "2024-03-01-04", "2024-03-01-05"),
        ("accounts", "2024-03-01-09", "2024-03-01-09"),
        ("cards", "2024-03-01-04", "2024-03-01-04"),
    }
    assert (
        "unit/accounts: 1 hour(s) with files before the first partition 2024-03-01-04 are not run: "
        "2024-03-01-03." in capfd.readouterr().err
    )


def test_downstream_layers_follow_outside_updates_but_not_whole_table_runs():
    """A ranged run that wrote every layer must not make the automation re-run its older hours;
    a ranged run killed after its upstream step has every one of its hours re-run downstream.

    The automation tick may see the upstream layer's materialisations before the downstream
    ones of the same run; only the run tag tells them apart from an update made elsewhere.
    """
    hours = dg.HourlyPartitionsDefinition(start_date="2024-03-01-00:00", end_date="2024-03-01-04:00")
    single_run = dg.BackfillPolicy.single_run()
    downstream_fails = False

    @dg.asset(partitions_def=hours, backfill_policy=single_run)
    def upstream() -> None:
        pass

    @dg.asset(
        partitions_def=hours,
        backfill_policy=single_run,
        deps=[upstream],
        automation_condition=follow_upstream(),
    )
    def downstream() -> None:
        if downstream_fails:
            raise RuntimeError("killed")

    instance = dg.DagsterInstance.ephemeral()
    # Dagster reads "new" updates after the previous tick's last event: give that tick one.
    assert dg.materialize([upstream, downstream], instance=instance, partition_key="2024-03-01-03:00").success
    cursor = dg.evaluate_automation_conditions(defs=[upstream, downstream], instance=instance).cursor

    def run_upstream(first: str, last: str, tags: dict[str, str]):
        result = dg.materialize(
            [upstream, downstream],
            selection=[upstream],
            instance=instance,
            tags={RANGE_START_TAG: first, RANGE_END_TAG: last, **tags},
        )
        assert result.success

    def requested(previous_cursor):
        evaluation = dg.evaluate_automation_conditions(
            defs=[upstream, downstream], instance=instance, cursor=previous_cursor
        )
        return evaluation.get_requested_partitions(downstream.key), evaluation.cursor

    run_upstream("2024-03-01-00:00", "2024-03-01-02:00", {WHOLE_TABLE_RUN_TAG: "true"})
    after_whole_table_run, cursor = requested(cursor)
    assert after_whole_table_run == set()

    run_upstream("2024-03-01-01:00", "2024-03-01-02:00", {})
    after_outside_update, cursor = requested(cursor)
    assert after_outside_update == {"2024-03-01-01:00", "2024-03-01-02:00"}

    def run_both(first: str, last: str) -> bool:
        return dg.materialize(
            [upstream, downstream],
            instance=instance,
            tags={RANGE_START_TAG: first, RANGE_END_TAG: last},
            raise_on_error=False,
        ).success

    assert run_both("2024-03-01-00:00", "2024-03-01-02:00")
    after_run_of_both, cursor = requested(cursor)
    assert after_run_of_both == set()

    downstream_fails = True
    assert not run_both("2024-03-01-00:00", "2024-03-01-02:00")
    after_killed_run, cursor = requested(cursor)
    assert after_killed_run == {"2024-03-01-00:00", "2024-03-01-01:00", "2024-03-01-02:00"}


def test_a_table_whose_landing_cannot_be_scanned_stops_no_other_tables_runs(tmp_path, monkeypatch, capfd):
    """One table's listing fails (a folder the daemon may not list, the store out of reach): the
    tick still asks for the other tables' runs, names the failure in its log, and keeps that
    table's cursor, so the next tick that can list it asks for what landed meanwhile only. A
    tick that can scan no table fails."""
    landing, defs, sensor, resources = _unit_landing_sensor(tmp_path)
    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        first = sensor(context)
    for table in ("accounts", "cards"):
        write_events(
            landing,
            table,
            10,
            "part-0.parquet",
            [event("n", "I", 10, at(10), name="x", balance=1)],
            ACCOUNT_SCHEMA,
        )
    listing = Storage.list

    def refusing(tables):
        def listing_but(self, uri):
            if any(f"/{table}/" in f"{uri}/" for table in tables):
                raise PermissionError(13, "Permission denied", uri)
            return listing(self, uri)

        return listing_but

    monkeypatch.setattr(Storage, "list", refusing(["accounts"]))
    with dg.build_sensor_context(resources=resources, definitions=defs, cursor=first.cursor) as context:
        refused = sensor(context)
    assert [(r.tags["lake_assets/table"], r.tags[RANGE_START_TAG]) for r in refused.run_requests] == [
        ("cards", "2024-03-01-10")
    ]
    assert "unit/accounts: its landing could not be scanned" in capfd.readouterr().err

    monkeypatch.setattr(Storage, "list", listing)
    with dg.build_sensor_context(resources=resources, definitions=defs, cursor=refused.cursor) as context:
        listed = sensor(context)
    assert [(r.tags["lake_assets/table"], r.tags[RANGE_START_TAG]) for r in listed.run_requests] == [
        ("accounts", "2024-03-01-10")
    ]

    monkeypatch.setattr(Storage, "list", refusing(["accounts", "cards"]))
    with (
        dg.build_sensor_context(resources=resources, definitions=defs, cursor=listed.cursor) as context,
        pytest.raises(LakeAssetsError, match="no table's landing could be scanned"),
    ):
        sensor(context)


def test_stray_files_alone_start_a_run_that_reports_them(tmp_path):
    """Files no partition reads (a vendor's new layout, `hour=25`) change no partition, so no
    run started and, with Dagster alone, no one ever reported them: the sensor now looks for
    them when a table has nothing else to run (a walk of the whole table: at most hourly, one
    table a tick, the one walked longest ago), and asks for one run of the table's last hour,
    which reports them; the same strays ask once."""
    landing, defs, sensor, resources = _unit_landing_sensor(tmp_path)
    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        cursor = sensor(context).cursor
    # the runs this tick asked for report the tables' strays: their next walks wait an hour
    an_hour_later = json.loads(cursor)
    for table in ("accounts", "cards"):
        an_hour_later[table]["strays_looked_at"] -= STRAYS_EVERY_SECONDS
    cursor = json.dumps(an_hour_later)
    landed = (
        landing / "cards" / "year=2024" / "month=03" / "day=01" / "hour=04" / "part-0.parquet"
    ).read_bytes()
    for table in ("accounts", "cards"):
        stray = landing / table / "year=2024" / "month=03" / "day=01" / "hour=25" / "part-0.parquet"
        stray.parent.mkdir(parents=True)
        stray.write_bytes(landed)

    asked, run_keys = [], []
    for _ in range(3):
        with dg.build_sensor_context(resources=resources, definitions=defs, cursor=cursor) as context:
            tick = sensor(context)
        asked.append(
            [
                (r.tags["lake_assets/table"], r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG])
                for r in tick.run_requests
            ]
        )
        assert all(":strays:" in r.run_key for r in tick.run_requests)
        cursor, run_keys = tick.cursor, run_keys + [r.run_key for r in tick.run_requests]
    assert asked == [
        [("accounts", "2024-03-01-09", "2024-03-01-09")],  # one walk a tick
        [("cards", "2024-03-01-04", "2024-03-01-04")],
        [],  # each walked at most hourly
    ]

    due_again = json.loads(cursor)
    due_again["cards"]["strays_looked_at"] -= STRAYS_EVERY_SECONDS
    with dg.build_sensor_context(
        resources=resources, definitions=defs, cursor=json.dumps(due_again)
    ) as context:
        (again,) = sensor(context).run_requests
    assert again.run_key == run_keys[-1]  # the same strays: a run Dagster has already made


def test_a_table_whose_walk_for_strays_fails_waits_its_next_turn(tmp_path, monkeypatch, capfd):
    """A walk that fails (a store refusing the listing) is logged and counts as the table's
    turn: the next tick walks the next table, so one failing table cannot keep the turn."""
    from lake_assets.orchestration import sensors

    _, defs, sensor, resources = _unit_landing_sensor(tmp_path)
    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        an_hour_later = json.loads(sensor(context).cursor)
    for table in ("accounts", "cards"):
        an_hour_later[table]["strays_looked_at"] -= STRAYS_EVERY_SECONDS
    walked = []

    def walk(storage, layout, fmt, landing, feed, table):
        walked.append(table)
        raise PermissionError(13, "Permission denied", table)

    monkeypatch.setattr(sensors, "unreported_strays", walk)
    cursor = json.dumps(an_hour_later)
    for _ in range(3):
        with dg.build_sensor_context(resources=resources, definitions=defs, cursor=cursor) as context:
            cursor = sensor(context).cursor
    assert walked == ["accounts", "cards"]
    assert "unit/accounts: could not be walked for strays" in capfd.readouterr().err
