"""Small valid landings of each feed, the hostile files added on top of them, and the check that
nothing landed was lost (used by `test_hostile_input`).

A landing here is a handful of rows per feed, enough for every layer to have content and small
enough that one `lake-assets run` over it takes seconds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from lake_assets.config import CollectionConfig, FeedConfig, LakeConfig, dump_config
from lake_assets.demo.flow_sample import build_uuid, clock_of
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, hour_dir, write_events

UTC = dt.UTC
GRAX_ORG = "00Dhostile"
FLOW_COLLECTION = "acmeCo/customers"
FLOW_TABLE = "acmeco_customers"
FLOW_HOUR = dt.datetime(2024, 6, 1, 10, 5, tzinfo=UTC)
FLOW_PRODUCER = bytes.fromhex("0a0b0c0d0e0f")


@dataclasses.dataclass(frozen=True)
class Feed:
    """One feed's valid landing: how to write it, its configuration, and how to name its rows."""

    name: str
    table: str
    write_valid: Callable[[Path], None]
    config: Callable[[Path], FeedConfig]
    #: the columns that identify one change event in `changes`
    event_identity: tuple[str, ...]


# --- Unit CDC ----------------------------------------------------------------------------------


def write_unit_valid(landing: Path) -> None:
    write_events(
        landing,
        "accounts",
        1,
        "part-0.parquet",
        [
            event("a", "I", 1, at(1), name="Ann", balance=10),
            event("b", "I", 2, at(1, 5), name="Bob", balance=20),
        ],
        ACCOUNT_SCHEMA,
    )
    write_events(
        landing,
        "accounts",
        2,
        "part-0.parquet",
        [
            event("a", "U", 3, at(2), name="Anna", balance=11),
            event("c", "I", 4, at(2, 1), name="Cy", balance=30),
        ],
        ACCOUNT_SCHEMA,
    )
    write_events(
        landing,
        "accounts",
        3,
        "part-0.parquet",
        [
            event("b", "D", 5, at(3), name="Bob", balance=20),
            event("a", "U", 6, at(3, 2), name="Annie", balance=12),
        ],
        ACCOUNT_SCHEMA,
    )


def unit_hour(landing: Path, hour: int = 2) -> Path:
    return hour_dir(landing, "accounts", hour)


def write_parquet(path: Path, rows: list[dict] | pa.Table, schema: pa.Schema | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows, schema=schema), path)
    return path


# --- GRAX Data Lake v2 -------------------------------------------------------------------------


def garble_data_pages(path: Path) -> Path:
    """Overwrite the data pages of a Parquet file, its footer left as it was: the file opens,
    and Spark fails only as it reads the rows."""
    footer = pq.ParquetFile(path).metadata
    data = bytearray(path.read_bytes())
    for group in range(footer.num_row_groups):
        for column in range(footer.num_columns):
            chunk = footer.row_group(group).column(column)
            start = chunk.dictionary_page_offset or chunk.data_page_offset  # the chunk's first page
            data[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(data))
    return path


#: in a footer (Thrift compact encoding), the start of an INT64 column chunk's metadata: the
#: chunk's `meta_data` field (struct), then its `type` field (i32) holding INT64 (2, zigzagged 4)
_INT64_CHUNK_METADATA = b"\x1c\x15\x04"


def contradict_a_column_chunk_type(path: Path) -> Path:
    """Make the first INT64 column chunk's metadata claim INT32, which its schema contradicts:
    pyarrow (26) ends the process that reads that chunk's statistics (`std::terminate`)."""
    data = path.read_bytes()
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    at = data.index(_INT64_CHUNK_METADATA, footer_start)
    path.write_bytes(data[:at] + b"\x1c\x15\x02" + data[at + len(_INT64_CHUNK_METADATA) :])
    return path


def grax_time(hour: int) -> dt.datetime:
    return dt.datetime(2024, 1, 1, hour, tzinfo=UTC)


GRAX_SCHEMA = pa.schema(
    [
        ("Id", pa.string()),
        ("source__modified", pa.timestamp("ms", tz="UTC")),
        ("grax__idseq", pa.string()),
        ("Name", pa.string()),
    ]
)


def grax_batch(landing: Path, batch: str, obj: str = "Account") -> Path:
    return landing / "parquet" / "v2" / f"org={GRAX_ORG}" / f"object={obj}" / f"batch={batch}"


def write_grax_valid(landing: Path) -> None:
    write_parquet(
        grax_batch(landing, "000000001") / "data-00000000001.parquet",
        [
            {"Id": "1", "source__modified": grax_time(1), "grax__idseq": "a", "Name": "Alice"},
            {"Id": "2", "source__modified": grax_time(2), "grax__idseq": "b", "Name": "Bob"},
        ],
        GRAX_SCHEMA,
    )
    write_parquet(
        grax_batch(landing, "000000002") / "data-00000000002.parquet",
        [
            {"Id": "1", "source__modified": grax_time(3), "grax__idseq": "c", "Name": "Alicia"},
            {"Id": "3", "source__modified": grax_time(4), "grax__idseq": "d", "Name": "Cleo"},
        ],
        GRAX_SCHEMA,
    )


# --- Estuary Flow journals ---------------------------------------------------------------------


