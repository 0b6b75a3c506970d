"""`lake-assets run` processes what changed since the last run, and only that.

Each test runs the real path (`runner.run_feeds`: Dagster in-process runs, Spark, the catalog)
twice or more on one lake and one Dagster instance, and checks which partitions the later runs
took (from the runs' range tags) and what the lake holds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from lake_assets import lake_io, pipeline, processed, reruns
from lake_assets.catalog.files import landed_records
from lake_assets.cli import main
from lake_assets.config import CollectionConfig, FeedConfig, LakeConfig, S3Config, dump_config
from lake_assets.console import format_status
from lake_assets.errors import LakeAssetsError
from lake_assets.orchestration import io_managers
from lake_assets.orchestration.definitions import resources_for
from lake_assets.orchestration.execution import lake_status
from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
from lake_assets.paths import LakeLayout
from lake_assets.runner import run_feeds
from lake_assets.storage import Entry, Storage
from lake_assets_tests.discovered import discovered_definitions
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, hour_dir, write_events


class Lake:
    """A Unit landing and its lake, run again and again on one Dagster instance."""

    def __init__(self, root: Path):
        self.landing, self.lake = root / "landing", root / "lake"
        self.config = LakeConfig(
            lake=f"file://{self.lake}",
            feeds=(FeedConfig(name="unit", format="unit_cdc", landing=f"file://{self.landing}"),),
        )
        self.instance = dg.DagsterInstance.ephemeral()
        self.said: list[str] = []

    def write(self, hour: int, name: str, rows: list[dict], table: str = "accounts") -> Path:
        return write_events(self.landing, table, hour, name, rows, ACCOUNT_SCHEMA)

    def run(self, **options) -> list[tuple[str, str]]:
        """Run; the (first, last) partitions of each Dagster run it started."""
        self.said.clear()
        run_ids = run_feeds(self.config, instance=self.instance, say=self.said.append, **options)
        return [_range(self.instance.get_run_by_id(run_id)) for run_id in run_ids]

    def catalogued(self, table: str = "accounts") -> dict[str, list[str]]:
        """hour -> its landed files the catalog lists, as `<hour>/<name>`."""
        store = resources_for(self.config)["catalog"].get_store()
        hours = [hour(h) for h in range(24)]
        return {
            key: [f"{key}/{url.rsplit('/', 1)[-1]}" for url in by_url]
            for key, by_url in landed_records(store, "unit", table, hours).items()
            if by_url
        }

    def current_ids(self, table: str = "accounts") -> list[str]:
        files = f"{self.lake}/current/unit/{table}/**/*.parquet"
        return sorted(row[0] for row in duckdb.execute(f"SELECT id FROM read_parquet('{files}')").fetchall())

    def changes(self, table: str = "accounts") -> dict[str, list]:
        """hour -> the sorted ids of the change log's rows."""
        if not list((self.lake / "changes" / "unit" / table).rglob("*.parquet")):
            return {}
        rows = duckdb.execute(
            f"SELECT hour, id FROM read_parquet('{self.lake}/changes/unit/{table}/**/*.parquet', "
            "hive_partitioning = true)"
        ).fetchall()
        out: dict[str, list] = {}
        for hour, id_ in rows:
            out.setdefault(hour, []).append(id_)
        return {hour: sorted(ids) for hour, ids in out.items()}


def _range(run) -> tuple[str, str]:
    return run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]


def hour(h: int) -> str:
    return f"2024-03-01-{h:02d}"


@pytest.fixture
def lake(tmp_path, spark) -> Lake:
    lake = Lake(tmp_path)
    lake.write(1, "part-0.parquet", [event("a", "I", 1, at(1, 5), name="a", balance=1)])
    lake.write(2, "part-0.parquet", [event("b", "I", 2, at(2, 5), name="b", balance=2)])
    lake.write(3, "part-0.parquet", [event("c", "I", 3, at(3, 5), name="c", balance=3)])
    assert lake.run() == [(hour(1), hour(3))]
    return lake


def test_a_run_with_nothing_new_starts_no_dagster_run_and_no_spark_session(lake, monkeypatch):
    runs_before = len(lake.instance.get_run_records())

    def no_spark(*_, **__):
        raise AssertionError("a run with nothing to do started a Spark session")

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", no_spark)
    assert lake.run() == []
    assert len(lake.instance.get_run_records()) == runs_before
    assert any("nothing changed" in line for line in lake.said)


def test_the_command_with_nothing_new_does_not_even_load_dagster(lake, tmp_path):
    """What keeps `cli_noop` (the benchmark) at a listing's cost: Dagster's start-up is most of
    a second, so the command plans first and loads it only when there is something to run."""
    config_file = tmp_path / "lake.yaml"
    config_file.write_text(dump_config(lake.config))
    probe = (
        "import sys; from lake_assets.cli import main; code = main(['run', '--config', sys.argv[1]]); "
        "print('exit', code, 'dagster loaded' if 'dagster' in sys.modules else 'dagster not loaded')"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(config_file)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LAKE_ASSETS_LOG_DIR": str(tmp_path / "logs")},
        check=False,
    )
    assert "nothing changed" in done.stdout, done.stdout + done.stderr
    assert done.stdout.strip().endswith("exit 0 dagster not loaded"), done.stdout + done.stderr


def test_a_late_file_in_an_old_hour_reprocesses_exactly_that_hour(lake):
    lake.write(5, "part-0.parquet", [event("e", "I", 5, at(5, 5), name="e", balance=5)])
    assert lake.run() == [(hour(5), hour(5))]
    lake.write(2, "part-late.parquet", [event("b", "U", 9, at(2, 30), name="b2", balance=20)])
    assert lake.run() == [(hour(2), hour(2))]
    assert lake.changes()[hour(2)] == ["b", "b"]
    assert any("part-late.parquet added" in line for line in lake.said)
    assert lake.run() == []


def test_a_file_rewritten_in_place_is_reprocessed_even_with_the_same_size(lake):
    path = hour_dir(lake.landing, "accounts", 2) / "part-0.parquet"
    before = path.stat().st_size
    lake.write(2, "part-0.parquet", [event("x", "I", 2, at(2, 5), name="b", balance=2)])  # one letter differs
    assert path.stat().st_size == before
    assert lake.run() == [(hour(2), hour(2))]
    assert lake.changes()[hour(2)] == ["x"]
    assert any("part-0.parquet rewritten" in line for line in lake.said)


def test_a_rewritten_file_whose_bytes_cannot_be_read_runs_its_hour_and_stops_no_planning(lake, monkeypatch):
    """Planning hashes a file modified since its hour was processed; when its store will not hand
    over the bytes (archived, or no longer readable by the run), the hour runs, and its run
    reports the file, instead of the planning of every hour failing."""
    path = hour_dir(lake.landing, "accounts", 2) / "part-0.parquet"
    os.utime(path)

    real_hash = processed.hash_file

    def refuse(storage, url):
        if url.endswith(f"hour=02/{path.name}"):
            raise PermissionError(f"{url}: access denied")
        return real_hash(storage, url)

    monkeypatch.setattr(processed, "hash_file", refuse)

    assert lake.run() == [(hour(2), hour(2))]
    assert any("part-0.parquet rewritten" in line for line in lake.said)


def test_a_read_that_fails_in_passing_fails_the_catalog_step_and_no_file_is_skipped(lake, monkeypatch):
    """A failure that may pass (a reset connection, a 5xx) while a new file is hashed fails the
    catalog step, to be run again, rather than leaving the file out as one its store refuses: a
    file left out would be read by no run a sensor starts."""
    from lake_assets.catalog import files
    from lake_assets.runner import RunFailed

    lake.write(4, "part-0.parquet", [event("d", "I", 4, at(4, 5), name="d", balance=4)])
    real_hash = files.hash_file

    def flaky(storage, url):
        if "hour=04" in url:
            raise ConnectionResetError(f"{url}: connection reset by peer")
        return real_hash(storage, url)

    monkeypatch.setattr(files, "hash_file", flaky)
    with pytest.raises(RunFailed, match="connection reset"):
        lake.run()
    monkeypatch.undo()

    assert lake.run() == [(hour(4), hour(4))]
    assert lake.changes()[hour(4)] == ["d"]


def test_a_read_that_fails_once_is_tried_again_and_the_file_is_read(lake, monkeypatch):
    from lake_assets.catalog import files

    lake.write(4, "part-0.parquet", [event("d", "I", 4, at(4, 5), name="d", balance=4)])
    real_hash, failed = files.hash_file, []

    def flaky_once(storage, url):
        if "hour=04" in url and not failed:
            failed.append(url)
            raise ConnectionResetError(f"{url}: connection reset by peer")
        return real_hash(storage, url)

    monkeypatch.setattr(files, "hash_file", flaky_once)

    assert lake.run() == [(hour(4), hour(4))]
    assert failed and lake.changes()[hour(4)] == ["d"]


