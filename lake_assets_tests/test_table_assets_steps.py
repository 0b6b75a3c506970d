"""`build_table_assets` step by step: each layer's factory and each piece of its bookkeeping."""

import dagster as dg
import pytest

from lake_assets import pipeline
from lake_assets.config import FeedConfig
from lake_assets.engine import checks
from lake_assets.engine.fold import FoldReport
from lake_assets.errors import SchemaClash
from lake_assets.feeds import format_for
from lake_assets.ingest import Batch
from lake_assets.orchestration import assets as steps
from lake_assets.orchestration.io_managers import PARTITION_COLUMN_KEY, TABLE_KEYS_KEY
from lake_assets.orchestration.resources import CatalogResource, LakeResource
from lake_assets.quarantine import UNPARTITIONED, Quarantined

HOURS = dg.HourlyPartitionsDefinition(start_date="2024-03-01-00:00")


def _unit_table(landing: str = "file:///landing/unit") -> steps.AssetTable:
    feed = FeedConfig(name="unit", format="unit_cdc", landing=landing)
    return steps.AssetTable(feed, format_for(feed), "accounts")


def _batch(**counts) -> Batch:
    fields = {
        "events": None,
        "files_listed": 3,
        "files_read": 2,
        "rows_in": 10,
        "events_out": 9,
        "duplicates": 1,
        "quarantined": [Quarantined("file:///landing/unit/accounts/bad.parquet", "not Parquet")],
    }
    return Batch(**{**fields, **counts})


def test_a_grouped_table_is_named_by_feed_group_and_table():
    feed = FeedConfig(name="grax", format="grax_v2", landing="s3a://bucket/grax")
    table = steps.AssetTable(feed, format_for(feed), "00D5g000004Fr0o/Account")
    assert table.label == "grax/00D5g000004Fr0o/Account"
    assert table.key("changes") == dg.AssetKey(["grax", "00D5g000004Fr0o", "Account", "changes"])
    assert table.group == "grax__00D5g000004Fr0o"
    assert table.pool == "lake_table__grax__00D5g000004Fr0o_Account"


def test_the_table_work_uses_the_runs_clients(tmp_path):
    lake = LakeResource(root=f"file://{tmp_path}")
    catalog = CatalogResource(lake=lake)
    work = _unit_table().work("run-1", lake, catalog)
    assert (work.table, work.run_id, work.layout.root) == ("accounts", "run-1", lake.layout().root)
    assert work.storage is lake.get_storage() and work.store is catalog.get_store()


def test_raw_files_are_observed_where_the_vendor_lands_them():
    raw = steps.raw_files_spec(_unit_table("s3a://bucket/unit"))
    assert raw.key == dg.AssetKey(["unit", "accounts", "raw"])
    assert raw.kinds == {"s3", "parquet"} and raw.group_name == "unit"
    assert raw.metadata == {"landing": "s3a://bucket/unit", "format": "unit_cdc"}
    assert "s3a://bucket/unit" in raw.description
    assert steps.raw_files_spec(_unit_table()).kinds == {"file", "parquet"}


def test_the_landing_catalog_follows_the_raw_files_in_single_run_backfills():
    table = _unit_table()
    raw = steps.raw_files_spec(table)
    catalog = steps.landing_catalog_asset(table, raw, HOURS)
    assert catalog.key == table.key("catalog")
    assert catalog.asset_deps[catalog.key] == {raw.key}
    assert catalog.partitions_def == HOURS and catalog.backfill_policy == dg.BackfillPolicy.single_run()
    assert {"lake", "catalog"} <= catalog.required_resource_keys
    assert "spark" not in catalog.required_resource_keys
    assert catalog.descriptions_by_key[catalog.key]


def test_the_catalogue_counts_become_metadata():
    landed = pipeline.LandingCatalogued(files=5, hashed=2, gone=1, refused=1)
    assert steps.catalogue_metadata(landed) == {
        "files_catalogued": 4,
        "files_hashed": 2,
        "files_gone": 1,
        "files_refused": 1,
    }


