"""A purge is forever (issue #28, item 9): once a GRAX record's purge has been processed, no
re-run, range backfill, sensor run, late file or restore puts its field data back into
`changes`, `current` or `history`, and every layer equals a clean run over the same landed data."""

import shutil

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lake_assets.cli import main
from lake_assets.config import dump_config
from lake_assets.orchestration.definitions import batch_partitions_name
from lake_assets_tests.grax_lake import (
    FEED,
    ORG,
    SCHEMA,
    TABLE,
    backfill,
    clean_run,
    cli,
    config_for,
    field_data,
    land,
    leaks,
    purge,
    rows,
    sensor_tick,
    tables,
    version,
)

pytestmark = pytest.mark.minutes(3)

B1, B2, B3, B4, B5 = "00000000a", "00000000b", "00000000c", "00000000d", "00000000e"


def landed_with_a_purge(landing):
    """X and Y created in B1; B2 holds a later write of X with field data, then X's purge; Y
    changes in B3."""
    land(
        landing,
        B1,
        "data-00000000001.parquet",
        [version("X", 1, "01", "Xavier", "555-0101"), version("Y", 1, "02", "Yvonne")],
    )
    land(
        landing,
        B2,
        "data-00000000002.parquet",
        [version("X", 2, "03", "Xavier II", "555-0303"), purge("X", 3, "04")],
    )
    land(landing, B3, "data-00000000003.parquet", [version("Y", 4, "05", "Yves", "555-0505")])
    return landing


