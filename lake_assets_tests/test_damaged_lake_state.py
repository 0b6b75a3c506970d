"""The lake's own notes damaged or changed outside a run: each is refused naming the note, before
anything is done on its word, and `status` names it instead of failing (no Spark)."""

from __future__ import annotations

import json

import pyarrow.fs as pafs
import pytest

from lake_assets import processed, reruns
from lake_assets.console import format_status
from lake_assets.engine.state import CommitPlan, TableState, commit, recover
from lake_assets.errors import AnotherWriter, DamagedLakeFile
from lake_assets.feeds.grax_v2 import GraxV2Format
from lake_assets.feeds.unit_cdc import UnitCdcFormat
from lake_assets.paths import LakeLayout
from lake_assets.status import table_status
from lake_assets.storage import Storage

FEED, TABLE = "unit", "accounts"


class _Killed(Exception):
    """The process dying at a step of a commit."""


def _killed_after_its_record(storage: Storage, state: TableState, plan: CommitPlan) -> None:
    def die(step: str) -> None:
        if step == "add 0":
            raise _Killed(step)

    with pytest.raises(_Killed):
        commit(storage, state, plan, on_step=die)


def _plan(storage: Storage, state: TableState) -> tuple[CommitPlan, str, str]:
    """A fold's plan replacing current's one file: (plan, the old file, the file it puts in place)."""
    old = f"{state.current}/part-0000000000000000-00000.parquet"
    storage.write_bytes(old, b"the table's file")
    staged = f"{state.staging('f1')}/current/part-0.parquet"
    storage.write_bytes(staged, b"the fold's file")
    final = f"{state.current}/part-f1-00000.parquet"
    return CommitPlan("f1", adds=[(staged, final)], deletes=[old]), old, final


def test_a_commit_record_is_finished_by_the_next_run(tmp_path):
    storage, state = Storage(), TableState(LakeLayout(f"file://{tmp_path}"), FEED, TABLE)
    plan, old, final = _plan(storage, state)
    _killed_after_its_record(storage, state, plan)

    assert [p.fold_id for p in recover(storage, state)] == ["f1"]
    assert storage.read_bytes(final) == b"the fold's file" and not storage.exists(old)


def test_a_commit_record_whose_staged_file_is_gone_is_refused_and_the_table_keeps_its_files(tmp_path):
    """Staging removed by hand (or a lifecycle rule) under a record: applying it would delete
    current's file and put nothing in its place, on every run."""
    storage, state = Storage(), TableState(LakeLayout(f"file://{tmp_path}"), FEED, TABLE)
    plan, old, final = _plan(storage, state)
    _killed_after_its_record(storage, state, plan)
    storage.delete_tree(state.staging_root())

    with pytest.raises(DamagedLakeFile) as refused:
        recover(storage, state)

    record = f"{state.commits}/f1.json"
    assert f"the lake file {record} cannot be applied (it puts " in str(refused.value)
    assert storage.read_bytes(old) == b"the table's file" and not storage.exists(final)


def test_a_commit_whose_staging_another_writer_discarded_stops_before_it_changes_the_table(tmp_path):
    """A second process writing the table (started by hand beside the daemon) recovers it, which
    discards the first fold's staging: that fold's commit must not take the table's files away."""
    storage, state = Storage(), TableState(LakeLayout(f"file://{tmp_path}"), FEED, TABLE)
    plan, old, final = _plan(storage, state)
    assert recover(storage, state) == []  # the other writer's run

    with pytest.raises(AnotherWriter, match="another process wrote the table meanwhile"):
        commit(storage, state, plan)
    assert storage.read_bytes(old) == b"the table's file" and not storage.exists(final)
    assert storage.list(state.commits) == []


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b"{}",
        b'{"fold_id": "f1", "adds": [1], "deletes": []}',
        b'{"fold_id": "f1", "deletes": ["file:///lake/current/unit/accounts/part-1.parquet"]}',
    ],
)
def test_a_commit_record_that_is_not_one_is_refused_naming_it(tmp_path, content):
    storage, state = Storage(), TableState(LakeLayout(f"file://{tmp_path}"), FEED, TABLE)
    record = f"{state.commits}/f1.json"
    storage.write_bytes(record, content)

    with pytest.raises(
        DamagedLakeFile, match=f"the lake file {record} cannot be read \\(not the note it should be"
    ):
        recover(storage, state)


NOTES = {
    "processed": lambda layout: f"{processed.notes_folder(layout, FEED, TABLE)}/2024-03-01-01.json",
    "rerun": lambda layout: f"{reruns.reruns_folder(layout, FEED, TABLE)}/2024-03-01-01/1-abc.json",
    "quarantine": lambda layout: (
        f"{layout.quarantine(FEED, TABLE, '2024-03-01-01')}/abc/x.parquet.reason.json"
    ),
}


