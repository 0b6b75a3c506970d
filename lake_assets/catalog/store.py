"""Where datalake records are kept and how they are found again.

A record (`lake_assets.catalog.metadata`) describes one file in one time bucket: a file whose
data spans three days has three records with the same `range_key`, one per day; a file spanning
more than 30 days has at most 30, in wider buckets (see `metadata`). Two stores keep them:

* `ParquetCatalogStore`: Parquet files in the lake itself, readable by any engine;
* `DynamoCatalogStore`: the original datalake index in DynamoDB.

Both answer the same queries the same way. The shared rules live in `CatalogStore`:

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
import io
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lake_assets.errors import CatalogError
from lake_assets.catalog.metadata import BUCKET_MS, LAST_INDEXED_MS, bucket_days, query_buckets, span_buckets
from lake_assets.paths import NAME, is_name, is_s3, safe_segment
from lake_assets.storage import Storage

_RECORD_FIELDS = (
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
# shared rules


def _check_name(field: str, value: Any) -> str:
    if not is_name(value):
        raise CatalogError(f"{field} {value!r} must match {NAME.pattern}")
    return value


def _check_ms(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CatalogError(f"{field} {value!r} must be an integer number of milliseconds")
    return value


def _bucket_of(record: dict) -> int:
    """The first day of the record's bucket: buckets in time order."""
    return bucket_days(record["time_index_key"].split(":", 1)[0])[0]


def _span(record: dict) -> tuple[int, int]:
    meta = record["metadata"]
    start = meta["start"]
    end = meta.get("end")
    return start, (end if end is not None else start)


def check_record(record: Any) -> dict:
    """Refuse a record whose index keys disagree with its metadata; return it unchanged."""
    what = _check_keys(record, _RECORD_FIELDS)
    if record.get("deleted"):
        raise CatalogError("a record marked deleted is a retirement: give it to retire(), not put()")
    _check_ms("size", record["size"])
    work_key = record["work_id_index_key"]
    work_id = record["metadata"].get("work_id")
    if not isinstance(work_key, str):
        raise CatalogError("work_id_index_key must be a string")
    if work_id is None:
        if not (work_key.startswith("null") and work_key.endswith(f":{what}") and ":" not in work_key[: -len(what) - 1]):
            raise CatalogError(f"work_id_index_key {work_key!r} must be 'null<random>:{what}' for a null work_id")
    elif work_key != f"{_check_name('metadata.work_id', work_id)}:{what}":
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
    bucket, _, key_what = key.partition(":") if isinstance(key, str) else ("", "", "")
    if key_what != what:
        raise CatalogError(f"time_index_key {key!r} must be '<bucket>:{what}'")
    indexed = span_buckets(start, end if end is not None else start)
    if bucket not in indexed:
        raise CatalogError(f"time_index_key {key!r}: not one of the file's buckets {indexed[0]}..{indexed[-1]}")

    if record["range_key"] != f"{where}:{meta['id']}":
        raise CatalogError(f"range_key {record['range_key']!r} must be '{where}:<id>'")
    return what


def _winners(records: Iterable[dict]) -> dict[tuple[str, str], dict]:
    """One record per (time_index_key, range_key): the greatest create_time, then the last seen."""
    out: dict[tuple[str, str], dict] = {}
    for record in records:
        key = (record["time_index_key"], record["range_key"])
        held = out.get(key)
        if held is None or record["create_time"] >= held["create_time"]:
            out[key] = record
    return out


def _one_per_file(records: Iterable[dict]) -> list[dict]:
    """Each file once (its record from the earliest bucket), sorted by (start, range_key)."""
    files: dict[str, dict] = {}
    for record in records:
        held = files.get(record["range_key"])
        if held is None or _bucket_of(record) < _bucket_of(held):
            files[record["range_key"]] = record
    return sorted(files.values(), key=lambda r: (r["metadata"]["start"], r["range_key"]))


def _latest_key(record: dict) -> tuple[int, int]:
    return record["metadata"]["start"], record["create_time"]


def _latest_rank(record: dict) -> tuple:
    """How a record ranks as the latest: its file's start, create_time, then (of one file's
    records) the one from its first bucket, so that every way of offering it offers the same."""
    return _latest_key(record), -_bucket_of(record)


