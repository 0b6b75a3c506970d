"""Spark Parquet tables in the lake: partitioned change logs and whole state tables.

Pure Spark + storage logic (no Dagster): the pipeline's steps, the fold, purges and the IO
manager read and write the lake's tables through it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets.engine import merge
from lake_assets.engine import model as m
from lake_assets.engine.names import col
from lake_assets.engine.schema import union_all
from lake_assets.engine.state import Removing, is_parquet_file, parquet_files
from lake_assets.errors import ConfigError, InvalidValue
from lake_assets.paths import partition_folder
from lake_assets.spark_errors import SCHEMAS_DISAGREE, SPARK_ERRORS, error_conditions
from lake_assets.storage import Storage, each_request, parquet_footer

if TYPE_CHECKING:
    from lake_assets.engine.purges import Erasure


TYPE_INFERENCE = "spark.sql.sources.partitionColumnTypeInference.enabled"
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"  # the footer entry Spark writes its schema to
SCHEMA_FROM_FOOTERS_MAX_FILES = 64


def is_cached(frame: DataFrame) -> bool:
    """Whether Spark keeps the frame's rows (persisted in memory or on disk)."""
    level = frame.storageLevel
    return level.useMemory or level.useDisk


@contextlib.contextmanager
def released_after(cached: list[DataFrame]) -> Iterator[list[DataFrame]]:
    """The frames a block caches (it adds each to `cached` as it caches it), unpersisted when
    the block ends, however it ends: a step that fails leaves no executor memory behind."""
    try:
        yield cached
    finally:
        for frame in cached:
            frame.unpersist()


def existing_partitions(storage: Storage, table_uri: str, column: str) -> dict[str, str]:
    """partition value -> folder URI for the Hive partition folders under a table."""
    prefix = f"{column}="
    return {
        e.name[len(prefix) :]: e.uri
        for e in storage.list(table_uri)
        if e.is_dir and e.name.startswith(prefix)
    }


def read_partitions(
    spark: SparkSession,
    storage: Storage,
    table_uri: str,
    column: str,
    values: Iterable[str] | None,
    keys: tuple[str, ...] = (),
    bound_for: Callable[[], T.StructType | None] | None = None,
) -> DataFrame | None:
    """The rows of the given partitions (all when `values` is None) as one DataFrame; `keys`
    and `bound_for` as for `read_drifting`.

    Only the requested partition folders are handed to Spark, so reading an hour of a long
    log costs the hour, not a listing of the whole log. None when no requested partition exists.
    """
    if str(spark.conf.get(TYPE_INFERENCE, "true")).lower() != "false":
        # Typed by inference, a GRAX batch folder of digits alone (`batch=000000123`) reads back
        # as 123 and matches no partition again: refuse rather than lose the zeros silently.
        raise ConfigError(
            f"reading {table_uri}: the Spark session must set {TYPE_INFERENCE}=false (partition values are text)"
        )
    present = existing_partitions(storage, table_uri, column)
    wanted = sorted(present) if values is None else sorted(set(values) & set(present))
    if not wanted:
        return None
    return read_drifting(
        spark,
        storage,
        [present[v] for v in wanted],
        base_path=table_uri,
        table=table_uri,
        keys=keys,
        bound_for=bound_for,
    )


