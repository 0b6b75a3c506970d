"""Reading one batch of landed files into change events, whatever the vendor format.

For every file: vet its Parquet footer (readable? the columns the format needs, with usable
types?), read the good files with Spark grouped by schema so drifting schemas union cleanly,
validate rows, and set aside any file with a bad row. Nothing is dropped silently: every file is
either read or quarantined with a reason, once, and the counts reconcile
(rows in good files + events a feed derives from them = events out + duplicates collapsed),
each side counted on its own: rows in from the footers, duplicates where the collapse drops them.
Text that is not valid UTF-8 is repaired (see `_with_valid_text_and_keys`), because other engines refuse
a whole table over one such value.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import TypeVar
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets.engine import merge
from lake_assets.engine import model as m
from lake_assets.engine.names import col, lake_name, same_name, schema_case_clash
from lake_assets.engine.run_values import text_table, with_run_values
from lake_assets.engine.schema import holds_text, unified_fields, union_all, valid_text
from lake_assets.errors import DamagedLakeFile, LakeAssetsError, SchemaClash, StorageRequestError, first_line
from lake_assets.feeds.base import DERIVED, FILE_PARTITION, FILE_URI, INVALID, FeedFormat, nanoseconds_as_time
from lake_assets.footer_probe import FooterProbeFailed
from lake_assets.quarantine import Quarantined
from lake_assets.reruns import ByteRange, Reading
from lake_assets.spark_errors import SPARK_ERRORS, is_request_failure
from lake_assets.storage import FILE_ERRORS, Entry, Storage, each_request, parquet_column, parquet_footer

#: per event: how many of its values held text that was not valid UTF-8 and were repaired
TEXT_REPAIRED = "__text_repaired"
#: how much of Spark's error a reason keeps: its message names the file (a long URI) and the cause
SPARK_REASON_CHARACTERS = 1000


@dataclasses.dataclass
class Batch:
    """The events of a batch and the bookkeeping that proves nothing was lost or doubled."""

    events: DataFrame | None
    files_listed: int
    files_read: int
    rows_in: int
    events_out: int
    duplicates: int
    quarantined: list[Quarantined]
    #: events a feed derived in addition to the rows' own (e.g. a GRAX row's delete)
    derived: int = 0
    #: listed files not needed because others hold the same data (overlapping Flow fragments)
    files_skipped: int = 0
    #: holes in the landed data (e.g. journal offsets no fragment covers)
    gaps: list[str] = dataclasses.field(default_factory=list)
    #: what the reader counted on the way (a Flow journal's ACKs, rollbacks, duplicates)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    #: file URI -> values of its rows whose text was not valid UTF-8 and was repaired
    text_repaired: dict[str, int] = dataclasses.field(default_factory=dict)
    #: another partition -> files of this batch's partitions whose rows it holds (a Flow
    #: transaction acknowledged there): it may have to run again (`pipeline.request_reruns`)
    committed_elsewhere: dict[str, list[ByteRange]] = dataclasses.field(default_factory=dict)
    #: what was read of streamed landings (Flow journals), kept in the partitions' notes
    reading: Reading | None = None

    def quarantine(self, item: Quarantined) -> None:
        """Set aside a file that was listed for the batch but not handed to the reader."""
        self.files_listed += 1
        self.quarantined.append(item)

    @property
    def reconciles(self) -> bool:
        return self.rows_in + self.derived == self.events_out + self.duplicates and (
            self.files_listed == self.files_read + len(self.quarantined) + self.files_skipped
        )

    def equations(self) -> str:
        """The two equations `reconciles` checks, with the batch's figures, for a person."""
        return (
            f"rows in {self.rows_in} + derived {self.derived} against events out {self.events_out} "
            f"+ duplicates {self.duplicates}; files listed {self.files_listed} against read "
            f"{self.files_read} + quarantined {len(self.quarantined)} + superseded {self.files_skipped}"
        )


def canonical_uri(spark_path: str) -> str:
    """Spark reports `file:/a/b` or URL-encoded `file:///a/b`; lake_assets says `file:///a/b`."""
    path = unquote(spark_path)
    if path.startswith("file:"):
        return "file:///" + path[len("file:") :].lstrip("/")
    return path


#: A column of one row group of a landed file that its footer says decodes to more than this,
#: at more than `BOMB_RATIO` times its stored size, is a decompression bomb: a small file whose
#: one value or dictionary inflates to gigabytes. Spark decodes a column chunk's dictionary
#: whole, in one task's memory, so such a file would end the JVM (with it every table of the
#: run, until `spark.driver_ended` starts another). A large column that is large on disk too,
#: or that compresses as data does, is read: Spark decodes its data pages one at a time.
BOMB_BYTES = 256 << 20
BOMB_RATIO = 100


