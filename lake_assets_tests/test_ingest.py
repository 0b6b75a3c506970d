"""The shared batch reader (`ingest.read_batch`) against hostile landed files: files damaged in
several ways in one batch, rows lost on the way, text that is not UTF-8, file names quarantine
would confuse and names Hadoop paths dislike."""

import io
import json
import os
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from lake_assets.config import CollectionConfig, FeedConfig, LakeConfig, S3Config
from lake_assets.demo.flow_sample import build_uuid, clock_of
from lake_assets.feeds.flow_journal import FlowJournalFormat
from lake_assets.feeds.unit_cdc import UnitCdcFormat
from lake_assets.ingest import _BatchFiles, read_batch
from lake_assets.runner import run_feeds
from lake_assets.spark_errors import SPARK_ERRORS, is_request_failure
from lake_assets.storage import Entry, Storage, data_files
from lake_assets_tests.test_flow_feed import HOUR as FLOW_HOUR
from lake_assets_tests.test_flow_feed import PRODUCER, doc_line, write_fragment
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, hour_dir, write_events

FMT = UnitCdcFormat()
UNIT_HOUR = "2024-03-01-00"


def _read(spark, landing: Path, fmt=FMT):
    storage = Storage()
    return read_batch(
        spark,
        storage,
        fmt,
        "accounts",
        {UNIT_HOUR: data_files(storage, f"file://{hour_dir(landing, 'accounts', 0)}")},
    )


def _ids(batch) -> list:
    return sorted(r["id"] for r in batch.events.select("id").collect())


def _names(batch) -> dict[str, str]:
    return {q.uri.rsplit("/", 1)[-1]: q.reason for q in batch.quarantined}


def damage_data_pages(path: Path, column: int = 1) -> None:
    """Overwrite one column chunk's pages with garbage, leaving the footer intact: the file vets
    (schema, row count) but no reader can decode its data."""
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + chunk.total_compressed_size] = b"\xab" * chunk.total_compressed_size
    path.write_bytes(bytes(data))


def land_good_file(landing: Path) -> None:
    """`part-0.parquet` in hour 0: one insert of the key "a"."""
    write_events(
        landing,
        "accounts",
        0,
        "part-0.parquet",
        [event("a", "I", 1, at(0, 1), name="a", balance=1)],
        ACCOUNT_SCHEMA,
    )


def land_damaged_file(landing: Path) -> None:
    """`part-damaged.parquet` in hour 0: a footer declaring 40 rows of the account schema, data
    pages no reader can decode."""
    damaged = write_events(
        landing,
        "accounts",
        0,
        "part-damaged.parquet",
        [event(f"d{i}", "I", 10 + i, at(0, 3), name=f"d{i}", balance=i) for i in range(40)],
        ACCOUNT_SCHEMA,
    )
    damage_data_pages(damaged)


def _run(landing: Path, lake: Path, instance=None, **feed):
    config = LakeConfig(
        lake=f"file://{lake}",
        feeds=(FeedConfig(name="unit", format="unit_cdc", landing=f"file://{landing}", **feed),),
    )
    instance = instance or dg.DagsterInstance.ephemeral()
    run_feeds(config, instance=instance, say=lambda _: None)
    return instance


def _changes_metadata(instance, feed: str = "unit", table: str = "accounts") -> dict:
    event_ = instance.get_latest_materialization_event(dg.AssetKey([feed, table, "changes"]))
    return {k: getattr(v, "value", v) for k, v in event_.asset_materialization.metadata.items()}


def test_a_range_run_lists_on_each_hour_only_the_files_set_aside_there(spark, tmp_path):
    """A run of three hours with a damaged file in the first and the last, and a stray: each
    hour's materialisation lists its own file (Dagster copied one list onto every hour of a
    range), its figures say they are the run's, and the landing check names the stray."""
    landing, lake = tmp_path / "unit", tmp_path / "lake"
    damaged = {}
    for hour in (0, 1, 2):
        write_events(landing, "accounts", hour, "part-good.parquet", [event(f"k{hour}", "I", 1, at(hour))])
        if hour != 1:
            damaged[hour] = hour_dir(landing, "accounts", hour) / "damaged.parquet"
            damaged[hour].write_bytes(b"PAR1 not a footer PAR1")
    stray = landing / "accounts" / "misc" / "x.parquet"
    stray.parent.mkdir()
    stray.write_bytes(b"PAR1")

    instance = _run(landing, lake)

    changes = dg.AssetKey(["unit", "accounts", "changes"])
    listed, shared = {}, set()
    for hour in (0, 1, 2):
        partition = f"2024-03-01-{hour:02d}"
        [record] = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=changes, asset_partitions=[partition]), limit=1
        ).records
        metadata = {k: getattr(v, "value", v) for k, v in record.asset_materialization.metadata.items()}
        listed[hour] = [q["file"] for q in metadata.get("quarantined", [])]  # hour 1: none to list
        shared.add((metadata["run_partitions"], metadata["files_quarantined"], metadata["files_read"]))
    assert listed == {0: [f"file://{damaged[0]}"], 1: [], 2: [f"file://{damaged[2]}"]}
    [(run_partitions, files_quarantined, files_read)] = shared
    assert run_partitions.startswith("2024-03-01-00 to 2024-03-01-02: 3 partitions in one run")
    assert files_quarantined == 3 and files_read == 3
    check_key = dg.AssetCheckKey(changes, "landing_complete")
    check = instance.event_log_storage.get_latest_asset_check_execution_by_key([check_key])[check_key]
    outside = check.event.dagster_event.event_specific_data.metadata["quarantined_outside_the_partitions"]
    assert [q["file"] for q in outside.value] == [f"file://{stray}"]


def _notes(lake: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((lake / "_quarantine").rglob("*.reason.json"))]


