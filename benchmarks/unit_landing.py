"""Synthetic Unit CDC exports, at benchmark scale.

Writes the layout the Unit feed reads, `<landing>/<table>/year=YYYY/month=MM/day=DD/hour=HH/`,
with the untidiness the feed must survive: duplicated rows, deletes, several writes of one key at
one commit time, rows out of order inside a file and rows that arrive an hour late. Every hour is
generated from its own random stream (seeded by `(seed, hour)`), so writing hours 0..9 in one
call or hour by hour gives the same files, and a benchmark can append "one more hour" later.

Generation is vectorised with numpy and strings are built with Arrow `take` over small
vocabularies, so tens of millions of rows take seconds to minutes, not hours.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

UTC = dt.UTC

# Sequence numbers are hour * SEQ_STRIDE + rank inside the hour, so any later hour (appended by
# a later call) always carries larger sequence numbers than everything written before it.
SEQ_STRIDE = 10_000_000
HOUR_US = 3_600_000_000

OPERATIONS = ("INSERT", "UPDATE", "DELETE")
STATUSES = ("active", "pending", "frozen", "closed", "archived")
# Share of non-delete events that are INSERTs; the rest are UPDATEs (a key's first event may be
# either, as in real exports that start mid-life).
INSERT_SHARE = 0.1
NOTE_NULL_RATE = 0.3

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("name", pa.string()),
        ("status", pa.string()),
        ("amount", pa.int64()),
        ("note", pa.string()),
        ("cdc_operation_type", pa.string()),
        ("cdc_change_seq", pa.int64()),
        ("cdc_commit_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
PAYLOAD = ["name", "status", "amount", "note"]


@dataclasses.dataclass(frozen=True)
class LandingShape:
    """How much landing data to write, and how untidy it is.

    `disorder_rate` rows are split evenly between rows moved to a random position inside their
    file and rows written to the next hour's folder (late arrival; their commit time stays in
    their own hour). `tie_rate` rows copy the key and commit time of another row of the same
    hour: half exactly (same microsecond), half only to the millisecond, since versions are
    compared at millisecond precision.
    """

    keys: int
    events_per_hour: int
    hours: int
    start: dt.datetime = dt.datetime(2024, 1, 1, tzinfo=UTC)
    files_per_hour: int = 2
    duplicate_rate: float = 0.02
    delete_rate: float = 0.05
    disorder_rate: float = 0.1
    seed: int = 7
    tie_rate: float = 0.01


@dataclasses.dataclass
class LandingStats:
    """What `write_unit_landing` wrote. `rows` counts duplicates; `paths` are in write order."""

    rows: int = 0
    files: int = 0
    hours: int = 0
    duplicate_rows: int = 0
    late_rows: int = 0
    paths: list[Path] = dataclasses.field(default_factory=list)


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def hour_folder(landing_dir: Path, table: str, start: dt.datetime, hour: int) -> Path:
    """The export folder of hour offset `hour` from `start` (created if missing)."""
    moment = _utc(start) + dt.timedelta(hours=hour)
    folder = (
        Path(landing_dir)
        / table
        / f"year={moment.year:04d}"
        / f"month={moment.month:02d}"
        / f"day={moment.day:02d}"
        / f"hour={moment.hour:02d}"
    )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _key_names(keys: int) -> pa.Array:
    width = max(8, len(str(max(keys - 1, 0))))
    return pa.array([f"k{i:0{width}d}" for i in range(keys)], type=pa.string())


class _Vocabulary:
    """Small string sets that payload columns are drawn from, built once per call."""

    def __init__(self, keys: int):
        self.ids = _key_names(keys)
        self.names = pa.array([f"name-{i:04d}" for i in range(1000)], type=pa.string())
        self.statuses = pa.array(STATUSES, type=pa.string())
        self.notes = pa.array([f"note {i}: {'x' * (i % 7)}" for i in range(64)], type=pa.string())
        self.operations = pa.array(OPERATIONS, type=pa.string())


def _hour_events(shape: LandingShape, hour: int, vocab: _Vocabulary, rng: np.random.Generator) -> pa.Table:
    """One hour's distinct events, in commit order, sequence numbers assigned."""
    n = shape.events_per_hour
    epoch_us = (_utc(shape.start) - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)
    hour_start_us = epoch_us + hour * HOUR_US
    key = rng.integers(0, shape.keys, n)
    at = hour_start_us + rng.integers(0, HOUR_US, n)

    ties = np.flatnonzero(rng.random(n) < shape.tie_rate)
    if ties.size:
        source = rng.integers(0, n, ties.size)
        key[ties] = key[source]
        at[ties] = at[source]
        # Half of the ties share only the millisecond: they collide once truncated, which is
        # where "greatest sequence wins" must also apply.
        loose = ties[rng.random(ties.size) < 0.5]
        at[loose] = at[loose] - at[loose] % 1000 + rng.integers(0, 1000, loose.size)

    # Sequence follows commit order (stable, so exact ties still get two different numbers).
    order = np.argsort(at, kind="stable")
    key, at = key[order], at[order]
    seq = hour * SEQ_STRIDE + np.arange(n, dtype=np.int64)

    roll = rng.random(n)
    insert_below = shape.delete_rate + (1 - shape.delete_rate) * INSERT_SHARE
    op = np.where(roll < shape.delete_rate, 2, np.where(roll < insert_below, 0, 1))
    deleted = op == 2

    # A DELETE carries only the key: null indices make `take` produce nulls.
    def pick(values: pa.Array, index: np.ndarray, null: np.ndarray) -> pa.Array:
        return values.take(pa.array(index, mask=null))

    note_null = deleted | (rng.random(n) < NOTE_NULL_RATE)
    amount = rng.integers(-100_000, 1_000_000, n)
    return pa.Table.from_arrays(
        [
            vocab.ids.take(pa.array(key)),
            pick(vocab.names, rng.integers(0, len(vocab.names), n), deleted),
            pick(vocab.statuses, rng.integers(0, len(vocab.statuses), n), deleted),
            pa.array(amount, type=pa.int64(), mask=deleted),
            pick(vocab.notes, rng.integers(0, len(vocab.notes), n), note_null),
            vocab.operations.take(pa.array(op)),
            pa.array(seq, type=pa.int64()),
            pa.array(at, type=pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        ],
        schema=SCHEMA,
    )


def _layout(shape: LandingShape, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Where each written row goes: (source row, file number, late count, duplicate count).

    Files 0..files_per_hour-1 are the hour's own; file number `files_per_hour` is the late file
    in the next hour's folder. Rows come back grouped by file, in file order.
    """
    files = shape.files_per_hour
    disorder = rng.random(n) < shape.disorder_rate
    late = disorder & (rng.random(n) < 0.5)
    shuffled = disorder & ~late

    # Own files hold contiguous runs of the sequence, as an export job would write them.
    on_time = np.flatnonzero(~late)
    n_on = on_time.size
    file_of = np.full(n, files, dtype=np.int64)
    position = np.empty(n, dtype=np.float64)
    rank = np.arange(n_on)
    file_of[on_time] = rank * files // max(n_on, 1)
    position[on_time] = rank
    late_rows = np.flatnonzero(late)
    position[late_rows] = np.arange(late_rows.size)

    # Shuffled rows trade places among themselves, within their own file only: the slots are
    # grouped by file in order, so sorting the rows by (file, random) hands each one a slot of
    # its own file.
    moved = np.flatnonzero(shuffled)
    if moved.size:
        slots = position[moved]
        permutation = np.lexsort((rng.random(moved.size), file_of[moved]))
        position[moved[permutation]] = slots

    duplicated = np.flatnonzero(rng.random(n) < shape.duplicate_rate)
    dup_file = file_of[duplicated].copy()
    own = dup_file < files
    dup_file[own] = rng.integers(0, files, int(own.sum()))
    # A copy lands anywhere inside the span of the file it went to.
    low = np.where(own, -(-dup_file * n_on // files), 0)
    high = np.where(own, -(-(dup_file + 1) * n_on // files), late_rows.size)
    dup_position = low + rng.random(duplicated.size) * np.maximum(high - low, 1)

    source = np.concatenate([np.arange(n), duplicated])
    file_all = np.concatenate([file_of, dup_file])
    position_all = np.concatenate([position, dup_position])
    order = np.lexsort((position_all, file_all))
    return source[order], file_all[order], int(late_rows.size), int(duplicated.size)


def write_unit_landing(
    landing_dir: Path, table: str, shape: LandingShape, first_hour: int = 0
) -> LandingStats:
    """Write hours `first_hour .. first_hour + shape.hours - 1` of Unit CDC exports for `table`.

    Hours are offsets from `shape.start` (which must be on the hour). Each hour gets
    `files_per_hour` files of its own; its late rows go to one extra file in the next hour's
    folder, so the last hour written also puts a file in the folder after it. Output depends only
    on the shape and the hour numbers: appending hour N later with `first_hour=N, hours=1` gives
    what a single larger call would have written, with larger sequence numbers.
    """
    start = _utc(shape.start)
    if (start.minute, start.second, start.microsecond) != (0, 0, 0):
        raise ValueError(f"start {start} must be on the hour")
    if not 0 < shape.events_per_hour < SEQ_STRIDE:
        raise ValueError(f"events_per_hour must be between 1 and {SEQ_STRIDE - 1}")
    if shape.keys < 1 or shape.files_per_hour < 1 or first_hour < 0:
        raise ValueError("keys and files_per_hour must be positive, first_hour not negative")

    vocab = _Vocabulary(shape.keys)
    stats = LandingStats(hours=shape.hours)
    for hour in range(first_hour, first_hour + shape.hours):
        rng = np.random.default_rng((shape.seed, hour))
        events = _hour_events(shape, hour, vocab, rng)
        source, file_of, late, duplicates = _layout(shape, events.num_rows, rng)
        rows = events.take(pa.array(source))
        bounds = np.searchsorted(file_of, np.arange(shape.files_per_hour + 2))
        for number in range(shape.files_per_hour + 1):
            lo, hi = int(bounds[number]), int(bounds[number + 1])
            if lo == hi:
                continue
            is_late = number == shape.files_per_hour
            folder = hour_folder(landing_dir, table, start, hour + 1 if is_late else hour)
            # The source hour in the name keeps a late file from clashing with the next hour's own.
            path = folder / f"part-{number:05d}-h{hour:07d}{'-late' if is_late else ''}.snappy.parquet"
            pq.write_table(rows.slice(lo, hi - lo), path, compression="snappy")
            stats.paths.append(path)
        stats.rows += rows.num_rows
        stats.late_rows += late
        stats.duplicate_rows += duplicates
    stats.files = len(stats.paths)
    return stats


def write_listing_only_landing(
    landing_dir: Path,
    table: str,
    hours: int,
    files_per_hour: int,
    start: dt.datetime = dt.datetime(2024, 1, 1, tzinfo=UTC),
) -> int:
    """Create empty `part-NNNNN.parquet` files in `hours` hour folders; return how many.

    Only for benchmarks of listing and partition discovery: the files are zero bytes, so they
    cost inodes and names, not data.
    """
    count = 0
    for hour in range(hours):
        folder = hour_folder(landing_dir, table, start, hour)
        for number in range(files_per_hour):
            open(folder / f"part-{number:05d}.parquet", "wb").close()
        count += files_per_hour
    return count
