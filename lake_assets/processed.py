"""Which landed partitions changed since they were last processed: what makes a daily
`lake-assets run` cost what changed, not the landing's whole history.

When a partition's changes are stored, the catalog's records of the landed files they were read
from (URL, size, hash, when each was recorded) are kept in a small note,
`<lake>/_state/<feed>/<table>/stored/<partition>.json`; when the fold of those changes has
succeeded, that note becomes the partition's processed note,
`<lake>/_state/<feed>/<table>/processed/<partition>.json`. The note says what was read, not what
the catalog holds by then: a file catalogued after the read (a run over the catalog alone, or a
concurrent one) is not taken for processed. Planning a run compares a listing of
the landing with those notes (see docs/incremental-runs.md):
- a partition with files and no note is new;
- a partition whose file names differ from its note's gained or lost files (a partition whose
  files are all gone still has a note, and is processed again, to empty it);
- a file whose size differs changed;
- a file modified after it was recorded may have been rewritten in place with the same size:
  only such a file is hashed again, and it changed if its hash differs;
- a partition that another run asked to run again (`reruns`) changed too.

Pure storage logic: no Spark, no Dagster.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from typing_extensions import TypedDict

from lake_assets.catalog.files import hash_file, unchanged_since_recorded
from lake_assets.engine.state import parquet_files
from lake_assets.errors import DamagedLakeFile
from lake_assets.paths import LakeLayout, join
from lake_assets.storage import FILE_ERRORS, Entry, Storage, each_request, read_lake_json

if TYPE_CHECKING:
    from lake_assets.feeds.base import FeedFormat

NOTES_FOLDER = "processed"
#: the landed files each partition's stored changes were read from (processed once folded)
STORED_FOLDER = "stored"


@dataclasses.dataclass(frozen=True)
class ProcessedFile:
    size: int
    hash: str
    #: when the catalog recorded (hashed) this content, ms since the epoch
    recorded_ms: int
    #: the file's modification time, by its store's clock, as listed when the run began to read
    #: it (None in notes written before runs noted it)
    read_mtime_ms: int | None = None


@dataclasses.dataclass(frozen=True)
class Change:
    """A partition to process, and why in words."""

    partition: str
    reason: str


def notes_folder(layout: LakeLayout, feed: str, table: str, folder: str = NOTES_FOLDER) -> str:
    return join(layout.state(feed, table), folder)


def note_uri(layout: LakeLayout, feed: str, table: str, partition: str, folder: str = NOTES_FOLDER) -> str:
    return join(notes_folder(layout, feed, table, folder), f"{partition}.json")


def note_from_records(records: dict[str, dict]) -> dict[str, ProcessedFile]:
    """URL -> the processed file, from the catalog's records of a partition's landed files."""
    return {
        url: ProcessedFile(int(r["size"]), r["metadata"]["hash"], int(r["create_time"]))
        for url, r in records.items()
    }


def write_notes(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    processed: dict[str, dict[str, ProcessedFile]],
) -> None:
    """Record what each partition held when it was processed (partition -> URL -> file)."""
    _write_each(
        storage, notes_folder(layout, feed, table), {p: _as_json(files) for p, files in processed.items()}
    )


def write_stored_notes(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    read_from: dict[str, dict[str, ProcessedFile]],
    run_id: str | None,
) -> None:
    """Record what each partition's stored changes were read from, and which run stored them:
    the fold of another run's batch must not take them for its own (`read_stored_notes`)."""
    folder = notes_folder(layout, feed, table, STORED_FOLDER)
    _write_each(
        storage, folder, {p: {"run": run_id, "files": _as_json(files)} for p, files in read_from.items()}
    )


def _as_json(files: dict[str, ProcessedFile]) -> dict:
    return {url: dataclasses.asdict(file) for url, file in sorted(files.items())}


def _write_each(storage: Storage, folder: str, bodies: dict[str, object]) -> None:
    """A note per partition. A backfill writes one per hour; on S3 each is a request, so they go
    out several at a time, as the notes are read."""

    def write(item: tuple[str, object]) -> None:
        partition, body = item
        storage.write_bytes(join(folder, f"{partition}.json"), json.dumps(body, indent=1).encode())

    each_request(write, bodies.items())


