"""The sensor's scanning logic: new hours, late files, run keys, pruned listing."""

import json
import os

import pytest

from lake_assets.errors import LakeAssetsError
from lake_assets.feeds.unit_cdc import UnitCdcFormat
from lake_assets.landing_watch import (
    TableCursor,
    contiguous_ranges,
    decode_cursor,
    encode_cursor,
    scan_table,
    stretches_in_order,
)
from lake_assets.processed import ProcessedFile, ProcessedWith, changed_partitions
from lake_assets.storage import Storage
from lake_assets_tests.storage_spy import CountingStorage
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events


def _write(landing, hour, name, day=1):
    return write_events(
        landing,
        "accounts",
        hour,
        name,
        [event("a", "INSERT", hour, at(hour, day=day), name="n", balance=1)],
        ACCOUNT_SCHEMA,
        day=day,
    )


def test_new_hours_then_only_late_files_are_reported(tmp_path):
    landing = tmp_path / "unit"
    for hour in (0, 1, 2, 5):
        _write(landing, hour, "part-0.parquet")
    storage, fmt, uri = Storage(), UnitCdcFormat(), f"file://{landing}"

    found, cursor, _ = scan_table(storage, fmt, uri, "accounts", TableCursor(), late_hours=4)
    assert [f.partition for f in found] == [
        "2024-03-01-00",
        "2024-03-01-01",
        "2024-03-01-02",
        "2024-03-01-05",
    ]
    assert cursor.high_water == "2024-03-01-05"

    again, cursor, _ = scan_table(
        storage, fmt, uri, "accounts", decode_cursor(encode_cursor({"accounts": cursor}))["accounts"], 4
    )
    assert again == []

    _write(landing, 2, "part-late.parquet")  # 3 hours late: inside the window
    _write(landing, 6, "part-0.parquet")
    found, cursor, _ = scan_table(storage, fmt, uri, "accounts", cursor, 4)
    assert [(f.partition, f.new_names) for f in found] == [
        ("2024-03-01-02", ("part-late.parquet",)),
        ("2024-03-01-06", ("part-0.parquet",)),
    ]
    assert [json.loads(version)[0] for version in found[0].all_names] == [
        "part-0.parquet",
        "part-late.parquet",
    ]
    # Hours older than the window are forgotten, so the cursor stays small.
    assert min(cursor.seen) >= "2024-03-01-02"


def test_scan_lists_only_the_late_window_not_the_whole_history(tmp_path):
    landing = tmp_path / "unit"
    for day in range(1, 11):
        for hour in (0, 12):
            _write(landing, hour, "part-0.parquet", day=day)
    storage, fmt, uri = CountingStorage(), UnitCdcFormat(), f"file://{landing}"
    _, cursor, _ = scan_table(storage, fmt, uri, "accounts", TableCursor(), 4)  # one walk of it all
    storage.listed.clear()
    scan_table(storage, fmt, uri, "accounts", cursor, 4)
    # year + month + the last day folder + its hour folders, not 10 days of folders.
    assert len(storage.listed) <= 6 < sum(1 for path in landing.rglob("*") if path.is_dir())


def test_contiguous_ranges_group_consecutive_hours():
    keys = [
        "2024-03-01-00",
        "2024-03-01-01",
        "2024-03-01-02",
        "2024-03-01-05",
        "2024-03-02-00",
        "2024-03-01-23",
    ]
    assert contiguous_ranges(keys) == [
        ("2024-03-01-00", "2024-03-01-02"),
        ("2024-03-01-05", "2024-03-01-05"),
        ("2024-03-01-23", "2024-03-02-00"),
    ]
    # Allowed gaps of hours without a key: up to 2 empty hours in a row stay in one range.
    assert contiguous_ranges(keys, max_gap_hours=2) == [
        ("2024-03-01-00", "2024-03-01-05"),
        ("2024-03-01-23", "2024-03-02-00"),
    ]
    assert contiguous_ranges(["1990-06-01-03", "2024-03-01-01"], max_gap_hours=24) == [
        ("1990-06-01-03", "1990-06-01-03"),
        ("2024-03-01-01", "2024-03-01-01"),
    ]


def test_stretches_follow_the_order_partitions_were_registered_in():
    registered = ["c", "d", "a", "b"]  # c and d first, then a and b
    assert stretches_in_order(registered, ["b", "c", "d"]) == [("b",), ("c", "d")]
    assert stretches_in_order(registered, ["a", "b", "c", "d"]) == [("c", "d", "a", "b")]
    assert stretches_in_order(registered, ["d", "a"]) == [("d", "a")]  # in a row where registered
    assert stretches_in_order(["a", "b", "c"], ["a", "c"]) == [("a",), ("c",)]  # b is not wanted
    assert stretches_in_order(["a"], []) == []
    assert stretches_in_order(["a", "b"], ["a", "a", "b"]) == [("a", "b")]
    # Stretches run in the order of their earliest wanted key: (d, a) holds a, so before (b).
    assert stretches_in_order(["d", "a", "x", "b"], ["a", "b", "d"]) == [("d", "a"), ("b",)]
    with pytest.raises(LakeAssetsError, match="x are not registered"):
        stretches_in_order(["a"], ["a", "x"])