def _vet(storage: Storage, fmt: FeedFormat, entry: Entry, keys: tuple[str, ...]):
    """(schema, rows, stored types) of a usable file, or the reason it is not usable.

    Every read of a landed file's bytes here keeps them apart from their decoding
    (`storage.parquet_footer`, `storage.parquet_column`), so a failed request to the store is
    never taken for a damaged file (`_read_landed`)."""
    try:
        footer = _read_landed(storage, entry.uri, parquet_footer)
        schema, rows, stored = footer.schema.to_arrow_schema(), footer.num_rows, _stored_types(footer.schema)
        reason = (
            _decompression_bomb(footer)
            or schema_case_clash(schema)
            or fmt.vet_schema(schema)
            or _keys_finer_than_microseconds(storage, entry.uri, schema, footer, keys)
        )
    except _SetAside as unusable:
        return None, _unreadable(unusable.cause)
    except (StorageRequestError, MemoryError, FooterProbeFailed):  # may pass; the process's limit; no file's
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for footers it cannot use
        return None, _unreadable(f"{type(exc).__name__}: {exc}")
    return ((schema, rows, stored), None) if reason is None else (None, reason)


class _SetAside(LakeAssetsError):
    """A landed file that cannot be read for good (damaged, gone, refused by its store), and why."""

    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


_Read = TypeVar("_Read")


def _read_landed(storage: Storage, uri: str, read: Callable[[Storage, str], _Read]) -> _Read:
    """What `read` gives of a landed file. Bytes that do not decode, and a read failure the store
    explains (the file is gone, or refused for good), raise `_SetAside`; any other read failure
    is tried once more and then raised as a failed request, which fails the run and sets
    nothing aside, for a later run to read the file."""
    try:
        return read(storage, uri)
    except DamagedLakeFile as damaged:
        raise _SetAside(damaged.cause) from damaged
    except MemoryError:  # pyarrow's is an ArrowException too: not the store's failure
        raise
    except FILE_ERRORS as first:
        refusal = _refusal(storage, uri)
        if refusal is not None:
            # a failed request says nothing of the file: the store's refusal does
            told = refusal if isinstance(first, StorageRequestError) else first
            raise _SetAside(f"{type(told).__name__}: {told}") from first
        try:
            return read(storage, uri)
        except DamagedLakeFile as damaged:
            raise _SetAside(damaged.cause) from damaged
        except FILE_ERRORS as again:
            raise StorageRequestError(
                f"reading {uri} failed twice while the store serves the file: "
                f"{first_line(first)}; then {first_line(again)}"
            ) from again


def _refusal(storage: Storage, uri: str) -> Exception | None:
    """The store's word that the file is gone or refused for good (`Storage.refusal_to_read`);
    its failure to answer is raised as a failed request, on S3 as on a local or mounted share."""
    try:
        return storage.refusal_to_read(uri)
    except StorageRequestError:
        raise
    except FILE_ERRORS as failing:
        raise StorageRequestError(f"reading {uri}: {first_line(failing)}") from failing


def _unreadable(cause: str) -> str:
    return f"not a readable Parquet file ({cause})"


def _keys_finer_than_microseconds(
    storage: Storage, uri: str, schema: pa.Schema, footer: pq.FileMetaData, keys: tuple[str, ...]
) -> str | None:
    """Why a file's key times cannot be kept, or None. Spark keeps times to the microsecond, so a
    key column of nanoseconds (`timestamp[ns]`) is rounded down as it is read: two keys a few
    nanoseconds apart would become one, and the first key's record would be lost. Only such a
    column is read here, and only in a file that has one. (An INT96 time, nanoseconds too, is
    not read: pyarrow wraps those outside 1677-2262 around, which would set good files aside.)"""
    wanted = {same_name(k) for k in keys}
    stored_as = {
        column.path: column.physical_type for column in map(footer.schema.column, range(len(footer.schema)))
    }
    for field in schema:
        if (
            same_name(lake_name(field.name)) not in wanted
            or not (pa.types.is_timestamp(field.type) and field.type.unit == "ns")
            or stored_as.get(field.name) != "INT64"
        ):
            continue
        column = _read_landed(storage, uri, functools.partial(parquet_column, name=field.name))
        nanoseconds = column.cast(pa.int64())
        finer = pc.not_equal(pc.subtract(nanoseconds, pc.multiply(pc.divide(nanoseconds, 1000), 1000)), 0)
        if pc.any(finer).as_py():
            return (
                f"key column '{field.name}' holds times finer than a microsecond, which Spark rounds "
                "down: two keys could become one"
            )
    return None


def _decompression_bomb(meta: pq.FileMetaData) -> str | None:
    """Why a file's footer says it is a decompression bomb (`BOMB_BYTES`), or None."""
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            decoded, stored = chunk.total_uncompressed_size, max(chunk.total_compressed_size, 1)
            if decoded > BOMB_BYTES and decoded > BOMB_RATIO * stored:
                return (
                    f"column '{chunk.path_in_schema}' of row group {group} decodes to {decoded} bytes from "
                    f"{stored} stored, a decompression bomb (more than {BOMB_BYTES} bytes at more than "
                    f"{BOMB_RATIO} times the stored size)"
                )
    return None


