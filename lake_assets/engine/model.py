"""The normalised change model every feed produces and the merge engine consumes.

A change event row holds the table's key column(s), its payload columns as the vendor sent them,
and these system columns:

| column          | type            | meaning                                                       |
|-----------------|-----------------|---------------------------------------------------------------|
| `_op`           | string          | `insert`, `update` or `delete`                                |
| `_version_at`   | timestamp       | the version's source time, truncated to milliseconds          |
| `_seq`          | feed-specific   | orders several writes of one version; greatest wins            |
| `_unmodified`   | array<string>   | payload columns this event did not set (partial update)       |
| `_purged`       | boolean         | the key was purged: its field data must be erased everywhere  |
| `_source_file`  | string          | URI of the landed file the event came from                    |
| `_ingested_at`  | timestamp       | when lake_assets read it                                      |

These names, the four history-mode columns (`_fivetran_start`, `_fivetran_end`,
`_fivetran_active`, `_fivetran_synced`), the partition columns and every name starting with `__` (the engine's working columns) are the
lake's own, compared ignoring case as Spark compares names: a vendor column named like one of them is kept under another name
(`engine.names.lake_name`), never dropped and never mistaken for the lake's.
"""

from __future__ import annotations

import dataclasses
import functools

OP = "_op"
VERSION_AT = "_version_at"
SEQ = "_seq"
UNMODIFIED = "_unmodified"
PURGED = "_purged"
SOURCE_FILE = "_source_file"
INGESTED_AT = "_ingested_at"

SYSTEM_COLUMNS = (OP, VERSION_AT, SEQ, UNMODIFIED, PURGED, SOURCE_FILE, INGESTED_AT)
#: system columns whose value differs on (nearly) every event: no Parquet dictionary pays for them
PER_EVENT_COLUMNS = (VERSION_AT, SEQ)

# Hive partition columns of change logs (hourly feeds, batch feeds); never payload.
PARTITION_COLUMNS = ("hour", "batch")
#: the engine's working columns all start with this
INTERNAL_PREFIX = "__"


def is_reserved(column: str) -> bool:
    """System, history, partition and internal (`__`) columns: everything that is not payload.
    Ignoring case, as Spark resolves names: a payload `Hour` would be the partition column `hour`,
    and `_ingested_at` spelled with a dotless i (U+0131) would be `_ingested_at`."""
    folded = case_folded(column)
    return folded in _RESERVED or folded.startswith(INTERNAL_PREFIX)


def case_folded(name: str) -> str:
    """`name` as Spark compares names ignoring case: what two names it takes for one column have in
    common. Spark's resolver uses Java's `equalsIgnoreCase`, which takes two characters for one
    when their upper cases are equal or the lower cases of those are, each a single character
    (Java's simple case mapping). So the dotless i (U+0131) and the dotted capital I (U+0130)
    are `i`, the long s (U+017F) is `s`, the micro sign (U+00B5) is the Greek mu, the final
    sigma is the medial one, the Kelvin sign is `k`; `ß` is not `ss`. Python's `str.lower`
    agrees on plain letters only."""
    return "".join(_folded_character(c) for c in name)


@functools.cache
def _folded_character(character: str) -> str:
    upper = character.upper()
    if len(upper) != 1:  # a full mapping (`ß` -> `SS`); the simple one is the title case, or none
        title = character.title()
        upper = title if len(title) == 1 else character
    lower = upper.lower()
    if len(lower) != 1:  # the dotted capital I: fully lower-cased, an i and a combining dot
        lower = "i" if upper == "\u0130" else upper
    return lower


INSERT, UPDATE, DELETE = "insert", "update", "delete"

# Fivetran's "open" end of an active version.
END_OF_TIME = "9999-12-31 23:59:59.999"
#: a closed version ends this many milliseconds before the next one starts (Fivetran's history
#: mode; `merge.before_next`)
END_GAP_MS = 1
# The earliest version time the lake keeps: Python's datetime (the fold's bookkeeping, Dagster's
# metadata) and many readers of the lake have no year 0 or before.
START_OF_TIME = "0001-01-01 00:00:00"


@dataclasses.dataclass(frozen=True)
class HistoryColumns:
    """Names of the history-mode system columns; Fivetran's by default."""

    start: str = "_fivetran_start"
    end: str = "_fivetran_end"
    active: str = "_fivetran_active"
    synced: str = "_fivetran_synced"


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """What the engine needs to know about one source table."""

    name: str
    keys: tuple[str, ...]
    partial_updates: bool = False
    history_columns: HistoryColumns = HistoryColumns()

    def payload_columns(self, columns: list[str]) -> list[str]:
        """The payload among `columns`: not a key, not the lake's own."""
        return payload_columns(columns, self.keys)


def payload_columns(columns: list[str], keys: tuple[str, ...] | list[str]) -> list[str]:
    """The field data among `columns` of a table keyed by `keys`: what a purge erases."""
    return [c for c in columns if c not in keys and not is_reserved(c)]


_RESERVED = frozenset(
    case_folded(name)
    for name in (
        *SYSTEM_COLUMNS,
        *PARTITION_COLUMNS,
        *dataclasses.astuple(HistoryColumns()),
    )
)
