"""Estuary Flow collection journals as fragment files, messy the way real ones are
(docs/formats/flow-journals.md).

Deterministic for a seed. Two collections are written under `landing_dir` (the storage prefix):

- `acmeCo/orders`, key `["/id"]`, logical partition field `category` (`Anvils`, `Rockets`);
  journals `acmeCo/orders/category=Anvils/pivot=00`, `.../category=Anvils/pivot=80` and
  `.../category=Rockets/pivot=00`. Anvils was split in two by key hash at 11:30: from then on
  half of its keys go to pivot=80, so a key created in pivot=00 may be updated in pivot=80;
  documents `{id, category, customer, total, items: [..], shipping: {method, address: {..}},
  status, _meta}`.
- `acmeCo/customers`, key `["/id"]`, no logical partition fields: one journal
  `acmeCo/customers/pivot=00`; documents `{id, name, email, tier, _meta}`.

Fragment files are `<journal>/utc_date=YYYY-MM-DD/utc_hour=HH/<begin>-<end>-<sha1><ext>`, begin and
end being offsets of the uncompressed journal content and sha1 its checksum. Journal content is
newline-delimited compact JSON; fragments break on newlines. Documents span 2024-06-01 10:00 to
about 15:00 UTC, so fragments land in several `utc_hour` folders. Every document carries a
version-1 `_meta.uuid` (clock, flags, producer) written by one of two producers whose clocks
strictly increase (by at least 16) except for the rollback ACK below.

The messiness:
- every codec: `.gz` (some fragments are two gzip members concatenated), `.zst`, `.sz` (snappy
  framing format), `.raw`, and extension-less fragments holding gzip bytes (as if uploaded with
  `Content-Encoding: gzip`);
- overlapping fragments in `acmeCo/orders/category=Anvils/pivot=00`: a fragment fully contained
  in another (same begin, smaller end); a partial overlap (a fragment beginning inside its
  predecessor, and no fragment begins where the predecessor ends, so a reader must skip bytes);
  one fragment written twice with the same name, in its own `utc_hour` folder and the next one;
- transactions: `0x1` documents committed by a later ACK (`0x2`) of the same producer, with the
  two producers' transactions interleaved in a journal and spanning several journals (one ACK
  per journal touched); documents outside transactions (`0x0`);
- one transaction rolled back: producer 2 writes `0x1` documents to `acmeCo/customers/pivot=00`
  and `acmeCo/orders/category=Rockets/pivot=00`, followed in both by an ACK whose clock is
  lower than theirs (but above that producer's previous clocks);
- re-delivered documents: the exact line of an already acknowledged document appears again
  later in the same journal (a `0x1` one in `acmeCo/orders/category=Anvils/pivot=00`, a `0x0`
  one in `acmeCo/customers/pivot=00`), its clock at or below that producer's last ACK there;
- deletes (`op` `d`, only `id` and `_meta`, no `category`) of orders and customers created
  earlier; updates of one key across hours (order status advancing, customer tier changes);
  some updates carry `_meta.before`; orders carry a nested object and an array;
- a pending transaction at the very end of `acmeCo/orders/category=Rockets/pivot=00`: `0x1`
  documents of producer 1 with no ACK after them.

Sequencing state is per journal (as Gazette readers keep it): a producer's ACK in one journal
says nothing about its documents in another. `committed` is what a correct reader delivers;
`excluded` lists the rolled-back, re-delivered and pending documents that are in the files but
must not be delivered (for tests).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import gzip
import hashlib
import json
import random
import uuid
from pathlib import Path
from typing import Any

import cramjam

from lake_assets.errors import InvalidValue

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
GREGORIAN_OFFSET = 0x01B21DD213814000  # 100 ns intervals from 1582-10-15 to 1970-01-01
FLAG_OUTSIDE_TXN, FLAG_CONTINUE_TXN, FLAG_ACK_TXN = 0x0, 0x1, 0x2
START = dt.datetime(2024, 6, 1, 10, 0, tzinfo=UTC)
SPLIT = dt.datetime(2024, 6, 1, 11, 30, tzinfo=UTC)  # Anvils gains its second physical partition
END = dt.datetime(2024, 6, 1, 14, 55, tzinfo=UTC)

ORDERS = "acmeCo/orders"
CUSTOMERS = "acmeCo/customers"
KEYS = {ORDERS: ["/id"], CUSTOMERS: ["/id"]}
ANVILS_LO = "acmeCo/orders/category=Anvils/pivot=00"
ANVILS_HI = "acmeCo/orders/category=Anvils/pivot=80"
ROCKETS = "acmeCo/orders/category=Rockets/pivot=00"
CUSTOMERS_J = "acmeCo/customers/pivot=00"
JOURNALS = {ORDERS: [ANVILS_LO, ANVILS_HI, ROCKETS], CUSTOMERS: [CUSTOMERS_J]}
COLLECTION_OF = {j: c for c, js in JOURNALS.items() for j in js}

# Producer ids (uuid node bytes), multicast bit set as for randomly generated node ids.
PRODUCERS = (bytes.fromhex("0b5e7a1c2d01"), bytes.fromhex("2f9c04e1b7a3"))

CODECS = ("gz", "gz2", "zst", "sz", "raw", "gzod")  # gz2 = two gzip members, gzod = no extension
EXTENSION = {"gz": ".gz", "gz2": ".gz", "zst": ".zst", "sz": ".sz", "raw": ".raw", "gzod": ""}
STATUSES = ("placed", "paid", "shipped", "delivered")


@dataclasses.dataclass
class FlowSample:
    landing_dir: Path  # the storage prefix folder holding <collection>/...
    collections: dict[str, list[str]]  # collection -> key JSON pointers
    files: list[Path]  # every fragment file written
    committed: dict[str, list[dict]]  # collection -> documents a correct reader delivers, each once
    journals: dict[str, list[str]]  # collection -> journal folders relative to landing_dir
    # "rolled_back" / "redelivered" / "pending" -> [{"collection", "journal", "doc"}]
    excluded: dict[str, list[dict]] = dataclasses.field(default_factory=dict)


def clock_of(moment: dt.datetime) -> int:
    """The 60-bit v1 UUID clock (100 ns since 1582-10-15) of a moment, counter bits zero."""
    delta = moment - EPOCH
    ticks = (delta.days * 86_400 + delta.seconds) * 10_000_000 + delta.microseconds * 10
    return (ticks + GREGORIAN_OFFSET) & ~0xF


def build_uuid(clock: int, flags: int, producer: bytes) -> str:
    raw = bytearray(16)
    raw[0:4] = (clock & 0xFFFFFFFF).to_bytes(4, "big")
    raw[4:6] = ((clock >> 32) & 0xFFFF).to_bytes(2, "big")
    raw[6:8] = (((clock >> 48) & 0x0FFF) | 0x1000).to_bytes(2, "big")  # version 1
    raw[8:10] = (0x8000 | (flags & 0x3FF)).to_bytes(2, "big")  # variant 10, flags in low 10 bits
    raw[10:16] = producer
    return str(uuid.UUID(bytes=bytes(raw)))


def _dumps(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


@dataclasses.dataclass
class _Line:
    data: bytes
    when: dt.datetime  # wall time of the append
    producer: int | None = None
    clock: int = 0
    flags: int = 0
    ack: bool = False


@dataclasses.dataclass
class _Fragment:
    journal: str
    first: int  # line indexes [first, last)
    last: int
    codec: str = "gz"
    hour_shift: int = 0


class _Flow:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.clock = [0, 0]
        self.lines: dict[str, list[_Line]] = {j: [] for js in JOURNALS.values() for j in js}
        self.committed: dict[str, list[dict]] = {c: [] for c in JOURNALS}
        self.excluded: dict[str, list[dict]] = {"rolled_back": [], "redelivered": [], "pending": []}
        self.open: dict[int, dict] = {}  # producer -> {"journals": [...], "docs": [(collection, line)]}
        self.last_ack: dict[tuple[str, int], int] = {}  # (journal, producer) -> clock of its last ACK
        self.orders: dict[int, dict] = {}
        self.customers: dict[str, dict] = {}
        self.next_order = 1001
        self.next_customer = 1
        self.lsn = 5_000_000
        self.now = START
        self.actor = 0  # the producer the next change is for
        self.locks: dict[tuple[str, object], int] = {}  # (collection, id) -> producer with it in an open txn

    # -- clocks and lines -------------------------------------------------------------------------

    def tick(self, p: int, when: dt.datetime, at_least: int = 0) -> int:
        self.clock[p] = max(self.clock[p] + 16, clock_of(when), at_least)
        return self.clock[p]

    def append(self, journal: str, line: _Line) -> None:
        self.lines[journal].append(line)

    def write_doc(
        self,
        p: int,
        when: dt.datetime,
        journal: str,
        body: dict,
        op: str,
        flags: int,
        before: dict | None = None,
        clock: int | None = None,
    ) -> _Line:
        clock = self.tick(p, when) if clock is None else clock
        self.lsn += self.rng.randint(8, 400)
        meta: dict = {"uuid": build_uuid(clock, flags, PRODUCERS[p]), "op": op}
        if before is not None:
            meta["before"] = before
        table = "orders" if COLLECTION_OF[journal] == ORDERS else "customers"
        meta["source"] = {
            "schema": "public",
            "table": table,
            "lsn": self.lsn,
            "ts_ms": int((when - EPOCH).total_seconds() * 1000),
        }
        doc = {"_meta": meta, **body}
        line = _Line(_dumps(doc), when, p, clock, flags)
        self.append(journal, line)
        return line

    def write_ack(self, p: int, when: dt.datetime, journal: str, clock: int) -> None:
        doc = {"_meta": {"uuid": build_uuid(clock, FLAG_ACK_TXN, PRODUCERS[p]), "ack": True}}
        self.append(journal, _Line(_dumps(doc), when, p, clock, FLAG_ACK_TXN, ack=True))

    # -- transactions ----------------------------------------------------------------------------

    def in_txn(self, p: int, when: dt.datetime, change: tuple[str, dict, str, dict | None]) -> None:
        journal, body, op, before = change
        txn = self.open.setdefault(p, {"journals": [], "docs": []})
        self.locks[(COLLECTION_OF[journal], body["id"])] = p
        line = self.write_doc(p, when, journal, body, op, FLAG_CONTINUE_TXN, before)
        if journal not in txn["journals"]:
            txn["journals"].append(journal)
        txn["docs"].append((COLLECTION_OF[journal], line))

    def outside_txn(self, p: int, when: dt.datetime, change: tuple[str, dict, str, dict | None]) -> None:
        journal, body, op, before = change
        line = self.write_doc(p, when, journal, body, op, FLAG_OUTSIDE_TXN, before)
        self.committed[COLLECTION_OF[journal]].append(json.loads(line.data))

    def commit(self, p: int, when: dt.datetime) -> None:
        txn = self.open.pop(p, None)
        if not txn:
            return
        self.locks = {k: v for k, v in self.locks.items() if v != p}
        clock = self.tick(p, when)  # one ACK, the same uuid in every journal the transaction touched
        for journal in txn["journals"]:
            self.write_ack(p, when, journal, clock)
            self.last_ack[(journal, p)] = clock
        for collection, line in txn["docs"]:
            self.committed[collection].append(json.loads(line.data))

    # -- source changes --------------------------------------------------------------------------

    def order_journal(self, oid: int, category: str) -> str:
        if category == "Rockets":
            return ROCKETS
        if self.now < SPLIT:
            return ANVILS_LO
        return ANVILS_HI if hashlib.sha1(str(oid).encode()).digest()[0] >= 0x80 else ANVILS_LO

    def new_order(self, category: str | None = None) -> dict:
        rng = self.rng
        category = category or ("Anvils" if rng.random() < 0.7 else "Rockets")
        items: list[dict[str, Any]] = [
            {
                "sku": f"{category[:3].upper()}-{rng.randint(100, 999)}",
                "qty": rng.randint(1, 4),
                "price": round(rng.uniform(4, 240), 2),
            }
            for _ in range(rng.randint(1, 3))
        ]
        customer = rng.choice(sorted(self.customers)) if self.customers else "cus-0000"
        body = {
            "id": self.next_order,
            "category": category,
            "customer": customer,
            "total": round(sum(i["qty"] * i["price"] for i in items), 2),
            "items": items,
            "shipping": {
                "method": rng.choice(["ground", "air", "freight"]),
                "address": {"city": rng.choice(["Tucson", "Flagstaff", "Yuma", "Mesa"]), "country": "US"},
            },
            "status": "placed",
        }
        self.next_order += 1
        return body

    def free(self, collection: str, key: object) -> bool:
        """Not in another producer's open transaction (one key is never in flight twice)."""
        return self.locks.get((collection, key), self.actor) == self.actor

    def order_change(
        self, apply: bool = True, category: str | None = None, delete: bool = False
    ) -> tuple[str, dict, str, dict | None]:
        """(journal, body, op, before) of the next orders change; `apply=False` leaves the state alone."""
        rng = self.rng
        live = sorted(
            o
            for o in self.orders
            if (category is None or self.orders[o]["category"] == category) and self.free(ORDERS, o)
        )
        roll = 0.45 if delete and live else rng.random()
        if not live or roll < 0.42:
            body = self.new_order(category)
            if apply:
                self.orders[body["id"]] = body
            return self.order_journal(body["id"], body["category"]), body, "c", None
        open_orders = [o for o in live if self.orders[o]["status"] != STATUSES[-1]]
        oid = rng.choice(open_orders if open_orders and rng.random() < 0.8 else live)
        old = self.orders[oid]
        journal = self.order_journal(oid, old["category"])
        if roll < 0.52 and (len(self.orders) > 6 or delete) and apply:
            del self.orders[oid]
            return journal, {"id": oid}, "d", None
        body = copy.deepcopy(old)
        if body["status"] != STATUSES[-1] and rng.random() < 0.75:
            body["status"] = STATUSES[STATUSES.index(body["status"]) + 1]
        else:
            body["items"].append(
                {
                    "sku": f"{old['category'][:3].upper()}-{rng.randint(100, 999)}",
                    "qty": 1,
                    "price": round(rng.uniform(4, 240), 2),
                }
            )
            body["total"] = round(sum(i["qty"] * i["price"] for i in body["items"]), 2)
            body["shipping"]["method"] = rng.choice(["ground", "air", "freight"])
        if apply:
            self.orders[oid] = body
        return journal, body, "u", (copy.deepcopy(old) if rng.random() < 0.4 else None)

    def customer_change(self, apply: bool = True, delete: bool = False) -> tuple[str, dict, str, dict | None]:
        rng = self.rng
        live = sorted(c for c in self.customers if self.free(CUSTOMERS, c))
        roll = 0.33 if delete and len(live) > 2 else rng.random()
        if len(live) < 3 or roll < 0.3:
            name = f"{rng.choice(['Ada', 'Brook', 'Cyd', 'Dana', 'Eli', 'Fern', 'Gus'])} {rng.choice(['Smith', 'Okafor', 'Ng', 'Diaz'])}"
            cid = f"cus-{self.next_customer:04d}"
            self.next_customer += 1
            body = {
                "id": cid,
                "name": name,
                "email": f"{name.split()[0].lower()}{rng.randint(1, 99)}@example.com",
                "tier": "basic",
            }
            if apply:
                self.customers[cid] = body
            return CUSTOMERS_J, body, "c", None
        cid = rng.choice(live)
        old = self.customers[cid]
        if roll < 0.37 and (len(live) > 5 or delete) and apply:
            del self.customers[cid]
            return CUSTOMERS_J, {"id": cid}, "d", None
        body = dict(old)
        if rng.random() < 0.7:
            body["tier"] = rng.choice([t for t in ("basic", "plus", "premium") if t != old["tier"]])
        else:
            body["email"] = f"{old['name'].split()[0].lower()}{rng.randint(100, 999)}@example.org"
        if apply:
            self.customers[cid] = body
        return CUSTOMERS_J, body, "u", (dict(old) if rng.random() < 0.4 else None)

    def change(self) -> tuple[str, dict, str, dict | None]:
        return self.order_change() if self.rng.random() < 0.68 else self.customer_change()

    # -- scripted messiness ----------------------------------------------------------------------

    def rollback(self, p: int, when: dt.datetime) -> None:
        """Producer p writes a transaction, then (after a crash) an ACK with a lower clock."""
        self.commit(p, when)
        self.actor = p
        ack_clock = self.tick(p, when)  # above every earlier clock of p ...
        first = ack_clock + 16 * self.rng.randint(2, 40)  # ... below the documents it rolls back
        changes = [self.customer_change(apply=False), self.order_change(apply=False, category="Rockets")]
        docs = []
        for i, (journal, body, op, before) in enumerate(changes):
            when_i = when + dt.timedelta(milliseconds=40 * i)
            clock = self.tick(p, when_i, at_least=first)
            docs.append(
                (
                    journal,
                    self.write_doc(p, when_i, journal, body, op, FLAG_CONTINUE_TXN, before, clock=clock),
                )
            )
        later = when + dt.timedelta(seconds=self.rng.randint(20, 50))
        for journal, line in docs:
            self.write_ack(p, later, journal, ack_clock)
            self.last_ack[(journal, p)] = ack_clock
            self.excluded["rolled_back"].append(
                {"collection": COLLECTION_OF[journal], "journal": journal, "doc": json.loads(line.data)}
            )

    def redeliver(self, journal: str, flags: int, when: dt.datetime) -> bool:
        """Append again the line of an acknowledged document; False when there is none yet."""
        rolled = {e["doc"]["_meta"]["uuid"] for e in self.excluded["rolled_back"]}
        candidates = [
            line
            for line in self.lines[journal]
            if not line.ack
            and line.flags == flags
            and line.producer is not None
            and line.producer not in self.open
            and line.clock <= self.last_ack.get((journal, line.producer), -1)
            and json.loads(line.data)["_meta"]["uuid"] not in rolled
        ]
        if not candidates:
            return False
        line = self.rng.choice(candidates)
        self.append(journal, _Line(line.data, when, line.producer, line.clock, line.flags))
        self.excluded["redelivered"].append(
            {"collection": COLLECTION_OF[journal], "journal": journal, "doc": json.loads(line.data)}
        )
        return True

    def pending_tail(self, p: int, when: dt.datetime) -> None:
        self.actor = p
        for i in range(2):
            change = self.order_change(category="Rockets")
            journal, body, op, before = change
            line = self.write_doc(
                p, when + dt.timedelta(seconds=3 * i), journal, body, op, FLAG_CONTINUE_TXN, before
            )
            self.excluded["pending"].append(
                {"collection": ORDERS, "journal": journal, "doc": json.loads(line.data)}
            )


