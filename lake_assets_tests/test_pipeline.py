"""The asset graph through Dagster: ranged single-run backfills, re-runs, DuckDB reading the lake,
the sample data against the brute-force reference, and the same graph on S3 (moto + s3a)."""

import datetime as dt
import decimal
import json

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lake_assets.config import FeedConfig, LakeConfig, S3Config
from lake_assets.demo.unit_sample import write_unit_landing
from lake_assets.engine import merge
from lake_assets.orchestration.definitions import feed_job_name
from lake_assets.orchestration.io_managers import InMemoryHandover
from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
from lake_assets.runner import run_feeds
from lake_assets_tests.discovered import discovered_definitions
from lake_assets_tests.reference import reference_tables, unit_events_to_normalised

pytestmark = pytest.mark.minutes(4)

TABLES = ("accounts", "customers", "transactions")
END_OF_TIME = dt.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    landing = tmp_path_factory.mktemp("landing") / "unit"
    return write_unit_landing(landing, hours=48)


@pytest.fixture(scope="module")
def local_lake(sample, tmp_path_factory, spark):
    """The sample processed once by `run_feeds` (one ranged run), shared by the read-only tests."""
    lake = tmp_path_factory.mktemp("lake")
    config = LakeConfig(
        lake=f"file://{lake}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{sample.landing_dir}"),)
    )
    instance = dg.DagsterInstance.ephemeral()
    run_ids = run_feeds(config, instance=instance, say=lambda _: None)
    return config, lake, instance, run_ids


def duck(sql: str):
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    return con.execute(sql)


