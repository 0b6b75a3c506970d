"""What `lake-assets run` shows a person, run as a command of its own: on a terminal (a
pseudo-terminal) and into a pipe."""

from __future__ import annotations

import dataclasses
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import duckdb

from lake_assets.config import FeedConfig, LakeConfig, dump_config
from lake_assets_tests.unit_files import ACCOUNT_SCHEMA, at, event, write_events

STEP_LINE = re.compile(
    r"^unit/accounts: (catalog|changes|current\+history)\s+2024-03-01-01 \.\. 2024-03-01-02\s+.*\d+\.\d s$",
    re.MULTILINE,
)


def _landing_and_config(tmp_path: Path) -> Path:
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    write_events(
        landing,
        "accounts",
        1,
        "part-0.parquet",
        [event("a", "I", 1, at(1, 5), name="a", balance=1)],
        ACCOUNT_SCHEMA,
    )
    write_events(
        landing,
        "accounts",
        2,
        "part-0.parquet",
        [
            event("b", "I", 2, at(2, 5), name="b", balance=2),
            event("a", "U", 3, at(2, 6), name="a2", balance=3),
        ],
        ACCOUNT_SCHEMA,
    )
    config = tmp_path / "lake.yaml"
    config.write_text(
        dump_config(
            LakeConfig(
                lake=f"file://{lake}",
                feeds=(FeedConfig(name="unit", format="unit_cdc", landing=f"file://{landing}"),),
            )
        )
    )
    return config


def _environment(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env.update(LAKE_ASSETS_LOG_DIR=str(tmp_path / "logs"), COLUMNS="160", TERM="xterm-256color")
    return env


def _log_path(output: str) -> Path:
    match = re.search(r"Dagster's and Spark's output: (\S+\.log)", output)
    assert match, output
    return Path(match.group(1))


def test_on_a_terminal_the_run_shows_a_line_per_step_a_summary_and_logs_dagster_to_a_file(tmp_path):
    config = _landing_and_config(tmp_path)
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "lake_assets.cli", "run", "--config", str(config)],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=_environment(tmp_path),
        close_fds=True,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the command ended and closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert process.wait(timeout=600) == 0
    os.close(leader)
    screen = b"".join(chunks).decode("utf-8", "replace")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen).replace("\r", "\n")
    assert len(STEP_LINE.findall(text)) == 3, text
    assert "rows in 3, events out 3" in text and "current rows 2, history rows 3" in text
    assert re.search(r"^feed\s+table\s+changes\s+current\s+history\s+quarantined$", text, re.MULTILINE), text
    assert re.search(r"lake-assets: done in \d+\.\d s", text)
    assert "\x1b[" in screen  # a terminal gets the live progress bar
    assert "STEP_START" not in text and "RUN_SUCCESS" in _log_path(text).read_text()


def test_into_a_pipe_the_lines_are_plain_and_the_summary_equals_the_tables_on_disk(tmp_path):
    config = _landing_and_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "lake_assets.cli", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        env=_environment(tmp_path),
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", done.stdout), "control characters in piped output"
    assert len(STEP_LINE.findall(done.stdout)) == 3, done.stdout
    assert "STEP_START" not in done.stdout + done.stderr
    assert "STEP_START" in _log_path(done.stdout).read_text()
    [summary] = [line.split() for line in done.stdout.splitlines() if line.startswith("unit ")]
    lake = tmp_path / "lake"
    on_disk = [
        duckdb.sql(
            f"SELECT count(*) FROM read_parquet('{lake}/{layer}/unit/accounts/**/*.parquet')"
        ).fetchall()[0][0]
        for layer in ("changes", "current", "history")
    ]
    assert summary == ["unit", "accounts", *map(str, on_disk), "0"]


def test_the_summary_says_where_the_quarantined_files_are_named():
    """The summary counts a table's quarantined files; a line after it says which command names
    each with its reason (the run's own log is in a file), and none when nothing is set aside."""
    from lake_assets.console import format_summary
    from lake_assets.status import LayerRows, TableSummary

    tables = [
        TableSummary("unit", "accounts", LayerRows(3, 2, 3), quarantined=2),
        TableSummary("unit", "cards", LayerRows(1, 1, 1), quarantined=1),
    ]
    lines = format_summary(tables).splitlines()
    assert lines[-1] == "3 file(s) in quarantine: `lake-assets status --config …` names each with its reason"
    assert "in quarantine" not in format_summary([dataclasses.replace(t, quarantined=0) for t in tables])
