"""SIGKILL the folding process at random points, at least ten times; the lake stays readable
after every kill, and the next run converges to exactly the reference tables.

After a kill the next process goes on from the batch that was interrupted, as an orchestrator
retries a failed partition, and its kill is aimed inside what it has left to fold (an exact
commit step, or a moment within the folds' measured seconds, as an uninterrupted run took
them), so nearly every process started is a kill. Then one run goes on to the end and the lake
equals the reference; a last run folds every batch again from the first, and it still does."""

import datetime as dt
import json
import random
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from lake_assets_tests.engine_harness import PAYLOAD
from lake_assets_tests.reference import reference_tables

pytestmark = pytest.mark.minutes(8)

ROOT = Path(__file__).resolve().parent.parent
KILLS = 10


def _events(rng: random.Random) -> list[list[dict]]:
    """Four batches over three days for 30 keys, the last two reaching back (late data)."""
    base = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    seq = 0
    batches = []
    for _batch_index, (first_hour, last_hour) in enumerate(((0, 20), (20, 50), (5, 60), (30, 70))):
        batch = []
        for _ in range(80):
            seq += 1
            op = rng.choice(["insert", "update", "update", "delete"])
            batch.append(
                {
                    "id": f"k{rng.randrange(30)}",
                    "op": op,
                    "version_at": (
                        base + dt.timedelta(minutes=rng.randrange(first_hour * 60, last_hour * 60))
                    ).isoformat(),
                    "seq": seq,
                    "c1": None if op == "delete" else rng.choice(["x", "y", None]),
                    "c2": None if op == "delete" else rng.randrange(5),
                }
            )
        batches.append(batch)
    return batches


def _driver(lake: Path, batches_file: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lake_assets_tests.fold_driver", str(lake), str(batches_file), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _steps_and_seconds_of_each_fold(output: str) -> tuple[list[int], list[float]]:
    """From a driver's output: how many commit steps each fold took, and how many seconds."""
    steps, seconds, counted = [], [], 0
    for line in output.splitlines():
        if line.startswith("step "):
            counted += 1
        elif line.startswith("folded "):
            steps.append(counted)
            seconds.append(float(line.rsplit(" in ", 1)[1].removesuffix(" s")))
            counted = 0
    return steps, seconds


def _read(lake: Path, layer: str, order: str) -> list[tuple]:
    folder = lake / layer / "test" / "things"
    if not folder.exists():
        return []
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    if layer == "current":
        sql = f"SELECT id, c1, c2, _version_at FROM read_parquet('{folder}/**/*.parquet', union_by_name = true) ORDER BY {order}"
    else:
        sql = (
            f"SELECT id, c1, c2, _fivetran_start, _fivetran_end, _fivetran_active "
            f"FROM read_parquet('{folder}/**/*.parquet', union_by_name = true) ORDER BY {order}"
        )
    return con.execute(sql).fetchall()


def test_killed_folds_converge_to_the_reference(tmp_path):
    rng = random.Random(20261122)
    batches = _events(rng)
    batches_file = tmp_path / "batches.json"
    batches_file.write_text(json.dumps(batches))
    lake = tmp_path / "lake"

    clean = _driver(lake, batches_file)  # counts the commit steps and seconds of each fold
    assert clean.returncode == 0, clean.stderr[-2000:]
    steps_of, seconds_of = _steps_and_seconds_of_each_fold(clean.stdout)
    assert len(steps_of) == len(batches) and all(steps_of)
    expected_history = _read(lake, "history", "id, _fivetran_start")
    expected_current = _read(lake, "current", "id")

    events = [dict(e, version_at=dt.datetime.fromisoformat(e["version_at"])) for b in batches for e in b]
    want_current, want_history = reference_tables(events, payload=list(PAYLOAD))
    assert expected_current == [
        (k, v["c1"], v["c2"], v["_version_at"]) for k, v in sorted(want_current.items())
    ]
    assert expected_history == [
        (r["id"], r["c1"], r["c2"], r["_fivetran_start"], r["_fivetran_end"], r["_fivetran_active"])
        for r in want_history
    ]

    lake, progress = tmp_path / "crashed", tmp_path / "folded"
    kills = 0
    attempts = 0
    while kills < KILLS and attempts < 3 * KILLS:
        attempts += 1
        left = slice(int(progress.read_text()) % len(batches) if progress.exists() else 0, None)
        if attempts % 2:  # an exact commit step: record, each file move or delete
            kill = ["--kill-at-step", str(rng.randint(1, sum(steps_of[left])))]
        else:  # anywhere, Spark's staging writes included
            kill = ["--kill-after", f"{rng.uniform(0.5, sum(seconds_of[left])):.2f}"]
        run = _driver(lake, batches_file, "--progress", str(progress), *kill)
        if run.returncode == -9:
            kills += 1
            # Whatever was interrupted, every file a reader globs is whole.
            _read(lake, "history", "id, _fivetran_start")
            _read(lake, "current", "id")
        else:
            assert run.returncode == 0 and "DONE" in run.stdout, run.stderr[-2000:]
    assert kills >= KILLS and kills > attempts // 2, f"{kills} of {attempts} processes were killed"

    resumed = _driver(lake, batches_file, "--progress", str(progress))  # on to the end
    assert resumed.returncode == 0 and "DONE" in resumed.stdout, resumed.stderr[-2000:]
    assert _read(lake, "history", "id, _fivetran_start") == expected_history
    assert _read(lake, "current", "id") == expected_current

    final = _driver(lake, batches_file)  # every batch again, from the first: folds are idempotent
    assert final.returncode == 0, final.stderr[-2000:]
    assert _read(lake, "history", "id, _fivetran_start") == expected_history
    assert _read(lake, "current", "id") == expected_current
    assert not list((lake / "_state" / "test" / "things" / "commits").glob("*.json"))
    assert not (lake / "_staging" / "test" / "things").exists() or not any(
        (lake / "_staging" / "test" / "things").iterdir()
    )
