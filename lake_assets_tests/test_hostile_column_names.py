"""Hostile column names in every feed, through the real readers and the whole pipeline
(catalog, changes, fold into current and history, checks):

- payload columns named like the lake's own columns (`_op`, `_source_file`, `_fivetran_start`,
  the partition columns `hour` and `batch`, names starting with `__`) are kept, renamed with the
  documented prefix (`engine.names.RENAMED_PREFIX`), in every layer;
- two columns of one file (or one Flow document) equal ignoring case: that file is quarantined
  naming both; the same column spelled differently in different files is one column;
- backticks, dots, spaces, `=`, `;`, braces, newlines and unicode in names are read and written
  as they are.

Each case lands on its own (a run that crashes on one case must not hide another) and checks
that the run succeeds, refused files are quarantined with a reason naming file and cause, every
good row is in `changes`, `current` and `history`, and the counts reconcile.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import hashlib
import json
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lake_assets.config import CollectionConfig, FeedConfig, LakeConfig
from lake_assets.demo.flow_sample import build_uuid, clock_of
from lake_assets.engine import model as m
from lake_assets.engine.names import RENAMED_PREFIX, lake_name, same_name, vendor_name
from lake_assets.feeds.grax_v2 import GraxV2Format
from lake_assets.ingest import read_batch
from lake_assets.runner import run_feeds
from lake_assets.storage import Storage, data_files

UTC = dt.UTC
ORG = "00Dhostile"

#: payload names the lake uses itself, each with the value the vendor sent in it
RESERVED = [
    "_op",
    "_version_at",
    "_\u017feq",  # a long s: Spark (Java) takes it for `s` ignoring case
    "_unmodified",
    "_purged",
    "_source_file",
    "_\u0131ngested_At",  # a dotless i: Spark takes it for `i` ignoring case
    "_fivetran_start",
    "_fivetran_end",
    "_fivetran_active",
    "_fivetran_synced",
    "hour",
    "batch",
    "__secret",
    "__file_uri",
    "__file_partition",
    "__invalid",
    "__derived",
    # the empty name: Spark's JSON reader drops it
    "",
    # a vendor name that starts with the prefix itself is renamed too, so no two meet
    f"{RENAMED_PREFIX}note",
]
#: Flow's reader passes its own fields along in each document
FLOW_INTERNAL = ["__op", "__clock", "__at", "__uri", "__offset", "__hour"]
ODD = [
    "a`b",
    "a``b`",
    "a.b",
    "a b",
    " lead",
    "x=y",
    "semi;colon",
    "comma,here",
    "{braces}",
    "(parens)",
    "new\nline",
    "tab\there",
    "ünïcødé",
    "日本語",
    "`",
    # Spark's name for a file's metadata (the reader asks for that by its role)
    "_metadata",
    # Spark's JSON reader's default name for lines it cannot parse: it took a Flow field's value
    "_corrupt_record",
]


@dataclasses.dataclass
class Landed:
    """One case, landed and run: the lake, the run's error (None when it succeeded) and the
    materialisation metadata of `changes`."""

    feed: str
    table: str
    key: str
    lake: Path
    error: Exception | None
    instance: dg.DagsterInstance
    asset_prefix: list[str]
    #: Flow: the name each fragment was landed under, by the name the case gave it
    fragment_names: dict[str, str] = dataclasses.field(default_factory=dict)

    def layer(self, layer: str) -> list[dict]:
        folder = self.lake / layer / self.feed / self.table
        if not folder.exists():
            return []
        hive = ", hive_partitioning = true" if layer == "changes" else ""
        # DuckDB: a reader independent of Spark
        query = f"SELECT * FROM read_parquet('{folder}/**/*.parquet', union_by_name = true{hive})"
        cursor = duckdb.connect().execute(query)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def changes_metadata(self) -> dict:
        event = self.instance.get_latest_materialization_event(dg.AssetKey([*self.asset_prefix, "changes"]))
        materialization = event.asset_materialization if event is not None else None
        assert materialization is not None, "changes was never materialised"
        return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}

    def quarantine_notes(self) -> dict[str, str]:
        """file name -> reason, from the `.reason.json` notes in the lake's quarantine."""
        notes = [json.loads(p.read_text()) for p in (self.lake / "_quarantine").rglob("*.reason.json")]
        return {n["file"].rsplit("/", 1)[-1]: n["reason"] for n in notes}


