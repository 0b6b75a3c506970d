"""Partitions whose rows depend on other partitions' files, and the runs that keeps asking for.

A Flow document belongs to the hour of its transaction's acknowledgement, so a fragment that
lands late in an earlier hour changes the rows of a later one, which nothing in that later hour's
own files says. These records make this safe, without comparing clocks (docs/incremental-runs.md,
"Runs asked for by other runs"):

- what a partition's stored changes were read from (`Reading`: per stream, the byte ranges read,
  and the files set aside as unusable), left by the changes step once its output is stored, at
  `<lake>/_state/<feed>/<table>/reading/<partition>.json`;
- a mark on each partition whose reading has a hole (`reading_gaps/<partition>.json`), so that
  a run whose files fill such a hole finds the partitions to ask with one listing;
- a request that a partition run again because its rows depend on bytes (`ByteRange`s) its
  reading does not hold, one file per request at
  `<lake>/_state/<feed>/<table>/reruns/<partition>/<request>.json`; or, for a request made
  once files its changes may have been read from were removed, on a reading recorded after it
  (`AfterRemoval`). Planning and the landing sensor take such a partition as changed; a
  successful fold of it withdraws every request its reading now answers (or whose file is gone).

Pure storage logic: no Spark, no Dagster.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterable
from typing import NotRequired

from typing_extensions import TypedDict

from lake_assets.errors import DamagedLakeFile
from lake_assets.paths import LakeLayout, join
from lake_assets.processed import json_files, json_name
from lake_assets.storage import Storage, each_request, read_lake_json

READING_FOLDER = "reading"
RERUNS_FOLDER = "reruns"
#: a mark per partition whose reading has a hole (`Reading.gaps`), so that a run finds them
#: with one listing (`readings_with_gaps`)
READING_GAPS_FOLDER = "reading_gaps"
#: the metadata name under which a changes step lists the partitions it asked to run again
RERUNS_ASKED = "partitions_asked_to_run_again"


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
    #: this record's own mark, given as it is written (`leave_reading`): a request made after a
    #: removal is answered only by a reading recorded since (None before marks were kept)
    recorded: str | None = None

    def holds(self, part: ByteRange) -> bool:
        """Whether the run read `part`'s bytes (from it or another file holding them) with none
        missing after them: what a run reads before a gap commits nothing after it, so only the
        stretch after the stream's last gap counts."""
        ranges = self.read.get(part.stream, ())
        return bool(ranges) and ranges[-1][0] <= part.begin and part.end <= ranges[-1][1]

    def gaps(self) -> dict[str, list[tuple[int, int]]]:
        """Per stream, the bytes missing between those read: what was read after such a hole
        committed nothing that began before it."""
        holes = {
            stream: [(ranges[i][1], ranges[i + 1][0]) for i in range(len(ranges) - 1)]
            for stream, ranges in self.read.items()
        }
        return {stream: found for stream, found in holes.items() if found}

    def answers(self, part: ByteRange) -> bool:
        """Whether a run asked to read `part` did: it read its bytes, or set the file aside as
        unusable (its own partition reports it; a repaired file is asked for again, as a file
        set aside is not read)."""
        read = any(begin <= part.begin and part.end <= end for begin, end in self.read.get(part.stream, ()))
        return read or part.uri in self.set_aside

    def to_json(self) -> dict:
        return {
            "read": {stream: [list(r) for r in ranges] for stream, ranges in self.read.items()},
            "set_aside": sorted(self.set_aside),
            **({"recorded": self.recorded} if self.recorded is not None else {}),
        }


def _overlaps(ranges: Iterable[tuple[int, int]], part: ByteRange) -> bool:
    return any(begin < part.end and part.begin < end for begin, end in ranges)


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
class RerunRequest:
    """One run's request that `partition` run again: its rows depend on `parts`, or (`after`)
    on being read again since a removal."""

    partition: str
    reason: str
    parts: tuple[ByteRange, ...]
    #: the request's file; its name is unique, so a sensor keys its run by it
    uri: str
    after: AfterRemoval | None = None

    @property
    def name(self) -> str:
        return self.uri.rsplit("/", 1)[-1][: -len(".json")]


def reading_folder(layout: LakeLayout, feed: str, table: str) -> str:
    return join(layout.state(feed, table), READING_FOLDER)


def reruns_folder(layout: LakeLayout, feed: str, table: str) -> str:
    return join(layout.state(feed, table), RERUNS_FOLDER)


def reading_gaps_folder(layout: LakeLayout, feed: str, table: str) -> str:
    return join(layout.state(feed, table), READING_GAPS_FOLDER)


