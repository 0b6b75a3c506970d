"""Estuary Flow journal fragments: pure logic, no Spark (lake_assets.feeds.flow_fragments)."""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import itertools
import json
import pickle
import random
import tracemalloc
import uuid as uuidlib
import zlib

import cramjam
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lake_assets.feeds import flow_fragments as ff
from lake_assets.feeds.flow_fragments import (
    ACK_TXN,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    CoverPiece,
    Doc,
    Fragment,
    FragmentError,
    FragmentName,
    Gap,
    Sequencer,
    cover,
    inflate,
    lines,
    parse_fragment_name,
    parse_uuid,
    verify,
)
from lake_assets.feeds.flow_journal import FlowJournalFormat
from lake_assets_tests.flow_reference import read_journal

SUM = "0102030405060708090a0b0c0d0e0f1011121314"
GREGORIAN_TO_UNIX = 0x01B21DD213814000  # 100 ns ticks from 1582-10-15 to 1970-01-01


# ---------------------------------------------------------------------------------------------
# helpers


def flow_uuid(producer: str, clock: int, flags: int) -> str:
    """A Flow UUID from a 64-bit producer clock (timestamp << 4 | counter), flags and producer."""
    t, seq = clock >> 4, clock & 0xF
    raw = (
        (t & 0xFFFFFFFF).to_bytes(4, "big")
        + ((t >> 32) & 0xFFFF).to_bytes(2, "big")
        + (0x1000 | ((t >> 48) & 0x0FFF)).to_bytes(2, "big")
        + (0x8000 | (seq << 10) | flags).to_bytes(2, "big")
        + bytes.fromhex(producer)
    )
    return str(uuidlib.UUID(bytes=raw))


def line(producer: str, clock: int, flags: int, ack: bool = False, **fields) -> bytes:
    meta: dict[str, object] = {"uuid": flow_uuid(producer, clock, flags)}
    if ack:
        meta["ack"] = True
    return json.dumps({**fields, "_meta": meta}).encode() + b"\n"


def name_of(begin: int, end: int, content: bytes | None = None, ext: str = ".raw") -> str:
    digest = ff.ZERO_SUM if begin == end else SUM if content is None else hashlib.sha1(content).hexdigest()
    return f"{begin:016x}-{end:016x}-{digest}{ext}"


def frag(begin: int, end: int, uri: str | None = None, journal: str = "j") -> Fragment:
    name = name_of(begin, end)
    return Fragment(uri=uri or f"s3://b/{journal}/{name}", journal=journal, name=parse_fragment_name(name))


def doc(offset: int, producer: str, clock: int, flags: int, ack: bool = False, **fields) -> Doc:
    uuid = flow_uuid(producer, clock, flags)
    meta: dict[str, object] = {"uuid": uuid}
    if ack:
        meta["ack"] = True
    return Doc(offset=offset, uri="u", uuid=parse_uuid(uuid), doc={**fields, "_meta": meta})


P, Q = "aaaaaaaaaaaa", "bbbbbbbbbbbb"


# ---------------------------------------------------------------------------------------------
# fragment names


def test_gazette_test_vector_parses():
    vector = "00000000499602d2-7fffffffffffffff-0102030405060708090a0b0c0d0e0f1011121314.gz"
    name = parse_fragment_name(vector)
    assert name == FragmentName(begin=0x499602D2, end=0x7FFFFFFFFFFFFFFF, sum=SUM, codec="gzip")
    assert name.begin == 1234567890


def test_name_with_folder_path_and_uppercase_hex():
    uri = "s3://bkt/acmeCo/orders/category=Anvils/pivot=00/utc_date=2022-01-07/utc_hour=19/" + (
        "0000000000000000-00000000201A3F27-1EC69E2DE187B7720FB864A8CD6D50BB69CC7F26.GZ"
    )
    name = parse_fragment_name(uri)
    assert (name.begin, name.end, name.codec) == (0, 0x201A3F27, "gzip")
    assert name.sum == "1ec69e2de187b7720fb864a8cd6d50bb69cc7f26"
    fragment = ff.fragment_from_uri(uri)
    assert fragment.journal == "s3://bkt/acmeCo/orders/category=Anvils/pivot=00"


@pytest.mark.parametrize(
    "ext, codec",
    [
        (".raw", "raw"),
        (".RAW", "raw"),
        (".gz", "gzip"),
        (".GZ", "gzip"),
        (".gzip", "gzip"),
        (".GZip", "gzip"),
        (".zst", "zstd"),
        (".ZST", "zstd"),
        (".zstandard", "zstd"),
        (".ZStandard", "zstd"),
        (".sz", "snappy"),
        (".SZ", "snappy"),
        (".snappy", "snappy"),
        (".SNAPPY", "snappy"),
        ("", "gzip_offload"),
        (".gzod", "gzip_offload"),
        (".GZOD", "gzip_offload"),
    ],
)
def test_extension_mapping(ext, codec):
    assert parse_fragment_name(f"{0:016x}-{16:016x}-{SUM}{ext}").codec == codec


