"""Hostile input on top of a valid landing, for every feed: nothing landed is lost.

Each case writes a small valid landing, adds one kind of bad (or merely odd) input on top, runs
`lake-assets run` as a user does and checks the promise of docs/bad-input.md:
- the command exits 0;
- every file the case added is either read (its rows are in `changes`) or set aside: copied to
  `_quarantine` with a note naming the file and the cause; files that cannot be used must be set
  aside, and nothing but the added files is;
- every event of the valid landing is in `changes`, and every layer is readable by DuckDB;
- the change log's counts reconcile, and `landing_complete` fails where data was lost upstream.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lake_assets.cli import main
from lake_assets.quarantine import notes_under
from lake_assets.storage import Storage
from lake_assets_tests.hostile_landings import (
    ACCOUNT_SCHEMA,
    FEEDS,
    FLOW_VALID_DOCS,
    GRAX_SCHEMA,
    at,
    contradict_a_column_chunk_type,
    event,
    events,
    flow_doc,
    flow_journal,
    flow_valid_content,
    garble_data_pages,
    grax_batch,
    grax_time,
    landing_complete_passed,
    layer_rows,
    materialisation_metadata,
    quarantine_notes,
    unit_hour,
    write_config,
    write_flow_fragment,
    write_parquet,
)

pytestmark = pytest.mark.minutes(5)


@dataclasses.dataclass(frozen=True)
class Hostile:
    feed: str
    name: str
    #: writes the hostile input on top of the valid landing; returns the files it added
    add: Callable[[Path], list[Path]]
    #: the added files cannot be used: each must be set aside with a reason
    unusable: bool = True
    #: the added files hold good data: each must be read (its rows in `changes`), none set aside
    read: bool = False
    #: what `landing_complete` must say (None: either, e.g. a file that is read in one rule)
    complete: bool | None = None


def uri(path: Path) -> str:
    return f"file://{path}"


# --- Unit CDC ----------------------------------------------------------------------------------


def unit_rows(id_: str, seq: int, **payload) -> list[dict]:
    return [event(id_, "I", seq, at(2, 30), name=f"n{id_}", balance=seq, **payload)]


def good_unit_file(path: Path, id_: str = "z", seq: int = 90) -> Path:
    return write_parquet(path, unit_rows(id_, seq), ACCOUNT_SCHEMA)


def zero_byte(landing: Path) -> list[Path]:
    path = unit_hour(landing) / "part-9.parquet"
    path.write_bytes(b"")
    return [path]


def random_bytes(landing: Path) -> list[Path]:
    path = unit_hour(landing) / "part-9.parquet"
    path.write_bytes(os.urandom(4096))
    return [path]


def corrupt_pages_and_clashing_schema(landing: Path) -> list[Path]:
    """A file whose footer is fine but whose data pages are garbage, and in the same batch a file
    giving `balance` a type no other file's can widen into."""
    corrupt = write_parquet(
        unit_hour(landing) / "part-7.parquet",
        [event(f"k{i}", "I", 100 + i, at(2, 7), name="x" * 50, balance=i) for i in range(200)],
        ACCOUNT_SCHEMA,
    )
    garble_data_pages(corrupt)
    clash_schema = pa.schema(
        [
            *(f for f in ACCOUNT_SCHEMA if f.name != "balance"),
            ("balance", pa.struct([("amount", pa.int64())])),
        ]
    )
    clash = write_parquet(
        unit_hour(landing) / "part-8.parquet",
        [event("q", "I", 300, at(2, 8), name="q", balance={"amount": 1})],
        clash_schema,
    )
    return [corrupt, clash]