def _stored_types(schema: pq.ParquetSchema) -> str:
    """Each column's Parquet physical type. Files that pyarrow reads alike, Spark may not: INT96
    and INT64 nanoseconds are both `timestamp[ns]` to pyarrow, while Spark reads the first as a
    timestamp and the second as a number, and fails a read of both together. So these belong to
    a file's schema signature (`_BatchFiles.accept`)."""
    return ",".join(f"{schema.column(i).path}:{schema.column(i).physical_type}" for i in range(len(schema)))


def canonical_uri_column(path: str | F.Column, *, encoded: bool = True) -> F.Column:
    """`canonical_uri` as a Spark expression; `encoded`: the path is URL-encoded, as
    `_metadata.file_path` is (the `binaryFile` source's `path` is not: a folder `a%20b` is
    spelled as it is, and decoding it would name another file).

    It runs on every row of a read, for a value that is the same for the whole file, so the
    common case is kept to cheap tests: no decoding without a `%`, and the `file:` prefix
    rewritten only when it is not already `file:///`. Decoding first protects `+`, which
    Spark's `url_decode` (form decoding) would turn into a space and `unquote` keeps.
    """
    spark_path = F.col(path) if isinstance(path, str) else path
    decoded = (
        F.when(
            spark_path.contains("%"), F.url_decode(F.replace(spark_path, F.lit("+"), F.lit("%2B")))
        ).otherwise(spark_path)
        if encoded
        else spark_path
    )
    canonical_prefix = decoded.startswith("file:///") & ~decoded.startswith("file:////")
    return F.when(
        decoded.startswith("file:") & ~canonical_prefix, F.regexp_replace(decoded, r"^file:/+", "file:///")
    ).otherwise(decoded)


#: Characters Spark and Hadoop read as a glob pattern in a path.
_GLOB_CHARACTERS = re.compile(r"[\\\[\]{}*?]")
#: Hadoop's default local file system keeps a checksum file `.<name>.crc` beside each file and
#: fails on a name holding `:`, which its checksum file's path cannot parse. Landed files have no
#: checksum files, so they are read through the raw local file system: set for the read only,
#: hence no cached instance. (A driver this process starts without S3 writes every file
#: through it, or the lake's subclass of it: `spark.FILE_SYSTEM_SETTING`; S3 drivers and
#: Connect servers do not.)
_RAW_LOCAL_FILES = {
    "fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "fs.file.impl.disable.cache": "true",
}


def _literal_path(uri: str) -> str:
    """`uri` as the glob pattern that matches that one file.

    Spark globs every path it reads: `b[1].parquet` would read `b1.parquet`, and `c{2}.parquet`
    would not be found; escaped, the glob characters match themselves. (Hadoop's globbing parses
    each literal name of such a path as a URI, so a path with a glob character and a `:` still
    fails: the reader then sets the file aside with Spark's reason.)
    """
    scheme, _, rest = uri.partition("://")
    authority, _, path = rest.partition("/")
    if not _GLOB_CHARACTERS.search(path):
        return uri
    return f"{scheme}://{authority}/" + _GLOB_CHARACTERS.sub(r"\\\g<0>", path)


def read_landed(spark: SparkSession, file_format: str, uris: Iterable[str]) -> DataFrame:
    """Spark's read of exactly these landed files, whatever characters their names hold."""
    uris = list(uris)
    reader = spark.read.format(file_format)
    if any(uri.startswith("file:") for uri in uris):
        reader = reader.options(**_RAW_LOCAL_FILES)
    return reader.load([_literal_path(uri) for uri in uris])


def _read_group(
    spark: SparkSession, fmt: FeedFormat, partition_of: dict[str, str], schema: pa.Schema | None = None
) -> DataFrame:
    """Files of one schema (URI -> the partition that lists it), normalised by the feed, which
    sees every column under its lake name (`names.lake_name`)."""
    raw = read_landed(spark, "parquet", partition_of)
    fields = {f.name: f.type for f in schema} if schema is not None else {}
    spark_types = {f.name: f.dataType for f in raw.schema.fields}  # one schema request (Spark Connect)

    def as_lake_column(name: str) -> F.Column:
        arrow_type = fields.get(name)
        # A column Parquet stores with the null type (present but empty) reaches Spark as some
        # arbitrary type; as NullType it widens into whatever type the column has elsewhere.
        if arrow_type is not None and pa.types.is_null(arrow_type):
            return F.lit(None).alias(lake_name(name))
        # INT64 nanoseconds reach Spark as a long (spark.py); INT96, also nanoseconds to pyarrow,
        # as a time already.
        stored_as_long = isinstance(spark_types[name], T.LongType)
        if isinstance(arrow_type, pa.TimestampType) and arrow_type.unit == "ns" and stored_as_long:
            return nanoseconds_as_time(col(name), zoned=arrow_type.tz is not None).alias(lake_name(name))
        return col(name) if lake_name(name) == name else col(name).alias(lake_name(name))

    raw = raw.select(
        *[as_lake_column(c) for c in raw.columns],
        # Asked for by its role: a vendor column named `_metadata` hides it from `F.col`.
        canonical_uri_column(raw.metadataColumn("_metadata").getField("file_path")).alias(FILE_URI),
    )
    # A file's partition is what listed it, looked up once per file: worked out from the path
    # on every row, it was a large share of the read (docs/profiling.md, "Figures behind the code").
    files = text_table(spark, [FILE_URI, FILE_PARTITION], list(partition_of.items()))
    raw = raw.join(F.broadcast(files), FILE_URI, "left")
    events = fmt.normalise(raw)
    return events if DERIVED in events.columns else events.withColumn(DERIVED, F.lit(False))


