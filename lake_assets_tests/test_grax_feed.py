"""The GRAX Data Lake v2 feed through Dagster: the seed's Account example, the vendor's own
latest-version SQL as a reference, purges erased from every layer, typed-field switches, bad
input, batch discovery, and the same graph on S3."""

import datetime as dt
import decimal
import json
import os
import shutil
from pathlib import Path

import boto3
import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import PySparkException

from lake_assets import ingest
from lake_assets.config import FeedConfig, LakeConfig, S3Config
from lake_assets.demo.grax_sample import write_grax_landing
from lake_assets.feeds.grax_v2 import GraxV2Format, batch_order, is_batch_key, typed_copies
from lake_assets.landing_watch import BatchCursor, scan_batches
from lake_assets.orchestration.definitions import batch_partitions_name
from lake_assets.runner import run_feeds
from lake_assets.storage import Storage, data_files
from lake_assets_tests.discovered import discovered_definitions
from lake_assets_tests.hostile_landings import links_to_a_tree_beside_a_real_folder
from lake_assets_tests.run_value_probes import assert_read_during_the_runs
from lake_assets_tests.storage_spy import CountingStorage

UTC = dt.UTC
TMAX = dt.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
MS = dt.timedelta(milliseconds=1)
ORG = "00Dseed"


def t(n: int) -> dt.datetime:
    return dt.datetime(2024, 1, 1, n, tzinfo=UTC)


def duck(sql: str):
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def layer_rows(lake: Path, layer: str, table: str, order: str = "Id") -> list[dict]:
    folder = lake / layer / "grax" / table
    if not folder.exists():
        return []
    return duck(f"SELECT * FROM read_parquet('{folder}/**/*.parquet', union_by_name = true) ORDER BY {order}")


def column_types(lake: Path, table: str) -> dict[str, str]:
    glob = f"{lake}/history/grax/{table}/**/*.parquet"
    return {
        r["column_name"]: r["column_type"]
        for r in duck(f"DESCRIBE SELECT * FROM read_parquet('{glob}', union_by_name = true)")
    }


def grax_schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    """GRAX's required columns, then `fields`."""
    return pa.schema(
        [
            ("Id", pa.string()),
            ("source__modified", pa.timestamp("ms", tz="UTC")),
            ("grax__idseq", pa.string()),
            *fields,
        ]
    )


def write_file(
    landing: Path, obj: str, batch: str, name: str, rows: list[dict], schema: pa.Schema | None = None
) -> Path:
    folder = landing / "parquet" / "v2" / f"org={ORG}" / f"object={obj}" / f"batch={batch}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def process(landing: Path, lake: Path, instance=None):
    config = LakeConfig(
        lake=f"file://{lake}", feeds=(FeedConfig(name="grax", format="grax_v2", landing=f"file://{landing}"),)
    )
    instance = instance or dg.DagsterInstance.ephemeral()
    run_feeds(config, instance=instance, say=lambda _: None)
    return instance


def test_batch_keys_are_hex_numbers_and_typed_copies_need_their_field():
    assert is_batch_key("05e0be100") and not is_batch_key("05e0be10g") and not is_batch_key("../x")
    assert sorted(["ff", "100", "0f0"], key=batch_order) == ["0f0", "ff", "100"]
    copies = typed_copies(["Id", "Amount", "Amount_i", "Amount_f", "Is_b", "Name"])
    assert copies == {"Amount": {"i": "Amount_i", "f": "Amount_f"}}  # `Is_b` has no `Is` beside it
    # GRAX types fields, not copies: `Total_i_b` is a field, though `Total_i` is beside it, and
    # `Total_i_b_b` is its copy
    assert typed_copies(["Id", "Total", "Total_i", "Total_i_b", "Total_i_b_b"]) == {
        "Total": {"i": "Total_i"},
        "Total_i_b": {"b": "Total_i_b_b"},
    }


def test_what_lies_beside_parquet_v2_is_named_as_read_by_no_table(tmp_path):
    """A landing naming the bucket folder that holds `parquet/v2`: another version's folder, or
    a file at the top or in `parquet/`, is read by no table, and discovery (so every run) says
    so, each once, the folder without its files."""
    landing = tmp_path / "landing"
    write_file(
        landing,
        "Account",
        "1",
        "data-1.parquet",
        [{"Id": "a", "source__modified": t(1), "grax__idseq": "01"}],
    )
    for stray in (
        "notes.parquet",
        "parquet/notes.parquet",
        f"parquet/v1/org={ORG}/object=Account/batch=1/data-1.parquet",
    ):
        (landing / stray).parent.mkdir(parents=True, exist_ok=True)
        (landing / stray).write_bytes(b"PAR1")
    (landing / "_SUCCESS").write_text("")  # hidden: not data

    survey = GraxV2Format().survey(Storage(), f"file://{landing}")

    assert survey.tables == [f"{ORG}/account"]
    assert survey.unread == [
        f"file://{landing}/notes.parquet: not inside parquet/v2, so no table reads it",
        f"file://{landing}/parquet/notes.parquet: not inside parquet/v2, so no table reads it",
        f"file://{landing}/parquet/v1/: not inside parquet/v2, so no table reads it",
    ]


def test_a_field_named_like_a_copy_of_a_typed_copy_is_kept(spark, tmp_path):
    """Beside `Total` and its copy `Total_i`, a column `Total_i_b` is a field of its own: its
    values are kept in every layer (taken for a copy of `Total_i`, they went nowhere)."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    row = {
        "Id": "a",
        "source__modified": t(1),
        "grax__idseq": "01",
        "Total": "1",
        "Total_i": 1,
        "Total_i_b": True,
    }
    write_file(landing, "Account", "1", "data-1.parquet", [row])
    process(landing, lake)

    for layer in ("changes", "current", "history"):
        [stored] = layer_rows(lake, layer, f"{ORG}/account")
        assert (stored["Total"], stored["Total_i_b"]) == (1, True), layer
    assert not (lake / "_quarantine").exists()


def test_the_seed_account_example(spark, tmp_path):
    """The vendor documentation's 7-row Account file (docs/formats/grax-v2.md). Read as: Alice renamed twice; record 2
    purged (no field data); Bob archived at t3; record 4 restored from 3, then edited."""
    rows = [
        {"Id": "1", "source__modified": t(4), "grax__idseq": "a", "Name": "Alice"},
        {"Id": "2", "source__modified": t(5), "grax__idseq": "q", "grax__purged": t(1)},
        {"Id": "1", "source__modified": t(5), "grax__idseq": "b", "Name": "Alicia"},
        {
            "Id": "3",
            "source__modified": t(1),
            "grax__idseq": "x",
            "grax__deleted": t(3),
            "grax__deletesource": "grax",
            "Name": "Bob",
            "Fax": "800-555-1212",
        },
        {"Id": "1", "source__modified": t(6), "grax__idseq": "c", "Name": "Allison"},
        {"Id": "4", "source__modified": t(8), "grax__idseq": "a", "grax__restoredfrom": "3", "Name": "Bob"},
        {
            "Id": "4",
            "source__modified": t(9),
            "grax__idseq": "g",
            "grax__restoredfrom": "3",
            "Name": "Bill",
            "Fax": "888-111-5555",
        },
    ]
    schema = grax_schema(
        ("grax__deleted", pa.timestamp("ms", tz="UTC")),
        ("grax__deletesource", pa.string()),
        ("grax__purged", pa.timestamp("ms", tz="UTC")),
        ("grax__restoredfrom", pa.string()),
        ("Name", pa.string()),
        ("Fax", pa.string()),
    )
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    write_file(landing, "Account", "05e0be100", "data-16f5e66e800.parquet", rows, schema)
    process(landing, lake)
    table = f"{ORG}/account"

    current = [
        (r["Id"], r["Name"], r["Fax"], r["grax__restoredfrom"]) for r in layer_rows(lake, "current", table)
    ]
    assert current == [
        ("1", "Allison", None, None),
        ("2", None, None, None),
        ("4", "Bill", "888-111-5555", "3"),
    ]

    history = [
        (r["Id"], r["Name"], r["_fivetran_start"], r["_fivetran_end"], r["_fivetran_active"])
        for r in layer_rows(lake, "history", table, "Id, _fivetran_start")
    ]
    assert history == [
        ("1", "Alice", t(4), t(5) - MS, False),
        ("1", "Alicia", t(5), t(6) - MS, False),
        ("1", "Allison", t(6), TMAX, True),
        ("2", None, t(5), TMAX, True),
        ("3", "Bob", t(1), t(3), False),  # archived: closed at the archive time, gone from current
        ("4", "Bob", t(8), t(9) - MS, False),
        ("4", "Bill", t(9), TMAX, True),
    ]
    changes = layer_rows(lake, "changes", table, "Id, _version_at, _seq")
    assert [(r["Id"], r["_op"], r["batch"]) for r in changes if r["Id"] == "3"] == [
        ("3", "update", "05e0be100"),
        ("3", "delete", "05e0be100"),
    ]


@pytest.fixture(scope="module")
def sample_lake(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("grax")
    sample = write_grax_landing(root / "landing")
    instance = process(sample.landing_dir, root / "lake")
    return sample, root / "lake", instance


def _landing_glob(sample, obj: str) -> str:
    return f"{sample.landing_dir}/parquet/v2/org={sample.org}/object={obj}/*/*.parquet"


@pytest.mark.parametrize("obj", ["Account", "Contact", "Opportunity"])
def test_current_matches_the_vendors_latest_version_sql(sample_lake, obj):
    """GRAX's own recipe: the max grax__idseq per Id, then drop deleted records."""
    sample, lake, _ = sample_lake
    vendor = duck(
        f"""SELECT * FROM (
              SELECT *, row_number() OVER (PARTITION BY Id ORDER BY grax__idseq DESC) AS rn
              FROM read_parquet('{_landing_glob(sample, obj)}', union_by_name = true, hive_partitioning = false))
            WHERE rn = 1 AND grax__deleted IS NULL ORDER BY Id"""
    )
    ours = layer_rows(lake, "current", f"{sample.org}/{obj.lower()}")
    assert [r["Id"] for r in ours] == [r["Id"] for r in vendor]
    fields = [
        c
        for c in vendor[0]
        if not c.startswith("grax__")
        and c not in ("Id", "source__modified", "rn")
        and not typed_copies(list(vendor[0])).get(c.rsplit("_", 1)[0])
    ]
    for mine, theirs in zip(ours, vendor, strict=True):
        assert mine["_version_at"] == theirs["source__modified"], mine["Id"]
        for field in fields:
            # the vendor's text: the audit copy where the file had a typed copy, else the field
            text = mine.get(f"{field}__string")
            assert (text if text is not None else mine.get(field)) == theirs[field], (mine["Id"], field)


