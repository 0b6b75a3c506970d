"""A Parquet footer's metadata read whole in a small process of its own before the run reads it.

pyarrow ends the process that reads some damaged footers (`std::terminate`) the moment a column
chunk's metadata is touched: a chunk whose physical type contradicts the schema, or a level
histogram of the wrong size. The error is thrown where pyarrow's Python binding cannot catch it,
so no `try` in the run's process helps, and one vendor's damaged file would end the run with
every table after it (docs/bad-input.md, "Footers that end the reading process").

So each footer is first read, every attribute of every row group and column chunk, in a probe
process; a probe that dies on it names the footer as damaged and the run sets the file aside.
An error pyarrow raises as a Python exception is not the probe's business: the run meets it
again where it reads the footer, and handles it there.

Run as a script, this module is the probe. It reads footers from its standard input (four bytes
of length, little-endian, then the footer behind a leading `PAR1`) and answers each with one
line. It imports nothing of lake_assets, so it starts in the time pyarrow takes to import, and
wherever the run's Python runs.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

_ANSWER = b"read\n"
#: footers remembered as read whole, so the lake's own files, read again and again in a run, are
#: sent once (a digest is 16 bytes: the memory stays small). Unremembered, they made an hour 4%
#: slower (docs/profiling.md, "What the profiles showed, and what changed").
_READ_REMEMBERED = 100_000


def _read_whole(footer: bytes) -> None:
    try:
        meta = pq.ParquetFile(pa.BufferReader(footer)).metadata
    except Exception:  # noqa: BLE001 - the run meets (and handles) any raised error itself
        return
    try:
        meta.to_dict()  # reads every row group's and column chunk's attributes, statistics included
    except Exception:  # noqa: BLE001 - a raised error stops `to_dict` midway: read on, part by part
        _read_part_by_part(meta)


def _read_part_by_part(meta: pq.FileMetaData) -> None:
    _touch(meta)
    for group_index in range(meta.num_row_groups):
        group = meta.row_group(group_index)
        _touch(group)
        for chunk_index in range(group.num_columns):
            chunk = group.column(chunk_index)
            _touch(chunk)
            try:
                statistics = chunk.statistics
            except Exception:  # noqa: BLE001,S112 - the run meets (and handles) any raised error itself
                continue
            if statistics is not None:
                _touch(statistics)


def _touch(part: Any) -> None:
    """Read every public attribute of a part of a footer, each apart: pyarrow decodes them when read."""
    for name in dir(part):
        if not name.startswith("_"):
            try:
                getattr(part, name)
            except Exception:  # noqa: BLE001,S112 - the run meets (and handles) any raised error itself
                continue


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    while len(header := requests.read(4)) == 4:
        _read_whole(requests.read(int.from_bytes(header, "little")))
        answers.write(_ANSWER)
        answers.flush()


class FooterProbe:
    """The run's probe process, started at first use (or ahead, by `start`) and again after it
    dies. Threads share it, one footer at a time, so a death is the footer's it was reading. A
    footer it has read whole is not sent again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._owner = os.getpid()
        self._read: set[bytes] = set()  # digests of the footers a probe read whole

    def start(self) -> None:
        """Start the probe without waiting for it: it imports pyarrow while the run goes on."""
        with self._lock:
            self._running()

    def why_it_ends_a_reader(self, footer: bytes) -> str | None:
        """Why reading `footer` ends the reading process, or None when it does not. A probe that
        dies is tried once more, fresh, so that only a footer that kills two is named."""
        digest = hashlib.blake2b(footer, digest_size=16).digest()
        with self._lock:
            if digest in self._read:
                return None
            for _attempt in range(2):
                process, stderr = self._running()
                if _answered(process, footer):
                    if len(self._read) >= _READ_REMEMBERED:
                        self._read.clear()
                    self._read.add(digest)
                    return None
            return _last_words(stderr, process.returncode)

    def _running(self) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        if self._owner != os.getpid():  # a forked child: its parent's probe and pipes are not its own
            self._process, self._stderr, self._owner = None, None, os.getpid()
        if self._process is None or self._stderr is None or self._process.poll() is not None:
            self._stop()
            self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - kept open while the probe runs
            self._process = subprocess.Popen(
                [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
            )
        return self._process, self._stderr

    def _stop(self) -> None:
        if self._process is not None:
            for pipe in (self._process.stdin, self._process.stdout):
                if pipe is not None:
                    pipe.close()
            self._process.wait()
        if self._stderr is not None:
            self._stderr.close()
        self._process = self._stderr = None


def _answered(process: subprocess.Popen[bytes], footer: bytes) -> bool:
    """Whether the probe read `footer` and answered; one that did not is ended (if it is not
    dead already) and reaped."""
    try:
        process.stdin.write(len(footer).to_bytes(4, "little") + footer)  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
        answered = process.stdout.readline() == _ANSWER  # type: ignore[union-attr]
    except BrokenPipeError:
        answered = False
    if not answered:
        process.kill()
        process.wait()
    return answered


def _last_words(stderr: IO[bytes], returncode: int | None) -> str:
    """What a dead probe printed last: pyarrow's `what():` line names the fault."""
    stderr.seek(0)
    lines = [line.strip() for line in stderr.read().decode(errors="replace").splitlines() if line.strip()]
    said = next(
        (line.removeprefix("what():").strip() for line in reversed(lines) if line.startswith("what():")), None
    )
    return (
        "pyarrow ends the process that reads its footer's column metadata ("
        + (said or (lines[-1] if lines else f"exit status {returncode}"))
        + ")"
    )


if __name__ == "__main__":
    # A Ctrl-C is the run's to act on: the probe ends when the run closes its input.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _serve(sys.stdin.buffer, sys.stdout.buffer)
