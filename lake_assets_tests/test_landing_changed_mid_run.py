"""A landed file rewritten in place while a run is under way: after the run catalogued it and
before its read, or, once Spark has lost the batch's cached blocks (an executor lost with its
shuffle files), before a later step reads the batch again from the landing. The run must not
record the partition stored or folded from the version it catalogued while the lake holds
another version's rows: it fails (`LandingChanged`), and the next run takes the landing as it
is then (docs/bad-input.md, "Files that change during a run")."""

from __future__ import annotations

import dataclasses
import os
import time

import duckdb
import pytest

from lake_assets import lake_io, landing_confirmation, pipeline, processed
from lake_assets.catalog.parquet_store import ParquetCatalogStore
from lake_assets.config import FeedConfig
from lake_assets.config_model import S3Config
from lake_assets.engine.state import TableState
from lake_assets.errors import LandingChanged
from lake_assets.feeds import format_for
from lake_assets.paths import LakeLayout
from lake_assets.storage import Storage
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events

pytestmark = pytest.mark.minutes(1)

HOUR = "2024-03-01-01"
FIRST = [event(k, "I", i, at(1, 5), name=f"{k}-first", balance=1) for i, k in enumerate("abc")]
REWRITTEN = [event(k, "I", 10 + i, at(1, 6), name=f"{k}-again", balance=2) for i, k in enumerate("xyz")]


def _land(landing, rows) -> None:
    write_events(landing, "accounts", 1, "part-0.parquet", rows, ACCOUNT_SCHEMA)


def _work(landing, lake, run_id: str) -> pipeline.TableWork:
    feed = FeedConfig(name="unit", format="unit_cdc", landing=f"file://{landing}")
    storage, layout = Storage(), LakeLayout(f"file://{lake}")
    store = ParquetCatalogStore(layout.catalog(), storage)
    return pipeline.TableWork(feed, format_for(feed), "accounts", storage, layout, store, run_id)


def _store(work: pipeline.TableWork, batch, hour: str = HOUR) -> None:
    fmt = work.fmt
    pipeline.store_partitions(
        work.storage,
        work.store,
        work.layout.table("changes", "unit", "accounts"),
        batch,
        fmt.partition_column,
        [hour],
        feed="unit",
        table="accounts",
        run_id=work.run_id,
        keys=fmt.table_spec("accounts").keys,
        state=TableState(work.layout, "unit", "accounts"),
    )


def _ids(lake, layer: str) -> list[str]:
    files = f"{lake}/{layer}/unit/accounts/**/*.parquet"
    try:
        rows = duckdb.execute(f"SELECT DISTINCT id FROM read_parquet('{files}')").fetchall()
    except duckdb.IOException:  # no file yet
        return []
    return sorted(row[0] for row in rows)


def _noted(work: pipeline.TableWork) -> dict:
    return processed.read_notes_of(work.storage, work.layout, "unit", "accounts", [HOUR], print)


def _whole_run(spark, work: pipeline.TableWork, hour: str = HOUR) -> None:
    pipeline.catalogue_landing(work, [hour])
    ingested = pipeline.ingest(spark, work, [hour])
    batch = ingested.batch.events
    assert batch is not None
    try:
        _store(work, batch, hour)
        pipeline.record_stored(work, [hour], ingested)
        report = pipeline.fold_into_state(spark, work, batch, partitions=[hour])
        assert all(
            outcome.passed for outcome in pipeline.check_fold(spark, work, batch, report, partitions=[hour])
        )
        pipeline.record_processed(work, [hour], work.run_id)
    finally:
        batch.unpersist()


