"""Schema drift across folds, and purges reaching the change log."""

import datetime as dt
import decimal

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets import lake_io, pipeline
from lake_assets.catalog.files import catalog_what
from lake_assets.catalog.parquet_store import ParquetCatalogStore
from lake_assets.engine import merge, purges
from lake_assets.engine import model as m
from lake_assets.engine.fold import fold
from lake_assets.engine.schema import union_all, widen
from lake_assets.engine.state import CommitPlan, parquet_files
from lake_assets.errors import SchemaClash
from lake_assets.storage import Storage, parquet_footer, read_lake_json
from lake_assets_tests.engine_harness import SCHEMA, EngineLake, as_row, utc


def _frame(spark, rows, amount_type):
    schema = T.StructType(
        [
            T.StructField("id", T.StringType()),
            T.StructField("amount", amount_type),
            T.StructField(m.OP, T.StringType()),
            T.StructField(m.VERSION_AT, T.TimestampType()),
            T.StructField(m.SEQ, T.LongType()),
        ]
    )
    return (
        spark.createDataFrame(rows, schema)
        .withColumn(m.PURGED, F.lit(False))
        .withColumn(m.SOURCE_FILE, F.lit("f"))
    )


def test_types_widen_across_folds_and_a_clash_names_table_column_and_types(spark, tmp_path):
    lake = EngineLake(spark, tmp_path, spec=m.TableSpec(name="ledger", keys=("id",)))
    storage = Storage()
    fold(
        spark,
        storage,
        lake.state,
        _frame(spark, [("a", 1, "insert", utc(2024, 1, 1), 1)], T.IntegerType()),
        lake.spec,
    )
    fold(
        spark,
        storage,
        lake.state,
        _frame(spark, [("a", 2**40, "update", utc(2024, 1, 2), 2)], T.LongType()),
        lake.spec,
    )
    fold(
        spark,
        storage,
        lake.state,
        _frame(spark, [("b", 2.5, "insert", utc(2024, 1, 3), 3)], T.DoubleType()),
        lake.spec,
    )
    history = lake.history()
    assert [(r["id"], r["amount"]) for r in history] == [("a", 1.0), ("a", float(2**40)), ("b", 2.5)]
    assert spark.read.parquet(lake.state.current).schema["amount"].dataType == T.DoubleType()

    # A boolean beside numbers: no number type holds both, text keeps every value (the table
    # goes on, rather than stopping at every run from here on).
    fold(
        spark,
        storage,
        lake.state,
        _frame(spark, [("c", True, "insert", utc(2024, 1, 4), 4)], T.BooleanType()),
        lake.spec,
    )
    assert spark.read.parquet(lake.state.current).schema["amount"].dataType == T.StringType()
    assert sorted((r["id"], r["amount"]) for r in lake.current()) == [
        ("a", "1.099511627776E12"),
        ("b", "2.5"),
        ("c", "true"),
    ]
    # Every history file, the closed ones the folds did not otherwise touch too, holds the
    # widened type: Spark's merged read of the whole table cannot merge a double with text.
    history_files = [e.uri for e in storage.walk_files(f"file://{tmp_path}") if "/history/" in e.uri]
    assert len(history_files) >= 2
    assert {_arrow_type(storage, uri, "amount") for uri in history_files} == {"string"}
    merged = spark.read.option("recursiveFileLookup", "true").option("mergeSchema", "true")
    assert merged.parquet(lake.state.history).count() == 4