def read_notes(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    is_partition: Callable[[str], bool] = lambda _: True,
) -> dict[str, dict[str, ProcessedFile]]:
    """partition -> URL -> file, for every partition processed so far. A note named like no
    partition (`is_partition`, the feed format's test) was not written by a run: it is damage."""
    return _read_notes(json_files(storage, notes_folder(layout, feed, table)), storage, is_partition)


def read_notes_of(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    partitions: list[str],
    damaged: Callable[[DamagedLakeFile], None],
) -> dict[str, dict[str, ProcessedFile]]:
    """The processed notes of `partitions` that have one and read, each read by its name; a
    damaged one is told to `damaged` and left out (the run rewrites it)."""
    uris = {p: note_uri(layout, feed, table, p) for p in partitions}
    present = [p for p, found in zip(uris, each_request(storage.exists, uris.values()), strict=True) if found]

    def read(partition: str) -> tuple[str, dict[str, ProcessedFile] | None]:
        try:
            return partition, read_lake_json(storage, uris[partition], dict[str, ProcessedFile])
        except DamagedLakeFile as exc:
            damaged(exc)
            return partition, None

    return {p: note for p, note in each_request(read, present) if note is not None}


class _StoredNote(TypedDict):
    run: str | None
    files: dict[str, ProcessedFile]


def read_stored_notes(
    storage: Storage, layout: LakeLayout, feed: str, table: str, partitions: list[str], stored_by: str | None
) -> tuple[dict[str, dict[str, ProcessedFile]], list[str]]:
    """(partition -> URL -> file the stored changes of each of `partitions` were read from,
    for those that run `stored_by` stored, or any run when None; the partitions whose changes
    another run stored). A partition whose changes were stored before these notes has none."""
    wanted = set(partitions)
    notes = _read_stored(storage, layout, feed, table, wanted.__contains__)
    ours = {
        partition: _files_of(note)
        for partition, note in notes.items()
        if stored_by is None or (_is_stored_note(note) and note["run"] == stored_by)
    }
    return ours, sorted(set(notes) - set(ours))


def unfolded_notes(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    processed: Collection[str],
    is_partition: Callable[[str], bool],
) -> dict[str, dict[str, ProcessedFile]]:
    """partition -> URL -> file its stored changes were read from, for the partitions whose
    changes a run stored and no fold has processed since (not among `processed`): a run killed
    before its fold, or `changes` materialised alone, left them."""
    return {
        partition: _files_of(note)
        for partition, note in _read_stored(
            storage, layout, feed, table, lambda p: is_partition(p) and p not in processed
        ).items()
    }


def _read_stored(
    storage: Storage, layout: LakeLayout, feed: str, table: str, wanted: Callable[[str], bool]
) -> dict[str, Any]:
    """partition -> its stored note as written, for the `wanted` partitions with one."""
    folder = notes_folder(layout, feed, table, STORED_FOLDER)
    entries = [e for e in json_files(storage, folder) if wanted(json_name(e))]
    # A note written before notes named their run is a plain URL -> file mapping: no run's own,
    # but what is stored when the fold read the change log back.
    shape: Any = _StoredNote | dict[str, ProcessedFile]
    return dict(each_request(lambda e: (json_name(e), read_lake_json(storage, e.uri, shape)), entries))


def stored_partitions(
    storage: Storage, layout: LakeLayout, feed: str, table: str, is_partition: Callable[[str], bool]
) -> set[str]:
    """The partitions whose changes a run stored (each has a `stored/` note), folded or not."""
    folder = notes_folder(layout, feed, table, STORED_FOLDER)
    return {json_name(e) for e in json_files(storage, folder) if is_partition(json_name(e))}


def _is_stored_note(note: dict) -> bool:
    return set(note) == {"run", "files"}


def _files_of(note: dict) -> dict[str, ProcessedFile]:
    return note["files"] if _is_stored_note(note) else note


