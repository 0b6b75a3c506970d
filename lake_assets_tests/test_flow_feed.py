"""The Estuary Flow journal feed through Dagster: every committed document exactly once over
overlapping fragments and every codec, transactions honoured, bad fragments named and
quarantined, gaps reported, hour pruning, the sensor, and the same graph on S3."""

import datetime as dt
import gzip
import hashlib
import json
import os
import zlib
from pathlib import Path

import boto3
import dagster as dg
import pyarrow as pa
import pydantic
import pytest

from lake_assets.config import CollectionConfig, FeedConfig, LakeConfig, S3Config, parse_config
from lake_assets.demo.flow_sample import build_uuid, clock_of, write_flow_landing
from lake_assets.discovery import discover
from lake_assets.errors import ConfigError
from lake_assets.feeds.flow_journal import FlowJournalFormat
from lake_assets.runner import run_feeds
from lake_assets.storage import Storage
from lake_assets_tests.discovered import discovered_definitions
from lake_assets_tests.hostile_landings import duck, links_to_a_tree_beside_a_real_folder
from lake_assets_tests.run_value_probes import assert_read_during_the_runs
from lake_assets_tests.storage_spy import CountingStorage

UTC = dt.UTC


def rows(lake: Path, layer: str, table: str) -> list[dict]:
    folder = lake / layer / "flow" / table
    if not folder.exists():
        return []
    return duck(
        f"SELECT * FROM read_parquet('{folder}/**/*.parquet', union_by_name = true, hive_partitioning = true)"
    )


def config_for(landing, lake, collections) -> LakeConfig:
    cols = tuple(CollectionConfig(name=name, key=tuple(key)) for name, key in collections.items())
    return LakeConfig(
        lake=f"file://{lake}",
        feeds=(
            FeedConfig(name="flow", format="flow_journal", landing=f"file://{landing}", collections=cols),
        ),
    )


def metadata_of(instance, table: str) -> dict:
    event = instance.get_latest_materialization_event(dg.AssetKey(["flow", table, "changes"]))
    return {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}


@pytest.fixture(scope="module")
def sample_lake(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("flow")
    sample = write_flow_landing(root / "landing")
    instance = dg.DagsterInstance.ephemeral()
    run_feeds(
        config_for(sample.landing_dir, root / "lake", sample.collections),
        instance=instance,
        say=lambda _: None,
    )
    return sample, root / "lake", instance


def _uuid_key(doc: dict) -> str:
    return doc["_meta"]["uuid"]


@pytest.mark.parametrize(
    "collection,table", [("acmeCo/orders", "acmeco_orders"), ("acmeCo/customers", "acmeco_customers")]
)
def test_every_committed_document_once_over_overlaps_and_codecs(sample_lake, collection, table):
    sample, lake, instance = sample_lake
    expected = sample.committed[collection]
    changes = rows(lake, "changes", table)
    assert len(changes) == len(expected)
    from lake_assets.feeds.flow_fragments import parse_uuid

    want = sorted((str(d["id"]), parse_uuid(_uuid_key(d)).order) for d in expected)
    assert sorted((str(r["id"]), r["_seq"]) for r in changes) == want
    metadata = metadata_of(instance, table)
    assert metadata["reconciled"] is True and metadata["gaps"] == [] and metadata["files_quarantined"] == 0
    if collection == "acmeCo/orders":
        assert metadata["files_superseded"] >= 1  # the contained and the duplicated fragments


def test_uncommitted_and_rolled_back_documents_never_reach_current(sample_lake):
    sample, lake, instance = sample_lake
    excluded = {
        (e["collection"], _uuid_key(e["doc"]))
        for kind in ("rolled_back", "pending")
        for e in sample.excluded[kind]
    }
    assert excluded
    from lake_assets.feeds.flow_fragments import parse_uuid

    for collection, table in (("acmeCo/orders", "acmeco_orders"), ("acmeCo/customers", "acmeco_customers")):
        clocks = {parse_uuid(u).order for c, u in excluded if c == collection}
        seen = {r["_seq"] for r in rows(lake, "changes", table)} | {
            r["_seq"] for r in rows(lake, "current", table)
        }
        assert not clocks & seen, collection
    counts = metadata_of(instance, "acmeco_customers")["reader_counts"]
    assert counts["rolled_back"] >= 1 and counts["duplicates"] >= 1 and counts["acks"] >= 1
    assert metadata_of(instance, "acmeco_orders")["reader_counts"]["pending"] >= 1


def test_current_is_the_last_committed_version_and_deletes_remove_keys(sample_lake):
    sample, lake, _ = sample_lake
    from lake_assets.feeds.flow_fragments import parse_uuid

    last: dict = {}
    for doc in sample.committed["acmeCo/orders"]:
        clock = parse_uuid(_uuid_key(doc)).order
        if doc["id"] not in last or clock > last[doc["id"]][0]:
            last[doc["id"]] = (clock, doc)
    live = {k: d for k, (_, d) in last.items() if d["_meta"]["op"] != "d"}
    current = {r["id"]: r for r in rows(lake, "current", "acmeco_orders")}
    assert set(current) == set(live)
    assert len(live) < len(last)  # the sample deletes orders
    for key, doc in live.items():
        assert current[key]["status"] == doc["status"] and current[key]["total"] == doc["total"]
        assert json.loads(current[key]["shipping"]) == doc["shipping"]  # nested values as JSON text


# --- hand-made journals for the error cases -----------------------------------------------------

PRODUCER = bytes.fromhex("0a0b0c0d0e0f")
HOUR = dt.datetime(2024, 6, 1, 10, 5, tzinfo=UTC)


def doc_line(n: int, **fields) -> bytes:
    doc = {
        "id": n,
        "name": f"c{n}",
        **fields,
        "_meta": {"uuid": build_uuid(clock_of(HOUR) + 16 * n, 0, PRODUCER), "op": "c"},
    }
    return json.dumps(doc).encode() + b"\n"


def write_fragment(
    journal: Path,
    begin: int,
    content: bytes,
    *,
    stored: bytes | None = None,
    sum_of: bytes | None = None,
    hour: int = 10,
) -> Path:
    folder = journal / "utc_date=2024-06-01" / f"utc_hour={hour:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(content if sum_of is None else sum_of).hexdigest()
    path = folder / f"{begin:016x}-{begin + len(content):016x}-{digest}.gz"
    path.write_bytes(gzip.compress(content) if stored is None else stored)
    return path


def uri(path: Path) -> str:
    return f"file://{path}"


def quarantine_notes(lake: Path) -> dict[str, str]:
    """Quarantined file uri -> reason, from the reason files next to the quarantined copies."""
    notes = [json.loads(p.read_text()) for p in (lake / "_quarantine").rglob("*.reason.json")]
    return {note["file"]: note["reason"] for note in notes}


def landing_complete_passed(instance, table: str) -> bool:
    check = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(dg.AssetKey(["flow", table, "changes"]), "landing_complete")]
    )
    return next(iter(check.values())).event.dagster_event.event_specific_data.passed


def journal_lines(numbers) -> tuple[list[bytes], list[int]]:
    """Document lines of the given ids and the journal offset where each begins (and one past the end)."""
    docs = [doc_line(n) for n in numbers]
    return docs, [sum(len(d) for d in docs[:i]) for i in range(len(docs) + 1)]


def transaction_line(n: int, flags: int, hour: int, ack: bool = False) -> bytes:
    """A document (or, with `ack`, an acknowledgement) of PRODUCER at hh:05 on 2024-06-01."""
    uuid = build_uuid(clock_of(dt.datetime(2024, 6, 1, hour, 5, tzinfo=UTC)) + 16 * n, flags, PRODUCER)
    doc = (
        {"_meta": {"uuid": uuid, "ack": True}} if ack else {"id": n, "name": f"c{n}", "_meta": {"uuid": uuid}}
    )
    return json.dumps(doc).encode() + b"\n"


def transaction_across_hours(ack_hour: int) -> dict[int, bytes]:
    """Hour -> its fragment's content: a document outside a transaction at 07:05, a
    transaction's two documents at 08:05, and its ACK with one more document at `ack_hour`:05."""
    return {
        7: transaction_line(0, 0x0, 7),
        8: transaction_line(1, 0x1, 8) + transaction_line(2, 0x1, 8),
        ack_hour: transaction_line(3, 0x2, ack_hour, ack=True) + transaction_line(4, 0x0, ack_hour),
    }


def offsets_of(hours: dict[int, bytes]) -> dict[int, int]:
    """Hour -> where its fragment begins in the journal (fragments in hour order)."""
    ordered = sorted(hours)
    return {hour: sum(len(hours[h]) for h in ordered[: ordered.index(hour)]) for hour in ordered}


def customers_lake(tmp_path: Path) -> tuple[Path, Path, LakeConfig, dg.DagsterInstance]:
    """A lake of one collection keyed by `/id`: its journal's folder, the lake's, the
    configuration and a Dagster instance."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    config = config_for(landing, lake, {"acmeCo/customers": ["/id"]})
    return landing / "acmeCo" / "customers" / "pivot=00", lake, config, dg.DagsterInstance.ephemeral()


def run_hour_by_hour(tmp_path: Path, hours: dict[int, bytes]) -> tuple[Path, dg.DagsterInstance]:
    """Land each hour's fragment in turn (in journal order) and run after each: the lake's
    folder and the instance."""
    journal, lake, config, instance = customers_lake(tmp_path)
    for hour, begin in offsets_of(hours).items():
        write_fragment(journal, begin, hours[hour], hour=hour)
        run_feeds(config, instance=instance, say=lambda _: None)
    return lake, instance


def test_a_transaction_begun_hours_before_its_acknowledgement_is_committed_hour_by_hour(spark, tmp_path):
    """No fragment at 09: run hour by hour, the 10:00 run's one context hour holds nothing of the
    journal, so it reads further back until the transaction's start."""
    lake, instance = run_hour_by_hour(tmp_path, transaction_across_hours(ack_hour=10))

    changes = {(r["hour"], r["id"]) for r in rows(lake, "changes", "acmeco_customers")}
    assert changes == {("2024-06-01-07", 0), ("2024-06-01-10", 1), ("2024-06-01-10", 2), ("2024-06-01-10", 4)}
    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [0, 1, 2, 4]
    assert metadata_of(instance, "acmeco_customers")["reconciled"] is True  # the passes counted once


@pytest.mark.parametrize("pending", [False, True], ids=["nothing-pending", "a-document-pending"])
def test_a_producer_silent_in_the_hour_before_its_acknowledgement_is_followed_back(spark, tmp_path, pending):
    """The transaction's documents at 08:05, another producer's document at 09:05, the ACK at
    10:05: hour 10's context hour holds records, none of the ACK's producer, and nothing read
    says where its transaction began (no earlier ACK, nothing outside a transaction): read
    further back. Whether or not a document of the transaction comes before the ACK in hour 10
    (then the producer has documents pending when its ACK comes)."""
    other = build_uuid(
        clock_of(dt.datetime(2024, 6, 1, 9, 5, tzinfo=UTC)), 0x0, bytes.fromhex("0f0e0d0c0b0a")
    )
    hours = {
        **transaction_across_hours(ack_hour=10),
        9: json.dumps({"id": 9, "name": "c9", "_meta": {"uuid": other}}).encode() + b"\n",
    }
    if pending:  # document 5, then the ACK, in hour 10
        hours[10] = transaction_line(5, 0x1, 10) + transaction_line(6, 0x2, 10, ack=True)
    lake, instance = run_hour_by_hour(tmp_path, hours)

    changes = {(r["hour"], r["id"]) for r in rows(lake, "changes", "acmeco_customers")}
    last = 5 if pending else 4
    assert changes == {
        ("2024-06-01-07", 0),
        ("2024-06-01-09", 9),
        ("2024-06-01-10", 1),
        ("2024-06-01-10", 2),
        ("2024-06-01-10", last),
    }
    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == sorted([0, 1, 2, 9, last])
    assert metadata_of(instance, "acmeco_customers")["reconciled"] is True


@pytest.mark.parametrize("retried", ["documents", "transaction"])
def test_documents_appended_again_hours_after_their_commit_are_dropped_hour_by_hour(spark, tmp_path, retried):
    """A retried append: PRODUCER's two documents (outside a transaction, or one transaction
    with its acknowledgement), committed at 05, are appended again at 13 with their first
    clocks, and another producer wrote every hour in between. Run hour by hour, 13's run reads
    only 12 before it, which holds no commit point of PRODUCER: the copies' clocks lie before
    anything read, so it reads back, as far as 05, and drops them, as a run over every hour does."""
    other = bytes.fromhex("0f0e0d0c0b0a")

    def other_line(n: int, hour: int) -> bytes:
        uuid = build_uuid(clock_of(dt.datetime(2024, 6, 1, hour, 5, tzinfo=UTC)) + 16 * n, 0x0, other)
        return json.dumps({"id": n, "name": f"c{n}", "_meta": {"uuid": uuid}}).encode() + b"\n"

    first = transaction_line(1, 0x0, 5) + transaction_line(5, 0x0, 5)
    if retried == "transaction":
        first = (
            transaction_line(1, 0x1, 5) + transaction_line(5, 0x1, 5) + transaction_line(7, 0x2, 5, ack=True)
        )
    between = {hour: other_line(10 + hour, hour) for hour in range(6, 13)}
    lake, _ = run_hour_by_hour(tmp_path, {5: first, **between, 13: first + transaction_line(6, 0x0, 13)})

    assert sorted((r["hour"], r["id"]) for r in rows(lake, "changes", "acmeco_customers")) == [
        ("2024-06-01-05", 1),
        ("2024-06-01-05", 5),
        *[(f"2024-06-01-{hour:02d}", 10 + hour) for hour in range(6, 13)],
        ("2024-06-01-13", 6),
    ]