def test_a_widening_with_late_data_rewrites_the_closed_files_the_late_data_does_not_reach(spark, tmp_path):
    """Late data reaches only the last closed files of a day (one per end hour in small folds):
    a widening in the same fold took the whole day as rewritten, and left the day's earlier
    files in the old type for good (the open set, widened now, never said so again)."""
    lake = EngineLake(spark, tmp_path, spec=m.TableSpec(name="ledger", keys=("id",)))
    storage = Storage()
    at = [utc(2024, 1, 1, hour) for hour in range(8)]
    fold(
        spark,
        storage,
        lake.state,
        _frame(spark, [("a", 1, "insert", at[1], 1), ("b", 3, "insert", at[3], 3)], T.LongType()),
        lake.spec,
    )
    fold(
        spark,
        storage,
        lake.state,
        _frame(spark, [("a", 2, "update", at[2], 2), ("b", 4, "update", at[4], 4)], T.LongType()),
        lake.spec,
    )
    closed = f"{lake.state.history_closed}/2024-01-01"
    assert len(parquet_files(storage, closed)) == 2  # a's row closed in hour 1, b's in hour 3
    # b's late version at 03:30 reaches the hour-3 file only; 2.5 widens the column
    late_and_wide = [
        ("b", 3.5, "update", at[3] + dt.timedelta(minutes=30), 5),
        ("c", 2.5, "insert", at[5], 6),
    ]
    fold(spark, storage, lake.state, _frame(spark, late_and_wide, T.DoubleType()), lake.spec)
    history_files = [e.uri for e in storage.walk_files(f"file://{tmp_path}") if "/history/" in e.uri]
    assert {_arrow_type(storage, uri, "amount") for uri in history_files} == {"double"}
    assert [(r["id"], r["amount"]) for r in lake.history()] == [
        ("a", 1.0),
        ("a", 2.0),
        ("b", 3.0),
        ("b", 3.5),
        ("b", 4.0),
        ("c", 2.5),
    ]


@pytest.mark.parametrize(
    ("left", "right", "widened", "as_key"),
    [
        (T.ByteType(), T.LongType(), T.LongType(), T.LongType()),
        (T.IntegerType(), T.FloatType(), T.DoubleType(), T.DoubleType()),
        (T.LongType(), T.DecimalType(20, 0), T.DecimalType(20, 0), T.DecimalType(20, 0)),
        (T.IntegerType(), T.DecimalType(10, 2), T.DecimalType(12, 2), T.DecimalType(12, 2)),
        (T.DecimalType(10, 2), T.DecimalType(12, 4), T.DecimalType(12, 4), T.DecimalType(12, 4)),
        (T.DecimalType(38, 10), T.LongType(), T.DecimalType(38, 10), T.DecimalType(38, 10)),
        # 20 whole digits and 30 after the point: no decimal holds both
        (T.DecimalType(38, 30), T.LongType(), T.StringType(), None),
        # a double rounds 64-bit integers beyond 2^53 and long decimals: two keys would become one
        (T.LongType(), T.DoubleType(), T.DoubleType(), None),
        (T.DecimalType(20, 0), T.DoubleType(), T.DoubleType(), None),
        # scalars no number or time holds together: text spells every value (as keys: refused)
        (T.BooleanType(), T.LongType(), T.StringType(), None),
        (T.DateType(), T.DoubleType(), T.StringType(), None),
        (T.BooleanType(), T.DateType(), T.StringType(), None),
        # a date is its day's first instant
        (T.DateType(), T.TimestampType(), T.TimestampType(), None),
    ],
)
def test_numbers_widen_into_one_type_and_keys_only_where_no_value_changes(left, right, widened, as_key):
    assert widen("t", "c", left, right) == widened and widen("t", "c", right, left) == widened
    if as_key is None:
        with pytest.raises(SchemaClash, match="column 'c' has type"):
            widen("t", "c", left, right, exact=True)
    else:
        assert widen("t", "c", left, right, exact=True) == as_key


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (T.StructType([T.StructField("x", T.LongType())]), T.StringType()),
        (T.ArrayType(T.LongType()), T.LongType()),
        (T.MapType(T.StringType(), T.LongType()), T.BooleanType()),
    ],
)
def test_a_struct_array_or_map_meeting_another_type_is_a_clash_not_text(left, right):
    """Spark's text of a struct (`{1, x}`) drops its field names and cannot be read back."""
    for pair in ((left, right), (right, left)):
        with pytest.raises(SchemaClash, match="column 'c' has type"):
            widen("t", "c", *pair)


