"""Asset factories: per configured table, `raw` (observed) → `catalog` (the landed files
recorded) → `changes` → `current` + `history`, with their checks."""

import dataclasses
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import dagster as dg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from lake_assets import lake_io, pipeline, reruns
from lake_assets.config import FeedConfig
from lake_assets.engine import checks, merge
from lake_assets.engine.fold import FoldReport
from lake_assets.engine.state import TableState
from lake_assets.errors import SchemaClash
from lake_assets.feeds.base import FeedFormat
from lake_assets.ingest import Batch, canonical_uri
from lake_assets.orchestration.io_managers import PARTITION_COLUMN_KEY, TABLE_KEYS_KEY
from lake_assets.orchestration.resources import CatalogResource, LakeResource, LakeSparkResource
from lake_assets.paths import identifier, is_s3
from lake_assets.quarantine import Quarantined
from lake_assets.spark import release_cached

# Single-run backfills are a design requirement; Dagster marks `backfill_policy` beta and would
# repeat that for every asset on every load (webserver, daemon, each run), burying real warnings.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)

IO_MANAGER_KEY = "lake_io_manager"


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


def table_pool(feed: str, table: str) -> str:
    """One writer per table at a time: runs writing the same table's change log and state
    queue on this pool (the instance gives each pool one slot); other tables go on in parallel."""
    return identifier("lake_table", feed, table)


def feed_job_name(feed: str) -> str:
    """The job over every table of an hourly feed (they share one partitions definition)."""
    return f"{identifier(feed)}_all_tables"


def table_job_name(feed: str, table: str) -> str:
    """The job of one table of a batch feed (each table has its own batches)."""
    return identifier(feed, table, "job")


WHOLE_TABLE_RUN_TAG = "lake_assets/whole_table"
"""Run tag of runs that write every layer of a table's partitions together (catalog, changes,
current and history): the landing sensors' runs and the table and feed jobs."""


def follow_upstream() -> dg.AutomationCondition:
    """Materialise a partition after any of its upstream partitions changed, once they are all
    present and none is in progress.

    `AutomationCondition.eager()` without its latest-time-window limit: a late file re-runs an
    old hour, and the downstream layers must follow that hour too. No `newly_missing` either:
    partitions nothing has landed in are not work.

    Upstream updates made by a whole-table run do not count: that run wrote this layer too.
    `any_deps_updated()` means the same but decides it with `executed_with_root_target()`, which
    only recognises the upstream asset's latest partition; after a ranged run over hours 0..3 it
    takes hours 0..2 for outside updates and, on a slow tick, re-folds them in a second run.
    The run-tag test looks at each partition's own new materialisations.
    """
    updated_elsewhere = (
        dg.AutomationCondition.newly_updated()
        & ~dg.AutomationCondition.all_new_updates_have_run_tags(tag_keys={WHOLE_TABLE_RUN_TAG})
        & ~dg.AutomationCondition.executed_with_root_target()
    ).with_label("updated by a run that did not write this layer")
    return (
        dg.AutomationCondition.any_deps_match(
            updated_elsewhere | dg.AutomationCondition.will_be_requested()
        ).since_last_handled()
        & ~dg.AutomationCondition.any_deps_missing()
        & ~dg.AutomationCondition.any_deps_in_progress()
        & ~dg.AutomationCondition.in_progress()
    ).with_label("follows its upstream partitions")


def group_name(feed: str, table: str) -> str:
    """Tables group by feed, and by their own group (a GRAX org) within it."""
    return identifier(feed, *table.split("/")[:-1])