def test_reading_back_across_hour_folders_without_fragments_ends(spark, tmp_path):
    """A producer's first transaction (no commit point before its ACK) makes the run read
    earlier hours. The hour folders before it hold no fragment, only files that are not
    fragments: listed once, they count as read, so the reading back ends at the first folder
    instead of listing the same folders pass after pass."""
    journal, lake, config, instance = customers_lake(tmp_path)
    for hour in (5, 6):
        folder = journal / "utc_date=2024-06-01" / f"utc_hour={hour:02d}"
        folder.mkdir(parents=True)
        (folder / "README.txt").write_text("not a fragment")
    write_fragment(journal, 0, transaction_line(1, 0x1, 8) + transaction_line(2, 0x2, 8, ack=True), hour=8)
    run_feeds(config, instance=instance, say=lambda _: None)

    assert {(r["hour"], r["id"]) for r in rows(lake, "changes", "acmeco_customers")} == {("2024-06-01-08", 1)}
    assert {Path(u).name for u in quarantine_notes(lake)} == {"README.txt"}


def test_a_fragment_landing_after_its_acknowledgements_hour_ran_is_committed_there(spark, tmp_path):
    """The transaction's 08:00 fragment lands last. Hour 10 ran without it (a gap); hour 08's run
    reads on to the ACK, asks hour 10 to run again, and the same command does so: nothing of
    the transaction is left out, and the next command has nothing to do."""
    journal, lake, config, instance = customers_lake(tmp_path)
    hours, table = transaction_across_hours(ack_hour=10), "acmeco_customers"
    begins = offsets_of(hours)
    for hour in (7, 10):
        write_fragment(journal, begins[hour], hours[hour], hour=hour)
        run_feeds(config, instance=instance, say=lambda _: None)
    assert {r["id"] for r in rows(lake, "changes", table)} == {0, 4}
    assert landing_complete_passed(instance, table) is False  # hour 10 saw the hole

    write_fragment(journal, begins[8], hours[8], hour=8)
    said: list[str] = []
    run_feeds(config, instance=instance, say=said.append)

    changes = {(r["hour"], r["id"]) for r in rows(lake, "changes", table)}
    assert changes == {("2024-06-01-07", 0), ("2024-06-01-10", 1), ("2024-06-01-10", 2), ("2024-06-01-10", 4)}
    assert sorted(r["id"] for r in rows(lake, "current", table)) == [0, 1, 2, 4]
    assert any("2024-06-01-10: to run again: a transaction acknowledged there" in line for line in said), said
    assert landing_complete_passed(instance, table) is True
    assert not list((lake / "_state").glob("**/reruns/**/*.json"))  # answered, so withdrawn
    said.clear()
    run_feeds(config, instance=instance, say=said.append)
    assert any("nothing changed since the last run" in line for line in said), said


def test_the_hour_asked_to_run_again_reads_back_to_the_late_fragment(spark, tmp_path):
    """A transaction's documents at 07:05 (landing last) and 10:05, its ACK at 11:05, another
    producer writing at 08 and 09. Hour 11 reads back two hours to 08 and stops: its producer did
    not write there. When 07 lands, its run reads on to the ACK and asks 11 to run again; that
    run reads back to the fragment the request names, however far, and commits both documents."""
    journal, lake, config, instance = customers_lake(tmp_path)
    other = bytes.fromhex("0f0e0d0c0b0a")

    def by_other(n: int, hour: int) -> bytes:
        uuid = build_uuid(clock_of(dt.datetime(2024, 6, 1, hour, 5, tzinfo=UTC)) + 16 * n, 0x0, other)
        return json.dumps({"id": n, "name": f"c{n}", "_meta": {"uuid": uuid}}).encode() + b"\n"

    hours = {
        6: transaction_line(0, 0x0, 6),
        7: transaction_line(1, 0x1, 7),
        8: by_other(8, 8),
        9: by_other(9, 9),
        10: transaction_line(2, 0x1, 10),
        11: transaction_line(3, 0x2, 11, ack=True) + transaction_line(4, 0x0, 11),
    }
    begins = offsets_of(hours)
    for hour in (6, 8, 9, 10, 11, 7):
        write_fragment(journal, begins[hour], hours[hour], hour=hour)
        run_feeds(config, instance=instance, say=lambda _: None)

    changes = {(r["hour"][-2:], r["id"]) for r in rows(lake, "changes", "acmeco_customers")}
    assert changes == {("06", 0), ("08", 8), ("09", 9), ("11", 1), ("11", 2), ("11", 4)}
    assert not list((lake / "_state").glob("**/reruns/**/*.json"))


def test_a_fragment_repaired_in_place_reaches_its_acknowledgements_hour(spark, tmp_path):
    """The transaction's 09:00 fragment first lands corrupt (set aside, a gap), then is rewritten
    whole under the same name: hour 10, whose run read past the hole, runs again."""
    journal, lake, config, instance = customers_lake(tmp_path)
    hours = {
        7: transaction_line(0, 0x0, 7),
        9: transaction_line(1, 0x1, 9) + transaction_line(2, 0x1, 9),
        10: transaction_line(3, 0x2, 10, ack=True) + transaction_line(4, 0x0, 10),
    }
    begins = offsets_of(hours)
    for hour, stored in ((7, None), (9, b"not gzip at all"), (10, None), (9, None)):
        write_fragment(journal, begins[hour], hours[hour], hour=hour, stored=stored)
        run_feeds(config, instance=instance, say=lambda _: None)

    changes = {(r["hour"][-2:], r["id"]) for r in rows(lake, "changes", "acmeco_customers")}
    assert changes == {("07", 0), ("10", 1), ("10", 2), ("10", 4)}


def test_documents_before_a_gap_wait_for_its_bytes_so_a_late_rollback_holds(spark, tmp_path):
    """A transaction at 08:05 is rolled back by an ACK at 09 (its clock below theirs), which lands
    last; another transaction commits at 10. Hour 10's run reads across the missing hour: what is
    pending there may be committed or rolled back by the missing bytes, so none of it is
    committed after them; the rolled-back documents never reach `changes` or `current`."""
    journal, lake, config, instance = customers_lake(tmp_path)
    rollback = build_uuid(clock_of(dt.datetime(2024, 6, 1, 8, 5, tzinfo=UTC)) + 8, 0x2, PRODUCER)
    hours = {
        7: transaction_line(0, 0x0, 7),
        8: transaction_line(1, 0x1, 8) + transaction_line(2, 0x1, 8),
        9: json.dumps({"_meta": {"uuid": rollback, "ack": True}}).encode() + b"\n",
        10: transaction_line(5, 0x1, 10)
        + transaction_line(6, 0x1, 10)
        + transaction_line(7, 0x2, 10, ack=True),
    }
    begins = offsets_of(hours)
    for hour in (7, 8, 10, 9):
        write_fragment(journal, begins[hour], hours[hour], hour=hour)
        run_feeds(config, instance=instance, say=lambda _: None)

    changes = {(r["hour"][-2:], r["id"]) for r in rows(lake, "changes", "acmeco_customers")}
    assert changes == {("07", 0), ("10", 5), ("10", 6)}
    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [0, 5, 6]


def transaction_across_another_producers_document() -> dict[int, bytes]:
    """Hour -> its fragment's content: a transaction's document at 10, another producer's
    document at 11, the transaction's ACK at 12."""
    other = bytes.fromhex("0f0e0d0c0b0a")
    by_other = build_uuid(clock_of(dt.datetime(2024, 6, 1, 11, 5, tzinfo=UTC)), 0x0, other)
    return {
        10: transaction_line(1, 0x1, 10),
        11: json.dumps({"id": 2, "name": "c2", "_meta": {"uuid": by_other}}).encode() + b"\n",
        12: transaction_line(3, 0x2, 12, ack=True),
    }


@pytest.mark.parametrize("landed", [(12, 10, 11), (10, 12, 11)])
def test_a_late_fragment_of_another_producer_filling_a_gap_lets_the_transaction_across_it_commit(
    spark, tmp_path, landed
):
    """A transaction's document at 10, another producer's document at 11 (the journal bytes
    between), the transaction's ACK at 12; hour 11's fragment lands last. The hour that read
    across the missing bytes cut the transaction there (`cut_by_gap`); the fragment filling the
    gap holds none of its documents, yet its run asks that hour to run again, and the
    transaction commits at 12, in whichever order the other two landed."""
    journal, lake, config, instance = customers_lake(tmp_path)
    hours = transaction_across_another_producers_document()
    begins = offsets_of(hours)
    for hour in landed:
        write_fragment(journal, begins[hour], hours[hour], hour=hour)
        run_feeds(config, instance=instance, say=lambda _: None)

    changes = {(r["hour"][-2:], r["id"]) for r in rows(lake, "changes", "acmeco_customers")}
    assert changes == {("11", 2), ("12", 1)}
    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [1, 2]
    assert not list((lake / "_state").glob("**/reruns/**/*.json"))  # answered, so withdrawn
    assert not list((lake / "_state").glob("**/reading_gaps/*.json"))  # no hour was read with a gap


def test_a_fragment_filling_a_hole_while_the_hour_reading_across_it_runs_asks_that_hour_again(
    spark, tmp_path, monkeypatch
):
    """The fragment between a transaction's document (10) and its ACK (12) lands after the run
    of 10-12 listed the landing, and before it read: it reads across the hole. The fragment's
    own run asks the hours read with a hole it fills, but it may have looked before this run's
    reading existed (here it never sees one). So the run itself, still holding the table's
    lease, looks at what landed and asks its hours to run again: the transaction commits at 12
    within the same `lake-assets run`."""
    from lake_assets import pipeline

    journal, lake, config, instance = customers_lake(tmp_path)
    hours = transaction_across_another_producers_document()
    begins = offsets_of(hours)
    for hour in (10, 12):
        write_fragment(journal, begins[hour], hours[hour], hour=hour)
    real_ingest, landed_late = pipeline.ingest, []

    def ingest_after_a_late_landing(session, work, partitions, log=pipeline._log):
        if not landed_late:
            landed_late.append(write_fragment(journal, begins[11], hours[11], hour=11))
        return real_ingest(session, work, partitions, log)

    monkeypatch.setattr(pipeline, "ingest", ingest_after_a_late_landing)
    monkeypatch.setattr(pipeline.reruns, "readings_with_gaps", lambda *args: {})  # looked too early

    run_feeds(config, instance=instance, say=lambda _: None)

    changes = {(r["hour"][-2:], r["id"]) for r in rows(lake, "changes", "acmeco_customers")}
    assert landed_late and changes == {("11", 2), ("12", 1)}
    assert not list((lake / "_state").glob("**/reruns/**/*.json"))  # answered, so withdrawn
    assert not list((lake / "_state").glob("**/reading_gaps/*.json"))