# --- the files of a batch, each read or set aside once ---------------------------------------------


_STORED_AS = "\nstored as "  # in a schema signature: the arrow schema, then `_stored_types`


def _arrow_part(signature: str) -> str:
    return signature.split(_STORED_AS)[0]


@dataclasses.dataclass
class _BatchFiles:
    """The listed files of a batch: each is live (to be read) or set aside, once, with its reason.

    A file set aside leaves the live groups, so no later step (a read again after damage is
    found, the search for bad rows) reads it or counts it again.
    """

    partition_of: dict[str, str]
    #: live file -> rows its footer declares
    rows_of: dict[str, int] = dataclasses.field(default_factory=dict)
    #: live file -> the signature of its schema (files of one signature are read together)
    signature_of: dict[str, str] = dataclasses.field(default_factory=dict)
    schemas: dict[str, pa.Schema] = dataclasses.field(default_factory=dict)
    quarantined: list[Quarantined] = dataclasses.field(default_factory=list)
    #: signatures whose files are read one by one (`groups`): read together they failed, though
    #: each file reads alone
    read_apart: set[str] = dataclasses.field(default_factory=set)
    #: file set aside for a schema clash -> its signature and rows, to make it live again should
    #: the clash be decided anew (`reconsider_clashes`)
    clashing: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)

    def accept(self, uri: str, schema: pa.Schema, rows: int, stored_types: str) -> None:
        arrow = schema.to_string(show_field_metadata=False, show_schema_metadata=False)
        signature = f"{arrow}{_STORED_AS}{stored_types}"
        self.schemas[signature] = schema
        self.signature_of[uri] = signature
        self.rows_of[uri] = rows

    def set_aside(self, uri: str, reason: str) -> None:
        if any(q.uri == uri for q in self.quarantined):
            return  # the first reason stands
        self.signature_of.pop(uri, None)
        self.quarantined.append(Quarantined(uri, reason, self.rows_of.pop(uri, None)))

    def set_aside_for_clash(self, uri: str, reason: str) -> None:
        if uri not in self.signature_of:
            return  # set aside already (Spark could not open it): its reason stands, no clash can revive it
        self.clashing[uri] = (self.signature_of[uri], self.rows_of[uri])
        self.set_aside(uri, reason)

    def reconsider_clashes(self) -> None:
        """Make the files set aside for a schema clash live again. Which schema a clash keeps
        is decided by the rows the footers declare; once a file is found damaged, its rows no
        longer count, so a file that outweighed the others must not keep them set aside."""
        self.quarantined = [q for q in self.quarantined if q.uri not in self.clashing]
        for uri, (signature, rows) in self.clashing.items():
            self.signature_of[uri], self.rows_of[uri] = signature, rows
        self.clashing.clear()

    def groups(self) -> list[tuple[str, list[str]]]:
        """(schema signature, live files read together), those of the arrow schema holding the
        most rows first, then of the most files (files of one arrow schema stored in other
        Parquet types are read apart, but count as one schema when a clash decides which files
        the batch keeps), then the largest. Rows, not files, come first: empty files must not
        outvote the one that holds the data. The files of a signature in `read_apart` are groups
        of one."""
        pairs = [
            pair
            for signature, uris in self.by_signature().items()
            for pair in (
                [(signature, [uri]) for uri in uris] if signature in self.read_apart else [(signature, uris)]
            )
        ]
        rows_of_schema: Counter[str] = Counter()
        files_of_schema: Counter[str] = Counter()
        for uri, signature in self.signature_of.items():
            rows_of_schema[_arrow_part(signature)] += self.rows_of[uri]
            files_of_schema[_arrow_part(signature)] += 1

        def weight(pair: tuple[str, list[str]]) -> tuple[int, int, int]:
            schema = _arrow_part(pair[0])
            return -rows_of_schema[schema], -files_of_schema[schema], -len(pair[1])

        return sorted(pairs, key=weight)

    def by_signature(self) -> dict[str, list[str]]:
        """schema signature -> its live files."""
        groups: dict[str, list[str]] = defaultdict(list)
        for uri, signature in self.signature_of.items():
            groups[signature].append(uri)
        return groups

    def partitions(self, uris: Iterable[str]) -> dict[str, str]:
        return {uri: self.partition_of[uri] for uri in uris}