@dataclasses.dataclass(frozen=True)
class AssetTable:
    """The configured table whose assets are being built: its feed, the feed's format and its name."""

    feed: FeedConfig
    fmt: FeedFormat
    name: str

    @property
    def label(self) -> str:
        return f"{self.feed.name}/{self.name}"

    @property
    def group(self) -> str:
        return group_name(self.feed.name, self.name)

    @property
    def pool(self) -> str:
        return table_pool(self.feed.name, self.name)

    @property
    def key_columns(self) -> list[str]:
        """The table's key columns."""
        return list(self.fmt.table_spec(self.name).keys)

    def key(self, layer: str) -> dg.AssetKey:
        return asset_key(self.feed.name, self.name, layer)

    def work(self, run_id: str, lake: LakeResource, catalog: CatalogResource) -> pipeline.TableWork:
        """What the pure pipeline needs to process this table in a run."""
        return pipeline.TableWork(
            self.feed,
            self.fmt,
            self.name,
            lake.get_storage(),
            lake.layout(),
            catalog.get_store(),
            run_id,
            lake.lease_wait_seconds,
        )


def build_table_assets(
    feed: FeedConfig, fmt: FeedFormat, table: str, partitions_def: dg.PartitionsDefinition
) -> TableAssets:
    """The assets of one configured table, a layer per step: the vendor's files (observed, never
    written), the landing catalog, the change log, and the state (current and history)."""
    subject = AssetTable(feed, fmt, table)
    raw = raw_files_spec(subject)
    landing_catalog = landing_catalog_asset(subject, raw, partitions_def)
    changes = changes_asset(subject, landing_catalog, partitions_def)
    state = state_asset(subject, changes, partitions_def)
    return TableAssets(
        feed=feed, table=table, raw=raw, landing_catalog=landing_catalog, changes=changes, state=state
    )


def raw_files_spec(table: AssetTable) -> dg.AssetSpec:
    """The files the vendor lands: observed by the landing sensor, never materialised."""
    feed, fmt = table.feed, table.fmt
    return dg.AssetSpec(
        key=table.key("raw"),
        description=(
            f"Files the vendor lands for `{table.name}` under {feed.landing} ({fmt.name}). Observed by "
            f"the `{feed.name}` landing sensor; lake_assets never writes here."
        ),
        group_name=table.group,
        kinds={"s3" if is_s3(feed.landing) else "file", "parquet"},
        metadata={"landing": feed.landing, "format": fmt.name},
    )