def test_a_purged_record_has_no_field_data_in_any_layer(sample_lake):
    sample, lake, _ = sample_lake
    purged = {r["Id"] for r in sample.rows["Account"] if r.get("grax__purged")}
    assert len(purged) == 1
    table = f"{sample.org}/account"
    seen = 0
    for layer in ("changes", "current", "history"):
        for row in layer_rows(lake, layer, table):
            if row["Id"] not in purged:
                continue
            seen += 1
            data = {
                k: v
                for k, v in row.items()
                if v is not None and k != "Id" and not k.startswith("_") and k != "batch"
            }
            assert data == {}, (layer, data)
            assert row["_purged"] is True or layer == "current"
    assert seen >= 3  # the key and its versions stay; only the data is gone


def test_typed_fields_follow_the_latest_type_and_keep_every_value(sample_lake):
    sample, lake, _ = sample_lake
    opportunity = layer_rows(lake, "history", f"{sample.org}/opportunity", "Id, _fivetran_start")
    types = column_types(lake, f"{sample.org}/opportunity")
    assert types["Probability"] == "DOUBLE" and types["Probability__string"] == "VARCHAR"
    assert all(
        r["Probability"] == float(r["Probability__string"]) for r in opportunity if r["Probability__string"]
    )
    account = layer_rows(lake, "history", f"{sample.org}/account", "Id, _fivetran_start")
    # IsActive__c went from a boolean copy to plain text: the column follows it to text, and the
    # early boolean values stay readable in it.
    assert column_types(lake, f"{sample.org}/account")["IsActive__c"] == "VARCHAR"
    switched = [r for r in account if r["IsActive__c"] in ("yes", "no")]
    typed = [r for r in account if r["IsActive__c__string"] in ("true", "false")]
    assert switched and typed
    assert all(r["IsActive__c"] == r["IsActive__c__string"] for r in typed)
    assert (
        types.get("Probability_i") is None and types.get("Probability_f") is None
    )  # copies fold into one column


def test_each_batch_is_a_partition_and_the_run_reconciles(sample_lake):
    sample, lake, instance = sample_lake
    key = dg.AssetKey(["grax", sample.org, "account", "changes"])
    event = instance.get_latest_materialization_event(key)
    metadata = event.asset_materialization.metadata
    assert metadata["reconciled"].value is True and metadata["files_quarantined"].value == 0
    assert metadata["rows_in"].value == len(sample.rows["Account"])
    batches = {r["batch"] for r in layer_rows(lake, "changes", f"{sample.org}/account")}
    assert batches == set(sample.batches["Account"])
    partitions = batch_partitions_name("grax", f"{sample.org}/account")
    assert instance.get_dynamic_partitions(partitions) == sample.batches["Account"]


def test_bad_files_and_batch_folders_are_quarantined_and_the_batch_goes_on(spark, tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    good = [
        {"Id": "a", "source__modified": t(1), "grax__idseq": "01", "Name": "A", "Amount": "5", "Amount_i": 5}
    ]
    write_file(landing, "Account", "000000001", "data-00000000001.parquet", good)
    write_file(
        landing,
        "Account",
        "000000001",
        "data-00000000002.parquet",
        [{"source__modified": t(2), "grax__idseq": "02", "Name": "no id column"}],
    )
    bad_typed = write_file(
        landing,
        "Account",
        "000000001",
        "data-00000000003.parquet",
        [{"Id": "b", "source__modified": t(2), "grax__idseq": "03", "Amount": "x", "Amount_i": "x"}],
    )
    corrupt = (
        landing / "parquet/v2" / f"org={ORG}" / "object=Account/batch=000000001/data-00000000004.parquet"
    )
    corrupt.write_bytes(b"PAR1 this is not parquet PAR1")
    write_file(landing, "Account", "zz-not-hex", "data-00000000005.parquet", good)
    # files no batch reads: each is reported with where it lies
    account = landing / "parquet/v2" / f"org={ORG}" / "object=Account"
    misplaced = {
        "object=Account": account / "loose.parquet",
        "'batch=000000001'; only files directly": account / "batch=000000001" / "retry" / "again.parquet",
        "folder 'misc' is not a batch folder": account / "misc" / "notes.parquet",
        "folder 'BATCH=00000000b' is not a batch folder": account / "BATCH=00000000b" / "data.parquet",
    }
    for path in misplaced.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(corrupt.read_bytes())
    dangling = account / "batch=000000001" / "data-00000000009.parquet"
    dangling.symlink_to(account / "gone.parquet")
    instance = process(landing, lake)

    table = f"{ORG}/account"
    assert [r["Id"] for r in layer_rows(lake, "current", table)] == ["a"]
    notes = {p.name: p.read_text() for p in (lake / "_quarantine" / "grax").rglob("*.reason.json")}
    assert "missing the required column(s) ['Id']" in notes["data-00000000002.parquet.reason.json"]
    assert "not a readable Parquet file" in notes["data-00000000004.parquet.reason.json"]
    assert (
        "Amount_i" in notes["data-00000000003.parquet.reason.json"]
        and str(bad_typed) in notes["data-00000000003.parquet.reason.json"]
    )
    assert "'batch=zz-not-hex' is not a hex number" in notes["data-00000000005.parquet.reason.json"]
    for where, path in misplaced.items():
        assert where in notes[f"{path.name}.reason.json"] and str(path) in notes[f"{path.name}.reason.json"]
    assert str(dangling) in notes[f"{dangling.name}.reason.json"]
    metadata = instance.get_latest_materialization_event(
        dg.AssetKey(["grax", ORG, "account", "changes"])
    ).asset_materialization.metadata
    assert metadata["files_listed"].value == 10 and metadata["files_read"].value == 1
    assert metadata["files_quarantined"].value == 9 and metadata["reconciled"].value is True
    assert metadata["rows_in"].value == 1 and metadata["events_out"].value == 1


def test_a_link_to_a_folder_where_no_batch_is_read_is_one_stray_and_a_real_folder_there_has_each_file(
    tmp_path,
):
    """A link to a large tree (a share's root) in a batch folder, in a folder within it, or
    beside the batch folders is reported once and not walked through; a real folder there
    still has each of its files reported."""
    landing = tmp_path / "landing"
    row = [{"Id": "a", "source__modified": t(1), "grax__idseq": "01"}]
    good = write_file(landing, "Account", "00000000a", "data-00000000001.parquet", row)
    tree = tmp_path / "share"
    links, nested = links_to_a_tree_beside_a_real_folder(good, tree, good.parent.parent / "misc")

    found = GraxV2Format().stray_files(Storage(), f"file://{landing}", f"{ORG}/account")

    strays = {Path(e.uri.removeprefix("file://")): r for e, r in found}
    assert set(strays) == {*links, nested}
    assert all(f"symbolic link to the folder {tree.resolve()}" in strays[link] for link in links)
    assert "a folder within batch folder" in strays[nested]


def test_the_batch_scan_lists_only_the_open_batch_and_newer_ones(tmp_path):
    landing = tmp_path / "landing"
    row = [{"Id": "a", "source__modified": t(1), "grax__idseq": "01"}]
    for batch in ("00000000a", "00000000b"):
        write_file(landing, "Account", batch, "data-00000000001.parquet", row)
    fmt, uri = GraxV2Format(), f"file://{landing}"

    storage = CountingStorage()
    found, cursor = scan_batches(storage, fmt, uri, f"{ORG}/account", BatchCursor())
    assert [(f.partition, f.new_names) for f in found] == [
        ("00000000a", ("data-00000000001.parquet",)),
        ("00000000b", ("data-00000000001.parquet",)),
    ]
    found, cursor = scan_batches(storage, fmt, uri, f"{ORG}/account", cursor)
    assert found == []
    write_file(landing, "Account", "00000000b", "data-00000000002.parquet", row)  # the open batch grows
    write_file(landing, "Account", "000000010", "data-00000000003.parquet", row)  # a new batch (0x10 > 0xb)
    storage.listed.clear()
    found, cursor = scan_batches(storage, fmt, uri, f"{ORG}/account", cursor)
    assert [(f.partition, f.new_names) for f in found] == [
        ("00000000b", ("data-00000000002.parquet",)),
        ("000000010", ("data-00000000003.parquet",)),
    ]
    assert not any(folder.endswith("batch=00000000a") for folder in storage.listed)  # closed: never relisted
    assert cursor.last == "000000010"


def test_the_grax_graph_runs_on_s3_through_s3a(sample_lake, moto_server, s3_bucket, spark):
    sample, local_lake, _ = sample_lake
    s3 = boto3.client("s3", endpoint_url=moto_server.url, region_name="us-east-1")
    for path in sample.files:
        s3.upload_file(str(path), s3_bucket, f"landing/{path.relative_to(sample.landing_dir)}")
    config = LakeConfig(
        lake=f"s3a://{s3_bucket}/lake",
        feeds=(
            FeedConfig(
                name="grax", format="grax_v2", landing=f"s3a://{s3_bucket}/landing", objects=("Account",)
            ),
        ),
    )
    config = config.replace(s3=S3Config(endpoint_url=moto_server.url))
    run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
    table = f"{sample.org}/account"
    keys = {
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=s3_bucket, Prefix=f"lake/current/grax/{table}/"
        )
        for o in page.get("Contents", [])
    }
    assert any(k.endswith(".parquet") for k in keys)
    assert not any("_staging" in k or "_temporary" in k for k in keys)
    got = sorted(
        r["Id"] for r in spark.read.parquet(f"s3a://{s3_bucket}/lake/current/grax/{table}").collect()
    )
    assert got == [r["Id"] for r in layer_rows(local_lake, "current", table)]


