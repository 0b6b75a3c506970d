"""GRAX Data Lake v2: Parquet under `parquet/v2/org=<org>/object=<Object>/batch=<hex>/data-<hex>.parquet`.

Facts (docs/formats/grax-v2.md): a version of a record is
`(Id, source__modified)` and the greatest `grax__idseq` (text) among its writes wins; rows repeat
and arrive out of order; every file has its own schema (only fields with data, sometimes a field
with none); non-string fields come with typed copies (`_b _i _f _ts _t _d`) beside the string
value, and the typed copy of a field may switch over time; `grax__deleted` marks a delete or an
archive (`grax__deletesource`), `grax__purged` a purge, `grax__restoredfrom` the Id a restored
record came from (a restored record is a new key). Batch and file names are increasing hex
numbers, compared as numbers and never read as clocks.

One table per org and object: its name is `<org>/<object in lower case>`, so the lake holds it at
`<layer>/<feed>/<org>/<object>/` and the assets are keyed `[feed, org, object, layer]`. Object
folders whose names differ only in case (`object=Account`, `object=ACCOUNT`) are one object, as
Salesforce API names ignore case, and so one table: all are read (see `object_folders`).

Mapping onto the change model, one landed row at a time:
- the row is the version `source__modified` of `Id`, sequenced by `grax__idseq`;
- a row with `grax__deleted` also yields a delete event at the delete time (or at the version
  time, when the vendor stamped the delete earlier), sequenced just after the row's own write so
  that a delete stamped at the version time wins over it;
- a row with `grax__purged` carries the purge marker: the engine erases the key's field data;
- field `X` with typed copies becomes one column `X` of the copy's type (several copies in one
  file widen as across files: double for integer + float, timestamp for date + timestamp, else
  text) and `X__string` keeps the vendor's string for audit; a field without typed copies stays
  text. Across files the engine widens the types the same way, so a switch loses no value.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from typing import Annotated, Literal

import pyarrow as pa
from pydantic import Field, model_validator
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets.config_model import FeedConfig, HourKey, LateHours, Names, checked, refused
from lake_assets.engine import model as m
from lake_assets.engine.names import col, lake_name, same_name, vendor_name
from lake_assets.engine.schema import change_columns, widen
from lake_assets.epoch import DAY_MS
from lake_assets.errors import InvalidValue, SchemaClash
from lake_assets.feeds.base import (
    DERIVED,
    FILE_PARTITION,
    FILE_URI,
    INVALID,
    FeedFormat,
    LandingSurvey,
    files_in_folders,
    is_text_type,
    outside_history,
    stripped,
    timestamp_column,
)
from lake_assets.paths import safe_segment
from lake_assets.storage import Entry, Storage, is_hidden

KEY = "Id"
MODIFIED = "source__modified"
IDSEQ = "grax__idseq"
DELETED = "grax__deleted"
DELETE_SOURCE = "grax__deletesource"
PURGED = "grax__purged"
RESTORED_FROM = "grax__restoredfrom"
GRAX_COLUMNS = (KEY, MODIFIED, IDSEQ, DELETED, DELETE_SOURCE, PURGED, RESTORED_FROM)
STRING_COPY_SUFFIX = "__string"
#: appended to a deleted row's idseq: greater than the row's own write, smaller than the next one
#: of the same width
DELETE_SEQ_SUFFIX = "~"
_SEQ_LIKE_A_DELETE = (
    f"{IDSEQ} ends with '{DELETE_SEQ_SUFFIX}', as the sequence of the delete the lake derives from "
    "a deleted row does: beside a deleted row of the same Id and time it would be taken for a copy of its delete"
)

TYPED_SUFFIXES: dict[str, T.DataType | None] = {
    "b": T.BooleanType(),
    "i": T.LongType(),
    "f": T.DoubleType(),
    "ts": T.TimestampType(),
    "t": None,
    "d": T.DateType(),
}
_TYPED = re.compile(r"^(?P<field>.+)_(?P<suffix>b|i|f|ts|t|d)$")
_BATCH = re.compile(r"^[0-9a-fA-F]{1,16}$")
#: what a batch key that `_BATCH` refuses is not, as messages say it
_NOT_A_BATCH = "is not a hex number of 1 to 16 digits"
_ORG = re.compile(r"^[A-Za-z0-9]{1,64}$")
_OBJECT = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")
V2_PREFIX = ("parquet", "v2")


def is_batch_key(value: str) -> bool:
    return bool(_BATCH.fullmatch(value or ""))


def batch_order(key: str) -> int:
    """Batches are opaque increasing hex numbers: compare them as numbers."""
    if not is_batch_key(key):
        raise InvalidValue(f"batch {key!r} {_NOT_A_BATCH}")
    return int(key, 16)


def sort_batches(keys) -> list[str]:
    return sorted(keys, key=batch_order)


def is_table(value: object) -> bool:
    """Whether `value` names a GRAX table: `<org>/<object in lower case>`."""
    org, _, obj = value.partition("/") if isinstance(value, str) else ("", "", "")
    return bool(_ORG.fullmatch(org)) and bool(_OBJECT.fullmatch(obj)) and obj == obj.lower()


def split_table(table: str) -> tuple[str, str]:
    """`<org>/<object>` -> (org, object), both validated for use in paths."""
    if not is_table(table):
        raise InvalidValue(f"GRAX table {table!r} must be '<org>/<object in lower case>'")
    org, _, obj = table.partition("/")
    return org, obj


def _folder_value(entry: Entry, level: str) -> str | None:
    """The value of a `<level>=<value>` folder, else None."""
    return entry.name[len(level) + 1 :] if entry.is_dir and entry.name.startswith(f"{level}=") else None


def _unread_entry(entry: Entry, expected: str) -> list[str]:
    """The entry, with why no table reads it, unless hidden (`_SUCCESS`, `.crc`)."""
    if is_hidden(entry.name):
        return []
    what = f" ({entry.unreadable})" if entry.unreadable else ""
    return [f"{entry.uri}{'/' if entry.is_dir else ''}{what}: not {expected}, so no table reads it"]


def _is_batch_folder(name: str) -> bool:
    """Whether `name` is a batch folder's: `batch=` and a hex number."""
    return name.startswith("batch=") and is_batch_key(name.removeprefix("batch="))


