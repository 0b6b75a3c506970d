"""Where datalake records are kept and how they are found again: the rules every store keeps.

A record (`lake_assets.catalog.metadata`) describes one file in one time bucket: a file whose
data spans three days has three records with the same `range_key`, one per day; a file spanning
more than 30 days has at most 30, in wider buckets (see `metadata`). Two stores keep them, each
in a module of its own on `CatalogStore`:

* `parquet_store.ParquetCatalogStore`: Parquet files in the lake itself, readable by any engine;
* `dynamodb_store.DynamoCatalogStore`: the original datalake index in DynamoDB.

Both answer the same queries the same way. The shared rules live here, in `CatalogStore` and
the helpers below it; a store only reads and writes its own medium:

* `put` replaces a record with the same `(time_index_key, range_key)` when the new one has a
  `create_time` at least as great (ties: the last written wins). Putting the same records again
  changes nothing.
* A time query looks in the buckets `metadata.query_buckets(start, end)` (each day, and the
  wider buckets overlapping the range), keeps records whose file span
  `[metadata.start, metadata.end or metadata.start]` touches `[start, end]` (inclusive), and
  returns each file once: the record from the earliest bucket looked in. Results are sorted by
  `(metadata.start, range_key)`.
* A work-id query returns each file once, same order; files whose work_id is null are never
  returned (their index key holds a random stand-in, not a work id).
* `latest` returns a record of the file with the greatest `metadata.start` for `what:where`
  (ties: greatest `create_time`, then the last written); of a file's records, `put` offers the
  one from its first bucket.
* `retire` takes a file that is gone out of the catalog: a retirement names each of its
  records' keys with a `create_time`; the records put no later are left out of all four
  queries (DynamoDB deletes them, Parquet keeps the retirement as a row marked `deleted`), and
  when the latest file goes, the latest remaining one is searched for (Parquet: the bucket
  folders from the latest down; DynamoDB: a scan of the records table). The path is rare: a
  change-log write records its new files before it retires the old ones, and the files a fold
  replaces (current, history) start at their oldest version, so they are seldom the latest.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from lake_assets.catalog.metadata import (
    BUCKET_MS,
    LAST_INDEXED_MS,
    bucket_and_what,
    bucket_days,
    query_buckets,
    range_key,
    span_buckets,
    work_id_index_key,
)
from lake_assets.errors import CatalogError
from lake_assets.paths import NAME, is_name
from lake_assets.storage import each_request

#: the fields of a record as the datalake format has them (a store keeps any others too)
RECORD_FIELDS = (
    "version",
    "url",
    "time_index_key",
    "work_id_index_key",
    "range_key",
    "create_time",
    "size",
    "metadata",
)
_RETIREMENT_FIELDS = ("url", "time_index_key", "range_key", "create_time", "metadata", "deleted")


# --------------------------------------------------------------------------------------------
# checking records and retirements


def _check_name(field: str, value: Any) -> str:
    if not is_name(value):
        raise CatalogError(f"{field} {value!r} must match {NAME.pattern}")
    return value


def _check_ms(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CatalogError(f"{field} {value!r} must be an integer number of milliseconds")
    return value


def _check_scope(what: str, where: str | None) -> None:
    """The what (and where, if given) a query is asked for."""
    _check_name("what", what)
    if where is not None:
        _check_name("where", where)


def check_record(record: Any) -> dict:
    """Refuse a record whose index keys disagree with its metadata; return it unchanged."""
    what = _check_keys(record, RECORD_FIELDS)
    if record.get("deleted"):
        raise CatalogError("a record marked deleted is a retirement: give it to retire(), not put()")
    _check_ms("size", record["size"])
    work_key = record["work_id_index_key"]
    work_id = record["metadata"].get("work_id")
    if not isinstance(work_key, str):
        raise CatalogError("work_id_index_key must be a string")
    if work_id is None:
        if not (
            work_key.startswith("null")
            and work_key.endswith(f":{what}")
            and ":" not in work_key[: -len(what) - 1]
        ):
            raise CatalogError(
                f"work_id_index_key {work_key!r} must be 'null<random>:{what}' for a null work_id"
            )
    elif work_key != work_id_index_key(_check_name("metadata.work_id", work_id), what):
        raise CatalogError(f"work_id_index_key {work_key!r} must be '{work_id}:{what}'")
    return record


def check_retirement(record: Any) -> dict:
    """Refuse a retirement (`metadata.build_retirements`) whose keys are not those of its file's
    records; return it unchanged."""
    _check_keys(record, _RETIREMENT_FIELDS)
    if record["deleted"] is not True:
        raise CatalogError("a retirement is marked deleted: True")
    return record


def _check_keys(record: Any, fields: tuple[str, ...]) -> str:
    """Check the fields a record and a retirement share (the index keys against the metadata's
    what, where, id, start and end, and create_time); return the record's what."""
    if not isinstance(record, dict):
        raise CatalogError(f"a record must be a dict, not {type(record).__name__}")
    missing = [f for f in fields if f not in record]
    if missing:
        raise CatalogError(f"record is missing {', '.join(missing)}")
    meta = record["metadata"]
    if not isinstance(meta, dict):
        raise CatalogError("record metadata must be a dict")
    what = _check_name("metadata.what", meta.get("what"))
    where = _check_name("metadata.where", meta.get("where"))
    start = _check_ms("metadata.start", meta.get("start"))
    end = meta.get("end")
    if end is not None:
        _check_ms("metadata.end", end)
        if end < start:
            raise CatalogError(f"metadata.end {end} is before metadata.start {start}")
    if not isinstance(meta.get("id"), str) or not meta["id"]:
        raise CatalogError("metadata.id must be a non-empty string")
    _check_ms("create_time", record["create_time"])

    key = record["time_index_key"]
    bucket, key_what = bucket_and_what(key) if isinstance(key, str) else ("", "")
    if key_what != what:
        raise CatalogError(f"time_index_key {key!r} must be '<bucket>:{what}'")
    indexed = span_buckets(start, end if end is not None else start)
    if bucket not in indexed:
        raise CatalogError(
            f"time_index_key {key!r}: not one of the file's buckets {indexed[0]}..{indexed[-1]}"
        )

    if record["range_key"] != range_key(where, meta["id"]):
        raise CatalogError(f"range_key {record['range_key']!r} must be '{where}:<id>'")
    return what