def _run(tmp: Path, feed: FeedConfig, table: str, key: str, asset_prefix: list[str]) -> Landed:
    lake = tmp / "lake"
    instance = dg.DagsterInstance.ephemeral()
    config = LakeConfig(lake=f"file://{lake}", feeds=(feed,))
    try:
        run_feeds(config, instance=instance, say=lambda _: None)
        error = None
    except Exception as exc:  # noqa: BLE001 - the assertion names it
        error = exc
    return Landed(feed.name, table, key, lake, error, instance, asset_prefix)


# --- landing each case in each feed ---------------------------------------------------------


def _unit_file(landing: Path, hour: int, name: str, rows: list[dict]) -> None:
    folder = landing / "cols" / f"year=2024/month=03/day=01/hour={hour:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    events = [
        {
            **row,
            "cdc_operation_type": "U",
            "cdc_change_seq": hour * 100 + i,
            "cdc_commit_timestamp": dt.datetime(2024, 3, 1, hour, i + 1, tzinfo=UTC),
        }
        for i, row in enumerate(rows)
    ]
    pq.write_table(pa.Table.from_pylist(events), folder / name)


def _grax_file(landing: Path, index: int, name: str, rows: list[dict]) -> None:
    batch = f"0{index + 1:x}"
    folder = landing / "parquet" / "v2" / f"org={ORG}" / "object=Cols" / f"batch={batch}"
    folder.mkdir(parents=True, exist_ok=True)
    stamped = [
        {
            **row,
            "source__modified": dt.datetime(2024, 3, 1, index, i + 1, tzinfo=UTC),
            "grax__idseq": f"{batch}{i:04d}",
        }
        for i, row in enumerate(rows)
    ]
    pq.write_table(pa.Table.from_pylist(stamped), folder / name)


PRODUCER = bytes.fromhex("0a0b0c0d0e0f")
FLOW_HOUR = dt.datetime(2024, 6, 1, 10, 5, tzinfo=UTC)


class _Journal:
    """Fragments appended one after the other to one Flow journal."""

    def __init__(self, landing: Path):
        self.folder = landing / "acmeCo" / "cols" / "pivot=00" / "utc_date=2024-06-01" / "utc_hour=10"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.offset = 0
        self.clock = clock_of(FLOW_HOUR)

    def fragment(self, docs: list[dict]) -> str:
        lines = b""
        for source in docs:
            self.clock += 10_000_000  # a second (100 ns units): each document its own version time
            doc = {**source, "_meta": {"uuid": build_uuid(self.clock, 0, PRODUCER), "op": "c"}}
            lines += json.dumps(doc).encode() + b"\n"
        name = f"{self.offset:016x}-{self.offset + len(lines):016x}-{hashlib.sha1(lines).hexdigest()}.gz"
        (self.folder / name).write_bytes(gzip.compress(lines))
        self.offset += len(lines)
        return name


def _land(feed: str, tmp: Path, files: list[tuple[str, list[dict]]]) -> Landed:
    """Land `files` (name, rows keyed by `key`) in one feed, one file (fragment, batch file)
    each, in order, then run the feed. Unit files go to hours 0, 1, ...; GRAX files to batches."""
    landing = tmp / "landing"
    if feed == "unit":
        for hour, (name, rows) in enumerate(files):
            _unit_file(landing, hour, name, [{"id": r.pop("key"), **r} for r in map(dict, rows)])
        return _run(
            tmp,
            FeedConfig(name="unit", format="unit_cdc", landing=f"file://{landing}"),
            "cols",
            "id",
            ["unit", "cols"],
        )
    if feed == "grax":
        for index, (name, rows) in enumerate(files):
            _grax_file(landing, index, name, [{"Id": r.pop("key"), **r} for r in map(dict, rows)])
        return _run(
            tmp,
            FeedConfig(name="grax", format="grax_v2", landing=f"file://{landing}"),
            f"{ORG}/cols",
            "Id",
            ["grax", ORG, "cols"],
        )
    journal = _Journal(landing)
    names = {}
    for name, rows in files:
        names[name] = journal.fragment([{"id": r.pop("key"), **r} for r in map(dict, rows)])
    feed_config = FeedConfig(
        name="flow",
        format="flow_journal",
        landing=f"file://{landing}",
        collections=(CollectionConfig(name="acmeCo/cols", key=("/id",)),),
    )
    return dataclasses.replace(
        _run(tmp, feed_config, "acmeco_cols", "id", ["flow", "acmeco_cols"]), fragment_names=names
    )


