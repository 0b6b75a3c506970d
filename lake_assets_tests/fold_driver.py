"""A process that folds batches of events into a lake and can kill itself mid-way (SIGKILL),
for the crash-safety tests.

    python -m lake_assets_tests.fold_driver LAKE BATCHES.json
        [--progress FILE] [--kill-at-step N | --kill-after S]

Without `--progress` a run folds every batch from the first: folds are idempotent, so such a
run both recovers an interrupted fold and converges to the tables of an uninterrupted run. With
it, a run goes on from the first batch the file does not record as folded (from the first again
once all are), as an orchestrator retries the partition that failed; the file is written after
each fold, so a kill between a fold and its record folds that batch once more. Each fold's
seconds are printed (`folded … in S s`) so that a caller can aim its kills inside the folds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import threading
import time
from pathlib import Path

from lake_assets import spark as spark_settings
from lake_assets_tests.engine_harness import EngineLake


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _folded(progress: str) -> int:
    """How many batches, from the first, the progress file records as folded."""
    return int(Path(progress).read_text()) if Path(progress).exists() else 0


def _record_folded(progress: str, batches: int) -> None:
    staged = Path(f"{progress}.tmp")
    staged.write_text(str(batches))
    staged.replace(progress)  # whole or not at all: a kill never leaves half a number


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("lake")
    parser.add_argument("batches")
    parser.add_argument("--progress")
    parser.add_argument("--kill-at-step", type=int)
    parser.add_argument("--kill-after", type=float)
    args = parser.parse_args()

    with open(args.batches) as handle:
        batches = json.load(handle)
    for batch in batches:
        for event in batch:
            event["version_at"] = dt.datetime.fromisoformat(event["version_at"])

    session = spark_settings.build_session(
        spark_settings.session_conf(extra={"spark.sql.shuffle.partitions": "2"})
    )
    session.sparkContext.setLogLevel("ERROR")
    if args.kill_after is not None:
        threading.Timer(args.kill_after, _die).start()
    steps = [0]
    counting = threading.Lock()  # a commit's moves, and so their steps, run on several threads

    def on_step(name: str) -> None:
        with counting:
            steps[0] += 1
            step = steps[0]
            print(f"step {step}: {name}", flush=True)
        if args.kill_at_step is not None and step == args.kill_at_step:
            _die()

    lake = EngineLake(session, args.lake)
    start = _folded(args.progress) % len(batches) if args.progress else 0
    for index in range(start, len(batches)):
        began = time.monotonic()
        report = lake.fold(batches[index], on_commit_step=on_step)
        seconds = time.monotonic() - began
        print(
            f"folded {report.events_in} events, recovered {report.recovered_folds} in {seconds:.2f} s",
            flush=True,
        )
        if args.progress:
            _record_folded(args.progress, index + 1)
    print("DONE", flush=True)
    os._exit(0)  # the kill timer thread must not outlive a finished run


if __name__ == "__main__":
    main()
