"""The catalog as Parquet files in the lake: `ParquetCatalogStore`, readable by any engine.

The rules it keeps (what a put replaces, what each query returns, what a retirement takes out)
are `lake_assets.catalog.store`'s; this module only lays records out as part files and reads
them back.
"""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lake_assets.catalog.metadata import bucket_and_what
from lake_assets.catalog.store import (
    RECORD_FIELDS,
    CatalogStore,
    best_for_latest,
    is_retired,
    latest_order,
    latest_start_in,
    live,
    what_where_key,
    winners,
)
from lake_assets.errors import CatalogError, DamagedLakeFile, first_line
from lake_assets.paths import is_s3, safe_segment
from lake_assets.storage import FILE_ERRORS, Storage, each_request

#: the folder name of a time bucket's records, before the bucket's label
_TIME_FOLDER = "time_bucket="
#: parts a time or work-id folder may hold before a put merges them into one: every hourly run
#: adds a few, and every query reads them all (docs/lake-layout.md, "The catalog")
MERGE_PARTS_AT = 16
#: marks a merged part: its name is the last merged part's token, this, then a random part
_MERGED = "~merged"
#: how often a read starts a folder again when a part listed in it is gone (merged meanwhile)
_READ_ATTEMPTS = 5

_KEPT = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def encode_segment(value: str) -> str:
    """An injective, path-safe spelling of any string: other characters become `+hh` per byte."""
    return "".join(c if c in _KEPT else "".join(f"+{b:02x}" for b in c.encode("utf-8")) for c in value)


_SCHEMA = pa.schema(
    [
        ("version", pa.int64()),
        ("url", pa.string()),
        ("time_index_key", pa.string()),
        ("work_id_index_key", pa.string()),
        ("range_key", pa.string()),
        ("create_time", pa.int64()),
        ("size", pa.int64()),
        ("meta_version", pa.int64()),
        ("meta_start", pa.int64()),
        ("meta_end", pa.int64()),
        ("meta_where", pa.string()),
        ("meta_what", pa.string()),
        ("meta_work_id", pa.string()),
        ("meta_id", pa.string()),
        ("meta_hash", pa.string()),
        ("meta_path", pa.string()),
        ("metadata_json", pa.string()),
        # top-level record fields beyond the format's own, as JSON (null when there are none)
        ("extra_json", pa.string()),
        # true in a retirement: the file of these keys is gone (null in a record)
        ("deleted", pa.bool_()),
    ]
)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _to_row(record: dict) -> dict:
    meta = record["metadata"]
    extra = {k: v for k, v in record.items() if k not in RECORD_FIELDS and k != "deleted"}
    return {
        "version": record["version"],
        "url": record["url"],
        "time_index_key": record["time_index_key"],
        "work_id_index_key": record["work_id_index_key"],
        "range_key": record["range_key"],
        "create_time": record["create_time"],
        "size": record["size"],
        "meta_version": _int_or_none(meta.get("version")),
        "meta_start": meta["start"],
        "meta_end": meta.get("end"),
        "meta_where": meta["where"],
        "meta_what": meta["what"],
        "meta_work_id": _str_or_none(meta.get("work_id")),
        "meta_id": meta["id"],
        "meta_hash": _str_or_none(meta.get("hash")),
        "meta_path": _str_or_none(meta.get("path")),
        "metadata_json": json.dumps(meta, sort_keys=True, separators=(",", ":")),
        "extra_json": json.dumps(extra, sort_keys=True, separators=(",", ":")) if extra else None,
        "deleted": True if record.get("deleted") else None,
    }


def _from_row(row: dict) -> dict:
    record = {
        "version": row["version"],
        "url": row["url"],
        "time_index_key": row["time_index_key"],
        "work_id_index_key": row["work_id_index_key"],
        "range_key": row["range_key"],
        "create_time": row["create_time"],
        "size": row["size"],
        "metadata": json.loads(row["metadata_json"]),
    }
    if row.get("extra_json"):
        record.update(json.loads(row["extra_json"]))
    if row.get("deleted"):
        record["deleted"] = True
    return record


