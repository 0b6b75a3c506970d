"""What a vendor format must tell the rest of lake_assets, and the shared hourly landing layout."""

from __future__ import annotations

import abc
import dataclasses
import datetime as dt
import re
import string
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets.catalog.files import parquet_span
from lake_assets.engine.model import END_OF_TIME, START_OF_TIME, TableSpec
from lake_assets.engine.names import col
from lake_assets.epoch import EPOCH_MS_THRESHOLD, LARGEST_EPOCH_MS
from lake_assets.errors import InvalidValue
from lake_assets.paths import HOUR_KEY_FORMAT, parse_hour_key
from lake_assets.storage import (
    FILE_ERRORS,
    UNLISTABLE_FOLDER,
    Entry,
    Storage,
    data_files,
    each_request,
    is_hidden,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lake_assets.ingest import Batch
    from lake_assets.reruns import ByteRange

#: set by `normalise` on events derived in addition to a landed row's own event
DERIVED = "__derived"
#: set by `normalise` on every row: why the row cannot be used (its file is set aside), or NULL
INVALID = "__invalid"
#: given to `normalise` on every row: the landed file's URI as listed (and catalogued)
FILE_URI = "__file_uri"
#: given to `normalise` on every row: the partition whose listing holds the file (hour or batch)
FILE_PARTITION = "__file_partition"


@dataclasses.dataclass(frozen=True)
class LandingSurvey:
    """What discovery found at the top of a landing: its tables, and each entry no table reads
    (a folder whose name no table has, a file outside every table's folder), with the reason."""

    tables: list[str]
    unread: list[str] = dataclasses.field(default_factory=list)


def is_text_type(t: pa.DataType) -> bool:
    """Whether a landed column of this Arrow type holds text: a string, a large string, or either
    dictionary-encoded (as pyarrow writes a categorical column), all of which Spark reads as text."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t)


class FeedFormat(abc.ABC):
    """A vendor's landing layout and file format, mapped onto the normalised change model."""

    name: str
    #: the Hive column that partitions this feed's change log
    partition_column: str
    #: "hourly" (time-window partitions from the landing folders) or "batch" (the vendor's own
    #: batches, registered as they appear)
    partitioning: str = "hourly"
    #: "parquet": read by the shared Parquet reader (`ingest`); otherwise the format's `read_batch`
    file_format: str = "parquet"
    #: whether landed files may hold the same data again (`holding_removed_data`: Flow's
    #: overlapping fragments); the others' files hold data of their own
    files_share_data: bool = False
    #: the landed files' event-time column(s), for the catalog's time span of a file
    time_columns: tuple[str, ...] = ()
    #: whether the change batch's lineage reaches the landed files, so that Spark reads them
    #: again after it lost the batch's cached blocks, and a run must check that they are still the
    #: versions it catalogued (`landing_confirmation.confirm_unchanged`)
    batch_rereads_landing: bool = True
    #: the model of a feed of this format in the configuration file (a `FeedConfig`)
    config_model: type

    @abc.abstractmethod
    def survey(self, storage: Storage, landing: str) -> LandingSurvey:
        """The tables present in the landing area, and what in it no table reads (lists it:
        `lake-assets discover` and every run, never at load)."""

    def configured_tables(self, feed) -> list[str] | None:
        """The tables the feed's configuration names, or None when discovery finds them."""
        return list(feed.tables) if feed.tables else None

    @abc.abstractmethod
    def table_spec(self, table: str) -> TableSpec:
        """Key columns and engine options for a table."""

    @abc.abstractmethod
    def partition_keys(self, storage: Storage, landing: str, table: str) -> list[str]:
        """Every partition of a table with landed files, in partition order."""

    def holds_landed_files(
        self, storage: Storage, landing: str, table: str, besides: Collection[str] = ()
    ) -> bool:
        """Whether any partition of the table but those `besides` holds a landed file; the newest
        are listed first, and the listing stops at the first file found."""
        keys = [key for key in self.partition_keys(storage, landing, table) if key not in besides]
        return any(self.partition_files(storage, landing, table, key) for key in reversed(keys))

    def configured(self, feed) -> FeedFormat:
        """The format as one feed configures it (a Flow feed names its collections)."""
        return self

    def surveying_with(self, siblings: Sequence) -> FeedFormat:
        """The format that surveys a landing these sibling feeds share (`discovery.sharing_landing`),
        so that what they read is not named as read by no one: a Flow feed's survey reports the
        collections it is not configured for, and a sibling's are read. The other formats'
        surveys find every table, and discovery says which ones the siblings take."""
        return self

    def landed_hours(
        self, storage: Storage, landing: str, table: str, since: dt.datetime | None
    ) -> dict[str, tuple[Entry, ...]]:
        """Hourly formats: hour key -> the files landed in that hour (named as the format tells
        them apart, in name order), for the hours at or after `since`, listing only what can
        hold them (the sensor's cost follows the window)."""
        raise NotImplementedError(f"{self.name} is not partitioned by hour")

    def landing_span(self, storage: Storage, uri: str) -> tuple[int, int] | None:
        """Event-time span (ms) inside a landed file, for the catalog; None when unknown. A file
        that cannot be read now has none: reading it to hash it meets the same failure, and the
        catalog step says what it is (`pipeline.catalogue_landing`). A landed file's record is
        retired as it was stored, so a span missed here places it elsewhere, no more."""
        try:
            return parquet_span(storage, uri, self.time_columns)
        except FILE_ERRORS:
            return None

    def read_partitions(self, partitions: list[str]) -> list[str]:
        """The partitions whose files a run over `partitions` reads (a format may need context)."""
        return list(partitions)

    def partition_order(self, key: str):
        """Sort key of a partition key (hour keys sort as text; batches may not)."""
        return key

    def holding_removed_data(self, removed: list[str], landed: list[str]) -> dict[str, str]:
        """Landed file -> a removed file (URIs) that held some of the same data, so that the
        removal may change what a run over the landed file's partition finds (Flow: fragments
        holding the same journal bytes). Files of the other formats hold data of their own."""
        return {}

    def byte_ranges(self, landing: str, uris: list[str]) -> list[ByteRange]:
        """The stream bytes each of `uris` (files of `landing`) holds, named as a `Reading`
        names them (Flow: a fragment's journal and offsets). Files of the other formats are read
        whole, with data of their own."""
        return []

    def is_partition_key(self, key: str) -> bool:
        """Whether `key` can name a partition of the format (an hour key here)."""
        try:
            parse_hour_key(key)
        except InvalidValue:
            return False
        return True

    def stray_files(self, storage: Storage, landing: str, table: str) -> list[tuple[Entry, str]]:
        """Landed files of a table that belong to no valid partition, with the reason."""
        return []

    def read_batch(
        self,
        spark: SparkSession,
        storage: Storage,
        landing: str,
        table: str,
        files: dict[str, list[Entry]],
        partitions: list[str],
        processed_before: Callable[[], set[str]] = set,
        must_read: Sequence[ByteRange] = (),
        stored: T.StructType | None = None,
    ) -> Batch:
        """The batch of a format that reads its own files (`file_format` other than "parquet").
        `processed_before` lists the partitions processed before (called only when needed);
        `must_read` are parts of other partitions' files that runs asked these partitions to
        read (`reruns`); `stored` is the table's schema as stored, if it has one."""
        raise NotImplementedError(f"{self.name} files are read by the shared Parquet reader")

    @abc.abstractmethod
    def partition_files(self, storage: Storage, landing: str, table: str, partition: str) -> list[Entry]:
        """The landed data files of one partition of one table."""

    def partitions_files(
        self, storage: Storage, landing: str, table: str, partitions: list[str]
    ) -> dict[str, list[Entry]]:
        """`partition_files` of several partitions (a format may list them together), several
        listed at a time."""
        listed = each_request(lambda key: self.partition_files(storage, landing, table, key), partitions)
        return dict(zip(partitions, listed, strict=True))

    def landed_partitions_files(
        self, storage: Storage, landing: str, table: str, wanted: Callable[[str], bool]
    ) -> dict[str, list[Entry]]:
        """The `wanted` landed partitions (in partition order) with their files: what a sensor
        tick lists (a format may find both in one listing)."""
        keys = [key for key in self.partition_keys(storage, landing, table) if wanted(key)]
        return self.partitions_files(storage, landing, table, keys)

    @abc.abstractmethod
    def vet_schema(self, schema: pa.Schema) -> str | None:
        """Why a file with this Parquet schema cannot be used, or None when it can."""

    @abc.abstractmethod
    def normalise(self, raw: DataFrame) -> DataFrame:
        """Map the vendor's rows onto the change model.

        `raw` holds files of one Parquet schema (its nanosecond times already made times), and
        on every row its file's URI (`FILE_URI`) and partition (`FILE_PARTITION`), which the
        reader looks up once per file rather than parsing the path on every row.
        Returns the change-model columns (all but `_ingested_at`, which the reader adds: see
        `ingest.stamped`), the partition column, `FILE_URI` and `__invalid`: NULL for a good
        row, else the reason the row (and so its file) cannot be used. A feed that turns one
        landed row into several events marks the extra ones with `__derived` = true, so the
        batch still reconciles.
        """


# --- time values in any encoding a vendor may choose ---------------------------------------------


def stripped(text: Column) -> Column:
    """`text` without the white space at either end, any kind (tabs, line breaks, no-break
    spaces): Spark's `trim` takes plain spaces only."""
    return F.regexp_replace(text, r"(?U)^\s+|\s+$", "")


def ascii_upper(text: Column) -> Column:
    """`text` with the ASCII letters upper-cased and no other: Spark's `upper` follows Unicode,
    which spells a dotless i (U+0131) as `I`, so "insert" spelled with it would read as `INSERT`."""
    return F.translate(text, string.ascii_lowercase, string.ascii_uppercase)


def timestamp_column(column: str, spark_type: T.DataType) -> Column:
    """A column as a timestamp, whatever the file stored: a Parquet timestamp of any unit
    (nanoseconds are made times as they are read: `ingest`), INT96, ISO text, or an integer (or
    a decimal without fraction, as an unsigned 64-bit integer reaches Spark) of epoch seconds or
    milliseconds. NULL for a value none of these can read (text that is no time, an epoch
    beyond what Spark's timestamps hold)."""
    value = col(column)
    if isinstance(spark_type, T.StringType):
        text = stripped(value)
        # Spark reads a time of day alone ("03:00") as that time today, a moment that moves with
        # the run's date: text is a time only when it starts with its year.
        return F.when(text.rlike(r"^[+-]?[0-9]{4}"), F.try_to_timestamp(text))
    if isinstance(spark_type, T.IntegralType) or (
        isinstance(spark_type, T.DecimalType) and spark_type.scale == 0
    ):
        as_long = value.try_cast("long")
        in_millis = (as_long > EPOCH_MS_THRESHOLD) | (as_long < -EPOCH_MS_THRESHOLD)
        countable = as_long.between(-LARGEST_EPOCH_MS, LARGEST_EPOCH_MS)
        return F.when(in_millis, F.when(countable, F.timestamp_millis(as_long))).otherwise(
            F.timestamp_seconds(as_long)
        )
    if isinstance(spark_type, T.NullType):
        return F.lit(None).cast("timestamp")
    return value.try_cast("timestamp")  # a float beyond Spark's times is no time, not a failed read


def nanoseconds_as_time(value: Column, *, zoned: bool) -> Column:
    """A Parquet TIMESTAMP(NANOS), which Spark reads as a long (spark.py), as the time it is: a
    timestamp for an instant (`zoned`), a timestamp without zone otherwise, as Spark reads the
    other units. Rounded down to the microsecond in whole numbers: `/` divides as doubles, which
    at today's epochs are 256 ns apart, and moved times near the end of a millisecond into the
    next one. `div` rounds towards zero, so a negative value with a remainder takes one off;
    nothing is subtracted from the value itself, which could overflow near the smallest long."""
    truncated = F.call_function("div", value, F.lit(1000))
    micros = truncated - ((value % 1000) < 0).cast("long")
    instant = F.timestamp_micros(micros)
    return instant if zoned else instant.cast(T.TimestampNTZType())


def outside_history(moment: Column, column: str) -> Column:
    """The reason an event time cannot open a version, or NULL: it lies after the end every open
    version's window has (`END_OF_TIME`), so its version would end before it begins (a year
    10000, or an epoch in microseconds read as milliseconds), or before the year 1
    (`START_OF_TIME`: a year 0 in text, an epoch of seconds far below zero)."""
    given = col(column).cast("string")
    return F.when(
        moment > F.to_timestamp(F.lit(END_OF_TIME)),
        F.concat(F.lit(f"{column} lies after {END_OF_TIME}, where open history ends: "), given),
    ).when(
        moment < F.to_timestamp(F.lit(START_OF_TIME)),
        F.concat(F.lit(f"{column} lies before {START_OF_TIME}, the earliest time the lake keeps: "), given),
    )


# --- the year=/month=/day=/hour= landing layout (Unit; Hive-style hourly folders) ---------------

#: (level, digits): a month, day or hour may drop its leading zero (`month=3`); a year has four
#: digits, from 1000 on, as hour keys (`2024-03-01-05`) and Dagster's hourly partitions write it
_HOURLY_LEVELS = (("year", "4"), ("month", "1,2"), ("day", "1,2"), ("hour", "1,2"))
_FIRST_YEAR = 1000
_LEVEL_HINTS = {
    "year": "year=<four digits, 1000 or later>",
    "month": "month=1..12",
    "day": "day=1..the month's last day",
    "hour": "hour=0..23",
}


def hour_key(moment: dt.datetime) -> str:
    return moment.strftime(HOUR_KEY_FORMAT)


def current_hour() -> dt.datetime:
    """The hour under way, in UTC (naive, like the hours folders name): the last hour that is a
    partition. A folder dated later holds no partition yet (`why_not_yet`)."""
    return dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0, tzinfo=None)


