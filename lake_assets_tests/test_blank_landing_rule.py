"""The blank-landing rule on its own (`processed.refusal_for_a_blank_landing`), without Spark:
which landings refuse a run because it would empty partitions whose files all went at once.
The runs that ask it are tested end to end in `test_incremental_runs.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from lake_assets import processed
from lake_assets.feeds import get_format
from lake_assets.paths import LakeLayout
from lake_assets.storage import Storage
from lake_assets_tests.unit_files import hour_dir

TABLE = "accounts"
FEED = "unit"
HOURS = {hour: f"2024-03-01-{hour:02d}" for hour in (10, 11, 12)}
FORMAT = get_format("unit_cdc")


class Lake:
    """A landing of Unit hour folders and a lake whose change log may hold a file per hour."""

    def __init__(self, root: Path):
        self.landing, self.layout = root / "landing", LakeLayout(f"file://{root / 'lake'}")
        self.landing.mkdir()

    def land(self, hour: int, name: str) -> str:
        path = hour_dir(self.landing, TABLE, hour) / name
        path.write_bytes(b"PAR1")  # listed by name: the rule never opens a landed file
        return f"file://{path}"

    def store_changes(self, *hours: int) -> None:
        """A file in the change log's folder of each hour (the rule only lists it)."""
        for hour in hours:
            folder = self.layout.change_log_partition(FEED, TABLE, FORMAT.partition_column, HOURS[hour])
            Path(folder.removeprefix("file://")).mkdir(parents=True)
            (Path(folder.removeprefix("file://")) / "part-0.parquet").write_bytes(b"PAR1")

    def refusal(self, read: dict[int, set[str]], allowed=False, elsewhere=None) -> str | None:
        storage = Storage()
        keys = [HOURS[hour] for hour in read]
        return processed.refusal_for_a_blank_landing(
            FORMAT,
            storage,
            self.layout,
            landing=f"file://{self.landing}",
            feed=FEED,
            table=TABLE,
            read={HOURS[hour]: urls for hour, urls in read.items()},
            listed=FORMAT.partitions_files(storage, f"file://{self.landing}", TABLE, keys),
            allowed=allowed,
            read_elsewhere=lambda key: (elsewhere or {}).get(key, ()),
        )


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(tmp_path)


def gone(*urls: str) -> None:
    for url in urls:
        Path(url.removeprefix("file://")).unlink()


def test_every_file_read_gone_at_once_refuses_and_names_the_landing_and_partitions(lake):
    first, second = lake.land(10, "a.parquet"), lake.land(11, "b.parquet")
    lake.store_changes(10, 11)
    gone(first, second)
    refusal = lake.refusal({10: {first}, 11: {second}})
    assert refusal is not None
    assert str(lake.landing) in refusal and "2 partition(s), 2024-03-01-10 .. 2024-03-01-11" in refusal
    assert lake.refusal({10: {first}, 11: {second}}, allowed=True) is None  # allow_empty_landing


def test_files_removed_while_a_file_read_before_is_still_listed_are_a_retention_not_a_blank_landing(lake):
    first, kept = lake.land(10, "a.parquet"), lake.land(11, "b.parquet")
    lake.store_changes(10, 11)
    gone(first)
    assert lake.refusal({10: {first}, 11: {kept}}) is None


def test_a_partition_whose_files_were_replaced_is_not_emptied(lake):
    old = lake.land(10, "a.parquet")
    lake.store_changes(10)
    gone(old)
    lake.land(10, "a-corrected.parquet")
    assert lake.refusal({10: {old}}) is None


def test_a_new_file_elsewhere_vouches_for_nothing_but_a_file_read_before_does(lake):
    """A sync job may write into an unmounted share's mount point: only a file the lake read
    shows the landing is the one it read."""
    read_before = lake.land(12, "c.parquet")
    first = lake.land(10, "a.parquet")
    lake.store_changes(10)
    gone(first)
    assert lake.refusal({10: {first}}) is not None  # hour 12's file: never read, as far as told
    assert lake.refusal({10: {first}}, elsewhere={HOURS[12]: {read_before}}) is None


def test_a_partition_whose_change_log_holds_no_file_is_emptied_without_refusal(lake):
    """Every file read from it was set aside, say: emptying it loses nothing."""
    set_aside, stored = lake.land(10, "bad.parquet"), lake.land(11, "b.parquet")
    lake.store_changes(11)
    gone(set_aside)
    assert lake.refusal({10: {set_aside}}) is None
    gone(stored)
    refusal = lake.refusal({10: {set_aside}, 11: {stored}})
    assert refusal is not None and "1 partition(s), 2024-03-01-11 .. 2024-03-01-11" in refusal


def test_partitions_never_read_are_not_emptied(lake):
    lake.land(11, "b.parquet")
    lake.store_changes(10)
    assert lake.refusal({10: set()}) is None
