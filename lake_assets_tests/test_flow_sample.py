"""The Estuary Flow journal sample generator: layout, fragment names and codecs, overlaps, and the
transaction messiness. Pure Python (gzip, cramjam): no Spark, no Dagster.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import itertools
import json
import re
import uuid
import zlib
from collections import Counter, defaultdict
from pathlib import Path

import cramjam
import pytest

from lake_assets.demo.flow_sample import FlowSample, write_flow_landing

PATH = re.compile(
    r"^(?P<journal>(?P<collection>acmeCo/(?:orders|customers))(?:/[a-z_]+=[A-Za-z0-9]+)*/pivot=(?P<pivot>[0-9a-f]{2}))"
    r"/utc_date=(?P<date>\d{4}-\d{2}-\d{2})/utc_hour=(?P<hour>\d{2})/(?P<name>[^/]+)$"
)
NAME = re.compile(r"^(?P<begin>[0-9a-f]{16})-(?P<end>[0-9a-f]{16})-(?P<sum>[0-9a-f]{40})(?P<ext>\.[a-z]+)?$")
GREGORIAN_OFFSET = 0x01B21DD213814000
SEEDS = (5, 1, 23)


@pytest.fixture(scope="module", params=SEEDS, ids=lambda s: f"seed{s}")
def sample(request, tmp_path_factory) -> FlowSample:
    return write_flow_landing(tmp_path_factory.mktemp(f"flow{request.param}"), seed=request.param)


def inflate(path: Path) -> bytes:
    data = path.read_bytes()
    named = NAME.match(path.name)
    assert named is not None, path.name
    ext = named["ext"] or ""
    if ext == ".raw":
        return data
    if ext in (".gz", ""):
        return gzip.decompress(data)  # handles multi-member
    if ext == ".zst":
        return bytes(cramjam.zstd.decompress(data))
    if ext == ".sz":
        return bytes(cramjam.snappy.decompress(data))
    raise AssertionError(f"unexpected extension {ext!r}")


def gzip_members(data: bytes) -> int:
    count = 0
    while data:
        d = zlib.decompressobj(wbits=31)
        d.decompress(data)
        assert d.eof
        data = d.unused_data
        count += 1
    return count


def parse_uuid(text: str) -> tuple[int, int, bytes]:
    """(clock, flags, producer) of a Flow document uuid, checking it is an RFC 4122 version 1 uuid."""
    u = uuid.UUID(text)
    assert u.version == 1 and u.variant == uuid.RFC_4122
    return u.time, int.from_bytes(u.bytes[8:10], "big") & 0x3FF, u.bytes[10:16]


def fragments(sample: FlowSample) -> list[dict]:
    out = []
    for path in sample.files:
        m = PATH.match(path.relative_to(sample.landing_dir).as_posix())
        assert m, path
        n = NAME.match(m["name"])
        assert n, m["name"]
        out.append(
            {
                **m.groupdict(),
                "begin": int(n["begin"], 16),
                "end": int(n["end"], 16),
                "sum": n["sum"],
                "ext": n["ext"] or "",
                "path": path,
            }
        )
    return out


def journal_contents(sample: FlowSample) -> dict[str, bytes]:
    """Each journal's bytes put together from all its fragments, checking overlaps agree."""
    by_journal = defaultdict(list)
    for f in fragments(sample):
        by_journal[f["journal"]].append(f)
    out = {}
    for journal, frs in by_journal.items():
        buf = bytearray(max(f["end"] for f in frs))
        seen = [False] * len(buf)
        for f in frs:
            content = inflate(f["path"])
            for i, byte in enumerate(content, start=f["begin"]):
                assert not seen[i] or buf[i] == byte, f"overlapping fragments disagree at {journal}@{i}"
                buf[i], seen[i] = byte, True
        assert all(seen)
        out[journal] = bytes(buf)
    return out


def sequence(content: bytes) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """A minimal Gazette-style sequencer over one journal: (delivered, rolled back, duplicates, pending)."""
    last_ack: dict[bytes, int] = {}
    pending: dict[bytes, list[tuple[int, dict]]] = defaultdict(list)
    delivered: list[dict] = []
    rolled_back: list[dict] = []
    duplicates: list[dict] = []
    for line in content.splitlines():
        doc = json.loads(line)
        clock, flags, producer = parse_uuid(doc["_meta"]["uuid"])
        if flags == 0x2:
            assert doc["_meta"].get("ack") is True and set(doc) == {"_meta"}
            for c, d in pending.pop(producer, []):
                (delivered if c <= clock else rolled_back).append(d)
            last_ack[producer] = clock
        elif clock <= last_ack.get(producer, -1):
            duplicates.append(doc)
        elif flags == 0x0:
            delivered.append(doc)
            last_ack[producer] = clock
        else:
            assert flags == 0x1
            pending[producer].append((clock, doc))
    return delivered, rolled_back, duplicates, [d for docs in pending.values() for _, d in docs]