def lake_rows(root: str, layer: str, table: str, order: str):
    glob = f"{root}/{layer}/unit/{table}/**/*.parquet"
    cur = duck(
        f"SELECT * FROM read_parquet('{glob}', hive_partitioning = true, union_by_name = true) ORDER BY {order}"
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _payload(sample, table):
    specials = {"id", "cdc_operation_type", "cdc_change_seq", "cdc_commit_timestamp"}
    return sorted({k for row in sample.events[table] for k in row if k not in specials})


@pytest.mark.parametrize("table", TABLES)
def test_duckdb_reads_current_and_history_exactly_as_the_reference(sample, local_lake, table):
    _, lake, _, _ = local_lake
    payload = _payload(sample, table)
    expected_current, expected_history = reference_tables(
        unit_events_to_normalised(sample.events[table]), payload=payload
    )

    current = lake_rows(str(lake), "current", table, "id")
    assert len(current) == len(expected_current)
    assert len({r["id"] for r in current}) == len(current)
    for row in current:
        want = expected_current[row["id"]]
        assert {c: row.get(c) for c in payload} == {c: want[c] for c in payload}, row["id"]
        assert row["_version_at"] == want["_version_at"]

    history = lake_rows(str(lake), "history", table, "id, _fivetran_start")
    got = [
        (
            r["id"],
            r["_fivetran_start"],
            r["_fivetran_end"],
            r["_fivetran_active"],
            *[r.get(c) for c in payload],
        )
        for r in history
    ]
    want = [
        (r["id"], r["_fivetran_start"], r["_fivetran_end"], r["_fivetran_active"], *[r[c] for c in payload])
        for r in expected_history
    ]
    assert got == want


def test_changes_hold_every_event_once_in_each_hour_that_delivered_it(sample, local_lake):
    _, lake, _, _ = local_lake
    for table in TABLES:
        rows = lake_rows(str(lake), "changes", table, "id")
        delivered = duckdb.execute(
            "SELECT DISTINCT concat_ws('-', year, month, day, hour), id, cdc_change_seq FROM read_parquet("
            f"'{sample.landing_dir}/{table}/**/*.parquet', hive_partitioning = true, union_by_name = true)"
        ).fetchall()
        assert sorted((r["hour"], r["id"], r["_seq"]) for r in rows) == sorted(delivered)
        # the sample re-delivers some events an hour later: they count once in current and history
        assert len(delivered) > len({(r["id"], r["cdc_change_seq"]) for r in sample.events[table]})
        assert all(r["_op"] in ("insert", "update", "delete") for r in rows)
        # The marks the collapse hands the fold with the batch are not stored.
        assert not set(merge.COLLAPSE_MARKS) & set(rows[0])


def test_a_ranged_backfill_is_one_run_with_metadata(local_lake, sample):
    _, lake, instance, run_ids = local_lake
    assert len(run_ids) == 1
    records = instance.get_run_records()
    assert len(records) == 1
    run = records[0].dagster_run
    assert run.tags[RANGE_START_TAG] == min(h for t in TABLES for h in sample.hours[t])
    event = instance.get_latest_materialization_event(dg.AssetKey(["unit", "accounts", "changes"]))
    metadata = event.asset_materialization.metadata
    assert metadata["reconciled"].value is True
    # the run's figures land on each of its hours: the total is not shown as an hour's row count
    assert (
        metadata["rows_written"].value == metadata["events_out"].value and "dagster/row_count" not in metadata
    )
    assert "path" in metadata and "dagster/column_schema" in metadata
    schema = {column.name for column in metadata["dagster/column_schema"].value.columns}
    assert "_op" in schema and not set(merge.COLLAPSE_MARKS) & schema
    for layer in ("current", "history"):  # counted from the footers: the rows a reader gets
        state = instance.get_latest_materialization_event(
            dg.AssetKey(["unit", "accounts", layer])
        ).asset_materialization
        assert (
            state.metadata["dagster/row_count"].value
            == len(lake_rows(str(lake), layer, "accounts", "id"))
            > 0
        )
        assert "dagster/column_schema" in state.metadata
    # The columns are told on the run's last partition alone: Dagster would store them once per
    # partition of the range.
    for layer in ("changes", "current", "history"):
        key = dg.AssetKey(["unit", "accounts", layer])
        events = instance.fetch_materializations(key, limit=1000).records
        with_schema = [
            e.partition_key for e in events if "dagster/column_schema" in e.asset_materialization.metadata
        ]
        assert len(events) > 1 and with_schema == [max(e.partition_key for e in events)], layer
    # Each table's state step folded the batch its changes step had stored, from memory.
    handed_over = [
        e.message
        for e in instance.all_logs(run_ids[0])
        if "the batch this run stored, from memory" in e.message
    ]
    assert sorted(m.split(":")[0] for m in handed_over) == sorted(f"unit/{t}/changes" for t in TABLES)
    # The IO manager tells the change-log write the table's key: stored without a dictionary.
    change_files = sorted((lake / "changes" / "unit" / "accounts").rglob("*.parquet"))
    assert change_files and not any(
        "DICTIONARY" in encoding
        for path in change_files
        for group in [pq.ParquetFile(path).metadata.row_group(0)]
        for i in range(group.num_columns)
        if group.column(i).path_in_schema == "id"
        for encoding in group.column(i).encodings
    )


def test_a_stored_batch_is_handed_over_once_to_its_own_run_and_released_otherwise(spark):
    handover = InMemoryHandover()
    key, other = dg.AssetKey(["unit", "accounts", "changes"]), dg.AssetKey(["unit", "cards", "changes"])

    def cached():
        frame = spark.range(3).persist()
        frame.count()
        return frame

    batch = cached()
    handover.keep("run-1", key, ["h1", "h2"], batch)
    assert handover.take("run-1", other, ["h1", "h2"]) is None
    assert handover.take("run-1", key, ["h1", "h2"]) is batch and batch.is_cached
    assert handover.take("run-1", key, ["h1", "h2"]) is None  # once

    for run_id, partitions in (("run-2", ["h1", "h2"]), ("run-1", ["h1"]), ("run-1", None)):
        batch = cached()
        handover.keep("run-1", key, ["h1", "h2"], batch)
        assert handover.take(run_id, key, partitions) is None and not batch.is_cached

    older, newer = cached(), cached()
    handover.keep("run-1", key, ["h1"], older)
    handover.keep("run-1", key, ["h1"], newer)
    assert not older.is_cached and handover.take("run-1", key, ["h1"]) is newer
    newer.unpersist()


def test_a_batch_kept_by_a_driver_that_has_ended_is_neither_handed_over_nor_released(spark, monkeypatch):
    """After a step ended the driver JVM, a batch it kept cannot be read or freed: the next step
    reads the stored files instead, and releasing it asks nothing of the dead JVM (a call that
    failed and hid the error that ended it)."""
    from lake_assets import spark as spark_settings
    from lake_assets.orchestration import io_managers

    handover, key = InMemoryHandover(), dg.AssetKey(["unit", "accounts", "changes"])
    kept, other = spark.range(3).persist(), spark.range(4).persist()
    handover.keep("run-1", key, ["h1"], kept)
    handover.keep("run-1", dg.AssetKey(["unit", "cards", "changes"]), ["h1"], other)
    unpersisted: list = []
    monkeypatch.setattr(io_managers, "driver_ended", lambda session: True)
    monkeypatch.setattr(spark_settings, "driver_ended", lambda session: True)
    monkeypatch.setattr(type(kept), "unpersist", lambda frame, *_: unpersisted.append(frame))

    assert handover.take("run-1", key, ["h1"]) is None
    handover.release_all()
    assert unpersisted == []
    monkeypatch.undo()
    kept.unpersist()
    other.unpersist()


def test_rerunning_a_partition_replaces_exactly_it(sample, tmp_path, spark):
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}",
        feeds=(FeedConfig("unit", "unit_cdc", f"file://{sample.landing_dir}", tables=("accounts",)),),
    )
    defs = discovered_definitions(config)
    job = defs.resolve_job_def(feed_job_name("unit"))
    hours = sample.hours["accounts"]
    instance = dg.DagsterInstance.ephemeral()
    tags = {RANGE_START_TAG: hours[0], RANGE_END_TAG: hours[5]}
    assert job.execute_in_process(instance=instance, tags=tags).success
    first = lake_rows(str(tmp_path / "lake"), "changes", "accounts", "_seq")
    history_first = lake_rows(str(tmp_path / "lake"), "history", "accounts", "id, _fivetran_start")
    # one partition again, then the whole range again
    assert job.execute_in_process(instance=instance, partition_key=hours[2]).success
    assert job.execute_in_process(instance=instance, tags=tags).success
    again = lake_rows(str(tmp_path / "lake"), "changes", "accounts", "_seq")

    def strip(rows):
        return [{k: v for k, v in r.items() if k not in ("_ingested_at", "_fivetran_synced")} for r in rows]

    assert strip(again) == strip(first)
    assert strip(lake_rows(str(tmp_path / "lake"), "history", "accounts", "id, _fivetran_start")) == strip(
        history_first
    )