def _read_notes(
    entries: list[Entry], storage: Storage, is_partition: Callable[[str], bool] = lambda _: True
) -> dict[str, dict[str, ProcessedFile]]:

    def read(entry: Entry) -> tuple[str, dict[str, ProcessedFile]]:
        partition = json_name(entry)
        if not is_partition(partition):
            raise DamagedLakeFile(entry.uri, f"{partition!r} names no partition of the table")
        return partition, read_lake_json(storage, entry.uri, dict[str, ProcessedFile])

    return dict(each_request(read, entries))


def forget_notes(storage: Storage, layout: LakeLayout, feed: str, table: str, partitions: list[str]) -> None:
    """Remove the notes of `partitions` (processed, and what their stored changes were read
    from), before Spark replaces their stored changes.

    Spark replaces a partition's folder by deleting it and then moving the new one in: a run
    killed between the two leaves the partition without its changes. Without its note the
    next run processes it again, as it would a new one; with it, planning would find nothing
    changed and the rows would stay lost. The fold's success writes the notes again. (A
    partition only emptied keeps its note: its files are gone, and the note is what makes the
    next run empty it if this one does not.)"""
    each_request(
        storage.delete_file,
        [
            note_uri(layout, feed, table, p, folder)
            for p in partitions
            for folder in (NOTES_FOLDER, STORED_FOLDER)
        ],
    )


def noted_partitions(storage: Storage, layout: LakeLayout, feed: str, table: str) -> set[str]:
    """The partitions processed so far (one listing, no note read)."""
    return {json_name(entry) for entry in json_files(storage, notes_folder(layout, feed, table))}


def refusal_for_a_blank_landing(
    fmt: FeedFormat,
    storage: Storage,
    layout: LakeLayout,
    *,
    landing: str,
    feed: str,
    table: str,
    read: Mapping[str, Collection[str]],
    listed: Mapping[str, list[Entry]],
    allowed: bool,
    read_elsewhere: Callable[[str], Collection[str]] = lambda _: (),
) -> str | None:
    """Why a run is refused (the text of `LandingEmptied`), or None. Refused: a run that would
    empty partitions (files were read from them, as `read` says, and the landing lists none in
    them: `listed`) when none of the files read from any partition of `read` is listed any more
    and no other partition lists a file read from it (`read_elsewhere`: partition -> URLs): the
    landing went blank at once, but for files no run has read yet. Not refused: files removed
    among others that remain (a vendor's retention) leave their partitions as usual, a partition
    whose files were replaced is not emptied, and a feed may allow it (`allowed`: its
    `allow_empty_landing`). A partition whose change log holds no file (its every file read was
    quarantined, say) loses nothing when emptied and is left out of the count; a partition
    whose files were set aside by a run that failed before storing its changes still holds the
    rows read before, and counts. Planning, the run's own step and `status` all ask this.

    An unmounted share (perhaps with a new file written into its mount point) or a mistyped
    prefix lists exactly like a vendor that removed every file, and the change log may be the
    only copy left of what was read (docs/incremental-runs.md, "What a run takes")."""
    if allowed:
        return None
    emptied = sorted(
        (key for key, urls in read.items() if urls and not listed.get(key)), key=fmt.partition_order
    )
    if not emptied:
        return None
    landed = {entry.uri for entries in listed.values() for entry in entries}
    if any(url in landed for urls in read.values() for url in urls):
        return None
    if _lists_a_file_read_before(fmt, storage, landing, table, set(listed) | set(read), read_elsewhere):
        return None
    emptied = [
        key
        for key in emptied
        if parquet_files(storage, layout.change_log_partition(feed, table, fmt.partition_column, key))
    ]
    return blank_landing_refusal(feed, table, landing, partitions_named(emptied)) if emptied else None


