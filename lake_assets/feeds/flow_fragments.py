"""Estuary Flow (Gazette) journal fragments: names, covers, codecs, checksums and transactions.

Pure Python: no Spark, no Dagster. Facts (docs/formats/flow-journals.md):

- A fragment file is named `%016x-%016x-%x%s`: begin and end byte offsets of the journal
  (half-open `[begin, end)`), SHA-1 of the *uncompressed* content and a codec extension. An empty
  fragment (begin == end) has an all-zero sum.
- Fragments of one journal may overlap; a reader picks a cover (lowest offset first, then always
  the covering fragment reaching furthest) and skips the bytes it has already read. A gap in the
  offsets is a real gap: it is reported, never papered over.
- A fragment that cannot be used (corrupt, wrong checksum, a bad document) is set aside and the
  journal is covered again without it, so other fragments holding the same bytes take over; bytes
  that only failed fragments hold are gaps too (a name is a claim, and a claim is not data).
- Content is inflated only up to the length its name declares (`MAX_FRAGMENT_BYTES` at most), so
  a compression bomb is refused, never inflated.
- Content is newline-delimited JSON; fragments hold whole documents.
- Text that is not valid UTF-8 (raw bytes, or a JSON escape of half a surrogate pair) does not
  make a document unreadable: it is read as lone surrogates (`Doc.garbled`), which
  `valid_text_fields` turns into U+FFFD, as the Parquet reader does with such text.
- `_meta.uuid` is a v1 UUID carrying the producer's clock, the transaction flags and the producer
  id. Continued transactions count only once acknowledged; see `Sequencer`.

On the clock: Flow's producer clock is 64 bits, the UUID's 60-bit timestamp followed by a 4-bit
sequence counter, and the counter is stored in the UUID's clock-sequence bits (bits 2-5 of byte 8,
next to the variant), not in the timestamp field (docs/formats/flow-journals.md, "Reading a
journal", step 4). So `FlowUuid.clock` is the UUID's 60-bit timestamp, which is a plain
100 ns time, `FlowUuid.sequence` the 4 counter bits, and `FlowUuid.order` the full 64-bit clock
that transactions are sequenced by.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import math
import re
import reprlib
import uuid as uuidlib
import zlib
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import cramjam

from lake_assets.errors import InvalidValue

__all__ = [
    "ACK_TXN",
    "CODECS",
    "CONTINUE_TXN",
    "MAX_FRAGMENT_BYTES",
    "OUTSIDE_TXN",
    "ZERO_SUM",
    "CoverPiece",
    "Doc",
    "FlowUuid",
    "Fragment",
    "FragmentError",
    "FragmentName",
    "Gap",
    "Sequencer",
    "cover",
    "fragment_from_uri",
    "holds_invalid_text",
    "inflate",
    "lines",
    "parse_document",
    "parse_fragment_name",
    "parse_uuid",
    "read_piece",
    "valid_text_fields",
    "verify",
]


class FragmentError(InvalidValue):
    """A fragment that cannot be used: message names the fragment (uri) and, where known, the journal
    byte offset."""

    def __init__(self, uri: str, reason: str, offset: int | None = None):
        self.uri = uri
        self.reason = reason
        self.offset = offset
        where = f" at journal offset {offset}" if offset is not None else ""
        super().__init__(f"fragment {uri}{where}: {reason}")

    def __reduce__(self):  # keep the three fields through pickling (e.g. across processes)
        return (type(self), (self.uri, self.reason, self.offset))


# --------------------------------------------------------------------------------------------
# Fragment names

ZERO_SUM = "0" * 40
#: largest journal offset: Gazette offsets are int64
MAX_OFFSET = 0x7FFF_FFFF_FFFF_FFFF

CODECS = ("raw", "gzip", "zstd", "snappy", "gzip_offload")
_EXTENSIONS = {
    ".raw": "raw",
    ".gz": "gzip",
    ".gzip": "gzip",
    ".zst": "zstd",
    ".zstandard": "zstd",
    ".sz": "snappy",
    ".snappy": "snappy",
    "": "gzip_offload",
    ".gzod": "gzip_offload",
}
_OFFSET = re.compile(r"[0-9a-fA-F]{16}")
_SUM = re.compile(r"[0-9a-fA-F]{40}")


@dataclass(frozen=True)
class FragmentName:
    begin: int
    end: int
    sum: str  # 40 lowercase hex: SHA-1 of the uncompressed content
    codec: str  # one of CODECS

    @property
    def length(self) -> int:
        return self.end - self.begin


def parse_fragment_name(name: str) -> FragmentName:
    """Parse `<begin:016x>-<end:016x>-<sha1:40x><ext>`; a leading folder path is ignored."""
    base = name.rsplit("/", 1)[-1]
    fields = base.split("-")
    if len(fields) != 3:
        raise InvalidValue(
            f"fragment name {name!r}: expected 3 '-'-separated fields (begin-end-sum), got {len(fields)}"
        )
    begin_text, end_text, rest = fields
    sum_text, dot, ext = rest.partition(".")
    ext = (dot + ext).lower()
    for label, text in (("begin", begin_text), ("end", end_text)):
        if not _OFFSET.fullmatch(text):
            raise InvalidValue(f"fragment name {name!r}: {label} offset {text!r} is not 16 hex digits")
    begin, end = int(begin_text, 16), int(end_text, 16)
    for label, value in (("begin", begin), ("end", end)):
        if value > MAX_OFFSET:
            raise InvalidValue(f"fragment name {name!r}: {label} offset {value:#x} exceeds int64")
    if end < begin:
        raise InvalidValue(f"fragment name {name!r}: end {end:#x} is before begin {begin:#x}")
    if not _SUM.fullmatch(sum_text):
        raise InvalidValue(
            f"fragment name {name!r}: sum {sum_text!r} is not a 40-hex-digit SHA-1 "
            f"(got {len(sum_text)} chars)"
        )
    digest = sum_text.lower()
    if begin == end and digest != ZERO_SUM:
        raise InvalidValue(f"fragment name {name!r}: an empty fragment must have an all-zero sum")
    try:
        codec = _EXTENSIONS[ext]
    except KeyError:
        known = sorted(e for e in _EXTENSIONS if e)
        raise InvalidValue(
            f"fragment name {name!r}: unknown extension {ext!r}; known: {known} or none"
        ) from None
    return FragmentName(begin=begin, end=end, sum=digest, codec=codec)


@dataclass(frozen=True)
class Fragment:
    uri: str
    journal: str
    name: FragmentName


_PSEUDO_PARTITION = re.compile(r"utc_(date|hour)=[^/]*")


def fragment_from_uri(uri: str, journal: str | None = None) -> Fragment:
    """A fragment from its storage uri. Without `journal`, the journal is the uri's folder with the
    supplemental `utc_date=`/`utc_hour=` pseudo-partitions removed (the journal's storage prefix)."""
    name = parse_fragment_name(uri)
    if journal is None:
        folder = uri.rsplit("/", 1)[0] if "/" in uri else ""
        parts = folder.split("/")
        while parts and _PSEUDO_PARTITION.fullmatch(parts[-1]):
            parts.pop()
        journal = "/".join(parts)
    return Fragment(uri=uri, journal=journal, name=name)


# --------------------------------------------------------------------------------------------
# Covers


@dataclass(frozen=True)
class CoverPiece:
    fragment: Fragment
    skip: int  # bytes of the fragment's inflated content to skip (offset - begin)
    #: journal offset where the piece stops, before its fragment's end: where a fragment that
    #: landed first takes over (None: the fragment's end)
    stop: int | None = None
    #: that fragment's uri (the one blamed should `stop` fall inside a document of this one)
    taken_over_by: str | None = None

    @property
    def start(self) -> int:
        """Journal offset where this piece's used content starts."""
        return self.fragment.name.begin + self.skip

    @property
    def end(self) -> int:
        return self.fragment.name.end if self.stop is None else self.stop


@dataclass(frozen=True)
class Gap:
    """Journal bytes `[begin, end)` that no usable fragment holds: in no fragment at all, or only in
    the `failed` fragments (uris), which were set aside."""

    journal: str
    begin: int
    end: int
    failed: tuple[str, ...] = ()

    @property
    def description(self) -> str:
        where = f"{self.journal}: bytes {self.begin}..{self.end}"
        if not self.failed:
            return f"{where} are in no fragment"
        names = ", ".join(uri.rsplit("/", 1)[-1] for uri in self.failed)
        return f"{where} are only in fragment(s) that cannot be used (quarantined): {names}"


def cover(
    fragments: list[Fragment],
    failed: Collection[str] = (),
    landed_first: Callable[[Fragment], str] = lambda fragment: "",
) -> tuple[list[CoverPiece], list[Gap]]:
    """The pieces that read every byte of one journal exactly once, and the gaps between them.

    From the lowest begin, repeatedly take, of the fragments holding the current offset, the one
    that landed first (`landed_first`: its hour), then the one reaching furthest (ties: smallest
    uri), skip what was already read, and continue from its end. A document belongs to the hour
    of the fragment it is read from: taking the first landing's copy of the bytes keeps it in its
    own hour when a later fragment (a compaction, a re-upload) holds the same bytes again, whether
    or not the run reads that later hour too. Fragments whose uri is in `failed` are not used:
    the others holding their bytes take over. Bytes that no usable fragment holds, between
    fragments or claimed only by failed ones, are `Gap`s. Empty fragments are ignored; identical
    ranges give one piece. (Whether a fragment left out holds the bytes read in its stead is
    `hold_against`'s to say.)"""
    journals = {f.journal for f in fragments}
    if len(journals) > 1:
        raise InvalidValue(f"cover takes the fragments of one journal; got {sorted(journals)}")
    held = [f for f in fragments if f.name.end > f.name.begin]
    usable = sorted((f for f in held if f.uri not in failed), key=lambda f: (f.name.begin, f.name.end, f.uri))
    pieces = _greedy_cover(usable, landed_first)
    return pieces, _gaps(pieces, held, failed)


def _greedy_cover(usable: list[Fragment], landed_first: Callable[[Fragment], str]) -> list[CoverPiece]:
    """`cover`'s pieces over fragments sorted by (begin, end, uri)."""
    pieces: list[CoverPiece] = []
    holding: list[
        Fragment
    ] = []  # fragments beginning at or before the offset (those ending after it hold it)
    offset = usable[0].name.begin if usable else 0
    i = 0
    while True:
        while i < len(usable) and usable[i].name.begin <= offset:
            holding.append(usable[i])
            i += 1
        holding = [f for f in holding if f.name.end > offset]
        if holding:
            best = min(holding, key=lambda f: (landed_first(f), -f.name.end, f.uri))
            # a fragment that landed before this one, beginning inside it, takes over there
            # (`usable` is sorted by begin: the first such is where)
            taker = _taking_over(usable, i, best, landed_first)
            stop = None if taker is None else taker.name.begin
            pieces.append(
                CoverPiece(
                    fragment=best,
                    skip=offset - best.name.begin,
                    stop=stop,
                    taken_over_by=None if taker is None else taker.uri,
                )
            )
            offset = best.name.end if stop is None else stop
        elif i < len(usable):
            offset = usable[i].name.begin  # nothing holds the bytes up to there: a gap
        else:
            return pieces


def _taking_over(
    usable: list[Fragment], start: int, best: Fragment, landed_first: Callable[[Fragment], str]
) -> Fragment | None:
    """The first fragment of `usable[start:]` (sorted by begin) beginning inside `best` that
    landed before it, or None."""
    for index in range(start, len(usable)):
        fragment = usable[index]
        if fragment.name.begin >= best.name.end:
            return None
        if landed_first(fragment) < landed_first(best):
            return fragment
    return None


def _gaps(pieces: list[CoverPiece], held: list[Fragment], failed: Collection[str]) -> list[Gap]:
    """Every stretch from the first to the last byte any fragment claims that `pieces` do not read,
    labelled with the failed fragments claiming it; adjacent stretches with one label are one gap."""
    if not held:
        return []
    journal = held[0].journal
    lost = [f for f in held if f.uri in failed]
    cuts = sorted(
        {f.name.begin for f in held}
        | {f.name.end for f in held}
        | {p.start for p in pieces}
        | {p.end for p in pieces}
    )
    gaps: list[Gap] = []
    read = iter(pieces)
    piece = next(read, None)
    for begin, end in itertools.pairwise(cuts):
        while piece is not None and piece.end <= begin:
            piece = next(read, None)
        if piece is not None and piece.start <= begin:
            continue  # the cut points include every piece's ends: a stretch is read whole or not at all
        claimed = tuple(sorted(f.uri for f in lost if f.name.begin <= begin and end <= f.name.end))
        if gaps and gaps[-1].end == begin and gaps[-1].failed == claimed:
            gaps[-1] = Gap(journal, gaps[-1].begin, end, claimed)
        else:
            gaps.append(Gap(journal, begin, end, claimed))
    return gaps


# --------------------------------------------------------------------------------------------
# Content: codecs, checksums, lines

_GZIP_MAGIC = b"\x1f\x8b"
#: The most bytes a fragment's content may hold: a fragment whose name declares more is refused
#: unread. Inflating stops one byte past the declared length, so a compression bomb (a small file
#: inflating to gigabytes) costs no more memory than its name's claim, and never more than this.
#: Far above the lengths journals are configured to roll fragments at; a caller may pass another.
MAX_FRAGMENT_BYTES = 1 << 30
#: the error cramjam reports when the output buffer cannot take the rest of the content
_BUFFER_FULL = "failed to write whole buffer"


def _over(uri: str, limit: int, begin: int | None) -> FragmentError:
    return FragmentError(uri, f"content inflates to more than {limit} bytes (inflating stopped there)", begin)


#: Inflated fragment content: zstd and snappy inflate into a preallocated bytearray.
Content = bytes | bytearray


def _gunzip(data: bytes, uri: str, codec: str, begin: int | None, limit: int) -> bytes:
    """Every member of a gzip stream (trailing zero padding allowed, as `gzip` allows), inflating at
    most `limit` + 1 bytes."""
    members: list[bytes] = []
    size = 0
    rest = data
    try:
        while rest:
            member = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            members.append(member.decompress(rest, limit + 1 - size))
            size += len(members[-1])
            if size > limit:
                raise _over(uri, limit, begin)
            if not member.eof:
                raise EOFError("compressed data ended before the end-of-stream marker was reached")
            rest = member.unused_data.lstrip(b"\0")
    except (EOFError, zlib.error) as e:
        raise FragmentError(uri, f"cannot inflate content ({codec}: {e})", begin) from e
    return members[0] if len(members) == 1 else b"".join(members)  # one member: no copy


def _unpack_framed(data: bytes, uri: str, codec: str, begin: int | None, limit: int) -> bytearray:
    """zstd or framed snappy into a buffer of `limit` + 1 bytes: cramjam refuses to write past it."""
    if not data:
        return bytearray()
    module = cramjam.zstd if codec == "zstd" else cramjam.snappy  # snappy: the framing format
    out = bytearray(limit + 1)
    try:
        size = module.decompress_into(data, out)
    except Exception as e:  # cramjam.DecompressionError, and anything else the codec reports
        if _BUFFER_FULL in str(e):
            raise _over(uri, limit, begin) from e
        raise FragmentError(uri, f"cannot inflate content ({codec}: {e})", begin) from e
    if size > limit:
        raise _over(uri, limit, begin)
    del out[size:]
    return out


def inflate(data: bytes, codec: str, uri: str, *, limit: int, begin: int | None = None) -> Content:
    """The uncompressed content of a fragment's stored bytes, refused (FragmentError) when it would
    exceed `limit` bytes (zstd and snappy inflate into a buffer of that size: give the length
    expected, not a generous bound). `begin` (optional, the fragment's begin offset) is only used to
    place errors in the journal."""
    if codec == "raw":
        return bytes(data)
    if codec == "gzip":
        return _gunzip(data, uri, codec, begin, limit)
    if codec == "gzip_offload":
        # Stored with Content-Encoding: gzip; an HTTP client may already have inflated it.
        return _gunzip(data, uri, codec, begin, limit) if data[:2] == _GZIP_MAGIC else bytes(data)
    if codec in ("zstd", "snappy"):
        return _unpack_framed(data, uri, codec, begin, limit)
    raise FragmentError(uri, f"unknown codec {codec!r}; known: {list(CODECS)}", begin)


def verify(content: Content, name: FragmentName, uri: str) -> None:
    """Check the inflated content against the fragment's name: length end - begin and SHA-1 sum."""
    if len(content) != name.length:
        raise FragmentError(
            uri,
            f"content length mismatch: expected {name.length} bytes (end - begin), actual {len(content)}",
            name.begin,
        )
    actual = ZERO_SUM if name.length == 0 else hashlib.sha1(content).hexdigest()
    if actual != name.sum:
        raise FragmentError(uri, f"SHA-1 mismatch: expected {name.sum}, actual {actual}", name.begin)


def lines(content: Content, skip: int, begin: int, uri: str) -> Iterator[tuple[int, Content]]:
    """The newline-delimited documents of content[skip:], as (journal offset, line without newline).

    `skip` must fall on a document boundary; the content must end with a newline. Both are checked
    before anything is yielded. Blank (whitespace-only) lines are skipped."""
    size = len(content)
    if skip < 0 or skip > size:
        raise FragmentError(uri, f"skip {skip} is outside the content ({size} bytes)", begin + max(skip, 0))
    if skip > 0 and content[skip - 1 : skip] != b"\n":
        raise FragmentError(uri, f"skip {skip} does not fall on a document boundary", begin + skip)
    if size > skip and content[-1:] != b"\n":
        last = max(content.rfind(b"\n", skip) + 1, skip)  # start of the unterminated line
        raise FragmentError(uri, "content does not end with a newline", begin + last)
    return _lines(content, skip, begin)


def _lines(content: Content, pos: int, begin: int) -> Iterator[tuple[int, Content]]:
    size = len(content)
    while pos < size:
        newline = content.index(b"\n", pos)
        line = content[pos:newline]
        if line.strip():
            yield begin + pos, line
        pos = newline + 1


# --------------------------------------------------------------------------------------------
# UUIDs and transactions

OUTSIDE_TXN, CONTINUE_TXN, ACK_TXN = 0x0, 0x1, 0x2
_GREGORIAN_EPOCH = dt.datetime(1582, 10, 15, tzinfo=dt.UTC)


@dataclass(frozen=True)
class FlowUuid:
    clock: int  # the UUID's 60-bit timestamp: 100 ns intervals since 1582-10-15 00:00:00 UTC
    flags: int  # uint16_be(bytes[8:10]) & 0x3ff
    producer: str  # bytes[10:16] as 12 lowercase hex
    sequence: int = 0  # Flow's 4-bit clock counter: (bytes[8] >> 2) & 0xf

    @property
    def order(self) -> int:
        """Flow's 64-bit producer clock (timestamp << 4 | counter): the total order of a producer's
        documents, used for acknowledgements and duplicates."""
        return (self.clock << 4) | self.sequence

    @property
    def timestamp(self) -> dt.datetime:
        """UTC time of the clock, microsecond precision (truncated)."""
        return _clock_time(self.clock)

    @property
    def is_ack(self) -> bool:
        return bool(self.flags & ACK_TXN)


def _clock_time(clock: int) -> dt.datetime:
    return _GREGORIAN_EPOCH + dt.timedelta(microseconds=clock // 10)


#: the first UUID time whose producer clock (`FlowUuid.order`) no longer fits a signed 64-bit
#: sequence (`_seq`), in the year 3409
_FIRST_UNORDERED_CLOCK = 2**59


def parse_uuid(text: str) -> FlowUuid:
    """Decode a Flow `_meta.uuid`; ValueError unless it is an RFC 4122 version-1 UUID whose time
    the lake's 64-bit sequence can order."""
    if not isinstance(text, str):
        raise InvalidValue(f"uuid must be a string, got {type(text).__name__}")
    try:
        u = uuidlib.UUID(text)
    except ValueError:
        raise InvalidValue(f"invalid uuid {text!r}") from None
    if u.variant != uuidlib.RFC_4122 or u.version != 1:
        raise InvalidValue(f"uuid {text!r} is not a version-1 UUID")
    if u.time >= _FIRST_UNORDERED_CLOCK:
        raise InvalidValue(
            f"uuid {text!r} is dated on or after {_clock_time(_FIRST_UNORDERED_CLOCK):%Y-%m-%d}, past what the "
            "lake's 64-bit sequence orders"
        )
    raw = u.bytes
    return FlowUuid(
        clock=u.time,
        flags=int.from_bytes(raw[8:10], "big") & 0x3FF,
        producer=raw[10:16].hex(),
        sequence=(raw[8] >> 2) & 0xF,
    )


@dataclass
class Doc:
    offset: int
    uri: str
    uuid: FlowUuid
    doc: dict
    #: some of its text was not valid UTF-8 (held as lone surrogates until `valid_text_fields`)
    garbled: bool = False

    @property
    def is_ack(self) -> bool:
        meta = self.doc.get("_meta")
        return self.uuid.is_ack or (isinstance(meta, dict) and meta.get("ack") is True)


#: a character standing for text that was not UTF-8: a byte decoded with "surrogateescape", or a
#: JSON escape of half a surrogate pair (a whole pair decodes to one character)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _json_value(line: Content):
    """(the JSON value of a line, whether some of its text was not valid UTF-8)."""
    try:
        text, garbled = line.decode("utf-8-sig"), False
    except UnicodeDecodeError:
        text, garbled = line.decode("utf-8-sig", "surrogateescape"), True
    value = json.loads(
        text, parse_constant=_refuse_constant, parse_float=_float_or_text, object_pairs_hook=_names_once
    )
    if not garbled and b"\\u" in line and _ESCAPED_SURROGATE.search(line):
        garbled = holds_invalid_text(value)
    return value, garbled


class RepeatedName(InvalidValue):
    """An object of a document gives one name twice: JSON parsers keep one of the values (Python's
    and Spark's the last), so the other would be dropped without a word."""


def _names_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # It doubles json.loads's time for a document of small objects (docs/profiling.md, "Figures
    # behind the code"): the price of never dropping a value without a word.
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise RepeatedName(
                    f"an object gives the name {reprlib.repr(name)} twice: which value is meant is not said"
                )
            seen.add(name)
    return value


class NumberText(str):
    """A JSON number no double holds, kept as the text it was written in: past a double's range
    it would read as infinity, and too small for one as zero, each without a word. A payload
    value like this makes its column text (docs/formats/flow-journals.md); a key, a refusal."""


def _float_or_text(literal: str) -> float | NumberText:
    value = float(literal)
    if math.isinf(value) or (value == 0 and _NONZERO_DIGIT.search(literal.lower().partition("e")[0])):
        return NumberText(literal)
    return value


_NONZERO_DIGIT = re.compile("[1-9]")


def holds_invalid_text(value) -> bool:
    """Whether a JSON value (of a `Doc.garbled` document) holds text that was not UTF-8."""
    if isinstance(value, str):
        return _LONE_SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(holds_invalid_text(k) or holds_invalid_text(v) for k, v in value.items())
    if isinstance(value, list):
        return any(holds_invalid_text(v) for v in value)
    return False


def _valid_text(value):
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_valid_text(k): _valid_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_text(v) for v in value]
    return value


def as_written(text: str) -> str:
    """Text of a `Doc.garbled` document as a reason shows it, one character at a time: a byte
    that was not UTF-8 as `\\xff`, an escaped lone surrogate as `\\ud800` (an escaped one in
    U+DC80..U+DCFF shows as the byte it stands for), anything else unprintable as `repr` does."""
    shown = []
    for character in text:
        code = ord(character)
        if 0xDC80 <= code <= 0xDCFF:  # how a byte that is not UTF-8 was decoded (`surrogateescape`)
            shown.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            shown.append(f"\\u{code:04x}")
        else:
            shown.append(character if character.isprintable() else repr(character)[1:-1])
    return "".join(shown)


def names_one_once_repaired(value) -> tuple[str, str] | None:
    """Two names of one object (at any depth) of a `Doc.garbled` value that are one name once
    their text is made valid (`_valid_text`), if any: the repaired object would keep one of
    their values and drop the other without a word."""
    if isinstance(value, list):
        return next(filter(None, map(names_one_once_repaired, value)), None)
    if not isinstance(value, dict):
        return None
    first_of: dict[str, str] = {}
    for name in value:
        repaired = _valid_text(name)
        if repaired in first_of:
            return first_of[repaired], name
        first_of[repaired] = name
    return next(filter(None, map(names_one_once_repaired, value.values())), None)


def valid_text_fields(document: dict) -> tuple[dict, int]:
    """A `Doc.garbled` document with its text made valid UTF-8 (what was not becomes U+FFFD),
    and how many of its fields other than `_meta` had text to repair."""
    repaired = [
        name
        for name, value in document.items()
        if name != "_meta" and (holds_invalid_text(name) or holds_invalid_text(value))
    ]
    return _valid_text(document), len(repaired)


def parse_document(line: Content, offset: int, uri: str) -> Doc:
    """One JSON document line; FragmentError (with the line's offset) when it is not usable."""
    try:
        value, garbled = _json_value(line)
    except RepeatedName as e:
        raise FragmentError(uri, f"document is not one record: {e}", offset) from None
    except ValueError as e:  # JSONDecodeError is a ValueError
        raise FragmentError(uri, f"line is not JSON ({e})", offset) from None
    except RecursionError:  # valid JSON, but nested deeper than Python's parser goes
        raise FragmentError(uri, "line is JSON nested too deeply to read", offset) from None
    if not isinstance(value, dict):
        raise FragmentError(uri, f"line is JSON {type(value).__name__}, not an object", offset)
    meta = value.get("_meta")
    if not isinstance(meta, dict) or "uuid" not in meta:
        raise FragmentError(uri, "document has no _meta.uuid", offset)
    try:
        flow_uuid = parse_uuid(meta["uuid"])
    except ValueError as e:
        raise FragmentError(uri, f"document has an invalid _meta.uuid ({e})", offset) from None
    return Doc(offset=offset, uri=uri, uuid=flow_uuid, doc=value, garbled=garbled)


def _refuse_constant(name: str):
    raise InvalidValue(f"{name} is not valid JSON")


@dataclass
class _Producer:
    pending: list[Doc] = field(default_factory=list)
    acked: int = -1  # last acknowledged (64-bit) clock; -1 before any


@dataclass(frozen=True)
class ClockWindow:
    """Clock times from `start` up to (not including) `end`, UTC."""

    start: dt.datetime
    end: dt.datetime

    def holds(self, doc: Doc) -> bool:
        return self.start <= doc.uuid.timestamp < self.end


class Sequencer:
    """Transaction rules of one journal, fed documents in journal order (docs/formats/flow-journals.md,
    "Reading a journal"):

    - ACK documents (`_meta.ack` true, or flags & 0x2) are not data: never emitted;
    - a document outside a transaction (flags 0x0) is committed at once (it acknowledges itself),
      and rolls back what its producer left pending before it;
    - a document continuing a transaction (0x1) stays pending until a later ACK from the same
      producer has a clock at or above its own: then it is committed (emitted, in journal order);
    - pending documents followed by an ACK of the same producer with a lower clock were rolled back:
      they are dropped;
    - a document whose clock is at or below the producer's last acknowledged clock is a re-read
      duplicate: dropped.

    Clocks compare as Flow's 64-bit clock (`FlowUuid.order`)."""

    def __init__(self) -> None:
        self._producers: dict[str, _Producer] = {}
        self.counts: dict[str, int] = {
            "documents": 0,
            "acks": 0,
            "outside": 0,
            "committed": 0,
            "rolled_back": 0,
            "duplicates": 0,
            "pending": 0,
            "cut_by_gap": 0,
        }

    def feed(self, doc: Doc) -> list[Doc]:
        """The committed documents released by `doc` (possibly empty), in journal order."""
        self.counts["documents"] += 1
        producer = self._producers.setdefault(doc.uuid.producer, _Producer())
        clock = doc.uuid.order
        if doc.is_ack:
            self.counts["acks"] += 1
            released = [d for d in producer.pending if d.uuid.order <= clock]
            self.counts["rolled_back"] += len(producer.pending) - len(released)
            self.counts["committed"] += len(released)
            producer.pending = []
            producer.acked = max(producer.acked, clock)
            return released
        if clock <= producer.acked:
            self.counts["duplicates"] += 1
            return []
        if doc.uuid.flags & CONTINUE_TXN:
            producer.pending.append(doc)
            return []
        # A document outside a transaction ends the producer's open one: what it left pending
        # was rolled back, as Gazette's sequencer treats it, and no later ACK commits it.
        self.counts["outside"] += 1
        self.counts["committed"] += 1
        self.counts["rolled_back"] += len(producer.pending)
        producer.pending = []
        producer.acked = clock
        return [doc]

    def may_commit_unread(self, doc: Doc) -> bool:
        """Whether `doc` is an ACK that may commit documents written before the first record fed:
        its producer has no commit point (an ACK, or a document outside a transaction) among the
        records fed so far, so its transaction may have begun before them."""
        producer = self._producers.get(doc.uuid.producer)
        return doc.is_ack and (producer is None or producer.acked < 0)

    def may_repeat_unread(self, doc: Doc, unread: ClockWindow) -> bool:
        """Whether `doc` may be a re-read duplicate of a document before the first record fed:
        it is outside a transaction, its producer has no commit point among the records fed so
        far, and its clock lies in `unread` (before what was read). A retried append sends
        documents again with their first clocks; a producer's new documents carry the time they
        were written, inside what was read."""
        producer = self._producers.get(doc.uuid.producer)
        return (
            not doc.is_ack
            and not doc.uuid.flags & CONTINUE_TXN
            and (producer is None or producer.acked < 0)
            and unread.holds(doc)
        )

    def cut_at_gap(self) -> None:
        """Bytes are missing here: an ACK among them may have committed or rolled back what is
        pending (a document outside a transaction, rolled it back), so nothing pending is
        committed by what follows. Those documents are left to
        a run that reads the missing bytes."""
        for producer in self._producers.values():
            self.counts["cut_by_gap"] += len(producer.pending)
            producer.pending = []

    def has_pending(self, producer: str) -> bool:
        """Whether `producer` has documents waiting for an ACK among those fed."""
        return producer in self._producers and bool(self._producers[producer].pending)

    def finish(self) -> list[Doc]:
        """Documents still pending (never acknowledged: not data), in journal order; clears them."""
        left = sorted((d for p in self._producers.values() for d in p.pending), key=lambda d: d.offset)
        for producer in self._producers.values():
            producer.pending = []
        self.counts["pending"] += len(left)
        return left


# --------------------------------------------------------------------------------------------
# Reading a journal


def verified_content(
    fragment: Fragment, fetch: Callable[[str], bytes], max_bytes: int = MAX_FRAGMENT_BYTES
) -> Content:
    """A fragment's content, inflated (at most its declared length, which may not exceed
    `max_bytes`) and verified against its name (FragmentError if not)."""
    name = fragment.name
    if name.length > max_bytes:
        raise FragmentError(
            fragment.uri,
            f"its name declares {name.length} bytes, more than the limit of {max_bytes}",
            name.begin,
        )
    content = inflate(fetch(fragment.uri), name.codec, fragment.uri, begin=name.begin, limit=name.length)
    verify(content, name, fragment.uri)
    return content


def hold_against(
    fragment: Fragment,
    content: Content,
    pieces: list[CoverPiece],
    content_of: Callable[[Fragment], Content],
    begin: int | None = None,
    end: int | None = None,
) -> None:
    """Check that the verified `content` of a fragment, at its journal offsets [begin, end) (by
    default all of it), is what `pieces` of a cover read for them; FragmentError naming the
    first offset where they differ, or where no piece read the bytes. Pieces of the fragment
    itself read its own bytes there (a fragment read again after one that landed before it and
    lies inside it), and match."""
    name = fragment.name
    offset = name.begin if begin is None else begin
    until = name.end if end is None else end
    for piece in pieces:
        low, high = max(offset, piece.start), min(until, piece.end)
        if high <= low:
            continue
        if low > offset:
            break
        base = piece.fragment.name.begin
        theirs = content_of(piece.fragment)[low - base : high - base]
        if content[low - name.begin : high - name.begin] != theirs:
            raise FragmentError(
                fragment.uri,
                f"holds other bytes at journal offsets {low}..{high} than "
                f"{piece.fragment.uri.rsplit('/', 1)[-1]}, which was read for them",
                low,
            )
        offset = high
    if offset < until:
        raise FragmentError(
            fragment.uri,
            f"its journal offsets {offset}..{until} are read from no fragment of the cover",
            offset,
        )


def read_piece(
    piece: CoverPiece, fetch: Callable[[str], bytes], max_bytes: int = MAX_FRAGMENT_BYTES
) -> list[Doc]:
    """The documents of one cover piece: its fragment's verified content (`verified_content`),
    split and parsed (FragmentError if not)."""
    fragment = piece.fragment
    name = fragment.name
    content = verified_content(fragment, fetch, max_bytes)
    if piece.stop is not None and piece.stop < name.end:
        cut = piece.stop - name.begin
        if content[cut - 1 : cut] != b"\n":
            # this fragment's bytes are checked (its SHA-1); the other's begin is only its name's claim
            raise FragmentError(
                piece.taken_over_by or fragment.uri,
                f"its name says it begins at journal offset {piece.stop}, inside a document of "
                f"{fragment.uri.rsplit('/', 1)[-1]}, which holds those bytes",
                piece.stop,
            )
        content = content[:cut]
    return [
        parse_document(line, offset, fragment.uri)
        for offset, line in lines(content, piece.skip, name.begin, fragment.uri)
    ]