def _vetted(
    storage: Storage, fmt: FeedFormat, files: dict[str, list[Entry]], keys: tuple[str, ...]
) -> _BatchFiles:
    """The files of `files` (partition -> its files), those whose footers are unusable set aside."""
    batch_files = _BatchFiles(
        {entry.uri: partition for partition, entries in files.items() for entry in entries}
    )
    entries = [entry for entries in files.values() for entry in entries]
    for entry, (vetted, reason) in zip(
        entries, each_request(lambda e: _vet(storage, fmt, e, keys), entries), strict=True
    ):
        if vetted is None:
            batch_files.set_aside(entry.uri, reason)
        else:
            batch_files.accept(entry.uri, *vetted)
    return batch_files


def _readable_group(
    spark: SparkSession, fmt: FeedFormat, files: _BatchFiles, signature: str, uris: list[str]
) -> DataFrame | None:
    """The live files of one schema read together. Spark reads a footer as it plans the read;
    a file it cannot open there (a footer only pyarrow could read; or gone since it was listed,
    which then stops the run: `pipeline._set_aside`) is set aside, found by trying each file
    alone, and the others are read."""
    schema = files.schemas[signature]
    try:
        return _read_group(spark, fmt, files.partitions(uris), schema)
    except SPARK_ERRORS as exc:
        failure = exc
    if is_request_failure(failure):
        raise failure
    unopened = {}
    for uri in uris:
        try:
            _read_group(spark, fmt, files.partitions([uri]), schema)
        except SPARK_ERRORS as exc:
            if is_request_failure(exc):
                raise
            unopened[uri] = (
                f"Spark could not open the file ({first_line(exc, limit=SPARK_REASON_CHARACTERS)})"
            )
    if not unopened:
        raise failure
    for uri, reason in unopened.items():
        files.set_aside(uri, reason)
    rest = [uri for uri in uris if uri not in unopened]
    return _readable_group(spark, fmt, files, signature, rest) if rest else None


def _union_compatible(
    spark: SparkSession, fmt: FeedFormat, table: str, files: _BatchFiles, stored: T.StructType | None
) -> DataFrame | None:
    """The union of the live schema groups whose column types can be widened into one and into
    the `stored` table's, its text made valid.

    Groups join in `_BatchFiles.groups`' order (the schema holding the most rows first), so
    when a few files give a column a type the others' cannot widen into (a struct where the rest
    have a number), those few are quarantined naming the column and both types, and the batch
    goes on. The stored table's columns come first: a file the fold could not merge into it
    would stop the table on every run until the file was removed.
    """
    keys = fmt.table_spec(table).keys
    accepted = _AcceptedGroups(table, keys, _stored_columns(stored))
    for signature, uris in files.groups():
        frame = _readable_group(spark, fmt, files, signature, uris)
        if frame is None:
            continue
        try:
            accepted.take(frame)
        except SchemaClash as clash:
            for uri in uris:
                files.set_aside_for_clash(uri, f"schema does not fit the batch or the stored table: {clash}")
    if not accepted.groups:
        return None
    # The batch's text is checked, repaired and counted after the union, bytes that became text
    # with it or will with the stored table's (a key's set its file aside): none on the way.
    union = union_all(
        table, [frame for frame, _ in accepted.groups], keys, repair_text=False, bound_for=accepted.stored
    )
    union = as_text_where_stored(union, accepted.unified(), keys)
    return _with_valid_text_and_keys(union, fmt.table_spec(table))


def as_text_where_stored(frame: DataFrame, unified: T.StructType, keys: tuple[str, ...]) -> DataFrame:
    """`frame` with the columns the stored table holds as text cast to text where they are bytes,
    or are keys of another scalar type: the fold would make them text, so the checks of text (a
    key's, the repairs') see the bytes here, and the fold matches the batch's keys with the
    stored ones as text (a number key beside a text one is matched as a number otherwise, and
    a stored key such as 'a' fails that cast)."""
    stored_types = {same_name(f.name): f.dataType for f in unified.fields}
    key_names = {same_name(k) for k in keys}

    def to_text(field: T.StructField) -> bool:
        if not isinstance(stored_types.get(same_name(field.name)), T.StringType):
            return False
        if isinstance(field.dataType, T.BinaryType):
            return True
        return (
            same_name(field.name) in key_names
            and isinstance(field.dataType, T.AtomicType)
            and not isinstance(field.dataType, T.StringType)
        )

    casts = {f.name: col(f.name).cast(T.StringType()) for f in frame.schema.fields if to_text(f)}
    return frame.withColumns(casts) if casts else frame


_Group = tuple[DataFrame, T.StructType]


