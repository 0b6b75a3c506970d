"""Estuary Flow collections read straight from their journal fragments in the bucket.

Layout (docs/formats/flow-journals.md, "Landing layout"):
`<prefix>/<collection>/<logical partition k=v>…/pivot=<hex>/utc_date=YYYY-MM-DD/utc_hour=HH/<fragment>`.
Each `pivot=` folder is a journal; its fragments are named by byte range and checksum and may
overlap. `flow_fragments` holds the pure rules (names, cover, codecs, checksums, transactions),
`flow_documents` what a document becomes as a row, and `flow_tasks` what one Spark task runs
over a journal's cover. This module lists the landing area and runs those tasks: Spark reads
the fragment bytes (`binaryFile`, so s3a works), and one Python task per journal walks its
cover in journal order, because transactions can only be sequenced in order.

A collection is a table named after it (lower case, anything but [a-z0-9_] as `_`), partitioned
by hour. A document belongs to the hour of the fragment holding the record that committed it
(itself outside a transaction, or the ACK of its transaction). To see transactions that straddle
an hour boundary, a run also reads the hour before its first hour as context; documents
committed in that hour belong to its own run. Should a late fragment make a document appear in
two hours' runs, the copies are the same event (same key, clock and content) and the merge
engine keeps one.

A fragment that cannot be used (it does not inflate, its checksum is wrong, a document in it is
not data: no key, a key that is an object or array, an unknown op) is quarantined whole, and its
journal is read again without it: other fragments holding the same bytes take over (see
`flow_fragments.cover`), and bytes that no good fragment holds are reported as gaps, which fail
`landing_complete`. Files outside valid `utc_date=`/`utc_hour=` folders belong to no hour: they
are strays, quarantined with their reason.

Documents map onto the change model: `_meta.op` c/u/d is insert/update/delete, the UUID clock
is both the version time and the sequence, delete documents carry only the key. Top-level fields
become columns; objects and arrays are kept as JSON text, so a nested field that drifts never
breaks a table's schema.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import errno
import functools
import json
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import PlainSerializer, PlainValidator, model_validator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets.catalog.metadata import datetime_to_ms
from lake_assets.config_model import FeedConfig, Model, Names, checked, expected, refused
from lake_assets.engine import model as m
from lake_assets.engine.names import col
from lake_assets.engine.schema import change_columns, one_column_per_name
from lake_assets.epoch import HOUR_MS
from lake_assets.errors import InvalidValue, UnsafePathError
from lake_assets.feeds import flow_fragments as ff
from lake_assets.feeds.base import (
    WALK_FROM_HOURS,
    FeedFormat,
    LandingSurvey,
    current_hour,
    hour_key,
    parse_hour_key,
    walked_hours,
    why_not_yet,
)
from lake_assets.feeds.flow_documents import KEY_KINDS, keep_first_spellings, key_column, stored_key_kinds
from lake_assets.feeds.flow_tasks import TASK_OUTPUT_DDL, read_journal_task
from lake_assets.ingest import (
    TEXT_REPAIRED,
    Batch,
    canonical_uri_column,
    collapse_counted,
    read_landed,
    text_repaired_per_file,
)
from lake_assets.lake_io import released_after
from lake_assets.paths import safe_segment
from lake_assets.quarantine import Quarantined
from lake_assets.reruns import ByteRange, Reading, merged
from lake_assets.storage import Entry, Storage, data_files, is_hidden

_SPARK_CORRUPT_RECORD = "__spark_corrupt_record"
_DATE = re.compile(r"utc_date=([0-9]{4}-[0-9]{2}-[0-9]{2})")
_HOUR = re.compile(r"utc_hour=([0-9]{2})")

#: a row per cover piece to read, then one per fragment of the run's hours the cover does not
#: read (`compare`: its bytes are held against those read for its offsets, `flow_tasks`)
_PLAN_DDL = (
    "journal string, uri string, skip long, stop long, taken_over_by string, order long, hour string, "
    "compare boolean"
)


@dataclasses.dataclass(frozen=True)
class Journal:
    uri: str
    name: str  # relative to the landing prefix, e.g. acmeCo/orders/category=Anvils/pivot=00


def folder_date(name: str) -> dt.date | None:
    """The date a `utc_date=YYYY-MM-DD` folder names, or None when none (`utc_date=2026-02-30`)."""
    match = _DATE.fullmatch(name)
    try:
        return dt.date.fromisoformat(match.group(1)) if match else None
    except ValueError:
        return None


def folder_hour(date: dt.date, name: str) -> dt.datetime | None:
    """The hour a `utc_hour=HH` folder names in the folder of `date`, or None (`utc_hour=25`, `utc_hour=7`)."""
    match = _HOUR.fullmatch(name)
    if not match or int(match.group(1)) > 23:
        return None
    return dt.datetime(date.year, date.month, date.day, int(match.group(1)))


def uri_hour(uri: str) -> str | None:
    """The hour key of the `utc_date=`/`utc_hour=` folders a fragment lies in, None outside them."""
    folders = uri.split("/")[:-1]
    date = folder_date(folders[-2]) if len(folders) >= 2 else None
    moment = folder_hour(date, folders[-1]) if date else None
    return hour_key(moment) if moment else None


def stray_reason(journal: str, folders: list[str]) -> str | None:
    """Why a file in `folders` (its path below the folder of `journal`) belongs to no hour, or None
    when it is directly in a valid `utc_date=`/`utc_hour=` folder, where a run reads it."""
    if not folders:
        return f"the file is directly in journal folder '{journal}', not inside a utc_date=/utc_hour= folder"
    date = folder_date(folders[0])
    if date is None:
        return f"folder '{folders[0]}' is not a valid utc_date=YYYY-MM-DD folder: the file is in no hour"
    if len(folders) == 1:
        return f"the file is directly in '{folders[0]}', not inside one of its utc_hour=HH folders"
    if folder_hour(date, folders[1]) is None:
        return f"folder '{folders[0]}/{folders[1]}' is not an hour folder (utc_hour=00..23): the file is in no hour"
    if len(folders) > 2:
        return (
            f"the file is inside '{'/'.join(folders[2:])}', a folder within hour folder "
            f"'{folders[0]}/{folders[1]}'; only files directly in an hour folder are read"
        )
    hour = folder_hour(date, folders[1])
    return why_not_yet(hour, f"{journal}/{folders[0]}/{folders[1]}") if hour else None


@dataclasses.dataclass
class _JournalFragments:
    """The fragments of one journal that a run lists, and what reading them has found so far."""

    name: str
    fragments: list[ff.Fragment]
    hour_of: dict[str, str]  # fragment uri -> the hour folder it was listed in
    failed: dict[str, str] = dataclasses.field(default_factory=dict)  # fragment uri -> why it cannot be used
    #: hour folders listed for it after the run's own, fragments or not (`_add_fragments`)
    listed: set[str] = dataclasses.field(default_factory=set)

    def hours_read(self) -> set[str]:
        """The hours whose folders were listed: those of its fragments and those added since."""
        return set(self.hour_of.values()) | self.listed

    def cover(self) -> tuple[list[ff.CoverPiece], list[ff.Gap]]:
        return ff.cover(self.fragments, self.failed, lambda fragment: self.hour_of[fragment.uri])

    def fragment(self, uri: str) -> ff.Fragment:
        return next(f for f in self.fragments if f.uri == uri)

    def plan(self, wanted: frozenset[str]) -> list[tuple]:
        """Rows of `_PLAN_DDL`: the pieces of the current cover, in journal order, then the
        fragments of the `wanted` hours it does not read (another holds their bytes, or their
        name says they hold none), to be compared with what it reads."""
        pieces = self.cover()[0]
        read = {p.fragment.uri for p in pieces}
        unread = [
            f
            for f in self.fragments
            if f.uri not in read and f.uri not in self.failed and self.hour_of[f.uri] in wanted
        ]
        return [
            (
                self.name,
                p.fragment.uri,
                p.skip,
                p.stop,
                p.taken_over_by,
                order,
                self.hour_of[p.fragment.uri],
                False,
            )
            for order, p in enumerate(pieces)
        ] + [
            (self.name, f.uri, 0, None, None, len(pieces) + order, self.hour_of[f.uri], True)
            for order, f in enumerate(unread)
        ]


@dataclasses.dataclass
class _PassNotes:
    """What the notes of the documents a read takes say, over its passes."""

    #: the sequencers' counts
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    #: other hours that commit documents of the run's hours -> the fragments holding them
    elsewhere: dict[str, list[ByteRange]] = dataclasses.field(default_factory=dict)
    #: folded columns holding empty text in some document (`DocumentRow`)
    empty_text: set[str] = dataclasses.field(default_factory=set)
    #: folded column -> the spelling its column takes (`DocumentRow`)
    spellings: dict[str, str] = dataclasses.field(default_factory=dict)
    #: key pointer -> JSON kind of its values -> documents taken
    key_kinds: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    def mixed_key_kinds(self) -> dict[str, str]:
        """pointer -> the kind most documents give it, for each key whose documents disagree
        (of kinds equally common, the first of `KEY_KINDS`)."""
        return {
            pointer: min(counted, key=lambda kind: (-counted[kind], KEY_KINDS.index(kind)))
            for pointer, counted in self.key_kinds.items()
            if len(counted) > 1
        }


def _failures_of_their_own(notes: list, by_name: dict[str, _JournalFragments]) -> dict[tuple[str, str], str]:
    """(journal, fragment URI) -> why it failed, of the pieces a pass reports bad, less those
    read only from inside (a skip) after a piece of their journal that failed too: where such
    a piece starts is the failed piece's doing (a damaged fragment claiming more bytes than it
    holds), so the next pass, on a cover without that one, judges it again from where it
    starts then. Each pass still sets its journals' first failed piece aside, so the passes
    end; a failure not placed on the cover (a fragment blamed for another's stop) is kept."""
    bad = [note for note in notes if note["kind"] == "bad"]
    placed: dict[tuple[str, str], list[tuple[int, int]]] = {}  # -> its pieces' (order, skip)
    for name in {note["journal"] for note in bad}:
        for order, piece in enumerate(by_name[name].cover()[0]):
            placed.setdefault((name, piece.fragment.uri), []).append((order, piece.skip))
    first_failed: dict[str, int] = {}
    for note in bad:
        for order, _ in placed.get((note["journal"], note["uri"]), []):
            first_failed[note["journal"]] = min(first_failed.get(note["journal"], order), order)

    def started_inside_after_a_failure(journal: str, pieces: list[tuple[int, int]]) -> bool:
        return bool(pieces) and all(skip > 0 and order > first_failed[journal] for order, skip in pieces)

    return {
        (note["journal"], note["uri"]): note["reason"]
        for note in bad
        if not started_inside_after_a_failure(note["journal"], placed.get((note["journal"], note["uri"]), []))
    }


def _collection_name(value: Any) -> bool:
    """`/`-separated segments of Flow's characters, each a folder name the lake may go into
    (`paths.safe_segment`: not `.`, nor starting with `-` or `.`)."""
    if not isinstance(value, str) or re.fullmatch(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*", value) is None:
        return False
    try:
        for segment in value.split("/"):
            safe_segment(segment, "collection")
    except UnsafePathError:
        return False
    return True


def _selection(value: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Logical partitions to read: `{field: [values]}` in the file, field -> values pairs in code."""
    pairs = value.items() if isinstance(value, dict) else value
    what = "a mapping of a partition field to a non-empty list of values, such as {region: [eu, us]}"
    try:
        pairs = [tuple(pair) for pair in pairs]
        selection = dict(pairs)
    except (TypeError, ValueError):
        raise expected(what) from None
    if len(selection) < len(pairs):  # given as pairs in code: a field twice, and the last one won
        raise refused("a partition field is given twice")
    if not all(_field_and_values(field, values) for field, values in selection.items()):
        raise expected(what)
    if any(len({str(v) for v in values}) < len(values) for values in selection.values()):
        raise refused("a partition field's list names a value twice")
    return tuple(sorted((field, tuple(str(v) for v in values)) for field, values in selection.items()))


def _field_and_values(field: Any, values: Any) -> bool:
    return (
        isinstance(field, str)
        and re.fullmatch(r"[A-Za-z0-9_]+", field) is not None
        and isinstance(values, (list, tuple))
        and len(values) > 0
        and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values)
    )


class CollectionConfig(Model):
    """A Flow collection: its name (which is also its storage prefix) and its key pointers."""

    _positional = ("name", "key", "partitions")

    name: Annotated[str, checked("a collection name such as acmeCo/orders", _collection_name)]
    key: Names[
        Annotated[
            str,
            checked(
                "a JSON pointer such as /id",
                lambda v: isinstance(v, str) and re.fullmatch(r"(/[A-Za-z0-9_.-]+)+", v) is not None,
            ),
        ]
    ]
    #: logical partitions to read, field -> accepted values; all when empty
    partitions: Annotated[
        tuple[tuple[str, tuple[str, ...]], ...],
        PlainValidator(_selection),
        PlainSerializer(lambda pairs: {field: list(values) for field, values in pairs}),
    ] = ()

    def wants(self, field: str, value: str) -> bool:
        """Whether a logical partition folder `field=value` is selected."""
        selected = dict(self.partitions)
        return field not in selected or value in selected[field]

    @property
    def table(self) -> str:
        """The lake table: the name in lower case, anything but [a-z0-9_] as `_`."""
        return re.sub(r"[^a-z0-9_]", "_", self.name.lower())


class FlowJournalFeedConfig(FeedConfig):
    """An Estuary Flow feed: the collections to read, each with its key."""

    format: Literal["flow_journal"]
    collections: Names[CollectionConfig]

    @model_validator(mode="after")
    def _one_table_per_collection(self) -> FlowJournalFeedConfig:
        seen: dict[str, str] = {}
        for index, collection in enumerate(self.collections):
            if collection.table in seen:
                raise refused(
                    f"collections {seen[collection.table]} and {collection.name} both become table "
                    f"{collection.table}",
                    at=("collections", index, "name"),
                )
            seen[collection.table] = collection.name
        nested = self._nested_in(self.collections)
        if nested:
            raise refused(nested[0], at=nested[1])
        return self

    def clash_with_sibling(self, sibling: FeedConfig) -> tuple[str, tuple[str | int, ...]] | None:
        return self._nested_in(sibling.collections or ())

    def _nested_in(self, others: Sequence[CollectionConfig]) -> tuple[str, tuple[str | int, ...]] | None:
        """The first of this feed's collections that lies around or inside one of `others`: the
        outer one's walk would set the inner one's files aside as strays."""
        for index, collection in enumerate(self.collections):
            for other in others:
                outer, inner = sorted((collection.name, other.name), key=len)
                if inner.startswith(f"{outer}/"):
                    return (
                        f"collection {inner} lies inside collection {outer}: a collection's folder holds "
                        "its own journals only",
                        ("collections", index, "name"),
                    )
        return None


def _missing_between(journal: _JournalFragments, begin: int, end: int, later: set[str]) -> bool:
    """Whether the journal's fragments listed so far leave bytes in `[begin, end)` unheld, and
    those listed outside the `later` hours all begin after `begin` (reading further back can
    then still find them; once they reach it, a hole left is the landing's)."""
    earliest = min(
        (f.name.begin for f in journal.fragments if journal.hour_of[f.uri] not in later), default=begin
    )
    reached = earliest <= begin
    return not reached and any(gap.begin < end and gap.end > begin for gap in journal.cover()[1])


def _selects_folder(collection: CollectionConfig, below_root: str) -> bool:
    """Whether `collection` reads the logical partition folder at `below_root` (its path below
    the collection's folder): it selects each `field=value` on the way."""
    return all(collection.wants(*segment.split("=", 1)) for segment in below_root.split("/"))


@dataclasses.dataclass(frozen=True)
class _CollectionWalk:
    """What a walk of a collection's folders met: its journals (`pivot=` folders), the entries
    that are neither a logical partition folder nor a journal folder (each with its path below
    the landing), and the logical partition folders its `partitions` leave out."""

    journals: list[Journal]
    misfits: list[tuple[Entry, str]]
    unselected: list[Entry]


def _journal_name(landing: str, uri: str) -> str:
    """The journal a fragment's URI belongs to, as a reading names it: its folder under the
    landing, without the `utc_date=`/`utc_hour=` folders."""
    return _journal_folder(uri)[len(landing.rstrip("/")) + 1 :]


def _fragments_named(uris: list[str]) -> list[ff.Fragment]:
    """The fragments among `uris` that hold bytes (a name that is no fragment's, or an empty
    fragment, is read by no cover)."""
    fragments = []
    for uri in uris:
        try:
            fragment = ff.fragment_from_uri(uri)
        except InvalidValue:
            continue
        if fragment.name.end > fragment.name.begin:
            fragments.append(fragment)
    return fragments


def _journal_folder(uri: str) -> str:
    """A fragment's journal folder as its URI spells it (cheap: no name parsed)."""
    return uri.split("/utc_date=", 1)[0]


#: the folder beside the collections in a Flow storage mapping's prefix where Flow keeps its
#: tasks' recovery logs: not a collection, and not reported as one left unread
FLOW_RECOVERY_LOGS = "recovery"

#: the folders of a fragment below its journal name: `utc_date=…/utc_hour=…`
FRAGMENT_LEVELS = 2


def _in_the_fragment_layout(folders: list[str]) -> bool:
    """Whether `folders` (below a journal folder) are an hour folder's path or the beginning of
    one, where a link is followed as the hours' listing follows it."""
    if not folders:
        return True
    date = folder_date(folders[0])
    if date is None or len(folders) > FRAGMENT_LEVELS:
        return False
    return len(folders) == 1 or folder_hour(date, folders[1]) is not None


def _fragments_in(storage: Storage, hour_folder: str) -> list[Entry]:
    """The fragments directly in one journal's folder of an hour. A run asks every journal for
    it: where one holds a file, or a link round a loop, in the folder's place, that journal has
    none (the walk for strays reports what is there), and the other journals' are still read."""
    try:
        return data_files(storage, hour_folder)
    except NotADirectoryError:
        return []
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return []
        raise


def _fragment_hour(folders: list[str]) -> dt.datetime | None:
    """The hour a fragment's folders below its journal name (`FRAGMENT_LEVELS`), or None."""
    date = folder_date(folders[0]) if len(folders) == FRAGMENT_LEVELS else None
    return folder_hour(date, folders[1]) if date else None


class FlowJournalFormat(FeedFormat):
    name = "flow_journal"
    config_model = FlowJournalFeedConfig
    partition_column = "hour"
    partitioning = "hourly"
    file_format = "flow"
    # Its events are checkpointed once parsed, and a fragment's name holds its content's checksum.
    batch_rereads_landing = False
    files_share_data = True

    #: the most bytes one fragment's content may hold (see `flow_fragments.MAX_FRAGMENT_BYTES`)
    max_fragment_bytes: int = ff.MAX_FRAGMENT_BYTES

    def holding_removed_data(self, removed: list[str], landed: list[str]) -> dict[str, str]:
        """Fragments whose byte ranges overlap those of removed fragments of their journal: a
        compaction and the fragments it holds again, either way round. (Sorted by begin, with
        the furthest-reaching so far at each: a retention clean-up may remove thousands.)"""
        by_journal: dict[str, list[ff.Fragment]] = {}
        for fragment in sorted(_fragments_named(removed), key=lambda f: f.name.begin):
            by_journal.setdefault(fragment.journal, []).append(fragment)
        reach: dict[str, tuple[list[int], list[ff.Fragment]]] = {}
        for journal, fragments in by_journal.items():
            furthest: list[ff.Fragment] = []
            for fragment in fragments:
                furthest.append(
                    fragment if not furthest or fragment.name.end > furthest[-1].name.end else furthest[-1]
                )
            reach[journal] = ([f.name.begin for f in fragments], furthest)
        holding = {}
        folders = {_journal_folder(uri) for uri in removed}
        for fragment in _fragments_named([uri for uri in landed if _journal_folder(uri) in folders]):
            if fragment.journal not in reach:
                continue
            begins, furthest = reach[fragment.journal]
            before_end = bisect.bisect_left(
                begins, fragment.name.end
            )  # removed ones beginning before its end
            if before_end and furthest[before_end - 1].name.end > fragment.name.begin:
                holding[fragment.uri] = furthest[before_end - 1].uri
        return holding

    def byte_ranges(self, landing: str, uris: list[str]) -> list[ByteRange]:
        """Each fragment's bytes of its journal (a name that is no fragment's holds none)."""
        return [
            ByteRange(
                fragment.uri, _journal_name(landing, fragment.uri), fragment.name.begin, fragment.name.end
            )
            for fragment in _fragments_named(uris)
        ]

    def __init__(
        self, collections: tuple[CollectionConfig, ...] = (), siblings: tuple[CollectionConfig, ...] = ()
    ):
        self.collections = {c.table: c for c in collections}
        #: the collections of other feeds over the same landing (`surveying_with`)
        self.siblings = siblings

    def configured(self, feed) -> FlowJournalFormat:
        return FlowJournalFormat(tuple(feed.collections or ()))

    def surveying_with(self, siblings: Sequence) -> FlowJournalFormat:
        theirs = tuple(c for sibling in siblings for c in sibling.collections or ())
        # its own last: a sibling's collection of the same table name does not stand in for it
        return FlowJournalFormat((*theirs, *self.collections.values()), theirs) if theirs else self

    def collection(self, table: str) -> CollectionConfig:
        try:
            return self.collections[table]
        except KeyError:
            raise InvalidValue(f"no Flow collection is configured for table {table!r}") from None

    def survey(self, storage: Storage, landing: str) -> LandingSurvey:
        """The configured collections that have a folder in the landing, and what lies beside
        the way to them: a Flow feed's tables are named in its configuration (a collection's
        name may hold `/`, so the landing's top does not list them), one with no folder has
        landed nothing, or is misspelt, and a collection landed but not configured
        (`acmeCo/customers` beside `acmeCo/orders`, `other/things`) is read by no table."""
        top = landing.rstrip("/")
        roots = {t: self._collection_root(landing, t) for t in sorted(self.collections)}
        # folder -> the names in it that lead to a configured collection (`acmeCo` in the
        # landing, `orders` in `acmeCo/`): a listing of each folder on the way, a few in all.
        # A folder that is not there lists as empty.
        leading: dict[str, set[str]] = {}
        for root in roots.values():
            folder = top
            for segment in root[len(top) + 1 :].split("/"):
                leading.setdefault(folder, set()).add(segment)
                folder = f"{folder}/{segment}"
        holding = {root.rsplit("/", 1)[0] for root in roots.values()}
        listed: dict[str, list[Entry]] = {}
        for folder in leading:
            try:
                listed[folder] = storage.list(folder)
            except OSError:
                if folder in holding:
                    raise
                # credentials granted for the collections' own prefixes may not list above them:
                # what lies beside the way goes unsaid, and the collections are still found
        found = {e.uri.rstrip("/") for entries in listed.values() for e in entries if e.is_dir}
        unread = [
            f"{e.uri}{'/' if e.is_dir else ''}: no configured collection is in it, so no table reads it"
            for folder, entries in listed.items()
            for e in entries
            if not is_hidden(e.name)
            and not (e.is_dir and e.name in leading[folder])
            and not (folder == top and e.is_dir and e.name == FLOW_RECOVERY_LOGS)
        ]
        tables = [t for t, root in roots.items() if root in found]
        return LandingSurvey(tables, sorted(unread + self._unselected_partitions(storage, landing, tables)))

    def _unselected_partitions(self, storage: Storage, landing: str, tables: list[str]) -> list[str]:
        """A line per logical partition folder that the feed's own collections' `partitions`
        leave out and no other feed's collection of the same name reads: no table reads its
        files (and, narrowed since, their rows leave `changes` as removed files' do). A walk
        down to the journals of each collection with a selection; one that cannot be walked is
        its runs' to report."""
        lines = []
        for table in tables:
            collection = self.collection(table)
            if not collection.partitions or any(collection is c for c in self.siblings):
                continue
            others = [c for c in self.siblings if c.name == collection.name]
            selected = "; ".join(f"{field}: {', '.join(values)}" for field, values in collection.partitions)
            try:
                unselected = self._collection_folders(storage, landing, table).unselected
            except OSError:
                continue
            root = self._collection_root(landing, table)
            lines += [
                f"{entry.uri}/: not among collection {collection.name}'s partitions ({selected}), so no table reads it"
                for entry in unselected
                if not any(_selects_folder(other, entry.uri[len(root) + 1 :]) for other in others)
            ]
        return lines

    def configured_tables(self, feed) -> list[str] | None:
        """A Flow feed names its collections in the configuration: they are its tables."""
        return super().configured_tables(feed) or sorted(self.collections)

    def table_spec(self, table: str) -> m.TableSpec:
        return m.TableSpec(name=table, keys=tuple(key_column(p) for p in self.collection(table).key))

    def vet_schema(self, schema: pa.Schema) -> str | None:  # fragments are not Parquet
        return None

    def normalise(self, raw: DataFrame) -> DataFrame:
        raise NotImplementedError("Flow fragments are read by read_batch, not as Parquet")

    # --- listing --------------------------------------------------------------------------------
    def journals(self, storage: Storage, landing: str, table: str) -> list[Journal]:
        """Every `pivot=` folder under the collection, through the selected logical partitions."""
        return self._collection_folders(storage, landing, table).journals

    def _collection_folders(self, storage: Storage, landing: str, table: str) -> _CollectionWalk:
        """A walk of the collection's folders down to its journals (see `journals`)."""
        collection = self.collection(table)
        root = self._collection_root(landing, table)
        found: list[Journal] = []
        misfits: list[tuple[Entry, str]] = []
        unselected: list[Entry] = []

        def descend(uri: str, relative: str) -> None:
            for entry in storage.list(uri):
                child = f"{relative}/{entry.name}"
                if is_hidden(entry.name):  # not data (`storage.is_hidden`), as under a journal
                    continue
                if (
                    not entry.is_dir
                    or "=" not in entry.name
                    or entry.name.startswith(("utc_date=", "utc_hour="))
                ):
                    misfits.append((entry, child))
                elif entry.name.startswith("pivot="):
                    found.append(Journal(uri=entry.uri, name=child))
                elif collection.wants(*entry.name.split("=", 1)):
                    descend(entry.uri, child)
                else:  # never listed inside: discovery names the folder as read by no table
                    unselected.append(entry)

        descend(root, collection.name)
        return _CollectionWalk(found, misfits, unselected)

    def _collection_root(self, landing: str, table: str) -> str:
        """The folder of the table's collection: its name's segments below the landing."""
        segments = [safe_segment(p, "collection") for p in self.collection(table).name.split("/")]
        return "/".join([landing.rstrip("/"), *segments])

    def stray_files(self, storage: Storage, landing: str, table: str) -> list[tuple[Entry, str]]:
        """Every file under the collection's selected partitions that no hour reads, with the reason.
        One walk of every journal: a run's cost, not a sensor tick's."""
        walk = self._collection_folders(storage, landing, table)
        strays = []
        for entry, where in walk.misfits:
            misfit = (
                f"'{where}' is neither a logical partition (field=value) nor a journal (pivot=) folder, "
                "so the file is in no journal"
            )
            strays += [
                (file, file.unreadable or misfit)
                for file in (
                    storage.walk_files(entry.uri, skip=is_hidden, follow_link=lambda folders: False)
                    if entry.is_dir
                    else [entry]
                )
            ]
        for journal in walk.journals:
            for entry in storage.walk_files(journal.uri, skip=is_hidden, follow_link=_in_the_fragment_layout):
                reason = stray_reason(journal.name, entry.uri[len(journal.uri) + 1 :].split("/")[:-1])
                # A file no one can open (a link that leads nowhere, a local name that is not
                # UTF-8, an S3 hour folder's own key holding data) is in no hour's listing
                # (`storage.data_files`): why it cannot be read says most.
                why = entry.unreadable or reason
                if why is not None:
                    strays.append((entry, why))
        return strays

    def _hour_folders(self, storage: Storage, journal: Journal, since: dt.datetime | None) -> dict[str, str]:
        """Hour key -> folder of the valid hour folders of a journal at or after `since`; the rest are
        strays (`stray_files`), never partitions."""
        floor = hour_key(since) if since else ""
        hours = {}
        for day in storage.list(journal.uri):
            date = folder_date(day.name) if day.is_dir else None
            if date is None or date.isoformat() < floor[:10]:
                continue
            for folder in storage.list(day.uri):
                hour = folder_hour(date, folder.name) if folder.is_dir else None
                if hour is not None and floor <= hour_key(hour) and hour <= current_hour():
                    hours[hour_key(hour)] = folder.uri
        return hours

    def _hour_folder(self, journal: Journal, key: str) -> str:
        moment = parse_hour_key(key)
        return f"{journal.uri}/utc_date={moment:%Y-%m-%d}/utc_hour={moment:%H}"

    def _hour_files(
        self, storage: Storage, journal: Journal, since: dt.datetime | None
    ) -> dict[str, list[Entry]]:
        """Hour key -> the fragments of a journal's valid hour folders at or after `since`; with no
        `since`, from one walk of the journal (`walked_hours`) where it can list every folder."""
        walked = (
            walked_hours(storage, journal.uri, _fragment_hour, FRAGMENT_LEVELS) if since is None else None
        )
        if walked is not None:
            return walked
        return {
            key: data_files(storage, folder)
            for key, folder in self._hour_folders(storage, journal, since).items()
        }

    def landed_hours(
        self, storage: Storage, landing: str, table: str, since: dt.datetime | None
    ) -> dict[str, tuple[Entry, ...]]:
        hours: dict[str, list[Entry]] = {}
        for journal in self.journals(storage, landing, table):
            for key, files in self._hour_files(storage, journal, since).items():
                hours.setdefault(key, []).extend(
                    dataclasses.replace(e, name=f"{journal.name}/{e.name}") for e in files
                )
        return {k: tuple(sorted(v, key=lambda e: e.name)) for k, v in hours.items() if v}

    def landing_span(self, storage: Storage, uri: str) -> tuple[int, int] | None:
        """A fragment's hour (of its first append) is what its path tells without inflating it;
        unknown (None) for a file outside a valid hour folder."""
        date_folder, hour_folder = ([*uri.rsplit("/", 3)[-3:-1], "", ""])[:2]
        date = folder_date(date_folder)
        start = folder_hour(date, hour_folder) if date else None
        if start is None:
            return None
        start_ms = datetime_to_ms(start)
        return start_ms, start_ms + HOUR_MS - 1

    def partition_keys(self, storage: Storage, landing: str, table: str) -> list[str]:
        return sorted(self.landed_hours(storage, landing, table, None))

    def partition_files(self, storage: Storage, landing: str, table: str, partition: str) -> list[Entry]:
        return [
            e
            for journal in self.journals(storage, landing, table)
            for e in _fragments_in(storage, self._hour_folder(journal, partition))
        ]

    def partitions_files(
        self, storage: Storage, landing: str, table: str, partitions: list[str]
    ) -> dict[str, list[Entry]]:
        """`partition_files` of each hour; for many hours (a backfill) from one walk of each
        journal (`WALK_FROM_HOURS`)."""
        if len(set(partitions)) < WALK_FROM_HOURS:
            return super().partitions_files(storage, landing, table, partitions)
        landed: dict[str, list[Entry]] = {}
        for journal in self.journals(storage, landing, table):
            for key, files in self._hour_files(storage, journal, None).items():
                landed.setdefault(key, []).extend(files)
        return {key: landed.get(key, []) for key in partitions}

    # --- reading ------------------------------------------------------------------------------
    def read_partitions(self, partitions: list[str]) -> list[str]:
        """A run also reads the hour before its first: transactions may begin there."""
        context = hour_key(parse_hour_key(min(partitions)) - dt.timedelta(hours=1))
        return sorted({context, *partitions})

    def read_batch(
        self,
        spark: SparkSession,
        storage: Storage,
        landing: str,
        table: str,
        files: dict[str, list[Entry]],
        hours: list[str],
        processed_before: Callable[[], set[str]] = set,
        must_read: Sequence[ByteRange] = (),
        stored: T.StructType | None = None,
    ) -> Batch:
        """Committed documents of `hours`, read fragment by fragment inside Spark.

        `files` holds the fragments of every hour in `read_partitions(hours)`; those of the
        context hour only complete transactions that began there. A journal whose cover has a
        fragment that fails is read again, on a cover without it, until every piece reads (each
        pass sets at least one more fragment aside, so this ends); only journals with a failure
        are read again.

        A key takes one JSON kind: the kind of its column in the `stored` table, else the kind
        most of the batch's documents give it. Read together, Spark would make a column of
        numbers and texts text, and the keys 1 and "1" one. A fragment holding a key of another
        kind is set aside (when the documents disagree, the batch is read again knowing the kind).
        """
        collection = self.collection(table)
        wanted = frozenset(hours)
        last_processed = functools.cache(lambda: max(processed_before(), default=None))

        def reach(journal: _JournalFragments, later: bool) -> bool:
            # Reading on only tells which later hour commits the run's documents, which matters
            # only to an hour processed before (`pipeline.request_reruns`).
            return self._add_hours(storage, landing, journal, later, last_processed)

        kinds = stored_key_kinds(stored, collection.key)
        # The passes' outputs stay cached until their documents are parsed, and not a moment
        # longer: released however the read ends.
        with released_after([]) as cached:
            while True:  # each round adds a key to `kinds`, whose other kinds are then set aside
                journals, listed, quarantined = self._journal_fragments(landing, files, wanted)
                self._read_what_was_asked(storage, landing, journals, must_read)
                task = read_journal_task(collection.key, wanted, self.max_fragment_bytes, kinds)
                outcomes, found = self._read_until_every_piece_reads(
                    spark, journals, wanted, task, cached, reach
                )
                mixed = found.mixed_key_kinds()
                if not mixed:
                    break
                kinds = {**kinds, **mixed}
                for frame in cached:
                    frame.unpersist()
                cached.clear()
            read, skipped, gaps, reading = self._tally(journals, wanted, quarantined)
            listed += self._landed_since_the_catalog(journals, files, wanted)
            documents = [
                outcome.where(F.col("kind") == "doc").where(~F.col("journal").isin(sorted(retried)))
                if retried
                else outcome.where(F.col("kind") == "doc")
                for outcome, retried in outcomes
            ]
            bodies = functools.reduce(DataFrame.unionByName, documents).select("body") if documents else None
            rows_in = bodies.count() if bodies is not None else 0
            events = None
            if bodies is not None and rows_in:
                parsed = self._parsed(spark, bodies, found)
                events = self._events(parsed, collection).localCheckpoint(eager=True)
        collapsed = None if events is None else collapse_counted(events, self.table_spec(table), keep=False)
        repaired = (
            text_repaired_per_file(events, m.SOURCE_FILE)
            if events is not None and collapsed is not None and collapsed.text_repaired
            else {}
        )
        return Batch(
            None if collapsed is None else collapsed.events,
            listed,
            read,
            rows_in,
            0 if collapsed is None else collapsed.events_out,
            0 if collapsed is None else collapsed.duplicates,
            quarantined,
            files_skipped=skipped,
            gaps=gaps,
            counts=found.counts,
            text_repaired=repaired,
            committed_elsewhere=found.elsewhere,
            reading=reading,
        )

    def _read_until_every_piece_reads(
        self,
        spark: SparkSession,
        journals: list[_JournalFragments],
        wanted: frozenset[str],
        task,
        cached: list[DataFrame],
        reach: Callable[[_JournalFragments, bool], bool],
    ) -> tuple[list[tuple[DataFrame, set[str]]], _PassNotes]:
        """Read the journals' covers, then again those where a fragment failed, on covers without
        the fragments that failed; those where an acknowledgement of the run's hours may commit
        documents of earlier hours, with those hours added; and those where documents of the
        run's hours are still pending at the end, with later hours added (`reach`, which says
        whether the journal has any), until a pass needs none of that (each pass sets a fragment
        aside or reads further, so this ends). Returns each pass's output with the journals it
        must not be taken from (read again later), and what the notes of the documents taken
        say (`_PassNotes`). Each pass's output is cached, and added to `cached` for the caller to
        release."""
        outcomes: list[tuple[DataFrame, set[str]]] = []
        found = _PassNotes()
        todo = journals
        while todo:
            plan = [row for journal in todo for row in journal.plan(wanted)]
            if not plan:
                break
            outcome = self._read_journals(spark, plan, task)
            cached.append(outcome)
            notes = outcome.where(F.col("kind") != "doc").collect()
            retried = self._take_notes(notes, journals, found, reach)
            outcomes.append((outcome, retried))
            todo = [journal for journal in journals if journal.name in retried]
        return outcomes, found

    @staticmethod
    def _tally(
        journals: list[_JournalFragments], wanted: frozenset[str], quarantined: list[Quarantined]
    ) -> tuple[int, int, list[str], Reading]:
        """Files of the run's hours read and superseded, the gaps up to the end of the run's own
        fragments (a hole further on is a later hour's to report), and what was read, on the
        final covers; the fragments of the run's hours that failed are added to `quarantined`."""
        gaps: list[str] = []
        read = skipped = 0
        ranges: dict[str, tuple[tuple[int, int], ...]] = {}
        set_aside: set[str] = set()
        for journal in journals:
            pieces, journal_gaps = journal.cover()
            own_end = max(
                (f.name.end for f in journal.fragments if journal.hour_of[f.uri] in wanted), default=0
            )
            gaps.extend(gap.description for gap in journal_gaps if gap.begin < own_end)
            ranges[journal.name] = merged([(piece.start, piece.end) for piece in pieces])
            set_aside.update(journal.failed)
            used = {piece.fragment.uri for piece in pieces}
            for fragment in journal.fragments:
                if journal.hour_of[fragment.uri] not in wanted:
                    continue
                if fragment.uri in journal.failed:
                    # the URI as listed: a fragment's name is never URL-encoded (Flow's escapes are text)
                    quarantined.append(
                        Quarantined(
                            fragment.uri,
                            journal.failed[fragment.uri],
                            partition=journal.hour_of[fragment.uri],
                        )
                    )
                elif fragment.uri in used:
                    read += 1
                else:
                    skipped += 1
        return read, skipped, gaps, Reading(ranges, frozenset(set_aside))

    @staticmethod
    def _landed_since_the_catalog(
        journals: list[_JournalFragments], files: dict[str, list[Entry]], wanted: frozenset[str]
    ) -> int:
        """Fragments of the run's hours that landed after its catalog step, met in a folder
        listed while reading back or on: `_tally` counts them read, superseded or set aside, so
        they count as listed too (the next run of their hour reads them as catalogued)."""
        catalogued = {entry.uri for entries in files.values() for entry in entries}
        return sum(
            1
            for journal in journals
            for fragment in journal.fragments
            if journal.hour_of[fragment.uri] in wanted and fragment.uri not in catalogued
        )

    @staticmethod
    def _journal_fragments(
        landing: str, files: dict[str, list[Entry]], wanted: frozenset[str]
    ) -> tuple[list[_JournalFragments], int, list[Quarantined]]:
        """The listed files grouped by journal as fragments, how many belong to the run's own
        hours, and those of them that are not fragments at all (by name)."""
        by_journal: dict[str, list[tuple[str, Entry]]] = {}
        for key, entries in files.items():
            for entry in entries:
                by_journal.setdefault(_journal_name(landing, entry.uri), []).append((key, entry))
        journals, quarantined, listed = [], [], 0
        for name, keyed_entries in sorted(by_journal.items()):
            fragments, hour_of = [], {}
            for key, entry in keyed_entries:
                listed += key in wanted
                try:
                    fragment = ff.Fragment(entry.uri, name, ff.parse_fragment_name(entry.name))
                except ValueError as error:
                    if key in wanted:
                        quarantined.append(Quarantined(entry.uri, f"not a journal fragment name: {error}"))
                    continue
                fragments.append(fragment)
                hour_of[entry.uri] = key
            journals.append(_JournalFragments(name, fragments, hour_of))
        return journals, listed, quarantined

    @staticmethod
    def _read_journals(spark: SparkSession, plan: list[tuple], task) -> DataFrame:
        """The task's output over the rows of `plan` (`_PLAN_DDL`: cover pieces and the fragments
        to compare with them), one task per journal, persisted: its notes are collected before its
        documents are read."""
        pieces = spark.createDataFrame(plan, _PLAN_DDL)
        content = read_landed(spark, "binaryFile", sorted({p[1] for p in plan})).select(
            canonical_uri_column("path", encoded=False).alias("uri"), "content"
        )
        # A piece whose file the read did not return keeps its row (no content): the task
        # reports its fragment as bad, where an inner join would drop it without a word.
        return (
            pieces.join(content, "uri", "left")
            .groupBy("journal")
            .applyInArrow(task, TASK_OUTPUT_DDL)
            .persist()
        )

    @staticmethod
    def _take_notes(
        notes: list,
        journals: list[_JournalFragments],
        found: _PassNotes,
        reach: Callable[[_JournalFragments, bool], bool],
    ) -> set[str]:
        """Record what a pass's notes say: fragments that failed (on their journal), journals
        whose earlier or later hours are to be read too (`reach` adds them), and, of the
        journals not read again, what `found` collects; returns the journals to read again."""
        by_name = {journal.name: journal for journal in journals}
        retry = set()
        for (journal, uri), reason in _failures_of_their_own(notes, by_name).items():
            by_name[journal].failed[uri] = reason
        for note in notes:
            if note["kind"] == "bad" or (
                note["kind"] in ("opened_earlier", "pending_after")
                and reach(by_name[note["journal"]], note["kind"] == "pending_after")
            ):
                retry.add(note["journal"])
        for note in notes:
            if note["journal"] in retry:  # judged again on the next pass
                continue
            if note["kind"] == "unread_differs":  # not read: its journal's documents stand, no pass again
                by_name[note["journal"]].failed[note["uri"]] = note["reason"]
            elif note["kind"] == "counts":
                for name, value in json.loads(note["body"]).items():
                    found.counts[name] = found.counts.get(name, 0) + value
            elif note["kind"] == "empty_text":
                found.empty_text.update(json.loads(note["body"]))
            elif note["kind"] == "spellings":
                keep_first_spellings(found.spellings, json.loads(note["body"]))
            elif note["kind"] == "key_kinds":
                for pointer, counted in json.loads(note["body"]).items():
                    for kind, documents in counted.items():
                        kinds = found.key_kinds.setdefault(pointer, {})
                        kinds[kind] = kinds.get(kind, 0) + documents
            elif note["kind"] == "committed_elsewhere":
                fragment = by_name[note["journal"]].fragment(note["uri"])
                part = ByteRange(fragment.uri, fragment.journal, fragment.name.begin, fragment.name.end)
                found.elsewhere.setdefault(note["hour"], []).append(part)
        return retry

    def _add_hours(
        self,
        storage: Storage,
        landing: str,
        journal: _JournalFragments,
        later: bool,
        until: Callable[[], str | None] = lambda: None,
    ) -> bool:
        """Add to `journal` the fragments of as many hours before its earliest (or after its
        latest, up to `until()`) as it spans, at least two, so a transaction open at the start
        (or end) of what was read is found in a few passes however long it lasted; False when
        no such hour is landed. Hours whose folders hold no fragment count as read, so each call
        that returns True reads further and the passes end."""
        read = journal.hours_read()
        folders = self._hour_folders(
            storage, self._journal_at(landing, journal), parse_hour_key(max(read)) if later else None
        )
        beyond = sorted(key for key in folders if (key > max(read) if later else key < min(read)))
        if later and beyond:  # asked only when there is something to read on into
            last = until()
            beyond = [key for key in beyond if last is not None and key <= last]
        if not beyond:
            return False
        step = max(2, len(read))
        self._add_fragments(storage, journal, folders, beyond[:step] if later else beyond[-step:])
        return True

    def _read_back_to(self, storage: Storage, landing: str, journal: _JournalFragments, hour: str) -> None:
        """Add to `journal` the fragments of every hour from `hour` to its earliest."""
        folders = self._hour_folders(storage, self._journal_at(landing, journal), parse_hour_key(hour))
        earliest = min(journal.hour_of.values())
        self._add_fragments(storage, journal, folders, [key for key in folders if key < earliest])

    def _read_what_was_asked(
        self,
        storage: Storage,
        landing: str,
        journals: list[_JournalFragments],
        must_read: Sequence[ByteRange],
    ) -> None:
        """Read each journal back to the hour of the earliest file a run asked these hours to
        read (`reruns`), so the transaction it belongs to is read whole, and the hour of any
        such file after them (a fragment that landed in a later folder). Such a later file (a
        compaction) may hold bytes from long before those read: the journal is then read back,
        hour by hour, while bytes between the earliest asked and the first listed before are
        missing and the hours read back have not reached the asked bytes."""
        for journal in journals:
            parts = [part for part in must_read if part.stream == journal.name]
            hours = {hour for part in parts if (hour := uri_hour(part.uri))}
            read = set(journal.hour_of.values())
            if not hours or not read:
                continue
            if min(hours) < min(read):
                self._read_back_to(storage, landing, journal, min(hours))
            later = sorted(hour for hour in hours if hour > max(read))
            if later:
                first_listed = min(f.name.begin for f in journal.fragments)
                since = parse_hour_key(later[0])
                folders = self._hour_folders(storage, self._journal_at(landing, journal), since)
                self._add_fragments(storage, journal, folders, [hour for hour in later if hour in folders])
                asked_from = min(part.begin for part in parts)
                while _missing_between(journal, asked_from, first_listed, set(later)) and self._add_hours(
                    storage, landing, journal, later=False
                ):
                    pass

    @staticmethod
    def _journal_at(landing: str, journal: _JournalFragments) -> Journal:
        return Journal(f"{landing.rstrip('/')}/{journal.name}", journal.name)

    @staticmethod
    def _add_fragments(
        storage: Storage, journal: _JournalFragments, folders: dict[str, str], keys: list[str]
    ) -> None:
        journal.listed.update(keys)
        for key in keys:
            for entry in data_files(storage, folders[key]):
                try:
                    fragment = ff.Fragment(entry.uri, journal.name, ff.parse_fragment_name(entry.name))
                except ValueError:  # not a fragment: its own hour's run sets it aside
                    continue
                journal.fragments.append(fragment)
                journal.hour_of[entry.uri] = key

    @staticmethod
    def _parsed(spark: SparkSession, bodies: DataFrame, found: _PassNotes) -> DataFrame:
        """The documents' rows (`DocumentRow.json`), each column spelled as `found.spellings`
        says, in the types Spark reads them in, but for a column holding empty text somewhere
        (`found.empty_text`): Spark takes `""` for a value of any type, so beside numbers or
        booleans it reads the column as those and then refuses the `""`. Such a column is text,
        every value spelled as the document wrote it, as when text meets a number in any other
        document (docs/formats/flow-journals.md)."""
        # `bodies` is a one-column DataFrame of text: no RDD (Spark Connect has none). Each body
        # is JSON this reader wrote, so a line Spark cannot parse is a fault to raise, not a row
        # to keep; and Spark's own column for such lines (`_corrupt_record` by default) takes a
        # name no vendor field has in the lake, so a document's field of that name keeps its value.
        # A field null in every document would be inferred as text, and beside a stored number
        # widen the column to text for good: left out, it is NULL in the stored type, as an
        # absent field is (a document is the whole record).
        # A value's text is as long as its fragment allows, not Jackson's 20 million characters.
        reader = (
            spark.read.option("mode", "FAILFAST")
            .option("columnNameOfCorruptRecord", _SPARK_CORRUPT_RECORD)
            .option("dropFieldIfAllNull", "true")
            .option("maxStringLen", ff.MAX_FRAGMENT_BYTES)
        )
        parsed = reader.json(bodies)
        as_text = [
            field.name
            for field in parsed.schema.fields
            if field.name in found.empty_text and not isinstance(field.dataType, T.StringType)
        ]
        if as_text:
            schema = T.StructType(
                [
                    T.StructField(f.name, T.StringType()) if f.name in as_text else f
                    for f in parsed.schema.fields
                ]
            )
            parsed = reader.schema(schema).json(bodies)
        respelled = {
            column: found.spellings[column]
            for column in parsed.columns
            if found.spellings.get(column, column) != column
        }
        return parsed.withColumnsRenamed(respelled) if respelled else parsed

    def _events(self, parsed: DataFrame, collection: CollectionConfig) -> DataFrame:
        parsed = one_column_per_name(parsed, collection.table)
        keys = [key_column(p) for p in collection.key]
        payload = [
            c for c in parsed.columns if not c.startswith("__") and c not in keys and not m.is_reserved(c)
        ]
        return parsed.select(
            *[col(k) for k in keys],
            *[
                F.when(F.col("__op") == m.DELETE, F.lit(None).cast(parsed.schema[c].dataType))
                .otherwise(col(c))
                .alias(c)
                for c in payload
            ],
            *change_columns(
                op=F.col("__op"),
                version_at=F.date_trunc("millisecond", F.to_timestamp("__at")),
                seq=F.col("__clock").cast("long"),
                source_file=F.col("__uri"),
                partition=F.col("__hour"),
                partition_column=self.partition_column,
            ),
            *([F.col(TEXT_REPAIRED)] if TEXT_REPAIRED in parsed.columns else []),
        )
