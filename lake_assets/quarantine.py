"""Quarantine: a copy of each unusable landed file next to a JSON note saying why.

The landing area belongs to the vendor (and is often read-only to us), so the original stays
where it is; the copy and its reason are what an operator inspects. Re-running a partition writes
the same quarantine entry again, so retries do not multiply it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
from typing import TYPE_CHECKING

from typing_extensions import TypedDict

from lake_assets.errors import first_line
from lake_assets.paths import LakeLayout
from lake_assets.storage import FILE_ERRORS, Entry, Storage

if TYPE_CHECKING:
    from lake_assets.feeds.base import FeedFormat

#: what follows a quarantined copy's name in the name of its note
REASON_SUFFIX = ".reason.json"
#: the quarantine "partition" of files that belong to no partition (strays)
UNPARTITIONED = "_unpartitioned"


def notes_under(storage: Storage, folder: str) -> list[Entry]:
    """The quarantine notes under a folder. A `.reason.json` beside its own note
    (`<name>.reason.json.reason.json`) is the copy of a landed file of that name, quarantined
    before copies were renamed so: not a note."""
    entries = list(storage.walk_files(folder))
    uris = {entry.uri for entry in entries}
    return [e for e in entries if e.name.endswith(REASON_SUFFIX) and e.uri + REASON_SUFFIX not in uris]


class QuarantineNote(TypedDict):
    """What is read back of a quarantine note (it holds more: rows, run, time)."""

    file: str
    partition: str | None
    reason: str


@dataclasses.dataclass(frozen=True)
class Quarantined:
    uri: str
    reason: str
    rows: int | None = None
    #: the partition whose folder holds the file, from a reader that met it outside the run's
    #: catalog (a Flow fragment landed after the catalog step): the run files it there, so that
    #: the partition's next run withdraws it once the file reads
    partition: str | None = None


#: the longest name a quarantined copy keeps: with `REASON_SUFFIX` its note's name must stay
#: within the 255 bytes file systems and object stores allow a name
LONGEST_COPY_NAME = 200


def _safe_name(name: str) -> str:
    """The copy's name: the landed name in safe characters, cut to `LONGEST_COPY_NAME` (the
    extension kept; the folder named by the file's id keeps cut names apart), and never ending
    like a note, which would be taken for one."""
    cleaned = re.sub(r"[^A-Za-z0-9_.=+-]", "_", name).lstrip("._") or "file"
    cleaned = cleaned.replace("..", "_")
    if len(cleaned) > LONGEST_COPY_NAME:
        stem, dot, extension = cleaned.rpartition(".")
        extension = extension if dot and len(extension) <= 16 else ""
        cleaned = (
            f"{stem[: LONGEST_COPY_NAME - len(extension) - 1]}.{extension}"
            if extension
            else cleaned[:LONGEST_COPY_NAME]
        )
    cleaned = cleaned.replace("..", "_")  # again: the cut may have joined two dots
    if cleaned.endswith(REASON_SUFFIX):
        cleaned = cleaned[: -len(REASON_SUFFIX)] + "_" + REASON_SUFFIX[1:]
    return cleaned


def _file_id(uri: str) -> str:
    """A short id of a landed file's full URI: the same file always gets the same one."""
    return hashlib.blake2b(uri.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


def quarantine_copy(layout: LakeLayout, feed: str, table: str, partition: str, uri: str) -> str:
    """Where the quarantine copy of a landed file goes (its reason beside it, `.reason.json`)."""
    return f"{layout.quarantine(feed, table, partition)}/{_file_id(uri)}/{_safe_name(uri.rstrip('/').rsplit('/', 1)[-1])}"


def is_quarantined(
    storage: Storage, layout: LakeLayout, feed: str, table: str, partition: str, uri: str
) -> bool:
    return storage.exists(quarantine_copy(layout, feed, table, partition, uri) + REASON_SUFFIX)


def quarantine_file(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    partition: str,
    item: Quarantined,
    run_id: str | None,
) -> str:
    """Copy the file to `<lake>/_quarantine/<feed>/<table>/<partition>/<file id>/<name>`, beside
    `<name>.reason.json`.

    Names made safe can coincide (`bad x`, `bad_x`), and one partition can list two files of one
    name (`hour=05/part-0` and `hour=5/part-0`); the folder named by the file's id keeps each
    file's copy and reason apart, and the copy keeps its name.
    """
    target = quarantine_copy(layout, feed, table, partition, item.uri)
    try:
        storage.copy(item.uri, target)
    except FILE_ERRORS as exc:  # the file may be gone or unreadable; the note still records it
        item = dataclasses.replace(item, reason=f"{item.reason} (copy failed: {first_line(exc)})")
        # An earlier run's copy of the file's earlier bytes must not pass for this one: the
        # run leaves a file it could not copy out of its partition's processed note by it.
        storage.delete_file(target)
    note = {
        "file": item.uri,
        "reason": item.reason,
        "rows": item.rows,
        "feed": feed,
        "table": table,
        "partition": partition,
        "run_id": run_id,
        "quarantined_at": dt.datetime.now(dt.UTC).isoformat(),
    }
    storage.write_bytes(target + REASON_SUFFIX, json.dumps(note, indent=2).encode())
    return target


def unreported_strays(
    storage: Storage, layout: LakeLayout, fmt: FeedFormat, landing: str, feed: str, table: str
) -> list[tuple[Entry, str]]:
    """A table's stray files (with why no partition reads them) that no run has set aside yet:
    those of a table without partitions, or landed since its last run."""
    return [
        (entry, reason)
        for entry, reason in fmt.stray_files(storage, landing, table)
        if not is_quarantined(storage, layout, feed, table, UNPARTITIONED, entry.uri)
    ]