def test_a_rebuild_goes_on_past_a_killed_folds_commit_it_cannot_finish(lake, tmp_path, capsys):
    """A rebuild finishes a killed fold's commit first (it may record purges); a commit record
    that cannot be applied (its staged file gone) is damage, which the rebuild is the remedy
    for: it says so and goes on."""
    commits = lake.lake / "_state" / "unit" / "accounts" / "commits"
    commits.mkdir(parents=True, exist_ok=True)
    final = f"file://{lake.lake}/history/unit/accounts/active/part-f1-00000.parquet"
    record = {"fold_id": "f1", "adds": [[f"file://{tmp_path}/gone.parquet", final]], "deletes": []}
    (commits / "f1.json").write_text(json.dumps(record))
    config_file = tmp_path / "lake.yaml"
    config_file.write_text(dump_config(lake.config))
    capsys.readouterr()

    assert main(["rebuild", "--config", str(config_file), "--table", "unit/accounts"]) == 0

    assert "a killed fold's commit could not be finished and was removed" in capsys.readouterr().out
    assert not commits.exists()
    assert lake.run() == [(hour(1), hour(3))]


def test_a_removed_file_reprocesses_its_hour_and_its_rows_leave_the_change_log(lake):
    (hour_dir(lake.landing, "accounts", 3) / "part-0.parquet").unlink()
    assert lake.run() == [(hour(3), hour(3))]
    assert hour(3) not in lake.changes()
    assert lake.run() == []


def test_a_file_rewritten_in_place_then_removed_leaves_no_record_and_nothing_set_aside(lake):
    """The catalog keeps a record of each content of a file rewritten in place; once the file is
    gone each is retired. One left behind listed the file again, and the run set it aside as
    unreadable ("FileNotFoundError"), a quarantine entry for a file that had simply gone."""
    rewritten = lake.write(2, "part-0.parquet", [event("b", "I", 2, at(2, 5), name="b corrected", balance=2)])
    assert lake.run() == [(hour(2), hour(2))]
    rewritten.unlink()
    lake.write(2, "part-1.parquet", [event("b", "I", 2, at(2, 5), name="b", balance=2)])
    assert lake.run() == [(hour(2), hour(2))]
    [status] = lake_status(lake.config, lake.instance)
    assert status.quarantined == []
    assert not list((lake.lake / "_quarantine").rglob("*.*"))
    assert lake.changes()[hour(2)] == ["b"]
    assert lake.run() == []


@pytest.mark.parametrize("new_name", ["part-0a.parquet", "part-zz.parquet"])
def test_a_correction_exported_under_a_new_name_replaces_the_removed_files_copy(lake, new_name):
    """A writer that names its files anew on every export re-exports an hour with a write
    corrected (same version time and sequence) and removes the old file. The removed file's copy
    of the write won whenever its name sorted after the new one's, so `current` and `history`
    kept the old values where a run over the landing as it is now gives the new ones."""
    old = lake.write(2, "part-5.parquet", [event("b", "U", 7, at(2, 40), name="b wrong", balance=20)])
    assert lake.run() == [(hour(2), hour(2))]
    old.unlink()
    (hour_dir(lake.landing, "accounts", 2) / "part-0.parquet").unlink()
    lake.write(
        2,
        new_name,
        [
            event("b", "I", 2, at(2, 5), name="b", balance=2),
            event("b", "U", 7, at(2, 40), name="b right", balance=21),
        ],
    )
    assert lake.run() == [(hour(2), hour(2))]
    table = f"{lake.lake}/%s/unit/accounts/**/*.parquet"
    new_file = f"file://{hour_dir(lake.landing, 'accounts', 2) / new_name}"
    current = f"SELECT name, balance, _source_file FROM read_parquet('{table % 'current'}') WHERE id = 'b'"
    assert duckdb.execute(current).fetchall() == [("b right", 21, new_file)]
    history = f"SELECT name, _source_file FROM read_parquet('{table % 'history'}') WHERE id = 'b' ORDER BY _fivetran_start"
    assert duckdb.execute(history).fetchall() == [("b", new_file), ("b right", new_file)]


def _remove_every_landed_file(lake: Lake) -> None:
    """The landing's files removed, folders and all (as on S3, or a share that is not mounted)."""
    for h in (1, 2, 3):
        (hour_dir(lake.landing, "accounts", h) / "part-0.parquet").unlink()
    for folder in sorted(lake.landing.rglob("*"), reverse=True):
        folder.rmdir()


def test_a_landing_gone_blank_at_once_is_refused_and_the_lake_keeps_what_it_read(lake):
    """Every file of a table gone at once is what an unmounted share or a mistyped prefix looks
    like: the run fails for the table, naming it and what to do, and neither the change log nor
    the catalog loses anything; once the removal is declared meant, the next run empties it."""
    before, catalogued = lake.changes(), lake.catalogued()
    _remove_every_landed_file(lake)
    with pytest.raises(
        LakeAssetsError, match=r"unit/accounts: the landing \S+ lists none of the files"
    ) as failed:
        lake.run()
    assert "allow_empty_landing: true" in str(failed.value)
    assert lake.changes() == before
    assert lake.catalogued() == catalogued == {hour(h): [f"{hour(h)}/part-0.parquet"] for h in (1, 2, 3)}
    [status] = lake_status(lake.config, lake.instance)  # status foretells the refusal, and why
    assert status.refused and status.refused in str(failed.value)
    assert f"refused: {status.refused}" in format_status([status], keeps_runs=True)
    feed = lake.config.feeds[0].model_copy(update={"allow_empty_landing": True})
    lake.config = lake.config.model_copy(update={"feeds": (feed,)})
    [status] = lake_status(lake.config, lake.instance)
    assert status.refused is None and len(status.pending) == 3
    assert lake.run() == [(hour(1), hour(3))]
    assert lake.changes() == {}
    assert lake.run() == []


@pytest.mark.parametrize("day, new_hour, emptied", [(1, 5, 3), (1, 3, 2), (3, 5, 3)])
def test_a_landing_gone_blank_but_for_a_new_file_is_refused_too(lake, day, new_hour, emptied):
    """A share not mounted while a sync job writes one new file into its mount point: in a new
    hour, in one read before, or two days on (planned as a run of its own): the new file does
    not make the old ones' removal look meant."""
    before = lake.changes()
    _remove_every_landed_file(lake)
    write_events(
        lake.landing,
        "accounts",
        new_hour,
        "part-1.parquet",
        [event("e", "I", 5, at(new_hour, 9, day=day), name="e", balance=5)],
        ACCOUNT_SCHEMA,
        day=day,
    )
    with pytest.raises(LakeAssetsError, match=rf"files the lake read from {emptied} partition\(s\)"):
        lake.run()
    assert lake.changes() == before


def test_a_run_of_an_old_hour_alone_is_refused_when_only_a_new_file_is_landed(lake):
    """The share unmounted while a sync job writes one new file into its mount point, and a
    backfill of an old hour alone from the UI: the new file, outside the run's hour, vouched for
    the landing, and the hour's rows left `changes`. Only a file read before vouches now. (A
    `--from/--to` run takes only hours that list files, so it empties none.)"""
    from lake_assets.orchestration.definitions import feed_job_name
    from lake_assets_tests.discovered import discovered_definitions

    before = lake.changes()
    _remove_every_landed_file(lake)
    lake.write(5, "part-1.parquet", [event("e", "I", 5, at(5, 9), name="e", balance=5)])
    assert lake.run(first=hour(1), last=hour(3)) == []
    job = discovered_definitions(lake.config).resolve_job_def(feed_job_name("unit"))
    done = job.execute_in_process(
        instance=lake.instance,
        partition_key=hour(2),
        asset_selection=[dg.AssetKey(["unit", "accounts", x]) for x in ("catalog", "changes")],
        raise_on_error=False,
    )
    assert not done.success
    assert "lists none of the files the lake read from 1 partition" in str(done.all_events)
    assert lake.changes() == before


@pytest.mark.parametrize("folders_too", [False, True])
def test_a_table_whose_only_files_were_set_aside_and_then_removed_is_emptied_not_refused(lake, folders_too):
    """A table whose every file read was quarantined gave the change log no row: the removal of
    its files loses nothing and is not taken for a landing gone blank (it was refused, and the
    table stayed refused until `allow_empty_landing` was set). Its quarantine entries go."""
    bad = hour_dir(lake.landing, "cards", 4) / "part-bad.parquet"
    bad.write_bytes(b"not parquet at all")
    lake.run()
    by_table = {s.table: s for s in lake_status(lake.config, lake.instance)}
    assert [q["file"] for q in by_table["cards"].quarantined] == [f"file://{bad}"]
    bad.unlink()
    if folders_too:
        for folder in sorted((lake.landing / "cards").rglob("*"), reverse=True):
            folder.rmdir()
    by_table = {s.table: s for s in lake_status(lake.config, lake.instance)}
    assert by_table["cards"].refused is None

    lake.run()

    by_table = {s.table: s for s in lake_status(lake.config, lake.instance)}
    assert by_table["cards"].quarantined == [] and by_table["cards"].refused is None
    assert not list((lake.lake / "_quarantine").rglob("*.*"))
    assert sorted(lake.changes()) == [hour(1), hour(2), hour(3)]
    assert lake.run() == []


