"""The catalog as an asset of the graph, the pipeline reading what the catalog lists, and the
catalog of real runs: files spanning any stretch of time, and files the lake replaced."""

import datetime as dt

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lake_assets.catalog.files import catalog_what, catalog_where, catalogued_entries, landed_records
from lake_assets.config import FeedConfig, LakeConfig
from lake_assets.epoch import DAY_MS
from lake_assets.orchestration.definitions import feed_job_name, resources_for
from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
from lake_assets.runner import run_feeds
from lake_assets.storage import Storage
from lake_assets_tests.discovered import discovered_definitions
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events

HOUR_1, HOUR_2 = "2024-03-01-01", "2024-03-01-02"


def catalogued_landing(store, feed: str, table: str, partition: str):
    """The landed files of one partition as the catalog lists them, in name order."""
    return catalogued_entries(landed_records(store, feed, table, [partition]))[partition]


def _key(layer: str) -> dg.AssetKey:
    return dg.AssetKey(["unit", "accounts", layer])


def _changed_ids(lake, hour: str) -> list[str]:
    glob = f"{lake}/changes/unit/accounts/hour={hour}/*.parquet"
    return [r[0] for r in duckdb.execute(f"SELECT id FROM read_parquet('{glob}') ORDER BY id").fetchall()]


def test_changes_read_the_files_the_catalog_lists_not_the_landing_folder(tmp_path, spark):
    landing = tmp_path / "landing"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1, 5))], ACCOUNT_SCHEMA)
    write_events(landing, "accounts", 2, "part-0.parquet", [event("b", "I", 2, at(2, 5))], ACCOUNT_SCHEMA)
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),)
    )
    defs = discovered_definitions(config)
    job = defs.resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()

    # The catalog partition is materialised on its own: one record per landed file of the hour.
    assert job.execute_in_process(
        instance=instance, partition_key=HOUR_1, asset_selection=[_key("catalog")]
    ).success
    resources = resources_for(config)
    store = resources["catalog"].get_store()
    catalogued = catalogued_landing(store, "unit", "accounts", HOUR_1)
    assert [e.name for e in catalogued] == ["part-0.parquet"]
    assert catalogued_landing(store, "unit", "accounts", HOUR_2) == []  # not catalogued yet

    # A file lands after the catalog ran: a run of the downstream layers alone brings the catalog
    # up to date first (it does not run the catalog step), then reads what the catalog lists…
    write_events(landing, "accounts", 1, "part-1.parquet", [event("c", "I", 3, at(1, 9))], ACCOUNT_SCHEMA)
    downstream = [_key("changes"), _key("current"), _key("history")]
    assert job.execute_in_process(instance=instance, partition_key=HOUR_1, asset_selection=downstream).success
    assert _changed_ids(tmp_path / "lake", HOUR_1) == ["a", "c"]

    # …as a run with the catalog step does.
    assert job.execute_in_process(
        instance=instance, partition_key=HOUR_1, asset_selection=[_key("catalog"), *downstream]
    ).success
    assert _changed_ids(tmp_path / "lake", HOUR_1) == ["a", "c"]
    # Cataloguing again replaced the records: still one per file, found by a time query too.
    assert [e.name for e in catalogued_landing(store, "unit", "accounts", HOUR_1)] == [
        "part-0.parquet",
        "part-1.parquet",
    ]
    day = at(0).timestamp() * 1000
    found = store.query_by_time(
        int(day), int(day) + DAY_MS - 1, catalog_what("accounts"), catalog_where("unit")
    )
    landed = sorted(r["url"].rsplit("/", 1)[-1] for r in found if "/landing/" in r["url"])
    assert landed == ["part-0.parquet", "part-1.parquet"]


def test_the_catalog_asset_shares_the_partitions_of_the_files_it_lists(tmp_path):
    landing = tmp_path / "landing"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1))], ACCOUNT_SCHEMA)
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),)
    )
    graph = discovered_definitions(config).resolve_asset_graph()
    catalog, changes = graph.get(_key("catalog")), graph.get(_key("changes"))
    assert catalog.partitions_def == changes.partitions_def
    assert _key("catalog") in changes.parent_keys and _key("raw") in catalog.parent_keys


# --------------------------------------------------------------------------------------------
# files whose event times span more than 30 days, or the calendar's first and last years

