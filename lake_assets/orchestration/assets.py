"""Asset factories: per configured table, `raw` (observed) → `changes` → `current` + `history`."""


import dataclasses
import re

import dagster as dg
from pyspark.sql import functions as F

from lake_assets import lake_io
from lake_assets.config import FeedConfig
from lake_assets.engine import checks, model as m
from lake_assets.engine.fold import fold, stored_rows_since
from lake_assets.engine.model import PURGED
from lake_assets.engine.state import TableState, data_files
from lake_assets.errors import SchemaClash
from lake_assets.feeds.base import FeedFormat
from lake_assets.ingest import read_batch
from lake_assets.orchestration.io_managers import PARTITION_COLUMN_KEY
from lake_assets.catalog.files import (
    catalog_file,
    catalogued_landing,
    landing_work_id,
    record as record_files,
    written_files,
)
from lake_assets.orchestration.resources import CatalogResource, LakeResource, LakeSparkResource
from lake_assets.paths import is_s3
from lake_assets.quarantine import Quarantined, quarantine_file

IO_MANAGER_KEY = "lake_io_manager"
UNPARTITIONED = "_unpartitioned"  # quarantine folder of files that belong to no partition
STATE_TIME_COLUMNS = ("_fivetran_start", "_version_at")  # history files, then current files


@dataclasses.dataclass(frozen=True)
class TableAssets:
    feed: FeedConfig
    table: str
    raw: dg.AssetSpec
    landing_catalog: dg.AssetsDefinition
    changes: dg.AssetsDefinition
    state: dg.AssetsDefinition

    @property
    def keys(self) -> list[dg.AssetKey]:
        return [self.raw.key, *self.processed_keys]

    @property
    def processed_keys(self) -> list[dg.AssetKey]:
        """What a run materialises: everything but the vendor's files."""
        return [*self.landing_catalog.keys, *self.changes.keys, *self.state.keys]

    @property
    def definitions(self) -> list:
        return [self.raw, self.landing_catalog, self.changes, self.state]


def asset_key(feed: str, table: str, layer: str) -> dg.AssetKey:
    """`[feed, table, layer]`, or `[feed, group, table, layer]` for a grouped table (GRAX org)."""
    return dg.AssetKey([feed, *table.split("/"), layer])


def identifier(*parts: str) -> str:
    """A Dagster name (op, pool, group, job) made of feed and table names."""
    return re.sub(r"[^A-Za-z0-9_]", "_", "__".join(parts))


def table_pool(feed: str, table: str) -> str:
    """One writer per table at a time: runs writing the same table's change log and state
    queue on this pool (the instance gives each pool one slot); other tables go on in parallel."""
    return identifier("lake_table", feed, table)


def follow_upstream() -> dg.AutomationCondition:
    """Materialise a partition after any of its upstream partitions changed, once they are all
    present and none is in progress.

    `AutomationCondition.eager()` without its latest-time-window limit: a late file re-runs an
    old hour, and the downstream layers must follow that hour too. No `newly_missing` either:
    partitions nothing has landed in are not work.
    """
    return (
        dg.AutomationCondition.any_deps_updated().since_last_handled()
        & ~dg.AutomationCondition.any_deps_missing()
        & ~dg.AutomationCondition.any_deps_in_progress()
        & ~dg.AutomationCondition.in_progress()
    ).with_label("follows its upstream partitions")


