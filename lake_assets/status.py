"""Where each table of a lake stands: what `lake-assets status` prints.

Read from the lake and the landing only (no Spark, no Dagster): the processed notes
(`processed`) give the last processed partition and, against a listing of the landing, the
partitions landed but not processed yet; the quarantine notes give the files set aside and why;
the tables' Parquet footers give their row counts. `orchestration.execution` adds the last
Dagster run. `summarise` is the table a run prints at its end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from lake_assets import processed, reruns
from lake_assets.config import LakeConfig
from lake_assets.discovery import feed_tables, load_pins
from lake_assets.engine import purges
from lake_assets.engine.state import TableState, unfinished_commits
from lake_assets.errors import DamagedLakeFile
from lake_assets.feeds import format_for
from lake_assets.feeds.base import FeedFormat
from lake_assets.paths import LakeLayout
from lake_assets.quarantine import QuarantineNote, notes_under, unreported_strays
from lake_assets.storage import Entry, Storage, is_hidden, parquet_footer, read_lake_json

_Read = TypeVar("_Read")


@dataclasses.dataclass
class TableStatus:
    feed: str
    table: str
    #: the newest partition processed (None: none, or unknown, a note being damaged)
    last_processed: str | None
    #: partitions landed but not processed yet (or changed since): partition, reason, files.
    #: Here and below, None is unknown: a note it is read from is damaged, named in `damaged`
    pending: list[dict] | None
    #: files set aside: file, partition, reason
    quarantined: list[QuarantineNote] | None
    #: stray files no run has set aside yet (a table without partitions has no run to): file, reason
    not_read: list[dict] | None
    #: rows of each layer (None: a file of it cannot be read, named in `damaged`)
    changes_rows: int | None
    current_rows: int | None
    history_rows: int | None
    #: lake files that cannot be read, each with its cause
    damaged: list[str]
    #: why the next run of the table will be refused, when it will (a landing gone blank)
    refused: str | None = None
    #: the line saying why no run takes the table, when none does (its names clash with
    #: another table's): `<feed>/<table>: not loaded: <why>`, as `discover` and `run` print it
    not_loaded: str | None = None
    #: folds stopped while putting their files in place, which the table's next run finishes
    unfinished_folds: list[str] = dataclasses.field(default_factory=list)
    #: the last Dagster run of the table, when the instance keeps runs: id, job, status, started
    last_run: dict | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def count_rows(storage: Storage, uri: str) -> int:
    """Rows of a lake table as any Hive-aware reader sees them: the row counts in the footers
    of its Parquet files, leaving out hidden entries (`storage.is_hidden`, as Spark and
    pyarrow do). Footers only: no data page is read."""
    if not storage.exists(uri):
        return 0
    files = storage.walk_files(uri, skip=is_hidden)
    return sum(parquet_footer(storage, entry.uri).num_rows for entry in files)


@dataclasses.dataclass(frozen=True)
class LayerRows:
    """Rows of a table's three layers; None for a layer with a file that cannot be read, which
    `damaged` names (a status is still given: it is how the damage is found)."""

    changes: int | None
    current: int | None
    history: int | None
    damaged: tuple[str, ...] = ()

    @classmethod
    def of(cls, storage: Storage, layout: LakeLayout, feed: str, table: str) -> LayerRows:
        rows: dict[str, int | None] = {}
        damaged: list[str] = []
        for layer in LakeLayout.LAYERS:
            try:
                rows[layer] = count_rows(storage, layout.table(layer, feed, table))
            except DamagedLakeFile as exc:
                rows[layer] = None
                damaged.append(str(exc))
        return cls(rows["changes"], rows["current"], rows["history"], tuple(damaged))


def quarantined_files(storage: Storage, layout: LakeLayout, feed: str, table: str) -> list[QuarantineNote]:
    """The notes of a table's quarantined files, oldest partition first."""
    notes = [
        read_lake_json(storage, entry.uri, QuarantineNote)
        for entry in notes_under(storage, layout.quarantine(feed, table))
    ]
    return sorted(notes, key=lambda n: (str(n["partition"]), n["file"]))


