"""The Unit feed through the shared batch reader and the merge engine (Spark, no Dagster)."""

import datetime as dt
import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from lake_assets.config import S3Config
from lake_assets.engine import model as m
from lake_assets.engine.fold import fold
from lake_assets.engine.state import TableState
from lake_assets.feeds.unit_cdc import UnitCdcFormat
from lake_assets.ingest import read_batch
from lake_assets.paths import LakeLayout
from lake_assets.quarantine import Quarantined, quarantine_file
from lake_assets.storage import Storage, data_files
from lake_assets_tests.run_value_probes import classes_compiled
from lake_assets_tests.storage_spy import CountingStorage
from lake_assets_tests.unit_files import (
    ACCOUNT_SCHEMA,
    at,
    event,
    hour_dir,
    landing_with_strays,
    write_events,
)

FMT = UnitCdcFormat()


def _fold(spark, landing, hours=(0, 1, 2)):
    """The hours' batch read and folded into an empty lake beside the landing, as a run does;
    the batch, and the table's current and history rows as the lake holds them."""
    storage = Storage()
    files = {
        f"2024-03-01-{h:02d}": data_files(storage, f"file://{hour_dir(landing, 'accounts', h)}")
        for h in hours
    }
    batch = read_batch(spark, storage, FMT, "accounts", files)
    state = TableState(LakeLayout(f"file://{landing.parent / 'lake'}"), "unit", "accounts")
    fold(spark, storage, state, batch.events, FMT.table_spec("accounts"))
    current = {r["id"]: r.asDict() for r in spark.read.parquet(state.current).collect()}
    stored = (
        spark.read.option("recursiveFileLookup", "true").option("mergeSchema", "true").parquet(state.history)
    )
    history = sorted((r.asDict() for r in stored.collect()), key=lambda r: (r["id"], r["_fivetran_start"]))
    return batch, current, history


def test_unit_semantics_on_focused_events(spark, tmp_path):
    landing = tmp_path / "unit"
    write_events(
        landing,
        "accounts",
        0,
        "part-0.parquet",
        [
            event("a1", "INSERT", 1, at(0, 1), name="first", balance=1),
            # same timestamp, three writes: the greatest cdc_change_seq wins, whatever the row order
            event("a1", "UPDATE", 4, at(0, 2), name="winner", balance=3),
            event("a1", "UPDATE", 2, at(0, 2), name="loser", balance=2),
            event("a1", "UPDATE", 3, at(0, 2), name="middle", balance=2),
            event("b1", "U", 5, at(0, 3), name="first-is-an-update", balance=10),
            event("c1", "I", 6, at(0, 4), name="to-delete", balance=7),
        ],
        ACCOUNT_SCHEMA,
    )
    write_events(
        landing,
        "accounts",
        1,
        "part-0.parquet",
        [
            {
                "id": "c1",
                "name": None,
                "balance": None,
                "cdc_operation_type": "D",
                "cdc_change_seq": 7,
                "cdc_commit_timestamp": at(1, 5),
            },
            event("b1", "UPDATE", 8, at(1, 6), name="second", balance=11),
        ],
        ACCOUNT_SCHEMA,
    )
    # The same file delivered twice: identical duplicates collapse.
    write_events(
        landing,
        "accounts",
        1,
        "part-1.parquet",
        [
            event("b1", "UPDATE", 8, at(1, 6), name="second", balance=11),
        ],
        ACCOUNT_SCHEMA,
    )

    batch, current, history = _fold(spark, landing)

    assert batch.reconciles and batch.duplicates == 1 and batch.events_out == 8
    assert set(current) == {"a1", "b1"}  # c1 was deleted
    assert current["a1"]["name"] == "winner" and current["a1"]["_seq"] == 4
    assert current["b1"]["name"] == "second"
    c1 = [h for h in history if h["id"] == "c1"]
    assert (
        len(c1) == 1
        and c1[0]["_fivetran_end"] == at(1, 5).replace(tzinfo=None)
        and not c1[0]["_fivetran_active"]
    )
    a1 = [h for h in history if h["id"] == "a1"]
    assert [h["name"] for h in a1] == ["first", "winner"]
    assert a1[0]["_fivetran_end"] == at(0, 2).replace(tzinfo=None) - dt.timedelta(milliseconds=1)
    assert (
        a1[1]["_fivetran_end"] == dt.datetime(9999, 12, 31, 23, 59, 59, 999000) and a1[1]["_fivetran_active"]
    )
    b1 = [h for h in history if h["id"] == "b1"]
    assert [h["name"] for h in b1] == ["first-is-an-update", "second"]


def test_special_columns_in_other_encodings_are_accepted(spark, tmp_path):
    landing = tmp_path / "unit"
    text_schema = pa.schema(
        [
            ("id", pa.int64()),
            ("v", pa.string()),
            ("cdc_operation_type", pa.string()),
            ("cdc_change_seq", pa.string()),
            ("cdc_commit_timestamp", pa.string()),
        ]
    )
    write_events(
        landing,
        "accounts",
        0,
        "part-0.parquet",
        [
            {
                "id": 1,
                "v": "a",
                "cdc_operation_type": "insert",
                "cdc_change_seq": "0001",
                "cdc_commit_timestamp": "2024-03-01T00:00:01Z",
            },
            {
                "id": 1,
                "v": "b",
                "cdc_operation_type": " Update ",
                "cdc_change_seq": "2",
                "cdc_commit_timestamp": "2024-03-01 00:00:02.5",
            },
        ],
        text_schema,
    )
    epoch_schema = pa.schema(
        [
            ("id", pa.int64()),
            ("v", pa.string()),
            ("cdc_operation_type", pa.string()),
            ("cdc_change_seq", pa.int32()),
            ("cdc_commit_timestamp", pa.int64()),
        ]
    )
    write_events(
        landing,
        "accounts",
        1,
        "part-0.parquet",
        [
            {
                "id": 1,
                "v": "c",
                "cdc_operation_type": "U",
                "cdc_change_seq": 3,
                "cdc_commit_timestamp": int(at(1).timestamp() * 1000),
            },
            {
                "id": 2,
                "v": "d",
                "cdc_operation_type": "I",
                "cdc_change_seq": 4,
                "cdc_commit_timestamp": int(at(1, 1).timestamp()),
            },
        ],
        epoch_schema,
    )
    batch, current, history = _fold(spark, landing, hours=(0, 1))
    assert batch.quarantined == [] and batch.reconciles
    assert current[1]["v"] == "c" and current[1]["_version_at"] == at(1).replace(tzinfo=None)
    assert current[2]["_version_at"] == at(1, 1).replace(tzinfo=None)
    assert [h["v"] for h in history if h["id"] == 1] == ["a", "b", "c"]
    assert history[1]["_fivetran_start"] == dt.datetime(2024, 3, 1, 0, 0, 2, 500000)