def test_a_compaction_in_a_later_folder_with_its_originals_removed_keeps_every_document(spark, tmp_path):
    """A journal of two producers with transactions across hours lands in rounds; then a
    compaction of the fragments of hours 08 to 11 lands in folder 15, and the originals are
    removed. The hour whose acknowledgement commits their transaction is asked to read the
    compaction, in a later folder than its own: it read back only to its context hour, took the
    bytes between the compaction and its own for a gap, and its transaction's documents left
    `changes`. After every run the lake equals one run over the landing as it then stands."""
    plan = json.loads((Path(__file__).parent / "data" / "flow_compaction_in_a_later_folder.json").read_text())
    journal, lake, config, instance = customers_lake(tmp_path)
    written = {}

    def equals_one_run_over_the_landing(step: str) -> None:
        fresh = tmp_path / f"fresh-{step}"
        whole = config_for(tmp_path / "landing", fresh, {"acmeCo/customers": ["/id"]})
        run_feeds(whole, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
        for layer, of in (
            ("changes", lambda r: (r["hour"], r["n"])),
            ("current", lambda r: (r["id"], r["n"])),
        ):
            got = sorted((of(r) for r in rows(lake, layer, "acmeco_customers")), key=repr)
            want = sorted((of(r) for r in rows(fresh, layer, "acmeco_customers")), key=repr)
            assert got == want, (step, layer)

    for round_ in plan["rounds"]:
        for fragment in round_:
            content = fragment["content"].encode()
            written[fragment["hour"], fragment["begin"]] = (
                content,
                write_fragment(journal, fragment["begin"], content, hour=fragment["hour"]),
            )
        run_feeds(config, instance=instance, say=lambda _: None)
    equals_one_run_over_the_landing("landed")
    compacted = [written[f["hour"], f["begin"]] for f in plan["compaction"]["fragments"]]
    begin = plan["compaction"]["fragments"][0]["begin"]
    write_fragment(
        journal, begin, b"".join(content for content, _ in compacted), hour=plan["compaction"]["hour"]
    )
    run_feeds(config, instance=instance, say=lambda _: None)
    equals_one_run_over_the_landing("compaction beside")
    for _, path in compacted:
        path.unlink()
    run_feeds(config, instance=instance, say=lambda _: None)
    equals_one_run_over_the_landing("originals removed")
    assert landing_complete_passed(instance, "acmeco_customers") is True


def test_a_fragment_landing_in_a_later_folder_than_its_acknowledgement_is_read_there(spark, tmp_path):
    """The transaction's documents (journal bytes before the 10:05 ACK) land late, in folder
    11: hour 11's run asks hour 10 to run again, and that run reads the folder it was asked to."""
    journal, lake, config, instance = customers_lake(tmp_path)
    hours = transaction_across_hours(ack_hour=10)
    begins = offsets_of(hours)
    for hour, folder in ((7, 7), (10, 10), (8, 11)):
        write_fragment(journal, begins[hour], hours[hour], hour=folder)
        run_feeds(config, instance=instance, say=lambda _: None)

    changes = {(r["hour"][-2:], r["id"]) for r in rows(lake, "changes", "acmeco_customers")}
    assert changes == {("07", 0), ("10", 1), ("10", 2), ("10", 4)}
    assert not list((lake / "_state").glob("**/reruns/**/*.json"))


def test_a_transaction_read_again_asks_no_hour_that_saw_it_to_run_again(spark, tmp_path):
    """Hour 08's documents are acknowledged at 09:05. Run up to 08, their commit is not known yet;
    09's own run commits them. Running 08 again reads on to 09, and 09, which saw them, is left
    alone: a transaction across an hour never starts a chain of runs."""
    journal, lake, config, instance = customers_lake(tmp_path)
    hours, table = transaction_across_hours(ack_hour=9), "acmeco_customers"
    for hour, begin in offsets_of(hours).items():
        write_fragment(journal, begin, hours[hour], hour=hour)

    run_feeds(config, instance=instance, say=lambda _: None, last="2024-06-01-08")
    assert {r["id"] for r in rows(lake, "changes", table)} == {0}
    run_feeds(config, instance=instance, say=lambda _: None)
    assert {r["id"] for r in rows(lake, "changes", table)} == {0, 1, 2, 4}
    said: list[str] = []
    run_ids = run_feeds(
        config, instance=instance, say=said.append, first="2024-06-01-08", last="2024-06-01-08"
    )

    assert len(run_ids) == 1 and not any("to run again" in line for line in said), said
    assert not list((lake / "_state").glob("**/reruns/**/*.json"))
    changes = {(r["hour"], r["id"]) for r in rows(lake, "changes", table)}
    assert changes == {("2024-06-01-07", 0), ("2024-06-01-09", 1), ("2024-06-01-09", 2), ("2024-06-01-09", 4)}


def test_the_landing_sensor_runs_an_hour_asked_to_run_again(tmp_path):
    from lake_assets import reruns
    from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
    from lake_assets.paths import LakeLayout

    journal, _, config, _ = customers_lake(tmp_path)
    write_fragment(journal, 0, doc_line(1), hour=10)
    first = landing_sensor_tick(config)
    storage, layout = Storage(S3Config()), LakeLayout(config.lake)
    late = reruns.ByteRange("file:///late.gz", "acmeCo/customers/pivot=00", 0, 10)
    reruns.request_rerun(
        storage, layout, "flow", "acmeco_customers", "2024-06-01-10", "a late fragment", [late]
    )
    # the hour's files are not new: only the request runs it
    [request] = landing_sensor_tick(config, first.cursor).run_requests
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == ("2024-06-01-10", "2024-06-01-10")
    assert ":again:2024-06-01-10:" in request.run_key
    # a second request makes a run of its own: a run already done for the first does not hide it
    reruns.request_rerun(storage, layout, "flow", "acmeco_customers", "2024-06-01-10", "another", [late])
    [again] = landing_sensor_tick(config, first.cursor).run_requests
    assert again.run_key != request.run_key


def test_bad_fragments_are_named_quarantined_and_a_gap_is_reported(spark, tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    good = doc_line(1)
    offset = 0
    write_fragment(journal, offset, good)
    offset += len(good)
    mismatch = doc_line(2)
    bad_sum = write_fragment(journal, offset, mismatch, sum_of=b"other content")
    offset += len(mismatch)
    truncated_content = doc_line(3)
    truncated = write_fragment(
        journal, offset, truncated_content, stored=gzip.compress(truncated_content)[:-12]
    )
    offset += len(truncated_content)
    not_json = b'{"id": 4, "_meta": {"uuid": "x"\n'
    bad_json = write_fragment(journal, offset, not_json)
    offset += len(not_json)
    keyless_content = (
        json.dumps(
            {"name": "no id", "_meta": {"uuid": build_uuid(clock_of(HOUR) + 16 * 9, 0, PRODUCER), "op": "c"}}
        ).encode()
        + b"\n"
    )
    keyless = write_fragment(journal, offset, keyless_content)
    offset += len(keyless_content) + 1000  # the next fragment starts further on: a gap
    write_fragment(journal, offset, doc_line(5))

    instance = dg.DagsterInstance.ephemeral()
    config = config_for(landing, lake, {"acmeCo/customers": ["/id"]})
    run_feeds(config, instance=instance, say=lambda _: None)

    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [1, 5]
    notes = quarantine_notes(lake)
    assert "SHA-1 mismatch" in notes[uri(bad_sum)]
    assert "gzip" in notes[uri(truncated)]
    assert "not JSON" in notes[uri(bad_json)] and "offset" in notes[uri(bad_json)]
    assert (
        "no key ['/id']" in notes[uri(keyless)]
        and f"offset {offset - 1000 - len(keyless_content)}" in notes[uri(keyless)]
    )
    assert all(
        str(p.name) in text for p, text in ((bad_sum, notes[uri(bad_sum)]), (keyless, notes[uri(keyless)]))
    )

    metadata = metadata_of(instance, "acmeco_customers")
    assert metadata["files_quarantined"] == 4 and metadata["reconciled"] is True
    in_no_fragment = [g for g in metadata["gaps"] if "in no fragment" in g]
    assert len(in_no_fragment) == 1
    # no other fragment holds the quarantined fragments' bytes: each is lost, so each is a gap
    for path in (bad_sum, truncated, bad_json, keyless):
        assert [
            g for g in metadata["gaps"] if path.name in g and "only in fragment(s) that cannot be used" in g
        ]
    assert len(metadata["gaps"]) == 5
    assert landing_complete_passed(instance, "acmeco_customers") is False


def _name_not_utf8(fragment: Path) -> tuple[str, str]:
    odd = os.path.join(os.fsencode(fragment.parent), os.fsencode(fragment.name) + b"\xff")
    os.rename(fragment, odd)
    return f"{uri(fragment)}\\xff", "its name is not UTF-8 text"


def _link_to_nowhere(fragment: Path) -> tuple[str, str]:
    fragment.unlink()
    fragment.symlink_to(fragment.parent / "gone.gz")
    return uri(fragment), "a symbolic link that leads nowhere"


@pytest.mark.parametrize("spoil", [_name_not_utf8, _link_to_nowhere])
def test_a_fragment_no_one_can_open_is_reported_with_its_cause_and_its_hour_goes_on(spark, tmp_path, spoil):
    """A local fragment that cannot be opened (its name's bytes are not UTF-8, or it is a link
    that leads nowhere) is set aside with that cause, as Unit and GRAX files are, and the hour's
    other fragments are read, on every run: it never fails the table's catalog step."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    first = doc_line(1)
    write_fragment(journal, 0, first)
    file, cause = spoil(write_fragment(journal, len(first), doc_line(2)))

    config = config_for(landing, lake, {"acmeCo/customers": ["/id"]})
    for _ in range(2):
        run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
        assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [1]
    ((noted, reason),) = quarantine_notes(lake).items()
    assert noted == file and cause in reason


def test_hidden_and_marker_files_in_a_journal_are_not_data(spark, tmp_path):
    """Names starting with `_` or `.` (`_SUCCESS`, a `.crc` checksum, a `_temporary/` folder a
    copy tool left) are not data for Flow either, as for Spark, Hive and the other feeds: no
    fragment is named so, and they are neither read, set aside, nor strays."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    fragment = write_fragment(journal, 0, doc_line(1))
    (fragment.parent / "_SUCCESS").write_bytes(b"")
    (fragment.parent / f".{fragment.name}.crc").write_bytes(b"crc")
    (journal / "_temporary" / "0").mkdir(parents=True)
    (journal / "_temporary" / "0" / "part-0").write_bytes(b"half a copy")

    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config_for(landing, lake, {"acmeCo/customers": ["/id"]}), instance=instance, say=lambda _: None)

    assert [r["id"] for r in rows(lake, "current", "acmeco_customers")] == [1]
    assert quarantine_notes(lake) == {}
    metadata = metadata_of(instance, "acmeco_customers")
    assert (metadata["files_listed"], metadata["files_read"], metadata["files_stray"]) == (1, 1, 0)


def test_a_logical_partition_whose_field_starts_with_an_underscore_is_read(spark, tmp_path):
    """`_region=eu` is a partition folder, not a hidden one (Spark's rule too): its journals are
    read, never skipped unreported."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    write_fragment(landing / "acmeCo" / "customers" / "_region=eu" / "pivot=00", 0, doc_line(1))

    run_feeds(
        config_for(landing, lake, {"acmeCo/customers": ["/id"]}),
        instance=dg.DagsterInstance.ephemeral(),
        say=lambda _: None,
    )

    assert [r["id"] for r in rows(lake, "current", "acmeco_customers")] == [1]


def test_a_failed_fragment_gives_way_to_the_fragments_holding_the_same_bytes(spark, tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    docs, at = journal_lines(range(1, 9))

    def fragment(first: int, last: int, **how) -> Path:
        return write_fragment(journal, at[first], b"".join(docs[first:last]), **how)

    fragment(0, 2)
    corrupt = fragment(2, 5, sum_of=b"other bytes")  # reaches furthest from doc 3: the cover picks it
    fragment(2, 4)
    fragment(3, 5)  # overlaps the one before by a document
    not_gzip = fragment(5, 8, stored=b"not gzip at all")
    truncated = fragment(5, 7, stored=gzip.compress(b"".join(docs[5:7]))[:-9])  # the first stand-in fails too
    fragment(5, 6)
    fragment(6, 8, hour=11)  # a later hour's fragment holds the rest

    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config_for(landing, lake, {"acmeCo/customers": ["/id"]}), instance=instance, say=lambda _: None)

    assert sorted(r["id"] for r in rows(lake, "changes", "acmeco_customers")) == list(range(1, 9))
    notes = quarantine_notes(lake)
    assert set(notes) == {uri(corrupt), uri(not_gzip), uri(truncated)}
    assert "SHA-1 mismatch" in notes[uri(corrupt)] and corrupt.name in notes[uri(corrupt)]
    assert "(gzip: " in notes[uri(not_gzip)] and "(gzip: " in notes[uri(truncated)]
    metadata = metadata_of(instance, "acmeco_customers")
    assert metadata["gaps"] == [] and metadata["reconciled"] is True
    assert (metadata["files_listed"], metadata["files_read"], metadata["files_quarantined"]) == (8, 5, 3)
    assert metadata["rows_in"] == 8 and metadata["reader_counts"]["committed"] == 8
    assert landing_complete_passed(instance, "acmeco_customers") is True


def test_bytes_only_failed_fragments_hold_are_gaps_and_the_landing_is_incomplete(spark, tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    docs, at = journal_lines(range(1, 7))
    hidden = landing / "acmeCo" / "customers" / "pivot=00"
    write_fragment(hidden, 0, b"".join(docs[0:3]))
    write_fragment(hidden, at[3], b"".join(docs[3:6]))
    claim = hidden / "utc_date=2024-06-01" / "utc_hour=10" / f"{0:016x}-{1_000_000:016x}-{'ab' * 20}.gz"
    claim.write_bytes(bytes(range(256)) * 4)  # garbage whose name claims the whole journal and more
    damaged = landing / "acmeCo" / "customers" / "pivot=01"
    write_fragment(damaged, 0, doc_line(11))
    lost = write_fragment(damaged, len(doc_line(11)), doc_line(12), sum_of=b"other bytes")  # no other copy
    write_fragment(damaged, len(doc_line(11)) + len(doc_line(12)), doc_line(13))

    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config_for(landing, lake, {"acmeCo/customers": ["/id"]}), instance=instance, say=lambda _: None)

    assert sorted(r["id"] for r in rows(lake, "changes", "acmeco_customers")) == [1, 2, 3, 4, 5, 6, 11, 13]
    notes = quarantine_notes(lake)
    assert set(notes) == {uri(claim), uri(lost)}
    assert claim.name in notes[uri(claim)] and "(gzip: " in notes[uri(claim)]
    metadata = metadata_of(instance, "acmeco_customers")
    gaps = metadata["gaps"]
    assert len(gaps) == 2 and metadata["reconciled"] is True
    assert f"pivot=00: bytes {at[6]}..1000000 are only in fragment(s) that cannot be used" in gaps[0]
    assert claim.name in gaps[0]
    assert f"pivot=01: bytes {len(doc_line(11))}..{len(doc_line(11)) + len(doc_line(12))}" in gaps[1]
    assert lost.name in gaps[1]
    assert landing_complete_passed(instance, "acmeco_customers") is False


def test_a_document_whose_key_is_not_a_scalar_is_quarantined_with_its_offset(spark, tmp_path):
    """The feed's rule for a bad document is to set its fragment aside (as for a missing key or an
    unknown op); the fragment's good documents are then read from other fragments holding them, and
    what no other fragment holds is a gap, so nothing is dropped unseen."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    docs = [doc_line(1), doc_line(2, id={"a": 2}), doc_line(3), doc_line(4, id=[4, 5]), doc_line(5)]
    at = [sum(len(d) for d in docs[:i]) for i in range(len(docs) + 1)]
    object_key = write_fragment(journal, 0, b"".join(docs[0:3]))
    write_fragment(journal, 0, docs[0])  # documents 1 and 3 have other copies; document 2 has none
    write_fragment(journal, at[2], docs[2])
    array_key = write_fragment(journal, at[3], docs[3])
    write_fragment(journal, at[4], docs[4])

    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config_for(landing, lake, {"acmeCo/customers": ["/id"]}), instance=instance, say=lambda _: None)

    changes = rows(lake, "changes", "acmeco_customers")
    assert sorted(r["id"] for r in changes) == [1, 3, 5]  # and the key column stays a number
    notes = quarantine_notes(lake)
    assert set(notes) == {uri(object_key), uri(array_key)}
    assert (
        f"offset {at[1]}" in notes[uri(object_key)] and "key /id is a JSON object" in notes[uri(object_key)]
    )
    assert f"offset {at[3]}" in notes[uri(array_key)] and "key /id is a JSON array" in notes[uri(array_key)]
    metadata = metadata_of(instance, "acmeco_customers")
    assert metadata["reconciled"] is True
    assert [g.split(": ", 1)[1].split(" are")[0] for g in metadata["gaps"]] == [
        f"bytes {at[1]}..{at[2]}",
        f"bytes {at[3]}..{at[4]}",
    ]
    assert landing_complete_passed(instance, "acmeco_customers") is False


