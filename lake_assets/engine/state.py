"""Where a table's folded state lives, and how a fold replaces it without readers seeing
half-written files.

```
current/<feed>/<table>/part-*.parquet                  live rows; rewritten by every fold
history/<feed>/<table>/active/part-*.parquet           open versions; rewritten by every fold
history/<feed>/<table>/closed/<end date>/part-*.parquet closed versions; each fold appends
                                                       files (a small fold: one per end hour),
                                                       late data rewrites those it reaches, a
                                                       settled day's files are merged once
_state/<feed>/<table>/deletes/{active,closed/<date>}/  delete events, same shape, not published
_state/<feed>/<table>/purged/part-*.parquet            the purged keys, for good (engine/purges.py)
_state/<feed>/<table>/commits/<fold>.json              commit record of a fold being applied
_staging/<feed>/<table>/<fold>/                        files of a fold before they are committed
_state/<feed>/tables.json                              the feed's tables and first hour, pinned by
                                                       discovery (lake_assets/discovery.py)
```

Closed versions never change unless late data lands before their end, so keeping them apart from
the open set, grouped by end date with each fold's rows in files of their own, lets a fold read
and rewrite only the open set and the closed files that late data reaches: the cost of a fold
follows the batch and the number of keys, not the length of history.

A fold writes everything to staging first (invisible to readers: `_staging` is outside every
table folder), then writes a commit record listing which staged files become which table files
and which old files go. Applying the record is idempotent; a run that dies while applying it is
finished by the next run (`recover`), and staging left without a record is discarded. Each file
appears whole (a rename, or an S3 copy), so a glob never reads a half-written file.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Callable

from typing_extensions import TypedDict

from lake_assets import lease
from lake_assets.errors import AnotherWriter, DamagedLakeFile
from lake_assets.paths import LakeLayout
from lake_assets.storage import PARTIAL_SUFFIX, Storage, data_files, each_request, is_hidden, read_lake_json

_DATE_FOLDER = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")

#: Told the lake files a write is about to remove, while they can still be read (the file
#: catalog retires their records: `pipeline`). A write that fails may have told it.
Removing = Callable[[list[str]], None]


@dataclasses.dataclass(frozen=True)
class TableState:
    layout: LakeLayout
    feed: str
    table: str

    @property
    def changes(self) -> str:
        return self.layout.table("changes", self.feed, self.table)

    @property
    def current(self) -> str:
        return self.layout.table("current", self.feed, self.table)

    @property
    def history(self) -> str:
        return self.layout.table("history", self.feed, self.table)

    @property
    def history_active(self) -> str:
        return f"{self.history}/active"

    @property
    def history_closed(self) -> str:
        return f"{self.history}/closed"

    @property
    def state_root(self) -> str:
        return self.layout.state(self.feed, self.table)

    @property
    def deletes_active(self) -> str:
        return f"{self.state_root}/deletes/active"

    @property
    def deletes_closed(self) -> str:
        return f"{self.state_root}/deletes/closed"

    @property
    def closed_roots(self) -> tuple[tuple[str, str], ...]:
        """(kind, folder) of the closed rows: history's ("history") and the deletes' ("delete")."""
        return (("history", self.history_closed), ("delete", self.deletes_closed))

    def open_folders(self, storage: Storage) -> list[str]:
        """The open set's folders that exist: history's active rows and the open deletes."""
        return [f for f in (self.history_active, self.deletes_active) if storage.exists(f)]

    @property
    def purged(self) -> str:
        return f"{self.state_root}/purged"

    @property
    def purges_seen(self) -> str:
        return f"{self.state_root}/purges_seen"

    @property
    def commits(self) -> str:
        return f"{self.state_root}/commits"

    def staging(self, fold_id: str) -> str:
        return self.layout.staging(self.feed, self.table, fold_id)

    def staging_root(self) -> str:
        return self.layout.staging(self.feed, self.table)

    def publishes(self, uri: str) -> bool:
        """Whether a file is one of the table's published ones (current, history), not the
        engine's own bookkeeping."""
        return uri.startswith((f"{self.current}/", f"{self.history}/"))


def new_fold_id() -> str:
    return uuid.uuid4().hex[:16]


def is_parquet_file(name: str) -> bool:
    """A Parquet data file's name, not one of Spark's markers or checksums."""
    return name.endswith(".parquet") and not is_hidden(name)


def parquet_files(storage: Storage, folder: str) -> list[str]:
    """The URIs of the Parquet data files directly in a lake folder (`storage.data_files` that
    are Parquet)."""
    return [e.uri for e in data_files(storage, folder) if is_parquet_file(e.name)]


def closed_days(storage: Storage, folder: str) -> dict[str, str]:
    """end date -> folder of the closed partitions under `folder`."""
    return {e.name: e.uri for e in storage.list(folder) if e.is_dir and _DATE_FOLDER.match(e.name)}