def _lists_a_file_read_before(
    fmt: FeedFormat,
    storage: Storage,
    landing: str,
    table: str,
    besides: Collection[str],
    read_from: Callable[[str], Collection[str]],
) -> bool:
    """Whether a partition of the table but those `besides` still lists a file the lake read from
    it (`read_from`: partition -> URLs). Newest first, stopping at the first such file: a new
    file vouches for nothing (a sync job may write one into an unmounted share's mount point),
    a file read before shows the landing is the one the lake read."""
    for key in reversed(fmt.partition_keys(storage, landing, table)):
        if key in besides:
            continue
        files = fmt.partition_files(storage, landing, table, key)
        if files and not set(read_from(key)).isdisjoint(entry.uri for entry in files):
            return True
    return False


def landing_vouched_for(
    storage: Storage, layout: LakeLayout, fmt: FeedFormat, landing: str, feed: str, table: str
) -> bool:
    """Whether the landing still lists a file the lake read (a processed note names it), before
    a rebuild forgets the table; a table with no note to go by, any file. A new file alone
    vouches for nothing: a sync job may have written it into an unmounted share's mount point."""
    if not noted_partitions(storage, layout, feed, table):
        return fmt.holds_landed_files(storage, landing, table)
    return _lists_a_file_read_before(
        fmt, storage, landing, table, (), noted_files(storage, layout, feed, table)
    )


def noted_files(storage: Storage, layout: LakeLayout, feed: str, table: str) -> Callable[[str], set[str]]:
    """partition -> the URLs its processed note names, each note read when asked for (a damaged
    one names none)."""

    def of(partition: str) -> set[str]:
        found = read_notes_of(storage, layout, feed, table, [partition], damaged=lambda _: None)
        return set(found.get(partition, {}))

    return of


def blank_landing_refusal(feed: str, table: str, landing: str, what: str) -> str:
    """Why `what` of a table whose landing went blank is not emptied, and what to do (the text
    of `LandingEmptied`)."""
    return (
        f"{feed}/{table}: the landing {landing} lists none of the files the lake read from {what}: not emptying "
        f"it. Is the landing mounted, and its path right? If every file was removed on purpose, set "
        f"`allow_empty_landing: true` on feed {feed} for the run that empties it"
    )


def partitions_named(partitions: list[str]) -> str:
    """`partitions` (in their order) in a few words: how many, the first and the last."""
    return f"{len(partitions)} partition(s), {partitions[0]} .. {partitions[-1]}"


def json_files(storage: Storage, folder: str) -> list[Entry]:
    """The `.json` files in a folder (none if it is absent)."""
    return [e for e in storage.list(folder) if not e.is_dir and e.name.endswith(".json")]


def json_name(entry: Entry) -> str:
    return entry.name[: -len(".json")]


def changed_partitions(
    storage: Storage,
    landed: dict[str, list[Entry]],
    notes: dict[str, dict[str, ProcessedFile]],
    asked: dict[str, str] | None = None,
    stored: Iterable[str] = (),
) -> list[Change]:
    """The partitions whose landed files differ from what they held when last processed, or
    that a run asked to run again (`asked`: partition -> why), in `landed`'s order (then
    partitions whose files are all gone); and of the partitions whose changes were `stored`, those
    never processed whose landed files are all gone (a folder may outlive its files): their run
    removes their stored changes (a run killed before its fold, or `changes` materialised
    alone, left them)."""
    asked = asked or {}
    changes = []
    for partition in [*landed, *(p for p in notes if p not in landed)]:
        reason = _why_changed(storage, landed.get(partition, []), notes.get(partition))
        if reason is None and partition in asked:
            reason = f"to run again: {asked[partition]}"
        if reason is not None:
            changes.append(Change(partition, reason))
    chosen = {change.partition for change in changes}
    for partition in sorted(set(stored) - set(notes) - chosen):
        if not landed.get(partition):
            changes.append(Change(partition, "stored but never folded, and its landed files are gone"))
    return changes