def read_drifting(
    spark: SparkSession,
    storage: Storage,
    paths: list[str],
    base_path: str | None = None,
    table: str = "",
    recursive: bool = False,
    keys: tuple[str, ...] = (),
    bound_for: Callable[[], T.StructType | None] | None = None,
) -> DataFrame:
    """Read Parquet folders (or single `.parquet` files) whose files may disagree on column types
    (`keys`: the table's key columns, widened only where no value changes; `bound_for` gives the
    schema of the table the rows are to be merged into, as for `schema.union_all`, asked only
    when the files disagree).

    Spark's mergeSchema handles added and dropped columns but refuses a column that is int in
    one file and bigint in another; then the files are read in groups of equal schema and
    unioned with lossless widening (or a clear SchemaClash).
    """
    written = _written_schema(storage, paths, recursive)
    # Spark's own schema from the footers needs no schema-merging job (one per read otherwise).
    reader = spark.read.schema(written) if written is not None else spark.read.option("mergeSchema", "true")
    if recursive:
        # Folders like history/<t>/closed/<date>/ are not Hive partitions: no columns inferred.
        reader = reader.option("recursiveFileLookup", "true")
    if base_path:
        reader = reader.option("basePath", base_path)
    try:
        df = reader.parquet(*paths)
        _ = df.schema  # schema merging happens here, eagerly
        return df
    except SPARK_ERRORS as exc:
        if SCHEMAS_DISAGREE not in error_conditions(exc):
            raise
    groups: dict[str, list[str]] = {}
    for uri in _parquet_files(storage, paths, recursive=True):
        signature = (
            parquet_footer(storage, uri).schema.to_arrow_schema().to_string(show_schema_metadata=False)
        )
        groups.setdefault(signature, []).append(uri)
    frames = []
    for uris in groups.values():
        part = (
            spark.read.option("basePath", base_path).parquet(*uris)
            if base_path
            else spark.read.parquet(*uris)
        )
        frames.append(part)
    return union_all(table, frames, keys, bound_for=bound_for() if bound_for is not None else None)


def _parquet_files(storage: Storage, paths: list[str], recursive: bool) -> list[str]:
    """The Parquet data files given, or in the given folders (Spark's markers and checksums
    left out); subfolders only when `recursive`."""
    found = []
    for path in paths:
        if path.endswith(".parquet"):
            found.append(path)
            continue
        found += (
            [e.uri for e in storage.walk_files(path) if is_parquet_file(e.name)]
            if recursive
            else parquet_files(storage, path)
        )
    return found


def _written_schema(storage: Storage, paths: list[str], recursive: bool) -> T.StructType | None:
    """The schema Spark wrote into the footer of every data file under `paths`, when they all
    carry one and it is the same (files the engine wrote, before any drift); None otherwise, and
    for reads of more than `SCHEMA_FROM_FOOTERS_MAX_FILES` files, where Spark's parallel footer
    reading is the better tool. Partition folders' columns are not in it: Spark adds them."""
    files = _parquet_files(storage, paths, recursive)
    if not files or len(files) > SCHEMA_FROM_FOOTERS_MAX_FILES:
        return None
    return _spark_schema(_footers(storage, files))


def _nullable(schema_json: bytes | None) -> bytes | None:
    """A written schema with every field nullable: how Spark reads any Parquet file, so files
    that differ only there (a fold's open set and its closed rows) read alike."""
    if schema_json is None:
        return None

    def relax(node):
        if isinstance(node, dict):
            return {
                k: True if k in ("nullable", "containsNull", "valueContainsNull") else relax(v)
                for k, v in node.items()
            }
        return [relax(item) for item in node] if isinstance(node, list) else node

    return json.dumps(relax(json.loads(schema_json))).encode()


def _spark_schema(footers: list[pq.FileMetaData], any_nullability: bool = False) -> T.StructType | None:
    """The schema Spark wrote into every one of these footers, when they all carry the same
    (with `any_nullability`, the same but for which fields may be null)."""
    written = {(meta.metadata or {}).get(SPARK_SCHEMA_KEY) for meta in footers}
    if any_nullability:
        written = {_nullable(w) for w in written}
    only = written.pop() if len(written) == 1 else None
    if only is None:
        return None
    try:
        return T.StructType.fromJson(json.loads(only))
    except (ValueError, KeyError, TypeError):  # a type this PySpark cannot parse: let Spark infer it
        return None


def _footers(storage: Storage, files: list[str]) -> list[pq.FileMetaData]:
    return each_request(lambda uri: parquet_footer(storage, uri), files)


