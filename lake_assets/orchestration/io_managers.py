"""The Spark Parquet IO manager: partitioned lake tables in Hive layout, `file://` or `s3a://`.

An asset keyed `[feed, (group,) table, layer]` lives at `<lake>/<layer>/<feed>/(<group>/)<table>/`, partitioned
by the column named in the asset's `lake/partition_column` metadata. Writes replace exactly the
partitions of the run (a single partition or a whole backfill range); reads of an upstream range
return one DataFrame filtered to those partitions.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import dagster as dg
from pydantic import PrivateAttr
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from lake_assets import lake_io, lease
from lake_assets.engine.schema import system_fields
from lake_assets.engine.state import TableState
from lake_assets.errors import SchemaClash, first_line
from lake_assets.ingest import as_text_where_stored
from lake_assets.orchestration.resources import CatalogResource, LakeResource, LakeSparkResource
from lake_assets.pipeline import current_schema, store_partitions
from lake_assets.spark import driver_ended, release_cached

PARTITION_COLUMN_KEY = "lake/partition_column"
TABLE_KEYS_KEY = "keys"  # the table's key columns, in the asset's metadata


def _table_location(lake: LakeResource, key: dg.AssetKey) -> str:
    if len(key.path) not in (3, 4):
        raise dg.Failure(f"asset key {key.to_user_string()} is not [feed, (group,) table, layer]")
    feed, *table, layer = key.path
    return lake.layout().table(layer, feed, "/".join(table))


def _table_keys(definition_metadata) -> tuple[str, ...]:
    """The table's key columns, from the change log asset's metadata."""
    keys = (definition_metadata or {}).get(TABLE_KEYS_KEY)
    return tuple(getattr(keys, "value", keys) or ())


def _keys_as_stored(
    changes: DataFrame, keys: tuple[str, ...], current: Callable[[], T.StructType | None]
) -> DataFrame:
    """The change log read back with its number keys as text where `current` holds the key as
    text, as a batch's are when it is read (`ingest.as_text_where_stored`): the fold matches them
    with the stored keys as text. Current is asked only when a key is not text already."""
    types = {f.name: f.dataType for f in changes.schema.fields}
    if all(isinstance(types.get(k), (T.StringType, type(None))) for k in keys):
        return changes
    stored = current()
    return changes if stored is None else as_text_where_stored(changes, stored, keys)


def empty_changes(spark, partition_column: str) -> DataFrame:
    """A change log with no rows: system columns only, so downstream code can still select them."""
    fields = [*system_fields(ingested_at=True), T.StructField(partition_column, T.StringType())]
    return spark.createDataFrame([], T.StructType(fields))


class InMemoryHandover:
    """A batch a run's step stored, kept in memory for the same run's next step to read.

    Within one run (the in-process executor shares one Spark session) the state step would
    otherwise read the change log it folds back from the files the changes step has just written,
    and sort it again by key, although the stored batch is still cached, collapsed and in that
    order. Handed over, the fold plans no exchange and no sort for it, which shortens a
    backfill measurably (docs/profiling.md, "Figures behind the code"). The stored files hold
    exactly these rows (less the field data of purged keys, which the fold erases just the
    same): the write replaced exactly the run's partitions with them. The batch kept also
    carries the collapse's marks, which the stored files do not (`merge.without_marks`).

    One batch is kept per asset; it is handed over once, for the same partitions, to a step
    loading the output of the run that stored it. Whatever is not taken that way (asked for
    for other partitions, or followed by a newer batch of the asset) is released from memory,
    and so is whatever is still kept when the run ends (`release_all`); the step that takes a
    batch releases it when it is done. The run's IO manager owns its handover: nothing kept
    outlives the run.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, ...], tuple[str, tuple[str, ...], DataFrame]] = {}

    def keep(self, run_id: str, key: dg.AssetKey, partitions: list[str], frame: DataFrame) -> None:
        with self._lock:
            previous = self._kept.pop(tuple(key.path), None)
            self._kept[tuple(key.path)] = (run_id, tuple(partitions), frame)
        if previous is not None and previous[2] is not frame:
            release_cached(previous[2])

    def take(self, run_id: str, key: dg.AssetKey, partitions: list[str] | None) -> DataFrame | None:
        """The batch kept for this run's step, or None: the step then reads the stored files (so
        too when the driver that kept it has ended since)."""
        with self._lock:
            kept = self._kept.pop(tuple(key.path), None)
        if kept is None:
            return None
        kept_run, kept_partitions, frame = kept
        if driver_ended(frame.sparkSession):
            return None
        if kept_run == run_id and partitions is not None and kept_partitions == tuple(partitions):
            return frame
        frame.unpersist()
        return None

    def release_all(self) -> None:
        """Release every batch still kept (the run is over: no step of it will take one)."""
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
        for _, _, frame in kept:
            release_cached(frame)