@pytest.mark.parametrize("how", ["beside a good file", "by a run that failed before storing"])
def test_a_table_whose_change_log_holds_rows_of_a_set_aside_file_is_still_refused(lake, monkeypatch, how):
    """A file set aside beside a good one, or rewritten into garbage and set aside by a run that
    then failed before it stored its changes (the change log still holds the rows read before):
    a landing gone blank would empty rows, quarantine or not, and is refused."""
    folder = hour_dir(lake.landing, "cards", 4)
    good = write_events(
        lake.landing,
        "cards",
        4,
        "part-0.parquet",
        [event("k", "I", 1, at(4, 5), name="k", balance=1)],
        ACCOUNT_SCHEMA,
    )
    if how == "beside a good file":
        (folder / "part-bad.parquet").write_bytes(b"not parquet at all")
        lake.run()
    else:
        lake.run()
        good.write_bytes(b"garbage now, and longer than before: " + b"x" * 4096)

        def fails(*_, **__):
            raise RuntimeError("the store failed")

        monkeypatch.setattr(io_managers, "store_partitions", fails)
        with pytest.raises(LakeAssetsError):
            lake.run()
        monkeypatch.undo()
    by_table = {s.table: s for s in lake_status(lake.config, lake.instance)}
    assert by_table["cards"].quarantined and hour(4) in lake.changes("cards")
    for landed in folder.iterdir():
        landed.unlink()
    by_table = {s.table: s for s in lake_status(lake.config, lake.instance)}
    assert by_table["cards"].refused
    with pytest.raises(LakeAssetsError, match="unit/cards: the landing"):
        lake.run()
    assert lake.changes("cards")[hour(4)] == ["k"]


def test_a_run_that_empties_an_old_hour_and_reads_a_new_one_goes_on_while_others_remain(lake):
    """A vendor's retention: the oldest hour goes as a new hour lands, the hours between stay."""
    (hour_dir(lake.landing, "accounts", 1) / "part-0.parquet").unlink()
    lake.write(4, "part-0.parquet", [event("d", "I", 4, at(4, 5), name="d", balance=4)])
    assert lake.run() == [(hour(1), hour(1)), (hour(4), hour(4))]
    assert sorted(lake.changes()) == [hour(2), hour(3), hour(4)]


def test_a_file_gone_between_the_catalog_and_the_read_fails_the_run_and_loses_no_row(lake, monkeypatch):
    """The share drops after the catalog step listed a new file and before the changes step
    reads it: set aside as unreadable, the file left its hour's changes without its rows and
    no copy of it. The run fails instead, and the next run reads the landing as it is then."""
    late = lake.write(3, "part-1.parquet", [event("d", "I", 7, at(3, 30), name="d", balance=4)])
    before = lake.changes()
    real_ingest = pipeline.ingest

    def ingest_after_the_file_went(session, work, partitions, **options):
        late.rename(late.with_name(".away"))
        return real_ingest(session, work, partitions, **options)

    monkeypatch.setattr(pipeline, "ingest", ingest_after_the_file_went)
    with pytest.raises(LakeAssetsError, match=r"part-1\.parquet was catalogued by this run but is gone now"):
        lake.run()
    monkeypatch.setattr(pipeline, "ingest", real_ingest)
    assert lake.changes() == before
    assert not list((lake.lake / "_quarantine").rglob("*.*"))
    late.with_name(".away").rename(late)
    assert lake.run() == [(hour(3), hour(3))]
    assert lake.changes()[hour(3)] == ["c", "d"]


def test_a_file_rewritten_before_the_fold_reads_it_again_fails_the_dagster_run_and_the_next_run_folds_it(
    lake, monkeypatch
):
    """Through Dagster: the state step folds the batch the changes step handed over in memory.
    Should Spark have lost its cached blocks, the fold reads the landed file again; rewritten by
    then, the run fails in the state step (`LandingChanged`) with nothing committed, and the next
    run folds the version the landing holds (docs/bad-input.md, "Files that change during a run")."""
    landed = lake.write(4, "part-0.parquet", [event("d", "I", 4, at(4, 5), name="d", balance=4)])
    fold_into_state = pipeline.fold_into_state

    def fold_after_the_file_was_rewritten(session, work, batch, **options):
        batch.unpersist(blocking=True)  # as when an executor is lost with the cached blocks
        monkeypatch.setattr(lake_io, "is_cached", lambda frame: frame is batch or frame.is_cached)
        lake.write(4, landed.name, [event("e", "I", 5, at(4, 6), name="e")])
        return fold_into_state(session, work, batch, **options)

    monkeypatch.setattr(pipeline, "fold_into_state", fold_after_the_file_was_rewritten)
    with pytest.raises(
        LakeAssetsError, match=r"part-0\.parquet changed after the run catalogued it \(found while folding"
    ):
        lake.run()
    monkeypatch.undo()
    assert lake.current_ids() == ["a", "b", "c"]  # the fold committed nothing

    assert lake.run() == [(hour(4), hour(4))]
    assert lake.changes()[hour(4)] == ["e"] and lake.current_ids() == ["a", "b", "c", "e"]


@pytest.mark.parametrize("new_file", [False, True])
def test_a_rebuild_of_a_table_whose_landing_lists_no_file_is_refused(lake, tmp_path, capsys, new_file):
    """A rebuild forgets the table and reads it again from the landing: over a landing gone blank
    it would leave every layer empty. It is refused, and the lake keeps the table; a new file
    written into an unmounted share's mount point does not vouch for it."""
    before = lake.changes()
    _remove_every_landed_file(lake)
    if new_file:
        lake.write(5, "part-1.parquet", [event("e", "I", 5, at(5, 9), name="e", balance=5)])
    config_file = tmp_path / "lake.yaml"
    config_file.write_text(dump_config(lake.config))
    capsys.readouterr()

    assert main(["rebuild", "--config", str(config_file), "--table", "unit/accounts"]) == 1

    assert "unit/accounts: the landing file://" in capsys.readouterr().err
    assert lake.changes() == before
    assert list((lake.lake / "current" / "unit" / "accounts").glob("*.parquet"))


def test_a_landing_emptied_hour_by_hour_empties_the_change_log_until_its_last_file_goes(lake):
    """Files removed while others remain (a vendor's retention) are not a landing gone blank: the
    hours run and their rows leave `changes`. The last file's removal leaves nothing landed, and
    is refused like a landing gone blank at once."""
    for h in (1, 2):
        (hour_dir(lake.landing, "accounts", h) / "part-0.parquet").unlink()
    assert lake.run() == [(hour(1), hour(2))]
    assert sorted(lake.changes()) == [hour(3)]
    (hour_dir(lake.landing, "accounts", 3) / "part-0.parquet").unlink()
    with pytest.raises(LakeAssetsError, match="lists none of the files the lake read from 1 partition"):
        lake.run()


def test_all_reprocesses_every_landed_hour_and_a_range_every_hour_in_it(lake):
    assert lake.run(everything=True) == [(hour(1), hour(3))]
    assert lake.run(first=hour(2), last=hour(2)) == [(hour(2), hour(2))]


def test_the_change_log_is_the_same_whichever_hours_run_together(tmp_path, spark):
    """A vendor re-delivers an event an hour later: each hour's partition keeps the copy it was
    delivered, so one run over both hours, runs hour by hour and re-runs of either hour alone
    leave the same change log (current and history count the event once either way)."""
    same = event("a", "I", 10, at(1, 5), name="a", balance=1)
    lakes = {}
    for name in ("together", "apart"):
        lakes[name] = Lake(tmp_path / name)
        lakes[name].write(1, "part-0.parquet", [same, event("b", "I", 11, at(1, 6), name="b", balance=2)])
    lakes["apart"].run()
    for lake in lakes.values():
        lake.write(2, "part-0.parquet", [same])
        lake.run()
    expected = {hour(1): ["a", "b"], hour(2): ["a"]}
    assert lakes["together"].changes() == lakes["apart"].changes() == expected
    for one in (1, 2):
        lakes["together"].run(first=hour(one), last=hour(one))
        assert lakes["together"].changes() == expected
    current = duckdb.execute(
        f"SELECT id FROM read_parquet('{lakes['together'].lake}/current/unit/accounts/*.parquet') ORDER BY id"
    ).fetchall()
    assert current == [("a",), ("b",)]