def test_bad_files_are_quarantined_and_the_rest_of_the_hour_goes_on(spark, tmp_path):
    landing = tmp_path / "unit"
    good = write_events(
        landing,
        "accounts",
        0,
        "part-good.parquet",
        [
            event("a1", "INSERT", 1, at(0, 1), name="ok", balance=1),
            event("a1", "INSERT", 1, at(0, 1), name="ok", balance=1),
        ],
        ACCOUNT_SCHEMA,
    )
    folder = hour_dir(landing, "accounts", 0)
    (folder / "part-corrupt.parquet").write_bytes(b"PAR1 this is not parquet at all PAR1")
    truncated = folder / "part-truncated.parquet"
    truncated.write_bytes(good.read_bytes()[:-30])
    pq.write_table(
        pa.table(
            {
                "name": ["no id"],
                "cdc_operation_type": ["I"],
                "cdc_change_seq": [2],
                "cdc_commit_timestamp": pa.array([at(0, 2)], pa.timestamp("us", tz="UTC")),
            }
        ),
        folder / "part-no-id.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "id": ["x"],
                "cdc_operation_type": ["I"],
                "cdc_change_seq": [2.5],
                "cdc_commit_timestamp": pa.array([at(0, 2)], pa.timestamp("us", tz="UTC")),
            }
        ),
        folder / "part-float-seq.parquet",
    )
    pq.write_table(
        pa.table(
            {"id": ["y"], "cdc_operation_type": ["I"], "cdc_change_seq": [3], "cdc_commit_timestamp": [True]}
        ),
        folder / "part-bool-ts.parquet",
    )
    write_events(
        landing,
        "accounts",
        0,
        "part-bad-op.parquet",
        [
            event("z", "UPSERT", 9, at(0, 9), name="?", balance=0),
            event("z2", "INSERT", 10, at(0, 9), name="fine row, bad file", balance=0),
        ],
        ACCOUNT_SCHEMA,
    )

    batch, current, _ = _fold(spark, landing, hours=(0,))

    reasons = {q.uri.rsplit("/", 1)[-1]: q.reason for q in batch.quarantined}
    assert set(reasons) == {
        "part-corrupt.parquet",
        "part-truncated.parquet",
        "part-no-id.parquet",
        "part-float-seq.parquet",
        "part-bool-ts.parquet",
        "part-bad-op.parquet",
    }
    assert "not a readable Parquet file" in reasons["part-corrupt.parquet"]
    assert "missing the key column 'id'" in reasons["part-no-id.parquet"]
    assert (
        "cdc_change_seq" in reasons["part-float-seq.parquet"]
        and "double" in reasons["part-float-seq.parquet"]
    )
    assert "cdc_commit_timestamp" in reasons["part-bool-ts.parquet"]
    assert "unknown cdc_operation_type UPSERT" in reasons["part-bad-op.parquet"]
    assert batch.files_listed == 7 and batch.files_read == 1
    assert batch.rows_in == 2 and batch.events_out == 1 and batch.duplicates == 1 and batch.reconciles
    assert set(current) == {"a1"}


def test_a_file_whose_types_cannot_join_the_batch_is_quarantined_naming_the_column(spark, tmp_path):
    landing = tmp_path / "unit"
    write_events(landing, "accounts", 0, "part-0.parquet", [event("a", "I", 1, at(0), flag=True)])
    write_events(landing, "accounts", 0, "part-1.parquet", [event("c", "I", 3, at(0, 1), flag=False)])
    write_events(landing, "accounts", 0, "part-2.parquet", [event("b", "I", 2, at(0), flag={"day": 1})])
    batch, current, _ = _fold(spark, landing, hours=(0,))
    assert [q.uri.rsplit("/", 1)[-1] for q in batch.quarantined] == ["part-2.parquet"]
    assert (
        "column 'flag' has type boolean" in batch.quarantined[0].reason
        and "struct" in batch.quarantined[0].reason
    )
    assert set(current) == {"a", "c"} and batch.reconciles and batch.files_read == 2


def test_columns_added_dropped_and_widened_union_cleanly(spark, tmp_path):
    landing = tmp_path / "unit"
    write_events(
        landing,
        "accounts",
        0,
        "part-0.parquet",
        [event("a", "I", 1, at(0), old_col="x", amount=1)],
        pa.schema(
            [
                ("id", pa.string()),
                ("old_col", pa.string()),
                ("amount", pa.int32()),
                ("cdc_operation_type", pa.string()),
                ("cdc_change_seq", pa.int64()),
                ("cdc_commit_timestamp", pa.timestamp("us", tz="UTC")),
            ]
        ),
    )
    write_events(
        landing, "accounts", 0, "part-1.parquet", [event("a", "U", 2, at(0, 5), new_col="y", amount=2**40)]
    )
    batch, current, history = _fold(spark, landing, hours=(0,))
    assert batch.reconciles
    row = current["a"]
    assert row["old_col"] is None and row["new_col"] == "y" and row["amount"] == 2**40
    assert history[0]["old_col"] == "x" and history[0]["new_col"] is None and history[0]["amount"] == 1


