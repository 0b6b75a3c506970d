"""Current state (SCD1) and history (SCD2, Fivetran history mode) from change events.

The rules (DESIGN.md "Semantics"), applied per key in (version time, sequence) order:
1. identical events collapse: one event per (key, version time, sequence);
2. a partial update's unmodified columns take the previous event's values, reset by a delete;
3. several writes of one version collapse to the greatest sequence;
4. every surviving non-delete event is a history version; it ends 1 ms before the next version,
   at the next event's time when that is a delete, or at the end of time while it is live;
5. current holds each key's live version; a key whose last event is a delete is absent;
6. a purged key keeps its key and system columns, every field is erased.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from pyspark.sql import Column, DataFrame, Window, functions as F

from lake_assets.engine import model as m


@dataclasses.dataclass
class FoldResult:
    current: DataFrame
    history: DataFrame


def _key_cols(spec: m.TableSpec) -> list[Column]:
    return [F.col(f"`{k}`") for k in spec.keys]


def collapse_identical(events: DataFrame, spec: m.TableSpec) -> DataFrame:
    """One event per (key, version time, sequence); a deterministic pick if re-deliveries differ."""
    window = Window.partitionBy(*_key_cols(spec), F.col(m.VERSION_AT), F.col(m.SEQ)).orderBy(
        F.col(m.SOURCE_FILE).desc_nulls_last(), F.col(m.OP).desc()
    )
    return events.withColumn("__dup", F.row_number().over(window)).where("__dup = 1").drop("__dup")


def fill_unmodified(events: DataFrame, spec: m.TableSpec, payload: list[str]) -> DataFrame:
    """Columns listed in `_unmodified` take the value of the key's previous event in its life."""
    if not spec.partial_updates or not payload:
        return events
    order = [F.col(m.VERSION_AT), F.col(m.SEQ)]
    is_delete = (F.col(m.OP) == m.DELETE).cast("int")
    before = Window.partitionBy(*_key_cols(spec)).orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
    events = events.withColumn("__life", F.coalesce(F.sum(is_delete).over(before), F.lit(0)))
    so_far = (
        Window.partitionBy(*_key_cols(spec), F.col("__life"))
        .orderBy(*order)
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    filled = []
    for column in payload:
        name = f"`{column}`"
        unmodified = F.coalesce(F.array_contains(F.col(m.UNMODIFIED), column), F.lit(False))
        # Wrapping the value in a struct keeps an explicit NULL apart from "not set here".
        carried = F.last(F.when(~unmodified, F.struct(F.col(name).alias("v"))), ignorenulls=True).over(so_far)
        filled.append(F.when(unmodified, carried.getField("v")).otherwise(F.col(name)).alias(column))
    others = [F.col(f"`{c}`") for c in events.columns if c not in payload and c != "__life"]
    return events.select(*others, *filled)


def latest_write_per_version(events: DataFrame, spec: m.TableSpec) -> DataFrame:
    window = Window.partitionBy(*_key_cols(spec), F.col(m.VERSION_AT)).orderBy(F.col(m.SEQ).desc())
    return events.withColumn("__w", F.row_number().over(window)).where("__w = 1").drop("__w")


def erase_purged(frame: DataFrame, spec: m.TableSpec, payload: list[str]) -> DataFrame:
    """Null every field of keys that carry a purge marker on any event."""
    if not payload:
        return frame
    purged = F.max(F.coalesce(F.col(m.PURGED), F.lit(False)).cast("int")).over(Window.partitionBy(*_key_cols(spec))) == 1
    return frame.select(
        *[
            (F.when(purged, F.lit(None)).otherwise(F.col(f"`{c}`")).cast(frame.schema[c].dataType).alias(c) if c in payload else F.col(f"`{c}`"))
            for c in frame.columns
        ]
    )


def fold_full(changes: DataFrame, spec: m.TableSpec, synced_at: Column | None = None) -> FoldResult:
    """Recompute current and history from the complete change log of one table."""
    hc = spec.history_columns
    payload = spec.payload_columns(changes.columns)
    # One instant for the whole fold, so current and history agree on when they were written.
    synced = synced_at if synced_at is not None else F.lit(dt.datetime.now(dt.timezone.utc)).cast("timestamp")

    events = collapse_identical(changes, spec)
    events = fill_unmodified(events, spec, payload)
    events = latest_write_per_version(events, spec)
    events = erase_purged(events, spec, payload)

    order = Window.partitionBy(*_key_cols(spec)).orderBy(F.col(m.VERSION_AT), F.col(m.SEQ))
    events = events.withColumn("__next_at", F.lead(m.VERSION_AT).over(order)).withColumn(
        "__next_op", F.lead(m.OP).over(order)
    )
    end = (
        F.when(F.col("__next_at").isNull(), F.to_timestamp(F.lit(m.END_OF_TIME)))
        .when(F.col("__next_op") == m.DELETE, F.col("__next_at"))
        .otherwise(F.col("__next_at") - F.expr("INTERVAL 1 MILLISECOND"))
    )
    versions = events.where(F.col(m.OP) != m.DELETE)
    key_and_payload = [F.col(f"`{c}`") for c in (*spec.keys, *payload)]
    history = versions.select(
        *key_and_payload,
        F.col(m.VERSION_AT).alias(hc.start),
        end.alias(hc.end),
        F.col("__next_at").isNull().alias(hc.active),
        synced.alias(hc.synced),
        F.col(m.SOURCE_FILE),
    )
    current = versions.where(F.col("__next_at").isNull()).select(
        *key_and_payload,
        F.col(m.VERSION_AT),
        F.col(m.SEQ),
        F.col(m.SOURCE_FILE),
        synced.alias(hc.synced),
    )
    return FoldResult(current=current, history=history)
