"""A process that folds batches of events into a lake and can kill itself mid-way (SIGKILL),
for the crash-safety tests.

    python -m lake_assets_tests.fold_driver LAKE BATCHES.json [--kill-at-step N | --kill-after S]

Every run folds all batches from the first: folds are idempotent, so a run after a crash both
recovers the interrupted fold and converges to the tables of an uninterrupted run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import threading

from lake_assets import spark as spark_settings
from lake_assets_tests.engine_harness import EngineLake


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("lake")
    parser.add_argument("batches")
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

    def on_step(name: str) -> None:
        steps[0] += 1
        print(f"step {steps[0]}: {name}", flush=True)
        if args.kill_at_step is not None and steps[0] == args.kill_at_step:
            _die()

    lake = EngineLake(session, args.lake)
    for batch in batches:
        report = lake.fold(batch, on_commit_step=on_step)
        print(f"folded {report.events_in} events, recovered {report.recovered_folds}", flush=True)
    print("DONE", flush=True)
    os._exit(0)  # the kill timer thread must not outlive a finished run


if __name__ == "__main__":
    main()