def column_names_not_utf8(landing: Path) -> list[Path]:
    """Column names (at the top and in a struct) holding bytes that are not UTF-8, as a writer
    that does not check them leaves them: no reader can name the columns."""
    added = []
    for name, columns in [
        ("part-top.parquet", {"zzQQ": pa.array([1], pa.int64())}),
        ("part-nested.parquet", {"s": pa.array([{"zzQQ": 1}], pa.struct([("zzQQ", pa.int64())]))}),
    ]:
        rows = pa.Table.from_pylist(unit_rows(f"u-{name}", 95), schema=ACCOUNT_SCHEMA)
        for column, values in columns.items():
            rows = rows.append_column(column, values)
        path = unit_hour(landing) / name
        pq.write_table(rows, path, store_schema=False)
        path.write_bytes(path.read_bytes().replace(b"zzQQ", b"zzQ\xff"))
        added.append(path)
    return added


def column_chunk_type_contradicts_schema(landing: Path) -> list[Path]:
    """A footer whose column chunk claims a type its schema contradicts: pyarrow cannot read
    that chunk's metadata without ending its process."""
    return [contradict_a_column_chunk_type(good_unit_file(unit_hour(landing) / "part-type.parquet"))]


def invalid_time_folders(landing: Path) -> list[Path]:
    table = landing / "accounts"
    folders = [
        "year=2024/month=03/day=01/hour=25",
        "year=2024/month=03/day=32/hour=01",
        "year=2024/month=13/day=01/hour=01",
        "year=2024/month=02/day=30/hour=01",
        "year=2024/month=03/day=01/hour=-1",
        "year=abcd/month=03/day=01/hour=01",
    ]
    return [
        good_unit_file(table / folder / "part-0.parquet", f"s{i}", 200 + i)
        for i, folder in enumerate(folders)
    ]


def symlink_loops(landing: Path) -> list[Path]:
    """Links back into their own folders: never followed, each reported as a stray."""
    links = [unit_hour(landing) / "loop", landing / "accounts" / "year=2024" / "again"]
    for link, target in zip(links, (unit_hour(landing), landing / "accounts"), strict=True):
        link.symlink_to(target, target_is_directory=True)
    return links


def named_pipe(landing: Path) -> list[Path]:
    """A named pipe among the data files: its copy to quarantine waited for a writer for ever."""
    pipe = unit_hour(landing) / "part-pipe.parquet"
    os.mkfifo(pipe)
    return [pipe]


def folder_named_like_a_file(landing: Path) -> list[Path]:
    return [good_unit_file(unit_hour(landing) / "part-5.parquet" / "inner.parquet")]


def hour_from_1990(landing: Path) -> list[Path]:
    folder = landing / "accounts" / "year=1990" / "month=01" / "day=01" / "hour=00"
    return [
        write_parquet(
            folder / "part-0.parquet",
            [event("old", "I", 1, at(0).replace(year=1990, month=1), name="old", balance=1)],
            ACCOUNT_SCHEMA,
        )
    ]


def reserved_column_names(landing: Path) -> list[Path]:
    rows = [
        {
            **unit_rows("r", 91)[0],
            "_op": "mine",
            "hour": 7,
            "__secret": "x",
            "_source_file": "vendor's",
            "_fivetran_start": "v",
            "batch": "b",
        }
    ]
    return [write_parquet(unit_hour(landing) / "part-6.parquet", rows)]


def id_twice_in_one_file(landing: Path) -> list[Path]:
    rows = [{**unit_rows("d", 92)[0], "Id": "D-upper"}]
    return [write_parquet(unit_hour(landing) / "part-6.parquet", rows)]


def column_case_differs_between_files(landing: Path) -> list[Path]:
    upper = [{("Balance" if k == "balance" else k): v for k, v in unit_rows("u", 93)[0].items()}]
    return [
        write_parquet(unit_hour(landing) / "part-6.parquet", upper),
        good_unit_file(unit_hour(landing, 3) / "part-6.parquet", "l", 94),
    ]


def odd_column_names(landing: Path) -> list[Path]:
    rows = [{**unit_rows("o", 95)[0], "we`ird": "tick", "with space": "s", "dot.ted": "d", "é": "u"}]
    return [write_parquet(unit_hour(landing) / "part-6.parquet", rows)]