FEEDS = ["unit", "grax", "flow"]


def _by_key(rows: list[dict], key: str) -> dict:
    return {str(r[key]): r for r in rows}


def _assert_reconciled(landed: Landed, rows_in: int, quarantined: int) -> None:
    metadata = landed.changes_metadata()
    assert metadata["reconciled"] is True
    assert metadata["rows_in"] == rows_in and metadata["files_quarantined"] == quarantined


# --- reserved names -------------------------------------------------------------------------


@pytest.fixture(scope="module", params=FEEDS)
def reserved(request, tmp_path_factory, spark):
    names = RESERVED + (FLOW_INTERNAL if request.param == "flow" else [])
    rows = [{"key": f"k{i}", **{name: f"{name}={i}" for name in names}} for i in range(2)]
    return _land(
        request.param, tmp_path_factory.mktemp(f"reserved-{request.param}"), [("part-reserved.parquet", rows)]
    ), names


def test_reserved_payload_names_are_kept_renamed_in_every_layer(reserved):
    landed, names = reserved
    assert landed.error is None
    renamed = {name: f"{RENAMED_PREFIX}{name}" for name in names}
    for layer in ("changes", "current", "history"):
        rows = _by_key(landed.layer(layer), landed.key)
        assert sorted(rows) == ["k0", "k1"], layer
        for i in range(2):
            row = rows[f"k{i}"]
            assert {name: row.get(lake_name) for name, lake_name in renamed.items()} == {
                n: f"{n}={i}" for n in names
            }, layer
            if layer != "current":  # the lake's own columns keep their meaning
                assert row["_op"] in ("insert", "update") and isinstance(
                    row.get("_fivetran_start", row.get("_version_at")), dt.datetime
                )
    _assert_reconciled(landed, rows_in=2, quarantined=0)


# --- names equal ignoring case --------------------------------------------------------------


@pytest.fixture(scope="module", params=FEEDS)
def cases(request, tmp_path_factory, spark):
    feed = request.param
    key = "id" if feed != "grax" else "Id"
    other_key = "Id" if feed != "grax" else "id"
    # Spark compares names as Java's `equalsIgnoreCase` does: a dotless i (U+0131) is `i` and the micro
    # sign is the Greek mu to it, not to Python's `lower`
    files = [
        (
            "part-upper.parquet",
            [
                {"key": "a1", "Balance": 1, "item": "w", "\u00b5s": 0},
                {"key": "a2", "Balance": 2, "item": "x", "\u00b5s": 1},
            ],
        ),
        (
            "part-lower.parquet",
            [{"key": "b1", "balance": 10, "Status": "new", "\u0131tem": "y", "\u03bcs": 2}],
        ),
        # a column named like the key but for its case: Spark cannot tell them apart
        ("part-both.parquet", [{"key": "c1", other_key: "C1", "balance": 5}]),
        ("part-later.parquet", [{"key": "a1", "balance": 3, "status": "later"}]),
    ]
    landed = _land(feed, tmp_path_factory.mktemp(f"cases-{feed}"), files)
    return landed, key, other_key