def test_of_two_copies_of_one_write_the_same_one_wins_whichever_ran_first(tmp_path, spark):
    """Two hours deliver one write (same id, commit time and sequence) with a field that differs:
    current and history keep the same copy (the greater file name's) whether the hours ran
    together, the later one first, or one of them again."""
    copies = {h: event("a", "I", 10, at(1, 5), name=f"from-hour-{h}", balance=1) for h in (1, 2)}

    def kept(lake: Lake) -> list[tuple]:
        return duckdb.execute(
            "SELECT name, regexp_extract(_source_file, 'hour=[0-9]+') FROM read_parquet("
            f"'{lake.lake}/history/unit/accounts/**/*.parquet') UNION ALL SELECT name, NULL FROM "
            f"read_parquet('{lake.lake}/current/unit/accounts/*.parquet')"
        ).fetchall()

    together, later_first = Lake(tmp_path / "together"), Lake(tmp_path / "later_first")
    for h in (1, 2):
        together.write(h, "part-0.parquet", [copies[h]])
    together.run()
    expected = [("from-hour-2", "hour=02"), ("from-hour-2", None)]
    assert kept(together) == expected
    later_first.write(2, "part-0.parquet", [copies[2]])
    later_first.run()
    later_first.write(1, "part-0.parquet", [copies[1]])
    later_first.run()
    assert kept(later_first) == expected
    for h in (1, 2):
        together.run(first=hour(h), last=hour(h))
        assert kept(together) == expected


def test_a_file_rewritten_in_place_with_corrected_writes_folds_as_if_only_the_correction_landed(
    tmp_path, spark
):
    """A vendor re-exports a file under its name with two writes corrected (same id, commit time
    and sequence): an update becomes an insert of another value, another a delete. Of the two
    copies of each write, the fold kept the one folded before ('update' sorts above 'insert'
    and 'delete'), so the deleted key stayed in `current`, and a run over everything again did
    not help; one run over the landing as it is now keeps the correction."""
    before = [event(k, "U", 1, at(1, 5), name="old", balance=1) for k in ("a", "d")]
    corrected = [event("a", "I", 1, at(1, 5), name="new", balance=2), event("d", "D", 1, at(1, 5))]

    def tables(lake: Lake) -> dict[str, list[tuple]]:
        columns = (
            "id, name, balance, _fivetran_start, _fivetran_end, _fivetran_active, _op, "
            "regexp_extract(_source_file, 'hour=.*$')"
        )
        folder = f"{lake.lake}/history/unit/accounts"
        return {
            "history": duckdb.execute(
                f"SELECT {columns} FROM read_parquet('{folder}/**/*.parquet') ORDER BY ALL"
            ).fetchall(),
            "current": duckdb.execute(
                f"SELECT id, name, balance FROM read_parquet('{lake.lake}/current/unit/accounts/*.parquet')"
            ).fetchall(),
        }

    stepwise, at_once = Lake(tmp_path / "stepwise"), Lake(tmp_path / "at_once")
    stepwise.write(1, "part-0.parquet", before)
    stepwise.run()
    for lake in (stepwise, at_once):
        lake.write(1, "part-0.parquet", corrected)
        lake.run()
    assert tables(stepwise)["current"] == [("a", "new", 2)]
    assert tables(stepwise) == tables(at_once)
    stepwise.run(everything=True)
    assert tables(stepwise) == tables(at_once)


def test_only_the_tables_that_changed_run(lake):
    lake.write(2, "part-0.parquet", [event("p", "I", 1, at(2, 5), name="p", balance=1)], table="payments")
    assert lake.run() == [(hour(2), hour(2))]
    assert [line for line in lake.said if "in one run" in line] == [
        f"unit (payments): hours {hour(2)} .. {hour(2)} in one run"
    ]
    [run] = lake.instance.get_run_records(limit=1)
    assert {key.path[1] for key in run.dagster_run.asset_selection} == {"payments"}
    assert lake.changes("payments") == {hour(2): ["p"]}


def test_a_run_bridges_empty_hours_but_not_hours_that_need_no_processing(lake):
    lake.write(4, "part-1.parquet", [event("d", "I", 4, at(4, 5), name="d", balance=4)])
    lake.write(9, "part-0.parquet", [event("i", "I", 9, at(9, 5), name="i", balance=9)])
    lake.write(1, "part-1.parquet", [event("a", "U", 5, at(1, 30), name="a2", balance=5)])
    # 1 changed, 2 and 3 did not; 4 and 9 are new, 5..8 hold no files
    assert lake.run() == [(hour(1), hour(1)), (hour(4), hour(9))]


def test_a_failed_fold_leaves_its_hours_to_the_next_run(lake, monkeypatch):
    lake.write(4, "part-0.parquet", [event("d", "I", 4, at(4, 5), name="d", balance=4)])
    run_with_the_fold_failing(lake, monkeypatch)
    assert lake.run() == [(hour(4), hour(4))]


def run_with_the_fold_failing(lake: Lake, monkeypatch) -> None:
    """A run whose changes are stored and whose fold fails (as a run killed before it would)."""
    from lake_assets import pipeline

    def fails(*_, **__):
        raise RuntimeError("the fold broke")

    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "fold_into_state", fails)
        with pytest.raises(LakeAssetsError):
            lake.run()


