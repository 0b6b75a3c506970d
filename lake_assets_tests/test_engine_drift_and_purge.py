"""Schema drift across folds, and purges reaching the change log."""

import datetime as dt
import decimal

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets import lake_io
from lake_assets.engine import merge, purges
from lake_assets.engine import model as m
from lake_assets.engine.fold import fold
from lake_assets.engine.schema import union_all, widen
from lake_assets.errors import SchemaClash
from lake_assets.storage import Storage
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


class Crash(Exception):
    pass


def _purge_commit_outcome(lake, changes):
    """(purge recorded, field data left in the change log, field data left in history) of key p."""
    ledger = purges.ledger(lake.spark, lake.storage, lake.state)
    recorded = ledger is not None and ledger.where("id = 'p'").count() > 0
    in_log = (
        lake_io.read_partitions(lake.spark, lake.storage, changes, "hour", None)
        .where("id = 'p' AND c1 IS NOT NULL")
        .count()
        > 0
    )
    in_history = any(r["c1"] is not None for r in lake.history() if r["id"] == "p")
    return recorded, in_log, in_history


def test_a_purge_is_recorded_and_erased_from_state_and_change_log_in_one_commit(spark, tmp_path):
    """Killed at any step of the commit of the fold that first meets a purge, the next fold's
    recovery leaves all of it (recorded, erased from history and from the change log) or none of
    it (and folding the batch again does it all): never a recorded purge with field data left."""
    created = [
        {"id": "p", "op": "insert", "version_at": utc(2024, 1, 1), "seq": 1, "c1": "secret", "c2": 1},
        {"id": "q", "op": "insert", "version_at": utc(2024, 1, 1), "seq": 2, "c1": "keep"},
    ]
    purge = [{"id": "p", "op": "update", "version_at": utc(2024, 1, 3), "seq": 3, "purged": True}]

    def lake_before_the_purge(root):
        lake = EngineLake(spark, root)
        log = spark.createDataFrame([as_row(e) for e in created + purge], SCHEMA).withColumn(
            "hour", F.when(F.col(m.PURGED), "h2").otherwise("h1")
        )
        lake_io.write_partitions(log, lake.storage, lake.state.changes, "hour", ["h1", "h2"])
        lake.fold(created, log_column="hour")
        return lake

    steps = []
    lake = lake_before_the_purge(tmp_path / "uninterrupted")
    lake.fold(purge, log_column="hour", on_commit_step=steps.append)
    assert _purge_commit_outcome(lake, lake.state.changes) == (True, False, False)
    assert "add 0" in steps and "delete 0" in steps

    adds = [s for s in steps if s.startswith("add")]
    deletes = [s for s in steps if s.startswith("delete")]
    for crash_at in ("record", adds[0], adds[-1], deletes[0], deletes[-1], "forget"):
        lake = lake_before_the_purge(tmp_path / crash_at.replace(" ", "-"))

        def crash(step, at=crash_at):
            if step == at:
                raise Crash(step)

        with pytest.raises(Crash):
            lake.fold(purge, log_column="hour", on_commit_step=crash)
        recovered = lake.fold([]).recovered_folds  # what the next fold does first
        assert len(recovered) == (0 if crash_at == "record" else 1), crash_at
        outcome = _purge_commit_outcome(lake, lake.state.changes)
        assert outcome in ((False, True, True), (True, False, False)), crash_at
        assert outcome == ((False, True, True) if crash_at == "record" else (True, False, False)), crash_at
        lake.fold(purge, log_column="hour")
        assert _purge_commit_outcome(lake, lake.state.changes) == (True, False, False), crash_at


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
