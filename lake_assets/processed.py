"""Which landed partitions changed since they were last processed: what makes a daily
`lake-assets run` cost what changed, not the landing's whole history.

When a partition's fold has succeeded, the catalog's records of the landed files it read (URL,
size, hash, when each was recorded) are kept in a small note,
`<lake>/_state/<feed>/<table>/processed/<partition>.json`. Planning a run compares a listing of
the landing with those notes (see docs/incremental-runs.md):
- a partition with files and no note is new;
- a partition whose file names differ from its note's gained or lost files (a partition whose
  files are all gone still has a note, and is processed again, to empty it);
- a file whose size differs changed;
- a file modified after it was recorded may have been rewritten in place with the same size:
  only such a file is hashed again, and it changed if its hash differs;
- a partition another partition's run asked to run again changed too (`request_rerun`: a Flow
  transaction acknowledged in it holds documents of a fragment its last run did not read).

A format whose partitions' rows can depend on other partitions' files (Flow) also says what a
run read, as byte ranges of its streams (`Reading`): the changes step leaves it beside the notes
(`reading/`), and the note of each partition keeps it, so that a later run can tell whether a
file was read when a partition was processed, without comparing clocks.

Pure storage logic: no Spark, no Dagster.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from lake_assets.catalog.files import hash_file, unchanged_since_recorded
from lake_assets.paths import LakeLayout, join
from lake_assets.storage import Entry, Storage, each_file

NOTES_FOLDER = "processed"
RERUNS_FOLDER = "reruns"
READING_FOLDER = "reading"
#: the metadata name under which a changes step lists the partitions it asked to run again
RERUNS_ASKED = "partitions_asked_to_run_again"


@dataclasses.dataclass(frozen=True)
class ProcessedFile:
    size: int
    hash: str
    #: when the catalog recorded (hashed) this content, ms since the epoch
    recorded_ms: int


@dataclasses.dataclass(frozen=True)
class ByteRange:
    """Bytes `[begin, end)` of a stream (a Flow journal) that the landed file `uri` holds."""

    uri: str
    stream: str
    begin: int
    end: int


@dataclasses.dataclass(frozen=True)
class Reading:
    """What a run read of streamed landings: per stream, the byte ranges read (merged, in
    order), and the files it set aside as unusable (their own partition reports them)."""

    read: dict[str, tuple[tuple[int, int], ...]]
    set_aside: frozenset[str] = frozenset()

    def holds(self, part: ByteRange) -> bool:
        """Whether the run read `part`'s bytes (from it or another file holding them), or set it aside."""
        return part.uri in self.set_aside or any(
            begin <= part.begin and part.end <= end for begin, end in self.read.get(part.stream, ())
        )

    def to_json(self) -> dict:
        return {
            "read": {s: [list(r) for r in ranges] for s, ranges in self.read.items()},
            "set_aside": sorted(self.set_aside),
        }

    @classmethod
    def from_json(cls, body: dict) -> Reading:
        return cls(
            {stream: tuple((int(b), int(e)) for b, e in ranges) for stream, ranges in body["read"].items()},
            frozenset(body["set_aside"]),
        )


def merged(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Byte ranges joined where they touch or overlap, in order."""
    out: list[tuple[int, int]] = []
    for begin, end in sorted(ranges):
        if out and begin <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((begin, end))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Note:
    """What a partition's landed files were when it was last processed, and, for a streamed
    landing, what that run read (None: not recorded)."""

    files: dict[str, ProcessedFile]
    reading: Reading | None = None


@dataclasses.dataclass(frozen=True)
class RerunRequest:
    """A run's request that `partition` be processed again, because its rows depend on `parts`,
    which its last run did not read."""

    partition: str
    reason: str
    parts: tuple[ByteRange, ...]

    @property
    def token(self) -> str:
        """Names this request (a sensor keys its run by it): the same parts, the same token."""
        text = json.dumps([dataclasses.astuple(p) for p in self.parts])
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclasses.dataclass(frozen=True)
class Change:
    """A partition to process, and why in words."""

    partition: str
    reason: str


def notes_folder(layout: LakeLayout, feed: str, table: str) -> str:
    return join(layout.state(feed, table), NOTES_FOLDER)


def note_uri(layout: LakeLayout, feed: str, table: str, partition: str) -> str:
    return join(notes_folder(layout, feed, table), f"{partition}.json")


def rerun_uri(layout: LakeLayout, feed: str, table: str, partition: str) -> str:
    return join(layout.state(feed, table), RERUNS_FOLDER, f"{partition}.json")


def reading_uri(layout: LakeLayout, feed: str, table: str, partitions: list[str]) -> str:
    """Where the changes step of a run over `partitions` leaves what it read, for its fold's notes."""
    return join(layout.state(feed, table), READING_FOLDER, f"{min(partitions)}_to_{max(partitions)}.json")


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
    reading: Reading | None = None,
) -> None:
    """Record what each partition held when it was processed (partition -> URL -> file), with
    what the run read, and withdraw the requests to run them again that this run answered (it
    read, or set aside, every file they name; a request it did not answer stays).

    A backfill writes a note per hour; on S3 each is a request, so they go out several at a
    time, as the notes are read."""
    reruns = read_reruns(storage, layout, feed, table)

    def write(item: tuple[str, dict[str, ProcessedFile]]) -> None:
        partition, files = item
        body: dict = {"files": {url: dataclasses.asdict(file) for url, file in sorted(files.items())}}
        if reading is not None:
            body["reading"] = reading.to_json()
        storage.write_bytes(note_uri(layout, feed, table, partition), json.dumps(body, indent=1).encode())
        if partition in reruns and reading is not None:
            # read again: a request made during this run may name more (what this run read
            # settles only what it names)
            request = read_rerun(storage, layout, feed, table, partition)
            if request is not None and all(reading.holds(p) for p in request.parts):
                storage.delete_file(rerun_uri(layout, feed, table, partition))

    each_file(write, processed.items())