def test_a_run_killed_while_it_replaces_a_processed_hours_changes_leaves_the_hour_to_the_next_run(
    lake, monkeypatch
):
    """Spark replaces a partition's folder by deleting it and then moving the new one in. A run
    killed in between (here, an error at that moment) left the hour without its changes while its
    processed note still matched the landing: the next run found nothing to do, and the rows
    stayed lost."""
    from lake_assets import lake_io

    real_write = lake_io.write_partitions

    def killed_between_delete_and_rename(df, storage, table_uri, column, values, *args, replacing, **kwargs):
        def then_killed(partitions: list[str]) -> None:
            replacing(partitions)  # what the run does before Spark replaces them
            for value in partitions:
                storage.delete_tree(f"{table_uri}/{column}={value}")
            raise RuntimeError("killed in the middle of the change log's commit")

        return real_write(df, storage, table_uri, column, values, *args, replacing=then_killed, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(lake_io, "write_partitions", killed_between_delete_and_rename)
        with pytest.raises(LakeAssetsError):
            lake.run(first=hour(3), last=hour(3))
    assert hour(3) not in lake.changes()
    assert lake.run() == [(hour(3), hour(3))]
    assert lake.changes()[hour(3)] == ["c"]
    assert lake.run() == []


def test_a_run_killed_before_it_empties_an_hour_whose_files_are_gone_leaves_it_to_the_next_run(
    lake, monkeypatch
):
    """An hour whose landed files are all gone is processed only because its note says it held
    some: the note must outlive a run killed before it emptied the hour."""
    from lake_assets import lake_io

    (hour_dir(lake.landing, "accounts", 3) / "part-0.parquet").unlink()

    def killed(*_, **__):
        raise RuntimeError("killed before the change log was written")

    with monkeypatch.context() as patch:
        patch.setattr(lake_io, "write_partitions", killed)
        with pytest.raises(LakeAssetsError):
            lake.run()
    assert lake.changes()[hour(3)] == ["c"]
    assert lake.run() == [(hour(3), hour(3))]
    assert hour(3) not in lake.changes()
    assert lake.run() == []


@pytest.mark.parametrize("later", ["catalog, then state alone", "catalog during the changes step"])
def test_a_file_catalogued_after_the_changes_were_read_is_not_noted_as_processed(lake, later, monkeypatch):
    """The processed note says what the folded changes were read from, not what the catalog
    holds when the fold ends. From the UI: the catalog of an hour materialised alone after a file
    landed, then its current and history alone (they fold the stored changes, which lack the
    file); or another run's catalog step while this run read the hour. The note listed the new
    file, and the next `lake-assets run` found nothing changed: its rows were in no layer."""
    from lake_assets import pipeline
    from lake_assets.orchestration.definitions import feed_job_name
    from lake_assets_tests.discovered import discovered_definitions

    job = discovered_definitions(lake.config).resolve_job_def(feed_job_name("unit"))
    selected = {
        layer: dg.AssetKey(["unit", "accounts", layer]) for layer in ("catalog", "current", "history")
    }

    def land_z():
        lake.write(1, "part-1.parquet", [event("z", "I", 9, at(1, 30), name="z", balance=9)])

    if later == "catalog, then state alone":
        land_z()
        for layers in (["catalog"], ["current", "history"]):
            done = job.execute_in_process(
                instance=lake.instance, partition_key=hour(1), asset_selection=[selected[x] for x in layers]
            )
            assert done.success
    else:
        real_ingest = pipeline.ingest

        def ingest_then_catalogue(session, work, partitions, **options):
            ingested = real_ingest(session, work, partitions, **options)
            land_z()
            pipeline.catalogue_landing(work, partitions)  # as another run's catalog step would
            return ingested

        with monkeypatch.context() as patch:
            patch.setattr(pipeline, "ingest", ingest_then_catalogue)
            done = job.execute_in_process(
                instance=lake.instance,
                partition_key=hour(1),
                asset_selection=[
                    dg.AssetKey(["unit", "accounts", x]) for x in ("changes", "current", "history")
                ],
            )
            assert done.success
    assert "z" not in lake.changes().get(hour(1), [])

    assert lake.run() == [(hour(1), hour(1))]
    assert lake.changes()[hour(1)] == ["a", "z"]
    assert lake.run() == []


def test_changes_materialised_without_their_catalog_read_what_landed_since(lake):
    """From the UI, `changes` (and the state) of an hour materialised without its `catalog`: the
    step read the files the catalog last listed, missed one landed since, and its landing
    check passed. The step now catalogues the landing first when its run does not."""
    from lake_assets.orchestration.definitions import feed_job_name
    from lake_assets_tests.discovered import discovered_definitions

    job = discovered_definitions(lake.config).resolve_job_def(feed_job_name("unit"))
    lake.write(1, "part-1.parquet", [event("z", "I", 9, at(1, 30), name="z", balance=9)])
    done = job.execute_in_process(
        instance=lake.instance,
        partition_key=hour(1),
        asset_selection=[dg.AssetKey(["unit", "accounts", x]) for x in ("changes", "current", "history")],
    )
    assert done.success
    assert lake.changes()[hour(1)] == ["a", "z"]
    [check] = [e for e in done.get_asset_check_evaluations() if e.check_name == "landing_complete"]
    assert check.passed
    assert lake.run() == []


def test_a_run_killed_after_it_emptied_an_hour_leaves_it_to_the_next_run_whatever_lands(
    lake, tmp_path, monkeypatch
):
    """An hour's only file removed: the run empties the hour's changes and is killed before its
    fold. The hour's note still names the file; the vendor lands the same file again (same name,
    size and content): planning found the hour unchanged, and its rows never came back."""
    import shutil

    landed = hour_dir(lake.landing, "accounts", 3) / "part-0.parquet"
    shutil.copy(landed, tmp_path / "kept.parquet")
    landed.unlink()
    run_with_the_fold_failing(lake, monkeypatch)
    assert hour(3) not in lake.changes()
    shutil.copy(tmp_path / "kept.parquet", landed)  # the same bytes, landed again

    assert lake.run() == [(hour(3), hour(3))]
    assert lake.changes()[hour(3)] == ["c"]
    assert lake.run() == []


_DRIVER_ENDS_IN_ONE_TABLE = """
import json, os, signal, sys
from pathlib import Path
import dagster as dg
from lake_assets import pipeline
from lake_assets.errors import LakeAssetsError
from lake_assets.runner import run_feeds
from lake_assets_tests.test_incremental_runs import Lake
from lake_assets_tests.unit_files import at, event

lake = Lake(Path(sys.argv[1]))
lake.write(1, "part-0.parquet", [event("a", "I", 1, at(1, 5), name="a", balance=1)], table="accounts")
lake.write(1, "part-0.parquet", [event("b", "I", 1, at(1, 5), name="b", balance=1)], table="bombs")
real_ingest, ended = pipeline.ingest, []

def ingest(session, work, partitions, **options):
    if not ended:  # the first table read ends the driver, as running it out of memory would
        from pyspark import SparkContext
        ended.append(work.table)
        os.kill(SparkContext._gateway.proc.pid, signal.SIGKILL)
        SparkContext._gateway.proc.wait()
    return real_ingest(session, work, partitions, **options)

pipeline.ingest = ingest
try:
    lake.run()
    failure = None
except LakeAssetsError as error:
    failure = str(error)
first = {table: sorted(lake.changes(table).get("2024-03-01-01", [])) for table in ("accounts", "bombs")}
lake.run()
again = {table: sorted(lake.changes(table).get("2024-03-01-01", [])) for table in ("accounts", "bombs")}
import threading  # each driver's accumulator server is a thread of this process
servers = sum("serve_forever" in thread.name for thread in threading.enumerate())
print(json.dumps({"ended": ended[0], "failure": failure, "first": first, "again": again, "servers": servers}))
"""


def test_a_table_whose_step_ends_the_driver_stops_no_other_table_of_the_run(tmp_path, spark):
    """Every step of a command's runs shares the process's Spark session. A table whose read ended
    the driver JVM (a file running it out of memory) failed every table after it, in every feed,
    each naming a refused connection: PySpark kept handing out the ended session. Its own step
    fails; the steps after it get a new driver (here the driver is killed as the first table
    is read, in a process of its own), and what the ended one left in this process is closed."""
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER_ENDS_IN_ONE_TABLE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "LAKE_ASSETS_LOG_DIR": str(tmp_path / "logs")},
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    ended, other = outcome["ended"], ({"accounts", "bombs"} - {outcome["ended"]}).pop()
    assert f"unit/{ended}" in outcome["failure"] and f"unit/{other}" not in outcome["failure"]
    assert outcome["first"][other] == [other[0]] and outcome["first"][ended] == []
    assert outcome["again"] == {"accounts": ["a"], "bombs": ["b"]}
    assert outcome["servers"] == 1, "the ended driver's accumulator server is still running"


# --- the rule itself, on listings ------------------------------------------------------------------


def _entry(path: Path) -> Entry:
    stat = path.stat()
    return Entry(
        uri=f"file://{path}",
        name=path.name,
        is_dir=False,
        size=stat.st_size,
        mtime_ms=stat.st_mtime_ns // 1_000_000,
    )


def test_a_listing_that_shows_a_file_unchanged_since_it_was_recorded_costs_no_read(tmp_path, monkeypatch):
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"x": [1]}), path)
    os.utime(path, ns=(1_000_000_000_000, 1_000_000_000_000))  # modified long before it was recorded
    note = {f"file://{path}": processed.ProcessedFile(path.stat().st_size, "whatever", 2_000_000)}
    storage = Storage(S3Config())
    monkeypatch.setattr(processed, "hash_file", lambda *_: pytest.fail("an unchanged file was read"))
    assert processed.changed_partitions(storage, {"p": [_entry(path)]}, {"p": note}) == []


def test_notes_round_trip_and_partitions_without_files_or_notes_need_nothing(tmp_path):
    storage, layout = Storage(S3Config()), LakeLayout(f"file://{tmp_path}")
    note = {"file:///x/part-0.parquet": processed.ProcessedFile(10, "abc", 5)}
    processed.write_notes(storage, layout, "unit", "accounts", {hour(1): note, hour(2): {}})
    assert processed.read_notes(storage, layout, "unit", "accounts") == {hour(1): note, hour(2): {}}
    assert processed.noted_partitions(storage, layout, "unit", "accounts") == {hour(1), hour(2)}
    assert processed.changed_partitions(storage, {hour(3): []}, {hour(2): {}}) == []
    [gone] = processed.changed_partitions(storage, {}, {hour(1): note})
    assert gone.partition == hour(1) and "removed" in gone.reason


def test_what_a_run_read_holds_a_file_read_from_any_copy_or_set_aside(tmp_path):
    reading = reruns.Reading({"j": reruns.merged([(10, 20), (0, 10), (25, 30)])}, frozenset({"bad"}))
    assert reading.read == {"j": ((0, 20), (25, 30))}
    storage, layout = Storage(S3Config()), LakeLayout(f"file://{tmp_path}")
    reruns.leave_reading(storage, layout, "flow", "accounts", [hour(1)], reading)
    stored = reruns.read_reading(storage, layout, "flow", "accounts", hour(1))
    assert stored is not None and stored.recorded  # a mark of its own (`AfterRemoval`)
    assert dataclasses.replace(stored, recorded=None) == reading
    assert reading.holds(reruns.ByteRange("a", "j", 26, 30))
    before_the_gap = reruns.ByteRange("a", "j", 5, 20)  # read, but nothing after 20..25 commits it
    assert not reading.holds(before_the_gap) and reading.answers(before_the_gap)
    assert not reading.answers(reruns.ByteRange("b", "j", 15, 26))  # bytes 20..25 were not read
    assert not reading.holds(reruns.ByteRange("c", "other", 0, 1))
    set_aside = reruns.ByteRange("bad", "j", 40, 50)
    assert not reading.holds(set_aside) and reading.answers(set_aside)  # its own hour reports it


