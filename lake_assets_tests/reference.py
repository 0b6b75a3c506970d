"""An independent, brute-force reference of the semantics, in plain Python, for checking the
Spark engine. Written from docs/semantics.md (its rules, history windows included); it shares
no code with `lake_assets.engine`.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

TMAX = dt.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=dt.UTC)
MS = dt.timedelta(milliseconds=1)
UNIT_SPECIAL = ("id", "cdc_operation_type", "cdc_change_seq", "cdc_commit_timestamp")
UNIT_OPS = {
    "INSERT": "insert",
    "I": "insert",
    "UPDATE": "update",
    "U": "update",
    "DELETE": "delete",
    "D": "delete",
}


def to_ms(moment: dt.datetime) -> dt.datetime:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def reference_tables(
    events: list[dict],
    *,
    key: str = "id",
    op: str = "op",
    version_at: str = "version_at",
    seq: str = "seq",
    payload: list[str],
    unmodified: str = "unmodified",
    purged: str = "purged",
) -> tuple[dict, list[dict]]:
    """(current, history): current maps key -> row; history rows sorted by (key, start)."""
    writes: dict = defaultdict(dict)
    purged_keys = set()
    for event in events:
        at = to_ms(event[version_at])
        writes[event[key]][(at, event[seq])] = event  # identical events count once
        if event.get(purged):
            purged_keys.add(event[key])

    current, history = {}, []
    for k in sorted(writes, key=str):
        winners: dict = {}
        for (at, s), event in writes[k].items():
            if at not in winners or s > winners[at][0]:
                winners[at] = (s, event)
        timeline: list[tuple[str, Any, dict[str, Any] | None]] = []  # (kind, start, values)
        previous: dict[str, Any] | None = None  # filled values of the previous version in this life
        for at in sorted(winners):
            event = winners[at][1]
            if event[op] == "delete":
                timeline.append(("delete", at, None))
                previous = None
                continue
            skipped = set(event.get(unmodified) or ())
            values = {c: ((previous or {}).get(c) if c in skipped else event.get(c)) for c in payload}
            previous = values
            timeline.append(("version", at, values))
        for index, (kind, start, version) in enumerate(timeline):
            if kind == "delete":
                continue
            following = timeline[index + 1] if index + 1 < len(timeline) else None
            if following is None:
                end = TMAX
            elif following[0] == "delete":
                end = following[1]
            else:
                end = following[1] - MS
            assert version is not None  # only deletes carry no values
            values = dict.fromkeys(payload) if k in purged_keys else version
            row = {
                key: k,
                **values,
                "_fivetran_start": start,
                "_fivetran_end": end,
                "_fivetran_active": following is None,
            }
            history.append(row)
            if following is None:
                current[k] = {key: k, **values, "_version_at": start}
    return current, history


def unit_events_to_normalised(rows: list[dict]) -> list[dict]:
    """Raw Unit CDC rows -> the reference's input shape."""
    out = []
    for row in rows:
        out.append(
            {
                **{c: v for c, v in row.items() if c not in UNIT_SPECIAL},
                "id": row["id"],
                "op": UNIT_OPS[str(row["cdc_operation_type"]).strip().upper()],
                "version_at": row["cdc_commit_timestamp"],
                "seq": int(row["cdc_change_seq"]),
            }
        )
    return out