def test_hours_before_the_first_partition_are_never_found_until_it_moves_back_to_them(tmp_path):
    """A sensor's range over hours before the table's first partition failed whole (valid hours
    too), and the cursor remembered the hours, so no later tick asked for them again. They are
    now reported on every scan, and a first partition moved earlier (discovery pinned an earlier
    hour; a reload) uncovers them, and only them, however far the cursor has moved on."""
    landing = tmp_path / "unit"
    for hour in (0, 1, 2):
        _write(landing, hour, "part-0.parquet")
    storage, fmt, uri = Storage(), UnitCdcFormat(), f"file://{landing}"

    found, cursor, before = scan_table(storage, fmt, uri, "accounts", TableCursor(), 4, "2024-03-01-01")
    assert [f.partition for f in found] == ["2024-03-01-01", "2024-03-01-02"]
    assert before == ["2024-03-01-00"] and "2024-03-01-00" not in cursor.seen
    for hour in range(3, 12):
        _write(landing, hour, "part-0.parquet")
    found, cursor, before = scan_table(storage, fmt, uri, "accounts", cursor, 4, "2024-03-01-01")
    assert [f.partition for f in found] == [f"2024-03-01-{h:02d}" for h in range(3, 12)]

    found, cursor, before = scan_table(storage, fmt, uri, "accounts", cursor, 4, "2024-03-01-00")
    assert [f.partition for f in found] == ["2024-03-01-00"] and before == []
    assert scan_table(storage, fmt, uri, "accounts", cursor, 4, "2024-03-01-00").found == []


def test_a_file_rewritten_in_place_or_removed_makes_its_hour_run_again(tmp_path):
    """A vendor's correction rewrites a file under its name; a file taken back is removed. The
    sensor compared names only, so neither ever ran: the hour's changes kept the old rows."""
    landing = tmp_path / "unit"
    for hour in (0, 1, 2):
        _write(landing, hour, "part-0.parquet")
    _write(landing, 1, "part-1.parquet")
    storage, fmt, uri = Storage(), UnitCdcFormat(), f"file://{landing}"
    _, cursor, _ = scan_table(storage, fmt, uri, "accounts", TableCursor(), 4)
    assert scan_table(storage, fmt, uri, "accounts", cursor, 4).found == []

    rewritten = _write(landing, 0, "part-0.parquet")
    os.utime(rewritten, (1_900_000_000, 1_900_000_000))  # rewritten later, whatever its size
    (landing / "accounts/year=2024/month=03/day=01/hour=01/part-1.parquet").unlink()
    for part in (landing / "accounts/year=2024/month=03/day=01/hour=02").iterdir():
        part.unlink()
    found, cursor, _ = scan_table(storage, fmt, uri, "accounts", cursor, 4)

    assert [(f.partition, f.new_names, len(f.removed)) for f in found] == [
        ("2024-03-01-00", ("part-0.parquet",), 1),
        ("2024-03-01-01", (), 1),
        ("2024-03-01-02", (), 1),
    ]
    assert scan_table(storage, fmt, uri, "accounts", cursor, 4).found == []


def test_a_removal_back_to_files_already_run_gets_a_run_key_of_its_own(tmp_path):
    """Hour 0 ran with `a`, then with `a` and a wrong late `b`; the vendor removes `b`. Keyed by
    the files the hour holds, the removal's run had the first run's key, which Dagster does not
    run again, and `b`'s rows stayed."""
    landing = tmp_path / "unit"
    _write(landing, 0, "part-a.parquet")
    storage, fmt, uri = Storage(), UnitCdcFormat(), f"file://{landing}"
    [first], cursor, _ = scan_table(storage, fmt, uri, "accounts", TableCursor(), 4)
    late = _write(landing, 0, "part-b.parquet")
    [second], cursor, _ = scan_table(storage, fmt, uri, "accounts", cursor, 4)
    late.unlink()
    [removal], cursor, _ = scan_table(storage, fmt, uri, "accounts", cursor, 4)

    assert removal.all_names == first.all_names and len(removal.removed) == 1
    assert len({first.fingerprint, second.fingerprint, removal.fingerprint}) == 3


