"""Dagster definitions built from a feed configuration and what discovery pinned in the lake.

Building them never lists a landing (`lake_assets.discovery`): the same configuration and pins
give the same definitions whatever has landed since.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path

import dagster as dg

from lake_assets.config import FeedConfig, LakeConfig, load_config
from lake_assets.discovery import (
    DISCOVER_HINT,
    Pin,
    first_hour,
    load_pins,
    pins_anything,
    sharing_landing,
    tables_of_every_feed,
)
from lake_assets.errors import ConfigError
from lake_assets.feeds import format_for
from lake_assets.feeds.base import HOUR_KEY_FORMAT, FeedFormat
from lake_assets.orchestration.assets import (
    WHOLE_TABLE_RUN_TAG,
    TableAssets,
    build_table_assets,
    feed_job_name,
    table_job_name,
)
from lake_assets.orchestration.io_managers import SparkParquetIOManager
from lake_assets.orchestration.resources import CatalogResource, LakeResource, LakeSparkResource
from lake_assets.orchestration.sensors import build_batch_sensor, build_landing_sensor, build_tables_sensor
from lake_assets.paths import identifier, is_s3

AUTOMATION_SENSOR = "lake_automation"

DEMO_CONFIG = Path(__file__).resolve().parents[2] / ".demo" / "lake_assets.yaml"

log = logging.getLogger(__name__)


def batch_partitions_name(feed: str, table: str) -> str:
    return identifier(feed, table, "batches")


def resources_for(config: LakeConfig) -> dict:
    uses_s3 = is_s3(config.lake) or any(is_s3(f.landing) for f in config.feeds)
    # The catalog and the IO manager hold the same `lake` (and `spark`) as typed fields: Dagster
    # initialises them as nested resources, so their config is the top-level one.
    lake = LakeResource(
        root=config.lake,
        s3_endpoint_url=config.s3.endpoint_url,
        s3_region=config.s3.region,
        lease_wait_seconds=config.lease_wait_seconds,
    )
    spark = LakeSparkResource.for_lake(
        master=config.spark.master,
        remote=config.spark.remote,
        extra=dict(config.spark.conf),
        use_s3=uses_s3,
        s3_endpoint_url=config.s3.endpoint_url,
        s3_region=config.s3.region,
    )
    catalog = CatalogResource(
        lake=lake,
        store=config.catalog.store,
        table=config.catalog.table,
        latest_table=config.catalog.latest_table,
        endpoint_url=config.catalog.endpoint_url,
        region=config.s3.region,
    )
    return {
        "lake": lake,
        "spark": spark,
        "catalog": catalog,
        "lake_io_manager": SparkParquetIOManager(lake=lake, spark=spark, catalog=catalog),
    }


def config_path() -> Path:
    """The feed configuration the code location loads: `LAKE_ASSETS_CONFIG`, else
    `./lake_assets.yaml`, else the demo's (written by `./dev demo`)."""
    explicit = os.environ.get("LAKE_ASSETS_CONFIG")
    if explicit:
        return Path(explicit)
    for candidate in (Path("lake_assets.yaml"), DEMO_CONFIG):
        if candidate.is_file():
            return candidate
    raise ConfigError(
        "no feed configuration: set LAKE_ASSETS_CONFIG to a config file, create ./lake_assets.yaml, "
        "or run './dev demo' first to create the demo configuration"
    )


@dg.definitions
def code_location() -> dg.Definitions:
    """The code location Dagster loads (`lake_assets.definitions`, named in workspace.yaml): the
    definitions of the configuration at `config_path()`, read when Dagster loads them, not when
    the module is imported."""
    return build_definitions(load_config(config_path()))