def odd_file_names(landing: Path) -> list[Path]:
    names = [
        "part:1.parquet",
        "part #2.parquet",
        "part%3.parquet",
        "part?4.parquet",
        "part[5].parquet",
        "part{6}.parquet",
    ]
    return [good_unit_file(unit_hour(landing) / name, f"f{i}", 400 + i) for i, name in enumerate(names)]


def colliding_quarantine_names(landing: Path) -> list[Path]:
    paths = [
        unit_hour(landing) / name
        for name in ("bad x.parquet", "bad_x.parquet", "bad\nx.parquet", "bad?x.parquet")
    ]
    for path in paths:
        path.write_bytes(b"not parquet at all")
    return paths


def long_file_name(usable: bool) -> Callable[[Path], list[Path]]:
    """A file whose name takes 250 of the 255 bytes a name may have. Unusable, its quarantine
    note's name (the copy's plus `.reason.json`) did not fit, and the table stopped on every
    run; usable, it is read like any other."""

    def add(landing: Path) -> list[Path]:
        path = unit_hour(landing) / ("n" * 242 + ".parquet")
        if usable:
            return [good_unit_file(path, "long", 450)]
        path.write_bytes(b"not parquet at all")
        return [path]

    return add


def file_named_like_a_note(landing: Path) -> list[Path]:
    """Its quarantined copy, named like a note beside the notes, was read as one."""
    path = unit_hour(landing) / "export.reason.json"
    path.write_text('{"file": "file:///elsewhere/fake.parquet", "rows": 999}')
    return [path]


def parquet_text(*values: bytes) -> pa.Array:
    """A Parquet STRING column holding exactly these bytes, valid UTF-8 or not."""
    return pa.array(values, pa.binary()).view(pa.string())


def text_that_is_not_utf8(landing: Path) -> list[Path]:
    """Payload text with bytes that are not UTF-8 is kept, repaired; DuckDB must still read the lake."""
    row = unit_rows("t", 96)[0]
    columns = {name: pa.array([value], ACCOUNT_SCHEMA.field(name).type) for name, value in row.items()}
    table = pa.table({**columns, "name": parquet_text(b"caf\xc3 \xff")})
    return [write_parquet(unit_hour(landing) / "part-6.parquet", table)]


def extreme_event_times(landing: Path) -> list[Path]:
    far = [
        event("y9999", "I", 601, at(2).replace(year=9999, month=12, day=31), name="far", balance=1),
        event("y0001", "I", 602, at(2).replace(year=1, month=1, day=1), name="near", balance=1),
    ]
    long_span = [
        event("long1", "I", 603, at(2).replace(month=1), name="a", balance=1),
        event("long2", "I", 604, at(2).replace(month=6), name="b", balance=1),
    ]
    return [
        write_parquet(unit_hour(landing) / "part-6.parquet", far, ACCOUNT_SCHEMA),
        write_parquet(unit_hour(landing) / "part-7.parquet", long_span, ACCOUNT_SCHEMA),
    ]


# --- GRAX --------------------------------------------------------------------------------------


def object_folders_differing_in_case(landing: Path) -> list[Path]:
    return [
        write_parquet(
            grax_batch(landing, "000000003", "ACCOUNT") / "data-00000000003.parquet",
            [{"Id": "9", "source__modified": grax_time(5), "grax__idseq": "e", "Name": "Upper"}],
            GRAX_SCHEMA,
        )
    ]


def grax_marker_that_is_not_a_time(column: str) -> Callable[[Path], list[Path]]:
    def add(landing: Path) -> list[Path]:
        rows = [
            {"Id": "2", "source__modified": grax_time(6), "grax__idseq": "f", "Name": "Bob", column: "yes"}
        ]
        return [write_parquet(grax_batch(landing, "000000003") / "data-00000000003.parquet", rows)]

    add.__name__ = f"{column}_not_a_time"
    return add


def grax_text_that_is_not_utf8(landing: Path) -> list[Path]:
    table = pa.table(
        {
            "Id": ["8"],
            "source__modified": [grax_time(6)],
            "grax__idseq": ["h"],
            "Name": parquet_text(b"M\xfcller"),
        },
        schema=GRAX_SCHEMA,
    )
    return [write_parquet(grax_batch(landing, "000000003") / "data-00000000003.parquet", table)]