def test_empty_partitions_and_empty_upstream_are_handled(sample, tmp_path, spark):
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}",
        feeds=(FeedConfig("unit", "unit_cdc", f"file://{sample.landing_dir}", tables=("accounts",)),),
    )
    job = discovered_definitions(config).resolve_job_def(feed_job_name("unit"))
    # An hour before anything landed: no files, no rows, still a successful materialisation.
    first = dt.datetime.strptime(sample.hours["accounts"][0], "%Y-%m-%d-%H")
    empty_hour = (first + dt.timedelta(hours=0)).strftime("%Y-%m-%d-%H")
    missing = [
        h
        for h in (first + dt.timedelta(hours=i) for i in range(48))
        if h.strftime("%Y-%m-%d-%H") not in sample.hours["accounts"]
    ]
    if missing:
        empty_hour = missing[0].strftime("%Y-%m-%d-%H")
        result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), partition_key=empty_hour)
        assert result.success
    assert not (tmp_path / "lake" / "changes" / "unit" / "accounts" / f"hour={empty_hour}").exists()


def test_the_same_graph_runs_on_s3_through_s3a(tmp_path, moto_server, s3_bucket, spark):
    """Twelve hours of the sample (late files, deletes and all) through s3a land the same
    tables as through the local file system. A few hours show it as well as many: through moto
    every file operation of the commit protocol is a round of HTTP requests."""
    sample = write_unit_landing(tmp_path / "landing" / "unit", hours=12, tables=("accounts", "customers"))
    client = moto_server.client("s3")
    moto_server.upload(s3_bucket, sample.landing_dir, "landing/unit")
    for where, landing, lake in (
        ("local", f"file://{sample.landing_dir}", f"file://{tmp_path / 'lake'}"),
        ("s3", f"s3a://{s3_bucket}/landing/unit", f"s3a://{s3_bucket}/lake"),
    ):
        config = LakeConfig(
            lake=lake,
            feeds=(FeedConfig("unit", "unit_cdc", landing, tables=("accounts", "customers")),),
            s3=S3Config(endpoint_url=moto_server.url) if where == "s3" else S3Config(),
        )
        run_ids = run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
        assert len(run_ids) == 1  # the whole range of hours in one run

    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket, Prefix="lake/")
        for o in page.get("Contents", [])
    ]
    assert any(k.startswith("lake/changes/unit/accounts/hour=") for k in keys)
    assert not any(("_staging" in k or "_temporary" in k) and k.endswith(".parquet") for k in keys)

    download = tmp_path / "s3copy"
    for key in keys:
        if key.endswith("/"):
            continue  # folder markers
        target = download / key
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(s3_bucket, key, str(target))

    def strip(rows):
        return [
            {k: v for k, v in r.items() if k not in ("_ingested_at", "_fivetran_synced", "_source_file")}
            for r in rows
        ]

    for table in ("accounts", "customers"):
        for layer, order in (("current", "id"), ("history", "id, _fivetran_start")):
            from_s3 = strip(lake_rows(str(download / "lake"), layer, table, order))
            assert from_s3 and from_s3 == strip(lake_rows(str(tmp_path / "lake"), layer, table, order))


