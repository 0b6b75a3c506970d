"""Datalake metadata documents: validation, JSON form, content hashes, time buckets and records.

A file shipped to the datalake travels with a small JSON document (version, start, end, path,
where, what, work_id, id, hash). `validate` checks it in a fixed order and returns a normalised
copy whose dates are integer milliseconds since the epoch. `build_records` turns a validated
document into the index records the catalog stores, one per time bucket the file is indexed in.

Time buckets. As upstream, a file is recorded once in each UTC day its span touches, as long as
that is at most MAX_BUCKETS (30) days: its records are exactly datalake-common's. Upstream
refuses a longer span; here such a file is never refused (a vendor row dated 9999, or a history
file holding versions that started months ago, must not stop a run). It is indexed instead in
the buckets of the finest wider width at which it touches at most MAX_BUCKETS of them: widths
of 30, 900, 27,000 and 810,000 days (each 30 times the last), so at most 30 records per file,
whatever its span. A wider bucket is named by its first day and its width (`19770+30` holds days
19770..19799; a day bucket keeps its upstream name, `19783`). A time query reads, besides the
days it covers, the one or few buckets of each wider width that overlap it (four more reads for
a day), and keeps the files whose true span touches it: a file is found from every day it spans.
The record keeps its true `start` and `end`; only its index is bounded: instants before
0001-01-01 or after 9999-12-31 (the calendar every engine's timestamps cover) are indexed in
the calendar's first or last day. A reader that knows only day buckets (upstream's datalake-api)
sees every file of up to 30 days, and none of the longer ones.

Pure Python: no Spark, no Dagster, no I/O.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

from lake_assets.epoch import DAY_MS, EPOCH_MS_THRESHOLD
from lake_assets.errors import CatalogError
from lake_assets.paths import is_name

__all__ = [
    "BUCKET_MS",
    "BUCKET_WIDTHS",
    "FIRST_INDEXED_MS",
    "LAST_INDEXED_MS",
    "MAX_BUCKETS",
    "METADATA_VERSION",
    "RECORD_VERSION",
    "REQUIRED_FIELDS",
    "MetadataError",
    "bucket_days",
    "buckets",
    "build_records",
    "build_retirements",
    "content_hash",
    "datetime_to_ms",
    "document_time",
    "from_json",
    "hash_stream",
    "query_buckets",
    "span_buckets",
    "time_bucket",
    "to_json",
    "validate",
]

METADATA_VERSION = 0
RECORD_VERSION = 0

# Fields that must be present and non-null, checked in this order.
REQUIRED_FIELDS = ("version", "start", "where", "what", "id", "hash", "path")

BUCKET_MS = DAY_MS  # a bucket is one UTC day
MAX_BUCKETS = 30
#: the widths, in days, of the buckets a file may be indexed in, finest first (see the module)
BUCKET_WIDTHS = tuple(MAX_BUCKETS**level for level in range(5))

HASH_DIGEST_SIZE = 16

# Numbers beyond EPOCH_MS_THRESHOLD (in magnitude) are milliseconds since the epoch; others,
# seconds. Upstream compares without the magnitude, reading every number below -1e11 as seconds
# before the year 1.
_POSIX_ABSOLUTE = re.compile(r"/")
_WINDOWS_DRIVE_ABSOLUTE = re.compile(r"[A-Za-z]:[\\/]")
_NUMERIC = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_THOUSAND = Decimal(1000)
_ONE = Decimal(1)
_MS = timedelta(milliseconds=1)


def datetime_to_ms(moment: datetime) -> int:
    """Exact integer milliseconds since the epoch (floored); a naive datetime is UTC. Exact for
    every year a datetime holds, where `timestamp()` goes through a float."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MS


#: the instants the index distinguishes: the years 1 to 9999, as a datetime (and every engine's timestamp)
FIRST_INDEXED_MS = datetime_to_ms(datetime.min)
LAST_INDEXED_MS = datetime_to_ms(datetime.max)