def grax_reserved_column_names(landing: Path) -> list[Path]:
    rows = [
        {
            "Id": "7",
            "source__modified": grax_time(6),
            "grax__idseq": "g",
            "Name": "R",
            "_op": "x",
            "batch": "b",
            "__derived": True,
        }
    ]
    return [write_parquet(grax_batch(landing, "000000003") / "data-00000000003.parquet", rows)]


# --- Flow --------------------------------------------------------------------------------------


def valid_length() -> int:
    return len(flow_valid_content())


def garbage_fragment_over_the_good_one(landing: Path) -> list[Path]:
    """A fragment claiming the good one's range and ten bytes more, whose bytes are garbage: the
    cover picks it first (it is the longest) and must fall back to the good fragment; the ten
    bytes only it claims are a gap."""
    # Its name carries the checksum of other bytes, so it does not replace the good file.
    return [
        write_flow_fragment(
            flow_journal(landing), 0, b"garbage", end=valid_length() + 10, stored=os.urandom(300)
        )
    ]


def key_that_is_not_a_scalar(key) -> Callable[[Path], list[Path]]:
    def add(landing: Path) -> list[Path]:
        content = flow_doc(10).replace(b'"id": 10', b'"id": ' + key)
        return [write_flow_fragment(flow_journal(landing), valid_length(), content)]

    add.__name__ = f"key_{key.decode()[:1]}"
    return add


def gzip_bomb(landing: Path) -> list[Path]:
    """Concatenated gzip members of zeros: 48 KB on disk, 3 GiB inflated."""
    member = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    content = flow_doc(11)
    return [write_flow_fragment(flow_journal(landing), valid_length(), content, stored=member * 48)]


def invalid_hour_folders(landing: Path) -> list[Path]:
    content = flow_doc(12)
    return [
        write_flow_fragment(flow_journal(landing), valid_length(), content, folder=folder)
        for folder in ("utc_date=2024-06-01/utc_hour=25", "utc_date=2026-02-30/utc_hour=01")
    ]


def flow_text_that_is_not_utf8(landing: Path) -> list[Path]:
    content = flow_doc(15, name="NAME").replace(b'"NAME"', b'"caf\xc3 \\ud800"')
    return [write_flow_fragment(flow_journal(landing), valid_length(), content)]


def flow_field_names_one_once_repaired(landing: Path) -> list[Path]:
    """Two field names (at the top and nested) that differ only in bytes that are not UTF-8, or
    beside the very character a repair puts in (U+FFFD): repaired, one value would be dropped."""
    top = flow_doc(16, fA="first", fB="second").replace(b'"fA"', b'"f\xff"').replace(b'"fB"', b'"f\xfe"')
    nested = flow_doc(17, o={"kA": 1, "kB": 2}).replace(b'"kA"', b'"k\xff"').replace(b'"kB"', b'"k\\ufffd"')
    return [
        write_flow_fragment(flow_journal(landing), valid_length(), top),
        write_flow_fragment(flow_journal(landing), valid_length() + len(top), nested),
    ]


def field_case_differs_between_documents(landing: Path) -> list[Path]:
    content = flow_doc(13, Status="open") + flow_doc(14, status="closed")
    return [write_flow_fragment(flow_journal(landing), valid_length(), content)]