@pytest.fixture(scope="module")
def clean(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("clean")
    return clean_run(landed_with_a_purge(root / "landing"), root / "lake")


@pytest.fixture
def lake(tmp_path):
    landing = landed_with_a_purge(tmp_path / "landing")
    return config_for(landing, tmp_path / "lake"), tmp_path / "lake", dg.DagsterInstance.ephemeral()


def test_a_clean_run_erases_the_purged_record_and_records_the_purge(clean, lake):
    config, root, instance = lake
    cli(config, instance)
    assert leaks(root, {"X"}) == []
    assert tables(root) == clean
    assert {r["Id"] for r in rows(root, "changes")} == {"X", "Y"}  # the key and its versions stay
    # The purge is in the table's state: the key, when the lake recorded it, nothing else.
    ledger = rows_of_ledger(root)
    assert [r["Id"] for r in ledger] == ["X"] and ledger[0]["__purged_at"] is not None
    assert set(ledger[0]) == {"Id", "__purged_at"}


def rows_of_ledger(root):
    import duckdb

    folder = root / "_state" / FEED / TABLE / "purged"
    return (
        [
            dict(zip(("Id", "__purged_at"), r, strict=True))
            for r in duckdb.connect()
            .execute(f"SELECT Id, __purged_at FROM read_parquet('{folder}/*.parquet') ORDER BY Id")
            .fetchall()
        ]
        if folder.exists()
        else []
    )


def test_a_rebuilt_table_keeps_its_purges_once_the_purge_batch_has_left_the_landing(lake, tmp_path, capsys):
    """`lake-assets rebuild` forgets a table but its purge ledger: rebuilt from a landing that no
    longer holds the batch of X's purge (B2, gone with the vendor's retention), X's field data
    in B1 stays erased in every layer."""
    config, root, instance = lake
    cli(config, instance)
    config_file = tmp_path / "lake.yaml"
    config_file.write_text(dump_config(config))
    assert main(["rebuild", "--config", str(config_file), "--table", f"{FEED}/{ORG}/nothing"]) == 1
    assert f"feed 'grax' has no table '{ORG}/nothing'" in capsys.readouterr().err

    assert main(["rebuild", "--config", str(config_file), "--table", f"{FEED}/{TABLE}"]) == 0
    assert [rows(root, layer) for layer in ("changes", "current", "history")] == [[], [], []]
    assert [r["Id"] for r in rows_of_ledger(root)] == ["X"]
    shutil.rmtree(tmp_path / "landing" / "parquet" / "v2" / f"org={ORG}" / "object=Account" / f"batch={B2}")
    cli(config, instance)

    assert {r["Id"] for r in rows(root, "current")} >= {"Y"}  # rebuilt
    assert leaks(root, {"X"}) == []


@pytest.mark.parametrize("how", ["removed", "emptied", "cut short"])
def test_a_lost_ledger_is_taken_from_open_history_and_a_late_file_brings_no_purge_back(lake, tmp_path, how):
    """The ledger removed, emptied or cut short by hand (X's row gone, another key's kept), or a
    lake written before there was one, then a late file of X lands: open history still marks X
    purged, so X is taken as purged and the late file's field data goes into no layer."""
    config, root, instance = lake
    cli(config, instance)
    ledger = root / "_state" / FEED / TABLE / "purged"
    if how == "removed":
        shutil.rmtree(ledger)
    else:
        for part in ledger.glob("*.parquet"):
            table = pq.read_table(part)  # X's row alone
            ids = table.schema.get_field_index("Id")
            kept = table.slice(0, 0) if how == "emptied" else table.set_column(ids, "Id", pa.array(["Z"]))
            pq.write_table(kept, part)
    land(tmp_path / "landing", B1, "data-00000000005.parquet", [version("X", 1, "07", "Xavier", "555-0707")])

    cli(config, instance)

    assert leaks(root, {"X"}) == []
    assert {r["Name"] for r in rows(root, "current")} == {None, "Yves"}


def test_rerunning_every_batch_keeps_the_purge(clean, lake):
    """`lake-assets run` processes every landed batch again: the purge batch's re-run used to find
    the key already purged in the state and leave the re-written change log as landed."""
    config, root, instance = lake
    cli(config, instance)
    cli(config, instance)
    assert leaks(root, {"X"}) == []
    assert tables(root) == clean


def test_rerunning_an_old_batch_or_the_purge_batch_alone_keeps_the_purge(clean, lake):
    config, root, instance = lake
    cli(config, instance)
    for first, last in ((B1, B1), (B2, B2)):
        cli(config, instance, first, last)
        assert leaks(root, {"X"}) == [], (first, last)
    backfill(config, instance, B1, B2)  # the same from the UI: one run over a range of batches
    assert leaks(root, {"X"}) == []
    assert tables(root) == clean


def test_a_change_log_written_before_its_fold_holds_no_purged_fields(clean, lake):
    """Materialising only `changes` (the state follows later, by automation): the purge marked in
    the batch itself erases the key's fields in the write, not only once the fold has run."""
    config, root, instance = lake
    backfill(config, instance, B1, B3, layers=("catalog", "changes"))
    assert [leak for leak in leaks(root, {"X"}) if leak[0] == "changes"] == []
    backfill(config, instance, B1, B3, layers=("current", "history"))
    assert leaks(root, {"X"}) == []
    assert tables(root) == clean


def test_a_state_step_run_alone_applies_a_purge_to_the_change_log_it_read_its_batch_from(tmp_path, spark):
    """X's write (B2) and its purge (B3) were stored by `changes` alone, into a table holding
    rows (B1); then the state step runs alone over B2..B3, reading its batch back from the change
    log. Its purge rewrites B2's partition, which the batch was read from, and the checks after
    the commit read the batch again: it is kept as read, and the step succeeds as one run would."""
    landing = tmp_path / "landing"
    land(
        landing,
        B1,
        "data-1.parquet",
        [version("X", 1, "01", "Xavier", "555-0101"), version("Y", 1, "02", "Yvonne")],
    )
    land(landing, B2, "data-2.parquet", [version("X", 2, "03", "Xavier II", "555-0303")])
    land(landing, B3, "data-3.parquet", [purge("X", 3, "04")])
    config, root, instance = (
        config_for(landing, tmp_path / "lake"),
        tmp_path / "lake",
        dg.DagsterInstance.ephemeral(),
    )
    backfill(config, instance, B1, B1)
    for batch in (B2, B3):
        backfill(config, instance, batch, batch, layers=("catalog", "changes"))
    backfill(config, instance, B2, B3, layers=("current", "history"))
    assert leaks(root, {"X"}) == []
    assert tables(root) == clean_run(landing, tmp_path / "clean")


def _without_the_purge_batch(landing, folder_left: bool = False):
    """The purge batch's files removed from the landing, with its folder unless `folder_left`
    (a share may keep an emptied folder)."""
    batch = landing / "parquet" / "v2" / f"org={ORG}" / "object=Account" / f"batch={B2}"
    if not folder_left:
        shutil.rmtree(batch)
        return
    for landed in batch.glob("*.parquet"):
        landed.unlink()


@pytest.mark.parametrize("folder_left", [False, True], ids=["batch-gone", "folder-left"])
def test_a_purge_the_change_log_met_stays_when_no_fold_followed_and_its_batch_went(
    lake, tmp_path, folder_left
):
    """`changes` alone materialised (or the run killed before its fold): the write erased X in
    the change log by the purge its own rows carried. The vendor then removes the purge batch
    (perhaps leaving its folder): the next run re-reads B1 from the landing, where X's fields
    still are. The purge the change log met is kept (`purges.seen`) and the next fold records
    it, so X's fields come back into no layer; the batch's stored changes go with its files."""
    config, root, instance = lake
    backfill(config, instance, B1, B3, layers=("catalog", "changes"))
    _without_the_purge_batch(tmp_path / "landing", folder_left)

    cli(config, instance)

    assert leaks(root, {"X"}) == []
    assert [r["Id"] for r in rows_of_ledger(root)] == ["X"]
    assert not list((root / "_state" / FEED / TABLE / "purges_seen").glob("*.parquet"))  # recorded now
    # The purge batch's stored changes went with its landed files, though it was never folded.
    assert {r["batch"] for r in rows(root, "changes")} == {B1, B3}


@pytest.mark.parametrize(
    "folded, folder_left",
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["stored-only", "stored-only-folder-left", "folded", "folded-folder-left"],
)
def test_a_first_sensor_tick_runs_the_purge_batch_whose_files_went_and_removes_its_changes(
    lake, tmp_path, folded, folder_left
):
    """The daemon starts (or its cursor is reset) after the purge batch's files went from the
    landing (on a share, perhaps leaving its folder): `changes` alone had stored it (or its run
    was killed before the fold), or it was folded. A first tick remembers nothing and lists no
    file of B2: it finds B2 from what the lake read it from (its stored or processed note), and
    its run removes B2's stored changes, as `lake-assets run` does. X stays purged."""
    config, root, instance = lake
    backfill(config, instance, B1, B1)
    backfill(
        config, instance, B2, B2, layers=("catalog", "changes", "current", "history")[: 4 if folded else 2]
    )
    _without_the_purge_batch(tmp_path / "landing", folder_left)

    cursor, runs = sensor_tick(config, instance, None)

    assert runs == 1  # B2 .. B3, registered in a row
    assert {r["batch"] for r in rows(root, "changes")} == {B1, B3}
    assert leaks(root, {"X"}) == []
    assert [r["Id"] for r in rows_of_ledger(root)] == ["X"]
    assert sensor_tick(config, instance, cursor)[1] == 0


def test_a_purge_the_change_log_met_is_applied_by_a_fold_with_no_events(lake, tmp_path):
    """As above, but nothing lands after the purge batch went: the only partition left to run
    is the purge batch's own, now without files. Its fold has no events; it still records the
    purge the change log met and erases X from current and history."""
    config, root, instance = lake
    backfill(config, instance, B1, B1)
    backfill(config, instance, B2, B2, layers=("catalog", "changes"))
    _without_the_purge_batch(tmp_path / "landing")
    shutil.rmtree(tmp_path / "landing" / "parquet" / "v2" / f"org={ORG}" / "object=Account" / f"batch={B3}")

    cli(config, instance)

    assert leaks(root, {"X"}) == []
    assert [r["Id"] for r in rows_of_ledger(root)] == ["X"]
    assert not list((root / "_state" / FEED / TABLE / "purges_seen").glob("*.parquet"))
    assert {r["Id"] for r in rows(root, "current")} == {"X", "Y"}  # X without its fields (leaks)
    assert {r["batch"] for r in rows(root, "changes")} == {B1}


@pytest.mark.usefixtures("spark")  # the sensor's runs fold in this process
@pytest.mark.parametrize("path", ["cli", "sensor's first scan"])
def test_a_purge_kept_by_a_write_killed_before_it_noted_its_partition_is_applied(lake, tmp_path, path):
    """As above, but the run that met the purge was killed after its change-log write kept the
    purge (`purges_seen`) and before it noted the purge batch's partition stored. With the purge
    batch gone, no note named a partition to run: every run found nothing to do and X's fields
    stayed in all three layers. The kept purge names its partition; planning, and a sensor's
    first scan, run it."""
    config, root, instance = lake
    backfill(config, instance, B1, B1)
    backfill(config, instance, B2, B2, layers=("catalog", "changes"))
    (root / "_state" / FEED / TABLE / "stored" / f"{B2}.json").unlink()  # where the kill fell
    _without_the_purge_batch(tmp_path / "landing")
    shutil.rmtree(tmp_path / "landing" / "parquet" / "v2" / f"org={ORG}" / "object=Account" / f"batch={B3}")

    if path == "cli":
        cli(config, instance)
    else:
        assert sensor_tick(config, instance, None)[1] == 1

    assert leaks(root, {"X"}) == []
    assert [r["Id"] for r in rows_of_ledger(root)] == ["X"]
    assert not list((root / "_state" / FEED / TABLE / "purges_seen").glob("*.parquet"))


def test_a_purge_kept_by_a_rerun_of_a_processed_batch_stopped_before_its_fold_is_applied(tmp_path, spark):
    """B1 was processed; a late file with X's purge landed in it, and the run of B1 stopped
    after its change-log write kept the purge; then the late file went. B1's files are again
    those it was processed with, but its write forgot its processed note before it kept the
    purge: planning runs B1 again, and its fold records the purge."""
    landing, root, instance = tmp_path / "landing", tmp_path / "lake", dg.DagsterInstance.ephemeral()
    land(landing, B1, "data-00000000001.parquet", [version("X", 1, "01", "Xavier", "555-0101")])
    config = config_for(landing, root)
    backfill(config, instance, B1, B1)
    late = land(landing, B1, "data-00000000002.parquet", [purge("X", 2, "02")])
    backfill(config, instance, B1, B1, layers=("catalog", "changes"))
    late.unlink()

    cli(config, instance)

    assert leaks(root, {"X"}) == []
    assert [r["Id"] for r in rows_of_ledger(root)] == ["X"]


@pytest.mark.usefixtures("spark")  # the sensor's runs fold in this process
def test_a_running_sensor_applies_a_purge_kept_by_its_run_stopped_before_the_fold(lake, monkeypatch):
    """The sensor's run of B2 .. B3 stopped after its change-log write (killed, its retries
    spent): the write kept X's purge, and nothing new lands. A regular tick, which compares the
    landing with its cursor only, found nothing to run, and X's fields stayed in current and
    history. It runs the partition the kept purge names, once."""
    from lake_assets.orchestration import sensors

    monkeypatch.setattr(sensors, "KEPT_PURGES_EVERY_SECONDS", 0)  # each tick looks for them
    config, root, instance = lake
    backfill(config, instance, B1, B1)
    cursor, runs = sensor_tick(config, instance, None, layers=("catalog", "changes"))
    assert runs == 1
    assert leaks(root, {"X"}) != []  # as the stopped run left it

    cursor, runs = sensor_tick(config, instance, cursor)

    assert runs == 1
    assert leaks(root, {"X"}) == []
    assert [r["Id"] for r in rows_of_ledger(root)] == ["X"]
    assert not list((root / "_state" / FEED / TABLE / "purges_seen").glob("*.parquet"))
    assert sensor_tick(config, instance, cursor)[1] == 0


def test_the_partitions_of_kept_purges_are_read_from_their_files_footers(tmp_path):
    """A kept purge's file without the partitions (written before they were kept), with a
    value that is not a list of them, or that is not Parquet at all, names none and stops
    nothing: the fold reads its keys (and names a damaged file)."""
    from lake_assets.engine.purges import SEEN_IN_PARTITIONS, seen_in_partitions
    from lake_assets.engine.state import TableState
    from lake_assets.paths import LakeLayout
    from lake_assets.storage import Storage

    state = TableState(LakeLayout(f"file://{tmp_path}"), FEED, TABLE)
    folder = tmp_path / "_state" / FEED / TABLE / "purges_seen"
    folder.mkdir(parents=True)
    keys = pa.table({"Id": ["X"]})
    for name, named in [("a", b'["00000000b"]'), ("b", None), ("c", b"{not json"), ("d", b"[1, 2]")]:
        metadata = {SEEN_IN_PARTITIONS: named} if named is not None else None
        pq.write_table(keys.replace_schema_metadata(metadata), folder / f"part-{name}.parquet")
    (folder / "part-e.parquet").write_bytes(b"not parquet")

    assert seen_in_partitions(Storage(), state) == {"00000000b": [f"file://{folder}/part-a.parquet"]}


def test_a_rebuild_finishes_a_killed_folds_commit_before_it_forgets_the_table(lake, tmp_path, monkeypatch):
    """A fold killed once its commit record is written has decided: its commit records X's
    purge in the ledger. `lake-assets rebuild` used to remove the record and its staging with
    the rest of the state; with the purge batch gone from the landing, X's fields came back."""
    from lake_assets.engine import fold
    from lake_assets.runner import RunFailed

    config, root, instance = lake
    real_commit = fold.commit

    def killed_after_the_record(*args, **kwargs):
        def kill(step):
            if step == "add 0":
                raise KeyboardInterrupt("killed after the commit record")

        return real_commit(*args, **{**kwargs, "on_step": kill})

    monkeypatch.setattr(fold, "commit", killed_after_the_record)
    with pytest.raises((RunFailed, KeyboardInterrupt)):
        cli(config, instance)
    monkeypatch.undo()
    assert list((root / "_state" / FEED / TABLE / "commits").glob("*"))
    _without_the_purge_batch(tmp_path / "landing")
    config_file = tmp_path / "lake.yaml"
    config_file.write_text(dump_config(config))

    assert main(["rebuild", "--config", str(config_file), "--table", f"{FEED}/{TABLE}"]) == 0
    cli(config, instance)

    assert leaks(root, {"X"}) == []
    assert [r["Id"] for r in rows_of_ledger(root)] == ["X"]


@pytest.mark.usefixtures("spark")  # its sensor ticks and runs fold in this process
def test_late_files_sensor_runs_and_restores_never_bring_a_purge_back(lake, tmp_path):
    """Decided: a purge erases the record's data for good. A write of the same Id after the
    purge (a late file, the key written again) keeps its version in history but no field data; a
    record GRAX restores from it is a new key (`grax__restoredfrom`) and keeps its own."""
    config, root, instance = lake
    landing = tmp_path / "landing"
    cursor, runs = sensor_tick(config, instance, None)  # the sensor's first run: every batch
    assert runs == 1 and leaks(root, {"X"}) == []

    land(landing, B3, "data-00000000004.parquet", [version("X", 6, "06", "Xavier is back", "555-0606")])
    cursor, runs = sensor_tick(config, instance, cursor)  # the open batch grew: the sensor re-runs it
    assert runs == 1 and leaks(root, {"X"}) == []

    land(landing, B1, "data-00000000005.parquet", [version("X", 1, "07", "Xavier (late)", "555-0707")])
    cli(config, instance, B1, B1)  # an old batch's late file: an operator re-runs that batch
    assert leaks(root, {"X"}) == []

    land(
        landing,
        B4,
        "data-00000000006.parquet",
        [version("Z", 7, "08", "Xavier", "555-0101", grax__restoredfrom="X")],
    )
    cursor, runs = sensor_tick(config, instance, cursor)
    assert runs == 1 and leaks(root, {"X"}) == []
    restored = [r for r in rows(root, "current") if r["Id"] == "Z"]
    assert [field_data(r) for r in restored] == [
        {"Name": "Xavier", "Phone": "555-0101", "grax__restoredfrom": "X"}
    ]
    history_of_x = [r for r in rows(root, "history") if r["Id"] == "X"]
    assert [r["_fivetran_start"].hour for r in history_of_x] == [1, 2, 3, 6]  # every version, no data

    assert tables(root) == clean_run(landing, tmp_path / "clean")


def test_batches_registered_newest_first_are_still_all_processed(clean, lake, tmp_path):
    """Dagster runs a range in the order the batches were registered, not in their own order.
    Register B3 .. B4 first (an operator's `--from/--to`), then B1 .. B2: the instance then holds
    B3, B4, B1, B2, where the range B2 .. B4 holds nothing. The CLI and the sensor cut their
    runs into ranges the instance holds in a row, so every batch is still processed."""
    config, root, instance = lake
    land(tmp_path / "landing", B4, "data-00000000009.parquet", [version("Y", 9, "09", "Yves II")])
    cli(config, instance, B3, B4)
    backfill(config, instance, B1, B2)  # as the UI launches it: the landed batches are registered
    cli(config, instance, B2, B4)  # one planned run, two Dagster runs: B2, then B3 .. B4
    assert leaks(root, {"X"}) == []
    expected = clean_run(tmp_path / "landing", tmp_path / "clean")
    assert tables(root) == expected

    fresh_instance = dg.DagsterInstance.ephemeral()
    cli(config, fresh_instance, B3, B4)
    # every batch is new to its cursor, and processed with the files it holds: nothing runs, and
    # the batches the instance lacks are registered after the CLI's
    cursor, runs = sensor_tick(config, fresh_instance, None)
    assert runs == 0
    assert fresh_instance.get_dynamic_partitions(batch_partitions_name(FEED, TABLE)) == [B3, B4, B1, B2]
    assert leaks(root, {"X"}) == [] and tables(root) == expected

    # The open batch B4 grows and B5 lands: B4 .. B5 is no range of the instance's order.
    land(tmp_path / "landing", B4, "data-00000000010.parquet", [version("Y", 10, "10", "Yves III")])
    land(tmp_path / "landing", B5, "data-00000000011.parquet", [purge("Y", 11, "11")])
    _, runs = sensor_tick(config, fresh_instance, cursor)
    assert runs == 2  # B4, then B5
    assert leaks(root, {"X", "Y"}) == []
    assert tables(root) == clean_run(tmp_path / "landing", tmp_path / "clean-again")


@pytest.mark.parametrize(
    "marked_copy_first", [True, False], ids=["marker-in-the-file-sorting-first", "marker-last"]
)
def test_a_marker_on_one_of_two_identical_copies_of_a_write_purges_the_key(tmp_path, marked_copy_first):
    """GRAX repeats rows within and across files. When only one copy of a write carries the
    purge marker, the collapse of identical copies must keep the marker, whichever file the copy
    it keeps comes from: the key is purged when any of its events says so."""
    landing, root = tmp_path / "landing", tmp_path / "lake"
    land(landing, B1, "data-00000000001.parquet", [version("X", 1, "01", "Xavier", "555-0101")])
    copy = version("X", 2, "02", "Xavier II", "555-0202")
    marked = {**copy, "grax__purged": copy["source__modified"]}
    first, second = (marked, copy) if marked_copy_first else (copy, marked)
    land(landing, B2, "data-00000000002.parquet", [first, version("Y", 2, "03", "Yvonne")])
    land(landing, B2, "data-00000000003.parquet", [second])
    cli(config_for(landing, root), dg.DagsterInstance.ephemeral())
    assert leaks(root, {"X"}) == []
    assert [r["Id"] for r in rows_of_ledger(root)] == ["X"]
    assert [field_data(r) for r in rows(root, "current") if r["Id"] == "Y"] == [{"Name": "Yvonne"}]


def test_grax_columns_spelled_in_another_case_are_grax_columns(tmp_path):
    """The lake takes names equal ignoring case for one column. A file spelling the purge marker
    `GRAX__PURGED` (and the key `ID`) carried a purge that was read as a field named like it, and
    the key kept its field data."""
    landing, root = tmp_path / "landing", tmp_path / "lake"
    land(landing, B1, "data-00000000001.parquet", [version("X", 1, "01", "Xavier", "555-0101")])
    shouting = {name: name.upper() for name in ("Id", "grax__purged")}
    folder = land(landing, B2, "data-00000000002.parquet", [version("Y", 2, "02", "Yvonne")]).parent
    marked = [{shouting.get(k, k): v for k, v in purge("X", 3, "03").items()}]
    schema = pa.schema([f.with_name(shouting.get(f.name, f.name)) for f in SCHEMA])
    pq.write_table(pa.Table.from_pylist(marked, schema=schema), folder / "data-00000000003.parquet")
    cli(config_for(landing, root), dg.DagsterInstance.ephemeral())
    assert leaks(root, {"X"}) == []
    assert [r["Id"] for r in rows_of_ledger(root)] == ["X"]
    assert {r["Id"] for r in rows(root, "current")} == {"X", "Y"}