def _simulate(rng: random.Random) -> _Flow:
    flow = _Flow(rng)
    when = START + dt.timedelta(seconds=rng.randint(5, 60))
    # The first customers exist before any order refers to them.
    flow.actor = 1
    for _ in range(3):
        flow.outside_txn(1, when, flow.customer_change())
        when += dt.timedelta(seconds=rng.randint(2, 20))
    flow.actor = 0
    for i in range(3):  # the first orders: Anvils, Anvils, Rockets in one transaction
        flow.in_txn(
            0,
            when + dt.timedelta(milliseconds=30 * i),
            flow.order_change(category="Rockets" if i == 2 else "Anvils"),
        )
    flow.commit(0, when + dt.timedelta(milliseconds=200))
    when += dt.timedelta(seconds=rng.randint(60, 200))
    todo = {
        "rollback": START + dt.timedelta(hours=2, minutes=15),
        "redeliver_txn": START + dt.timedelta(hours=1, minutes=40),
        "redeliver_outside": START + dt.timedelta(hours=3, minutes=30),
        "deletes": START + dt.timedelta(hours=3),
    }
    while when < END:
        flow.now = when
        p = flow.actor = rng.randrange(2)
        if "rollback" in todo and when >= todo["rollback"]:
            flow.rollback(1, when)
            del todo["rollback"]
        elif (
            "redeliver_txn" in todo
            and when >= todo["redeliver_txn"]
            and flow.redeliver(ANVILS_LO, FLAG_CONTINUE_TXN, when)
        ):
            del todo["redeliver_txn"]
        elif (
            "redeliver_outside" in todo
            and when >= todo["redeliver_outside"]
            and flow.redeliver(CUSTOMERS_J, FLAG_OUTSIDE_TXN, when)
        ):
            del todo["redeliver_outside"]
        elif "deletes" in todo and when >= todo["deletes"]:  # at least one delete in each collection
            flow.commit(p, when)  # never a 0x0 document while the producer has a transaction open
            for collection, change in ((ORDERS, flow.order_change), (CUSTOMERS, flow.customer_change)):
                if not any(d["_meta"]["op"] == "d" for d in flow.committed[collection]):
                    flow.outside_txn(p, when, change(delete=True))
            del todo["deletes"]
        elif p in flow.open:
            if len(flow.open[p]["docs"]) < 4 and rng.random() < 0.45:
                flow.in_txn(p, when, flow.change())
            else:
                flow.commit(p, when)
        elif rng.random() < 0.25:
            flow.outside_txn(p, when, flow.change())
        else:
            for i in range(rng.randint(1, 2)):
                flow.in_txn(p, when + dt.timedelta(milliseconds=25 * i), flow.change())
        when += dt.timedelta(seconds=rng.randint(90, 330))
    flow.now = when
    for p in sorted(flow.open):
        flow.commit(p, when)
    if "redeliver_txn" in todo and flow.redeliver(ANVILS_LO, FLAG_CONTINUE_TXN, when):
        del todo["redeliver_txn"]
    if "redeliver_outside" in todo and flow.redeliver(CUSTOMERS_J, FLAG_OUTSIDE_TXN, when):
        del todo["redeliver_outside"]
    assert not todo, f"scripted messiness not placed: {sorted(todo)}"
    flow.pending_tail(0, when + dt.timedelta(seconds=30))
    return flow


