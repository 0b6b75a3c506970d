"""Landing sensors: one per feed, a cursor per table, ranged runs for new or late files."""


import hashlib

import dagster as dg

from lake_assets.config import FeedConfig
from lake_assets.feeds.base import FeedFormat
from lake_assets.landing_watch import TableCursor, contiguous_ranges, decode_cursor, encode_cursor, scan_table
from lake_assets.orchestration.assets import TableAssets
from lake_assets.orchestration.resources import LakeResource

RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


def build_landing_sensor(feed: FeedConfig, fmt: FeedFormat, tables: list[TableAssets]) -> dg.SensorDefinition:
    by_name = {t.table: t for t in tables}

    @dg.sensor(
        name=f"{feed.name.replace('-', '_')}_landing_sensor",
        description=(
            f"Watches {feed.landing} for new hour folders and for files arriving up to "
            f"{feed.late_hours} h late in an hour already seen; requests one run per table and "
            "range of consecutive hours, keyed by the files it saw so nothing runs twice."
        ),
        minimum_interval_seconds=30,
        asset_selection=[k for t in tables for k in t.keys if k != t.raw.key],
    )
    def landing_sensor(context: dg.SensorEvaluationContext, lake: LakeResource):
        storage = lake.get_storage()
        cursors = decode_cursor(context.cursor)
        run_requests, observations = [], []
        for name, assets in sorted(by_name.items()):
            found, cursors[name] = scan_table(
                storage, fmt, feed.landing, name, cursors.get(name) or TableCursor(), feed.late_hours
            )
            if not found:
                continue
            fingerprints = {f.partition: f.fingerprint for f in found}
            for start, end in contiguous_ranges(list(fingerprints)):
                digest = hashlib.sha1(
                    "".join(f"{k}={fingerprints[k]}" for k in sorted(fingerprints) if start <= k <= end).encode()
                ).hexdigest()[:16]
                run_requests.append(
                    dg.RunRequest(
                        run_key=f"{feed.name}:{name}:{start}..{end}:{digest}",
                        asset_selection=[k for k in assets.keys if k != assets.raw.key],
                        tags={RANGE_START_TAG: start, RANGE_END_TAG: end, "lake_assets/table": name},
                    )
                )
            observations.append(
                dg.AssetObservation(
                    asset_key=assets.raw.key,
                    metadata={
                        "new_files": sum(len(f.new_names) for f in found),
                        "partitions_with_new_files": dg.MetadataValue.json(sorted(fingerprints)),
                    },
                )
            )
        return dg.SensorResult(run_requests=run_requests, asset_events=observations, cursor=encode_cursor(cursors))

    return landing_sensor
