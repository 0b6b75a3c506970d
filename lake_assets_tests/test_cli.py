"""`lake-assets run` and `lake-assets demo` as a user runs them."""

import datetime as dt
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from lake_assets.cli import main
from lake_assets.config import FeedConfig, LakeConfig, dump_config
from lake_assets.demo.damaged import TRUNCATED_FILE
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events

pytestmark = pytest.mark.minutes(6)

ROOT = Path(__file__).resolve().parent.parent


def unit_lake_config(tmp_path: Path, landing: Path) -> Path:
    """A config file of one Unit feed over `landing`, its lake in `tmp_path / "lake"`."""
    config = tmp_path / "c.yaml"
    feed = FeedConfig(name="unit", format="unit_cdc", landing=f"file://{landing}")
    config.write_text(dump_config(LakeConfig(lake=f"file://{tmp_path / 'lake'}", feeds=(feed,))))
    return config


def test_run_processes_everything_and_exits_zero(tmp_path, spark, capsys):
    landing = tmp_path / "landing"
    write_events(
        landing,
        "accounts",
        1,
        "part-0.parquet",
        [event("a", "I", 1, at(1), name="x", balance=1)],
        ACCOUNT_SCHEMA,
    )
    write_events(
        landing,
        "accounts",
        7,
        "part-0.parquet",
        [event("a", "U", 2, at(7), name="y", balance=2)],
        ACCOUNT_SCHEMA,
    )
    config = tmp_path / "c.yaml"
    config.write_text(
        dump_config(
            LakeConfig(lake="file:///unused", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),))
        )
    )
    assert main(["run", "--config", str(config), "--lake", f"file://{tmp_path / 'lake'}"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"unit\s+accounts\s+2\s+1\s+2\s+0", out), out
    assert (tmp_path / "lake" / "history" / "unit" / "accounts").is_dir()
    assert main(["status", "--config", str(config), "--lake", f"file://{tmp_path / 'lake'}", "--json"]) == 0
    (status,) = json.loads(capsys.readouterr().out)
    assert (status["current_rows"], status["history_rows"]) == (1, 2)
    assert not Path("/unused").exists()


def damage_open_history(lake: Path, feed: str, table: str) -> Path:
    """Overwrite the one file of a table's open history (which every fold reads) with bytes that
    are not Parquet: damage to the lake's own files, which no run can set aside."""
    (damaged,) = (lake / "history" / feed / table / "active").glob("*.parquet")
    damaged.write_bytes(b"not parquet")
    return damaged


def test_run_fails_with_a_clear_message_and_rebuild_mends_the_table(tmp_path, spark, capsys):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1), flag=True)])
    config = unit_lake_config(tmp_path, landing)
    assert main(["run", "--config", str(config)]) == 0
    damaged = damage_open_history(lake, "unit", "accounts")
    write_events(landing, "accounts", 2, "part-1.parquet", [event("b", "I", 2, at(2), flag=False)])
    capsys.readouterr()

    assert main(["run", "--config", str(config)]) == 1
    out, err = capsys.readouterr()
    assert f"the lake file file://{damaged} cannot be read" in err, err
    assert 'rebuild the table (docs/lake-layout.md, "Rebuilding a table")' in err
    # The summary is printed all the same: the damaged layer's rows are unknown, and why is said.
    assert re.search(r"^unit\s+accounts\s+2\s+1\s+\?\s+0$", out, re.M), out
    assert f"unit/accounts: damaged: the lake file file://{damaged} cannot be read" in out
    assert main(["status", "--config", str(config), "--json"]) == 0
    (status,) = json.loads(capsys.readouterr().out)
    assert (status["current_rows"], status["history_rows"]) == (1, None)
    assert [damage.split(" cannot be read")[0] for damage in status["damaged"]] == [
        f"the lake file file://{damaged}"
    ]

    # The rebuild docs/lake-layout.md gives: the table forgotten but its purge ledger, then a run.
    assert main(["rebuild", "--config", str(config), "--table", "unit/accounts"]) == 0
    out = capsys.readouterr().out
    assert f"lake-assets: removed file://{lake}/history/unit/accounts\n" in out
    assert f"lake-assets: warning: the catalog may still list file://{damaged}: " in out
    assert [p.name for p in (lake / "_state" / "unit" / "accounts").iterdir()] == []
    assert main(["run", "--config", str(config)]) == 0
    current = duckdb.sql(
        f"SELECT id, flag FROM read_parquet('{lake}/current/unit/accounts/*.parquet') ORDER BY id"
    )
    assert current.fetchall() == [("a", True), ("b", False)]
    capsys.readouterr()
    # and the catalog lists no file that is gone
    query = [
        "catalog",
        "query",
        "--config",
        str(config),
        "--what",
        "accounts",
        "--start",
        "0",
        "--end",
        "4102444800000",
    ]
    assert main([*query, "--json"]) == 0
    listed = [record["url"] for record in json.loads(capsys.readouterr().out)]
    assert any("/current/" in url for url in listed) and any("/changes/" in url for url in listed)
    assert [url for url in listed if not Path(url.removeprefix("file://")).exists()] == [f"file://{damaged}"]

    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == 1
    assert "missing.yaml does not exist" in capsys.readouterr().err


