"""How long a landing sensor's FIRST tick takes on one Unit table with a long history.

Builds, without Spark, a Unit landing of H hour folders (1-3 small files each) and the processed
notes a run would have written for them (`processed.write_notes`, from the landing's own
listing, with the real `hash_file` hashes), then times what `sensors._hourly_runs` does on a
first scan: `_processed_with` (read_notes + unfolded_notes + read_reruns) and `scan_table` with a fresh
TableCursor, split into the landing listing (`landed_hours`) and the per-hour
`ProcessedWith.unchanged` -> `changed_partitions` calls. Optionally also the strays walk a first
tick makes for one table (`unreported_strays`: due at once for a fresh cursor). S3 is a moto
server this script starts on 127.0.0.1, whose requests are slower than S3's and slow further as
the bucket grows: its figures are request counts first, seconds second.

Scenarios:
  normal  - every file's mtime is before its note's recorded_ms - 2 s: no hashing
  rehash  - every file's mtime is after recorded_ms (a landing re-synced/copied, or recorded
            within 2 s of landing): `_why_changed` hashes every landed file

Usage: .venv/bin/python -m benchmarks.first_tick --hours 720 --backend local|s3 [--scenario normal|rehash]
       [--file-kb 2] [--strays]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from lake_assets import reruns
from lake_assets.catalog.metadata import hash_stream
from lake_assets.config_model import S3Config
from lake_assets.feeds.base import current_hour, hour_key
from lake_assets.feeds.unit_cdc import UnitCdcFormat
from lake_assets.landing_watch import TableCursor, scan_table
from lake_assets.paths import LakeLayout
from lake_assets.processed import ProcessedFile, ProcessedWith, read_notes, unfolded_notes, write_notes
from lake_assets.quarantine import unreported_strays
from lake_assets.storage import Storage

FEED, TABLE = "unit", "accounts"


class CountingStorage(Storage):
    """Counts the Storage calls by name (thread-safe: notes are read 16 at a time)."""

    def __init__(self, s3=None):
        super().__init__(s3)
        self.calls: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()


def _counted(name: str):
    def call(self: CountingStorage, *args, **kwargs):
        with self._lock:
            self.calls[name] += 1
        return getattr(Storage, name)(self, *args, **kwargs)

    return call


for _name in ("list", "read_bytes", "exists", "open_input_file", "walk_files"):
    setattr(CountingStorage, _name, _counted(_name))


def hours_back(n: int) -> list[dt.datetime]:
    end = current_hour() - dt.timedelta(hours=1)
    return [end - dt.timedelta(hours=i) for i in range(n)][::-1]


def rel_path(moment: dt.datetime, i: int) -> str:
    return (
        f"{TABLE}/year={moment.year}/month={moment.month:02d}/day={moment.day:02d}/"
        f"hour={moment.hour:02d}/part-{i:05d}-{moment:%Y%m%d%H}.snappy.parquet"
    )


def landing_files(hours: int, file_kb: int) -> dict[str, bytes]:
    rng = random.Random(42)
    files = {}
    for moment in hours_back(hours):
        for i in range(rng.randint(1, 3)):
            files[rel_path(moment, i)] = rng.randbytes(rng.randint(file_kb * 512, file_kb * 1536))
    return files


def build(storage: Storage, landing: str, lake: str, hours: int, scenario: str, file_kb: int, s3=None):
    """Writes the landing and the processed notes; returns (number of files, bytes landed)."""
    files = landing_files(hours, file_kb)
    t0 = time.time()
    if s3 is None:
        root = landing[len("file://") :]
        old = time.time() - 3600  # landed an hour ago
        for rel, data in files.items():
            path = f"{root}/{rel}"
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(data)
            os.utime(path, (old, old))
        recorded_ms = int(time.time() * 1000) if scenario == "normal" else int((old - 3600) * 1000)
    else:
        client, bucket, prefix = s3
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda kv: client.put_object(Bucket=bucket, Key=f"{prefix}/{kv[0]}", Body=kv[1]),
                    files.items(),
                )
            )
        time.sleep(3)
        recorded_ms = int(time.time() * 1000) if scenario == "normal" else int((t0 - 3600) * 1000)
    print(
        f"  landed {len(files)} files ({sum(map(len, files.values())) / 1e6:.1f} MB) in {time.time() - t0:.1f}s"
    )
    # the notes, exactly as a run writes them, from the landing as listed
    fmt, layout = UnitCdcFormat(), LakeLayout(lake)
    listed = fmt.landed_hours(storage, landing, TABLE, None)
    assert len(listed) == hours, (len(listed), hours)
    plain = Storage(storage._s3_settings)
    prefix = landing.rstrip("/") + "/"
    # hash_file's hash (blake2b-16 of the bytes), from the bytes written rather than read back
    notes = {
        key: {
            e.uri: ProcessedFile(
                e.size, hash_stream([files[e.uri[len(prefix) :]]]), recorded_ms, read_mtime_ms=e.mtime_ms
            )
            for e in entries
        }
        for key, entries in listed.items()
    }
    t1 = time.time()
    write_notes(plain, layout, FEED, TABLE, notes)
    print(f"  wrote {len(notes)} processed notes in {time.time() - t1:.1f}s")
    return len(files), sum(map(len, files.values()))


class _Spent:
    """Seconds and storage calls spent inside the blocks it times."""

    def __init__(self, storage: CountingStorage):
        self.storage, self.seconds = storage, 0.0
        self.calls: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def timing(self):
        before, started = self.storage.calls.copy(), time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - started
            self.calls.update(self.storage.calls - before)


def first_tick(storage: CountingStorage, landing: str, lake: str, hours: int, strays: bool) -> dict:
    layout = LakeLayout(lake)
    first = hour_key(hours_back(hours)[0])
    spent = {
        name: _Spent(storage)
        for name in ("read_notes", "unfolded_notes", "read_reruns", "listing", "unchanged", "scan", "strays")
    }

    class TimedFormat(UnitCdcFormat):
        def landed_hours(self, *args, **kwargs):
            with spent["listing"].timing():
                return super().landed_hours(*args, **kwargs)

    class TimedProcessedWith(ProcessedWith):
        def unchanged(self, partition, files):
            with spent["unchanged"].timing():
                return super().unchanged(partition, files)

    fmt = TimedFormat()
    with spent["read_notes"].timing():
        notes = read_notes(storage, layout, FEED, TABLE, fmt.is_partition_key)
    with spent["unfolded_notes"].timing():
        unfolded = unfolded_notes(storage, layout, FEED, TABLE, notes.keys(), fmt.is_partition_key)
    with spent["read_reruns"].timing():
        asked = reruns.read_reruns(storage, layout, FEED, TABLE, fmt.is_partition_key)
    with spent["scan"].timing():
        processed = TimedProcessedWith(storage, notes, frozenset(asked), unfolded)
        scan = scan_table(storage, fmt, landing, TABLE, TableCursor(), 4, first, processed)
    if strays:
        with spent["strays"].timing():
            assert not unreported_strays(storage, layout, fmt, landing, FEED, TABLE)
    print(f"  found {len(scan.found)} hour(s) to run, cursor remembers {len(scan.cursor.seen)} hour(s)")
    rest = spent["scan"].seconds - spent["listing"].seconds - spent["unchanged"].seconds
    return {
        "read_notes": (spent["read_notes"].seconds, dict(spent["read_notes"].calls)),
        "unfolded_notes": (spent["unfolded_notes"].seconds, dict(spent["unfolded_notes"].calls)),
        "read_reruns": (spent["read_reruns"].seconds, dict(spent["read_reruns"].calls)),
        "scan: landed_hours listing": (spent["listing"].seconds, dict(spent["listing"].calls)),
        "scan: unchanged() per hour": (spent["unchanged"].seconds, dict(spent["unchanged"].calls)),
        "scan: rest": (rest, {}),
        **(
            {"strays walk (one table a tick)": (spent["strays"].seconds, dict(spent["strays"].calls))}
            if strays
            else {}
        ),
    }


def start_moto() -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen(
        [moto, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    import urllib.request

    for _ in range(100):
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
    return proc, url


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=int, default=720)
    ap.add_argument("--backend", choices=["local", "s3"], default="local")
    ap.add_argument("--scenario", choices=["normal", "rehash"], default="normal")
    ap.add_argument("--file-kb", type=int, default=2)
    ap.add_argument("--strays", action="store_true")
    args = ap.parse_args()
    print(f"H={args.hours} backend={args.backend} scenario={args.scenario}")
    proc = tmp = None
    try:
        if args.backend == "local":
            tmp = tempfile.mkdtemp(prefix="tick-")
            landing, lake = f"file://{tmp}/landing", f"file://{tmp}/lake"
            s3cfg, s3 = None, None
        else:
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "measure-fake")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "measure-fake-secret")
            proc, url = start_moto()
            import boto3

            client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
            client.create_bucket(Bucket="tick")
            landing, lake = "s3a://tick/landing", "s3a://tick/lake"
            s3cfg, s3 = S3Config(endpoint_url=url), (client, "tick", "landing")
        build(Storage(s3cfg), landing, lake, args.hours, args.scenario, args.file_kb, s3)
        result = first_tick(CountingStorage(s3cfg), landing, lake, args.hours, args.strays)
        for name, (seconds, calls) in result.items():
            print(f"  {name:42s} {seconds:8.2f} s  {calls}")
        print(f"  {'TOTAL':42s} {sum(seconds for seconds, _ in result.values()):8.2f} s")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