def _in_the_batch_layout(folders: list[str]) -> bool:
    """Whether `folders` (below an object folder) are none or a batch folder, where a link is
    followed as the batches' listing follows it."""
    return not folders or (len(folders) == 1 and _is_batch_folder(folders[0]))


def _why_no_batch_reads(object_folder: str, folders: list[str]) -> str | None:
    """Why a file in `folders` (its path below `object_folder`) is in no batch, or None when it
    is directly in a `batch=<hex>` folder, where a run reads it."""
    if not folders:
        return f"the file is directly in '{object_folder}', not inside a batch=<hex number> folder"
    if not folders[0].startswith("batch="):
        return f"folder '{folders[0]}' is not a batch folder (batch=<hex number>), so the file belongs to no batch"
    if not _is_batch_folder(folders[0]):
        return f"batch folder '{folders[0]}' {_NOT_A_BATCH}, so the file belongs to no batch"
    if len(folders) > 1:
        return (
            f"the file is inside '{'/'.join(folders[1:])}', a folder within batch folder '{folders[0]}'; "
            "only files directly in a batch folder are read"
        )
    return None


def typed_copies(columns: list[str]) -> dict[str, dict[str, str]]:
    """field -> {suffix: column} for columns that are typed copies of a field present beside them.

    A column like `Is_b` counts as a typed copy only when `Is` is in the same file: GRAX writes
    the string value of every field that has data, so a lone `Is_b` is a field of its own, and
    so is one whose `Is` is itself a copy.
    Columns go by their lake Names, pairs are found by the vendor's: a field `hour` (in the lake
    `_src_hour`, a reserved name) has its copy `hour_i`.
    """
    present = set(columns)
    pairs: dict[str, tuple[str, str]] = {}  # column -> (its field, suffix)
    for column in columns:
        match = _TYPED.match(vendor_name(column))
        if match is None:
            continue
        field = lake_name(match.group("field"))
        if field in present and field not in GRAX_COLUMNS:
            pairs[column] = (field, match.group("suffix"))

    def is_copy(column: str) -> bool:
        # GRAX types fields, not copies: beside `Total` and `Total_i`, a `Total_i_b` is a field
        # of its own (taken for a copy of a copy, its values went nowhere), and `Total_i_b_b`
        # that field's copy. Fields and copies alternate down a chain of names, each shorter.
        steps = 0
        while column in pairs:
            column, steps = pairs[column][0], steps + 1
        return steps % 2 == 1

    copies: dict[str, dict[str, str]] = {}
    for column, (field, suffix) in pairs.items():
        if is_copy(column):
            copies.setdefault(field, {})[suffix] = column
    return copies


