"""What an object store's round trips cost a backfill: `python -m benchmarks.request_latency`.

Every request the lake's Python side makes of its store (`Storage`: listings, footers, hashes,
catalog parts, notes, the commit's moves) waits here for `--latency` seconds before it is made,
as a request to S3 waits out a round trip (20-30 ms), while Spark's own reads and writes stay on
local disk. The 7-day backfill of the quick size then shows what requests made one after
another cost, apart from Spark's s3a traffic: per step, seconds, and the requests made in all and
on the main thread (one after another). A moto server cannot show this: it answers one request
at a time, so requests made side by side take as long as in a row.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from benchmarks import side_by_side
from benchmarks.unit_landing import LandingShape, write_unit_landing
from lake_assets.storage import PARALLEL_SMALL_REQUESTS, Storage

#: every `Storage` method that makes a request of the store (`exists` asks `file_info`, counted there)
STORE_REQUESTS = (
    "list",
    "walk_files",
    "files_now",
    "file_info",
    "read_bytes",
    "open_input_file",
    "refusal_to_read",
    "write_bytes",
    "read_tagged",
    "write_if_tag",
    "copy",
    "delete_tree",
    "delete_file",
    "move_file",
)
#: the counter's key of the requests made on the main thread, one after another
MAIN_THREAD = "main thread"
#: the counter's key of every request
ALL = "all"


@contextlib.contextmanager
def store_requests_counted(latency: float = 0.0) -> Iterator[collections.Counter]:
    """Within the block every store is taken for a remote one (`Storage.requests_at_once`), and
    every request of it waits `latency` seconds first and is counted: by method name if made on
    the main thread, and under `MAIN_THREAD` and `ALL`."""
    counted: collections.Counter = collections.Counter()
    originals = {name: getattr(Storage, name) for name in (*STORE_REQUESTS, "requests_at_once")}
    counting_lock = threading.Lock()

    def counting(name: str):
        request = originals[name]

        def counted_request(self, *args, **kwargs):
            with counting_lock:
                if threading.current_thread() is threading.main_thread():
                    counted[name] += 1
                    counted[MAIN_THREAD] += 1
                counted[ALL] += 1
            if latency:
                time.sleep(latency)
            return request(self, *args, **kwargs)

        return counted_request

    for name in STORE_REQUESTS:
        setattr(Storage, name, counting(name))
    Storage.requests_at_once = lambda self, uri: PARALLEL_SMALL_REQUESTS  # type: ignore[method-assign]
    try:
        yield counted
    finally:
        for name, request in originals.items():
            setattr(Storage, name, request)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.02, help="seconds each store request waits")
    parser.add_argument("--rounds", type=int, default=3, help="backfills, the first one left out")
    args = parser.parse_args()

    from lake_assets import spark as spark_settings

    spark = spark_settings.build_session(spark_settings.session_conf(app_name="request-latency"))
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as scratch:
        landing = Path(scratch) / "landing"
        shape = LandingShape(
            keys=side_by_side.QUICK["keys"], events_per_hour=side_by_side.QUICK["rate"], hours=168
        )
        write_unit_landing(landing, side_by_side.TABLE, shape)
        feed = side_by_side.feed_config(landing)
        partitions = side_by_side.landed_hours(feed)
        print(f"{len(partitions)} hour partitions, each store request {args.latency * 1000:.0f} ms")
        for round_number in range(args.rounds):
            steps: dict[str, float] = {}
            started = time.perf_counter()
            with store_requests_counted(args.latency) as counted:
                side_by_side.run_pipeline(
                    spark, feed, Path(scratch) / f"lake-{round_number}", partitions, uuid.uuid4().hex, steps
                )
            seconds = time.perf_counter() - started
            if round_number:
                by_step = ", ".join(f"{step} {value:.2f}" for step, value in steps.items())
                print(
                    f"backfill {seconds:.2f} s ({by_step}); requests {counted[ALL]}, "
                    f"{counted[MAIN_THREAD]} of them one after another"
                )


if __name__ == "__main__":
    main()