def test_a_file_whose_column_the_stored_table_cannot_take_is_set_aside_and_its_hour_folds(
    tmp_path, spark, capsys
):
    """`flag` is stored as a boolean; a later hour's file gives it a struct, which no type holds
    with a boolean. That file is quarantined naming the column, and the hour's other file and
    the next hour fold. Judged by the batch alone, the struct file's three rows would win, the
    two boolean files be set aside, and the fold fail on every run until the file was removed."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1), flag=True)])
    config = unit_lake_config(tmp_path, landing)
    assert main(["run", "--config", str(config)]) == 0
    # Three rows: more than the batch's boolean files hold, so the batch alone would keep them.
    struct_rows = [event(f"b{day}", "I", 1 + day, at(2), flag={"day": day}) for day in range(1, 4)]
    write_events(landing, "accounts", 2, "part-struct.parquet", struct_rows)
    write_events(landing, "accounts", 2, "part-fine.parquet", [event("c", "I", 3, at(2), flag=False)])
    write_events(landing, "accounts", 3, "part-0.parquet", [event("d", "I", 4, at(3), flag=True)])
    capsys.readouterr()

    assert main(["run", "--config", str(config)]) == 0
    assert re.search(r"^unit\s+accounts\s+3\s+3\s+3\s+1$", capsys.readouterr().out, re.M)
    (note,) = (lake / "_quarantine" / "unit" / "accounts" / "2024-03-01-02").rglob("*.reason.json")
    reason = json.loads(note.read_text())
    assert reason["file"].endswith("hour=02/part-struct.parquet")
    assert "the stored table" in reason["reason"] and "column 'flag' has type" in reason["reason"]
    assert "boolean" in reason["reason"] and "struct" in reason["reason"]
    current = duckdb.sql(f"SELECT id FROM read_parquet('{lake}/current/unit/accounts/*.parquet') ORDER BY id")
    assert [row[0] for row in current.fetchall()] == ["a", "c", "d"]


def test_a_failing_table_stops_no_other_table_or_feed_and_every_failure_is_reported(tmp_path, spark, capsys):
    """Feed `a` (tables accounts, customers) then feed `b` (accounts, orders): the lake files of
    `a/accounts` and `b/orders` are damaged, so those two fail; `a/customers` and `b/accounts`
    still take their new rows, and the command names both failures at the end, one line each,
    and exits non-zero."""
    landings = {feed: tmp_path / f"landing-{feed}" for feed in ("a", "b")}
    lake = tmp_path / "lake"
    failing = {("a", "accounts"), ("b", "orders")}
    tables = {"a": ("accounts", "customers"), "b": ("accounts", "orders")}
    for feed, names in tables.items():
        for table in names:
            write_events(
                landings[feed], table, 1, "part-0.parquet", [event(f"{table}-1", "I", 1, at(1), flag=True)]
            )
    config = tmp_path / "c.yaml"
    feeds = tuple(FeedConfig(feed, "unit_cdc", f"file://{landings[feed]}") for feed in tables)
    config.write_text(dump_config(LakeConfig(lake=f"file://{lake}", feeds=feeds)))
    assert main(["run", "--config", str(config)]) == 0
    capsys.readouterr()
    damaged = {(feed, table): damage_open_history(lake, feed, table) for feed, table in failing}
    for feed, names in tables.items():
        for table in names:
            write_events(
                landings[feed], table, 2, "part-1.parquet", [event(f"{table}-2", "I", 2, at(2), flag=False)]
            )

    assert main(["run", "--config", str(config), "--from", "2024-03-01-02", "--to", "2024-03-01-02"]) == 1

    out, err = capsys.readouterr()
    failures = [line for line in err.splitlines() if line.startswith("lake-assets: failed: ")]
    assert len(failures) == 2, err
    for line, (feed, table) in zip(failures, sorted(failing), strict=True):
        assert line.startswith(f"lake-assets: failed: {feed}/{table}: current+history"), line
        assert f"the lake file file://{damaged[feed, table]} cannot be read" in line, line
    for feed, names in tables.items():
        for table in names:
            if (feed, table) in failing:
                continue
            current = duckdb.sql(
                f"SELECT id FROM read_parquet('{lake}/current/{feed}/{table}/*.parquet') ORDER BY id"
            )
            assert [r[0] for r in current.fetchall()] == [f"{table}-1", f"{table}-2"], (feed, table)
    assert re.search(r"^b\s+orders\s+", out, re.M), out  # the summary is printed all the same


def test_hours_before_the_configured_start_are_named_and_the_rest_still_runs(tmp_path, spark, capsys):
    """Hours landed before the feed's pinned `start` are not in its partitions: the command names
    them and exits non-zero (their files are neither read nor quarantined), and the hours from
    `start` on are processed all the same, even those within a day of the early ones."""
    landing = tmp_path / "landing"
    write_events(landing, "accounts", 22, "part-0.parquet", [event("early", "I", 1, at(22))], day=1)
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 2, at(1, day=2))], day=2)
    config = tmp_path / "c.yaml"
    feed = FeedConfig("unit", "unit_cdc", f"file://{landing}", start="2024-03-02-00")
    config.write_text(dump_config(LakeConfig(lake=f"file://{tmp_path / 'lake'}", feeds=(feed,))))

    assert main(["run", "--config", str(config)]) == 1

    err = capsys.readouterr().err
    failures = [line for line in err.splitlines() if line.startswith("lake-assets: failed: ")]
    assert [re.sub(r" \(log: \S+\.log\)$", "", line) for line in failures] == [
        "lake-assets: failed: unit: 1 hour(s) with files lie before the configured start 2024-03-02-00 "
        "(2024-03-01-22 .. 2024-03-01-22), outside the feed's partitions: not processed"
    ], err
    assert all(line.endswith(".log)") for line in failures)  # each failure says where the run's log is
    current = duckdb.sql(
        f"SELECT id FROM read_parquet('{tmp_path}/lake/current/unit/accounts/*.parquet')"
    ).fetchall()
    assert current == [("a",)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The README's demo, in its own process as a user runs it (fresh JVM, ephemeral instance)."""
    root = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    cli = Path(sys.executable).parent / "lake-assets"
    proc = subprocess.run(
        [str(cli), "demo", "--dir", str(root / "demo")],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "demo", proc.stdout


def test_demo_summary_matches_the_tables_on_disk(demo):
    root, stdout = demo
    rows = re.findall(r"^(unit|grax|flow)\s+([\w/]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", stdout, re.M)
    assert sorted({feed for feed, *_ in rows}) == ["flow", "grax", "unit"], stdout
    assert len(rows) >= 8, stdout
    lake = root / "lake"
    for feed, table, changes, current, history, _ in rows:
        for layer, printed in (("changes", changes), ("current", current), ("history", history)):
            glob = f"{lake}/{layer}/{feed}/{table}/**/*.parquet"
            on_disk = duckdb.sql(
                f"SELECT count(*) FROM read_parquet('{glob}', hive_partitioning = true, union_by_name = true)"
            ).fetchall()[0][0]
            assert on_disk == int(printed) > 0, (table, layer)
    assert (root / "lake_assets.yaml").is_file()
    # a driver without S3 writes the lake's files without Hadoop's checksum files beside them
    checksums = [str(path) for path in lake.rglob("*.crc")]
    assert not checksums and any(lake.rglob("*.parquet")), checksums[:5]


def test_the_demo_quarantines_its_truncated_file_and_reads_the_rest_of_the_hour(demo):
    root, stdout = demo
    landing = root / "landing" / "unit"
    damaged = next(landing.rglob(TRUNCATED_FILE))
    table = damaged.relative_to(landing).parts[0]
    quarantined = {
        (feed, name): int(q)
        for feed, name, *_, q in re.findall(
            r"^(unit|grax|flow)\s+([\w/]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", stdout, re.M
        )
    }
    assert quarantined.pop(("unit", table)) == 1, stdout
    assert set(quarantined.values()) == {0}, stdout

    notes = list((root / "lake" / "_quarantine" / "unit" / table).rglob("*.reason.json"))
    assert len(notes) == 1
    note = json.loads(notes[0].read_text())
    assert note["file"] == f"file://{damaged}" and note["reason"].startswith("not a readable Parquet file"), (
        note
    )
    copy = Path(str(notes[0])[: -len(".reason.json")])
    assert copy.read_bytes() == damaged.read_bytes()

    siblings = {f"file://{p}" for p in damaged.parent.glob("*.parquet") if p != damaged}
    changes = f"{root}/lake/changes/unit/{table}/**/*.parquet"
    sources = {
        r[0]
        for r in duckdb.sql(
            f"SELECT DISTINCT _source_file FROM read_parquet('{changes}', union_by_name = true)"
        ).fetchall()
    }
    assert siblings and siblings <= sources and f"file://{damaged}" not in sources


def _catalogued(lake: Path) -> list[dict]:
    glob = f"{lake}/catalog/time_bucket=*/*/*.parquet"
    con = duckdb.connect()
    cur = con.execute(
        f"SELECT url, range_key, meta_hash, meta_start, meta_end FROM read_parquet('{glob}', hive_partitioning = false)"
    )
    return [dict(zip([d[0] for d in cur.description], row, strict=True)) for row in cur.fetchall()]


def test_after_the_demo_every_file_has_one_catalog_record_with_its_hash(demo):
    root, _ = demo
    lake = root / "lake"
    records = _catalogued(lake)
    files = {p for p in (root / "landing").rglob("*") if p.is_file()}
    for layer in ("changes", "current", "history", "_quarantine"):
        files |= {p for p in (lake / layer).rglob("*") if p.is_file() and not p.name.startswith((".", "_"))}
    by_url: dict = {}
    for r in records:
        by_url.setdefault(r["url"], set()).add(r["range_key"])
    assert {f"file://{p}" for p in files} <= set(by_url)
    for path in files:
        assert len(by_url[f"file://{path}"]) == 1, path  # one file, one record (in each bucket it spans)
        hashes = {r["meta_hash"] for r in records if r["url"] == f"file://{path}"}
        assert hashes == {hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()}, path


def test_a_day_query_returns_exactly_the_files_whose_span_touches_it(demo):
    import pyarrow.parquet as pq

    from lake_assets.catalog.parquet_store import ParquetCatalogStore
    from lake_assets.storage import Storage

    root, _ = demo
    landing = root / "landing" / "unit" / "accounts"
    spans = {}
    for path in landing.rglob("*.parquet"):  # the spans, from the data itself (the damaged file has none)
        if path.name == TRUNCATED_FILE:
            continue
        stamps = pq.read_table(path, columns=["cdc_commit_timestamp"]).column(0).to_pylist()
        spans[f"file://{path}"] = (min(stamps), max(stamps))
    day = min(start for start, _ in spans.values()).replace(
        hour=0, minute=0, second=0, microsecond=0
    ) + dt.timedelta(days=1)
    day_end = day + dt.timedelta(days=1) - dt.timedelta(milliseconds=1)
    expected = {url for url, (start, end) in spans.items() if start <= day_end and end >= day}
    store = ParquetCatalogStore(f"file://{root / 'lake' / 'catalog'}", Storage())
    found = store.query_by_time(
        int(day.timestamp() * 1000), int(day_end.timestamp() * 1000), "accounts", "unit"
    )
    assert expected and {r["url"] for r in found if "/landing/" in r["url"]} == expected
    assert len({r["range_key"] for r in found}) == len(found)

    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "lake-assets"),
            "catalog",
            "query",
            "--config",
            str(root / "lake_assets.yaml"),
            "--what",
            "accounts",
            "--where",
            "unit",
            "--start",
            day.isoformat(),
            "--end",
            day_end.isoformat(),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(r["url"] for r in json.loads(proc.stdout)) == sorted(r["url"] for r in found)