#: the Parquet types (as pyarrow reads them) each kind of typed copy may be stored in: its own,
#: text, or a type whose values convert to it (checked value by value in `_typed_copy`)
_TYPED_STORAGE = {
    "b": (pa.types.is_boolean, pa.types.is_integer),
    "i": (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_boolean),
    "f": (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_boolean),
    # epochs as whole numbers only: seconds or milliseconds by size (`timestamp_column`); a
    # float's unit and precision are anyone's guess
    "ts": (
        pa.types.is_timestamp,
        pa.types.is_date,
        pa.types.is_integer,
        lambda kind: pa.types.is_decimal(kind) and kind.scale == 0,
    ),
    "d": (pa.types.is_date, pa.types.is_timestamp),
}


def _typed_copy_stored_apart(schema: pa.Schema) -> str | None:
    """Why a typed field's columns cannot be read: a column named like the text the lake keeps
    beside a typed field (`X__string` beside `X` and `X_f`), or a typed copy stored in a type
    that holds no value of its kind (a date copy stored as a number, a float copy as bytes)."""
    by_lake_name = {lake_name(f.name): f for f in schema}
    copies = typed_copies(list(by_lake_name))
    taken = {same_name(field + STRING_COPY_SUFFIX): field for field in copies}
    for name in by_lake_name:
        if same_name(name) in taken:
            field = taken[same_name(name)]
            return f"column '{by_lake_name[name].name}' has the name the lake gives the text of typed field '{field}'"
    for column, suffix in sorted((c, s) for group in copies.values() for s, c in group.items()):
        target = TYPED_SUFFIXES[suffix]
        if target is None:
            continue  # a time-of-day copy is kept as it is read
        kind = by_lake_name[column].type
        fits = (pa.types.is_null, pa.types.is_string, pa.types.is_large_string, *_TYPED_STORAGE[suffix])
        if not any(is_kind(kind) for is_kind in fits):
            name = by_lake_name[column].name
            return f"typed column '{name}' is stored as {kind}, which holds no {target.simpleString()} values"
    return None


class GraxV2FeedConfig(FeedConfig):
    """A GRAX Data Lake v2 feed: its tables are `<org>/<object>`, and it may name the orgs and
    objects to take (all that landed otherwise)."""

    format: Literal["grax_v2"]
    tables: Names[Annotated[str, checked("'<org id>/<object in lower case>'", is_table)]] | None = None
    orgs: (
        Names[Annotated[str, checked("a Salesforce org id (letters and digits)", _ORG.fullmatch)]] | None
    ) = None
    objects: Names[Annotated[str, checked("an object name such as Account", _OBJECT.fullmatch)]] | None = None
    # Options of hourly feeds: GRAX partitions are batches. Refused when given, never dumped.
    start: HourKey | None = Field(default=None, exclude=True)
    late_hours: LateHours = Field(default=4, exclude=True)

    @model_validator(mode="after")
    def _no_hourly_options(self) -> GraxV2FeedConfig:
        for key in ("start", "late_hours"):
            if key in self.model_fields_set:
                raise refused(
                    "this key applies to hourly feeds (unit_cdc, flow_journal) only: GRAX's partitions are batches",
                    at=(key,),
                )
        return self


