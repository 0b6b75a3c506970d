"""On an object store every request waits out a round trip. A run's requests per file or per
partition (footers, hashes, catalog parts, listings, the commit's moves) are made several at a
time, so the requests a backfill makes one after another do not grow with the hours it reads
(docs/profiling.md, "Requests one after another")."""

from __future__ import annotations

import signal
import threading
import time

import botocore.exceptions
import pytest

from benchmarks import side_by_side
from benchmarks.request_latency import ALL, MAIN_THREAD, store_requests_counted
from benchmarks.unit_landing import LandingShape, write_unit_landing
from lake_assets.catalog.files import catalog_file, record, retirements
from lake_assets.catalog.parquet_store import ParquetCatalogStore
from lake_assets.feeds.base import files_in_folders
from lake_assets.storage import Storage, each_outcome, each_request


def test_a_backfills_requests_one_after_another_do_not_grow_with_its_hours(spark, tmp_path):
    one_after_another = {}
    for hours in (2, 10):
        landing = tmp_path / f"landing-{hours}"
        write_unit_landing(
            landing, side_by_side.TABLE, LandingShape(keys=40, events_per_hour=12, hours=hours)
        )
        feed = side_by_side.feed_config(landing)
        partitions = side_by_side.landed_hours(feed)
        assert len(partitions) >= hours
        with store_requests_counted() as counted:
            side_by_side.run_pipeline(spark, feed, tmp_path / f"lake-{hours}", partitions, f"run-{hours}")
        assert counted[ALL] > counted[MAIN_THREAD] > 0
        one_after_another[hours] = {
            name: made for name, made in counted.items() if name not in (ALL, MAIN_THREAD)
        }
    # (A single item is asked on the main thread: the short backfill may make a few more.)
    grown = {
        name: (one_after_another[2].get(name, 0), made)
        for name, made in one_after_another[10].items()
        if made > one_after_another[2].get(name, 0)
    }
    assert not grown, f"requests one after another (2 hours, 10 hours): {grown}"


def test_the_counter_sees_what_the_catalog_asks_of_a_file(tmp_path):
    """The catalog asks a file's size and time through the store (`Storage.file_info`), so the
    benchmark's counter (and its latency) sees those requests too."""
    written = tmp_path / "part-0.parquet"
    written.write_bytes(b"PAR1")
    item = catalog_file("feed", "table", "run", f"file://{written}", None)
    with store_requests_counted() as counted:
        found = retirements(Storage(), [item])
    assert found
    assert counted["file_info"] == 1
    store = ParquetCatalogStore(f"file://{tmp_path / 'catalog'}", Storage())
    with store_requests_counted() as counted:
        assert record(store, Storage(), [item]) == 1
    assert counted["file_info"] == 1


def test_the_folders_of_many_partitions_are_listed_several_at_a_time(tmp_path, monkeypatch):
    """What a Unit run of a short range and a GRAX run of several batches list their landed
    files with (`feeds.base.files_in_folders`)."""
    folders = {}
    for number in range(6):
        folder = tmp_path / f"batch={number:x}"
        folder.mkdir()
        (folder / "part-0.parquet").write_bytes(b"PAR1")
        folders[f"{number:x}"] = [f"file://{folder}"]
    in_flight, most, lock = 0, 0, threading.Lock()
    listing = Storage.list

    def slow_list(self, uri):
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.05)  # a request's round trip
        with lock:
            in_flight -= 1
        return listing(self, uri)

    monkeypatch.setattr(Storage, "list", slow_list)
    found = files_in_folders(Storage(), folders, [*folders, "ff"])
    assert most > 1
    assert {key: [e.name for e in entries] for key, entries in found.items()} == {
        **{key: ["part-0.parquet"] for key in folders},
        "ff": [],
    }


@pytest.mark.parametrize("at_once", [1, 4])
def test_each_request_is_tried_and_its_outcome_kept_in_order(at_once):
    def request(number: int) -> int:
        if number == 2:
            raise OSError("the store refused one request")
        time.sleep(0.01 * (5 - number))  # the later requests end first
        return number * 10

    outcomes = each_outcome(request, range(5), at_once)
    assert [o if not isinstance(o, Exception) else "refused" for o in outcomes] == [0, 10, "refused", 30, 40]
    with pytest.raises(OSError, match="refused one request"):
        each_request(request, range(5), at_once)


@pytest.mark.parametrize("at_once", [1, 4])
def test_once_the_store_is_out_of_reach_no_further_request_is_made(at_once):
    begun = []

    def request(number: int) -> None:
        begun.append(number)
        time.sleep(0.02)
        raise botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:9")

    outcomes = each_outcome(request, range(40), at_once)
    assert len(begun) <= at_once
    assert all(isinstance(o, botocore.exceptions.EndpointConnectionError) for o in outcomes)


@pytest.mark.parametrize("at_once", [1, 4])
def test_an_interrupt_makes_no_further_request(at_once):
    """Dagster's termination of a step, or Ctrl-C, raised in a request: the requests under way
    end, no other begins (the step no longer holds its table's lease once it is out)."""
    begun = []

    def request(number: int) -> None:
        begun.append(number)
        if number == 0:
            raise KeyboardInterrupt("the step was terminated")
        time.sleep(0.05)

    with pytest.raises(KeyboardInterrupt, match="terminated"):
        each_outcome(request, range(40), at_once)
    assert len(begun) <= at_once


@pytest.mark.parametrize("after", [0.0, 0.1])
def test_an_interrupt_of_the_caller_begins_no_request_and_waits_for_those_under_way(after):
    """Ctrl-C (SIGINT, raised in the main thread) while the requests run, or while they are
    still being handed to their threads: none begins after it, and it is raised only once
    those under way have ended."""
    assert threading.current_thread() is threading.main_thread(), "a signal reaches the main thread only"
    begun, ended = [], []

    def request(number: int) -> None:
        begun.append(number)
        if number == 0:
            time.sleep(after)
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        time.sleep(0.2)
        ended.append(number)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            each_outcome(request, range(40), 4)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(begun) == sorted(ended)
    assert len(begun) <= 4