def test_bad_files_are_named_quarantined_and_the_run_goes_on(tmp_path, spark):
    import json

    from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, hour_dir, write_events

    landing = tmp_path / "landing"
    write_events(
        landing,
        "accounts",
        2,
        "part-good.parquet",
        [event("a", "I", 1, at(2), name="ok", balance=1)] * 2,
        ACCOUNT_SCHEMA,
    )
    (hour_dir(landing, "accounts", 2) / "part-corrupt.parquet").write_bytes(b"not parquet")
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),)
    )
    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config, instance=instance, say=lambda _: None)

    [note] = (tmp_path / "lake/_quarantine/unit/accounts/2024-03-01-02").glob(
        "*/part-corrupt.parquet.reason.json"
    )
    assert json.loads(note.read_text())["reason"].startswith("not a readable Parquet file")
    assert (note.parent / "part-corrupt.parquet").read_bytes() == b"not parquet"
    run_id = instance.get_run_records()[0].dagster_run.run_id
    errors = [e.message for e in instance.all_logs(run_id) if e.level == 40 and e.message]  # logging.ERROR
    assert any("part-corrupt.parquet" in m and "not a readable Parquet file" in m for m in errors)
    metadata = instance.get_latest_materialization_event(
        dg.AssetKey(["unit", "accounts", "changes"])
    ).asset_materialization.metadata
    assert metadata["files_quarantined"].value == 1 and metadata["files_read"].value == 1
    assert (
        metadata["rows_in"].value == 2
        and metadata["events_out"].value == 1
        and metadata["duplicates_collapsed"].value == 1
    )
    assert metadata["dagster/row_count"].value == 1  # a run of one hour: that hour's rows
    assert lake_rows(str(tmp_path / "lake"), "current", "accounts", "id")[0]["name"] == "ok"