class GraxV2Format(FeedFormat):
    name = "grax_v2"
    config_model = GraxV2FeedConfig
    partition_column = "batch"
    time_columns = (MODIFIED,)
    partitioning = "batch"

    # --- landing layout ---------------------------------------------------------------------
    @staticmethod
    def v2_root(storage: Storage, landing: str) -> str:
        """The landing may name the bucket folder that holds `parquet/v2`, or `parquet/v2` itself."""
        nested = f"{landing}/{'/'.join(V2_PREFIX)}"
        return nested if storage.exists(nested) else landing

    def survey(self, storage: Storage, landing: str) -> LandingSurvey:
        root = self.v2_root(storage, landing)
        tables, unread = [], self._beside_v2(storage, landing) if root != landing else []
        for org_entry in storage.list(root):
            org = _folder_value(org_entry, "org")
            if org is None or not _ORG.fullmatch(org):
                unread += _unread_entry(org_entry, "an org=<Salesforce org ID> folder")
                continue
            for obj_entry in storage.list(org_entry.uri):
                obj = _folder_value(obj_entry, "object")
                if obj is not None and _OBJECT.fullmatch(obj):
                    tables.append(f"{org}/{obj.lower()}")
                else:
                    unread += _unread_entry(obj_entry, "an object=<Salesforce object API name> folder")
        return LandingSurvey(sorted(set(tables)), sorted(unread))

    @staticmethod
    def _beside_v2(storage: Storage, landing: str) -> list[str]:
        """What a landing naming the folder that holds `parquet/v2` has beside it (another
        version's folder, a file at the top): no table reads it."""
        unread, folder = [], landing
        for step in V2_PREFIX:
            for entry in storage.list(folder):
                if not (entry.is_dir and entry.name == step):
                    unread += _unread_entry(entry, f"inside {'/'.join(V2_PREFIX)}")
            folder = f"{folder}/{step}"
        return unread

    def object_folders(self, storage: Storage, landing: str, table: str) -> list[str]:
        """Every landed `object=<Object>` folder of a table, in listing order.

        Salesforce object API names ignore case, and the table is named by the object in lower
        case, so `object=Account` and `object=ACCOUNT` are one table: the folders are read
        together and a batch found in several of them holds the files of all (rows from both
        fold by `Id` and `grax__idseq` as any other rows do). Reading only one would drop the
        other's rows without a word.
        """
        org, obj = split_table(table)
        org_uri = f"{self.v2_root(storage, landing)}/org={safe_segment(org, 'org')}"
        return [
            entry.uri
            for entry in storage.list(org_uri)
            if (_folder_value(entry, "object") or "").lower() == obj
        ]

    def batch_folders(self, storage: Storage, landing: str, table: str) -> dict[str, list[str]]:
        """Batch key -> its folders, for the valid batches; the files of the rest are strays
        (`stray_files`).

        A batch is a hex number: `batch=0a1`, `batch=0A1` and `batch=00a1` are one batch, whose
        folders (in every object folder) are read together, keyed by the least of its spellings
        in lower case (the landed spelling itself when there is one). Two keys for one batch
        would write their rows under whichever spelling ran last and remove each other's on the
        next run."""
        by_number: dict[int, tuple[str, list[str]]] = {}
        for folder in self.object_folders(storage, landing, table):
            for entry in storage.list(folder):
                spelled = _folder_value(entry, "batch")
                if spelled is None or not is_batch_key(spelled):
                    continue
                key, folders = by_number.get(batch_order(spelled), (spelled.lower(), []))
                by_number[batch_order(spelled)] = (min(key, spelled.lower()), [*folders, entry.uri])
        return dict(by_number.values())

    def partition_keys(self, storage: Storage, landing: str, table: str) -> list[str]:
        return sort_batches(self.batch_folders(storage, landing, table))

    def partition_order(self, key: str) -> int:
        return batch_order(key)

    def is_partition_key(self, key: str) -> bool:
        return is_batch_key(key)

    def stray_files(self, storage: Storage, landing: str, table: str) -> list[tuple[Entry, str]]:
        """Every file under the table's object folders that no batch reads, with the reason.
        One walk of each object folder: a run's cost, not a sensor tick's."""
        strays = []
        for folder in self.object_folders(storage, landing, table):
            for entry in storage.walk_files(folder, skip=is_hidden, follow_link=_in_the_batch_layout):
                folders = entry.uri[len(folder.rstrip("/")) + 1 :].split("/")[:-1]
                reason = entry.unreadable or _why_no_batch_reads(folder.rsplit("/", 1)[-1], folders)
                if reason is not None:
                    strays.append((entry, reason))
        return strays

    def partition_files(self, storage: Storage, landing: str, table: str, partition: str) -> list[Entry]:
        return self.partitions_files(storage, landing, table, [partition])[partition]

    def partitions_files(
        self, storage: Storage, landing: str, table: str, partitions: list[str]
    ) -> dict[str, list[Entry]]:
        """The files of each batch, from one listing of the table's batch folders."""
        for partition in partitions:
            if not is_batch_key(partition):
                raise InvalidValue(f"batch partition {partition!r} {_NOT_A_BATCH}")
        return self._files_of(storage, self.batch_folders(storage, landing, table), partitions)

    def landed_partitions_files(
        self, storage: Storage, landing: str, table: str, wanted: Callable[[str], bool]
    ) -> dict[str, list[Entry]]:
        folders = self.batch_folders(storage, landing, table)
        return self._files_of(storage, folders, [key for key in sort_batches(folders) if wanted(key)])

    @staticmethod
    def _files_of(storage: Storage, folders: dict[str, list[str]], keys: list[str]) -> dict[str, list[Entry]]:
        # Looked up as keyed: a partition registered under another spelling of a batch (before
        # batches were keyed as `batch_folders` keys them) has no files, so its rows leave
        # `changes` once.
        return files_in_folders(storage, folders, keys)

    def table_spec(self, table: str) -> m.TableSpec:
        return m.TableSpec(name=table, keys=(KEY,))

    # --- files --------------------------------------------------------------------------------
    def vet_schema(self, schema: pa.Schema) -> str | None:
        spelled = _grax_spellings(schema.names)
        schema = pa.schema([f.with_name(spelled.get(f.name, f.name)) for f in schema])
        names = set(schema.names)
        missing = [c for c in (KEY, MODIFIED, IDSEQ) if c not in names]
        if missing:
            return f"missing the required column(s) {missing}"
        for column in (KEY, IDSEQ):
            kind = schema.field(column).type
            if not (is_text_type(kind) or pa.types.is_null(kind)):
                return f"column '{column}' has type {kind}, expected a string"
        for column in (MODIFIED, DELETED, PURGED):
            if column in names:
                kind = schema.field(column).type
                if not (pa.types.is_timestamp(kind) or pa.types.is_null(kind) or is_text_type(kind)):
                    return f"column '{column}' has type {kind}, expected a timestamp"
        return _typed_copy_stored_apart(schema)

    def normalise(self, raw: DataFrame) -> DataFrame:
        rows = _LandedRows.of(raw)
        version_at = F.date_trunc("millisecond", rows.stamp(MODIFIED))
        seq = F.col(IDSEQ).cast("string")
        versions = rows.raw.select(
            F.col(KEY).cast("string").alias(KEY),
            *rows.payload(),
            *change_columns(
                op=F.lit(m.UPDATE),
                version_at=version_at,
                seq=seq,
                source_file=F.col(FILE_URI),
                partition=F.col(FILE_PARTITION),
                partition_column=self.partition_column,
                purged=rows.stamp(PURGED).isNotNull(),
            ),
            rows.invalid_reason(version_at, seq).alias(INVALID),
            F.col(FILE_URI),
            F.lit(False).alias(DERIVED),
            F.date_trunc("millisecond", rows.stamp(DELETED)).alias(_DELETED_AT),
        )
        return versions.unionByName(_deletes_of(versions)).drop(_DELETED_AT)