def test_the_change_log_is_stored_by_the_io_manager_one_writer_per_table():
    table = _unit_table()
    catalog = steps.landing_catalog_asset(table, steps.raw_files_spec(table), HOURS)
    changes = steps.changes_asset(table, catalog, HOURS)
    key = table.key("changes")
    assert changes.key == key and changes.asset_deps[key] == {catalog.key}
    spec = changes.specs_by_key[key]
    assert spec.metadata[PARTITION_COLUMN_KEY] == table.fmt.partition_column
    assert spec.metadata[TABLE_KEYS_KEY] == list(table.fmt.table_spec("accounts").keys)
    assert changes.get_io_manager_key_for_asset_key(key) == steps.IO_MANAGER_KEY
    assert changes.op.pool == table.pool and spec.automation_condition is not None
    assert [c.name for c in changes.check_specs] == [steps.LANDING_COMPLETE]
    assert {"spark", "lake", "catalog", steps.IO_MANAGER_KEY} <= changes.required_resource_keys


def test_a_batch_that_does_not_reconcile_fails_its_step():
    steps.require_reconciled(_unit_table(), _batch())
    with pytest.raises(dg.Failure, match="unit/accounts: counts do not reconcile") as failed:
        steps.require_reconciled(_unit_table(), _batch(events_out=8))
    assert "events out 8" in str(failed.value) and "DataFrame" not in str(failed.value)


def test_the_change_log_metadata_counts_every_file_and_row():
    batch = _batch(gaps=["journal bytes 10..20"], text_repaired={"file:///b": 2, "file:///a": 1}, derived=0)
    metadata = steps.changes_metadata(
        pipeline.Ingested(batch, files_catalogued=4, strays=[]), ["2024-03-01-00"]
    )
    plain = {name: getattr(value, "value", value) for name, value in metadata.items()}
    assert plain == {
        "files_listed": 3,
        "files_read": 2,
        "files_quarantined": 1,
        "quarantined": [{"file": "file:///landing/unit/accounts/bad.parquet", "reason": "not Parquet"}],
        "rows_in": 10,
        "events_out": 9,
        "duplicates_collapsed": 1,
        "events_derived": 0,
        "files_superseded": 0,
        "gaps": ["journal bytes 10..20"],
        "reader_counts": {},
        "text_values_repaired": 3,
        "text_repaired": [{"file": "file:///a", "values": 1}, {"file": "file:///b", "values": 2}],
        "reconciled": True,
        "stray_and_quarantine_files_catalogued": 4,
        "files_stray": 0,
        "partitions_asked_to_run_again": [],
    }


def test_a_range_run_lists_each_partitions_own_files_and_the_check_those_of_none():
    """Dagster copies a range run's metadata onto each of its partitions: a backfill's
    quarantined files were listed on every hour of it. Each hour now lists its own, the shared
    figures say they are the run's, and the landing check names the strays."""
    hours = ["2024-03-01-00", "2024-03-01-01", "2024-03-01-02", "2024-03-01-03"]
    bad = [
        Quarantined(f"file:///landing/unit/accounts/{n}.parquet", f"reason {n}") for n in ("h0", "h2", "odd")
    ]
    batch = _batch(files_listed=5, quarantined=bad, text_repaired={"file:///h1-text.parquet": 3})
    stray = Quarantined("file:///landing/unit/accounts/nohour/x.parquet", "outside every partition")
    batch.quarantine(stray)
    of = {bad[0].uri: hours[0], bad[1].uri: hours[2], bad[2].uri: "unknown", stray.uri: UNPARTITIONED}
    ingested = pipeline.Ingested(
        batch, files_catalogued=0, strays=[stray], partition_of={**of, "file:///h1-text.parquet": hours[1]}
    )

    shared = {k: getattr(v, "value", v) for k, v in steps.changes_metadata(ingested, hours).items()}
    own = {
        partition: {k: getattr(v, "value", v) for k, v in metadata.items()}
        for partition, metadata in steps.files_of_each_partition(ingested, hours).items()
    }
    check = steps.landing_check(ingested, hours)

    assert "quarantined" not in shared and "text_repaired" not in shared
    assert shared["run_partitions"].startswith("2024-03-01-00 to 2024-03-01-03: 4 partitions")
    assert shared["files_quarantined"] == 4 and shared["text_values_repaired"] == 3
    assert own == {  # the hour with no file to list has no metadata of its own
        hours[0]: {"quarantined": [{"file": bad[0].uri, "reason": "reason h0"}], "text_repaired": []},
        hours[1]: {"quarantined": [], "text_repaired": [{"file": "file:///h1-text.parquet", "values": 3}]},
        hours[2]: {"quarantined": [{"file": bad[1].uri, "reason": "reason h2"}], "text_repaired": []},
    }
    assert check.metadata["text_repaired_outside_the_partitions"].value == []
    assert check.metadata["quarantined_outside_the_partitions"].value == [
        {"file": bad[2].uri, "reason": "reason odd"},
        {"file": stray.uri, "reason": "outside every partition"},
    ]
    assert steps.files_of_each_partition(ingested, hours[:1]) == {}  # one partition: all on it


