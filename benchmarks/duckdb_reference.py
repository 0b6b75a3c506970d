"""The hand-written alternative: recompute `current` and `history` from every landed Unit file
with DuckDB on one machine, and check the lake against it.

This is the baseline a single-machine user would write, so it is deliberately a full recompute
(one pass over all files, window functions per key) with no incremental state. It follows
docs/semantics.md directly, with the same reading of it as `lake_assets_tests/reference.py`;
it shares no code with the engine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import duckdb

KEY = "id"
SPECIAL = ("cdc_operation_type", "cdc_change_seq", "cdc_commit_timestamp")
END_OF_TIME = "TIMESTAMPTZ '9999-12-31 23:59:59.999+00'"
TIMELINE = "__unit_reference_timeline"

OPERATIONS = {
    "INSERT": "insert",
    "I": "insert",
    "UPDATE": "update",
    "U": "update",
    "DELETE": "delete",
    "D": "delete",
}
CURRENT_SYSTEM = ("_version_at", "_seq")
HISTORY_SYSTEM = ("_fivetran_start", "_fivetran_end", "_fivetran_active", "_seq")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _local(path: Path | str) -> str:
    # The project names lake roots as URIs; DuckDB wants a plain path for local files.
    text = str(path)
    return text[len("file://") :] if text.startswith("file://") else text


def _reader(glob: str) -> str:
    # Hive columns (year=/month=/...) are folder names, not data: never let them become payload.
    return f"read_parquet({_literal(glob)}, union_by_name=true, hive_partitioning=false)"


def _timeline_sql(source: str, payload: list[str]) -> str:
    columns = ", ".join(_ident(c) for c in payload)
    ops = " ".join(f"WHEN {_literal(spelling)} THEN {_literal(op)}" for spelling, op in OPERATIONS.items())
    return f"""
    WITH events AS (
        SELECT
            {_ident(KEY)} AS id,
            {columns}{"," if payload else ""}
            CASE upper(trim(cdc_operation_type)) {ops}
                ELSE error('unknown cdc_operation_type: ' || coalesce(cdc_operation_type, 'NULL')) END AS op,
            -- Naive timestamps read as UTC (the session time zone): that is what the feed assumes.
            date_trunc('millisecond', CAST(cdc_commit_timestamp AS TIMESTAMPTZ)) AS version_at,
            CAST(cdc_change_seq AS BIGINT) AS seq
        FROM {source}
    ),
    versions AS (
        -- One row per key and millisecond. This single rule drops identical duplicates and
        -- settles several writes of one version (the greatest sequence wins).
        SELECT * FROM events
        QUALIFY row_number() OVER (PARTITION BY id, version_at ORDER BY seq DESC) = 1
    )
    SELECT *,
        lead(version_at) OVER by_key AS next_at,
        lead(op) OVER by_key AS next_op
    FROM versions
    WINDOW by_key AS (PARTITION BY id ORDER BY version_at)
    """


def recompute(
    landing_dir: Path, table: str, out_dir: Path, con: duckdb.DuckDBPyConnection | None = None
) -> dict:
    """Recompute `current` and `history` of a Unit table from all its landed files.

    Writes `out_dir/current.parquet` (id, payload, `_version_at`, `_seq`) and
    `out_dir/history.parquet` (id, payload, `_fivetran_start`, `_fivetran_end`,
    `_fivetran_active`, `_seq`), timestamps as TIMESTAMPTZ in UTC, and returns row counts and
    the wall time. Payload = every column but `id` and the `cdc_*` columns.
    """
    own = con is None
    if con is None:
        con = duckdb.connect()
    started = time.perf_counter()
    try:
        con.execute("SET TimeZone='UTC'")
        source = _reader(f"{_local(landing_dir)}/{table}/**/*.parquet")
        columns = [row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()]
        payload = [c for c in columns if c not in (KEY, *SPECIAL)]
        # Materialised once: both outputs come from the same per-key timeline.
        con.execute(f"CREATE OR REPLACE TEMP TABLE {TIMELINE} AS {_timeline_sql(source, payload)}")

        out = Path(_local(out_dir))
        out.mkdir(parents=True, exist_ok=True)
        values = "".join(f", {_ident(c)}" for c in payload)
        history = f"""
            SELECT id{values},
                version_at AS _fivetran_start,
                CASE WHEN next_at IS NULL THEN {END_OF_TIME}
                     WHEN next_op = 'delete' THEN next_at
                     ELSE next_at - INTERVAL 1 MILLISECOND END AS _fivetran_end,
                next_at IS NULL AS _fivetran_active,
                seq AS _seq
            FROM {TIMELINE} WHERE op <> 'delete' ORDER BY id, _fivetran_start
        """
        current = f"""
            SELECT id{values}, version_at AS _version_at, seq AS _seq
            FROM {TIMELINE} WHERE op <> 'delete' AND next_at IS NULL ORDER BY id
        """
        con.execute(f"COPY ({history}) TO {_literal(str(out / 'history.parquet'))} (FORMAT parquet)")
        con.execute(f"COPY ({current}) TO {_literal(str(out / 'current.parquet'))} (FORMAT parquet)")
        counts = _row(
            con,
            f"""SELECT count(*) FILTER (WHERE op <> 'delete'),
                       count(*) FILTER (WHERE op <> 'delete' AND next_at IS NULL),
                       count(*)
                FROM {TIMELINE}""",
        )
        source_rows = _row(con, f"SELECT count(*) FROM {source}")[0]
        con.execute(f"DROP TABLE IF EXISTS {TIMELINE}")
        return {
            "source_rows": source_rows,
            "events": counts[2],
            "history": counts[0],
            "current": counts[1],
            "payload": payload,
            "seconds": round(time.perf_counter() - started, 3),
        }
    finally:
        if own:
            con.close()


def _row(con: duckdb.DuckDBPyConnection, sql: str) -> tuple:
    """The one row of an aggregate query."""
    row = con.execute(sql).fetchone()
    if row is None:
        raise RuntimeError(f"no row from: {sql}")
    return row


def _diff(con: duckdb.DuckDBPyConnection, reference: str, lake_dir: Path, columns: list[str]) -> dict:
    """Row-for-row comparison as multisets: rows only in the reference, rows only in the lake."""
    described = con.execute(f"DESCRIBE SELECT * FROM read_parquet({_literal(reference)})").fetchall()
    types = {row[0]: row[1] for row in described}
    wanted = ", ".join(_ident(c) for c in columns)
    ref_sql = f"SELECT {wanted} FROM read_parquet({_literal(reference)})"
    if lake_dir.is_dir() and any(lake_dir.rglob("*.parquet")):
        # Cast to the reference's types so Spark's encodings (INT96 or naive timestamps, other
        # integer widths) compare by value, not by type.
        cast = ", ".join(f"CAST({_ident(c)} AS {types[c]}) AS {_ident(c)}" for c in columns)
        lake_sql = f"SELECT {cast} FROM {_reader(str(lake_dir / '**' / '*.parquet'))}"
    else:
        lake_sql = f"{ref_sql} WHERE false"  # an absent table is empty, so every row is missing
    rows = _row(con, f"SELECT count(*) FROM ({ref_sql})")[0]
    lake_rows = _row(con, f"SELECT count(*) FROM ({lake_sql})")[0]
    missing = _row(con, f"SELECT count(*) FROM ({ref_sql} EXCEPT ALL {lake_sql})")[0]
    extra = _row(con, f"SELECT count(*) FROM ({lake_sql} EXCEPT ALL {ref_sql})")[0]
    return {"rows": rows, "lake_rows": lake_rows, "missing": missing, "extra": extra}


def compare_with_lake(
    reference_dir: Path,
    lake_root: Path,
    feed: str,
    table: str,
    payload: list[str],
    con: duckdb.DuckDBPyConnection | None = None,
) -> dict:
    """Compare the lake's `current` and `history` of a table with `recompute`'s output.

    Compares id, `payload`, and the version columns (`_version_at`, `_seq` for current; the
    `_fivetran_*` window and `_seq` for history) as multisets, ignoring write-time and
    bookkeeping columns (`_fivetran_synced`, `_source_file`, `_op`, ...). Returns per table the
    reference row count, lake row count, rows missing from the lake and extra rows in it, and
    whether both tables are equal.
    """
    root = Path(_local(lake_root))
    reference = Path(_local(reference_dir))
    own = con is None
    if con is None:
        con = duckdb.connect()
    try:
        con.execute("SET TimeZone='UTC'")
        result: dict[str, Any] = {}
        for name, system in (("current", CURRENT_SYSTEM), ("history", HISTORY_SYSTEM)):
            lake_dir = root / name / feed / table
            columns = [KEY, *payload, *system]
            result[name] = _diff(con, str(reference / f"{name}.parquet"), lake_dir, columns)
        result["equal"] = all(result[n]["missing"] == 0 == result[n]["extra"] for n in ("current", "history"))
        return result
    finally:
        if own:
            con.close()