def test_the_batch_sensor_registers_batches_and_reruns_only_the_open_one(tmp_path):
    from lake_assets.orchestration.resources import LakeResource
    from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG

    landing = tmp_path / "landing"
    row = [{"Id": "a", "source__modified": t(1), "grax__idseq": "01"}]
    for batch in ("00000000a", "00000000b"):
        write_file(landing, "Account", batch, "data-00000000001.parquet", row)
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}",
        feeds=(FeedConfig(name="grax", format="grax_v2", landing=f"file://{landing}"),),
    )
    defs = discovered_definitions(config)
    sensor = defs.resolve_sensor_def("grax_batch_sensor")
    resources = {"lake": LakeResource(root=config.lake)}
    partitions = batch_partitions_name("grax", f"{ORG}/account")
    instance = dg.DagsterInstance.ephemeral()

    def tick(cursor=None):
        """One tick, its new batches registered as the daemon does."""
        with dg.build_sensor_context(
            resources=resources, definitions=defs, instance=instance, cursor=cursor
        ) as context:
            result = sensor(context)
        for request in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return result

    first = tick()
    assert [(r.partitions_def_name, list(r.partition_keys)) for r in first.dynamic_partitions_requests] == [
        (partitions, ["00000000a", "00000000b"])
    ]
    assert [(r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]) for r in first.run_requests] == [
        ("00000000a", "00000000b")
    ]

    quiet = tick(first.cursor)
    assert quiet.run_requests == [] and quiet.dynamic_partitions_requests == []

    write_file(landing, "Account", "00000000b", "data-00000000002.parquet", row)  # the open batch grows
    grown = tick(quiet.cursor)
    assert [(r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]) for r in grown.run_requests] == [
        ("00000000b", "00000000b")
    ]
    assert grown.run_requests[0].run_key != first.run_requests[0].run_key
    assert set(grown.run_requests[0].asset_selection) == {
        dg.AssetKey(["grax", ORG, "account", layer]) for layer in ("catalog", "changes", "current", "history")
    }


def test_timestamps_in_every_parquet_encoding(spark, tmp_path):
    """GRAX does not document the physical type: millis, micros, nanos and INT96 all read alike."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    moment = dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
    folder = landing / "parquet" / "v2" / f"org={ORG}" / "object=Account" / "batch=000000001"
    folder.mkdir(parents=True)
    for index, (unit, int96) in enumerate((("ms", False), ("us", False), ("ns", False), ("us", True))):
        table = pa.table(
            {
                "Id": [f"id-{unit}-{int96}"],
                "source__modified": pa.array([moment], pa.timestamp(unit, tz="UTC")),
                "grax__idseq": ["01"],
                "LastReviewed__c": [moment.isoformat()],
                "LastReviewed__c_ts": pa.array([moment], pa.timestamp(unit, tz="UTC")),
            }
        )
        options = {"use_deprecated_int96_timestamps": True} if int96 else {"version": "2.6"}
        pq.write_table(table, folder / f"data-{index:011x}.parquet", **options)
        stored = pq.ParquetFile(folder / f"data-{index:011x}.parquet").schema.column(1).physical_type
        assert stored == ("INT96" if int96 else "INT64")
    process(landing, lake)
    rows = layer_rows(lake, "current", f"{ORG}/account")
    assert len(rows) == 4
    assert {(r["_version_at"], r["LastReviewed__c"]) for r in rows} == {(moment, moment)}


@pytest.mark.parametrize("grouped_by", ["stored types", "arrow types alone"])
def test_int96_beside_nanoseconds_without_a_zone_are_read_apart(spark, tmp_path, monkeypatch, grouped_by):
    """Both are `timestamp[ns]` to pyarrow, but Spark reads INT96 as a timestamp and INT64
    nanoseconds as a number: read in one Spark read, the batch failed whole, with an earlier
    batch of the same run. Their Parquet types set them apart; and had the schema signature
    missed it (as one that knows only arrow types does), each file would read alone, so the
    batch's files are then read apart. Either way every row reaches the lake."""
    if grouped_by == "arrow types alone":
        monkeypatch.setattr(ingest, "_stored_types", lambda schema: "")
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    schema = pa.schema(
        [("Id", pa.string()), ("source__modified", pa.timestamp("ns")), ("grax__idseq", pa.string())]
    )
    files = {
        ("000000001", "data-00000000001.parquet"): ("earlier", {"coerce_timestamps": "ms"}),
        ("000000002", "data-00000000002.parquet"): ("int96", {"use_deprecated_int96_timestamps": True}),
        ("000000002", "data-00000000003.parquet"): ("nanos", {"version": "2.6"}),
    }
    for hour, ((batch, name), (key, options)) in enumerate(files.items()):
        folder = landing / "parquet" / "v2" / f"org={ORG}" / "object=Account" / f"batch={batch}"
        folder.mkdir(parents=True, exist_ok=True)
        row = {"Id": key, "source__modified": dt.datetime(2024, 1, 1, hour), "grax__idseq": "01"}
        pq.write_table(pa.Table.from_pylist([row], schema=schema), folder / name, **options)
    process(landing, lake)
    rows = layer_rows(lake, "current", f"{ORG}/account")
    assert {(r["Id"], r["_version_at"]) for r in rows} == {
        (key, dt.datetime(2024, 1, 1, hour, tzinfo=UTC)) for hour, (key, _) in enumerate(files.values())
    }


def _int96_and_nanos_with_clean_files(landing: Path) -> dict[str, list]:
    """One batch: an INT96 file and an INT64-nanoseconds file Spark cannot read together (both
    `timestamp[ns]` to pyarrow), and three clean files of another schema. -> partition: files."""
    folder = landing / "parquet" / "v2" / f"org={ORG}" / "object=Account" / "batch=000000001"
    folder.mkdir(parents=True)
    stamped = pa.schema(
        [("Id", pa.string()), ("source__modified", pa.timestamp("ns")), ("grax__idseq", pa.string())]
    )
    for name, options in (
        ("int96", {"use_deprecated_int96_timestamps": True}),
        ("nanos", {"version": "2.6"}),
    ):
        row = {"Id": name, "source__modified": dt.datetime(2024, 1, 1), "grax__idseq": "01"}
        pq.write_table(pa.Table.from_pylist([row], schema=stamped), folder / f"{name}.parquet", **options)
    for n in range(3):
        row = {"Id": f"clean-{n}", "source__modified": t(n), "grax__idseq": "01", "Name": "A"}
        pq.write_table(pa.Table.from_pylist([row]), folder / f"clean-{n}.parquet", coerce_timestamps="ms")
    storage = Storage()
    return {"000000001": data_files(storage, f"file://{folder}")}


