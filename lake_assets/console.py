"""What `lake-assets run` and `demo` show a person: a line per finished step (table, layers,
partitions, rows, quarantined files, seconds), a live progress bar on a terminal, then the
summary; everything Dagster and Spark print goes to a log file of the invocation instead.

Plain lines, without control characters, when the output is not a terminal (a cron job's mail,
a CI log). `-v` leaves Dagster's and Spark's output on the console, as it comes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from lake_assets.errors import ConfigError
from lake_assets.runner import NAMED_CHANGES, PlannedRun, StepDone
from lake_assets.status import TableStatus, TableSummary

#: what a step line shows of each layer's metadata, in this order: (layer, metadata key, label)
_FIGURES = (
    ("catalog", "files_catalogued", "files"),
    ("changes", "rows_in", "rows in"),
    ("changes", "events_out", "events out"),
    ("changes", "files_quarantined", "quarantined"),
    ("current", "events_folded", "folded"),
    ("current", "dagster/row_count", "current rows"),
    ("history", "dagster/row_count", "history rows"),
)


def log_directory() -> Path:
    """Where each invocation's log goes: `$LAKE_ASSETS_LOG_DIR`, else the user's cache."""
    configured = os.environ.get("LAKE_ASSETS_LOG_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lake_assets" / "logs"


def new_log_path(command: str) -> Path:
    folder = log_directory()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"the log folder {folder} cannot be made ({exc.strerror}): set LAKE_ASSETS_LOG_DIR to a folder "
            "this user can write"
        ) from None
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    return folder / f"{command}-{stamp}-{os.getpid()}.log"


@contextlib.contextmanager
def output_to(log_path: Path | None) -> Iterator[TextIO]:
    """Send everything written to the process's stdout and stderr (Python's, Dagster's, the
    Spark JVM's) to `log_path`, and yield a stream to the real console; with None, yield the
    console and change nothing."""
    if log_path is None:
        yield sys.stdout
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        sys.stdout.fileno()
        console: TextIO = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
    except (AttributeError, OSError, io.UnsupportedOperation):  # stdout is not a file (captured by a test)
        console = sys.stdout
    try:
        with open(log_path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield console
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        console.flush()


class RunDisplay:
    """The `runner.Progress` callbacks, drawn on `stream`: a bar over the planned steps on a
    terminal, a line per finished step everywhere."""

    def __init__(self, stream: TextIO):
        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def say(self, message: str) -> None:
        self.console.print(f"lake-assets: {message}", markup=False)

    def planned(self, runs: list[PlannedRun], steps: int) -> None:
        if not self.console.is_terminal or not steps:
            return
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.task = self.bar.add_task(f"{len(runs)} run(s)", total=steps)
        self.bar.start()

    def step_done(self, step: StepDone) -> None:
        self.console.print(step_line(step), markup=False)
        if self.bar is not None and self.task is not None:
            self.bar.advance(self.task)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def step_line(step: StepDone) -> str:
    """`unit/accounts: changes  2024-03-01-00 .. 2024-03-01-05  rows in 1200, events out 1180  2.1 s`"""
    partitions = step.first if step.first == step.last else f"{step.first} .. {step.last}"
    if step.failure is not None:
        return f"{step.what}  {partitions}  FAILED: {step.failure}"
    figures = [
        f"{label} {step.metadata[layer][key]}"
        for layer, key, label in _FIGURES
        if key in step.metadata.get(layer, {})
    ]
    return f"{step.what}  {partitions}  {', '.join(figures) or 'done'}  {step.seconds:.1f} s"


def format_status(tables: list[TableStatus], keeps_runs: bool) -> str:
    """The status as a person reads it: one line per table, then what waits and what was set aside."""
    header = ("feed", "table", "last processed", "pending", "quarantined", "current", "history", "last run")
    body = [
        (
            s.feed,
            s.table,
            s.last_processed or "-",
            _count(_length(s.pending)),
            _count(_length(s.quarantined)),
            _count(s.current_rows),
            _count(s.history_rows),
            f"{s.last_run['status']} {s.last_run['started'][:19]}" if s.last_run else "-",
        )
        for s in tables
    ]
    lines = [_table(header, body, 3)]
    if not keeps_runs:
        lines.append("(last runs are kept only by a Dagster instance: set DAGSTER_HOME)")
    for s in tables:
        if s.not_loaded:
            lines.append(s.not_loaded)
        if s.refused:
            lines.append(f"refused: {s.refused}")
        if s.unfinished_folds:
            lines.append(
                f"{s.feed}/{s.table}: unfinished: fold {', '.join(s.unfinished_folds)} is putting its files in "
                "place, or was stopped while it did; until it or the table's next run finishes, readers may see "
                "its new files beside those they replace"
            )
        pending = s.pending or []
        for item in pending[:NAMED_CHANGES]:
            lines.append(
                f"{s.feed}/{s.table}: not processed: {item['partition']} ({item['files']} file(s)): {item['reason']}"
            )
        if len(pending) > NAMED_CHANGES:
            lines.append(
                f"{s.feed}/{s.table}: and {len(pending) - NAMED_CHANGES} more partition(s) not processed"
            )
        for note in s.quarantined or []:
            lines.append(f"{s.feed}/{s.table}: quarantined: {note['file']}: {note['reason']}")
        for item in s.not_read or []:
            lines.append(f"{s.feed}/{s.table}: not read yet: {item['file']}: {item['reason']}")
        lines += [f"{s.feed}/{s.table}: damaged: {damage}" for damage in s.damaged]
    return "\n".join(lines)


def _count(rows: int | None) -> str:
    return "?" if rows is None else str(rows)


def _length(items: list | None) -> int | None:
    return None if items is None else len(items)


def _table(header: tuple[str, ...], body: Sequence[tuple[str, ...]], text_columns: int) -> str:
    """Aligned columns: the first `text_columns` left-aligned, the rest (numbers) right-aligned."""
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
    return "\n".join(
        "  ".join(
            v.ljust(w) if i < text_columns else v.rjust(w)
            for i, (v, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in (header, *body)
    )


def format_summary(tables: list[TableSummary]) -> str:
    """Rows per layer and files quarantined, one line per table; then each damaged lake file."""
    header = ("feed", "table", "changes", "current", "history", "quarantined")
    body = [
        (
            t.feed,
            t.table,
            _count(t.rows.changes),
            _count(t.rows.current),
            _count(t.rows.history),
            str(t.quarantined),
        )
        for t in tables
    ]
    damage = [f"{t.feed}/{t.table}: damaged: {damage}" for t in tables for damage in t.rows.damaged]
    set_aside = sum(t.quarantined for t in tables)
    where = (
        [f"{set_aside} file(s) in quarantine: `lake-assets status --config …` names each with its reason"]
        if set_aside
        else []
    )
    return "\n".join([_table(header, body, 2), *damage, *where])


def format_records(records: list[dict]) -> str:
    """Catalog records as a table a person reads: span, where, what, run, size, file."""

    def when(ms):
        return (
            "-" if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        )

    body = [
        (
            when(r["metadata"]["start"]),
            when(r["metadata"]["end"]),
            r["metadata"]["where"],
            r["metadata"]["what"],
            r["metadata"]["work_id"] or "-",
            r["url"],
            str(r["size"]),
        )
        for r in records
    ]
    return (
        _table(("start", "end", "where", "what", "work_id", "url", "bytes"), body, 6)
        + f"\n{len(records)} file(s)"
    )