@dataclasses.dataclass
class _AcceptedGroups:
    """The schema groups a batch's union takes, each frame with its schema (asked of Spark
    once), checked against each other and the `stored` table's columns as each comes (`take`).
    The schemas alone tell whether the union can be made: no union is planned per group."""

    table: str
    keys: tuple[str, ...]
    stored: T.StructType
    groups: list[_Group] = dataclasses.field(default_factory=list)

    def unified(self, groups: list[_Group] | None = None) -> T.StructType:
        """The union's columns with the stored table's, widened."""
        schemas = [self.stored, *(schema for _, schema in (self.groups if groups is None else groups))]
        return T.StructType(unified_fields(self.table, schemas, self.keys))

    def take(self, frame: DataFrame) -> None:
        """Takes the group's `frame`, or raises the SchemaClash that keeps it out. The groups are
        also widened among themselves without the stored table: two key types that the stored
        text absorbs may still clash (a long key beside a double key).

        A clashing column that no row of the new group holds a value in, or of the groups taken
        that hold it, is null there instead, typed as nothing, which widens into any type: a
        purge's file carries no field data, and its empty columns, typed as the vendor's writer
        pleased, must not set it aside (its purge would wait) nor the files holding the values.
        Asking the rows costs a Spark job, on a clash only."""
        group = (frame, frame.schema)
        while True:
            candidates = [*self.groups, group]
            try:
                self.unified(candidates)
                unified_fields(self.table, [schema for _, schema in candidates], self.keys)
            except SchemaClash as clash:
                emptied = _without_values(group, clash.column, self.keys)
                if emptied is not None:
                    group = emptied
                    continue
                self.groups = self._emptied_of(clash)
                continue
            self.groups = candidates
            return

    def _emptied_of(self, clash: SchemaClash) -> list[_Group]:
        """The groups taken, the clashing column null in those holding it, when none holds a
        value in it; else the clash."""
        emptied, changed = [], False
        for group in self.groups:
            if _typed_column(group[1], clash.column) is None:
                emptied.append(group)
                continue
            empty = _without_values(group, clash.column, self.keys)
            if empty is None:
                raise clash
            emptied.append(empty)
            changed = True
        if not changed:
            raise clash
        return emptied


def _typed_column(schema: T.StructType, name: str | None) -> T.StructField | None:
    """The field of `schema` named `name` (ignoring case), when it has a type (not nothing)."""
    if name is None:
        return None
    return next(
        (
            f
            for f in schema.fields
            if same_name(f.name) == same_name(name) and not isinstance(f.dataType, T.NullType)
        ),
        None,
    )


def _without_values(group: _Group, name: str | None, keys: tuple[str, ...]) -> _Group | None:
    """`group` with its non-key column `name` null, typed as nothing, when no row holds a value
    in it; else None."""
    frame, schema = group
    field = _typed_column(schema, name)
    if field is None or same_name(field.name) in {same_name(k) for k in keys} or m.is_reserved(field.name):
        return None
    try:
        if not frame.where(col(field.name).isNotNull()).isEmpty():
            return None
    except SPARK_ERRORS as exc:
        if is_request_failure(exc):
            raise
        # A file whose data Spark cannot read: the clash stands, and the batch's own read of
        # the files it keeps names any that is damaged.
        return None
    nulled = T.StructType(
        [T.StructField(f.name, T.NullType(), True) if f is field else f for f in schema.fields]
    )
    return frame.withColumn(field.name, F.lit(None)), nulled


def _stored_columns(stored: T.StructType | None) -> T.StructType:
    """The columns of a stored table that a batch's rows are merged into (not the lake's own)."""
    if stored is None:
        return T.StructType([])
    return T.StructType([f for f in stored.fields if not m.is_reserved(f.name)])


def _unreadable_in_spark(
    spark: SparkSession, fmt: FeedFormat, table: str, files: _BatchFiles, uris: Iterable[str]
) -> dict[str, str]:
    """Those of the live files `uris` whose data pages Spark cannot decode (or whose text,
    repaired, Spark refuses: a map whose keys become equal), reading each alone."""
    bad = {}
    for uri in uris:
        try:
            _read_in_full(spark, fmt, table, files, [uri])
        except SPARK_ERRORS as exc:
            if is_request_failure(exc):
                raise
            bad[uri] = (
                f"Spark could not read the file's data ({first_line(exc, limit=SPARK_REASON_CHARACTERS)})"
            )
    return bad


def _read_in_full(
    spark: SparkSession, fmt: FeedFormat, table: str, files: _BatchFiles, uris: list[str]
) -> None:
    """Read every row of the live files `uris` (of one signature), their text made valid."""
    frame = _read_group(spark, fmt, files.partitions(uris), files.schemas[files.signature_of[uris[0]]])
    _with_valid_text_and_keys(frame, fmt.table_spec(table)).write.format("noop").mode("overwrite").save()


def _reads_in_spark(
    spark: SparkSession, fmt: FeedFormat, table: str, files: _BatchFiles, uris: list[str]
) -> bool:
    try:
        _read_in_full(spark, fmt, table, files, uris)
    except SPARK_ERRORS as exc:
        if is_request_failure(exc):
            raise
        return False
    return True


def _failing_together(
    spark: SparkSession, fmt: FeedFormat, table: str, files: _BatchFiles
) -> dict[str, list[str]]:
    """signature -> its live files, for the groups (not read apart) whose read fails: a group of
    one is a damaged file, found in the same round as a group Spark cannot read together."""
    return {
        signature: uris
        for signature, uris in files.by_signature().items()
        if signature not in files.read_apart and not _reads_in_spark(spark, fmt, table, files, uris)
    }