def test_documents_no_rule_foresaw_set_their_fragment_aside_not_the_batch(spark, tmp_path):
    """An op that is not text (JSON has arrays and objects too) and a field nested deeper than
    Python's parser goes each failed the whole batch, every good fragment with it, on every run."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"

    def with_op(n: int, op) -> bytes:
        doc = json.loads(doc_line(n))
        doc["_meta"]["op"] = op
        return json.dumps(doc).encode() + b"\n"

    deep = doc_line(4, deep="@").replace(b'"@"', b"[" * 5000 + b"]" * 5000)
    docs = [doc_line(1), with_op(2, ["c"]), with_op(3, {"c": 1}), deep, doc_line(5)]
    at = [sum(len(d) for d in docs[:i]) for i in range(len(docs) + 1)]
    bad = {
        write_fragment(journal, at[i], docs[i]): reason
        for i, reason in (
            (1, "unknown _meta.op ['c']"),
            (2, "unknown _meta.op {'c': 1}"),
            (3, "nested too deeply"),
        )
    }
    write_fragment(journal, 0, docs[0])
    write_fragment(journal, at[4], docs[4])

    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config_for(landing, lake, {"acmeCo/customers": ["/id"]}), instance=instance, say=lambda _: None)

    assert sorted(r["id"] for r in rows(lake, "changes", "acmeco_customers")) == [1, 5]
    notes = quarantine_notes(lake)
    assert set(notes) == {uri(path) for path in bad}
    for path, reason in bad.items():
        assert reason in notes[uri(path)], notes[uri(path)]
    assert metadata_of(instance, "acmeco_customers")["reconciled"] is True


def test_number_keys_keep_their_values_or_their_fragment_is_set_aside(spark, tmp_path):
    """Spark's JSON reading infers a number with a fraction, or beyond 64 bits, as a double:
    beside one, the keys 2^53 and 2^53 + 1 both read as 2^53, and one record was gone."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    big = 2**53
    docs = [doc_line(1, id=big), doc_line(2, id=big + 1), doc_line(3, id=1.5), doc_line(4, id=10**40)]
    at = [sum(len(d) for d in docs[:i]) for i in range(len(docs) + 1)]
    write_fragment(journal, 0, b"".join(docs[:2]))
    fraction = write_fragment(journal, at[2], docs[2])
    too_long = write_fragment(journal, at[3], docs[3])

    run_feeds(
        config_for(landing, lake, {"acmeCo/customers": ["/id"]}),
        instance=dg.DagsterInstance.ephemeral(),
        say=lambda _: None,
    )

    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [big, big + 1]
    notes = quarantine_notes(lake)
    assert set(notes) == {uri(fraction), uri(too_long)}
    assert "key /id is the number 1.5" in notes[uri(fraction)]
    assert f"key /id is the number {10**40}"[:40] in notes[uri(too_long)]


def test_a_text_key_beside_number_keys_sets_its_fragment_aside_instead_of_merging_keys(spark, tmp_path):
    """Read together, Spark makes a key column of numbers and texts text: the keys 1 and "1"
    became one, and `current` kept only the later. The kind most documents give the key stands;
    the fragment holding the other kind is set aside, naming the document."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    docs = [doc_line(1), doc_line(2), doc_line(3, id="1", name="text one"), doc_line(4)]
    at = [sum(len(d) for d in docs[:i]) for i in range(len(docs) + 1)]
    write_fragment(journal, 0, b"".join(docs[:2]))
    text_key = write_fragment(journal, at[2], docs[2])
    write_fragment(journal, at[3], docs[3])

    run_feeds(
        config_for(landing, lake, {"acmeCo/customers": ["/id"]}),
        instance=dg.DagsterInstance.ephemeral(),
        say=lambda _: None,
    )

    current = {r["id"]: r["name"] for r in rows(lake, "current", "acmeco_customers")}
    assert current == {1: "c1", 2: "c2", 4: "c4"}
    notes = quarantine_notes(lake)
    assert set(notes) == {uri(text_key)}
    assert "key /id is text ('1') where the collection's key is number" in notes[uri(text_key)]


@pytest.mark.parametrize(
    "value, kind",
    [
        (True, "boolean"),
        (False, "boolean"),
        (0, "number"),
        (2**63 - 1, "number"),
        ("1", "text"),
        ("", "text"),
    ],
)
def test_a_key_values_kind_is_its_json_kind_with_booleans_apart_from_numbers(value, kind):
    from lake_assets.feeds.flow_documents import key_kind

    assert key_kind(value) == kind


def test_the_stored_key_column_gives_the_kind_and_a_column_of_another_type_gives_none():
    from pyspark.sql import types as T

    from lake_assets.feeds.flow_documents import stored_key_kinds

    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("Region", T.StringType()),
            T.StructField("flag", T.BooleanType()),
            T.StructField("at", T.TimestampType()),
        ]
    )
    key = ("/id", "/region", "/flag", "/at", "/missing")
    assert stored_key_kinds(schema, key) == {"/id": "number", "/region": "text", "/flag": "boolean"}
    assert stored_key_kinds(None, key) == {}


def test_of_kinds_a_batch_gives_a_key_the_most_common_stands_and_a_tie_goes_to_the_first_kind():
    from lake_assets.feeds.flow_journal import _PassNotes

    found = _PassNotes(
        key_kinds={
            "/id": {"text": 2, "number": 2},
            "/region": {"text": 3, "boolean": 1},
            "/n": {"number": 5},
        }
    )
    assert found.mixed_key_kinds() == {"/id": "number", "/region": "text"}


def test_a_later_batch_whose_key_is_text_where_the_table_holds_numbers_is_set_aside(spark, tmp_path):
    """Across runs the table's stored key column gives the kind: a later hour writing the key as
    text (all its documents alike) is set aside rather than turning the stored keys into text."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    config = config_for(landing, lake, {"acmeCo/customers": ["/id"]})
    instance = dg.DagsterInstance.ephemeral()
    first = doc_line(1) + doc_line(2)
    write_fragment(journal, 0, first)
    run_feeds(config, instance=instance, say=lambda _: None)
    later = write_fragment(journal, len(first), doc_line(5, id="1", name="text one"), hour=11)

    run_feeds(config, instance=instance, say=lambda _: None)

    assert {r["id"]: r["name"] for r in rows(lake, "current", "acmeco_customers")} == {1: "c1", 2: "c2"}
    assert "key /id is text ('1') where the collection's key is number" in quarantine_notes(lake)[uri(later)]


def test_a_field_null_in_every_document_of_a_later_hour_keeps_its_stored_type(spark, tmp_path):
    """Spark infers a field that is null in every document as text: beside the stored numbers it
    turned the column into text for good (and history's closed files with it). A field null
    everywhere in a batch is NULL in the stored type, as absent fields are."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    config = config_for(landing, lake, {"acmeCo/customers": ["/id"]})
    instance = dg.DagsterInstance.ephemeral()
    first = doc_line(1, score=7) + doc_line(2, score=8)
    write_fragment(journal, 0, first)
    run_feeds(config, instance=instance, say=lambda _: None)
    write_fragment(journal, len(first), doc_line(5, id=1, score=None), hour=11)

    run_feeds(config, instance=instance, say=lambda _: None)

    from pyspark.sql import types as T

    current = spark.read.parquet(str(lake / "current" / "flow" / "acmeco_customers"))
    assert current.schema["score"].dataType == T.LongType()
    assert {r["id"]: r["score"] for r in rows(lake, "current", "acmeco_customers")} == {1: None, 2: 8}


def test_a_compression_bomb_is_quarantined_not_inflated(spark, tmp_path, monkeypatch):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    docs, at = journal_lines(range(1, 5))
    write_fragment(journal, 0, docs[0])
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    bomb = b"".join(packer.compress(bytes(1 << 20)) for _ in range(256)) + packer.flush()  # 256 MiB of zeros
    bombed = write_fragment(journal, at[1], docs[1], stored=bomb)
    oversized = (
        journal / "utc_date=2024-06-01" / "utc_hour=10" / f"{at[2]:016x}-{at[2] + 5000:016x}-{'cd' * 20}.gz"
    )
    oversized.write_bytes(gzip.compress(b"x" * 10))
    write_fragment(journal, at[2] + 5000, docs[3])
    monkeypatch.setattr(FlowJournalFormat, "max_fragment_bytes", 4096)  # a feed may lower the limit

    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config_for(landing, lake, {"acmeCo/customers": ["/id"]}), instance=instance, say=lambda _: None)

    assert sorted(r["id"] for r in rows(lake, "changes", "acmeco_customers")) == [1, 4]
    notes = quarantine_notes(lake)
    assert set(notes) == {uri(bombed), uri(oversized)}
    assert f"content inflates to more than {len(docs[1])} bytes" in notes[uri(bombed)]
    assert bombed.name in notes[uri(bombed)]
    assert "declares 5000 bytes, more than the limit of 4096" in notes[uri(oversized)]
    metadata = metadata_of(instance, "acmeco_customers")
    assert metadata["reconciled"] is True and len(metadata["gaps"]) == 2  # the bytes only the two held


def test_files_outside_valid_hour_folders_are_stray_never_a_crash(spark, tmp_path):
    from lake_assets.orchestration.resources import LakeResource
    from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG

    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    docs, at = journal_lines(range(1, 10))
    write_fragment(journal, 0, docs[0])
    strays = {}  # file -> what its quarantine reason must say
    for n, (folder, cause) in enumerate(
        [
            (
                "utc_date=2024-06-01/utc_hour=25",
                "folder 'utc_date=2024-06-01/utc_hour=25' is not an hour folder",
            ),
            ("utc_date=2024-02-30/utc_hour=01", "folder 'utc_date=2024-02-30' is not a valid utc_date"),
            (
                "utc_date=2024-06-01/utc_hour=7",
                "folder 'utc_date=2024-06-01/utc_hour=7' is not an hour folder",
            ),
            ("utc_date=2024-13-01/utc_hour=10", "folder 'utc_date=2024-13-01' is not a valid utc_date"),
            ("utc_date=June-1/utc_hour=10", "folder 'utc_date=June-1' is not a valid utc_date"),
            (
                "utc_date=2024-06-01",
                "directly in 'utc_date=2024-06-01', not inside one of its utc_hour=HH folders",
            ),
            ("", "directly in journal folder 'acmeCo/customers/pivot=00'"),
            (
                "utc_date=2999-06-01/utc_hour=10",
                "hour folder 'acmeCo/customers/pivot=00/utc_date=2999-06-01/utc_hour=10' is dated "
                "2999-06-01-10, after the current UTC hour",
            ),
        ],
        start=1,
    ):
        name = f"{at[n]:016x}-{at[n + 1]:016x}-{hashlib.sha1(docs[n]).hexdigest()}.gz"
        path = journal / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(docs[n]))
        strays[uri(path)] = cause
    nested = (
        journal / "utc_date=2024-06-01" / "utc_hour=10" / "retry" / "copy.gz"
    )  # a folder inside an hour folder
    nested.parent.mkdir()
    nested.write_bytes(b"x")
    strays[uri(nested)] = "inside 'retry', a folder within hour folder 'utc_date=2024-06-01/utc_hour=10'"
    notes_file = landing / "acmeCo" / "customers" / "README"
    notes_file.write_text("not a journal")
    strays[uri(notes_file)] = "'acmeCo/customers/README' is neither a logical partition"
    config = config_for(landing, lake, {"acmeCo/customers": ["/id"]})

    defs = discovered_definitions(config)  # one bad folder name must not stop every feed of the config
    sensor = defs.resolve_sensor_def("flow_landing_sensor")

    def first_tick() -> list[tuple[str, str]]:
        resources = {"lake": LakeResource(root=config.lake)}
        with dg.build_sensor_context(resources=resources, definitions=defs) as context:
            return [(r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]) for r in sensor(context).run_requests]

    assert first_tick() == [("2024-06-01-10", "2024-06-01-10")]
    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config, instance=instance, say=lambda _: None)

    assert [r["id"] for r in rows(lake, "changes", "acmeco_customers")] == [1]
    notes = quarantine_notes(lake)
    assert set(notes) == set(strays)
    for file, cause in strays.items():
        assert cause in notes[file], notes[file]
    metadata = metadata_of(instance, "acmeco_customers")
    assert metadata["files_quarantined"] == len(strays) and metadata["reconciled"] is True
    assert landing_complete_passed(instance, "acmeco_customers") is False

    # processed with the files it holds, it needs no run: a first scan leaves it out
    assert first_tick() == []


def test_invalid_hour_folders_are_neither_partitions_nor_spans(tmp_path):
    landing = tmp_path / "landing"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    good = write_fragment(journal, 0, doc_line(1))
    bad = []
    for folder in ("utc_date=2024-02-30/utc_hour=01", "utc_date=2024-06-01/utc_hour=25"):
        path = journal / folder / good.name
        path.parent.mkdir(parents=True)
        path.write_bytes(good.read_bytes())
        bad.append(path)
    fmt, storage = FlowJournalFormat((CollectionConfig(name="acmeCo/customers", key=("/id",)),)), Storage()
    assert fmt.partition_keys(storage, f"file://{landing}", "acmeco_customers") == ["2024-06-01-10"]
    assert [fmt.landing_span(storage, uri(p)) for p in bad] == [None, None]
    assert fmt.landing_span(storage, uri(good)) == (1717236000000, 1717239599999)
    strays = fmt.stray_files(storage, f"file://{landing}", "acmeco_customers")
    assert sorted(entry.uri for entry, _ in strays) == sorted(uri(p) for p in bad)


def test_a_link_to_a_folder_where_no_hour_is_read_is_one_stray_and_a_real_folder_there_has_each_file(
    tmp_path,
):
    """A link to a large tree (a share's root) in an hour folder, in a folder within it, or in
    the collection where no journal is, is reported once and not walked through; a real folder
    there still has each of its files reported."""
    landing = tmp_path / "landing"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    tree = tmp_path / "share"
    links, nested = links_to_a_tree_beside_a_real_folder(
        write_fragment(journal, 0, doc_line(1)), tree, landing / "acmeCo" / "customers" / "elsewhere"
    )
    fmt = FlowJournalFormat((CollectionConfig(name="acmeCo/customers", key=("/id",)),))

    strays = {e.uri: r for e, r in fmt.stray_files(Storage(), f"file://{landing}", "acmeco_customers")}

    assert set(strays) == {*map(uri, links), uri(nested)}
    assert all(f"symbolic link to the folder {tree.resolve()}" in strays[uri(link)] for link in links)
    assert "a folder within hour folder" in strays[uri(nested)]
    # the walk of a link it may not follow, asked with a trailing slash, is still the one entry
    walked = list(Storage().walk_files(f"{uri(links[-1])}/", follow_link=lambda folders: False))
    assert [entry.unreadable is not None for entry in walked] == [True]


def test_a_file_or_a_link_loop_where_another_journal_has_the_hour_folder_is_a_stray_not_a_crash(tmp_path):
    """A run asks each journal for the hour's folder. A regular file named like it in one
    journal, or a link there that leads round a loop, made the listing raise and stopped the
    table; each holds no fragment, and the walk for strays reports it."""
    landing = tmp_path / "landing"
    collection = landing / "acmeCo" / "customers"
    good = write_fragment(collection / "pivot=00", 0, doc_line(1))
    hour_folder = good.parent.relative_to(collection / "pivot=00")
    a_file = collection / "pivot=01" / hour_folder
    a_file.parent.mkdir(parents=True)
    a_file.write_bytes(b"not a folder")
    a_loop = collection / "pivot=02" / hour_folder
    a_loop.parent.mkdir(parents=True)
    a_loop.symlink_to(a_loop.name)
    fmt, storage = FlowJournalFormat((CollectionConfig(name="acmeCo/customers", key=("/id",)),)), Storage()
    table, key = "acmeco_customers", "2024-06-01-10"

    read = fmt.partitions_files(storage, f"file://{landing}", table, [key])[key]
    assert [e.uri for e in read] == [uri(good)]
    walked = fmt.landed_hours(storage, f"file://{landing}", table, None)[key]
    assert [e.uri for e in walked] == [uri(good)]  # the walk agrees
    strays = {e.uri for e, _ in fmt.stray_files(storage, f"file://{landing}", table)}
    assert strays == {uri(a_file), uri(a_loop)}


def test_links_back_up_the_collection_are_loops_not_more_journals(tmp_path):
    """A logical partition linked to its own collection (`region=eu -> .`) listed every journal
    again under each spelling of the loop, and a journal linked to the landing had every other
    table's file reported as this table's stray. Each is one stray, a loop, and nothing else."""
    landing = tmp_path / "landing"
    collection = landing / "acmeCo" / "customers"
    good = write_fragment(collection / "region=us" / "pivot=00", 0, doc_line(1))
    other_table = write_fragment(landing / "acmeCo" / "orders" / "pivot=00", 0, doc_line(2))
    again = collection / "region=eu"
    again.symlink_to(".", target_is_directory=True)
    up = collection / "region=us" / "pivot=01"
    up.symlink_to("../../..", target_is_directory=True)
    fmt, storage = FlowJournalFormat((CollectionConfig(name="acmeCo/customers", key=("/id",)),)), Storage()
    table = "acmeco_customers"

    assert [j.uri for j in fmt.journals(storage, f"file://{landing}", table)] == [uri(good.parents[2])]
    assert [e.uri for e in fmt.landed_hours(storage, f"file://{landing}", table, None)["2024-06-01-10"]] == [
        uri(good)
    ]
    strays = {e.uri: why for e, why in fmt.stray_files(storage, f"file://{landing}", table)}
    assert set(strays) == {uri(again), uri(up)}, f"{uri(other_table)} is the orders table's"
    assert all("a loop; not followed" in why for why in strays.values()), strays


def test_fragment_listing_is_pruned_to_the_hours_asked_for(tmp_path):
    landing = tmp_path / "landing"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    offset = 0
    for hour in range(10, 16):
        line = doc_line(hour)
        write_fragment(journal, offset, line, hour=hour)
        offset += len(line)

    storage = CountingStorage()
    fmt = FlowJournalFormat((CollectionConfig(name="acmeCo/customers", key=("/id",)),))
    files = fmt.partition_files(storage, f"file://{landing}", "acmeco_customers", "2024-06-01-12")
    assert [f.name.split("-")[0] for f in files] == [f"{len(doc_line(10)) + len(doc_line(11)):016x}"]
    assert not any("utc_hour=1" in f and not f.endswith("utc_hour=12") for f in storage.listed)
    hours = fmt.landed_hours(storage, f"file://{landing}", "acmeco_customers", dt.datetime(2024, 6, 1, 14))
    assert sorted(hours) == ["2024-06-01-14", "2024-06-01-15"]


def landing_sensor_tick(config: LakeConfig, cursor: str | None = None) -> dg.SensorResult:
    """One evaluation of the Flow feed's landing sensor."""
    from lake_assets.orchestration.resources import LakeResource

    defs = discovered_definitions(config)
    sensor = defs.resolve_sensor_def("flow_landing_sensor")
    resources = {"lake": LakeResource(root=config.lake)}
    with dg.build_sensor_context(resources=resources, definitions=defs, cursor=cursor) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def test_the_landing_sensor_requests_hours_with_new_fragments(tmp_path):
    from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG

    journal, _, config, _ = customers_lake(tmp_path)
    first = doc_line(1)
    write_fragment(journal, 0, first, hour=10)
    tick = landing_sensor_tick(config)
    assert [(r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]) for r in tick.run_requests] == [
        ("2024-06-01-10", "2024-06-01-10")
    ]
    write_fragment(journal, len(first), doc_line(2), hour=11)
    later = landing_sensor_tick(config, tick.cursor)
    assert [(r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]) for r in later.run_requests] == [
        ("2024-06-01-11", "2024-06-01-11")
    ]