def group_name(feed: str, table: str) -> str:
    """Tables group by feed, and by their own group (a GRAX org) within it."""
    return identifier(feed, *table.split("/")[:-1])


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
        group_name=group_name(feed.name, table),
        kinds={storage_kind, "parquet"},
        metadata={"landing": feed.landing, "format": fmt.name},
    )
    spec = fmt.table_spec(table)

    @dg.asset(
        key=asset_key(feed.name, table, "catalog"),
        deps=[raw],
        partitions_def=partitions_def,
        backfill_policy=dg.BackfillPolicy.single_run(),
        group_name=group_name(feed.name, table),
        kinds={"catalog"},
        description=(
            f"The datalake catalog of the files landed for `{table}`: one record per file with its "
            "blake2b-16 hash, size and event-time span, indexed by day and by landing batch (work "
            "id `landing-<partition>`). Partitioned like the landing area; `changes` reads the "
            "files this catalog lists and never lists the landing area itself."
        ),
    )
    def landing_catalog(context: dg.AssetExecutionContext, lake: LakeResource, catalog: CatalogResource):
        storage = lake.get_storage()
        partitions = fmt.read_partitions(list(context.partition_keys))
        files = [
            catalog_file(feed.name, table, landing_work_id(key), entry.uri, fmt.landing_span(storage, entry.uri))
            for key in partitions
            for entry in fmt.partition_files(storage, feed.landing, table, key)
        ]
        recorded = record_files(catalog.get_store(lake), storage, files)
        context.log.info(f"{feed.name}/{table}: catalogued {recorded} landed file(s) in {len(partitions)} partition(s)")
        return dg.MaterializeResult(metadata={"files_catalogued": recorded, "partitions_catalogued": len(partitions)})

    @dg.asset(
        key=asset_key(feed.name, table, "changes"),
        deps=[landing_catalog],
        partitions_def=partitions_def,
        backfill_policy=dg.BackfillPolicy.single_run(),
        io_manager_key=IO_MANAGER_KEY,
        group_name=group_name(feed.name, table),
        kinds={"spark", "parquet"},
        pool=table_pool(feed.name, table),
        automation_condition=follow_upstream(),
        metadata={PARTITION_COLUMN_KEY: fmt.partition_column, "keys": list(spec.keys)},
        description=(
            f"Every change event of `{table}` once, normalised (`_op`, `_version_at`, `_seq`, "
            f"`_source_file`…), partitioned like the landing area by `{fmt.partition_column}`. "
            "Reads the files the landing catalog lists for its partitions. Unreadable files are "
            "quarantined with their reason; the rest of the batch goes on."
        ),
        check_specs=[
            dg.AssetCheckSpec(
                "landing_complete",
                asset=asset_key(feed.name, table, "changes"),
                description="Every landed file was read, quarantined or superseded, and the landed data "
                            "has no holes (e.g. journal byte ranges that no fragment covers).",
            )
        ],
    )
    def changes(context: dg.AssetExecutionContext, spark: LakeSparkResource, lake: LakeResource, catalog: CatalogResource):
        storage = lake.get_storage()
        session = spark.spark_session
        store = catalog.get_store(lake)
        keys = list(context.partition_keys)
        # The catalog, not a listing, says what landed: what a run reads is what was catalogued.
        catalogued = {key: catalogued_landing(store, feed.name, table, key) for key in fmt.read_partitions(keys)}
        partition_of = {f.uri: key for key in keys for f in catalogued[key]}
        files = [f for key in keys for f in catalogued[key]]
        context.log.info(f"{feed.name}/{table}: {len(files)} catalogued file(s) in {len(keys)} partition(s)")
        if fmt.file_format == "parquet":
            batch = read_batch(session, storage, fmt, table, files)
        else:  # the format reads its own files (Flow: journals, covers and transactions)
            batch = fmt.read_batch(session, storage, feed.landing, table, catalogued, keys)
        # Files outside every valid partition (e.g. a batch folder that is not hex) never reach a
        # partition's run; each run sets them aside again, so none goes unreported.
        strays = fmt.stray_files(storage, feed.landing, table)
        for entry, reason in strays:
            partition_of[entry.uri] = UNPARTITIONED
            batch.quarantine(Quarantined(entry.uri, reason))
        quarantine_copies = []
        for item in batch.quarantined:
            where = quarantine_file(
                storage, lake.layout(), feed.name, table, partition_of.get(item.uri, "unknown"), item, context.run.run_id
            )
            quarantine_copies += [where, f"{where}.reason.json"]
            context.log.error(f"quarantined {item.uri}: {item.reason} (copy and reason at {where})")
        recorded = record_files(store, storage, [
            *[catalog_file(feed.name, table, context.run.run_id, entry.uri, fmt.landing_span(storage, entry.uri))
              for entry, _ in strays],
            *[catalog_file(feed.name, table, context.run.run_id, uri, None) for uri in quarantine_copies if storage.exists(uri)],
        ])
        metadata = {
            "files_listed": batch.files_listed,
            "files_read": batch.files_read,
            "files_quarantined": len(batch.quarantined),
            "quarantined": dg.MetadataValue.json([{"file": q.uri, "reason": q.reason} for q in batch.quarantined]),
            "rows_in": batch.rows_in,
            "events_out": batch.events_out,
            "duplicates_collapsed": batch.duplicates,
            "events_derived": batch.derived,
            "files_superseded": batch.files_skipped,
            "gaps": dg.MetadataValue.json(batch.gaps),
            "reader_counts": dg.MetadataValue.json(batch.counts),
            "reconciled": batch.reconciles,
            "stray_and_quarantine_files_catalogued": recorded,
        }
        if not batch.reconciles:
            raise dg.Failure(f"{feed.name}/{table}: counts do not reconcile: {batch}")
        for gap in batch.gaps:
            context.log.error(f"{feed.name}/{table}: gap in the landed data: {gap}")
        yield dg.Output(batch.events, metadata=metadata)
        yield dg.AssetCheckResult(
            check_name="landing_complete",
            passed=not batch.gaps,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"{len(batch.gaps)} gap(s); {len(batch.quarantined)} file(s) quarantined",
            metadata={"gaps": dg.MetadataValue.json(batch.gaps), "files_quarantined": len(batch.quarantined)},
        )

    current_key = asset_key(feed.name, table, "current")
    history_key = asset_key(feed.name, table, "history")

    @dg.multi_asset(
        name=identifier(feed.name, table, "state"),
        ins={"batch": dg.AssetIn(key=changes.key)},
        specs=[
            dg.AssetSpec(
                current_key,
                deps=[changes.key],
                group_name=group_name(feed.name, table),
                kinds={"spark", "parquet"},
                automation_condition=follow_upstream(),
                description=(
                    f"Live state of `{table}` (SCD type 1): one row per {list(spec.keys)}, the last "
                    "version by (version time, sequence); deleted keys are absent. Materialising a "
                    "partition folds that partition's change events in."
                ),
            ),
            dg.AssetSpec(
                history_key,
                deps=[changes.key],
                group_name=group_name(feed.name, table),
                kinds={"spark", "parquet"},
                automation_condition=follow_upstream(),
                description=(
                    f"Every version of `{table}` (SCD type 2, Fivetran history mode): "
                    "`_fivetran_start`, `_fivetran_end` (next start − 1 ms, the delete time, or "
                    "9999-12-31 23:59:59.999), `_fivetran_active`, `_fivetran_synced`. Open versions "
                    "under `active/`, closed ones under `closed/<end date>/`."
                ),
            ),
        ],
        check_specs=[
            dg.AssetCheckSpec("current_unique_key", asset=current_key, blocking=True,
                              description="One row per key in current."),
            dg.AssetCheckSpec("history_windows", asset=history_key, blocking=True,
                              description="Per key: at most one active version, no inverted or overlapping "
                                          "windows, each end = next start − 1 ms or the delete time."),
            dg.AssetCheckSpec("events_reconcile", asset=history_key, blocking=True,
                              description="Events folded = versions stored + identical duplicates + "
                                          "superseded writes of one version."),
        ],
        partitions_def=partitions_def,
        backfill_policy=dg.BackfillPolicy.single_run(),
        pool=table_pool(feed.name, table),
        can_subset=False,
    )
    def state(context: dg.AssetExecutionContext, spark: LakeSparkResource, lake: LakeResource, catalog: CatalogResource, batch):
        """Fold the change events of the materialised partitions into current and history."""
        storage = lake.get_storage()
        layout = lake.layout()
        session = spark.spark_session
        table_state = TableState(layout, feed.name, table)
        changes_uri = layout.table("changes", feed.name, table)

        def erase_from_log(key_values):
            hours = lake_io.erase_keys_in_partitions(
                session, storage, changes_uri, fmt.partition_column, list(spec.keys), key_values,
                spec.payload_columns, PURGED,
            )
            context.log.info(f"purge: erased field data of {len(key_values)} key(s) from {len(hours)} change partition(s)")
            rewritten = [u for h in hours for u in data_files(storage, f"{changes_uri}/{fmt.partition_column}={h}")]
            record_files(catalog.get_store(lake), storage,
                         written_files(feed.name, table, context.run.run_id, storage, rewritten, (m.VERSION_AT,)))

        try:
            report = fold(session, storage, table_state, batch, spec, erase_from_log=erase_from_log)
        except SchemaClash as clash:
            raise _clash_failure(feed.name, table, clash, batch) from clash
        record_files(catalog.get_store(lake), storage,
                     written_files(feed.name, table, context.run.run_id, storage, report.files_written, STATE_TIME_COLUMNS))
        if report.recovered_folds:
            context.log.warning(f"finished interrupted fold(s) {report.recovered_folds} before folding")
        fold_metadata = {
            "events_folded": report.events_in,
            "keys_touched": report.keys_touched,
            "late_keys": report.late_keys,
            "closed_days_rewritten": len(report.days_rewritten),
            "closed_days_appended": len(report.days_appended),
            "keys_newly_purged": len(report.newly_purged),
        }
        for key, uri in ((current_key, table_state.current), (history_key, table_state.history)):
            yield dg.MaterializeResult(asset_key=key, metadata={**fold_metadata, **_table_metadata(session, storage, uri)})
        for outcome, key in zip(_check_fold(session, storage, table_state, spec, batch, report), (current_key, history_key, history_key)):
            yield dg.AssetCheckResult(
                asset_key=key,
                check_name=outcome.name,
                passed=outcome.passed,
                description=outcome.description,
                metadata=outcome.metadata,
                severity=dg.AssetCheckSeverity.ERROR,
            )

    return TableAssets(feed=feed, table=table, raw=raw, landing_catalog=landing_catalog, changes=changes, state=state)