def leave_reading(
    storage: Storage, layout: LakeLayout, feed: str, table: str, partitions: list[str], reading: Reading
) -> None:
    """Record what the stored changes of `partitions` were read from (each partition's record
    replaces the one before, so it always describes the changes stored), under a mark of its own,
    and mark those whose reading has a hole (`readings_with_gaps`), or unmark them."""
    body = json.dumps(dataclasses.replace(reading, recorded=uuid.uuid4().hex).to_json()).encode()
    folder = reading_folder(layout, feed, table)
    each_request(lambda partition: storage.write_bytes(join(folder, f"{partition}.json"), body), partitions)
    gaps = reading_gaps_folder(layout, feed, table)
    if reading.gaps():
        each_request(
            lambda partition: storage.write_bytes(join(gaps, f"{partition}.json"), b"{}"), partitions
        )
        return
    marked = sorted({json_name(entry) for entry in json_files(storage, gaps)} & set(partitions))
    each_request(lambda partition: storage.delete_file(join(gaps, f"{partition}.json")), marked)


def readings_with_gaps(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    leaving_out: set[str],
    warn: Callable[[str], None],
) -> dict[str, Reading]:
    """The partitions (but `leaving_out`) whose stored changes were read with a hole in a
    stream, with their readings: one listing of their marks, which is mostly empty."""
    marked = [
        name
        for name in (
            json_name(entry) for entry in json_files(storage, reading_gaps_folder(layout, feed, table))
        )
        if name not in leaving_out
    ]

    def reading_of(partition: str) -> Reading | None:
        try:
            return read_reading(storage, layout, feed, table, partition)
        except DamagedLakeFile as damaged:  # one damaged record stops no run
            warn(
                f"{feed}/{table}: the reading of {partition} is not read, so no run asks it to fill its gap: {damaged}"
            )
            return None

    readings = each_request(reading_of, marked)
    return {
        partition: reading
        for partition, reading in zip(marked, readings, strict=True)
        if reading is not None and reading.gaps()
    }


def filling_gaps(readings: dict[str, Reading], parts: list[ByteRange]) -> dict[str, list[ByteRange]]:
    """Partition -> the `parts` (bytes of landed files) that fall in a hole of its reading (Flow:
    a fragment landing between bytes another hour read while it was missing). A file the reading
    set aside fills none: read again, it leaves the same hole."""
    filling: dict[str, list[ByteRange]] = {}
    for partition, reading in sorted(readings.items()):
        holes = reading.gaps()
        found = [
            part
            for part in parts
            if part.uri not in reading.set_aside and _overlaps(holes.get(part.stream, ()), part)
        ]
        if found:
            filling[partition] = found
    return filling


def holes_marked_before(
    storage: Storage, layout: LakeLayout, feed: str, table: str, partitions: list[str], reading: Reading
) -> bool:
    """Whether each of `partitions` is marked already (one listing) with a recorded reading
    whose holes hold every hole of `reading` and which set aside no file `reading` does not
    (read at once): a file filling those holes that landed since then was matched against the
    mark by its own run (`filling_gaps` leaves out only the files a reading set aside). A
    reading that cannot be read answers no."""
    marked = {json_name(entry) for entry in json_files(storage, reading_gaps_folder(layout, feed, table))}
    if not set(partitions) <= marked:
        return False

    def holds_the_holes(partition: str) -> bool:
        try:
            before = read_reading(storage, layout, feed, table, partition)
        except DamagedLakeFile:
            return False
        if before is None or not before.set_aside <= reading.set_aside:
            return False
        old = before.gaps()
        return all(
            any(start <= begin and end <= stop for start, stop in old.get(stream, ()))
            for stream, holes in reading.gaps().items()
            for begin, end in holes
        )

    return all(each_request(holds_the_holes, partitions))


def read_reading(
    storage: Storage, layout: LakeLayout, feed: str, table: str, partition: str
) -> Reading | None:
    """What the stored changes of `partition` were read from; None if not recorded."""
    uri = join(reading_folder(layout, feed, table), f"{partition}.json")
    return read_lake_json(storage, uri, Reading) if storage.exists(uri) else None


def read_partitions(storage: Storage, layout: LakeLayout, feed: str, table: str) -> set[str]:
    """The partitions whose changes have a reading recorded (one listing)."""
    return {json_name(entry) for entry in json_files(storage, reading_folder(layout, feed, table))}