def read_notes(storage: Storage, layout: LakeLayout, feed: str, table: str) -> dict[str, Note]:
    """partition -> its note, for every partition processed so far."""
    entries = [
        e
        for e in storage.list(notes_folder(layout, feed, table))
        if not e.is_dir and e.name.endswith(".json")
    ]

    def read(entry: Entry) -> tuple[str, Note]:
        return entry.name[: -len(".json")], _note(storage.read_bytes(entry.uri))

    return dict(each_file(read, entries))


def read_note(storage: Storage, layout: LakeLayout, feed: str, table: str, partition: str) -> Note | None:
    """The note of one partition, None if it was never processed."""
    uri = note_uri(layout, feed, table, partition)
    return _note(storage.read_bytes(uri)) if storage.exists(uri) else None


def noted_partitions(storage: Storage, layout: LakeLayout, feed: str, table: str) -> set[str]:
    """The partitions processed so far (one listing, no note read)."""
    return {
        e.name[: -len(".json")]
        for e in storage.list(notes_folder(layout, feed, table))
        if not e.is_dir and e.name.endswith(".json")
    }


def _note(data: bytes) -> Note:
    body = json.loads(data)
    if "files" not in body:  # written before notes kept what the run read: URL -> file
        return Note({url: ProcessedFile(**file) for url, file in body.items()})
    reading = Reading.from_json(body["reading"]) if "reading" in body else None
    return Note({url: ProcessedFile(**file) for url, file in body["files"].items()}, reading)


def leave_reading(
    storage: Storage, layout: LakeLayout, feed: str, table: str, partitions: list[str], reading: Reading
) -> None:
    """Leave what the changes step of a run over `partitions` read, for its fold's notes."""
    storage.write_bytes(reading_uri(layout, feed, table, partitions), json.dumps(reading.to_json()).encode())


def take_reading(
    storage: Storage, layout: LakeLayout, feed: str, table: str, partitions: list[str]
) -> Reading | None:
    """What the changes step of a run over `partitions` read (None: nothing was left), removed."""
    uri = reading_uri(layout, feed, table, partitions)
    if not storage.exists(uri):
        return None
    reading = Reading.from_json(json.loads(storage.read_bytes(uri)))
    storage.delete_file(uri)
    return reading


def request_rerun(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    partition: str,
    reason: str,
    parts: list[ByteRange],
) -> RerunRequest:
    """Ask for `partition` to be processed again because its rows depend on `parts`: planning
    and the landing sensor see it as changed until a run that reads them (`write_notes`). A
    request already standing keeps its parts too."""
    standing = read_rerun(storage, layout, feed, table, partition)
    request = RerunRequest(
        partition,
        reason,
        tuple(sorted({*parts, *(standing.parts if standing else ())}, key=dataclasses.astuple)),
    )
    body = {"reason": request.reason, "parts": [dataclasses.asdict(p) for p in request.parts]}
    storage.write_bytes(rerun_uri(layout, feed, table, partition), json.dumps(body, indent=1).encode())
    return request


def read_reruns(storage: Storage, layout: LakeLayout, feed: str, table: str) -> dict[str, RerunRequest]:
    """partition -> the request to process it again, for every partition with one (the folder
    is empty but for requests not yet answered)."""
    entries = [
        e
        for e in storage.list(join(layout.state(feed, table), RERUNS_FOLDER))
        if not e.is_dir and e.name.endswith(".json")
    ]

    def read(entry: Entry) -> RerunRequest:
        return _rerun(entry.name[: -len(".json")], storage.read_bytes(entry.uri))

    return {request.partition: request for request in each_file(read, entries)}


def read_rerun(
    storage: Storage, layout: LakeLayout, feed: str, table: str, partition: str
) -> RerunRequest | None:
    """The request to process `partition` again, None if there is none."""
    uri = rerun_uri(layout, feed, table, partition)
    return _rerun(partition, storage.read_bytes(uri)) if storage.exists(uri) else None


def _rerun(partition: str, data: bytes) -> RerunRequest:
    body = json.loads(data)
    return RerunRequest(partition, body["reason"], tuple(ByteRange(**p) for p in body["parts"]))


def changed_partitions(
    storage: Storage,
    landed: dict[str, list[Entry]],
    notes: dict[str, Note],
    reruns: dict[str, RerunRequest] | None = None,
) -> list[Change]:
    """The partitions whose landed files differ from what they held when last processed, or
    that a run asked to run again, in `landed`'s order (then partitions whose files are all
    gone)."""
    reruns = reruns or {}
    changes = []
    for partition in [*landed, *(p for p in notes if p not in landed)]:
        note = notes.get(partition)
        reason = _why_changed(storage, landed.get(partition, []), note.files if note else None)
        if reason is None and partition in reruns:
            reason = f"to run again: {reruns[partition].reason}"
        if reason is not None:
            changes.append(Change(partition, reason))
    return changes


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
    rewritten = [url for url in touched if hash_file(storage, url) != note[url].hash]
    return _count(rewritten, "rewritten") if rewritten else None


def _count(urls: list[str], what: str) -> str | None:
    if not urls:
        return None
    name = urls[0].rsplit("/", 1)[-1]
    return f"{name} {what}" if len(urls) == 1 else f"{len(urls)} files {what} ({name}, ...)"
