"""Cataloguing the files lake_assets reads and writes: one datalake-common record per file.

`where` is the feed instance, `what` the table, `work_id` the run that read or wrote the file,
`start`/`end` the event-time span inside the file (Parquet footer statistics of its time column,
or what the format knows of a non-Parquet file), `hash` the blake2b-16 of its bytes.

A file's id is derived from its URL, so cataloguing the same file again replaces its records
rather than adding some. A landed file's id is derived from its content too: its vendor may
rewrite it in place, and each content keeps a record. A lake file is written once under a name
of its own (Spark's and the fold's file names are unique per write), so its URL alone is its
id: when the lake removes it (a partition written again, a purge rewrite, a fold replacing
current or merging closed files), its records are found from its URL and its span, read while
it still exists, and retired (`retirements`): the catalog never lists a file that is gone.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterable

from pyarrow.fs import FileType

from lake_assets.catalog.metadata import (
    BUCKET_MS,
    build_records,
    build_retirements,
    datetime_to_ms,
    document_time,
    hash_stream,
)
from lake_assets.catalog.store import CatalogStore
from lake_assets.errors import CatalogError, DamagedLakeFile
from lake_assets.paths import as_name
from lake_assets.storage import FILE_ERRORS, Entry, Storage, each_outcome, each_request, parquet_footer

CHUNK = 8 * 1024 * 1024


def catalog_what(table: str) -> str:
    """A table name as a datalake `what` (`paths.NAME`): `00Dxx/account` -> `00dxx-account`."""
    return as_name(table.replace("/", "-"))


def catalog_where(feed: str) -> str:
    return as_name(feed)


def catalog_work_id(run_id: str | None) -> str | None:
    return as_name(run_id) if run_id else None


def names_its_work(partition: str) -> bool:
    """Whether `partition` is spelled as its work id spells it. A work id is a name (lower case):
    a key typed in another case (`0A1`, a GRAX batch added by hand in the UI, where batches
    are keyed `0a1`) shares the work id of the key as landed, but none of its files are its own:
    it has no records, and a run of it catalogues and retires none."""
    return landing_work_id(partition) == f"landing-{partition}"


def landing_work_id(partition: str) -> str:
    """The work id of a landed file: the vendor's batch it arrived in (an hour or a batch key).

    Derived from the partition, not from the run that catalogued the file, so cataloguing a
    partition again finds and replaces the same records, and any run can ask for a partition's
    files by work id.
    """
    return as_name(f"landing-{partition}")


def absolute_path(uri: str) -> str:
    """The file's absolute path in its filesystem: `/abs/path` locally, `/bucket/key` on S3."""
    if uri.startswith("file://"):
        return "/" + uri[len("file://") :].lstrip("/")
    return "/" + uri.split("://", 1)[1]


#: Parquet TIMESTAMP units per millisecond
_PER_MS = {"milliseconds": 1, "microseconds": 1_000, "nanoseconds": 1_000_000}


def _statistic_ms(stats, raw: int) -> int | None:
    """A min or max statistic of a time column as ms since the epoch, read from its stored
    integer: exact, and defined for any value (pyarrow's own conversion to a datetime fails
    beyond the years 1 to 9999). None for a column that is not a date or timestamp."""
    logical = stats.logical_type
    if logical.type == "TIMESTAMP":
        return raw // _PER_MS[json.loads(logical.to_json())["timeUnit"]]
    if logical.type == "DATE":
        return raw * BUCKET_MS
    return None


def parquet_span(storage: Storage, uri: str, columns: Iterable[str]) -> tuple[int, int] | None:
    """(min, max) in ms of the first of `columns` the file has, from its footer statistics only.

    Any span is kept as it is (a row dated 9999 included): the catalog indexes any span. A
    file that is no Parquet, or gone, has none (a gone file is neither recorded nor retired).
    A failure to read it is tried once more, then raised: the span places the file's record,
    and a record and its retirement placed apart (one by the span, one by the modification
    time, for want of it) would leave the record of a removed file behind."""
    try:
        try:
            meta = parquet_footer(storage, uri)
        except FILE_ERRORS as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            meta = parquet_footer(storage, uri)  # most failures of a read pass
    except (DamagedLakeFile, FileNotFoundError):  # no footer, or no file: the caller falls back
        return None
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    for column in columns:
        if column not in names:
            continue
        index = names.index(column)
        lows, highs = [], []
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(index).statistics
            if stats is None or not stats.has_min_max:
                continue
            low, high = _statistic_ms(stats, stats.min_raw), _statistic_ms(stats, stats.max_raw)
            if low is not None and high is not None:
                lows.append(low)
                highs.append(high)
        if lows:
            return min(lows), max(highs)
    return None


