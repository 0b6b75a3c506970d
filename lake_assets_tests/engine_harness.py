"""Driving the merge engine directly (no Dagster) on a temporary lake, for engine tests."""

from __future__ import annotations

import datetime as dt

import duckdb
from pyspark.sql import types as T

from lake_assets.engine import model as m
from lake_assets.engine.fold import fold
from lake_assets.engine.schema import system_fields
from lake_assets.engine.state import TableState
from lake_assets.paths import LakeLayout
from lake_assets.storage import Storage

SPEC = m.TableSpec(name="things", keys=("id",), partial_updates=True)
PAYLOAD = ("c1", "c2")
SCHEMA = T.StructType(
    [
        T.StructField("id", T.StringType()),
        T.StructField("c1", T.StringType()),
        T.StructField("c2", T.LongType()),
        *system_fields(ingested_at=False),
    ]
)


def as_row(event: dict) -> tuple:
    return (
        event["id"],
        event.get("c1"),
        event.get("c2"),
        event["op"],
        event["version_at"],
        event["seq"],
        event.get("unmodified"),
        bool(event.get("purged")),
        event.get("source_file", "file:///test"),
    )


class EngineLake:
    def __init__(self, spark, root, spec: m.TableSpec = SPEC):
        self.spark = spark
        self.root = root
        self.spec = spec
        self.storage = Storage()
        self.state = TableState(LakeLayout(f"file://{root}"), "test", spec.name)

    def fold(self, events: list[dict], **kwargs):
        """Fold `events`; those that name an `hour` carry it as their delivery (the change log's
        partition), as a run's batch does."""
        batch = None
        if any("hour" in e for e in events):
            delivered = T.StructType([*SCHEMA.fields, T.StructField("hour", T.StringType())])
            batch = self.spark.createDataFrame([(*as_row(e), e.get("hour")) for e in events], delivered)
        elif events:
            batch = self.spark.createDataFrame([as_row(e) for e in events], SCHEMA)
        return fold(self.spark, self.storage, self.state, batch, self.spec, **kwargs)

    def _rows(self, folder: str, order: str) -> list[dict]:
        path = folder[len("file://") :]
        import os

        if not os.path.isdir(path) or not any(
            f.endswith(".parquet") for _, _, fs in os.walk(path) for f in fs
        ):
            return []
        con = duckdb.connect()
        con.execute("SET TimeZone = 'UTC'")
        cur = con.execute(
            f"SELECT * FROM read_parquet('{path}/**/*.parquet', union_by_name = true) ORDER BY {order}"
        )
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def current(self) -> list[dict]:
        return self._rows(self.state.current, "id")

    def history(self) -> list[dict]:
        return self._rows(self.state.history, "id, _fivetran_start")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, microsecond: int = 0
) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, second, microsecond, tzinfo=dt.UTC)