class _PartGone(CatalogError):
    """A part listed in a folder was removed before it was read (merged, or beaten as latest).
    Caught in this module: every reader lists the folder again or passes over the part."""

    def __init__(self, uri: str, cause: OSError):
        super().__init__(uri)
        self.uri, self.cause = uri, cause


def _merged_name(last_part: str) -> str:
    """A new name for the part that merges a folder's parts up to `last_part`: it sorts right
    after that part and before any part written later (tokens grow), so "the last read wins"
    among rows of one create_time stays as it was. It is never a name in use: two processes
    merging at once, each from its own listing, must not write over each other's rows."""
    stem = last_part.rsplit("/", 1)[1].removesuffix(".parquet").split("~")[0]
    return f"{stem}{_MERGED}-{uuid.uuid4().hex[:16]}.parquet"


def _grouped(records: list[dict], field: str) -> list[tuple[str, list[dict]]]:
    """The records by the value of `field`, in order of that value (one part per group)."""
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(record[field], []).append(record)
    return sorted(groups.items())


class ParquetCatalogStore(CatalogStore):
    """Records as Parquet files in the lake.

    Layout under `root` (every part file is written once and never changed; once a time or
    work-id folder holds `MERGE_PARTS_AT` parts, a put merges them into one, `_merge_parts`):

    * `time_bucket=<bucket>/<what>/part-<token>.parquet`: one file per put call per
      (bucket, what); a time query for a bucket and a what reads only that folder. A bucket is
      named as in its records' time_index_key: `19783` (a day), `19770+30` (a wider bucket).
    * `work_id=<encoded work_id_index_key>/part-<token>.parquet`: the same records again, by
      work id (records with a null work_id are not written here).
    * `latest=<encoded what:where>/part-<token>.parquet`: one record per put call per
      (what, where), the best of the call; parts beaten by a newer one are removed, and so are
      parts of a file that is gone.

    A file that is gone is retired by a part in each of its time folders whose rows hold its
    keys, `deleted` true and a later create_time: the rows of a time folder, winners taken per
    key, are what is catalogued there (an engine reading the folders keeps, per key, the row of
    the greatest create_time and leaves out those marked deleted).

    Columns: the record's fields, the metadata flattened into `meta_*` columns for other
    engines, and the whole metadata as JSON (`metadata_json`), which is what is read back.
    Tokens sort in write order (nanosecond clock, then a random part), so "the last written"
    is the part with the greatest name; among writers on different machines this is as good as
    their clocks. The time layout is the truth: a work-id hit is checked against it, so a
    record re-put with another work id is no longer found under the old one.
    """

    _token_lock = threading.Lock()
    _last_ns = 0
    merge_parts_at = MERGE_PARTS_AT

    def __init__(self, root: str, storage: Storage):
        if not (root.startswith("file:///") or is_s3(root)):
            raise CatalogError(f"catalog root {root!r} must be a file:/// or s3a:// URI")
        self.root = root.rstrip("/")
        self.storage = storage

    # paths ------------------------------------------------------------------------------------

    def _time_folder(self, bucket: str, what: str) -> str:
        return f"{self.root}/{safe_segment(_TIME_FOLDER + bucket)}/{safe_segment(what, 'what')}"

    def _work_folder(self, work_id_index_key: str) -> str:
        return f"{self.root}/{safe_segment('work_id=' + encode_segment(work_id_index_key))}"

    def _latest_folder(self, what: str, where: str) -> str:
        return f"{self.root}/{safe_segment('latest=' + encode_segment(what_where_key(what, where)))}"

    @classmethod
    def _token(cls) -> str:
        with cls._token_lock:
            ns = max(time.time_ns(), cls._last_ns + 1)
            cls._last_ns = ns
        return f"{ns:020d}-{uuid.uuid4().hex[:16]}"

    # reading and writing part files -----------------------------------------------------------

    def _write_part(self, folder: str, records: list[dict], token: str) -> str:
        return self._write_rows(f"{folder}/part-{token}.parquet", records)

    def _write_rows(self, uri: str, records: Iterable[dict]) -> str:
        table = pa.Table.from_pylist([_to_row(r) for r in records], schema=_SCHEMA)
        sink = io.BytesIO()
        pq.write_table(table, sink)
        self.storage.write_bytes(uri, sink.getvalue())  # whole or absent
        return uri

    def _parts(self, folder: str) -> list[str]:
        names = [
            e
            for e in self.storage.list(folder)
            if not e.is_dir and e.name.startswith("part-") and e.name.endswith(".parquet")
        ]
        return [e.uri for e in sorted(names, key=lambda e: e.name)]

    def _read_part(self, uri: str, where: str | None = None) -> list[dict]:
        try:
            data = self.storage.read_bytes(uri)
        except OSError as failure:
            if not self.storage.exists(uri):
                raise _PartGone(uri, failure) from None
            raise  # a failure to read a part that is there is raised as it is: not damage
        try:
            table = pq.read_table(pa.BufferReader(data))
        except FILE_ERRORS as exc:
            raise DamagedLakeFile(
                uri,
                first_line(exc),
                remedy="restore it from a copy (a catalog part holds records of many tables: no table's rebuild replaces it)",
            ) from exc
        if where is not None:
            table = table.filter(pc.equal(table["meta_where"], where))
        return [_from_row(row) for row in table.to_pylist()]

    def _read_part_unless_gone(self, uri: str) -> list[dict]:
        """The rows of a part, none if another process removed it since it was listed."""
        try:
            return self._read_part(uri)
        except _PartGone as gone:
            self._unless_still_listed(gone)
            return []

    def _unless_still_listed(self, gone: _PartGone) -> list[str]:
        """The folder's parts listed again; a part listed still, though it could not be read, was
        not merged away (a broken link, a listing behind the store): its read error is raised."""
        parts = self._parts(gone.uri.rsplit("/", 1)[0])
        if gone.uri in parts:
            raise gone.cause
        return parts

    def _read_folder(self, folder: str, where: str | None = None) -> list[dict]:
        """The rows of every part of `folder`, in part order. Another process may merge the
        parts between the listing and the reads: the folder is then listed and read again."""
        parts = self._parts(folder)
        for _ in range(_READ_ATTEMPTS):
            try:
                return [record for uri in parts for record in self._read_part(uri, where)]
            except _PartGone as gone:
                parts = self._unless_still_listed(gone)
        raise CatalogError(f"{folder}: its parts kept changing while they were read; try again")

    def _merge_parts(self, folder: str) -> None:
        """Merge the parts of `folder` into one once it holds `merge_parts_at`: the winning row of
        each key (retirements too), so any reader finds what it found before. The merged part is
        written whole before the parts it replaces are removed; a process killed between leaves
        rows twice, which readers take once (`winners`), and the next merge takes in. A part it
        cannot read leaves the folder as it is: merging is an economy, the put must not fail."""
        parts = self._parts(folder)
        if len(parts) < self.merge_parts_at:
            return
        try:
            rows = [record for uri in parts for record in self._read_part(uri)]
        except (_PartGone, DamagedLakeFile, OSError):
            return  # merged meanwhile by another process, or a part a query will name
        merged = self._write_rows(f"{folder}/{_merged_name(parts[-1])}", winners(rows).values())
        for uri in parts:
            if uri != merged:
                self.storage.delete_file(uri)

    # CatalogStore -----------------------------------------------------------------------------

    def _write_parts(self, parts: Iterable[tuple[str, list[dict]]], token: str) -> None:
        """A part of `token` in each folder (folder -> its records), each folder merged after
        (`_merge_parts`); on a remote store the folders several at a time
        (`Storage.requests_at_once`): a backfill's records fall in a work-id folder per hour,
        each a request or more."""

        def write(part: tuple[str, list[dict]]) -> None:
            folder, records = part
            self._write_part(folder, records, token)
            self._merge_parts(folder)

        each_request(write, parts, self.storage.requests_at_once(self.root))

    def _write_time_parts(self, records: list[dict], token: str) -> None:
        """One part per time folder the records (or retirements) fall in."""
        self._write_parts(
            (
                (self._time_folder(*bucket_and_what(key)), group)
                for key, group in _grouped(records, "time_index_key")
            ),
            token,
        )

    def _put(self, records: list[dict], latest: dict[tuple[str, str], dict]) -> None:
        token = self._token()
        # the time layout first: it is the truth the others are checked against
        self._write_time_parts(records, token)
        with_work_id = [r for r in records if r["metadata"].get("work_id") is not None]
        self._write_parts(
            ((self._work_folder(key), group) for key, group in _grouped(with_work_id, "work_id_index_key")),
            token,
        )
        for (what, where), record in sorted(latest.items()):
            self._offer_latest(what, where, record, token)

    def _retire(self, retirements: list[dict]) -> None:
        self._write_time_parts(retirements, self._token())

    def _latest_remaining(self, what: str, where: str) -> dict | None:
        # The buckets from the latest down: a record's start is at most its bucket's end, so
        # once the best found starts after the next bucket ends, nothing below can beat it.
        buckets = sorted(
            (
                e.name.removeprefix(_TIME_FOLDER)
                for e in self.storage.list(self.root)
                if e.is_dir and e.name.startswith(_TIME_FOLDER)
            ),
            key=latest_start_in,
            reverse=True,
        )
        best = None
        for bucket in buckets:
            if best is not None and best["metadata"]["start"] > latest_start_in(bucket):
                break
            best = best_for_latest(live(self._time_bucket(bucket, what, where)), best)
        return best

    def _forget_latest(self, what: str, where: str, files: dict[str, int]) -> None:
        # A part offered after a better one stays until beaten: it must not outlive its file.
        for uri in self._parts(self._latest_folder(what, where)):
            if all(is_retired(r, files) for r in self._read_part_unless_gone(uri)):
                self.storage.delete_file(uri)

    def _replace_latest(self, what: str, where: str, retired: dict, best: dict | None) -> None:
        if best is not None:  # the retired record's part is gone already (_forget_latest)
            self._offer_latest(what, where, best, self._token())

    def _offer_latest(self, what: str, where: str, record: dict, token: str) -> None:
        folder = self._latest_folder(what, where)
        mine = self._write_part(folder, [record], token)
        mine_rank = (latest_order(record), mine.rsplit("/", 1)[1])
        for uri in self._parts(folder):
            if uri == mine:
                continue
            rows = self._read_part_unless_gone(uri)
            if all((latest_order(r), uri.rsplit("/", 1)[1]) < mine_rank for r in rows):
                self.storage.delete_file(uri)  # beaten by the part just written, which stays

    def _time_bucket(self, bucket: str, what: str, where: str | None) -> Iterable[dict]:
        return winners(self._read_folder(self._time_folder(bucket, what), where)).values()

    def _work_id(self, work_id_index_key: str, where: str | None) -> Iterable[dict]:
        return self._work_ids([work_id_index_key], where)[work_id_index_key]

    def _work_ids(self, work_id_index_keys: list[str], where: str | None) -> dict[str, list[dict]]:
        """Each work id's records, checked against the time layout, which a later put may have
        changed. On a remote store the folders are read several at a time (a backfill asks for
        a work id per hour), and each time bucket once for all the work ids: a day bucket holds
        many hours' files."""
        at_once = self.storage.requests_at_once(self.root)
        candidates = each_request(
            lambda key: winners(self._read_folder(self._work_folder(key), where)), work_id_index_keys, at_once
        )
        time_keys = list(dict.fromkeys(key[0] for found in candidates for key in found))
        buckets = dict(
            zip(
                time_keys,
                each_request(
                    lambda time_key: winners(
                        self._read_folder(self._time_folder(*bucket_and_what(time_key)), where)
                    ),
                    time_keys,
                    at_once,
                ),
                strict=True,
            )
        )
        return {
            work_key: [
                record
                for key in found
                if (record := buckets[key[0]].get(key)) is not None
                and record["work_id_index_key"] == work_key
            ]
            for work_key, found in zip(work_id_index_keys, candidates, strict=True)
        }

    def _latest(self, what: str, where: str) -> dict | None:
        best = None
        for record in self._read_folder(self._latest_folder(what, where)):  # in write order
            if best is None or latest_order(record) >= latest_order(best):
                best = record
        return best