@dataclasses.dataclass(frozen=True)
class CatalogFile:
    url: str
    where: str
    what: str
    work_id: str | None
    span: tuple[int, int] | None  # None: use the file's modification time
    landed: bool = False  # a vendor's file (its id follows its content), not one the lake wrote

    def file_id(self, digest: str | None) -> str:
        """The file's catalog id: from its URL, and for a landed file its content's `digest`."""
        if not self.landed:
            return uuid.uuid5(uuid.NAMESPACE_URL, self.url).hex
        if digest is None:
            raise CatalogError(f"{self.url}: a landed file's id needs the hash of its content")
        return uuid.uuid5(uuid.NAMESPACE_URL, f"{self.url}#{digest}").hex


def catalog_file(
    feed: str, table: str, run_id: str | None, url: str, span: tuple[int, int] | None, *, landed: bool = False
) -> CatalogFile:
    """A file read (`landed`) or written for a table of a feed by a run."""
    return CatalogFile(
        url=url,
        where=catalog_where(feed),
        what=catalog_what(table),
        work_id=catalog_work_id(run_id),
        span=span,
        landed=landed,
    )


def written_files(
    feed: str,
    table: str,
    run_id: str | None,
    storage: Storage,
    uris: Iterable[str],
    time_columns: tuple[str, ...],
) -> list[CatalogFile]:
    """Lake files a run wrote, each spanning the range of its first present time column."""
    uris = list(uris)
    spans = each_request(
        lambda uri: parquet_span(storage, uri, time_columns), uris, storage.requests_at_once_for(uris)
    )
    return [catalog_file(feed, table, run_id, uri, span) for uri, span in zip(uris, spans, strict=True)]


#: Modification times are coarse (S3 keeps whole seconds): a file modified up to this long before
#: its content was recorded may still have been rewritten after, so it is hashed again.
MTIME_SLACK_MS = 2_000


def unchanged_since_recorded(entry: Entry, size: int, recorded_ms: int) -> bool:
    """Whether a listed file still holds the content recorded at `recorded_ms` with `size`, as
    far as a listing can tell (same size, not modified since); if not, only its hash can say."""
    return (
        entry.size == size and entry.mtime_ms is not None and entry.mtime_ms <= recorded_ms - MTIME_SLACK_MS
    )


def hash_file(storage: Storage, url: str) -> str:
    """The catalog's hash of a file's bytes (blake2b-16, as datalake-common)."""
    with storage.open_input_file(url) as handle:
        return hash_stream(iter(lambda: handle.read(CHUNK), b""))


#: told of a file whose bytes could not be read to catalogue it, and why
Refused = Callable[["CatalogFile", Exception], None]


def record(
    store: CatalogStore, storage: Storage, files: list[CatalogFile], refused: Refused | None = None
) -> int:
    """Hash each file and put its records; returns how many files were recorded. A file whose
    bytes cannot be read fails the call, or, given `refused`, is told to it and left out."""
    at_once = storage.requests_at_once_for([item.url for item in files])
    outcomes = each_outcome(lambda item: _records_of_retried(storage, item), files, at_once)
    hashed = [records for records in outcomes if not isinstance(records, Exception)]
    try:
        for item, outcome in zip(files, outcomes, strict=True):
            if isinstance(outcome, Exception):
                if refused is None or not isinstance(outcome, FILE_ERRORS):
                    raise outcome
                refused(item, outcome)
    finally:  # what was hashed is kept: a run after a failure hashes only the rest
        if hashed:
            store.put([record for records in hashed for record in records])
    return len(hashed)