def flow_doc(n: int, **fields) -> bytes:
    doc = {
        "id": n,
        "name": f"c{n}",
        **fields,
        "_meta": {"uuid": build_uuid(clock_of(FLOW_HOUR) + 16 * n, 0, FLOW_PRODUCER), "op": "c"},
    }
    return json.dumps(doc).encode() + b"\n"


def flow_journal(landing: Path) -> Path:
    return landing / "acmeCo" / "customers" / "pivot=00"


def write_flow_fragment(
    journal: Path,
    begin: int,
    content: bytes,
    *,
    stored: bytes | None = None,
    folder: str = "utc_date=2024-06-01/utc_hour=10",
    end: int | None = None,
) -> Path:
    """A gzip fragment of `content` at offset `begin` (`stored` replaces the compressed bytes;
    `end` lets a name claim another range than its content's)."""
    target = journal / folder
    target.mkdir(parents=True, exist_ok=True)
    end = begin + len(content) if end is None else end
    path = target / f"{begin:016x}-{end:016x}-{hashlib.sha1(content).hexdigest()}.gz"
    path.write_bytes(gzip.compress(content) if stored is None else stored)
    return path


FLOW_VALID_DOCS = (1, 2, 3)


def flow_valid_content() -> bytes:
    return b"".join(flow_doc(n) for n in FLOW_VALID_DOCS)


def write_flow_valid(landing: Path) -> None:
    write_flow_fragment(flow_journal(landing), 0, flow_valid_content())


FEEDS = {
    "unit": Feed(
        "unit",
        "accounts",
        write_unit_valid,
        lambda landing: FeedConfig(name="unit", format="unit_cdc", landing=f"file://{landing}"),
        ("id", "_seq"),
    ),
    "grax": Feed(
        "grax",
        f"{GRAX_ORG}/account",
        write_grax_valid,
        lambda landing: FeedConfig(name="grax", format="grax_v2", landing=f"file://{landing}"),
        ("Id", "_version_at", "_seq", "_op"),
    ),
    "flow": Feed(
        "flow",
        FLOW_TABLE,
        write_flow_valid,
        lambda landing: FeedConfig(
            name="flow",
            format="flow_journal",
            landing=f"file://{landing}",
            collections=(CollectionConfig(name=FLOW_COLLECTION, key=("/id",)),),
        ),
        ("id", "_seq"),
    ),
}


# --- running and reading a lake ----------------------------------------------------------------


def links_to_a_tree_beside_a_real_folder(
    data_file: Path, tree: Path, misplaced: Path
) -> tuple[list[Path], Path]:
    """Beside a landed file that a run reads: a link to a folder tree elsewhere (a share's root,
    holding copies of the file), a real folder holding another copy and another link to the
    tree, and a link to the tree at `misplaced`, where the layout reads no files. Returns (the
    links, the copy in the real folder)."""
    for n in range(3):
        (tree / f"d{n}").mkdir(parents=True)
        (tree / f"d{n}" / data_file.name).write_bytes(data_file.read_bytes())
    nested = data_file.parent / "retry" / data_file.name
    nested.parent.mkdir()
    nested.write_bytes(data_file.read_bytes())
    links = [data_file.parent / "share", nested.parent / "share", misplaced]
    misplaced.parent.mkdir(parents=True, exist_ok=True)
    for link in links:
        link.symlink_to(tree, target_is_directory=True)
    return links, nested


def write_config(root: Path, feed: Feed, landing: Path, lake: Path) -> Path:
    path = root / f"{feed.name}.yaml"
    path.write_text(dump_config(LakeConfig(lake=f"file://{lake}", feeds=(feed.config(landing),))))
    return path


def duck(sql: str) -> list[dict]:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def layer_rows(lake: Path, layer: str, feed: Feed) -> list[dict]:
    """A layer's rows as DuckDB reads them (so the table must be readable by another engine)."""
    folder = lake / layer / feed.name / feed.table
    if not folder.exists():
        return []
    return duck(
        f"SELECT * FROM read_parquet('{folder}/**/*.parquet', union_by_name = true, hive_partitioning = true)"
    )


def events(lake: Path, feed: Feed) -> set[tuple]:
    return {tuple(str(row.get(c)) for c in feed.event_identity) for row in layer_rows(lake, "changes", feed)}


def quarantine_notes(lake: Path) -> dict[str, dict]:
    """Landed file URI -> its quarantine note."""
    notes = {}
    for path in (lake / "_quarantine").rglob("*.reason.json"):
        note = json.loads(path.read_text())
        notes[note["file"]] = note
    return notes


def materialisation_metadata(instance: dg.DagsterInstance, feed: Feed, layer: str = "changes") -> dict:
    event = instance.get_latest_materialization_event(dg.AssetKey([feed.name, *feed.table.split("/"), layer]))
    materialization = event.asset_materialization if event is not None else None
    assert materialization is not None, f"{feed.name}/{feed.table}/{layer} was never materialised"
    return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}


def landing_complete_passed(instance: dg.DagsterInstance, feed: Feed) -> bool:
    key = dg.AssetCheckKey(dg.AssetKey([feed.name, *feed.table.split("/"), "changes"]), "landing_complete")
    executions = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])
    entry = next(iter(executions.values())).event
    evaluation = entry.dagster_event.event_specific_data if entry and entry.dagster_event else None
    assert isinstance(evaluation, dg.AssetCheckEvaluation), evaluation
    return evaluation.passed
