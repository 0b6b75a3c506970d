"""Reading one batch of landed files into change events, whatever the vendor format.

For every file: vet its Parquet footer (readable? the columns the format needs, with usable
types?), read the good files with Spark grouped by schema so drifting schemas union cleanly,
validate rows, and set aside any file with a bad row. Nothing is dropped silently: every file is
either read or quarantined with a reason, and the counts reconcile
(rows in good files + events a feed derives from them = events out + duplicates collapsed).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, Observation, SparkSession, functions as F

from lake_assets.engine import merge, model as m
from lake_assets.engine.names import col, lake_name, lake_schema, schema_case_clash
from lake_assets.engine.run_values import text_table, with_run_values
from lake_assets.engine.schema import union_all
from lake_assets.errors import SchemaClash
from lake_assets.feeds.base import DERIVED, FILE_PARTITION, FILE_URI, FeedFormat
from lake_assets.quarantine import Quarantined
from lake_assets.storage import Entry, Storage

INVALID = "__invalid"


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

    def quarantine(self, item: Quarantined) -> None:
        """Set aside a file that was listed for the batch but not handed to the reader."""
        self.files_listed += 1
        self.quarantined.append(item)

    @property
    def reconciles(self) -> bool:
        return self.rows_in + self.derived == self.events_out + self.duplicates and (
            self.files_listed == self.files_read + len(self.quarantined) + self.files_skipped
        )


def canonical_uri(spark_path: str) -> str:
    """Spark reports `file:/a/b` or URL-encoded `file:///a/b`; lake_assets says `file:///a/b`."""
    path = unquote(spark_path)
    if path.startswith("file:"):
        return "file:///" + path[len("file:"):].lstrip("/")
    return path


def _vet(storage: Storage, fmt: FeedFormat, entry: Entry):
    """(schema, rows) of a usable file, or the reason it is not usable."""
    try:
        with storage.open_input_file(entry.uri) as handle:
            meta = pq.ParquetFile(handle)
            schema, rows = meta.schema_arrow, meta.metadata.num_rows
    except Exception as exc:  # pyarrow raises several types for damaged files
        return None, f"not a readable Parquet file ({type(exc).__name__}: {exc})"
    reason = schema_case_clash(schema) or fmt.vet_schema(schema)
    return ((schema, rows), None) if reason is None else (None, reason)


def canonical_uri_column(path: str | F.Column) -> F.Column:
    """`canonical_uri` as a Spark expression.

    It runs on every row of a read, for a value that is the same for the whole file, so the
    common case is kept to cheap tests: no decoding without a `%`, and the `file:` prefix
    rewritten only when it is not already `file:///`. Decoding first protects `+`, which
    Spark's `url_decode` (form decoding) would turn into a space and `unquote` keeps.
    """
    spark_path = F.col(path) if isinstance(path, str) else path
    decoded = F.when(spark_path.contains("%"), F.url_decode(F.replace(spark_path, F.lit("+"), F.lit("%2B")))).otherwise(spark_path)
    canonical_prefix = decoded.startswith("file:///") & ~decoded.startswith("file:////")
    return F.when(decoded.startswith("file:") & ~canonical_prefix, F.regexp_replace(decoded, r"^file:/+", "file:///")).otherwise(decoded)


def _read_group(spark: SparkSession, fmt: FeedFormat, partition_of: dict[str, str], schema: pa.Schema | None = None) -> DataFrame:
    """Files of one schema (URI -> the partition that lists it), normalised by the feed, which
    sees every column under its lake name (`names.lake_name`)."""
    raw = spark.read.parquet(*partition_of)
    null_columns = tuple(f.name for f in schema if pa.types.is_null(f.type)) if schema is not None else ()

    def as_lake_column(name: str) -> F.Column:
        # A column Parquet stores with the null type (present but empty) reaches Spark as some
        # arbitrary type; as NullType it widens into whatever type the column has elsewhere.
        if name in null_columns:
            return F.lit(None).alias(lake_name(name))
        return col(name) if lake_name(name) == name else col(name).alias(lake_name(name))

    raw = raw.select(
        *[as_lake_column(c) for c in raw.columns],
        # Asked for by its role: a vendor column named `_metadata` hides it from `F.col`.
        canonical_uri_column(raw.metadataColumn("_metadata").getField("file_path")).alias(FILE_URI),
    )
    # A file's partition is what listed it, looked up once per file: worked out from the path
    # on every row, it cost ~0.8 s of a 1.7M-row read (docs/profiling.md).
    files = text_table(spark, [FILE_URI, FILE_PARTITION], list(partition_of.items()))
    raw = raw.join(F.broadcast(files), FILE_URI, "left")
    events = fmt.normalise(raw, lake_schema(schema) if schema is not None else None)
    return events if DERIVED in events.columns else events.withColumn(DERIVED, F.lit(False))


def _unreadable_in_spark(spark: SparkSession, fmt: FeedFormat, files: dict[str, tuple[str, pa.Schema]]) -> dict[str, str]:
    """Find files (URI -> partition, schema) whose data pages Spark cannot decode, one at a time."""
    bad = {}
    for uri, (partition, schema) in files.items():
        try:
            _read_group(spark, fmt, {uri: partition}, schema).write.format("noop").mode("overwrite").save()
        except Exception as exc:  # py4j wraps the JVM error; its first line names the cause
            first_line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            bad[uri] = f"Spark could not read the file's data ({first_line})"
    return bad


def _union_compatible(
    spark: SparkSession, fmt: FeedFormat, table: str, groups: dict[str, list[str]], schemas: dict[str, pa.Schema],
    quarantined: list[Quarantined], rows_of: dict[str, int], partition_of: dict[str, str],
) -> DataFrame | None:
    """The union of the schema groups whose column types can be widened into one.

    Groups join largest first, so when a few files give a column a type the others' cannot
    widen into (a struct where the rest have a number), those few are quarantined naming the
    column and both types, and the batch goes on.
    """
    accepted: list[DataFrame] = []
    for signature, uris in sorted(groups.items(), key=lambda item: -len(item[1])):
        if not uris:
            continue
        frame = _read_group(spark, fmt, {u: partition_of[u] for u in uris}, schemas[signature])
        try:
            union_all(table, [*accepted, frame])
        except SchemaClash as clash:
            quarantined.extend(Quarantined(u, f"schema does not fit the batch: {clash}", rows_of.pop(u)) for u in uris)
            continue
        accepted.append(frame)
    return union_all(table, accepted) if accepted else None


@dataclasses.dataclass
class _Collapsed:
    events: DataFrame  # kept in memory: the caller writes it
    events_out: int
    invalid_rows: int
    derived: int


def _collapse_counted(events: DataFrame, spec) -> _Collapsed:
    """Collapse identical events in one pass that also counts the invalid rows and derived
    events (an observation on the way), so a clean batch is read, sorted and cached once."""
    observation = Observation()
    observed = events.observe(
        observation,
        F.count(INVALID).alias("invalid_rows"),
        F.coalesce(F.sum(F.col(DERIVED).cast("long")), F.lit(0)).alias("derived"),
    )
    deduped = merge.collapse_identical(stamped(observed.drop(INVALID, FILE_URI, DERIVED)), spec).persist()
    try:
        events_out = deduped.count()
    except Exception:
        deduped.unpersist()
        raise
    metrics = observation.get
    return _Collapsed(deduped, events_out, metrics["invalid_rows"], metrics["derived"])


def stamped(events: DataFrame) -> DataFrame:
    """The events with `_ingested_at`: when this read took place, one instant for the batch."""
    return with_run_values(events, {m.INGESTED_AT: dt.datetime.now(dt.timezone.utc)})


def _per_file_counts(events: DataFrame) -> dict[str, dict]:
    """file URI -> its invalid rows and the first reason (hashed counts first; the reasons,
    text, come from a second pass over the invalid rows alone)."""
    counts = events.groupBy(FILE_URI).agg(F.count(INVALID).alias("bad_rows")).collect()
    per_file = {row[FILE_URI]: {"bad_rows": row["bad_rows"], "reason": None} for row in counts}
    if any(f["bad_rows"] for f in per_file.values()):
        invalid = events.where(F.col(INVALID).isNotNull()).groupBy(FILE_URI).agg(F.first(INVALID).alias("reason"))
        for row in invalid.collect():
            per_file[row[FILE_URI]]["reason"] = row["reason"]
    return per_file


def read_batch(spark: SparkSession, storage: Storage, fmt: FeedFormat, table: str, files: dict[str, list[Entry]]) -> Batch:
    """The change batch of the landed Parquet files of `files` (partition -> its files)."""
    spec = fmt.table_spec(table)
    partition_of = {entry.uri: partition for partition, entries in files.items() for entry in entries}
    listed = len(partition_of)
    quarantined: list[Quarantined] = []
    groups: dict[str, list[str]] = defaultdict(list)
    schemas: dict[str, pa.Schema] = {}
    rows_of: dict[str, int] = {}
    for entry in (entry for entries in files.values() for entry in entries):
        vetted, reason = _vet(storage, fmt, entry)
        if vetted is None:
            quarantined.append(Quarantined(entry.uri, reason))
            continue
        schema, rows = vetted
        rows_of[entry.uri] = rows
        signature = schema.to_string(show_field_metadata=False, show_schema_metadata=False)
        groups[signature].append(entry.uri)
        schemas[signature] = schema

    events = _union_compatible(spark, fmt, table, groups, schemas, quarantined, rows_of, partition_of)
    if events is None:
        return Batch(None, listed, 0, 0, 0, 0, quarantined)
    try:
        collapsed = _collapse_counted(events, spec)
    except Exception:
        # A file passed its footer check but its pages are damaged: find it and set it aside.
        damaged = _unreadable_in_spark(spark, fmt, {u: (partition_of[u], schemas[sig]) for sig, g in groups.items() for u in g})
        if not damaged:
            raise
        quarantined.extend(Quarantined(u, r, rows_of.pop(u)) for u, r in damaged.items())
        remaining = {sig: [u for u in g if u not in damaged] for sig, g in groups.items()}
        events = _union_compatible(spark, fmt, table, remaining, schemas, quarantined, rows_of, partition_of)
        if events is None:
            return Batch(None, listed, 0, 0, 0, 0, quarantined)
        collapsed = _collapse_counted(events, spec)

    if collapsed.invalid_rows:
        # Some files hold bad rows: they are set aside whole and the rest collapsed again.
        collapsed.events.unpersist()
        bad_files = []
        for uri, counted in _per_file_counts(events).items():
            if not counted["bad_rows"]:
                continue
            reason = f"{counted['reason']} ({counted['bad_rows']} bad row(s), first reason shown)"
            quarantined.append(Quarantined(uri, reason, rows_of.pop(uri, None)))
            bad_files.append(uri)
        collapsed = _collapse_counted(events.where(~F.col(FILE_URI).isin(bad_files)), spec)
    deduped, events_out, derived = collapsed.events, collapsed.events_out, collapsed.derived
    rows_in = sum(rows_of.values())
    return Batch(
        events=deduped,
        files_listed=listed,
        files_read=len(rows_of),
        rows_in=rows_in,
        events_out=events_out,
        duplicates=rows_in + derived - events_out,
        quarantined=quarantined,
        derived=derived,
    )