def test_asset_checks_pass_and_a_corrupted_history_fails_them(sample, tmp_path, spark):
    import shutil

    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}",
        feeds=(FeedConfig("unit", "unit_cdc", f"file://{sample.landing_dir}", tables=("accounts",)),),
    )
    job = discovered_definitions(config).resolve_job_def(feed_job_name("unit"))
    hours = sample.hours["accounts"]
    instance = dg.DagsterInstance.ephemeral()
    result = job.execute_in_process(
        instance=instance, tags={RANGE_START_TAG: hours[0], RANGE_END_TAG: hours[-2]}
    )
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == {
        "landing_complete",
        "current_unique_key",
        "history_windows",
        "events_reconcile",
    }
    assert all(e.passed for e in evaluations.values()), evaluations
    assert evaluations["events_reconcile"].metadata["versions_stored"].value > 0
    # into an empty table: every stored row read back is compared with the batch's versions
    assert evaluations["events_reconcile"].metadata["stored_rows_match_batch_versions"].value is True

    # A stray copy of an open-set file (as a botched manual repair would leave) doubles rows
    # where the next fold's checks look: the open set and the closed files it could change.
    active = tmp_path / "lake/history/unit/accounts/active"
    shutil.copy(next(active.glob("*.parquet")), active / "part-stray-copy.parquet")
    result = job.execute_in_process(instance=instance, partition_key=hours[-1], raise_on_error=False)
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["history_windows"].passed is False
    assert evaluations["history_windows"].metadata["overlapping"].value > 0
    # into rows already there: each of the batch's versions is looked up among the stored rows
    assert "stored_rows_match_batch_versions" not in evaluations["events_reconcile"].metadata
    assert not result.success  # the check is blocking


def test_every_file_no_hour_reads_is_quarantined_as_a_stray_and_fails_landing_complete(tmp_path, spark):
    """Files in folders that are not valid times, at the wrong depth, in a folder within an
    hour, or links that loop or lead nowhere: the run reads the good hour, sets each stray aside
    with its reason, and the `landing_complete` check fails until the landing is put right."""
    import json

    from lake_assets_tests.unit_files import landing_with_strays

    landing = tmp_path / "landing"
    _, expected = landing_with_strays(landing)
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),)
    )
    instance = dg.DagsterInstance.ephemeral()
    (run_id,) = run_feeds(config, instance=instance, say=lambda _: None)

    notes = {
        p.name[: -len(".reason.json")]: json.loads(p.read_text())
        for p in (tmp_path / "lake/_quarantine/unit/accounts").rglob("*.reason.json")
    }
    assert set(notes) == set(expected)
    for name, words in expected.items():
        note = notes[name]
        assert note["file"].startswith(f"file://{landing}/accounts/") and note["file"].endswith(f"/{name}")
        assert all(w in note["reason"] for w in words), note
    copies = {p.name for p in (tmp_path / "lake/_quarantine/unit/accounts").rglob("*.parquet")}
    assert {n for n in expected if n.endswith(".parquet")} - {"self.parquet", "gone.parquet"} <= copies
    errors = [e.message for e in instance.all_logs(run_id) if e.level == 40 and e.message]
    assert all(any(notes[n]["file"] in m for m in errors) for n in expected)

    changes = dg.AssetKey(["unit", "accounts", "changes"])
    metadata = instance.get_latest_materialization_event(changes).asset_materialization.metadata
    assert metadata["files_read"].value == 1 and metadata["files_quarantined"].value == len(expected)
    assert metadata["files_stray"].value == len(expected) and metadata["reconciled"].value is True
    assert metadata["rows_in"].value == metadata["events_out"].value == 1
    check = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(changes, "landing_complete")]
    )[dg.AssetCheckKey(changes, "landing_complete")]
    evaluation = check.event.dagster_event.event_specific_data
    assert evaluation.passed is False and f"{len(expected)} stray file(s)" in evaluation.description
    assert [r["id"] for r in lake_rows(str(tmp_path / "lake"), "current", "accounts", "id")] == ["a"]


