"""The catalog as an asset of the graph, the pipeline reading what the catalog lists, and the
catalog of real runs: files spanning any stretch of time, and files the lake replaced."""

import datetime as dt

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from lake_assets.catalog.files import catalog_what, catalog_where, catalogued_landing
from lake_assets.config import FeedConfig, LakeConfig
from lake_assets.orchestration.definitions import build_definitions, resources_for
from lake_assets.runner import run_feeds
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


# --------------------------------------------------------------------------------------------
# files whose event times span more than 30 days, or the calendar's first and last years

FIRST_YEAR = dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc)
LAST_YEAR = dt.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=dt.timezone.utc)


def _ms(moment: dt.datetime) -> int:
    return (moment - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(milliseconds=1)


def _files_of_the_day(store, table: str, feed: str, moment: dt.datetime) -> list[str]:
    start = _ms(moment) // DAY_MS * DAY_MS
    return sorted(r["url"] for r in store.query_by_time(start, start + DAY_MS - 1, catalog_what(table), catalog_where(feed)))


def _assert_found_on_every_day_it_spans(store, table: str, feed: str, url: str, first: dt.datetime, last: dt.datetime):
    for moment in (first, first + (last - first) / 3, first + (last - first) / 2, last):
        assert url in _files_of_the_day(store, table, feed, moment), moment
    for moment, step in ((first, -1), (last, 1)):
        if FIRST_YEAR + dt.timedelta(days=1) <= moment <= LAST_YEAR - dt.timedelta(days=1):
            assert url not in _files_of_the_day(store, table, feed, moment + dt.timedelta(days=step)), moment


def test_a_unit_file_with_rows_in_the_years_1_and_9999_is_catalogued_and_the_run_succeeds(tmp_path, spark):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    far = write_events(landing, "accounts", 2, "part-far.parquet", [
        event("a", "I", 1, at(2, 5), name="now", balance=1),
        event("b", "I", 2, LAST_YEAR, name="last year", balance=2),
        event("c", "I", 3, FIRST_YEAR, name="first year", balance=3),
    ], ACCOUNT_SCHEMA)
    # 45 days of commits in one hour's file: more than the 30 day buckets datalake-common allows
    long = write_events(landing, "accounts", 3, "part-long.parquet", [
        event("d", "I", 4, at(3), name="early", balance=4),
        event("e", "I", 5, at(3) + dt.timedelta(days=45), name="late", balance=5),
    ], ACCOUNT_SCHEMA)
    config = LakeConfig(lake=f"file://{lake}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),))
    assert run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)

    changed = duckdb.sql(f"SELECT id, _version_at FROM read_parquet('{lake}/changes/unit/accounts/**/*.parquet') ORDER BY id").fetchall()
    assert [r[0] for r in changed] == ["a", "b", "c", "d", "e"]  # every landed row is in the change log
    resources = resources_for(config)
    store = resources["catalog"].get_store(resources["lake"])
    _assert_found_on_every_day_it_spans(store, "accounts", "unit", f"file://{far}", FIRST_YEAR, LAST_YEAR)
    _assert_found_on_every_day_it_spans(store, "accounts", "unit", f"file://{long}", at(3), at(3) + dt.timedelta(days=45))
    (record,) = [r for r in store.query_by_time(_ms(at(2)), _ms(at(2)), "accounts", "unit") if r["url"] == f"file://{far}"]
    assert (record["metadata"]["start"], record["metadata"]["end"]) == (_ms(FIRST_YEAR), _ms(LAST_YEAR))  # the true span


def test_a_grax_file_with_rows_in_the_years_1_and_9999_is_catalogued_and_the_run_succeeds(tmp_path, spark):
    org, landing, lake = "00Dfar", tmp_path / "landing", tmp_path / "lake"
    folder = landing / "parquet" / "v2" / f"org={org}" / "object=Account" / "batch=000000001"
    folder.mkdir(parents=True)
    schema = pa.schema([("Id", pa.string()), ("source__modified", pa.timestamp("ms", tz="UTC")),
                        ("grax__idseq", pa.string()), ("Name", pa.string())])
    rows = [{"Id": "1", "source__modified": at(1), "grax__idseq": "a", "Name": "now"},
            {"Id": "2", "source__modified": LAST_YEAR, "grax__idseq": "a", "Name": "last year"},
            {"Id": "3", "source__modified": FIRST_YEAR, "grax__idseq": "a", "Name": "first year"}]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "data-000000001.parquet")
    config = LakeConfig(lake=f"file://{lake}", feeds=(FeedConfig("grax", "grax_v2", f"file://{landing}"),))
    assert run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)

    table = f"{org}/account"
    current = duckdb.sql(f"SELECT Id, Name FROM read_parquet('{lake}/current/grax/{table}/*.parquet') ORDER BY Id").fetchall()
    assert current == [("1", "now"), ("2", "last year"), ("3", "first year")]
    resources = resources_for(config)
    store = resources["catalog"].get_store(resources["lake"])
    landed = f"file://{folder}/data-000000001.parquet"
    _assert_found_on_every_day_it_spans(store, table, "grax", landed, FIRST_YEAR, LAST_YEAR)
    # the lake files written from it span the same years, and are found there too
    for moment in (FIRST_YEAR, at(1), LAST_YEAR):
        assert any("/changes/grax/" in url for url in _files_of_the_day(store, table, "grax", moment)), moment


def test_a_files_span_is_read_exactly_from_its_footer_whatever_its_times(tmp_path):
    from lake_assets.catalog.files import parquet_span
    from lake_assets.storage import Storage

    def span_of(name: str, values, arrow_type) -> tuple[int, int] | None:
        path = tmp_path / name
        pq.write_table(pa.table({"t": pa.array(values, arrow_type)}), path)
        return parquet_span(Storage(), f"file://{path}", ("t",))

    assert span_of("edges.parquet", [FIRST_YEAR, LAST_YEAR], pa.timestamp("us", tz="UTC")) == (_ms(FIRST_YEAR), _ms(LAST_YEAR))
    assert span_of("days.parquet", [dt.date(1, 1, 1), dt.date(9999, 12, 31)], pa.date32()) == (
        _ms(dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc)), _ms(dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc)))
    # microseconds beyond what a Python datetime holds (the year 148 thousand, and as far before year 1)
    assert span_of("far.parquet", [-(2**62), 2**62], pa.timestamp("us", tz="UTC")) == (-(2**62) // 1000, 2**62 // 1000)
    assert span_of("nanos.parquet", [-1, 1_500_000], pa.timestamp("ns")) == (-1, 1)  # floor: -1 ns is in ms -1
    assert span_of("text.parquet", ["2024-01-01"], pa.string()) is None