def files_reaching(storage: Storage, files: list[str], column: str, bound: dt.datetime) -> list[str]:
    """The Parquet files in which `column` may hold a time at or after `bound`, decided from the
    footers' row-group statistics without reading any data. A file whose statistics are missing
    (or not a plain timestamp) counts as reaching: only provably older files are left out."""
    bound = bound if bound.tzinfo else bound.replace(tzinfo=dt.UTC)

    def reaches(meta: pq.FileMetaData) -> bool:
        maxima = _row_group_maxima(meta, column)
        if maxima is None:
            return True
        for latest in maxima:
            if not isinstance(latest, dt.datetime):
                return True
            if (latest if latest.tzinfo else latest.replace(tzinfo=dt.UTC)) >= bound:
                return True
        return False

    return [uri for uri, meta in zip(files, _footers(storage, files), strict=True) if reaches(meta)]


def _row_group_maxima(meta: pq.FileMetaData, column: str) -> list | None:
    """The largest value of a top-level `column` in each row group, from the footer's statistics
    (None for a group without them); None when the file has no such column."""
    index = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == column), None)
    if index is None:
        return None
    groups = (meta.row_group(group).column(index).statistics for group in range(meta.num_row_groups))
    return [_largest(stats) if stats is not None and stats.has_min_max else None for stats in groups]


def _largest(stats: pq.Statistics) -> Any:
    """A row group's largest value, or None when its statistic cannot be a value of its type
    (a damaged footer's time past the year 9999, text that is not UTF-8): no statistic."""
    try:
        return stats.max
    except (OverflowError, ValueError):  # UnicodeDecodeError is a ValueError
        return None


def holds_true(meta: pq.FileMetaData, column: str) -> bool:
    """Whether the footer's statistics show a true value in the boolean `column` (no data read;
    a file without statistics shows nothing)."""
    return any(maximum is True for maximum in _row_group_maxima(meta, column) or [])


def rows_in(storage: Storage, files: list[str]) -> int:
    """How many rows the Parquet files hold, from their footers (no data is read)."""
    return sum(meta.num_rows for meta in _footers(storage, files))


def table_summary(
    spark: SparkSession, storage: Storage, table_uri: str
) -> tuple[int, T.StructType | None] | None:
    """Rows and schema of a whole lake table (every data file under it) from its Parquet
    footers: no Spark job unless the files disagree on their schema. None for no table."""
    if not storage.exists(table_uri):
        return None
    footers = _footers(storage, _parquet_files(storage, [table_uri], recursive=True))
    if not footers:
        return 0, None
    schema = _spark_schema(footers, any_nullability=True)
    if schema is None:  # drifted files: the schema a reader gets is Spark's merge of them
        schema = read_drifting(spark, storage, [table_uri], table=table_uri, recursive=True).schema
    return sum(meta.num_rows for meta in footers), schema


def without_dictionary(columns: Iterable[str]) -> dict[str, str]:
    """Parquet writer options that store `columns` plainly, for columns whose values differ on
    (nearly) every row of a file: event times, sequences, the keys of a current-state table.

    parquet-mr starts every column with a dictionary and, at the end of the first page, gives it
    up if it does not pay and encodes the values again. A change-log hour or a fold's file fits
    in that first page, so for such columns every file built a dictionary only to throw it away,
    a large share of the CPU of writing a change log (docs/profiling.md, "Figures behind the
    code"). For such columns the files come out the same size.
    """
    return {f"parquet.enable.dictionary#{c}": "false" for c in columns}


#: what Spark's writes leave in a table's folder while they run (a dynamic partition overwrite's
#: `.spark-staging-<job>`, a plain write's `_temporary`)
_SPARK_WRITE_FOLDERS = (".spark-staging-", "_temporary")