def test_names_equal_ignoring_case_are_one_column_across_files_and_refused_within_one(cases):
    landed, key, other_key = cases
    assert landed.error is None
    refused = landed.fragment_names.get("part-both.parquet", "part-both.parquet")
    reasons = landed.quarantine_notes()
    assert set(reasons) == {refused}
    assert (
        f"'{key}'" in reasons[refused] and f"'{other_key}'" in reasons[refused] and "case" in reasons[refused]
    )

    current = _by_key(landed.layer("current"), landed.key)
    assert sorted(current) == ["a1", "a2", "b1"]
    balance = [c for c in next(iter(current.values())) if c.lower() == "balance"]
    status = [c for c in next(iter(current.values())) if c.lower() == "status"]
    assert len(balance) == 1 and len(status) == 1, "one column per name, whatever its case"
    for name, values in (("item", {"a2": "x", "b1": "y"}), ("\u03bcs", {"a2": 1, "b1": 2})):
        spelled = [c for c in next(iter(current.values())) if same_name(c) == same_name(name)]
        assert len(spelled) == 1, spelled
        assert {k: current[k][spelled[0]] for k in values} == values
    assert {k: (r[balance[0]], r[status[0]]) for k, r in current.items()} == {
        "a1": (3, "later"),
        "a2": (2, None),
        "b1": (10, "new"),
    }
    history = sorted((str(r[landed.key]), r[balance[0]]) for r in landed.layer("history"))
    assert history == [("a1", 1), ("a1", 3), ("a2", 2), ("b1", 10)]
    assert len(landed.layer("changes")) == 4
    _assert_reconciled(landed, rows_in=4, quarantined=1)


# --- odd characters -------------------------------------------------------------------------


@pytest.fixture(scope="module", params=FEEDS)
def odd(request, tmp_path_factory, spark):
    rows = [{"key": f"k{i}", **{name: f"{name}={i}" for name in ODD}} for i in range(2)]
    return _land(request.param, tmp_path_factory.mktemp(f"odd-{request.param}"), [("part-odd.parquet", rows)])


def test_odd_characters_in_names_are_read_and_written_as_they_are(odd):
    assert odd.error is None
    for layer in ("changes", "current", "history"):
        rows = _by_key(odd.layer(layer), odd.key)
        assert sorted(rows) == ["k0", "k1"], layer
        for i in range(2):
            assert {name: rows[f"k{i}"].get(name) for name in ODD} == {n: f"{n}={i}" for n in ODD}, layer
    _assert_reconciled(odd, rows_in=2, quarantined=0)


# --- the rule itself ----------------------------------------------------------------------

NAME_PARTS = st.sampled_from(
    [
        "_",
        "__",
        "_src_",
        "_SRC_",
        "src",
        "hour",
        "Hour",
        "batch",
        "_op",
        "_OP",
        "_fivetran_start",
        "id",
        "x",
        "`",
        ".",
        " ",
    ]
)


@given(st.lists(st.lists(NAME_PARTS, max_size=4).map("".join), min_size=1, max_size=8))
def test_lake_names_never_meet_and_never_take_a_reserved_name(vendor):
    distinct = list({same_name(n): n for n in vendor}.values())  # a file's names differ ignoring case
    lake = [lake_name(n) for n in distinct]
    assert len({same_name(n) for n in lake}) == len(lake)
    assert not any(m.is_reserved(n) for n in lake) and all(lake)
    assert [vendor_name(n) for n in lake] == distinct


def test_typed_copies_of_a_reserved_grax_field_stay_its_copies(spark, tmp_path):
    landing = tmp_path / "landing"
    _grax_file(
        landing,
        0,
        "data-1.parquet",
        [
            {"Id": "1", "hour": "7", "hour_i": 7, "__x": "1.5", "__x_f": 1.5, "batch": "b"},
            {"Id": "2", "hour": "8", "hour_i": 8, "__x": "2", "__x_f": 2.0, "batch": None},
        ],
    )
    storage = Storage()
    folder = landing / "parquet" / "v2" / f"org={ORG}" / "object=Cols" / "batch=01"
    batch = read_batch(
        spark, storage, GraxV2Format(), f"{ORG}/cols", {"01": data_files(storage, f"file://{folder}")}
    )
    assert batch.quarantined == [] and batch.reconciles
    types = {f.name: f.dataType.simpleString() for f in batch.events.schema.fields}
    assert (
        types["_src_hour"] == "bigint" and types["_src___x"] == "double" and types["_src_batch"] == "string"
    )
    assert "hour_i" not in types and "_src___x_f" not in types  # folded into their field
    rows = sorted(
        (r["Id"], r["_src_hour"], r["_src_hour__string"], r["_src___x"], r["_src_batch"])
        for r in batch.events.collect()
    )
    assert rows == [("1", 7, "7", 1.5, "b"), ("2", 8, "8", 2.0, None)]