def test_only_the_files_of_a_schema_that_fail_read_together_are_read_apart(spark, tmp_path, monkeypatch):
    """Had the schema signature missed a difference Spark cannot read in one read, only that
    group's files are read one by one: the other groups are read together as before, and no
    file of theirs is read alone looking for damage (on a batch of many files, reading each
    alone, and planning a union of them all, would cost far more than the batch)."""
    monkeypatch.setattr(ingest, "_stored_types", lambda schema: "")
    files = _int96_and_nanos_with_clean_files(tmp_path / "landing")
    read_together: list[list[str]] = []
    read_group = ingest._read_group

    def recording(spark, fmt, partition_of, schema):
        read_together.append(sorted(uri.rsplit("/", 1)[1] for uri in partition_of))
        return read_group(spark, fmt, partition_of, schema)

    monkeypatch.setattr(ingest, "_read_group", recording)
    batch = ingest.read_batch(spark, Storage(), GraxV2Format(), f"{ORG}/account", files)

    assert batch.quarantined == [] and batch.reconciles and batch.files_read == 5
    assert sorted(r["Id"] for r in batch.events.select("Id").collect()) == [
        "clean-0",
        "clean-1",
        "clean-2",
        "int96",
        "nanos",
    ]
    clean = [f"clean-{n}.parquet" for n in range(3)]
    assert all(uris == clean for uris in read_together if set(uris) & set(clean)), read_together
    assert ["int96.parquet"] in read_together and ["nanos.parquet"] in read_together


def test_a_read_that_fails_after_its_files_were_read_apart_names_the_first_failure(
    spark, tmp_path, monkeypatch
):
    """When reading apart does not help either, the error raised carries the failure that led
    to it, so the cause first seen is not lost."""
    monkeypatch.setattr(ingest, "_stored_types", lambda schema: "")
    files = _int96_and_nanos_with_clean_files(tmp_path / "landing")
    failures = iter(range(1, 10))

    def failing(events, spec, **_):
        raise PySparkException(f"collapse failure {next(failures)}")

    monkeypatch.setattr(ingest, "collapse_counted", failing)
    with pytest.raises(PySparkException, match="collapse failure 2") as raised:
        ingest.read_batch(spark, Storage(), GraxV2Format(), f"{ORG}/account", files)
    assert "collapse failure 1" in str(raised.value.__cause__)


def test_every_change_carries_the_instant_its_run_read_it(sample_lake):
    sample, lake, instance = sample_lake
    assert_read_during_the_runs(
        {r["_ingested_at"] for r in layer_rows(lake, "changes", f"{sample.org}/account")}, instance
    )


def changes_metadata(instance, table_object: str = "account") -> dict:
    event = instance.get_latest_materialization_event(dg.AssetKey(["grax", ORG, table_object, "changes"]))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def test_object_folders_differing_only_in_case_are_one_table(spark, tmp_path):
    """`object=Account` and `object=ACCOUNT` name one Salesforce object (API names ignore case):
    both folders are read as the table `<org>/account`, and a batch found in both holds the
    files of both."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    write_file(
        landing,
        "Account",
        "000000001",
        "data-00000000001.parquet",
        [{"Id": "a", "source__modified": t(1), "grax__idseq": "01", "Name": "A"}],
    )
    write_file(
        landing,
        "ACCOUNT",
        "000000001",
        "data-00000000001.parquet",  # same batch, same file name
        [{"Id": "b", "source__modified": t(1), "grax__idseq": "01", "Name": "B"}],
    )
    write_file(
        landing,
        "ACCOUNT",
        "000000002",
        "data-00000000002.parquet",
        [
            {"Id": "a", "source__modified": t(2), "grax__idseq": "02", "Name": "A2"},
            {"Id": "c", "source__modified": t(2), "grax__idseq": "01", "Name": "C"},
        ],
    )
    write_file(
        landing,
        "Account",
        "000000003",
        "data-00000000003.parquet",
        [{"Id": "d", "source__modified": t(3), "grax__idseq": "01", "Name": "D"}],
    )
    instance = process(landing, lake)

    table = f"{ORG}/account"
    assert GraxV2Format().survey(CountingStorage(), f"file://{landing}").tables == [table]
    assert [(r["Id"], r["Name"]) for r in layer_rows(lake, "current", table)] == [
        ("a", "A2"),
        ("b", "B"),
        ("c", "C"),
        ("d", "D"),
    ]
    changes = layer_rows(lake, "changes", table, "Id, _version_at")
    assert [(r["Id"], r["batch"]) for r in changes] == [
        ("a", "000000001"),
        ("a", "000000002"),
        ("b", "000000001"),
        ("c", "000000002"),
        ("d", "000000003"),
    ]
    assert instance.get_dynamic_partitions(batch_partitions_name("grax", table)) == [
        "000000001",
        "000000002",
        "000000003",
    ]
    metadata = changes_metadata(instance)
    assert (
        metadata["files_listed"] == 4 and metadata["files_read"] == 4 and metadata["files_quarantined"] == 0
    )
    assert metadata["rows_in"] == 5 and metadata["events_out"] == 5 and metadata["reconciled"] is True


def test_the_batch_scan_sees_a_late_file_named_like_one_in_the_other_case_folder(tmp_path):
    landing = tmp_path / "landing"
    row = [{"Id": "a", "source__modified": t(1), "grax__idseq": "01"}]
    write_file(landing, "Account", "00000000a", "data-00000000001.parquet", row)
    fmt, uri, table = GraxV2Format(), f"file://{landing}", f"{ORG}/account"
    found, cursor = scan_batches(CountingStorage(), fmt, uri, table, BatchCursor())
    assert [f.partition for f in found] == ["00000000a"]
    write_file(landing, "ACCOUNT", "00000000a", "data-00000000001.parquet", row)  # the open batch grows
    found, cursor = scan_batches(CountingStorage(), fmt, uri, table, cursor)
    assert [(f.partition, f.new_names) for f in found] == [("00000000a", ("data-00000000001.parquet",))]
    found, _ = scan_batches(CountingStorage(), fmt, uri, table, cursor)
    assert found == []


def test_the_batch_scan_sees_a_file_of_the_open_batch_rewritten_or_removed(tmp_path):
    landing = tmp_path / "landing"
    row = [{"Id": "a", "source__modified": t(1), "grax__idseq": "01"}]
    first = write_file(landing, "Account", "00000000a", "data-00000000001.parquet", row)
    write_file(landing, "Account", "00000000a", "data-00000000002.parquet", row)
    fmt, uri, table = GraxV2Format(), f"file://{landing}", f"{ORG}/account"
    found, cursor = scan_batches(CountingStorage(), fmt, uri, table, BatchCursor())
    assert [f.partition for f in found] == ["00000000a"]

    # A correction rewritten in place: new again, and the run is keyed apart from the first.
    write_file(landing, "Account", "00000000a", "data-00000000001.parquet", row * 2)
    os.utime(first, ns=(first.stat().st_atime_ns, first.stat().st_mtime_ns + 5_000_000))
    rewritten, cursor = scan_batches(CountingStorage(), fmt, uri, table, cursor)
    assert [(f.partition, f.new_names) for f in rewritten] == [("00000000a", ("data-00000000001.parquet",))]
    assert rewritten[0].fingerprint != found[0].fingerprint
    assert scan_batches(CountingStorage(), fmt, uri, table, cursor)[0] == []

    first.unlink()  # a file taken back: the batch runs again, and its rows leave `changes`
    removed, cursor = scan_batches(CountingStorage(), fmt, uri, table, cursor)
    assert [(f.partition, f.new_names, len(f.removed)) for f in removed] == [("00000000a", (), 1)]

    # A cursor saved when the scan remembered names alone: what it names counts as seen.
    old = BatchCursor(last="00000000a", open_files=["data-00000000002.parquet"])
    assert scan_batches(CountingStorage(), fmt, uri, table, old)[0] == []

    # The batch's last file taken back: on S3 its folder goes with it. The batch before is the
    # open one again, and a file landing there later is seen.
    write_file(landing, "Account", "000000009", "data-00000000009.parquet", row)
    shutil.rmtree(first.parent)
    gone, cursor = scan_batches(CountingStorage(), fmt, uri, table, cursor)
    assert [(f.partition, f.new_names, len(f.removed)) for f in gone] == [("00000000a", (), 1)]
    assert cursor.last == "000000009"
    assert scan_batches(CountingStorage(), fmt, uri, table, cursor)[0] == []
    write_file(landing, "Account", "000000009", "data-0000000000a.parquet", row)
    landed, _ = scan_batches(CountingStorage(), fmt, uri, table, cursor)
    assert [(f.partition, f.new_names) for f in landed] == [("000000009", ("data-0000000000a.parquet",))]


def test_a_typed_copy_that_changes_type_between_batches_keeps_the_table_going(spark, tmp_path):
    """`Score` comes as a whole number (`Score_i`) in one batch and as a boolean (`Score_b`) in
    the next, beside a purge: no number type holds both, so the column becomes text, every value
    is kept and the purge goes through, instead of the table stopping at every run."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    first = [
        {"Id": "X", "source__modified": t(1), "grax__idseq": "01", "Score": "5", "Score_i": 5},
        {"Id": "Y", "source__modified": t(1), "grax__idseq": "02", "Score": "6", "Score_i": 6},
    ]
    write_file(landing, "Account", "00000000a", "data-00000000001.parquet", first)
    process(landing, lake)
    write_file(
        landing,
        "Account",
        "00000000b",
        "data-00000000002.parquet",
        [{"Id": "Z", "source__modified": t(2), "grax__idseq": "03", "Score": "true", "Score_b": True}],
    )
    purge = [{"Id": "X", "source__modified": t(3), "grax__idseq": "04", "grax__purged": t(3)}]
    write_file(landing, "Account", "00000000b", "data-00000000003.parquet", purge)
    process(landing, lake)

    current = {r["Id"]: r["Score"] for r in layer_rows(lake, "current", f"{ORG}/account")}
    assert current == {"X": None, "Y": "6", "Z": "true"}
    assert all(r["Score"] is None for r in layer_rows(lake, "history", f"{ORG}/account") if r["Id"] == "X")
    assert not list((lake / "_quarantine").rglob("*.reason.json"))


