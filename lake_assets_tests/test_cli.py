"""`lake-assets run` and `lake-assets demo` as a user runs them."""

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb

from lake_assets.cli import main
from lake_assets.config import FeedConfig, LakeConfig, dump_config
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events

ROOT = Path(__file__).resolve().parent.parent


def test_run_processes_everything_and_exits_zero(tmp_path, spark, capsys):
    landing = tmp_path / "landing"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1), name="x", balance=1)], ACCOUNT_SCHEMA)
    write_events(landing, "accounts", 7, "part-0.parquet", [event("a", "U", 2, at(7), name="y", balance=2)], ACCOUNT_SCHEMA)
    config = tmp_path / "c.yaml"
    config.write_text(dump_config(LakeConfig(lake="file:///unused", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),))))
    assert main(["run", "--config", str(config), "--lake", f"file://{tmp_path / 'lake'}"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"unit\s+accounts\s+2\s+1\s+2\s+0", out), out
    assert (tmp_path / "lake" / "history" / "unit" / "accounts").is_dir()
    assert not Path("/unused").exists()


def test_run_fails_with_a_clear_message(tmp_path, spark, capsys):
    landing = tmp_path / "landing"
    write_events(landing, "accounts", 1, "part-0.parquet", [event("a", "I", 1, at(1), flag=True)])
    write_events(landing, "accounts", 1, "part-1.parquet", [event("b", "I", 2, at(1), flag=dt.date(2024, 1, 1))])
    config = tmp_path / "c.yaml"
    config.write_text(dump_config(LakeConfig(lake=f"file://{tmp_path / 'lake'}", feeds=(FeedConfig("unit", "unit_cdc", f"file://{landing}"),))))
    assert main(["run", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "column 'flag' has type boolean" in err and "date" in err

    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == 1
    assert "missing.yaml does not exist" in capsys.readouterr().err


def test_demo_summary_matches_the_tables_on_disk(tmp_path):
    """The README's demo, in its own process as a user runs it (fresh JVM, ephemeral instance)."""
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    cli = Path(sys.executable).parent / "lake-assets"
    proc = subprocess.run([str(cli), "demo", "--dir", str(tmp_path / "demo")], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"^(unit|grax|flow)\s+([\w/]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", proc.stdout, re.M)
    assert sorted({feed for feed, *_ in rows}) == ["flow", "grax", "unit"], proc.stdout
    assert len(rows) >= 8, proc.stdout
    lake = tmp_path / "demo" / "lake"
    for feed, table, changes, current, history, _ in rows:
        for layer, printed in (("changes", changes), ("current", current), ("history", history)):
            glob = f"{lake}/{layer}/{feed}/{table}/**/*.parquet"
            on_disk = duckdb.sql(f"SELECT count(*) FROM read_parquet('{glob}', hive_partitioning = true, union_by_name = true)").fetchall()[0][0]
            assert on_disk == int(printed) > 0, (table, layer)
    assert (tmp_path / "demo" / "lake_assets.yaml").is_file()