def test_readings_with_a_hole_are_marked_until_one_without_replaces_them_and_a_damaged_one_is_passed(
    tmp_path,
):
    """A reading with a hole marks its partitions (one listing finds them); a later reading of
    a partition without one removes its mark. A marked partition whose reading cannot be read is
    warned of and left out: it stops no run. Only a fragment the run could use, and not one the
    marked reading set aside, fills a hole (a set-aside fragment read again leaves the same hole)."""
    from lake_assets.feeds.flow_journal import FlowJournalFormat

    storage, layout = Storage(S3Config()), LakeLayout(f"file://{tmp_path}")
    holed = reruns.Reading(
        {"j": ((0, 88), (182, 255))}, frozenset({"file:///l/j/utc_date=2024-06-01/utc_hour=11/bad"})
    )
    assert holed.gaps() == {"j": [(88, 182)]} and reruns.Reading({"j": ((0, 255),)}).gaps() == {}
    reruns.leave_reading(storage, layout, "flow", "t", [hour(1), hour(2)], holed)
    warned: list[str] = []
    found = reruns.readings_with_gaps(storage, layout, "flow", "t", {hour(2)}, warned.append)
    assert list(found) == [hour(1)]
    reruns.leave_reading(storage, layout, "flow", "t", [hour(1)], reruns.Reading({"j": ((0, 255),)}))
    assert list(reruns.readings_with_gaps(storage, layout, "flow", "t", set(), warned.append)) == [hour(2)]
    (tmp_path / "_state" / "flow" / "t" / "reading" / f"{hour(2)}.json").write_text("{not json")
    assert reruns.readings_with_gaps(storage, layout, "flow", "t", set(), warned.append) == {}
    assert hour(2) in warned[0]

    fill = "file:///l/j/utc_date=2024-06-01/utc_hour=11/" + f"{100:016x}-{150:016x}-{'0' * 40}.gz"
    beside = "file:///l/j/utc_date=2024-06-01/utc_hour=12/" + f"{182:016x}-{200:016x}-{'1' * 40}.gz"
    landed = FlowJournalFormat().byte_ranges("file:///l", [fill, beside])
    asked = reruns.filling_gaps({hour(2): holed}, landed)
    assert asked == {hour(2): [reruns.ByteRange(fill, "j", 100, 150)]}
    set_aside = dataclasses.replace(holed, set_aside=frozenset({fill}))
    assert reruns.filling_gaps({hour(2): set_aside}, landed[:1]) == {}


def test_requests_to_run_again_stand_until_a_fold_whose_changes_read_what_they_name(tmp_path):
    storage, layout = Storage(S3Config()), LakeLayout(f"file://{tmp_path}")
    late, other = tmp_path / "f1.gz", tmp_path / "f2.gz"
    late.write_bytes(b"x")
    other.write_bytes(b"y")
    first = reruns.ByteRange(f"file://{late}", "j", 100, 200)
    second = reruns.ByteRange(f"file://{other}", "j", 300, 400)
    reruns.request_rerun(storage, layout, "flow", "t", hour(1), "a transaction ends there", [first])
    reruns.request_rerun(storage, layout, "flow", "t", hour(1), "another", [second])  # a file of its own
    standing = reruns.read_reruns(storage, layout, "flow", "t")
    assert {r.parts for r in standing[hour(1)]} == {(first,), (second,)}
    [change] = processed.changed_partitions(storage, {hour(1): []}, {hour(1): {}}, reruns.asked(standing))
    assert change.reason.startswith("to run again: ") and "(and 1 more request(s))" in change.reason

    def fold_read(ranges: tuple[tuple[int, int], ...]) -> list[reruns.RerunRequest]:
        reruns.leave_reading(storage, layout, "flow", "t", [hour(1)], reruns.Reading({"j": ranges}))
        return reruns.withdraw_answered(storage, layout, "flow", "t", [hour(1)], warnings.append)

    warnings: list[str] = []
    assert fold_read(((0, 100),)) == []  # answers neither
    assert [r.parts for r in fold_read(((0, 200),))] == [(first,)]  # answers the first only
    other.unlink()  # the second's file is gone: nothing is left to read, so it goes too, warned
    assert [r.parts for r in fold_read(((0, 200),))] == [(second,)]
    assert reruns.read_reruns(storage, layout, "flow", "t") == {} and str(other) in warnings[0]


def test_a_request_made_after_a_removal_stands_until_a_reading_recorded_since(tmp_path):
    """A request that a partition be read again after files were removed is answered only by a
    reading recorded after it: a fold of changes read before the removal leaves it standing,
    the next read withdraws it. A partition with no reading yet needs one too; a request written
    before such requests were marked reads as the plain request it was."""
    storage, layout = Storage(S3Config()), LakeLayout(f"file://{tmp_path}")
    reading = reruns.Reading({"j": ((0, 100),)})

    def folds() -> list[reruns.RerunRequest]:
        return reruns.withdraw_answered(storage, layout, "flow", "t", [hour(1), hour(2)], print)

    reruns.leave_reading(storage, layout, "flow", "t", [hour(1)], reading)  # read before the removal
    assert reruns.request_read_since_removal(storage, layout, "flow", "t", hour(1), "holds data of x")
    assert reruns.request_read_since_removal(
        storage, layout, "flow", "t", hour(2), "holds data of y"
    )  # never read
    # each run of the emptied hours finds the removal again: one request waits for the next reading
    assert reruns.request_read_since_removal(storage, layout, "flow", "t", hour(1), "holds data of x") is None
    assert folds() == []
    reruns.leave_reading(storage, layout, "flow", "t", [hour(1), hour(2)], reading)  # read again since
    assert sorted(r.partition for r in folds()) == [hour(1), hour(2)]
    old = reruns.reruns_folder(layout, "flow", "t") + f"/{hour(1)}/1-old.json"
    storage.write_bytes(old, json.dumps({"reason": "from before", "parts": []}).encode())
    assert reruns.read_reruns(storage, layout, "flow", "t")[hour(1)][0].after is None
    assert [r.uri for r in folds()] == [old]


def test_a_run_read_across_a_new_hole_asks_itself_again_for_a_file_it_did_not_know_of(tmp_path):
    """A run whose reading has a hole looks, before it lets the table go, for a landed file
    filling it that it did not catalogue (one that landed during the run): its own hours are
    asked to run again. A file it knew of (read, or set aside: the store refused it) asks
    nothing, or the run would ask itself again and again; nor does a hole its hours' readings
    had already, marked for the filling file's own run to find."""
    from lake_assets import pipeline
    from lake_assets.feeds.flow_journal import FlowJournalFormat

    landing, storage, layout = tmp_path / "landing", Storage(S3Config()), LakeLayout(f"file://{tmp_path}")
    collection = CollectionConfig(name="acmeCo/customers", key=("/id",))
    feed = FeedConfig(
        name="flow", format="flow_journal", landing=f"file://{landing}", collections=(collection,)
    )
    work = pipeline.TableWork(
        feed, FlowJournalFormat((collection,)), "acmeco_customers", storage, layout, None, "a"
    )
    folder = landing / "acmeCo" / "customers" / "pivot=00" / "utc_date=2024-06-01" / "utc_hour=11"
    folder.mkdir(parents=True)
    fill = folder / f"{88:016x}-{182:016x}-{'0' * 40}.gz"
    fill.write_bytes(b"x")
    holed = reruns.Reading({"acmeCo/customers/pivot=00": ((0, 88), (182, 255))})
    said: list[str] = []
    log = type("Log", (), {"warning": staticmethod(said.append)})()
    own = ["2024-06-01-12"]

    def ask(known: set[str]) -> list[str]:
        return pipeline._ask_again_for_holes_filled_meanwhile(work, own, holed, known, log)

    assert ask({f"file://{fill}"}) == []
    assert ask(set()) == own and f"file://{fill}" in said[0]
    (request,) = reruns.read_reruns(storage, layout, "flow", "acmeco_customers")[own[0]]
    assert [part.uri for part in request.parts] == [f"file://{fill}"]
    reruns.leave_reading(storage, layout, "flow", "acmeco_customers", own, holed)
    assert ask(set()) == []  # the hole was marked before: the file's own run asks
    # ... unless the marked reading set aside a file this one does not: the filling file's own
    # run passed that reading over for it
    aside = dataclasses.replace(holed, set_aside=frozenset({f"file://{fill}"}))
    reruns.leave_reading(storage, layout, "flow", "acmeco_customers", own, aside)
    assert ask(set()) == own