def _split(lines: list[_Line], rng: random.Random, sizes: tuple[int, int]) -> list[tuple[int, int]]:
    """Line index ranges of the fragments a broker would have persisted, in order."""
    out: list[tuple[int, int]] = []
    first, target = 0, rng.randint(*sizes)
    for i in range(1, len(lines)):
        new_hour = lines[i].when.hour != lines[i - 1].when.hour
        if i - first >= target or (new_hour and i - first >= 2 and rng.random() < 0.6):
            out.append((first, i))
            first, target = i, rng.randint(*sizes)
    out.append((first, len(lines)))
    return out


def _fragments(flow: _Flow, rng: random.Random) -> tuple[list[_Fragment], list[_Fragment]]:
    """(fragments, copies): every fragment with its own content, and same-name copies."""
    fragments: list[_Fragment] = []
    copies: list[_Fragment] = []
    for journal, lines in flow.lines.items():
        spans = _split(lines, rng, (2, 5) if journal == ANVILS_LO else (3, 9))
        if journal != ANVILS_LO:
            fragments += [_Fragment(journal, a, b) for a, b in spans]
            continue
        if len(spans) < 5:
            spans = _split(lines, rng, (2, 2))
        assert len(spans) >= 5 and all(b - a >= 2 for a, b in spans[:-1]), (
            "journal too short for the overlaps"
        )
        # Partial overlap: the fragment after spans[1] begins inside spans[1] instead of at its end.
        a1, b1 = spans[1]
        _a2, b2 = spans[2]
        spans[2] = (rng.randint(a1 + 1, b1 - 1), b2)
        own = [_Fragment(journal, a, b) for a, b in spans]
        # Contained: a shorter fragment with the same begin as spans[3] (as after a broker restart).
        a3, b3 = spans[3]
        own.insert(4, _Fragment(journal, a3, rng.randint(a3 + 1, b3 - 1)))
        fragments += own
        # The same fragment persisted twice: a copy of spans[0] under the next utc_hour.
        copies.append(_Fragment(journal, *spans[0], hour_shift=1))
    return fragments, copies