@dataclasses.dataclass(frozen=True)
class AfterRemoval:
    """A request made once files the partition's stored changes may have been read from were
    removed: only a reading recorded since answers it. `reading` is the mark of the partition's
    reading when the request was made (None: it had none). Both are written under the table's
    lease, so a reading with another mark was read after the removal; no clocks are compared."""

    reading: str | None


class _RequestNote(TypedDict):
    reason: str
    parts: list[ByteRange]
    after: NotRequired[AfterRemoval]


def request_rerun(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    partition: str,
    reason: str,
    parts: list[ByteRange],
    after: AfterRemoval | None = None,
) -> RerunRequest:
    """Ask for `partition` to run again because its rows depend on `parts`, or on a read since
    a removal (`after`): a file of its own, so no request overwrites another."""
    body: dict = {"reason": reason, "parts": [dataclasses.asdict(p) for p in parts]}
    if after is not None:
        body["after"] = dataclasses.asdict(after)
    data = json.dumps(body, indent=1).encode()
    name = f"{time.time_ns() // 1_000_000}-{hashlib.blake2b(data, digest_size=6).hexdigest()}"
    uri = join(reruns_folder(layout, feed, table), partition, f"{name}.json")
    storage.write_bytes(uri, data)
    return RerunRequest(partition, reason, tuple(parts), uri, after)


def request_read_since_removal(
    storage: Storage, layout: LakeLayout, feed: str, table: str, partition: str, reason: str
) -> RerunRequest | None:
    """Ask for `partition` to run again because files its stored changes may have been read
    from were removed: answered only by a reading recorded after this request (`AfterRemoval`);
    None when a request standing already waits for a reading after the current one. The caller
    holds the table's lease."""
    try:
        reading = read_reading(storage, layout, feed, table, partition)
    except DamagedLakeFile:
        reading = None  # no mark: the partition's next reading answers it, and rewrites the damage
    after = AfterRemoval(reading.recorded if reading else None)
    standing = read_reruns(storage, layout, feed, table).get(partition, [])
    if any(request.after == after for request in standing):
        return None
    return request_rerun(storage, layout, feed, table, partition, reason, [], after)


def read_reruns(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    is_partition: Callable[[str], bool] = lambda _: True,
) -> dict[str, list[RerunRequest]]:
    """partition -> the requests standing for it (the folder is empty but for requests not yet
    answered). A folder named like no partition (`is_partition`, the feed format's test) was not
    made by a run: it is damage."""
    folders = [e for e in storage.list(reruns_folder(layout, feed, table)) if e.is_dir]
    for folder in folders:
        if not is_partition(folder.name):
            raise DamagedLakeFile(folder.uri, f"{folder.name!r} names no partition of the table")

    def read(partition_folder) -> list[RerunRequest]:
        def request(uri: str) -> RerunRequest:
            note = read_lake_json(storage, uri, _RequestNote)
            return RerunRequest(
                partition_folder.name, note["reason"], tuple(note["parts"]), uri, note.get("after")
            )

        return [request(entry.uri) for entry in json_files(storage, partition_folder.uri)]

    return {
        folder.name: found
        for folder, found in zip(folders, each_request(read, folders), strict=True)
        if found
    }


def asked(requests: dict[str, list[RerunRequest]]) -> dict[str, str]:
    """partition -> why it is to run again, in words."""
    return {
        partition: standing[0].reason
        + (f" (and {len(standing) - 1} more request(s))" if len(standing) > 1 else "")
        for partition, standing in requests.items()
    }


def withdraw_answered(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    partitions: list[str],
    warn: Callable[[str], None],
) -> list[RerunRequest]:
    """After a successful fold of `partitions`, withdraw the requests of each that its recorded
    reading answers: every part read or set aside, or its file gone (warned: nothing is left to
    read), and, for a request made after a removal, a reading recorded since (a read that took
    place before the removal still read the removed files). A request its reading does not
    answer stands. Returns those withdrawn."""
    standing = read_reruns(storage, layout, feed, table)
    withdrawn = []
    for partition in partitions:
        if partition not in standing:
            continue
        reading = read_reading(storage, layout, feed, table, partition) or Reading({})
        for request in standing[partition]:
            unread = [part for part in request.parts if not reading.answers(part)]
            gone = [part for part in unread if not storage.exists(part.uri)]
            if len(gone) < len(unread) or (
                request.after is not None and request.after.reading == reading.recorded
            ):
                continue
            for part in gone:
                warn(f"{feed}/{table}: {partition} was asked to read {part.uri}, which is gone")
            storage.delete_file(request.uri)
            withdrawn.append(request)
    return withdrawn
