"""Unit CDC exports: hourly Parquet under `<table>/year=/month=/day=/hour=/part-*.parquet`.

Facts (docs/formats/unit-cdc.md): business key `id`; special columns
`cdc_operation_type` (INSERT/UPDATE/DELETE or I/U/D), `cdc_change_seq` (unique, increasing) and
`cdc_commit_timestamp`; a DELETE row carries only `id`; duplicates, out-of-order rows and
same-timestamp multi-updates happen; columns come and go; hours gain files up to 4 hours late.
Their physical types are not documented, so every plausible encoding is accepted.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Literal

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets.config_model import TABLE_NAME, FeedConfig
from lake_assets.engine import model as m
from lake_assets.engine.names import col
from lake_assets.engine.schema import change_columns
from lake_assets.feeds.base import (
    FILE_PARTITION,
    FILE_URI,
    INVALID,
    WALK_FROM_HOURS,
    FeedFormat,
    LandingSurvey,
    ascii_upper,
    files_in_folders,
    hour_folders,
    hourly_files,
    hourly_strays,
    is_text_type,
    list_hour_folders,
    outside_history,
    parse_hour_key,
    stripped,
    timestamp_column,
)
from lake_assets.paths import safe_segment
from lake_assets.storage import Entry, Storage, is_hidden

KEY = "id"
OPERATION = "cdc_operation_type"
SEQUENCE = "cdc_change_seq"
COMMITTED_AT = "cdc_commit_timestamp"
SPECIAL = (OPERATION, SEQUENCE, COMMITTED_AT)

_OPS = {
    "INSERT": m.INSERT,
    "I": m.INSERT,
    "UPDATE": m.UPDATE,
    "U": m.UPDATE,
    "DELETE": m.DELETE,
    "D": m.DELETE,
}


def _is_whole_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or (pa.types.is_decimal(t) and t.scale == 0)


class UnitCdcFeedConfig(FeedConfig):
    """A Unit CDC feed: the options every feed has, nothing more."""

    format: Literal["unit_cdc"]


class UnitCdcFormat(FeedFormat):
    name = "unit_cdc"
    config_model = UnitCdcFeedConfig
    partition_column = "hour"
    time_columns = (COMMITTED_AT,)

    def survey(self, storage: Storage, landing: str) -> LandingSurvey:
        tables, unread = [], []
        for entry in storage.list(landing):
            if entry.is_dir and re.fullmatch(TABLE_NAME, entry.name):
                tables.append(entry.name)  # `_accounts` too: a table name may start with `_`
            elif is_hidden(entry.name):
                continue
            elif not entry.is_dir:
                what = f"{entry.unreadable}, " if entry.unreadable else "a file "
                unread.append(f"{entry.uri}: {what}outside every table's folder")
            else:
                unread.append(f"{entry.uri}/: no table has this name (a table folder is named {TABLE_NAME})")
        return LandingSurvey(sorted(tables), sorted(unread))

    def table_spec(self, table: str) -> m.TableSpec:
        return m.TableSpec(name=table, keys=(KEY,))

    def partition_keys(self, storage: Storage, landing: str, table: str) -> list[str]:
        return list_hour_folders(storage, self._table_uri(landing, table))

    def landed_hours(
        self, storage: Storage, landing: str, table: str, since: dt.datetime | None
    ) -> dict[str, tuple[Entry, ...]]:
        return {
            key: tuple(sorted(files, key=lambda e: e.name))
            for key, files in hourly_files(storage, self._table_uri(landing, table), since).items()
        }

    def stray_files(self, storage: Storage, landing: str, table: str) -> list[tuple[Entry, str]]:
        return hourly_strays(storage, self._table_uri(landing, table))

    def partition_files(self, storage: Storage, landing: str, table: str, partition: str) -> list[Entry]:
        return self.partitions_files(storage, landing, table, [partition])[partition]

    def partitions_files(
        self, storage: Storage, landing: str, table: str, partitions: list[str]
    ) -> dict[str, list[Entry]]:
        """The files of each hour, in every folder spelling of it (`hour=05`, `hour=5`), from
        one listing pruned to the hours' range, or for many hours (a backfill) one walk of the
        table (`hourly_files`), which lists a thousand keys a request where the pruned listing
        asks once per hour folder."""
        if not partitions:
            return {}
        if len(set(partitions)) >= WALK_FROM_HOURS:
            landed = hourly_files(storage, self._table_uri(landing, table), None)
            return {key: landed.get(key, []) for key in partitions}
        moments = [parse_hour_key(key) for key in partitions]
        folders = hour_folders(storage, self._table_uri(landing, table), min(moments), max(moments))
        return files_in_folders(storage, folders, partitions)

    @staticmethod
    def _table_uri(landing: str, table: str) -> str:
        return f"{landing}/{safe_segment(table, 'table')}"

    def vet_schema(self, schema: pa.Schema) -> str | None:
        names = set(schema.names)
        if KEY not in names:
            return f"missing the key column '{KEY}'"
        missing = [c for c in SPECIAL if c not in names]
        if missing:
            return f"missing special column(s) {missing}"
        op_type = schema.field(OPERATION).type
        if not is_text_type(op_type):
            return f"column '{OPERATION}' has type {op_type}, expected a string"
        seq_type = schema.field(SEQUENCE).type
        if not (_is_whole_number(seq_type) or is_text_type(seq_type)):
            return f"column '{SEQUENCE}' has type {seq_type}, expected an integer (or digits as text)"
        ts_type = schema.field(COMMITTED_AT).type
        if not (
            pa.types.is_timestamp(ts_type)
            or pa.types.is_date(ts_type)
            or is_text_type(ts_type)
            or _is_whole_number(ts_type)
        ):
            return f"column '{COMMITTED_AT}' has type {ts_type}, expected a timestamp (or ISO text or epoch number)"
        return None

    def normalise(self, raw: DataFrame) -> DataFrame:
        op_text = ascii_upper(stripped(F.col(OPERATION)))
        op = F.coalesce(*[F.when(op_text == k, F.lit(v)) for k, v in _OPS.items()])
        seq_col = F.col(SEQUENCE)
        seq = (
            seq_col.try_cast("long")  # NULL beyond 64 bits (an unsigned or decimal sequence): refused
            if not isinstance(raw.schema[SEQUENCE].dataType, T.StringType)
            else stripped(seq_col).try_cast("bigint")
        )
        version_at = F.date_trunc(
            "millisecond", timestamp_column(COMMITTED_AT, raw.schema[COMMITTED_AT].dataType)
        )
        invalid = (
            F.when(F.col(KEY).isNull(), F.lit("id is NULL"))
            .when(
                op.isNull(),
                F.concat(F.lit(f"unknown {OPERATION} "), F.coalesce(F.col(OPERATION), F.lit("NULL"))),
            )
            .when(
                seq.isNull(),
                F.concat(
                    F.lit(f"{SEQUENCE} is not a whole number: "),
                    F.coalesce(seq_col.cast("string"), F.lit("NULL")),
                ),
            )
            .when(
                version_at.isNull(),
                F.concat(
                    F.lit(f"{COMMITTED_AT} is not a time: "),
                    F.coalesce(F.col(COMMITTED_AT).cast("string"), F.lit("NULL")),
                ),
            )
            .otherwise(outside_history(version_at, COMMITTED_AT))
        )
        payload = [c for c in raw.columns if c not in (KEY, *SPECIAL) and not m.is_reserved(c)]
        return raw.select(
            F.col(KEY),
            *[col(c) for c in payload],
            *change_columns(
                op=op,
                version_at=version_at,
                seq=seq,
                source_file=F.col(FILE_URI),
                partition=F.col(FILE_PARTITION),
                partition_column=self.partition_column,
            ),
            invalid.alias(INVALID),
            F.col(FILE_URI),
        )