def discard_unfinished_writes(storage: Storage, table_uri: str) -> list[str]:
    """Remove what a killed Spark write left in a table's folder; returns what it removed. Spark's
    readers skip these hidden folders, but a `**` glob (DuckDB's) reaches them, and their files
    hold rows that were never committed. Only one write of a table runs at a time (one writer
    per table), so none of them belongs to a write still going on."""
    left = [entry.uri for entry in storage.list(table_uri) if entry.name.startswith(_SPARK_WRITE_FOLDERS)]
    for uri in left:
        storage.delete_tree(uri)
        storage.delete_file(uri)
    return left


def write_partitions(
    df: DataFrame | None,
    storage: Storage,
    table_uri: str,
    column: str,
    values: Iterable[str],
    keys: Iterable[str] = (),
    erase: Erasure | None = None,
    removing: Removing | None = None,
    replacing: Callable[[list[str]], None] | None = None,
    emptying: Callable[[list[str]], None] | None = None,
) -> dict[str, int]:
    """Replace exactly the partitions `values` of a table with the rows of `df`.

    Partitions in `values` that `df` has no rows for are removed, so re-running a partition
    whose input shrank leaves nothing stale behind. Returns rows written per partition.
    `keys` (the table's key columns), event times and sequences are stored without a Parquet
    dictionary: in a change-log partition most keys change once, so they differ on nearly every row.
    With `erase` (a change log's purges), purged keys' field data is erased from the rows first.
    `removing` is told the files the write replaces, before it writes; `replacing`, the
    partitions whose folders Spark is about to replace (delete, then move the new one in);
    `emptying`, the stored partitions about to be removed.
    """
    values = sorted(set(values))
    folders = {value: partition_folder(table_uri, column, value) for value in values}
    discard_unfinished_writes(storage, table_uri)
    if removing is not None:
        present = existing_partitions(storage, table_uri, column)
        removing(
            [uri for value in values if value in present for uri in parquet_files(storage, present[value])]
        )
    counts: dict[str, int] = {}
    if df is not None:
        # One pass both counts the rows per partition and finds rows outside the run's partitions
        # (and counts the rows marking a purge, for `erase`).
        tallies = [
            F.count(F.lit(1)).alias("n"),
            (erase.marked_rows(df) if erase is not None else F.lit(0)).alias("marked"),
        ]
        counted = df.groupBy(column).agg(*tallies).collect()
        counts = {r[column]: r["n"] for r in counted}
        stray = sorted((str(v) for v in counts if v is None or v not in set(values)), key=str)
        if stray:
            raise InvalidValue(
                f"rows for partition {stray[0]!r} do not belong to the partitions being written {values[:3]}…"
            )
        if counts and replacing is not None:
            replacing(sorted(counts))
        if erase is not None:  # after `replacing` confirmed the lease: it may keep purges seen
            marking = [str(r[column]) for r in counted if r["marked"]]
            df = erase.apply(df, sum(r["marked"] for r in counted), marking)
        if counts:
            # Dynamic overwrite: Spark replaces only the partition folders present in df.
            (
                df.repartition(F.col(column))
                .write.options(
                    **without_dictionary(c for c in (*keys, *m.PER_EVENT_COLUMNS) if c in df.columns)
                )
                .mode("overwrite")
                .option("partitionOverwriteMode", "dynamic")
                .partitionBy(column)
                .parquet(table_uri)
            )
    emptied = [v for v in values if v not in counts and storage.exists(folders[v])]
    if emptied and emptying is not None:
        emptying(emptied)
    for value in emptied:
        storage.delete_tree(folders[value])
    return counts


def read_table(
    spark: SparkSession, storage: Storage, table_uri: str, keys: tuple[str, ...] = ()
) -> DataFrame | None:
    if not storage.exists(table_uri):
        return None
    return read_drifting(spark, storage, [table_uri], table=table_uri, recursive=True, keys=keys)