def _unit_config(tmp_path: Path, lake: str, extra: str = "") -> Path:
    """A configuration file of one Unit feed whose landing exists (nothing landed in it)."""
    landing = tmp_path / "landing"
    landing.mkdir(exist_ok=True)
    config = tmp_path / "c.yaml"
    config.write_text(
        f"lake: {lake}\nfeeds:\n  - {{name: unit, format: unit_cdc, landing: {landing}{extra}}}\n"
    )
    return config


def test_config_check_prints_the_resolved_configuration_with_credentials_redacted(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXSECRETVALUE")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    config = _unit_config(tmp_path, "s3a://bucket/lake", ", tables: [accounts]")

    assert main(["config", "check", str(config)]) == 0

    out, err = capsys.readouterr()
    assert err == "" and "AKIAEXAMPLEKEY" not in out and "wJalrXSECRETVALUE" not in out
    resolved = yaml.safe_load(out)
    assert resolved["lake"] == "s3a://bucket/lake"
    assert resolved["feeds"] == [
        {
            "name": "unit",
            "format": "unit_cdc",
            "landing": f"file://{tmp_path}/landing",
            "tables": ["accounts"],
            "late_hours": 4,
            "sensor_interval_seconds": 30,
            "watch": True,
            "allow_empty_landing": False,
        }
    ]
    assert resolved["s3"] == {
        "region": "us-east-1",
        "credentials_from_environment": {
            "AWS_ACCESS_KEY_ID": "set (redacted)",
            "AWS_SECRET_ACCESS_KEY": "set (redacted)",
            "AWS_SESSION_TOKEN": "not set",
        },
    }
    assert resolved["catalog"] == {"store": "parquet"}


@pytest.mark.parametrize(
    "extra, line",
    [
        (
            ", late_hours: true",
            "feeds[0].late_hours: expected an integer from 0 to 87,600 (ten years), got true",
        ),
        (", watch: 'off'", "feeds[0].watch: expected true or false, got 'off'"),
        (
            ", colour: blue",
            "feeds[0].colour: unknown key; expected one of name, format, landing, tables, start, "
            "late_hours, sensor_interval_seconds, watch, allow_empty_landing",
        ),
        (
            ", allow_empty_landing: 'yes'",
            "feeds[0].allow_empty_landing: expected true or false, got 'yes'",
        ),
    ],
)
def test_a_configuration_mistake_is_one_line_naming_the_key_and_no_traceback(tmp_path, capsys, extra, line):
    config = _unit_config(tmp_path, f"file://{tmp_path}/lake", extra)
    for argv in (
        ["config", "check", str(config)],
        ["catalog", "query", "--config", str(config), "--what", "accounts", "--work-id", "r"],
    ):
        assert main(argv) == 1
        out, err = capsys.readouterr()
        assert err == f"lake-assets: error: {config}: {line}\n" and out == ""


def test_config_check_refuses_credentials_without_showing_them(tmp_path, capsys):
    config = _unit_config(tmp_path, "s3a://AKIAEXAMPLEKEY:wJalrXSECRETVALUE@bucket/lake")
    with config.open("a") as handle:
        handle.write("spark:\n  conf: {spark.hadoop.fs.s3a.secret.key: wJalrXSECRETVALUE}\n")
    assert main(["config", "check", str(config)]) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert [line.split(": ")[3] for line in lines] == [
        "lake",
        "spark.conf['spark.hadoop.fs.s3a.secret.key']",
    ], err
    assert all("credentials come from the environment (AWS_ACCESS_KEY_ID" in line for line in lines), err
    assert "AKIAEXAMPLEKEY" not in err and "wJalrXSECRETVALUE" not in err and "Traceback" not in err


def test_config_check_refuses_a_landing_that_does_not_exist(tmp_path, capsys):
    config = _unit_config(tmp_path, f"file://{tmp_path}/lake")
    (tmp_path / "landing").rmdir()
    assert main(["config", "check", str(config)]) == 1
    assert (
        capsys.readouterr().err
        == f"lake-assets: error: {config}: feeds[0].landing: file://{tmp_path}/landing does not exist\n"
    )


def test_a_run_over_a_landing_that_does_not_exist_stops_before_it_starts(tmp_path, capsys):
    """A typo in a landing is an error, not "nothing landed" (checked before any Spark or Dagster)."""
    config = _unit_config(tmp_path, f"file://{tmp_path}/lake")
    (tmp_path / "landing").rmdir()
    assert main(["run", "--config", str(config)]) == 1
    _out, err = capsys.readouterr()
    assert (
        err == f"lake-assets: error: {config}: feeds[0].landing: file://{tmp_path}/landing does not exist\n"
    ), err
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["run", "--from", "2024-03-01"],
            "lake-assets run: error: argument --from: '2024-03-01' is neither an hour like 2024-03-01-05 nor a batch id (hex digits)",
        ),
        (
            ["run", "--to", "2024-02-30-00"],
            "lake-assets run: error: argument --to: '2024-02-30-00' is neither an hour like 2024-03-01-05 nor a batch id (hex digits)",
        ),
        (
            ["catalog", "query", "--what", "accounts", "--start", "yesterday", "--end", "0"],
            "lake-assets catalog query: error: argument --start: 'yesterday' is neither an ISO date/time "
            "(2024-03-02, 2024-03-02T05:00:00Z) nor epoch milliseconds",
        ),
        (
            ["catalog", "query", "--what", "accounts", "--start", "0", "--end", "2024-03-02T25:00"],
            "lake-assets catalog query: error: argument --end: '2024-03-02T25:00' is neither an ISO date/time "
            "(2024-03-02, 2024-03-02T05:00:00Z) nor epoch milliseconds",
        ),
        (
            ["run", "--from", "2024-03-02-00", "--to", "2024-03-01-23"],
            "lake-assets: error: --from/--to: 2024-03-02-00 comes after 2024-03-01-23",
        ),
        (["run", "--from", "ff", "--to", "1a"], "lake-assets: error: --from/--to: ff comes after 1a"),
        (["run", "--lake", ""], "lake-assets run: error: argument --lake: an empty value names nothing"),
        (
            ["run", "--from", "2024-03-01-00", "--to", "065e11a80"],
            "lake-assets: error: --from/--to: 2024-03-01-00 and 065e11a80 name different kinds of partitions "
            "(an hour and a GRAX batch)",
        ),
        (
            ["catalog", "query", "--what", "accounts", "--start", "2024-03-02", "--end", "1709251200000"],
            "lake-assets: error: --start/--end: 1709337600000 comes after 1709251200000",
        ),
    ],
)
def test_a_bad_command_line_value_is_one_line_and_exit_code_2(tmp_path, capsys, argv, line):
    config = _unit_config(tmp_path, f"file://{tmp_path}/lake")
    with pytest.raises(SystemExit) as exited:
        main(
            [*argv[:2], "--config", str(config), *argv[2:]]
            if argv[0] == "catalog"
            else [argv[0], "--config", str(config), *argv[1:]]
        )
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == line and "Traceback" not in err