def test_columns_written_with_the_null_type_take_the_type_other_files_give_them(spark, tmp_path):
    """Athena's and Trino's CTAS write a column of nothing but NULLs with Parquet's NULL type,
    which Spark would read as an integer: within a batch it takes the other files' type
    (text, a boolean, a time), and a table that stored it as such widens when values arrive in
    a later fold."""
    landing = tmp_path / "unit"
    typed = {"note": pa.string(), "active": pa.bool_(), "seen": pa.timestamp("us", tz="UTC")}

    def schema(**types: pa.DataType) -> pa.Schema:
        return pa.schema([*ACCOUNT_SCHEMA, *types.items()])

    every_null = {name: pa.null() for name in typed}
    write_events(landing, "accounts", 0, "part-0.parquet", [event("a", "I", 1, at(0))], schema(**every_null))
    values = {"note": "kept", "active": True, "seen": at(0, 1)}
    write_events(
        landing, "accounts", 0, "part-1.parquet", [event("b", "I", 2, at(0, 5), **values)], schema(**typed)
    )
    write_events(
        landing, "accounts", 0, "part-2.parquet", [event("c", "I", 3, at(0, 9))], schema(extra=pa.null())
    )
    batch, current, _ = _fold(spark, landing, hours=(0,))
    assert batch.reconciles and not batch.quarantined
    assert {k: current["b"][k] for k in typed} == {
        **values,
        "seen": values["seen"].astimezone().replace(tzinfo=None),
    }  # PySpark: local, naive
    assert {k: current["a"][k] for k in typed} == dict.fromkeys(typed)
    stored = dict(spark.read.parquet(f"file://{tmp_path / 'lake/current/unit/accounts'}").dtypes)
    assert (stored["note"], stored["active"], stored["seen"]) == ("string", "boolean", "timestamp")

    write_events(landing, "accounts", 1, "part-0.parquet", [event("c", "U", 4, at(1), extra="now text")])
    batch, current, history = _fold(spark, landing, hours=(1,))
    assert batch.reconciles and not batch.quarantined
    assert current["c"]["extra"] == "now text" and current["a"]["extra"] is None
    assert [r["extra"] for r in history if r["id"] == "c"] == [None, "now text"]


def test_keys_whose_types_meet_keep_every_value_or_their_file_is_set_aside(spark, tmp_path):
    """Files type `id` as int64, as decimal(20,0) and as double. Widened to double, 2^53 and
    2^53 + 1 became one key: one record vanished from current and its history merged into the
    other's. A decimal holds both exactly; a double cannot hold every int64, so that file is
    set aside, naming the column and both types."""
    landing, big = tmp_path / "unit", 2**53

    def schema(id_type):
        return pa.schema(
            [
                ("id", id_type),
                ("name", pa.string()),
                ("cdc_operation_type", pa.string()),
                ("cdc_change_seq", pa.int64()),
                ("cdc_commit_timestamp", pa.timestamp("us", tz="UTC")),
            ]
        )

    write_events(
        landing,
        "accounts",
        0,
        "part-0.parquet",
        [event(big, "I", 1, at(0, 1), name="Ann")],
        schema(pa.int64()),
    )
    write_events(
        landing,
        "accounts",
        0,
        "part-1.parquet",
        [event(big + 1, "I", 2, at(0, 2), name="Bob")],
        schema(pa.int64()),
    )
    write_events(
        landing,
        "accounts",
        0,
        "part-2.parquet",
        [event(decimal.Decimal(7), "I", 3, at(0, 3), name="Cy")],
        schema(pa.decimal128(20, 0)),
    )
    write_events(
        landing,
        "accounts",
        0,
        "part-3.parquet",
        [event(8.0, "I", 4, at(0, 4), name="Di")],
        schema(pa.float64()),
    )
    batch, current, history = _fold(spark, landing, hours=(0,))
    assert batch.reconciles
    [(set_aside, reason)] = [(q.uri.rsplit("/", 1)[1], q.reason) for q in batch.quarantined]
    assert set_aside == "part-3.parquet" and "column 'id'" in reason and "without changing values" in reason
    assert {int(k): r["name"] for k, r in current.items()} == {big: "Ann", big + 1: "Bob", 7: "Cy"}
    assert sorted((int(r["id"]), r["_fivetran_active"]) for r in history) == [
        (7, True),
        (big, True),
        (big + 1, True),
    ]


def test_nanosecond_commit_times_are_truncated_to_the_millisecond_not_rounded(spark, tmp_path):
    """Converted through a double, 10:00:00.000999900 became .001, the same millisecond as the
    next write, and one of two versions was gone from history."""
    landing = tmp_path / "unit"
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("name", pa.string()),
            ("cdc_operation_type", pa.string()),
            ("cdc_change_seq", pa.int64()),
            ("cdc_commit_timestamp", pa.timestamp("ns", tz="UTC")),
        ]
    )
    ten = 1_717_236_000 * 10**9  # 2024-06-01 10:00:00 UTC in nanoseconds
    rows = [
        event("a", "I", 1, ten + 999_900, name="first"),
        event("a", "U", 2, ten + 1_000_000, name="second"),
        event("b", "I", 3, -1, name="just before 1970"),  # rounds down, to .999 of the year before
    ]
    write_events(landing, "accounts", 0, "part-0.parquet", rows, schema)
    batch, _, history = _fold(spark, landing, hours=(0,))
    assert batch.reconciles
    utc = dt.UTC
    assert [(r["id"], r["name"], r["_fivetran_start"].astimezone(utc)) for r in history] == [
        ("a", "first", dt.datetime(2024, 6, 1, 10, tzinfo=utc)),
        ("a", "second", dt.datetime(2024, 6, 1, 10, 0, 0, 1000, tzinfo=utc)),
        ("b", "just before 1970", dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=utc)),
    ]


def test_every_file_carries_the_partition_that_lists_it_whatever_its_folder_spelling(spark, tmp_path):
    """The reader takes a file's partition from the listing it came in, once per file, not from
    its path: files of an hour folder spelled without leading zeros carry the padded key."""
    landing = tmp_path / "unit"
    padded = write_events(landing, "accounts", 7, "part-0.parquet", [event("a", "I", 1, at(7))], day=4)
    bare = landing / "accounts" / "year=2024/month=3/day=4/hour=7"
    bare.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([event("b", "I", 2, at(7, 5))]), bare / "part-1.parquet")
    storage = Storage()
    files = {
        "2024-03-04-07": [
            *data_files(storage, f"file://{padded.parent}"),
            *data_files(storage, f"file://{bare}"),
        ]
    }
    batch = read_batch(spark, storage, FMT, "accounts", files)
    keys = {r["id"]: r[FMT.partition_column] for r in batch.events.collect()}
    assert keys == {"a": "2024-03-04-07", "b": "2024-03-04-07"}