def schema_metadata(schema: T.StructType) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def erase_keys_in_partitions(
    spark: SparkSession,
    storage: Storage,
    table_uri: str,
    column: str,
    keys: list[str],
    purged: DataFrame,
    staging: str,
) -> list[str]:
    """Write to `staging` (as `<column>=<value>/` folders) every partition of a log holding rows of
    the `purged` keys (a frame of key columns) that still carry field data or lack the purge
    marker, with those keys erased (`merge.erase_keys`); returns those partitions. The caller
    puts them in place of the originals in its commit. Used for purges, which must leave no field
    data behind.

    Partitions are read and written in groups of equal schema: a log whose types drifted (even
    apart beyond widening, a struct here and a number there) is erased without a clash, and each
    partition keeps the types it was written with."""
    erasure = _LogErasure(spark, storage, table_uri, column, keys, purged)
    erased: list[str] = []
    for group in _partitions_by_schema(storage, existing_partitions(storage, table_uri, column)):
        hit = erasure.partitions_holding(group)
        if hit:
            erasure.write(hit, staging)
            erased += hit
    return sorted(erased)


def _partitions_by_schema(storage: Storage, present: dict[str, str]) -> list[list[str]]:
    """The partition values of `present` (value -> folder) holding files, grouped by the schemas
    of their files (nullability aside), each group in value order."""
    listed = sorted(present)
    files = dict(
        zip(listed, each_request(lambda value: parquet_files(storage, present[value]), listed), strict=True)
    )
    values = [value for value in listed if files[value]]  # a folder without files holds nothing to erase
    every = [uri for value in values for uri in files[value]]
    signatures = dict(
        zip(
            every,
            each_request(lambda uri: _schema_signature(parquet_footer(storage, uri)), every),
            strict=True,
        )
    )
    groups: dict[frozenset[str], list[str]] = {}
    for value in values:
        groups.setdefault(frozenset(signatures[uri] for uri in files[value]), []).append(value)
    return list(groups.values())


def _schema_signature(meta: pq.FileMetaData) -> str:
    """A file's schema as text: the one Spark wrote (nullability aside), else Parquet's own."""
    written = _nullable((meta.metadata or {}).get(SPARK_SCHEMA_KEY))
    return (
        written.decode() if written else meta.schema.to_arrow_schema().to_string(show_schema_metadata=False)
    )


@dataclasses.dataclass(frozen=True)
class _LogErasure:
    """The erasure of the `purged` keys (a frame of key columns) from a log partitioned by `column`."""

    spark: SparkSession
    storage: Storage
    table_uri: str
    column: str
    keys: list[str]
    purged: DataFrame

    def _read(self, values: list[str]) -> DataFrame | None:
        return read_partitions(
            self.spark, self.storage, self.table_uri, self.column, values, tuple(self.keys)
        )

    def partitions_holding(self, values: list[str]) -> list[str]:
        """Those of the partitions `values` holding rows of the purged keys that still carry
        field data or lack the purge marker."""
        log = self._read(values)
        if log is None:
            return []
        not_erased = ~F.coalesce(F.col(m.PURGED), F.lit(False)) if m.PURGED in log.columns else F.lit(True)
        for name in m.payload_columns(log.columns, self.keys):
            not_erased = not_erased | col(name).isNotNull()
        purged = F.broadcast(merge.keys_typed_as(self.purged, log, self.keys).distinct())
        held = log.join(purged, self.keys, "left_semi").where(not_erased)
        return sorted(r[self.column] for r in held.select(self.column).distinct().collect())

    def write(self, values: list[str], staging: str) -> None:
        """Add to `staging` the partitions `values` with the purged keys erased."""
        held = self._read(values)
        if held is None:  # the partitions just read are gone: nothing left to erase
            return
        erased = merge.erase_keys(held, self.keys, self.purged)
        options = without_dictionary(c for c in (*self.keys, *m.PER_EVENT_COLUMNS) if c in erased.columns)
        # append: each group of partitions adds its own folders to the fold's fresh staging folder
        writer = erased.repartition(F.col(self.column)).write.options(**options).mode("append")
        writer.partitionBy(self.column).parquet(staging)