def table_status(
    storage: Storage,
    layout: LakeLayout,
    landing: str,
    feed: str,
    fmt: FeedFormat,
    table: str,
    *,
    allow_empty_landing: bool = False,
) -> TableStatus:
    """Where a table stands. A damaged note of the lake leaves out what it would tell (pending
    partitions, quarantined files) and is named in `damaged`: a status is how damage is found.
    A landing gone blank (`processed.refusal_for_a_blank_landing`) is named in `refused` unless
    the feed allows it, as the run that the status foretells would be refused."""
    rows = LayerRows.of(storage, layout, feed, table)
    damaged = list(rows.damaged)

    def known(read: Callable[[], _Read], unknown: _Read) -> _Read:
        try:
            return read()
        except DamagedLakeFile as exc:
            damaged.append(str(exc))
            return unknown

    notes = known(lambda: processed.read_notes(storage, layout, feed, table, fmt.is_partition_key), None)
    pending, refused = None, None
    if notes is not None:
        keys = fmt.partition_keys(storage, landing, table)
        found = known(
            lambda: pending_partitions(
                storage, layout, fmt, landing=landing, feed=feed, table=table, keys=keys, notes=notes
            ),
            None,
        )
        if found is not None:
            changes, landed = found
            pending = [
                {"partition": c.partition, "reason": c.reason, "files": len(landed.get(c.partition, []))}
                for c in changes
            ]
            # Every note is in `read`: no other partition has one to vouch for the landing.
            refused = processed.refusal_for_a_blank_landing(
                fmt,
                storage,
                layout,
                landing=landing,
                feed=feed,
                table=table,
                read={partition: set(note) for partition, note in notes.items()},
                listed=landed,
                allowed=allow_empty_landing,
            )
    return TableStatus(
        feed=feed,
        table=table,
        last_processed=max(notes, key=fmt.partition_order) if notes else None,
        pending=pending,
        quarantined=known(lambda: quarantined_files(storage, layout, feed, table), None),
        not_read=known(
            lambda: [
                {"file": entry.uri, "reason": reason}
                for entry, reason in unreported_strays(storage, layout, fmt, landing, feed, table)
            ],
            None,
        ),
        changes_rows=rows.changes,
        current_rows=rows.current,
        history_rows=rows.history,
        damaged=damaged,
        refused=refused,
        unfinished_folds=unfinished_commits(storage, TableState(layout, feed, table)),
    )


def pending_partitions(
    storage: Storage,
    layout: LakeLayout,
    fmt: FeedFormat,
    *,
    landing: str,
    feed: str,
    table: str,
    keys: list[str],
    notes: dict[str, dict[str, processed.ProcessedFile]],
    within: Callable[[str], bool] = lambda _: True,
) -> tuple[list[processed.Change], dict[str, list[Entry]]]:
    """The partitions a run of the table takes (`processed.changed_partitions`), with the landed
    files of `keys`: those whose files changed since their `notes`, those a run asked to run
    again, those holding data of a file removed from another partition (a format whose files
    share data), and those stored but never processed whose files are gone. `notes` are of the
    partitions inside the run's window (`within`): outside it, files do not look removed."""
    landed = fmt.partitions_files(storage, landing, table, keys)
    asked = reruns.asked(reruns.read_reruns(storage, layout, feed, table, fmt.is_partition_key))
    holding = (
        processed.holding_removed_data(landed, notes, fmt.holding_removed_data)
        if fmt.files_share_data
        else {}
    )
    stored = processed.stored_partitions(storage, layout, feed, table, fmt.is_partition_key)
    # A write forgets its partitions' processed notes before it keeps a purge: a kept purge's
    # partition is never taken for processed, and runs as stored and never folded.
    stored |= kept_purge_partitions(storage, layout, fmt, feed, table).keys()
    # A request's own reason is kept over the removal's: the request outlives this run.
    changes = processed.changed_partitions(
        storage, landed, notes, {**holding, **asked}, {p for p in stored if within(p)}
    )
    return changes, landed


def kept_purge_partitions(
    storage: Storage,
    layout: LakeLayout,
    fmt: FeedFormat,
    feed: str,
    table: str,
    files: list[str] | None = None,
) -> dict[str, list[str]]:
    """The change partitions whose write kept a purge it met that no fold has recorded yet, each
    with the files keeping it (`purges.seen_in_partitions`): run as changes stored and never
    folded, so that a fold follows though the write was killed before it noted them stored and
    their landed files are gone."""
    kept = purges.seen_in_partitions(storage, TableState(layout, feed, table), files)
    return {partition: files for partition, files in kept.items() if fmt.is_partition_key(partition)}


@dataclasses.dataclass(frozen=True)
class TableSummary:
    feed: str
    table: str
    rows: LayerRows
    quarantined: int


def summarise(config: LakeConfig) -> list[TableSummary]:
    """Rows of each table's layers and its quarantined files, as the lake holds them now."""
    storage = config.storage()
    layout = LakeLayout(config.lake)
    pins = load_pins(config, storage)
    return [
        TableSummary(
            feed=feed.name,
            table=table,
            rows=LayerRows.of(storage, layout, feed.name, table),
            quarantined=len(notes_under(storage, layout.quarantine(feed.name, table))),
        )
        for feed in config.feeds
        for table in feed_tables(feed, format_for(feed), pins[feed.name])
    ]