def test_reading_the_same_files_again_compiles_no_new_code(spark, tmp_path):
    """Each read stamps its events with its own `_ingested_at`; reading again must reuse Spark's
    compiled stages, not generate new ones around the new time."""
    landing = tmp_path / "unit"
    write_events(
        landing,
        "accounts",
        0,
        "part-0.parquet",
        [
            event("a1", "INSERT", 1, at(0, 1), name="a", balance=1),
            event("b1", "UPDATE", 2, at(0, 2), name="b", balance=2),
        ],
        ACCOUNT_SCHEMA,
    )
    storage = Storage()
    files = {"2024-03-01-00": data_files(storage, f"file://{hour_dir(landing, 'accounts', 0)}")}
    compiled, stamps = [], []
    for _ in range(2):
        before = classes_compiled(spark)
        started = dt.datetime.now(dt.UTC)
        batch = read_batch(spark, storage, FMT, "accounts", files)
        compiled.append(classes_compiled(spark) - before)
        stamps.append({r[0] for r in batch.events.select(F.unix_micros(m.INGESTED_AT)).collect()})
        batch.events.unpersist()
        assert len(stamps[-1]) == 1 and next(iter(stamps[-1])) >= int(started.timestamp() * 1_000_000) - 1
    assert stamps[0] != stamps[1]
    assert compiled[1] == 0, f"the second read compiled {compiled[1]} new class(es)"


def test_source_files_with_odd_names_are_named_as_the_catalog_names_them(spark, tmp_path):
    """`_source_file` is the file's URI as listed (and catalogued), whatever Spark's own spelling:
    spaces, `%`, `+` and `=` in names survive the read."""
    landing = tmp_path / "unit lake"
    names = ["part 0.parquet", "a+b.parquet", "100%=c d+e.parquet"]
    for seq, name in enumerate(names):
        write_events(
            landing,
            "accounts",
            0,
            name,
            [event(f"k{seq}", "INSERT", seq, at(0, seq), name="n", balance=1)],
            ACCOUNT_SCHEMA,
        )
    storage = Storage()
    files = data_files(storage, f"file://{hour_dir(landing, 'accounts', 0)}")
    batch = read_batch(spark, storage, FMT, "accounts", {"2024-03-01-00": files})
    rows = batch.events.select(m.SOURCE_FILE, "hour").collect()
    assert sorted(r[m.SOURCE_FILE] for r in rows) == sorted(f.uri for f in files)
    assert {r["hour"] for r in rows} == {"2024-03-01-00"}
    batch.events.unpersist()


def test_an_hour_spelled_without_leading_zeros_is_one_partition_with_all_its_files(tmp_path):
    """`month=3/day=4/hour=7` and `month=03/day=04/hour=07` are the same hour: one partition
    key, and the run, the catalog and the sensor see the files of both folders. Listing a range
    of hours lists only the branches that can hold them."""
    landing = tmp_path / "unit"
    write_events(landing, "accounts", 7, "part-0.parquet", [event("a", "I", 1, at(7))], day=4)
    bare = landing / "accounts" / "year=2024/month=3/day=4/hour=7"
    bare.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([event("b", "I", 2, at(7, 5))]), bare / "part-1.parquet")
    write_events(landing, "accounts", 9, "part-0.parquet", [event("c", "I", 3, at(9))], day=4)
    write_events(landing, "accounts", 1, "part-0.parquet", [event("d", "I", 4, at(1))], day=20)
    uri = f"file://{landing}"
    assert FMT.partition_keys(Storage(), uri, "accounts") == [
        "2024-03-04-07",
        "2024-03-04-09",
        "2024-03-20-01",
    ]
    storage = CountingStorage()
    files = FMT.partitions_files(storage, uri, "accounts", ["2024-03-04-07"])
    assert sorted(e.name for e in files["2024-03-04-07"]) == ["part-0.parquet", "part-1.parquet"]
    assert not [u for u in storage.listed if "day=20" in u or "hour=09" in u]
    assert FMT.partition_files(Storage(), uri, "accounts", "2024-03-04-08") == []
    since = dt.datetime(2024, 3, 4, 7)
    assert [e.name for e in FMT.landed_hours(Storage(), uri, "accounts", since)["2024-03-04-07"]] == [
        "part-0.parquet",
        "part-1.parquet",
    ]


def test_every_file_no_hour_reads_is_a_stray_with_its_reason(tmp_path):
    landing = tmp_path / "unit"
    _good, expected = landing_with_strays(landing)
    uri = f"file://{landing}"

    strays = FMT.stray_files(Storage(), uri, "accounts")

    reasons = {entry.name: reason for entry, reason in strays}
    assert set(reasons) == set(expected), reasons
    for name, words in expected.items():
        assert all(w in reasons[name] for w in words), (name, reasons[name])
    assert all(entry.uri.startswith(f"{uri}/accounts/") for entry, _ in strays)
    # What the hours read is unchanged: the one good file, never a link that leads nowhere.
    assert FMT.partition_keys(Storage(), uri, "accounts") == ["2024-03-01-01"]
    assert [e.name for e in FMT.partition_files(Storage(), uri, "accounts", "2024-03-01-01")] == [
        "part-good.parquet"
    ]
    landed = FMT.landed_hours(Storage(), uri, "accounts", None)
    assert {key: [e.name for e in files] for key, files in landed.items()} == {
        "2024-03-01-01": ["part-good.parquet"]
    }


def test_an_hour_folder_linked_back_to_its_day_is_a_loop_and_reads_nothing(tmp_path):
    """`hour=05 -> .` in a day folder: the folder descent read the day's own files as hour 05's
    while the walk for strays called the link a loop and set those same files aside. The link
    is one stray, a loop; the day's files are strays, and no hour reads them."""
    landing = tmp_path / "unit"
    good = write_events(
        landing, "accounts", 1, "part-good.parquet", [event("a", "I", 1, at(1))], ACCOUNT_SCHEMA
    )
    day = good.parent.parent
    (day / "under-a-day.parquet").write_bytes(good.read_bytes())
    (day / "hour=05").symlink_to(".", target_is_directory=True)
    uri = f"file://{landing}"

    assert FMT.partition_keys(Storage(), uri, "accounts") == ["2024-03-01-01"]
    assert list(FMT.landed_hours(Storage(), uri, "accounts", None)) == ["2024-03-01-01"]
    assert FMT.partition_files(Storage(), uri, "accounts", "2024-03-01-05") == []
    strays = {entry.name: reason for entry, reason in FMT.stray_files(Storage(), uri, "accounts")}
    assert set(strays) == {"under-a-day.parquet", "hour=05"}, strays
    assert "a loop; not followed" in strays["hour=05"]


