"""The merge engine on hand-made cases: the Fivetran seed example and the classic edge cases."""

import datetime as dt
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from lake_assets import lake_io
from lake_assets.engine import merge
from lake_assets.engine.fold import fold
from lake_assets_tests.engine_harness import PAYLOAD, SCHEMA, SPEC, EngineLake, as_row, utc
from lake_assets_tests.run_value_probes import classes_compiled

T = {i: utc(2024, 1, 1, 0, 0, i) for i in range(1, 10)}
MS = dt.timedelta(milliseconds=1)
TMAX = utc(9999, 12, 31, 23, 59, 59, 999000)


def ev(id_, op, at, seq, c1=None, c2=None, unmodified=None, purged=False):
    return {
        "id": id_,
        "op": op,
        "version_at": at,
        "seq": seq,
        "c1": c1,
        "c2": c2,
        "unmodified": unmodified,
        "purged": purged,
    }


def table(rows):
    return [
        (r["id"], r["c1"], r["c2"], r["_fivetran_start"], r["_fivetran_end"], r["_fivetran_active"])
        for r in rows
    ]


def test_fivetran_seed_worked_example(spark, tmp_path):
    """Fivetran's history-mode worked example (docs/semantics.md, "Partial updates"): the existing
    table, three partial updates, the final table. As in the example, a row the second sync only
    closes keeps the first sync's `_fivetran_synced`; the rows it writes anew carry its own."""
    lake = EngineLake(spark, tmp_path)
    first_sync, second_sync = T[1] + dt.timedelta(days=1), T[1] + dt.timedelta(days=2)
    lake.fold(
        [
            ev("1", "insert", T[1], 1, "abc", 1),
            ev("1", "update", T[2], 2, "pqr", 2),
            ev("2", "insert", T[2], 3, "mno", 3),
        ],
        synced_at=first_sync,
    )
    assert table(lake.history()) == [
        ("1", "abc", 1, T[1], T[2] - MS, False),
        ("1", "pqr", 2, T[2], TMAX, True),
        ("2", "mno", 3, T[2], TMAX, True),
    ]
    lake.fold(
        [
            ev("1", "update", T[3], 4, c1="xyz", unmodified=["c2"]),
            ev("2", "update", T[4], 5, c2=1000, unmodified=["c1"]),
            ev("1", "update", T[5], 6, c1="def", unmodified=["c2"]),
        ],
        synced_at=second_sync,
    )
    synced = {(r["id"], r["_fivetran_start"]): r["_fivetran_synced"] for r in lake.history()}
    assert synced == {
        ("1", T[1]): first_sync,
        ("1", T[2]): first_sync,
        ("2", T[2]): first_sync,
        ("1", T[3]): second_sync,
        ("1", T[5]): second_sync,
        ("2", T[4]): second_sync,
    }
    assert {r["id"]: r["_fivetran_synced"] for r in lake.current()} == {"1": second_sync, "2": second_sync}
    assert sorted(table(lake.history())) == sorted(
        [
            ("1", "abc", 1, T[1], T[2] - MS, False),
            ("1", "pqr", 2, T[2], T[3] - MS, False),
            ("2", "mno", 3, T[2], T[4] - MS, False),
            ("1", "def", 2, T[5], TMAX, True),
            ("1", "xyz", 2, T[3], T[5] - MS, False),
            ("2", "mno", 1000, T[4], TMAX, True),
        ]
    )
    assert [(r["id"], r["c1"], r["c2"]) for r in lake.current()] == [("1", "def", 2), ("2", "mno", 1000)]