def _records_of_retried(storage: Storage, item: CatalogFile) -> list[dict]:
    """`_records_of`, asked once more after a failure: most failures of a read pass."""
    try:
        return _records_of(storage, item)
    except FILE_ERRORS:
        return _records_of(storage, item)


def _records_of(storage: Storage, item: CatalogFile) -> list[dict]:
    info = storage.file_info(item.url)
    digest = hash_file(storage, item.url)
    start, end = item.span or (datetime_to_ms(info.mtime), None)
    metadata = {
        "version": 0,
        "id": item.file_id(digest),
        "start": document_time(start),
        "end": None if end is None else document_time(end),
        "where": item.where,
        "what": item.what,
        "work_id": item.work_id,
        "hash": digest,
        "path": absolute_path(item.url),
    }
    return build_records(metadata, url=item.url, size=info.size or 0)


def retirements(storage: Storage, files: list[CatalogFile]) -> list[dict]:
    """The retirements (`CatalogStore.retire`) of lake files about to be removed: read now,
    while the files exist, for their span (which places their records); files already gone are
    left out (their retirement was read before they went)."""
    for item in files:
        if item.landed:
            raise CatalogError(f"{item.url}: the lake retires only files it wrote")

    def retirements_of(item: CatalogFile) -> list[dict]:
        info = storage.file_info(item.url)
        if info.type == FileType.NotFound:
            return []
        start, end = item.span or (datetime_to_ms(info.mtime), None)
        return build_retirements(
            url=item.url, where=item.where, what=item.what, file_id=item.file_id(None), start=start, end=end
        )

    at_once = storage.requests_at_once_for([item.url for item in files])
    return [retirement for found in each_request(retirements_of, files, at_once) for retirement in found]


def landed_record_versions(
    store: CatalogStore, feed: str, table: str, partitions: Iterable[str]
) -> dict[str, dict[str, list[dict]]]:
    """partition -> URL -> every record of each landed file of the partition, oldest first (one
    query). A file rewritten in place has a record per content, each of which is retired when
    the file is gone."""
    partitions = list(partitions)
    found = store.query_by_work_ids(
        [landing_work_id(p) for p in partitions], catalog_what(table), catalog_where(feed)
    )
    out: dict[str, dict[str, list[dict]]] = {}
    for partition in partitions:
        by_url: dict[str, list[dict]] = {}
        if names_its_work(partition):
            for record in found[landing_work_id(partition)]:
                by_url.setdefault(record["url"], []).append(record)
        out[partition] = {
            url: sorted(records, key=lambda r: r["create_time"]) for url, records in sorted(by_url.items())
        }
    return out


def landed_records(
    store: CatalogStore, feed: str, table: str, partitions: Iterable[str]
) -> dict[str, dict[str, dict]]:
    """partition -> URL -> the record of each landed file of the partition, as catalogued (one
    query): of a file rewritten in place, the newest record stands for it."""
    return newest_records(landed_record_versions(store, feed, table, partitions))


def newest_records(versions: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, dict]]:
    """`landed_record_versions` with each file's newest record alone."""
    return {
        partition: {url: records[-1] for url, records in by_url.items()}
        for partition, by_url in versions.items()
    }


def retire_landed(store: CatalogStore, records: Iterable[dict]) -> None:
    """Take the records of landed files that are gone out of the catalog."""
    store.retire(
        [
            retirement
            for r in records
            for retirement in build_retirements(
                url=r["url"],
                where=r["metadata"]["where"],
                what=r["metadata"]["what"],
                file_id=r["metadata"]["id"],
                start=r["metadata"]["start"],
                end=r["metadata"]["end"],
            )
        ]
    )


def catalogued_entries(records: dict[str, dict[str, dict]]) -> dict[str, list[Entry]]:
    """partition -> its landed files as the catalog lists them (`landed_records`), in name
    order; a run reads each file once."""
    return {
        partition: [
            Entry(uri=url, name=url.rsplit("/", 1)[-1], is_dir=False, size=int(record["size"]), mtime_ms=None)
            for url, record in by_url.items()
        ]
        for partition, by_url in records.items()
    }