def _assign_codecs(fragments: list[_Fragment], copies: list[_Fragment], rng: random.Random) -> None:
    order = list(range(len(fragments)))
    rng.shuffle(order)
    multi = [i for i in order if fragments[i].last - fragments[i].first >= 2]
    required = {multi[0]: "gz2"}
    for codec in ("zst", "sz", "raw", "gzod"):
        required[next(i for i in order if i not in required)] = codec
    for i, fragment in enumerate(fragments):
        if i in required:
            fragment.codec = required[i]
        else:
            codec = rng.choices(["gz", "zst", "sz", "raw", "gzod"], weights=[45, 20, 15, 12, 8])[0]
            if codec == "gz" and fragment.last - fragment.first >= 2 and rng.random() < 0.3:
                codec = "gz2"
            fragment.codec = codec
    for c in copies:
        c.codec = next(
            f.codec for f in fragments if (f.journal, f.first, f.last) == (c.journal, c.first, c.last)
        )


def _encode(codec: str, lines: list[bytes]) -> bytes:
    data = b"".join(lines)
    if codec == "raw":
        return data
    if codec in ("gz", "gzod"):
        return gzip.compress(data, mtime=0)
    if codec == "gz2":  # two members, split on a line boundary
        cut = len(lines) // 2
        return gzip.compress(b"".join(lines[:cut]), mtime=0) + gzip.compress(b"".join(lines[cut:]), mtime=0)
    if codec == "zst":
        return bytes(cramjam.zstd.compress(data))
    if codec == "sz":
        return bytes(cramjam.snappy.compress(data))  # snappy framing format
    raise InvalidValue(codec)


