"""What the end-to-end tests drop into a watched landing folder and how they check the lake a
deployment wrote: against a clean in-process run over everything landed."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import dagster as dg
import duckdb

from lake_assets.config import LakeConfig
from lake_assets.demo.unit_sample import write_unit_landing
from lake_assets.runner import run_feeds
from lake_assets_tests.deployment import Deployment

TABLES = ("accounts", "customers")
START = "2024-03-01-00"
LAYERS = ("catalog", "changes", "current", "history")
VOLATILE = ("_ingested_at", "_fivetran_synced")  # when a row was written, not what it says
RUN_TIMEOUT = 900


def hour_key(hour: int) -> str:
    return f"2024-03-01-{hour:02d}"


class Landing:
    """Sample vendor files written once, moved into the watched landing folder hour by hour."""

    def __init__(self, root: Path):
        self.staged = root / "staged" / "unit"
        self.dir = root / "landing" / "unit"
        self.dir.mkdir(parents=True)
        write_unit_landing(self.staged, hours=6, tables=TABLES)

    def land(self, hours: range) -> None:
        for table in TABLES:
            for hour in hours:
                folder = f"{table}/year=2024/month=03/day=01/hour={hour:02d}"
                if (self.staged / folder).is_dir():
                    shutil.copytree(self.staged / folder, self.dir / folder, dirs_exist_ok=True)


def lake_table(lake: Path, layer: str, feed: str, table: str) -> list[tuple]:
    """A lake table as sorted rows of (column, value) pairs, without the write-time columns."""
    files = [str(f) for f in (lake / layer / feed / table).rglob("*.parquet")]
    if not files:
        return []
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    frame = con.execute(
        f"SELECT * FROM read_parquet({files}, hive_partitioning = true, union_by_name = true)"
    )
    names = [d[0] for d in frame.description]
    return sorted(
        tuple((n, str(v)) for n, v in sorted(zip(names, row, strict=True)) if n not in VOLATILE)
        for row in frame.fetchall()
    )


def assert_lake_equals_a_clean_run(root: Path, config: LakeConfig, feed: str, tables=TABLES) -> None:
    """The deployed lake holds what one in-process run over everything landed produces."""
    reference = root / f"reference-{time.monotonic_ns()}"
    subset = LakeConfig(lake=f"file://{reference}", feeds=tuple(f for f in config.feeds if f.name == feed))
    run_feeds(subset, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
    for table in tables:
        for layer in ("changes", "current", "history"):
            deployed = lake_table(root / "lake", layer, feed, table)
            expected = lake_table(reference, layer, feed, table)
            assert deployed == expected, (
                f"{feed}/{table}/{layer}: {len(deployed)} rows deployed, {len(expected)} in a clean run"
            )
            assert expected, f"{feed}/{table}/{layer} is empty"


def partitions_since(deployment: Deployment, key: list[str], since: float) -> set[str]:
    return {
        m["partition"]
        for m in deployment.materialised_partitions(key)
        if float(m["timestamp"]) / 1000 > since
    }


def runs_since(deployment: Deployment, key: list[str], since: float) -> list[dict]:
    """For a failure message: the runs that materialised `key` after `since`, with what
    launched them (sensor, automation, backfill tags) and when."""
    made: dict[str, list[str]] = {}
    for m in deployment.materialised_partitions(key):
        if float(m["timestamp"]) / 1000 > since:
            made.setdefault(m["runId"], []).append(m["partition"])
    return [
        {
            "run": r["runId"],
            "partitions": sorted(made[r["runId"]]),
            "status": r["status"],
            "start": r["startTime"],
            "end": r["endTime"],
            "tags": {k: v for k, v in r["tags"].items() if k.startswith("dagster/")},
        }
        for r in deployment.runs()
        if r["runId"] in made
    ]
