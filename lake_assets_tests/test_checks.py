"""The table invariants find each kind of broken history, and count a key once per fault."""

from __future__ import annotations

import datetime as dt

from lake_assets.engine import checks
from lake_assets.engine import model as m

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
    assert checks.windows_and_versions_stored(stored, batch, SPEC)[1] == 1


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
    assert found == 3  # a@1 (twice in the batch), a@5 and b@20 (a delete); not a@3, a@7 nor c@5

    plan = (
        checks._marked_rows(history(spark, stored_rows), batch, SPEC)
        ._jdf.queryExecution()
        .executedPlan()
        .toString()
    )
    assert plan.count("Exchange hashpartitioning") == 1, plan
    assert plan.count("Sort [") == 1, plan
