"""A Parquet footer's metadata read whole in a small process of its own before the run reads it.

pyarrow ends the process that reads some damaged footers (`std::terminate`) the moment a column
chunk's metadata is touched: a chunk whose physical type contradicts the schema, or a level
histogram of the wrong size. The error is thrown where pyarrow's Python binding cannot catch it,
so no `try` in the run's process helps, and one vendor's damaged file would end the run with
every table after it (docs/bad-input.md, "Footers that end the reading process"). (pyarrow's
reads of a file's rows meet the same faults as errors it raises: only the footer's attributes,
read one by one from Python, end the process.)

So each footer is first read, every attribute of every row group and column chunk, in a probe
process (`python -P -m lake_assets.footer_probe`). A footer that crashes two probes (a fatal
signal, as `std::terminate` raises) is named as damaged, and the run sets the file aside; one
that two probes cannot finish in time is named too. Any other ending of either attempt (no
`ready`, an exit, a kill from outside, odd output, no interpreter to start) is no file's fault:
that raises `FooterProbeFailed`, and the step fails. An error pyarrow raises as a Python
exception is not the probe's business: the run meets it where it reads the footer.

The exchange: the probe says `ready` once started, then reads footers from its standard input
(four bytes of length, little-endian, then the footer behind a leading `PAR1`) and answers each
with one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from typing import IO, Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from lake_assets.errors import LakeAssetsError

_READY = b"ready\n"
#: environment variables the probe is not given: what holds a credential
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|KEY|CREDENTIAL", re.IGNORECASE)
_READ = b"read\n"
#: signals a process raises on itself when the code it runs breaks: `std::terminate` aborts
_CRASHES = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})
#: how long a footer may take the probe: far beyond any real footer's few milliseconds
FOOTER_SECONDS = 120.0
#: how long a probe may take to start (a Python and pyarrow imported: ~0.2 s when idle)
START_SECONDS = 60.0
#: how long a probe whose output ended is given to exit, so that its own status is read
_EXIT_SECONDS = 5.0
#: footers remembered (by a 16-byte digest), so the lake's own files, read again and again in a
#: run, are sent once. Unremembered, they made an hour 4% slower (docs/profiling.md, "What the
#: profiles showed, and what changed").
REMEMBERED = 100_000
#: a footer larger than this is read part by part: `to_dict` would hold the whole of a huge
#: footer as Python objects at once
_WHOLE_AT_ONCE_BYTES = 1 << 20

Outcome = Literal["read", "crashed", "slow", "failed"]


class FooterProbeFailed(LakeAssetsError):
    """The footer probe cannot run: no file is to blame, and none is set aside for it."""


class FooterProbe:
    """The run's probe process, started at first use (or ahead, by `start`) and again after it
    dies. Threads share it, one footer at a time, so a death is the footer's it was reading.
    Each footer's verdict is remembered."""

    def __init__(self, command: Sequence[str] | None = None) -> None:
        #: how the probe is started (tests give stand-ins that fail as a probe can)
        self._command = list(command or [sys.executable, "-P", "-m", __name__])
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._ready = False
        self._verdicts: dict[bytes, str | None] = {}  # a footer's digest: why it ends a reader, or None
        forget = weakref.WeakMethod(self._forget_in_child)  # a probe no longer used can go
        os.register_at_fork(after_in_child=lambda: (method := forget()) is not None and method())

    def close(self) -> None:
        """End the probe (a later footer starts another)."""
        with self._lock:
            if self._process is not None and self._stderr is not None:
                self._end(self._process, self._stderr)

    def start(self) -> None:
        """Start the probe without waiting for it: it imports pyarrow while the run goes on
        (unless a thread is using it, in which case it runs already)."""
        if self._lock.acquire(blocking=False):
            try:
                self._running()
            except Exception:  # noqa: BLE001,S110 - a warm-up only: the first footer says what fails
                pass
            finally:
                self._lock.release()

    def why_it_ends_a_reader(self, footer: bytes) -> str | None:
        """Why reading `footer` ends the reading process, or None when it does not. A footer
        that crashes a probe is given to a fresh one once more, so that only a footer that
        crashes two is named; a probe that fails for want of running raises `FooterProbeFailed`."""
        digest = hashlib.blake2b(footer, digest_size=16).digest()
        with self._lock:
            if digest in self._verdicts:
                return self._verdicts[digest]
            try:
                verdict, lasting = self._verdict(footer)
            except FooterProbeFailed:
                raise
            # the probe's plumbing failing (no interpreter, no file handles) is no file's fault
            except Exception as failure:
                self._end_quietly()
                raise self._failed(f"{type(failure).__name__}: {failure}") from failure
            if lasting:
                self._remember(digest, verdict)
            return verdict

    def _verdict(self, footer: bytes) -> tuple[str | None, bool]:
        """The footer's verdict, and whether it lasts (is remembered): a footer two probes were
        too slow for may be a loaded machine's doing, and is asked about again next time."""
        outcomes = []
        for _attempt in range(2):
            outcome, said = self._ask(footer)
            if outcome == "read":
                return None, True
            outcomes.append(outcome)
        if outcomes == ["crashed", "crashed"]:
            return f"pyarrow ends the process that reads its footer's column metadata ({said})", True
        if set(outcomes) <= {"crashed", "slow"}:
            return f"pyarrow did not finish reading its footer's metadata in {FOOTER_SECONDS:.0f} s", False
        raise self._failed(said)

    def _failed(self, said: str) -> FooterProbeFailed:
        return FooterProbeFailed(
            f"the footer probe (`{' '.join(self._command)}`, which reads each Parquet footer "
            f"apart from the run) cannot run: {said}"
        )

    def _end_quietly(self) -> None:
        if self._process is not None and self._stderr is not None:
            with contextlib.suppress(Exception):
                self._end(self._process, self._stderr)
        self._process, self._stderr, self._ready = None, None, False

    def _remember(self, digest: bytes, verdict: str | None) -> None:
        if len(self._verdicts) >= REMEMBERED:
            self._verdicts.clear()
        self._verdicts[digest] = verdict

    def _ask(self, footer: bytes) -> tuple[Outcome, str]:
        """How one probe fared with `footer`, and what it said if it did not read it. Whatever
        stops the exchange midway (an interrupt included) ends the probe, so that no answer is
        ever taken for the next footer's."""
        process, stderr = self._running()
        try:
            if not self._ready:
                if (greeting := _line(process, START_SECONDS)) != _READY:
                    said = self._end(process, stderr, closed=greeting == b"")
                    return "failed", f"it did not start ({said}; it said {greeting!r})"
                self._ready = True
            _send(process, len(footer).to_bytes(4, "little") + footer)
            answer = _line(process, FOOTER_SECONDS)
        except BrokenPipeError:
            answer = b""
        except BaseException:
            self._end(process, stderr)
            raise
        if answer == _READ:
            stderr.seek(0)
            stderr.truncate()  # what it says is kept for one footer only
            return "read", ""
        said = self._end(process, stderr, closed=answer == b"")
        if answer is None:
            return "slow", said
        if answer:
            return "failed", f"it answered {answer!r} ({said})"
        crashed = process.returncode is not None and -process.returncode in _CRASHES
        return ("crashed" if crashed else "failed"), said

    def _running(self) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        if self._process is None or self._stderr is None or self._process.poll() is not None:
            if self._process is not None and self._stderr is not None:
                self._end(self._process, self._stderr)
            # unbuffered: a plain file holds no lock a fork could leave taken (`_forget_in_child`)
            self._stderr = tempfile.TemporaryFile(buffering=0)  # noqa: SIM115 - kept open while the probe runs
            self._process = subprocess.Popen(
                self._command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                bufsize=0,
                env=_probe_environment(),
            )
            self._ready = False
        return self._process, self._stderr

    def _end(self, process: subprocess.Popen[bytes], stderr: IO[bytes], *, closed: bool = False) -> str:
        """End and reap `process` (if it has not ended), and say how it ended: pyarrow's
        `what():` line (which names the fault), or the last line it printed and its status.
        `closed`: its output ended, so it is exiting: given a moment, its own status is kept."""
        if process is self._process:  # forgotten first: an interrupt below leaves no half-ended probe in use
            self._process, self._stderr, self._ready = None, None, False
        try:
            process.wait(timeout=_EXIT_SECONDS if closed else 0)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()
        stderr.seek(0)
        lines = [line.strip() for line in stderr.read().decode(errors="replace").splitlines() if line.strip()]
        stderr.close()
        what = next(
            (line.removeprefix("what():").strip() for line in reversed(lines) if line.startswith("what():")),
            "",
        )
        how = f"exit status {process.returncode}"
        return what or (f"{lines[-1]}; {how}" if lines else how)

    def _forget_in_child(self) -> None:
        """In a forked child, the parent's probe and pipes are not the child's: close the
        child's copies (so the parent's probe still sees its input end) and start afresh."""
        self._lock = threading.Lock()
        if self._process is not None:
            for pipe in (self._process.stdin, self._process.stdout):
                if pipe is not None:
                    pipe.close()
        if self._stderr is not None:
            self._stderr.close()
        self._process, self._stderr, self._ready = None, None, False