def _latest_start_in(bucket: str) -> float:
    """The greatest start a record in this bucket may have: the bucket's last ms, but no bound
    for a bucket holding the calendar's last day (files starting after it are indexed there)."""
    first, width = bucket_days(bucket)
    last_ms = (first + width) * BUCKET_MS - 1
    return float("inf") if last_ms >= LAST_INDEXED_MS else last_ms


def _retired(record: dict, files: dict[str, int]) -> bool:
    """Whether `files` (range_key -> when retired) retire this record (put no later)."""
    return record["create_time"] <= files.get(record["range_key"], -1)


def _live(records: Iterable[dict]) -> Iterator[dict]:
    return (r for r in records if not r.get("deleted"))


class CatalogStore(abc.ABC):
    """Datalake records, found by time bucket, by work id, or as the latest file of what:where."""

    def put(self, records: list[dict]) -> None:
        records = [check_record(r) for r in records]
        if not records:
            return
        batch = list(_winners(records).values())
        latest: dict[tuple[str, str], dict] = {}
        for record in batch:
            meta = record["metadata"]
            key = (meta["what"], meta["where"])
            held = latest.get(key)
            if held is None or _latest_rank(record) >= _latest_rank(held):
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
        batch = list(_winners(retirements).values())
        self._retire(batch)
        gone: dict[tuple[str, str], dict[str, int]] = {}
        for retirement in batch:
            meta = retirement["metadata"]
            files = gone.setdefault((meta["what"], meta["where"]), {})
            files[retirement["range_key"]] = max(files.get(retirement["range_key"], 0), retirement["create_time"])
        for (what, where), files in gone.items():
            held = self.latest(what, where)
            self._forget_latest(what, where, files)
            if held is not None and _retired(held, files):
                self._replace_latest(what, where, held, self._latest_remaining(what, where))

    def query_by_time(self, start: int, end: int, what: str, where: str | None = None) -> list[dict]:
        _check_ms("start", start)
        _check_ms("end", end)
        if end < start:
            raise CatalogError(f"end {end} is before start {start}")
        _check_name("what", what)
        if where is not None:
            _check_name("where", where)
        found = []
        for bucket in query_buckets(start, end):
            for record in _live(self._time_bucket(bucket, what, where)):
                first, last = _span(record)
                if first <= end and last >= start:
                    found.append(record)
        return _one_per_file(found)

    def query_by_work_id(self, work_id: str, what: str, where: str | None = None) -> list[dict]:
        return self.query_by_work_ids([work_id], what, where)[work_id]

    def query_by_work_ids(self, work_ids: Iterable[str], what: str, where: str | None = None) -> dict[str, list[dict]]:
        """`query_by_work_id` for several work ids at once (a run over many partitions asks
        for each partition's files); a store may share reads between them."""
        work_ids = list(dict.fromkeys(work_ids))
        for work_id in work_ids:
            _check_name("work_id", work_id)
        _check_name("what", what)
        if where is not None:
            _check_name("where", where)
        found = self._work_ids([f"{w}:{what}" for w in work_ids], where)
        return {
            work_id: _one_per_file(r for r in _live(found[f"{work_id}:{what}"]) if r["metadata"].get("work_id") is not None)
            for work_id in work_ids
        }

    @abc.abstractmethod
    def latest(self, what: str, where: str) -> dict | None:
        """The record of the file with the greatest metadata.start for what:where, or None."""

    # store-specific parts ---------------------------------------------------------------------

    @abc.abstractmethod
    def _put(self, records: list[dict], latest: dict[tuple[str, str], dict]) -> None:
        """Store checked records (one per key) and offer each (what, where)'s best as latest."""

    @abc.abstractmethod
    def _retire(self, retirements: list[dict]) -> None:
        """Take out the records these checked retirements (one per key) name, unless put later."""

    @abc.abstractmethod
    def _latest_remaining(self, what: str, where: str) -> dict | None:
        """The best record for latest among the files of what:where still catalogued (a search
        of the store: called only when the latest file goes)."""

    @abc.abstractmethod
    def _replace_latest(self, what: str, where: str, retired: dict, best: dict | None) -> None:
        """Put `best` (or nothing) in place of the latest record `retired`, unless another has
        taken its place meanwhile."""

    def _forget_latest(self, what: str, where: str, files: dict[str, int]) -> None:
        """Drop what the store keeps of these retired files (range_key -> retired at) as
        candidates for latest; a store that keeps only the latest itself has nothing to drop."""

    @abc.abstractmethod
    def _time_bucket(self, bucket: str, what: str, where: str | None) -> Iterable[dict]:
        """The current records whose time_index_key is f"{bucket}:{what}" (and where, if given);
        with a store that keeps retirements, those too (marked deleted)."""

    @abc.abstractmethod
    def _work_id(self, work_id_index_key: str, where: str | None) -> Iterable[dict]:
        """The current records with this work_id_index_key (and where, if given)."""

    def _work_ids(self, work_id_index_keys: list[str], where: str | None) -> dict[str, list[dict]]:
        return {key: list(self._work_id(key, where)) for key in work_id_index_keys}