def why_not_yet(moment: dt.datetime, where: str) -> str | None:
    """Why the files of hour folder `where` (hour `moment`) are not read yet, or None: a folder
    dated after the hour under way (a vendor's clock, or times that are not UTC) is no
    partition until its hour comes, so its files are reported, not read."""
    if moment <= current_hour():
        return None
    return (
        f"hour folder '{where}' is dated {hour_key(moment)}, after the current UTC hour "
        f"{hour_key(current_hour())}: its files are read once that hour has begun"
    )


def _first_moment(levels: tuple[int, ...]) -> dt.datetime:
    """The first moment of the year, month, day or hour whose leading levels these are."""
    year, month, day, hour = (*levels, 1, 1, 0)[:4]
    return dt.datetime(year, month, day, hour)


def _level_value(name: str, depth: int, prefix: tuple[int, ...]) -> int | None:
    """The value of folder `name` at `depth` of the hourly layout below the values `prefix`, or
    None when it is not a valid one: a name of another level or not a number (`year=abc`,
    `hour=-1`, `year=24`), or no such time (`hour=25`, `month=13`, `day=30` in February)."""
    level, digits = _HOURLY_LEVELS[depth]
    match = re.fullmatch(rf"{level}=([0-9]{{{digits}}})", name)
    if not match:
        return None
    parts = (*prefix, int(match.group(1)))
    if parts[0] < _FIRST_YEAR:
        return None
    try:
        _first_moment(parts)  # a year, month or day stands for its first hour
    except ValueError:
        return None
    return parts[-1]


