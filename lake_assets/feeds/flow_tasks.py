"""What Spark's tasks run over a Flow journal: its cover pieces read in journal order, the
documents their transactions commit in the run's hours emitted as rows, and what the driver
needs to judge the read (fragments that cannot be used, counts, hours read too early or too
late). One task per journal, because transactions can only be sequenced in order; the rules
themselves are `flow_fragments` and `flow_documents`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from lake_assets.feeds import flow_fragments as ff
from lake_assets.feeds.base import hour_key, parse_hour_key
from lake_assets.feeds.flow_documents import (
    document_row,
    keep_first_spellings,
    key_kind,
    resolve,
    vet_document,
)

# What each journal's task returns: documents, fragments set aside, and the task's counts.
TASK_OUTPUT = pa.schema(
    [
        ("journal", pa.string()),
        ("kind", pa.string()),
        ("hour", pa.string()),
        ("uri", pa.string()),
        ("offset", pa.int64()),
        ("body", pa.string()),
        ("reason", pa.string()),
    ]
)
TASK_OUTPUT_DDL = (
    "journal string, kind string, hour string, uri string, offset long, body string, reason string"
)


def read_journal_task(
    key: tuple[str, ...],
    wanted_hours: frozenset[str],
    max_bytes: int = ff.MAX_FRAGMENT_BYTES,
    kinds: dict[str, str] | None = None,
) -> Callable[[pa.Table], pa.Table]:
    """The per-journal function Spark runs (`applyInArrow`): the cover pieces of one journal,
    with their bytes, in; committed documents, bad fragments and counts out (`_JournalRead`).
    A document whose key is not of the kind `kinds` gives it sets its fragment aside."""

    def run(table: pa.Table) -> pa.Table:
        rows = table.sort_by("order").to_pylist()
        pieces = [row for row in rows if not row.get("compare")]
        left_out = [row for row in rows if row.get("compare")]
        return _JournalRead(key, wanted_hours, max_bytes, pieces, kinds or {}, left_out).read()

    return run


#: How far before a run's first hour a document's clock may lie and still make the run read
#: back for the document it may repeat (`Sequencer.may_repeat_unread`): a clock older than that is
#: taken for a skewed producer's, so that it cannot make every run read the whole journal.
REPEAT_LOOKBACK = dt.timedelta(hours=24)


def _hour_start(hour: str) -> dt.datetime:
    return parse_hour_key(hour).replace(tzinfo=dt.UTC)


class _JournalRead:
    """One journal's cover pieces read in order, in a Spark task.

    Once a piece fails, the journal's documents are not emitted (the driver reads the journal
    again on a new cover), but the remaining pieces are still checked, so that one pass finds
    every bad fragment of the cover."""

    def __init__(
        self,
        key: tuple[str, ...],
        wanted_hours: frozenset[str],
        max_bytes: int,
        rows: list[dict[str, Any]],
        kinds: dict[str, str],
        left_out: list[dict[str, Any]] | None = None,
    ):
        self.key, self.wanted_hours, self.max_bytes, self.rows = key, wanted_hours, max_bytes, rows
        #: fragments of the run's hours that the cover does not read (`compare` rows of the plan)
        self.left_out = left_out or []
        self.kinds = kinds
        # The hour read before the run's hours (`FlowJournalFormat.read_partitions`): what a first pass reads before them.
        self.context_hour = hour_key(parse_hour_key(min(wanted_hours)) - dt.timedelta(hours=1))
        # Clocks before the earliest hour this pass reads were written before it; those more
        # than REPEAT_LOOKBACK before the run's first hour are taken for a skewed producer's.
        self.unread = ff.ClockWindow(
            _hour_start(min(wanted_hours)) - REPEAT_LOOKBACK,
            _hour_start(min([r["hour"] for r in rows] or [self.context_hour])),
        )
        self.journal = next((r["journal"] for r in [*rows, *self.left_out]), None)
        self.content = {r["uri"]: r["content"] for r in [*rows, *self.left_out]}
        self.hour_of = {r["uri"]: r["hour"] for r in rows}
        self.sequencer = ff.Sequencer()
        self.out: dict[str, list[Any]] = {name: [] for name in TASK_OUTPUT.names}
        self.broken = False
        self.read_to: int | None = None  # the journal offset read so far
        self.first_hour: dict[str, str] = {}  # producer -> the hour of its first record read
        #: producers whose ACK in the run's hours may commit unread documents, or whose document
        #: there may repeat one unread (`Sequencer.may_repeat_unread`)
        self.opened: set[str] = set()
        self.blind = False  # such an ACK found nothing of its producer pending: its documents are unread
        self.elsewhere: set[tuple[str, str]] = set()  # (hour, fragment): the run's documents committed there
        self.empty_text: set[str] = set()  # columns of emitted documents holding "" (`DocumentRow`)
        self.spellings: dict[str, str] = {}  # folded column -> its first spelling in sort order
        self.key_kinds: dict[str, dict[str, int]] = {}  # pointer -> kind -> emitted documents

    def read(self) -> pa.Table:
        for row in self.rows:
            self._read_piece(row)
        if not self.broken:  # else the journal is read again, on another cover, and compared then
            self._finish()
            self._compare_what_the_cover_skips()
        return pa.table(self.out, schema=TASK_OUTPUT)

    def _compare_what_the_cover_skips(self) -> None:
        """Hold the bytes of the run's fragments that the cover does not read against the bytes
        it reads for their offsets: a fragment it leaves out, and the part of a piece's fragment
        before its skip or after its stop. Documents there are taken as read only where the
        bytes are the same (a compaction's or a re-upload's copy). A fragment left out that
        differs, or cannot be read, is noted `unread_differs`, and the driver sets it aside (its
        documents are in no other fragment); a piece's fragment that differs is `bad`, and its
        journal is read again without it, as for any fragment that fails.

        Only journals whose fragments overlap have anything to compare. Ranges are taken in
        journal order, and a piece's content is kept only while a range further on may need it."""
        pieces = [self._piece(row) for row in self.rows]
        checks = [
            *(
                (self._piece(row).fragment, None, None, "unread_differs", row["hour"])
                for row in self.left_out
            ),
            *(
                (p.fragment, p.fragment.name.begin, p.start, "bad", self.hour_of[p.fragment.uri])
                for p in pieces
                if p.skip
            ),
            *(
                (p.fragment, p.end, p.fragment.name.end, "bad", self.hour_of[p.fragment.uri])
                for p in pieces
                if p.stop is not None
            ),
        ]
        inflated: dict[str, ff.Content] = {}

        def content_of(fragment: ff.Fragment) -> ff.Content:
            if fragment.uri not in inflated:
                inflated[fragment.uri] = self._inflated(fragment)
            return inflated[fragment.uri]

        for fragment, begin, end, kind, hour in sorted(
            checks, key=lambda c: c[1] if c[1] is not None else c[0].name.begin
        ):
            start = fragment.name.begin if begin is None else begin
            for uri in [uri for uri in inflated if self._fragment_end(uri) <= start]:
                del inflated[uri]
            try:
                content = self._inflated(fragment) if kind == "unread_differs" else content_of(fragment)
                ff.hold_against(fragment, content, pieces, content_of, begin, end)
            except ff.FragmentError as error:
                self._emit(kind, hour, error.uri, error.offset, None, str(error))
            except Exception as error:  # noqa: BLE001 - input no rule foresaw: this fragment, not the batch
                unforeseen = ff.FragmentError(
                    fragment.uri, f"could not be read ({type(error).__name__}: {error})"
                )
                self._emit(kind, hour, unforeseen.uri, None, None, str(unforeseen))

    @staticmethod
    def _fragment_end(uri: str) -> int:
        return ff.parse_fragment_name(uri.rsplit("/", 1)[1]).end

    def _inflated(self, fragment: ff.Fragment) -> ff.Content:
        """The fragment's verified content (`flow_fragments.verified_content`)."""
        return ff.verified_content(fragment, self._bytes, self.max_bytes)

    def _bytes(self, uri: str) -> bytes:
        """A fragment's stored bytes, as the landing's read returned them. Spark's read returns
        no row for a file of no bytes, which is all an empty fragment (one whose name declares
        no bytes) may hold."""
        if self.content[uri] is None:
            if ff.parse_fragment_name(uri.rsplit("/", 1)[1]).length == 0:
                return b""
            raise ff.FragmentError(uri, "the landing's read returned no bytes for this path")
        return self.content[uri]

    @staticmethod
    def _piece(row: dict[str, Any]) -> ff.CoverPiece:
        fragment = ff.Fragment(
            uri=row["uri"], journal=row["journal"], name=ff.parse_fragment_name(row["uri"].rsplit("/", 1)[1])
        )
        return ff.CoverPiece(
            fragment=fragment, skip=row["skip"], stop=row["stop"], taken_over_by=row["taken_over_by"]
        )

    def _emit(self, kind, hour, uri=None, offset=None, body=None, reason=None) -> None:
        values = (self.journal, kind, hour, uri, offset, body, reason)
        for name, value in zip(TASK_OUTPUT.names, values, strict=True):
            self.out[name].append(value)

    def _read_piece(self, row: dict[str, Any]) -> None:
        uri, hour = row["uri"], row["hour"]
        piece = self._piece(row)
        if self.read_to is not None and piece.start > self.read_to:
            self.sequencer.cut_at_gap()
        self.read_to = piece.end
        try:
            docs = self._vetted_documents(piece)
            if not self.broken:
                self._sequence(hour, docs)
        except ff.FragmentError as error:
            self._emit("bad", hour, error.uri, error.offset, None, str(error))
            self.broken = True
        except Exception as error:  # noqa: BLE001 - input no rule foresaw: this fragment, not the batch
            unforeseen = ff.FragmentError(uri, f"could not be read ({type(error).__name__}: {error})")
            self._emit("bad", hour, unforeseen.uri, None, None, str(unforeseen))
            self.broken = True

    def _vetted_documents(self, piece: ff.CoverPiece) -> list:
        docs = ff.read_piece(piece, self._bytes, self.max_bytes)
        for doc in docs:
            if not doc.is_ack:
                vet_document(doc, self.key, self.kinds)
        return docs

    def _sequence(self, hour: str, docs: list) -> None:
        """Feed a piece's documents to the sequencer; emit those it commits in the run's hours,
        and note which documents of the run's hours a later hour commits."""
        for doc in docs:
            self.first_hour.setdefault(doc.uuid.producer, hour)
            unread_ack = hour in self.wanted_hours and self.sequencer.may_commit_unread(doc)
            if unread_ack or (
                hour in self.wanted_hours and self.sequencer.may_repeat_unread(doc, self.unread)
            ):
                self.opened.add(doc.uuid.producer)
                # reading goes on back while nothing of the producer was met before: its
                # documents are unread (none pending), or this is a copy (a clock before what was read)
                self.blind = (
                    self.blind
                    or not self.sequencer.has_pending(doc.uuid.producer)
                    or (unread_ack and self.unread.holds(doc))
                )
            for committed in self.sequencer.feed(doc):
                # a document belongs to the hour of the record that committed it
                if hour in self.wanted_hours:
                    row = document_row(committed, self.key, hour)
                    self._count_key_kinds(committed)
                    self.empty_text.update(row.empty_text)
                    keep_first_spellings(self.spellings, row.spellings)
                    self._emit("doc", hour, committed.uri, committed.offset, row.json)
                elif (
                    self.hour_of[committed.uri] in self.wanted_hours
                    and (hour, committed.uri) not in self.elsewhere
                ):
                    self.elsewhere.add((hour, committed.uri))
                    self._emit("committed_elsewhere", hour, committed.uri)

    def _count_key_kinds(self, doc: ff.Doc) -> None:
        """Count the kind of each key of an emitted document: the driver learns from the sums
        whether the batch's documents agree (`flow_journal._PassNotes.mixed_key_kinds`)."""
        for pointer in self.key:
            counted = self.key_kinds.setdefault(pointer, {})
            kind = key_kind(resolve(doc.doc, pointer))
            counted[kind] = counted.get(kind, 0) + 1

    def _finish(self) -> None:
        left = self.sequencer.finish()
        self._emit("counts", None, body=json.dumps(self.sequencer.counts))
        self._emit("key_kinds", None, body=json.dumps(self.key_kinds))
        if self.empty_text:
            self._emit("empty_text", None, body=json.dumps(sorted(self.empty_text)))
        self._emit("spellings", None, body=json.dumps(self.spellings))
        # Documents of the run's hours whose transaction is still open: its end, if landed,
        # lies in a later hour, which the driver reads too (to learn which hour commits them).
        if any(self.hour_of[d.uri] in self.wanted_hours for d in left):
            self._emit("pending_after", None)
        if self._may_have_begun_earlier():
            self._emit("opened_earlier", None)

    def _may_have_begun_earlier(self) -> bool:
        """A producer with no commit point before its ACK may have begun its transaction before
        what was read. The driver reads earlier hours: once whenever no more than the context
        hour was read before the run's hours (the producer may have been silent there in
        mid-transaction), and again for as long as it wrote from the first hour read on, or had
        nothing pending (a producer writes an ACK only to journals it wrote to in the transaction)."""
        if not self.opened:
            return False
        earliest = min(r["hour"] for r in self.rows)
        return (
            self.blind
            or earliest >= self.context_hour
            or any(self.first_hour[p] == earliest for p in self.opened)
        )