# --------------------------------------------------------------------------------------------
# what the stores share when they read records back


def what_where_key(what: str, where: str) -> str:
    """The key a store finds the latest file of a what:where by."""
    return f"{what}:{where}"


def winners(records: Iterable[dict]) -> dict[tuple[str, str], dict]:
    """One record per (time_index_key, range_key): the greatest create_time, then the last seen."""
    out: dict[tuple[str, str], dict] = {}
    for record in records:
        key = (record["time_index_key"], record["range_key"])
        held = out.get(key)
        if held is None or record["create_time"] >= held["create_time"]:
            out[key] = record
    return out


def live(records: Iterable[dict]) -> Iterator[dict]:
    """The records that are not retirements."""
    return (r for r in records if not r.get("deleted"))


def is_retired(record: dict, files: dict[str, int]) -> bool:
    """Whether `files` (range_key -> when retired) retire this record (put no later)."""
    return record["create_time"] <= files.get(record["range_key"], -1)


def _bucket_of(record: dict) -> int:
    """The first day of the record's bucket: buckets in time order."""
    return bucket_days(bucket_and_what(record["time_index_key"])[0])[0]


def _span(record: dict) -> tuple[int, int]:
    meta = record["metadata"]
    start = meta["start"]
    end = meta.get("end")
    return start, (end if end is not None else start)


def _one_per_file(records: Iterable[dict]) -> list[dict]:
    """Each file once (its record from the earliest bucket), sorted by (start, range_key)."""
    files: dict[str, dict] = {}
    for record in records:
        held = files.get(record["range_key"])
        if held is None or _bucket_of(record) < _bucket_of(held):
            files[record["range_key"]] = record
    return sorted(files.values(), key=lambda r: (r["metadata"]["start"], r["range_key"]))


def latest_order(record: dict) -> tuple[int, int]:
    """How files compare for latest: their start, then create_time."""
    return record["metadata"]["start"], record["create_time"]


def latest_rank(record: dict) -> tuple:
    """How a record ranks as the latest: its file's `latest_order`, then (of one file's records)
    the one from its first bucket, so that every way of offering it offers the same."""
    return latest_order(record), -_bucket_of(record)


def best_for_latest(records: Iterable[dict], held: dict | None = None) -> dict | None:
    """The best of `records` by `latest_rank`, or `held` when none beats it (ties: the first)."""
    return max(itertools.chain([held] if held is not None else [], records), key=latest_rank, default=None)


def latest_start_in(bucket: str) -> float:
    """The greatest start a record in this bucket may have: the bucket's last ms, but no bound
    for a bucket holding the calendar's last day (files starting after it are indexed there)."""
    first, width = bucket_days(bucket)
    last_ms = (first + width) * BUCKET_MS - 1
    return float("inf") if last_ms >= LAST_INDEXED_MS else last_ms


