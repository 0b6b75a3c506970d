"""Noticing new landed files cheaply: the pure logic behind the landing sensors.

Per table the cursor keeps a high-water hour and, for the hours still inside the late window
(`late_hours` before the high-water hour), the files already seen, each as its name, size and
modification time (`landed_version`), so that a file rewritten in place or removed is noticed. A scan lists
only the hour folders at or after the window's start (pruning whole years, months and days), so
its cost follows the window, not the length of the landing history.
"""

from __future__ import annotations

import abc
import bisect
import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from lake_assets.errors import LakeAssetsError
from lake_assets.feeds.base import FeedFormat, current_hour, hour_key, parse_hour_key
from lake_assets.processed import ProcessedWith
from lake_assets.storage import Entry, Storage


def short_digest(text: str) -> str:
    """16 hex characters standing for `text` in run keys and sensor cursors (not a security
    measure: Dagster's run keys and cursors only need to tell sets of names apart)."""
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class SensorLooks(abc.ABC):
    """What a table's landing-sensor cursor keeps of the sensor's own looks at it, whatever the
    feed's partitions are (hours or batches): each cursor adds where its scans got to."""

    #: when the table last had its turn to be walked for strays (`strays_due`; a scan that failed
    #: in its turn counts), in seconds since the epoch
    strays_looked_at: float | None = None
    #: whether a scan saved this cursor (a blank landing leaves nothing else in it)
    scanned: bool = False
    #: when a first scan of the table was last begun and did not save a cursor (it failed), in
    #: seconds since the epoch: tables waiting for a first scan take turns by it
    first_scan_tried_at: float | None = None
    #: when the table's purges kept by a change-log write were last looked for (the landing
    #: sensor's `_kept_purges`), in seconds since the epoch
    purges_looked_at: float | None = None
    #: the end of the last look at the runs that left the table's partitions unprocessed (the
    #: landing sensor's `_left_unfinished`), in seconds since the epoch: the next look takes
    #: the runs updated since (less an overlap for clocks that lag the daemon's)
    unfinished_looked_until: float | None = None
    #: partitions cancelled or failed runs left that the last look did not ask for (a run in
    #: flight may still write them, a retry Dagster will launch may process them, or the tick's
    #: share of partitions was spent): looked at again by the next look, whatever runs it takes
    unfinished_held: list[str] = dataclasses.field(default_factory=list)
    #: the failed runs whose retry, promised and yet to be launched, the last look waited for
    #: (their partitions are held): not waited for again
    retries_awaited: list[str] = dataclasses.field(default_factory=list)
    #: when the partitions the scans no longer list (hours older than the late window, batches
    #: before the open one) were last compared with what the lake processed them with (the
    #: sensors' `_old_partitions`; a first scan does it too), in seconds since the epoch
    old_partitions_looked_at: float | None = None

    @property
    @abc.abstractmethod
    def first_scan(self) -> bool:
        """Whether the table was never scanned (a sensor new to it, or reset)."""

    @property
    @abc.abstractmethod
    def newest(self) -> str | None:
        """The newest partition the scans saw (none: the landing holds none yet)."""


@dataclasses.dataclass
class TableCursor(SensorLooks):
    """The latest hour seen (`high_water`) and, per hour still open to late files, its files as
    seen: hours before those can no longer change unnoticed."""

    high_water: str | None = None
    seen: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    #: the table's first partition when the cursor was saved: hours before it were left out,
    #: so a first partition moved earlier since (a reload after discovery pinned an earlier
    #: hour) makes the next scan look back to them
    first_hour: str | None = None

    @property
    def first_scan(self) -> bool:
        """Whether the table was never scanned (a sensor new to it, or reset). A cursor saved
        before `scanned` was kept has scanned the table when it has seen an hour."""
        return not self.scanned and self.high_water is None and not self.seen

    @property
    def newest(self) -> str | None:
        return self.high_water


@dataclasses.dataclass(frozen=True)
class NewFiles:
    """Files that appeared, were rewritten or went in one partition since the last scan."""

    table: str
    partition: str
    new_names: tuple[str, ...]  # new or rewritten
    #: every file the partition holds now, as `landed_version` tells them apart
    all_names: tuple[str, ...]
    #: the files (as `landed_version` tells them apart) it held at the last scan and no longer
    #: does: removed, or replaced by a rewrite
    removed: tuple[str, ...] = ()

    @property
    def fingerprint(self) -> str:
        """What a run of the partition is keyed by: the files it holds and, for a removal, the
        files removed (else a removal that brings the files back to a set already run would
        get that run's key, which Dagster does not run again)."""
        return short_digest("\n".join([*self.all_names, *(f"-{version}" for version in self.removed)]))