def write_flow_landing(landing_dir: Path, *, seed: int = 5) -> FlowSample:
    landing_dir = Path(landing_dir)
    rng = random.Random(seed)
    flow = _simulate(rng)
    fragments, copies = _fragments(flow, rng)
    _assign_codecs(fragments, copies, rng)

    offsets: dict[str, list[int]] = {}
    for journal, lines in flow.lines.items():
        acc = [0]
        for line in lines:
            acc.append(acc[-1] + len(line.data))
        offsets[journal] = acc

    files: list[Path] = []
    for fragment in fragments + copies:
        lines = flow.lines[fragment.journal]
        chunk = [line.data for line in lines[fragment.first : fragment.last]]
        content = b"".join(chunk)
        begin, end = offsets[fragment.journal][fragment.first], offsets[fragment.journal][fragment.last]
        assert end - begin == len(content)
        appended = lines[fragment.first].when + dt.timedelta(
            seconds=rng.randint(0, 3), hours=fragment.hour_shift
        )
        name = f"{begin:016x}-{end:016x}-{hashlib.sha1(content).hexdigest()}{EXTENSION[fragment.codec]}"
        folder = landing_dir / fragment.journal / f"utc_date={appended:%Y-%m-%d}" / f"utc_hour={appended:%H}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_bytes(_encode(fragment.codec, chunk))
        files.append(path)

    return FlowSample(
        landing_dir=landing_dir,
        collections={c: list(k) for c, k in KEYS.items()},
        files=files,
        committed=flow.committed,
        journals={c: list(js) for c, js in JOURNALS.items()},
        excluded=flow.excluded,
    )