def uuids(docs) -> Counter:
    return Counter(d["_meta"]["uuid"] for d in docs)


def test_layout_names_and_content(sample):
    frs = fragments(sample)
    assert {f["collection"] for f in frs} == set(sample.collections) == {"acmeCo/orders", "acmeCo/customers"}
    assert sample.collections == {"acmeCo/orders": ["/id"], "acmeCo/customers": ["/id"]}
    assert {f["journal"] for f in frs} == {j for js in sample.journals.values() for j in js}
    for collection, journals in sample.journals.items():
        assert all(j.startswith(collection + "/") and (sample.landing_dir / j).is_dir() for j in journals)
    assert all(f["path"].is_file() for f in frs)
    for f in frs:
        content = inflate(f["path"])
        assert len(content) == f["end"] - f["begin"] > 0
        assert hashlib.sha1(content).hexdigest() == f["sum"]
        assert content.endswith(b"\n")
        for line in content.split(b"\n")[:-1]:
            json.loads(line)  # fragments break only on newlines
    assert {f["date"] for f in frs} == {"2024-06-01"}
    assert len({f["hour"] for f in frs}) >= 4


def test_codecs_and_pivots(sample):
    frs = fragments(sample)
    assert {f["ext"] for f in frs} >= {".gz", ".zst", ".sz", ".raw", ""}
    assert any(gzip_members(f["path"].read_bytes()) >= 2 for f in frs if f["ext"] == ".gz")
    for f in frs:
        head = f["path"].read_bytes()[:10]
        if f["ext"] in (".gz", ""):
            assert head[:2] == b"\x1f\x8b"
        elif f["ext"] == ".zst":
            assert head[:4] == b"\x28\xb5\x2f\xfd"
        elif f["ext"] == ".sz":
            assert head == b"\xff\x06\x00\x00sNaPpY"  # snappy framing format stream identifier
    pivots = defaultdict(set)
    for f in frs:
        pivots[f["journal"].rsplit("/pivot=", 1)[0]].add(f["pivot"])
    assert {"00", "80"} in pivots.values()
    assert pivots["acmeCo/customers"] == {"00"}


def test_coverage_and_overlaps(sample):
    by_journal = defaultdict(list)
    for f in fragments(sample):
        by_journal[f["journal"]].append(f)
    for journal, frs in by_journal.items():
        reach = 0
        for f in sorted(frs, key=lambda f: (f["begin"], f["end"])):
            assert f["begin"] <= reach, f"gap in {journal} at {reach}"
            reach = max(reach, f["end"])
    shapes = defaultdict(set)
    for journal, frs in by_journal.items():
        ranges = Counter((f["begin"], f["end"]) for f in frs)
        names = Counter(f["name"] for f in frs)
        if any(n > 1 for n in names.values()):
            shapes["identical"].add(journal)
            assert len({f["hour"] for f in frs if names[f["name"]] > 1}) > 1  # in two hour folders
        for a in ranges:
            for b in ranges:
                if a != b and b[0] <= a[0] and a[1] <= b[1]:
                    shapes["contained"].add(journal)
                if a[0] < b[0] < a[1] < b[1]:
                    shapes["partial"].add(journal)
                    if not any(c[0] == a[1] for c in ranges):  # the cover must skip into b
                        shapes["partial_needed"].add(journal)
    overlapping = "acmeCo/orders/category=Anvils/pivot=00"
    for shape in ("identical", "contained", "partial", "partial_needed"):
        assert overlapping in shapes[shape], shape