@pytest.mark.parametrize(
    "name, complaint",
    [
        (f"{0:016x}-{SUM}.gz", "3 '-'-separated fields"),
        (f"{0:016x}-{1:016x}-{2:016x}-{SUM}.gz", "3 '-'-separated fields"),
        (f"{0:016x}-{1:016x}-{SUM[:39]}.gz", "40-hex"),
        (f"{0:016x}-{1:016x}-{SUM}0.gz", "40-hex"),
        (f"{0:016x}-{1:016x}-{'g' + SUM[1:]}.gz", "40-hex"),
        (f"{0:015x}-{1:016x}-{SUM}.gz", "16 hex"),
        (f"{0:016x}-{1:017x}-{SUM}.gz", "16 hex"),
        (f"000000000000000x-{1:016x}-{SUM}.gz", "16 hex"),
        (f"{9:016x}-{1:016x}-{SUM}.gz", "before begin"),
        (f"{0:016x}-{1:016x}-{SUM}.lz4", "unknown extension"),
        (f"{0:016x}-{1:016x}-{SUM}.", "unknown extension"),
        (f"{5:016x}-{5:016x}-{SUM}.gz", "all-zero sum"),
    ],
)
def test_bad_names_refused(name, complaint):
    with pytest.raises(ValueError, match=complaint):
        parse_fragment_name(name)


def test_empty_fragment_with_zero_sum_accepted():
    name = parse_fragment_name(f"{5:016x}-{5:016x}-{ff.ZERO_SUM}.gz")
    assert (name.begin, name.end, name.sum) == (5, 5, ff.ZERO_SUM)
    verify(b"", name, "u")
    with pytest.raises(FragmentError, match="length"):
        verify(b"x", name, "u")


# ---------------------------------------------------------------------------------------------
# covers


def spans(pieces: list[CoverPiece]) -> list[tuple[int, int, str, int]]:
    return [(p.start, p.fragment.name.end, p.fragment.uri, p.skip) for p in pieces]


def test_cover_contained_fragment_is_not_read():
    a, b = frag(0, 100, "a"), frag(20, 50, "b")
    pieces, gaps = cover([b, a])
    assert spans(pieces) == [(0, 100, "a", 0)] and gaps == []


def test_cover_prefers_greatest_end_at_the_same_begin():
    a, b = frag(0, 50, "a"), frag(0, 100, "b")
    assert spans(cover([a, b])[0]) == [(0, 100, "b", 0)]


def test_cover_takes_the_bytes_from_the_fragment_that_landed_first():
    """A later fragment holding landed bytes again (a compaction) yields to the first landing's
    fragments, although it reaches further: a document stays in its first hour."""
    first, second, compacted = frag(0, 60, "a"), frag(60, 100, "b"), frag(0, 100, "c")
    hour = {"a": "2024-06-01-10", "b": "2024-06-01-11", "c": "2024-06-01-12"}
    pieces, gaps = cover([compacted, second, first], landed_first=lambda f: hour[f.uri])
    assert spans(pieces) == [(0, 60, "a", 0), (60, 100, "b", 0)] and gaps == []
    pieces, _ = cover([compacted, second], landed_first=lambda f: hour[f.uri])  # hour 10 not read
    assert spans(pieces) == [(0, 100, "c", 0), (60, 100, "b", 0)] and [p.end for p in pieces] == [60, 100]
    # where the first landing has a hole (a fragment set aside), the later fragment fills the
    # hole only: the first landing's fragment after it takes over
    hole = {"a": "1", "x": "1", "b": "1", "c": "2"}
    pieces, gaps = cover(
        [frag(0, 100, "a"), frag(100, 150, "x"), frag(150, 200, "b"), frag(0, 200, "c")],
        failed={"x"},
        landed_first=lambda f: hole[f.uri],
    )
    assert spans(pieces) == [(0, 100, "a", 0), (100, 200, "c", 100), (150, 200, "b", 0)] and gaps == []
    assert [p.end for p in pieces] == [100, 150, 200]
    # an earlier fragment that ends before the offset holds nothing there
    pieces, _ = cover([frag(0, 10, "d"), compacted], landed_first=lambda f: {"d": "0", "c": "1"}[f.uri])
    assert spans(pieces) == [(0, 10, "d", 0), (10, 100, "c", 10)]


def test_cover_partial_overlap_skips_what_was_read():
    a, b = frag(0, 60, "a"), frag(40, 100, "b")
    pieces, gaps = cover([b, a])
    assert spans(pieces) == [(0, 60, "a", 0), (60, 100, "b", 20)] and gaps == []
    assert pieces[1].start == 60


def test_cover_identical_ranges_give_one_piece():
    pieces, gaps = cover([frag(0, 100, "z"), frag(0, 100, "a"), frag(0, 100, "m")])
    assert spans(pieces) == [(0, 100, "a", 0)] and gaps == []


def test_cover_adjacent_fragments():
    pieces, gaps = cover([frag(50, 100, "b"), frag(0, 50, "a")])
    assert spans(pieces) == [(0, 50, "a", 0), (50, 100, "b", 0)] and gaps == []


def test_cover_reports_gaps_and_ignores_empty_fragments():
    fragments = [frag(10, 50, "a"), frag(70, 100, "b"), frag(60, 60, "e"), frag(130, 140, "c")]
    pieces, gaps = cover(fragments)
    assert spans(pieces) == [(10, 50, "a", 0), (70, 100, "b", 0), (130, 140, "c", 0)]
    assert gaps == [Gap("j", 50, 70), Gap("j", 100, 130)]


def test_cover_mixed_shapes():
    fragments = [
        frag(0, 40, "a"),
        frag(10, 30, "inside-a"),
        frag(30, 80, "b"),  # partial overlap with a
        frag(30, 80, "b-copy"),  # identical to b
        frag(80, 90, "c"),  # adjacent to b
        frag(85, 88, "inside-c"),
        frag(95, 120, "d"),  # after a gap
        frag(100, 120, "tail-of-d"),
    ]
    pieces, gaps = cover(fragments)
    assert spans(pieces) == [(0, 40, "a", 0), (40, 80, "b", 10), (80, 90, "c", 0), (95, 120, "d", 0)]
    assert gaps == [Gap("j", 90, 95)]