def landed_version(entry: Entry) -> str:
    """A landed file as the sensor remembers it: its name, size and modification time, so that
    a file rewritten in place (a vendor's correction) is new again."""
    return json.dumps([entry.name, entry.size, entry.mtime_ms])


class TableScan(NamedTuple):
    found: list[NewFiles]
    cursor: TableCursor
    #: hours holding files before the table's first partition, which no run can name
    before_start: list[str]


def late_window_start(high_water: str, late_hours: int) -> str:
    """The first hour of the late window of a table whose latest hour seen is `high_water`: the
    hours a scan lists, and in which a file landing late is found."""
    return hour_key(parse_hour_key(high_water) - dt.timedelta(hours=late_hours))


def scan_table(
    storage: Storage,
    fmt: FeedFormat,
    landing: str,
    table: str,
    cursor: TableCursor,
    late_hours: int,
    first_hour: str | None = None,
    processed: ProcessedWith | None = None,
) -> TableScan:
    """The files new since `cursor` in the hours from `late_hours` before its high water on,
    and in the hours a `first_hour` (the table's first partition) moved earlier than the
    cursor's uncovers. Hours before `first_hour` are never found (no run could name them) nor
    remembered: they are returned as `before_start` on every scan that lists them. On a first
    scan (a cursor that has seen nothing), an hour the lake last `processed` with the files it
    holds now is remembered but not found (`_first_scan_finds`), and an hour it processed with
    files that holds none now is found as emptied."""
    since = window = None
    # A cursor saved while a future-dated folder counted as an hour may point past the hour under
    # way: it is held to it, or the tick would look only at hours no listing returns yet.
    high_water = min(cursor.high_water, hour_key(current_hour())) if cursor.high_water else None
    if high_water is not None:
        window = late_window_start(high_water, late_hours)
        since = parse_hour_key(window)
    uncovered = (cursor.first_hour or "") if first_hour and first_hour < (cursor.first_hour or "") else ""
    if since is not None and first_hour and uncovered:
        since = min(since, parse_hour_key(first_hour))
    found: list[NewFiles] = []
    before_start: list[str] = []
    first_scan = cursor.first_scan
    seen = dict(cursor.seen)
    listed = fmt.landed_hours(storage, landing, table, since)
    # An hour remembered but no longer listed lost every file: a run empties it. (A cursor held
    # to the hour under way may remember later hours, which no listing returns yet.)
    emptied = {key for key in seen if key not in listed and key <= hour_key(current_hour())}
    # A first scan remembers nothing: the hours the lake processed with files that hold none now.
    processed_files = processed.emptied(listed) if first_scan and processed is not None else {}
    emptied |= {key for key in processed_files if key <= hour_key(current_hour())}
    for key in sorted({*listed, *emptied}):
        files = listed.get(key, ())
        if first_hour and key < first_hour:
            before_start += [key] if files else []
            continue
        if window is not None and key < window and key >= uncovered:
            continue  # looked at by the scans before (listed only to reach the uncovered hours)
        versions = {landed_version(entry): entry.name for entry in files}
        fresh, removed = _compared(versions, seen.get(key, processed_files.get(key, ())))
        # an hour stored from no file (each was set aside) and emptied names no file, yet runs
        if (fresh or removed or key in processed_files) and _first_scan_finds(
            first_scan, processed, key, files
        ):
            found.append(NewFiles(table, key, fresh, tuple(sorted(versions)), removed))
        if versions:
            seen[key] = sorted(versions)
            high_water = max(high_water or key, key)
        else:
            seen.pop(key, None)
    if high_water is not None:
        floor = late_window_start(high_water, late_hours)
        seen = {k: v for k, v in seen.items() if k >= floor}
    # what the sensor keeps of its turns is carried; a first scan that saved a cursor is not retried
    scanned = dataclasses.replace(
        cursor,
        high_water=high_water,
        seen=seen,
        first_hour=first_hour,
        scanned=True,
        first_scan_tried_at=None,
    )
    return TableScan(found, scanned, before_start)


def _first_scan_finds(
    first_scan: bool, processed: ProcessedWith | None, partition: str, files: Sequence[Entry]
) -> bool:
    """Whether a partition with new files counts as found. A sensor that scans a table for the
    first time (started after `lake-assets run` did the backfill, or its cursor reset) would
    otherwise take every partition of the landing for new and fold the whole history again,
    ahead of the hours that are really new; a partition the lake last processed with the very
    files it holds now needs no run."""
    return not (first_scan and processed is not None and processed.unchanged(partition, files))