def test_union_all_projects_only_frames_out_of_shape(spark):
    """Frames already in the union's shape are unioned as they are (no projection of every
    column to build and analyse); a frame that lacks a column or has a narrower type is
    conformed: NULL for the missing column, the type widened."""
    wide = spark.createDataFrame([("a", 1, "x")], "id string, n bigint, note string")
    same = spark.createDataFrame([("b", 2, "y")], "id string, n bigint, note string")
    narrow = spark.createDataFrame([("c", 3)], "id string, n int")

    def projections(frame):
        return str(frame._jdf.queryExecution().analyzed()).count("Project [")

    plain = projections(wide.unionByName(same))  # what Spark's by-name union itself plans
    assert projections(union_all("t", [wide, same])) == plain
    mixed = union_all("t", [wide, narrow])
    assert projections(mixed) == plain + 1
    assert mixed.schema.simpleString() == "struct<id:string,n:bigint,note:string>"
    assert sorted(tuple(r) for r in mixed.collect()) == [("a", 1, "x"), ("c", 3, None)]


def test_columns_added_and_dropped_across_folds(spark, tmp_path):
    lake = EngineLake(spark, tmp_path)
    lake.fold([{"id": "a", "op": "insert", "version_at": utc(2024, 1, 1), "seq": 1, "c1": "old", "c2": 1}])
    frame = (
        spark.createDataFrame(
            [("a", "new", "update", dt.datetime(2024, 1, 2), 2)],
            "id string, c3 string, _op string, _version_at timestamp, _seq long",
        )
        .withColumn(m.PURGED, F.lit(False))
        .withColumn(m.SOURCE_FILE, F.lit("f"))
    )
    fold(spark, Storage(), lake.state, frame, lake.spec)
    rows = lake.history()
    assert [(r["c1"], r["c2"], r["c3"]) for r in rows] == [("old", 1, None), (None, None, "new")]


@pytest.mark.parametrize("first, second", [("text", "bytes"), ("bytes", "text")])
def test_bytes_meeting_text_in_a_later_fold_become_valid_utf8_text(spark, tmp_path, first, second):
    """A column stored as text by one fold and given as bytes by a later one (or the other way
    round) widens to text. A batch's own text is repaired as it is read; bytes cast to text in
    the fold were not, and the table's files held text that is not UTF-8, which pyarrow and
    DuckDB refuse for the whole table."""
    import pyarrow.parquet as pq

    lake = EngineLake(spark, tmp_path)
    values = {"text": ("a", "ok"), "bytes": ("b", bytearray(b"M\xfcller\xff"))}

    def batch(kind, day):
        key, value = values[kind]
        type_name = "string" if kind == "text" else "binary"
        return (
            spark.createDataFrame(
                [(key, value, "insert", dt.datetime(2024, 1, day), 1)],
                f"id string, blob {type_name}, _op string, _version_at timestamp, _seq long",
            )
            .withColumn(m.PURGED, F.lit(False))
            .withColumn(m.SOURCE_FILE, F.lit("f"))
        )

    fold(spark, Storage(), lake.state, batch(first, 1), lake.spec)
    fold(spark, Storage(), lake.state, batch(second, 2), lake.spec)

    for folder in (lake.state.current, lake.state.history):
        for path in (tmp_path / folder[len(f"file://{tmp_path}/") :]).rglob("*.parquet"):
            pq.read_table(path)  # raised on text that is not UTF-8
    assert {r["id"]: r["blob"] for r in lake.current()} == {"a": "ok", "b": "M\ufffdller\ufffd"}