def test_the_flow_graph_runs_on_s3_through_s3a(sample_lake, moto_server, s3_bucket, spark):
    sample, local_lake, _ = sample_lake
    s3 = boto3.client("s3", endpoint_url=moto_server.url, region_name="us-east-1")
    for path in sample.files:
        s3.upload_file(str(path), s3_bucket, f"flow/{path.relative_to(sample.landing_dir)}")
    cols = (CollectionConfig(name="acmeCo/customers", key=tuple(sample.collections["acmeCo/customers"])),)
    config = LakeConfig(
        lake=f"s3a://{s3_bucket}/lake",
        feeds=(
            FeedConfig(
                name="flow", format="flow_journal", landing=f"s3a://{s3_bucket}/flow", collections=cols
            ),
        ),
        s3=S3Config(endpoint_url=moto_server.url),
    )
    run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
    got = sorted(
        (r["id"], r["_seq"])
        for r in spark.read.parquet(f"s3a://{s3_bucket}/lake/current/flow/acmeco_customers").collect()
    )
    want = sorted((r["id"], r["_seq"]) for r in rows(local_lake, "current", "acmeco_customers"))
    assert got == want and got


def test_only_selected_logical_partitions_are_listed(tmp_path):
    landing = tmp_path / "landing"
    for category in ("Anvils", "Rockets"):
        write_fragment(landing / "acmeCo" / "orders" / f"category={category}" / "pivot=00", 0, doc_line(1))
    storage = CountingStorage()
    selected = CollectionConfig(name="acmeCo/orders", key=("/id",), partitions=(("category", ("Anvils",)),))
    fmt = FlowJournalFormat((selected,))
    journals = fmt.journals(storage, f"file://{landing}", "acmeco_orders")
    assert [j.name for j in journals] == ["acmeCo/orders/category=Anvils/pivot=00"]
    assert not any("category=Rockets" in folder for folder in storage.listed)
    assert sorted(fmt.landed_hours(storage, f"file://{landing}", "acmeco_orders", None)) == ["2024-06-01-10"]


def test_a_logical_partition_left_out_of_the_selection_is_named_by_every_run(spark, tmp_path):
    """Narrowing a collection's `partitions` takes the rows read from the folders it leaves out
    out of `changes`, as a removal of their files would. Their files are still landed, so the
    run says which folders no table reads now and why (the planning reason alone said only
    `removed`), and so does every run after it, and `lake-assets discover` names each."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    for n, category in enumerate(("Anvils", "Rockets"), 1):
        write_fragment(landing / "acmeCo" / "orders" / f"category={category}" / "pivot=00", 0, doc_line(n))

    def config(*selected: str) -> LakeConfig:
        selection = (("category", selected),) if selected else ()
        collection = CollectionConfig(name="acmeCo/orders", key=("/id",), partitions=selection)
        return LakeConfig(
            lake=f"file://{lake}",
            feeds=(
                FeedConfig(
                    name="flow", format="flow_journal", landing=f"file://{landing}", collections=(collection,)
                ),
            ),
        )

    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config(), instance=instance, say=lambda _: None)
    assert sorted(r["id"] for r in rows(lake, "changes", "acmeco_orders")) == [1, 2]

    for _ in range(2):
        said: list[str] = []
        run_feeds(config("Anvils"), instance=instance, say=said.append)
        left_out = [line for line in said if "not read, no table's" in line]
        assert (
            len(left_out) == 1
            and "/category=Rockets/: not among collection acmeCo/orders's partitions" in left_out[0]
        )
        assert "(category: Anvils)" in left_out[0], left_out
        assert sorted(r["id"] for r in rows(lake, "changes", "acmeco_orders")) == [1]
    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_orders")) == [1, 2]  # a fold only adds


def test_a_logical_partition_another_feed_over_the_landing_reads_is_not_named_as_unread(tmp_path):
    """Two feeds over one landing split a collection's logical partitions between them: neither
    names the other's folders as read by no table; a folder neither selects, both name."""
    landing = tmp_path / "landing"
    for category in ("Anvils", "Rockets", "Bolts"):
        write_fragment(landing / "acmeCo" / "orders" / f"category={category}" / "pivot=00", 0, doc_line(1))
    feeds = tuple(
        FeedConfig(
            name=name,
            format="flow_journal",
            landing=f"file://{landing}",
            collections=(
                CollectionConfig(name="acmeCo/orders", key=("/id",), partitions=(("category", (value,)),)),
            ),
        )
        for name, value in (("flow_a", "Anvils"), ("flow_r", "Rockets"))
    )
    config = LakeConfig(lake=f"file://{tmp_path / 'lake'}", feeds=feeds)

    found = discover(config, Storage(S3Config()))

    for feed in found:
        assert [line.split("/: ")[0].rsplit("/", 1)[-1] for line in feed.unread] == ["category=Bolts"], (
            feed.unread
        )


def test_a_nested_logical_partition_is_read_by_another_feed_only_if_it_selects_each_level(tmp_path):
    """Partitions two levels deep: the other feed over the landing selects `region=eu` only, so
    `region=us/category=Rockets`, which this feed leaves out, is read by no table either."""
    landing = tmp_path / "landing"
    for region, category in (("us", "Anvils"), ("us", "Rockets"), ("eu", "Rockets")):
        folder = landing / "acmeCo" / "orders" / f"region={region}" / f"category={category}"
        write_fragment(folder / "pivot=00", 0, doc_line(1))

    def feed(name: str, *selection: tuple[str, tuple[str, ...]]) -> FeedConfig:
        orders = CollectionConfig(name="acmeCo/orders", key=("/id",), partitions=selection)
        return FeedConfig(
            name=name, format="flow_journal", landing=f"file://{landing}", collections=(orders,)
        )

    feeds = (
        feed("flow_us", ("region", ("us",)), ("category", ("Anvils",))),
        feed("flow_eu", ("region", ("eu",))),
    )
    config = LakeConfig(lake=f"file://{tmp_path / 'lake'}", feeds=feeds)

    found = {f.feed.name: f.unread for f in discover(config, Storage(S3Config()))}

    assert [line.split("/: ")[0].split("orders/")[1] for line in found["flow_us"]] == [
        "region=us/category=Rockets"
    ]
    assert [line.split("/: ")[0].split("orders/")[1] for line in found["flow_eu"]] == []


@pytest.mark.parametrize("table", ["acmeco_orders", "acmeco_customers"])
def test_every_change_carries_the_instant_its_run_read_it(sample_lake, table):
    _, lake, instance = sample_lake
    assert_read_during_the_runs({r["_ingested_at"] for r in rows(lake, "changes", table)}, instance)