class CatalogStore(abc.ABC):
    """Datalake records, found by time bucket, by work id, or as the latest file of what:where."""

    def put(self, records: list[dict]) -> None:
        records = [check_record(r) for r in records]
        if not records:
            return
        batch = list(winners(records).values())
        latest: dict[tuple[str, str], dict] = {}
        for record in batch:
            meta = record["metadata"]
            key = (meta["what"], meta["where"])
            held = latest.get(key)
            if held is None or latest_rank(record) >= latest_rank(held):
                latest[key] = record
        self._put(batch, latest)

    def retire(self, retirements: list[dict]) -> None:
        """Take files that are gone out of the catalog (`metadata.build_retirements`).

        Each retirement holds the keys of one of a file's records; a record put with a
        create_time up to the retirement's is left out of the four queries from then on (a
        record put later, of a file written again, is not). When the latest file of a what:where
        goes, the latest remaining one takes its place."""
        retirements = [check_retirement(r) for r in retirements]
        if not retirements:
            return
        batch = list(winners(retirements).values())
        self._retire(batch)
        gone: dict[tuple[str, str], dict[str, int]] = {}
        for retirement in batch:
            meta = retirement["metadata"]
            files = gone.setdefault((meta["what"], meta["where"]), {})
            files[retirement["range_key"]] = max(
                files.get(retirement["range_key"], 0), retirement["create_time"]
            )
        for (what, where), files in gone.items():
            held = self.latest(what, where)
            self._forget_latest(what, where, files)
            if held is not None and is_retired(held, files):
                self._replace_latest(what, where, held, self._latest_remaining(what, where))

    def query_by_time(self, start: int, end: int, what: str, where: str | None = None) -> list[dict]:
        _check_ms("start", start)
        _check_ms("end", end)
        if end < start:
            raise CatalogError(f"end {end} is before start {start}")
        _check_scope(what, where)
        found = []
        for bucket in query_buckets(start, end):
            for record in live(self._time_bucket(bucket, what, where)):
                first, last = _span(record)
                if first <= end and last >= start:
                    found.append(record)
        return _one_per_file(found)

    def query_by_work_id(self, work_id: str, what: str, where: str | None = None) -> list[dict]:
        return self.query_by_work_ids([work_id], what, where)[work_id]

    def query_by_work_ids(
        self, work_ids: Iterable[str], what: str, where: str | None = None
    ) -> dict[str, list[dict]]:
        """`query_by_work_id` for several work ids at once (a run over many partitions asks
        for each partition's files); a store may share reads between them."""
        work_ids = list(dict.fromkeys(work_ids))
        for work_id in work_ids:
            _check_name("work_id", work_id)
        _check_scope(what, where)
        found = self._work_ids([work_id_index_key(w, what) for w in work_ids], where)
        return {
            work_id: _one_per_file(
                r
                for r in live(found[work_id_index_key(work_id, what)])
                if r["metadata"].get("work_id") is not None
            )
            for work_id in work_ids
        }

    def latest(self, what: str, where: str) -> dict | None:
        """The record of the file with the greatest metadata.start for what:where, or None."""
        _check_name("what", what)
        _check_name("where", where)
        return self._latest(what, where)

    # store-specific parts ---------------------------------------------------------------------

    @abc.abstractmethod
    def _put(self, records: list[dict], latest: dict[tuple[str, str], dict]) -> None:
        """Store checked records (one per key) and offer each (what, where)'s best as latest."""

    @abc.abstractmethod
    def _retire(self, retirements: list[dict]) -> None:
        """Take out the records these checked retirements (one per key) name, unless put later."""

    @abc.abstractmethod
    def _latest(self, what: str, where: str) -> dict | None:
        """`latest` for a checked what and where."""

    @abc.abstractmethod
    def _latest_remaining(self, what: str, where: str) -> dict | None:
        """The best record for latest (`best_for_latest`) among the files of what:where still
        catalogued (a search of the store: called only when the latest file goes)."""

    @abc.abstractmethod
    def _replace_latest(self, what: str, where: str, retired: dict, best: dict | None) -> None:
        """Put `best` (or nothing) in place of the latest record `retired`, unless another has
        taken its place meanwhile."""

    def _forget_latest(  # noqa: B027 - an optional hook: most stores keep nothing to drop
        self, what: str, where: str, files: dict[str, int]
    ) -> None:
        """Drop what the store keeps of these retired files (range_key -> retired at) as
        candidates for latest; a store that keeps only the latest itself has nothing to drop."""

    @abc.abstractmethod
    def _time_bucket(self, bucket: str, what: str, where: str | None) -> Iterable[dict]:
        """The current records whose time_index_key is `metadata.time_index_key(bucket, what)`
        (and where, if given); with a store that keeps retirements, those too (marked deleted)."""

    @abc.abstractmethod
    def _work_id(self, work_id_index_key: str, where: str | None) -> Iterable[dict]:
        """The current records with this work_id_index_key (and where, if given)."""

    def _work_ids(self, work_id_index_keys: list[str], where: str | None) -> dict[str, list[dict]]:
        """`_work_id` of each key, several asked at a time (a backfill asks for one per hour)."""
        found = each_request(lambda key: list(self._work_id(key, where)), work_id_index_keys)
        return dict(zip(work_id_index_keys, found, strict=True))