def _clash_failure(feed: str, table: str, clash: SchemaClash, batch) -> dg.Failure:
    """A batch that cannot join the stored table: the failure names the landed files to look at."""
    files: list[str] = []
    if clash.column in batch.columns:
        found = batch.where(F.col(f"`{clash.column}`").isNotNull()).select(m.SOURCE_FILE).distinct().limit(20)
        files = sorted(r[0] for r in found.collect())
    named = "; landed file(s) with this column: " + ", ".join(files) if files else ""
    return dg.Failure(
        description=f"{feed}/{table}: the batch cannot be folded into the stored table: {clash}{named}",
        metadata={"column": clash.column or "", "files": dg.MetadataValue.json(files)},
    )


def _table_metadata(session, storage, uri: str) -> dict:
    """Row count, path and schema of a lake table as a reader sees it (footers only)."""
    frame = lake_io.read_table(session, storage, uri)
    if frame is None:
        return {"dagster/row_count": 0, "path": dg.MetadataValue.path(uri)}
    return {
        "dagster/row_count": frame.count(),
        "path": dg.MetadataValue.path(uri),
        "dagster/column_schema": dg.TableSchema(
            columns=[dg.TableColumn(n, t) for n, t in lake_io.schema_metadata(frame.schema)]
        ),
    }


def _check_fold(session, storage, table_state: TableState, spec, batch, report) -> list:
    """The table invariants after a fold, read back from the committed files."""
    current = lake_io.read_table(session, storage, table_state.current)
    rows = stored_rows_since(session, storage, table_state, spec, report.touched_since)
    stored_versions = 0
    if report.events_in and rows is not None:
        start = spec.history_columns.start
        versions = batch.select(*spec.keys, m.VERSION_AT).distinct().withColumnRenamed(m.VERSION_AT, start)
        stored_versions = versions.join(rows.select(*spec.keys, start), [*spec.keys, start], "left_semi").count()
    return [
        checks.current_has_unique_keys(current, spec),
        checks.history_windows_are_consistent(rows, spec),
        checks.batch_reconciles(report.batch_rows, report.identical_duplicates, report.superseded_writes, stored_versions),
    ]
