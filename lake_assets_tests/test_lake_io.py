"""Replacing partitions of a lake table: exactly the run's partitions, nothing else."""

import datetime as dt

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from lake_assets import lake_io, spark_errors
from lake_assets.errors import ConfigError, DamagedLakeFile
from lake_assets.storage import Storage, parquet_footer


def test_write_partitions_replaces_exactly_the_given_partitions(spark, tmp_path):
    table = f"file://{tmp_path / 't'}"
    storage = Storage()
    first = spark.createDataFrame([("a", "h1"), ("b", "h2"), ("c", "h3")], "id string, hour string")
    assert lake_io.write_partitions(first, storage, table, "hour", ["h1", "h2", "h3"]) == {
        "h1": 1,
        "h2": 1,
        "h3": 1,
    }
    again = spark.createDataFrame([("d", "h2"), ("e", "h2")], "id string, hour string")
    # h2 is replaced, h3 had no rows this time and is emptied, h1 was not part of the run.
    assert lake_io.write_partitions(again, storage, table, "hour", ["h2", "h3"]) == {"h2": 2}
    rows = sorted((r["id"], r["hour"]) for r in spark.read.parquet(table).collect())
    assert rows == [("a", "h1"), ("d", "h2"), ("e", "h2")]


def test_what_a_killed_write_left_in_the_table_is_removed_by_the_next_write(spark, tmp_path):
    """A run killed while Spark wrote the change log leaves whole part files in the table's hidden
    staging folder: Spark skips it, a `**` glob (DuckDB's, as the README reads the lake) does not.
    The table's next write removes it."""
    table, storage = tmp_path / "t", Storage()
    rows = spark.createDataFrame([("a", "h1"), ("b", "h2")], "id string, hour string")
    lake_io.write_partitions(rows, storage, f"file://{table}", "hour", ["h1", "h2"])
    for leftover in (table / ".spark-staging-0f1e" / "hour=h1", table / "_temporary" / "0"):
        leftover.mkdir(parents=True)
        pq.write_table(pa.table({"id": ["a", "a"]}), leftover / "part-00000.parquet")
    glob = f"SELECT count(*) FROM read_parquet('{table}/**/*.parquet')"
    assert duckdb.sql(glob).fetchall() == [(6,)]

    lake_io.write_partitions(rows.where("hour = 'h2'"), storage, f"file://{table}", "hour", ["h2"])

    assert sorted(path.name for path in table.iterdir()) == ["hour=h1", "hour=h2"]
    assert duckdb.sql(glob).fetchall() == [(2,)]


def test_rows_outside_the_run_partitions_are_refused(spark, tmp_path):
    table = f"file://{tmp_path / 't'}"
    frame = spark.createDataFrame([("a", "h1"), ("b", "h9")], "id string, hour string")
    with pytest.raises(ValueError, match="'h9' do not belong"):
        lake_io.write_partitions(frame, Storage(), table, "hour", ["h1"])
    nulls = spark.createDataFrame([("a", None)], "id string, hour string")
    with pytest.raises(ValueError, match="'None' do not belong"):
        lake_io.write_partitions(nulls, Storage(), table, "hour", ["h1"])


def test_partition_values_of_digits_read_back_as_written(spark, tmp_path):
    """GRAX batch ids are hex: a batch of digits alone, read by itself, keeps its leading zeros
    (typed by inference it would come back as a number), and a purge finds it to erase; a
    session that infers partition types is refused, not trusted."""
    table = f"file://{tmp_path / 't'}"
    storage = Storage()
    frame = spark.createDataFrame([("a", "000000123"), ("b", "00000000e")], "id string, batch string")
    lake_io.write_partitions(frame, storage, table, "batch", ["000000123", "00000000e"])
    alone = lake_io.read_partitions(spark, storage, table, "batch", ["000000123"])
    assert [(r["id"], r["batch"]) for r in alone.collect()] == [("a", "000000123")]
    only_digits = f"file://{tmp_path / 'digits'}"
    lake_io.write_partitions(frame.where("id = 'a'"), storage, only_digits, "batch", ["000000123"])
    erased = lake_io.erase_keys_in_partitions(
        spark,
        storage,
        only_digits,
        "batch",
        ["id"],
        spark.createDataFrame([("a",)], "id string"),
        f"file://{tmp_path / 'staged'}",
    )
    assert erased == ["000000123"]
    spark.conf.set(lake_io.TYPE_INFERENCE, "true")  # a session someone else configured
    try:
        with pytest.raises(ConfigError, match=r"partitionColumnTypeInference\.enabled=false"):
            lake_io.read_partitions(spark, storage, table, "batch", ["000000123"])
    finally:
        spark.conf.set(lake_io.TYPE_INFERENCE, "false")