@pytest.mark.parametrize("command", ["run", "status", "discover", "rebuild"])
def test_a_lake_given_by_option_is_refused_as_the_options_not_as_a_key_of_the_file(tmp_path, capsys, command):
    """`--lake` replaces the file's `lake:`: a mistake in it is said as `--lake`'s, and the
    value, which may hold a credential, is not repeated."""
    config = _unit_config(tmp_path, f"file://{tmp_path}/lake")
    table = ["--table", "unit/accounts"] if command == "rebuild" else []
    assert main([command, "--config", str(config), "--lake", "s3a://KEY:pa55word@bucket/lake", *table]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lake-assets: error: --lake: credentials in a URL are refused"), err
    assert "pa55word" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("everything", [True, False], ids=["all", "changed"])
def test_strays_of_a_table_without_partitions_are_named_by_every_run(tmp_path, spark, capsys, everything):
    """A table whose files are all strays has no partition to run, so no run sets them aside:
    each is named with its reason by `run --all` as by a plain run, and the other table runs."""
    landing = tmp_path / "landing"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1))], ACCOUNT_SCHEMA)
    loose = landing / "cards" / "year=2024" / "month=03" / "day=01" / "loose.parquet"
    bad_hour = loose.parent / "hour=99" / "bad-hour.parquet"
    for path in (loose, bad_hour):
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([event("c", "I", 1, at(1))], schema=ACCOUNT_SCHEMA), path)
    config = unit_lake_config(tmp_path, landing)
    assert main(["run", "--config", str(config), *(["--all"] if everything else [])]) == 0
    out = capsys.readouterr().out
    for path in (loose, bad_hour):
        assert f"unit/cards: file://{path} is not read: " in out, out
    assert re.search(r"unit\s+accounts\s+1\s+1\s+1\s+0", out), out
    # and `status` lists them, while no run has set them aside
    assert main(["status", "--config", str(config), "--json"]) == 0
    cards = next(t for t in json.loads(capsys.readouterr().out) if t["table"] == "cards")
    assert sorted(item["file"] for item in cards["not_read"]) == sorted(
        f"file://{p}" for p in (bad_hour, loose)
    )
    assert main(["status", "--config", str(config)]) == 0
    assert f"unit/cards: not read yet: file://{loose}: " in capsys.readouterr().out