def test_the_landing_check_fails_on_gaps_and_strays_only():
    assert steps.landing_check(pipeline.Ingested(_batch(), files_catalogued=0), []).passed
    stray = Quarantined("file:///landing/unit/accounts/nohour/x.parquet", "outside every partition")
    with_stray = steps.landing_check(pipeline.Ingested(_batch(), files_catalogued=1, strays=[stray]), [])
    with_gap = steps.landing_check(pipeline.Ingested(_batch(gaps=["bytes 0..9"]), files_catalogued=0), [])
    assert not with_stray.passed and not with_gap.passed
    assert with_stray.check_name == steps.LANDING_COMPLETE
    assert with_stray.severity == dg.AssetCheckSeverity.ERROR
    assert with_stray.description == (
        "0 gap(s); 1 stray file(s) that no partition reads; 1 file(s) quarantined"
    )


def test_the_state_layers_fold_the_change_log_under_blocking_checks():
    table = _unit_table()
    catalog = steps.landing_catalog_asset(table, steps.raw_files_spec(table), HOURS)
    changes = steps.changes_asset(table, catalog, HOURS)
    state = steps.state_asset(table, changes, HOURS)
    current, history = table.key("current"), table.key("history")
    assert state.keys == {current, history} and not state.can_subset
    assert state.keys_by_input_name == {"batch": changes.key}
    assert {(c.asset_key, c.name, c.blocking) for c in state.check_specs} == {
        (current, "current_unique_key", True),
        (history, "history_windows", True),
        (history, "events_reconcile", True),
    }
    assert state.op.pool == table.pool and state.backfill_policy == dg.BackfillPolicy.single_run()
    assert all(state.descriptions_by_key[key] for key in (current, history))


def test_build_table_assets_chains_the_layers():
    table = _unit_table()
    built = steps.build_table_assets(table.feed, table.fmt, table.name, HOURS)
    assert built.keys[:3] == [table.key(layer) for layer in ("raw", "catalog", "changes")]
    assert set(built.keys[3:]) == {table.key("current"), table.key("history")}
    assert built.state.keys_by_input_name == {"batch": built.changes.key}
    assert built.changes.asset_deps[built.changes.key] == {built.landing_catalog.key}


