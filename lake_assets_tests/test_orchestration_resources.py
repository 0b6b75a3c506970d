"""The resources as Dagster runs them: clients once per run, resources inside resources, and a
run's hand-over owned by the run."""

import dagster as dg

from lake_assets.catalog.parquet_store import ParquetCatalogStore
from lake_assets.config import FeedConfig, LakeConfig, S3Config
from lake_assets.orchestration.definitions import feed_job_name, resources_for
from lake_assets.orchestration.resources import CatalogResource, LakeResource
from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
from lake_assets_tests.discovered import discovered_definitions
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events


def test_a_runs_clients_are_built_once_and_not_shared_with_other_runs(tmp_path):
    lake = LakeResource(root=f"file://{tmp_path}")
    resources = {"lake": lake, "catalog": CatalogResource(lake=lake)}
    with dg.build_resources(resources) as first:
        storage, store = first.lake.get_storage(), first.catalog.get_store()
        assert first.lake.get_storage() is storage and first.catalog.get_store() is store
    with dg.build_resources(resources) as second:
        assert second.lake.get_storage() is not storage and second.catalog.get_store() is not store


def test_the_catalog_resource_holds_the_lake_it_catalogues(tmp_path):
    feed = FeedConfig(name="unit", format="unit_cdc", landing=f"file://{tmp_path}/in")
    resources = resources_for(LakeConfig(lake=f"file://{tmp_path}/lake", feeds=(feed,)))
    assert resources["catalog"].lake is resources["lake"]
    assert resources["lake_io_manager"].catalog is resources["catalog"]
    store = resources["catalog"].get_store()
    assert isinstance(store, ParquetCatalogStore) and store.root == f"file://{tmp_path}/lake/catalog"


def test_no_credential_reaches_the_resources_config(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEYID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXSECRETVALUE")
    config = LakeConfig(
        lake="s3a://lake/root",
        feeds=(FeedConfig(name="unit", format="unit_cdc", landing="s3a://landing/unit"),),
        s3=S3Config(endpoint_url="http://127.0.0.1:1"),
    )
    resources = resources_for(config)
    resources["lake"].get_storage()  # a client made with the keys: held privately, never as config
    shown = " ".join(repr(resource) for resource in resources.values())
    assert "s3a://lake/root" in shown and "AKIAEXAMPLEKEYID" not in shown and "wJalrXSECRETVALUE" not in shown


def test_a_batch_the_run_stored_and_did_not_fold_is_released_when_the_run_ends(tmp_path, spark):
    landing = tmp_path / "landing"
    for hour in (3, 4):
        rows = [event("a", "I", hour, at(hour), name="x", balance=1)]
        write_events(landing, "accounts", hour, "part-0.parquet", rows, ACCOUNT_SCHEMA)
    feed = FeedConfig(name="unit", format="unit_cdc", landing=f"file://{landing}")
    config = LakeConfig(lake=f"file://{tmp_path / 'lake'}", feeds=(feed,))
    job = discovered_definitions(config).resolve_job_def(feed_job_name("unit"))
    spark.catalog.clearCache()
    changes_only = [dg.AssetKey(["unit", "accounts", layer]) for layer in ("catalog", "changes")]
    result = job.execute_in_process(
        instance=dg.DagsterInstance.ephemeral(),
        asset_selection=changes_only,
        tags={RANGE_START_TAG: "2024-03-01-03", RANGE_END_TAG: "2024-03-01-04"},
    )
    assert result.success
    stored = result.asset_materializations_for_node("unit__accounts__changes")
    assert stored and stored[0].metadata["rows_written"].value == 2
    # The changes step kept its cached batch for a state step that this run does not have.
    assert spark._jsparkSession.sharedState().cacheManager().isEmpty()