def test_a_window_of_hours_plans_the_hourly_feeds_and_says_why_a_grax_feed_does_not_run(tmp_path, capsys):
    """`--from`/`--to` name hours or GRAX batches: a feed whose partitions the window does not
    name is left out with a line saying so, not failed table by table; an hourly feed with
    nothing in the window says that, not that nothing landed."""
    from lake_assets.demo.grax_sample import write_grax_landing
    from lake_assets.runner import _Selection, plan_runs

    write_events(tmp_path / "unit", "accounts", 3, "part-0.parquet", [event("a", "I", 1, at(3), flag=False)])
    write_grax_landing(tmp_path / "grax", batches=4)
    config = LakeConfig(
        lake=str(tmp_path / "lake"),
        feeds=(
            FeedConfig("unit", "unit_cdc", str(tmp_path / "unit")),
            FeedConfig("grax", "grax_v2", str(tmp_path / "grax")),
        ),
    )

    def plan(first, last):
        said, failures = [], []
        runs = plan_runs(config, _Selection(first, last, forced=True), said.append, failures)
        return [(r.feed, r.first, r.last) for r in runs], said, failures

    runs, said, failures = plan("2024-03-01-00", None)
    assert runs == [("unit", "2024-03-01-03", "2024-03-01-03")] and failures == []
    assert "grax: not run: --from/--to from 2024-03-01-00 names none of its partitions (GRAX batches)" in said
    runs, said, failures = plan("2030-01-01-00", None)
    assert runs == [] and failures == []
    assert f"unit: nothing landed from 2030-01-01-00 under file://{tmp_path}/unit" in said
    config_file = tmp_path / "lake.yaml"
    config_file.write_text(dump_config(config))
    assert main(["run", "--config", str(config_file), "--from", "2030-01-01-00"]) == 0
    assert "lake-assets: no landed partition in the window: nothing to process" in capsys.readouterr().out


def test_a_folder_given_as_the_configuration_is_named_as_one(tmp_path, capsys):
    assert main(["status", "--config", str(tmp_path)]) == 1
    assert (
        capsys.readouterr().err
        == f"lake-assets: error: config file {tmp_path} is a folder; give the YAML file in it\n"
    )


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_output_cut_short_by_its_reader_ends_the_command_without_a_traceback(tmp_path, buffered):
    """`lake-assets … | head -1`: the reader leaves (here before the first line); the command
    stops quietly with the exit code of a command ended by SIGPIPE, whether its output was
    buffered (written at the end) or not (written as it goes)."""
    config = _unit_config(tmp_path, f"file://{tmp_path}/lake")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    command = subprocess.Popen(
        [sys.executable, "-m", "lake_assets.cli", "config", "check", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    command.stdout.close()  # the reader is gone before anything is written
    _, err = command.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert command.returncode == 141
