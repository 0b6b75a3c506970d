"""A purge is forever: the keys a purge erased are kept in the table's state, and every later
write of the change log erases them again.

`_state/<feed>/<table>/purged/` (the ledger) holds one row per purged key: its key columns and
`__purged_at`, when the lake erased it (the time of the fold that did). The fold that first meets
a key's purge marker erases the key from the state and from every change partition that holds
it, and records it in the ledger, all in one commit (`state.commit`): a crash leaves all of it or
none, and the table's next write (its change log's, before it writes; or its fold's) finishes it,
or the fold redoes it.

From then on, every write of change partitions (a re-run of an old partition or of the purge's
own, a range backfill, a sensor run, a late file) erases the rows of the ledger's keys, and of
keys the rows being written mark purged themselves, before anything is written. Those last it
keeps first in `purges_seen/` (`seen`): the erasure must hold though no fold follows and the
purge's landed file goes, and the next fold records them, whatever its batch; the fold treats
the ledger's keys as purged whatever its batch says. A write after a purge (a late file, the key
written again) keeps its version but no field data: as in GRAX, a purge erases the record, and
a restored record is a new key (`grax__restoredfrom`).

The ledger is small (purges are rare), so a write reads it with a listing and, when it holds
keys, one small file, and applies it as a broadcast join; every write also reads the footers of
`history/active` (which show the keys of a ledger lost or cut short), and the rows of the files
whose footers show a purged row: a table never purged pays one listing and the footers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import uuid
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets import lake_io
from lake_assets.engine import merge
from lake_assets.engine import model as m
from lake_assets.engine.run_values import with_run_values
from lake_assets.engine.schema import union_all
from lake_assets.engine.state import CommitPlan, TableState, parquet_files
from lake_assets.errors import DamagedLakeFile
from lake_assets.paths import partition_folder
from lake_assets.storage import Storage, parquet_footer

PURGED_AT = "__purged_at"
#: a `purges_seen` file's footer key: the change partitions whose rows marked its keys purged
SEEN_IN_PARTITIONS = b"lake_assets.seen_in_partitions"

_log = logging.getLogger(__name__)


def ledger(spark: SparkSession, storage: Storage, state: TableState, keys: Sequence[str]) -> DataFrame | None:
    """The purged keys recorded for a table (its `keys` and `PURGED_AT`); None when none are.

    The keys of open history's rows marked purged are always added to it (`PURGED_AT` unknown):
    a ledger removed, emptied or cut short by hand, or a lake written before there was one, then
    still keeps every purge open history shows, so no write brings their field data back; the
    next fold that records a purge writes them into the ledger."""
    files = parquet_files(storage, state.purged)
    recorded = None
    if files and lake_io.rows_in(storage, files) > 0:  # footers only
        recorded = lake_io.read_drifting(
            spark, storage, files, table=f"{state.feed}/{state.table} purged keys", keys=tuple(keys)
        )
    shown = _purged_in_open_history(spark, storage, state, keys, recorded is None)
    if recorded is None or shown is None:
        return recorded if shown is None else shown
    missing = shown.join(merge.keys_typed_as(recorded, shown, list(keys)), list(keys), "left_anti")
    return union_all("purged keys", [recorded, missing], tuple(keys))


def _purged_in_open_history(
    spark: SparkSession, storage: Storage, state: TableState, keys: Sequence[str], ledger_lost: bool
) -> DataFrame | None:
    """The keys of `history/active`'s rows marked purged, read only from the files whose footers'
    statistics show one (a table never purged reads footers, no row). A key purged after its
    delete has no open row: this finds most of a lost ledger, not all of it. With `ledger_lost`
    (no ledger, or none with a row) finding any is logged."""
    marked = []
    for uri in parquet_files(storage, state.history_active):
        try:
            if lake_io.holds_true(parquet_footer(storage, uri), m.PURGED):
                marked.append(uri)
        except DamagedLakeFile:
            continue  # it shows nothing; the fold, which reads it, names it
    if not marked:
        return None
    if ledger_lost:
        _log.warning(
            f"{state.feed}/{state.table}: the purge ledger {state.purged} is empty, but open history holds "
            "purged keys: they stay purged; restore the ledger if you have a copy"
        )
    rows = lake_io.read_drifting(spark, storage, marked, table=f"{state.feed}/{state.table} open history")
    return (
        rows.where(F.col(m.PURGED))
        .select(*keys)
        .distinct()
        .withColumn(PURGED_AT, F.lit(None).cast(T.TimestampType()))
    )


def seen_files(storage: Storage, state: TableState) -> list[str]:
    """The files of `seen` keys; the fold that records their keys removes them in its commit."""
    return parquet_files(storage, state.purges_seen)


def seen(
    spark: SparkSession,
    storage: Storage,
    state: TableState,
    keys: Sequence[str],
    files: list[str] | None = None,
) -> DataFrame | None:
    """The keys (a frame of the key columns) that a write of the change log erased for a purge
    marker among its own rows, and that no fold has recorded in the ledger yet (`Erasure.apply`),
    from `files` (`seen_files`, listed when not given); None when none are."""
    files = seen_files(storage, state) if files is None else files
    if not files:
        return None
    found = lake_io.read_drifting(
        spark, storage, files, table=f"{state.feed}/{state.table} purges seen", keys=tuple(keys)
    )
    return found.select(*keys)


def seen_in_partitions(
    storage: Storage, state: TableState, files: list[str] | None = None
) -> dict[str, list[str]]:
    """The change partitions whose rows marked the `seen` keys purged, each with the `seen`
    files naming it (of `files`, listed when not given): until a fold records those keys,
    planning and the landing sensors run these partitions (their landed files may be gone, and
    the write killed before it noted them stored), so that a fold follows. A damaged file names
    none (the fold, which reads its keys, names it)."""
    found: dict[str, list[str]] = {}
    for uri in seen_files(storage, state) if files is None else files:
        try:
            named = (parquet_footer(storage, uri).metadata or {}).get(SEEN_IN_PARTITIONS, b"[]")
        except FileNotFoundError:  # recorded by a fold since it was listed
            continue
        except DamagedLakeFile as damaged:
            _log.warning("%s; the partitions it names are not run for its purges", damaged)
            continue
        try:
            partitions = json.loads(named)
        except ValueError:
            partitions = None
        if not isinstance(partitions, list) or not all(isinstance(p, str) for p in partitions):
            # The fold does not need the names (it reads the keys): planning goes on without them.
            _log.warning(
                "%s: its footer's %s is not a list of partitions; they are not run for its purges",
                uri,
                SEEN_IN_PARTITIONS.decode(),
            )
            continue
        for partition in partitions:
            found.setdefault(partition, []).append(uri)
    return found


def _remember_seen(storage: Storage, state: TableState, keys: DataFrame, partitions: Sequence[str]) -> None:
    """Keep `keys` (purged by rows of the change `partitions` a write is about to write) before
    the write erases them: should no fold follow (a run killed, a run of `changes` alone) and
    the landed file that carried the purge go, the erasure must still hold, and the next fold
    record it (`seen_in_partitions` tells planning which partitions to run for it)."""
    found = keys.toArrow()
    if found.num_rows == 0:
        return
    found = found.replace_schema_metadata({SEEN_IN_PARTITIONS: json.dumps(sorted(partitions)).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(found, sink)
    storage.write_bytes(f"{state.purges_seen}/part-{uuid.uuid4().hex}.parquet", sink.getvalue().to_pybytes())


def either(keys: Sequence[str], frames: list[DataFrame | None]) -> DataFrame | None:
    """The union of the frames of key columns that are not None; None when all are."""
    present = [frame for frame in frames if frame is not None]
    return union_all("purged keys", present, tuple(keys)) if present else None


@dataclasses.dataclass(frozen=True)
class Erasure:
    """What a write of change partitions erases: the rows of keys the ledger holds or a write
    before saw purged (`seen`), and of keys that a row being written marks purged (the batch
    that carries the purge), which are kept as seen first."""

    keys: tuple[str, ...]
    recorded: DataFrame | None
    storage: Storage
    state: TableState

    @classmethod
    def of_table(
        cls, spark: SparkSession, storage: Storage, state: TableState, keys: tuple[str, ...]
    ) -> Erasure:
        if not keys:
            return cls(keys, None, storage, state)
        recorded = ledger(spark, storage, state, keys)
        known = either(
            keys,
            [recorded.select(*keys) if recorded is not None else None, seen(spark, storage, state, keys)],
        )
        return cls(keys, known, storage, state)

    def marked_rows(self, frame: DataFrame) -> Column:
        """An aggregate counting the rows that mark their key purged, for the write's own count
        of its rows to compute on the way (no pass of its own)."""
        return F.count(F.when(F.col(m.PURGED), 1)) if m.PURGED in frame.columns else F.lit(0)

    def apply(self, frame: DataFrame, marked_rows: int, marking_partitions: Sequence[str] = ()) -> DataFrame:
        """`frame` with the purged keys' rows erased; `frame` itself when no key is purged.
        `marked_rows` rows mark their key purged, in the change partitions `marking_partitions`."""
        if not self.keys or not set(self.keys) <= set(frame.columns):
            return frame
        purged = [] if self.recorded is None else [self.recorded]
        if marked_rows:
            marking = frame.where(F.col(m.PURGED)).select(*self.keys).distinct()
            if self.recorded is not None:
                marking = marking.join(
                    merge.keys_typed_as(self.recorded, marking, list(self.keys)), list(self.keys), "left_anti"
                )
            _remember_seen(self.storage, self.state, marking, marking_partitions)
            purged.append(marking)
        if not purged:
            return frame
        return merge.erase_keys(frame, list(self.keys), union_all("purged keys", purged, tuple(self.keys)))


def newly_purged(events: DataFrame, recorded: DataFrame | None, keys: list[str]) -> list[tuple]:
    """Keys with a purge marker in `events` that the ledger does not hold yet."""
    purged = events.where(F.coalesce(F.col(m.PURGED), F.lit(False))).select(*keys).distinct()
    if recorded is not None:
        purged = purged.join(merge.keys_typed_as(recorded, events, keys), keys, "left_anti")
    return [tuple(r) for r in purged.collect()]


def stage_ledger(
    storage: Storage,
    state: TableState,
    plan: CommitPlan,
    stage: str,
    recorded: DataFrame | None,
    added: DataFrame,
    purged_at: dt.datetime,
) -> None:
    """Stage the ledger with the keys `added` (erased at `purged_at`) in `plan`, the commit of
    the fold that erases them: the ledger file is replaced whole."""
    new = with_run_values(added, {PURGED_AT: purged_at})
    every = union_all(
        "purged keys", [new] if recorded is None else [recorded, new], keys=tuple(added.columns)
    ).dropDuplicates(list(added.columns))
    every.coalesce(1).write.mode("overwrite").parquet(f"{stage}/purged")
    plan.replace_folder(storage, state.purged)
    plan.stage_folder(storage, f"{stage}/purged", state.purged)


def stage_log_erasure(
    spark: SparkSession,
    storage: Storage,
    state: TableState,
    plan: CommitPlan,
    stage: str,
    column: str,
    keys: list[str],
    purged: DataFrame,
) -> list[str]:
    """Stage in `plan` the change partitions that hold field data of the `purged` keys, those
    keys erased; returns the partitions."""
    staged = f"{stage}/changes"
    partitions = lake_io.erase_keys_in_partitions(spark, storage, state.changes, column, keys, purged, staged)
    for value in partitions:
        final = partition_folder(state.changes, column, value)
        plan.replace_folder(storage, final)
        plan.stage_folder(storage, partition_folder(staged, column, value), final)
    return partitions
