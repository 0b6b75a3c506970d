"""The rules that turn change events into a per-key timeline, and current / history from it.

Per key, in (version time, sequence) order (DESIGN.md "Semantics", FORMATS.md "Fivetran
history mode"):
1. identical events collapse: one event per (key, version time, sequence);
2. several writes of one version collapse to the greatest sequence;
3. a partial update's unmodified columns take the previous version's values; after a delete
   (or with no previous version) they are NULL;
4. every event becomes a timeline row that ends 1 ms before the next event starts, or at the
   next event's time when that is a delete, or at the end of time when it is the last;
5. history = the timeline's non-delete rows; current = each key's last row unless a delete;
6. a purged key keeps its key and system columns, every field is erased.

The functions here know nothing of storage: `fold.py` applies them to a whole log or to the
window of touched keys.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from pyspark.sql import Column, DataFrame, Window, functions as F

from lake_assets.engine import model as m

START = "_version_at"  # in a timeline, a row starts at its version time
END = "__end"
ACTIVE = "__active"
SYNCED = "__synced"


@dataclasses.dataclass
class FoldResult:
    current: DataFrame
    history: DataFrame


def key_cols(spec: m.TableSpec) -> list[Column]:
    return [F.col(f"`{k}`") for k in spec.keys]


def with_optional_columns(events: DataFrame) -> DataFrame:
    """Events with every optional model column: a feed that never sends partial updates, purges
    or file names may leave them out."""
    defaults = {
        m.UNMODIFIED: F.lit(None).cast("array<string>"),
        m.PURGED: F.lit(False),
        m.SOURCE_FILE: F.lit(None).cast("string"),
    }
    for column, value in defaults.items():
        if column not in events.columns:
            events = events.withColumn(column, value)
    return events


def collapse_identical(events: DataFrame, spec: m.TableSpec) -> DataFrame:
    """One event per (key, version time, sequence); a deterministic pick if re-deliveries differ."""
    window = Window.partitionBy(*key_cols(spec), F.col(m.VERSION_AT), F.col(m.SEQ)).orderBy(
        F.col(m.SOURCE_FILE).desc_nulls_last(), F.col(m.OP).desc()
    )
    return events.withColumn("__dup", F.row_number().over(window)).where("__dup = 1").drop("__dup")


def latest_write_per_version(events: DataFrame, spec: m.TableSpec, tie_break: list[Column] | None = None) -> DataFrame:
    """Several writes of one version: the greatest sequence wins."""
    order = [F.col(m.SEQ).desc(), *(tie_break or []), F.col(m.SOURCE_FILE).desc_nulls_last()]
    window = Window.partitionBy(*key_cols(spec), F.col(m.VERSION_AT)).orderBy(*order)
    return events.withColumn("__w", F.row_number().over(window)).where("__w = 1").drop("__w")


def fill_unmodified(
    events: DataFrame, spec: m.TableSpec, payload: list[str], settled: Column | None = None
) -> DataFrame:
    """Columns listed in `_unmodified` take the value of the key's previous version in its life.

    A life is the run of events between deletes: a delete resets what can be carried forward.
    Rows where `settled` holds already carry their filled values (an incremental fold's anchor
    rows): nothing is carried into them, but their `_unmodified` marker is kept, because a later
    fold that reaches further back must be able to fill them again.
    """
    if not spec.partial_updates or not payload:
        return events
    order = [F.col(m.VERSION_AT), F.col(m.SEQ)]
    is_delete = (F.col(m.OP) == m.DELETE).cast("int")
    before = Window.partitionBy(*key_cols(spec)).orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
    events = events.withColumn("__life", F.coalesce(F.sum(is_delete).over(before), F.lit(0)))
    so_far = (
        Window.partitionBy(*key_cols(spec), F.col("__life"))
        .orderBy(*order)
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    filled = []
    for column in payload:
        name = f"`{column}`"
        unmodified = F.coalesce(F.array_contains(F.col(m.UNMODIFIED), column), F.lit(False))
        if settled is not None:
            unmodified = unmodified & ~F.coalesce(settled, F.lit(False))
        # Wrapping the value in a struct keeps an explicit NULL apart from "not set here".
        carried = F.last(F.when(~unmodified, F.struct(F.col(name).alias("v"))), ignorenulls=True).over(so_far)
        filled.append(F.when(unmodified, carried.getField("v")).otherwise(F.col(name)).alias(column))
    others = [F.col(f"`{c}`") for c in events.columns if c not in payload and c != "__life"]
    return events.select(*others, *filled).select(*events.drop("__life").columns)


def with_windows(events: DataFrame, spec: m.TableSpec) -> DataFrame:
    """Add each row's end (see rule 4) and whether it is the key's last event."""
    order = Window.partitionBy(*key_cols(spec)).orderBy(F.col(m.VERSION_AT), F.col(m.SEQ))
    next_at = F.lead(m.VERSION_AT).over(order)
    next_op = F.lead(m.OP).over(order)
    events = events.withColumn("__next_at", next_at).withColumn("__next_op", next_op)
    end = (
        F.when(F.col("__next_at").isNull(), F.to_timestamp(F.lit(m.END_OF_TIME)))
        .when((F.col("__next_op") == m.DELETE) & (F.col(m.OP) != m.DELETE), F.col("__next_at"))
        .otherwise(F.col("__next_at") - F.expr("INTERVAL 1 MILLISECOND"))
    )
    return events.withColumn(END, end).withColumn(ACTIVE, F.col("__next_at").isNull()).drop("__next_at", "__next_op")


def erase_fields(frame: DataFrame, payload: list[str], erase: Column) -> DataFrame:
    """NULL the payload columns of rows where `erase` holds (purged keys)."""
    if not payload:
        return frame
    types = dict((f.name, f.dataType) for f in frame.schema.fields)
    return frame.select(
        *[
            F.when(erase, F.lit(None).cast(types[c])).otherwise(F.col(f"`{c}`")).alias(c) if c in payload else F.col(f"`{c}`")
            for c in frame.columns
        ]
    )


def purged_anywhere(spec: m.TableSpec) -> Column:
    """True on every row of a key that has a purge marker on any of its rows."""
    flag = F.coalesce(F.col(m.PURGED), F.lit(False)).cast("int")
    return F.max(flag).over(Window.partitionBy(*key_cols(spec))) == 1


def timeline(
    events: DataFrame,
    spec: m.TableSpec,
    payload: list[str],
    tie_break: list[Column] | None = None,
    settled: Column | None = None,
) -> DataFrame:
    """Rules 2–4 and 6 over the events of whole keys (or of a key's window from its anchor).

    A key counts as purged when any of its writes carries the marker, superseded ones included,
    so the flag is settled before writes of one version collapse.
    """
    events = events.withColumn(m.PURGED, purged_anywhere(spec))
    events = latest_write_per_version(events, spec, tie_break)
    events = fill_unmodified(events, spec, payload, settled)
    events = erase_fields(events, payload, F.col(m.PURGED))
    return with_windows(events, spec)


def history_of(rows: DataFrame, spec: m.TableSpec, payload: list[str]) -> DataFrame:
    """Published history columns from timeline rows (deletes excluded)."""
    hc = spec.history_columns
    return rows.where(F.col(m.OP) != m.DELETE).select(
        *[F.col(f"`{c}`") for c in (*spec.keys, *payload)],
        F.col(m.VERSION_AT).alias(hc.start),
        F.col(END).alias(hc.end),
        F.col(ACTIVE).alias(hc.active),
        F.col(SYNCED).alias(hc.synced),
        F.col(m.OP),
        F.col(m.SEQ),
        F.col(m.UNMODIFIED),
        F.col(m.SOURCE_FILE),
    )


def current_of(rows: DataFrame, spec: m.TableSpec, payload: list[str]) -> DataFrame:
    """Published current columns from timeline rows: last rows that are not deletes."""
    return rows.where(F.col(ACTIVE) & (F.col(m.OP) != m.DELETE)).select(
        *[F.col(f"`{c}`") for c in (*spec.keys, *payload)],
        F.col(m.VERSION_AT),
        F.col(m.SEQ),
        F.col(m.SOURCE_FILE),
        F.col(SYNCED).alias(spec.history_columns.synced),
    )


def fold_full(changes: DataFrame, spec: m.TableSpec, synced_at: dt.datetime | None = None) -> FoldResult:
    """Recompute current and history from the complete change log of one table."""
    payload = spec.payload_columns(changes.columns)
    # One instant for the whole fold, so current and history agree on when they were written.
    synced = F.lit(synced_at or dt.datetime.now(dt.timezone.utc)).cast("timestamp")
    rows = timeline(collapse_identical(changes, spec), spec, payload).withColumn(SYNCED, synced)
    return FoldResult(current=current_of(rows, spec, payload), history=history_of(rows, spec, payload))
