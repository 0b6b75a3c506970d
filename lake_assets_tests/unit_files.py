"""Small hand-made Unit CDC files for focused tests."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

UTC = dt.timezone.utc


def at(hour: int, minute: int = 0, second: int = 0, day: int = 1) -> dt.datetime:
    return dt.datetime(2024, 3, day, hour, minute, second, tzinfo=UTC)


def event(id_, op, seq, when, **payload):
    return {"id": id_, **payload, "cdc_operation_type": op, "cdc_change_seq": seq, "cdc_commit_timestamp": when}


def hour_dir(landing: Path, table: str, hour: int, day: int = 1) -> Path:
    folder = landing / table / f"year=2024/month=03/day={day:02d}/hour={hour:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_events(landing: Path, table: str, hour: int, name: str, rows: list[dict], schema: pa.Schema | None = None, day: int = 1) -> Path:
    path = hour_dir(landing, table, hour, day) / name
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


ACCOUNT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("name", pa.string()),
        ("balance", pa.int64()),
        ("cdc_operation_type", pa.string()),
        ("cdc_change_seq", pa.int64()),
        ("cdc_commit_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