def test_a_fold_answers_no_request_with_a_reading_another_run_stored_since(tmp_path):
    """Run A stored an hour's changes before a removal; a request asked for a read since; run B
    read and stored the hour again. A's fold folds A's batch: the reading B recorded is not what
    A folded, so the request stands for B's fold (were B's to fail, nothing else would tell)."""
    from lake_assets import pipeline

    storage, layout = Storage(S3Config()), LakeLayout(f"file://{tmp_path}")
    feed = FeedConfig(name="flow", format="unit_cdc", landing=f"file://{tmp_path}/landing")
    work = pipeline.TableWork(feed, None, "t", storage, layout, None, "run-a")
    files = {hour(1): {f"file://{tmp_path}/f.gz": processed.ProcessedFile(1, "h", 2)}}
    reading = reruns.Reading({"j": ((0, 100),)})
    processed.write_stored_notes(storage, layout, "flow", "t", files, "run-a")
    reruns.leave_reading(storage, layout, "flow", "t", [hour(1)], reading)
    assert reruns.request_read_since_removal(storage, layout, "flow", "t", hour(1), "holds data of x")
    processed.write_stored_notes(storage, layout, "flow", "t", files, "run-b")
    reruns.leave_reading(storage, layout, "flow", "t", [hour(1)], reading)

    pipeline.record_processed(work, [hour(1)], "run-a")
    assert list(reruns.read_reruns(storage, layout, "flow", "t")) == [hour(1)]
    pipeline.record_processed(dataclasses.replace(work, run_id="run-b"), [hour(1)], "run-b")
    assert reruns.read_reruns(storage, layout, "flow", "t") == {}


def test_a_backfills_notes_are_written_several_at_a_time_and_one_failure_stops_none_of_the_others(
    tmp_path, monkeypatch
):
    """On S3 each note is a request: a backfill's 169 written one after another wait out 169
    round trips."""
    storage, layout = Storage(S3Config()), LakeLayout(f"file://{tmp_path}")
    notes = {hour(h): {f"file:///x/{h}.parquet": processed.ProcessedFile(h, "abc", 5)} for h in range(12)}
    in_flight, most, lock = 0, 0, threading.Lock()
    original = Storage.write_bytes

    def slow_write(self, uri, data):
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.05)  # a request's latency
        with lock:
            in_flight -= 1
        if uri.endswith(f"{hour(3)}.json"):
            raise OSError("the store refused one note")
        return original(self, uri, data)

    monkeypatch.setattr(Storage, "write_bytes", slow_write)
    with pytest.raises(OSError, match="refused one note"):
        processed.write_notes(storage, layout, "unit", "accounts", notes)
    assert most > 1
    written = processed.read_notes(storage, layout, "unit", "accounts")
    assert set(written) == set(notes) - {hour(3)}


# --- lake-assets status ----------------------------------------------------------------------------


def test_status_shows_what_waits_what_was_set_aside_the_rows_and_the_last_run(
    lake, tmp_path, capsys, monkeypatch
):
    bad = hour_dir(lake.landing, "accounts", 2) / "part-bad.parquet"
    bad.write_bytes(b"not parquet at all")
    assert lake.run() == [(hour(2), hour(2))]
    lake.write(6, "part-0.parquet", [event("f", "I", 6, at(6, 5), name="f", balance=6)])

    [status] = lake_status(lake.config, lake.instance)
    assert status.last_processed == hour(3)
    assert status.pending == [{"partition": hour(6), "reason": "new: 1 file(s)", "files": 1}]
    [quarantined] = status.quarantined
    assert (
        quarantined["file"] == f"file://{bad}"
        and quarantined["partition"] == hour(2)
        and quarantined["reason"]
    )
    assert (status.changes_rows, status.current_rows, status.history_rows) == (3, 3, 3)
    assert (
        status.last_run["status"] == "SUCCESS" and status.last_run["partitions"] == f"{hour(2)} .. {hour(2)}"
    )

    config_file = tmp_path / "lake.yaml"
    config_file.write_text(dump_config(lake.config))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    assert main(["status", "--config", str(config_file), "--json"]) == 0
    [printed] = json.loads(capsys.readouterr().out)
    assert printed["pending"] == status.pending and printed["quarantined"] == status.quarantined
    assert printed["last_run"] is None  # an ephemeral instance keeps no runs between commands
    assert main(["status", "--config", str(config_file)]) == 0
    text = capsys.readouterr().out
    assert f"unit/accounts: not processed: {hour(6)} (1 file(s)): new: 1 file(s)" in text
    assert f"unit/accounts: quarantined: file://{bad}: " in text and "set DAGSTER_HOME" in text

    # A backfill from the UI (Dagster's own asset job) is the table's last run from then on.
    layers = [
        dg.AssetKey(["unit", "accounts", layer]) for layer in ("catalog", "changes", "current", "history")
    ]
    backfill = (
        discovered_definitions(lake.config)
        .resolve_implicit_global_asset_job_def()
        .execute_in_process(
            instance=lake.instance,
            tags={RANGE_START_TAG: hour(6), RANGE_END_TAG: hour(6)},
            asset_selection=layers,
        )
    )
    [status] = lake_status(lake.config, lake.instance)
    assert status.pending == [] and status.last_run["run_id"] == backfill.run_id
    assert (
        status.last_run["job"] == backfill.job_def.name
        and status.last_run["partitions"] == f"{hour(6)} .. {hour(6)}"
    )
    # and the command's next run after it
    lake.write(7, "part-0.parquet", [event("g", "I", 7, at(7, 5), name="g", balance=7)])
    assert lake.run() == [(hour(7), hour(7))]
    [status] = lake_status(lake.config, lake.instance)
    assert status.last_run["job"] != backfill.job_def.name
    assert status.last_run["partitions"] == f"{hour(7)} .. {hour(7)}"


def test_status_names_a_fold_stopped_while_putting_its_files_in_place(lake, monkeypatch):
    """A run killed in the middle of a fold's commit leaves the new files beside those they
    replace (current with two rows for one key) until the table's next run finishes the commit:
    `status` says so, and no longer once it is finished."""
    from lake_assets.engine import state

    real_apply = state._apply

    def stopped_after_the_adds(storage, plan, on_step):
        for staged, final in plan.adds:
            storage.move_file(staged, final)
        raise RuntimeError("killed")

    lake.write(3, "part-1.parquet", [event("c", "U", 4, at(3, 30), name="c2", balance=4)])
    monkeypatch.setattr(state, "_apply", stopped_after_the_adds)
    with pytest.raises(LakeAssetsError):
        lake.run()
    [status] = lake_status(lake.config, lake.instance)
    assert len(status.unfinished_folds) == 1 and status.current_rows == 6
    assert "unit/accounts: unfinished: fold " in format_status([status], keeps_runs=True)
    monkeypatch.setattr(state, "_apply", real_apply)
    assert lake.run() == [(hour(3), hour(3))]
    [status] = lake_status(lake.config, lake.instance)
    assert status.unfinished_folds == [] and status.current_rows == 3


def test_a_new_stray_file_makes_a_run_that_reports_it_once(lake):
    stray = lake.landing / "accounts" / "year=2024" / "month=03" / "day=01" / "hour=25" / "part-0.parquet"
    stray.parent.mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([event("s", "I", 9, at(3, 9), name="s", balance=9)], schema=ACCOUNT_SCHEMA),
        stray,
    )
    assert lake.run() == [(hour(3), hour(3))]  # the last hour's run reports the table's strays
    notes = list((lake.lake / "_quarantine" / "unit" / "accounts" / "_unpartitioned").rglob("*.reason.json"))
    assert len(notes) == 1 and f"file://{stray}" in notes[0].read_text()
    assert lake.run() == []


def test_the_hour_under_way_is_read_and_a_later_dated_folder_is_reported_not_run(lake):
    """A file of the hour under way is read like any other; a folder dated after it (a vendor's
    clock, or local times) holds no partition yet: it is reported, and the run does not fail."""
    now = dt.datetime.now(dt.UTC)
    future = dt.datetime(2999, 6, 1, 10, tzinfo=dt.UTC)
    paths = {}
    for name, moment in (("now", now), ("future", future)):
        folder = lake.landing / "accounts" / moment.strftime("year=%Y/month=%m/day=%d/hour=%H")
        folder.mkdir(parents=True)
        paths[name] = folder / "part-0.parquet"
        row = event(name, "I", 9, moment, name=name, balance=9)
        pq.write_table(pa.Table.from_pylist([row], schema=ACCOUNT_SCHEMA), paths[name])
    key = now.strftime("%Y-%m-%d-%H")
    assert lake.run() == [(key, key)]
    assert lake.changes()[key] == ["now"]
    [note] = (lake.lake / "_quarantine" / "unit" / "accounts" / "_unpartitioned").rglob("*.reason.json")
    assert (
        f"file://{paths['future']}" in note.read_text() and "after the current UTC hour" in note.read_text()
    )
    assert lake.run() == []


def test_a_quarantine_entry_goes_once_its_file_reads_or_is_gone(lake):
    """A vendor re-uploads a truncated file whole: its rows reach `changes`, so the entry that
    said it was set aside goes; a quarantined file removed from the landing takes its entry along."""
    fixed = hour_dir(lake.landing, "accounts", 2) / "part-1.parquet"
    fixed.write_bytes(b"PAR1 truncated upload")
    gone = hour_dir(lake.landing, "accounts", 3) / "part-1.parquet"
    gone.write_bytes(b"not parquet at all")
    lake.run()
    assert {q["file"] for q in lake_status(lake.config, lake.instance)[0].quarantined} == {
        f"file://{fixed}",
        f"file://{gone}",
    }

    lake.write(2, "part-1.parquet", [event("d", "I", 4, at(2, 9), name="d", balance=4)])
    gone.unlink()
    lake.run()
    [status] = lake_status(lake.config, lake.instance)
    assert status.quarantined == []
    assert not list((lake.lake / "_quarantine").rglob("*.*"))  # copies and notes alike
    assert lake.changes()[hour(2)] == ["b", "d"]