@pytest.mark.parametrize("together", [False, True], ids=["one-batch", "two-batches-one-run"])
def test_numbers_of_several_types_bound_for_a_text_column_keep_every_digit(spark, tmp_path, together):
    """The table holds `Big` as text. Later files give it as a double in one and as a 64-bit
    integer and a wide decimal in others, in one batch or in two batches of one run. Widened
    among themselves they became a double, and the integer's last digit and the decimal's
    fraction were gone before they became text; each becomes text from its own type."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    write_file(
        landing,
        "Account",
        "01",
        "data-1.parquet",
        [{"Id": "a", "source__modified": t(1), "grax__idseq": "1", "Big": "text"}],
    )
    process(landing, lake)
    later = ("02", "02") if not together else ("02", "03")
    write_file(
        landing,
        "Account",
        later[0],
        "data-2.parquet",
        [{"Id": "b", "source__modified": t(2), "grax__idseq": "2", "Big": 2.5}],
        grax_schema(("Big", pa.float64())),
    )
    write_file(
        landing,
        "Account",
        later[1],
        "data-3.parquet",
        [{"Id": "c", "source__modified": t(3), "grax__idseq": "3", "Big": 9007199254740993}],
        grax_schema(("Big", pa.int64())),
    )
    wide = decimal.Decimal("1234567890123456789012345678.0123456789")
    write_file(
        landing,
        "Account",
        later[1],
        "data-4.parquet",
        [{"Id": "d", "source__modified": t(4), "grax__idseq": "4", "Big": wide}],
        grax_schema(("Big", pa.decimal128(38, 10))),
    )
    process(landing, lake)

    expected = {"a": "text", "b": "2.5", "c": "9007199254740993", "d": str(wide)}
    for layer in ("changes", "current", "history"):
        found = {r["Id"]: r["Big"] for r in layer_rows(lake, layer, f"{ORG}/account")}
        assert {k: str(v) for k, v in found.items()} == expected, layer
    assert not list((lake / "_quarantine").rglob("*.reason.json"))


@pytest.mark.parametrize("where", ["stored", "same-batch"])
def test_a_purge_file_whose_empty_column_has_a_clashing_type_applies_its_purge(spark, tmp_path, where):
    """A purge's file carries no field data; one gave `Name`, which the table (or the larger
    file of its batch) holds as text, as a struct, every value NULL. The clash set the file
    aside, so the purge waited and X's name stayed in every layer. A column no row of the file
    holds a value of cannot clash: the file's rows have no name, and the purge applies."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    names = [
        {"Id": key, "source__modified": t(1), "grax__idseq": str(n), "Name": f"name {key}"}
        for n, key in enumerate(["X", "Y", "Z"])
    ]
    write_file(landing, "Account", "01", "data-1.parquet", names, grax_schema(("Name", pa.string())))
    if where == "stored":
        process(landing, lake)
    batch = "02" if where == "stored" else "01"
    empty_struct = ("Name", pa.struct([("first", pa.string())]))
    purge = {"Id": "X", "source__modified": t(2), "grax__idseq": "9", "grax__purged": t(2), "Name": None}
    write_file(
        landing,
        "Account",
        batch,
        "data-2.parquet",
        [purge],
        grax_schema(("grax__purged", pa.timestamp("ms", tz="UTC")), empty_struct),
    )
    process(landing, lake)

    assert not list((lake / "_quarantine").rglob("*.reason.json"))
    for layer in ("changes", "current", "history"):
        rows = layer_rows(lake, layer, f"{ORG}/account")
        assert all(r["Name"] is None for r in rows if r["Id"] == "X"), layer
        assert {r["Name"] for r in rows if r["Id"] != "X"} == {"name Y", "name Z"}, layer
    marked = [r["_purged"] for r in layer_rows(lake, "history", f"{ORG}/account") if r["Id"] == "X"]
    assert marked and all(marked)