def test_a_struct_with_fields_equal_ignoring_case_is_refused_naming_them(spark, tmp_path):
    landing = tmp_path / "landing"
    _unit_file(landing, 0, "part-good.parquet", [{"id": "a", "address": {"city": "Oslo", "zip": "1"}}])
    _unit_file(landing, 1, "part-nested.parquet", [{"id": "b", "address": {"city": "Rome", "City": "ROME"}}])
    landed = _run(
        tmp_path,
        FeedConfig(name="unit", format="unit_cdc", landing=f"file://{landing}"),
        "cols",
        "id",
        ["unit", "cols"],
    )
    assert landed.error is None
    reasons = landed.quarantine_notes()
    assert (
        list(reasons) == ["part-nested.parquet"]
        and "'address.city' and 'address.City'" in reasons["part-nested.parquet"]
    )
    assert [(r["id"], r["address"]["city"]) for r in landed.layer("current")] == [("a", "Oslo")]
    _assert_reconciled(landed, rows_in=1, quarantined=1)


def test_a_later_run_spelling_a_column_otherwise_folds_into_the_stored_column(spark, tmp_path):
    landing = tmp_path / "landing"
    _unit_file(landing, 0, "part-0.parquet", [{"id": "a", "Balance": 1}, {"id": "b", "Balance": 2}])
    first = _run(
        tmp_path,
        FeedConfig(name="unit", format="unit_cdc", landing=f"file://{landing}"),
        "cols",
        "id",
        ["unit", "cols"],
    )
    assert first.error is None
    _unit_file(landing, 1, "part-1.parquet", [{"id": "a", "balance": 3}, {"id": "c", "balance": 4}])
    landed = _run(
        tmp_path,
        FeedConfig(name="unit", format="unit_cdc", landing=f"file://{landing}"),
        "cols",
        "id",
        ["unit", "cols"],
    )
    assert landed.error is None
    current = landed.layer("current")
    assert [c for c in current[0] if same_name(c) == "balance"] == ["Balance"]  # as the table first met it
    assert sorted((r["id"], r["Balance"]) for r in current) == [("a", 3), ("b", 2), ("c", 4)]
    assert sorted((r["id"], r["Balance"]) for r in landed.layer("history")) == [
        ("a", 1),
        ("a", 3),
        ("b", 2),
        ("c", 4),
    ]


NAMES_SPARK_MAY_TAKE_FOR_ONE = [
    ("item", "ITEM"),
    ("item", "\u0131tem"),  # dotless i
    ("ID", "\u0130d"),  # dotted capital I
    ("sum", "\u017fum"),  # long s
    ("\u00b5s", "\u03bcs"),  # micro sign, Greek mu
    ("\u03c2", "\u03c3"),  # final and medial sigma
    ("\u212a", "k"),  # Kelvin sign
    ("\u01c5", "\u01c6"),  # a title-case digraph
    ("stra\u00dfe", "STRASSE"),  # not one: `ß` has no single upper-case letter
    ("\u00e9", "e"),  # not one: an accent is not a case
]


@pytest.mark.parametrize(("one", "other"), NAMES_SPARK_MAY_TAKE_FOR_ONE)
def test_names_are_the_same_exactly_when_spark_takes_one_for_the_other(spark, one, other):
    """Spark's union by name and `withColumn` compare names with Java's `equalsIgnoreCase`
    (its resolver): two names they take for one must be the same name to the lake, or a file
    holding one beside a file holding the other fails the batch's union, and a vendor column
    `_ingested_at` spelled with a dotless i is overwritten by the lake's `_ingested_at`. (Asking
    for a column by name also needs the names' lower cases equal: it resolves fewer.)"""
    from pyspark.sql import functions as F

    first = spark.range(1).select(F.lit(1).alias(one))
    second = spark.range(1).select(F.lit(2).alias(other))
    taken_for_one = len(first.unionByName(second, allowMissingColumns=True).columns) == 1
    assert (first.withColumn(other, F.lit(3)).columns == [other]) == taken_for_one
    assert (same_name(one) == same_name(other)) == taken_for_one