def test_runs_follow_the_hours_that_hold_files_not_the_years_between_them(tmp_path, spark):
    """One hour from 1990 among hours of 2024: `run_feeds` runs each stretch of landed hours on
    its own; the 1990 hour is processed (it is real data) and the 34 years between hold no
    materialised partition. (The old hour is another table's, so no file spans the years.)"""
    import pyarrow as pa

    from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events

    landing = tmp_path / "landing"
    old = dt.datetime(1990, 6, 1, 3, 15, tzinfo=dt.UTC)
    old_hour = landing / f"legacy/year={old:%Y}/month={old:%m}/day={old:%d}/hour={old:%H}"
    old_hour.mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([event("old", "I", 1, old, name="1990", balance=0)], schema=ACCOUNT_SCHEMA),
        old_hour / "part-0.parquet",
    )
    write_events(
        landing,
        "accounts",
        1,
        "part-0.parquet",
        [event("a", "I", 2, at(1), name="x", balance=1)],
        ACCOUNT_SCHEMA,
    )
    write_events(
        landing,
        "accounts",
        3,
        "part-0.parquet",
        [event("b", "I", 3, at(3), name="y", balance=2)],
        ACCOUNT_SCHEMA,
    )
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),)
    )
    instance = dg.DagsterInstance.ephemeral()

    run_ids = run_feeds(config, instance=instance, say=lambda _: None)

    tags = [instance.get_run_by_id(r).tags for r in run_ids]
    old_key = f"{old:%Y-%m-%d-%H}"
    # A short stretch without files (hour 02) stays inside its run; 34 years do not.
    assert sorted((t[RANGE_START_TAG], t[RANGE_END_TAG]) for t in tags) == [
        (old_key, old_key),
        ("2024-03-01-01", "2024-03-01-03"),
    ]
    materialised = {
        t: instance.get_materialized_partitions(dg.AssetKey(["unit", t, "changes"]))
        for t in ("accounts", "legacy")
    }
    assert (
        materialised["legacy"]
        == materialised["accounts"]
        == {old_key, "2024-03-01-01", "2024-03-01-02", "2024-03-01-03"}
    )
    lake = str(tmp_path / "lake")
    assert [(r["id"], r["name"]) for r in lake_rows(lake, "current", "accounts", "id")] == [
        ("a", "x"),
        ("b", "y"),
    ]
    assert [(r["id"], r["name"], r["hour"]) for r in lake_rows(lake, "changes", "legacy", "id")] == [
        ("old", "1990", old_key)
    ]


def test_an_archived_s3_object_is_reported_and_the_rest_of_its_hour_is_read(
    tmp_path, moto_server, s3_bucket, spark
):
    """An object moved to Glacier by a lifecycle rule is listed like any other, but S3 refuses to
    hand over its bytes until it is restored (403 InvalidObjectState). It is reported with that
    cause, every other file of its hour and table is read, and once it is restored the next run
    reads it and withdraws the report."""
    sample = write_unit_landing(tmp_path / "landing" / "unit", hours=3, tables=("accounts", "customers"))
    client = moto_server.client("s3")
    moto_server.upload(s3_bucket, sample.landing_dir, "landing/unit")
    hour_files = sorted((sample.landing_dir / "accounts").rglob("*.parquet"))
    archived_key = f"landing/unit/{hour_files[0].relative_to(sample.landing_dir).as_posix()}"
    client.copy_object(
        Bucket=s3_bucket,
        Key=archived_key,
        CopySource={"Bucket": s3_bucket, "Key": archived_key},
        StorageClass="GLACIER",
    )
    stray_key = "landing/unit/accounts/year=2024/month=03/day=01/hour=99/part-archived-stray.parquet"
    client.put_object(
        Bucket=s3_bucket, Key=stray_key, Body=hour_files[0].read_bytes(), StorageClass="GLACIER"
    )
    lake = tmp_path / "lake"
    config = LakeConfig(
        lake=f"file://{lake}",
        feeds=(
            FeedConfig(
                "unit", "unit_cdc", f"s3a://{s3_bucket}/landing/unit", tables=("accounts", "customers")
            ),
        ),
        s3=S3Config(endpoint_url=moto_server.url),
    )
    archived_uri = f"s3a://{s3_bucket}/{archived_key}"

    run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)

    notes = {
        json.loads(p.read_text())["file"]: json.loads(p.read_text())["reason"]
        for p in (lake / "_quarantine").rglob("*.reason.json")
    }
    assert sorted(notes) == [archived_uri, f"s3a://{s3_bucket}/{stray_key}"]
    assert "(InvalidObjectState)" in notes[archived_uri]
    read = {r["_source_file"] for r in lake_rows(str(lake), "changes", "accounts", "id")}
    landed = {
        f"s3a://{s3_bucket}/landing/unit/{p.relative_to(sample.landing_dir).as_posix()}" for p in hour_files
    }
    assert read == landed - {archived_uri}
    assert lake_rows(str(lake), "current", "customers", "id")

    client.restore_object(Bucket=s3_bucket, Key=archived_key, RestoreRequest={"Days": 1})
    run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)

    notes = [json.loads(p.read_text())["file"] for p in (lake / "_quarantine").rglob("*.reason.json")]
    assert notes == [f"s3a://{s3_bucket}/{stray_key}"]
    assert {r["_source_file"] for r in lake_rows(str(lake), "changes", "accounts", "id")} == landed