def _upload_without_links(moto_server, bucket: str, landing: Path) -> None:
    """A local landing's files to `unit/` in `bucket`, leaving out its symbolic links: S3 has none."""
    s3 = moto_server.client("s3")
    for path in sorted(landing.rglob("*")):
        if path.is_file() and not path.is_symlink() and "up" not in path.relative_to(landing).parts:
            s3.upload_file(str(path), bucket, f"unit/{path.relative_to(landing).as_posix()}")


def test_strays_on_s3_come_from_one_listing_of_the_table(tmp_path, moto_server, s3_bucket):
    """On S3 the stray scan is one listing of every key under the table (no folders to walk)."""
    landing = tmp_path / "unit"
    good, expected = landing_with_strays(landing)
    _upload_without_links(moto_server, s3_bucket, landing)
    storage = CountingStorage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/unit"

    strays = FMT.stray_files(storage, uri, "accounts")

    links = {"up", "share", "linked", "shared", "self.parquet", "gone.parquet"}  # S3 has no links
    assert {e.name: r for e, r in strays}.keys() == set(expected) - links
    assert storage.listed == []  # one recursive listing, not a walk folder by folder
    assert [e.name for e in FMT.partition_files(storage, uri, "accounts", "2024-03-01-01")] == [good.name]


def test_s3_keys_no_hadoop_path_can_name_are_strays_and_quarantined_with_their_bytes(
    tmp_path, moto_server, s3_bucket
):
    """An S3 key is any text. A key with an empty, `.` or `..` segment, or one ending in `/`
    that holds data, is no file Spark can read: pyarrow's listing showed the first kind as
    hidden names and the second as a plain file in its hour, so no hour read them and no stray
    scan reported them (a run exited 0 without their rows), and copying `hour=00//x` to
    quarantine raised and stopped the table. Each is now a stray with its reason, copied whole."""
    from lake_assets.quarantine import Quarantined, quarantine_file

    landing = tmp_path / "unit"
    good = write_events(
        landing, "accounts", 1, "part-good.parquet", [event("a", "I", 1, at(1), name="ok")], ACCOUNT_SCHEMA
    )
    s3 = moto_server.client("s3")
    hour = good.parent.relative_to(landing).as_posix()
    s3.upload_file(str(good), s3_bucket, f"unit/{hour}/part-good.parquet")
    unnameable = {
        f"{hour}//empty-segment.parquet": "an empty, '.' or '..' path segment",
        f"{hour}/./dot.parquet": "an empty, '.' or '..' path segment",
        f"{hour}/../{hour.rsplit('/', 1)[-1]}/dot-dot.parquet": "an empty, '.' or '..' path segment",
        f"{hour}/slash.parquet/": "ends in '/' but holds",
    }
    for key in unnameable:
        s3.put_object(Bucket=s3_bucket, Key=f"unit/{key}", Body=good.read_bytes())
    s3.put_object(Bucket=s3_bucket, Key=f"unit/{hour}/marker/", Body=b"")  # a folder marker: not data
    s3.put_object(Bucket=s3_bucket, Key=f"unit/{hour}_$folder$", Body=b"")  # as EMR and s3n mark one
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/unit"

    strays = {e.uri: (e, reason) for e, reason in FMT.stray_files(storage, uri, "accounts")}

    assert set(strays) == {f"{uri}/{key}" for key in unnameable}
    for key, words in unnameable.items():
        assert words in strays[f"{uri}/{key}"][1], strays[f"{uri}/{key}"]
    assert [e.name for e in FMT.partition_files(storage, uri, "accounts", "2024-03-01-01")] == [good.name]
    layout = LakeLayout(f"s3a://{s3_bucket}/lake")
    for entry, reason in strays.values():
        copy = quarantine_file(
            storage, layout, "unit", "accounts", "_unpartitioned", Quarantined(entry.uri, reason), None
        )
        assert storage.read_bytes(copy) == good.read_bytes(), entry.uri
        assert "copy failed" not in storage.read_bytes(copy + ".reason.json").decode()
    # one deleted between the listing and its copy: the note says so, and nothing is raised
    gone = f"{uri}/{hour}//empty-segment.parquet"
    s3.delete_object(Bucket=s3_bucket, Key=f"unit/{hour}//empty-segment.parquet")
    copy = quarantine_file(storage, layout, "unit", "accounts", "_gone", Quarantined(gone, "stray"), None)
    assert "(copy failed: reading " in storage.read_bytes(copy + ".reason.json").decode()
    # and a bucket that does not exist walks as empty, as pyarrow's listing did
    assert list(storage.walk_files(f"s3a://{s3_bucket}-none/unit")) == []


def test_s3_requests_made_with_boto3_fail_as_lake_errors_and_say_when_unsigned(
    moto_server, s3_bucket, monkeypatch
):
    """The S3 walk and the reads of keys pyarrow cannot name go through boto3, whose errors are
    not OSErrors: every caller of `Storage` handles those (and a CLI shows them as one line)."""
    from lake_assets.errors import StorageRequestError

    uri = f"s3a://{s3_bucket}/unit"
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")  # a key without its secret: boto3 refuses to sign
    with pytest.raises(StorageRequestError, match=f"listing {uri}: "):
        list(Storage(S3Config(endpoint_url=moto_server.url)).walk_files(uri))
    # no credentials at all: asked unsigned (a public bucket), and a failure says so
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, "/nonexistent") if name != "AWS_ACCESS_KEY_ID" else monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StorageRequestError, match="sent unsigned: no AWS credentials were found"):
        Storage(S3Config(endpoint_url=moto_server.url)).read_bytes(f"{uri}/hour=00//gone.parquet")


def test_event_times_after_the_end_of_history_set_their_file_aside(spark, tmp_path):
    """History's open versions end at 9999-12-31 23:59:59.999: a version opening after it
    failed the windows check on every run, with the good files' fold, until the file went."""
    landing = tmp_path / "unit"
    write_events(landing, "accounts", 0, "part-good.parquet", [event("a", "I", 1, at(0, 1), name="ok")])
    far = {
        "part-year-10000.parquet": (pa.string(), "10000-01-01T00:00:00Z"),
        # an epoch in microseconds, read as milliseconds: the year 56134
        "part-micros.parquet": (pa.int64(), 1_709_254_800_000_000),
    }
    for name, (commit_type, committed) in far.items():
        schema = pa.schema(
            [
                *(f for f in ACCOUNT_SCHEMA if f.name != "cdc_commit_timestamp"),
                ("cdc_commit_timestamp", commit_type),
            ]
        )
        write_events(landing, "accounts", 0, name, [event("b", "I", 2, committed, name="?")], schema)
    batch, current, history = _fold(spark, landing, hours=(0,))
    reasons = {q.uri.rsplit("/", 1)[-1]: q.reason for q in batch.quarantined}
    assert set(reasons) == {"part-year-10000.parquet", "part-micros.parquet"}
    assert all("cdc_commit_timestamp lies after 9999-12-31 23:59:59.999" in r for r in reasons.values())
    assert "10000-01-01T00:00:00Z" in reasons["part-year-10000.parquet"]
    assert batch.reconciles and set(current) == {"a"} and len(history) == 1