def files_in_folders(
    storage: Storage, folders: Mapping[str, Sequence[str]], keys: list[str]
) -> dict[str, list[Entry]]:
    """key -> the data files of its `folders` (a partition may be spelled by several folders),
    for each of `keys`, their folders listed several at a time (`each_request`): a backfill's
    partitions are a listing each."""
    listed = each_request(
        lambda key: [e for folder in folders.get(key, ()) for e in data_files(storage, folder)], keys
    )
    return dict(zip(keys, listed, strict=True))


def hour_folders(
    storage: Storage, table_uri: str, since: dt.datetime | None = None, until: dt.datetime | None = None
) -> dict[str, list[str]]:
    """Hour key -> the folder(s) under `table_uri` that hold that hour, pruning whole
    years/months/days outside [`since`, `until`].

    A level may be written without its leading zero (`month=3`): both spellings of an hour are
    the same partition, so a key can have two folders. The pruning is what keeps a sensor tick
    and a run's listing cheap: only branches that can hold the wanted hours are listed, never
    the whole history. Folders that are not valid times hold no hour (see `hourly_strays`).
    """
    found: dict[str, list[str]] = {}
    if until is None:  # a listing of what landed: later hours are no partitions yet (`why_not_yet`)
        until = current_hour()
    bounds = [tuple(getattr(b, level) for level, _ in _HOURLY_LEVELS) if b else None for b in (since, until)]

    def descend(uri: str, depth: int, prefix: tuple[int, ...]) -> None:
        for entry in storage.list(uri):
            value = _level_value(entry.name, depth, prefix) if entry.is_dir else None
            if value is None:
                continue
            parts = (*prefix, value)
            floor, ceiling = (b[: depth + 1] if b else None for b in bounds)
            if (floor and parts < floor) or (ceiling and parts > ceiling):
                continue
            if depth < len(_HOURLY_LEVELS) - 1:
                descend(entry.uri, depth + 1, parts)
                continue
            found.setdefault(hour_key(_first_moment(parts)), []).append(entry.uri)

    descend(table_uri, 0, ())
    return found