def test_a_purge_erasure_stages_every_change_log_partition_still_holding_the_key(spark, tmp_path):
    """Partitions holding the key's field data (or its rows without the marker) are staged with
    the key erased; a partition where the key is erased already, or absent, is left alone."""
    storage = Storage()
    table = f"file://{tmp_path}/changes/test/things"
    log = spark.createDataFrame(
        [
            ("p", "secret", "h1", False),
            ("q", "keep", "h1", False),
            ("p", "secret2", "h2", False),
            ("q", "keep2", "h3", False),
            ("p", None, "h4", True),
        ],
        "id string, c1 string, hour string, _purged boolean",
    )
    lake_io.write_partitions(log, storage, table, "hour", ["h1", "h2", "h3", "h4"])
    staging = f"file://{tmp_path}/staging"
    purged = spark.createDataFrame([("p",)], "id string")
    assert lake_io.erase_keys_in_partitions(spark, storage, table, "hour", ["id"], purged, staging) == [
        "h1",
        "h2",
    ]
    rows = sorted(
        tuple(r)
        for r in lake_io.read_partitions(spark, storage, staging, "hour", None)
        .select("id", "c1", "hour", "_purged")
        .collect()
    )
    assert rows == [("p", None, "h1", True), ("p", None, "h2", True), ("q", "keep", "h1", False)]
    unchanged = (
        lake_io.read_partitions(spark, storage, table, "hour", None)
        .where("id = 'p' AND c1 IS NOT NULL")
        .count()
    )
    assert unchanged == 2  # staged only: the caller's commit puts them in place


def _arrow_type(storage, uri, column) -> str:
    return str(parquet_footer(storage, uri).schema.to_arrow_schema().field(column).type)


def _parquet_type(storage, folder, column):
    """The Parquet (arrow) type of `column` in the files of `folder`, one per file."""
    return {_arrow_type(storage, uri, column) for uri in parquet_files(storage, folder)}


def test_a_purge_erasure_keeps_each_partition_s_own_column_types_even_where_they_cannot_be_widened(
    spark, tmp_path
):
    """Partitions whose types drifted apart, even beyond widening (a struct in one, a number in
    another), are erased each with the types it was written with: a purge neither fails on the
    clash nor rewrites a partition's columns into another partition's types."""
    storage = Storage()
    table = f"file://{tmp_path}/changes/test/things"
    layouts = {
        "h1": ("c1 struct<a: int>", [("p", (1,)), ("q", (2,))]),
        "h2": ("c1 bigint", [("p", 2**40), ("q", 3)]),
        "h3": ("c1 int", [("p", 4), ("q", 5)]),
        "h4": ("c1 int", [("q", 6)]),
    }
    for hour, (column, rows) in layouts.items():
        frame = spark.createDataFrame(rows, f"id string, {column}").select(
            "id", "c1", F.lit(False).alias(m.PURGED), F.lit(hour).alias("hour")
        )
        lake_io.write_partitions(frame, storage, table, "hour", [hour])
    (tmp_path / "changes" / "test" / "things" / "hour=h5").mkdir()  # a folder left without files
    staging = f"file://{tmp_path}/staging"
    purged = spark.createDataFrame([("p",)], "id string")
    erased = lake_io.erase_keys_in_partitions(spark, storage, table, "hour", ["id"], purged, staging)
    assert erased == ["h1", "h2", "h3"]
    types = {hour: _parquet_type(storage, f"{staging}/hour={hour}", "c1") for hour in erased}
    assert types == {"h1": {"struct<a: int32>"}, "h2": {"int64"}, "h3": {"int32"}}
    for hour in erased:
        rows = spark.read.parquet(f"{staging}/hour={hour}").select("id", "c1", m.PURGED).collect()
        assert sorted((r["id"], r["c1"] is None, r[m.PURGED]) for r in rows) == [
            ("p", True, True),
            ("q", False, False),
        ]


class Crash(Exception):
    pass


def _purge_commit_outcome(lake, changes):
    """(purge recorded, field data left in the change log, field data left in history) of key p."""
    ledger = purges.ledger(lake.spark, lake.storage, lake.state, ["id"])
    recorded = ledger is not None and ledger.where("id = 'p'").count() > 0
    in_log = (
        lake_io.read_partitions(lake.spark, lake.storage, changes, "hour", None)
        .where("id = 'p' AND c1 IS NOT NULL")
        .count()
        > 0
    )
    in_history = any(r["c1"] is not None for r in lake.history() if r["id"] == "p")
    return recorded, in_log, in_history


CREATED = [
    {"id": "p", "op": "insert", "version_at": utc(2024, 1, 1), "seq": 1, "c1": "secret", "c2": 1},
    {"id": "q", "op": "insert", "version_at": utc(2024, 1, 1), "seq": 2, "c1": "keep"},
]
PURGE = [{"id": "p", "op": "update", "version_at": utc(2024, 1, 3), "seq": 3, "purged": True}]


