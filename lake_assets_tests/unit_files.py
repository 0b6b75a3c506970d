"""Small hand-made Unit CDC files for focused tests."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

UTC = dt.UTC


def at(hour: int, minute: int = 0, second: int = 0, day: int = 1) -> dt.datetime:
    return dt.datetime(2024, 3, day, hour, minute, second, tzinfo=UTC)


def event(id_, op, seq, when, **payload):
    return {
        "id": id_,
        **payload,
        "cdc_operation_type": op,
        "cdc_change_seq": seq,
        "cdc_commit_timestamp": when,
    }


def hour_dir(landing: Path, table: str, hour: int, day: int = 1) -> Path:
    folder = landing / table / f"year=2024/month=03/day={day:02d}/hour={hour:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_events(
    landing: Path,
    table: str,
    hour: int,
    name: str,
    rows: list[dict],
    schema: pa.Schema | None = None,
    day: int = 1,
) -> Path:
    path = hour_dir(landing, table, hour, day) / name
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


ACCOUNT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("name", pa.string()),
        ("balance", pa.int64()),
        ("cdc_operation_type", pa.string()),
        ("cdc_change_seq", pa.int64()),
        ("cdc_commit_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


def landing_with_strays(landing: Path) -> tuple[Path, dict[str, tuple[str, ...]]]:
    """A valid hour beside every kind of file that no hour reads: folders that are not valid
    times, files at the wrong depth, a folder named like a data file, symbolic link loops and
    a link that leads nowhere. Returns (the good file, {stray file name: words its reason holds})."""
    good = write_events(
        landing,
        "accounts",
        1,
        "part-good.parquet",
        [event("a", "I", 1, at(1), name="ok", balance=1)],
        ACCOUNT_SCHEMA,
    )
    table = landing / "accounts"
    hour = good.parent
    bad_folders = {
        "in-hour-25.parquet": ("year=2024/month=03/day=01/hour=25", "hour=25"),
        "in-hour-minus-1.parquet": ("year=2024/month=03/day=01/hour=-1", "hour=-1"),
        "in-day-32.parquet": ("year=2024/month=03/day=32/hour=01", "day=32"),
        "in-month-13.parquet": ("year=2024/month=13/day=01/hour=01", "month=13"),
        "in-feb-30.parquet": ("year=2024/month=02/day=30/hour=01", "day=30"),
        "in-year-abc.parquet": ("year=abc/month=03/day=01/hour=01", "year=abc"),
        "in-year-0001.parquet": ("year=0001/month=03/day=01/hour=01", "year=0001"),  # no four-digit hour key
        "in-year-24.parquet": ("year=24/month=03/day=01/hour=01", "year=24"),  # 2024, or the year 24?
        "in-a-stray-folder.parquet": ("misc", "misc"),
    }
    expected: dict[str, tuple[str, ...]] = {}
    for name, (folder, words) in bad_folders.items():
        (table / folder).mkdir(parents=True)
        pq.write_table(
            pa.Table.from_pylist([event(name, "I", 2, at(1))], schema=ACCOUNT_SCHEMA), table / folder / name
        )
        expected[name] = (words, "not a valid")
    for name, place in (
        ("under-the-table.parquet", table),
        ("under-a-year.parquet", table / "year=2024"),
        ("under-a-day.parquet", table / "year=2024/month=03/day=01"),
    ):
        (place / name).write_bytes(good.read_bytes())
        expected[name] = ("not inside an hour folder",)
    nested = hour / "nested.parquet"  # a folder named like a data file, as a Spark writer leaves one
    nested.mkdir()
    (nested / "part-in-a-folder.parquet").write_bytes(good.read_bytes())
    expected["part-in-a-folder.parquet"] = (
        "nested.parquet",
        "only files directly in an hour folder are read",
    )
    (hour / "up").symlink_to("..")  # a folder loop: up/hour=01/up/hour=01/…
    expected["up"] = ("symbolic link", "loop")
    share = landing.parent / f"{landing.name}-share"  # a large tree elsewhere: one stray, not each file
    (share / "a").mkdir(parents=True)
    (share / "a" / "part-in-the-share.parquet").write_bytes(good.read_bytes())
    (hour / "share").symlink_to(share, target_is_directory=True)
    expected["share"] = ("symbolic link", str(share.resolve()), "not followed")
    (nested / "linked").symlink_to(share, target_is_directory=True)  # in a folder within an hour
    expected["linked"] = ("symbolic link", str(share.resolve()), "not followed")
    (table / "year=2024" / "shared").symlink_to(share, target_is_directory=True)  # where no hour is
    expected["shared"] = ("symbolic link", str(share.resolve()), "not followed")
    (hour / "self.parquet").symlink_to("self.parquet")  # a link to itself
    expected["self.parquet"] = ("symbolic link",)
    (hour / "gone.parquet").symlink_to(table / "removed.parquet")  # a link to nothing
    expected["gone.parquet"] = ("symbolic link",)
    # Hidden and marker files are not data by the Hadoop convention, wherever they are.
    (hour / "_SUCCESS").write_bytes(b"")
    (hour / ".part-good.parquet.swp").write_bytes(good.read_bytes())
    (table / "_temporary/0").mkdir(parents=True)
    (table / "_temporary/0/part-being-written.parquet").write_bytes(good.read_bytes())
    return good, expected