FIRST_YEAR = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
LAST_YEAR = dt.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=dt.UTC)


def _ms(moment: dt.datetime) -> int:
    return (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)


def _files_of_the_day(store, table: str, feed: str, moment: dt.datetime) -> list[str]:
    start = _ms(moment) // DAY_MS * DAY_MS
    return sorted(
        r["url"]
        for r in store.query_by_time(start, start + DAY_MS - 1, catalog_what(table), catalog_where(feed))
    )


def _assert_found_on_every_day_it_spans(
    store, table: str, feed: str, url: str, first: dt.datetime, last: dt.datetime
):
    for moment in (first, first + (last - first) / 3, first + (last - first) / 2, last):
        assert url in _files_of_the_day(store, table, feed, moment), moment
    for moment, step in ((first, -1), (last, 1)):
        if FIRST_YEAR + dt.timedelta(days=1) <= moment <= LAST_YEAR - dt.timedelta(days=1):
            assert url not in _files_of_the_day(store, table, feed, moment + dt.timedelta(days=step)), moment


def test_a_unit_file_with_rows_in_the_years_1_and_9999_is_catalogued_and_the_run_succeeds(tmp_path, spark):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    far = write_events(
        landing,
        "accounts",
        2,
        "part-far.parquet",
        [
            event("a", "I", 1, at(2, 5), name="now", balance=1),
            event("b", "I", 2, LAST_YEAR, name="last year", balance=2),
            event("c", "I", 3, FIRST_YEAR, name="first year", balance=3),
        ],
        ACCOUNT_SCHEMA,
    )
    # 45 days of commits in one hour's file: more than the 30 day buckets datalake-common allows
    long = write_events(
        landing,
        "accounts",
        3,
        "part-long.parquet",
        [
            event("d", "I", 4, at(3), name="early", balance=4),
            event("e", "I", 5, at(3) + dt.timedelta(days=45), name="late", balance=5),
        ],
        ACCOUNT_SCHEMA,
    )
    config = LakeConfig(lake=f"file://{lake}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),))
    assert run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)

    changed = duckdb.sql(
        f"SELECT id, _version_at FROM read_parquet('{lake}/changes/unit/accounts/**/*.parquet') ORDER BY id"
    ).fetchall()
    assert [r[0] for r in changed] == ["a", "b", "c", "d", "e"]  # every landed row is in the change log
    resources = resources_for(config)
    store = resources["catalog"].get_store()
    _assert_found_on_every_day_it_spans(store, "accounts", "unit", f"file://{far}", FIRST_YEAR, LAST_YEAR)
    _assert_found_on_every_day_it_spans(
        store, "accounts", "unit", f"file://{long}", at(3), at(3) + dt.timedelta(days=45)
    )
    (record,) = [
        r
        for r in store.query_by_time(_ms(at(2)), _ms(at(2)), "accounts", "unit")
        if r["url"] == f"file://{far}"
    ]
    assert (record["metadata"]["start"], record["metadata"]["end"]) == (
        _ms(FIRST_YEAR),
        _ms(LAST_YEAR),
    )  # the true span


def test_a_grax_file_with_rows_in_the_years_1_and_9999_is_catalogued_and_the_run_succeeds(tmp_path, spark):
    org, landing, lake = "00Dfar", tmp_path / "landing", tmp_path / "lake"
    folder = landing / "parquet" / "v2" / f"org={org}" / "object=Account" / "batch=000000001"
    folder.mkdir(parents=True)
    schema = pa.schema(
        [
            ("Id", pa.string()),
            ("source__modified", pa.timestamp("ms", tz="UTC")),
            ("grax__idseq", pa.string()),
            ("Name", pa.string()),
        ]
    )
    rows = [
        {"Id": "1", "source__modified": at(1), "grax__idseq": "a", "Name": "now"},
        {"Id": "2", "source__modified": LAST_YEAR, "grax__idseq": "a", "Name": "last year"},
        {"Id": "3", "source__modified": FIRST_YEAR, "grax__idseq": "a", "Name": "first year"},
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "data-000000001.parquet")
    config = LakeConfig(lake=f"file://{lake}", feeds=(FeedConfig("grax", "grax_v2", f"file://{landing}"),))
    assert run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)

    table = f"{org}/account"
    current = duckdb.sql(
        f"SELECT Id, Name FROM read_parquet('{lake}/current/grax/{table}/*.parquet') ORDER BY Id"
    ).fetchall()
    assert current == [("1", "now"), ("2", "last year"), ("3", "first year")]
    resources = resources_for(config)
    store = resources["catalog"].get_store()
    landed = f"file://{folder}/data-000000001.parquet"
    _assert_found_on_every_day_it_spans(store, table, "grax", landed, FIRST_YEAR, LAST_YEAR)
    # the lake files written from it span the same years, and are found there too
    for moment in (FIRST_YEAR, at(1), LAST_YEAR):
        assert any("/changes/grax/" in url for url in _files_of_the_day(store, table, "grax", moment)), moment