def _change_log(spark):
    """The change log of CREATED (partition h1) and PURGE (h2)."""
    return spark.createDataFrame([as_row(e) for e in CREATED + PURGE], SCHEMA).withColumn(
        "hour", F.when(F.col(m.PURGED), "h2").otherwise("h1")
    )


def _lake_before_the_purge(spark, root) -> EngineLake:
    lake = EngineLake(spark, root)
    lake_io.write_partitions(_change_log(spark), lake.storage, lake.state.changes, "hour", ["h1", "h2"])
    lake.fold(CREATED, log_column="hour")
    return lake


def _crash_at(at: str):
    def crash(step):
        if step == at:
            raise Crash(step)

    return crash


def test_a_purge_is_recorded_and_erased_from_state_and_change_log_in_one_commit(spark, tmp_path):
    """Killed at any step of the commit of the fold that first meets a purge, the next fold's
    recovery leaves all of it (recorded, erased from history and from the change log) or none of
    it (and folding the batch again does it all): never a recorded purge with field data left."""
    steps = []
    lake = _lake_before_the_purge(spark, tmp_path / "uninterrupted")
    lake.fold(PURGE, log_column="hour", on_commit_step=steps.append)
    assert _purge_commit_outcome(lake, lake.state.changes) == (True, False, False)
    assert "add 0" in steps and "delete 0" in steps

    adds = [s for s in steps if s.startswith("add")]
    deletes = [s for s in steps if s.startswith("delete")]
    for crash_at in ("record", adds[0], adds[-1], deletes[0], deletes[-1], "forget"):
        lake = _lake_before_the_purge(spark, tmp_path / crash_at.replace(" ", "-"))
        with pytest.raises(Crash):
            lake.fold(PURGE, log_column="hour", on_commit_step=_crash_at(crash_at))
        recovered = lake.fold([]).recovered_folds  # what the next fold does first
        assert len(recovered) == (0 if crash_at == "record" else 1), crash_at
        outcome = _purge_commit_outcome(lake, lake.state.changes)
        assert outcome in ((False, True, True), (True, False, False)), crash_at
        assert outcome == ((False, True, True) if crash_at == "record" else (True, False, False)), crash_at
        lake.fold(PURGE, log_column="hour")
        assert _purge_commit_outcome(lake, lake.state.changes) == (True, False, False), crash_at


def test_a_change_log_partition_stored_again_after_a_killed_purge_commit_holds_each_row_once(spark, tmp_path):
    """The fold that first meets a purge is killed at its commit's first move (the others, made
    on other threads, may have run); before the
    next fold, h1 of the change log is stored again (a run over that hour: a late file). The
    write finishes the killed commit first, so h1 holds each row once, the purged key erased,
    and the files the commit put in place are catalogued; the erased copy of h1 the commit
    staged is never moved in beside the new files."""
    lake = _lake_before_the_purge(spark, tmp_path / "lake")
    with pytest.raises(Crash):
        lake.fold(PURGE, log_column="hour", on_commit_step=_crash_at("add 0"))
    (record,) = lake.storage.list(lake.state.commits)
    killed = read_lake_json(lake.storage, record.uri, CommitPlan)
    store = ParquetCatalogStore(f"file://{tmp_path}/catalog", lake.storage)

    pipeline.store_partitions(
        lake.storage,
        store,
        lake.state.changes,
        _change_log(spark).where("hour = 'h1'"),
        "hour",
        ["h1"],
        feed="test",
        table="things",
        run_id="rerun",
        keys=("id",),
        state=lake.state,
    )

    h1 = lake_io.read_partitions(spark, lake.storage, lake.state.changes, "hour", ["h1"])
    assert sorted(tuple(r) for r in h1.select("id", "c1").collect()) == [("p", None), ("q", "keep")]
    assert lake.fold([]).recovered_folds == []
    assert _purge_commit_outcome(lake, lake.state.changes) == (True, False, False)
    catalogued = {r["url"] for r in store.query_by_work_id("rerun", catalog_what("things"))}
    put_in_place = {final for _, final in killed.adds if lake.state.publishes(final)}
    assert put_in_place and put_in_place <= catalogued  # recorded by the write that finished the fold