class _DiesMidWrite:
    """A local file system whose writes stop halfway, as a process killed while writing does."""

    def __init__(self):
        self._fs = pafs.LocalFileSystem()

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def open_output_stream(self, path):
        stream = self._fs.open_output_stream(path)

        class Half:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                stream.close()

            def write(self, data):
                stream.write(data[: len(data) // 2])
                raise OSError("killed")

        return Half()


WRITTEN_NOTES = {
    **NOTES,
    "commit record": lambda layout: f"{TableState(layout, FEED, TABLE).commits}/f1.json",
}


@pytest.mark.parametrize("note", sorted(WRITTEN_NOTES))
def test_a_note_whose_write_dies_midway_is_the_old_note_or_none(tmp_path, note):
    layout, storage = LakeLayout(f"file://{tmp_path}"), Storage()
    uri = WRITTEN_NOTES[note](layout)
    storage.write_bytes(uri, b'{"the note": "as it was"}')
    storage._local = _DiesMidWrite()

    with pytest.raises(OSError, match="killed"):
        storage.write_bytes(uri, json.dumps({"the note": "new", "padding": "x" * 100}).encode())

    folder = uri.rsplit("/", 1)[0]
    assert Storage().read_bytes(uri) == b'{"the note": "as it was"}'
    assert [entry.name for entry in Storage().list(folder)] == [uri.rsplit("/", 1)[1]]


@pytest.mark.parametrize("note", sorted(NOTES))
@pytest.mark.parametrize("content", [b"\xff garbage", b"[]", b'{"x": {"size": 1}}'])
def test_a_damaged_note_is_named_by_status_which_still_reports_the_table(tmp_path, note, content):
    layout, storage = LakeLayout(f"file://{tmp_path / 'lake'}"), Storage()
    uri = NOTES[note](layout)
    storage.write_bytes(uri, content)

    status = table_status(storage, layout, f"file://{tmp_path / 'landing'}", FEED, UnitCdcFormat(), TABLE)

    assert [damage.split(" (")[0] for damage in status.damaged] == [f"the lake file {uri} cannot be read"]
    assert json.dumps(status.to_json())  # still a whole status, for `status --json`
    unknown = "quarantined" if note == "quarantine" else "pending"  # what the note would tell
    assert getattr(status, unknown) is None, "unknown, not none"
    header, row = format_status([status], keeps_runs=True).splitlines()[:2]
    assert row.split()[header.split().index(unknown) - 1] == "?"  # "last processed" is two words


@pytest.mark.parametrize(
    "fmt, table", [(UnitCdcFormat(), "accounts"), (GraxV2Format(), "org/account")], ids=["hours", "batches"]
)
@pytest.mark.parametrize("note", ["processed", "rerun"])
@pytest.mark.parametrize("name", ["zzz", "2024-13-01-00", "2024-02-30-24"])
def test_a_note_named_like_no_partition_is_damage(tmp_path, fmt, table, note, name):
    """Shaped like an hour key but naming no hour (month 13), a name stopped `status` and a
    feed's sensor tick with Python's own ValueError, where it is damage like any other name."""
    layout, storage = LakeLayout(f"file://{tmp_path / 'lake'}"), Storage()
    if note == "processed":
        uri = f"{processed.notes_folder(layout, FEED, table)}/{name}.json"
        storage.write_bytes(uri, b"{}")
    else:
        uri = f"{reruns.reruns_folder(layout, FEED, table)}/{name}"
        reruns.request_rerun(storage, layout, FEED, table, name, "by hand", [])

    status = table_status(storage, layout, f"file://{tmp_path / 'landing'}", FEED, fmt, table)

    assert status.damaged == [
        f"the lake file {uri} cannot be read ({name!r} names no partition of the table); "
        + status.damaged[0].split("; ", 1)[1]
    ]
    assert status.pending is None and status.last_processed is None


def test_a_damaged_reading_note_is_refused_naming_it(tmp_path):
    layout, storage = LakeLayout(f"file://{tmp_path}"), Storage()
    uri = f"{reruns.reading_folder(layout, FEED, TABLE)}/2024-03-01-01.json"
    storage.write_bytes(uri, b'{"parts": 3}')

    with pytest.raises(DamagedLakeFile, match=f"the lake file {uri} cannot be read"):
        reruns.read_reading(storage, layout, FEED, TABLE, "2024-03-01-01")


def test_a_damaged_catalog_file_is_named(tmp_path):
    from lake_assets.catalog.files import catalog_what, catalog_where
    from lake_assets.catalog.metadata import build_records
    from lake_assets.catalog.parquet_store import ParquetCatalogStore

    storage = Storage()
    store = ParquetCatalogStore(f"file://{tmp_path}/catalog", storage)
    metadata = {
        "id": "f1",
        "where": catalog_where(FEED),
        "what": catalog_what(TABLE),
        "work_id": "run-1",
        "start": 1_700_000_000_000,
        "end": 1_700_000_000_000,
        "hash": "00",
        "path": "/l/a.parquet",
    }
    store.put(build_records(metadata, url="file:///l/a.parquet", size=1))
    (part,) = sorted((tmp_path / "catalog").rglob("time_bucket=*/**/part-*.parquet"))
    part.write_bytes(b"not parquet")

    with pytest.raises(DamagedLakeFile, match=f"the lake file file://{part} cannot be read"):
        store.query_by_time(1_600_000_000_000, 1_800_000_000_000, catalog_what(TABLE))