def test_a_field_whose_column_is_a_nested_keys_column_sets_its_fragment_aside(spark, tmp_path):
    """With the key `/a/b` stored as column `a_b`, a document's own top-level field `a_b` (or
    `A_B`) has nowhere to go: its value was dropped without a word. Its fragment is set aside
    saying which field and key (or, for `A_B`, which names Spark cannot tell apart), and the
    other fragments are read."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"

    def line(n: int, **fields) -> bytes:
        doc = {"a": {"b": n}, **fields, "_meta": {"uuid": build_uuid(clock_of(HOUR) + 16 * n, 0, PRODUCER)}}
        return json.dumps(doc).encode() + b"\n"

    good = line(1, name="one")
    write_fragment(journal, 0, good)
    clashing = line(2, a_b="top-level") + line(3, name="three")
    set_aside = write_fragment(journal, len(good), clashing)
    upper = line(4, A_B="upper")
    set_aside_too = write_fragment(journal, len(good) + len(clashing), upper)
    run_feeds(config_for(landing, lake, {"acmeCo/customers": ["/a/b"]}), say=lambda _: None)

    assert [r["a_b"] for r in rows(lake, "changes", "acmeco_customers")] == [1]
    notes = quarantine_notes(lake)
    assert "a field 'a_b' whose column is the column of the key /a/b" in notes[uri(set_aside)]
    assert "columns 'A_B' and 'a_b', whose names are equal ignoring case" in notes[uri(set_aside_too)]


def test_values_spark_would_refuse_or_change_make_their_columns_text_and_stop_nothing(spark, tmp_path):
    """Spark's JSON reading takes `""` for a value of any type: beside numbers or booleans it read
    the column as those and then refused the `""`, and the table failed on every run, its good
    journals with it. An integer of more than 38 digits read as a double (rounded), and a number
    past a double's range as infinity (or, too small, zero), without a word. A UUID dated past
    what a 64-bit sequence orders failed the table too."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    collection = landing / "acmeCo" / "customers"
    forty_one_digits = "1" * 41

    def raw_line(n: int, fields: str, *, at: dt.datetime = HOUR) -> bytes:
        meta = {"uuid": build_uuid(clock_of(at) + 16 * n, 0, PRODUCER), "op": "c"}
        return f'{{"id": {n}, {fields}, "_meta": {json.dumps(meta)}}}\n'.encode()

    write_fragment(collection / "pivot=00", 0, doc_line(1, amount=5, flag=True, big=7, tiny=1.5, huge=2.5))
    write_fragment(
        collection / "pivot=01",
        0,
        raw_line(2, f'"amount": "", "flag": "", "big": {forty_one_digits}, "tiny": 1e-400, "huge": -1e400'),
    )
    far = write_fragment(
        collection / "pivot=02", 0, raw_line(3, '"amount": 1', at=dt.datetime(3500, 1, 1, tzinfo=UTC))
    )
    key = write_fragment(
        collection / "pivot=03", 0, raw_line(4, '"amount": 1').replace(b'"id": 4', b'"id": 1e400')
    )

    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config_for(landing, lake, {"acmeCo/customers": ["/id"]}), instance=instance, say=lambda _: None)

    changed = {r["id"]: r for r in rows(lake, "changes", "acmeco_customers")}
    assert sorted(changed) == [1, 2]
    values = {c: (changed[1][c], changed[2][c]) for c in ("amount", "flag", "big", "tiny", "huge")}
    assert values == {
        "amount": ("5", ""),
        "flag": ("true", ""),
        "big": ("7", forty_one_digits),
        "tiny": ("1.5", "1e-400"),
        "huge": ("2.5", "-1e400"),
    }
    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [1, 2]
    notes = quarantine_notes(lake)
    assert set(notes) == {uri(far), uri(key)}
    assert "dated on or after 3409-07-08" in notes[uri(far)]
    assert "key /id is the number 1e400:" in notes[uri(key)]
    assert metadata_of(instance, "acmeco_customers")["reconciled"] is True


def test_fields_spelled_alike_but_for_case_are_one_column_holding_every_value(spark, tmp_path):
    """Spark's reading of JSON merges `totalAmount` and `totalamount` into one column, and then
    (given the schema, as a column holding empty text is) read the values of one spelling only:
    every value spelled the other way became NULL, with no word."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    docs = [
        doc_line(1, totalAmount=5),
        doc_line(2, totalamount=7),
        doc_line(3, totalamount=""),
        doc_line(4, Region="eu", z=1),
        doc_line(5, region="us", z=2),
    ]
    write_fragment(journal, 0, b"".join(docs))

    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config_for(landing, lake, {"acmeCo/customers": ["/id"]}), instance=instance, say=lambda _: None)

    current = {r["id"]: r for r in rows(lake, "current", "acmeco_customers")}
    assert {c for c in current[1] if c.lower() in ("totalamount", "region")} == {"totalAmount", "Region"}
    assert [(current[n]["totalAmount"], current[n]["Region"]) for n in (1, 2, 3, 4, 5)] == [
        ("5", None),
        ("7", None),
        ("", None),
        (None, "eu"),
        (None, "us"),
    ]
    assert metadata_of(instance, "acmeco_customers")["reconciled"] is True


def test_journals_under_partition_folders_flow_escapes_are_read(spark, tmp_path):
    """Flow names a logical partition's folder with its value URL-escaped (`Anvils%20Co`) or,
    for a number, `true` or null, as `%_42`. The fragments' paths, as Spark's binary read gives
    them, are not encoded; they were decoded all the same: an escaped folder named another file,
    so its fragments were dropped from the read without a word (and noted as processed), and
    `%_42` failed the whole collection on every run."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    folders = ("category=plain", "category=Anvils%20Co", "category=%_42", "category=a+b%2Fc")
    for index, folder in enumerate(folders):
        journal = landing / "acmeCo" / "customers" / folder / "pivot=00"
        write_fragment(journal, 0, b"".join(doc_line(10 * index + n, folder=folder) for n in range(3)))
    instance = dg.DagsterInstance.ephemeral()

    run_feeds(config_for(landing, lake, {"acmeCo/customers": ["/id"]}), instance=instance, say=lambda _: None)

    stored = rows(lake, "changes", "acmeco_customers")
    assert sorted((r["folder"], r["id"]) for r in stored) == sorted(
        (folder, 10 * index + n) for index, folder in enumerate(folders) for n in range(3)
    )
    assert quarantine_notes(lake) == {}
    assert metadata_of(instance, "acmeco_customers")["reconciled"] is True


def test_a_bad_fragment_under_an_escaped_partition_folder_is_set_aside_by_its_own_name(spark, tmp_path):
    """A fragment that fails, in a journal whose logical-partition folder holds Flow's escapes
    (`Anvils%20Co`), is set aside under its name as listed: its copy holds its bytes, its note
    is filed under its hour, and once it reads again the entry is withdrawn."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    journal = landing / "acmeCo" / "customers" / "category=Anvils%20Co" / "pivot=00"
    content = doc_line(1)
    bad = write_fragment(journal, 0, content, sum_of=b"other content")
    config = config_for(landing, lake, {"acmeCo/customers": ["/id"]})

    run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)

    (note,) = [json.loads(p.read_text()) for p in (lake / "_quarantine").rglob("*.reason.json")]
    assert note["file"] == uri(bad) and note["partition"] == "2024-06-01-10"
    assert "SHA-1 mismatch" in note["reason"] and "copy failed" not in note["reason"]

    bad.unlink()
    write_fragment(journal, 0, content)
    run_feeds(config, instance=dg.DagsterInstance.ephemeral(), say=lambda _: None)
    assert quarantine_notes(lake) == {}
    assert [r["id"] for r in rows(lake, "current", "acmeco_customers")] == [1]


def test_a_fragment_the_read_returned_no_bytes_for_is_reported_bad_not_dropped():
    """The journal task gets each cover piece beside its file's bytes (a left join): a piece
    without bytes (a path the read spelled otherwise) is a bad fragment with its reason."""
    from lake_assets.feeds.flow_tasks import read_journal_task

    docs, _ = journal_lines([1, 2])
    content = b"".join(docs)
    name = f"{0:016x}-{len(content):016x}-{hashlib.sha1(content).hexdigest()}.gz"
    piece = {
        "journal": "j",
        "uri": f"file:///l/j/utc_date=2024-06-01/utc_hour=10/{name}",
        "skip": 0,
        "stop": None,
        "taken_over_by": None,
    }
    table = pa.Table.from_pylist([{**piece, "order": 0, "hour": "2024-06-01-10", "content": None}])

    out = read_journal_task(("/id",), frozenset({"2024-06-01-10"}))(table).to_pylist()

    assert [(r["kind"], r["uri"]) for r in out] == [("bad", piece["uri"])]
    assert "returned no bytes for this path" in out[0]["reason"]


def test_an_s3_hour_folder_key_holding_data_is_a_stray(moto_server, s3_bucket):
    """On S3 an hour folder's own key (`…/utc_hour=10/`) can hold data: s3a takes it for a folder
    marker and no hour lists it, so it is reported; an empty one is a marker and is not."""
    s3 = moto_server.client("s3")
    hour = "acmeCo/customers/pivot=00/utc_date=2024-06-01/utc_hour=10/"
    content = doc_line(1)
    name = f"{0:016x}-{len(content):016x}-{hashlib.sha1(content).hexdigest()}.gz"
    s3.put_object(Bucket=s3_bucket, Key=hour + name, Body=gzip.compress(content))
    s3.put_object(Bucket=s3_bucket, Key=hour, Body=gzip.compress(content))
    s3.put_object(Bucket=s3_bucket, Key="acmeCo/customers/pivot=00/utc_date=2024-06-01/", Body=b"")
    fmt = FlowJournalFormat((CollectionConfig(name="acmeCo/customers", key=("/id",)),))
    storage = Storage(S3Config(endpoint_url=moto_server.url))

    strays = fmt.stray_files(storage, f"s3a://{s3_bucket}", "acmeco_customers")

    assert [(e.uri, r) for e, r in strays] == [
        (f"s3a://{s3_bucket}/{hour}", strays[0][1])
    ] and "ends in '/' but holds" in strays[0][1]
    assert [
        e.name
        for e in fmt.partition_files(storage, f"s3a://{s3_bucket}", "acmeco_customers", "2024-06-01-10")
    ] == [name]


def test_a_later_fragment_holding_landed_bytes_again_leaves_each_document_in_its_first_hour(spark, tmp_path):
    """A fragment landing later with bytes landed before (a compaction, a re-upload) must not
    take their documents out of their own hours: run over every hour, the cover read them from
    the fragment reaching furthest, all in its hour, and once that copy was removed its hour ran
    again, emptied, and the documents were in no hour of `changes`, though their own fragments
    were still landed."""
    journal, lake, config, instance = customers_lake(tmp_path)
    docs, at = journal_lines(range(1, 6))
    write_fragment(journal, at[0], b"".join(docs[0:3]), hour=10)
    write_fragment(journal, at[3], b"".join(docs[3:5]), hour=11)
    copy = write_fragment(journal, at[0], b"".join(docs[0:5]), hour=12)

    def by_hour() -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for row in rows(lake, "changes", "acmeco_customers"):
            found.setdefault(row["hour"], []).append(row["id"])
        return {hour: sorted(ids) for hour, ids in found.items()}

    run_feeds(config, instance=instance, say=lambda _: None)
    assert by_hour() == {"2024-06-01-10": [1, 2, 3], "2024-06-01-11": [4, 5]}
    copy.unlink()
    run_feeds(config, instance=instance, say=lambda _: None)
    assert by_hour() == {"2024-06-01-10": [1, 2, 3], "2024-06-01-11": [4, 5]}
    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [1, 2, 3, 4, 5]


def test_fragments_removed_while_a_later_fragment_holds_their_bytes_again_move_its_documents_there(
    spark, tmp_path
):
    """The other way round: the first landing's fragments are removed (cleaned up once a
    compaction holds their bytes). Their hours run again and empty; the compaction's hour, whose
    run read those bytes from them, runs again too, and its `changes` now hold the documents."""
    journal, lake, config, instance = customers_lake(tmp_path)
    docs, at = journal_lines(range(1, 6))
    first = write_fragment(journal, at[0], b"".join(docs[0:3]), hour=10)
    second = write_fragment(journal, at[3], b"".join(docs[3:5]), hour=11)
    write_fragment(journal, at[0], b"".join(docs[0:5]), hour=12)
    said: list[str] = []
    run_feeds(config, instance=instance, say=said.append)
    first.unlink()
    second.unlink()
    said.clear()
    run_feeds(config, instance=instance, say=said.append)
    by_hour: dict[str, list[int]] = {}
    for row in rows(lake, "changes", "acmeco_customers"):
        by_hour.setdefault(row["hour"], []).append(row["id"])
    assert {hour: sorted(ids) for hour, ids in by_hour.items()} == {"2024-06-01-12": [1, 2, 3, 4, 5]}
    assert any("2024-06-01-12: to run again: holds data of" in line for line in said), said
    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [1, 2, 3, 4, 5]


def test_reading_back_to_a_later_folders_bytes_stops_once_it_reaches_them_past_a_hole(tmp_path):
    """An hour asked to read bytes of a compaction in a later folder reads its journal back
    until the fragments listed reach those bytes. A hole between them and its own (a fragment
    never landed) stays a hole however far back it reads, so the read-back stops there rather
    than reading the journal's whole history: here the day before is never listed."""
    from lake_assets.feeds.flow_fragments import fragment_from_uri
    from lake_assets.feeds.flow_journal import _JournalFragments
    from lake_assets.reruns import ByteRange

    landing = tmp_path / "landing"
    journal = landing / "acmeCo" / "customers" / "pivot=00"
    hours = [dt.datetime(2024, 5, 31, tzinfo=UTC) + dt.timedelta(hours=n) for n in range(35)]

    def land(at: dt.datetime, begin: int) -> Path:
        folder = journal / f"utc_date={at:%Y-%m-%d}" / f"utc_hour={at:%H}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{begin:016x}-{begin + 10:016x}-{'0' * 40}.gz"
        path.write_bytes(b"x")
        return path

    for index, at in enumerate(hours[:-1]):
        if at.hour != 8 or at.day != 1:  # 2024-06-01-08's bytes never landed: a hole
            land(at, 10 * index)
    own = land(hours[-1], 10 * (len(hours) - 1))  # the run's hour, 2024-06-01-10
    compaction = land(dt.datetime(2024, 6, 1, 15, tzinfo=UTC), 300)  # again bytes of 2024-06-01-06
    name = "acmeCo/customers/pivot=00"
    read = _JournalFragments(
        name, [fragment_from_uri(f"file://{own}", name)], {f"file://{own}": "2024-06-01-10"}
    )
    asked = ByteRange(f"file://{compaction}", name, 300, 310)

    FlowJournalFormat()._read_what_was_asked(Storage(S3Config()), f"file://{landing}", [read], [asked])

    listed = read.hours_read()
    assert "2024-06-01-15" in listed and min(f.name.begin for f in read.fragments) <= 300
    assert min(listed) >= "2024-06-01-00", sorted(listed)