@pytest.mark.parametrize(
    "selection, steps_run, catalogues",
    [
        (None, None, False),  # the whole job
        ("", None, False),  # the whole job, as a job run without a selection has it
        ("catalog changes state", None, False),
        ("changes state", None, True),  # from the UI, or by automation
        ("catalog changes state", ["changes", "state"], True),  # a retry from failure
    ],
)
def test_changes_catalogue_the_landing_first_unless_the_run_executes_the_catalog_step(
    selection, steps_run, catalogues
):
    from types import SimpleNamespace

    table = _unit_table()
    built = steps.build_table_assets(table.feed, table.fmt, table.name, HOURS)
    by_layer = {"catalog": built.landing_catalog, "changes": built.changes, "state": built.state}
    run = SimpleNamespace(
        asset_selection=None
        if selection is None
        else {k for x in selection.split() for k in by_layer[x].keys},
        step_keys_to_execute=None if steps_run is None else [by_layer[x].op.name for x in steps_run],
    )
    assert steps.runs_step_of(SimpleNamespace(run=run), built.landing_catalog) is not catalogues


def test_the_fold_figures_become_metadata_of_both_layers():
    report = FoldReport(
        "fold-1",
        events_in=7,
        keys_touched=3,
        late_keys=1,
        days_rewritten=["2024-03-01"],
        closed_files_rewritten=2,
        days_appended=["2024-03-02", "2024-03-03"],
        days_compacted=[],
        newly_purged=["k"],
    )
    assert steps.fold_metadata(report) == {
        "events_folded": 7,
        "keys_touched": 3,
        "late_keys": 1,
        "closed_days_rewritten": 1,
        "closed_files_rewritten": 2,
        "closed_days_appended": 2,
        "closed_days_compacted": 0,
        "keys_newly_purged": 1,
    }


def test_each_fold_check_is_reported_on_its_layer():
    outcomes = [
        checks.Outcome("current_unique_key", True, "ok", {}),
        checks.Outcome("history_windows", False, "2 overlaps", {"keys": 2}),
        checks.Outcome("events_reconcile", True, "ok", {}),
    ]
    results = list(steps.fold_check_results(_unit_table(), outcomes))
    assert [(r.asset_key.path[-1], r.check_name, r.passed) for r in results] == [
        ("current", "current_unique_key", True),
        ("history", "history_windows", False),
        ("history", "events_reconcile", True),
    ]
    assert results[1].metadata["keys"].value == 2 and results[1].severity == dg.AssetCheckSeverity.ERROR


def test_the_state_layers_as_a_reader_finds_them(tmp_path, spark):
    table, lake = _unit_table(), LakeResource(root=f"file://{tmp_path}")
    work = table.work("run-1", lake, CatalogResource(lake=lake))
    spark.createDataFrame([("a", 1), ("b", 2)], "id string, balance int").write.parquet(
        f"{tmp_path}/current/unit/accounts"
    )
    layers = steps.read_state_layers(table, spark, work)
    assert [(layer.key.path[-1], layer.rows) for layer in layers] == [("current", 2), ("history", 0)]
    assert layers[0].schema is not None and layers[0].schema.fieldNames() == ["id", "balance"]
    assert layers[1].schema is None  # no files yet
    results = steps.state_materializations(layers, FoldReport("fold-1", events_in=2))
    found = {result.asset_key.path[-1]: result.metadata for result in results}
    assert found["current"]["dagster/row_count"] == 2 and found["history"]["dagster/row_count"] == 0
    assert found["current"]["events_folded"] == 2


def test_a_batch_that_cannot_join_the_stored_table_fails_naming_its_files(spark, monkeypatch):
    batch = spark.createDataFrame(
        [("file:///l/h1/a.parquet", "x"), ("file:///l/h2/b.parquet", None)],
        "_source_file string, note string",
    )

    def clashing(*args, **kwargs):
        raise SchemaClash("note: string cannot join int", table="accounts", column="note")

    monkeypatch.setattr(pipeline, "fold_into_state", clashing)
    with pytest.raises(dg.Failure) as failed:
        steps.fold(_unit_table(), spark, None, batch, None)
    assert failed.value.description == (
        "unit/accounts: the batch cannot be folded into the stored table: "
        "note: string cannot join int; landed file(s) with this column: "
        "file:///l/h1/a.parquet"
    )
    assert failed.value.metadata["files"].value == ["file:///l/h1/a.parquet"]