def test_a_purged_key_is_erased_after_the_key_column_changed_type(spark):
    """The ledger keeps a key in the type it had when purged; a later batch whose key column
    drifted (number to text, or back) is still erased, and a recorded value the batch's type
    cannot hold matches nothing instead of failing the write."""
    numbers = spark.createDataFrame(
        [(7, "secret", False), (8, "keep", False)], "id bigint, c1 string, _purged boolean"
    )
    texts = spark.createDataFrame(
        [("7", "secret", False), ("x", "keep", False)], "id string, c1 string, _purged boolean"
    )
    recorded_as_text = spark.createDataFrame([("7",), ("abc",)], "id string")
    recorded_as_number = spark.createDataFrame([(7,)], "id bigint")
    for batch, recorded in ((numbers, recorded_as_text), (texts, recorded_as_number)):
        rows = sorted(
            (str(r["id"]), r["c1"], r["_purged"]) for r in merge.erase_keys(batch, ["id"], recorded).collect()
        )
        assert rows == sorted([("7", None, True), (str(batch.collect()[1]["id"]), "keep", False)])


def test_a_decimal_whose_precision_grows_between_folds_widens_and_keeps_every_value(spark, tmp_path):
    """A vendor widening a decimal column (decimal(10,2) to decimal(14,4)) used to be a clash
    against the stored table: every later fold failed."""
    lake = EngineLake(spark, tmp_path, spec=m.TableSpec(name="ledger", keys=("id",)))
    storage = Storage()
    for rows, amount_type in (
        ([("a", decimal.Decimal("12345678.91"), "insert", utc(2024, 1, 1), 1)], T.DecimalType(10, 2)),
        ([("a", decimal.Decimal("1234567890.1234"), "update", utc(2024, 1, 2), 2)], T.DecimalType(14, 4)),
        ([("b", 7, "insert", utc(2024, 1, 3), 3)], T.LongType()),
    ):
        fold(spark, storage, lake.state, _frame(spark, rows, amount_type), lake.spec)
    assert [(r["id"], r["amount"]) for r in lake.history()] == [
        ("a", decimal.Decimal("12345678.9100")),
        ("a", decimal.Decimal("1234567890.1234")),
        ("b", decimal.Decimal("7.0000")),
    ]
    assert spark.read.parquet(lake.state.current).schema["amount"].dataType == T.DecimalType(24, 4)


def test_a_purges_only_fold_keeps_the_state_types_whatever_the_change_log_drifted_to(spark, tmp_path):
    """A fold without events applies the purges a change-log write met (`purges.seen`). Its empty
    batch has the seen keys' shape: a later `changes` partition never folded (its `c2` drifted to
    boolean) does not widen current's `c2` to text."""
    created = [
        {"id": "p", "op": "insert", "version_at": utc(2024, 1, 1), "seq": 1, "c1": "secret", "c2": 1},
        {"id": "q", "op": "insert", "version_at": utc(2024, 1, 1), "seq": 2, "c1": "keep", "c2": 2},
    ]
    lake = EngineLake(spark, tmp_path)
    h1 = spark.createDataFrame([as_row(e) for e in created], SCHEMA).withColumn("hour", F.lit("h1"))
    lake_io.write_partitions(h1, lake.storage, lake.state.changes, "hour", ["h1"])
    lake.fold(created, log_column="hour")
    later = {"id": "r", "op": "insert", "version_at": utc(2024, 1, 2), "seq": 3, "c1": "x"}
    h2 = (
        spark.createDataFrame([as_row(later)], SCHEMA)
        .drop("c2")
        .withColumn("c2", F.lit(True))
        .withColumn("hour", F.lit("h2"))
    )
    lake_io.write_partitions(h2, lake.storage, lake.state.changes, "hour", ["h2"])
    purges._remember_seen(lake.storage, lake.state, spark.createDataFrame([("p",)], "id string"), ["h2"])

    report = fold(spark, lake.storage, lake.state, None, lake.spec, log_column="hour")

    assert report.events_in == 0 and report.newly_purged == [("p",)]
    assert spark.read.parquet(lake.state.current).schema["c2"].dataType == T.LongType()
    assert sorted((r["id"], r["c1"], r["c2"]) for r in lake.current()) == [
        ("p", None, None),
        ("q", "keep", 2),
    ]
    assert not purges.seen_files(lake.storage, lake.state)