class SparkParquetIOManager(dg.ConfigurableIOManager):
    """Stores Spark DataFrames as Hive-partitioned Parquet under the lake root."""

    lake: LakeResource
    spark: LakeSparkResource
    catalog: CatalogResource

    # Dagster initialises a fresh copy of the IO manager for each run, so this handover is the
    # run's own; whatever the run kept and did not fold is released when it ends.
    _handover: InMemoryHandover = PrivateAttr(default_factory=InMemoryHandover)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self._handover.release_all()

    def _partition_column(self, definition_metadata) -> str:
        column = (definition_metadata or {}).get(PARTITION_COLUMN_KEY)
        if column is None:
            raise dg.Failure(f"asset metadata lacks '{PARTITION_COLUMN_KEY}'")
        return getattr(column, "value", column)

    def handle_output(self, context: dg.OutputContext, obj: DataFrame | None) -> None:
        location = _table_location(self.lake, context.asset_key)
        column = self._partition_column(context.definition_metadata)
        if not context.has_asset_partitions:
            raise dg.Failure(
                f"{context.asset_key.to_user_string()}: this IO manager stores partitioned assets only"
            )
        keys = list(context.asset_partition_keys)
        if not keys:  # a range whose start comes after its end in Dagster's order of the partitions
            raise dg.Failure(
                f"{context.asset_key.to_user_string()}: the run's partition range holds no partition"
            )
        feed, *table, _ = context.asset_key.path
        state = TableState(self.lake.layout(), feed, "/".join(table))  # its purges hold for every write
        storage = self.lake.get_storage()
        with lease.writing_table(
            storage,
            state.layout,
            feed,
            state.table,
            context.run_id,
            "changes",
            self.lake.lease_wait_seconds,
            context.log.info,
        ):
            written, files = store_partitions(
                storage,
                self.catalog.get_store(),
                location,
                obj,
                column,
                keys,
                feed=feed,
                table=state.table,
                run_id=context.run_id,
                keys=_table_keys(context.definition_metadata),
                state=state,
                log=context.log,
            )
        if obj is not None and lake_io.is_cached(obj):
            self._handover.keep(context.run_id, context.asset_key, keys, obj)
        metadata: dict = {
            "rows_written": sum(written.values()),
            "path": dg.MetadataValue.path(location),
            "partitions_written": len(written),
            "partitions_emptied": len(set(keys) - set(written)),
            "files_catalogued": len(files),
        }
        if len(keys) == 1:
            # Dagster copies a range run's output metadata onto every partition in the range:
            # there, the run's total would read as each hour's row count in the UI.
            metadata["dagster/row_count"] = metadata["rows_written"]
        # The columns are the asset's to tell, on the run's last partition (`assets.add_column_schema`).
        context.add_output_metadata(metadata)

    def load_input(self, context: dg.InputContext) -> DataFrame:
        upstream = context.upstream_output
        key = context.asset_key
        location = _table_location(self.lake, key)
        column = self._partition_column(upstream.definition_metadata if upstream else None)
        keys = list(context.asset_partition_keys) if context.has_asset_partitions else None
        # The run that stored the batch (this run, or the parent of a re-execution that skipped it).
        producer = upstream.run_id if upstream is not None else None
        handed_over = self._handover.take(producer, key, keys) if producer else None
        if handed_over is not None:
            context.log.info(f"{key.to_user_string()}: the batch this run stored, from memory")
            return handed_over
        spark = self.spark.spark_session
        storage, (feed, *table, _) = self.lake.get_storage(), key.path
        table_keys = _table_keys(upstream.definition_metadata if upstream else None)

        @functools.cache
        def current() -> T.StructType | None:
            """Current's schema, which the read-back batch's types are bound for (digits kept,
            number keys matched as text): one that cannot be read is no reason to fail the step
            here (the fold reads the state it is made from, not current)."""
            try:
                return current_schema(spark, storage, self.lake.layout(), feed, "/".join(table), context.log)
            except Exception as unknown:  # noqa: BLE001 - logged; the partitions widen among themselves
                context.log.warning(
                    f"{key.to_user_string()}: current's schema is unknown: {first_line(unknown)}"
                )
                return None

        # Partitions written with drifted types are widened as a batch's files are when it is
        # read: the table's keys exactly, and a column they disagree on that current holds as
        # text becomes text from each partition's own type (`schema.text_where_bound_for_text`).
        try:
            df = lake_io.read_partitions(
                spark,
                storage,
                location,
                column,
                values=keys,
                keys=table_keys,
                bound_for=current,
            )
        except SchemaClash as clash:
            raise dg.Failure(
                f"{key.to_user_string()}: the stored partitions cannot be read as one: {clash}. Run them "
                "again in one run (a backfill of their range, or `lake-assets run`): it reads their "
                "landed files as one batch, and sets aside the files that clash"
            ) from clash
        if df is None:
            context.log.info(f"{key.to_user_string()}: no stored partitions in the requested range")
            return empty_changes(spark, column)
        return _keys_as_stored(df, table_keys, current)