def test_a_version_filled_again_from_late_data_takes_the_later_sync_time(spark, tmp_path):
    """A stored version that carried a column from the version before it takes a late
    version's value: its row changed, so it is synced anew; the row the late version only
    closes keeps its time."""
    lake = EngineLake(spark, tmp_path)
    first_sync, second_sync = T[1] + dt.timedelta(days=1), T[1] + dt.timedelta(days=2)
    lake.fold(
        [ev("1", "insert", T[1], 1, "abc", 1), ev("1", "update", T[3], 3, c1="xyz", unmodified=["c2"])],
        synced_at=first_sync,
    )
    lake.fold([ev("1", "update", T[2], 2, c2=5, unmodified=["c1"])], synced_at=second_sync)
    rows = [(r["c1"], r["c2"], r["_fivetran_start"], r["_fivetran_synced"]) for r in lake.history()]
    assert rows == [
        ("abc", 1, T[1], first_sync),
        ("abc", 5, T[2], second_sync),
        ("xyz", 5, T[3], second_sync),
    ]


def test_a_version_read_again_takes_the_new_sync_time_as_a_re_import_does(spark, tmp_path):
    """docs/semantics.md: a version read again (its partition run again because a file landed
    beside it) is synced anew even when its copy is unchanged, as Fivetran does when it
    re-imports a table; a key the later batch does not hold keeps its time."""
    lake = EngineLake(spark, tmp_path)
    first_sync, second_sync = T[1] + dt.timedelta(days=1), T[1] + dt.timedelta(days=2)
    lake.fold(
        [ev("1", "insert", T[1], 1, "abc", 1), ev("2", "insert", T[1], 2, "mno", 3)], synced_at=first_sync
    )
    lake.fold([ev("1", "insert", T[1], 1, "abc", 1)], synced_at=second_sync)
    rows = [(r["id"], r["c1"], r["_fivetran_start"], r["_fivetran_synced"]) for r in lake.history()]
    assert sorted(rows) == [("1", "abc", T[1], second_sync), ("2", "mno", T[1], first_sync)]


def test_deletes_late_events_and_resurrection(spark, tmp_path):
    lake = EngineLake(spark, tmp_path)
    lake.fold(
        [
            ev("a", "insert", T[1], 1, "v1"),
            ev("a", "delete", T[4], 4),
            ev("b", "insert", T[1], 2, "b1"),
            ev("b", "delete", T[3], 3),
        ]
    )
    assert lake.current() == []
    # A late older update of a deleted key must not resurrect it; it becomes a closed version.
    lake.fold([ev("a", "update", T[2], 5, "late")])
    assert lake.current() == []
    assert table(lake.history())[:2] == [
        ("a", "v1", None, T[1], T[2] - MS, False),
        ("a", "late", None, T[2], T[4], False),
    ]
    # A newer insert does resurrect it.
    lake.fold([ev("b", "insert", T[6], 6, "back")])
    assert [(r["id"], r["c1"]) for r in lake.current()] == [("b", "back")]
    b = [h for h in table(lake.history()) if h[0] == "b"]
    assert b == [("b", "b1", None, T[1], T[3], False), ("b", "back", None, T[6], TMAX, True)]


def test_ties_duplicates_and_refolds(spark, tmp_path):
    lake = EngineLake(spark, tmp_path)
    batch = [
        ev("a", "update", T[2], 7, "seven"),
        ev("a", "update", T[2], 3, "three"),
        ev("a", "insert", T[1], 1, "one"),
    ]
    lake.fold(batch + batch)  # identical duplicates
    first = table(lake.history())
    assert first == [("a", "one", None, T[1], T[2] - MS, False), ("a", "seven", None, T[2], TMAX, True)]
    report = lake.fold(batch)  # re-folding changes nothing
    assert table(lake.history()) == first and report.late_keys == 1
    lake.fold([ev("a", "update", T[2], 9, "nine")])  # same time, greater sequence: replaces the version
    assert table(lake.history())[1][1] == "nine" and len(lake.history()) == 2


def test_purge_erases_field_data_everywhere_but_keeps_keys(spark, tmp_path):
    lake = EngineLake(spark, tmp_path)
    lake.fold(
        [
            ev("p", "insert", T[1], 1, "secret", 42),
            ev("p", "update", T[2], 2, "secret2", 43),
            ev("q", "insert", T[1], 3, "keep"),
        ]
    )
    lake.fold([ev("p", "update", T[3], 4, purged=True)])
    rows = [h for h in lake.history() if h["id"] == "p"]
    assert len(rows) == 3 and all(r["c1"] is None and r["c2"] is None and r["_purged"] for r in rows)
    assert [r["_fivetran_start"] for r in rows] == [T[1], T[2], T[3]]
    # A late event carrying field data for a purged key is erased as well.
    lake.fold([ev("p", "update", T[1] + MS, 5, "leak", 1)])
    assert all(r["c1"] is None for r in lake.history() if r["id"] == "p")
    assert [r["c1"] for r in lake.history() if r["id"] == "q"] == ["keep"]