#: a deleted row's delete time, while its delete event is derived
_DELETED_AT = "__deleted_at"


@dataclasses.dataclass(frozen=True)
class _LandedRows:
    """A landed file's rows under GRAX's own spellings, with the typed copies of their fields."""

    raw: DataFrame
    #: the vendor's columns (not the reader's own `__` ones)
    columns: list[str]
    #: field -> typed-copy suffix -> the copy's column (`typed_copies`)
    copies: dict[str, dict[str, str]]

    @classmethod
    def of(cls, raw: DataFrame) -> _LandedRows:
        spelled = _grax_spellings(raw.columns)
        if spelled:
            raw = raw.withColumnsRenamed(spelled)
        columns = [c for c in raw.columns if not c.startswith("__")]
        return cls(raw, columns, typed_copies(columns))

    def stamp(self, column: str) -> Column:
        """A time column as a timestamp, however it is stored (NULL where the file lacks it)."""
        if column not in self.columns:
            return F.lit(None).cast("timestamp")
        return timestamp_column(column, self.raw.schema[column].dataType)

    def payload(self) -> list[Column]:
        """The record's fields: each with typed copies as one typed column (and its string copy),
        the delete and purge markers as times (they stay readable, as lineage), the rest as is."""
        typed_columns = {c for group in self.copies.values() for c in group.values()}
        payload: list[Column] = []
        for column in self.columns:
            if column in (KEY, MODIFIED, IDSEQ) or column in typed_columns:
                continue
            if column in self.copies:
                payload.extend(_typed_field(self.raw, column, self.copies[column]))
            elif column in (DELETED, PURGED):
                payload.append(self.stamp(column).alias(column))
            else:
                payload.append(col(column).alias(column))
        return payload

    def invalid_reason(self, version_at: Column, seq: Column) -> Column:
        """Why a row cannot be an event (NULL for a valid row). Of the required fields, the first
        missing one is named (or a version time outside history); a delete time outside history
        only when none of that was found; a marker that is no time, a typed copy that is not its
        type, and an epoch of unknown unit each replace what was found before them, in that order."""
        reason = (
            F.when(F.col(KEY).isNull(), F.lit(f"{KEY} is NULL"))
            .when(seq.isNull(), F.lit(f"{IDSEQ} is NULL"))
            # A sequence the lake gives a derived delete would be taken for that delete's copy.
            .when(seq.endswith(DELETE_SEQ_SUFFIX), F.lit(_SEQ_LIKE_A_DELETE))
            .when(version_at.isNull(), _not_a_time(MODIFIED))
            .otherwise(outside_history(version_at, MODIFIED))
        )
        if DELETED in self.columns:  # a delete opens its own event at its time
            reason = F.coalesce(reason, outside_history(self.stamp(DELETED), DELETED))
        for found, why in [
            *self._markers_not_times(),
            *self._copies_not_their_type(),
            *self._epochs_unlike_text(),
        ]:
            reason = F.when(found, why).otherwise(reason)
        return reason

    def _markers_not_times(self) -> list[tuple[Column, Column]]:
        """A marker given as text must be a time, or empty for 'not deleted/purged': other text
        ("yes") cannot say whether the record is gone, and read as no marker it would keep a
        deleted record live or a purged one's field data."""
        return [
            ((stripped(F.col(column)) != "") & self.stamp(column).isNull(), _not_a_time(column))
            for column in (DELETED, PURGED)
            if column in self.columns and isinstance(self.raw.schema[column].dataType, T.StringType)
        ]

    def _copies_not_their_type(self) -> list[tuple[Column, Column]]:
        """Typed copies holding a value their type cannot keep unchanged (`_typed_copy`)."""
        found = []
        for column, suffix in sorted((c, s) for group in self.copies.values() for s, c in group.items()):
            copy = _typed_copy(self.raw, column, suffix)
            if copy is not None and copy.changed is not None:
                not_its_type = (
                    f"typed column '{column}' holds a value that is not {copy.kind.simpleString()}: "
                )
                found.append((copy.changed, F.concat(F.lit(not_its_type), col(column).cast("string"))))
        return found

    def _epochs_unlike_text(self) -> list[tuple[Column, Column]]:
        """Timestamp copies stored as epoch numbers whose unit cannot be told from the field's text."""
        schema, found = self.raw.schema, []
        for field, group in sorted(self.copies.items()):
            epochs = group.get("ts")
            if (
                epochs is None
                or not _holds_epoch_numbers(schema[epochs].dataType)
                or not isinstance(schema[field].dataType, T.StringType)
            ):
                continue
            unlike = _epoch_unlike_its_text(
                timestamp_column(field, T.StringType()), timestamp_column(epochs, schema[epochs].dataType)
            )
            why = F.concat(
                F.lit(f"typed column '{epochs}' holds the epoch "),
                col(epochs).cast("string"),
                F.lit(f", whose unit cannot be told: read by its size it is not '{field}' "),
                col(field).cast("string"),
            )
            found.append((unlike, why))
        return found


