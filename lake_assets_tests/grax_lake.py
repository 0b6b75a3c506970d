"""A small GRAX landing and the ways a lake processes it (the CLI, a Dagster range backfill, the
batch sensor's runs), with what the purge tests read back from every layer."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from lake_assets.config import FeedConfig, LakeConfig
from lake_assets.feeds.grax_v2 import batch_order, sort_batches
from lake_assets.landing_watch import stretches_in_order
from lake_assets.orchestration.definitions import batch_partitions_name, table_job_name
from lake_assets.orchestration.resources import LakeResource
from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
from lake_assets.runner import run_feeds
from lake_assets_tests.discovered import discovered_definitions

UTC = dt.UTC
ORG = "00Dpurge"
TABLE = f"{ORG}/account"
FEED = "grax"
LAYERS = ("changes", "current", "history")
#: what differs between two runs over the same landed data: when they ran
RUN_TIME_COLUMNS = ("_ingested_at", "_fivetran_synced")
SCHEMA = pa.schema(
    [
        ("Id", pa.string()),
        ("source__modified", pa.timestamp("ms", tz="UTC")),
        ("grax__idseq", pa.string()),
        ("grax__purged", pa.timestamp("ms", tz="UTC")),
        ("grax__restoredfrom", pa.string()),
        ("Name", pa.string()),
        ("Phone", pa.string()),
    ]
)


def at(hour: int, ms: int = 0) -> dt.datetime:
    return dt.datetime(2024, 1, 1, hour, tzinfo=UTC) + dt.timedelta(milliseconds=ms)


def version(
    key: str, hour: int, idseq: str, name: str | None = None, phone: str | None = None, **extra
) -> dict:
    """A GRAX row: version `at(hour)` of `key` with its fields."""
    return {
        "Id": key,
        "source__modified": at(hour),
        "grax__idseq": idseq,
        "Name": name,
        "Phone": phone,
        **extra,
    }


def purge(key: str, hour: int, idseq: str) -> dict:
    """GRAX's purge of `key`: a write marked `grax__purged`, without field data."""
    return {"Id": key, "source__modified": at(hour), "grax__idseq": idseq, "grax__purged": at(hour)}


def land(landing: Path, batch: str, name: str, rows: list[dict]) -> Path:
    folder = landing / "parquet" / "v2" / f"org={ORG}" / "object=Account" / f"batch={batch}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return path


def config_for(landing: Path, lake: Path) -> LakeConfig:
    return LakeConfig(
        lake=f"file://{lake}", feeds=(FeedConfig(name=FEED, format="grax_v2", landing=f"file://{landing}"),)
    )


def cli(
    config: LakeConfig, instance: dg.DagsterInstance, first: str | None = None, last: str | None = None
) -> None:
    """What `lake-assets run [--from first --to last]` does."""
    run_feeds(config, instance=instance, say=lambda _: None, first=first, last=last)


def backfill(
    config: LakeConfig,
    instance: dg.DagsterInstance,
    first: str,
    last: str,
    layers=("catalog", "changes", "current", "history"),
) -> None:
    """A backfill of the batches `first` .. `last` of the table's job as the UI launches it (the
    landed batches registered): one run per range the instance holds in a row, as Dagster's
    single-run backfill policy cuts the partitions picked."""
    defs = discovered_definitions(config)
    name = batch_partitions_name(FEED, TABLE)
    landed = {
        p.name[len("batch=") :] for p in Path(config.feeds[0].landing[len("file://") :]).rglob("batch=*")
    }
    instance.add_dynamic_partitions(name, sort_batches(landed - set(instance.get_dynamic_partitions(name))))
    picked = sort_batches(b for b in landed if batch_order(first) <= batch_order(b) <= batch_order(last))
    for stretch in stretches_in_order(instance.get_dynamic_partitions(name), picked):
        result = defs.resolve_job_def(table_job_name(FEED, TABLE)).execute_in_process(
            instance=instance,
            tags={RANGE_START_TAG: stretch[0], RANGE_END_TAG: stretch[-1]},
            asset_selection=[dg.AssetKey([FEED, *TABLE.split("/"), layer]) for layer in layers],
        )
        assert result.success


def sensor_tick(
    config: LakeConfig,
    instance: dg.DagsterInstance,
    cursor: str | None,
    layers=("catalog", "changes", "current", "history"),
) -> tuple[str | None, int]:
    """One tick of the batch sensor, then the runs it requested, as the daemon would launch them
    (each stopped after `layers`, as a run killed before its fold is); returns the new cursor and
    how many runs were requested."""
    defs = discovered_definitions(config)
    sensor = defs.resolve_sensor_def(f"{FEED}_batch_sensor")
    with dg.build_sensor_context(
        resources={"lake": LakeResource(root=config.lake)}, definitions=defs, cursor=cursor, instance=instance
    ) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult), result
    for request in result.dynamic_partitions_requests or ():
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    job = defs.resolve_job_def(table_job_name(FEED, TABLE))
    for run_request in result.run_requests or ():
        assert run_request.asset_selection is not None  # every run the sensor asks for names its assets
        selected = [key for key in run_request.asset_selection if key.path[-1] in layers]
        assert job.execute_in_process(
            instance=instance, tags=run_request.tags, asset_selection=selected
        ).success
    return result.cursor, len(result.run_requests or ())


def rows(lake: Path, layer: str) -> list[dict]:
    """A layer as a reader globbing it sees it (DuckDB), in a stable order."""
    folder = lake / layer / FEED / TABLE
    if not any(folder.rglob("*.parquet")):
        return []
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    order = "Id, _fivetran_start" if layer == "history" else "Id, _version_at, _seq"
    cur = con.execute(
        f"SELECT * FROM read_parquet('{folder}/**/*.parquet', union_by_name = true, hive_partitioning = true) ORDER BY {order}"
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def field_data(row: dict) -> dict:
    """A row's field data: every value but the key, the lake's own columns and the partition."""
    return {
        k: v for k, v in row.items() if v is not None and k not in ("Id", "batch") and not k.startswith("_")
    }


def leaks(lake: Path, purged: set[str]) -> list[tuple]:
    """(layer, key, fields) of every row of a purged key that still holds field data, or lacks
    the purge marker where the layer keeps it (`changes`, `history`)."""
    found = []
    for layer in LAYERS:
        for row in rows(lake, layer):
            if row["Id"] in purged and (
                field_data(row) or (layer != "current" and row.get("_purged") is not True)
            ):
                found.append((layer, row["Id"], field_data(row)))
    return found


def comparable(lake: Path, layer: str) -> list[dict]:
    """A layer without the columns that say when it was written, its landed files named from the
    landing's `parquet/v2/` on (two lakes read two copies of one landing)."""
    return [
        {
            k: v.split("/parquet/v2/", 1)[-1] if k == "_source_file" and v else v
            for k, v in row.items()
            if k not in RUN_TIME_COLUMNS
        }
        for row in rows(lake, layer)
    ]


def tables(lake: Path) -> dict[str, list[dict]]:
    return {layer: comparable(lake, layer) for layer in LAYERS}


def clean_run(landing: Path, lake: Path) -> dict[str, list[dict]]:
    """Every layer of one `lake-assets run` over the landing into a fresh lake."""
    cli(config_for(landing, lake), dg.DagsterInstance.ephemeral())
    return tables(lake)