def _with_commit_type(commit_type: pa.DataType) -> pa.Schema:
    return pa.schema(
        [
            *(f for f in ACCOUNT_SCHEMA if f.name != "cdc_commit_timestamp"),
            ("cdc_commit_timestamp", commit_type),
        ]
    )


def test_event_times_before_the_year_1_or_beyond_any_time_set_their_file_aside(spark, tmp_path):
    """A time before 0001-01-01 (a year 0 in text, an epoch of seconds far below zero) passed
    the reader, then failed every fold of its table in the fold's own bookkeeping, holding back
    the good files of its hour and of every hour after. An epoch too large for Spark's
    microseconds failed the read. Each now sets its file aside with its reason."""
    landing = tmp_path / "unit"
    write_events(landing, "accounts", 0, "part-good.parquet", [event("a", "I", 1, at(0, 1), name="ok")])
    far = {
        "part-year-0.parquet": (pa.string(), "0000-01-01 00:00:00"),
        "part-seconds.parquet": (pa.int64(), -100_000_000_000),  # seconds: the year -1199
        "part-huge.parquet": (pa.int64(), 9_000_000_000_000_000_000),
    }
    for name, (commit_type, committed) in far.items():
        rows = [event("b", "I", 2, committed, name="?")]
        write_events(landing, "accounts", 0, name, rows, _with_commit_type(commit_type))
    batch, current, history = _fold(spark, landing, hours=(0,))
    reasons = {q.uri.rsplit("/", 1)[-1]: q.reason for q in batch.quarantined}
    assert set(reasons) == set(far)
    before = "cdc_commit_timestamp lies before 0001-01-01 00:00:00, the earliest time the lake keeps"
    assert before in reasons["part-year-0.parquet"] and "0000-01-01" in reasons["part-year-0.parquet"]
    assert before in reasons["part-seconds.parquet"] and "-100000000000" in reasons["part-seconds.parquet"]
    assert "cdc_commit_timestamp is not a time: 9000000000000000000" in reasons["part-huge.parquet"]
    assert batch.reconciles and set(current) == {"a"} and len(history) == 1


def test_epochs_in_unsigned_or_whole_decimal_columns_read_like_integers(spark, tmp_path):
    """Spark reads an unsigned 64-bit integer as a decimal of 20 digits: an epoch of
    milliseconds stored so was read as seconds and refused as lying after 9999."""
    landing = tmp_path / "unit"
    millis, seconds = int(at(0, 1).timestamp() * 1000), int(at(0, 2).timestamp())
    stored = {
        "part-uint64-ms.parquet": ("a", pa.uint64(), millis),
        "part-uint64-s.parquet": ("b", pa.uint64(), seconds),
        "part-decimal-ms.parquet": ("c", pa.decimal128(20, 0), decimal.Decimal(millis)),
    }
    for name, (id_, commit_type, committed) in stored.items():
        write_events(
            landing, "accounts", 0, name, [event(id_, "I", 1, committed)], _with_commit_type(commit_type)
        )
    batch, current, _ = _fold(spark, landing, hours=(0,))
    assert batch.quarantined == [] and batch.reconciles
    assert {k: r["_version_at"] for k, r in current.items()} == {
        "a": at(0, 1).replace(tzinfo=None),
        "b": at(0, 2).replace(tzinfo=None),
        "c": at(0, 1).replace(tzinfo=None),
    }


def test_operations_are_trimmed_of_any_white_space_and_compared_in_ascii_case(spark, tmp_path):
    """Tabs, line breaks and no-break spaces around an operation are trimmed, as plain spaces
    were; a letter outside ASCII that upper-cases to an ASCII one (a dotless i) is no spelling."""
    landing = tmp_path / "unit"
    spelled = {"a": "\tU", "b": "U\n", "c": "\u00a0update\u00a0", "d": " d ", "e": "\u0131nsert"}
    for n, (id_, op) in enumerate(spelled.items()):
        write_events(landing, "accounts", 0, f"part-{id_}.parquet", [event(id_, op, n, at(0, n))])
    batch, current, _ = _fold(spark, landing, hours=(0,))
    reasons = {q.uri.rsplit("/", 1)[-1]: q.reason for q in batch.quarantined}
    assert list(reasons) == ["part-e.parquet"] and "unknown cdc_operation_type" in reasons["part-e.parquet"]
    assert set(current) == {"a", "b", "c"}


def test_payload_times_in_nanoseconds_are_kept_as_times(spark, tmp_path):
    """Spark reads Parquet nanoseconds as a number: a payload column of them was stored as a
    count of nanoseconds, and beside microseconds of another file became text in two spellings."""
    landing = tmp_path / "unit"
    moment = dt.datetime(2024, 2, 1, 12, 0, 0, 123456)
    for n, unit in enumerate(("ns", "us")):
        schema = pa.schema(
            [*ACCOUNT_SCHEMA, ("reviewed", pa.timestamp(unit)), ("seen", pa.timestamp(unit, "UTC"))]
        )
        row = event(f"k{unit}", "I", n, at(0, n), reviewed=moment, seen=moment.replace(tzinfo=dt.UTC))
        write_events(landing, "accounts", n, "part-0.parquet", [row], schema)
    batch, current, _ = _fold(spark, landing, hours=(0, 1))
    assert batch.quarantined == [] and batch.reconciles
    assert dict(batch.events.dtypes)["reviewed"] in ("timestamp", "timestamp_ntz")
    assert {r["reviewed"].replace(tzinfo=None) for r in current.values()} == {moment}
    assert {r["seen"].replace(tzinfo=None) for r in current.values()} == {moment}


