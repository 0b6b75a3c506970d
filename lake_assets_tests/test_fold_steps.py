"""The steps `engine.fold.fold` is made of, each on its own, on small frames and a temporary lake.

The fold as a whole is judged by the reference-model, property and crash tests; these say what
each step hands the next.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lake_assets.engine import checks, merge
from lake_assets.engine import fold as fold_module
from lake_assets.engine import model as m
from lake_assets.engine.fold import (
    ACTIVE,
    END,
    FROM,
    KIND,
    OPEN,
    ORIGIN,
    SLICE,
    START,
    SYNCED,
    FoldReport,
    KeyWindows,
    OpenSet,
    closed_files_to_redo,
    kept_marks,
    key_windows,
    laid_out,
    late_keys,
    marked_batch,
    plan_state_commit,
    purged_now,
    read_open_set,
    settled_days_to_compact,
    split_closed_rows,
    stage_purges,
    stage_state,
    timeline_rows,
    touched_keys,
)
from lake_assets.engine.state import CommitPlan, TableState, parquet_files
from lake_assets.paths import LakeLayout
from lake_assets.storage import Storage
from lake_assets_tests.engine_harness import SCHEMA, SPEC, EngineLake, as_row, utc

HC = SPEC.history_columns
TMAX = utc(9999, 12, 31, 23, 59, 59, 999000)
MS = dt.timedelta(milliseconds=1)
#: timeline rows in the engine's own column names (what the staging steps are handed)
ROW_SCHEMA = (
    f"id string, c1 string, c2 long, {START} timestamp, {END} timestamp, {ACTIVE} boolean, "
    f"{SYNCED} timestamp, {m.OP} string, {m.SEQ} long, {m.UNMODIFIED} array<string>, "
    f"{m.PURGED} boolean, {m.SOURCE_FILE} string"
)


def aware(moment: dt.datetime) -> dt.datetime:
    """A time collected from Spark (naive, in the Python process's zone) as an aware UTC time."""
    return moment.astimezone(dt.UTC)


def ev(id_, op, at, seq, c1=None, purged=False):
    return {"id": id_, "op": op, "version_at": at, "seq": seq, "c1": c1, "purged": purged}


def batch_of(spark, events: list[dict]) -> DataFrame:
    return spark.createDataFrame([as_row(e) for e in events], SCHEMA)


def timeline_row(id_, c1, start, end, op="update", seq=1, purged=False, synced=None):
    synced = synced or utc(2024, 2, 1)
    return (id_, c1, None, start, end, end == TMAX, synced, op, seq, None, purged, "file:///test")


def rows_of(spark, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, ROW_SCHEMA)


def stored(frame: DataFrame) -> DataFrame:
    """Timeline rows as the lake stores them (history-mode column names)."""
    return (
        frame.withColumnRenamed(START, HC.start)
        .withColumnRenamed(END, HC.end)
        .withColumnRenamed(ACTIVE, HC.active)
        .withColumnRenamed(SYNCED, HC.synced)
    )


def lake_state(tmp_path) -> TableState:
    return TableState(LakeLayout(f"file://{tmp_path}"), "test", SPEC.name)


def test_marked_batch_keeps_the_delivery_adds_optional_columns_erases_recorded_keys_and_marks(spark):
    batch = spark.createDataFrame(
        [
            ("a", "x", "insert", utc(2024, 1, 1), 1, "2024-01-01-00", utc(2024, 1, 2)),
            ("a", "x", "insert", utc(2024, 1, 1), 1, "2024-01-01-00", utc(2024, 1, 2)),
            ("a", "x", "insert", utc(2024, 1, 1), 1, "2024-01-01-01", utc(2024, 1, 2)),
            ("b", "y", "insert", utc(2024, 1, 1), 2, "2024-01-01-00", utc(2024, 1, 2)),
        ],
        f"id string, c1 string, {m.OP} string, {m.VERSION_AT} timestamp, {m.SEQ} long, hour string, "
        f"{m.INGESTED_AT} timestamp",
    )
    recorded = spark.createDataFrame([("b",)], "id string")

    marked = marked_batch(batch, SPEC, recorded)

    assert "hour" in marked.columns and m.INGESTED_AT not in marked.columns
    assert {m.UNMODIFIED, m.PURGED, m.SOURCE_FILE, *merge.COLLAPSE_MARKS} <= set(marked.columns)
    marks = marked.select("id", "hour", m.PURGED, merge.KEPT, merge.LAST_OF_EVENT, merge.FIRST_OF_KEY)
    rows = sorted(tuple(r) for r in marks.collect())
    # One copy kept per delivery (hour); the event counts once, in its last delivery; the key's
    # first event is marked on the copy kept of it.
    assert rows == [
        ("a", "2024-01-01-00", False, False, False, False),
        ("a", "2024-01-01-00", False, True, False, True),
        ("a", "2024-01-01-01", False, True, True, False),
        ("b", "2024-01-01-00", True, True, True, True),
    ]
    # Without a ledger nothing is erased.
    assert marked_batch(batch, SPEC, None).where(F.col(m.PURGED)).count() == 0


def test_kept_marks_persists_the_marks_unless_the_batch_is_cached_and_nothing_is_erased(spark):
    batch = batch_of(spark, [ev("a", "insert", utc(2024, 1, 1), 1, "x")])
    recorded = spark.createDataFrame([("z",)], "id string")

    cached: list[DataFrame] = []
    marked = kept_marks(batch, marked_batch(batch, SPEC, None), None, cached)
    assert cached == [marked] and marked.storageLevel.useMemory
    marked.unpersist()

    batch.cache()
    try:
        cached = []
        marked = kept_marks(batch, marked_batch(batch, SPEC, None), None, cached)
        assert cached == [] and not marked.storageLevel.useMemory
        marked = kept_marks(batch, marked_batch(batch, SPEC, recorded), recorded, cached)
        assert cached == [marked] and marked.storageLevel.useMemory
        marked.unpersist()
    finally:
        batch.unpersist()


def test_a_fold_that_fails_releases_the_marks_it_cached(spark, tmp_path, monkeypatch):
    marks: list[DataFrame] = []
    mark_identical = merge.mark_identical

    def recorded_marks(events, spec):
        marks.append(mark_identical(events, spec))
        return marks[-1]

    class Killed(Exception):
        pass

    def dies(*args, **kwargs):
        raise Killed()

    monkeypatch.setattr(merge, "mark_identical", recorded_marks)
    monkeypatch.setattr(fold_module, "commit", dies)
    with pytest.raises(Killed):
        EngineLake(spark, tmp_path).fold([ev("a", "insert", utc(2024, 1, 1), 1, "x")])
    assert len(marks) == 1 and not marks[0].storageLevel.useMemory


def test_the_marks_a_collapse_hands_on_are_those_a_fold_would_give_its_events(spark):
    """The reader collapses a batch and hands its marks on with it; the fold then marks the
    events without a window. Over copies in one delivery and across deliveries (the key's
    first event among them), several writes of a version, NULL sequences and deliveries and
    purge markers, the marks handed on are those computed afresh for the collapsed events."""
    rng = random.Random(32)
    times = [utc(2024, 1, 1, 0, 0, second) for second in range(4)]
    rows = []
    for _ in range(400):
        copy = (
            rng.choice("abcdefgh"),
            "x",  # copies equal in the order are equal: which one a collapse keeps is then moot
            None,
            rng.choice(["insert", "update", "delete"]),
            rng.choice(times),
            rng.choice([None, 1, 2]),
            None,
            rng.choice([False, True, None]),
            rng.choice([None, "file:///a", "file:///b"]),
            rng.choice([None, "2024-01-01-00", "2024-01-01-01"]),
        )
        rows.extend([copy] * rng.choice([1, 1, 2, 3]))
    rng.shuffle(rows)
    batch = spark.createDataFrame(rows, T.StructType([*SCHEMA.fields, T.StructField("hour", T.StringType())]))

    handed_on = merge.collapse_identical(batch, SPEC, keep_marks=True)
    assert merge.carries_marks(handed_on) and merge.KEPT not in handed_on.columns
    afresh = merge.mark_identical(merge.collapse_identical(batch, SPEC), SPEC)

    def marks(frame: DataFrame) -> list[tuple]:
        return sorted(
            (tuple(row) for row in frame.select(*batch.columns, *merge.COLLAPSE_MARKS).collect()), key=repr
        )

    assert marks(merge.mark_identical(handed_on, SPEC)) == marks(afresh)
    assert afresh.where(F.col(merge.FIRST_OF_KEY)).count() == batch.select("id").distinct().count()
    assert merge.without_marks(handed_on).columns == batch.columns


def test_touched_keys_are_each_key_with_its_earliest_version(spark):
    batch = batch_of(
        spark,
        [
            ev("a", "update", utc(2024, 1, 3), 3),
            ev("a", "insert", utc(2024, 1, 1), 1),
            ev("b", "insert", utc(2024, 1, 2), 2),
        ],
    )
    touched = touched_keys(marked_batch(batch, SPEC, None), SPEC)
    got = sorted((r["id"], aware(r[FROM])) for r in touched.collect())
    assert got == [("a", utc(2024, 1, 1)), ("b", utc(2024, 1, 2))]
    assert touched.columns == ["id", FROM]


def test_read_open_set_splits_the_stored_open_rows_by_the_touched_keys(spark, tmp_path):
    state = lake_state(tmp_path)
    storage = Storage()
    touched = spark.createDataFrame([("a", utc(2024, 1, 5))], f"id string, {FROM} timestamp")
    assert read_open_set(spark, storage, state, SPEC, touched) == OpenSet([])

    open_rows = [
        timeline_row("a", "a1", utc(2024, 1, 2), TMAX),
        timeline_row("b", "b1", utc(2024, 1, 3), TMAX),
    ]
    stored(rows_of(spark, open_rows)).write.parquet(state.history_active)
    open_set = read_open_set(spark, storage, state, SPEC, touched)

    assert open_set.paths == [state.history_active]
    assert sorted(r["id"] for r in open_set.rows.collect()) == ["a", "b"]
    touched_rows = [(r["id"], aware(r[START]), aware(r[FROM])) for r in open_set.touched.collect()]
    assert touched_rows == [("a", utc(2024, 1, 2), utc(2024, 1, 5))]
    assert [r["id"] for r in open_set.carried.collect()] == ["b"]
    assert FROM not in open_set.carried.columns


def test_purged_now_is_the_marked_keys_the_ledger_does_not_hold(spark):
    events = batch_of(
        spark,
        [
            ev("a", "update", utc(2024, 1, 1), 1, purged=True),
            ev("b", "update", utc(2024, 1, 1), 2, purged=True),
            ev("c", "update", utc(2024, 1, 1), 3),
        ],
    )
    recorded = spark.createDataFrame([("b",)], "id string")

    found, frame = purged_now(spark, events, recorded, ["id"], purge_markers=2)
    assert found == [("a",)] and [tuple(r) for r in frame.collect()] == [("a",)] and frame.columns == ["id"]
    assert purged_now(spark, events, None, ["id"], purge_markers=0) == ([], None)
    only_recorded = events.where(F.col("id") == "b")
    assert purged_now(spark, only_recorded, recorded, ["id"], purge_markers=1) == ([], None)


def test_late_keys_are_those_whose_batch_reaches_back_to_their_open_row(spark):
    open_touched = spark.createDataFrame(
        [
            ("a", utc(2024, 1, 5), utc(2024, 1, 4)),
            ("b", utc(2024, 1, 5), utc(2024, 1, 5)),
            ("c", utc(2024, 1, 5), utc(2024, 1, 6)),
        ],
        f"id string, {START} timestamp, {FROM} timestamp",
    )
    late = late_keys(open_touched, SPEC)
    got = sorted((r["id"], aware(r[FROM])) for r in late.collect())
    assert got == [("a", utc(2024, 1, 4)), ("b", utc(2024, 1, 5))]


def _write_closed_day(spark, state: TableState, day: str, ends: list[dt.datetime]) -> list[str]:
    """One closed history file per end time, under the day's folder."""
    folder = f"{state.history_closed}/{day}"
    for index, end in enumerate(ends):
        row = timeline_row(f"k{index}", "v", end - dt.timedelta(hours=1), end)
        stored(rows_of(spark, [row])).coalesce(1).write.mode("append").parquet(folder)
    return parquet_files(Storage(), folder)


def test_closed_files_to_redo_are_those_late_data_reaches_or_all_when_erasing(spark, tmp_path):
    state, storage = lake_state(tmp_path), Storage()
    old = _write_closed_day(spark, state, "2024-01-01", [utc(2024, 1, 1, 5)])
    day2 = _write_closed_day(spark, state, "2024-01-02", [utc(2024, 1, 2, 5), utc(2024, 1, 2, 20)])
    late_file = next(uri for uri in day2 if _max_end(spark, uri) == utc(2024, 1, 2, 20))

    assert closed_files_to_redo(storage, state, SPEC, None, erasing=False) == {}
    everything = closed_files_to_redo(storage, state, SPEC, None, erasing=True)
    assert everything == {("history", "2024-01-01"): old, ("history", "2024-01-02"): day2}
    # A row ending a millisecond before the late version is reached too.
    reached = closed_files_to_redo(storage, state, SPEC, utc(2024, 1, 2, 20) + MS, erasing=False)
    assert reached == {("history", "2024-01-02"): [late_file]}
    assert closed_files_to_redo(storage, state, SPEC, utc(2024, 1, 2, 20) + 2 * MS, erasing=False) == {}


def _max_end(spark, uri: str) -> dt.datetime:
    return aware(spark.read.parquet(uri).agg(F.max(HC.end)).collect()[0][0])


def test_split_closed_rows_sends_the_rows_late_data_reaches_to_the_window(spark):
    closed = rows_of(
        spark,
        [
            timeline_row("a", "a1", utc(2024, 1, 1), utc(2024, 1, 1, 12)),
            timeline_row("a", "a2", utc(2024, 1, 2), utc(2024, 1, 3) - MS),
            timeline_row("b", "b1", utc(2024, 1, 1), utc(2024, 1, 4) - MS),
        ],
    )
    open_touched = spark.createDataFrame(
        [("a", utc(2024, 1, 3), utc(2024, 1, 2)), ("b", utc(2024, 1, 4), utc(2024, 1, 5))],
        f"id string, {START} timestamp, {FROM} timestamp",
    )
    kept, window = split_closed_rows(closed, open_touched, 1, SPEC)
    assert sorted(r["c1"] for r in kept.collect()) == ["a1", "b1"] and kept.columns == closed.columns
    assert [(r["c1"], aware(r[FROM])) for r in window.collect()] == [("a2", utc(2024, 1, 2))]
    # Without late keys (only purges to erase) every closed row is kept.
    assert split_closed_rows(closed, open_touched, 0, SPEC) == (closed, None)
    assert split_closed_rows(None, open_touched, 1, SPEC) == (None, None)


def test_settled_days_to_compact_are_the_recent_days_before_the_fold_with_many_files(tmp_path, monkeypatch):
    monkeypatch.setattr(fold_module, "COMPACT_AFTER_FILES", 2)
    state, storage = lake_state(tmp_path), Storage()
    for root, day, files in (
        (state.history_closed, "2024-01-01", 3),  # before the lookback
        (state.history_closed, "2024-01-03", 3),
        (state.history_closed, "2024-01-04", 2),  # not enough files
        (state.deletes_closed, "2024-01-04", 3),
        (state.history_closed, "2024-01-05", 3),  # the fold's own day: not settled
    ):
        folder = Path(root[len("file://") :]) / day
        folder.mkdir(parents=True)
        for index in range(files):
            (folder / f"part-{index}.parquet").write_bytes(b"")
    since = utc(2024, 1, 5, 3)

    found = settled_days_to_compact(storage, state, since, skip={})
    assert sorted(found) == [("delete", "2024-01-04"), ("history", "2024-01-03")]
    assert found[("history", "2024-01-03")] == parquet_files(storage, f"{state.history_closed}/2024-01-03")
    # A day the fold rewrites anyway is left to that rewrite.
    assert sorted(settled_days_to_compact(storage, state, since, skip={("history", "2024-01-03"): []})) == [
        ("delete", "2024-01-04"),
    ]


def test_key_windows_join_stored_rows_and_the_batch_with_anchors_before_the_earliest_version(spark):
    events = batch_of(
        spark,
        [
            ev("a", "update", utc(2024, 1, 3), 5, "a3"),
            ev("b", "insert", utc(2024, 1, 3), 6, "b"),
        ],
    )
    touched = spark.createDataFrame([("a", utc(2024, 1, 3))], f"id string, {FROM} timestamp")
    assert key_windows(events, touched, None, SPEC) == KeyWindows(events)

    stored_rows = rows_of(
        spark,
        [
            timeline_row("a", "a1", utc(2024, 1, 1), utc(2024, 1, 2) - MS),
            timeline_row("a", "a2", utc(2024, 1, 4), TMAX),
        ],
    ).withColumn(FROM, F.lit(utc(2024, 1, 3)))
    windows = key_windows(events, touched, stored_rows, SPEC)

    rows = windows.events.select("c1", ORIGIN, windows.anchor.alias("anchor")).collect()
    assert sorted(tuple(r) for r in rows) == [("a1", 0, True), ("a2", 0, False), ("a3", 1, False)]
    assert not {END, ACTIVE, SYNCED} & set(windows.events.columns)
    assert windows.tie_break is not None


def test_timeline_rows_are_the_windows_timeline_synced_at_the_folds_time(spark):
    events = batch_of(
        spark,
        [
            ev("a", "insert", utc(2024, 1, 1), 1, "a1"),
            ev("a", "update", utc(2024, 1, 2), 2, "a2"),
        ],
    )
    windows = KeyWindows(events.withColumn(FROM, F.lit(utc(2024, 1, 1))))
    synced = utc(2024, 2, 1)

    rows = timeline_rows(windows, SPEC, synced, batch_purges=False)

    assert not {FROM, ORIGIN} & set(rows.columns)
    got = sorted(
        (r["c1"], aware(r[START]), aware(r[END]), r[ACTIVE], aware(r[SYNCED])) for r in rows.collect()
    )
    assert got == [
        ("a1", utc(2024, 1, 1), utc(2024, 1, 2) - MS, False, synced),
        ("a2", utc(2024, 1, 2), TMAX, True, synced),
    ]


def test_timeline_rows_erase_a_key_the_batch_purges(spark):
    events = batch_of(
        spark,
        [
            ev("a", "insert", utc(2024, 1, 1), 1, "a1"),
            ev("a", "update", utc(2024, 1, 2), 2, purged=True),
        ],
    )
    rows = timeline_rows(KeyWindows(events), SPEC, utc(2024, 2, 1), batch_purges=True)
    assert sorted((r["c1"], r[m.PURGED]) for r in rows.collect()) == [(None, True), (None, True)]


def test_laid_out_gives_each_row_its_kind_and_slice(spark):
    rows = rows_of(
        spark,
        [
            timeline_row("a", "open", utc(2024, 1, 1), TMAX),
            timeline_row("a", "closed", utc(2024, 1, 1), utc(2024, 1, 2, 5, 30)),
            timeline_row("b", None, utc(2024, 1, 2), TMAX, op="delete"),
        ],
    )
    settled = rows_of(spark, [timeline_row("c", "settled", utc(2024, 1, 1), utc(2024, 1, 1, 7))])

    small = laid_out(SPEC, [rows, None], settled, large=False)
    assert sorted((r["c1"], r[KIND], r[SLICE]) for r in small.collect() if r["c1"]) == [
        ("closed", "history", "2024-01-02T05"),
        ("open", "history", OPEN),
        ("settled", "history", "2024-01-01"),
    ]
    assert [(r[KIND], r[SLICE]) for r in small.where(F.col("id") == "b").collect()] == [("delete", OPEN)]
    large = laid_out(SPEC, [rows], None, large=True)
    assert sorted(r[SLICE] for r in large.collect()) == ["2024-01-02", OPEN, OPEN]


def test_stage_state_writes_rows_by_kind_and_slice_and_current_from_the_open_set(spark, tmp_path):
    storage = Storage()
    stage = f"file://{tmp_path}/stage"
    state_rows = laid_out(
        SPEC,
        [
            rows_of(
                spark,
                [
                    timeline_row("a", "a2", utc(2024, 1, 2), TMAX),
                    timeline_row("a", "a1", utc(2024, 1, 1), utc(2024, 1, 2, 5)),
                    timeline_row("b", None, utc(2024, 1, 2), TMAX, op="delete"),
                    timeline_row("c", "c1", utc(2024, 1, 2), TMAX),
                ],
            )
        ],
        None,
        large=False,
    )

    current_rows = stage_state(
        spark, storage, SPEC, state_rows, stage, OpenSet([]), keys_touched=3, large=False
    )

    assert current_rows == 2
    current = spark.read.parquet(f"{stage}/current")
    assert sorted((r["id"], r["c1"], aware(r[m.VERSION_AT])) for r in current.collect()) == [
        ("a", "a2", utc(2024, 1, 2)),
        ("c", "c1", utc(2024, 1, 2)),
    ]
    for kind, slice_ in (("history", OPEN), ("history", "2024-01-02T05"), ("delete", OPEN)):
        assert parquet_files(storage, f"{stage}/rows/{KIND}={kind}/{SLICE}={slice_}")


def test_stage_purges_records_the_new_keys_in_the_commit_plan(spark, tmp_path):
    state, storage = lake_state(tmp_path), Storage()
    stage = state.staging("f1")
    plan = CommitPlan("f1")
    when = {"synced_at": utc(2024, 2, 1), "log_column": None}
    assert stage_purges(spark, storage, state, plan, stage, None, None, **when) == []
    assert plan == CommitPlan("f1")

    purged = spark.createDataFrame([("a",)], "id string")
    erased = stage_purges(spark, storage, state, plan, stage, None, purged, **when)
    assert erased == []
    assert [final.rsplit("/", 1)[0] for _, final in plan.adds] == [state.purged]
    assert [r["id"] for r in spark.read.parquet(f"{stage}/purged").collect()] == ["a"]


def test_plan_state_commit_replaces_the_open_sets_and_adds_the_closed_slices_to_their_days(spark, tmp_path):
    state, storage = lake_state(tmp_path), Storage()
    stage = state.staging("f1")
    one_row = rows_of(spark, [timeline_row("a", "x", utc(2024, 1, 1), TMAX)])
    for folder in (
        f"{stage}/rows/{KIND}=history/{SLICE}={OPEN}",
        f"{stage}/rows/{KIND}=history/{SLICE}=2024-01-02T05",
        f"{stage}/rows/{KIND}=history/{SLICE}=2024-01-02T06",
        f"{stage}/rows/{KIND}=history/{SLICE}=2024-01-03T01",
        f"{stage}/rows/{KIND}=delete/{SLICE}=2024-01-01T00",
        f"{stage}/current",
        state.history_active,
    ):
        one_row.coalesce(1).write.parquet(folder)
    old_active = parquet_files(storage, state.history_active)
    rewrite = {("history", "2024-01-03"): ["file:///lake/rewritten.parquet"]}
    compact = {("history", "2023-12-31"): ["file:///lake/s1.parquet", "file:///lake/s2.parquet"]}
    plan = CommitPlan("f1")

    appended = plan_state_commit(storage, state, plan, stage, rewrite, compact)

    assert appended == ["history:2024-01-02", "delete:2024-01-01"]
    assert plan.deletes == [
        *old_active,
        "file:///lake/rewritten.parquet",
        "file:///lake/s1.parquet",
        "file:///lake/s2.parquet",
    ]
    finals = [final.rsplit("/", 1)[0] for _, final in plan.adds]
    assert finals == [
        state.history_active,
        state.current,
        f"{state.history_closed}/2024-01-02",
        f"{state.history_closed}/2024-01-02",
        f"{state.history_closed}/2024-01-03",
        f"{state.deletes_closed}/2024-01-01",
    ]


def test_report_closed_days_and_counts():
    report = FoldReport("f1")
    rewrite, compact = {("history", "2024-01-02"): ["x", "y"]}, {("delete", "2024-01-01"): ["z"]}
    fold_module._report_closed_days(report, rewrite, compact)
    assert (report.days_rewritten, report.closed_files_rewritten, report.days_compacted) == (
        ["history:2024-01-02"],
        2,
        ["delete:2024-01-01"],
    )
    totals = {"rows": 5, "events": 4, "versions": 3, "keys": 2, "since": utc(2024, 1, 1), "late_keys": 1}
    totals |= {"versions_count": 3, "versions_low": 11, "versions_high": 12}
    fold_module._report_counts(report, totals)
    assert report.batch_versions == checks.VersionSet(3, 11, 12)
    counts = (
        report.batch_rows,
        report.events_in,
        report.identical_duplicates,
        report.superseded_writes,
        report.keys_touched,
        report.touched_since,
        report.late_keys,
    )
    assert counts == (5, 4, 1, 1, 2, utc(2024, 1, 1), 1)


def test_nothing_to_fold_in_an_empty_frame_that_lacks_the_keys(spark):
    assert fold_module._nothing_to_fold(spark.createDataFrame([], "other string"), SPEC)
    # With the keys present, even an empty batch goes on: its emptiness shows in the counts.
    assert not fold_module._nothing_to_fold(batch_of(spark, []), SPEC)
    assert not fold_module._nothing_to_fold(spark.createDataFrame([Row(other="x")]), SPEC)