def test_a_files_span_is_read_exactly_from_its_footer_whatever_its_times(tmp_path):
    from lake_assets.catalog.files import parquet_span

    def span_of(name: str, values, arrow_type) -> tuple[int, int] | None:
        path = tmp_path / name
        pq.write_table(pa.table({"t": pa.array(values, arrow_type)}), path)
        return parquet_span(Storage(), f"file://{path}", ("t",))

    assert span_of("edges.parquet", [FIRST_YEAR, LAST_YEAR], pa.timestamp("us", tz="UTC")) == (
        _ms(FIRST_YEAR),
        _ms(LAST_YEAR),
    )
    assert span_of("days.parquet", [dt.date(1, 1, 1), dt.date(9999, 12, 31)], pa.date32()) == (
        _ms(dt.datetime(1, 1, 1, tzinfo=dt.UTC)),
        _ms(dt.datetime(9999, 12, 31, tzinfo=dt.UTC)),
    )
    # microseconds beyond what a Python datetime holds (the year 148 thousand, and as far before year 1)
    assert span_of("far.parquet", [-(2**62), 2**62], pa.timestamp("us", tz="UTC")) == (
        -(2**62) // 1000,
        2**62 // 1000,
    )
    assert span_of("nanos.parquet", [-1, 1_500_000], pa.timestamp("ns")) == (
        -1,
        1,
    )  # floor: -1 ns is in ms -1
    assert span_of("text.parquet", ["2024-01-01"], pa.string()) is None


class _StoreFailing(Storage):
    """A store whose reads of files fail the way a failing request does (a connection reset)."""

    def open_input_file(self, uri: str):
        raise ConnectionResetError(f"reading {uri}: the connection was reset")


def test_a_span_that_cannot_be_read_now_is_a_failure_not_a_missing_span(tmp_path):
    """A lake file's span places its catalog record, and its retirement is placed the same way
    when the file is about to go: a read failure taken for 'no span' placed the one by the
    modification time and the other by the span, and the removed file's record stayed behind.
    So the failure is raised (the step fails, and runs again); bytes that are no Parquet have no
    span. A landed file's record is retired as stored, so its span is left unknown instead."""
    from lake_assets.catalog.files import parquet_span, written_files
    from lake_assets.feeds import format_for
    from lake_assets.pipeline import RemovedFiles

    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"t": pa.array([FIRST_YEAR, LAST_YEAR], pa.timestamp("us", tz="UTC"))}), path)
    uri = f"file://{path}"
    assert parquet_span(Storage(), uri, ("t",)) == (_ms(FIRST_YEAR), _ms(LAST_YEAR))
    with pytest.raises(ConnectionResetError):
        parquet_span(_StoreFailing(), uri, ("t",))
    with pytest.raises(ConnectionResetError):
        written_files("unit", "accounts", "run-1", _StoreFailing(), [uri], ("t",))
    removed = RemovedFiles(_StoreFailing(), store=None, feed="unit", table="accounts", time_columns=("t",))
    with pytest.raises(ConnectionResetError):
        removed([uri])
    assert removed.pending == []

    # a fold killed mid-commit is finished with files of its delete list gone already
    gone = RemovedFiles(Storage(), store=None, feed="unit", table="accounts", time_columns=("t",))
    gone([f"file://{tmp_path / 'deleted-before-the-kill.parquet'}"])
    assert gone.pending == []

    (tmp_path / "garbled.parquet").write_bytes(b"PAR1 not a footer PAR1")
    assert parquet_span(Storage(), f"file://{tmp_path / 'garbled.parquet'}", ("t",)) is None
    unit = format_for(FeedConfig(name="unit", format="unit_cdc", landing=f"file://{tmp_path}"))
    assert unit.landing_span(_StoreFailing(), uri) is None