# --------------------------------------------------------------------------------------------
# Parquet in the lake

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
    extra = {k: v for k, v in record.items() if k not in _RECORD_FIELDS and k != "deleted"}
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


class ParquetCatalogStore(CatalogStore):
    """Records as Parquet files in the lake.

    Layout under `root` (every part file is written once and never changed):

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

    def __init__(self, root: str, storage: Storage):
        if not (root.startswith("file:///") or is_s3(root)):
            raise CatalogError(f"catalog root {root!r} must be a file:/// or s3a:// URI")
        self.root = root.rstrip("/")
        self.storage = storage

    # paths ------------------------------------------------------------------------------------

    def _time_folder(self, bucket: str, what: str) -> str:
        return f"{self.root}/{safe_segment(f'time_bucket={bucket}')}/{safe_segment(what, 'what')}"

    def _work_folder(self, work_id_index_key: str) -> str:
        return f"{self.root}/{safe_segment('work_id=' + encode_segment(work_id_index_key))}"

    def _latest_folder(self, what: str, where: str) -> str:
        return f"{self.root}/{safe_segment('latest=' + encode_segment(f'{what}:{where}'))}"

    @classmethod
    def _token(cls) -> str:
        with cls._token_lock:
            ns = max(time.time_ns(), cls._last_ns + 1)
            cls._last_ns = ns
        return f"{ns:020d}-{uuid.uuid4().hex[:16]}"

    # reading and writing part files -----------------------------------------------------------

    def _write_part(self, folder: str, records: list[dict], token: str) -> str:
        table = pa.Table.from_pylist([_to_row(r) for r in records], schema=_SCHEMA)
        sink = io.BytesIO()
        pq.write_table(table, sink)
        name = f"part-{token}.parquet"
        uri = f"{folder}/{name}"
        if is_s3(uri):
            self.storage.write_bytes(uri, sink.getvalue())  # one PUT: whole or absent
        else:
            temp = f"{folder}/.tmp-{token}"
            self.storage.write_bytes(temp, sink.getvalue())
            self.storage.move_file(temp, uri)  # readers never see half a file
        return uri

    def _parts(self, folder: str) -> list[str]:
        names = [
            e
            for e in self.storage.list(folder)
            if not e.is_dir and e.name.startswith("part-") and e.name.endswith(".parquet")
        ]
        return [e.uri for e in sorted(names, key=lambda e: e.name)]

    def _read_part(self, uri: str, where: str | None = None) -> list[dict]:
        table = pq.read_table(pa.BufferReader(self.storage.read_bytes(uri)))
        if where is not None:
            table = table.filter(pc.equal(table["meta_where"], where))
        return [_from_row(row) for row in table.to_pylist()]

    def _read_folder(self, folder: str, where: str | None = None) -> list[dict]:
        out: list[dict] = []
        for uri in self._parts(folder):
            out.extend(self._read_part(uri, where))
        return out

    # CatalogStore -----------------------------------------------------------------------------

    def _put(self, records: list[dict], latest: dict[tuple[str, str], dict]) -> None:
        token = self._token()
        by_time: dict[str, list[dict]] = {}
        by_work: dict[str, list[dict]] = {}
        for record in records:
            by_time.setdefault(record["time_index_key"], []).append(record)
            if record["metadata"].get("work_id") is not None:
                by_work.setdefault(record["work_id_index_key"], []).append(record)
        # the time layout first: it is the truth the others are checked against
        for key, group in sorted(by_time.items()):
            bucket, what = key.split(":", 1)
            self._write_part(self._time_folder(bucket, what), group, token)
        for key, group in sorted(by_work.items()):
            self._write_part(self._work_folder(key), group, token)
        for (what, where), record in sorted(latest.items()):
            self._offer_latest(what, where, record, token)

    def _retire(self, retirements: list[dict]) -> None:
        token = self._token()
        by_time: dict[str, list[dict]] = {}
        for retirement in retirements:
            by_time.setdefault(retirement["time_index_key"], []).append(retirement)
        for key, group in sorted(by_time.items()):
            bucket, what = key.split(":", 1)
            self._write_part(self._time_folder(bucket, what), group, token)

    def _latest_remaining(self, what: str, where: str) -> dict | None:
        # The buckets from the latest down: a record's start is at most its bucket's end, so
        # once the best found starts after the next bucket ends, nothing below can beat it.
        buckets = sorted(
            (e.name.split("=", 1)[1] for e in self.storage.list(self.root) if e.is_dir and e.name.startswith("time_bucket=")),
            key=_latest_start_in, reverse=True,
        )
        best = None
        for bucket in buckets:
            if best is not None and best["metadata"]["start"] > _latest_start_in(bucket):
                break
            for record in _live(self._time_bucket(bucket, what, where)):
                if best is None or _latest_rank(record) > _latest_rank(best):
                    best = record
        return best

    def _forget_latest(self, what: str, where: str, files: dict[str, int]) -> None:
        # A part offered after a better one stays until beaten: it must not outlive its file.
        for uri in self._parts(self._latest_folder(what, where)):
            if all(_retired(r, files) for r in self._read_part(uri)):
                self.storage.delete_file(uri)

    def _replace_latest(self, what: str, where: str, retired: dict, best: dict | None) -> None:
        if best is not None:  # the retired record's part is gone already (_forget_latest)
            self._offer_latest(what, where, best, self._token())

    def _offer_latest(self, what: str, where: str, record: dict, token: str) -> None:
        folder = self._latest_folder(what, where)
        mine = self._write_part(folder, [record], token)
        mine_rank = (_latest_key(record), mine.rsplit("/", 1)[1])
        for uri in self._parts(folder):
            if uri == mine:
                continue
            rows = self._read_part(uri)
            if all((_latest_key(r), uri.rsplit("/", 1)[1]) < mine_rank for r in rows):
                self.storage.delete_file(uri)  # beaten by the part just written, which stays

    def _time_bucket(self, bucket: str, what: str, where: str | None) -> Iterable[dict]:
        return _winners(self._read_folder(self._time_folder(bucket, what), where)).values()

    def _work_id(self, work_id_index_key: str, where: str | None) -> Iterable[dict]:
        return self._work_ids([work_id_index_key], where)[work_id_index_key]

    def _work_ids(self, work_id_index_keys: list[str], where: str | None) -> dict[str, list[dict]]:
        # Time buckets are read once for all the work ids: a day bucket holds many hours' files.
        buckets: dict[str, dict[tuple[str, str], dict]] = {}
        return {key: self._verified_hits(key, where, buckets) for key in work_id_index_keys}

    def _verified_hits(
        self, work_id_index_key: str, where: str | None, current: dict[str, dict[tuple[str, str], dict]]
    ) -> list[dict]:
        candidates = _winners(self._read_folder(self._work_folder(work_id_index_key), where))
        # check each hit against the time layout, which a later put may have changed
        out = []
        for key in candidates:
            time_key = key[0]
            if time_key not in current:
                bucket, what = time_key.split(":", 1)
                current[time_key] = _winners(self._read_folder(self._time_folder(bucket, what), where))
            record = current[time_key].get(key)
            if record is not None and record["work_id_index_key"] == work_id_index_key:
                out.append(record)
        return out

    def latest(self, what: str, where: str) -> dict | None:
        _check_name("what", what)
        _check_name("where", where)
        best = None
        for uri in self._parts(self._latest_folder(what, where)):  # in write order
            for record in self._read_part(uri):
                if best is None or _latest_key(record) >= _latest_key(best):
                    best = record
        return best


# --------------------------------------------------------------------------------------------
# DynamoDB


def _to_dynamo(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _to_dynamo(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_dynamo(v) for v in value]
    return value


def _from_dynamo(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _from_dynamo(v) for k, v in value.items()}
    if isinstance(value, (list, set, frozenset)):
        return [_from_dynamo(v) for v in value]
    return value


class DynamoCatalogStore(CatalogStore):
    """The original datalake index in DynamoDB.

    * records table `table`: HASH `time_index_key`, RANGE `range_key`; global secondary index
      `work-id-index`: HASH `work_id_index_key`, RANGE `range_key`, projection ALL;
    * latest table `latest_table`: HASH `what_where_key` = f"{what}:{where}", the latest record.

    Writes are conditional, so the rules of `CatalogStore` hold with concurrent writers: a
    record replaces one with the same key only if its create_time is at least as great; the
    latest item is replaced only by a record with a later start (or the same start and a
    create_time at least as great). Credentials come from boto3's default chain only.
    """

    WORK_ID_INDEX = "work-id-index"

    def __init__(
        self,
        table: str,
        latest_table: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        page_size: int | None = None,
        write_threads: int = 8,
    ):
        import boto3
        from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

        self.table = table
        self.latest_table = latest_table
        self.page_size = page_size  # Query page size (None: DynamoDB's own 1 MB pages)
        self.write_threads = max(1, write_threads)
        self.client = boto3.client("dynamodb", endpoint_url=endpoint_url, region_name=region)
        self._ser = TypeSerializer()
        self._de = TypeDeserializer()

    def __repr__(self) -> str:
        return f"DynamoCatalogStore(table={self.table!r}, latest_table={self.latest_table!r})"

    def _item(self, record: dict) -> dict:
        return {k: self._ser.serialize(_to_dynamo(v)) for k, v in record.items()}

    def _record(self, item: dict) -> dict:
        record = {k: _from_dynamo(self._de.deserialize(v)) for k, v in item.items()}
        record.pop("what_where_key", None)
        return record

    def create_tables(self) -> None:
        """Create both tables if absent (PAY_PER_REQUEST) and wait until they are usable."""
        errors = self.client.exceptions
        try:
            self.client.create_table(
                TableName=self.table,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[
                    {"AttributeName": "time_index_key", "AttributeType": "S"},
                    {"AttributeName": "range_key", "AttributeType": "S"},
                    {"AttributeName": "work_id_index_key", "AttributeType": "S"},
                ],
                KeySchema=[
                    {"AttributeName": "time_index_key", "KeyType": "HASH"},
                    {"AttributeName": "range_key", "KeyType": "RANGE"},
                ],
                GlobalSecondaryIndexes=[
                    {
                        "IndexName": self.WORK_ID_INDEX,
                        "KeySchema": [
                            {"AttributeName": "work_id_index_key", "KeyType": "HASH"},
                            {"AttributeName": "range_key", "KeyType": "RANGE"},
                        ],
                        "Projection": {"ProjectionType": "ALL"},
                    }
                ],
            )
        except errors.ResourceInUseException:
            pass
        try:
            self.client.create_table(
                TableName=self.latest_table,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": "what_where_key", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "what_where_key", "KeyType": "HASH"}],
            )
        except errors.ResourceInUseException:
            pass
        waiter = self.client.get_waiter("table_exists")
        for name in (self.table, self.latest_table):
            waiter.wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
        described = self.client.describe_table(TableName=self.table)["Table"]
        indexes = {i["IndexName"] for i in described.get("GlobalSecondaryIndexes", [])}
        if self.WORK_ID_INDEX not in indexes:
            raise CatalogError(f"table {self.table!r} exists without the {self.WORK_ID_INDEX!r} index")

    def _each(self, write: Callable[[dict], None], records: list[dict]) -> None:
        """`write` each record, on `write_threads` threads: the keys are distinct after
        CatalogStore's rules, so the writes are independent."""
        if len(records) > 1:
            with ThreadPoolExecutor(max_workers=min(self.write_threads, len(records))) as pool:
                list(pool.map(write, records))  # list(): re-raise the first error
        else:
            for record in records:
                write(record)

    def _put(self, records: list[dict], latest: dict[tuple[str, str], dict]) -> None:
        failed = self.client.exceptions.ConditionalCheckFailedException

        def put_record(record: dict) -> None:
            try:
                self.client.put_item(
                    TableName=self.table,
                    Item=self._item(record),
                    ConditionExpression="attribute_not_exists(#tk) OR #ct <= :ct",
                    ExpressionAttributeNames={"#tk": "time_index_key", "#ct": "create_time"},
                    ExpressionAttributeValues={":ct": {"N": str(record["create_time"])}},
                )
            except failed:
                pass  # a record with a later create_time holds the key

        self._each(put_record, records)
        for (what, where), record in latest.items():
            item = self._item({**record, "what_where_key": f"{what}:{where}"})
            try:
                self.client.put_item(
                    TableName=self.latest_table,
                    Item=item,
                    ConditionExpression=(
                        "attribute_not_exists(#wk) OR #m.#s < :s OR (#m.#s = :s AND #ct <= :ct)"
                    ),
                    ExpressionAttributeNames={
                        "#wk": "what_where_key",
                        "#m": "metadata",
                        "#s": "start",
                        "#ct": "create_time",
                    },
                    ExpressionAttributeValues={
                        ":s": {"N": str(record["metadata"]["start"])},
                        ":ct": {"N": str(record["create_time"])},
                    },
                )
            except failed:
                pass  # a later file is already the latest

    def _retire(self, retirements: list[dict]) -> None:
        failed = self.client.exceptions.ConditionalCheckFailedException

        def delete(retirement: dict) -> None:
            try:
                self.client.delete_item(
                    TableName=self.table,
                    Key={k: {"S": retirement[k]} for k in ("time_index_key", "range_key")},
                    ConditionExpression="#ct <= :ct",
                    ExpressionAttributeNames={"#ct": "create_time"},
                    ExpressionAttributeValues={":ct": {"N": str(retirement["create_time"])}},
                )
            except failed:
                pass  # absent, or put again after the retirement

        self._each(delete, retirements)

    def _latest_remaining(self, what: str, where: str) -> dict | None:
        # The records table has no index by what:where alone: a scan, on this rare path only.
        pages = self.client.get_paginator("scan").paginate(
            TableName=self.table,
            FilterExpression="#m.#w = :what AND begins_with(#r, :where)",
            ExpressionAttributeNames={"#m": "metadata", "#w": "what", "#r": "range_key"},
            ExpressionAttributeValues={":what": {"S": what}, ":where": {"S": f"{where}:"}},
            ConsistentRead=True,
        )
        records = (self._record(item) for page in pages for item in page.get("Items", []))
        return max(records, key=_latest_rank, default=None)

    def _replace_latest(self, what: str, where: str, retired: dict, best: dict | None) -> None:
        still_retired = {
            "ConditionExpression": "#m.#id = :id AND #ct = :ct",
            "ExpressionAttributeNames": {"#m": "metadata", "#id": "id", "#ct": "create_time"},
            "ExpressionAttributeValues": {
                ":id": {"S": retired["metadata"]["id"]}, ":ct": {"N": str(retired["create_time"])},
            },
        }
        try:
            if best is None:
                self.client.delete_item(
                    TableName=self.latest_table, Key={"what_where_key": {"S": f"{what}:{where}"}}, **still_retired
                )
            else:
                item = self._item({**best, "what_where_key": f"{what}:{where}"})
                self.client.put_item(TableName=self.latest_table, Item=item, **still_retired)
        except self.client.exceptions.ConditionalCheckFailedException:
            pass  # a file put meanwhile is the latest now

    def _query(self, hash_name: str, hash_value: str, where: str | None, **extra) -> Iterator[dict]:
        condition = "#h = :h"
        names = {"#h": hash_name}
        values = {":h": {"S": hash_value}}
        if where is not None:
            condition += " AND begins_with(#r, :r)"
            names["#r"] = "range_key"
            values[":r"] = {"S": f"{where}:"}
        pages = self.client.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            PaginationConfig={"PageSize": self.page_size} if self.page_size else {},
            **extra,
        )
        for page in pages:
            for item in page.get("Items", []):
                yield self._record(item)

    def _time_bucket(self, bucket: str, what: str, where: str | None) -> Iterable[dict]:
        return self._query("time_index_key", f"{bucket}:{what}", where, ConsistentRead=True)

    def _work_id(self, work_id_index_key: str, where: str | None) -> Iterable[dict]:
        return self._query("work_id_index_key", work_id_index_key, where, IndexName=self.WORK_ID_INDEX)

    def latest(self, what: str, where: str) -> dict | None:
        _check_name("what", what)
        _check_name("where", where)
        answer = self.client.get_item(
            TableName=self.latest_table,
            Key={"what_where_key": {"S": f"{what}:{where}"}},
            ConsistentRead=True,
        )
        item = answer.get("Item")
        return self._record(item) if item else None
