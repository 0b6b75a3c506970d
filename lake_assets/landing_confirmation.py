"""Whether the landed files a run read are still the versions it catalogued.

Spark reads a landed file after the run catalogued it, and again whenever it loses the
batch's cached blocks, so a file rewritten in place, or gone, while a run is under way could
give the lake rows of a version the catalog does not hold. The steps ask these functions before
they record anything, and fail with `LandingChanged` instead (docs/bad-input.md). The pipeline's
steps call each function at its point of the run, so they are public; no Dagster.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame

from lake_assets import lake_io, processed
from lake_assets.catalog.files import hash_file, unchanged_since_recorded
from lake_assets.errors import LandingChanged
from lake_assets.storage import Entry, Storage, each_request

if TYPE_CHECKING:
    from lake_assets.pipeline import TableWork


def confirm_unchanged(
    work: TableWork, read_from: dict[str, dict[str, processed.ProcessedFile]], step: str
) -> None:
    """Raise `LandingChanged` when a landed file a change batch was read from (`read_from`: the
    catalog's records of it, by partition) no longer holds the content its record describes.

    Spark reads a landed file after the run catalogued it, and reads it again whenever it loses
    the batch's cached blocks (an executor lost, with its shuffle files): the step that uses the
    batch then (the change log's write, the fold) reads the file as it is by then. Rewritten in
    place meanwhile, it would give the lake another version's rows while the notes name the one
    catalogued. Asked after a step's last use of the batch and before it records its partitions
    stored or folded, this fails the step instead, and the next run catalogues the landing as it
    is then. A file gone is not asked about (the next run sees it gone); one written since the
    run began to read it (`ProcessedFile.read_mtime_ms`) is changed whatever it holds now; one
    whose listing cannot tell otherwise (the same size, modified after or just before its
    record) is hashed. A format whose batch does not reach back to the landed files
    (`batch_rereads_landing`) is not asked."""
    files = {url: note for notes in read_from.values() for url, note in notes.items()}
    if not files or not work.fmt.batch_rereads_landing:
        return
    now = work.storage.files_now(files)
    present = [(url, note) for url, note in sorted(files.items()) if url in now]
    hashed_if_need_be = each_request(
        lambda item: _changed(work, now[item[0]], item[1]),
        present,
        work.storage.requests_at_once(work.feed.landing),
    )
    changed = [url for (url, _), is_changed in zip(present, hashed_if_need_be, strict=True) if is_changed]
    if changed:
        raise LandingChanged(
            f"{work.feed.name}/{work.table}: {changed[0]}{f' (and {len(changed) - 1} more)' if changed[1:] else ''} "
            f"changed after the run catalogued it (found while {step}): rows may have been read from a "
            "version the catalog does not hold, so the run records none of its partitions done; the "
            "next run catalogues the landing as it is then (run it again once the vendor has "
            "finished rewriting the files)"
        )


def _changed(work: TableWork, entry: Entry, note: processed.ProcessedFile) -> bool:
    """Whether a listed landed file may no longer hold, or may not have held while the run read
    it, the content `note` records. A file written since the run began to read it (its
    modification time is not the one listed then, both by the store's clock) counts as changed
    even when it holds the recorded bytes again: a delivery made again in place (a truncation,
    a placeholder or a removal, then the same bytes) could have been read half way."""
    if entry.size != note.size:
        return True
    if note.read_mtime_ms is not None and entry.mtime_ms != note.read_mtime_ms:
        return True
    if unchanged_since_recorded(entry, note.size, note.recorded_ms):
        return False
    try:
        return hash_file(work.storage, entry.uri) != note.hash
    except FileNotFoundError:  # gone since the listing: the next run sees it gone
        return False


def listed_before_the_read(work: TableWork, catalogued: dict[str, list[Entry]]) -> dict[str, Entry]:
    """The catalogued files as their store lists them just before the batch is read: what
    `confirm_unchanged` compares their modification times with, the store's clock
    against itself. A file gone by then raises `LandingChanged` (written again before the read
    ends, it could be read half way and then pass its hash). Only for a format whose batch
    reaches back to the landed files."""
    if not work.fmt.batch_rereads_landing:
        return {}
    uris = [entry.uri for entries in catalogued.values() for entry in entries]
    listed = work.storage.files_now(uris)
    for uri in uris:
        if uri not in listed:
            raise gone_under_the_run(uri)
    return listed


def unless_any_is_gone(storage: Storage, uris: list[str]) -> None:
    """Raise `LandingChanged` when one of the files the run catalogued and then set aside is gone
    (whichever read found it so: its footer's, Spark's, a journal's): set aside, it would leave
    its partition's changes without its rows and no copy of it, and a share that dropped
    between the catalog step and the read looks like that. (A failure that may pass, a timeout,
    is raised by the store's answer; a file its store refuses for good is set aside as before.)"""
    for uri in uris:
        if isinstance(storage.refusal_to_read(uri), FileNotFoundError):
            raise gone_under_the_run(uri)


def gone_under_the_run(uri: str) -> LandingChanged:
    return LandingChanged(
        f"{uri} was catalogued by this run but is gone now: the landing changed under the run "
        "(a share unmounted, a file removed); nothing of the table was written, and the next run "
        "catalogues the landing as it is then"
    )


def confirmation_for(
    work: TableWork, batch: DataFrame, partitions: Collection[str], step: str
) -> Callable[[], None] | None:
    """For the run's own batch (handed over in memory, its lineage the landed files, which
    Spark reads again when it loses the cached blocks): `confirm_unchanged` against the
    versions its changes were stored from. None for a batch read back from the change log."""
    if not (partitions and work.fmt.batch_rereads_landing and lake_io.is_cached(batch)):
        return None

    def confirm() -> None:
        stored, _ = processed.read_stored_notes(
            work.storage, work.layout, work.feed.name, work.table, list(partitions), work.run_id
        )
        confirm_unchanged(work, stored, step)

    return confirm