def test_a_cursor_saved_with_names_alone_runs_nothing_again_after_an_upgrade(tmp_path):
    """Cursors saved before the sensor remembered sizes and times hold names: their files count
    as seen (else every hour of the late window ran again), and a name gone is a removal."""
    landing = tmp_path / "unit"
    for name in ("part-0.parquet", "part-1.parquet"):
        _write(landing, 0, name)
    storage, fmt, uri = Storage(), UnitCdcFormat(), f"file://{landing}"
    saved = decode_cursor(
        json.dumps(
            {
                "accounts": {
                    "high_water": "2024-03-01-00",
                    "seen": {"2024-03-01-00": ["part-0.parquet", "part-1.parquet"]},
                }
            }
        )
    )["accounts"]

    found, cursor, _ = scan_table(storage, fmt, uri, "accounts", saved, 4)
    assert found == [] and [json.loads(v)[0] for v in cursor.seen["2024-03-01-00"]] == [
        "part-0.parquet",
        "part-1.parquet",
    ]

    saved.seen["2024-03-01-00"].append("part-gone.parquet")
    [removal], _, _ = scan_table(storage, fmt, uri, "accounts", saved, 4)
    assert removal.new_names == () and removal.removed == ("part-gone.parquet",)


def test_a_first_scan_finds_the_hours_read_from_files_that_are_all_gone_now(tmp_path):
    """A first scan has no cursor to miss a file from: an hour the lake read (processed, or its
    changes stored and never folded: a run killed before its fold) whose files are all gone is
    found from its note, the files it was read from as removed. Its run empties it, as
    planning's does."""
    landing = tmp_path / "unit"
    _write(landing, 0, "part-0.parquet")
    storage, fmt, uri = Storage(), UnitCdcFormat(), f"file://{landing}"

    def read_from(hour: int, name: str) -> dict[str, ProcessedFile]:
        return {
            f"{uri}/accounts/year=2024/month=03/day=01/hour={hour:02d}/{name}": ProcessedFile(10, "0" * 64, 0)
        }

    processed = ProcessedWith(
        storage,
        {"2024-03-01-03": read_from(3, "part-0.parquet"), "2024-03-01-06": {}},
        unfolded={
            "2024-03-01-04": read_from(4, "part-1.parquet"),
            "2024-03-01-05": {},  # stored from no file (each was set aside), then killed
            "2024-03-01-07": read_from(7, "part-1.parquet"),  # its folder outlived its files
            "2024-03-01-00": read_from(0, "part-0.parquet"),  # its file is still there: not emptied
        },
    )
    left = landing / "accounts" / "year=2024" / "month=03" / "day=01" / "hour=07"
    left.mkdir(parents=True)
    (left / "_SUCCESS").write_bytes(b"")
    found, cursor, _ = scan_table(storage, fmt, uri, "accounts", TableCursor(), 4, processed=processed)

    assert [(f.partition, f.new_names, f.removed) for f in found] == [
        ("2024-03-01-00", ("part-0.parquet",), ()),
        ("2024-03-01-03", (), ("part-0.parquet",)),
        ("2024-03-01-04", (), ("part-1.parquet",)),
        ("2024-03-01-05", (), ()),
        ("2024-03-01-07", (), ("part-1.parquet",)),
    ]
    assert list(cursor.seen) == ["2024-03-01-00"]
    # the hours planning runs, from the same notes (hour 06, processed from no file, is not one)
    keys = fmt.partition_keys(storage, uri, "accounts")
    landed = fmt.partitions_files(storage, uri, "accounts", keys)
    planned = changed_partitions(storage, landed, processed.notes, stored=processed.unfolded)
    assert [c.partition for c in planned] == [f.partition for f in found]
    # asked to run again as well, a partition is planned once
    asked = changed_partitions(
        storage, landed, processed.notes, {"2024-03-01-07": "a request"}, processed.unfolded
    )
    assert sorted(c.partition for c in asked) == sorted(c.partition for c in planned)


def test_a_cursor_field_this_version_does_not_know_is_left_out():
    """A cursor saved by a newer version (then rolled back) may carry fields this one lacks:
    every tick would fail on them."""
    saved = json.dumps(
        {"accounts": {"high_water": "2024-03-01-05", "seen": {}, "kept_by_a_newer_version": 1}}
    )
    assert decode_cursor(saved)["accounts"].high_water == "2024-03-01-05"


def test_a_cursor_field_saved_under_its_earlier_name_is_read():
    """The daily look's time was saved as `old_hours_looked_at`: read under that name, an
    upgrade does not make every table due for the look at once."""
    saved = json.dumps({"accounts": {"high_water": "2024-03-01-05", "old_hours_looked_at": 5.0}})
    assert decode_cursor(saved)["accounts"].old_partitions_looked_at == 5.0