def test_delete_and_purge_markers_that_are_not_times_quarantine_their_file(spark, tmp_path):
    """`grax__deleted` / `grax__purged` are timestamps; a file may carry them as text (ISO). Empty
    text is 'not deleted'; text that is not a time cannot say whether the record is gone, so its
    file is set aside naming the column and the value, and the batch goes on."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    text = grax_schema(("grax__deleted", pa.string()), ("grax__purged", pa.string()), ("Name", pa.string()))
    write_file(
        landing,
        "Account",
        "000000001",
        "data-00000000001.parquet",
        [
            {
                "Id": "live",
                "source__modified": t(1),
                "grax__idseq": "01",
                "grax__deleted": "",
                "grax__purged": " ",
                "Name": "L",
            },
            {
                "Id": "gone",
                "source__modified": t(1),
                "grax__idseq": "01",
                "grax__deleted": "2024-01-01T03:00:00Z",
                "Name": "G",
            },
            {
                "Id": "erased",
                "source__modified": t(1),
                "grax__idseq": "01",
                "grax__purged": "2024-01-01 04:00:00",
                "Name": "E",
            },
            {"Id": "plain", "source__modified": t(1), "grax__idseq": "01", "Name": "P"},
        ],
        text,
    )
    deleted = write_file(
        landing,
        "Account",
        "000000001",
        "data-00000000002.parquet",
        [
            {"Id": "d", "source__modified": t(2), "grax__idseq": "02", "Name": "D"},
            {"Id": "d", "source__modified": t(3), "grax__idseq": "03", "grax__deleted": "yes", "Name": "D"},
        ],
        text,
    )
    purged = write_file(
        landing,
        "Account",
        "000000001",
        "data-00000000003.parquet",
        [
            {"Id": "p", "source__modified": t(2), "grax__idseq": "02", "grax__purged": "not-a-date"},
        ],
        text,
    )
    # Spark reads a time of day alone as that time today: a delete time that would move with the run
    time_only = write_file(
        landing,
        "Account",
        "000000001",
        "data-00000000004.parquet",
        [
            {
                "Id": "t",
                "source__modified": t(2),
                "grax__idseq": "02",
                "grax__deleted": "03:00:00",
                "Name": "T",
            },
        ],
        text,
    )
    instance = process(landing, lake)

    table = f"{ORG}/account"
    assert [(r["Id"], r["Name"]) for r in layer_rows(lake, "current", table)] == [
        ("erased", None),
        ("live", "L"),
        ("plain", "P"),
    ]
    history = {r["Id"]: r for r in layer_rows(lake, "history", table)}
    assert history["gone"]["_fivetran_end"] == t(3) and history["erased"]["_purged"] is True
    notes = {
        p.name: json.loads(p.read_text()) for p in (lake / "_quarantine" / "grax").rglob("*.reason.json")
    }
    assert set(notes) == {f"data-0000000000{n}.parquet.reason.json" for n in (2, 3, 4)}
    assert notes["data-00000000004.parquet.reason.json"]["file"] == f"file://{time_only}"
    assert "grax__deleted is not a time: 03:00:00" in notes["data-00000000004.parquet.reason.json"]["reason"]
    deleted_note, purged_note = (
        notes["data-00000000002.parquet.reason.json"],
        notes["data-00000000003.parquet.reason.json"],
    )
    assert (
        deleted_note["file"] == f"file://{deleted}"
        and "grax__deleted is not a time: yes" in deleted_note["reason"]
    )
    assert (
        purged_note["file"] == f"file://{purged}"
        and "grax__purged is not a time: not-a-date" in purged_note["reason"]
    )
    metadata = changes_metadata(instance)
    assert (
        metadata["files_listed"] == 4 and metadata["files_read"] == 1 and metadata["files_quarantined"] == 3
    )
    assert metadata["rows_in"] == 4 and metadata["events_derived"] == 1 and metadata["events_out"] == 5
    assert metadata["reconciled"] is True


def test_a_write_or_delete_dated_after_the_end_of_history_sets_its_file_aside(tmp_path):
    """A delete opens an event at its own time: one in the year 10000 would open a window that
    ends before it begins."""
    from lake_assets_tests import grax_lake

    landing, lake = tmp_path / "landing", tmp_path / "lake"
    grax_lake.land(
        landing, "00000000a", "data-00000000001.parquet", [grax_lake.version("X", 1, "01", "Xavier")]
    )
    schema = pa.schema([*grax_lake.SCHEMA, ("grax__deleted", pa.string()), ("note", pa.string())])
    folder = landing / "parquet" / "v2" / f"org={grax_lake.ORG}" / "object=Account" / "batch=00000000b"
    folder.mkdir(parents=True)
    far = {**grax_lake.version("X", 2, "02", "Xavier"), "grax__deleted": "10000-01-01T00:00:00Z"}
    pq.write_table(pa.Table.from_pylist([far], schema=schema), folder / "data-00000000002.parquet")
    grax_lake.cli(grax_lake.config_for(landing, lake), dg.DagsterInstance.ephemeral())
    notes = [json.loads(p.read_text()) for p in (lake / "_quarantine").rglob("*.reason.json")]
    assert [n["reason"].split(" (")[0] for n in notes] == [
        "grax__deleted lies after 9999-12-31 23:59:59.999, where open history ends: 10000-01-01T00:00:00Z"
    ]
    # one landed row, though the delete derived from it carries its reason too
    assert notes[0]["reason"].endswith("(1 bad row(s), first reason shown)") and notes[0]["rows"] == 1
    assert [r["Name"] for r in grax_lake.rows(lake, "current")] == ["Xavier"]


def test_an_idseq_spelled_like_a_derived_delete_sets_its_file_aside(spark, tmp_path):
    """A deleted row's delete is sequenced `grax__idseq` + `~`. A landed row whose sequence is
    spelled so, for the same key and time, was collapsed with that delete as its copy: the run
    counted it a duplicate and the row was in no layer and in no note. Its file is set aside."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    schema = grax_schema(("Name", pa.string()), ("grax__deleted", pa.timestamp("ms", tz="UTC")))
    deleted = {"Id": "k1", "source__modified": t(1), "grax__idseq": "05", "grax__deleted": t(1)}
    write_file(landing, "Account", "01", "data-2.parquet", [deleted], schema)
    tilde = {"Id": "k1", "source__modified": t(1), "grax__idseq": "05~", "Name": "B"}
    tilde_file = write_file(landing, "Account", "01", "data-1.parquet", [tilde], schema)
    instance = process(landing, lake)

    [note] = [json.loads(p.read_text()) for p in (lake / "_quarantine").rglob("*.reason.json")]
    assert note["file"] == f"file://{tilde_file}"
    assert "grax__idseq ends with '~', as the sequence of the delete" in note["reason"]
    changes = layer_rows(lake, "changes", f"{ORG}/account", order="_seq")
    assert [(r["_seq"], r["_op"]) for r in changes] == [("05", "update"), ("05~", "delete")]
    metadata = changes_metadata(instance)
    assert metadata["files_quarantined"] == 1 and metadata["duplicates_collapsed"] == 0


def test_typed_copies_stored_as_numbers_that_do_not_fit_their_type_set_their_file_aside(spark, tmp_path):
    """A typed copy stored as a number rather than as text: a whole-number copy (`_i`) holding a
    double beyond a long, with a fraction or NaN cannot be kept as its type without changing the
    value. Its file is set aside with a reason naming the column and the value, and the good
    files of the batch are read (a whole double in an `_i` column is a whole number)."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"

    def row(key: str, seq: str, **fields) -> dict:
        return {"Id": key, "source__modified": t(1), "grax__idseq": seq, **fields}

    numbers = grax_schema(("Score", pa.string()), ("Score_i", pa.float64()))
    good = write_file(
        landing,
        "Account",
        "00000000a",
        "data-00000000001.parquet",
        [row("a", "01", Score="5", Score_i=5.0)],
        numbers,
    )
    too_large = write_file(
        landing,
        "Account",
        "00000000a",
        "data-00000000002.parquet",
        [row("b", "02", Score="1e30", Score_i=1e30)],
        numbers,
    )
    fraction = write_file(
        landing,
        "Account",
        "00000000a",
        "data-00000000003.parquet",
        [row("c", "03", Score="2.5", Score_i=2.5)],
        numbers,
    )
    not_a_number = write_file(
        landing,
        "Account",
        "00000000a",
        "data-00000000004.parquet",
        [row("d", "04", Score="NaN", Score_i=float("nan"))],
        numbers,
    )
    process(landing, lake)

    assert {r["Id"]: r["Score"] for r in layer_rows(lake, "current", f"{ORG}/account")} == {"a": 5}
    notes = {
        p.name: json.loads(p.read_text()) for p in (lake / "_quarantine" / "grax").rglob("*.reason.json")
    }
    for path, value in ((too_large, "1.0E30"), (fraction, "2.5"), (not_a_number, "NaN")):
        reason = notes[f"{path.name}.reason.json"]["reason"]
        assert "typed column 'Score_i' holds a value that is not bigint" in reason and value in reason, reason
    assert good.name + ".reason.json" not in notes


def test_typed_copies_stored_in_a_type_that_holds_no_such_values_are_refused_by_name(spark, tmp_path):
    """A date copy stored as a number, a boolean copy as a time, a float copy as bytes, a
    whole-number copy as a list: no value of the column is its kind, so the file is set aside
    saying which column is stored how, and a boolean stored in a whole-number copy is read as
    1 (a type whose values convert is read value by value)."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    stored = {
        "Born_d": (pa.int32(), 5),
        "Flag_b": (pa.timestamp("ms", tz="UTC"), t(2)),
        "Amount_f": (pa.binary(), b"1.5"),
        "Count_i": (pa.list_(pa.int64()), [1]),
        "Rank_i": (pa.bool_(), True),
    }
    names = {}
    for n, (copy, (kind, value)) in enumerate(stored.items(), start=1):
        field = copy.rsplit("_", 1)[0]
        schema = grax_schema((field, pa.string()), (copy, kind))
        row = {"Id": copy, "source__modified": t(1), "grax__idseq": f"{n:02}", field: "x", copy: value}
        names[copy] = write_file(landing, "Account", "00000000a", f"data-{n:011}.parquet", [row], schema).name
    process(landing, lake)

    assert [(r["Id"], r["Rank"]) for r in layer_rows(lake, "current", f"{ORG}/account")] == [("Rank_i", 1)]
    notes = {
        p.name: json.loads(p.read_text()) for p in (lake / "_quarantine" / "grax").rglob("*.reason.json")
    }
    expected = {
        "Born_d": "typed column 'Born_d' is stored as int32, which holds no date values",
        "Flag_b": "typed column 'Flag_b' is stored as timestamp[ms, tz=UTC], which holds no boolean values",
        "Amount_f": "typed column 'Amount_f' is stored as binary, which holds no double values",
        "Count_i": "typed column 'Count_i' is stored as list<element: int64>, which holds no bigint values",
    }
    for copy, reason in expected.items():
        assert reason in notes[f"{names[copy]}.reason.json"]["reason"]
    assert len(notes) == len(expected)