def test_files_reaching_a_time_are_told_by_their_footers(tmp_path):
    """Only files whose statistics prove every value older than the bound are left out; a file
    without the column or without statistics may reach it."""
    at = [dt.datetime(2024, 1, 1, h, tzinfo=dt.UTC) for h in range(24)]

    def write(name, ends, **options):
        pq.write_table(
            pa.table(
                {
                    "id": [str(i) for i in range(len(ends))],
                    "_end": pa.array(ends, pa.timestamp("us", tz="UTC")),
                }
            ),
            tmp_path / name,
            **options,
        )
        return f"file://{tmp_path / name}"

    older = write("older.parquet", [at[1], at[3]])
    touching = write("touching.parquet", [at[2], at[5]])  # max equals the bound
    newer = write("newer.parquet", [at[8]])
    groups = write("groups.parquet", [at[1], at[2], at[9]], row_group_size=1)  # only its last group reaches
    unknown = write("unknown.parquet", [at[1]], write_statistics=False)
    other = f"file://{tmp_path / 'other.parquet'}"
    pq.write_table(pa.table({"id": ["x"]}), tmp_path / "other.parquet")
    files = [older, touching, newer, groups, unknown, other]
    assert lake_io.files_reaching(Storage(), files, "_end", at[5]) == [
        touching,
        newer,
        groups,
        unknown,
        other,
    ]
    assert lake_io.files_reaching(Storage(), files, "_end", at[10]) == [unknown, other]
    naive = at[5].replace(tzinfo=None)  # a naive bound is read as UTC
    assert lake_io.files_reaching(Storage(), files, "_end", naive) == [
        touching,
        newer,
        groups,
        unknown,
        other,
    ]