def closed_files(lake, day):
    return {p.name for p in (Path(lake.state.history_closed[len("file://") :]) / day).glob("*.parquet")}


def end_hours(lake, day, names):
    """The distinct end hours of the closed history rows in each of the named files of a day."""
    folder = Path(lake.state.history_closed[len("file://") :]) / day
    return [
        sorted({t.hour for t in pq.read_table(folder / name).column("_fivetran_end").to_pylist()})
        for name in names
    ]


def test_late_data_rewrites_only_the_closed_files_it_reaches(spark, tmp_path):
    lake = EngineLake(spark, tmp_path)
    days = [utc(2024, 1, d, 12) for d in range(1, 8)]
    for i, day in enumerate(days):
        report = lake.fold([ev(k, "update", day, i * 10 + n, f"{k}{i}") for n, k in enumerate("abc")])
        assert report.days_rewritten == []
    # Two more folds on the last day: its closed rows now lie in the files of three folds.
    files_of_fold = []
    for n, hour in enumerate((14, 16)):
        before = closed_files(lake, "2024-01-07")
        lake.fold(
            [
                ev(k, "update", utc(2024, 1, 7, hour), 100 + n * 10 + i, f"{k}@{hour}")
                for i, k in enumerate("abc")
            ]
        )
        files_of_fold.append(closed_files(lake, "2024-01-07") - before)
    untouched = {
        "2024-01-06": closed_files(lake, "2024-01-06"),
        "2024-01-07": closed_files(lake, "2024-01-07") - files_of_fold[1],
    }
    assert len(untouched["2024-01-07"]) == 2 and len(files_of_fold[1]) == 1
    report = lake.fold([ev("a", "update", utc(2024, 1, 7, 15), 999, "late")])
    assert report.late_keys == 1
    # Only the file of the fold at 16:00 holds a row ending after 15:00 (a's version of 14:00);
    # the day before and the older files of the same day stay as they were.
    assert report.days_rewritten == ["history:2024-01-07"] and report.closed_files_rewritten == 1
    assert closed_files(lake, "2024-01-06") == untouched["2024-01-06"]
    after = closed_files(lake, "2024-01-07")
    # The rewritten rows and the late fold's own are filed by end hour: a's version of 14:00 now
    # ends in the 14:00 hour, the late version and b's and c's versions of 14:00 in the 15:00 hour.
    assert untouched["2024-01-07"] <= after and not files_of_fold[1] & after and len(after) == 4
    assert sorted(end_hours(lake, "2024-01-07", after - untouched["2024-01-07"])) == [[14], [15]]
    a = [h for h in table(lake.history()) if h[0] == "a"]
    assert [h[1] for h in a] == ["a0", "a1", "a2", "a3", "a4", "a5", "a6", "a@14", "late", "a@16"]
    assert [h[4] for h in a][-3:] == [utc(2024, 1, 7, 15) - MS, utc(2024, 1, 7, 16) - MS, TMAX]


def _fold_late_into_two_hours_of_one_day(lake):
    """a, b and c at 14:00 and 16:00 on 7 Jan, then a late version of a at 15:00."""
    for n, hour in enumerate((14, 16)):
        lake.fold(
            [
                ev(k, "update", utc(2024, 1, 7, hour), 100 + n * 10 + i, f"{k}@{hour}")
                for i, k in enumerate("abc")
            ]
        )
    return lake.fold([ev("a", "update", utc(2024, 1, 7, 15), 999, "late")])