#: hours asked at once from which their files come from one walk of the table rather than a
#: listing per hour folder (a year of hours: ~8,760 requests on S3, minutes of a backfill). The
#: walk lists the whole table, a thousand keys a request: fewer requests than a week's hour
#: folders until the table holds some 170k files
WALK_FROM_HOURS = 168


def hourly_files(storage: Storage, table_uri: str, since: dt.datetime | None) -> dict[str, list[Entry]]:
    """Hour key -> the data files landed in that hour (in every folder spelling of it), for the
    hours at or after `since` up to the hour under way: with `since`, from the folders that can
    hold those hours (`hour_folders`, a sensor's window), without it from one walk
    (`walked_hours`) where the walk can list every folder."""
    walked = walked_hours(storage, table_uri, _hour_of_levels, len(_HOURLY_LEVELS)) if since is None else None
    if walked is not None:
        return walked
    return {
        key: [e for folder in folders for e in data_files(storage, folder)]
        for key, folders in hour_folders(storage, table_uri, since).items()
    }


def walked_hours(
    storage: Storage, uri: str, hour_of: Callable[[list[str]], dt.datetime | None], levels: int
) -> dict[str, list[Entry]] | None:
    """Hour key -> the data files under `uri` whose folders below it (`levels` of them) `hour_of`
    names an hour up to the hour under way, from one walk of `uri` (`Storage.walk_files`: on
    S3 a listing of its keys, a thousand to a request; no folder deeper is entered).
    Descending folder by folder asks once per folder: a year of
    hours took minutes on S3, more than a sensor's tick may take. None when the walk met a
    folder it could not list (a local or mounted folder's I/O error): the caller descends
    instead, which raises for such a folder where it could hold an hour, rather than leave its
    hours out."""
    now = current_hour()
    found: dict[str, list[Entry]] = {}
    for entry in storage.walk_files(uri, skip=is_hidden, levels=levels):
        if entry.is_dir and (entry.unreadable or "").startswith(UNLISTABLE_FOLDER):
            return None
        if entry.is_dir or entry.unreadable is not None:
            continue
        hour = hour_of(entry.uri[len(uri.rstrip("/")) + 1 :].split("/")[:-1])
        if hour is not None and hour <= now:
            found.setdefault(hour_key(hour), []).append(entry)
    return found