def _originals_and_their_compaction_run(tmp_path):
    """Documents 1-5 landed as two fragments (hours 10 and 11) and again as one compaction
    (hour 12), run: (lake, config, instance, the two originals)."""
    journal, lake, config, instance = customers_lake(tmp_path)
    docs, at = journal_lines(range(1, 6))
    first = write_fragment(journal, at[0], b"".join(docs[0:3]), hour=10)
    second = write_fragment(journal, at[3], b"".join(docs[3:5]), hour=11)
    write_fragment(journal, at[0], b"".join(docs[0:5]), hour=12)
    run_feeds(config, instance=instance, say=lambda _: None)
    return lake, config, instance, (first, second)


def test_a_first_sensor_tick_runs_the_hours_that_changed_and_the_compactions_hour_holding_their_data(
    spark, tmp_path, monkeypatch
):
    """A landing sensor's first tick (started after `lake-assets run`, or its cursor reset) runs
    no hour processed with the files it holds: Flow's too, though its files share data. Once
    the originals are removed, it runs their hours and the compaction's, whose own fragment is
    unchanged but whose run read those bytes from the originals: left out, their documents
    would be in no hour of `changes`."""
    from lake_assets.orchestration.resources import LakeResource
    from lake_assets.orchestration.sensors import RANGE_END_TAG, RANGE_START_TAG
    from lake_assets_tests.discovered import discovered_definitions
    from lake_assets_tests.storage_spy import spy_on_every_storage

    _, config, _, (first, second) = _originals_and_their_compaction_run(tmp_path)
    defs = discovered_definitions(config)
    sensor = defs.resolve_sensor_def("flow_landing_sensor")

    def first_tick() -> list[tuple[str, str]]:
        resources = {"lake": LakeResource(root=config.lake)}
        with dg.build_sensor_context(resources=resources, definitions=defs) as context:
            return [(r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG]) for r in sensor(context).run_requests]

    touched = spy_on_every_storage(monkeypatch)
    assert first_tick() == []
    # the landing walked, not listed hour folder by hour folder (a year of them outlasted a tick)
    assert not [uri for call, uri in touched if call == "list" and "utc_hour=" in uri]
    first.unlink()
    second.unlink()
    assert first_tick() == [("2024-06-01-10", "2024-06-01-12")]


def test_a_run_of_the_emptied_hours_alone_leaves_the_compactions_hour_asked_to_run_again(spark, tmp_path):
    """The removal is seen only while the emptied hours' notes still name the removed
    fragments: a run of those hours alone (from the UI, or the sensor's) rewrites their notes,
    so it asks the compaction's hour to run again, in a request that stands until that hour's
    fold."""
    from lake_assets.orchestration.definitions import feed_job_name
    from lake_assets_tests.discovered import discovered_definitions

    lake, config, instance, (first, second) = _originals_and_their_compaction_run(tmp_path)
    first.unlink()
    second.unlink()
    job = discovered_definitions(config).resolve_job_def(feed_job_name("flow"))
    for emptied in ("2024-06-01-10", "2024-06-01-11"):
        assert job.execute_in_process(instance=instance, partition_key=emptied).success
    run_feeds(config, instance=instance, say=lambda _: None)
    hours = {row["hour"] for row in rows(lake, "changes", "acmeco_customers")}
    assert hours == {"2024-06-01-12"}
    assert sorted(r["id"] for r in rows(lake, "changes", "acmeco_customers")) == [1, 2, 3, 4, 5]


def test_a_fold_of_changes_read_before_the_removal_leaves_the_compactions_hour_asked_to_run_again(
    spark, tmp_path
):
    """The compaction's hour stores its changes, its originals are then removed and their hours
    run (asking it to run again), and only then does its fold run (its state steps alone, as a
    later step of a run that began before the removal would). Its changes were read while the
    originals were there, so the request stands: withdrawn, the documents were in no hour."""
    from lake_assets.orchestration.definitions import feed_job_name
    from lake_assets_tests.discovered import discovered_definitions

    lake, config, instance, (first, second) = _originals_and_their_compaction_run(tmp_path)
    job = discovered_definitions(config).resolve_job_def(feed_job_name("flow"))

    def assets(*layers: str) -> list[dg.AssetKey]:
        return [dg.AssetKey(["flow", "acmeco_customers", layer]) for layer in layers]

    compaction_hour = "2024-06-01-12"
    stored = job.execute_in_process(
        instance=instance, partition_key=compaction_hour, asset_selection=assets("changes")
    )
    assert stored.success
    first.unlink()
    second.unlink()
    for emptied in ("2024-06-01-10", "2024-06-01-11"):
        assert job.execute_in_process(instance=instance, partition_key=emptied).success
    folded = job.execute_in_process(
        instance=instance, partition_key=compaction_hour, asset_selection=assets("current", "history")
    )
    assert folded.success
    run_feeds(config, instance=instance, say=lambda _: None)
    by_hour: dict[str, list[int]] = {}
    for row in rows(lake, "changes", "acmeco_customers"):
        by_hour.setdefault(row["hour"], []).append(row["id"])
    assert {hour: sorted(ids) for hour, ids in by_hour.items()} == {compaction_hour: [1, 2, 3, 4, 5]}


def test_a_range_run_of_an_hour_that_lost_a_fragment_runs_the_compactions_hour_in_the_same_command(
    spark, tmp_path
):
    """`lake-assets run --from/--to` over an hour that lost a fragment a compaction holds again:
    the compaction's hour, asked to run again, is run by the command's follow-up round, not left
    for a later command."""
    journal, lake, config, instance = customers_lake(tmp_path)
    docs, at = journal_lines(range(1, 7))
    original = write_fragment(journal, at[0], b"".join(docs[0:3]), hour=10)
    write_fragment(journal, at[3], b"".join(docs[3:5]), hour=11)
    write_fragment(journal, at[5], b"".join(docs[5:6]), hour=10)
    write_fragment(journal, at[0], b"".join(docs[0:5]), hour=12)
    run_feeds(config, instance=instance, say=lambda _: None)
    original.unlink()
    run_feeds(config, instance=instance, say=lambda _: None, first="2024-06-01-10", last="2024-06-01-10")
    by_hour: dict[str, list[int]] = {}
    for row in rows(lake, "changes", "acmeco_customers"):
        by_hour.setdefault(row["hour"], []).append(row["id"])
    assert {hour: sorted(ids) for hour, ids in by_hour.items()} == {
        "2024-06-01-10": [6],
        "2024-06-01-11": [4, 5],
        "2024-06-01-12": [1, 2, 3],
    }


def test_a_damaged_processed_note_stops_no_flow_run_and_is_written_again(spark, tmp_path):
    from lake_assets import processed
    from lake_assets.orchestration.definitions import feed_job_name
    from lake_assets.paths import LakeLayout
    from lake_assets_tests.discovered import discovered_definitions

    journal, _, config, instance = customers_lake(tmp_path)
    docs, at = journal_lines(range(1, 4))
    write_fragment(journal, at[0], b"".join(docs[0:3]), hour=10)
    run_feeds(config, instance=instance, say=lambda _: None)
    note = Path(processed.note_uri(LakeLayout(config.lake), "flow", "acmeco_customers", "2024-06-01-10")[7:])
    note.write_text("{not json")
    job = discovered_definitions(config).resolve_job_def(feed_job_name("flow"))
    assert job.execute_in_process(instance=instance, partition_key="2024-06-01-10").success
    assert json.loads(note.read_text())


def _a_fragment_lands_after_the_catalog_step(tmp_path, monkeypatch, stored: bytes | None = None):
    """Journal 00 holds at 11 an acknowledgement of PRODUCER's transaction whose documents 1
    and 2 are in a fragment of 10; journal 01 holds a document at 10, so the run takes 10 and
    11. Journal 00's 10:00 fragment (`stored` as its bytes, if given) lands after the run's
    catalog step: reading back from the acknowledgement lists the hour and meets it. Returns
    the journal, the lake, the configuration, the instance and the fragment's lines."""
    journal, lake, config, instance = customers_lake(tmp_path)
    write_fragment(journal.parent / "pivot=01", 0, transaction_line(10, 0x0, 10), hour=10)
    late = transaction_line(1, 0x1, 10) + transaction_line(2, 0x1, 10)
    ack = transaction_line(3, 0x2, 11, ack=True) + transaction_line(4, 0x0, 11)
    write_fragment(journal, len(late), ack, hour=11)
    from lake_assets import pipeline

    catalogue_now = pipeline.catalogue_landing

    def then_a_fragment_lands(*args, **kwargs):
        catalogued = catalogue_now(*args, **kwargs)
        write_fragment(journal, 0, late, stored=stored, hour=10)
        return catalogued

    monkeypatch.setattr(pipeline, "catalogue_landing", then_a_fragment_lands)
    run_feeds(config, instance=instance, say=lambda _: None)
    monkeypatch.setattr(pipeline, "catalogue_landing", catalogue_now)
    return journal, lake, config, instance, late


def test_a_fragment_landed_after_the_catalog_step_is_read_and_counted(spark, tmp_path, monkeypatch):
    """The fragment read back is counted among the hour's files: the run's counts reconcile
    (they did not, and the run failed)."""
    _, lake, config, instance, _ = _a_fragment_lands_after_the_catalog_step(tmp_path, monkeypatch)
    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [1, 2, 4, 10]
    run_feeds(config, instance=instance, say=lambda _: None)  # catalogued now: read again, same rows
    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [1, 2, 4, 10]


def test_a_fragment_landed_after_the_catalog_step_and_set_aside_is_withdrawn_once_it_reads(
    spark, tmp_path, monkeypatch
):
    """Set aside, it is filed under the hour whose folder holds it, not under no partition
    (`unknown`), where no run would ever withdraw it: status would name it for good."""
    from lake_assets.paths import LakeLayout
    from lake_assets.status import table_status

    journal, lake, config, instance, late = _a_fragment_lands_after_the_catalog_step(
        tmp_path, monkeypatch, stored=b"not gzip at all"
    )

    def set_aside() -> list[tuple[str | None, str]]:
        status = table_status(
            Storage(S3Config()),
            LakeLayout(config.lake),
            config.feeds[0].landing,
            "flow",
            FlowJournalFormat(config.feeds[0].collections),
            "acmeco_customers",
        )
        return sorted(
            (note["partition"], Path(note["file"]).parent.name) for note in status.quarantined or []
        )

    assert set_aside() == [("2024-06-01-10", "utc_hour=10")]
    write_fragment(journal, 0, late, hour=10)  # delivered again whole: it reads
    run_feeds(config, instance=instance, say=lambda _: None)
    assert set_aside() == []
    assert sorted(r["id"] for r in rows(lake, "current", "acmeco_customers")) == [1, 2, 4, 10]


def test_over_an_unmounted_landing_a_run_of_the_next_hour_is_refused_and_empties_nothing_later(
    spark, tmp_path
):
    """The share is unmounted and a sync job writes a fragment of 11 into its mount point. A
    Dagster run of 11 (a sensor's, a backfill's) reads 10 for context: asked of 10 too, the
    blank landing refuses it, and it retires none of 10's records. Were 10 not asked, the run
    would retire them, and a run of 10 after it, finding no record of what 10 read, would empty
    10's changes."""
    from lake_assets.orchestration.definitions import feed_job_name

    journal, lake, config, instance = customers_lake(tmp_path)
    first = transaction_line(1, 0x0, 10)
    write_fragment(journal, 0, first, hour=10)
    run_feeds(config, instance=instance, say=lambda _: None)
    landing = tmp_path / "landing"
    landing.rename(tmp_path / "landing-unmounted")
    write_fragment(journal, len(first), transaction_line(2, 0x0, 11), hour=11)
    job = discovered_definitions(config).resolve_job_def(feed_job_name("flow"))
    for hour in ("2024-06-01-11", "2024-06-01-10"):
        result = job.execute_in_process(instance=instance, partition_key=hour, raise_on_error=False)
        failures = [
            event.step_failure_data.error.to_string()
            for event in result.all_events
            if event.is_step_failure and event.step_failure_data.error
        ]
        assert not result.success and any("lists none of the files" in said for said in failures), hour
    assert [(r["hour"], r["id"]) for r in rows(lake, "changes", "acmeco_customers")] == [("2024-06-01-10", 1)]