class _AccountsSteps:
    """The Unit feed's job over one `accounts` table landed at `landing`, its layers run apart."""

    def __init__(self, landing, lake):
        config = LakeConfig(
            lake=f"file://{lake}",
            feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}", tables=("accounts",)),),
        )
        self.job = discovered_definitions(config).resolve_job_def(feed_job_name("unit"))
        self.instance = dg.DagsterInstance.ephemeral()

    @staticmethod
    def layers(*names: str) -> list[dg.AssetKey]:
        return [dg.AssetKey(["unit", "accounts", name]) for name in names]

    def changes_alone(self, *hours: str) -> None:
        """The change log of each hour stored by a run of its own, with no fold after it."""
        for hour in hours:
            selection = self.layers("catalog", "changes")
            assert self.job.execute_in_process(
                instance=self.instance, partition_key=hour, asset_selection=selection
            ).success

    def state_alone(self, first: str, last: str) -> dg.ExecuteInProcessResult:
        """A run of the state step alone over `first`..`last`: it reads the change log back."""
        return self.job.execute_in_process(
            instance=self.instance,
            tags={RANGE_START_TAG: first, RANGE_END_TAG: last},
            asset_selection=self.layers("current", "history"),
            raise_on_error=False,
        )


def test_a_state_step_reading_the_change_log_back_keeps_every_digit_bound_for_text(tmp_path, spark):
    """Current holds `balance` as text. Two hours' change logs hold it as a double and as a
    64-bit integer beyond 2^53, and their state step runs on its own, so it reads them back from
    storage (no batch handed over in memory). Widened among themselves they became a double and
    the integer lost its last digit on its way to text; each becomes text from its own type, as
    in a run that folds the batch it read (`test_ingest.py`)."""
    from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events

    landing, lake = tmp_path / "landing", tmp_path / "lake"
    as_text = ACCOUNT_SCHEMA.set(2, pa.field("balance", pa.string()))
    write_events(
        landing, "accounts", 1, "p.parquet", [event("a", "I", 1, at(1), name="a", balance="x")], as_text
    )
    as_double = ACCOUNT_SCHEMA.set(2, pa.field("balance", pa.float64()))
    write_events(
        landing, "accounts", 2, "p.parquet", [event("b", "I", 2, at(2), name="b", balance=2.5)], as_double
    )
    big = 9007199254740993
    write_events(
        landing,
        "accounts",
        3,
        "p.parquet",
        [event("c", "I", 3, at(3), name="c", balance=big)],
        ACCOUNT_SCHEMA,
    )
    steps = _AccountsSteps(landing, lake)
    assert steps.job.execute_in_process(instance=steps.instance, partition_key="2024-03-01-01").success
    steps.changes_alone("2024-03-01-02", "2024-03-01-03")
    result = steps.state_alone("2024-03-01-02", "2024-03-01-03")
    assert result.success
    assert not any("from memory" in e.message for e in steps.instance.all_logs(result.run_id))

    current = {r["id"]: r["balance"] for r in lake_rows(str(lake), "current", "accounts", "id")}
    assert current == {"a": "x", "b": "2.5", "c": str(big)}