def test_folders_numbered_in_other_scripts_digits_are_no_hour(tmp_path):
    """An hour folder named with Arabic-Indic digits (U+0660, U+0667) was read as the hour 07: a folder level takes ASCII
    digits only, and the file is a stray."""
    landing = tmp_path / "unit"
    folder = landing / "accounts" / "year=2024" / "month=03" / "day=01" / "hour=\u0660\u0667"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([event("a", "I", 1, at(7))]), folder / "part-0.parquet")
    uri = f"file://{landing}"
    assert FMT.partition_keys(Storage(), uri, "accounts") == []
    assert [entry.name for entry, _ in FMT.stray_files(Storage(), uri, "accounts")] == ["part-0.parquet"]


def test_payload_nanoseconds_at_the_edge_of_a_long_are_read(spark, tmp_path):
    """Rounding nanoseconds down subtracted the remainder from the value, which overflowed for
    the smallest longs: one such payload value failed the batch's read."""
    landing = tmp_path / "unit"
    schema = pa.schema([*ACCOUNT_SCHEMA, ("reviewed", pa.timestamp("ns"))])
    rows = [event("a", "I", 1, at(0), reviewed=-(2**63)), event("b", "I", 2, at(0, 1), reviewed=-1)]
    write_events(landing, "accounts", 0, "part-0.parquet", rows, schema)
    storage = Storage()
    files = {"2024-03-01-00": data_files(storage, f"file://{hour_dir(landing, 'accounts', 0)}")}
    batch = read_batch(spark, storage, FMT, "accounts", files)
    assert batch.quarantined == [] and batch.reconciles
    micros = {
        r["id"]: r["micros"]
        for r in batch.events.select("id", F.unix_micros("reviewed").alias("micros")).collect()
    }
    assert micros == {"a": -(2**63) // 1000, "b": -1}  # rounded down


def test_key_times_finer_than_a_microsecond_set_their_file_aside(spark, tmp_path):
    """Spark keeps times to the microsecond: a key of nanoseconds was rounded down as it was read,
    two keys a nanosecond apart became one, and the first one's record was lost from every layer
    (its id even from `changes`). Such a file is set aside; keys in whole microseconds, as pandas
    writes most, are read."""
    landing = tmp_path / "unit"
    schema = pa.schema([("id", pa.timestamp("ns", "UTC")), *list(ACCOUNT_SCHEMA)[1:]])
    second = 1_717_236_000 * 10**9
    apart = [event(second + 1, "I", 1, at(0), name="a"), event(second + 2, "I", 2, at(0, 1), name="b")]
    write_events(landing, "accounts", 0, "part-apart.parquet", apart, schema)
    whole = [
        event(second + 1000, "I", 3, at(0, 2), name="c"),
        event(second + 2000, "I", 4, at(0, 3), name="d"),
    ]
    write_events(landing, "accounts", 0, "part-whole.parquet", whole, schema)
    # an INT96 time (nanoseconds to pyarrow, which wraps those before 1677 around) is left alone
    int96 = hour_dir(landing, "accounts", 0) / "part-int96.parquet"
    early = pa.Table.from_pylist(
        [event(dt.datetime(1600, 1, 1), "I", 5, at(0, 4), name="e", balance=1)],
        pa.schema([("id", pa.timestamp("us")), *list(ACCOUNT_SCHEMA)[1:]]),
    )
    pq.write_table(early, int96, use_deprecated_int96_timestamps=True)
    batch, current, _ = _fold(spark, landing, hours=(0,))
    reasons = {q.uri.rsplit("/", 1)[-1]: q.reason for q in batch.quarantined}
    assert list(reasons) == ["part-apart.parquet"]
    assert "key column 'id' holds times finer than a microsecond" in reasons["part-apart.parquet"]
    assert sorted(r["name"] for r in current.values()) == ["c", "d", "e"]
    assert batch.reconciles


def test_an_s3_key_that_is_also_a_folder_is_a_stray_and_the_rest_of_its_hour_is_read(
    tmp_path, moto_server, s3_bucket
):
    """`x.parquet` beside `x.parquet/_SUCCESS` (a Spark job's output folder, or an upload tool's
    marker): s3a reads the folder's files for that path, not the object, so the hour's read
    failed and stopped every hour of the table, naming no file. The object is now a stray with
    its reason, the files under it are strays or hidden as anywhere else, and the hour reads."""
    landing = tmp_path / "unit"
    good = write_events(
        landing, "accounts", 1, "part-good.parquet", [event("a", "I", 1, at(1), name="ok")], ACCOUNT_SCHEMA
    )
    s3 = moto_server.client("s3")
    hour = good.parent.relative_to(landing).as_posix()
    for key in ("part-good.parquet", "shadowed.parquet", "shadowed.parquet/_SUCCESS", "nested.parquet"):
        s3.put_object(Bucket=s3_bucket, Key=f"unit/{hour}/{key}", Body=good.read_bytes())
    s3.put_object(Bucket=s3_bucket, Key=f"unit/{hour}/nested.parquet/part-0.parquet", Body=good.read_bytes())
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/unit"

    strays = {
        e.uri.removeprefix(f"{uri}/{hour}/"): reason
        for e, reason in FMT.stray_files(storage, uri, "accounts")
    }

    assert set(strays) == {"shadowed.parquet", "nested.parquet", "nested.parquet/part-0.parquet"}
    assert "whose key is also a folder" in strays["shadowed.parquet"]
    assert "whose key is also a folder" in strays["nested.parquet"]
    assert [e.name for e in FMT.partition_files(storage, uri, "accounts", "2024-03-01-01")] == [good.name]
    copy = quarantine_file(
        storage,
        LakeLayout(f"s3a://{s3_bucket}/lake"),
        "unit",
        "accounts",
        "2024-03-01-01",
        Quarantined(f"{uri}/{hour}/shadowed.parquet", strays["shadowed.parquet"]),
        None,
    )
    assert storage.read_bytes(copy) == good.read_bytes()


def test_an_s3_key_holding_a_carriage_return_is_listed_as_it_is_and_read(
    tmp_path, moto_server, s3_bucket, spark
):
    """S3 sends a listing as XML, whose parsers turn a carriage return into a line feed unless
    the keys come URL-encoded: the hour's listing named `cr\\nx.parquet`, which no one could
    open, and the table's catalog step failed on every run. Listed as it is, it is hashed, and
    read by Spark."""
    from lake_assets.catalog.files import hash_file
    from lake_assets.ingest import read_landed

    landing = tmp_path / "unit"
    good = write_events(
        landing, "accounts", 1, "part-good.parquet", [event("a", "I", 1, at(1), name="ok")], ACCOUNT_SCHEMA
    )
    s3 = moto_server.client("s3")
    hour = good.parent.relative_to(landing).as_posix()
    s3.put_object(Bucket=s3_bucket, Key=f"unit/{hour}/cr\rx.parquet", Body=good.read_bytes())
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/unit"

    (listed,) = FMT.partition_files(storage, uri, "accounts", "2024-03-01-01")
    assert listed.name == "cr\rx.parquet"
    assert hash_file(storage, listed.uri)
    assert FMT.stray_files(storage, uri, "accounts") == []
    assert read_landed(spark, "parquet", [listed.uri]).count() == 1


def test_a_whole_landing_is_listed_in_one_walk_that_finds_what_the_folder_descent_finds(
    tmp_path, moto_server, s3_bucket, monkeypatch
):
    """With no window (a sensor's first scan) the landed hours come from one listing of the
    table's keys: descending folder by folder made a request per year, month, day and hour, and
    a year of hours on S3 took minutes, past the time Dagster gives a sensor's tick. The walk
    finds exactly the files the descent finds, on a landing of every kind of stray, an hour
    spelt two ways, hidden files and an hour not begun yet, on S3 and on local disk."""
    from lake_assets.feeds import unit_cdc

    landing = tmp_path / "unit"
    good, _ = landing_with_strays(landing)
    table = landing / "accounts"
    for folder, name in (
        ("year=2024/month=3/day=1/hour=1", "part-unpadded.parquet"),  # hour 2024-03-01-01 again
        ("year=2024/month=03/day=01/hour=02", "part-next.parquet"),
        ("year=2024/month=03/day=01/hour=02", "_SUCCESS"),
        ("year=2024/month=03/day=01/hour=02/_temporary", "part-hidden.parquet"),
        ("year=2999/month=01/day=01/hour=00", "part-future.parquet"),
    ):
        (table / folder).mkdir(parents=True, exist_ok=True)
        (table / folder / name).write_bytes(good.read_bytes())
    since_ever = dt.datetime(1000, 1, 1)  # a window reaching every hour: the descent's listing

    def found(storage: Storage, uri: str, since: dt.datetime | None) -> dict[str, list[tuple[str, str, int]]]:
        hours = FMT.landed_hours(storage, uri, "accounts", since)
        return {key: [(e.uri, e.name, e.size) for e in files] for key, files in hours.items() if files}

    local = f"file://{landing}"
    assert found(Storage(), local, None) == found(Storage(), local, since_ever)
    # a run asking many hours' files (a backfill) walks too, and is given what the listing gives
    asked = ["2024-03-01-00", "2024-03-01-01", "2024-03-01-02", "2024-03-02-00"]
    listed = FMT.partitions_files(Storage(), local, "accounts", asked)
    monkeypatch.setattr(unit_cdc, "WALK_FROM_HOURS", 1)
    walking = CountingStorage()
    assert {
        k: sorted(e.uri for e in v)
        for k, v in FMT.partitions_files(walking, local, "accounts", asked).items()
    } == {k: sorted(e.uri for e in v) for k, v in listed.items()}
    assert walking.listed == [] and listed["2024-03-01-00"] == [] and len(listed["2024-03-01-01"]) == 2
    assert sorted(found(Storage(), local, None)) == ["2024-03-01-01", "2024-03-01-02"]
    assert [name for _, name, _ in found(Storage(), local, None)["2024-03-01-01"]] == [
        "part-good.parquet",
        "part-unpadded.parquet",
    ]

    _upload_without_links(moto_server, s3_bucket, landing)
    storage = CountingStorage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/unit"
    whole = found(storage, uri, None)
    assert storage.listed == []  # one listing of the keys, no folder listed
    assert whole == found(storage, uri, since_ever) and sorted(whole) == ["2024-03-01-01", "2024-03-01-02"]


def test_a_landing_walk_that_cannot_list_an_hour_folder_raises_rather_than_leave_the_hour_out(tmp_path):
    """A local folder the walk cannot list (an I/O error, a stale NFS handle) comes out of it
    as an unreadable entry; its hour must not simply be missing from the landing (a first sensor
    scan would move past it for good): the landing is listed folder by folder instead, which
    raises for it as it always did."""
    import errno

    landing = tmp_path / "unit"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1))], ACCOUNT_SCHEMA)
    failing = write_events(
        landing, "accounts", 2, "part-0.parquet", [event("b", "I", 1, at(2))], ACCOUNT_SCHEMA
    )

    class FailingShare(Storage):
        def _list_local(self, uri: str, path: str):
            if path.rstrip("/") == str(failing.parent):
                raise OSError(errno.EIO, "Input/output error", path)
            return super()._list_local(uri, path)

    with pytest.raises(OSError, match="Input/output error"):
        FMT.landed_hours(FailingShare(), f"file://{landing}", "accounts", None)
    assert sorted(FMT.landed_hours(Storage(), f"file://{landing}", "accounts", None)) == [
        "2024-03-01-01",
        "2024-03-01-02",
    ]