def _compared(versions: dict[str, str], remembered: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of the files new or rewritten since the last scan, and the versions of the files
    removed since. A cursor saved before versions were remembered holds names alone: a file
    of such a name counts as seen, whatever its version, so an upgrade runs nothing again."""
    remembered = set(remembered)
    names_alone = {entry for entry in remembered if not entry.startswith("[")}
    names_now = set(versions.values())
    fresh = tuple(
        sorted(
            name
            for version, name in versions.items()
            if version not in remembered and name not in names_alone
        )
    )
    removed = tuple(
        sorted(e for e in remembered - versions.keys() if e not in names_alone or e not in names_now)
    )
    return fresh, removed


def contiguous_ranges(
    keys: list[str], max_gap_hours: int = 0, barriers: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """Group sorted hour keys into runs of consecutive hours: one backfill run per range. With
    `max_gap_hours`, a range also spans up to that many hours without a key in a row, unless one
    of them is among `barriers` (hours a range must not take in)."""
    walls = sorted(barriers)
    ranges: list[tuple[str, str]] = []
    for key in sorted(keys):
        if ranges:
            start, end = ranges[-1]
            next_wall = bisect.bisect_right(walls, end)
            walled = next_wall < len(walls) and walls[next_wall] < key
            if not walled and parse_hour_key(key) - parse_hour_key(end) <= dt.timedelta(
                hours=1 + max_gap_hours
            ):
                ranges[-1] = (start, key)
                continue
        ranges.append((key, key))
    return ranges


def stretches_in_order(order: Sequence[str], wanted: Sequence[str]) -> list[tuple[str, ...]]:
    """`wanted` (keys of `order`) cut into stretches that are contiguous in `order`, each one
    partition range a run can name, in the order of the earliest key of each in `wanted`.

    Dagster resolves a range run's partitions in the partitions' own order, and a dynamic
    partitions definition (GRAX batches) keeps the order the keys were added in: batches
    registered newest first (`--from c --to d`, then `--from a --to b`) sit as c, d, a, b, where
    the range b .. d holds nothing. A range cut here holds exactly the wanted keys.
    """
    position = {key: index for index, key in enumerate(order)}
    unknown = [key for key in wanted if key not in position]
    if unknown:
        raise LakeAssetsError(f"partition(s) {', '.join(unknown)} are not registered: no run can name them")
    stretches: list[list[str]] = []
    for key in sorted(set(wanted), key=position.__getitem__):
        if stretches and position[stretches[-1][-1]] + 1 == position[key]:
            stretches[-1].append(key)
        else:
            stretches.append([key])
    rank: dict[str, int] = {}
    for index, key in enumerate(wanted):
        rank.setdefault(key, index)
    return [tuple(s) for s in sorted(stretches, key=lambda stretch: min(rank[key] for key in stretch))]


def encode_cursor(cursors: dict) -> str:
    """A sensor's cursor: one cursor (TableCursor or BatchCursor) per table, as JSON."""
    return json.dumps({t: dataclasses.asdict(c) for t, c in sorted(cursors.items())}, separators=(",", ":"))


def decode_cursor(text: str | None, kind: type | None = None) -> dict:
    """The cursors `encode_cursor` saved. A field this version does not know (saved by a newer
    one, before a rollback) is left out rather than fail every tick."""
    kind = kind or TableCursor
    if not text:
        return {}
    known = {field.name for field in dataclasses.fields(kind)}
    return {
        t: kind(**{k: v for k, v in _renamed(c).items() if k in known}) for t, c in json.loads(text).items()
    }


#: cursor fields saved under an earlier name
_EARLIER_NAMES = {"old_hours_looked_at": "old_partitions_looked_at"}


def _renamed(saved: dict) -> dict:
    return {_EARLIER_NAMES.get(name, name): value for name, value in saved.items()}


# --- feeds partitioned by the vendor's own batches (GRAX) ---------------------------------------


@dataclasses.dataclass
class BatchCursor(SensorLooks):
    """The greatest batch seen and its files as seen (`_batch_file_version`; a cursor saved
    before held their names): the batch a vendor still writes to, so every tick compares it;
    earlier batches are compared once a day (the sensors' look at older partitions)."""

    last: str | None = None
    open_files: list[str] = dataclasses.field(default_factory=list)

    @property
    def first_scan(self) -> bool:
        """Whether the table was never scanned (a sensor new to it, or reset). A cursor saved
        before `scanned` was kept has scanned the table when it has seen a batch."""
        return not self.scanned and self.last is None

    @property
    def newest(self) -> str | None:
        return self.last


def scan_batches(
    storage: Storage,
    fmt: FeedFormat,
    landing: str,
    table: str,
    cursor: BatchCursor,
    processed: ProcessedWith | None = None,
) -> tuple[list[NewFiles], BatchCursor]:
    """Batches that are new since the cursor, and the open (greatest) batch if it gained, rewrote or
    lost files. On a first scan, a batch the lake last `processed` with the files it holds now
    is not found (`_first_scan_finds`), and one it read from files that are all gone now is
    found as emptied.

    One listing of the table's batch folders, then file listings only of the batches at or after
    the cursor: closed batches (a greater one exists) are never listed again.
    """
    floor = fmt.partition_order(cursor.last) if cursor.last is not None else None
    files = fmt.landed_partitions_files(
        storage, landing, table, lambda key: floor is None or fmt.partition_order(key) >= floor
    )
    found: list[NewFiles] = []
    last, open_files = cursor.last, list(cursor.open_files)
    if cursor.last is not None and cursor.last not in files:
        # The open batch lost every file: on S3 its folder goes with its last object.
        if cursor.open_files:
            _, removed = _compared({}, cursor.open_files)
            found.append(NewFiles(table, cursor.last, (), (), removed))
        # Unless a newer batch landed, the one before it is open again: files landing there count.
        last, open_files = _open_batch_before(storage, fmt, landing, table, cursor.last)
    for key, entries in files.items():
        # Each file with its object folder, not by name alone: a batch may hold one name twice
        # (GRAX `object=Account` and `object=ACCOUNT` folders), and a copy landing late is new.
        versions = {_batch_file_version(entry): entry.name for entry in entries}
        if key == cursor.last:  # the open batch: its files may also be rewritten or removed
            fresh, removed = _compared(versions, cursor.open_files)
        else:
            fresh, removed = tuple(sorted(entry.name for entry in entries)), ()
        if (fresh or removed) and _first_scan_finds(cursor.first_scan, processed, key, entries):
            found.append(NewFiles(table, key, fresh, tuple(sorted(versions)), removed))
        last, open_files = key, sorted(versions)
    if cursor.first_scan and processed is not None:
        # A first scan remembers nothing: the batches the lake read that hold no file now.
        found += [NewFiles(table, key, (), (), names) for key, names in processed.emptied(files).items()]
        found.sort(key=lambda new: fmt.partition_order(new.partition))
    # what the sensor keeps of its turns is carried; a first scan that saved a cursor is not retried
    return found, dataclasses.replace(
        cursor, last=last, open_files=open_files, scanned=True, first_scan_tried_at=None
    )


def _open_batch_before(
    storage: Storage, fmt: FeedFormat, landing: str, table: str, gone: str
) -> tuple[str | None, list[str]]:
    """The greatest batch before `gone` and its files as seen now (none: no batch, no files)."""
    earlier = [
        k
        for k in fmt.partition_keys(storage, landing, table)
        if fmt.partition_order(k) < fmt.partition_order(gone)
    ]
    if not earlier:
        return None, []
    newest = max(earlier, key=fmt.partition_order)
    entries = fmt.partitions_files(storage, landing, table, [newest]).get(newest, [])
    return newest, sorted(_batch_file_version(entry) for entry in entries)


def _batch_file_version(entry: Entry) -> str:
    """A batch's file as the sensor remembers it: `landed_version` with its object folder (a
    batch spans object folders whose names differ only in case), `object=…/batch=…/<name>`."""
    return landed_version(dataclasses.replace(entry, name="/".join(entry.uri.rsplit("/", 3)[1:])))


# --- files no partition reads --------------------------------------------------------------------

#: how often a sensor walks a table for stray files: a walk lists every file of the table (on
#: S3, every key under it), so it is not a tick's cost
STRAYS_EVERY_SECONDS = 3600


def strays_due(looked_at: float | None, now: float) -> bool:
    """Whether a table's strays are to be looked for again (`STRAYS_EVERY_SECONDS`)."""
    return looked_at is None or now - looked_at >= STRAYS_EVERY_SECONDS


def strays_run_key(feed: str, table: str, partition: str, strays: Iterable[str]) -> str:
    """The run key of a run that reports a table's `strays` (their URIs): the same strays ask
    for one run, and a new one asks again."""
    digest = short_digest("\n".join(sorted(strays)))
    return f"{feed}:{table}:strays:{partition}:{digest}"