@pytest.mark.parametrize("when", ["before-the-read", "before-the-store", "before-the-fold"])
def test_a_file_rewritten_during_a_run_fails_it_before_anything_is_recorded_and_the_next_run_takes_the_new_version(
    tmp_path, spark, monkeypatch, when
):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    _land(landing, FIRST)
    work = _work(landing, lake, "run-1")

    pipeline.catalogue_landing(work, [HOUR])
    if when == "before-the-read":
        _land(landing, REWRITTEN)
    ingested = pipeline.ingest(spark, work, [HOUR])
    batch = ingested.batch.events
    assert lake_io.is_cached(batch) and ingested.batch.events_out == 3
    if when == "before-the-store":
        # As when Spark loses the cached blocks: the write reads the landed file again.
        batch.unpersist(blocking=True)
        _land(landing, REWRITTEN)
    _store(work, batch)
    if when != "before-the-fold":
        with pytest.raises(LandingChanged, match=r"part-0\.parquet changed after the run catalogued it"):
            pipeline.record_stored(work, [HOUR], ingested)
        stored, _ = processed.read_stored_notes(work.storage, work.layout, "unit", "accounts", [HOUR], None)
        assert stored == {}  # the next run takes the hour whatever its listing shows
    else:
        pipeline.record_stored(work, [HOUR], ingested)
        assert _ids(lake, "changes") == ["a", "b", "c"]
        # Spark still counts the batch as cached (its storage level outlives the lost blocks)
        # while the fold reads the landed file again.
        batch.unpersist(blocking=True)
        monkeypatch.setattr(lake_io, "is_cached", lambda frame: frame is batch or frame.is_cached)
        _land(landing, REWRITTEN)
        with pytest.raises(LandingChanged, match="found while folding the changes"):
            pipeline.fold_into_state(spark, work, batch, partitions=[HOUR])
        assert _ids(lake, "current") == [] and _ids(lake, "history") == []  # nothing committed
        monkeypatch.undo()
    batch.unpersist()

    _whole_run(spark, _work(landing, lake, "run-2"))

    _assert_the_lake_holds_the_new_version(lake, work)


def _assert_the_lake_holds_the_new_version(lake, work: pipeline.TableWork) -> None:
    assert _ids(lake, "changes") == _ids(lake, "current") == _ids(lake, "history") == ["x", "y", "z"]
    (note,) = _noted(work)[HOUR].values()
    (record,) = pipeline.landed_records(work.store, "unit", "accounts", [HOUR])[HOUR].values()
    assert (
        dataclasses.replace(note, read_mtime_ms=None) == processed.note_from_records({"": record})[""]
    )  # the processed note names the version the lake holds


