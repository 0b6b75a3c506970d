"""The work of each layer of a table, without Dagster: catalogue what landed, read it into a
change batch, store the change log, fold it into current and history, cataloguing every file.

Every place that writes lake files records them in the catalog and retires the records of the
files it removed (`RemovedFiles`): a write of change partitions and a purge rewrite once they
have succeeded, a fold's commit as soon as its commit record makes the deletes certain.

The Dagster assets (`orchestration.assets`) and IO manager call these and add only what is
Dagster's: partitions from the run, metadata, asset checks, logs in the UI. The benchmarks call
them directly to measure what Dagster adds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Collection, Iterator
from typing import cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from lake_assets import lake_io, landing_confirmation, lease, processed, reruns
from lake_assets.catalog.files import (
    Refused,
    catalog_file,
    catalogued_entries,
    landed_record_versions,
    landed_records,
    landing_work_id,
    newest_records,
    retire_landed,
    retirements,
    unchanged_since_recorded,
    written_files,
)
from lake_assets.catalog.files import (
    record as record_files,
)
from lake_assets.catalog.store import CatalogStore
from lake_assets.config import FeedConfig
from lake_assets.config_model import DEFAULT_LEASE_WAIT_SECONDS
from lake_assets.engine import checks, merge, purges
from lake_assets.engine import model as m
from lake_assets.engine.fold import FoldReport, fold, stored_rows_since
from lake_assets.engine.names import col
from lake_assets.engine.parallel import run_together
from lake_assets.engine.state import TableState, is_parquet_file, parquet_files, recover
from lake_assets.errors import (
    DamagedLakeFile,
    LandingEmptied,
    SchemaClash,
    StoreUnreachable,
    first_line,
)
from lake_assets.feeds.base import FeedFormat
from lake_assets.ingest import SPARK_REASON_CHARACTERS, Batch, read_batch
from lake_assets.paths import LakeLayout, parse_hour_key, partition_folder
from lake_assets.quarantine import REASON_SUFFIX, UNPARTITIONED, Quarantined, quarantine_file
from lake_assets.spark_errors import SPARK_ERRORS, is_request_failure
from lake_assets.storage import Entry, Storage, each_request, parquet_footer

CHANGE_TIME_COLUMNS = (m.VERSION_AT,)  # the event time of a change-log file, for its catalog span
STATE_TIME_COLUMNS = ("_fivetran_start", "_version_at")  # history files, then current files

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TableWork:
    """One table of one feed, in one lake, for one run (`run_id` is the catalog's work id)."""

    feed: FeedConfig
    fmt: FeedFormat
    table: str
    storage: Storage
    layout: LakeLayout
    store: CatalogStore
    run_id: str | None
    #: how long a step waits for another writer of the table (`lease`)
    lease_wait_seconds: float = DEFAULT_LEASE_WAIT_SECONDS

    def catalogue(self, files, refused: Refused | None = None) -> int:
        return record_files(self.store, self.storage, files, refused)

    def writing(self, step: str, log=_log) -> contextlib.AbstractContextManager[None]:
        """Hold the table's lease (one writer at a time, `lease`) for a step that writes it."""
        return lease.writing_table(
            self.storage,
            self.layout,
            self.feed.name,
            self.table,
            self.run_id,
            step,
            self.lease_wait_seconds,
            log.info,
        )


@dataclasses.dataclass
class RemovedFiles:
    """A `Removing` hook of the lake's writes: told the lake files a write is about to remove,
    it reads their retirements while they can still be read (their span places their records),
    and `retire` takes them out of the catalog."""

    storage: Storage
    store: CatalogStore
    feed: str
    table: str
    time_columns: tuple[str, ...]
    pending: list[dict] = dataclasses.field(default_factory=list)

    def __call__(self, uris: list[str]) -> None:
        files = written_files(self.feed, self.table, None, self.storage, uris, self.time_columns)
        self.pending += retirements(self.storage, files)

    def retire(self) -> None:
        self.store.retire(self.pending)
        self.pending = []


@dataclasses.dataclass(frozen=True)
class CommitCatalog:
    """Keeps the catalog in step with the fold commits of one table: the files a commit deletes
    are retired once its record makes the deletes certain (they go, by this commit or by the next
    run's recovery, which tells again any file still there); the files it put in place are recorded."""

    storage: Storage
    store: CatalogStore
    feed: str
    table: str
    run_id: str | None
    state: TableState

    def _by_layer(self, uris: list[str]) -> list[tuple[tuple[str, ...], list[str]]]:
        return [
            (STATE_TIME_COLUMNS, [u for u in uris if self.state.publishes(u)]),
            (CHANGE_TIME_COLUMNS, [u for u in uris if u.startswith(f"{self.state.changes}/")]),
        ]

    def retire_replaced(self, uris: list[str]) -> None:
        for time_columns, replaced in self._by_layer(uris):
            removed = RemovedFiles(self.storage, self.store, self.feed, self.table, time_columns)
            removed(replaced)
            removed.retire()

    def record_put_in_place(self, uris: list[str]) -> None:
        for time_columns, files in self._by_layer(uris):
            if files:
                record_files(
                    self.store,
                    self.storage,
                    written_files(self.feed, self.table, self.run_id, self.storage, files, time_columns),
                )


def finish_interrupted_folds(commits: CommitCatalog, log=_log) -> list[str]:
    """Finish the commits of folds of the table killed after their commit record was written
    (`engine.state.recover`), cataloguing what they put in place; returns their fold ids."""
    plans = recover(commits.storage, commits.state, commits.retire_replaced)
    finals = [final for plan in plans for _, final in plan.adds]
    commits.record_put_in_place([uri for uri in finals if commits.storage.exists(uri)])
    if plans:
        log.warning(
            f"{commits.feed}/{commits.table}: finished interrupted fold(s) {[p.fold_id for p in plans]}"
        )
    return [plan.fold_id for plan in plans]


@dataclasses.dataclass(frozen=True)
class Forgotten:
    """What `forget_table` removed."""

    #: the folders (and files) removed
    removed: list[str]
    #: damaged files whose catalog records stay: a record is found by the span its file holds
    still_catalogued: list[str]
    #: why a killed fold's commit could not be finished (its record is damaged): removed unapplied
    unfinished_commit: str | None = None


def forget_table(
    storage: Storage, layout: LakeLayout, store: CatalogStore, feed: str, table: str
) -> Forgotten:
    """Remove what the lake holds of a table but its purge ledger, so that the next run reads
    every landed partition again and rebuilds it (docs/lake-layout.md, "Rebuilding a table"):
    its change log, current and history, their catalog records retired first (a removal cut
    short leaves files the catalog does not list, which the command removes when run again,
    never records of files that are gone); its state; a killed run's staging. The ledger stays,
    so every key purged stays purged, as do the keys a change-log write saw purged before a fold
    recorded them (`purges.seen`). A fold killed after its commit record is finished first: its
    commit may record purges in the ledger."""
    state = TableState(layout, feed, table)
    unfinished = None
    try:
        finish_interrupted_folds(CommitCatalog(storage, store, feed, table, None, state))
    except DamagedLakeFile as exc:  # the rebuild is the remedy for damage: it must go on
        unfinished = first_line(exc)
    damaged = []
    for time_columns, layers in (
        (CHANGE_TIME_COLUMNS, [state.changes]),
        (STATE_TIME_COLUMNS, [state.current, state.history]),
    ):
        files = [e.uri for layer in layers for e in storage.walk_files(layer) if is_parquet_file(e.name)]
        readable = []
        for uri in files:
            try:
                parquet_footer(storage, uri)
                readable.append(uri)
            except DamagedLakeFile:
                damaged.append(uri)
        removed = RemovedFiles(storage, store, feed, table, time_columns)
        removed(readable)
        removed.retire()
    kept_for_good = {state.purged, state.purges_seen}
    entries = [
        state.changes,
        state.current,
        state.history,
        *(entry.uri for entry in storage.list(state.state_root) if entry.uri not in kept_for_good),
        state.staging_root(),
    ]
    gone = [uri for uri in entries if storage.exists(uri)]
    for uri in gone:
        storage.delete_tree(uri)
        storage.delete_file(uri)
    return Forgotten(gone, damaged, unfinished)


@dataclasses.dataclass(frozen=True)
class LandingCatalogued:
    files: int  # landed files of the partitions, all now catalogued but those refused
    hashed: int  # of which new or changed, so read, hashed and recorded
    gone: int  # files catalogued before that are no longer landed: their records retired
    #: listed files whose bytes their store would not hand over: left out, reported by the run's
    #: read of the partitions (`ingest`)
    refused: int = 0


def catalogue_landing(work: TableWork, partitions: list[str], log=_log) -> LandingCatalogued:
    """List the landed files of the partitions a run over `partitions` reads and record them
    (work id `landing-<partition>`), retiring the records of files that are gone. A file whose
    listing shows it unchanged since its record is not read again. A file that cannot be read
    (an archived S3 object) is left out, and the rest catalogued: one file must not stop its
    table; the read of the partitions reports it (`ingest`)."""
    fmt, storage = work.fmt, work.storage
    keys = fmt.read_partitions(partitions)
    listed = fmt.partitions_files(storage, work.feed.landing, work.table, keys)
    versions = landed_record_versions(work.store, work.feed.name, work.table, keys)
    recorded = newest_records(versions)
    # Every record of a gone file: one left of a file rewritten in place would list it again.
    gone = [
        record
        for key in keys
        for url, records in versions[key].items()
        if url not in {entry.uri for entry in listed.get(key, [])}
        for record in records
    ]
    # Of every partition read, a Flow run's context hour too: the run retires its records of
    # gone files, and read without its context a new hour's transactions may go uncommitted.
    _refuse_to_empty_for_a_landing_gone_blank(work, keys, listed, recorded)
    retire_landed(work.store, gone)
    refused: list[str] = []

    def refuse(item, exc: Exception) -> None:
        answer = storage.refusal_to_read(item.url)  # raises what may pass: the step fails, to be retried
        if answer is None:
            raise exc  # it reads now: the failure passed, and the step is to be run again
        if isinstance(answer, FileNotFoundError):
            log.info(f"{item.url} went while its partition was catalogued")
            return
        refused.append(item.url)
        log.error(
            f"{item.url} cannot be read ({first_line(answer)}): left out of the catalog, reported by its run"
        )

    new = [
        (key, entry.uri)
        for key, entries in listed.items()
        for entry in entries
        if not _still_recorded(entry, recorded[key].get(entry.uri))
    ]
    spans = each_request(
        lambda item: fmt.landing_span(storage, item[1]), new, storage.requests_at_once(work.feed.landing)
    )
    hashed = work.catalogue(
        [
            catalog_file(work.feed.name, work.table, landing_work_id(key), uri, span, landed=True)
            for (key, uri), span in zip(new, spans, strict=True)
        ],
        refuse,
    )
    return LandingCatalogued(
        sum(len(entries) for entries in listed.values()), hashed, len({r["url"] for r in gone}), len(refused)
    )


def _refuse_to_empty_for_a_landing_gone_blank(
    work: TableWork, keys: list[str], listed: dict[str, list[Entry]], records: dict[str, dict]
) -> None:
    """Raise `LandingEmptied` when the run would empty partitions because the landing went blank
    (`processed.refusal_for_a_blank_landing`, the files read being those the catalog records:
    `records`), unless the feed allows it (`allow_empty_landing`). Planning asks the same of the
    whole table first (`runner`); asked here too, a run started from the UI or a sensor is held
    to it."""
    refusal = processed.refusal_for_a_blank_landing(
        work.fmt,
        work.storage,
        work.layout,
        landing=work.feed.landing,
        feed=work.feed.name,
        table=work.table,
        read={key: set(records[key]) for key in keys},
        listed=listed,
        allowed=work.feed.allow_empty_landing,
        read_elsewhere=processed.noted_files(work.storage, work.layout, work.feed.name, work.table),
    )
    if refusal:
        raise LandingEmptied(refusal)


def _still_recorded(entry, record: dict | None) -> bool:
    return record is not None and unchanged_since_recorded(
        entry, int(record["size"]), int(record["create_time"])
    )


def record_processed(
    work: TableWork,
    partitions: list[str],
    stored_by: str | None,
    log=_log,
    folded_files: set[str] | None = None,
) -> None:
    """Note, now that their fold has succeeded, which landed files the stored changes of
    `partitions` were read from (`record_stored`): the next `lake-assets run` processes them
    again only if that changes. A file catalogued after the read (a run of the catalog alone,
    or of another run) is not in it, so it is read then.

    `stored_by` is the run whose batch was folded as it stored it (handed over in memory), or
    None when the fold read the change log as stored (by whichever run), from `folded_files`
    (their URIs). A partition whose changes another run stored after `stored_by`, or whose
    change-log files are no longer those read (one started by hand beside the daemon's; the two
    take turns step by step), gets no processed note: its files were not what was folded.
    Neither does a partition with no note (stored before there were any). The next run
    processes them. Requests to run them again that their changes now answer are withdrawn
    (`reruns`)."""
    storage, layout, feed, table = work.storage, work.layout, work.feed.name, work.table
    stored, elsewhere = processed.read_stored_notes(storage, layout, feed, table, partitions, stored_by)
    if folded_files is not None:
        changed = _stored_since_read(work, list(stored), folded_files)
        stored = {p: files for p, files in stored.items() if p not in changed}
        elsewhere = sorted({*elsewhere, *changed})
    for partition in sorted(set(partitions) - set(stored) - set(elsewhere)):
        log.info(
            f"{feed}/{table}: {partition} is not noted as processed: what its changes were read from is unknown"
        )
    if elsewhere:
        log.warning(
            f"{feed}/{table}: {_count_partitions(elsewhere)} not noted as processed: another run stored "
            "their changes again after this one, so the next run processes them again"
        )
    processed.write_notes(storage, layout, feed, table, stored)
    # only what this fold folded: another run's later store is that run's to answer with
    reruns.withdraw_answered(storage, layout, feed, table, sorted(stored), log.warning)


def _stored_since_read(work: TableWork, partitions: list[str], read: set[str]) -> set[str]:
    """Those of `partitions` whose change-log files are not the ones read (`read`: the URIs a
    fold read the change log back from)."""
    changed = set()
    for partition in partitions:
        folder = work.layout.change_log_partition(
            work.feed.name, work.table, work.fmt.partition_column, partition
        )
        now = set(parquet_files(work.storage, folder))
        if now != {uri for uri in read if uri.startswith(f"{folder}/")}:
            changed.add(partition)
    return changed


def _count_partitions(partitions: list[str]) -> str:
    return partitions[0] if len(partitions) == 1 else f"{len(partitions)} partitions ({partitions[0]}, ...)"


def record_stored(work: TableWork, partitions: list[str], ingested: Ingested) -> None:
    """Once the changes of `partitions` are stored, record what they were read from: the
    catalogued landed files (`processed.STORED_FOLDER`, which their fold's success makes the
    processed notes) and, for a format that reads streams (Flow journals), the byte ranges,
    which tell a later run whether a late file was read. The files must still be the versions
    catalogued (`landing_confirmation.confirm_unchanged`)."""
    storage, layout, feed, table = work.storage, work.layout, work.feed.name, work.table
    landing_confirmation.confirm_unchanged(work, ingested.read_from, "storing the changes")
    lease.confirm_held()
    processed.write_stored_notes(storage, layout, feed, table, ingested.read_from, work.run_id)
    if ingested.batch.reading is not None:
        reruns.leave_reading(storage, layout, feed, table, partitions, ingested.batch.reading)


def withdraw_stale_quarantine(work: TableWork, partitions: list[str], written: set[str]) -> list[str]:
    """Remove the quarantine entries of the run's partitions, and of strays (every run lists them
    all again), that this run did not write again: their file now reads (a vendor's fixed upload)
    or is gone. Left behind, `status` and the run summary would report a file whose rows are in
    `changes` as set aside. Returns the notes withdrawn; their copies go too, and out of the
    catalog."""
    folders = [work.layout.quarantine(work.feed.name, work.table, p) for p in [*partitions, UNPARTITIONED]]
    stale = [
        entry.uri
        for entries in each_request(lambda folder: list(work.storage.walk_files(folder)), folders)
        for entry in entries
        if not entry.is_dir and entry.unreadable is None and entry.uri not in written
    ]
    if not stale:
        return []
    work.store.retire(
        retirements(
            work.storage, [catalog_file(work.feed.name, work.table, None, uri, None) for uri in stale]
        )
    )
    for uri in stale:
        work.storage.delete_file(uri)
    return [uri for uri in stale if uri.endswith(REASON_SUFFIX)]


@dataclasses.dataclass
class Ingested:
    batch: Batch
    files_catalogued: int  # stray landed files and quarantine copies recorded by this run
    #: landed files outside every valid partition (also in the batch's quarantined files)
    strays: list[Quarantined] = dataclasses.field(default_factory=list)
    #: partitions this run asked to run again (`_ask_partitions_to_run_again`): others, and its
    #: own when a file landed during the run fills a hole in what they read
    reruns: list[str] = dataclasses.field(default_factory=list)
    #: partition -> the catalogued landed files the batch was read from (`record_stored`)
    read_from: dict[str, dict[str, processed.ProcessedFile]] = dataclasses.field(default_factory=dict)
    #: landed file read or set aside -> the partition it was read for or quarantined under
    #: (`UNPARTITIONED` for a stray)
    partition_of: dict[str, str] = dataclasses.field(default_factory=dict)


def current_schema(
    session: SparkSession, storage: Storage, layout: LakeLayout, feed: str, table: str, log=_log
) -> T.StructType | None:
    """The schema of the table's current state, which a batch's files must fit and its drifted
    columns are widened for (None before the first fold). From its footers. Current that cannot
    be read is no reason to stop: the fold reads the state it is made from, not current, and
    rewrites it whole; a clash it meets then fails the fold."""
    uri = layout.table("current", feed, table)
    try:
        summary = lake_io.table_summary(session, storage, uri)
    except (DamagedLakeFile, SchemaClash, *SPARK_ERRORS) as unknown:
        log.warning(f"{feed}/{table}: current's schema is unknown: {first_line(unknown)}")
        return None
    return summary[1] if summary else None


def ingest(session: SparkSession, work: TableWork, partitions: list[str], log=_log) -> Ingested:
    """Read the catalogued files of `partitions` into a change batch; unusable files (and stray
    files outside every partition) are copied to quarantine with their reason and reported."""
    fmt, storage, feed, table = work.fmt, work.storage, work.feed, work.table
    # The catalog, not a listing, says what landed: what a run reads is what was catalogued.
    read_partitions = fmt.read_partitions(partitions)
    records = landed_records(work.store, feed.name, table, read_partitions)
    holders_asked = _ask_holders_of_removed_data(work, partitions, records, log)
    catalogued = catalogued_entries(records)
    partition_of = {f.uri: key for key in partitions for f in catalogued[key]}
    own_files = list(partition_of)
    log.info(f"{feed.name}/{table}: {len(partition_of)} catalogued file(s) in {len(partitions)} partition(s)")
    as_read = landing_confirmation.listed_before_the_read(work, catalogued)
    batch = _read(session, work, partitions, catalogued, log)
    # Files outside every valid partition (e.g. a batch folder that is not hex) never reach a
    # partition's run; each run sets them aside again, so none goes unreported.
    strays = fmt.stray_files(storage, feed.landing, table)
    for entry, reason in strays:
        partition_of[entry.uri] = UNPARTITIONED
        batch.quarantine(Quarantined(entry.uri, reason))
    for key, item in _refused_to_the_catalog(work, read_partitions, records, log):
        partition_of[item.uri] = key
        batch.quarantine(item)
    for item in batch.quarantined:  # a reader names the partition of a file the catalog did not list
        partition_of.setdefault(item.uri, item.partition or "unknown")
    for uri, values in sorted(batch.text_repaired.items()):
        log.warning(f"repaired {values} value(s) of {uri} holding text that was not valid UTF-8 (now U+FFFD)")
    copies, uncopied = _set_aside(
        work, batch, partition_of, {url for key in partitions for url in records[key]}, log
    )
    for withdrawn in withdraw_stale_quarantine(work, partitions, set(copies)):
        log.info(
            f"{feed.name}/{table}: withdrew the quarantine entry {withdrawn}: its file now reads, or is gone"
        )
    readable_strays = [entry for entry, _ in strays if not entry.is_dir and entry.unreadable is None]
    return Ingested(
        batch=batch,
        files_catalogued=_catalogue_strays_and_copies(work, readable_strays, copies, log),
        strays=[Quarantined(e.uri, r) for e, r in strays],
        reruns=sorted(
            {
                *holders_asked,
                *_ask_partitions_to_run_again(
                    work,
                    partitions,
                    batch,
                    own_files,
                    {url for key in read_partitions for url in records[key]},
                    log,
                ),
            }
        ),
        read_from={key: _note_of_what_was_held(records[key], uncopied, as_read) for key in partitions},
        partition_of=partition_of,
    )


@contextlib.contextmanager
def failed_requests_told(
    what: str,
    meaning: str = "not on the data (the step stopped before recording its partitions done; the next "
    "run does them again)",
) -> Iterator[None]:
    """A Spark error of the block that is a failed request to the store (`is_request_failure`)
    raised as `StoreUnreachable`: `what` failed on a request to the store, its `meaning`, and the
    store's answer. It is named by the live error, whose text may not name it (a Spark Connect
    server's stack traces can be hidden); any other error passes as it is."""
    try:
        yield
    except SPARK_ERRORS as failure:
        if not is_request_failure(failure):
            raise
        raise StoreUnreachable(
            f"{what} failed on a request to the store, {meaning}: "
            f"{first_line(failure, limit=SPARK_REASON_CHARACTERS)}"
        ) from failure


def _read(session: SparkSession, work: TableWork, partitions: list[str], catalogued: dict, log) -> Batch:
    """The change batch of the catalogued files of `partitions`; a request to the store that
    failed under Spark's read is raised as `StoreUnreachable`."""
    with failed_requests_told(
        f"{work.feed.name}/{work.table}: reading the landed files",
        "not on a file (none was set aside; the next run reads them once the store answers)",
    ):
        return _read_by_format(session, work, partitions, catalogued, log)


def _read_by_format(
    session: SparkSession, work: TableWork, partitions: list[str], catalogued: dict, log
) -> Batch:
    """Parquet files through the common reader, the rest by their format (Flow: journals,
    covers and transactions)."""
    fmt, storage, feed, table = work.fmt, work.storage, work.feed, work.table
    if fmt.file_format == "parquet":
        return read_batch(
            session,
            storage,
            fmt,
            table,
            {key: catalogued[key] for key in partitions},
            current_schema(session, storage, work.layout, feed.name, table, log),
        )
    standing = reruns.read_reruns(storage, work.layout, feed.name, table)
    return fmt.read_batch(
        session,
        storage,
        feed.landing,
        table,
        catalogued,
        partitions,
        lambda: _processed_before(work),
        [part for key in partitions for request in standing.get(key, []) for part in request.parts],
        current_schema(session, storage, work.layout, feed.name, table, log),
    )


def _set_aside(
    work: TableWork, batch: Batch, partition_of: dict[str, str], catalogued: set[str], log
) -> tuple[list[str], set[str]]:
    """Copy each file the batch set aside to quarantine beside its reason; returns (the copies and
    notes written, the `catalogued` files whose copy failed: the next run of their partition
    reads them again). A catalogued file that is gone raises `LandingChanged` first."""
    landing_confirmation.unless_any_is_gone(
        work.storage, [item.uri for item in batch.quarantined if item.uri in catalogued]
    )
    copies, uncopied = [], set()
    for item in batch.quarantined:
        where = quarantine_file(
            work.storage,
            work.layout,
            work.feed.name,
            work.table,
            partition_of[item.uri],
            item,
            work.run_id,
        )
        copies += [where, where + REASON_SUFFIX]
        log.error(f"quarantined {item.uri}: {item.reason} (at {where}, its note beside it)")
        if item.uri in catalogued and not work.storage.exists(where):
            uncopied.add(item.uri)
            log.warning(f"{item.uri} could not be copied: the next run of its partition reads it again")
    return copies, uncopied


def _catalogue_strays_and_copies(work: TableWork, strays: list[Entry], copies: list[str], log) -> int:
    """Record the readable stray files and the quarantine copies and notes written; returns how
    many were recorded. A stray is reported with its reason already; one its store will not read
    stays out of the catalog."""
    feed, table, storage = work.feed.name, work.table, work.storage
    return work.catalogue(
        [
            *[
                catalog_file(
                    feed,
                    table,
                    work.run_id,
                    entry.uri,
                    work.fmt.landing_span(storage, entry.uri),
                    landed=True,
                )
                for entry in strays
            ],
            *[catalog_file(feed, table, work.run_id, uri, None) for uri in copies if storage.exists(uri)],
        ],
        lambda item, exc: log.warning(f"{item.url} could not be read to catalogue it ({first_line(exc)})"),
    )


def _refused_to_the_catalog(
    work: TableWork, partitions: list[str], records: dict, log
) -> list[tuple[str, Quarantined]]:
    """(partition, file) of the landed files of `partitions` that are listed but not catalogued
    because their store would not hand over their bytes (`catalogue_landing`), each with the
    store's answer. Their partition's processed note leaves them out, so the next run of it
    tries again; a file that reads now landed after the catalog step, and is the next run's (a
    failure that may pass is raised: the step fails, to be retried)."""
    listed = work.fmt.partitions_files(work.storage, work.feed.landing, work.table, partitions)
    refused = []
    for key, entries in listed.items():
        for entry in entries:
            if entry.uri in records[key]:
                continue
            answer = work.storage.refusal_to_read(entry.uri)
            if answer is None or isinstance(answer, FileNotFoundError):
                log.info(
                    f"{entry.uri} landed, or went, after its partition was catalogued: the next run sees it"
                )
                continue
            reason = f"its bytes could not be read ({first_line(answer)}); the next run of its partition tries again"
            refused.append((key, Quarantined(entry.uri, reason)))
    return refused


def _note_of_what_was_held(
    records: dict, uncopied: set[str], as_read: dict[str, Entry]
) -> dict[str, processed.ProcessedFile]:
    """A partition's processed note: its catalogued files, each with its modification time as
    listed before the read (`as_read`), but for those set aside whose bytes could not be copied
    (their store refused the bytes; a file gone stops the run first). Their rows are in neither
    `changes` nor quarantine, so the partition must not count as having processed them: listed
    again, they make the next run take it."""
    held = processed.note_from_records({url: r for url, r in records.items() if url not in uncopied})
    return {
        url: dataclasses.replace(note, read_mtime_ms=as_read[url].mtime_ms) if url in as_read else note
        for url, note in held.items()
    }


def _ask_partitions_to_run_again(
    work: TableWork, partitions: list[str], batch: Batch, own_files: list[str], catalogued: set[str], log
) -> list[str]:
    """Ask the partitions that hold rows of this run's files (`request_reruns`), then those read
    across a hole its files (`own_files`) fill (`_ask_readers_of_filled_gaps`), and its own
    partitions if a file this run did not catalogue fills a hole in what it read
    (`_ask_again_for_holes_filled_meanwhile`), to run again; returns the partitions asked."""
    asked = request_reruns(work, batch.committed_elsewhere, log)
    # A file set aside fills no hole: asked to read it, the hour would find the same hole.
    set_aside = {item.uri for item in batch.quarantined}
    asked += _ask_readers_of_filled_gaps(work, [*partitions, *asked], sorted(set(own_files) - set_aside), log)
    return [
        *asked,
        *_ask_again_for_holes_filled_meanwhile(work, partitions, batch.reading, catalogued | set_aside, log),
    ]


def _ask_readers_of_filled_gaps(work: TableWork, leaving_out: list[str], landed: list[str], log) -> list[str]:
    """Ask the partitions (but `leaving_out`) whose stored changes were read with a hole that
    one of the `landed` files holds bytes of to run again: a transaction pending where the hole
    began committed nothing after it (Flow: a fragment landing late between a transaction's
    documents and the hour of its acknowledgement, which ran while it was missing;
    docs/formats/flow-journals.md, "Hours"). The step holds
    the table's lease. Returns the partitions asked."""
    storage, layout, fmt, feed, table = work.storage, work.layout, work.fmt, work.feed.name, work.table
    if not fmt.files_share_data:
        return []
    with_gaps = reruns.readings_with_gaps(storage, layout, feed, table, set(leaving_out), log.warning)
    return _ask_to_fill(work, reruns.filling_gaps(with_gaps, fmt.byte_ranges(work.feed.landing, landed)), log)


def _ask_again_for_holes_filled_meanwhile(
    work: TableWork, partitions: list[str], reading: reruns.Reading | None, known: set[str], log
) -> list[str]:
    """Ask `partitions` themselves to run again when what they read has a new hole that a file
    landed now, and not `known` to the run (catalogued by it, or set aside), holds bytes of.
    Such a file landed after this run's catalog step, and its own run, which asks the readers
    of the holes it fills, may have looked before this run's reading (and its mark) existed.
    Looked at under the table's lease, which this run holds until its reading is recorded: a
    file landing after this look is its own run's to match against the mark. A hole the
    partitions' readings had already (marked, with no file set aside that this reading uses)
    was there for that run to find, so only a new hole costs the look: a listing of the hours
    from the run's context hour on (a file landing during the run in an earlier hour is not
    looked for). A listing that fails fails the step: skipped, the look would never be made,
    as the hole is marked from then on. Returns the partitions asked."""
    if reading is None or not reading.gaps():
        return []
    storage, fmt, landing, feed, table = work.storage, work.fmt, work.feed.landing, work.feed.name, work.table
    if reruns.holes_marked_before(storage, work.layout, feed, table, partitions, reading):
        return []
    since = parse_hour_key(fmt.read_partitions(partitions)[0])
    hours = fmt.landed_hours(storage, landing, table, since)
    landed = [entry.uri for entries in hours.values() for entry in entries if entry.uri not in known]
    holed = dict.fromkeys(partitions, reading)
    return _ask_to_fill(work, reruns.filling_gaps(holed, fmt.byte_ranges(landing, landed)), log)


def _ask_to_fill(work: TableWork, filling: dict[str, list[reruns.ByteRange]], log) -> list[str]:
    """Request that each partition of `filling` run again to read the parts that fill a hole in
    what its changes were read from; returns the partitions asked."""
    asked = []
    for partition, parts in sorted(filling.items()):
        more = f" and {len(parts) - 1} more" if len(parts) > 1 else ""
        reason = f"its changes were read with a gap that {parts[0].uri}{more} fills"
        reruns.request_rerun(work.storage, work.layout, work.feed.name, work.table, partition, reason, parts)
        log.warning(f"{work.feed.name}/{work.table}: asked {partition} to run again: {reason}")
        asked.append(partition)
    return asked


def _ask_holders_of_removed_data(work: TableWork, partitions: list[str], records: dict, log) -> list[str]:
    """Ask the partitions holding data of a file removed from `partitions` since they were
    processed (Flow: a compaction in another hour holding a removed fragment's bytes, which that
    hour's run read from the removed one) to run again. The request stands until a fold of
    theirs that was read after it (`reruns.request_read_since_removal`): once this run's notes
    no longer name the file, nothing else would tell. The step holds the table's lease. Returns
    the partitions asked."""
    storage, layout, fmt, feed, table = work.storage, work.layout, work.fmt, work.feed, work.table
    if not fmt.files_share_data:
        return []
    notes = processed.read_notes_of(
        storage,
        layout,
        feed.name,
        table,
        partitions,
        lambda damage: log.warning(f"{feed.name}/{table}: {damage} (this run writes it again)"),
    )
    if not any(set(note) - set(records.get(p, {})) for p, note in notes.items()):
        return []
    keys = fmt.partition_keys(storage, feed.landing, table)
    landed = fmt.partitions_files(storage, feed.landing, table, keys)
    live = {p: landed.get(p, []) for p in partitions}
    holding = processed.holding_removed_data({**landed, **live}, notes, fmt.holding_removed_data)
    for partition, reason in holding.items():
        if partition not in partitions and reruns.request_read_since_removal(
            storage, layout, feed.name, table, partition, reason
        ):
            log.info(f"{feed.name}/{table}: asked {partition} to run again: it {reason}")
    return sorted(p for p in holding if p not in partitions)


def _processed_before(work: TableWork) -> set[str]:
    """Partitions whose changes were stored or folded before (two listings)."""
    storage, layout, feed, table = work.storage, work.layout, work.feed.name, work.table
    return processed.noted_partitions(storage, layout, feed, table) | reruns.read_partitions(
        storage, layout, feed, table
    )


def request_reruns(
    work: TableWork, committed_elsewhere: dict[str, list[reruns.ByteRange]], log=_log
) -> list[str]:
    """Ask the partitions that hold rows of this run's files (a Flow transaction acknowledged
    there) to run again, unless the reading recorded with their stored changes holds those files'
    bytes (docs/incremental-runs.md, "Runs asked for by other runs"). A partition with no reading
    is asked too: if it never ran, planning takes it anyway. Returns the partitions asked."""
    storage, layout, feed, table = work.storage, work.layout, work.feed.name, work.table
    asked = []
    for partition, parts in sorted(committed_elsewhere.items()):
        reading = reruns.read_reading(storage, layout, feed, table, partition) or reruns.Reading({})
        unread = [part for part in parts if not reading.holds(part)]
        if not unread:
            continue
        more = f" and {len(unread) - 1} more" if len(unread) > 1 else ""
        reason = (
            f"a transaction acknowledged there holds documents of {unread[0].uri}{more}, "
            "which its stored changes were not read from"
        )
        reruns.request_rerun(storage, layout, feed, table, partition, reason, unread)
        log.warning(f"{feed}/{table}: asked {partition} to run again: {reason}")
        asked.append(partition)
    return asked


def store_partitions(
    storage: Storage,
    store: CatalogStore,
    location: str,
    frame: DataFrame | None,
    column: str,
    partitions: list[str],
    *,
    feed: str,
    table: str,
    run_id: str | None,
    keys: tuple[str, ...] = (),
    state: TableState | None = None,
    log=_log,
) -> tuple[dict[str, int], list[str]]:
    """Replace exactly `partitions` of the partitioned lake table at `location` with `frame`
    (a table keyed by `keys`), cataloguing the files written and retiring those replaced;
    returns (rows per written partition, files written). With the table's `state` (a change log),
    the keys it recorded as purged, and those `frame` purges, are written without their field data.
    The marks a collapse handed on with the events are not stored (`merge.without_marks`).

    A fold of the table killed mid-commit is finished first: its commit may put erased change-log
    files in place, which must land before this write replaces their partitions, never beside it.
    The processed notes of the partitions Spark replaces go just before (`processed.forget_notes`),
    so that a run killed while it replaces them leaves them to the next run."""
    if state is not None:
        finish_interrupted_folds(CommitCatalog(storage, store, feed, table, run_id, state), log)
    frame = None if frame is None else merge.without_marks(frame)
    replacing = functools.partial(_replacing_partitions, storage, state, feed, table)
    emptying = functools.partial(_ask_to_finish_emptying, storage, state, log) if state is not None else None
    with failed_requests_told(f"{feed}/{table}: reading the purged keys"):
        erase = (
            purges.Erasure.of_table(frame.sparkSession, storage, state, keys)
            if state is not None and frame is not None
            else None
        )
    removed = RemovedFiles(storage, store, feed, table, CHANGE_TIME_COLUMNS)
    # A batch whose cached rows Spark evicted is read again from the landing here.
    with failed_requests_told(f"{feed}/{table}: storing the changes"):
        written = lake_io.write_partitions(
            frame,
            storage,
            location,
            column,
            partitions,
            keys,
            erase,
            removed,
            replacing=replacing,
            emptying=emptying,
        )
    listed = each_request(
        lambda value: parquet_files(storage, partition_folder(location, column, value)), written
    )
    files = [uri for uris in listed for uri in uris]
    removed.retire()  # first: a failure recording the new files leaves no record of a removed one
    record_files(store, storage, written_files(feed, table, run_id, storage, files, CHANGE_TIME_COLUMNS))
    return written, files


def _replacing_partitions(
    storage: Storage, state: TableState | None, feed: str, table: str, partitions: list[str]
) -> None:
    """Just before Spark replaces `partitions`' folders: the table's lease is still the step's
    (`lease.confirm_held`), and their processed notes go (a change log's)."""
    lease.confirm_held()
    if state is not None:
        processed.forget_notes(storage, state.layout, feed, table, partitions)


def _ask_to_finish_emptying(storage: Storage, state: TableState, log, partitions: list[str]) -> None:
    """Before the stored changes of `partitions` (whose landed files are all gone) are removed,
    ask for each to run again; the fold's success withdraws the request. Killed after the
    removal, the run leaves the partition's processed note naming the files it held: were the
    same files to land again, planning would find the partition unchanged, and their rows would
    never return to `changes`. The request makes the next run take it whatever lands. The table's
    lease must still be the step's (`lease.confirm_held`)."""
    lease.confirm_held()
    for partition in partitions:
        reruns.request_rerun(
            storage,
            state.layout,
            state.feed,
            state.table,
            partition,
            "its stored changes are being removed (its landed files are gone)",
            [],
        )
    log.info(
        f"{state.feed}/{state.table}: removing the changes of {len(partitions)} partition(s) with no landed file"
    )


def fold_into_state(
    session: SparkSession, work: TableWork, batch: DataFrame, log=_log, partitions: Collection[str] = ()
) -> FoldReport:
    """Fold a change batch (the changes of `partitions`) into the table's current and history,
    erasing keys it purges for the first time from the change log too, cataloguing the files the
    fold wrote and retiring those it replaced.

    The run's own batch (handed over in memory, its lineage the landed files) must still have
    been read from the versions its changes were stored from when the fold's commit is recorded
    (`landing_confirmation.confirm_unchanged`): otherwise `LandingChanged`, with nothing committed. A request
    to the store that fails under Spark raises `StoreUnreachable`."""
    fmt = work.fmt
    state = TableState(work.layout, work.feed.name, work.table)
    commits = CommitCatalog(work.storage, work.store, work.feed.name, work.table, work.run_id, state)
    before_commit = None
    if confirm := landing_confirmation.confirmation_for(work, batch, partitions, "folding the changes"):

        def before_commit(step: str) -> None:
            if step == "record":  # after the fold's last read of the batch
                confirm()

    with failed_requests_told(f"{work.feed.name}/{work.table}: folding the changes into current and history"):
        report = fold(
            session,
            work.storage,
            state,
            batch,
            fmt.table_spec(work.table),
            on_commit_step=before_commit,
            log_column=fmt.partition_column,
            removing=commits.retire_replaced,
            delivered=lambda: delivered_now(work, list(partitions)),
        )
    commits.record_put_in_place([*report.files_written, *report.log_files_written])
    if report.newly_purged:
        log.info(
            f"purge: recorded {len(report.newly_purged)} key(s) as purged and erased their field data from the "
            f"state and from {len(report.log_partitions_erased)} change partition(s)"
        )
    if report.recovered_folds:
        log.warning(f"finished interrupted fold(s) {report.recovered_folds} before folding")
    return report


def delivered_now(work: TableWork, partitions: list[str]) -> set[str]:
    """The landed files the changes of `partitions`, as stored now, were read from (their stored
    notes): what those partitions deliver. A stored copy of a write read from another file of
    their folders (removed since) gives way to the batch's (`merge.copy_rank`)."""
    storage, layout, feed, table = work.storage, work.layout, work.feed.name, work.table
    stored, _ = processed.read_stored_notes(storage, layout, feed, table, partitions, None)
    return {url for files in stored.values() for url in files}


def check_fold(
    session: SparkSession,
    work: TableWork,
    batch: DataFrame,
    report: FoldReport,
    *,
    partitions: Collection[str],
    log=_log,
) -> list[checks.Outcome]:
    """The table's invariants after a fold, read back from the committed files: unique keys in
    current, consistent history windows, and every folded event accounted for.

    After a fold into an empty table every stored row is read back and compared with the batch's
    versions as a summary the fold took (`checks.VersionSet`), so the batch is not shuffled
    beside them; otherwise the rows the fold could have changed are read, with the batch. When a
    check fails on the run's own batch (of `partitions`), which Spark may have read again from
    landed files rewritten since the commit, a changed file is told as such (`LandingChanged`)
    rather than as the lake's inconsistency."""
    confirm = landing_confirmation.confirmation_for(work, batch, partitions, "checking the fold")
    with failed_requests_told(f"{work.feed.name}/{work.table}: checking the fold"):
        outcomes = _check_fold(session, work, batch, report)
    failed = [outcome.description for outcome in outcomes if not outcome.passed]
    if confirm and failed:
        log.warning(f"{work.feed.name}/{work.table}: checks failed: {'; '.join(failed)}; asking the landing")
        try:
            confirm()
        except (OSError, DamagedLakeFile) as unasked:  # the checks' own failure stands
            log.warning(
                f"{work.feed.name}/{work.table}: the landing could not be asked: {first_line(unasked)}"
            )
    return outcomes


def _check_fold(
    session: SparkSession, work: TableWork, batch: DataFrame, report: FoldReport
) -> list[checks.Outcome]:
    spec = work.fmt.table_spec(work.table)
    state = TableState(work.layout, work.feed.name, work.table)
    current = lake_io.read_table(session, work.storage, state.current, spec.keys)
    folded: DataFrame | checks.VersionSet | None = batch if report.events_in else None
    since = report.touched_since
    if report.into_empty and report.batch_versions is not None:
        folded, since = report.batch_versions, None
    rows = stored_rows_since(session, work.storage, state, spec, since)
    # Independent queries: submitted together, their jobs share the cores.
    unique_keys, windows_and_versions = run_together(
        lambda: checks.current_has_unique_keys(current, spec),
        lambda: checks.windows_and_versions_stored(rows, folded, spec),
        session=session,
    )
    # run_together's list holds both results; their types are the two checks' own.
    windows, stored_versions = cast("tuple[checks.Outcome, checks.StoredVersions]", windows_and_versions)
    reconciles = checks.batch_reconciles(
        report.batch_rows, report.identical_duplicates, report.superseded_writes, stored_versions
    )
    return [cast("checks.Outcome", unique_keys), windows, reconciles]


def files_with_values(batch: DataFrame, column: str | None, limit: int = 20) -> list[str]:
    """The landed files whose events carry a value in `column` (to name in an error)."""
    if column is None or column not in batch.columns:
        return []
    found = batch.where(col(column).isNotNull()).select(m.SOURCE_FILE).distinct().limit(limit)
    return sorted(r[0] for r in found.collect())
