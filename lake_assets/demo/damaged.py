"""A damaged landed file for the demo: what a broken vendor upload leaves behind."""

from __future__ import annotations

from pathlib import Path

TRUNCATED_FILE = "part-99999-truncated-upload.snappy.parquet"


def add_truncated_copy(landed: Path) -> Path:
    """The first half of a landed file, saved next to it: no footer, so no reader can open it."""
    damaged = landed.with_name(TRUNCATED_FILE)
    data = landed.read_bytes()
    damaged.write_bytes(data[: len(data) // 2])
    return damaged
