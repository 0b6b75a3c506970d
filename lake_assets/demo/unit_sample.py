"""Realistic Unit CDC exports, messy the way the real ones are (docs/formats/unit-cdc.md).

Deterministic for a seed. Written as `<table>/year=/month=/day=/hour=/part-*.snappy.parquet`,
1–3 files an hour, some hours without a folder, and:
- exact duplicate rows (re-delivered in another file of the hour or in the next hour);
- rows out of order within files, and events that land one or two hours after their hour;
- several UPDATEs of one id in one transaction: same commit time, increasing sequence;
- updates that change nothing visible (new sequence and time, same values);
- DELETE rows that carry only `id` and the special columns;
- ids whose first event is an UPDATE, ids deleted and inserted again;
- `INSERT/UPDATE/DELETE` in some tables and `I/U/D` in another;
- a late file: written for an early hour after later hours were delivered;
- schema drift: `accounts` loses `updated_by` and gains `risk_level` part-way through.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

UTC = dt.UTC
SPECIAL = ("cdc_operation_type", "cdc_change_seq", "cdc_commit_timestamp")

_ARROW_TYPES = {str: pa.string(), int: pa.int64()}


@dataclasses.dataclass(frozen=True)
class TableShape:
    prefix: str
    columns: dict  # column -> python type
    spelling: dict  # insert/update/delete -> the word written
    ids: int
    make: Callable[[random.Random, str, dict | None], dict]  # (rng, id, previous values) -> values


def _accounts(rng: random.Random, _id: str, prev: dict | None) -> dict:
    prev = prev or {"name": f"Account {rng.randint(100, 999)}", "status": "open", "balance": 0}
    return {
        "name": prev["name"] if rng.random() < 0.8 else f"Account {rng.randint(100, 999)}",
        "status": rng.choice(["open", "open", "frozen", "closed"]),
        "balance": int(prev["balance"] or 0) + rng.randint(-5000, 20000),
        "updated_by": rng.choice(["api", "dashboard", "batch"]),
        "risk_level": rng.choice(["low", "medium", "high"]),
    }


def _customers(rng: random.Random, _id: str, prev: dict | None) -> dict:
    first = rng.choice(["Ada", "Brook", "Cyd", "Dana", "Eli", "Fern", "Gus"])
    prev = prev or {"full_name": f"{first} {rng.choice(['Smith', 'Okafor', 'Ng', 'Diaz'])}"}
    return {
        "full_name": prev["full_name"],
        "email": f"{prev['full_name'].split()[0].lower()}{rng.randint(1, 99)}@example.com",
        "tier": rng.choice(["basic", "plus", "premium"]),
    }


def _transactions(rng: random.Random, _id: str, prev: dict | None) -> dict:
    prev = prev or {
        "account_id": f"acc_{rng.randint(0, 59):05d}",
        "amount": rng.randint(-50000, 50000),
        "currency": "USD",
        "description": rng.choice(["card purchase", "ach credit", "fee", "wire"]),
    }
    return {**prev, "description": prev["description"] if rng.random() < 0.7 else "adjusted"}


LONG = {"insert": "INSERT", "update": "UPDATE", "delete": "DELETE"}
SHORT = {"insert": "I", "update": "U", "delete": "D"}

SHAPES = {
    "accounts": TableShape(
        "acc",
        {"name": str, "status": str, "balance": int, "updated_by": str, "risk_level": str},
        LONG,
        60,
        _accounts,
    ),
    "customers": TableShape("cus", {"full_name": str, "email": str, "tier": str}, SHORT, 50, _customers),
    "transactions": TableShape(
        "txn",
        {"account_id": str, "amount": int, "currency": str, "description": str},
        LONG,
        120,
        _transactions,
    ),
}


@dataclasses.dataclass
class UnitSample:
    landing_dir: Path
    tables: tuple[str, ...]
    hours: dict[str, list[str]]
    files: list[Path]
    late_files: list[Path]
    events: dict[str, list[dict]]


def _columns_at(table: str, hour_index: int, hours: int) -> list[str]:
    """accounts drops `updated_by` after 40% of the hours and adds `risk_level` after 55%."""
    columns = list(SHAPES[table].columns)
    if table == "accounts":
        if hour_index >= int(hours * 0.4):
            columns.remove("updated_by")
        if hour_index < int(hours * 0.55):
            columns.remove("risk_level")
    elif "risk_level" in columns:
        columns.remove("risk_level")
    return columns


def _simulate(
    table: str, rng: random.Random, start: dt.datetime, hours: int, seq: list[int]
) -> list[tuple[int, dict]]:
    """(commit hour index, row) for every change event of a table, in commit order."""
    shape = SHAPES[table]
    live: dict[str, dict] = {}
    deleted: list[str] = []
    unseen = [f"{shape.prefix}_{i:05d}" for i in range(shape.ids)]
    rng.shuffle(unseen)
    quiet_hours = {h for h in range(hours) if rng.random() < 0.08 and h not in (0, 2)}
    out: list[tuple[int, dict]] = []

    def emit(hour: int, when: dt.datetime, op: str, id_: str, values: dict | None) -> None:
        seq[0] += rng.randint(1, 3)  # unique and increasing, with gaps like a real log
        row: dict[str, object] = {"id": id_}
        if values is not None:
            row.update({c: values.get(c) for c in _columns_at(table, hour, hours)})
        row.update(
            {"cdc_operation_type": shape.spelling[op], "cdc_change_seq": seq[0], "cdc_commit_timestamp": when}
        )
        out.append((hour, row))

    for hour in range(hours):
        if hour in quiet_hours:
            continue
        base = start + dt.timedelta(hours=hour)
        moments = sorted(
            base + dt.timedelta(microseconds=rng.randrange(3_600_000_000)) for _ in range(rng.randint(4, 14))
        )
        for when in moments:
            roll = rng.random()
            if unseen and (roll < 0.3 or not live):
                id_ = unseen.pop()
                live[id_] = shape.make(rng, id_, None)
                # Some rows reach the export only after a first update: no INSERT is ever seen.
                emit(hour, when, "update" if rng.random() < 0.15 else "insert", id_, live[id_])
            elif deleted and roll < 0.36:
                id_ = deleted.pop(rng.randrange(len(deleted)))
                live[id_] = shape.make(rng, id_, None)
                emit(hour, when, "insert", id_, live[id_])
            elif roll < 0.44 and len(live) > 3:
                id_ = rng.choice(sorted(live))
                del live[id_]
                deleted.append(id_)
                emit(hour, when, "delete", id_, None)
            else:
                id_ = rng.choice(sorted(live))
                if rng.random() < 0.1:
                    emit(hour, when, "update", id_, live[id_])  # nothing visible changed
                    continue
                writes = 3 if rng.random() < 0.12 else 1  # one transaction, several updates
                for _ in range(writes):
                    live[id_] = shape.make(rng, id_, live[id_])
                    emit(hour, when, "update", id_, live[id_])
    return out


def _hour_folder(root: Path, table: str, moment: dt.datetime) -> Path:
    return (
        root
        / table
        / f"year={moment.year:04d}"
        / f"month={moment.month:02d}"
        / f"day={moment.day:02d}"
        / f"hour={moment.hour:02d}"
    )


def _write_file(folder: Path, rows: list[dict], table: str, rng: random.Random, index: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    present = [c for c in SHAPES[table].columns if any(c in r for r in rows)]
    schema = pa.schema(
        [("id", pa.string())]
        + [(c, _ARROW_TYPES[SHAPES[table].columns[c]]) for c in present]
        + [
            ("cdc_operation_type", pa.string()),
            ("cdc_change_seq", pa.int64()),
            ("cdc_commit_timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )
    name = f"part-{index:05d}-{uuid.UUID(int=rng.getrandbits(128))}-c000.snappy.parquet"
    path = folder / name
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression="snappy")
    return path


def write_unit_landing(
    landing_dir: Path,
    *,
    seed: int = 7,
    start: dt.datetime = dt.datetime(2024, 3, 1, 0),
    hours: int = 72,
    tables: tuple[str, ...] = ("accounts", "customers", "transactions"),
) -> UnitSample:
    landing_dir = Path(landing_dir)
    rng = random.Random(seed)
    start = start.replace(tzinfo=UTC) if start.tzinfo is None else start
    seq = [1_000_000]
    files: list[Path] = []
    late_files: list[Path] = []
    events: dict[str, list[dict]] = {}
    hours_of: dict[str, list[str]] = {}
    for table in tables:
        delivered: dict[int, list[dict]] = defaultdict(list)
        written: list[dict] = []
        late_rows: list[dict] = []
        for hour, row in _simulate(table, rng, start, hours, seq):
            # Most events arrive in their own hour; some one or two hours later.
            target = hour + (rng.choice([1, 2]) if rng.random() < 0.05 and hour + 2 < hours else 0)
            if target == 2 and hour == 2 and rng.random() < 0.5:
                late_rows.append(row)  # held back for the late file of hour 2
            else:
                delivered[target].append(row)
            written.append(row)
            if rng.random() < 0.04:  # the same row delivered twice
                again = target + (1 if rng.random() < 0.5 and target + 1 < hours else 0)
                delivered[again].append(dict(row))
                written.append(dict(row))
        for hour in sorted(delivered):
            rows = delivered[hour]
            rng.shuffle(rows)
            parts = min(len(rows), rng.randint(1, 3))
            folder = _hour_folder(landing_dir, table, start + dt.timedelta(hours=hour))
            for index in range(parts):
                chunk = rows[index::parts]
                files.append(_write_file(folder, chunk, table, rng, index))
        if late_rows:
            rng.shuffle(late_rows)
            folder = _hour_folder(landing_dir, table, start + dt.timedelta(hours=2))
            late = _write_file(folder, late_rows, table, rng, 90)
            files.append(late)
            late_files.append(late)
        events[table] = written
        hours_of[table] = sorted(
            (start + dt.timedelta(hours=h)).strftime("%Y-%m-%d-%H") for h in delivered if delivered[h]
        )
        if late_rows and (start + dt.timedelta(hours=2)).strftime("%Y-%m-%d-%H") not in hours_of[table]:
            hours_of[table] = sorted(
                hours_of[table] + [(start + dt.timedelta(hours=2)).strftime("%Y-%m-%d-%H")]
            )
    return UnitSample(
        landing_dir=landing_dir,
        tables=tuple(tables),
        hours=hours_of,
        files=files,
        late_files=late_files,
        events=events,
    )