def landing_catalog_asset(
    table: AssetTable, raw: dg.AssetSpec, partitions_def: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    @dg.asset(
        key=table.key("catalog"),
        deps=[raw],
        partitions_def=partitions_def,
        backfill_policy=dg.BackfillPolicy.single_run(),
        group_name=table.group,
        kinds={"catalog"},
        description=(
            f"The datalake catalog of the files landed for `{table.name}`: one record per file with its "
            "blake2b-16 hash, size and event-time span, indexed by day and by landing batch (work "
            "id `landing-<partition>`). Partitioned like the landing area; `changes` reads the "
            "files this catalog lists and never lists the landing area itself."
        ),
    )
    def landing_catalog(
        context: dg.AssetExecutionContext, lake: LakeResource, catalog: CatalogResource
    ) -> dg.MaterializeResult:
        partitions = list(context.partition_keys)
        landed = pipeline.catalogue_landing(
            table.work(context.run.run_id, lake, catalog), partitions, log=context.log
        )
        context.log.info(
            f"{table.label}: catalogued {landed.files - landed.refused} landed file(s) for {len(partitions)} "
            f"partition(s) ({landed.hashed} new or changed, {landed.gone} gone, {landed.refused} unreadable)"
        )
        return dg.MaterializeResult(metadata=catalogue_metadata(landed))

    return landing_catalog


def catalogue_metadata(landed: pipeline.LandingCatalogued) -> dict[str, int]:
    return {
        "files_catalogued": landed.files - landed.refused,
        "files_hashed": landed.hashed,
        "files_gone": landed.gone,
        "files_refused": landed.refused,
    }


def changes_asset(
    table: AssetTable, landing_catalog: dg.AssetsDefinition, partitions_def: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    key = table.key("changes")
    fmt = table.fmt

    @dg.asset(
        key=key,
        deps=[landing_catalog],
        partitions_def=partitions_def,
        backfill_policy=dg.BackfillPolicy.single_run(),
        io_manager_key=IO_MANAGER_KEY,
        group_name=table.group,
        kinds={"spark", "parquet"},
        pool=table.pool,
        automation_condition=follow_upstream(),
        metadata={PARTITION_COLUMN_KEY: fmt.partition_column, TABLE_KEYS_KEY: table.key_columns},
        description=(
            f"Every change event of `{table.name}` once, normalised (`_op`, `_version_at`, `_seq`, "
            f"`_source_file`…), partitioned like the landing area by `{fmt.partition_column}`. "
            "Reads the files the landing catalog lists for its partitions (catalogued first when "
            "the run does not materialise the catalog). Unreadable files are quarantined with "
            "their reason; the rest of the batch goes on."
        ),
        check_specs=[
            dg.AssetCheckSpec(
                LANDING_COMPLETE,
                asset=key,
                description=(
                    "Every landed file was read, quarantined or superseded, none lies outside the "
                    "partitions (a stray: quarantined, and the check fails until it is moved), and the "
                    "landed data has no holes (e.g. journal byte ranges that no fragment covers)."
                ),
            )
        ],
    )
    def changes(
        context: dg.AssetExecutionContext,
        spark: LakeSparkResource,
        lake: LakeResource,
        catalog: CatalogResource,
    ) -> Iterator[dg.Output | dg.AssetCheckResult]:
        work = table.work(context.run.run_id, lake, catalog)
        partitions = list(context.partition_keys)
        # One writer from the read to the note of what was stored: the IO manager's store holds
        # the same lease on, so no other writer stores these partitions, or sets aside or
        # withdraws their quarantine entries, between this run's read and its note.
        with work.writing("changes", context.log):
            if not runs_step_of(context, landing_catalog):
                # Materialised without its catalog (from the UI, or by automation): the catalog
                # may not know of files landed since it was last materialised; this run would
                # read none of them, and its landing check could not tell.
                landed = pipeline.catalogue_landing(work, partitions, log=context.log)
                context.log.info(f"{table.label}: catalogued the landing first: {catalogue_metadata(landed)}")
            ingested = pipeline.ingest(spark.spark_session, work, partitions, log=context.log)
            require_reconciled(table, ingested.batch)
            for gap in ingested.batch.gaps:
                context.log.error(f"{table.label}: gap in the landed data: {gap}")
            for partition, files in files_of_each_partition(ingested, partitions).items():
                context.add_asset_metadata(files, partition_key=partition)
            if ingested.batch.events is not None:
                schema = merge.without_marks(ingested.batch.events).schema
                add_column_schema(context, table.key("changes"), schema, partitions)
            yield dg.Output(ingested.batch.events, metadata=changes_metadata(ingested, partitions))
            pipeline.record_stored(work, partitions, ingested)
        yield landing_check(ingested, partitions)

    return changes


def runs_step_of(context: dg.AssetExecutionContext, asset: dg.AssetsDefinition) -> bool:
    """Whether this run executes `asset`'s step too: it selects the asset (a run of a whole job
    selects all), and, re-executing another run (from failure: the run retries' default), takes
    its step again.

    A run of a job without an asset selection has an empty `asset_selection` (not None): it
    selects every asset of the job."""
    run = context.run
    selected = not run.asset_selection or asset.key in run.asset_selection
    return selected and (run.step_keys_to_execute is None or asset.op.name in run.step_keys_to_execute)


LANDING_COMPLETE = "landing_complete"


def require_reconciled(table: AssetTable, batch: Batch) -> None:
    """A batch whose counts do not add up fails its step: something was lost or doubled."""
    if not batch.reconciles:
        raise dg.Failure(f"{table.label}: counts do not reconcile: {batch.equations()}")


def changes_metadata(ingested: pipeline.Ingested, partitions: list[str]) -> dict[str, Any]:
    """What the change-log step counted, as the materialisation's metadata. Dagster copies it
    onto every partition of a range run: there the figures are the run's (`run_partitions`
    says so), and each partition lists only its own files (`files_of_each_partition`). Copied,
    a backfill's thousand quarantined files would be told of on each of its hours, a list
    stored as many times as the run has partitions."""
    batch = ingested.batch
    one_partition = len(partitions) == 1
    of_the_run = {} if one_partition else {"run_partitions": _run_partitions(partitions)}
    files = _files_metadata(batch.quarantined, batch.text_repaired) if one_partition else {}
    return {
        **of_the_run,
        "files_listed": batch.files_listed,
        "files_read": batch.files_read,
        "files_quarantined": len(batch.quarantined),
        **files,
        "rows_in": batch.rows_in,
        "events_out": batch.events_out,
        "duplicates_collapsed": batch.duplicates,
        "events_derived": batch.derived,
        "files_superseded": batch.files_skipped,
        "gaps": dg.MetadataValue.json(batch.gaps),
        "reader_counts": dg.MetadataValue.json(batch.counts),
        "text_values_repaired": sum(batch.text_repaired.values()),
        "reconciled": batch.reconciles,
        "stray_and_quarantine_files_catalogued": ingested.files_catalogued,
        "files_stray": len(ingested.strays),
        reruns.RERUNS_ASKED: dg.MetadataValue.json(ingested.reruns),
    }


def files_of_each_partition(ingested: pipeline.Ingested, partitions: list[str]) -> dict[str, dict[str, Any]]:
    """In a range run, the quarantined and repaired files of each partition that has any, as
    that partition's own metadata (`changes_metadata`); files outside the run's partitions
    (strays, a Flow run's fragments of the hour before it) are named by the landing check.
    Only those partitions: Dagster looks each one up in the whole range, so a call per hour of
    a year's backfill would cost it most of a minute."""
    if len(partitions) == 1:
        return {}
    in_run = set(partitions)
    quarantined: dict[str, list[Quarantined]] = {}
    repaired: dict[str, dict[str, int]] = {}
    for item in ingested.batch.quarantined:
        if (partition := ingested.partition_of.get(item.uri)) in in_run:
            quarantined.setdefault(partition, []).append(item)
    for uri, values in ingested.batch.text_repaired.items():
        if (partition := ingested.partition_of.get(uri)) in in_run:
            repaired.setdefault(partition, {})[uri] = values
    return {
        p: _files_metadata(quarantined.get(p, []), repaired.get(p, {}))
        for p in partitions
        if p in quarantined or p in repaired
    }


def _files_metadata(
    quarantined: list[Quarantined], repaired: dict[str, int], suffix: str = ""
) -> dict[str, Any]:
    return {
        f"quarantined{suffix}": dg.MetadataValue.json(
            [{"file": q.uri, "reason": q.reason} for q in quarantined]
        ),
        f"text_repaired{suffix}": dg.MetadataValue.json(
            [{"file": f, "values": n} for f, n in sorted(repaired.items())]
        ),
    }


def _run_partitions(partitions: list[str]) -> str:
    return f"{partitions[0]} to {partitions[-1]}: {len(partitions)} partitions in one run, whose figures these are"


def landing_check(ingested: pipeline.Ingested, partitions: list[str]) -> dg.AssetCheckResult:
    """`landing_complete`: fails while the landed data has holes or files that no partition reads.
    It names the files set aside outside the run's partitions (strays), which no partition's
    materialisation lists (`files_of_each_partition`)."""
    batch, strays = ingested.batch, ingested.strays
    return dg.AssetCheckResult(
        check_name=LANDING_COMPLETE,
        passed=not batch.gaps and not strays,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{len(batch.gaps)} gap(s); {len(strays)} stray file(s) that no partition reads; "
        f"{len(batch.quarantined)} file(s) quarantined",
        metadata={
            "gaps": dg.MetadataValue.json(batch.gaps),
            "files_quarantined": len(batch.quarantined),
            "files_stray": len(strays),
            **_files_metadata(
                [q for q in batch.quarantined if ingested.partition_of.get(q.uri) not in partitions],
                {
                    f: n
                    for f, n in batch.text_repaired.items()
                    if ingested.partition_of.get(f) not in partitions
                },
                suffix="_outside_the_partitions",
            ),
        },
    )


def state_layers(table: AssetTable, changes: dg.AssetsDefinition) -> list[dg.AssetSpec]:
    """`current` and `history`, both written by the fold of `changes`."""

    def layer(key: dg.AssetKey, description: str) -> dg.AssetSpec:
        return dg.AssetSpec(
            key,
            deps=[changes.key],
            group_name=table.group,
            kinds={"spark", "parquet"},
            automation_condition=follow_upstream(),
            description=description,
        )

    return [
        layer(
            table.key("current"),
            f"Live state of `{table.name}` (SCD type 1): one row per {table.key_columns}, the last "
            "version by (version time, sequence); deleted keys are absent. Materialising a "
            "partition folds that partition's change events in.",
        ),
        layer(
            table.key("history"),
            f"Every version of `{table.name}` (SCD type 2, Fivetran history mode): "
            "`_fivetran_start`, `_fivetran_end` (next start − 1 ms, the delete time, or "
            "9999-12-31 23:59:59.999), `_fivetran_active`, `_fivetran_synced`. Open versions "
            "under `active/`, closed ones under `closed/<end date>/`.",
        ),
    ]


def state_checks(table: AssetTable) -> list[dg.AssetCheckSpec]:
    """The fold's checks, blocking: a failed one holds back what depends on the table's state."""

    def check(name: str, description: str) -> dg.AssetCheckSpec:
        asset = table.key(checks.LAYER_OF_CHECK[name])
        return dg.AssetCheckSpec(name, asset=asset, blocking=True, description=description)

    return [
        check(checks.CURRENT_UNIQUE_KEY, "One row per key in current."),
        check(
            checks.HISTORY_WINDOWS,
            "Per key: at most one active version, no inverted or overlapping windows, each end = "
            "next start − 1 ms or the delete time.",
        ),
        check(
            checks.EVENTS_RECONCILE,
            "Events folded = versions stored + identical duplicates + superseded writes of one version.",
        ),
    ]


def state_asset(
    table: AssetTable, changes: dg.AssetsDefinition, partitions_def: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    @dg.multi_asset(
        name=identifier(table.feed.name, table.name, "state"),
        ins={"batch": dg.AssetIn(key=changes.key)},
        specs=state_layers(table, changes),
        check_specs=state_checks(table),
        partitions_def=partitions_def,
        backfill_policy=dg.BackfillPolicy.single_run(),
        pool=table.pool,
        can_subset=False,
    )
    def state(
        context: dg.AssetExecutionContext,
        spark: LakeSparkResource,
        lake: LakeResource,
        catalog: CatalogResource,
        batch: DataFrame,
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        """Fold the change events of the materialised partitions into current and history."""
        try:
            work = table.work(context.run.run_id, lake, catalog)
            # A batch handed over in memory is the one this run stored; one read back is the
            # change log as stored, by whichever run, in the files it was read from.
            handed_over = lake_io.is_cached(batch)
            stored_by = work.run_id if handed_over else None
            folded_files = None if handed_over else {canonical_uri(uri) for uri in batch.inputFiles()}
            with work.writing("state", context.log):
                if not handed_over:
                    # Kept as read (a checkpoint: not taken for a batch handed over): a purge the
                    # fold applies rewrites the change log's partitions the batch was read from,
                    # and the checks after the commit read it again.
                    batch = batch.localCheckpoint(eager=True)
                report = fold(
                    table, spark.spark_session, work, batch, context.log, list(context.partition_keys)
                )
                layers = read_state_layers(table, spark.spark_session, work)
                for layer in layers:
                    if layer.schema is not None:
                        add_column_schema(context, layer.key, layer.schema, list(context.partition_keys))
                yield from state_materializations(layers, report)
                outcomes = pipeline.check_fold(
                    spark.spark_session,
                    work,
                    batch,
                    report,
                    partitions=list(context.partition_keys),
                    log=context.log,
                )
                if all(outcome.passed for outcome in outcomes):
                    pipeline.record_processed(
                        work, list(context.partition_keys), stored_by, context.log, folded_files
                    )
            yield from fold_check_results(table, outcomes)
        finally:
            release_cached(batch)  # a batch handed over in memory (`io_managers.InMemoryHandover`)

    return state


def fold(
    table: AssetTable,
    session: SparkSession,
    work: pipeline.TableWork,
    batch: DataFrame,
    log: logging.Logger,
    partitions: list[str] | None = None,
) -> FoldReport:
    """The batch (of `partitions`) folded into the stored state; a batch that cannot join it
    fails the step."""
    try:
        return pipeline.fold_into_state(session, work, batch, log=log, partitions=partitions or ())
    except SchemaClash as clash:
        raise clash_failure(table, clash, batch) from clash


def fold_metadata(report: FoldReport) -> dict[str, int]:
    """What the fold did, as metadata of both state layers."""
    return {
        "events_folded": report.events_in,
        "keys_touched": report.keys_touched,
        "late_keys": report.late_keys,
        "closed_days_rewritten": len(report.days_rewritten),
        "closed_files_rewritten": report.closed_files_rewritten,
        "closed_days_appended": len(report.days_appended),
        "closed_days_compacted": len(report.days_compacted),
        "keys_newly_purged": len(report.newly_purged),
    }


@dataclasses.dataclass(frozen=True)
class StateLayer:
    """A state layer as a reader finds it, from its Parquet footers (a Spark count and schema
    merge of current and history cost every state run a few tenths of a second:
    docs/profiling.md, "Figures behind the code"). `schema` is None without files."""

    key: dg.AssetKey
    uri: str
    rows: int
    schema: T.StructType | None


def read_state_layers(table: AssetTable, session: SparkSession, work: pipeline.TableWork) -> list[StateLayer]:
    """Current and history as stored now: their rows and schema, from their files' footers
    (read once a fold, for its materialisations and the column schema)."""
    table_state = TableState(work.layout, table.feed.name, table.name)
    found = []
    for key, uri in (
        (table.key("current"), table_state.current),
        (table.key("history"), table_state.history),
    ):
        rows, schema = lake_io.table_summary(session, work.storage, uri) or (0, None)
        found.append(StateLayer(key, uri, rows, schema))
    return found


def state_materializations(layers: list[StateLayer], report: FoldReport) -> Iterator[dg.MaterializeResult]:
    """Current and history as a reader now finds them, each with the fold's figures."""
    for layer in layers:
        yield dg.MaterializeResult(
            asset_key=layer.key,
            metadata={
                **fold_metadata(report),
                "dagster/row_count": layer.rows,
                "path": dg.MetadataValue.path(layer.uri),
            },
        )


def add_column_schema(
    context: dg.AssetExecutionContext, key: dg.AssetKey, schema: T.StructType, partitions: list[str]
) -> None:
    """`key`'s columns as its materialisation's `dagster/column_schema`, on the run's last
    partition only. Dagster copies a range run's metadata onto each of its partitions, and the
    schema was the largest part of those events: a week's backfill stored it some 500 times
    (docs/profiling.md, "Figures behind the code"). The asset's page shows the latest
    materialisation's schema, which is the last partition's."""
    columns = [dg.TableColumn(name, dtype) for name, dtype in lake_io.schema_metadata(schema)]
    context.add_asset_metadata(
        {"dagster/column_schema": dg.TableSchema(columns=columns)},
        asset_key=key,
        partition_key=partitions[-1],
    )


def fold_check_results(table: AssetTable, outcomes: list[checks.Outcome]) -> Iterator[dg.AssetCheckResult]:
    for outcome in outcomes:
        yield dg.AssetCheckResult(
            asset_key=table.key(checks.LAYER_OF_CHECK[outcome.name]),
            check_name=outcome.name,
            passed=outcome.passed,
            description=outcome.description,
            metadata=outcome.metadata,
            severity=dg.AssetCheckSeverity.ERROR,
        )


def clash_failure(table: AssetTable, clash: SchemaClash, batch: DataFrame) -> dg.Failure:
    """A batch that cannot join the stored table: the failure names the landed files to look at."""
    files = pipeline.files_with_values(batch, clash.column)
    named = "; landed file(s) with this column: " + ", ".join(files) if files else ""
    return dg.Failure(
        description=f"{table.label}: the batch cannot be folded into the stored table: {clash}{named}",
        metadata={"column": clash.column or "", "files": dg.MetadataValue.json(files)},
    )