CASES = [
    Hostile("unit", "zero_byte", zero_byte),
    Hostile("unit", "random_bytes", random_bytes),
    Hostile("unit", "corrupt_pages_and_clashing_schema", corrupt_pages_and_clashing_schema),
    Hostile("unit", "invalid_time_folders", invalid_time_folders, complete=False),
    Hostile("unit", "column_names_not_utf8", column_names_not_utf8),
    Hostile("unit", "column_chunk_type_contradicts_schema", column_chunk_type_contradicts_schema),
    Hostile("unit", "symlink_loops", symlink_loops),
    Hostile("unit", "folder_named_like_a_file", folder_named_like_a_file, unusable=False),
    Hostile("unit", "named_pipe", named_pipe),
    Hostile("unit", "hour_from_1990", hour_from_1990, unusable=False, read=True, complete=True),
    Hostile("unit", "reserved_column_names", reserved_column_names, unusable=False, read=True),
    Hostile("unit", "id_twice_in_one_file", id_twice_in_one_file, unusable=False),
    Hostile(
        "unit",
        "column_case_differs_between_files",
        column_case_differs_between_files,
        unusable=False,
        read=True,
    ),
    Hostile("unit", "odd_column_names", odd_column_names, unusable=False, read=True),
    Hostile("unit", "odd_file_names", odd_file_names, unusable=False),
    Hostile("unit", "colliding_quarantine_names", colliding_quarantine_names),
    Hostile("unit", "long_file_name_unusable", long_file_name(usable=False)),
    Hostile("unit", "long_file_name_usable", long_file_name(usable=True), unusable=False, read=True),
    Hostile("unit", "file_named_like_a_note", file_named_like_a_note),
    Hostile("unit", "text_that_is_not_utf8", text_that_is_not_utf8, unusable=False, read=True),
    Hostile("unit", "extreme_event_times", extreme_event_times, unusable=False, read=True),
    Hostile(
        "grax",
        "object_folders_differing_in_case",
        object_folders_differing_in_case,
        unusable=False,
        read=True,
        complete=True,
    ),
    Hostile("grax", "deleted_not_a_time", grax_marker_that_is_not_a_time("grax__deleted")),
    Hostile("grax", "purged_not_a_time", grax_marker_that_is_not_a_time("grax__purged")),
    Hostile("grax", "text_that_is_not_utf8", grax_text_that_is_not_utf8, unusable=False, read=True),
    Hostile("grax", "reserved_column_names", grax_reserved_column_names, unusable=False, read=True),
    Hostile("flow", "garbage_fragment_over_the_good_one", garbage_fragment_over_the_good_one, complete=False),
    Hostile("flow", "key_is_an_object", key_that_is_not_a_scalar(b'{"a": 1}')),
    Hostile("flow", "key_is_an_array", key_that_is_not_a_scalar(b"[1, 2]")),
    Hostile("flow", "gzip_bomb", gzip_bomb),
    Hostile("flow", "invalid_hour_folders", invalid_hour_folders, complete=False),
    Hostile("flow", "text_that_is_not_utf8", flow_text_that_is_not_utf8, unusable=False, read=True),
    Hostile("flow", "field_names_one_once_repaired", flow_field_names_one_once_repaired),
    Hostile(
        "flow", "field_case_differs_between_documents", field_case_differs_between_documents, unusable=False
    ),
]


def test_empty_fragments_stored_as_no_bytes_are_read_as_empty(valid_events, tmp_path, monkeypatch):
    """A fragment whose name declares no bytes (begin = end, the zero sum) may be stored as a
    file of no bytes, whatever its codec: it is valid, holds no document, and is not set aside."""
    from lake_assets.feeds.flow_fragments import ZERO_SUM

    def empty_fragments(landing: Path) -> list[Path]:
        folder = flow_journal(landing) / "utc_date=2024-06-01/utc_hour=10"
        at = valid_length()
        added = [folder / f"{at:016x}-{at:016x}-{ZERO_SUM}{codec}" for codec in ("", ".gz", ".zst")]
        for path in added:
            path.write_bytes(b"")
        return added

    code, lake, instance, _ = run_cli(tmp_path, "flow", empty_fragments, monkeypatch)

    assert code == 0
    assert quarantine_notes(lake) == {}
    assert len(events(lake, FEEDS["flow"])) == len(valid_events["flow"])
    assert landing_complete_passed(instance, FEEDS["flow"])