def test_a_state_step_whose_stored_partitions_hold_clashing_keys_fails_saying_how_to_mend_them(
    tmp_path, spark
):
    """Two hours' change logs were stored apart, before any fold, one with a 64-bit integer key
    and one with a double key: read back as one, the keys would round alike and become one
    record. The state step run on its own fails naming the clash and the way out; a run of
    both hours together reads their files as one batch, sets aside the file that clashes, and
    folds the rest."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    for hour, kind, key in ((1, pa.int64(), 9007199254740993), (2, pa.float64(), 9007199254740992.0)):
        _write_keyed(landing, hour, kind, key, "I", "n")
    steps = _AccountsSteps(landing, lake)
    steps.changes_alone("2024-03-01-01", "2024-03-01-02")
    state_alone = steps.state_alone("2024-03-01-01", "2024-03-01-02")
    assert not state_alone.success
    (failure,) = [e for e in state_alone.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    error = failure.step_failure_data.error
    told = "".join(str(part) for part in (error, error.cause) if part is not None)
    assert "cannot be read as one" in told and "in one run" in told, told

    both = {RANGE_START_TAG: "2024-03-01-01", RANGE_END_TAG: "2024-03-01-02"}
    assert steps.job.execute_in_process(instance=steps.instance, tags=both).success
    assert len(lake_rows(str(lake), "current", "accounts", "id")) == 1
    assert len(list((lake / "_quarantine").rglob("*.reason.json"))) == 1


def _text_keys_then(landing, *later: tuple[int, pa.DataType, object, str]) -> None:
    """Hour 01 lands the text keys `x` and `5`; each of `later` (hour, key type, key, name) a
    write of one key given as another type."""
    from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events

    first = [
        event("x", "I", 1, at(1), name="x", balance=1),
        event("5", "I", 2, at(1, 5), name="five", balance=1),
    ]
    write_events(landing, "accounts", 1, "p.parquet", first, ACCOUNT_SCHEMA)
    for hour, kind, key, name in later:
        _write_keyed(landing, hour, kind, key, "U", name)


def _write_keyed(landing, hour: int, kind: pa.DataType, key, op: str, name: str) -> None:
    """Hour `hour` lands one write (`op`) of `key`, its key column typed `kind`."""
    from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events

    schema = ACCOUNT_SCHEMA.set(0, pa.field("id", kind))
    rows = [event(key, op, hour, at(hour), name=name, balance=hour)]
    write_events(landing, "accounts", hour, "p.parquet", rows, schema)


def test_a_number_key_read_back_is_matched_as_text_where_current_holds_keys_as_text(tmp_path, spark):
    """Current holds `id` as text; hour 02's change log, stored alone, gives key 5 as a 64-bit
    integer. The state step reading it back matches it with the stored `5` as text, as a run
    folding the batch it read does (a number join with the stored text keys failed on `x`)."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    _text_keys_then(landing, (2, pa.int64(), 5, "five-updated"))
    steps = _AccountsSteps(landing, lake)
    steps.changes_alone("2024-03-01-01", "2024-03-01-02")
    assert steps.state_alone("2024-03-01-01", "2024-03-01-01").success
    assert steps.state_alone("2024-03-01-02", "2024-03-01-02").success

    current = {r["id"]: r["name"] for r in lake_rows(str(lake), "current", "accounts", "id")}
    assert current == {"x": "x", "5": "five-updated"}


def test_keys_of_two_number_types_bound_for_text_keep_their_own_spelling(tmp_path, spark):
    """Current holds `id` as text. One later run reads a decimal key `1.50` and a 64-bit integer
    key `5` (an update of the stored `5`): widened among themselves, `5` became `5.00`, a new
    record beside the stored one. Each becomes text from its own type, as in one run over all."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    _text_keys_then(
        landing, (2, pa.decimal128(10, 2), decimal.Decimal("1.50"), "dec"), (3, pa.int64(), 5, "five-updated")
    )
    steps = _AccountsSteps(landing, lake)
    assert steps.job.execute_in_process(instance=steps.instance, partition_key="2024-03-01-01").success
    later = {RANGE_START_TAG: "2024-03-01-02", RANGE_END_TAG: "2024-03-01-03"}
    assert steps.job.execute_in_process(instance=steps.instance, tags=later).success

    current = {r["id"]: r["name"] for r in lake_rows(str(lake), "current", "accounts", "id")}
    assert current == {"x": "x", "1.50": "dec", "5": "five-updated"}