def _not_a_time(column: str) -> Column:
    return F.concat(
        F.lit(f"{column} is not a time: "), F.coalesce(F.col(column).cast("string"), F.lit("NULL"))
    )


def _deletes_of(versions: DataFrame) -> DataFrame:
    """The delete event of each deleted row: the key only, at the delete time (or at the version
    time, when the vendor stamped the delete before it), sequenced just after the row's write."""
    payload = {c for c in versions.columns if c != KEY and not m.is_reserved(c) and c != INVALID}
    return (
        versions.where(F.col(_DELETED_AT).isNotNull())
        .select(
            *[
                F.lit(None).cast(versions.schema[c].dataType).alias(c) if c in payload else col(c)
                for c in versions.columns
            ]
        )
        .withColumn(m.OP, F.lit(m.DELETE))
        .withColumn(m.VERSION_AT, F.greatest(F.col(_DELETED_AT), F.col(m.VERSION_AT)))
        .withColumn(m.SEQ, F.concat(F.col(m.SEQ), F.lit(DELETE_SEQ_SUFFIX)))
        .withColumn(DERIVED, F.lit(True))
    )


def _typed_field(raw: DataFrame, field: str, copies: dict[str, str]) -> list[Column]:
    """`field` as one typed column, plus its string copy for audit."""
    kinds = [copy for suffix, column in copies.items() if (copy := _typed_copy(raw, column, suffix))]
    string_copy = col(field).cast("string")
    if not kinds:
        value = string_copy
    else:
        target = _one_type(field, [copy.kind for copy in kinds])
        value = F.coalesce(*[copy.value.cast(target) for copy in kinds], string_copy.try_cast(target))
    return [value.alias(field), string_copy.alias(field + STRING_COPY_SUFFIX)]