# --- text that other engines can read -----------------------------------------------------------


def _identity_reasons(schema: T.StructType, roles: dict[str, str]) -> list[Column]:
    """Per column that identifies or orders an event (column -> its role: a key, the sequence),
    why a row's value cannot be kept (NULL when it can): text that is not UTF-8 (repaired, two
    values could become one; a GRAX `_seq` is text), and NaN or -0.0, which Spark takes for
    every other NaN and for 0.0 when it groups, joins and sorts."""
    reasons = []
    for k, role in roles.items():
        kind = schema[k].dataType
        if isinstance(kind, T.StringType):
            reasons.append(
                F.when(
                    ~F.is_valid_utf8(col(k)), F.lit(f"{role} column '{k}' holds text that is not valid UTF-8")
                )
            )
        elif isinstance(kind, (T.FloatType, T.DoubleType)):
            negative_zero = (col(k) == 0) & col(k).cast("string").startswith("-")
            reasons.append(
                F.when(
                    F.isnan(col(k)) | negative_zero,
                    F.lit(
                        f"{role} column '{k}' holds NaN or -0.0, which Spark takes for the same value as another"
                    ),
                )
            )
    return reasons


def _with_valid_text_and_keys(events: DataFrame, spec) -> DataFrame:
    """Events whose text every engine can read, with `TEXT_REPAIRED` counting the values repaired,
    and whose keys and sequences are identities (`_identity_reasons`).

    A Parquet string column may hold bytes that are not UTF-8; Spark passes them through, and
    DuckDB and pyarrow then refuse the whole table. Payload text is repaired (each invalid
    sequence becomes U+FFFD) and the row kept. A key is an identity, not a value: repaired, two
    different keys could become one, so an event whose key (or text sequence) is not UTF-8 is
    invalid, and its file is quarantined; so is one whose floating-point key is NaN or -0.0.
    """
    schema = events.schema
    payload = [c for c in spec.payload_columns(events.columns) if holds_text(schema[c].dataType)]
    roles = {**dict.fromkeys(spec.keys, "key"), m.SEQ: "sequence"}
    reasons = _identity_reasons(schema, {c: role for c, role in roles.items() if c in events.columns})
    if not payload and not reasons:
        return events
    repairs = {c: valid_text(col(c), schema[c].dataType) for c in payload}
    bad_key = F.coalesce(*reasons) if reasons else F.lit(None).cast("string")
    repaired_values = sum((flag.cast("int") for _, flag in repairs.values()), F.lit(0))
    return events.withColumns(
        {
            **{c: repaired.alias(c) for c, (repaired, _) in repairs.items()},
            INVALID: F.coalesce(F.col(INVALID), bad_key),
            TEXT_REPAIRED: repaired_values,
        }
    )


# --- collapsing, with every count of the row equation taken on its own ------------------------------

#: bookkeeping columns a reader carries up to the collapse, and how the batch counts each
_CARRIED_COUNTS = {
    INVALID: F.count,
    DERIVED: lambda c: F.sum(c.cast("long")),
    TEXT_REPAIRED: F.sum,
}


@dataclasses.dataclass
class Collapsed:
    events: DataFrame
    events_out: int
    #: events the collapse dropped as identical to one it kept, counted as it dropped them
    duplicates: int
    invalid_rows: int
    derived: int
    text_repaired: int


def collapse_counted(events: DataFrame, spec, *, keep: bool = True) -> Collapsed:
    """Collapse identical events and count, in that one pass (observations), what a batch
    reconciles: the events dropped as duplicates, and the bookkeeping columns carried up to here
    (invalid rows, derived events, repaired text), which are then dropped.

    With `keep`, the collapsed events stay cached (the caller writes them and hands them on), so
    a clean batch is read, sorted and cached once, with the collapse's marks for the fold
    (`merge.collapse_identical`): storing them drops the marks (`merge.without_marks`).
    """
    carried = [c for c in _CARRIED_COUNTS if c in events.columns]
    before = Observation()
    if carried:
        events = events.observe(
            before, *[F.coalesce(_CARRIED_COUNTS[c](F.col(c)), F.lit(0)).alias(c) for c in carried]
        )
    dropped = Observation()
    deduped = merge.collapse_identical(
        stamped(events.drop(*carried, FILE_URI)), spec, count_dropped=dropped, keep_marks=keep
    )
    if keep:
        deduped = deduped.persist()
    try:
        events_out = deduped.count()
    except Exception:
        deduped.unpersist()
        raise
    counted = {c: before.get[c] for c in carried}
    return Collapsed(
        deduped,
        events_out,
        dropped.get[merge.DROPPED_IDENTICAL],
        counted.get(INVALID, 0),
        counted.get(DERIVED, 0),
        counted.get(TEXT_REPAIRED, 0),
    )