def _hour_of_levels(folders: list[str]) -> dt.datetime | None:
    """The hour a file's folders below its table name, or None unless they are exactly the four
    levels of the hourly layout, each valid (`_level_value`)."""
    if len(folders) != len(_HOURLY_LEVELS):
        return None
    parts = _leading_level_values(folders)
    return _first_moment(parts) if len(parts) == len(_HOURLY_LEVELS) else None


def _leading_level_values(folders: Sequence[str]) -> tuple[int, ...]:
    """The values of the leading `folders` (at most the layout's four) that are valid levels of
    the hourly layout (`_level_value`), up to the first that is not."""
    parts: tuple[int, ...] = ()
    for depth, name in enumerate(folders[: len(_HOURLY_LEVELS)]):
        value = _level_value(name, depth, parts)
        if value is None:
            break
        parts = (*parts, value)
    return parts


def _in_the_hourly_layout(folders: list[str]) -> bool:
    """Whether `folders` (below a table folder) are an hour folder's path or the beginning of
    one, where a link is followed as the hours' listing follows it."""
    return len(folders) <= len(_HOURLY_LEVELS) and len(_leading_level_values(folders)) == len(folders)


def hourly_strays(storage: Storage, table_uri: str) -> list[tuple[Entry, str]]:
    """Every file under `table_uri` that no hour reads, with the reason: in a folder that is
    not a valid time, not inside an hour folder, inside a folder within an hour folder, or a
    link that cannot be read. A link to a folder anywhere but on an hour folder's path is one
    stray, not followed. Hidden and marker files are not data (`is_hidden`).

    One walk of the whole table: a run's cost, not a sensor tick's.
    """
    strays = []
    # asked once per folder of this walk (an hour folder's files share its answer); not kept
    # beyond it, since whether an hour has begun depends on the clock
    folder_reasons: dict[tuple[str, ...], str | None] = {}
    for entry in storage.walk_files(table_uri, skip=is_hidden, follow_link=_in_the_hourly_layout):
        folders = tuple(entry.uri[len(table_uri.rstrip("/")) + 1 :].split("/")[:-1])
        if folders not in folder_reasons:
            folder_reasons[folders] = _why_no_hour_reads(folders)
        reason = entry.unreadable or folder_reasons[folders]
        if reason is not None:
            strays.append((entry, reason))
    return strays