def test_copies_that_would_change_converted_or_have_no_unit_set_their_file_aside(spark, tmp_path):
    """A boolean copy stored as the number 2, a date copy as a time with its time of day, a
    float copy as a long beyond 2^53 (a double rounds it), an epoch beyond any time, a date copy
    as text with a time of day (Spark would drop it), a float copy as text beyond a double (Spark
    would make it infinite): each would change (or vanish) converted, so its file is set aside
    naming the column and value.
    A time copy stored as a float is refused by its type (seconds or milliseconds, and how
    precise, cannot be told). 0 and 1, midnight, 2^53 and epoch milliseconds are read."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    cases = [  # (column, stored type, good value, bad value, the bad value as the reason shows it)
        ("Flag_b", pa.int64(), 1, 2, "2"),
        ("Born_d", pa.timestamp("ms", tz="UTC"), t(0), t(3), "2024-01-01 03:00:00"),
        ("Amount_f", pa.int64(), 2**53, 2**53 + 1, str(2**53 + 1)),
        ("When_ts", pa.int64(), 1_700_000_000_000, 10**18, str(10**18)),
        ("Due_d", pa.string(), "2024-01-01", "2024-01-01 10:30:00", "2024-01-01 10:30:00"),
        ("Ratio_f", pa.string(), "1.5", "1e400", "1e400"),
    ]
    bad_files = {}
    for n, (column, kind, good, bad, shown) in enumerate(cases):
        field = column.rsplit("_", 1)[0]
        schema = grax_schema((field, pa.string()), (column, kind))
        for m, value in ((0, good), (1, bad)):
            row = {
                "Id": f"{column}-{m}",
                "source__modified": t(1),
                "grax__idseq": f"{n}{m}",
                field: "x",
                column: value,
            }
            path = write_file(landing, "Account", "00000000a", f"data-{2 * n + m:011}.parquet", [row], schema)
        bad_files[path.name] = (column, shown)
    floats = pa.schema([*list(schema)[:3], ("Seen", pa.string()), ("Seen_ts", pa.float64())])
    row = {"Id": "float", "source__modified": t(1), "grax__idseq": "99", "Seen": "x", "Seen_ts": 1.7e9}
    float_file = write_file(landing, "Account", "00000000a", "data-00000000099.parquet", [row], floats)
    process(landing, lake)

    current = {r["Id"] for r in layer_rows(lake, "current", f"{ORG}/account")}
    assert current == {f"{column}-0" for column, *_ in cases}
    notes = {
        p.name: json.loads(p.read_text()) for p in (lake / "_quarantine" / "grax").rglob("*.reason.json")
    }
    for name, (column, shown) in bad_files.items():
        reason = notes[f"{name}.reason.json"]["reason"]
        assert f"typed column '{column}' holds a value that is not" in reason and shown in reason, reason
    assert (
        "typed column 'Seen_ts' is stored as double, which holds no timestamp values"
        in (notes[f"{float_file.name}.reason.json"]["reason"])
    )
    assert len(notes) == len(cases) + 1


def test_an_epoch_in_milliseconds_too_small_to_tell_from_seconds_sets_its_file_aside(spark, tmp_path):
    """A time copy stored as an epoch number is read as milliseconds or seconds by its size: the
    milliseconds of a moment before March 1973 pass for seconds, read years away. Where the
    field's own text tells another moment, the file is set aside saying so; 2024's milliseconds,
    and 1972's seconds, read right."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    schema = grax_schema(("Founded", pa.string()), ("Founded_ts", pa.int64()))
    early, late = dt.datetime(1972, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 1, tzinfo=UTC)

    def landed(name: str, key: str, text: str, epoch: int) -> Path:
        row = {"Id": key, "source__modified": t(1), "grax__idseq": "01", "Founded": text, "Founded_ts": epoch}
        return write_file(landing, "Account", "1", name, [row], schema)

    salesforce = "%Y-%m-%dT%H:%M:%S.000+0000"  # how Salesforce spells a time
    landed("data-1.parquet", "late-ms", late.strftime(salesforce), int(late.timestamp() * 1000))
    landed("data-2.parquet", "early-s", early.isoformat(), int(early.timestamp()))
    landed("data-3.parquet", "no-time", "10:30", int(late.timestamp() * 1000))  # no year: not a time
    misread = landed("data-4.parquet", "early-ms", early.strftime(salesforce), int(early.timestamp() * 1000))
    process(landing, lake)

    founded = {r["Id"]: r["Founded"] for r in layer_rows(lake, "current", f"{ORG}/account")}
    assert founded == {"early-s": early, "late-ms": late, "no-time": late}
    (note,) = [json.loads(p.read_text()) for p in (lake / "_quarantine" / "grax").rglob("*.reason.json")]
    assert note["file"].endswith(misread.name)
    assert (
        "typed column 'Founded_ts' holds the epoch 63072000000, whose unit cannot be told" in note["reason"]
    )


def test_batch_folders_spelling_one_number_are_one_batch_on_every_run(spark, tmp_path):
    """`batch=0a1`, `batch=0A1` and `batch=00a1` are one hex number, so one batch (keyed `00a1`,
    the least spelling in lower case): read together, stored under one partition, and a run
    with nothing new changes nothing. As separate partitions, each run wrote one spelling's rows
    under another's folder and the next removed them (3 of 9 rows left)."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    for n, batch in enumerate(("0a1", "0A1", "00a1", "0b2"), start=1):
        rows = [
            {"Id": f"{batch}-{i}", "source__modified": t(1), "grax__idseq": f"{n}{i:02}"} for i in range(3)
        ]
        write_file(landing, "Account", batch, f"data-{n:011}.parquet", rows)
    instance = dg.DagsterInstance.ephemeral()
    for _ in range(3):
        process(landing, lake, instance)
        changes = duck(
            f"SELECT batch, _source_file FROM read_parquet('{lake}/changes/grax/{ORG}/account/**/*.parquet',"
            " hive_partitioning = true)"
        )
        assert len(changes) == 12
        by_batch = {(r["batch"], r["_source_file"].rsplit("/batch=", 1)[1]) for r in changes}
        assert by_batch == {
            ("00a1", "0a1/data-00000000001.parquet"),
            ("00a1", "0A1/data-00000000002.parquet"),
            ("00a1", "00a1/data-00000000003.parquet"),
            ("0b2", "0b2/data-00000000004.parquet"),
        }
    assert len(layer_rows(lake, "current", f"{ORG}/account")) == 12
    fmt = GraxV2Format()
    assert fmt.partition_keys(Storage(), f"file://{landing}", f"{ORG}/account") == ["00a1", "0b2"]
    # a partition registered under another spelling (before batches were keyed so) has no files
    assert fmt.partition_files(Storage(), f"file://{landing}", f"{ORG}/account", "0A1") == []


def test_a_field_named_like_the_text_of_a_typed_field_sets_its_file_aside_by_name(spark, tmp_path):
    """`Amount__string` is the column the lake keeps `Amount`'s text in when `Amount_f` comes
    beside it: a vendor field of that name has nowhere to go. Its file is set aside saying so
    (it was Spark's COLUMN_ALREADY_EXISTS), and the other file of the batch is read."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    base = {"source__modified": t(1), "Amount": "1.5", "Amount_f": 1.5}
    write_file(
        landing,
        "Account",
        "00000000a",
        "data-00000000001.parquet",
        [{"Id": "a", "grax__idseq": "01", **base}],
    )
    clash = write_file(
        landing,
        "Account",
        "00000000a",
        "data-00000000002.parquet",
        [{"Id": "b", "grax__idseq": "02", **base, "Amount__string": "mine"}],
    )
    process(landing, lake)

    assert [(r["Id"], r["Amount"]) for r in layer_rows(lake, "current", f"{ORG}/account")] == [("a", 1.5)]
    (note,) = [json.loads(p.read_text()) for p in (lake / "_quarantine" / "grax").rglob("*.reason.json")]
    assert note["file"].endswith(clash.name)
    assert (
        "column 'Amount__string' has the name the lake gives the text of typed field 'Amount'"
        in note["reason"]
    )


def test_dictionary_encoded_and_large_text_ids_are_read_like_plain_text(spark, tmp_path):
    """pyarrow writes a categorical column as a dictionary of strings, which Spark reads as text;
    a file whose `Id` or `grax__idseq` was one was quarantined as "expected a string"."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    folder = landing / "parquet" / "v2" / f"org={ORG}" / "object=Account" / "batch=000000001"
    folder.mkdir(parents=True)
    for index, kind in enumerate((pa.dictionary(pa.int32(), pa.string()), pa.large_string(), pa.string())):
        table = pa.table(
            {
                "Id": pa.array([f"id-{index}"]).cast(kind),
                "source__modified": pa.array([t(1)], pa.timestamp("ms", tz="UTC")),
                "grax__idseq": pa.array(["01"]).cast(kind),
                "Name": [f"name-{index}"],
            }
        )
        pq.write_table(table, folder / f"data-{index:011x}.parquet")
    instance = process(landing, lake)
    assert [(r["Id"], r["Name"]) for r in layer_rows(lake, "current", f"{ORG}/account")] == [
        ("id-0", "name-0"),
        ("id-1", "name-1"),
        ("id-2", "name-2"),
    ]
    assert changes_metadata(instance)["files_quarantined"] == 0


def test_a_batch_key_typed_in_upper_case_in_the_ui_touches_no_other_batchs_files(tmp_path, spark):
    """`0A1` added as a partition in the UI, where the landed batch is `batch=0a1` (batch keys are
    lower case). The work id a batch's files are catalogued under is written in lower case, so
    `0A1`'s catalog step found `0a1`'s records, listed no file of its own for them and retired
    them all; a later run of `0a1`'s changes alone then emptied them. `0A1` names no files: its
    run reads, records and retires nothing, and `0a1` keeps its catalog and its changes."""
    from lake_assets.catalog.files import landed_records
    from lake_assets.orchestration.definitions import resources_for, table_job_name
    from lake_assets_tests import grax_lake

    landing, lake = tmp_path / "landing", tmp_path / "lake"
    grax_lake.land(landing, "0a1", "part-0.parquet", [grax_lake.version("001", 1, "0001", name="Acme")])
    config, instance = grax_lake.config_for(landing, lake), dg.DagsterInstance.ephemeral()
    grax_lake.cli(config, instance)
    store = resources_for(config)["catalog"].get_store()

    def catalogued() -> list[str]:
        records = landed_records(store, grax_lake.FEED, grax_lake.TABLE, ["0a1"])["0a1"]
        return [url.rsplit("/", 1)[-1] for url in records]

    def changes() -> list[tuple]:
        return sorted((r["Id"], r["batch"]) for r in grax_lake.rows(lake, "changes"))

    assert catalogued() == ["part-0.parquet"] and changes() == [("001", "0a1")]
    instance.add_dynamic_partitions(batch_partitions_name(grax_lake.FEED, grax_lake.TABLE), ["0A1"])
    job = discovered_definitions(config).resolve_job_def(table_job_name(grax_lake.FEED, grax_lake.TABLE))
    assert job.execute_in_process(instance=instance, partition_key="0A1").success
    assert catalogued() == ["part-0.parquet"] and changes() == [("001", "0a1")]

    layers = [
        dg.AssetKey([grax_lake.FEED, *grax_lake.TABLE.split("/"), x])
        for x in ("changes", "current", "history")
    ]
    assert job.execute_in_process(instance=instance, partition_key="0a1", asset_selection=layers).success
    assert changes() == [("001", "0a1")]


def test_an_idseq_that_is_not_utf8_sets_its_file_aside_and_every_engine_reads_the_lake(spark, tmp_path):
    """`grax__idseq` orders the writes of a version, as a key identifies them: repaired, two
    sequences could become one, and left as it is, DuckDB refuses every layer holding it. Its
    file is set aside, naming the column, and the batch's other file is read."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    schema = pa.schema(
        [
            ("Id", pa.string()),
            ("source__modified", pa.timestamp("ms", tz="UTC")),
            ("grax__idseq", pa.string()),
        ]
    )
    write_file(
        landing,
        "Account",
        "1",
        "data-ok.parquet",
        [{"Id": "a", "source__modified": t(1), "grax__idseq": "01"}],
        schema,
    )
    bad = write_file(landing, "Account", "1", "data-bytes.parquet", [], schema)
    pq.write_table(
        pa.table(
            {
                "Id": ["b"],
                "source__modified": pa.array([t(1)], pa.timestamp("ms", tz="UTC")),
                "grax__idseq": pa.array([b"0\xff1"], pa.binary()).view(pa.string()),
            }
        ),
        bad,
    )
    process(landing, lake)

    for layer in ("changes", "current", "history"):  # DuckDB reads every layer
        assert [r["Id"] for r in layer_rows(lake, layer, f"{ORG}/account")] == ["a"], layer
    (note,) = [json.loads(p.read_text()) for p in (lake / "_quarantine" / "grax").rglob("*.reason.json")]
    assert note["file"].endswith(bad.name)
    assert "sequence column '_seq' holds text that is not valid UTF-8" in note["reason"]


