"""Asset factories: per configured table, `raw` (observed) → `changes` → `current` + `history`."""


import dataclasses

import dagster as dg
from lake_assets import lake_io
from lake_assets.config import FeedConfig
from lake_assets.engine import merge
from lake_assets.feeds.base import FeedFormat
from lake_assets.ingest import read_batch
from lake_assets.orchestration.io_managers import PARTITION_COLUMN_KEY
from lake_assets.orchestration.resources import LakeResource, LakeSparkResource
from lake_assets.paths import is_s3
from lake_assets.quarantine import quarantine_file

IO_MANAGER_KEY = "lake_io_manager"


@dataclasses.dataclass(frozen=True)
class TableAssets:
    feed: FeedConfig
    table: str
    raw: dg.AssetSpec
    changes: dg.AssetsDefinition
    state: dg.AssetsDefinition

    @property
    def keys(self) -> list[dg.AssetKey]:
        return [self.raw.key, *self.changes.keys, *self.state.keys]


def asset_key(feed: str, table: str, layer: str) -> dg.AssetKey:
    return dg.AssetKey([feed, table, layer])


def state_pool(feed: str, table: str) -> str:
    """One writer per state table at a time: runs folding the same table queue on this pool."""
    return f"lake_state__{feed}__{table}"


def build_table_assets(
    feed: FeedConfig, fmt: FeedFormat, table: str, partitions_def: dg.PartitionsDefinition
) -> TableAssets:
    storage_kind = "s3" if is_s3(feed.landing) else "file"
    raw = dg.AssetSpec(
        key=asset_key(feed.name, table, "raw"),
        description=(
            f"Files the vendor lands for `{table}` under {feed.landing} ({fmt.name}). Observed by "
            f"the `{feed.name}` landing sensor; lake_assets never writes here."
        ),
        group_name=feed.name,
        kinds={storage_kind, "parquet"},
        metadata={"landing": feed.landing, "format": fmt.name},
    )
    spec = fmt.table_spec(table)

    @dg.asset(
        key=asset_key(feed.name, table, "changes"),
        deps=[raw],
        partitions_def=partitions_def,
        backfill_policy=dg.BackfillPolicy.single_run(),
        io_manager_key=IO_MANAGER_KEY,
        group_name=feed.name,
        kinds={"spark", "parquet"},
        metadata={PARTITION_COLUMN_KEY: fmt.partition_column, "keys": list(spec.keys)},
        description=(
            f"Every change event of `{table}` once, normalised (`_op`, `_version_at`, `_seq`, "
            f"`_source_file`…), partitioned like the landing area by `{fmt.partition_column}`. "
            "Unreadable files are quarantined with their reason; the rest of the batch goes on."
        ),
    )
    def changes(context: dg.AssetExecutionContext, spark: LakeSparkResource, lake: LakeResource):
        storage = lake.get_storage()
        session = spark.spark_session
        listed = [(key, f) for key in context.partition_keys for f in fmt.partition_files(storage, feed.landing, table, key)]
        partition_of = {f.uri: key for key, f in listed}
        files = [f for _, f in listed]
        context.log.info(f"{feed.name}/{table}: {len(files)} landed file(s) in {len(context.partition_keys)} partition(s)")
        batch = read_batch(session, storage, fmt, table, files)
        for item in batch.quarantined:
            where = quarantine_file(
                storage, lake.layout(), feed.name, table, partition_of.get(item.uri, "unknown"), item, context.run_id
            )
            context.log.error(f"quarantined {item.uri}: {item.reason} (copy and reason at {where})")
        context.add_output_metadata(
            {
                "files_listed": batch.files_listed,
                "files_read": batch.files_read,
                "files_quarantined": len(batch.quarantined),
                "quarantined": dg.MetadataValue.json([{"file": q.uri, "reason": q.reason} for q in batch.quarantined]),
                "rows_in": batch.rows_in,
                "events_out": batch.events_out,
                "duplicates_collapsed": batch.duplicates,
                "reconciled": batch.reconciles,
            }
        )
        if not batch.reconciles:
            raise dg.Failure(f"{feed.name}/{table}: counts do not reconcile: {batch}")
        return batch.events

    current_key = asset_key(feed.name, table, "current")
    history_key = asset_key(feed.name, table, "history")

    @dg.multi_asset(
        name=f"{feed.name}__{table}__state".replace("-", "_"),
        specs=[
            dg.AssetSpec(
                current_key,
                deps=[changes.key],
                group_name=feed.name,
                kinds={"spark", "parquet"},
                description=(
                    f"Live state of `{table}` (SCD type 1): one row per {list(spec.keys)}, the last "
                    "version by (version time, sequence); deleted keys are absent."
                ),
            ),
            dg.AssetSpec(
                history_key,
                deps=[changes.key],
                group_name=feed.name,
                kinds={"spark", "parquet"},
                description=(
                    f"Every version of `{table}` (SCD type 2, Fivetran history mode): "
                    "`_fivetran_start`, `_fivetran_end`, `_fivetran_active`, `_fivetran_synced`."
                ),
            ),
        ],
        partitions_def=partitions_def,
        backfill_policy=dg.BackfillPolicy.single_run(),
        pool=state_pool(feed.name, table),
        can_subset=False,
    )
    def state(context: dg.AssetExecutionContext, spark: LakeSparkResource, lake: LakeResource):
        """Fold the change log of the materialised partitions into current and history."""
        storage = lake.get_storage()
        layout = lake.layout()
        session = spark.spark_session
        log = lake_io.read_table(session, storage, layout.table("changes", feed.name, table))
        if log is None:
            context.log.info(f"{feed.name}/{table}: the change log is empty; nothing to fold")
            for key in (current_key, history_key):
                yield dg.MaterializeResult(asset_key=key, metadata={"dagster/row_count": 0})
            return
        result = merge.fold_full(log, spec)
        for key, frame, layer in ((current_key, result.current, "current"), (history_key, result.history, "history")):
            path = lake_io.replace_table(frame, storage, layout, feed.name, table, layer)
            written = session.read.parquet(path)
            yield dg.MaterializeResult(
                asset_key=key,
                metadata={
                    "dagster/row_count": written.count(),
                    "path": dg.MetadataValue.path(path),
                    "dagster/column_schema": dg.TableSchema(
                        columns=[dg.TableColumn(n, t) for n, t in lake_io.schema_metadata(written.schema)]
                    ),
                },
            )

    return TableAssets(feed=feed, table=table, raw=raw, changes=changes, state=state)
