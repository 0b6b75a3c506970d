"""Estuary Flow collections read straight from their journal fragments in the bucket.

Layout (seeds/estuary-flow-journals.txt, FORMATS.md "Flow"):
`<prefix>/<collection>/<logical partition k=v>…/pivot=<hex>/utc_date=YYYY-MM-DD/utc_hour=HH/<fragment>`.
Each `pivot=` folder is a journal; its fragments are named by byte range and checksum and may
overlap. `flow_fragments` holds the pure rules (names, cover, codecs, checksums, transactions);
this module lists the landing area and runs those rules inside Spark: Spark reads the fragment
bytes (`binaryFile`, so s3a works), and one Python task per journal walks its cover in journal
order, because transactions can only be sequenced in order.

A collection is a table named after it (lower case, anything but [a-z0-9_] as `_`), partitioned
by hour. A document belongs to the hour of the fragment holding the record that committed it
(itself outside a transaction, or the ACK of its transaction). To see transactions that straddle
an hour boundary, a run also reads the hour before its first hour as context; documents
committed in that hour belong to its own run. Should a late fragment make a document appear in
two hours' runs, the copies are the same event (same key, clock and content) and the merge
engine keeps one.

Documents map onto the change model: `_meta.op` c/u/d is insert/update/delete, the UUID clock
is both the version time and the sequence, delete documents carry only the key. Top-level fields
become columns; objects and arrays are kept as JSON text, so a nested field that drifts never
breaks a table's schema.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, functions as F

from lake_assets.config import CollectionConfig
from lake_assets.engine import model as m
from lake_assets.feeds import flow_fragments as ff
from lake_assets.feeds.base import FeedFormat, hour_key, parse_hour_key
from lake_assets.ingest import Batch, canonical_uri, canonical_uri_column, collapse_counted, read_landed
from lake_assets.paths import safe_segment
from lake_assets.quarantine import Quarantined
from lake_assets.storage import Entry, Storage

_OPS = {"c": m.INSERT, "u": m.UPDATE, "d": m.DELETE}
_DATE = re.compile(r"^utc_date=(\d{4}-\d{2}-\d{2})$")
_HOUR = re.compile(r"^utc_hour=(\d{2})$")
_HOUR_IN_PATH = re.compile(r"/utc_date=(\d{4}-\d{2}-\d{2})/utc_hour=(\d{2})/")

# What each journal's task returns: documents, fragments set aside, and the task's counts.
_OUT = pa.schema([
    ("kind", pa.string()), ("hour", pa.string()), ("uri", pa.string()), ("offset", pa.int64()),
    ("body", pa.string()), ("reason", pa.string()),
])
_OUT_DDL = "kind string, hour string, uri string, offset long, body string, reason string"


@dataclasses.dataclass(frozen=True)
class Journal:
    uri: str
    name: str  # relative to the landing prefix, e.g. acmeCo/orders/category=Anvils/pivot=00


def key_column(pointer: str) -> str:
    """The column a key pointer becomes: `/id` -> `id`, `/a/b` -> `a_b`."""
    return pointer.strip("/").replace("/", "_")


def _resolve(document: dict, pointer: str):
    value = document
    for token in pointer.strip("/").split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if not isinstance(value, dict) or token not in value:
            return None
        value = value[token]
    return value


def document_row(doc: ff.Doc, key: tuple[str, ...], hour: str) -> str:
    """One committed document as a flat JSON object: key columns, top-level fields (objects and
    arrays as JSON text) and the change-model fields the feed derives."""
    body = doc.doc
    meta = body.get("_meta") or {}
    row = {
        name: json.dumps(value, sort_keys=True, separators=(",", ":")) if isinstance(value, (dict, list)) else value
        for name, value in body.items()
        if name != "_meta"
    }
    for pointer in key:
        row[key_column(pointer)] = _resolve(body, pointer)
    row.update({
        "__op": _OPS.get(meta.get("op"), m.UPDATE),  # a document without an op is an upsert
        "__clock": doc.uuid.order,
        "__at": doc.uuid.timestamp.isoformat(),
        "__uri": doc.uri,
        "__offset": doc.offset,
        "__hour": hour,
    })
    return json.dumps(row, separators=(",", ":"))


def read_journal_task(key: tuple[str, ...], wanted_hours: frozenset[str]):
    """The per-journal function Spark runs (`applyInArrow`): the cover pieces of one journal,
    with their bytes, in; committed documents, bad fragments and counts out."""

    def run(table: pa.Table) -> pa.Table:
        rows = table.sort_by("order").to_pylist()
        content = {r["uri"]: r["content"] for r in rows}
        sequencer = ff.Sequencer()
        out = {name: [] for name in _OUT.names}

        def emit(kind, hour, uri=None, offset=None, body=None, reason=None):
            for name, value in zip(_OUT.names, (kind, hour, uri, offset, body, reason)):
                out[name].append(value)

        for r in rows:
            fragment = ff.Fragment(uri=r["uri"], journal=r["journal"], name=ff.parse_fragment_name(r["uri"].rsplit("/", 1)[1]))
            piece = ff.CoverPiece(fragment=fragment, skip=r["skip"])
            try:
                docs = ff.read_piece(piece, content.__getitem__)
                for doc in docs:
                    if doc.is_ack:
                        continue
                    op = doc.doc["_meta"].get("op")
                    if op is not None and op not in _OPS:
                        raise ff.FragmentError(doc.uri, f"document has an unknown _meta.op {op!r}", doc.offset)
                    missing = [p for p in key if _resolve(doc.doc, p) is None]
                    if missing:
                        raise ff.FragmentError(doc.uri, f"document has no key {missing}", doc.offset)
            except ff.FragmentError as error:
                emit("bad", r["hour"], error.uri, error.offset, None, str(error))
                continue
            for doc in docs:
                for committed in sequencer.feed(doc):
                    # a document belongs to the hour of the record that committed it
                    if r["hour"] in wanted_hours:
                        emit("doc", r["hour"], committed.uri, committed.offset, document_row(committed, key, r["hour"]))
        sequencer.finish()
        emit("counts", None, rows[0]["journal"] if rows else None, None, json.dumps(sequencer.counts))
        return pa.table(out, schema=_OUT)

    return run


class FlowJournalFormat(FeedFormat):
    name = "flow_journal"
    partition_column = "hour"
    partitioning = "hourly"
    file_format = "flow"

    def __init__(self, collections: tuple[CollectionConfig, ...] = ()):
        self.collections = {c.table: c for c in collections}

    def configured(self, feed) -> "FlowJournalFormat":
        return FlowJournalFormat(tuple(feed.collections or ()))

    def collection(self, table: str) -> CollectionConfig:
        try:
            return self.collections[table]
        except KeyError:
            raise ValueError(f"no Flow collection is configured for table {table!r}") from None

    def discover_tables(self, storage: Storage, landing: str) -> list[str]:
        return sorted(self.collections)

    def table_spec(self, table: str) -> m.TableSpec:
        return m.TableSpec(name=table, keys=tuple(key_column(p) for p in self.collection(table).key))

    def vet_schema(self, schema: pa.Schema) -> str | None:  # fragments are not Parquet
        return None

    def normalise(self, raw: DataFrame, arrow_schema: pa.Schema | None = None) -> DataFrame:
        raise NotImplementedError("Flow fragments are read by read_batch, not as Parquet")

    # --- listing --------------------------------------------------------------------------------
    def journals(self, storage: Storage, landing: str, table: str) -> list[Journal]:
        """Every `pivot=` folder under the collection, through the selected logical partitions."""
        collection = self.collection(table)
        name = collection.name
        root = "/".join([landing.rstrip("/"), *[safe_segment(p, "collection") for p in name.split("/")]])
        found: list[Journal] = []

        def descend(uri: str, relative: str) -> None:
            for entry in storage.list(uri):
                if not entry.is_dir or "=" not in entry.name or entry.name.startswith(("utc_date=", "utc_hour=")):
                    continue
                child = f"{relative}/{entry.name}"
                if entry.name.startswith("pivot="):
                    found.append(Journal(uri=entry.uri, name=child))
                elif collection.wants(*entry.name.split("=", 1)):  # unselected partitions: never listed
                    descend(entry.uri, child)

        descend(root, name)
        return found

    def _hour_folders(self, storage: Storage, journal: Journal, since: dt.datetime | None) -> dict[str, str]:
        floor = hour_key(since) if since else ""
        hours = {}
        for day in storage.list(journal.uri):
            match = _DATE.match(day.name)
            if not day.is_dir or not match or (since and match.group(1) < since.date().isoformat()):
                continue
            for hour in storage.list(day.uri):
                hour_match = _HOUR.match(hour.name)
                if hour.is_dir and hour_match:
                    key = f"{match.group(1)}-{hour_match.group(1)}"
                    if key >= floor:
                        hours[key] = hour.uri
        return hours

    def _hour_folder(self, journal: Journal, key: str) -> str:
        moment = parse_hour_key(key)
        return f"{journal.uri}/utc_date={moment:%Y-%m-%d}/utc_hour={moment:%H}"

    def landed_hours(self, storage: Storage, landing: str, table: str, since: dt.datetime | None) -> dict[str, tuple[str, ...]]:
        hours: dict[str, list[str]] = {}
        for journal in self.journals(storage, landing, table):
            for key, folder in self._hour_folders(storage, journal, since).items():
                names = [f"{journal.name}/{e.name}" for e in storage.list(folder) if not e.is_dir]
                hours.setdefault(key, []).extend(names)
        return {k: tuple(sorted(v)) for k, v in hours.items() if v}

    def landing_span(self, storage: Storage, uri: str) -> tuple[int, int] | None:
        """A fragment's hour (of its first append) is what its path tells without inflating it."""
        match = _HOUR_IN_PATH.search(uri)
        if not match:
            return None
        start = dt.datetime.strptime(f"{match.group(1)}-{match.group(2)}", "%Y-%m-%d-%H").replace(tzinfo=dt.timezone.utc)
        start_ms = int(start.timestamp() * 1000)
        return start_ms, start_ms + 3_600_000 - 1

    def partition_keys(self, storage: Storage, landing: str, table: str) -> list[str]:
        return sorted(self.landed_hours(storage, landing, table, None))

    def partition_files(self, storage: Storage, landing: str, table: str, partition: str) -> list[Entry]:
        return [
            e for journal in self.journals(storage, landing, table)
            for e in storage.list(self._hour_folder(journal, partition)) if not e.is_dir
        ]

    # --- reading ------------------------------------------------------------------------------
    def read_partitions(self, partitions: list[str]) -> list[str]:
        """A run also reads the hour before its first: transactions may begin there."""
        context = hour_key(parse_hour_key(min(partitions)) - dt.timedelta(hours=1))
        return sorted({context, *partitions})

    def read_batch(
        self, spark: SparkSession, storage: Storage, landing: str, table: str,
        files: dict[str, list[Entry]], hours: list[str],
    ) -> Batch:
        """Committed documents of `hours`, read fragment by fragment inside Spark.

        `files` holds the fragments of every hour in `read_partitions(hours)`; those of the
        context hour only complete transactions that began there.
        """
        collection = self.collection(table)
        wanted = frozenset(hours)
        by_journal: dict[str, list[tuple[str, Entry]]] = {}
        for key, entries in files.items():
            for entry in entries:
                by_journal.setdefault(entry.uri.split("/utc_date=", 1)[0], []).append((key, entry))
        plan, quarantined, gaps = [], [], []
        listed = skipped = 0
        for journal_uri, entries in sorted(by_journal.items()):
            journal = journal_uri[len(landing.rstrip("/")) + 1:]
            fragments, hour_of = [], {}
            for key, entry in entries:
                in_run = key in wanted
                listed += in_run
                try:
                    fragment = ff.Fragment(entry.uri, journal, ff.parse_fragment_name(entry.name))
                except ValueError as error:
                    if in_run:
                        quarantined.append(Quarantined(entry.uri, f"not a journal fragment name: {error}"))
                    continue
                fragments.append(fragment)
                hour_of[entry.uri] = key
            pieces, journal_gaps = ff.cover(fragments)
            gaps.extend(f"{g.journal}: bytes {g.begin}..{g.end} are in no fragment" for g in journal_gaps)
            used = {p.fragment.uri for p in pieces}
            skipped += sum(1 for f in fragments if f.uri not in used and hour_of[f.uri] in wanted)
            plan.extend(
                (journal, p.fragment.uri, p.skip, order, hour_of[p.fragment.uri]) for order, p in enumerate(pieces)
            )
        if not plan:
            return Batch(None, listed, 0, 0, 0, 0, quarantined, files_skipped=skipped, gaps=gaps)

        pieces = spark.createDataFrame(plan, "journal string, uri string, skip long, order long, hour string")
        content = read_landed(spark, "binaryFile", sorted({p[1] for p in plan})).select(
            canonical_uri_column("path").alias("uri"), "content"
        )
        outcome = (
            pieces.join(content, "uri")
            .groupBy("journal")
            .applyInArrow(read_journal_task(collection.key, wanted), _OUT_DDL)
            .persist()
        )
        notes = outcome.where(F.col("kind") != "doc").collect()
        counts: dict[str, int] = {}
        for note in notes:
            if note["kind"] == "bad" and note["hour"] in wanted:
                quarantined.append(Quarantined(canonical_uri(note["uri"]), note["reason"]))
            elif note["kind"] == "counts":
                for name, value in json.loads(note["body"]).items():
                    counts[name] = counts.get(name, 0) + value
        bad_uris = {q.uri for q in quarantined}
        read = len({p[1] for p in plan if p[4] in wanted} - bad_uris)
        documents = outcome.where(F.col("kind") == "doc").select("body")
        rows_in = documents.count()
        if rows_in == 0:
            outcome.unpersist()
            return Batch(None, listed, read, 0, 0, 0, quarantined, files_skipped=skipped, gaps=gaps, counts=counts)
        parsed = spark.read.json(documents.rdd.map(lambda r: r[0]))
        events = self._events(parsed, collection).localCheckpoint(eager=True)
        outcome.unpersist()
        collapsed = collapse_counted(events, self.table_spec(table), keep=False)
        return Batch(collapsed.events, listed, read, rows_in, collapsed.events_out, collapsed.duplicates, quarantined,
                     files_skipped=skipped, gaps=gaps, counts=counts)

    def _events(self, parsed: DataFrame, collection: CollectionConfig) -> DataFrame:
        keys = [key_column(p) for p in collection.key]
        payload = [c for c in parsed.columns if not c.startswith("__") and c not in keys and not m.is_reserved(c)]
        return parsed.select(
            *[F.col(f"`{k}`") for k in keys],
            *[F.when(F.col("__op") == m.DELETE, F.lit(None).cast(parsed.schema[c].dataType)).otherwise(F.col(f"`{c}`")).alias(c)
              for c in payload],
            F.col("__op").alias(m.OP),
            F.date_trunc("millisecond", F.to_timestamp("__at")).alias(m.VERSION_AT),
            F.col("__clock").cast("long").alias(m.SEQ),
            F.lit(None).cast("array<string>").alias(m.UNMODIFIED),
            F.lit(False).alias(m.PURGED),
            F.col("__uri").alias(m.SOURCE_FILE),
            F.col("__hour").alias(self.partition_column),
        )