@dataclasses.dataclass
class CommitPlan:
    """Which staged files become which table files, and which table files go."""

    fold_id: str
    adds: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    deletes: list[str] = dataclasses.field(default_factory=list)

    def stage_folder(self, storage: Storage, staged_folder: str, final_folder: str) -> None:
        """Every data file Spark wrote to `staged_folder` goes to `final_folder`, named by fold."""
        self.stage_files(parquet_files(storage, staged_folder), final_folder)

    def stage_files(self, staged_files: list[str], final_folder: str) -> None:
        """The staged files go to `final_folder`, named by fold."""
        for index, uri in enumerate(sorted(staged_files)):
            self.adds.append((uri, f"{final_folder}/part-{self.fold_id}-{index:05d}.parquet"))

    def replace_folder(self, storage: Storage, final_folder: str) -> None:
        """The files now in `final_folder` are superseded by this fold."""
        self.deletes.extend(parquet_files(storage, final_folder))

    def to_json(self) -> str:
        return json.dumps({"fold_id": self.fold_id, "adds": self.adds, "deletes": self.deletes}, indent=1)


class _CommitRecord(TypedDict):
    """A commit record as written (`CommitPlan.to_json`): every field is required."""

    fold_id: str
    adds: list[tuple[str, str]]
    deletes: list[str]


def _check_applicable(storage: Storage, plan: CommitPlan, record: str) -> None:
    """A record whose staged file is gone, and not in place either, would put nothing where its
    deletes take the table's files away: it is refused, naming it, before any file moves.
    (Nothing writes a table's folders while one of its records is pending: a change-log write
    finishes the table's interrupted folds first, `pipeline.store_partitions`.)"""
    for staged, final in plan.adds:
        if not (storage.exists(staged) or storage.exists(final)):
            raise DamagedLakeFile(
                record,
                f"it puts {staged} in place, which is gone from staging and is not at {final}",
                problem="cannot be applied",
            )


def _check_staged(storage: Storage, state: TableState, plan: CommitPlan) -> None:
    """Every file the plan puts in place is in its staging (one listing): a run that recovers
    the table meanwhile (another writer) discards staging, and a commit without its files would
    take the table's away."""
    staged = {entry.uri for entry in storage.walk_files(state.staging(plan.fold_id))}
    missing = [uri for uri, _ in plan.adds if uri not in staged]
    if missing:
        raise AnotherWriter(
            f"{state.feed}/{state.table}: the fold's staged file {missing[0]} is gone before its commit: "
            "another process wrote the table meanwhile; nothing was changed, run it again"
        )


def _apply(storage: Storage, plan: CommitPlan, on_step: Callable[[str], None]) -> None:
    """Every add, then every delete, several at a time: on S3 a move is a copy and a delete,
    and a backfill's hundreds of files moved one after another waited out each round trip
    (docs/profiling.md, "Requests one after another"). A commit killed at any point is finished
    by `recover`, whichever of its files had moved."""

    def add(numbered: tuple[int, tuple[str, str]]) -> None:
        index, (staged, final) = numbered
        on_step(f"add {index}")
        if storage.exists(staged):
            storage.move_file(staged, final)

    def delete(numbered: tuple[int, str]) -> None:
        index, old = numbered
        on_step(f"delete {index}")
        storage.delete_file(old)

    each_request(add, enumerate(plan.adds))
    each_request(delete, enumerate(plan.deletes))


def commit(
    storage: Storage,
    state: TableState,
    plan: CommitPlan,
    on_step: Callable[[str], None] | None = None,
    removing: Removing | None = None,
) -> None:
    """Record the plan, apply it, then forget it.

    The table's lease must still be the step's (`lease.confirm_held`, asked right before the
    record). `on_step` is called before every file operation: the crash tests kill the process
    there at an exact point, and a fold's caller makes its last check of what the fold read at
    "record", which may still stop the commit.
    `removing` is told the files the plan deletes once the record is written (from then on they
    go, by this commit or by the next run's `recover`)."""
    step = on_step or (lambda _: None)
    record = f"{state.commits}/{plan.fold_id}.json"
    _check_staged(storage, state, plan)
    step("record")
    lease.confirm_held()
    storage.write_bytes(record, plan.to_json().encode())  # whole or absent
    if removing is not None:
        removing(plan.deletes)
    _apply(storage, plan, step)
    step("forget")
    storage.delete_file(record)
    storage.delete_tree(state.staging(plan.fold_id))


def unfinished_commits(storage: Storage, state: TableState) -> list[str]:
    """The folds whose commit was stopped while it put their files in place (their record is
    there): until the table's next write finishes them (`recover`), a reader may see a fold's
    new files beside those they replace."""
    return sorted(
        entry.name[: -len(".json")]
        for entry in storage.list(state.commits)
        if not entry.is_dir and entry.name.endswith(".json")
    )


def recover(storage: Storage, state: TableState, removing: Removing | None = None) -> list[CommitPlan]:
    """Finish folds whose commit record exists (returns their plans); discard staging that never
    got one. `removing` is told each plan's deletes again (some may be gone already)."""
    finished = []
    for entry in storage.list(state.commits):
        if entry.name.endswith((".json.tmp", PARTIAL_SUFFIX)):
            storage.delete_file(entry.uri)  # never became a record: its fold never started applying
            continue
        if entry.is_dir or not entry.name.endswith(".json"):
            continue
        plan = CommitPlan(**read_lake_json(storage, entry.uri, _CommitRecord))
        _check_applicable(storage, plan, entry.uri)
        if removing is not None:
            removing(plan.deletes)
        _apply(storage, plan, lambda _: None)
        storage.delete_file(entry.uri)
        finished.append(plan)
    storage.delete_tree(state.staging_root())
    return finished