def test_late_data_is_placed_in_utc_whatever_the_python_time_zone(spark, tmp_path, monkeypatch):
    """PySpark hands timestamps to Python in the process's local zone; east of UTC, a late
    version's time read that way lies hours after the closed rows it must split."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        report = _fold_late_into_two_hours_of_one_day(EngineLake(spark, tmp_path))
        lake = EngineLake(spark, tmp_path)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert report.touched_since == utc(2024, 1, 7, 15) and report.closed_files_rewritten == 1
    a = [h for h in table(lake.history()) if h[0] == "a"]
    assert [(h[1], h[4]) for h in a] == [
        ("a@14", utc(2024, 1, 7, 15) - MS),
        ("late", utc(2024, 1, 7, 16) - MS),
        ("a@16", TMAX),
    ]


def test_a_settled_day_of_hour_files_is_merged_into_one_file(spark, tmp_path):
    lake = EngineLake(spark, tmp_path)
    # Hourly folds on 2 Jan: each closes the versions of the hour before, in a file of that hour.
    for hour in range(12):
        report = lake.fold(
            [ev(k, "update", utc(2024, 1, 2, hour), hour * 10 + i, f"{k}{hour}") for i, k in enumerate("ab")]
        )
        assert report.days_compacted == []
    hour_files = closed_files(lake, "2024-01-02")
    assert len(hour_files) == 11 and sorted(end_hours(lake, "2024-01-02", hour_files)) == [
        [h] for h in range(11)
    ]
    closed_on_2nd = [h for h in table(lake.history()) if h[4].date() == dt.date(2024, 1, 2)]

    # The first fold of 3 Jan does not reach 2 Jan: the day has settled, and its files merge.
    report = lake.fold([ev(k, "update", utc(2024, 1, 3, 1), 500 + i, f"{k}+") for i, k in enumerate("ab")])
    assert report.days_compacted == ["history:2024-01-02"] and report.days_appended == ["history:2024-01-03"]
    merged = closed_files(lake, "2024-01-02")
    assert len(merged) == 1 and not merged & hour_files
    assert [h for h in table(lake.history()) if h[4].date() == dt.date(2024, 1, 2)] == closed_on_2nd
    assert len(closed_on_2nd) == 22
    # A merged day stays merged: the next fold finds nothing to do there.
    assert lake.fold([ev("a", "update", utc(2024, 1, 3, 2), 600, "a++")]).days_compacted == []


def test_late_data_reaching_back_days_rewrites_the_files_of_each_day_it_reaches(spark, tmp_path):
    lake = EngineLake(spark, tmp_path)
    days = [utc(2024, 1, d, 12) for d in range(1, 8)]
    for i, day in enumerate(days):
        lake.fold([ev(k, "update", day, i * 10 + n, f"{k}{i}") for n, k in enumerate("abc")])
    report = lake.fold([ev("a", "update", days[5] + dt.timedelta(hours=1), 999, "late")])
    # a's version of 6 Jan ends on 7 Jan; the file of 6 Jan ends before the late version
    assert report.days_rewritten == ["history:2024-01-07"]
    report = lake.fold([ev("b", "update", days[2] - dt.timedelta(hours=1), 998, "later")])
    assert sorted(report.days_rewritten) == [f"history:2024-01-0{d}" for d in range(3, 8)]
    a = [h for h in table(lake.history()) if h[0] == "a"]
    assert [h[1] for h in a] == ["a0", "a1", "a2", "a3", "a4", "a5", "late", "a6"]
    b = [h for h in table(lake.history()) if h[0] == "b"]
    assert [h[1] for h in b] == ["b0", "b1", "later", "b2", "b3", "b4", "b5", "b6"]


def test_a_partial_update_closed_by_a_later_fold_still_fills_from_an_older_late_version(spark, tmp_path):
    """A partial update folded first, then closed by a delete in another fold (it becomes that
    fold's anchor), then its previous version arrives late: the unmodified column must still be
    taken from that previous version, so the stored row must keep its partial-update marker."""
    lake = EngineLake(spark, tmp_path)
    lake.fold([ev("a", "update", T[5], 5, c1="new", unmodified=["c2"])])
    lake.fold([ev("a", "delete", T[8], 8)])
    lake.fold([ev("a", "insert", T[1], 1, "old", 2)])
    assert table(lake.history()) == [
        ("a", "old", 2, T[1], T[5] - MS, False),
        ("a", "new", 2, T[5], T[8], False),
    ]
    assert lake.current() == []


def test_an_empty_batch_leaves_the_state_as_it_was(spark, tmp_path):
    """An empty batch, with the table's columns or without even its keys (the frame of empty
    upstream partitions), is a fold of nothing: no rows counted, nothing committed."""
    lake = EngineLake(spark, tmp_path)
    lake.fold([ev("1", "insert", T[1], 1, "abc", 1)])
    before = (lake.current(), lake.history())
    for batch in (spark.createDataFrame([], SCHEMA), spark.range(0).select()):
        report = fold(spark, lake.storage, lake.state, batch, lake.spec)
        assert (report.batch_rows, report.events_in, report.keys_touched, report.files_written) == (
            0,
            0,
            0,
            [],
        )
        assert (lake.current(), lake.history()) == before


def _plan_above_the_cache(frame) -> list[str]:
    plan = frame._jdf.queryExecution().executedPlan().toString().splitlines()
    return plan[: next(i for i, line in enumerate(plan) if "InMemoryRelation" in line)]


def _sorts_or_shuffles_above_the_cache(frame) -> list[str]:
    return [line for line in _plan_above_the_cache(frame) if "Sort [" in line or "Exchange " in line]


def _windows_above_the_cache(frame) -> list[str]:
    return [line for line in _plan_above_the_cache(frame) if "Window [" in line]


@pytest.mark.parametrize("cached", ["marked batch", "collapsed batch", "handed-over batch"])
def test_a_cached_batch_feeds_the_timeline_without_another_sort(spark, cached):
    """A fold into an empty table (a first backfill) builds the timeline from a cached batch:
    the marked batch it cached itself, a collapsed batch with the marks computed on top of it,
    or (handed over from the run's change-log write) the batch the reader collapsed and cached
    with its marks, which are then not computed again. The marks and the rules read events in
    one order, so Spark plans no shuffle or sort between the cache and the timeline: the batch
    is sorted once, not twice."""
    events = [
        ev("a", "insert", T[1], 1, "x", 1),
        ev("a", "update", T[2], 2, "y", unmodified=["c2"]),
        ev("b", "insert", T[1], 3, "z", 2),
        ev("b", "insert", T[1], 3, "z", 2),
    ]
    # b's two copies came in two deliveries: the change log keeps both, the timeline one.
    hours = ["2024-01-01-00", "2024-01-01-00", "2024-01-01-00", "2024-01-01-01"]
    schema = StructType([*SCHEMA.fields, StructField("hour", StringType())])
    batch = spark.createDataFrame([(*as_row(e), h) for e, h in zip(events, hours, strict=True)], schema)
    if cached == "marked batch":
        cache = marked = merge.mark_identical(batch, SPEC).persist()
    else:
        cache = merge.collapse_identical(batch, SPEC, keep_marks=cached == "handed-over batch").persist()
        marked = merge.mark_identical(cache, SPEC)
    try:
        cache.count()  # as the fold's totals or the reader's count do: the cached order is known from here on
        marks_windows = _windows_above_the_cache(marked) if marked is not cache else []
        assert (marks_windows == []) == (cached != "collapsed batch"), marks_windows
        kept = marked.where(F.col(merge.KEPT)).drop(*merge.COLLAPSE_MARKS)
        rows = merge.timeline(kept, SPEC, list(PAYLOAD), tie_break=merge.delivery_order(kept), purges=True)
        assert not _sorts_or_shuffles_above_the_cache(rows)
        assert [(r["id"], r["c1"], r["c2"]) for r in rows.orderBy("id", merge.START).collect()] == [
            ("a", "x", 1),
            ("a", "y", 1),
            ("b", "z", 2),
        ]
    finally:
        cache.unpersist()


def test_the_latest_write_of_each_version_is_picked_in_one_window(spark):
    """Of several writes of one version the greatest sequence wins; of its copies the greatest
    file name, whichever carries a purge marker; of copies equal in that, the last delivery; of
    copies equal in every column of the order, exactly one. The pick reads the events in one
    window over (key, version), the order they are sorted in, not three."""
    rows = [  # (label, id, version, seq, purged, file, delivery)
        ("a-old", "a", T[1], 1, False, "z", "h0"),
        ("a-lesser-file", "a", T[1], 2, False, "a", "h1"),
        ("a", "a", T[1], 2, False, "b", "h0"),
        ("b-first-delivery", "b", T[1], 1, False, "x", "h0"),
        ("b", "b", T[1], 1, False, "x", "h1"),
        ("c-marked", "c", T[1], 1, True, "x", "h0"),
        ("c", "c", T[1], 1, False, "y", "h1"),
        ("c-marker-unset", "c", T[1], 1, None, "x", "h1"),
        ("d", "d", T[1], 1, False, "x", "h0"),
        ("d", "d", T[1], 1, False, "x", "h0"),
        ("e1", "e", T[1], 1, False, "x", "h0"),
        ("e2", "e", T[2], 1, False, "x", "h0"),
        # A marker unset (NULL) ranks as false but sorts first: equal rank must not keep two.
        ("f-marker-unset", "f", T[1], 1, None, "b", "h0"),
        ("f-lesser-file", "f", T[1], 1, False, "a", "h0"),
        ("f", "f", T[1], 1, False, "b", "h0"),
        ("g-no-sequence", "g", T[1], None, False, "x", "h0"),
        ("g", "g", T[1], 1, False, "x", "h0"),
        ("h-no-delivery", "h", T[1], 1, False, "x", None),
        ("h", "h", T[1], 1, False, "x", "h0"),
    ]
    schema = StructType([*SCHEMA.fields, StructField("hour", StringType())])
    events = spark.createDataFrame(
        [
            (id_, label, None, "update", at, seq, None, purged, f"file:///{name}", hour)
            for label, id_, at, seq, purged, name, hour in rows
        ],
        schema,
    )
    kept = merge.latest_write_per_version(events, SPEC, tie_break=[F.col("hour")])
    assert sorted(r["c1"] for r in kept.collect()) == ["a", "b", "c", "d", "e1", "e2", "f", "g", "h"]
    plan = kept._jdf.queryExecution().executedPlan().toString()
    assert plan.count("Window [") == 1, plan


def test_a_fold_caches_a_batch_only_when_it_is_not_cached_already(spark, tmp_path, monkeypatch):
    """A batch the caller keeps in memory (the run's stored change batch, handed over) is not
    cached a second time as the marked batch; a batch read from files is, once."""
    marked_frames = []
    mark = merge.mark_identical
    monkeypatch.setattr(
        merge, "mark_identical", lambda *args: marked_frames.append(mark(*args)) or marked_frames[-1]
    )
    rows = [as_row(ev(k, "insert", T[1], i, "x", 1)) for i, k in enumerate("abc")]
    marks_cached = {}
    for name in ("read", "kept in memory"):
        given = spark.createDataFrame(rows, SCHEMA)
        if name == "kept in memory":
            given = given.persist()
        lake = EngineLake(spark, tmp_path / name.replace(" ", "_"))
        marked_frames.clear()
        seen = []
        # Looked at while the fold commits: whatever it cached is still held then.
        fold(
            spark,
            lake.storage,
            lake.state,
            given,
            lake.spec,
            on_commit_step=lambda step, seen=seen: seen.append(lake_io.is_cached(marked_frames[0])),
        )
        marks_cached[name] = seen[0]
        given.unpersist()
    assert marks_cached == {"read": True, "kept in memory": False}


def test_a_fold_leaves_no_cached_blocks_behind(spark, tmp_path):
    """The marked batch is cached; in a long-lived driver (a Spark Connect server, a sensor's
    process) it must not outlive the fold."""
    storage = spark.sparkContext._jsc.sc()

    def blocks():
        return sorted((info.id(), info.numCachedPartitions()) for info in storage.getRDDStorageInfo())

    before = blocks()
    lake = EngineLake(spark, tmp_path)
    lake.fold([ev("a", "insert", T[1], 1, "x", 1), ev("b", "insert", T[1], 2, "y", 2)])
    lake.fold([ev("a", "update", T[2], 3, "x2"), ev("b", "update", T[1] - MS, 4, "late")])
    # unpersist(blocking=False) returns before the blocks are gone, and on a busy machine (the
    # whole suite, two workers and the servers other tests start) their removal was seen to take
    # longer than 10 s; a block the fold leaks stays however long one waits
    deadline = time.monotonic() + 60
    while blocks() != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert blocks() == before


def test_a_fold_at_another_time_compiles_no_new_code(spark, tmp_path):
    """Every fold stamps its rows with its own `_fivetran_synced`; the same fold at another time
    must reuse Spark's compiled stages, not generate new ones around the new time."""
    events = [
        ev("a", "insert", T[1], 1, "x", 1),
        ev("a", "update", T[2], 2, "y", 2),
        ev("b", "insert", T[3], 3, "z", 3),
    ]
    compiled = []
    for name, synced in (("first", T[8]), ("second", T[9])):
        lake = EngineLake(spark, tmp_path / name)
        before = classes_compiled(spark)
        lake.fold(events, synced_at=synced)
        compiled.append(classes_compiled(spark) - before)
        stamped = [r["_fivetran_synced"] for r in (*lake.current(), *lake.history())]
        assert len(stamped) == 5 and set(stamped) == {synced}
    assert compiled[1] == 0, f"the second fold compiled {compiled[1]} new class(es)"


def dictionary_columns(folder: Path) -> dict[str, bool]:
    """Per column of the Parquet files under `folder`: whether any file stores it with a dictionary."""
    found: dict[str, bool] = {}
    for path in folder.rglob("*.parquet"):
        group = pq.ParquetFile(path).metadata.row_group(0)
        for i in range(group.num_columns):
            column = group.column(i)
            uses = any("DICTIONARY" in encoding for encoding in column.encodings)
            found[column.path_in_schema] = found.get(column.path_in_schema, False) or uses
    return found


def test_columns_unique_in_every_file_are_written_without_a_dictionary(spark, tmp_path):
    lake = EngineLake(spark, tmp_path)
    keys = [f"k{i:03d}" for i in range(200)]
    lake.fold([ev(k, "insert", T[1], i, "same", 7) for i, k in enumerate(keys)])
    lake.fold([ev(k, "update", T[2], 1000 + i, "same", 7) for i, k in enumerate(keys)])

    current = dictionary_columns(Path(lake.state.current[len("file://") :]))
    assert current["c1"] and not any(current[c] for c in ("id", "_version_at", "_seq"))
    history = dictionary_columns(Path(lake.state.history[len("file://") :]))
    assert history["c1"] and history["_fivetran_end"]  # the open rows all end at the end of time
    assert not any(history[c] for c in ("_fivetran_start", "_seq"))


def test_current_follows_the_open_set_even_when_every_key_is_deleted(spark, tmp_path):
    """Current is staged from the fold's open set; with every key deleted it is an empty table
    of its own columns, and a later insert brings the key back."""
    lake = EngineLake(spark, tmp_path)
    report = lake.fold([ev("a", "insert", T[1], 1, "x", 1), ev("b", "insert", T[1], 2, "y", 2)])
    assert report.current_rows == 2 and [r["id"] for r in lake.current()] == ["a", "b"]
    report = lake.fold([ev("a", "delete", T[2], 3), ev("b", "delete", T[2], 4)])
    assert report.current_rows == 0 and lake.current() == []
    columns = spark.read.parquet(lake.state.current).columns
    assert columns == ["id", "c1", "c2", "_version_at", "_seq", "_source_file", "_fivetran_synced"]
    report = lake.fold([ev("a", "insert", T[3], 5, "z", 3)])
    assert report.current_rows == 1 and [(r["id"], r["c1"], r["_version_at"]) for r in lake.current()] == [
        ("a", "z", T[3])
    ]