def test_transactions_and_committed(sample):
    contents = journal_contents(sample)
    excluded = sample.excluded
    assert all(len(excluded[k]) >= 2 for k in ("rolled_back", "redelivered", "pending"))
    for collection, journals in sample.journals.items():
        delivered, rolled, dups, pending = [], [], [], []
        for journal in journals:
            d, r, u, p = sequence(contents[journal])
            delivered += d
            rolled += r
            dups += u
            pending += p
            if any(e["journal"] == journal for e in excluded["pending"]):
                tail = contents[journal].splitlines()[-len(p) :]
                assert [json.loads(x) for x in tail] == p  # the pending transaction ends the journal
        committed = sample.committed[collection]
        assert sorted(map(json.dumps, delivered)) == sorted(map(json.dumps, committed))
        assert all(n == 1 for n in uuids(committed).values())

        def mine(kind, collection=collection):
            return [e["doc"] for e in excluded[kind] if e["collection"] == collection]

        assert uuids(rolled) == uuids(mine("rolled_back"))
        assert uuids(dups) == uuids(mine("redelivered"))
        assert uuids(pending) == uuids(mine("pending"))
        for kind in ("rolled_back", "redelivered", "pending"):
            for e in excluded[kind]:
                if e["collection"] != collection:
                    continue
                line = json.dumps(e["doc"], separators=(",", ":")).encode()
                times = contents[e["journal"]].splitlines().count(line)
                assert times == (2 if kind == "redelivered" else 1), kind
                assert (e["doc"]["_meta"]["uuid"] in uuids(committed)) == (kind == "redelivered")


def test_uuid_clocks_and_flags(sample):
    contents = journal_contents(sample)
    producers = set()
    docs = []
    for content in contents.values():
        for line in content.splitlines():
            doc = json.loads(line)
            clock, flags, producer = parse_uuid(doc["_meta"]["uuid"])
            producers.add(producer)
            assert flags in (0, 1, 2)
            moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
                microseconds=(clock - GREGORIAN_OFFSET) // 10
            )
            assert (
                dt.datetime(2024, 6, 1, 10, tzinfo=dt.UTC)
                <= moment
                < dt.datetime(2024, 6, 1, 16, tzinfo=dt.UTC)
            )
            docs.append((clock, producer, doc))
    assert len(producers) == 2
    # Distinct documents of one producer have distinct clocks at least 16 apart.
    for producer in producers:
        clocks = sorted({c for c, p, d in docs if p == producer and not d["_meta"].get("ack")})
        assert all(b - a >= 16 for a, b in itertools.pairwise(clocks))
    # Rollback: an ACK of the same producer below the rolled-back documents' clocks follows them.
    for e in sample.excluded["rolled_back"]:
        clock, flags, producer = parse_uuid(e["doc"]["_meta"]["uuid"])
        assert flags == 1
        lines = [json.loads(x) for x in contents[e["journal"]].splitlines()]
        at = lines.index(e["doc"])
        acks = [parse_uuid(d["_meta"]["uuid"]) for d in lines[at:] if d["_meta"].get("ack")]
        first = next(a for a in acks if a[2] == producer)
        assert first[0] < clock


def test_documents_shapes(sample):
    orders, customers = sample.committed["acmeCo/orders"], sample.committed["acmeCo/customers"]
    for docs, fields in (
        (orders, {"id", "category", "customer", "total", "items", "shipping", "status"}),
        (customers, {"id", "name", "email", "tier"}),
    ):

        def clock(d):
            return parse_uuid(d["_meta"]["uuid"])[0]

        created = {d["id"]: clock(d) for d in docs if d["_meta"]["op"] == "c"}
        for doc in docs:
            op = doc["_meta"]["op"]
            assert op in ("c", "u", "d")
            if op == "d":  # only the key and _meta, of a key created earlier
                assert set(doc) == {"id", "_meta"} and created[doc["id"]] < clock(doc)
            else:
                assert set(doc) == fields | {"_meta"}
        assert any(d["_meta"]["op"] == "d" for d in docs)
        assert any("before" in d["_meta"] for d in docs if d["_meta"]["op"] == "u")
    for doc in orders:
        if doc["_meta"]["op"] != "d":
            assert doc["category"] in ("Anvils", "Rockets")
            assert (
                isinstance(doc["total"], (int, float))
                and isinstance(doc["items"], list)
                and isinstance(doc["shipping"]["address"], dict)
            )
    hours = defaultdict(set)
    for doc in orders + customers:
        if doc["_meta"]["op"] == "u":
            clock = parse_uuid(doc["_meta"]["uuid"])[0]
            hours[doc["id"]].add((clock - GREGORIAN_OFFSET) // 36_000_000_000)
    assert any(len(h) >= 2 for h in hours.values())


def test_deterministic_for_a_seed(tmp_path):
    a = write_flow_landing(tmp_path / "a", seed=9)
    b = write_flow_landing(tmp_path / "b", seed=9)
    c = write_flow_landing(tmp_path / "c", seed=10)

    def files(s):
        return [(p.relative_to(s.landing_dir).as_posix(), p.read_bytes()) for p in s.files]

    assert files(a) == files(b)
    assert a.committed == b.committed and a.excluded == b.excluded and a.journals == b.journals
    assert files(a) != files(c)