def test_a_landing_walk_enters_no_folder_below_the_hour_folders(tmp_path):
    """A link in an hour folder may lead into a large tree (a share's root): the walk that lists
    the landing's hours lists the hour folders' own entries and enters nothing below them, where
    no file is an hour's. It finds what the folder descent finds."""
    landing = tmp_path / "unit"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1))], ACCOUNT_SCHEMA)
    tree = tmp_path / "share"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "part-deep.parquet").write_bytes(b"PAR1")
    hour = landing / "accounts" / "year=2024" / "month=03" / "day=01" / "hour=01"
    (hour / "share").symlink_to(tree, target_is_directory=True)
    (hour / "nested").mkdir()

    listed: list[str] = []

    class ListingSpy(Storage):
        def _list_local(self, uri: str, path: str):
            listed.append(path)
            return super()._list_local(uri, path)

    uri = f"file://{landing}"
    walked = FMT.landed_hours(ListingSpy(), uri, "accounts", None)
    assert [p for p in listed if p.startswith(str(hour)) and p.rstrip("/") != str(hour)] == []
    descended = FMT.landed_hours(Storage(), uri, "accounts", dt.datetime(1000, 1, 1))
    assert {k: [e.uri for e in v] for k, v in walked.items()} == {
        k: [e.uri for e in v] for k, v in descended.items() if v
    }
    assert [e.name for e in walked["2024-03-01-01"]] == ["part-0.parquet"]