def stamped(events: DataFrame) -> DataFrame:
    """The events with `_ingested_at`: when this read took place, one instant for the batch."""
    return with_run_values(events, {m.INGESTED_AT: dt.datetime.now(dt.UTC)})


def _bad_row_reasons(events: DataFrame) -> dict[str, str]:
    """file URI -> why its rows cannot be used, for the files with invalid rows (hashed counts
    first; the reasons, text, come from a second pass over the invalid rows alone)."""
    landed = ~F.coalesce(F.col(DERIVED), F.lit(False)) if DERIVED in events.columns else F.lit(True)
    # An event derived from a bad row (GRAX's delete of a deleted row) carries its reason: the
    # landed row is counted, once.
    counts = (
        events.groupBy(FILE_URI)
        .agg(F.count(INVALID).alias("invalid"), F.count(F.when(landed, F.col(INVALID))).alias("bad_rows"))
        .where("invalid > 0")
        .collect()
    )
    if not counts:
        return {}
    invalid = events.where(F.col(INVALID).isNotNull()).groupBy(FILE_URI).agg(F.first(INVALID).alias("reason"))
    first_reason = {row[FILE_URI]: row["reason"] for row in invalid.collect()}
    return {
        uri: f"{first_reason[uri]} ({max(bad_rows, 1)} bad row(s), first reason shown)"
        for uri, bad_rows in ((row[FILE_URI], row["bad_rows"]) for row in counts)
    }


def text_repaired_per_file(events: DataFrame, file_column: str = FILE_URI) -> dict[str, int]:
    """file -> values repaired in it (a pass of its own: only for a batch that had any)."""
    repaired = (
        events.where(F.col(TEXT_REPAIRED) > 0).groupBy(file_column).agg(F.sum(TEXT_REPAIRED).alias("values"))
    )
    return {row[file_column]: row["values"] for row in repaired.collect()}


def _read_collapsed(
    spark: SparkSession,
    fmt: FeedFormat,
    table: str,
    files: _BatchFiles,
    stored: T.StructType | None,
    earlier: Exception | None = None,
) -> tuple[DataFrame, Collapsed] | None:
    """The live files read and collapsed: (the events before the collapse, the collapse), or
    None when no file is left.

    When the read fails, the groups of one schema signature whose read together fails are
    found. A file among them (or, when none fails, among all) whose data pages turn out
    damaged is set aside and the rest read again. When none is damaged, the failing groups'
    files are read one by one: Spark read them in a way that fits some of them only. `earlier`
    is the failure that led to this read, chained to the error raised when nothing helps."""
    events = _union_compatible(spark, fmt, table, files, stored)
    if events is None:
        return None
    try:
        return events, collapse_counted(events, fmt.table_spec(table))
    except SPARK_ERRORS as failure:
        if is_request_failure(failure):
            raise
        failing = _failing_together(spark, fmt, table, files)
        suspects = [uri for uris in failing.values() for uri in uris] if failing else list(files.signature_of)
        damaged = _unreadable_in_spark(spark, fmt, table, files, suspects)
        if damaged:
            for uri, reason in damaged.items():
                files.set_aside(uri, reason)
            files.reconsider_clashes()
        elif failing:
            files.read_apart |= failing.keys()
        elif earlier is None:
            raise
        else:
            raise failure from earlier
        return _read_collapsed(spark, fmt, table, files, stored, earlier=earlier or failure)


def read_batch(
    spark: SparkSession,
    storage: Storage,
    fmt: FeedFormat,
    table: str,
    files: dict[str, list[Entry]],
    stored: T.StructType | None = None,
) -> Batch:
    """The change batch of the landed Parquet files of `files` (partition -> its files); a file
    whose columns cannot be widened into the `stored` table's schema is set aside."""
    batch_files = _vetted(storage, fmt, files, tuple(fmt.table_spec(table).keys))
    listed = len(batch_files.partition_of)
    read = _read_collapsed(spark, fmt, table, batch_files, stored)
    if read is None:
        return Batch(None, listed, 0, 0, 0, 0, batch_files.quarantined)
    events, collapsed = read
    if collapsed.invalid_rows:
        # Some files hold bad rows: they are set aside whole and the rest collapsed again.
        collapsed.events.unpersist()
        bad = _bad_row_reasons(events)
        for uri, reason in bad.items():
            batch_files.set_aside(uri, reason)
        events = events.where(~F.col(FILE_URI).isin(list(bad)))
        collapsed = collapse_counted(events, fmt.table_spec(table))
    try:  # the cached events are the batch's; they are released here only if it is not made
        repaired = text_repaired_per_file(events) if collapsed.text_repaired else {}
    except BaseException:
        collapsed.events.unpersist()
        raise
    return Batch(
        events=collapsed.events,
        files_listed=listed,
        files_read=len(batch_files.rows_of),
        rows_in=sum(batch_files.rows_of.values()),
        events_out=collapsed.events_out,
        duplicates=collapsed.duplicates,
        quarantined=batch_files.quarantined,
        derived=collapsed.derived,
        text_repaired=repaired,
    )