def test_a_pass_sets_aside_the_pieces_that_failed_of_their_own_and_judges_again_those_a_failure_placed():
    """Which of a pass's failed pieces are set aside (`_failures_of_their_own`), on covers built
    from fragment names alone: the first failed piece of a journal always; a piece read from
    inside after it (its start placed by the failed one) only on the next pass; a fragment with
    a piece of its own read from its start, and a fragment blamed that is not on the cover,
    always."""
    from lake_assets.feeds import flow_fragments as ff
    from lake_assets.feeds.flow_journal import _failures_of_their_own, _JournalFragments

    def fragment(begin: int, end: int, tag: str) -> ff.Fragment:
        return ff.Fragment(f"file:///j/{tag}", "j", ff.FragmentName(begin, end, tag * 40, "gzip"))

    def set_aside(fragments: list[ff.Fragment], hours: list[str], failed: list[str]) -> list[str]:
        journal = _JournalFragments("j", fragments, {f.uri: h for f, h in zip(fragments, hours, strict=True)})
        notes = [
            {"journal": "j", "kind": "bad", "uri": f"file:///j/{tag}", "reason": "bad"} for tag in failed
        ]
        return sorted(uri.rsplit("/", 1)[1] for _, uri in _failures_of_their_own(notes, {"j": journal}))

    hour = ["2024-06-01-10"] * 3
    # a damaged fragment claiming the first 10 bytes of the next: that one is read from 10 bytes in
    damaged, after = fragment(0, 110, "d"), fragment(100, 200, "n")
    assert set_aside([damaged, after], hour[:2], ["d", "n"]) == ["d"]
    assert set_aside([damaged, after], hour[:2], ["n"]) == ["n"]  # nothing failed before it
    # a fragment on the cover twice, cut by one that landed first, failing at its own start
    spanning, first = fragment(0, 300, "p"), fragment(100, 200, "t")
    assert set_aside([spanning, first], ["2024-06-01-11", "2024-06-01-10"], ["p", "t", "p"]) == ["p", "t"]
    # a fragment blamed that is not on the cover excuses nothing and is set aside
    a, b, c = fragment(0, 100, "a"), fragment(90, 200, "b"), fragment(150, 300, "c")
    assert set_aside([a, b, c], hour, ["z", "b", "c"]) == ["b", "z"]


def test_many_hours_files_come_from_one_walk_of_each_journal_as_the_hour_listings_give_them(
    tmp_path, monkeypatch
):
    """A run over many hours (a backfill) is given each hour's fragments from one walk of each
    journal, not a listing of every journal's every hour folder, and they are the same files."""
    from lake_assets.feeds import flow_journal
    from lake_assets_tests.storage_spy import CountingStorage

    landing = tmp_path / "landing"
    offset = 0
    for pivot in ("pivot=00", "pivot=01"):
        for hour in (10, 11, 13):
            line = doc_line(hour)
            write_fragment(landing / "acmeCo" / "customers" / pivot, offset, line, hour=hour)
            offset += len(line)
    fmt = FlowJournalFormat((CollectionConfig(name="acmeCo/customers", key=("/id",)),))
    hours = [f"2024-06-01-{hour:02d}" for hour in range(9, 15)]

    def files(storage) -> dict[str, list[str]]:
        found = fmt.partitions_files(storage, f"file://{landing}", "acmeco_customers", hours)
        return {key: [e.uri for e in entries] for key, entries in found.items()}

    listed = files(Storage())
    monkeypatch.setattr(flow_journal, "WALK_FROM_HOURS", 1)
    walking = CountingStorage()
    assert files(walking) == listed
    assert [len(listed[hour]) for hour in hours] == [0, 2, 2, 0, 2, 0]
    assert not [uri for uri in walking.listed if "utc_hour=" in uri]


def test_collections_landed_but_not_configured_are_named_unless_a_feed_beside_reads_them(tmp_path):
    """A Flow feed names its collections; one that landed beside them (`acmeCo/customers`
    beside `acmeCo/orders`, `other/things`) was read by no table and named by no one."""
    landing = tmp_path / "landing"
    for collection in ("acmeCo/orders", "acmeCo/customers", "other/things"):
        write_fragment(landing / collection / "pivot=00", 0, doc_line(1))
    (landing / "notes.txt").write_text("journals below")
    (landing / "recovery" / "derivation").mkdir(parents=True)  # Flow's tasks' recovery logs
    orders = CollectionConfig(name="acmeCo/orders", key=("/id",))
    customers = CollectionConfig(name="acmeCo/customers", key=("/id",))
    config = LakeConfig(
        lake=f"file://{tmp_path / 'lake'}",
        feeds=(FeedConfig("flow", "flow_journal", f"file://{landing}", collections=(orders,)),),
    )

    [found] = discover(config, config.storage())

    assert found.tables == ["acmeco_orders"]
    assert sorted(found.unread) == [
        f"file://{landing}/acmeCo/customers/: no configured collection is in it, so no table reads it",
        f"file://{landing}/notes.txt: no configured collection is in it, so no table reads it",
        f"file://{landing}/other/: no configured collection is in it, so no table reads it",
    ]
    # a feed beside it over the same landing reads the customers: not named as read by no one
    beside = FeedConfig("flow-b", "flow_journal", f"file://{landing}", collections=(customers,))
    shared = config.replace(feeds=(*config.feeds, beside))
    assert [len(found.unread) for found in discover(shared, shared.storage())] == [2, 2]
    # credentials granted for the collections' prefixes only: the landing's top does not list,
    # and the collections are found all the same (a misspelt one is still told apart)

    class OnlyTheCollectionsPrefix(Storage):
        def list(self, uri):
            if uri.rstrip("/") == f"file://{landing}":
                raise PermissionError(13, "Access Denied", uri)
            return super().list(uri)

    fmt = FlowJournalFormat((orders, CollectionConfig(name="acmeCo/ordrs", key=("/id",))))
    survey = fmt.survey(OnlyTheCollectionsPrefix(), f"file://{landing}")
    assert survey.tables == ["acmeco_orders"]
    assert survey.unread == [
        f"file://{landing}/acmeCo/customers/: no configured collection is in it, so no table reads it"
    ]
    # nor can one collection lie inside another: the outer one's walk would set its files aside
    archive = CollectionConfig("acmeCo/orders/archive", ("/id",))
    with pytest.raises(
        pydantic.ValidationError, match="acmeCo/orders/archive lies inside collection acmeCo/orders"
    ):
        FeedConfig("flow", "flow_journal", f"file://{landing}", collections=(orders, archive))
    # not even when a feed beside it, over the same landing, names the inner one
    raw = config.model_dump(mode="json")
    raw["feeds"].append(
        {**raw["feeds"][0], "name": "flow-archive", "collections": [{"name": archive.name, "key": ["/id"]}]}
    )
    with pytest.raises(ConfigError) as refusal:
        parse_config(raw)
    assert str(refusal.value).endswith(
        "feeds[1].collections[0].name: collection acmeCo/orders/archive lies inside collection acmeCo/orders: "
        "a collection's folder holds its own journals only (one of the two is feed 'flow''s, over the same "
        "landing)"
    ), str(refusal.value)
    # over another landing it is a folder of its own
    raw["feeds"][1]["landing"] = f"file://{tmp_path / 'elsewhere'}"
    assert [feed.name for feed in parse_config(raw).feeds] == ["flow", "flow-archive"]


def _run_customers(landing: Path, lake: Path) -> dg.DagsterInstance:
    instance = dg.DagsterInstance.ephemeral()
    run_feeds(config_for(landing, lake, {"acmeCo/customers": ["/id"]}), instance=instance, say=lambda _: None)
    return instance


def test_a_fragment_the_cover_does_not_read_is_held_against_the_bytes_read_for_its_offsets(spark, tmp_path):
    """A fragment whose bytes another fragment holds is not read: it was counted superseded
    unseen. A compaction's copy holds the same bytes; a fragment of the same offsets with other
    bytes, or one named empty that holds documents, does not, and its documents were in no
    table and no quarantine. Each is now compared with what was read, and set aside if it differs."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    customers = landing / "acmeCo" / "customers"
    # a copy: the first half of a larger fragment, byte for byte
    write_fragment(customers / "pivot=00", 0, doc_line(11) + doc_line(12))
    write_fragment(customers / "pivot=00", 0, doc_line(11))
    # one range, two contents: one is read, the other set aside
    pair = [
        write_fragment(customers / "pivot=01", 0, doc_line(a) + doc_line(b)) for a, b in ((13, 14), (15, 16))
    ]
    # a larger fragment over a smaller one that holds other bytes
    write_fragment(customers / "pivot=02", 0, doc_line(17) + doc_line(18))
    other = write_fragment(customers / "pivot=02", 0, doc_line(19))
    # named empty (begin = end, an all-zero sum), holding a document all the same
    first = write_fragment(customers / "pivot=03", 0, doc_line(21))
    named_empty = first.parent / f"{len(doc_line(21)):016x}-{len(doc_line(21)):016x}-{'0' * 40}.gz"
    named_empty.write_bytes(gzip.compress(doc_line(22)))
    # the same, alone in its journal: the cover has no piece to read
    alone = write_fragment(customers / "pivot=04", 0, doc_line(23)).with_name(
        f"{0:016x}-{0:016x}-{'0' * 40}.gz"
    )
    (alone.parent / f"{0:016x}-{len(doc_line(23)):016x}-{hashlib.sha1(doc_line(23)).hexdigest()}.gz").rename(
        alone
    )

    instance = _run_customers(landing, lake)

    ids = {row["id"] for row in rows(lake, "changes", "acmeco_customers")}
    notes = quarantine_notes(lake)
    [read] = [path for path, docs in zip(pair, ({13, 14}, {15, 16}), strict=True) if docs <= ids]
    [unread] = [path for path in pair if path != read]
    assert ids == {11, 12, 17, 18, 21} | ({13, 14} if read == pair[0] else {15, 16})
    assert set(notes) == {uri(unread), uri(other), uri(named_empty), uri(alone)}, notes
    assert notes[uri(unread)].endswith(
        f"holds other bytes at journal offsets 0..{2 * len(doc_line(13))} than {read.name}, which was read for them"
    )
    assert f"holds other bytes at journal offsets 0..{len(doc_line(19))} than " in notes[uri(other)]
    assert "content inflates to more than 0 bytes" in notes[uri(named_empty)], notes[uri(named_empty)]
    metadata = metadata_of(instance, "acmeco_customers")
    assert metadata["files_superseded"] == 1  # the copy alone
    assert landing_complete_passed(instance, "acmeco_customers")


def test_a_document_spark_cannot_take_sets_its_fragment_aside_and_a_long_value_is_read(spark, tmp_path):
    """A value longer than Spark's JSON reader takes by default (20 million characters) failed
    the table's every run; a field name longer than it takes at all (50,000), or a name given
    twice in one object (one value would be dropped, the key's too), sets its fragment aside."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    customers = landing / "acmeCo" / "customers"
    long_text = "x" * 20_000_001
    write_fragment(customers / "pivot=00", 0, doc_line(1, note=long_text))
    write_fragment(customers / "pivot=01", 0, doc_line(2))
    meta = json.dumps({"uuid": build_uuid(clock_of(HOUR) + 16 * 3, 0, PRODUCER), "op": "c"})
    refused = {
        "pivot=02": (doc_line(3, **{"n" * 50_001: 1}), "a field name of 50,001 characters"),
        "pivot=03": (
            b'{"id": 3, "name": "a", "name": "b", "_meta": ' + meta.encode() + b"}\n",
            "'name' twice",
        ),
        "pivot=04": (b'{"id": 3, "id": 4, "_meta": ' + meta.encode() + b"}\n", "'id' twice"),
        "pivot=05": (b'{"id": 3, "o": {"a": 1, "a": 2}, "_meta": ' + meta.encode() + b"}\n", "'a' twice"),
    }
    fragments = {pivot: write_fragment(customers / pivot, 0, line) for pivot, (line, _) in refused.items()}

    _run_customers(landing, lake)

    changes = {row["id"]: row for row in rows(lake, "changes", "acmeco_customers")}
    assert sorted(changes) == [1, 2] and changes[1]["note"] == long_text
    notes = quarantine_notes(lake)
    assert set(notes) == {uri(path) for path in fragments.values()}
    for pivot, (_, reason) in refused.items():
        assert reason in notes[uri(fragments[pivot])], notes[uri(fragments[pivot])]


def test_the_part_of_a_piece_s_fragment_the_cover_skips_is_held_against_the_bytes_read_for_it(
    spark, tmp_path
):
    """A fragment read from inside (its first bytes read from another) or up to where one that
    landed before it takes over: those bytes were never compared, so a second writer's document
    there was in no table. The fragment is set aside, and the bytes only it holds are a gap."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    customers = landing / "acmeCo" / "customers"
    n = len(doc_line(31))
    # read from inside: its first document is another than the one read for those bytes
    write_fragment(customers / "pivot=00", 0, doc_line(31) + doc_line(32))
    skipped_into = write_fragment(customers / "pivot=00", n, doc_line(33) + doc_line(34))
    # stopped where a fragment landed an hour before it begins, holding another document there
    stopped = write_fragment(customers / "pivot=01", 0, doc_line(35) + doc_line(36), hour=11)
    write_fragment(customers / "pivot=01", n, doc_line(37), hour=10)
    # a compaction landed after a fragment that lies inside it, holding the same bytes: it is read
    # around that fragment (stopped at its start, read on from its end) and nothing differs
    compacted = doc_line(41) + doc_line(42) + doc_line(43)
    write_fragment(customers / "pivot=02", 0, compacted, hour=11)
    write_fragment(customers / "pivot=02", n, doc_line(42), hour=10)

    instance = _run_customers(landing, lake)

    ids = {row["id"] for row in rows(lake, "changes", "acmeco_customers")}
    notes = quarantine_notes(lake)
    assert ids == {31, 32, 37, 41, 42, 43}
    assert set(notes) == {uri(skipped_into), uri(stopped)}, notes
    assert f"holds other bytes at journal offsets {n}..{2 * n} than " in notes[uri(skipped_into)]
    assert f"holds other bytes at journal offsets {n}..{2 * n} than " in notes[uri(stopped)]
    assert not landing_complete_passed(instance, "acmeco_customers")  # bytes only they held are gaps