def _lake_rows(lake: Path, layer: str, feed: str, table: str) -> list[dict]:
    con = duckdb.connect()
    cur = con.execute(
        f"SELECT * FROM read_parquet('{lake}/{layer}/{feed}/{table}/**/*.parquet', union_by_name = true, hive_partitioning = true)"
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


# --- a file set aside once is never read again ----------------------------------------------------


def test_in_a_clash_the_files_holding_more_rows_are_kept_however_many_files_disagree(spark, tmp_path):
    """Two files of a row each give `balance` a struct, one file of ten rows a number: the
    schema with the rows is kept and the two files are set aside. Counted by files (empty ones,
    before a column without values stopped clashing), the two outvoted it and the ten rows
    were set aside."""
    landing = tmp_path / "unit"
    rows = [event(f"k{i}", "I", i, at(0, i), name="n", balance=i) for i in range(10)]
    write_events(landing, "accounts", 0, "part-rows.parquet", rows, ACCOUNT_SCHEMA)
    struct_schema = ACCOUNT_SCHEMA.set(2, pa.field("balance", pa.struct([("cents", pa.int64())])))
    for name in ("part-struct-0.parquet", "part-struct-1.parquet"):
        write_events(
            landing, "accounts", 0, name, [event(name, "I", 1, at(0, 1), balance={"cents": 1})], struct_schema
        )

    batch = _read(spark, landing)

    assert sorted(_names(batch)) == ["part-struct-0.parquet", "part-struct-1.parquet"]
    assert all("schema does not fit the batch" in reason for reason in _names(batch).values())
    assert _ids(batch) == sorted(f"k{i}" for i in range(10))


def test_files_whose_clashing_column_holds_no_value_are_read_without_it(spark, tmp_path):
    """Empty files, and a file whose `balance` is a struct NULL in every row, beside files
    holding numbers: nothing of theirs can clash, so none is set aside, and the row keeps a
    NULL balance. A struct holding a NULL field is a value, and still clashes."""
    landing = tmp_path / "unit"
    rows = [event(f"k{i}", "I", i, at(0, i), name="n", balance=i) for i in range(10)]
    write_events(landing, "accounts", 0, "part-rows.parquet", rows, ACCOUNT_SCHEMA)
    struct_schema = ACCOUNT_SCHEMA.set(2, pa.field("balance", pa.struct([("cents", pa.int64())])))
    write_events(landing, "accounts", 0, "part-empty.parquet", [], struct_schema)
    write_events(
        landing,
        "accounts",
        0,
        "part-null.parquet",
        [event("null", "I", 1, at(0, 1), balance=None)],
        struct_schema,
    )
    write_events(
        landing,
        "accounts",
        0,
        "part-null-field.parquet",
        [event("field", "I", 1, at(0, 1), balance={"cents": None})],
        struct_schema.set(1, pa.field("name", pa.int64())),
    )

    batch = _read(spark, landing)

    assert sorted(_names(batch)) == ["part-null-field.parquet"]
    assert _ids(batch) == sorted([*(f"k{i}" for i in range(10)), "null"])
    balances = {r["id"]: r["balance"] for r in batch.events.select("id", "balance").collect()}
    assert balances["null"] is None and balances["k3"] == 3
    batch.events.unpersist()


def test_files_holding_values_are_kept_beside_larger_files_whose_clashing_column_holds_none(spark, tmp_path):
    """The files whose `balance` is a struct NULL in every row hold more rows, so their group is
    taken first; the smaller file holding numbers clashed with it and was set aside. The empty
    column gives way instead, and the numbers are kept."""
    landing = tmp_path / "unit"
    struct_schema = ACCOUNT_SCHEMA.set(2, pa.field("balance", pa.struct([("cents", pa.int64())])))
    empty = [event(f"e{i}", "I", i, at(0, i), name="n", balance=None) for i in range(10)]
    write_events(landing, "accounts", 0, "part-empty-balance.parquet", empty, struct_schema)
    rows = [event(f"k{i}", "I", 20 + i, at(0, 20 + i), name="n", balance=i) for i in range(2)]
    write_events(landing, "accounts", 0, "part-rows.parquet", rows, ACCOUNT_SCHEMA)

    batch = _read(spark, landing)

    assert _names(batch) == {}
    balances = {r["id"]: r["balance"] for r in batch.events.select("id", "balance").collect()}
    assert balances == {**{f"e{i}": None for i in range(10)}, "k0": 0, "k1": 1}
    batch.events.unpersist()


def test_a_file_spark_cannot_open_in_a_clashing_group_keeps_its_own_reason(spark, tmp_path):
    """Two files give `balance` a struct, where the file holding the rows has a number; Spark
    cannot open one of the two (its name). It was set aside, then the group's clash set aside
    every file of the group again, and the first failed on a KeyError: the table stopped on
    every run. Each is set aside once, with its own reason."""
    landing = tmp_path / "unit"
    rows = [event(f"k{i}", "I", i, at(0, i), name="n", balance=i) for i in range(10)]
    write_events(landing, "accounts", 0, "part-rows.parquet", rows, ACCOUNT_SCHEMA)
    struct_schema = ACCOUNT_SCHEMA.set(2, pa.field("balance", pa.struct([("cents", pa.int64())])))
    for name in ("part-clash.parquet", "x[1]:y.parquet"):
        write_events(
            landing, "accounts", 0, name, [event(name, "I", 1, at(0, 1), balance={"cents": 1})], struct_schema
        )

    batch = _read(spark, landing)

    reasons = _names(batch)
    assert sorted(reasons) == ["part-clash.parquet", "x[1]:y.parquet"]
    assert "schema does not fit the batch" in reasons["part-clash.parquet"]
    assert reasons["x[1]:y.parquet"].startswith("Spark could not open the file (")
    assert _ids(batch) == sorted(f"k{i}" for i in range(10))
    batch.events.unpersist()


def test_a_damaged_file_and_a_clashing_file_in_one_batch_are_each_set_aside_once(spark, tmp_path):
    """The clash is found when the groups are unioned, the damage only when the data is read;
    the batch is read again without the damaged file, and the clashing file stays set aside."""
    landing = tmp_path / "unit"
    land_good_file(landing)
    write_events(
        landing,
        "accounts",
        0,
        "part-1.parquet",
        [event("b", "I", 2, at(0, 2), name="b", balance=2)] * 2,
        ACCOUNT_SCHEMA,
    )
    land_damaged_file(landing)
    write_events(
        landing,
        "accounts",
        0,
        "part-clash.parquet",
        [event("c", "I", 3, at(0, 4), name="c", balance={"cents": 1})],
    )

    batch = _read(spark, landing)

    reasons = _names(batch)
    assert len(batch.quarantined) == 2 and set(reasons) == {"part-damaged.parquet", "part-clash.parquet"}
    assert "Spark could not read the file's data" in reasons["part-damaged.parquet"]
    # the reason is the JVM's, naming the file and its cause: the same on every run and on Spark
    # Connect, never py4j's "An error occurred while calling o1098.save"
    assert "An error occurred while calling" not in reasons["part-damaged.parquet"]
    assert "part-damaged.parquet" in reasons["part-damaged.parquet"].partition("(")[2]
    assert (
        "schema does not fit the batch" in reasons["part-clash.parquet"]
        and "balance" in reasons["part-clash.parquet"]
    )
    assert {q.rows for q in batch.quarantined} == {40, 1}
    assert _ids(batch) == ["a", "b"]
    assert (batch.files_listed, batch.files_read, batch.rows_in, batch.events_out, batch.duplicates) == (
        4,
        2,
        3,
        2,
        1,
    )
    assert batch.reconciles


def test_a_damaged_file_whose_footer_outweighs_a_clash_does_not_keep_the_good_files_aside(spark, tmp_path):
    """The damaged file's footer declares 40 rows of one schema, two good files hold three rows
    of another: the clash first keeps the damaged file's schema. Once the read finds it damaged
    its rows no longer count, and the two good files are read, on every run."""
    landing = tmp_path / "unit"
    land_damaged_file(landing)
    write_events(
        landing, "accounts", 0, "part-a.parquet", [event("a", "I", 1, at(0, 1), balance={"cents": 1})]
    )
    write_events(
        landing,
        "accounts",
        0,
        "part-b.parquet",
        [
            event("b", "I", 2, at(0, 2), balance={"cents": 2}),
            event("c", "I", 3, at(0, 2), balance={"cents": 3}),
        ],
    )

    batch = _read(spark, landing)

    assert list(_names(batch)) == ["part-damaged.parquet"]
    assert "Spark could not read the file's data" in _names(batch)["part-damaged.parquet"]
    assert _ids(batch) == ["a", "b", "c"]
    assert (batch.files_read, batch.rows_in) == (2, 3) and batch.reconciles
    batch.events.unpersist()


def test_a_damaged_file_with_bad_rows_beside_it_is_set_aside_once(spark, tmp_path):
    """Damage, a schema clash and a bad row in three files of one batch: three reasons, one each."""
    landing = tmp_path / "unit"
    land_good_file(landing)
    write_events(
        landing,
        "accounts",
        0,
        "part-bad-op.parquet",
        [event("z", "UPSERT", 2, at(0, 2), name="z", balance=2)],
        ACCOUNT_SCHEMA,
    )
    land_damaged_file(landing)
    write_events(
        landing,
        "accounts",
        0,
        "part-clash.parquet",
        [event("c", "I", 3, at(0, 4), name="c", balance={"cents": 1})],
    )

    batch = _read(spark, landing)

    assert sorted(_names(batch)) == ["part-bad-op.parquet", "part-clash.parquet", "part-damaged.parquet"]
    assert (
        len(batch.quarantined) == 3
        and "unknown cdc_operation_type UPSERT" in _names(batch)["part-bad-op.parquet"]
    )
    assert _ids(batch) == ["a"] and batch.files_read == 1 and batch.rows_in == 1 and batch.reconciles


# --- the row equation is checked, not assumed -----------------------------------------------------


class _LosesARow(UnitCdcFormat):
    """A feed with a bug: its normalisation drops the rows of one key."""

    def normalise(self, raw):
        return super().normalise(raw).where(F.col("id") != "lost")


def test_a_row_lost_before_the_collapse_fails_the_reconciliation(spark, tmp_path):
    landing = tmp_path / "unit"
    write_events(
        landing,
        "accounts",
        0,
        "part-0.parquet",
        [
            event("a", "I", 1, at(0, 1), name="a", balance=1),
            event("a", "I", 1, at(0, 1), name="a", balance=1),  # a true duplicate
            event("lost", "I", 2, at(0, 2), name="lost", balance=2),
            event("b", "I", 3, at(0, 3), name="b", balance=3),
        ],
        ACCOUNT_SCHEMA,
    )

    honest = _read(spark, landing)
    assert (honest.rows_in, honest.events_out, honest.duplicates) == (4, 3, 1) and honest.reconciles

    lossy = _read(spark, landing, _LosesARow())
    assert (lossy.rows_in, lossy.events_out) == (4, 2)
    assert lossy.duplicates == 1  # counted where the collapse drops rows, not inferred from the others
    assert not lossy.reconciles


class _FlowLosesARow(FlowJournalFormat):
    def configured(self, feed):
        return _FlowLosesARow(tuple(feed.collections or ()))

    def _events(self, parsed, collection):
        return super()._events(parsed, collection).where(F.col("id") != 2)


def _flow_batch(spark, fmt: FlowJournalFormat, landing: Path, table: str, hours: list[str]):
    storage = Storage()
    files = fmt.partitions_files(storage, f"file://{landing}", table, fmt.read_partitions(hours))
    return fmt.read_batch(spark, storage, f"file://{landing}", table, files, hours)


def test_a_flow_document_lost_before_the_collapse_fails_the_reconciliation(spark, tmp_path):
    landing = tmp_path / "landing"
    content = doc_line(1) + doc_line(2) + doc_line(3)
    write_fragment(landing / "acmeCo" / "customers" / "pivot=00", 0, content)
    collections = (CollectionConfig(name="acmeCo/customers", key=("/id",)),)

    honest = _flow_batch(
        spark, FlowJournalFormat(collections), landing, "acmeco_customers", ["2024-06-01-10"]
    )
    assert (honest.rows_in, honest.events_out, honest.duplicates) == (3, 3, 0) and honest.reconciles

    lossy = _flow_batch(spark, _FlowLosesARow(collections), landing, "acmeco_customers", ["2024-06-01-10"])
    assert (lossy.rows_in, lossy.events_out, lossy.duplicates) == (3, 2, 0)
    assert not lossy.reconciles


# --- text that is not UTF-8 ------------------------------------------------------------------------


def _text(*values) -> pa.Array:
    """A Parquet STRING column holding exactly these bytes, valid UTF-8 or not."""
    return pa.array(values, pa.binary()).view(pa.string())


def _assert_every_engine_reads(lake: Path, feed: str, table: str) -> dict[str, list[dict]]:
    """Each layer as DuckDB and pyarrow read it (both refuse a table with invalid text)."""
    import pyarrow.dataset as pads

    layers = {}
    for layer in ("changes", "current", "history"):
        layers[layer] = _lake_rows(lake, layer, feed, table)
        dataset = pads.dataset(str(lake / layer / feed / table), format="parquet", partitioning="hive")
        arrow = dataset.to_table()
        arrow.validate(full=True)
        assert arrow.num_rows == len(layers[layer]) > 0
    return layers


def test_text_that_is_not_utf8_is_repaired_and_every_engine_reads_the_lake(spark, tmp_path):
    landing, lake = tmp_path / "unit", tmp_path / "lake"
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("name", pa.string()),
            ("tags", pa.list_(pa.string())),
            ("address", pa.struct([("city", pa.string()), ("zip", pa.int32())])),
            ("attrs", pa.map_(pa.string(), pa.string())),
            ("cdc_operation_type", pa.string()),
            ("cdc_change_seq", pa.int64()),
            ("cdc_commit_timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )
    tags = pa.ListArray.from_arrays(pa.array([0, 2, 3], pa.int32()), _text(b"ok", b"\xff", b"fine"))
    address = pa.StructArray.from_arrays(
        [_text(b"Z\xfcrich", b"Bern"), pa.array([8000, 3000], pa.int32())], names=["city", "zip"]
    )
    attrs = pa.MapArray.from_arrays(
        pa.array([0, 1, 2], pa.int32()), _text(b"k", b"k\xfe"), _text(b"v\xfe", b"v")
    )
    folder = hour_dir(landing, "accounts", 0)
    text_file = folder / "part-text.parquet"
    pq.write_table(
        pa.table(
            {
                "id": _text(b"a", b"b"),
                "name": _text(b"caf\xc3", b"plain"),
                "tags": tags,
                "address": address,
                "attrs": attrs,
                "cdc_operation_type": ["I", "I"],
                "cdc_change_seq": [1, 2],
                "cdc_commit_timestamp": pa.array([at(0, 1), at(0, 2)], pa.timestamp("us", tz="UTC")),
            },
            schema=schema,
        ),
        text_file,
    )
    bad_key = folder / "part-bad-key.parquet"
    pq.write_table(
        pa.table(
            {
                "id": _text(b"k\xff"),
                "name": ["x"],
                "cdc_operation_type": ["I"],
                "cdc_change_seq": [3],
                "cdc_commit_timestamp": pa.array([at(0, 3)], pa.timestamp("us", tz="UTC")),
            }
        ),
        bad_key,
    )
    write_events(landing, "accounts", 0, "part-good.parquet", [event("c", "I", 4, at(0, 4), name="ç")])

    instance = _run(landing, lake)

    layers = _assert_every_engine_reads(lake, "unit", "accounts")
    current = {r["id"]: r for r in layers["current"]}
    assert set(current) == {"a", "b", "c"} and len(layers["changes"]) == 3
    assert current["a"]["name"] == "caf\ufffd" and current["a"]["tags"] == ["ok", "\ufffd"]
    assert current["a"]["address"] == {"city": "Z\ufffdrich", "zip": 8000} and current["a"]["attrs"] == {
        "k": "v\ufffd"
    }
    assert current["b"]["attrs"] == {"k\ufffd": "v"}
    assert (
        current["b"]["name"] == "plain" and current["b"]["tags"] == ["fine"] and current["c"]["name"] == "ç"
    )
    [note] = _notes(lake)
    assert (
        note["file"] == f"file://{bad_key}"
        and "key column 'id' holds text that is not valid UTF-8" in note["reason"]
    )
    metadata = _changes_metadata(instance)
    assert metadata["text_values_repaired"] == 5
    assert metadata["text_repaired"] == [{"file": f"file://{text_file}", "values": 5}]
    assert metadata["reconciled"] is True and metadata["rows_in"] == 3 and metadata["files_quarantined"] == 1


def test_bytes_that_become_text_in_one_batch_are_checked_and_counted_like_text(spark, tmp_path):
    """Files storing `id` or `name` as bytes beside files storing them as text: the batch's
    union makes them text, then the key check and the repair count see them as delivered (a
    repair on the way would have merged the keys b'\\xff' and b'\\xfe' into one key U+FFFD
    without a word, and counted no repair)."""
    landing, lake = tmp_path / "unit", tmp_path / "lake"
    folder = hour_dir(landing, "accounts", 0)

    def write(name, ids, names, seq):
        pq.write_table(
            pa.table(
                {
                    "id": pa.array(ids, pa.binary() if isinstance(ids[0], bytes) else pa.string()),
                    "name": pa.array(names, pa.binary() if isinstance(names[0], bytes) else pa.string()),
                    "cdc_operation_type": ["I"] * len(ids),
                    "cdc_change_seq": list(range(seq, seq + len(ids))),
                    "cdc_commit_timestamp": pa.array([at(0, 1)] * len(ids), pa.timestamp("us", tz="UTC")),
                }
            ),
            folder / name,
        )
        return f"file://{folder / name}"

    bytes_keys = write("part-bytes-keys.parquet", [b"\xff", b"\xfe"], ["x", "y"], 1)
    bytes_names = write("part-bytes-names.parquet", ["a"], [b"M\xfcller"], 3)
    write("part-text.parquet", ["b"], ["plain"], 4)

    instance = _run(landing, lake)

    layers = _assert_every_engine_reads(lake, "unit", "accounts")
    assert {r["id"]: r["name"] for r in layers["current"]} == {"a": "M\ufffdller", "b": "plain"}
    [note] = _notes(lake)
    assert (
        note["file"] == bytes_keys and "key column 'id' holds text that is not valid UTF-8" in note["reason"]
    )
    metadata = _changes_metadata(instance)
    assert metadata["text_repaired"] == [{"file": bytes_names, "values": 1}]


def test_bytes_landing_where_the_table_holds_text_are_checked_and_counted_like_text(spark, tmp_path):
    """The table holds `id` and `name` as text; a later hour's files hold them as bytes only.
    The batch alone stays bytes (no check of text applies to bytes), and the fold made them
    text: a key not UTF-8 reached `current` as text other engines refuse. They are text, and
    checked, from the batch on."""
    landing, lake = tmp_path / "unit", tmp_path / "lake"
    write_events(landing, "accounts", 0, "part-text.parquet", [event("a", "I", 1, at(0, 1), name="plain")])
    instance = _run(landing, lake)
    folder = hour_dir(landing, "accounts", 1)

    def write(name, ids, names):
        pq.write_table(
            pa.table(
                {
                    "id": pa.array(ids, pa.binary()),
                    "name": pa.array(names, pa.binary()),
                    "cdc_operation_type": ["I"] * len(ids),
                    "cdc_change_seq": [2] * len(ids),
                    "cdc_commit_timestamp": pa.array([at(1, 1)] * len(ids), pa.timestamp("us", tz="UTC")),
                }
            ),
            folder / name,
        )
        return f"file://{folder / name}"

    bad_keys = write("part-bytes-keys.parquet", [b"\xff", b"\xfe"], [b"x", b"y"])
    bad_names = write("part-bytes-names.parquet", [b"b"], [b"M\xfcller"])

    _run(landing, lake, instance)

    layers = _assert_every_engine_reads(lake, "unit", "accounts")
    assert {r["id"]: r["name"] for r in layers["current"]} == {"a": "plain", "b": "M\ufffdller"}
    [note] = _notes(lake)
    assert note["file"] == bad_keys and "key column 'id' holds text that is not valid UTF-8" in note["reason"]
    assert _changes_metadata(instance)["text_repaired"] == [{"file": bad_names, "values": 1}]


def test_key_types_that_clash_among_themselves_where_the_table_holds_text_set_the_fewer_aside(
    spark, tmp_path
):
    """The table holds `id` as text, which absorbs a long key and a double key alike; but the
    batch's own union of the two must widen them into one key type, and a long beside a double
    cannot be without changing a value. That failed the table's step on every run; the group
    holding fewer rows is set aside with the clash, and the rest is read."""
    landing, lake = tmp_path / "unit", tmp_path / "lake"
    write_events(landing, "accounts", 0, "part-text.parquet", [event("a", "I", 1, at(0, 1), name="plain")])
    instance = _run(landing, lake)
    folder = hour_dir(landing, "accounts", 1)

    def write(name, ids):
        pq.write_table(
            pa.table(
                {
                    "id": ids,
                    "cdc_operation_type": ["I"] * len(ids),
                    "cdc_change_seq": [2] * len(ids),
                    "cdc_commit_timestamp": pa.array([at(1, 1)] * len(ids), pa.timestamp("us", tz="UTC")),
                }
            ),
            folder / name,
        )
        return f"file://{folder / name}"

    write("part-long.parquet", pa.array([11, 12], pa.int64()))
    doubles = write("part-double.parquet", pa.array([13.5], pa.float64()))
    _run(landing, lake, instance)

    [note] = _notes(lake)
    assert note["file"] == doubles and "column 'id'" in note["reason"] and "double" in note["reason"]
    assert sorted(r["id"] for r in _lake_rows(lake, "current", "unit", "accounts")) == ["11", "12", "a"]


def _flow_line(n, raw_fields: bytes) -> bytes:
    """A document line whose fields are given as raw JSON bytes (which may not be UTF-8)."""
    meta = json.dumps({"uuid": build_uuid(clock_of(FLOW_HOUR) + 16 * n, 0, PRODUCER), "op": "c"}).encode()
    return b"{" + raw_fields + b', "_meta": ' + meta + b"}\n"


def test_flow_text_that_is_not_utf8_is_repaired_and_every_engine_reads_the_lake(spark, tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    content = (
        _flow_line(1, b'"id": 1, "name": "caf\xc3"')
        + _flow_line(2, b'"id": 2, "name": "fine", "notes": {"t": "\\ud800x", "ok": "\\ud83d\\ude00"}')
        + doc_line(3)
    )
    first = write_fragment(journal, 0, content)
    garbled_key = write_fragment(journal, len(content), _flow_line(4, b'"id": "k\xff", "name": "x"'))
    config = LakeConfig(
        lake=f"file://{lake}",
        feeds=(
            FeedConfig(
                name="flow",
                format="flow_journal",
                landing=f"file://{landing}",
                collections=(CollectionConfig(name="acmeCo/customers", key=("/id",)),),
            ),
        ),
    )
    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config, instance=instance, say=lambda _: None)

    layers = _assert_every_engine_reads(lake, "flow", "acmeco_customers")
    current = {r["id"]: r for r in layers["current"]}
    assert set(current) == {1, 2, 3}
    assert current[1]["name"] == "caf\ufffd" and current[3]["name"] == "c3"
    assert json.loads(current[2]["notes"]) == {"t": "\ufffdx", "ok": "\U0001f600"}
    [note] = _notes(lake)
    assert (
        note["file"] == f"file://{garbled_key}"
        and "key ['/id'] holds text that is not valid UTF-8" in note["reason"]
    )
    assert "offset" in note["reason"]
    metadata = _changes_metadata(instance, "flow", "acmeco_customers")
    assert metadata["text_values_repaired"] == 2 and metadata["reconciled"] is True
    assert metadata["text_repaired"] == [{"file": f"file://{first}", "values": 2}]


# --- every quarantined file keeps its own copy and reason ------------------------------------------


def test_files_whose_names_look_alike_are_each_quarantined_with_their_own_copy_and_reason(spark, tmp_path):
    landing, lake = tmp_path / "unit", tmp_path / "lake"
    write_events(
        landing,
        "accounts",
        2,
        "part-good.parquet",
        [event("a", "I", 1, at(2), name="ok", balance=1)],
        ACCOUNT_SCHEMA,
    )
    folder = hour_dir(landing, "accounts", 2)
    bare = landing / "accounts" / "year=2024/month=3/day=1/hour=2"  # the same hour, spelled without zeros
    bare.mkdir(parents=True)
    bad = [
        folder / "bad x",
        folder / "bad_x",
        folder / "bad\nx",
        folder / "part-corrupt.parquet",
        bare / "part-corrupt.parquet",
    ]
    for n, path in enumerate(bad):
        path.write_bytes(b"not parquet %d" % n)

    instance = _run(landing, lake)
    _run(landing, lake, instance)  # the same partition again: the same entries, none added

    notes = _notes(lake)
    assert sorted(n["file"] for n in notes) == sorted(f"file://{p}" for p in bad)
    assert all(n["reason"].startswith("not a readable Parquet file") for n in notes)
    for note_path in (lake / "_quarantine").rglob("*.reason.json"):
        note = json.loads(note_path.read_text())
        copy = Path(str(note_path)[: -len(".reason.json")])
        assert copy.read_bytes() == Path(note["file"][len("file://") :]).read_bytes()
    metadata = _changes_metadata(instance)
    assert (
        metadata["files_quarantined"] == 5 and metadata["files_read"] == 1 and metadata["reconciled"] is True
    )
    assert [r["id"] for r in _lake_rows(lake, "current", "unit", "accounts")] == ["a"]


# --- names Hadoop paths dislike --------------------------------------------------------------------

ODD_NAMES = [
    "part:1.parquet",
    "part[1].parquet",
    "part1.parquet",
    "part{2}.parquet",
    "part?3.parquet",
    "part*4.parquet",
    "part%41.parquet",
    "part#5.parquet",
    "part 6.parquet",
    "part\\7.parquet",
    "a:b:c",
]


def test_files_whose_names_hold_path_characters_are_read(spark, tmp_path):
    """`:` trips Hadoop's local file system, `[]{}?*\\` are glob patterns to Spark (`part[1]`
    would read `part1`), `%#` and spaces are escaped in URIs: each file is read as itself."""
    landing, lake = tmp_path / "unit", tmp_path / "lake"
    for seq, name in enumerate(ODD_NAMES):
        write_events(
            landing,
            "accounts",
            3,
            name,
            [event(name, "I", seq, at(3, seq), name="n", balance=seq)],
            ACCOUNT_SCHEMA,
        )
    # Hadoop cannot glob a path holding `:` at all: the file is set aside, naming the cause.
    unreadable = write_events(
        landing, "accounts", 3, "x[1]:y.parquet", [event("x", "I", 99, at(3, 50))], ACCOUNT_SCHEMA
    )

    instance = _run(landing, lake)

    [note] = _notes(lake)
    assert note["file"] == f"file://{unreadable}" and note["reason"].startswith(
        "Spark could not open the file ("
    )
    assert "Relative path in absolute URI" in note["reason"] and note["rows"] == 1
    changes = _lake_rows(lake, "changes", "unit", "accounts")
    folder = hour_dir(landing, "accounts", 3)
    assert sorted((r["id"], r["_source_file"]) for r in changes) == sorted(
        (n, f"file://{folder}/{n}") for n in ODD_NAMES
    )
    assert sorted(r["id"] for r in _lake_rows(lake, "current", "unit", "accounts")) == sorted(ODD_NAMES)
    metadata = _changes_metadata(instance)
    assert (
        metadata["files_read"] == len(ODD_NAMES)
        and metadata["rows_in"] == len(ODD_NAMES)
        and metadata["reconciled"] is True
    )
    assert metadata["files_quarantined"] == 1


def test_files_whose_names_hold_path_characters_are_read_from_s3(spark, moto_server, s3_bucket):
    client = moto_server.client("s3")
    names = ["a:b.parquet", "b[1].parquet", "b1.parquet", "c{2}.parquet", "d?.parquet", "e #%.parquet"]
    prefix = "unit/accounts/year=2024/month=03/day=01/hour=00"
    for seq, name in enumerate(names):
        buffer = io.BytesIO()
        pq.write_table(
            pa.Table.from_pylist(
                [event(name, "I", seq, at(0, seq), name="n", balance=seq)], schema=ACCOUNT_SCHEMA
            ),
            buffer,
        )
        client.put_object(Bucket=s3_bucket, Key=f"{prefix}/{name}", Body=buffer.getvalue())
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    files = data_files(storage, f"s3a://{s3_bucket}/{prefix}")
    assert sorted(f.name for f in files) == sorted(names)

    batch = read_batch(spark, storage, FMT, "accounts", {UNIT_HOUR: files})

    assert batch.quarantined == [] and batch.reconciles
    assert sorted(
        (r["id"], r["_source_file"]) for r in batch.events.select("id", "_source_file").collect()
    ) == sorted((f.name, f.uri) for f in files)
    batch.events.unpersist()


def test_a_read_that_spark_s_credentials_fail_sets_no_file_aside(spark, moto_server, s3_bucket):
    """The files are fine and the lake's own client reads them; Spark's connector is refused
    for want of credentials. That is about the request, not the files: the read fails (the
    step, to be retried), and no file is quarantined as one Spark could not open."""
    client = moto_server.client("s3")
    prefix = "unit/accounts/year=2024/month=03/day=01/hour=00"
    for seq in range(3):
        buffer = io.BytesIO()
        pq.write_table(
            pa.Table.from_pylist(
                [event(f"k{seq}", "I", seq, at(0, seq), name="n", balance=seq)], schema=ACCOUNT_SCHEMA
            ),
            buffer,
        )
        client.put_object(Bucket=s3_bucket, Key=f"{prefix}/part-{seq}.parquet", Body=buffer.getvalue())
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    files = data_files(storage, f"s3a://{s3_bucket}/{prefix}")
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    provider = "fs.s3a.aws.credentials.provider"
    before = hadoop.get(provider)
    # a session-token provider without a token: the connector has no credentials at all
    hadoop.set(provider, "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")
    try:
        with pytest.raises(SPARK_ERRORS) as refused:
            read_batch(spark, storage, FMT, "accounts", {UNIT_HOUR: files})
        assert is_request_failure(refused.value)
    finally:
        hadoop.set(provider, before)
    batch = read_batch(spark, storage, FMT, "accounts", {UNIT_HOUR: files})
    assert batch.quarantined == [] and batch.reconciles and batch.events.count() == 3
    batch.events.unpersist()


def test_flow_fragments_under_folders_whose_names_hold_path_characters_are_read(spark, tmp_path):
    landing = tmp_path / "landing"
    journal = landing / "acmeCo" / "customers" / "region=eu[1] {west}" / "pivot=00"
    write_fragment(journal, 0, doc_line(1) + doc_line(2))
    collections = (CollectionConfig(name="acmeCo/customers", key=("/id",)),)

    batch = _flow_batch(spark, FlowJournalFormat(collections), landing, "acmeco_customers", ["2024-06-01-10"])

    assert batch.quarantined == [] and batch.reconciles and batch.files_read == 1
    assert sorted(r["id"] for r in batch.events.select("id").collect()) == [1, 2]


def test_files_of_one_schema_stored_in_other_parquet_types_count_together_for_which_group_leads():
    """A clash sets aside the files of the groups read after the first: ten files of one arrow
    schema, split by how Parquet stores a column (read apart), still lead six of another, read
    apart or not."""
    decimal_schema = pa.schema([("id", pa.string()), ("amount", pa.decimal128(9, 2))])
    text_schema = pa.schema([("id", pa.string()), ("amount", pa.string())])
    for apart in (False, True):
        files = _BatchFiles({})
        for n in range(5):
            files.accept(f"file:///fixed-{n}", decimal_schema, 1, "id:BYTE_ARRAY,amount:FIXED_LEN_BYTE_ARRAY")
            files.accept(f"file:///int-{n}", decimal_schema, 1, "id:BYTE_ARRAY,amount:INT32")
        for n in range(6):
            files.accept(f"file:///text-{n}", text_schema, 1, "id:BYTE_ARRAY,amount:BYTE_ARRAY")
        files.read_apart = set(files.signature_of.values()) if apart else set()
        order = [uri.rsplit("/", 1)[1].split("-")[0] for _, uris in files.groups() for uri in uris]
        assert set(order[:10]) == {"fixed", "int"} and set(order[10:]) == {"text"}, order


def test_a_run_names_what_in_the_landing_no_table_reads_and_processes_the_rest(spark, tmp_path):
    """`lake-assets run` discovers first: a folder no table name fits is named in its output,
    and the tables are processed as always."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    write_events(landing, "accounts", 0, "part-0.parquet", [event("a", "I", 1, at(0))], ACCOUNT_SCHEMA)
    write_events(landing, "Accounts", 0, "part-0.parquet", [event("b", "I", 1, at(0))], ACCOUNT_SCHEMA)
    lines: list[str] = []
    config = LakeConfig(
        lake=f"file://{lake}",
        feeds=(FeedConfig(name="unit", format="unit_cdc", landing=f"file://{landing}"),),
    )
    run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lines.append)
    assert any(
        line.startswith("unit: not read, no table's: ")
        and f"file://{landing}/Accounts/: no table has" in line
        for line in lines
    ), lines
    assert [r["id"] for r in _lake_rows(lake, "current", "unit", "accounts")] == ["a"]


def test_a_decompression_bomb_is_set_aside_from_its_footer_and_a_large_column_is_read(
    spark, tmp_path, monkeypatch
):
    """A small file whose one value inflates to gigabytes (a dictionary of 1.5 GB of text in a
    47 KB file) ran the driver out of memory: the JVM ended and every table of the run failed,
    naming no file. Its footer says what it decodes to, so it is set aside before any read (the
    bound lowered here so that the test stays small)."""
    from lake_assets import ingest

    monkeypatch.setattr(ingest, "BOMB_BYTES", 256 * 1024)
    landing = tmp_path / "unit"
    land_good_file(landing)
    bomb = [event("b", "I", 2, at(0, 2), name="x" * 400_000, balance=2)] * 3
    pq.write_table(
        pa.Table.from_pylist(bomb, schema=ACCOUNT_SCHEMA),
        hour_dir(landing, "accounts", 0) / "part-bomb.parquet",
        compression="zstd",
    )
    # As large decoded, but as large stored: data, not a bomb (its text does not compress).
    varied = [event("c", "I", 3, at(0, 3), name=os.urandom(200_000).hex(), balance=3)]
    write_events(landing, "accounts", 0, "part-large.parquet", varied, ACCOUNT_SCHEMA)
    assert (hour_dir(landing, "accounts", 0) / "part-bomb.parquet").stat().st_size < 256 * 1024

    batch = _read(spark, landing)

    assert _ids(batch) == ["a", "c"]
    reason = _names(batch)["part-bomb.parquet"]
    assert "column 'name' of row group 0 decodes to" in reason and "a decompression bomb" in reason
    assert list(_names(batch)) == ["part-bomb.parquet"]
    assert batch.reconciles


def test_floating_point_keys_spark_would_take_for_another_set_their_file_aside(spark, tmp_path):
    """Spark takes every NaN for one value, and -0.0 for 0.0, when it groups, joins and sorts: the
    keys 0.0 and -0.0 (and two NaNs) became one record in `current`, one version closing the
    other's, though `changes` held both."""
    landing = tmp_path / "unit"
    schema = ACCOUNT_SCHEMA.set(0, pa.field("id", pa.float64()))
    write_events(
        landing,
        "accounts",
        0,
        "part-0.parquet",
        [event(0.0, "I", 1, at(0, 1), name="zero"), event(1.5, "I", 2, at(0, 2), name="one and a half")],
        schema,
    )
    write_events(
        landing, "accounts", 0, "part-negative-zero.parquet", [event(-0.0, "I", 3, at(0, 3))], schema
    )
    write_events(landing, "accounts", 0, "part-nan.parquet", [event(float("nan"), "I", 4, at(0, 4))], schema)

    batch = _read(spark, landing)

    assert _ids(batch) == [0.0, 1.5]
    reasons = _names(batch)
    assert set(reasons) == {"part-negative-zero.parquet", "part-nan.parquet"}
    assert all("key column 'id' holds NaN or -0.0" in reason for reason in reasons.values())
    assert batch.reconciles


def test_a_nanosecond_key_after_a_nested_column_is_checked_by_its_own_stored_type(tmp_path):
    """The check of key times finer than a microsecond looked up the stored type by the Arrow
    field's position, which a nested column before the key shifts: the key went unchecked."""
    from lake_assets.ingest import _keys_finer_than_microseconds

    table = pa.table(
        {
            "meta": pa.array([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]),
            "id": pa.array([1_000_000_001, 1_000_000_002], pa.timestamp("ns")),
        }
    )
    pq.write_table(table, tmp_path / "nested.parquet")
    path = tmp_path / "nested.parquet"
    footer = pq.ParquetFile(path).metadata
    reason = _keys_finer_than_microseconds(
        Storage(), f"file://{path}", footer.schema.to_arrow_schema(), footer, ("id",)
    )
    assert reason is not None and "key column 'id'" in reason


class _HandedOut:
    """A file handle of `Storage` whose reads go through `read_at(handle, length, offset)`."""

    def __init__(self, handle, read_at):
        self._handle, self._read_at = handle, read_at

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self._handle.close()

    def size(self) -> int:
        return self._handle.size()

    def read_at(self, length: int, offset: int) -> bytes:
        return self._read_at(self._handle, length, offset)


def _nanosecond_keys(tmp_path) -> Entry:
    """A Unit file whose key times are a nanosecond apart, its key column first."""
    landed = pa.table(
        {
            "id": pa.array([1_000_000_001, 1_000_000_002], pa.timestamp("ns")),
            "cdc_operation_type": ["I", "I"],
            "cdc_change_seq": pa.array([1, 2], pa.int64()),
            "cdc_commit_timestamp": pa.array([1, 2], pa.timestamp("us", tz="UTC")),
        }
    )
    pq.write_table(landed, tmp_path / "n.parquet")
    return next(e for e in Storage().list(f"file://{tmp_path}") if e.name == "n.parquet")


def test_a_landed_file_whose_read_came_short_and_that_is_gone_now_is_set_aside(tmp_path):
    """A read that came short (a connection closed early) is a failed request, and the store,
    asked, says the file is gone: it is set aside as gone, as every other read failure of a gone
    file is, not taken for a failure that may pass (which failed the run)."""
    from lake_assets.ingest import _vet

    class ShortThenGone(Storage):
        def open_input_file(self, uri: str):
            return _HandedOut(super().open_input_file(uri), lambda h, n, at: h.read_at(n, at)[: n // 2])

        def refusal_to_read(self, uri: str):
            return FileNotFoundError(uri)

    entry = _nanosecond_keys(tmp_path)
    usable, reason = _vet(ShortThenGone(), UnitCdcFormat(), entry, ("id",))
    assert usable is None and reason == f"not a readable Parquet file (FileNotFoundError: {entry.uri})"


@pytest.mark.parametrize("failures", [1, 2])
def test_the_nanosecond_key_check_tells_a_failed_read_from_damage(tmp_path, failures):
    """The check of key times finer than a microsecond reads the key column: a read of it that
    fails once (an I/O error, the file still served) is read again, and the file is judged by its
    keys; one that fails again fails the run. Before, either was taken for a damaged file and set
    it aside, its rows gone from `changes` in a run that exited 0."""
    import errno

    from lake_assets.errors import StorageRequestError
    from lake_assets.ingest import _vet

    class FailingAfterTheFooter(Storage):
        opened, failing = 0, failures

        def open_input_file(self, uri: str):
            self.opened += 1
            handle = super().open_input_file(uri)
            return handle if self.opened == 1 else _HandedOut(handle, self._read)

        def _read(self, handle, length: int, offset: int) -> bytes:
            if self.failing:
                self.failing -= 1
                raise OSError(errno.EIO, "Input/output error")
            return handle.read_at(length, offset)

    entry, storage = _nanosecond_keys(tmp_path), FailingAfterTheFooter()
    if failures == 2:
        with pytest.raises(StorageRequestError, match="failed twice while the store serves the file"):
            _vet(storage, UnitCdcFormat(), entry, ("id",))
        return
    usable, reason = _vet(storage, UnitCdcFormat(), entry, ("id",))
    assert usable is None and "key column 'id' holds times finer than a microsecond" in reason


def test_the_nanosecond_key_check_running_out_of_memory_fails_the_run_and_sets_no_file_aside(
    tmp_path, monkeypatch
):
    """Decoding a key column too large for the process's memory says nothing of the file: it was
    set aside as 'not a readable Parquet file'."""
    import lake_assets.ingest as ingest

    def out_of_memory(storage, uri, name):
        raise pa.ArrowMemoryError("malloc of size 1073741824 failed")

    monkeypatch.setattr(ingest, "parquet_column", out_of_memory)
    with pytest.raises(MemoryError):
        ingest._vet(Storage(), UnitCdcFormat(), _nanosecond_keys(tmp_path), ("id",))


def test_the_nanosecond_key_check_sets_a_file_with_damaged_key_pages_aside(tmp_path):
    """Bytes of the key column that do not decode, under a sound footer, are the file's damage."""
    from lake_assets.ingest import _vet

    entry = _nanosecond_keys(tmp_path)
    path = tmp_path / "n.parquet"
    data = bytearray(path.read_bytes())
    data[4:40] = b"\xff" * 36  # the first page's header and values
    path.write_bytes(bytes(data))
    usable, reason = _vet(Storage(), UnitCdcFormat(), entry, ("id",))
    assert usable is None and reason.startswith("not a readable Parquet file ("), reason


class _JavaClass:
    """A JVM class as py4j shows one: its name and its superclass."""

    def __init__(self, name: str, superclass: "_JavaClass | None" = None):
        self._name, self._superclass = name, superclass

    def getName(self):
        return self._name

    def getSuperclass(self):
        return self._superclass


class _Throwable:
    """A JVM throwable as py4j shows one: its class, its message and its cause."""

    def __init__(self, kind: "str | _JavaClass", message: str = "", cause: "_Throwable | None" = None):
        self._class = kind if isinstance(kind, _JavaClass) else _JavaClass(kind)
        self._message, self._cause = message, cause

    def getClass(self):
        return self._class

    def getMessage(self):
        return self._message

    def getCause(self):
        return self._cause


class _Captured(Exception):
    """An error PySpark converted, keeping the JVM's throwable (`_origin`)."""

    def __init__(self, origin: _Throwable | None):
        super().__init__("[FAILED_READ_FILE.NO_HINT] Encountered error while reading file")
        self._origin = origin


def test_a_failed_request_is_told_from_a_damaged_file_by_the_causes_spark_reports():
    def failure(*chain: tuple[str, str]) -> _Captured:
        cause = None
        for name, message in reversed(chain):
            cause = _Throwable(name, message, cause)
        return _Captured(cause)

    spark_task = ("org.apache.spark.SparkException", "Job aborted")
    for name, message in [
        ("java.net.SocketTimeoutException", "Read timed out"),
        ("org.apache.hadoop.fs.s3a.AWSBadRequestException", "open s3a://b/k: ExpiredToken: token expired"),
        ("org.apache.hadoop.fs.s3a.RemoteFileChangedException", "the object changed while it was read"),
        ("org.apache.http.conn.ConnectionPoolTimeoutException", "Timeout waiting for connection from pool"),
        (
            "com.amazonaws.thirdparty.apache.http.ConnectionClosedException",
            "Premature end of Content-Length delimited message body (expected: 8; received: 0)",
        ),
        (
            "software.amazon.awssdk.thirdparty.org.apache.http.NoHttpResponseException",
            "The target server failed to respond",
        ),
    ]:
        assert is_request_failure(failure(spark_task, (name, message))), name
    for name, message in [
        ("org.apache.parquet.io.ParquetDecodingException", "Can not read value at 0 in block 0"),
        ("java.io.FileNotFoundException", "No such file or directory: s3a://b/gone.parquet"),
        ("org.apache.hadoop.fs.s3a.AWSBadRequestException", "open s3a://b/k: InvalidArgument"),
        (
            "java.lang.RuntimeException",
            "s3a://b/java.net.SocketTimeoutException.parquet is not a Parquet file",
        ),
    ]:
        assert not is_request_failure(failure(spark_task, (name, message))), name
    socket = _JavaClass("java.net.SocketException", _JavaClass("java.io.IOException"))
    ssl = _JavaClass("javax.net.ssl.SSLException", _JavaClass("java.io.IOException"))
    for kind in (
        _JavaClass("java.net.ConnectException", socket),
        _JavaClass("javax.net.ssl.SSLHandshakeException", ssl),
    ):
        assert is_request_failure(
            _Captured(_Throwable("org.apache.spark.SparkException", "", _Throwable(kind)))
        ), kind
    # A task's error the driver holds as text, and a Spark Connect client's, name the class.
    assert is_request_failure(
        RuntimeError("Job aborted.\nCaused by: java.net.SocketTimeoutException: Read timed out")
    )
    assert not is_request_failure(
        RuntimeError("s3a://b/java.net.SocketTimeoutException.parquet is not a Parquet file")
    )
    assert is_request_failure(
        RuntimeError("(org.apache.spark.SparkException) … java.net.UnknownHostException: h")
    )
    assert not is_request_failure(RuntimeError("(org.apache.parquet.io.ParquetDecodingException) bad page"))
    # a network failure's subclass, known by its text alone
    for named in ("java.net.ConnectException: Connection refused", "javax.net.ssl.SSLHandshakeException: x"):
        assert is_request_failure(RuntimeError(f"Job aborted.\nCaused by: {named}")), named


def test_a_footer_a_mounted_share_fails_to_read_fails_the_run_and_sets_no_file_aside(tmp_path):
    """On a local or mounted landing a read failing with an I/O error (EIO, a stale handle) is a
    failure that may pass, like a store's throttle: the run fails, and the file is not set aside
    as damaged (before, only S3's answers were told apart)."""
    import errno

    from lake_assets.errors import StorageRequestError
    from lake_assets.feeds.unit_cdc import UnitCdcFormat
    from lake_assets.ingest import _vet

    class FailingShare(Storage):
        def open_input_file(self, uri: str):
            raise OSError(errno.EIO, "Input/output error", uri)

        def refusal_to_read(self, uri: str):
            raise OSError(errno.EIO, "Input/output error", uri)

    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"id": [1]}), path)
    entry = next(e for e in Storage().list(f"file://{tmp_path}") if e.name == "part-0.parquet")
    with pytest.raises(StorageRequestError, match="Input/output error"):
        _vet(FailingShare(), UnitCdcFormat(), entry, ("id",))
