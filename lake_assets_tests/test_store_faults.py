"""A store that fails a good file's requests (throttling past the connector's retries, a
connection closed before the bytes) is not a damaged file: the run fails naming the store's
answer, no file is set aside, and once the store answers again the next run reads every file.
Set aside as damaged, the file's rows would leave `changes` in a run that exits 0.

The store is moto behind `s3_faults.FaultyS3`, on 127.0.0.1, for Spark's s3a connector; the
lake's own client talks to moto directly, except in the footer tests at the end, where the
lake's own client asks through it. (The same on a Spark Connect server with its stack traces
hidden: `test_scale_out.py`.)"""

from __future__ import annotations

import dataclasses
import uuid

import dagster as dg
import pytest

from lake_assets import lake_io, pipeline
from lake_assets.catalog.parquet_store import ParquetCatalogStore
from lake_assets.engine.model import SOURCE_FILE
from lake_assets.engine.state import TableState
from lake_assets.errors import StorageRequestError, StoreUnreachable
from lake_assets.feeds import format_for
from lake_assets.paths import LakeLayout
from lake_assets.runner import RunFailed, run_feeds
from lake_assets_tests.hostile_landings import quarantine_notes
from lake_assets_tests.s3_faults import CUT, THROTTLE, FaultyS3, bucket_read_through, landing_on_s3

pytestmark = [pytest.mark.s3, pytest.mark.minutes(2)]

#: what the failure says of each fault: the store's answer, as the connector reports it (a
#: connection closed is reported by the AWS SDK's check of the length once s3a retried the read,
#: by the HTTP client itself when it did not)
NAMED = {THROTTLE: "Status Code: 503", CUT: "different length than the expected"}
NAMED_WITHOUT_RETRIES = {CUT: "ConnectionClosedException"}
#: attempts pyarrow's S3 client makes of a request (its default retry strategy)
PYARROW_S3_ATTEMPTS = 3


@pytest.mark.parametrize(
    "feed, how, methods, retries",
    [
        ("unit", THROTTLE, ("GET",), 1),
        ("unit", THROTTLE, ("HEAD", "GET"), 1),
        ("unit", CUT, ("GET",), 1),
        ("unit", CUT, ("GET",), 0),
        ("grax", THROTTLE, ("GET",), 1),
        ("grax", CUT, ("GET",), 1),
        # Flow reads its fragments' bytes with no error taken for a damaged file: held all the same
        ("flow", CUT, ("GET",), 1),
    ],
    ids=[
        "unit-throttled-reads",
        "unit-throttled-everything",
        "unit-connection-closed",
        "unit-connection-closed-no-retries",
        "grax-throttled",
        "grax-connection-closed",
        "flow-connection-closed",
    ],
)
def test_a_read_the_store_fails_sets_no_file_aside_and_the_next_run_reads_it(
    tmp_path, moto_server, spark, feed, how, methods, retries
):
    # a bucket of its own, whose s3a connector this test opens first (`bucket_read_through`)
    bucket = f"faulty-{uuid.uuid4().hex[:16]}"
    moto_server.client("s3").create_bucket(Bucket=bucket)
    landing = landing_on_s3(moto_server, bucket, tmp_path, feed)
    config = landing.config(moto_server.url)

    with FaultyS3(moto_server.url).serving() as s3, bucket_read_through(spark, bucket, s3.url, retries):
        s3.fail(bucket, landing.victim, how, methods)
        with pytest.raises(RunFailed) as failed:
            run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
        assert s3.delivered(how, methods[0]) > 0  # a HEAD refused, the GET is never sent
        assert "failed on a request to the store" in str(failed.value), failed.value
        assert landing.victim in str(failed.value), failed.value
        assert (NAMED if retries else NAMED_WITHOUT_RETRIES)[how] in str(failed.value), failed.value
        assert not quarantine_notes(landing.lake)

        s3.heal()
        run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)

    assert not quarantine_notes(landing.lake)
    assert f"s3a://{bucket}/{landing.victim}" in landing.files_in_changes()