def _why_no_hour_reads(folders: tuple[str, ...]) -> str | None:
    """Why a file in `folders` (the path below the table folder) is in no hour, or None."""
    prefix = _leading_level_values(folders)
    depth = len(prefix)
    if depth < min(len(folders), len(_HOURLY_LEVELS)):
        level = _HOURLY_LEVELS[depth][0]
        where = "/".join(folders[: depth + 1])
        return f"folder '{where}' is not a valid {level} folder ({_LEVEL_HINTS[level]}), so the file belongs to no hour"
    if len(folders) < len(_HOURLY_LEVELS):
        return "the file is not inside an hour folder (year=/month=/day=/hour=)"
    if len(folders) > len(_HOURLY_LEVELS):
        return (
            f"the file is inside '{'/'.join(folders[len(_HOURLY_LEVELS) :])}', a folder within hour folder "
            f"'{'/'.join(folders[: len(_HOURLY_LEVELS)])}'; only files directly in an hour folder are read"
        )
    return why_not_yet(_first_moment(prefix), "/".join(folders))


def list_hour_folders(storage: Storage, table_uri: str, since: dt.datetime | None = None) -> list[str]:
    """Hour keys with a folder under `table_uri`, at or after `since` (see `hour_folders`)."""
    return sorted(hour_folders(storage, table_uri, since))
