"""The catalog stores: one suite run against ParquetCatalogStore (local lake) and
DynamoCatalogStore (moto server), plus Parquet-only checks of what a query reads."""

from __future__ import annotations

import hashlib
import itertools
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lake_assets.catalog.dynamodb_store import DynamoCatalogStore
from lake_assets.catalog.metadata import build_records, build_retirements
from lake_assets.catalog.parquet_store import ParquetCatalogStore
from lake_assets.config import S3Config
from lake_assets.epoch import DAY_MS
from lake_assets.errors import DamagedLakeFile
from lake_assets.storage import PARTIAL_SUFFIX, Storage

HOUR_MS = 3_600_000
_clock = itertools.count(1_700_000_000_000, 1000)


def make_file(
    start: int,
    end: int | None,
    *,
    what: str = "accounts",
    where: str = "unit",
    work_id: str | None = None,
    create_time: int | None = None,
    file_id: str | None = None,
    url: str | None = None,
    path: str | None = None,
) -> list[dict]:
    """The records of one file, built by hand: one per time bucket of its span."""
    file_id = file_id or uuid.uuid4().hex
    metadata = {
        "version": 0,
        "start": start,
        "end": end,
        "path": path or f"/data/{what}/{file_id}.parquet",
        "work_id": work_id,
        "where": where,
        "what": what,
        "id": file_id,
        "hash": hashlib.blake2b(file_id.encode(), digest_size=16).hexdigest(),
    }
    work_key = f"{work_id}:{what}" if work_id is not None else f"null{uuid.uuid4().hex}:{what}"
    last = end if end is not None else start
    created = create_time if create_time is not None else next(_clock)
    return [
        {
            "version": 0,
            "url": url or f"file:///lake/changes/{where}/{what}/part-{file_id}.parquet",
            "time_index_key": f"{bucket}:{what}",
            "work_id_index_key": work_key,
            "range_key": f"{where}:{file_id}",
            "create_time": created,
            "size": 1234,
            "metadata": dict(metadata),
        }
        for bucket in range(start // DAY_MS, last // DAY_MS + 1)
    ]


def ids(records: list[dict]) -> list[str]:
    return [r["metadata"]["id"] for r in records]


def day(n: int) -> tuple[int, int]:
    return n * DAY_MS, (n + 1) * DAY_MS - 1


@pytest.fixture(params=["parquet", "dynamo"])
def store(request, tmp_path):
    if request.param == "parquet":
        yield ParquetCatalogStore(f"file://{tmp_path}/lake/catalog", Storage())
    else:
        server = request.getfixturevalue("moto_server")
        token = uuid.uuid4().hex[:12]
        dynamo = DynamoCatalogStore(
            f"records-{token}", f"latest-{token}", endpoint_url=server.url, page_size=40
        )
        dynamo.create_tables()
        yield dynamo
        for name in (dynamo.table, dynamo.latest_table):
            dynamo.client.delete_table(TableName=name)


# --------------------------------------------------------------------------------------------
# both stores


def test_put_and_query_by_time_for_a_what_and_a_where(store):
    base = 19723 * DAY_MS
    a = make_file(base + HOUR_MS, base + 2 * HOUR_MS, where="unit")
    b = make_file(base + 3 * HOUR_MS, base + 4 * HOUR_MS, where="other", work_id="run-abc")
    c = make_file(base + 5 * HOUR_MS, base + 6 * HOUR_MS, what="contacts", where="unit")
    store.put(a + b + c)

    found = store.query_by_time(*day(19723), "accounts")
    assert found == [a[0], b[0]]  # whole records come back unchanged, ints not Decimals
    assert all(type(r["create_time"]) is int and type(r["metadata"]["start"]) is int for r in found)
    assert found[0]["metadata"]["work_id"] is None
    assert store.query_by_time(*day(19723), "accounts", "unit") == a
    assert store.query_by_time(*day(19723), "accounts", "other") == b
    assert store.query_by_time(*day(19723), "contacts") == c
    assert store.query_by_time(*day(19723), "contacts", "other") == []
    assert store.query_by_time(*day(19723), "leads") == []
    assert store.query_by_time(*day(19722), "accounts") == []


def test_a_file_spanning_three_days_is_found_from_each_and_returned_once(store):
    records = make_file(int(0.8 * DAY_MS), int(2.2 * DAY_MS))
    assert len(records) == 3 and len({r["range_key"] for r in records}) == 1
    store.put(records)

    for n in (0, 1, 2):
        found = store.query_by_time(*day(n), "accounts")
        assert ids(found) == ids(records[:1]), n
        assert found[0]["time_index_key"] == f"{n}:accounts"
    assert store.query_by_time(0, 3 * DAY_MS - 1, "accounts") == [records[0]]
    assert store.query_by_time(DAY_MS + 1, 2 * DAY_MS + 5, "accounts", "unit") == [records[1]]
    assert store.query_by_time(*day(3), "accounts") == []
    # inside the first and last day, outside the file's span
    assert store.query_by_time(0, int(0.8 * DAY_MS) - 1, "accounts") == []
    assert store.query_by_time(int(2.2 * DAY_MS) + 1, 3 * DAY_MS - 1, "accounts") == []


def test_a_day_query_returns_exactly_the_files_touching_the_day(store):
    d = 20_000
    lo, hi = day(d)
    ends_before = make_file(lo - 6 * HOUR_MS, lo - 1)  # the ms before the day starts
    ends_at_start = make_file(lo - 5 * HOUR_MS, lo)
    inside = make_file(lo + HOUR_MS, lo + 2 * HOUR_MS)
    across_end = make_file(hi - HOUR_MS, hi + HOUR_MS)
    starts_after = make_file(hi + 1, hi + HOUR_MS)
    snapshot = make_file(lo + 5 * HOUR_MS, None)
    old_snapshot = make_file(lo - 1, None)
    store.put(ends_before + ends_at_start + inside + across_end + starts_after + snapshot + old_snapshot)

    found = store.query_by_time(lo, hi, "accounts")
    assert ids(found) == ids([ends_at_start[0], inside[0], snapshot[0], across_end[0]])
    assert [r["time_index_key"] for r in found] == [f"{d}:accounts"] * 4

    # a snapshot counts only at its own instant
    instant = snapshot[0]["metadata"]["start"]
    assert ids(store.query_by_time(instant, instant, "accounts")) == ids(snapshot)
    assert ids(store.query_by_time(instant - 1, instant - 1, "accounts")) == []
    assert ids(store.query_by_time(instant + 1, instant + 1, "accounts")) == []
    assert ids(store.query_by_time(lo + 3 * HOUR_MS, lo + 4 * HOUR_MS, "accounts")) == []
    assert ids(store.query_by_time(lo - 1, lo - 1, "accounts")) == ids(
        [ends_before[0], ends_at_start[0], old_snapshot[0]]
    )


def test_query_by_work_id_with_and_without_where(store):
    a = make_file(DAY_MS - HOUR_MS, DAY_MS + HOUR_MS, where="unit", work_id="run-a")  # two buckets
    b = make_file(5 * DAY_MS, 5 * DAY_MS + 1, where="other", work_id="run-a")
    c = make_file(DAY_MS, DAY_MS + 1, where="unit", work_id="run-b")
    d = make_file(DAY_MS, DAY_MS + 1, what="contacts", where="unit", work_id="run-a")
    store.put(a + b + c + d)

    assert store.query_by_work_id("run-a", "accounts") == [a[0], b[0]]
    assert store.query_by_work_id("run-a", "accounts", "unit") == [a[0]]
    assert store.query_by_work_id("run-a", "accounts", "other") == [b[0]]
    assert store.query_by_work_id("run-a", "contacts") == d
    assert store.query_by_work_id("run-b", "accounts") == c
    assert store.query_by_work_id("run-b", "accounts", "other") == []
    assert store.query_by_work_id("run-c", "accounts") == []


def test_several_work_ids_in_one_query_find_what_each_query_finds(store):
    a = make_file(DAY_MS - HOUR_MS, DAY_MS + HOUR_MS, work_id="landing-1")  # two buckets
    b = make_file(DAY_MS + HOUR_MS, DAY_MS + 2 * HOUR_MS, work_id="landing-2")
    c = make_file(DAY_MS + HOUR_MS, DAY_MS + 2 * HOUR_MS, work_id="landing-2", where="other")
    store.put(a + b + c)
    # b moves to another work id: the old one must not find it, in one query or many
    moved = make_file(
        DAY_MS + HOUR_MS, DAY_MS + 2 * HOUR_MS, work_id="landing-3", file_id=b[0]["metadata"]["id"]
    )
    store.put(moved)

    ids = ["landing-1", "landing-2", "landing-3", "landing-4"]
    for where in (None, "unit"):
        together = store.query_by_work_ids(ids, "accounts", where)
        assert together == {w: store.query_by_work_id(w, "accounts", where) for w in ids}
    assert store.query_by_work_ids(ids, "accounts", "unit") == {
        "landing-1": [a[0]],
        "landing-2": [],
        "landing-3": [moved[0]],
        "landing-4": [],
    }
    with pytest.raises(ValueError):
        store.query_by_work_ids(["landing-1", "bad:id"], "accounts")


def test_files_without_a_work_id_are_not_found_by_work_id(store):
    nulls = make_file(DAY_MS, 2 * DAY_MS + 1)
    named = make_file(DAY_MS + 1, DAY_MS + 2, work_id="nullable-run")  # a real id that starts with "null"
    store.put(nulls + named)
    stand_in = nulls[0]["work_id_index_key"].split(":", 1)[0]
    assert stand_in.startswith("null") and len(stand_in) > 4

    assert store.query_by_work_id(stand_in, "accounts") == []
    assert store.query_by_work_id(stand_in, "accounts", "unit") == []
    assert store.query_by_work_id("null", "accounts") == []
    assert store.query_by_work_id("nullable-run", "accounts") == named
    assert ids(store.query_by_time(*day(1), "accounts")) == ids([nulls[0], named[0]])


def test_put_is_idempotent_and_a_later_record_replaces(store):
    a = make_file(DAY_MS, 3 * DAY_MS, work_id="run-a", create_time=1000)
    b = make_file(2 * DAY_MS, 2 * DAY_MS + 1, where="other", create_time=1000)
    store.put(a + b)

    def answers():
        return (
            store.query_by_time(0, 4 * DAY_MS, "accounts"),
            [store.query_by_time(*day(n), "accounts") for n in range(4)],
            store.query_by_work_id("run-a", "accounts"),
            store.latest("accounts", "unit"),
            store.latest("accounts", "other"),
        )

    first = answers()
    assert ids(first[0]) == ids([a[0], b[0]])
    store.put(a + b)
    store.put(list(reversed(a)))
    assert answers() == first

    # same keys, a later create_time: the new records win
    moved = [{**r, "url": "s3a://lake/moved.parquet", "create_time": 2000} for r in a]
    store.put(moved)
    assert store.query_by_time(0, 4 * DAY_MS, "accounts", "unit") == [moved[0]]
    assert [r["url"] for r in store.query_by_time(*day(3), "accounts")] == ["s3a://lake/moved.parquet"]
    assert store.query_by_work_id("run-a", "accounts") == [moved[0]]
    # an older copy put afterwards does not bring the old one back
    store.put(a)
    assert store.query_by_time(0, 4 * DAY_MS, "accounts", "unit") == [moved[0]]
    assert store.query_by_work_id("run-a", "accounts") == [moved[0]]


def test_a_record_put_again_with_another_work_id_moves(store):
    a = make_file(DAY_MS, DAY_MS + 1, work_id="run-a", create_time=1000)
    store.put(a)
    meta = {**a[0]["metadata"], "work_id": "run-b"}
    again = [{**a[0], "work_id_index_key": "run-b:accounts", "create_time": 2000, "metadata": meta}]
    store.put(again)
    assert store.query_by_work_id("run-a", "accounts") == []
    assert store.query_by_work_id("run-b", "accounts") == again
    assert store.query_by_time(*day(1), "accounts") == again


def test_latest(store):
    assert store.latest("accounts", "unit") is None
    early = make_file(DAY_MS, 3 * DAY_MS, create_time=5000)
    late = make_file(2 * DAY_MS, 2 * DAY_MS + 10, create_time=1000)
    elsewhere = make_file(9 * DAY_MS, 9 * DAY_MS, where="other")
    contacts = make_file(8 * DAY_MS, 8 * DAY_MS, what="contacts")
    store.put(early + late + elsewhere + contacts)

    assert store.latest("accounts", "unit")["range_key"] == late[0]["range_key"]
    assert store.latest("accounts", "unit") == late[0]
    assert store.latest("accounts", "other") == elsewhere[0]
    assert store.latest("contacts", "unit") == contacts[0]
    assert store.latest("contacts", "other") is None

    # an older file put later does not take over
    store.put(make_file(DAY_MS + 5, DAY_MS + 6))
    assert store.latest("accounts", "unit") == late[0]
    # same start: the greater create_time wins, whichever comes first
    tie_old = make_file(2 * DAY_MS, None, create_time=500)
    tie_new = make_file(2 * DAY_MS, None, create_time=1500)
    store.put(tie_new)
    store.put(tie_old)
    assert store.latest("accounts", "unit") == tie_new[0]
    store.put(tie_new)
    assert store.latest("accounts", "unit") == tie_new[0]
    # a later start wins whatever its create_time
    newest = make_file(4 * DAY_MS, 6 * DAY_MS, create_time=1)
    store.put(newest)
    assert store.latest("accounts", "unit") == newest[0]  # the record from its first bucket


def built_file(
    start: int, end: int | None, *, what: str = "accounts", where: str = "unit", work_id: str | None = None
) -> list[dict]:
    """The records of one file as `build_records` makes them (long spans in wider buckets)."""
    file_id = uuid.uuid4().hex
    metadata = {
        "version": 0,
        "start": start,
        "end": end,
        "path": f"/data/{what}/{file_id}.parquet",
        "work_id": work_id,
        "where": where,
        "what": what,
        "id": file_id,
        "hash": hashlib.blake2b(file_id.encode(), digest_size=16).hexdigest(),
    }
    return build_records(
        metadata, url=f"file:///lake/{what}/{file_id}.parquet", size=1, create_time=next(_clock)
    )


def test_files_spanning_more_than_thirty_days_are_found_from_every_day_they_span(store):
    first_year, last_year = (
        -62_135_596_799_000,
        253_402_300_799_999,
    )  # 0001-01-01T00:00:01, 9999-12-31T23:59:59.999
    d = 19_783  # 2024-03-01
    whole_calendar = built_file(first_year, last_year, work_id="run-a")
    to_the_end = built_file(d * DAY_MS, last_year)
    from_the_start = built_file(first_year, d * DAY_MS + HOUR_MS)
    six_weeks = built_file(d * DAY_MS + HOUR_MS, (d + 45) * DAY_MS, work_id="run-a")
    an_hour = make_file(d * DAY_MS + 2 * HOUR_MS, d * DAY_MS + 3 * HOUR_MS)
    beyond = built_file(
        10**15, 10**15 + DAY_MS
    )  # the year 33658: kept as given, indexed at the calendar's end
    before_the_epoch = built_file(-10 * DAY_MS, -DAY_MS + 5)
    files = [whole_calendar, to_the_end, from_the_start, six_weeks, an_hour, beyond, before_the_epoch]
    assert all(len(f) <= 30 for f in files) and len(six_weeks) == 2  # 19770+30, 19800+30
    store.put([r for f in files for r in f])

    def spans(f, n):
        meta = f[0]["metadata"]
        return meta["start"] <= day(n)[1] and day(n)[0] <= (
            meta["end"] if meta["end"] is not None else meta["start"]
        )

    for n in (
        first_year // DAY_MS,
        -5,
        -1,
        0,
        5_000,
        d - 1,
        d,
        d + 1,
        d + 30,
        d + 45,
        d + 46,
        1_000_000,
        last_year // DAY_MS,
    ):
        expected = sorted(
            (f[0] for f in files if spans(f, n)), key=lambda r: (r["metadata"]["start"], r["range_key"])
        )
        assert ids(store.query_by_time(*day(n), "accounts")) == ids(expected), n
    assert ids(store.query_by_time(*day(10**15 // DAY_MS), "accounts")) == ids(beyond)
    assert ids(store.query_by_time(10**15 + DAY_MS + 1, 10**15 + 2 * DAY_MS, "accounts")) == []
    assert ids(store.query_by_work_id("run-a", "accounts")) == ids([whole_calendar[0], six_weeks[0]])
    assert store.latest("accounts", "unit") == beyond[0]


def gone(records: list[dict], create_time: int | None = None) -> list[dict]:
    """The retirements of a file, built from one of its records as the pipeline builds them."""
    meta = records[0]["metadata"]
    return build_retirements(
        url=records[0]["url"],
        where=meta["where"],
        what=meta["what"],
        file_id=meta["id"],
        start=meta["start"],
        end=meta["end"],
        create_time=create_time or next(_clock),
    )


def test_retired_files_are_left_out_of_the_four_queries(store):
    two_days = make_file(DAY_MS - HOUR_MS, DAY_MS + HOUR_MS, work_id="run-a")
    kept = make_file(DAY_MS + 2 * HOUR_MS, DAY_MS + 3 * HOUR_MS, work_id="run-a")
    newest = make_file(DAY_MS + 4 * HOUR_MS, None, work_id="run-b")
    six_weeks = built_file(0, 42 * DAY_MS, work_id="run-a")
    elsewhere = make_file(DAY_MS + 5 * HOUR_MS, None, where="other", work_id="run-b")
    store.put(two_days + kept + newest + six_weeks + elsewhere)
    assert store.latest("accounts", "unit") == newest[0]

    store.retire(gone(two_days) + gone(newest) + gone(six_weeks))
    assert store.query_by_time(*day(0), "accounts") == []
    assert store.query_by_time(*day(1), "accounts") == [kept[0], elsewhere[0]]
    assert store.query_by_time(*day(30), "accounts") == []
    assert store.query_by_time(0, 50 * DAY_MS, "accounts", "unit") == [kept[0]]
    assert store.query_by_work_id("run-a", "accounts") == [kept[0]]
    assert store.query_by_work_ids(["run-a", "run-b"], "accounts") == {
        "run-a": [kept[0]],
        "run-b": [elsewhere[0]],
    }
    assert store.latest("accounts", "unit") == kept[0]  # the latest went: the next one takes its place
    assert store.latest("accounts", "other") == elsewhere[0]

    # retiring again, or a file never catalogued, changes nothing
    store.retire(gone(two_days) + gone(make_file(DAY_MS, DAY_MS + 1)))
    assert store.query_by_time(0, 50 * DAY_MS, "accounts", "unit") == [kept[0]]
    # a file catalogued again after it was retired is back
    again = [{**r, "create_time": next(_clock)} for r in newest]
    store.put(again)
    assert store.query_by_time(*day(1), "accounts", "unit") == [kept[0], again[0]]
    assert store.latest("accounts", "unit") == again[0]
    # and a retirement older than a record leaves the record alone
    store.retire(gone(kept, create_time=1))
    assert store.query_by_work_id("run-a", "accounts") == [kept[0]]

    store.retire(gone(kept) + gone(again))
    assert store.query_by_time(0, 50 * DAY_MS, "accounts", "unit") == []
    assert store.latest("accounts", "unit") is None
    assert store.latest("accounts", "other") == elsewhere[0]


def test_when_the_latest_file_is_retired_the_latest_remaining_one_is_found_however_far_back(store):
    old = make_file(100 * DAY_MS, 100 * DAY_MS + HOUR_MS)
    long_ago = built_file(-1000 * DAY_MS, 50 * DAY_MS)  # indexed in wider buckets
    latest = make_file(900 * DAY_MS, 900 * DAY_MS + HOUR_MS)
    store.put(long_ago + old + latest)
    store.retire(gone(latest))
    assert store.latest("accounts", "unit") == old[0]
    store.retire(gone(old))
    assert store.latest("accounts", "unit") == long_ago[0]


def test_a_retired_file_never_comes_back_as_latest(store):
    first, second, third = (make_file(n * DAY_MS, None) for n in (1, 2, 3))
    store.put(first)
    store.put(third)
    store.put(second)  # offered after a better one
    store.retire(gone(second))
    assert store.latest("accounts", "unit") == third[0]
    store.retire(gone(third))
    assert store.latest("accounts", "unit") == first[0]


def test_many_records(store):
    files = [
        make_file(
            10 * DAY_MS + i * 10 * 60_000,
            10 * DAY_MS + i * 10 * 60_000 + 30 * 60_000,
            where="unit" if i % 2 else "other",
            work_id="bulk-run",
        )
        for i in range(300)
    ]  # 300 files over about two days, some crossing midnight
    records = [r for f in files for r in f]
    assert len(records) > 300

    calls = []
    if isinstance(store, DynamoCatalogStore):
        store.client.meta.events.register("after-call.dynamodb.Query", lambda **kw: calls.append(1))
    store.put(records[:150])
    store.put(records[150:])

    everything = store.query_by_time(0, 20 * DAY_MS, "accounts")
    assert ids(everything) == [f[0]["metadata"]["id"] for f in files]
    assert len(store.query_by_time(0, 20 * DAY_MS, "accounts", "unit")) == 150
    assert len(store.query_by_work_id("bulk-run", "accounts")) == 300
    assert ids(store.query_by_work_id("bulk-run", "accounts", "other")) == [
        f[0]["metadata"]["id"] for f in files[::2]
    ]
    assert store.latest("accounts", "unit") == files[299][0]
    assert store.latest("accounts", "other") == files[298][0]
    if isinstance(store, DynamoCatalogStore):
        # more pages than queries: pagination was followed
        assert len(calls) > 21 + 21 + 2


def test_bad_input_is_refused(store):
    good = make_file(DAY_MS, DAY_MS + 1)[0]
    with pytest.raises(ValueError):
        store.put([{**good, "time_index_key": "7:accounts"}])  # bucket outside the span
    with pytest.raises(ValueError):
        store.put([{**good, "range_key": "elsewhere:" + good["metadata"]["id"]}])
    with pytest.raises(ValueError):
        store.put([{**good, "work_id_index_key": "run-x:accounts"}])  # work_id is null
    with pytest.raises(ValueError):
        store.put([{k: v for k, v in good.items() if k != "url"}])
    with pytest.raises(ValueError):
        store.query_by_time(10, 5, "accounts")
    with pytest.raises(ValueError):
        store.query_by_time(0, 10, "../accounts")
    with pytest.raises(ValueError):
        store.query_by_work_id("run:a", "accounts")
    assert store.query_by_time(0, 10 * DAY_MS, "accounts") == []


# --------------------------------------------------------------------------------------------
# Parquet only


class SpyStorage(Storage):
    def __init__(self, s3: S3Config | None = None):
        super().__init__(s3)
        self.listed: list[str] = []
        self.read: list[str] = []

    def list(self, uri):
        self.listed.append(uri)
        return super().list(uri)

    def read_bytes(self, uri):
        self.read.append(uri)
        return super().read_bytes(uri)

    def open_input_file(self, uri):
        self.read.append(uri)
        return super().open_input_file(uri)


def test_parquet_time_query_reads_only_the_bucket_folders_it_needs(tmp_path):
    root = f"file://{tmp_path}/catalog"
    spy = SpyStorage()
    store = ParquetCatalogStore(root, spy)
    for n in range(10):
        store.put(make_file(n * DAY_MS + HOUR_MS, n * DAY_MS + 2 * HOUR_MS, work_id="run-a"))
        store.put(make_file(n * DAY_MS + HOUR_MS, n * DAY_MS + 2 * HOUR_MS, what="contacts"))
    spy.listed.clear()
    spy.read.clear()

    found = store.query_by_time(3 * DAY_MS, 4 * DAY_MS + HOUR_MS + 5, "accounts")
    assert len(found) == 2
    days = (f"{root}/time_bucket=3/accounts", f"{root}/time_bucket=4/accounts")
    wider = tuple(
        f"{root}/time_bucket=0+{width}/accounts" for width in (30, 900, 27000, 810000)
    )  # files over 30 days
    wanted = days + wider
    assert sorted(spy.listed) == sorted(wanted)
    assert spy.read and all(uri.rsplit("/", 1)[0] in wanted for uri in spy.read)

    # a work-id query reads its own folder and the time folders of its hits, nothing else
    spy.listed.clear()
    spy.read.clear()
    assert len(store.query_by_work_id("run-a", "accounts")) == 10
    assert spy.listed[0] == f"{root}/work_id=run-a+3aaccounts"
    assert sorted(spy.listed[1:]) == sorted(f"{root}/time_bucket={n}/accounts" for n in range(10))
    assert f"{root}" not in spy.listed


def test_parquet_files_are_plain_tables_with_flat_metadata_columns(tmp_path):
    import pyarrow.parquet as pq

    store = ParquetCatalogStore(f"file://{tmp_path}/catalog/", Storage())
    records = make_file(DAY_MS, DAY_MS + 5, where="unit", work_id="run-a")
    store.put(records)
    parts = list((tmp_path / "catalog" / "time_bucket=1" / "accounts").glob("part-*.parquet"))
    assert len(parts) == 1
    rows = pq.read_table(parts[0]).to_pylist()
    meta = records[0]["metadata"]
    assert rows[0]["meta_start"] == meta["start"] and rows[0]["meta_end"] == meta["end"]
    assert (rows[0]["meta_where"], rows[0]["meta_what"], rows[0]["meta_work_id"]) == (
        "unit",
        "accounts",
        "run-a",
    )
    assert (rows[0]["meta_id"], rows[0]["meta_hash"], rows[0]["meta_path"]) == (
        meta["id"],
        meta["hash"],
        meta["path"],
    )
    assert not list(tmp_path.rglob(f"*{PARTIAL_SUFFIX}"))  # parts are written aside and renamed
    # the latest folder keeps one part once a newer file beats the older
    store.put(make_file(2 * DAY_MS, 2 * DAY_MS + 5))
    store.put(make_file(3 * DAY_MS, 3 * DAY_MS + 5))
    latest_parts = list((tmp_path / "catalog").glob("latest=*/part-*.parquet"))
    assert len(latest_parts) == 1


def test_parquet_store_on_s3(moto_server, s3_bucket):
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    store = ParquetCatalogStore(f"s3a://{s3_bucket}/lake/catalog", storage)
    a = make_file(int(0.5 * DAY_MS), int(1.5 * DAY_MS), work_id="run-a")
    b = make_file(DAY_MS, DAY_MS, where="other")
    store.put(a + b)
    assert store.query_by_time(*day(1), "accounts") == [a[1], b[0]]
    assert store.query_by_time(*day(0), "accounts") == [a[0]]
    assert store.query_by_work_id("run-a", "accounts") == [a[0]]
    assert store.latest("accounts", "other") == b[0]
    keys = [o["Key"] for o in moto_server.client("s3").list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert any(k.startswith("lake/catalog/time_bucket=1/accounts/part-") for k in keys)


def test_parquet_retirements_are_rows_an_engine_can_leave_out(tmp_path):
    import duckdb

    store = ParquetCatalogStore(f"file://{tmp_path}/catalog", Storage())
    kept, retired = make_file(DAY_MS, DAY_MS + 5), make_file(DAY_MS + 10, DAY_MS + 20)
    store.put(kept + retired)
    store.retire(gone(retired))
    live = duckdb.sql(f"""
        SELECT meta_id FROM read_parquet('{tmp_path}/catalog/time_bucket=*/accounts/*.parquet', union_by_name = true)
        QUALIFY row_number() OVER (PARTITION BY time_index_key, range_key ORDER BY create_time DESC) = 1
            AND deleted IS NOT TRUE
    """).fetchall()
    assert live == [(kept[0]["metadata"]["id"],)]
    assert store.latest("accounts", "unit") == kept[0]


def _answers(store: ParquetCatalogStore, work_ids: list[str]) -> tuple:
    return (
        store.query_by_time(0, 40 * DAY_MS, "accounts"),
        store.query_by_work_ids(work_ids, "accounts"),
        store.query_by_work_ids(work_ids, "accounts", "other"),
        store.latest("accounts", "unit"),
        store.latest("accounts", "other"),
    )


def _part_counts(root) -> list[int]:
    return [len(list(folder.glob("part-*.parquet"))) for folder in root.rglob("*") if folder.is_dir()]


def test_parquet_folders_merge_their_parts_and_every_query_answers_as_before(tmp_path):
    """Hourly runs add a few parts to a day's folder each; the folder is merged before reads get
    long, and no query can tell (re-puts, retirements, files catalogued again)."""
    merging = ParquetCatalogStore(f"file://{tmp_path}/merged", Storage())
    merging.merge_parts_at = 4
    unmerged = ParquetCatalogStore(f"file://{tmp_path}/plain", Storage())
    unmerged.merge_parts_at = 10**9
    work_ids = [f"run-{n % 3}" for n in range(3)]
    files = []
    for n in range(30):
        where = "other" if n % 4 == 0 else "unit"
        step: list[tuple[str, list[dict]]] = [
            (
                "put",
                make_file(DAY_MS + n * 60_000, DAY_MS + n * 60_000 + 5, where=where, work_id=f"run-{n % 3}"),
            )
        ]
        files.append(step[0][1])
        if n % 5 == 4:
            step.append(("retire", gone(files[n - 3])))
        if n % 7 == 6:  # a file catalogued again, with a later record
            step.append(("put", [{**r, "create_time": next(_clock)} for r in files[n - 5]]))
        for kind, records in step:
            for store in (merging, unmerged):
                getattr(store, kind)(records)
        assert _answers(merging, work_ids) == _answers(unmerged, work_ids)
    assert max(_part_counts(tmp_path / "merged")) < 4
    assert max(_part_counts(tmp_path / "plain")) > 20
    assert list((tmp_path / "merged").rglob("part-*~merged-*.parquet"))


def test_a_merge_killed_before_it_removed_the_merged_parts_changes_no_answer(tmp_path, monkeypatch):
    root = f"file://{tmp_path}/catalog"
    store = ParquetCatalogStore(root, Storage())
    store.merge_parts_at = 3
    store.put(make_file(DAY_MS, DAY_MS + 5, work_id="run-a"))
    first = make_file(DAY_MS + 10, DAY_MS + 15, work_id="run-a")
    store.put(first)
    expected = store.query_by_time(*day(1), "accounts")

    class Killed(Exception):
        pass

    def killed(uri):
        raise Killed(uri)

    monkeypatch.setattr(store.storage, "delete_file", killed)
    third = make_file(DAY_MS + 20, DAY_MS + 25, work_id="run-a")
    with pytest.raises(Killed):
        store.put(third)  # the merged part is written, no part it merged is removed
    folder = tmp_path / "catalog" / "time_bucket=1" / "accounts"
    assert len(list(folder.glob("part-*"))) == 4
    monkeypatch.undo()

    fresh = ParquetCatalogStore(root, Storage())
    assert fresh.query_by_time(*day(1), "accounts") == [*expected, third[0]]
    fresh.put(third)  # the killed run's put again: its work-id part had not been written
    assert fresh.query_by_work_id("run-a", "accounts") == [*expected, third[0]]
    fresh.merge_parts_at = 3
    fourth = make_file(DAY_MS + 30, DAY_MS + 35, work_id="run-a")
    fresh.put(fourth)
    assert len(list(folder.glob("part-*"))) == 1
    assert fresh.query_by_time(*day(1), "accounts") == [*expected, third[0], fourth[0]]


class MergingMeanwhile(Storage):
    """Storage whose first read of a part lets another process merge the part's folder first."""

    def __init__(self, other: ParquetCatalogStore, s3: S3Config | None):
        super().__init__(s3)
        self.other = other
        self.raced: list[str] = []

    def read_bytes(self, uri):
        if "/part-" in uri and not self.raced:
            self.raced.append(uri)
            self.other.merge_parts_at = 1
            self.other._merge_parts(uri.rsplit("/", 1)[0])
        return super().read_bytes(uri)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_folder_merged_while_a_query_reads_it_is_read_again(where, tmp_path, request):
    if where == "s3":
        s3 = S3Config(endpoint_url=request.getfixturevalue("moto_server").url)
        root = f"s3a://{request.getfixturevalue('s3_bucket')}/lake/catalog"
    else:
        s3, root = None, f"file://{tmp_path}/catalog"
    writer = ParquetCatalogStore(root, Storage(s3))
    files = [make_file(DAY_MS + n, DAY_MS + n + 1, work_id="run-a") for n in range(5)]
    for records in files:
        writer.put(records)
    racing = MergingMeanwhile(ParquetCatalogStore(root, Storage(s3)), s3)
    reader = ParquetCatalogStore(root, racing)
    assert reader.query_by_time(*day(1), "accounts") == [f[0] for f in files]
    assert racing.raced  # the part it listed first was gone when it read it
    assert len(writer.storage.list(f"{root}/time_bucket=1/accounts")) == 1


class LateWriterDuringMerge(Storage):
    """Storage on which, just before a merge writes its merged part, another process's part lands
    with an older token (taken before, written late) and that process merges the folder too."""

    def __init__(self, late):
        super().__init__()
        self.late = late
        self.happened = False

    def write_bytes(self, uri, data):
        if "~merged" in uri and not self.happened:
            self.happened = True
            self.late()
        super().write_bytes(uri, data)


def test_two_processes_merging_one_folder_from_different_listings_lose_no_row(tmp_path):
    root = f"file://{tmp_path}/catalog"
    folder = f"{root}/time_bucket=1/accounts"
    late_file = make_file(DAY_MS + 50, DAY_MS + 60)

    def other_process():
        other = ParquetCatalogStore(root, Storage())
        other.merge_parts_at = 3
        other._write_part(folder, late_file, "00000000000000000001-" + "0" * 16)
        other._merge_parts(folder)

    store = ParquetCatalogStore(root, LateWriterDuringMerge(other_process))
    files = [make_file(DAY_MS + n, DAY_MS + n + 1) for n in range(3)]
    store.put(files[0])
    store.put(files[1])
    store.merge_parts_at = 3
    store.put(files[2])  # its part makes three: it merges, and the other process lands meanwhile
    assert store.storage.happened
    found = ParquetCatalogStore(root, Storage()).query_by_time(*day(1), "accounts")
    assert sorted(ids(found)) == sorted(ids([f[0] for f in [*files, late_file]]))


def test_a_put_into_a_folder_with_a_damaged_part_is_whole_and_the_query_names_the_part(tmp_path):
    root = f"file://{tmp_path}/catalog"
    store = ParquetCatalogStore(root, Storage())
    store.merge_parts_at = 2
    folder = tmp_path / "catalog" / "time_bucket=1" / "accounts"
    folder.mkdir(parents=True)
    (folder / "part-00000000000000000001-damaged.parquet").write_bytes(b"not parquet")
    records = make_file(DAY_MS, DAY_MS + 5, work_id="run-a")
    store.put(records)  # the merge cannot read the damaged part: it leaves the folder alone
    assert len(list(folder.glob("part-*"))) == 2
    assert store.latest("accounts", "unit") == records[0]
    assert (tmp_path / "catalog" / "work_id=run-a+3aaccounts").is_dir()
    with pytest.raises(DamagedLakeFile, match=r"damaged\.parquet"):
        store.query_by_time(*day(1), "accounts")


def test_a_part_that_is_listed_but_cannot_be_read_is_an_error_not_a_merge(tmp_path):
    root = f"file://{tmp_path}/catalog"
    store = ParquetCatalogStore(root, Storage())
    store.put(make_file(DAY_MS, DAY_MS + 5))
    folder = tmp_path / "catalog" / "time_bucket=1" / "accounts"
    (folder / "part-99999999999999999999-link.parquet").symlink_to(tmp_path / "nowhere.parquet")
    with pytest.raises(FileNotFoundError):
        store.query_by_time(*day(1), "accounts")


#: one step of a catalog's life: a new file (day, minute, where, work id), the file at that index
#: catalogued again (a later record, maybe another work id), or retired; `killed` makes the merge
#: this step sets off stop after its merged part is written, before it removes a part
_steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("new"),
            st.integers(0, 2),
            st.integers(0, 60),
            st.sampled_from(["unit", "other"]),
            st.sampled_from(["run-a", "run-b", None]),
        ),
        st.tuples(st.just("again"), st.integers(0, 40), st.sampled_from(["run-a", "run-c"])),
        st.tuples(st.just("retire"), st.integers(0, 40)),
        st.tuples(st.just("killed")),
    ),
    min_size=1,
    max_size=30,
)


class KilledMidMerge(Exception):
    pass


class StorageKilledOnce(Storage):
    """Storage whose next removal of a merged part's source kills the process (an exception)."""

    armed = False

    def delete_file(self, uri):
        if self.armed and "/time_bucket=" in uri:
            self.armed = False
            raise KilledMidMerge(uri)
        super().delete_file(uri)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_steps)
def test_merged_and_unmerged_catalogs_answer_alike_whatever_happens(steps, tmp_path_factory):
    """Property: a catalog merging its folders at two parts and one never merging answer every
    query alike after every step, through re-puts, retirements and merges killed midway (the
    killed put is made again, as the run that made it would)."""
    base = tmp_path_factory.mktemp("catalogs")
    killing = StorageKilledOnce()
    merging = ParquetCatalogStore(f"file://{base}/merged", killing)
    merging.merge_parts_at = 2
    unmerged = ParquetCatalogStore(f"file://{base}/plain", Storage())
    unmerged.merge_parts_at = 10**9
    files: list[list[dict]] = []
    for step in steps:
        if step[0] == "killed":
            killing.armed = True
            continue
        if step[0] == "new":
            _, day_no, minute, where, work_id = step
            start = (day_no + 1) * DAY_MS + minute * 60_000
            files.append(make_file(start, start + 5, where=where, work_id=work_id))
            kind, records = "put", files[-1]
        elif not files:
            continue
        elif step[0] == "again":
            records = [{**r, "create_time": next(_clock)} for r in files[step[1] % len(files)]]
            kind = "put"
        else:
            kind, records = "retire", gone(files[step[1] % len(files)])
        for store in (merging, unmerged):
            try:
                getattr(store, kind)(records)
            except KilledMidMerge:
                getattr(store, kind)(records)  # the run again
        assert _answers(merging, ["run-a", "run-b", "run-c"]) == _answers(
            unmerged, ["run-a", "run-b", "run-c"]
        ), step
