"""The catalog as an asset of the graph, and the pipeline reading what the catalog lists."""

import dagster as dg
import duckdb

from lake_assets.catalog.files import catalog_what, catalog_where, catalogued_landing
from lake_assets.config import FeedConfig, LakeConfig
from lake_assets.orchestration.definitions import build_definitions, resources_for
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events

HOUR_1, HOUR_2 = "2024-03-01-01", "2024-03-01-02"
DAY_MS = 86_400_000


def _key(layer: str) -> dg.AssetKey:
    return dg.AssetKey(["unit", "accounts", layer])


def _changed_ids(lake, hour: str) -> list[str]:
    glob = f"{lake}/changes/unit/accounts/hour={hour}/*.parquet"
    return [r[0] for r in duckdb.sql(f"SELECT id FROM read_parquet('{glob}') ORDER BY id").fetchall()]


def test_changes_read_the_files_the_catalog_lists_not_the_landing_folder(tmp_path, spark):
    landing = tmp_path / "landing"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1, 5))], ACCOUNT_SCHEMA)
    write_events(landing, "accounts", 2, "part-0.parquet", [event("b", "I", 2, at(2, 5))], ACCOUNT_SCHEMA)
    config = LakeConfig(lake=f"file://{tmp_path / 'lake'}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),))
    defs = build_definitions(config)
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()

    # The catalog partition is materialised on its own: one record per landed file of the hour.
    assert job.execute_in_process(instance=instance, partition_key=HOUR_1, asset_selection=[_key("catalog")]).success
    resources = resources_for(config)
    store = resources["catalog"].get_store(resources["lake"])
    catalogued = catalogued_landing(store, "unit", "accounts", HOUR_1)
    assert [e.name for e in catalogued] == ["part-0.parquet"]
    assert catalogued_landing(store, "unit", "accounts", HOUR_2) == []  # not catalogued yet

    # A file lands after the catalog ran: a run of the downstream layers alone does not see it…
    write_events(landing, "accounts", 1, "part-1.parquet", [event("c", "I", 3, at(1, 9))], ACCOUNT_SCHEMA)
    downstream = [_key("changes"), _key("current"), _key("history")]
    assert job.execute_in_process(instance=instance, partition_key=HOUR_1, asset_selection=downstream).success
    assert _changed_ids(tmp_path / "lake", HOUR_1) == ["a"]

    # …until the catalog partition is brought up to date; then the same run reads both files.
    assert job.execute_in_process(instance=instance, partition_key=HOUR_1, asset_selection=[_key("catalog"), *downstream]).success
    assert _changed_ids(tmp_path / "lake", HOUR_1) == ["a", "c"]
    # Cataloguing again replaced the records: still one per file, found by a time query too.
    assert [e.name for e in catalogued_landing(store, "unit", "accounts", HOUR_1)] == ["part-0.parquet", "part-1.parquet"]
    day = at(0).timestamp() * 1000
    found = store.query_by_time(int(day), int(day) + DAY_MS - 1, catalog_what("accounts"), catalog_where("unit"))
    landed = sorted(r["url"].rsplit("/", 1)[-1] for r in found if "/landing/" in r["url"])
    assert landed == ["part-0.parquet", "part-1.parquet"]


def test_the_catalog_asset_shares_the_partitions_of_the_files_it_lists(tmp_path):
    landing = tmp_path / "landing"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1))], ACCOUNT_SCHEMA)
    config = LakeConfig(lake=f"file://{tmp_path / 'lake'}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),))
    graph = build_definitions(config).resolve_asset_graph()
    catalog, changes = graph.get(_key("catalog")), graph.get(_key("changes"))
    assert catalog.partitions_def == changes.partitions_def
    assert _key("catalog") in changes.parent_keys and _key("raw") in catalog.parent_keys