@dataclasses.dataclass(frozen=True)
class _TypedCopy:
    value: Column  # the copy as its type
    kind: T.DataType
    #: holds where a value could not be kept as that type unchanged (the row is invalid); None
    #: for a time-of-day copy, kept as Spark reads it
    changed: Column | None


def _typed_copy(raw: DataFrame, column: str, suffix: str) -> _TypedCopy | None:
    """A typed copy as its type, however the file stores it, or None for a column present but
    empty (it says nothing about the type). Text must parse; a stored number must fit: a
    whole-number copy holding a fraction, or a number beyond its type, or NaN, is not that
    type, and converted it would change the value without a word."""
    stored = raw.schema[column].dataType
    if isinstance(stored, T.NullType):
        return None
    target, value = TYPED_SUFFIXES[suffix], col(column)
    if target is None:
        return _TypedCopy(value, stored, None)
    if suffix == "ts":
        converted = timestamp_column(column, stored)
        return _TypedCopy(converted, target, value.isNotNull() & converted.isNull())
    converted = value.try_cast(target)
    changed = value.isNotNull() & converted.isNull()
    if _may_change(stored, target):  # 2.5 in a whole-number copy, 2 in a boolean one, a time in a date
        changed = changed | (converted.cast(stored) != value)
    elif isinstance(stored, T.StringType):
        changed = changed | _parsed_to_another_value(value, converted, target)
    return _TypedCopy(converted, target, changed)