def test_a_file_whose_name_is_not_utf8_is_reported_and_its_batch_and_table_go_on(spark, tmp_path):
    """A local landing may hold a file whose name's bytes are not UTF-8 text: no URI can name
    it for Spark, so it is reported (its note shows the bytes escaped) and not read; the other
    file of its batch, and the other batch, are read, on every run."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    row = {"source__modified": t(1), "grax__idseq": "01"}
    write_file(landing, "Account", "1", "data-1.parquet", [{"Id": "a", **row}])
    beside = write_file(landing, "Account", "2", "data-2.parquet", [{"Id": "b", **row}])
    odd = os.path.join(os.fsencode(beside.parent), b"data-\xff\xfe.parquet")
    written = write_file(landing, "Account", "2", "data-3.parquet", [{"Id": "c", **row}])
    content = written.read_bytes()
    os.rename(written, odd)

    for _ in range(2):
        process(landing, lake)
        assert [r["Id"] for r in layer_rows(lake, "current", f"{ORG}/account")] == ["a", "b"]
    (note,) = [json.loads(p.read_text()) for p in (lake / "_quarantine" / "grax").rglob("*.reason.json")]
    assert note["file"] == f"file://{beside.parent}/data-\\xff\\xfe.parquet"
    assert "its name is not UTF-8 text" in note["reason"]
    # its copy holds its bytes, though its name is shown with escapes
    (copy,) = [
        p for p in (lake / "_quarantine" / "grax").rglob("data-*") if not p.name.endswith(".reason.json")
    ]
    assert copy.read_bytes() == content
    assert "copy failed" not in note["reason"]


def test_a_batch_sensor_started_after_a_cli_run_runs_only_the_batches_that_changed_since(tmp_path, spark):
    """The batch sensor's first tick (no cursor) after `lake-assets run` processed the landing
    runs no batch the lake processed with the files it holds now (it folded them all again);
    a batch landing later runs, as does a file landing late in a processed open batch."""
    from lake_assets_tests import grax_lake

    landing, lake = tmp_path / "landing", tmp_path / "lake"
    grax_lake.land(landing, "000000001", "data-1.parquet", [grax_lake.version("a", 1, "01", name="A")])
    grax_lake.land(landing, "000000002", "data-1.parquet", [grax_lake.version("b", 2, "01", name="B")])
    config, instance = grax_lake.config_for(landing, lake), dg.DagsterInstance.ephemeral()
    grax_lake.cli(config, instance)

    cursor, runs = grax_lake.sensor_tick(config, instance, None)
    assert runs == 0
    # a deployment's instance that the CLI's run did not register them in: the UI can run them
    fresh = dg.DagsterInstance.ephemeral()
    assert grax_lake.sensor_tick(config, fresh, None)[1] == 0
    assert fresh.get_dynamic_partitions(batch_partitions_name("grax", grax_lake.TABLE)) == [
        "000000001",
        "000000002",
    ]
    grax_lake.land(landing, "000000003", "data-1.parquet", [grax_lake.version("c", 3, "01", name="C")])
    cursor, runs = grax_lake.sensor_tick(config, instance, cursor)
    assert runs == 1
    assert {row["Id"] for row in grax_lake.rows(lake, "current")} == {"a", "b", "c"}

    # a file landing late in the open batch, seen by a sensor whose cursor was reset
    grax_lake.land(landing, "000000003", "data-2.parquet", [grax_lake.version("d", 4, "01", name="D")])
    _, runs = grax_lake.sensor_tick(config, instance, None)
    assert runs == 1
    assert {row["Id"] for row in grax_lake.rows(lake, "current")} == {"a", "b", "c", "d"}


def test_a_file_landing_in_a_batch_before_the_open_one_is_found_by_the_daily_look(
    tmp_path, spark, monkeypatch, capfd
):
    """The scans list the open (greatest) batch only: a file that lands in an earlier batch
    after it was processed is found by the table's look at its older batches (once a day, one
    table a tick), as a first scan would find it, and that batch alone runs."""
    from lake_assets.orchestration import sensors
    from lake_assets_tests import grax_lake

    landing, lake = tmp_path / "landing", tmp_path / "lake"
    for batch, key in (("000000001", "a"), ("000000002", "b"), ("000000003", "c")):
        grax_lake.land(landing, batch, "data-1.parquet", [grax_lake.version(key, 1, "01", name=key.upper())])
    config, instance = grax_lake.config_for(landing, lake), dg.DagsterInstance.ephemeral()
    cursor, runs = grax_lake.sensor_tick(config, instance, None)
    assert runs == 1
    grax_lake.land(landing, "000000001", "data-2.parquet", [grax_lake.version("a", 5, "02", name="A2")])
    cursor, runs = grax_lake.sensor_tick(config, instance, cursor)
    assert runs == 0  # looked at by the first scan, moments ago

    monkeypatch.setattr(sensors, "OLD_PARTITIONS_EVERY_SECONDS", 0)
    capfd.readouterr()
    cursor, runs = grax_lake.sensor_tick(config, instance, cursor)
    assert runs == 1
    told = "1 batch(es) before the open one changed since the lake processed them: 000000001;"
    assert told in capfd.readouterr().err
    assert {row["Id"]: row["Name"] for row in grax_lake.rows(lake, "current")} == {
        "a": "A2",
        "b": "B",
        "c": "C",
    }
    assert grax_lake.sensor_tick(config, instance, cursor)[1] == 0  # processed with it now
