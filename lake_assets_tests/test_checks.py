"""The table invariants find each kind of broken history, and count a key once per fault."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from lake_assets.engine import checks
from lake_assets.engine import model as m
from lake_assets.engine.fold import stored_rows_since
from lake_assets_tests.engine_harness import SPEC as SPEC_OF_LAKE
from lake_assets_tests.engine_harness import EngineLake
from lake_assets_tests.test_engine import T, ev

SPEC = m.TableSpec(name="accounts", keys=("id",))
T0 = dt.datetime(2024, 1, 1)
OPEN = dt.datetime(9999, 12, 31, 23, 59, 59, 999000)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def ms_before(seconds: float) -> dt.datetime:
    return at(seconds) - dt.timedelta(milliseconds=1)


def history(spark, rows):
    """(id, op, start, end, active) rows in the stored shape the check reads."""
    return spark.createDataFrame(
        rows,
        f"id string, {m.OP} string, _fivetran_start timestamp, _fivetran_end timestamp, _fivetran_active boolean",
    )


def windows_check(rows):
    """The `history_windows` check alone, without a batch to find among the rows."""
    return checks.windows_and_versions_stored(rows, None, SPEC)[0]


def test_a_consistent_history_passes(spark):
    rows = [
        ("a", m.INSERT, at(0), ms_before(10), False),
        ("a", m.UPDATE, at(10), at(20), False),
        ("a", m.DELETE, at(20), OPEN, True),
        ("b", m.UPDATE, at(5), OPEN, True),
    ]
    outcome = windows_check(history(spark, rows))
    assert outcome.passed, outcome.description
    assert outcome.metadata["versions_checked"] == 3


def test_each_kind_of_fault_is_counted(spark):
    rows = [
        # two active versions, and the first one's end overlaps the second
        ("a", m.INSERT, at(0), OPEN, True),
        ("a", m.UPDATE, at(10), OPEN, True),
        # an end before its start
        ("b", m.INSERT, at(10), at(5), False),
        ("b", m.UPDATE, at(20), OPEN, True),
        # a closed version whose end is not the next start − 1 ms, and an open one marked inactive
        ("c", m.INSERT, at(0), at(3), False),
        ("c", m.UPDATE, at(10), OPEN, False),
        # a key with three active versions (and a delete first) still counts once
        ("d", m.DELETE, at(0), OPEN, False),
        ("d", m.INSERT, at(1), OPEN, True),
        ("d", m.UPDATE, at(2), OPEN, True),
        ("d", m.UPDATE, at(3), OPEN, True),
    ]
    outcome = windows_check(history(spark, rows))
    assert not outcome.passed
    assert outcome.metadata["keys_with_several_active_versions"] == 2  # a and d
    assert outcome.metadata["inverted"] == 1  # b
    assert outcome.metadata["overlapping"] == 3  # a's first, d's first two
    assert outcome.metadata["inconsistent_end"] == 5  # a's first, b's first, c's first, d's first two
    assert outcome.metadata["wrong_active_flag"] == 4  # a's first, c's last, d's first two
    assert outcome.metadata["versions_checked"] == 9


def test_versions_stored_counts_each_batch_version_found_once(spark):
    batch = spark.createDataFrame(
        [("a", at(1)), ("a", at(1)), ("b", at(2)), ("c", at(3))], f"id string, {m.VERSION_AT} timestamp"
    )
    stored = history(
        spark,
        [
            ("a", m.INSERT, at(1), OPEN, True),  # found (twice in the batch: counted once)
            ("b", m.INSERT, at(9), OPEN, True),  # same key, another version: not found
            ("d", m.INSERT, at(3), OPEN, True),  # another key at c's time: not found
        ],
    )
    assert checks.windows_and_versions_stored(stored, batch, SPEC)[1] == checks.StoredVersions(1)


def test_the_windows_and_the_stored_versions_come_from_one_shuffle_and_one_sort(spark):
    """One pass gives both: the window faults of the stored rows are those found without a
    batch beside them, a batch version counts once when stored, and Spark shuffles and sorts
    once."""
    stored_rows = [
        ("a", m.INSERT, at(1), ms_before(5), False),
        ("a", m.UPDATE, at(5), OPEN, True),
        ("b", m.INSERT, at(10), at(5), False),  # inverted
        ("b", m.DELETE, at(20), OPEN, True),
    ]
    batch = spark.createDataFrame(
        # a@3 lies between two stored rows: their window is read past it
        [("a", at(1)), ("a", at(1)), ("a", at(3)), ("a", at(5)), ("a", at(7)), ("b", at(20)), ("c", at(5))],
        f"id string, {m.VERSION_AT} timestamp",
    )
    alone = windows_check(history(spark, stored_rows))
    outcome, found = checks.windows_and_versions_stored(history(spark, stored_rows), batch, SPEC)
    assert (outcome.passed, outcome.metadata) == (alone.passed, alone.metadata)
    assert alone.metadata["inverted"] == 1 and alone.metadata["versions_checked"] == 3
    assert found.found == 3  # a@1 (twice in the batch), a@5 and b@20 (a delete); not a@3, a@7 nor c@5

    plan = (
        checks._marked_rows(history(spark, stored_rows), batch, SPEC)
        ._jdf.queryExecution()
        .executedPlan()
        .toString()
    )
    assert plan.count("Exchange hashpartitioning") == 1, plan
    assert plan.count("Sort [") == 1, plan


# --- a fold into an empty table: the stored rows against the batch's versions as summaries ----------


def summed_up(spark, pairs) -> checks.VersionSet:
    """The summary of distinct (id, time) pairs, as the fold takes it of its batch."""
    frame = spark.createDataFrame(pairs, f"id string, {m.VERSION_AT} timestamp")
    row = frame.agg(*checks.VersionSet.sums(["id"], F.col(m.VERSION_AT), F.lit(True), prefix="b_")).collect()[
        0
    ]
    return checks.VersionSet.of(row, prefix="b_")


STORED = [
    ("a", m.INSERT, at(1), ms_before(5), False),
    ("a", m.UPDATE, at(5), at(9), False),
    ("a", m.DELETE, at(9), OPEN, True),
    ("b", m.INSERT, at(2), OPEN, True),
]
VERSIONS = [("a", at(1)), ("a", at(5)), ("a", at(9)), ("b", at(2))]


def test_stored_rows_that_are_exactly_the_batch_versions_match_their_summary(spark):
    outcome, stored = checks.windows_and_versions_stored(
        history(spark, STORED), summed_up(spark, VERSIONS), SPEC
    )
    assert outcome.passed and outcome.metadata["versions_checked"] == 3
    assert stored == checks.StoredVersions(4, same_set=True)
    reconciled = checks.batch_reconciles(6, 1, 1, stored)
    assert reconciled.passed and reconciled.metadata["stored_rows_match_batch_versions"] is True


@pytest.mark.parametrize(
    "stored_rows",
    [
        pytest.param([*STORED[:3], ("b", m.INSERT, at(3), OPEN, True)], id="a start moved, same count"),
        pytest.param([*STORED[:3], ("c", m.INSERT, at(2), OPEN, True)], id="a key changed, same time"),
        pytest.param(STORED[:3], id="a version missing"),
        pytest.param([*STORED, STORED[3]], id="a version stored twice"),
    ],
)
def test_stored_rows_that_differ_from_the_batch_versions_fail_the_reconciliation(spark, stored_rows):
    _, stored = checks.windows_and_versions_stored(
        history(spark, stored_rows), summed_up(spark, VERSIONS), SPEC
    )
    assert stored.same_set is False
    # the counts alone could balance (here they do for the first two cases): the summary decides
    reconciled = checks.batch_reconciles(6, 1, 1, checks.StoredVersions(4, stored.same_set))
    assert not reconciled.passed
    assert "not the batch's versions" in reconciled.description


def test_against_a_summary_only_the_stored_rows_are_shuffled(spark, monkeypatch):
    beside_the_stored_rows = []
    original = checks._marked_rows

    def marked_rows(rows, batch, spec):
        beside_the_stored_rows.append(batch)
        return original(rows, batch, spec)

    monkeypatch.setattr(checks, "_marked_rows", marked_rows)
    checks.windows_and_versions_stored(history(spark, STORED), summed_up(spark, VERSIONS), SPEC)
    assert beside_the_stored_rows == [None]


def test_a_fold_into_an_empty_table_sums_up_its_batch_versions_and_a_lost_file_shows(spark, tmp_path):
    """The fold's summary of its batch matches every stored row read back; a closed file gone
    after the commit breaks the match. A second fold, into rows already there, is not `into_empty`."""
    lake = EngineLake(spark, tmp_path)
    report = lake.fold(
        [
            ev("1", "insert", T[1], 1, "a"),
            ev("1", "insert", T[1], 1, "a"),  # identical: collapsed
            ev("1", "update", T[2], 2, "b"),
            ev("1", "update", T[2], 3, "c"),  # a later write of the same version
            ev("1", "delete", T[3], 4),
            ev("2", "insert", T[2], 5, "x"),
        ]
    )
    assert report.into_empty and report.batch_versions.count == 4

    def stored_against_summary():
        rows = stored_rows_since(spark, lake.storage, lake.state, SPEC_OF_LAKE, None)
        return checks.windows_and_versions_stored(rows, report.batch_versions, SPEC_OF_LAKE)

    outcome, stored = stored_against_summary()
    assert outcome.passed and stored == checks.StoredVersions(4, same_set=True)
    assert checks.batch_reconciles(
        report.batch_rows, report.identical_duplicates, report.superseded_writes, stored
    ).passed

    [closed] = list(Path(lake.state.history_closed[len("file://") :]).rglob("*.parquet"))
    closed.unlink()
    assert stored_against_summary()[1].same_set is False

    assert not lake.fold([ev("2", "update", T[4], 6, "y")]).into_empty


def test_nothing_stored_for_a_batch_with_versions_does_not_match(spark):
    _, stored = checks.windows_and_versions_stored(None, summed_up(spark, VERSIONS), SPEC)
    assert stored == checks.StoredVersions(0, same_set=False)
    assert not checks.batch_reconciles(4, 0, 0, stored).passed


def test_keys_of_several_columns_that_differ_only_in_where_a_null_sits_do_not_match(spark):
    spec = m.TableSpec(name="pairs", keys=("a", "b"))
    batch = spark.createDataFrame([("x", None, at(1))], f"a string, b string, {m.VERSION_AT} timestamp")
    row = batch.agg(
        *checks.VersionSet.sums(["a", "b"], F.col(m.VERSION_AT), F.lit(True), prefix="b_")
    ).collect()
    stored = spark.createDataFrame(
        [(None, "x", m.INSERT, at(1), OPEN, True)],
        f"a string, b string, {m.OP} string, _fivetran_start timestamp, _fivetran_end timestamp, "
        "_fivetran_active boolean",
    )
    _, found = checks.windows_and_versions_stored(stored, checks.VersionSet.of(row[0], "b_"), spec)
    assert found.same_set is False