def random_fragments(rng: random.Random) -> list[Fragment]:
    """1 to 12 fragments of up to 60 bytes (some empty) beginning anywhere in the first 200."""
    fragments = []
    for i in range(rng.randint(1, 12)):
        begin = rng.randint(0, 200)
        fragments.append(frag(begin, begin + rng.randint(0, 60), f"f{i:02d}"))
    return fragments


def test_cover_every_byte_once_randomised():
    rng = random.Random(20240501)
    for _ in range(300):
        fragments = random_fragments(rng)
        pieces, gaps = cover(fragments)
        wanted = set()
        for f in fragments:
            wanted.update(range(f.name.begin, f.name.end))
        read: list[int] = []
        for p in pieces:
            assert p.fragment.name.begin <= p.start < p.fragment.name.end
            assert p.skip == p.start - p.fragment.name.begin
            read.extend(range(p.start, p.fragment.name.end))
            # greedy: nothing covering the start reaches further
            assert all(
                f.name.end <= p.fragment.name.end for f in fragments if f.name.begin <= p.start < f.name.end
            )
        assert len(read) == len(set(read)), "a byte was read twice"
        assert set(read) == wanted
        holes = set()
        for g in gaps:
            assert g.begin < g.end and not wanted & set(range(g.begin, g.end))
            holes.update(range(g.begin, g.end))
        if wanted:
            assert holes | wanted == set(range(min(wanted), max(wanted) + 1))
        for before, after in itertools.pairwise(pieces):
            assert before.fragment.name.end <= after.start


def test_cover_of_nothing_and_of_two_journals():
    assert cover([]) == ([], [])
    assert cover([frag(3, 3)]) == ([], [])
    with pytest.raises(ValueError, match="one journal"):
        cover([frag(0, 1, journal="x"), frag(0, 1, journal="y")])


def test_cover_falls_back_past_failed_fragments():
    whole, first, second = frag(0, 100, "whole"), frag(0, 60, "first"), frag(40, 100, "second")
    pieces, gaps = cover([whole, first, second], failed={"whole"})
    assert spans(pieces) == [(0, 60, "first", 0), (60, 100, "second", 20)] and gaps == []
    pieces, gaps = cover([whole, first, second], failed={"whole", "first"})
    assert spans(pieces) == [(40, 100, "second", 0)]
    assert gaps == [Gap("j", 0, 40, failed=("first", "whole"))]


def test_cover_reports_what_only_failed_fragments_hold_as_gaps():
    garbage = frag(0, 1_000_000, "garbage")  # a name claiming far more than the journal holds
    fragments = [garbage, frag(0, 50, "a"), frag(50, 80, "b"), frag(90, 95, "c"), frag(120, 130, "bad-d")]
    pieces, gaps = cover(fragments, failed={"garbage", "bad-d"})
    assert spans(pieces) == [(0, 50, "a", 0), (50, 80, "b", 0), (90, 95, "c", 0)]
    assert gaps == [
        Gap("j", 80, 90, failed=("garbage",)),
        Gap("j", 95, 120, failed=("garbage",)),
        Gap("j", 120, 130, failed=("bad-d", "garbage")),
        Gap("j", 130, 1_000_000, failed=("garbage",)),
    ]
    assert "garbage" in gaps[0].description and "80..90" in gaps[0].description
    nothing_holds = cover([frag(0, 10, "x"), frag(20, 30, "y")], failed={"x"})[1]
    assert nothing_holds == [Gap("j", 0, 10, failed=("x",)), Gap("j", 10, 20)]
    assert "in no fragment" in nothing_holds[1].description
    assert cover([frag(0, 10, "x")], failed={"x"}) == ([], [Gap("j", 0, 10, failed=("x",))])


def test_cover_with_failed_fragments_randomised():
    rng = random.Random(20260511)
    for _ in range(300):
        fragments = random_fragments(rng)
        failed = {f.uri for f in fragments if rng.random() < 0.3}
        pieces, gaps = cover(fragments, failed=failed)
        good, lost = set(), set()
        for f in fragments:
            (lost if f.uri in failed else good).update(range(f.name.begin, f.name.end))
        read: list[int] = []
        for p in pieces:
            assert p.fragment.uri not in failed
            read.extend(range(p.start, p.fragment.name.end))
        assert len(read) == len(set(read)) and set(read) == good
        for g in gaps:
            held_by = {
                f.uri
                for f in fragments
                if f.uri in failed and max(f.name.begin, g.begin) < min(f.name.end, g.end)
            }
            assert set(g.failed) == held_by
            assert all(
                f.name.begin <= g.begin and g.end <= f.name.end for f in fragments if f.uri in g.failed
            )
        holes = {b for g in gaps for b in range(g.begin, g.end)}
        assert not holes & good and lost - good <= holes
        everything = good | lost
        if everything:
            assert holes | good == set(range(min(everything), max(everything) + 1))


# ---------------------------------------------------------------------------------------------
# codecs, checksums, lines

CONTENT = b"".join(line(P, 16 * i, OUTSIDE_TXN, id=i) for i in range(40))