@dataclasses.dataclass(frozen=True)
class ProcessedWith:
    """What the lake last processed each partition with (its notes, `read_notes`), for a sensor's
    first scan, which has no cursor to compare the landing with. `run_anyway` are the
    partitions planning runs whatever their files: those asked to run again and, for formats
    whose files share data, those holding data of a file removed elsewhere."""

    storage: Storage
    notes: dict[str, dict[str, ProcessedFile]]
    run_anyway: frozenset[str] = frozenset()
    #: the partitions stored but never processed (`unfolded_notes`), with the files they were read from
    unfolded: Mapping[str, dict[str, ProcessedFile]] = dataclasses.field(default_factory=dict)

    def unchanged(self, partition: str, files: Sequence[Entry]) -> bool:
        """Whether the partition's landed `files` are those it was processed with, as planning
        compares them (`changed_partitions`), and nothing else asks it to run."""
        note = self.notes.get(partition)
        return (
            partition not in self.run_anyway
            and note is not None
            and not changed_partitions(self.storage, {partition: list(files)}, {partition: note})
        )

    def emptied(self, landed: Mapping[str, Sequence[Entry]]) -> dict[str, tuple[str, ...]]:
        """partition -> the names of the files it was processed (or its changes stored) with,
        for the partitions that hold no file now (`landed` lists none for them; a folder may
        outlive its files) and that planning runs for it (`changed_partitions`), which empties
        them."""
        read_from = {**self.unfolded, **self.notes}
        gone: dict[str, list[Entry]] = {partition: [] for partition in read_from if not landed.get(partition)}
        runs = changed_partitions(
            self.storage,
            gone,
            {p: self.notes[p] for p in gone if p in self.notes},
            stored=[p for p in self.unfolded if p in gone],
        )
        return {
            change.partition: tuple(sorted(url.rsplit("/", 1)[-1] for url in read_from[change.partition]))
            for change in runs
        }


def holding_removed_data(
    landed: dict[str, list[Entry]],
    notes: dict[str, dict[str, ProcessedFile]],
    holding: Callable[[list[str], list[str]], dict[str, str]],
) -> dict[str, str]:
    """partition -> why it must run again: it holds some of the same data as a file removed
    from another partition (`holding`, the format's test: a Flow fragment removed from one hour
    while another hour's compaction holds its bytes again, which that hour's run read from the
    removed one). `notes` are those of the partitions `landed` covers (a run's window)."""
    removed = {
        url: partition
        for partition, note in notes.items()
        for url in set(note) - {entry.uri for entry in landed.get(partition, [])}
    }
    if not removed:
        return {}
    partition_of = {entry.uri: partition for partition, entries in landed.items() for entry in entries}
    found: dict[str, str] = {}
    for uri, gone in sorted(holding(sorted(removed), sorted(partition_of)).items()):
        partition = partition_of[uri]
        if removed[gone] != partition:
            found.setdefault(
                partition, f"holds data of {gone.rsplit('/', 1)[-1]}, removed from {removed[gone]}"
            )
    return found


def _why_changed(storage: Storage, files: list[Entry], note: dict[str, ProcessedFile] | None) -> str | None:
    if note is None:
        return f"new: {len(files)} file(s)" if files else None
    listed = {entry.uri: entry for entry in files}
    added, removed = sorted(set(listed) - set(note)), sorted(set(note) - set(listed))
    if added or removed:
        return ", ".join(part for part in (_count(added, "added"), _count(removed, "removed")) if part)
    resized = [url for url, entry in listed.items() if entry.size != note[url].size]
    if resized:
        return _count(resized, "changed size")
    touched = [
        url
        for url, entry in listed.items()
        if not unchanged_since_recorded(entry, note[url].size, note[url].recorded_ms)
    ]
    rewritten = [url for url in touched if _hash_now(storage, url) != note[url].hash]
    return _count(rewritten, "rewritten") if rewritten else None


def _hash_now(storage: Storage, url: str) -> str | None:
    """The file's hash, or None when its bytes cannot be read now: it counts as rewritten, so its
    partition runs, and that run reports the file with its store's answer, rather than one file
    stopping the planning of every partition."""
    try:
        return hash_file(storage, url)
    except FILE_ERRORS:
        return None


def _count(urls: list[str], what: str) -> str | None:
    if not urls:
        return None
    name = urls[0].rsplit("/", 1)[-1]
    return f"{name} {what}" if len(urls) == 1 else f"{len(urls)} files {what} ({name}, ...)"
