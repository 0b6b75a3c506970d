"""The GRAX Data Lake v2 sample generator: layout, per-file schemas, and every promised messiness.

Pure pyarrow: no Spark, no Dagster.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lake_assets.demo.grax_sample import FIELDS, GraxSample, write_grax_landing

SYSTEM = (
    "Id",
    "source__modified",
    "grax__idseq",
    "grax__deleted",
    "grax__deletesource",
    "grax__purged",
    "grax__restoredfrom",
)
PATH = re.compile(
    r"^parquet/v2/org=(?P<org>[A-Za-z0-9]+)/object=(?P<object>[A-Za-z0-9_]+)"
    r"/batch=(?P<batch>[0-9a-f]{9})/data-(?P<name>[0-9a-f]{11})\.parquet$"
)
START_SECONDS = int(dt.datetime(2024, 3, 1, tzinfo=dt.UTC).timestamp())
TS_MS = pa.timestamp("ms", tz="UTC")
SUFFIX_TYPES = {
    "_b": pa.bool_(),
    "_i": pa.int64(),
    "_f": pa.float64(),
    "_ts": TS_MS,
    "_d": pa.date32(),
    "_t": pa.time64("us"),
}


@pytest.fixture(scope="module", params=[(11, 6), (3, 4), (29, 9)], ids=lambda p: f"seed{p[0]}-batches{p[1]}")
def sample(request, tmp_path_factory) -> GraxSample:
    seed, batches = request.param
    return write_grax_landing(tmp_path_factory.mktemp(f"grax{seed}"), seed=seed, batches=batches)


def _parts(sample: GraxSample, path) -> dict:
    match = PATH.match(path.relative_to(sample.landing_dir).as_posix())
    assert match, path
    return match.groupdict()


def _files_of(sample: GraxSample, obj: str) -> list:
    return [f for f in sample.files if _parts(sample, f)["object"] == obj]


def _fields(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in SYSTEM}


def _placed(sample: GraxSample, obj: str) -> list[tuple[int, int, dict]]:
    """(file index, batch index, row) for every row of an object, in writing order."""
    batch_index = {key: i for i, key in enumerate(sample.batches[obj])}
    out = []
    for index, path in enumerate(_files_of(sample, obj)):
        batch = batch_index[_parts(sample, path)["batch"]]
        for row in pq.read_table(path).to_pylist():
            out.append((index, batch, {k: v for k, v in row.items() if v is not None}))
    return out


def _key(row: dict) -> tuple:
    return row["Id"], row["source__modified"], row["grax__idseq"]


def _first_writes(sample: GraxSample, obj: str) -> list[tuple[int, dict]]:
    """(batch index, row) for the first placement of every distinct write (duplicates left out)."""
    seen, out = set(), []
    for _file, batch, row in _placed(sample, obj):
        if _key(row) not in seen:
            seen.add(_key(row))
            out.append((batch, row))
    return out


def test_layout_and_names(sample):
    on_disk = sorted(p for p in sample.landing_dir.rglob("*") if p.is_file())
    assert on_disk == sorted(sample.files)
    assert re.fullmatch(r"[A-Za-z0-9]+", sample.org)
    assert len(sample.objects) >= 3
    for obj in sample.objects:
        files = _files_of(sample, obj)
        parts = [_parts(sample, f) for f in files]
        assert {p["org"] for p in parts} == {sample.org}
        keys = [(int(p["batch"], 16), int(p["name"], 16)) for p in parts]
        assert keys == sorted(keys) and len(set(keys)) == len(keys), "files listed in writing order"
        names = [name for _batch, name in keys]
        assert all(a < b for a, b in itertools.pairwise(names)), "file names strictly increase across batches"
        batch_keys = sorted({p["batch"] for p in parts})
        assert sample.batches[obj] == batch_keys
        numbers = [int(k, 16) for k in batch_keys]
        assert numbers == [START_SECONDS + 43_200 * i for i in range(len(numbers))], (
            "12-hour windows from 2024-03-01"
        )
        for batch_key in batch_keys:
            in_batch = [int(p["name"], 16) for p in parts if p["batch"] == batch_key]
            assert 1 <= len(in_batch) <= 3
            start_ms = int(batch_key, 16) * 1000
            assert all(start_ms <= ms < start_ms + 43_200_000 for ms in in_batch)


def test_each_file_has_its_own_schema(sample):
    null_type_files = typed_null_files = 0
    schemas = set()
    for path in sample.files:
        table = pq.read_table(path)
        schemas.add(tuple(table.schema.names))
        empty = [name for name in table.column_names if table.column(name).null_count == table.num_rows]
        assert len(empty) <= 1, (path, empty)
        for name in ("Id", "source__modified", "grax__idseq"):
            assert table.column(name).null_count == 0
        for field in table.schema:
            if field.name in ("source__modified", "grax__deleted", "grax__purged"):
                assert field.type == TS_MS
            elif field.name in SYSTEM or pa.types.is_null(field.type):
                assert field.type in (pa.string(), pa.null())
            else:
                suffix = next(
                    (
                        s
                        for s in SUFFIX_TYPES
                        if field.name.endswith(s) and field.name[: -len(s)] in table.column_names
                    ),
                    None,
                )
                if suffix is None and field.name not in empty:
                    assert field.type == pa.string(), field
                elif suffix is not None:
                    assert field.type == SUFFIX_TYPES[suffix], field
        if empty:
            if pa.types.is_null(table.schema.field(empty[0]).type):
                null_type_files += 1
            else:
                typed_null_files += 1
        written = {k for row in table.to_pylist() for k, v in row.items() if v is not None}
        assert written == set(table.column_names) - set(empty)
    assert null_type_files and typed_null_files
    assert len(schemas) > len(sample.objects), "schemas vary between files of an object"


def test_files_read_back_exactly_as_rows(sample):
    for obj in sample.objects:
        assert [row for _f, _b, row in _placed(sample, obj)] == sample.rows[obj]
        assert 40 <= len({r["Id"] for r in sample.rows[obj]}) <= 80


def test_idseq_orders_the_writes_of_an_id(sample):
    for obj in sample.objects:
        by_write: dict[tuple, dict] = {}
        by_id = defaultdict(list)
        for row in sample.rows[obj]:
            assert re.fullmatch(r"\d{16}", row["grax__idseq"])
            assert by_write.setdefault((row["Id"], row["grax__idseq"]), row) == row, "one idseq, one row"
            by_id[row["Id"]].append(row)
        for rows in by_id.values():
            latest = max(rows, key=lambda r: r["grax__idseq"])
            assert latest["source__modified"] == max(r["source__modified"] for r in rows)


def test_duplicates_in_later_files(sample):
    for obj in sample.objects:
        first_file, later = {}, 0
        for file_index, _batch, row in _placed(sample, obj):
            if _key(row) in first_file:
                assert first_file[_key(row)] < file_index, "a duplicate lands in a later file"
                later += 1
            else:
                first_file[_key(row)] = file_index
        assert later, obj


def test_several_writes_of_one_version(sample):
    for obj in sample.objects:
        versions = defaultdict(dict)
        for row in sample.rows[obj]:
            if "grax__purged" not in row:
                versions[row["Id"], row["source__modified"]][row["grax__idseq"]] = _fields(row)
        multi = [writes for writes in versions.values() if len(writes) >= 2]
        assert multi, obj
        assert any(len({tuple(sorted(f.items())) for f in writes.values()}) > 1 for writes in multi)


def test_out_of_order_across_and_within_files(sample):
    for obj in sample.objects:
        newest_before: dict[str, dict[int, dt.datetime]] = defaultdict(dict)
        across = within = False
        for file_index, _batch, row in _placed(sample, obj):
            earlier = [m for f, m in newest_before[row["Id"]].items() if f < file_index]
            if earlier and row["source__modified"] < max(earlier):
                across = True
            seen = newest_before[row["Id"]]
            seen[file_index] = max(seen.get(file_index, row["source__modified"]), row["source__modified"])
        for path in _files_of(sample, obj):
            greatest: dict[str, str] = {}
            for row in pq.read_table(path, columns=["Id", "grax__idseq"]).to_pylist():
                if row["grax__idseq"] < greatest.get(row["Id"], ""):
                    within = True
                greatest[row["Id"]] = max(greatest.get(row["Id"], ""), row["grax__idseq"])
        assert across and within, obj


def _switch(batches_of_old: list[int], batches_of_new: list[int]) -> None:
    assert batches_of_old and batches_of_new
    assert max(batches_of_old) < min(batches_of_new)


def test_probability_switches_from_integer_to_float(sample):
    as_int, as_float = [], []
    for batch, row in _first_writes(sample, "Opportunity"):
        assert "Probability" in row
        assert ("Probability_i" in row) != ("Probability_f" in row)
        if "Probability_i" in row:
            assert row["Probability"] == str(row["Probability_i"])
            as_int.append(batch)
        else:
            assert float(row["Probability"]) == row["Probability_f"]
            as_float.append(batch)
    _switch(as_int, as_float)


def test_is_active_switches_from_boolean_to_text(sample):
    as_bool, as_text = [], []
    for batch, row in _first_writes(sample, "Account"):
        if "IsActive__c" not in row:
            continue
        if "IsActive__c_b" in row:
            assert row["IsActive__c"] == ("true" if row["IsActive__c_b"] else "false")
            as_bool.append(batch)
        else:
            assert row["IsActive__c"] in ("yes", "no")
            as_text.append(batch)
    _switch(as_bool, as_text)


def _latest(rows: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for row in rows:
        if row["Id"] not in out or row["grax__idseq"] > out[row["Id"]]["grax__idseq"]:
            out[row["Id"]] = row
    return out


def test_deletes_at_source_and_archives(sample):
    for obj in sample.objects:
        latest = _latest(sample.rows[obj])
        for source in ("source", "grax"):
            gone = [
                r
                for r in latest.values()
                if r.get("grax__deletesource") == source and "grax__purged" not in r
            ]
            assert gone, (obj, source)
            for row in gone:
                assert isinstance(row["grax__deleted"], dt.datetime) and _fields(row)


def test_one_purge_without_field_data(sample):
    purged_ids = {r["Id"] for obj in sample.objects for r in sample.rows[obj] if "grax__purged" in r}
    assert len(purged_ids) == 1
    (purged,) = purged_ids
    placed = [(f, b, r) for obj in sample.objects for f, b, r in _placed(sample, obj) if r["Id"] == purged]
    with_data = [(f, b) for f, b, r in placed if "grax__purged" not in r]
    marked = [(f, b, r) for f, b, r in placed if "grax__purged" in r]
    assert with_data and marked
    for _f, _b, row in marked:
        assert not _fields(row), "a purged write carries no field data"
        assert row["grax__deletesource"] == "grax"
    for _f, _b, r in placed:
        if "grax__purged" not in r:
            assert _fields(r)
    assert max(b for _f, b in with_data) < min(b for _f, b, _r in marked), "data first, in earlier batches"
    # every version of the purged record has a purged write as its greatest idseq
    versions = defaultdict(list)
    for _f, _b, row in placed:
        versions[row["source__modified"]].append(row)
    for rows in versions.values():
        assert "grax__purged" in max(rows, key=lambda r: r["grax__idseq"])


def test_one_restore_of_an_archived_record(sample):
    restored = [(obj, r) for obj in sample.objects for r in sample.rows[obj] if "grax__restoredfrom" in r]
    assert restored
    assert len({r["Id"] for _o, r in restored}) == 1
    obj, first = min(restored, key=lambda p: p[1]["grax__idseq"])
    source_id = first["grax__restoredfrom"]
    assert source_id != first["Id"]
    source_rows = [r for r in sample.rows[obj] if r["Id"] == source_id]
    archive = max(
        (r for r in source_rows if r.get("grax__deletesource") == "grax"), key=lambda r: r["grax__idseq"]
    )
    assert archive["grax__deleted"] < first["source__modified"]
    assert _fields(first) == _fields(archive)
    assert not any(r["Id"] == first["Id"] for r in sample.rows[obj] if "grax__restoredfrom" not in r)


def test_typed_copies_have_their_plain_text_column(sample):
    seen = set()
    for obj in sample.objects:
        bases = {name for name, _kind in FIELDS[obj]}
        for row in sample.rows[obj]:
            for column in row:
                suffix = next(
                    (s for s in SUFFIX_TYPES if column.endswith(s) and column[: -len(s)] in bases), None
                )
                if suffix is not None:
                    assert isinstance(row[column[: -len(suffix)]], str), (column, row)
                    seen.add(column)
                elif column not in SYSTEM:
                    assert column in bases and isinstance(row[column], str), (column, row)
    for column in (
        "LastReviewed__c_ts",
        "Birthdate_d",
        "CloseDate_d",
        "PreferredCallTime__c_t",
        "IsWon_b",
        "Amount_f",
    ):
        assert column in seen
    for obj in sample.objects:
        for row in sample.rows[obj]:
            if "LastReviewed__c_ts" in row:
                assert row["LastReviewed__c_ts"].tzinfo is not None
                assert row["LastReviewed__c"].startswith(
                    row["LastReviewed__c_ts"].strftime("%Y-%m-%dT%H:%M:%S")
                )
            if "Birthdate_d" in row:
                assert row["Birthdate"] == row["Birthdate_d"].isoformat()


def test_deterministic_for_a_seed(tmp_path):
    def snapshot(sample):
        return [p.relative_to(sample.landing_dir).as_posix() for p in sample.files], sample.rows

    a = write_grax_landing(tmp_path / "a", seed=5, batches=4)
    b = write_grax_landing(tmp_path / "b", seed=5, batches=4)
    c = write_grax_landing(tmp_path / "c", seed=6, batches=4)
    assert snapshot(a) == snapshot(b)
    assert snapshot(a) != snapshot(c)
    for path_a, path_b in zip(a.files, b.files, strict=True):
        assert pq.read_table(path_a).equals(pq.read_table(path_b))


def test_needs_four_batches(tmp_path):
    with pytest.raises(ValueError):
        write_grax_landing(tmp_path, batches=3)