def run_cli(tmp_path: Path, feed_name: str, add: Callable[[Path], list[Path]] | None, monkeypatch):
    """Write the valid landing (plus `add`'s input), run `lake-assets run`; (exit code, lake,
    instance, added files)."""
    feed = FEEDS[feed_name]
    landing, lake, home = tmp_path / "landing", tmp_path / "lake", tmp_path / "dagster_home"
    feed.write_valid(landing)
    added = add(landing) if add else []
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    code = main(["run", "--config", str(write_config(tmp_path, feed, landing, lake))])
    return code, lake, dg.DagsterInstance.get(), added


@pytest.fixture(scope="module")
def valid_events(spark, tmp_path_factory):
    """feed -> the events a clean run over the valid landing puts in `changes`."""
    found = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name, feed in FEEDS.items():
            code, lake, _, _ = run_cli(tmp_path_factory.mktemp(f"valid-{name}"), name, None, monkeypatch)
            assert code == 0
            found[name] = events(lake, feed)
            assert found[name], f"the valid {name} landing produced no events"
    assert len(found["flow"]) == len(FLOW_VALID_DOCS)
    return found


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.feed}-{c.name}")
def test_nothing_landed_is_lost(case: Hostile, valid_events, spark, tmp_path, monkeypatch):
    feed = FEEDS[case.feed]
    code, lake, instance, added = run_cli(tmp_path, case.feed, case.add, monkeypatch)
    assert code == 0

    notes = quarantine_notes(lake)
    read_files = {row.get("_source_file") for row in layer_rows(lake, "changes", feed)}
    for path in added:
        if case.unusable:
            assert uri(path) in notes, f"{path.name} was not set aside: {sorted(notes)}"
        assert uri(path) in notes or uri(path) in read_files, f"{path.name} was neither read nor set aside"
        if case.read:
            assert uri(path) in read_files and uri(path) not in notes, (
                f"{path.name} holds good data but was not read"
            )
    for file, note in notes.items():
        assert file in {uri(p) for p in added}, f"a valid file was set aside: {file}: {note['reason']}"
        assert note["reason"].strip(), file

    assert valid_events[case.feed] <= events(lake, feed), "events of the valid landing are missing"
    for layer in ("current", "history"):
        assert layer_rows(lake, layer, feed), f"{layer} is empty"
    assert materialisation_metadata(instance, feed)["reconciled"] is True
    if case.complete is not None:
        assert landing_complete_passed(instance, feed) is case.complete


def test_a_copy_named_like_a_note_in_an_older_lake_is_not_taken_for_one(tmp_path):
    """Before copies were renamed, a landed `x.reason.json` was copied under that name beside its
    note `x.reason.json.reason.json`; status read the copy as a note and failed. A note whose
    copy failed stands alone and is still a note."""
    folder = tmp_path / "_quarantine" / "unit" / "accounts" / "2024-03-01-02"
    (folder / "a1").mkdir(parents=True)
    (folder / "a1" / "x.reason.json").write_text('{"rows": 999}')
    (folder / "a1" / "x.reason.json.reason.json").write_text('{"file": "f", "reason": "r"}')
    (folder / "b2").mkdir()
    (folder / "b2" / "y.parquet.reason.json").write_text('{"file": "g", "reason": "copy failed"}')

    notes = notes_under(Storage(), f"file://{tmp_path / '_quarantine'}")

    assert sorted(e.name for e in notes) == ["x.reason.json.reason.json", "y.parquet.reason.json"]


#: a folder of each feed's valid landing whose files a run reads
_READ_FOLDER = {
    "unit": unit_hour,
    "grax": lambda landing: grax_batch(landing, "000000002"),
    "flow": lambda landing: flow_journal(landing) / "utc_date=2024-06-01/utc_hour=10",
}