def document_time(ms: int) -> str | int:
    """A time in ms as a document gives it so that `validate` reads back exactly `ms`: ISO 8601
    in the years 1 to 9999 (a bare number there may read as seconds: 5000 would be 5000 s), the
    number itself beyond them (where its magnitude makes it ms)."""
    if not FIRST_INDEXED_MS <= ms <= LAST_INDEXED_MS:
        return ms
    return (_EPOCH + ms * _MS).isoformat(timespec="milliseconds")


class MetadataError(CatalogError):
    """A metadata document is invalid; `field` names the offending field, `reason` says why."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"metadata field '{field}': {reason}")
        self.field = field
        self.reason = reason

    def __reduce__(self):
        return (type(self), (self.field, self.reason))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def validate(metadata: Mapping) -> dict:
    """Check `metadata` and return a new, normalised dict; the input is never modified.

    Checks run in this order and the first failure raises MetadataError:
    1. `id` is assigned (uuid4 hex) when the key is missing;
    2. `version` is the integer 0; a document without the key is version 0, as upstream
       (datalake-common's `Metadata` sets a missing version before validating);
    3. `version, start, where, what, id, hash, path` are present and non-null;
    4. `where` and `what` match ^[a-z0-9_-]+$;
    5. the `work_id` key is present; its value is null or a name like `where`, never "null";
    6. `path` is absolute (POSIX, or a Windows drive path);
    7. `start` and `end` become integer milliseconds since the epoch;
    8. `end` may be missing or null, and is never before `start`; a missing `end` is kept as
       null, so the normalised document (and every record) always has the key, as upstream.
    Keys the format does not know are kept unchanged.
    """
    if not isinstance(metadata, Mapping):
        raise MetadataError("document", f"must be a mapping, not {type(metadata).__name__}")
    doc = dict(metadata)

    # 1. id
    if "id" not in doc:
        doc["id"] = uuid.uuid4().hex

    # 2. version
    version = doc.setdefault("version", METADATA_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise MetadataError(
            "version", f"must be the integer {METADATA_VERSION}, got {type(version).__name__} {version!r}"
        )
    if version != METADATA_VERSION:
        raise MetadataError("version", f"unsupported version {version!r} (only {METADATA_VERSION})")
    doc["version"] = METADATA_VERSION

    # 3. required, non-null
    for field in REQUIRED_FIELDS:
        if field not in doc:
            raise MetadataError(field, "is required")
        if doc[field] is None:
            raise MetadataError(field, "must not be null")

    # 4. where / what
    for field in ("where", "what"):
        _check_name(field, doc[field])

    # 5. work_id
    if "work_id" not in doc:
        raise MetadataError("work_id", "is required (it may be null)")
    work_id = doc["work_id"]
    if work_id is not None:
        if work_id == "null":
            raise MetadataError("work_id", 'must not be the string "null" (use a JSON null)')
        _check_name("work_id", work_id)

    # 6. path
    _check_path(doc["path"])

    # 7. dates
    doc["start"] = _to_ms("start", doc["start"])
    if doc.setdefault("end", None) is not None:
        doc["end"] = _to_ms("end", doc["end"])

    # 8. end after start
    end = doc.get("end")
    if end is not None and end < doc["start"]:
        raise MetadataError("end", f"{end} is before start {doc['start']}")

    return doc


def _check_name(field: str, value: Any) -> None:
    if not isinstance(value, str):
        raise MetadataError(field, f"must be a string, not {type(value).__name__}")
    if not is_name(value):
        raise MetadataError(field, f"{value!r} may only contain lowercase letters, digits, '-' and '_'")


def _check_path(path: Any) -> None:
    if not isinstance(path, str):
        raise MetadataError("path", f"must be a string, not {type(path).__name__}")
    if _POSIX_ABSOLUTE.match(path) or _WINDOWS_DRIVE_ABSOLUTE.match(path):
        return
    raise MetadataError("path", f"{path!r} is not absolute (POSIX '/...' or Windows 'C:\\...')")


def _to_ms(field: str, value: Any) -> int:
    """Integer ms since the epoch from a number, a numeric string, a date string or 'now'."""
    if isinstance(value, bool):
        raise MetadataError(field, f"must be a time, not the boolean {value!r}")
    if isinstance(value, int):
        return _number_to_ms(field, Decimal(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MetadataError(field, f"must be a finite time, got {value!r}")
        # repr gives the shortest decimal that round-trips, so 1426809600.123 stays .123 exactly.
        return _number_to_ms(field, Decimal(repr(value)))
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "now":
            return _now_ms()
        if _NUMERIC.fullmatch(text):
            try:
                number = Decimal(text)
            except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
                raise MetadataError(field, f"cannot read {value!r} as a number") from None
            return _number_to_ms(field, number)
        return _date_string_to_ms(field, value, text)
    raise MetadataError(
        field, f"must be a number, a date string or 'now', not {type(value).__name__} {value!r}"
    )


def _number_to_ms(field: str, number: Decimal) -> int:
    if not number.is_finite():
        raise MetadataError(field, f"must be a finite time, got {number}")
    ms = number if abs(number) > EPOCH_MS_THRESHOLD else number * _THOUSAND
    return int(ms.quantize(_ONE, rounding=ROUND_HALF_EVEN))


def _date_string_to_ms(field: str, original: str, text: str) -> int:
    iso = text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        raise MetadataError(
            field, f"cannot read {original!r} as a time (ms, seconds, ISO 8601 date or 'now')"
        ) from None
    return datetime_to_ms(moment)


# --------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------


def to_json(metadata: Mapping) -> str:
    """The validated, normalised document as compact JSON with sorted keys."""
    return json.dumps(validate(metadata), sort_keys=True, separators=(",", ":"), allow_nan=False)


def _refuse_constant(name: str):
    raise MetadataError("document", f"JSON constant {name} is not allowed")


def from_json(text: str | bytes) -> dict:
    """Parse a JSON metadata document and validate it."""
    try:
        loaded = json.loads(text, parse_constant=_refuse_constant)
    except MetadataError:
        raise
    except (ValueError, TypeError) as exc:
        raise MetadataError("document", f"not valid JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise MetadataError("document", f"must be a JSON object, not {type(loaded).__name__}")
    return validate(loaded)


# --------------------------------------------------------------------------------------------
# content hash
# --------------------------------------------------------------------------------------------


def content_hash(data: bytes) -> str:
    """blake2b with a 16-byte digest, as 32 hex characters."""
    return hashlib.blake2b(data, digest_size=HASH_DIGEST_SIZE).hexdigest()


def hash_stream(chunks: Iterable[bytes]) -> str:
    """`content_hash` of the concatenated chunks, computed without holding them all."""
    hasher = hashlib.blake2b(digest_size=HASH_DIGEST_SIZE)
    for chunk in chunks:
        hasher.update(chunk)
    return hasher.hexdigest()


# --------------------------------------------------------------------------------------------
# time buckets and records
# --------------------------------------------------------------------------------------------


def time_bucket(ms: int) -> int:
    """The one-day bucket holding the instant `ms` (milliseconds since the epoch)."""
    return operator.index(ms) // BUCKET_MS


def buckets(metadata: Mapping) -> list[str]:
    """The buckets a file is indexed in (`span_buckets` of start .. end or start).

    `metadata` must already be validated: `start` and `end` are read as integer milliseconds
    as they stand. (Validating again would read a small ms value such as 69_120_000 as seconds.)
    """
    start = _ms_field(metadata, "start")
    end = _ms_field(metadata, "end") if metadata.get("end") is not None else start
    if end < start:
        raise MetadataError("end", f"{end} is before start {start}")
    return span_buckets(start, end)


def span_buckets(start: int, end: int) -> list[str]:
    """The buckets of a file spanning [start, end] (ms): its days when they are at most
    MAX_BUCKETS, else the buckets of the finest wider width that it touches at most
    MAX_BUCKETS of (see the module's docstring)."""
    first, last = _indexed_day(start), _indexed_day(end)
    for width in BUCKET_WIDTHS:
        if last // width - first // width < MAX_BUCKETS:
            return _labels(first, last, width)
    raise AssertionError(
        f"the widest bucket ({BUCKET_WIDTHS[-1]} days) must hold the calendar in {MAX_BUCKETS}"
    )


def query_buckets(start: int, end: int) -> list[str]:
    """Every bucket a time query for [start, end] (ms) must read: each day, and the buckets of
    each wider width that overlap the range."""
    first, last = _indexed_day(start), _indexed_day(end)
    return [label for width in BUCKET_WIDTHS for label in _labels(first, last, width)]


def bucket_days(label: str) -> tuple[int, int]:
    """(first day, width in days) of a bucket named by `span_buckets` or `query_buckets`."""
    first, _, width = label.partition("+")
    return int(first), int(width or 1)


def _indexed_day(ms: int) -> int:
    return time_bucket(min(max(ms, FIRST_INDEXED_MS), LAST_INDEXED_MS))


def _labels(first_day: int, last_day: int, width: int) -> list[str]:
    starts = range(first_day // width * width, last_day + 1, width)
    return [str(day) if width == 1 else f"{day}+{width}" for day in starts]


def _ms_field(metadata: Mapping, field: str) -> int:
    value = metadata.get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MetadataError(
            field, f"must be integer milliseconds (validate the metadata first), got {value!r}"
        )
    return value


def time_index_key(bucket: str, what: str) -> str:
    """A record's key in the time index: its bucket and table."""
    return f"{bucket}:{what}"


def bucket_and_what(key: str) -> tuple[str, str]:
    """The (bucket, what) a `time_index_key` names."""
    bucket, _, what = key.partition(":")
    return bucket, what


def work_id_index_key(work_id: str, what: str) -> str:
    """A record's key in the work-id index (a null work_id: "null" plus a random value)."""
    return f"{work_id}:{what}"


def range_key(where: str, file_id: str) -> str:
    """A record's range key: one file of one feed, the same in each of its buckets."""
    return f"{where}:{file_id}"


def build_records(
    metadata: Mapping,
    *,
    url: str,
    size: int,
    create_time: int | None = None,
    null_work_id: Callable[[], str] | None = None,
) -> list[dict]:
    """One catalog record per time bucket the file is indexed in, for a validated copy of `metadata`.

    A null work_id is replaced in the index key by "null" plus one random value shared by all
    of this file's records (`null_work_id()` when given, else a uuid4 hex).
    """
    if not isinstance(url, str) or not url:
        raise MetadataError("url", f"must be a non-empty string, got {url!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise MetadataError("size", f"must be a non-negative integer, got {size!r}")
    if create_time is not None and (isinstance(create_time, bool) or not isinstance(create_time, int)):
        raise MetadataError("create_time", f"must be integer ms or None, got {create_time!r}")

    doc = validate(metadata)
    spans = buckets(doc)
    what = doc["what"]
    work_id = doc["work_id"]
    if work_id is None:
        token = (null_work_id or _random_hex)()
        work_key = work_id_index_key(f"null{token}", what)
    else:
        work_key = work_id_index_key(work_id, what)
    created = _now_ms() if create_time is None else create_time
    file_key = range_key(doc["where"], doc["id"])

    return [
        {
            "version": RECORD_VERSION,
            "url": url,
            "time_index_key": time_index_key(bucket, what),
            "work_id_index_key": work_key,
            "range_key": file_key,
            "create_time": created,
            "size": size,
            "metadata": dict(doc),
        }
        for bucket in spans
    ]


def build_retirements(
    *,
    url: str,
    where: str,
    what: str,
    file_id: str,
    start: int,
    end: int | None,
    create_time: int | None = None,
) -> list[dict]:
    """Records saying that a file is gone: one per bucket it is indexed in, with the keys of its
    records (`time_index_key`, `range_key`) and `deleted: True`. A store takes them with
    `retire` and leaves the file out of every query from then on, unless a record of it is put
    again later. `start` and `end` are the file's, in ms, as its records hold them."""
    _check_name("where", where)
    _check_name("what", what)
    created = _now_ms() if create_time is None else create_time
    return [
        {
            "version": RECORD_VERSION,
            "url": url,
            "time_index_key": time_index_key(bucket, what),
            "work_id_index_key": None,
            "range_key": range_key(where, file_id),
            "create_time": created,
            "size": 0,
            "metadata": {
                "version": METADATA_VERSION,
                "id": file_id,
                "start": start,
                "end": end,
                "where": where,
                "what": what,
            },
            "deleted": True,
        }
        for bucket in buckets({"start": start, "end": end})
    ]


def _random_hex() -> str:
    return uuid.uuid4().hex