# --------------------------------------------------------------------------------------------
# files the lake replaced or deleted leave the catalog: a day query lists exactly what exists

LAKE_LAYERS = ("changes", "current", "history")


def _lake_files(lake) -> set[str]:
    """The data files of the published layers, as they are on disk."""
    return {
        f"file://{p}"
        for layer in LAKE_LAYERS
        for p in (lake / layer).rglob("*.parquet")
        if not p.name.startswith((".", "_"))
    }


def _catalogued_lake_files(store, table: str, feed: str, first: dt.datetime, last: dt.datetime) -> set[str]:
    found = store.query_by_time(_ms(first), _ms(last), catalog_what(table), catalog_where(feed))
    return {r["url"] for r in found if any(f"/{layer}/" in r["url"] for layer in LAKE_LAYERS)}


def _assert_the_catalog_lists_exactly_the_lake(
    store, lake, table: str, feed: str, first: dt.datetime, last: dt.datetime
):
    on_disk = _lake_files(lake)
    assert on_disk  # the lake was written
    for day in range((last.date() - first.date()).days + 1):
        start = max(first, dt.datetime.combine(first.date() + dt.timedelta(days=day), dt.time(), dt.UTC))
        # every file holds data of these days only, so each day's query may list any of them, but no other
        assert (
            _catalogued_lake_files(
                store, table, feed, start, start + dt.timedelta(days=1) - dt.timedelta(milliseconds=1)
            )
            <= on_disk
        )
    assert _catalogued_lake_files(store, table, feed, first, last) == on_disk


def test_rerunning_a_partition_and_its_fold_retires_the_records_of_the_files_they_replaced(tmp_path, spark):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    write_events(
        landing,
        "accounts",
        1,
        "part-0.parquet",
        [
            event("a", "I", 1, at(1, 5), name="a", balance=1),
            event("b", "I", 2, at(1, 6), name="b", balance=2),
        ],
        ACCOUNT_SCHEMA,
    )
    second = write_events(
        landing,
        "accounts",
        2,
        "part-0.parquet",
        [event("a", "U", 3, at(2, 5), name="a2", balance=3)],
        ACCOUNT_SCHEMA,
    )
    config = LakeConfig(lake=f"file://{lake}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),))
    job = discovered_definitions(config).resolve_job_def(feed_job_name("unit"))
    instance = dg.DagsterInstance.ephemeral()
    assert job.execute_in_process(
        instance=instance, tags={RANGE_START_TAG: HOUR_1, RANGE_END_TAG: HOUR_2}
    ).success
    resources = resources_for(config)
    store = resources["catalog"].get_store()
    first, last = at(0), at(23, 59, 59)
    _assert_the_catalog_lists_exactly_the_lake(store, lake, "accounts", "unit", first, last)
    before = _lake_files(lake)

    # A late file in hour 1, and the hour run again: its change partition, current and the open
    # history are written anew; the records of the files they replaced go.
    write_events(
        landing,
        "accounts",
        1,
        "part-1.parquet",
        [event("c", "I", 4, at(1, 9), name="c", balance=4)],
        ACCOUNT_SCHEMA,
    )
    assert job.execute_in_process(instance=instance, partition_key=HOUR_1).success
    replaced = before - _lake_files(lake)
    assert any("/changes/" in u for u in replaced) and any("/current/" in u for u in replaced), replaced
    _assert_the_catalog_lists_exactly_the_lake(store, lake, "accounts", "unit", first, last)

    # Hour 2's file rewritten in place with garbage: the hour is quarantined and its partition
    # emptied; its change file leaves the catalog with it.
    second.write_bytes(b"not parquet any more")
    assert job.execute_in_process(instance=instance, partition_key=HOUR_2).success
    assert not (lake / "changes" / "unit" / "accounts" / f"hour={HOUR_2}").exists()
    _assert_the_catalog_lists_exactly_the_lake(store, lake, "accounts", "unit", first, last)


def test_a_purge_rewriting_the_change_log_retires_the_records_of_the_files_it_replaced(tmp_path, spark):
    org, landing, lake = "00Dpurge", tmp_path / "landing", tmp_path / "lake"
    schema = pa.schema(
        [
            ("Id", pa.string()),
            ("source__modified", pa.timestamp("ms", tz="UTC")),
            ("grax__idseq", pa.string()),
            ("grax__purged", pa.timestamp("ms", tz="UTC")),
            ("Name", pa.string()),
        ]
    )
    batches = {
        "000000001": [
            {"Id": "1", "source__modified": at(1), "grax__idseq": "a", "Name": "Alice"},
            {"Id": "2", "source__modified": at(2), "grax__idseq": "a", "Name": "Bob"},
        ],
        "000000002": [{"Id": "1", "source__modified": at(5), "grax__idseq": "b", "grax__purged": at(4)}],
    }
    for batch, rows in batches.items():
        folder = landing / "parquet" / "v2" / f"org={org}" / "object=Account" / f"batch={batch}"
        folder.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / f"data-{batch}.parquet")
    config = LakeConfig(lake=f"file://{lake}", feeds=(FeedConfig("grax", "grax_v2", f"file://{landing}"),))
    instance = dg.DagsterInstance.ephemeral()
    assert run_feeds(config, instance=instance, say=lambda _: None)
    table = f"{org}/account"
    log = duckdb.sql(
        f"SELECT Id, Name FROM read_parquet('{lake}/changes/grax/{table}/**/*.parquet') ORDER BY Id"
    ).fetchall()
    assert ("1", "Alice") not in log  # the purge rewrote batch 1's change file
    resources = resources_for(config)
    store = resources["catalog"].get_store()
    _assert_the_catalog_lists_exactly_the_lake(store, lake, table, "grax", at(0), at(23, 59, 59))


