"""Quarantine: a copy of each unusable landed file next to a JSON note saying why.

The landing area belongs to the vendor (and is often read-only to us), so the original stays
where it is; the copy and its reason are what an operator inspects. Re-running a partition writes
the same quarantine entry again, so retries do not multiply it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re

from lake_assets.paths import LakeLayout
from lake_assets.storage import Storage


@dataclasses.dataclass(frozen=True)
class Quarantined:
    uri: str
    reason: str
    rows: int | None = None


def _safe_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.=+-]", "_", name).lstrip("._") or "file"
    return cleaned.replace("..", "_")


def quarantine_file(
    storage: Storage, layout: LakeLayout, feed: str, table: str, partition: str, item: Quarantined, run_id: str | None
) -> str:
    """Copy the file into `<lake>/_quarantine/<feed>/<table>/<partition>/` with `<name>.reason.json`."""
    folder = layout.quarantine(feed, table, partition)
    name = _safe_name(item.uri.rsplit("/", 1)[-1])
    target = f"{folder}/{name}"
    try:
        storage.copy(item.uri, target)
    except OSError as exc:  # the file may be gone or unreadable; the note still records it
        item = dataclasses.replace(item, reason=f"{item.reason} (copy failed: {exc})")
    note = {
        "file": item.uri,
        "reason": item.reason,
        "rows": item.rows,
        "feed": feed,
        "table": table,
        "partition": partition,
        "run_id": run_id,
        "quarantined_at": dt.datetime.now(dt.timezone.utc).isoformat(),
    }
    storage.write_bytes(f"{target}.reason.json", json.dumps(note, indent=2).encode())
    return target