def _parsed_to_another_value(text: Column, parsed: Column, target: T.DataType) -> Column:
    """Whether text that parses as the copy's type was changed by it: Spark reads a date with
    a time of day as its date (the time dropped), and a number beyond a double's range as
    infinite."""
    if isinstance(target, T.DateType):
        return F.coalesce(text.try_cast("timestamp") != parsed.cast("timestamp"), F.lit(False))
    if isinstance(target, T.DoubleType):
        return parsed.isin(float("inf"), float("-inf")) & text.rlike("[0-9]")
    return F.lit(False)


def _holds_epoch_numbers(stored: T.DataType) -> bool:
    """Whether a timestamp copy is stored as epoch numbers (`timestamp_column` reads them)."""
    return isinstance(stored, (T.IntegralType, T.DecimalType))


def _epoch_unlike_its_text(told: Column, moment: Column) -> Column:
    """Whether an epoch number, read in the unit its size suggests (`epoch.EPOCH_MS_THRESHOLD`),
    is more than a day from the moment the field's own text tells (`told`, NULL where the text
    is no time): milliseconds before March 1973 are small enough to pass for seconds, and read
    so they are years away. (GRAX keeps every field's value as text beside its typed copies.)"""
    return F.coalesce(F.abs(F.unix_micros(told) - F.unix_micros(moment)) > DAY_MS * 1000, F.lit(False))


def _may_change(stored: T.DataType, target: T.DataType) -> bool:
    """Whether converting a stored value to the copy's type may change it (then it must convert
    back to itself). Text is parsed instead; a decimal made a double is as near as a float copy
    means to be."""
    if isinstance(stored, (T.StringType, type(target))):
        return False
    return not (isinstance(stored, T.DecimalType) and isinstance(target, T.DoubleType))


def _one_type(field: str, types: list[T.DataType]) -> T.DataType:
    """The type of a field whose typed copies in one file differ: the schema drift rule's
    widening (an integer copy and a float copy become double), and text where that rule has
    none."""
    try:
        return functools.reduce(lambda left, right: widen("", field, left, right), types)
    except SchemaClash:
        return T.StringType()


def _grax_spellings(names: list[str]) -> dict[str, str]:
    """Names of GRAX's own columns spelled in another case (`GRAX__PURGED`) -> GRAX's spelling.
    Names equal ignoring case are one column in the lake, and read as a field of the same name, a
    purge or delete marker would be ignored without a word."""
    grax = {same_name(c): c for c in GRAX_COLUMNS}
    return {n: grax[same_name(n)] for n in names if same_name(n) in grax and n != grax[same_name(n)]}