def _run_hours(spark, feed: FeedConfig, lake, hours: list[str], run_id: str):
    """One run's work for these hours, without Dagster: catalogue, ingest, store, fold."""
    from lake_assets import pipeline
    from lake_assets.catalog.parquet_store import ParquetCatalogStore
    from lake_assets.feeds import format_for
    from lake_assets.paths import LakeLayout
    from lake_assets.storage import Storage

    storage, layout, fmt = Storage(), LakeLayout(f"file://{lake}"), format_for(feed)
    work = pipeline.TableWork(
        feed, fmt, "accounts", storage, layout, ParquetCatalogStore(layout.catalog(), storage), run_id
    )
    pipeline.catalogue_landing(work, hours)
    batch = pipeline.ingest(spark, work, hours).batch.events
    pipeline.store_partitions(
        storage,
        work.store,
        layout.table("changes", feed.name, "accounts"),
        batch,
        fmt.partition_column,
        hours,
        feed=feed.name,
        table="accounts",
        run_id=run_id,
        keys=fmt.table_spec("accounts").keys,
    )
    assert batch is not None, "the hours land events"
    report = pipeline.fold_into_state(spark, work, batch)
    batch.unpersist()
    return work.store, report


def test_compaction_and_late_rewrites_of_closed_history_retire_the_records_of_the_files_they_merged(
    tmp_path, spark, monkeypatch
):
    from lake_assets.engine import fold

    monkeypatch.setattr(
        fold, "COMPACT_AFTER_FILES", 2
    )  # a settled day of 3 hour files is merged: 4 folds, not 10
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    feed = FeedConfig("unit", "unit_cdc", f"file://{landing}")
    # Hourly folds on 2 March: each closes the versions of the hour before, in a file of that hour.
    for hour in range(4):
        rows = [
            event(k, "U", hour * 10 + i, at(hour, 5, day=2), name=f"{k}{hour}", balance=hour)
            for i, k in enumerate("ab")
        ]
        write_events(landing, "accounts", hour, "part-0.parquet", rows, ACCOUNT_SCHEMA, day=2)
        store, report = _run_hours(spark, feed, lake, [f"2024-03-02-{hour:02d}"], f"run-{hour}")
        assert report.days_compacted == []
    first, last = at(0, day=2), at(23, 59, 59, day=3)
    _assert_the_catalog_lists_exactly_the_lake(store, lake, "accounts", "unit", first, last)

    # The first fold of 3 March merges the settled day's hour files into one.
    write_events(
        landing,
        "accounts",
        1,
        "part-0.parquet",
        [event("a", "U", 500, at(1, day=3), name="a+", balance=9)],
        ACCOUNT_SCHEMA,
        day=3,
    )
    store, report = _run_hours(spark, feed, lake, ["2024-03-03-01"], "run-merge")
    assert report.days_compacted == ["history:2024-03-02"]
    _assert_the_catalog_lists_exactly_the_lake(store, lake, "accounts", "unit", first, last)

    # Late data (before a's open version, of 3 March 01:00) rewrites the closed file it reaches.
    write_events(
        landing,
        "accounts",
        2,
        "part-0.parquet",
        [event("a", "U", 600, at(22, day=2), name="late", balance=7)],
        ACCOUNT_SCHEMA,
        day=3,
    )
    store, report = _run_hours(spark, feed, lake, ["2024-03-03-02"], "run-late")
    assert report.closed_files_rewritten >= 1
    _assert_the_catalog_lists_exactly_the_lake(store, lake, "accounts", "unit", first, last)