def build_definitions(config: LakeConfig) -> dg.Definitions:
    """The definitions of a feed configuration (what the code location loads; tests build their
    own from a configuration of their own)."""
    pins = load_pins(config, config.storage())
    assets: list = []
    sensors: list = []
    jobs: list = []
    tables_of, left_out = tables_of_every_feed(config.feeds, pins)
    for line in left_out.values():  # `lake-assets run` and discovery fail on these too
        log.error(line)
    for feed in config.feeds:
        fmt = format_for(feed)
        tables = tables_of[feed.name]
        if pins_anything(feed, fmt):
            sensors.append(build_tables_sensor(feed, fmt, pins[feed.name], sharing_landing(config, feed)))
        if not tables:
            log.warning(
                "feed %s: no tables configured or pinned, so it has no assets; %s", feed.name, DISCOVER_HINT
            )
            continue
        if fmt.partitioning == "batch":
            built = _batch_tables(feed, fmt, tables)
            jobs.extend(_table_job(feed, table_assets) for table_assets in built)
            sensors.append(build_batch_sensor(feed, fmt, built))
        else:
            hours = _hours_of(feed, pins[feed.name])  # one definition: the feed job spans every table
            built = [build_table_assets(feed, fmt, t, hours) for t in tables]
            jobs.append(_feed_job(feed, built))
            sensors.append(build_landing_sensor(feed, fmt, built))
        assets.extend(definition for table_assets in built for definition in table_assets.definitions)
    if assets:
        sensors.append(_automation_sensor(config))
    return dg.Definitions(
        assets=assets,
        sensors=sensors,
        jobs=jobs,
        resources=resources_for(config),
        # One process per run: a SparkSession (and its JVM) per step would cost more than the work.
        executor=dg.in_process_executor,
    )


def _batch_tables(feed: FeedConfig, fmt: FeedFormat, tables: list[str]) -> list[TableAssets]:
    """A batch feed's tables: each partitioned by its own batches (dynamic partitions)."""
    return [
        build_table_assets(
            feed, fmt, t, dg.DynamicPartitionsDefinition(name=batch_partitions_name(feed.name, t))
        )
        for t in tables
    ]


def _hours_of(feed: FeedConfig, pin: Pin) -> dg.HourlyPartitionsDefinition:
    """An hourly feed's partitions, from its first hour. The hour under way is a partition too
    (`end_offset=1`): its files are read as they land, and a file landing later in the hour
    re-runs it like any late file."""
    return dg.HourlyPartitionsDefinition(
        start_date=dt.datetime.strptime(first_hour(feed, pin), HOUR_KEY_FORMAT),
        fmt=HOUR_KEY_FORMAT,
        timezone="UTC",
        end_offset=1,
    )


def _table_job(feed: FeedConfig, table_assets: TableAssets) -> dg.UnresolvedAssetJobDefinition:
    return dg.define_asset_job(
        table_job_name(feed.name, table_assets.table),
        selection=dg.AssetSelection.assets(*table_assets.processed_keys),
        description=f"`{table_assets.table}` of the `{feed.name}` feed: changes, current and history.",
        tags={WHOLE_TABLE_RUN_TAG: "true"},
    )


def _feed_job(feed: FeedConfig, built: list[TableAssets]) -> dg.UnresolvedAssetJobDefinition:
    """One job over every table of an hourly feed (they share the feed's hours)."""
    return dg.define_asset_job(
        feed_job_name(feed.name),
        selection=dg.AssetSelection.assets(*[k for t in built for k in t.processed_keys]),
        description=f"Every table of the `{feed.name}` feed: changes, current and history.",
        tags={WHOLE_TABLE_RUN_TAG: "true"},
    )


def _automation_sensor(config: LakeConfig) -> dg.AutomationConditionSensorDefinition:
    return dg.AutomationConditionSensorDefinition(
        AUTOMATION_SENSOR,
        target=dg.AssetSelection.all(),
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=min(f.sensor_interval_seconds for f in config.feeds),
        description="Evaluates the assets' automation conditions: `changes`, `current` and "
        "`history` follow their upstream partitions, including old hours.",
    )