def _write(op, at, seq, source, hour, **fields) -> dict:
    return {"id": "k", "op": op, "version_at": at, "seq": seq, "source_file": source, "hour": hour, **fields}


def test_copies_of_one_write_keep_the_same_copy_whichever_fold_met_the_purge_marker_first(spark, tmp_path):
    """Two copies of one write in two deliveries, one carrying the purge marker. Once a key is
    purged every row of it carries the marker, so a rank by the marker kept whichever copy a
    fold met first: folded in one order the key was deleted, in the other live, with another
    `_source_file`. The marker now purges the key whichever copy is kept, and the copy is
    picked as for any other key (the greatest file)."""
    at = utc(2024, 1, 1, 0, 0, 1)
    marked = _write("delete", at, 3, "file:///land/hour=02/b.parquet", "2024-01-01-02", purged=True)
    plain = _write("update", at, 3, "file:///land/hour=03/c.parquet", "2024-01-01-03", c1="z", c2=1)
    lakes = {
        order: EngineLake(spark, tmp_path / order) for order in ("at_once", "marked_first", "plain_first")
    }
    lakes["at_once"].fold([marked, plain])
    for order, batches in (("marked_first", ([marked], [plain])), ("plain_first", ([plain], [marked]))):
        for batch in batches:
            lakes[order].fold(batch)

    def seen(lake: EngineLake) -> tuple:
        history = [
            (r["_op"], r["c1"], r["c2"], r["_purged"], r["_source_file"], r["_fivetran_active"])
            for r in lake.history()
        ]
        return [(r["id"], r["c1"], r["_source_file"]) for r in lake.current()], history

    expected = (
        [("k", None, "file:///land/hour=03/c.parquet")],
        [("update", None, None, True, "file:///land/hour=03/c.parquet", True)],
    )
    assert {order: seen(lake) for order, lake in lakes.items()} == dict.fromkeys(lakes, expected)


def test_a_purged_key_s_rows_older_than_the_fold_s_batch_keep_their_sync(spark, tmp_path):
    """`_fivetran_synced` of a purged key: the rows the fold derives again, from the batch's
    earliest version on, take the fold's time; older rows keep theirs (docs/semantics.md). The
    open row the batch closes was given the fold's time, on the purge's fold and on every
    later one, while the rows before it kept theirs."""
    t = {i: utc(2024, 1, 1, 0, 0, i) for i in range(1, 6)}
    first, second = utc(2024, 2, 1), utc(2024, 2, 2)

    def event(op, i, **fields) -> dict:
        return {"id": "p", "op": op, "version_at": t[i], "seq": i, **fields}

    purged_now, purged_before = EngineLake(spark, tmp_path / "now"), EngineLake(spark, tmp_path / "before")
    purged_now.fold([event("insert", 1, c1="s1"), event("update", 2, c1="s2")], synced_at=first)
    purged_now.fold([event("update", 3, purged=True)], synced_at=second)
    purged_before.fold([event("insert", 1, c1="s1"), event("update", 2, purged=True)], synced_at=first)
    purged_before.fold([event("update", 4, c1="new")], synced_at=second)

    def synced(lake: EngineLake) -> dict:
        return {r["_fivetran_start"].second: (r["_fivetran_synced"], r["c1"]) for r in lake.history()}

    assert synced(purged_now) == {1: (first, None), 2: (first, None), 3: (second, None)}
    assert synced(purged_before) == {1: (first, None), 2: (first, None), 4: (second, None)}