def test_a_file_rewritten_after_the_fold_committed_fails_its_checks_as_a_changed_file_and_the_next_run_takes_it(
    tmp_path, spark, monkeypatch
):
    """The checks of a fold into stored rows compare them with the run's batch; when Spark has
    lost the batch's blocks, it reads the landed file again, which may hold another version by
    then. A failed check is then the landing's change, not the lake's inconsistency: told as
    such, and the hour is not recorded processed."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    write_events(landing, "accounts", 0, "part-0.parquet", [event("p", "I", 0, at(0, 5))], ACCOUNT_SCHEMA)
    _whole_run(spark, _work(landing, lake, "run-0"), "2024-03-01-00")
    _land(landing, FIRST)
    work = _work(landing, lake, "run-1")
    pipeline.catalogue_landing(work, [HOUR])
    ingested = pipeline.ingest(spark, work, [HOUR])
    batch = ingested.batch.events
    _store(work, batch)
    pipeline.record_stored(work, [HOUR], ingested)
    report = pipeline.fold_into_state(spark, work, batch, partitions=[HOUR])
    assert _ids(lake, "current") == ["a", "b", "c", "p"]

    batch.unpersist(blocking=True)
    monkeypatch.setattr(lake_io, "is_cached", lambda frame: frame is batch or frame.is_cached)
    _land(landing, REWRITTEN)
    with pytest.raises(LandingChanged, match="found while checking the fold"):
        pipeline.check_fold(spark, work, batch, report, partitions=[HOUR])
    monkeypatch.undo()

    _whole_run(spark, _work(landing, lake, "run-2"))
    assert _ids(lake, "changes") == ["p", "x", "y", "z"]
    # a write the rewritten file no longer holds stays folded (docs/semantics.md)
    assert _ids(lake, "current") == _ids(lake, "history") == ["a", "b", "c", "p", "x", "y", "z"]


def _catalogued_beside_another_file(tmp_path):
    """(landing, lake, the run's work, the landed file part-0) once the hour's two files are
    catalogued."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    _land(landing, FIRST)
    write_events(landing, "accounts", 1, "part-1.parquet", [event("o", "I", 9, at(1, 7))], ACCOUNT_SCHEMA)
    work = _work(landing, lake, "run-1")
    pipeline.catalogue_landing(work, [HOUR])
    (path,) = (landing / "accounts").rglob("part-0.parquet")
    return landing, lake, work, path


def test_a_file_delivered_again_in_place_while_the_run_read_it_fails_the_run_though_it_holds_its_bytes_again(
    tmp_path, spark
):
    """A vendor delivers the same file again in place, not atomically (a truncation, then the
    bytes): the run read the half-written file and set it aside as unreadable, and by the check
    the file holds its recorded bytes again. Written since the run listed it before the read, it
    counts as changed: the run records nothing done, and the next run reads it and withdraws the
    quarantine entry."""
    landing, lake, work, path = _catalogued_beside_another_file(tmp_path)
    delivered = path.read_bytes()
    path.write_bytes(delivered[: len(delivered) // 2])

    ingested = pipeline.ingest(spark, work, [HOUR])
    assert [q.reason for q in ingested.batch.quarantined if q.uri.endswith("part-0.parquet")]
    path.write_bytes(delivered)
    _store(work, ingested.batch.events)
    with pytest.raises(LandingChanged, match=r"part-0\.parquet changed after the run catalogued it"):
        pipeline.record_stored(work, [HOUR], ingested)
    ingested.batch.events.unpersist()

    _whole_run(spark, _work(landing, lake, "run-2"))
    assert _ids(lake, "changes") == _ids(lake, "current") == ["a", "b", "c", "o"]
    assert not [p for p in (lake / "_quarantine").rglob("*") if p.is_file()]


def test_a_file_removed_when_the_read_begins_fails_the_run_though_it_is_back_whole_by_the_store(
    tmp_path, spark, monkeypatch
):
    """A delivery made again by removing the file, then writing it: gone when the run lists the
    files it is about to read, half written when Spark reads it, whole again by the check. With
    no modification time noted at the read, its hash would pass it; the run stops at the read."""
    landing, lake, work, path = _catalogued_beside_another_file(tmp_path)
    delivered = path.read_bytes()
    files_now = Storage.files_now

    def listed_while_delivered_again(storage, uris):
        path.unlink()
        listed = files_now(storage, uris)
        path.write_bytes(delivered[: len(delivered) // 2])
        return listed

    monkeypatch.setattr(Storage, "files_now", listed_while_delivered_again)
    with pytest.raises(LandingChanged, match=r"part-0\.parquet was catalogued by this run but is gone now"):
        pipeline.ingest(spark, work, [HOUR])
    monkeypatch.undo()
    path.write_bytes(delivered)

    _whole_run(spark, _work(landing, lake, "run-2"))
    assert _ids(lake, "changes") == _ids(lake, "current") == ["a", "b", "c", "o"]


def test_a_file_written_again_with_its_bytes_between_runs_is_read_by_the_next_run_as_usual(tmp_path, spark):
    """A file delivered days ago and touched after the run that catalogued it (the same bytes
    written again) keeps the catalog record made before the touch (a file's record is the one
    of its earliest day): the next run, whose reads began after the touch, hashes it and goes
    on."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    _land(landing, FIRST)
    (path,) = (landing / "accounts").rglob("part-0.parquet")
    days_ago_ns = time.time_ns() - 3 * 86_400 * 1_000_000_000
    os.utime(path, ns=(days_ago_ns, days_ago_ns))
    _whole_run(spark, _work(landing, lake, "run-1"))
    (note,) = _noted(_work(landing, lake, "run-1"))[HOUR].values()
    touched_ms = note.recorded_ms + 3_000  # beyond the slack after its record
    time.sleep(max(0.0, touched_ms / 1000 - time.time()))
    os.utime(path, ns=(touched_ms * 1_000_000, touched_ms * 1_000_000))

    _whole_run(spark, _work(landing, lake, "run-2"))
    assert _ids(lake, "changes") == _ids(lake, "current") == ["a", "b", "c"]


def test_a_landed_file_whose_store_clock_runs_ahead_of_this_machine_is_read_as_usual(tmp_path, spark):
    """Modification times are compared with the store's own, never with this machine's clock:
    a file stamped a minute ahead (a store whose clock runs fast, a vendor's kept mtime) is
    hashed, found the same, and the run goes on."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    _land(landing, FIRST)
    (path,) = (landing / "accounts").rglob("part-0.parquet")
    ahead_ns = time.time_ns() + 60 * 1_000_000_000
    os.utime(path, ns=(ahead_ns, ahead_ns))

    _whole_run(spark, _work(landing, lake, "run-1"))
    assert _ids(lake, "changes") == _ids(lake, "current") == ["a", "b", "c"]


@pytest.mark.parametrize(
    "case, recorded_after_mtime_ms, listed_at_read, stored_hash, hashed, changed",
    [
        ("the listing vouches for it", 10_000, "as now", None, False, False),
        ("modified just before its record, the same bytes", 0, "as now", None, True, False),
        ("the same size, other bytes", 0, "as now", "0" * 32, True, True),
        ("written after its record, before the read, the same bytes", -10_000, "as now", None, True, False),
        ("written since the read began, the recorded bytes again", -10_000, "earlier", None, False, True),
        ("noted before runs listed files at their read, the same bytes", 0, None, None, True, False),
    ],
)
def test_the_listing_settles_a_file_and_the_hash_what_the_listing_cannot(
    tmp_path, spark, monkeypatch, case, recorded_after_mtime_ms, listed_at_read, stored_hash, hashed, changed
):
    """A file written since the run began to read it is changed; otherwise only a file the
    listing cannot vouch for (the same size, modified after or within the slack before its
    record) is read again, to hash it."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    _land(landing, FIRST)
    work = _work(landing, lake, "run-1")
    pipeline.catalogue_landing(work, [HOUR])
    ingested = pipeline.ingest(spark, work, [HOUR])
    ingested.batch.events.unpersist()
    (url, note), *_ = ingested.read_from[HOUR].items()
    (listed,) = [entry for entry in work.storage.list(url.rsplit("/", 1)[0]) if entry.uri == url]
    assert listed.mtime_ms is not None
    recorded_ms = listed.mtime_ms + recorded_after_mtime_ms
    read_mtime_ms = {"as now": listed.mtime_ms, "earlier": listed.mtime_ms - 1_000, None: None}[
        listed_at_read
    ]
    as_noted = processed.ProcessedFile(note.size, stored_hash or note.hash, recorded_ms, read_mtime_ms)
    read_again: list[str] = []
    hash_file = landing_confirmation.hash_file
    monkeypatch.setattr(
        landing_confirmation,
        "hash_file",
        lambda storage, uri: read_again.append(uri) or hash_file(storage, uri),
    )
    if changed:
        with pytest.raises(LandingChanged):
            landing_confirmation.confirm_unchanged(work, {HOUR: {url: as_noted}}, "storing the changes")
    else:
        landing_confirmation.confirm_unchanged(work, {HOUR: {url: as_noted}}, "storing the changes")
    assert read_again == ([url] if hashed else []), case


def test_on_s3_the_check_of_a_day_of_hours_is_one_listing_and_tells_a_rewritten_file_from_a_gone_one(
    moto_server, s3_bucket
):
    """The check runs in every step that records partitions, so on S3 it asks for the files'
    key range in one listing rather than listing each hour's folder again."""
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    work = dataclasses.replace(
        _work("/unused", "/unused", "run-1"),
        feed=FeedConfig(name="unit", format="unit_cdc", landing=f"s3a://{s3_bucket}/unit"),
        storage=storage,
    )
    folder = f"s3a://{s3_bucket}/unit/accounts/year=2024/month=03/day=01"
    for hour in range(24):
        storage.write_bytes(f"{folder}/hour={hour:02d}/part-0.parquet", b"x" * 10)
    storage.write_bytes(f"{folder}/hour=07/not-read.parquet", b"between the files asked about")
    storage.write_bytes(f"{folder[:-1]}2/hour=00/part-0.parquet", b"after the last file asked about")
    listings: list[dict] = []
    storage._s3_client().meta.events.register(
        "before-parameter-build.s3.ListObjectsV2", lambda params, **_: listings.append(params)
    )
    much_later = 2**62  # a record made long after the files' writes: the listing vouches for them
    noted = {
        f"2024-03-01-{hour:02d}": {
            f"{folder}/hour={hour:02d}/part-0.parquet": processed.ProcessedFile(10, "0" * 32, much_later)
        }
        for hour in range(24)
    }

    landing_confirmation.confirm_unchanged(work, noted, "storing the changes")
    assert len(listings) == 1

    storage.delete_file(f"{folder}/hour=03/part-0.parquet")  # gone: the next run sees it gone
    landing_confirmation.confirm_unchanged(work, noted, "storing the changes")
    for first_or_last in ("hour=00", "hour=23"):
        storage.write_bytes(f"{folder}/{first_or_last}/part-0.parquet", b"y" * 11)
        with pytest.raises(
            LandingChanged, match=rf"{first_or_last}/part-0\.parquet changed after the run catalogued"
        ):
            landing_confirmation.confirm_unchanged(work, noted, "storing the changes")
        storage.write_bytes(f"{folder}/{first_or_last}/part-0.parquet", b"x" * 10)
    assert len(listings) == 4

    # a key to encode, and one key asked under both schemes
    storage.write_bytes(f"{folder}/hour=05/a name+1%.parquet", b"z")
    asked = [f"{folder}/hour=05/a name+1%.parquet", f"{folder}/hour=05/part-0.parquet"]
    asked.append(asked[1].replace("s3a://", "s3://"))
    assert {uri: entry.size for uri, entry in storage.files_now(asked).items()} == dict(
        zip(asked, [1, 10, 10], strict=True)
    )


def test_in_a_directory_bucket_whose_listing_has_no_order_the_files_are_found_from_the_folder_they_share(
    moto_server, monkeypatch
):
    """An S3 Express directory bucket lists keys in no order and takes no `StartAfter`: the
    files are looked up in a listing of the folder they share, read to its end. (boto3 asks a
    bucket named as a directory bucket for an S3 Express session, which moto does not serve,
    so the bucket here is told apart by another suffix.)"""
    from lake_assets import storage as storage_module

    monkeypatch.setattr(storage_module, "_DIRECTORY_BUCKET_SUFFIXES", ("-directory",))
    bucket = "landing-directory"
    moto_server.client("s3").create_bucket(Bucket=bucket)
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    listings: list[dict] = []
    storage._s3_client().meta.events.register(
        "before-parameter-build.s3.ListObjectsV2", lambda params, **_: listings.append(dict(params))
    )
    folder = f"s3a://{bucket}/unit/accounts/year=2024/month=03/day=01"
    uris = [f"{folder}/hour={hour:02d}/part-0.parquet" for hour in (3, 14)]
    for size, uri in enumerate(uris, start=1):
        storage.write_bytes(uri, b"x" * size)

    assert {uri: entry.size for uri, entry in storage.files_now(uris).items()} == {uris[0]: 1, uris[1]: 2}
    (asked,) = listings
    assert "StartAfter" not in asked and asked["Prefix"] == "unit/accounts/year=2024/month=03/day=01/"