def test_the_files_of_an_interrupted_fold_are_catalogued_by_the_run_that_finishes_it(
    tmp_path, spark, monkeypatch
):
    from lake_assets.engine import fold, state

    landing, lake = tmp_path / "landing", tmp_path / "lake"
    feed = FeedConfig("unit", "unit_cdc", f"file://{landing}")
    write_events(
        landing,
        "accounts",
        0,
        "part-0.parquet",
        [event(k, "I", i, at(0, 5), name=k, balance=0) for i, k in enumerate("ab")],
        ACCOUNT_SCHEMA,
    )
    _run_hours(spark, feed, lake, ["2024-03-01-00"], "run-0")

    # The next fold dies once its commit record is written, at its first move (its other moves,
    # made on other threads, may have run: a commit is finished from any part of it).
    class Killed(Exception):
        pass

    def dies_after_the_record(storage, table_state, plan, on_step=None, removing=None):
        def step(name):
            if name == "add 0":
                raise Killed()

        state.commit(storage, table_state, plan, on_step=step, removing=removing)

    write_events(
        landing,
        "accounts",
        1,
        "part-0.parquet",
        [event(k, "U", 10 + i, at(1, 5), name=f"{k}1", balance=1) for i, k in enumerate("ab")],
        ACCOUNT_SCHEMA,
    )
    with monkeypatch.context() as patch:
        patch.setattr(fold, "commit", dies_after_the_record)
        with pytest.raises(Killed):
            _run_hours(spark, feed, lake, ["2024-03-01-01"], "run-1")

    # The next run finishes it (closing a and b's first versions) before folding its own hour.
    write_events(
        landing,
        "accounts",
        2,
        "part-0.parquet",
        [event("c", "I", 20, at(2, 5), name="c", balance=2)],
        ACCOUNT_SCHEMA,
    )
    store, report = _run_hours(spark, feed, lake, ["2024-03-01-02"], "run-2")
    assert report.recovered_folds and list(
        (lake / "history" / "unit" / "accounts" / "closed").rglob("*.parquet")
    )
    _assert_the_catalog_lists_exactly_the_lake(store, lake, "accounts", "unit", at(0), at(23, 59, 59))


@pytest.mark.parametrize("job_of", ["feed job", "global asset job"])
def test_a_run_of_a_whole_job_catalogues_the_landing_once(tmp_path, spark, job_of):
    """A job run without an asset selection (the CLI's, a benchmark's) runs the catalog step:
    `changes` must not catalogue the landing a second time."""
    landing = tmp_path / "landing"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1, 5))], ACCOUNT_SCHEMA)
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),)
    )
    defs = discovered_definitions(config)
    job = (
        defs.resolve_job_def(feed_job_name("unit"))
        if job_of == "feed job"
        else defs.resolve_implicit_global_asset_job_def()
    )
    instance = dg.DagsterInstance.ephemeral()
    result = job.execute_in_process(instance=instance, partition_key=HOUR_1)
    assert result.success
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert sum("catalogued" in m and "landed file(s)" in m for m in messages) == 1
    assert not [m for m in messages if "catalogued the landing first" in m]
    assert _changed_ids(tmp_path / "lake", HOUR_1) == ["a"]