@pytest.mark.parametrize("feed_name", sorted(FEEDS))
def test_a_file_the_run_may_not_read_is_reported_and_the_files_beside_it_are_read(
    feed_name, valid_events, spark, tmp_path, monkeypatch
):
    """A landed file the run's user may not read (another owner's mode 600) is reported with
    that cause, and the rest of its partition is read: it never fails the table's catalog step.
    The tests run as root, which may read any file, so the kernel's answer (`os.access`) is
    stood in for, for that one file."""
    denied_name = "part-denied.parquet"
    real_access = os.access
    monkeypatch.setattr(
        os,
        "access",
        lambda path, mode, **kw: Path(path).name != denied_name and real_access(path, mode, **kw),
    )

    def add(landing: Path) -> list[Path]:
        return [good_unit_file(_READ_FOLDER[feed_name](landing) / denied_name)]

    code, lake, _, (denied,) = run_cli(tmp_path, feed_name, add, monkeypatch)

    assert code == 0
    assert "may not read it (permission denied)" in quarantine_notes(lake)[uri(denied)]["reason"]
    assert valid_events[feed_name] <= events(lake, FEEDS[feed_name])


def test_a_copy_that_fails_leaves_no_earlier_copy_to_pass_for_it(tmp_path):
    """A file set aside again whose copy fails (gone when read) must not leave an earlier run's
    copy of its earlier bytes in its place: the run tells a file it could not copy by its
    missing copy, and keeps it out of the partition's processed note."""
    from lake_assets.paths import LakeLayout
    from lake_assets.quarantine import Quarantined, quarantine_file

    landed = good_unit_file(unit_hour(tmp_path / "landing") / "part-0.parquet")
    storage, layout = Storage(), LakeLayout(f"file://{tmp_path / 'lake'}")

    def set_aside() -> str:
        item = Quarantined(uri(landed), "a reason")
        return quarantine_file(storage, layout, "unit", "accounts", "2024-03-01-02", item, None)

    assert storage.exists(set_aside())
    landed.unlink()
    copy = set_aside()
    assert not storage.exists(copy)
    assert "copy failed" in storage.read_bytes(copy + ".reason.json").decode()


@pytest.mark.parametrize("feed_name", sorted(FEEDS))
def test_a_landing_that_lists_empty_leaves_the_change_log_as_it_was(
    feed_name, spark, tmp_path, monkeypatch, capsys
):
    """A share that is not mounted (its mount point lists empty) looks like every file removed:
    `run` fails naming the table, and `changes` keeps every row it read, whichever the feed."""
    feed = FEEDS[feed_name]
    code, lake, _, _ = run_cli(tmp_path, feed_name, None, monkeypatch)
    assert code == 0
    stored = events(lake, feed)
    landing = tmp_path / "landing"
    for child in list(landing.iterdir()):
        shutil.rmtree(child)
    capsys.readouterr()
    config = str(tmp_path / f"{feed_name}.yaml")
    assert main(["run", "--config", config]) == 1
    said = capsys.readouterr()
    assert (
        f"{feed_name}/{feed.table}: the landing file://{landing} lists none of the files"
        in said.out + said.err
    )
    assert events(lake, feed) == stored


def test_a_good_fragment_a_damaged_one_claims_the_start_of_is_read_not_set_aside(
    valid_events, spark, tmp_path, monkeypatch
):
    """The damaged fragment claims the good one's range and ten bytes of the next fragment's,
    so the first cover reads that one from ten bytes in, inside a document. Set aside for it,
    a good fragment went to quarantine, its documents out of `changes`; judged again on the
    cover without the damaged fragment, it is read whole."""
    after = flow_doc(20) + flow_doc(21)

    def add(landing: Path) -> list[Path]:
        return [
            *garbage_fragment_over_the_good_one(landing),
            write_flow_fragment(flow_journal(landing), valid_length(), after),
        ]

    code, lake, _, (damaged, good) = run_cli(tmp_path, "flow", add, monkeypatch)
    notes = quarantine_notes(lake)
    assert code == 0 and uri(damaged) in notes
    assert uri(good) not in notes, notes.get(uri(good))
    assert {20, 21} <= {int(row["id"]) for row in layer_rows(lake, "changes", FEEDS["flow"])}
    assert valid_events["flow"] <= events(lake, FEEDS["flow"])