@pytest.mark.parametrize("step", ["store", "fold"])
def test_a_step_reading_an_evicted_batch_again_that_the_store_fails_says_so_and_leaves_the_next_run_whole(
    tmp_path, moto_server, spark, step
):
    """A step after the ingest reads the landed files again when Spark evicted the batch's
    cached rows (here: released): a request the store fails there fails the step as a failed
    request naming the store's answer, not as a raw Spark error, and nothing is recorded done."""
    bucket = f"faulty-{uuid.uuid4().hex[:16]}"
    moto_server.client("s3").create_bucket(Bucket=bucket)
    landing = landing_on_s3(moto_server, bucket, tmp_path, "unit")
    config = landing.config(moto_server.url)
    storage, layout, fmt = config.storage(), LakeLayout(config.lake), format_for(landing.feed)
    work = pipeline.TableWork(
        landing.feed,
        fmt,
        "accounts",
        storage,
        layout,
        ParquetCatalogStore(layout.catalog(), storage),
        "run-1",
    )
    hours = fmt.partition_keys(storage, landing.feed.landing, "accounts")

    def store(batch):
        return pipeline.store_partitions(
            storage,
            work.store,
            layout.table("changes", landing.feed.name, "accounts"),
            batch,
            fmt.partition_column,
            hours,
            feed=landing.feed.name,
            table="accounts",
            run_id=work.run_id,
            keys=fmt.table_spec("accounts").keys,
            state=TableState(layout, landing.feed.name, "accounts"),
        )

    with FaultyS3(moto_server.url).serving() as s3, bucket_read_through(spark, bucket, s3.url):
        pipeline.catalogue_landing(work, hours)
        batch = pipeline.ingest(spark, work, hours).batch.events
        assert batch is not None and lake_io.is_cached(batch)
        if step == "fold":
            store(batch)
        batch.unpersist(blocking=True)  # as Spark evicts a cached block it has no room for
        s3.fail(bucket, landing.victim, THROTTLE)
        with pytest.raises(StoreUnreachable) as failed:
            store(batch) if step == "store" else pipeline.fold_into_state(
                spark, work, batch, partitions=hours
            )
        assert s3.delivered(THROTTLE) > 0
        what = "storing the changes" if step == "store" else "folding the changes into current and history"
        assert f"unit/accounts: {what} failed on a request to the store" in str(failed.value), failed.value
        assert NAMED[THROTTLE] in str(failed.value), failed.value
        assert not storage.exists(TableState(layout, "unit", "accounts").current)  # nothing committed

        s3.heal()
        if step == "store":
            store(batch)
        report = pipeline.fold_into_state(spark, work, batch, partitions=hours)

    assert report.events_in == batch.count() > 0
    assert f"s3a://{bucket}/{landing.victim}" in landing.files_in_changes()


def test_a_footer_read_the_store_fails_for_a_while_is_asked_again_and_sets_no_file_aside(
    tmp_path, moto_server, spark
):
    """Before Spark reads them, the ingest reads the landed files' footers through the lake's own
    client (pyarrow), whose failed request raises as a damaged footer does. A good file whose
    footer the store throttled past pyarrow's retries, and that the store hands over again when
    asked, is read, not set aside as 'not a readable Parquet file' (its rows would have left
    `changes` in a run that exits 0, and its partition's note would have named it processed)."""
    with FaultyS3(moto_server.url).serving() as s3:
        landing, through, hours = _catalogued_then_read_through(s3, moto_server, tmp_path)
        asked, ask = [], through.storage.refusal_to_read
        through.storage.refusal_to_read = lambda uri: (asked.append(uri), ask(uri))[1]
        s3.fail(landing.bucket, landing.victim, THROTTLE, times=PYARROW_S3_ATTEMPTS)
        ingested = pipeline.ingest(spark, through, hours)
        assert s3.delivered(THROTTLE) == PYARROW_S3_ATTEMPTS
        assert asked == [
            f"s3a://{landing.bucket}/{landing.victim}"
        ]  # the store was asked, then the footer read again

    assert not quarantine_notes(landing.lake)
    assert ingested.batch.events is not None
    read = {row[0] for row in ingested.batch.events.select(SOURCE_FILE).distinct().collect()}
    assert f"s3a://{landing.bucket}/{landing.victim}" in read


@pytest.mark.parametrize("how, named", [(THROTTLE, "SlowDown"), (CUT, "failed twice while the store serves")])
def test_a_footer_the_store_keeps_failing_fails_the_run_and_sets_no_file_aside(
    tmp_path, moto_server, spark, how, named
):
    """A footer read failing on and on fails the run, and no file is set aside, so a later run
    reads it: throttled, the store's own answer says so; cut after its headers (the store
    answers a request, and the bytes never come), the same failure twice is not taken for
    damage."""
    with FaultyS3(moto_server.url).serving() as s3:
        landing, through, hours = _catalogued_then_read_through(s3, moto_server, tmp_path)
        s3.fail(landing.bucket, landing.victim, how)
        with pytest.raises(StorageRequestError, match=named):
            pipeline.ingest(spark, through, hours)
    assert not quarantine_notes(landing.lake)


def _catalogued_then_read_through(s3: FaultyS3, moto_server, root):
    """A Unit landing in a bucket of its own, catalogued through moto directly; then the work of
    its `accounts` table with the lake's own client asking through `s3` (Spark still asks moto),
    and the table's hours."""
    bucket = f"faulty-{uuid.uuid4().hex[:16]}"
    moto_server.client("s3").create_bucket(Bucket=bucket)
    landing = landing_on_s3(moto_server, bucket, root, "unit")
    work = _accounts_work(landing, landing.config(moto_server.url))
    hours = work.fmt.partition_keys(work.storage, landing.feed.landing, "accounts")
    pipeline.catalogue_landing(work, hours)
    return landing, dataclasses.replace(work, storage=landing.config(s3.url).storage()), hours


def _accounts_work(landing, config) -> pipeline.TableWork:
    storage, layout = config.storage(), LakeLayout(config.lake)
    return pipeline.TableWork(
        landing.feed,
        format_for(landing.feed),
        "accounts",
        storage,
        layout,
        ParquetCatalogStore(layout.catalog(), storage),
        "run-1",
    )