def test_rows_in_files_are_counted_from_their_footers(tmp_path):
    """The counts come from each file's footer, across row groups, and add up over files."""
    pq.write_table(pa.table({"id": [str(i) for i in range(7)]}), tmp_path / "a.parquet", row_group_size=3)
    pq.write_table(pa.table({"id": ["x", "y"]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    files = [f"file://{tmp_path / name}" for name in ("a.parquet", "b.parquet", "empty.parquet")]
    assert lake_io.rows_in(Storage(), files) == 9
    assert lake_io.rows_in(Storage(), files[1:]) == 2
    assert lake_io.rows_in(Storage(), []) == 0


def test_single_files_whose_types_disagree_are_read_together_widened(spark, tmp_path):
    """The closed files a fold rewrites are named one by one; an int and a bigint copy of a
    column (schema drift between folds) still read as one frame."""
    pq.write_table(pa.table({"id": ["a"], "n": pa.array([1], pa.int32())}), tmp_path / "narrow.parquet")
    pq.write_table(pa.table({"id": ["b"], "n": pa.array([2**40], pa.int64())}), tmp_path / "wide.parquet")
    files = [f"file://{tmp_path / name}" for name in ("narrow.parquet", "wide.parquet")]
    frame = lake_io.read_drifting(spark, Storage(), files, table="t")
    assert dict(frame.dtypes)["n"] == "bigint"
    assert sorted((r["id"], r["n"]) for r in frame.collect()) == [("a", 1), ("b", 2**40)]


def _jobs_during(spark, action):
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    result = action()
    return result, len(set(tracker.getJobIdsForGroup()) - before)


def test_spark_written_files_of_one_schema_are_read_without_a_schema_job(spark, tmp_path):
    """Files Spark wrote carry its schema in their footers: when every file read carries the
    same one, it is handed to the reader, and no job merges schemas; partition columns still
    come from the folders. Files that drifted apart are merged by Spark as before."""
    storage = Storage()
    table = f"file://{tmp_path / 'log'}"
    frame = spark.createDataFrame([("a", 1, "h1"), ("b", 2, "h2")], "id string, n bigint, hour string")
    lake_io.write_partitions(frame, storage, table, "hour", ["h1", "h2"])
    read, jobs = _jobs_during(
        spark, lambda: lake_io.read_partitions(spark, storage, table, "hour", ["h1", "h2"])
    )
    assert jobs == 0
    assert read.dtypes == [("id", "string"), ("n", "bigint"), ("hour", "string")]
    assert sorted(tuple(r) for r in read.collect()) == [("a", 1, "h1"), ("b", 2, "h2")]

    # A later write added a column: the footers disagree, Spark merges (one job), nothing is lost.
    grown = spark.createDataFrame([("c", 3, "x", "h3")], "id string, n bigint, note string, hour string")
    lake_io.write_partitions(grown, storage, table, "hour", ["h3"])
    read, jobs = _jobs_during(
        spark, lambda: lake_io.read_partitions(spark, storage, table, "hour", ["h1", "h3"])
    )
    assert jobs >= 1
    assert sorted(tuple(r) for r in read.select("id", "n", "note", "hour").collect()) == [
        ("a", 1, None, "h1"),
        ("c", 3, "x", "h3"),
    ]


def test_a_table_summary_comes_from_the_footers_and_falls_back_to_spark_for_drift(spark, tmp_path):
    """Rows and schema of a whole table (files in subfolders too) without a Spark job, also when
    its files differ only in which fields may be null (a fold's open set against its closed
    rows); files that drifted apart get Spark's merged schema. No table: None."""
    storage = Storage()
    table = f"file://{tmp_path / 'history'}"
    strict = spark.createDataFrame([("a", True)], "id string not null, active boolean not null")
    loose = spark.createDataFrame([("b", None), ("c", False)], "id string, active boolean")
    strict.write.parquet(f"{table}/active")
    loose.write.parquet(f"{table}/closed/2024-01-01")
    summary, jobs = _jobs_during(spark, lambda: lake_io.table_summary(spark, storage, table))
    assert jobs == 0
    rows, schema = summary
    assert rows == 3 and [(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields] == [
        ("id", "string", True),
        ("active", "boolean", True),
    ]

    spark.createDataFrame([("d", 1)], "id string, n bigint").write.parquet(f"{table}/closed/2024-01-02")
    rows, schema = lake_io.table_summary(spark, storage, table)
    assert rows == 4 and schema.fieldNames() == ["id", "active", "n"]
    assert lake_io.table_summary(spark, storage, f"file://{tmp_path / 'absent'}") is None


def test_a_change_log_stores_keys_event_times_and_sequences_without_a_dictionary(spark, tmp_path):
    table = tmp_path / "t"
    # Values repeated so that a dictionary would pay: only the columns named keep one.
    rows = [
        (f"k{i % 10}", f"r{i % 10}", "same", dt.datetime(2024, 1, 1, 0, 0, i % 5), i % 5, "h1")
        for i in range(500)
    ]
    frame = spark.createDataFrame(
        rows, "id string, ref string, status string, _version_at timestamp, _seq long, hour string"
    )
    lake_io.write_partitions(frame, Storage(), f"file://{table}", "hour", ["h1"], keys=("id",))
    (path,) = (table / "hour=h1").glob("*.parquet")
    group = pq.ParquetFile(path).metadata.row_group(0)
    with_dictionary = {
        group.column(i).path_in_schema: any("DICTIONARY" in e for e in group.column(i).encodings)
        for i in range(group.num_columns)
    }
    assert with_dictionary == {"id": False, "ref": True, "status": True, "_version_at": False, "_seq": False}


def test_files_whose_types_disagree_are_known_by_spark_s_error_condition(spark, tmp_path):
    """Spark's schema merge refuses an int column beside a bigint one with the condition
    CANNOT_MERGE_SCHEMAS; the reader knows it by that condition (not by the message's words)
    and reads the files in groups of one schema. Any other error passes through."""
    folder = tmp_path / "t"
    folder.mkdir()
    pq.write_table(pa.table({"n": pa.array([1], pa.int32())}), folder / "a.parquet")
    pq.write_table(pa.table({"n": pa.array([2**40], pa.int64())}), folder / "b.parquet")
    with pytest.raises((PySparkException, Py4JJavaError)) as refused:
        _ = spark.read.option("mergeSchema", "true").parquet(f"file://{folder}").schema
    assert spark_errors.SCHEMAS_DISAGREE in spark_errors.error_conditions(refused.value)

    frame = lake_io.read_drifting(spark, Storage(), [f"file://{folder}"])
    assert sorted(r["n"] for r in frame.collect()) == [1, 2**40]

    with pytest.raises(PySparkException) as missing:
        lake_io.read_drifting(spark, Storage(), [f"file://{tmp_path}/absent"])
    assert spark_errors.error_conditions(missing.value) == {"PATH_NOT_FOUND"}


def test_frames_a_failing_block_cached_are_released(spark):
    frame = spark.range(3).persist()
    with pytest.raises(RuntimeError, match="the step fails"), lake_io.released_after([]) as cached:
        cached.append(frame)
        assert frame.count() == 3 and lake_io.is_cached(frame)
        raise RuntimeError("the step fails")
    assert not lake_io.is_cached(frame)


def test_a_footer_that_does_not_decode_is_damage_and_a_file_that_cannot_be_reached_is_not(tmp_path):
    """Damage asks the user to rebuild a table, so only bytes that are not a footer are damage;
    a footer longer than the first read (many row groups) is read whole."""
    storage = Storage()
    long_footer = tmp_path / "long.parquet"
    pq.write_table(pa.table({"a": list(range(20_000))}), long_footer, row_group_size=10)
    assert pq.ParquetFile(long_footer).metadata.serialized_size > 64 * 1024
    assert parquet_footer(storage, f"file://{long_footer}").num_rows == 20_000

    whole = long_footer.read_bytes()
    cases = {
        "empty.parquet": (b"", "its 0 bytes do not end in PAR1"),
        "text.parquet": (b"not parquet at all", "do not end in PAR1"),
        "long_claim.parquet": (b"PAR1" + (10**6).to_bytes(4, "little") + b"PAR1", "more than the file holds"),
        "garbled.parquet": (whole[:100] + b"\xab" * (len(whole) - 108) + whole[-8:], "thrift"),
    }
    for name, (content, cause) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(DamagedLakeFile) as damaged:
            parquet_footer(storage, f"file://{tmp_path / name}")
        assert f"the lake file file://{tmp_path / name} cannot be read" in str(damaged.value)
        assert cause in str(damaged.value), str(damaged.value)
    with pytest.raises(FileNotFoundError):
        parquet_footer(storage, f"file://{tmp_path / 'gone.parquet'}")