def encodings(content: bytes) -> dict[str, list[bytes]]:
    half = len(content) // 2
    return {
        "raw": [content],
        "gzip": [gzip.compress(content[:half]) + gzip.compress(content[half:]), gzip.compress(content)],
        "zstd": [bytes(cramjam.zstd.compress(content))],
        "snappy": [bytes(cramjam.snappy.compress(content))],
        "gzip_offload": [gzip.compress(content), content],
    }


@pytest.mark.parametrize("codec", ff.CODECS)
def test_codecs_round_trip(codec):
    name = parse_fragment_name(name_of(1000, 1000 + len(CONTENT), CONTENT))
    for stored in encodings(CONTENT)[codec]:
        inflated = inflate(stored, codec, "u", limit=len(CONTENT))
        assert inflated == CONTENT
        verify(inflated, name, "u")
        got = list(lines(inflated, 0, name.begin, "u"))
        assert len(got) == 40 and got[0] == (1000, CONTENT.split(b"\n")[0])
        assert all(CONTENT[off - 1000 :].startswith(text) for off, text in got)


def test_gzip_multi_member_reads_every_member():
    stored = gzip.compress(b"a\n") + gzip.compress(b"b\n") + gzip.compress(b"c\n")
    assert inflate(stored, "gzip", "u", limit=6) == b"a\nb\nc\n"