def test_a_table_another_writer_holds_fails_after_the_wait_naming_it_and_the_other_tables_go_on(lake):
    """A `lake-assets run` beside another writer of a table (the daemon's run) waits for it,
    `lease_wait_seconds`, then fails that table naming the holder; the other tables go on, and
    the next run does what was left."""
    from lake_assets import lease

    lake.config = lake.config.model_copy(update={"lease_wait_seconds": 1})
    lake.write(4, "part-0.parquet", [event("d", "I", 4, at(4, 5), name="d", balance=4)])
    lake.write(4, "part-0.parquet", [event("x", "I", 4, at(4, 5), name="x", balance=4)], table="cards")
    layout = LakeLayout(lake.config.lake)
    with (
        lease.writing_table(Storage(), layout, "unit", "accounts", "daemon-run", "state", 0, print),
        pytest.raises(LakeAssetsError) as failed,
    ):
        lake.run()
    assert "unit/accounts" in str(failed.value) and "the table is being written by run daemon-run" in str(
        failed.value
    )
    assert lake.changes("cards") == {hour(4): ["x"]}
    assert hour(4) not in lake.changes()
    assert lake.run() == [(hour(4), hour(4))]
    assert lake.changes()[hour(4)] == ["d"]
    assert lake.run() == []


def test_no_other_writer_gets_the_table_between_a_runs_read_and_its_note_of_what_it_stored(lake, monkeypatch):
    """The changes step holds its table's lease from its read of the landing to its note of what
    it stored, and the IO manager's store within holds it on. Another writer trying in between
    finds the table busy: in the gap there was between the store and the note, a rebuild or
    another run's store could come in, and the hour was noted processed with the change log
    lacking its rows; and while the batch was read, another run could set aside or withdraw
    the hour's quarantine entries."""
    from lake_assets import lease, pipeline
    from lake_assets.orchestration import io_managers

    layout = LakeLayout(lake.config.lake)
    tried: list[tuple[str, str]] = []

    def another_writer_tries(when: str) -> None:
        try:
            with lease.writing_table(Storage(), layout, "unit", "accounts", "another", "rebuild", 0, print):
                tried.append((when, "got in"))
        except lease.TableBusy:
            tried.append((when, "busy"))

    real_ingest, real_store = pipeline.ingest, io_managers.SparkParquetIOManager.handle_output

    def ingest(*args, **kwargs):
        another_writer_tries("read")
        return real_ingest(*args, **kwargs)

    def handle_output(self, context, obj):
        real_store(self, context, obj)
        another_writer_tries("stored")

    monkeypatch.setattr(pipeline, "ingest", ingest)
    monkeypatch.setattr(io_managers.SparkParquetIOManager, "handle_output", handle_output)
    lake.write(4, "part-0.parquet", [event("d", "I", 4, at(4, 5), name="d", balance=4)])
    assert lake.run() == [(hour(4), hour(4))]
    assert tried == [("read", "busy"), ("stored", "busy")]
    assert lake.changes()[hour(4)] == ["d"]


def test_a_changes_step_whose_store_fails_lets_go_of_its_tables_lease(lake, monkeypatch):
    """The changes step holds its table's lease across its output, which Dagster hands to the IO
    manager while the step waits: a store that fails ends the step, and the lease goes with it
    (the next run of the table does not wait for it)."""
    from lake_assets import lease
    from lake_assets.orchestration import io_managers

    def failing_store(*args, **kwargs):
        raise OSError("the disk is full")

    monkeypatch.setattr(io_managers, "store_partitions", failing_store)
    lake.write(4, "part-0.parquet", [event("d", "I", 4, at(4, 5), name="d", balance=4)])
    with pytest.raises(LakeAssetsError):
        lake.run()
    layout = LakeLayout(lake.config.lake)
    with lease.writing_table(Storage(), layout, "unit", "accounts", "next", "changes", 0, print):
        pass
    monkeypatch.undo()
    assert lake.run() == [(hour(4), hour(4))]
    assert lake.changes()[hour(4)] == ["d"]


def test_a_fold_does_not_take_another_runs_later_store_of_its_hours_for_what_it_folded(lake, monkeypatch):
    """Two writers of one table take turns step by step: another run may store an hour again
    between this run's store and its fold. Its note names a file this run's batch lacks; taken
    for this run's, the hour was noted processed, and were the other run's fold to fail, that
    file's rows would be in the change log but never folded, and no later run would look again."""
    from lake_assets import pipeline
    from lake_assets.orchestration.definitions import feed_job_name
    from lake_assets_tests.discovered import discovered_definitions

    job = discovered_definitions(lake.config).resolve_job_def(feed_job_name("unit"))
    changes_only = [dg.AssetKey(["unit", "accounts", "changes"])]
    real_writing = pipeline.TableWork.writing
    between = []

    def another_run_stores_first(work, step, log=None):
        if step == "state" and not between:
            between.append(step)
            lake.write(1, "part-1.parquet", [event("z", "I", 9, at(1, 30), name="z", balance=9)])
            other = job.execute_in_process(
                instance=lake.instance, partition_key=hour(1), asset_selection=changes_only
            )
            assert other.success  # its fold never comes (as if it failed)
        return real_writing(work, step) if log is None else real_writing(work, step, log)

    with monkeypatch.context() as patch:
        patch.setattr(pipeline.TableWork, "writing", another_run_stores_first)
        done = job.execute_in_process(
            instance=lake.instance,
            partition_key=hour(1),
            asset_selection=[dg.AssetKey(["unit", "accounts", x]) for x in ("changes", "current", "history")],
        )
        assert done.success and between
    assert lake.changes()[hour(1)] == ["a", "z"]
    assert lake.run() == [(hour(1), hour(1))]
    current = duckdb.execute(
        f"SELECT id FROM read_parquet('{lake.lake}/current/unit/accounts/**/*.parquet') ORDER BY id"
    ).fetchall()
    assert [r[0] for r in current] == ["a", "b", "c", "z"]


def test_a_stored_note_written_before_notes_named_their_run_counts_when_the_change_log_is_read_back(tmp_path):
    """A lake from before stored notes named their run: a fold of the change log read back takes
    its notes as they are; a fold of a batch handed over in memory (this run's own) does not."""
    layout = LakeLayout(f"file://{tmp_path}/lake")
    storage = Storage()
    old = {f"file://{tmp_path}/x.parquet": {"size": 1, "hash": "h", "recorded_ms": 2}}
    folder = processed.notes_folder(layout, "unit", "accounts", processed.STORED_FOLDER)
    storage.write_bytes(f"{folder}/{hour(1)}.json", json.dumps(old).encode())
    read = processed.read_stored_notes(storage, layout, "unit", "accounts", [hour(1)], None)
    assert read == ({hour(1): {f"file://{tmp_path}/x.parquet": processed.ProcessedFile(1, "h", 2)}}, [])
    assert processed.read_stored_notes(storage, layout, "unit", "accounts", [hour(1)], "run-a") == (
        {},
        [hour(1)],
    )


def test_a_fold_of_the_change_log_read_back_notes_no_hour_stored_again_since_the_read(lake, monkeypatch):
    """`current` and `history` materialised alone fold the change log as stored. Should another
    writer store an hour again between that read and the fold's notes (taking the processed note
    away, as a store does), the hour's stored note describes files the fold never read: it must
    not become the processed note."""
    from lake_assets import pipeline
    from lake_assets.orchestration.definitions import feed_job_name
    from lake_assets_tests.discovered import discovered_definitions

    job = discovered_definitions(lake.config).resolve_job_def(feed_job_name("unit"))
    layout = LakeLayout(lake.config.lake)
    note = processed.note_uri(layout, "unit", "accounts", hour(1)).removeprefix("file://")
    real_record = pipeline.record_processed

    def stored_again_meanwhile(work, partitions, *args, **kwargs):
        folder = lake.lake / "changes" / "unit" / "accounts" / f"hour={hour(1)}"
        for path in folder.glob("*.parquet"):
            path.rename(folder / f"again-{path.name}")
        Path(note).unlink()
        return real_record(work, partitions, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "record_processed", stored_again_meanwhile)
        done = job.execute_in_process(
            instance=lake.instance,
            partition_key=hour(1),
            asset_selection=[dg.AssetKey(["unit", "accounts", x]) for x in ("current", "history")],
        )
    assert done.success
    assert not Path(note).exists()
    assert lake.run() == [(hour(1), hour(1))]