def _probe_environment() -> dict[str, str]:
    """The run's environment without its secrets (the probe parses hostile bytes and needs none),
    and the run's import path, so the probe imports this module as the run did."""
    kept = {name: value for name, value in os.environ.items() if not _SECRET_NAME.search(name)}
    paths = [path for path in sys.path if isinstance(path, str) and path and os.pathsep not in path]
    return {**kept, "PYTHONPATH": os.pathsep.join(paths)}


def _send(process: subprocess.Popen[bytes], data: bytes) -> None:
    """All of `data` to the probe: a pipe takes a large footer in parts."""
    stdin, view = process.stdin.fileno(), memoryview(data)  # type: ignore[union-attr]
    while view:
        view = view[os.write(stdin, view) :]


def _line(process: subprocess.Popen[bytes], seconds: float) -> bytes | None:
    """One line from the probe; b"" if it ended first, None if `seconds` passed first."""
    stdout = process.stdout.fileno()  # type: ignore[union-attr]
    waiting = select.poll()  # not `select.select`, which refuses descriptors past 1023
    waiting.register(stdout, select.POLLIN)
    deadline, line = time.monotonic() + seconds, b""
    while not line.endswith(b"\n"):
        if not waiting.poll(max(0.0, deadline - time.monotonic()) * 1000):
            return None
        chunk = os.read(stdout, 64)
        if not chunk:
            return b""
        line += chunk
    return line


# --- the probe process ---------------------------------------------------------------------------


def _read_whole(footer: bytes) -> None:
    try:
        meta = pq.ParquetFile(pa.BufferReader(footer)).metadata
    except Exception:  # noqa: BLE001 - the run meets (and handles) any raised error itself
        return
    if len(footer) <= _WHOLE_AT_ONCE_BYTES:
        try:
            meta.to_dict()  # every row group's and column chunk's attributes, statistics included
            return
        except Exception:  # noqa: BLE001,S110 - a raised error stops `to_dict` midway: read on, part by part
            pass
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
    answers.write(_READY)
    answers.flush()
    while len(header := requests.read(4)) == 4:
        _read_whole(requests.read(int.from_bytes(header, "little")))
        answers.write(_READ)
        answers.flush()


if __name__ == "__main__":
    # A Ctrl-C is the run's to act on: the probe ends when the run closes its input.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort on a damaged footer leaves no core file
    _serve(sys.stdin.buffer, sys.stdout.buffer)