def bomb(codec: str, size: int = 128 << 20) -> bytes:
    """`size` zero bytes compressed with `codec`, a chunk at a time (never whole in memory)."""
    chunk = bytes(1 << 20)
    if codec in ("gzip", "gzip_offload"):
        packer = zlib.compressobj(1, zlib.DEFLATED, 31)
        return b"".join(packer.compress(chunk) for _ in range(size // len(chunk))) + packer.flush()
    packer = (cramjam.zstd if codec == "zstd" else cramjam.snappy).Compressor()
    for _ in range(size // len(chunk)):
        packer.compress(chunk)
    return bytes(packer.finish())


@pytest.mark.parametrize(
    "codec, ext", [("gzip", ".gz"), ("zstd", ".zst"), ("snappy", ".sz"), ("gzip_offload", ".gzod")]
)
def test_a_compression_bomb_stops_at_the_length_its_name_declares(codec, ext):
    content = line(P, 16, OUTSIDE_TXN, id=1)
    uri = "s3://b/j/" + name_of(0, len(content), content, ext)
    stored = {uri: bomb(codec)}
    tracemalloc.start()
    try:
        with pytest.raises(FragmentError) as info:
            ff.read_piece(CoverPiece(ff.fragment_from_uri(uri), 0), stored.__getitem__)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.uri == uri and info.value.offset == 0
    assert f"content inflates to more than {len(content)} bytes" in str(info.value)
    assert peak < 4 << 20, f"inflating used {peak} bytes"


def test_inflate_is_bounded_across_gzip_members():
    stored = gzip.compress(b"a" * 60 + b"\n") + gzip.compress(b"b" * 60 + b"\n")
    assert inflate(stored, "gzip", "u", limit=122) == b"a" * 60 + b"\n" + b"b" * 60 + b"\n"
    with pytest.raises(FragmentError, match="inflates to more than 121 bytes"):
        inflate(stored, "gzip", "u", limit=121)
    padded = stored + bytes(7)  # zero padding after the last member, as gzip allows
    assert inflate(padded, "gzip", "u", limit=122) == inflate(stored, "gzip", "u", limit=122)


def test_a_name_declaring_more_than_the_inflate_limit_is_refused_unread():
    huge = "s3://b/j/" + name_of(0, ff.MAX_FRAGMENT_BYTES + 1, ext=".gz")
    fetched: list[str] = []
    with pytest.raises(
        FragmentError, match=f"declares {ff.MAX_FRAGMENT_BYTES + 1} bytes, more than the limit"
    ):
        ff.read_piece(CoverPiece(ff.fragment_from_uri(huge), 0), lambda u: fetched.append(u) or b"")
    assert fetched == []
    content = line(P, 16, OUTSIDE_TXN, id=1)
    uri = "s3://b/j/" + name_of(0, len(content), content, ".gz")
    piece, stored = CoverPiece(ff.fragment_from_uri(uri), 0), {uri: gzip.compress(content)}
    assert ids(ff.read_piece(piece, stored.__getitem__, max_bytes=len(content))) == [1]
    with pytest.raises(FragmentError, match="more than the limit"):
        ff.read_piece(piece, stored.__getitem__, max_bytes=len(content) - 1)


def test_snappy_is_the_framing_format():
    with pytest.raises(FragmentError, match=r"snappy: "):
        inflate(bytes(cramjam.snappy.compress_raw(CONTENT)), "snappy", "s3://b/x.sz", limit=len(CONTENT))


@pytest.mark.parametrize("codec", ["gzip", "zstd", "snappy", "gzip_offload"])
def test_truncated_content_refused(codec):
    stored = encodings(CONTENT)[codec][0]
    with pytest.raises(FragmentError) as info:
        inflate(stored[: len(stored) - 7], codec, "s3://b/j/f", begin=4096, limit=len(CONTENT))
    err = info.value
    assert (err.uri, err.offset) == ("s3://b/j/f", 4096)
    assert f"({codec}: " in str(err) and "s3://b/j/f" in str(err) and "4096" in str(err)


def test_checksum_mismatch_names_expected_and_actual():
    name = parse_fragment_name(name_of(64, 64 + len(CONTENT), CONTENT))
    damaged = CONTENT.replace(b'"id": 7', b'"id": 8')
    with pytest.raises(FragmentError) as info:
        verify(damaged, name, "s3://b/j/f.raw")
    err = info.value
    assert err.uri == "s3://b/j/f.raw" and err.offset == 64
    assert name.sum in str(err) and hashlib.sha1(damaged).hexdigest() in str(err)
    with pytest.raises(FragmentError, match="expected 1 bytes"):
        verify(b"xy", FragmentName(0, 1, SUM, "raw"), "u")


def test_missing_trailing_newline_names_offset_of_last_line():
    content = b'{"a":1}\n{"b":2}'
    with pytest.raises(FragmentError, match="does not end with a newline") as info:
        list(lines(content, 0, 500, "s3://b/j/f"))
    assert (info.value.uri, info.value.offset) == ("s3://b/j/f", 508)


def test_lines_skip_blank_lines_and_start_at_skip():
    content = b'{"a":1}\n\n{"b":2}\n  \n{"c":3}\n'
    assert list(lines(content, 0, 10, "u")) == [(10, b'{"a":1}'), (19, b'{"b":2}'), (30, b'{"c":3}')]
    assert list(lines(content, 9, 10, "u")) == [(19, b'{"b":2}'), (30, b'{"c":3}')]
    assert list(lines(content, len(content), 10, "u")) == []
    with pytest.raises(FragmentError, match="document boundary"):
        list(lines(content, 3, 10, "u"))


def test_fragment_error_pickles():
    err = pickle.loads(pickle.dumps(FragmentError("s3://x", "bad", 7)))  # noqa: S301 - our own object
    assert (err.uri, err.reason, err.offset) == ("s3://x", "bad", 7)
    assert str(err) == "fragment s3://x at journal offset 7: bad"
    assert isinstance(err, ValueError)


# ---------------------------------------------------------------------------------------------
# uuids


def test_parse_uuid_decodes_clock_flags_producer_and_time():
    when = dt.datetime(2024, 3, 1, 12, 34, 56, 789012, tzinfo=dt.UTC)
    unix_us = (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    ticks = unix_us * 10 + GREGORIAN_TO_UNIX + 7  # 700 ns past the microsecond
    text = flow_uuid("a1b2c3d4e5f6", (ticks << 4) | 5, CONTINUE_TXN)
    u = parse_uuid(text)
    assert u.clock == ticks and u.sequence == 5 and u.order == (ticks << 4) | 5
    assert u.flags == CONTINUE_TXN and u.producer == "a1b2c3d4e5f6"
    assert u.timestamp == when
    # the same fields as Python's own v1 reading
    std = uuidlib.UUID(text)
    assert std.version == 1 and std.time == u.clock and std.node == int("a1b2c3d4e5f6", 16)


def test_parse_uuid_flags_use_ten_bits():
    u = parse_uuid(flow_uuid(P, (1 << 40) | 0xF, 0x3FF))
    assert u.flags == 0x3FF and u.sequence == 0xF
    assert parse_uuid(flow_uuid(P, 1 << 40, ACK_TXN)).is_ack


@pytest.mark.parametrize(
    "text", ["6f1c2b7e-3d4a-4c5b-9e8f-0a1b2c3d4e5f", "not-a-uuid", "", str(uuidlib.UUID(int=0))]
)
def test_parse_uuid_refuses_non_v1(text):
    with pytest.raises(ValueError):
        parse_uuid(text)


# ---------------------------------------------------------------------------------------------
# transactions


def ids(docs):
    return [d.doc.get("id") for d in docs]


def test_outside_transaction_documents_commit_at_once():
    s = Sequencer()
    assert ids(s.feed(doc(0, P, 100, OUTSIDE_TXN, id=1))) == [1]
    assert ids(s.feed(doc(1, Q, 50, OUTSIDE_TXN, id=2))) == [2]
    assert s.finish() == [] and s.counts["committed"] == 2


def test_transaction_committed_by_ack_in_journal_order():
    s = Sequencer()
    assert s.feed(doc(0, P, 100, CONTINUE_TXN, id=1)) == []
    assert ids(s.feed(doc(1, Q, 100, OUTSIDE_TXN, id=2))) == [2]
    assert s.feed(doc(2, P, 101, CONTINUE_TXN, id=3)) == []
    assert s.feed(doc(3, Q, 200, ACK_TXN)) == []  # another producer's ack commits nothing of P
    assert ids(s.feed(doc(4, P, 101, ACK_TXN))) == [1, 3]  # clock at or above each
    assert s.finish() == []
    assert s.counts["acks"] == 2 and s.counts["committed"] == 3


def test_ack_flag_in_meta_is_an_ack():
    s = Sequencer()
    s.feed(doc(0, P, 100, CONTINUE_TXN, id=1))
    assert ids(s.feed(doc(1, P, 100, OUTSIDE_TXN, ack=True))) == [1]


def test_transaction_rolled_back_by_lower_ack():
    s = Sequencer()
    s.feed(doc(0, P, 100, CONTINUE_TXN, id=1))
    s.feed(doc(1, P, 200, CONTINUE_TXN, id=2))
    assert ids(s.feed(doc(2, P, 150, ACK_TXN))) == [1]  # 2 was rolled back
    s.feed(doc(3, P, 300, CONTINUE_TXN, id=3))
    assert s.feed(doc(4, P, 90, ACK_TXN)) == []
    assert s.counts["rolled_back"] == 2 and s.counts["committed"] == 1


def test_a_document_outside_a_transaction_rolls_back_what_its_producer_left_pending():
    """As Gazette's sequencer does: the open transaction ends there, and a later ACK of a
    higher clock commits only what came after. Committed by that ACK, a run over the whole
    journal kept a document that runs reading from a later hour (after the outside document)
    never saw: the lake differed with how hours were grouped into runs."""
    s = Sequencer()
    s.feed(doc(0, P, 100, CONTINUE_TXN, id=1))
    s.feed(doc(1, Q, 100, CONTINUE_TXN, id=2))
    assert ids(s.feed(doc(2, P, 200, OUTSIDE_TXN, id=3))) == [3]
    s.feed(doc(3, P, 300, CONTINUE_TXN, id=4))
    assert ids(s.feed(doc(4, P, 300, ACK_TXN))) == [4]
    assert ids(s.feed(doc(5, Q, 100, ACK_TXN))) == [2]  # another producer's transaction stands
    assert s.counts["rolled_back"] == 1 and s.counts["committed"] == 3


def test_reread_duplicates_dropped():
    s = Sequencer()
    s.feed(doc(0, P, 100, CONTINUE_TXN, id=1))
    assert ids(s.feed(doc(1, P, 100, ACK_TXN))) == [1]
    assert s.feed(doc(2, P, 100, CONTINUE_TXN, id=1)) == []  # re-read of a committed document
    assert s.feed(doc(3, P, 100, ACK_TXN)) == []
    assert ids(s.feed(doc(4, Q, 5, OUTSIDE_TXN, id=9))) == [9]
    assert s.feed(doc(5, Q, 5, OUTSIDE_TXN, id=9)) == []  # outside documents acknowledge themselves
    assert s.counts["duplicates"] == 2
    # same 100 ns tick, higher counter: not a duplicate
    s.feed(doc(6, P, 101, CONTINUE_TXN, id=2))
    assert ids(s.feed(doc(7, P, 101, ACK_TXN))) == [2]


def test_pending_at_the_end_is_not_emitted():
    s = Sequencer()
    s.feed(doc(0, P, 100, CONTINUE_TXN, id=1))
    s.feed(doc(1, Q, 100, CONTINUE_TXN, id=2))
    s.feed(doc(2, P, 101, CONTINUE_TXN, id=3))
    assert ids(s.finish()) == [1, 2, 3]
    assert s.counts["committed"] == 0 and s.counts["pending"] == 3


# ---------------------------------------------------------------------------------------------
# reading a journal


def test_read_journal_end_to_end():
    journal = [
        line(Q, 100, OUTSIDE_TXN, id=1),
        line(P, 200, CONTINUE_TXN, id=2),
        line(P, 201, CONTINUE_TXN, id=3),
        line(P, 201, ACK_TXN),
        line(Q, 101, OUTSIDE_TXN, id=4),
        line(P, 300, CONTINUE_TXN, id=5),  # rolled back by the next ack
        line(P, 250, ACK_TXN),
        line(P, 201, CONTINUE_TXN, id=3),  # re-read duplicate
        line(P, 400, CONTINUE_TXN, id=6),  # in the damaged fragment
        line(P, 400, ACK_TXN),  # in the damaged fragment
        line(Q, 102, OUTSIDE_TXN, id=7),
        b"\n",
        line(P, 500, CONTINUE_TXN, id=8),  # never acknowledged
        line(Q, 103, OUTSIDE_TXN, id=9),  # in a fragment with a non-JSON line
        b"{not json\n",
    ]
    offsets = [0]
    for text in journal:
        offsets.append(offsets[-1] + len(text))
    data = b"".join(journal)
    stored: dict[str, bytes] = {}
    base = "s3://bkt/acme/orders/pivot=00/utc_date=2024-05-01/utc_hour=07/"

    def put(first: int, last: int, codec_ext: str, encode, damage=None) -> None:
        begin, end = offsets[first], offsets[last]
        content = data[begin:end]
        uri = base + name_of(begin, end, content, codec_ext)
        stored[uri] = encode(damage(content) if damage else content)

    put(0, 4, ".gz", lambda c: gzip.compress(c[:40]) + gzip.compress(c[40:]))
    put(2, 8, ".zst", lambda c: bytes(cramjam.zstd.compress(c)))  # partial overlap
    put(2, 4, ".raw", bytes)  # inside the first fragment
    put(0, 4, ".raw", bytes)  # identical range, another codec
    put(8, 10, ".sz", lambda c: bytes(cramjam.snappy.compress(c)), damage=lambda c: c.replace(b"id", b"ID"))
    put(10, 13, "", bytes)  # offload codec, handed over already inflated
    put(13, 15, ".gzod", gzip.compress)

    fetched: list[str] = []

    def fetch(uri: str) -> bytes:
        fetched.append(uri)
        return stored[uri]

    fragments = [ff.fragment_from_uri(uri) for uri in stored]
    assert {f.journal for f in fragments} == {"s3://bkt/acme/orders/pivot=00"}
    pieces, gaps = cover(fragments)
    assert gaps == []
    assert [(p.start, p.fragment.name.end) for p in pieces] == [
        (offsets[0], offsets[4]),
        (offsets[4], offsets[8]),
        (offsets[8], offsets[10]),
        (offsets[10], offsets[13]),
        (offsets[13], offsets[15]),
    ]
    assert pieces[1].skip == offsets[4] - offsets[2]

    result = read_journal(fragments, fetch)
    assert len(fetched) == 5  # the damaged fragments have no stand-in: nothing else is fetched
    assert ids(result.committed) == [1, 2, 3, 4, 7]
    assert [d.offset for d in result.committed] == [offsets[i] for i in (0, 1, 2, 4, 10)]
    assert ids(result.pending) == [8]
    assert result.counts["rolled_back"] == 1 and result.counts["duplicates"] == 1
    assert result.counts["acks"] == 2 and result.counts["bad_fragments"] == 2

    checksum, not_json = result.bad
    assert checksum.uri == pieces[2].fragment.uri and checksum.offset == offsets[8]
    assert "SHA-1 mismatch" in str(checksum) and checksum.uri in str(checksum)
    assert not_json.uri == pieces[4].fragment.uri and not_json.offset == offsets[14]
    assert "not JSON" in str(not_json) and str(offsets[14]) in str(not_json)
    journal_uri = "s3://bkt/acme/orders/pivot=00"
    assert result.gaps == [
        Gap(journal_uri, offsets[8], offsets[10], failed=(checksum.uri,)),
        Gap(journal_uri, offsets[13], offsets[15], failed=(not_json.uri,)),
    ]


def test_read_journal_sets_aside_truncated_and_uuid_less_fragments():
    good = line(P, 16, OUTSIDE_TXN, id=1)
    no_uuid = b'{"id": 2, "_meta": {}}\n'
    v4 = json.dumps({"id": 3, "_meta": {"uuid": str(uuidlib.uuid4())}}).encode() + b"\n"
    a, b, c = good, no_uuid, v4
    o1, o2, o3 = len(a), len(a) + len(b), len(a) + len(b) + len(c)
    stored = {
        "s3://b/j/" + name_of(0, o1, a, ".gz"): gzip.compress(a)[:-9],  # truncated
        "s3://b/j/" + name_of(o1, o2, b, ".raw"): b,
        "s3://b/j/" + name_of(o2, o3, c, ".raw"): c,
    }
    result = read_journal([ff.fragment_from_uri(u) for u in stored], stored.__getitem__)
    assert result.committed == [] and result.pending == []
    truncated, missing, invalid = result.bad
    assert truncated.offset == 0 and "(gzip: " in truncated.reason
    assert missing.offset == o1 and "_meta.uuid" in missing.reason
    assert invalid.offset == o2 and "not a version-1 UUID" in invalid.reason


def test_read_journal_falls_back_to_fragments_holding_the_same_bytes():
    journal = [line(P, 16 * i, OUTSIDE_TXN, id=i) for i in range(1, 7)]
    at = [sum(len(t) for t in journal[:i]) for i in range(len(journal) + 1)]
    stored: dict[str, bytes] = {}

    def put(first: int, last: int, ext: str, encode, sum_of: bytes | None = None) -> str:
        content = b"".join(journal[first:last])
        uri = "s3://b/j/" + name_of(at[first], at[last], sum_of or content, ext)
        stored[uri] = encode(content)
        return uri

    whole = put(0, 6, ".raw", bytes, sum_of=b"other bytes")  # picked first: it reaches furthest
    put(0, 3, ".raw", bytes)
    second_half = put(3, 6, ".gz", lambda c: gzip.compress(c)[:-9])  # the stand-in fails too
    put(3, 5, ".zst", lambda c: bytes(cramjam.zstd.compress(c)))
    put(4, 6, ".raw", bytes)
    fetched: list[str] = []

    def fetch(uri: str) -> bytes:
        fetched.append(uri)
        return stored[uri]

    result = read_journal([ff.fragment_from_uri(u) for u in stored], fetch)
    assert ids(result.committed) == [1, 2, 3, 4, 5, 6] and result.gaps == []
    assert [e.uri for e in result.bad] == [whole, second_half]
    assert "SHA-1 mismatch" in result.bad[0].reason and "(gzip: " in result.bad[1].reason
    assert sorted(fetched) == sorted(stored)  # each fragment fetched once
    assert result.counts["bad_fragments"] == 2 and result.counts["pieces"] == 3


def test_a_piece_stopped_where_another_fragment_takes_over_reads_up_to_there_only():
    first, second = line(P, 16, OUTSIDE_TXN, id=1), line(P, 32, OUTSIDE_TXN, id=2)
    content = first + second
    uri = "s3://b/j/" + name_of(0, len(content), content, ".gz")
    stored = {uri: gzip.compress(content)}
    fragment = ff.fragment_from_uri(uri)
    assert ids(ff.read_piece(CoverPiece(fragment, 0, stop=len(first)), stored.__getitem__)) == [1]
    # the fragment said to take over there is blamed: this one's bytes are checked, its begin is
    # only what its name claims
    taker = "s3://b/j/" + name_of(len(first) - 3, len(content))
    with pytest.raises(FragmentError, match="inside a document of") as refused:
        ff.read_piece(CoverPiece(fragment, 0, stop=len(first) - 3, taken_over_by=taker), stored.__getitem__)
    assert refused.value.uri == taker


@given(
    st.lists(st.tuples(st.integers(0, 60), st.integers(1, 20)), max_size=8),
    st.lists(st.tuples(st.integers(0, 60), st.integers(1, 20)), max_size=8),
)
def test_the_landed_fragments_holding_removed_bytes_are_those_that_overlap_one(removed, landed):
    def uri(begin: int, length: int, hour: int) -> str:
        return f"file:///l/acme/x/pivot=00/utc_date=2024-06-01/utc_hour={hour:02d}/" + name_of(
            begin, begin + length
        )

    gone = [uri(b, n, 1) for b, n in removed]
    kept = [uri(b, n, 2) for b, n in landed]
    found = FlowJournalFormat().holding_removed_data(gone, kept)
    for (begin, length), kept_uri in zip(landed, kept, strict=True):
        overlapping = {
            g for (b, n), g in zip(removed, gone, strict=True) if b < begin + length and begin < b + n
        }
        assert (kept_uri in found) == bool(overlapping)
        assert kept_uri not in found or found[kept_uri] in overlapping
    assert FlowJournalFormat().holding_removed_data(gone, [u.replace("/x/", "/y/") for u in kept]) == {}
    # an empty fragment holds nothing (the cover ignores it), removed or landed
    empty = uri(5, 0, 3)
    assert empty not in FlowJournalFormat().holding_removed_data([uri(0, 10, 1)], [empty])
    assert FlowJournalFormat().holding_removed_data([empty], [uri(0, 10, 2)]) == {}


def test_a_fragment_left_out_of_the_cover_is_held_against_the_bytes_read_in_its_stead():
    """`hold_against`: a copy of bytes that two pieces read passes; one differing byte is named
    by its offset; bytes no piece read are named too."""
    journal = b"0123456789abcdefghij"  # 20 bytes over two fragments read whole: [0, 12) and [12, 20)
    read = {"s3://b/j/a": journal[:12], "s3://b/j/b": journal[12:]}
    pieces = [CoverPiece(frag(0, 12, "s3://b/j/a"), 0), CoverPiece(frag(12, 20, "s3://b/j/b"), 0)]

    def content_of(fragment: Fragment) -> bytes:
        return read[fragment.uri]

    ff.hold_against(frag(4, 16, "s3://b/j/copy"), journal[4:16], pieces, content_of)
    ff.hold_against(frag(8, 8, "s3://b/j/empty"), b"", pieces, content_of)
    with pytest.raises(
        FragmentError, match=r"other bytes at journal offsets 12\.\.16 than b, which was read"
    ) as differs:
        ff.hold_against(frag(4, 16, "s3://b/j/other"), journal[4:12] + b"WXYZ", pieces, content_of)
    assert differs.value.offset == 12 and differs.value.uri == "s3://b/j/other"
    with pytest.raises(FragmentError, match=r"offsets 20\.\.24 are read from no fragment of the cover"):
        ff.hold_against(frag(16, 24, "s3://b/j/past"), journal[16:] + b"klmn", pieces, content_of)


@pytest.mark.parametrize(
    "names, shown",
    [
        ((b'"f\xff"', b'"f\xfe"'), ("'f\\xff'", "'f\\xfe'")),
        ((b'"g\\ud800"', b'"g\\udbff"'), ("'g\\ud800'", "'g\\udbff'")),
        ((b'"h\\ufffd"', b'"h\xff"'), ("'h\ufffd'", "'h\\xff'")),
        ((b'"f\xff\\ud800"', b'"f\xfe\\ud800"'), ("'f\\xff\\ud800'", "'f\\xfe\\ud800'")),
        (
            (b'"%s\xff"' % (b"a" * 70), b'"%s\xfe"' % (b"a" * 70)),
            ("'...%s\\xff'" % ("a" * 20), "'...%s\\xfe'" % ("a" * 20)),
        ),
    ],
    ids=["bytes", "escaped-surrogates", "beside-the-replacement-character", "byte-and-escape", "long"],
)
@pytest.mark.parametrize("nested", [False, True], ids=["top", "nested"])
def test_field_names_that_are_one_once_their_text_is_repaired_set_the_document_aside(names, shown, nested):
    """Repaired, the two names are one and one value would be dropped without a word."""
    from lake_assets.demo.flow_sample import build_uuid
    from lake_assets.feeds.flow_documents import vet_document

    fields = b"%s: 1, %s: 2" % names
    body = b'"o": {%s}' % fields if nested else fields
    line = b'{"id": 7, %s, "_meta": {"uuid": "%s"}}\n' % (body, build_uuid(1, 0, b"\x01" * 6).encode())
    doc = ff.parse_document(line, 0, "file:///journal/fragment")

    with pytest.raises(ff.FragmentError) as refused:
        vet_document(doc, ("/id",))

    assert f"field names {shown[0]} and {shown[1]}, which are one name" in str(refused.value)


def test_field_names_equal_but_for_case_once_repaired_set_the_document_aside():
    """`F\\xff` and `f\\xfe` are `F\ufffd` and `f\ufffd` once repaired: one column to Spark."""
    from lake_assets.demo.flow_sample import build_uuid
    from lake_assets.feeds.flow_documents import vet_document

    line = (
        b'{"id": 7, "F\xff": 1, "f\xfe": 2, "_meta": {"uuid": "%s"}}\n'
        % build_uuid(1, 0, b"\x01" * 6).encode()
    )
    with pytest.raises(ff.FragmentError, match="equal ignoring case"):
        vet_document(ff.parse_document(line, 0, "file:///journal/fragment"), ("/id",))


def test_the_journal_s_own_meta_is_not_held_to_the_names_of_fields():
    """Only `_meta.op` is read and nothing of `_meta` is written: names in it that are one
    once repaired drop nothing, and set nothing aside."""
    from lake_assets.demo.flow_sample import build_uuid
    from lake_assets.feeds.flow_documents import vet_document

    uuid = build_uuid(1, 0, b"\x01" * 6).encode()
    line = b'{"id": 7, "x": "\xff", "_meta": {"uuid": "%s", "before": {"k\xff": 1, "k\xfe": 2}}}\n' % uuid
    vet_document(ff.parse_document(line, 0, "file:///journal/fragment"), ("/id",))
