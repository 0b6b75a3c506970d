"""One writer per table at a time, whoever starts it (docs/lake-layout.md, "One writer per table").

A step that writes a table (its change log, or its fold into current and history) holds the
table's lease while it runs. Dagster's pools keep the daemon's runs apart; the lease also keeps
a `lake-assets run` started by hand, or a second deployment on the same lake, from writing the
table at the same time: two writers could each replace what the other just wrote (a change-log
partition stored before a purge was recorded would keep the purged key's data).

- On a file system the lease is an advisory lock (`flock`) on the lease file. The system lets
  go of it when its process ends, however it ends: a killed run never holds up the next one.
- On S3 it is an object written only by conditional requests (created if absent, replaced only
  if unchanged since read). Its holder renews it every `RENEW_SECONDS`; a lease not renewed for
  `EXPIRES_SECONDS` is free, so a run killed on S3 holds up the next one that long at most. The
  lease's age is the store's to tell (`Tagged.age_seconds`): machines whose clocks disagree
  still agree on it.

The file names its holder (run, process, host, step, since when), so a run kept waiting says
whom it waits for. Pure storage logic: no Spark, no Dagster.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

from lake_assets.errors import AnotherWriter, LakeAssetsError
from lake_assets.paths import LakeLayout, is_s3
from lake_assets.storage import Storage

#: an S3 lease not renewed for this long is free (its holder is taken to be dead)
EXPIRES_SECONDS = 120.0
#: how often an S3 lease's holder renews it
RENEW_SECONDS = 20.0
#: how often a run kept waiting looks again
POLL_SECONDS = 1.0

#: the lease the step running in this context holds (`held`), which `confirm_held` checks
_holding: contextvars.ContextVar[_Lease | None] = contextvars.ContextVar("lake_assets_lease", default=None)
#: the leases this process holds ((URI, holder) -> the lease and how many holds it has): a step
#: holding its table's lease runs code that holds it too (the changes step, around its IO
#: manager's store), and letting go in between would let another writer in
_held_here: dict[tuple[str, str], tuple[_Lease, int]] = {}
_held_here_guard = threading.Lock()


class TableBusy(LakeAssetsError):
    """Another writer held the table's lease for longer than this run would wait."""


class LeaseLost(AnotherWriter):
    """The lease expired while its holder still ran (its renewals failed for `EXPIRES_SECONDS`)
    and another writer took it."""


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lease, since when by its own clock, whether it let go, and how long after its
    last renewal it runs out (S3: the store's clock measures that age)."""

    who: str
    since: float
    released: bool = False
    expires_after_seconds: float = 0.0
    #: one holding's own mark (S3): a holder knows its stamp by it whatever answer it got
    token: str = ""

    def describe(self, now: float, free_in: float | None = None) -> str:
        held = f"{self.who}, holding it for {max(0.0, now - self.since):.0f} s"
        if free_in is not None:
            held += f" (free in at most {max(0.0, free_in):.0f} s if its process is gone)"
        return held

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Holder | None:
        """None for an empty or unreadable lease file: nobody is named (the lock decides)."""
        try:
            fields = json.loads(data)
            return cls(
                str(fields["who"]),
                float(fields["since"]),
                bool(fields["released"]),
                # a lease written before holders said so ran out after the default
                float(fields.get("expires_after_seconds", EXPIRES_SECONDS)),
                str(fields.get("token", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None


def writing_table(
    storage: Storage,
    layout: LakeLayout,
    feed: str,
    table: str,
    run_id: str | None,
    step: str,
    wait_seconds: float,
    say: Callable[[str], None],
) -> contextlib.AbstractContextManager[None]:
    """Hold the table's lease for `step` of run `run_id` (`held`)."""
    who = f"run {run_id or '(none)'} ({feed}/{table} {step}; process {os.getpid()} on {socket.gethostname()})"
    return held(storage, layout.lease(feed, table), who, wait_seconds, say)


@contextlib.contextmanager
def held(
    storage: Storage,
    uri: str,
    who: str,
    wait_seconds: float,
    say: Callable[[str], None],
) -> Iterator[None]:
    """Hold the lease at `uri` for the block, waiting up to `wait_seconds` for another holder to
    let go (`TableBusy` after that, naming it). A block within one that holds the lease as the
    same `who` (in this process) holds it on: it is let go when the outermost block ends. On S3
    a lease lost meanwhile fails the block's end (`LeaseLost`)."""
    with _held_here_guard:
        outer = _held_here.get((uri, who))
        if outer is not None:
            _held_here[uri, who] = (outer[0], outer[1] + 1)
    if outer is not None:
        with _held_on(outer[0]):
            yield
        if not outer[0].confirm():  # lost while the inner block ran: its caller must not go on
            raise LeaseLost(_no_longer_held(outer[0]))
        return
    lease: _Lease = _S3Lease(storage, uri, who) if is_s3(uri) else _LocalLease(uri, who)
    _take(lease, uri, wait_seconds, say)
    with _held_here_guard:
        _held_here[uri, who] = (lease, 1)
    try:
        with _held_on(lease):
            yield
    finally:
        with _held_here_guard:  # an inner hold still counted (ended out of order) ends with it
            if _held_here.get((uri, who), (None, 0))[0] is lease:
                del _held_here[uri, who]
        if _holding.get() is lease:
            _holding.set(None)
        lost = lease.release()
    if lost:
        raise LeaseLost(
            f"the lease {uri} was taken by another writer while {who} held it (its renewals failed "
            f"for {EXPIRES_SECONDS:.0f} s): the table may have been written twice at once; run it again"
        )


@contextlib.contextmanager
def _held_on(lease: _Lease) -> Iterator[None]:
    """One hold of a lease this process has taken: `confirm_held` finds it within the block,
    and the process counts it as held until the block ends (counted down before anything that
    could fail)."""
    holding = _holding.set(lease)
    try:
        yield
    finally:
        with _held_here_guard:
            key = (lease.uri, lease.who)
            held_lease, holds = _held_here.get(key, (None, 0))
            if held_lease is lease and holds > 1:
                _held_here[key] = (lease, holds - 1)
            elif held_lease is lease:
                del _held_here[key]
        with contextlib.suppress(ValueError):  # ended in another context than it began in
            _holding.reset(holding)


def confirm_held() -> None:
    """Before a change that cannot be taken back (a fold's commit, a change log's store): raise
    `LeaseLost` unless the lease the step holds is still its own. On S3 that is one conditional
    renewal, now: a holder cut off from the store long enough for another writer to take its
    lease finds out before it commits, not at its step's end. Outside `held` (a caller that
    holds no lease, as the engine's own tests) there is nothing to confirm."""
    lease = _holding.get()
    if lease is not None and not lease.confirm():
        raise LeaseLost(_no_longer_held(lease))


def _no_longer_held(lease: _Lease) -> str:
    return (
        f"the lease {lease.uri} is no longer {lease.who}'s, or could not be renewed before it "
        "may have run out: another writer may hold it; nothing more was committed, run it again"
    )


def _take(lease: _Lease, uri: str, wait_seconds: float, say: Callable[[str], None]) -> None:
    deadline = time.monotonic() + wait_seconds
    waiting_for = None
    while not lease.try_take():
        who, named = lease.waiting_on()
        if time.monotonic() >= deadline:
            raise TableBusy(
                f"the table is being written by {named}; waited {wait_seconds:.0f} s for its lease "
                f"{uri} (lease_wait_seconds)"
            )
        if who is None or who != waiting_for:
            say(f"waiting for the table's lease {uri}: {named}")
            waiting_for = who
        time.sleep(POLL_SECONDS)


class _Lease:
    uri: str
    who: str

    def try_take(self) -> bool:
        raise NotImplementedError

    def waiting_on(self) -> tuple[str | None, str]:
        """Who holds the lease (None when its file names nobody), described for a log line."""
        raise NotImplementedError

    def confirm(self) -> bool:
        """Whether the lease is still this holder's."""
        raise NotImplementedError

    def release(self) -> bool:
        """Let go; True when the lease had been lost meanwhile."""
        raise NotImplementedError


class _LocalLease(_Lease):
    def __init__(self, uri: str, who: str):
        self.uri, self.who = uri, who
        self.path = uri.removeprefix("file://")
        self.fd: int | None = None

    def try_take(self) -> bool:
        import fcntl

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, Holder(self.who, time.time()).to_json(), 0)
        except BaseException:
            os.close(fd)  # lets go of the lock too
            raise
        self.fd = fd
        return True

    def waiting_on(self) -> tuple[str | None, str]:
        try:
            with open(self.path, "rb") as handle:
                holder = Holder.from_json(handle.read())
        except OSError:
            holder = None
        return (holder.who, holder.describe(time.time())) if holder else (None, "another writer")

    def confirm(self) -> bool:
        return self.fd is not None  # the system keeps the lock for the process

    def release(self) -> bool:
        import fcntl

        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # names nobody once free
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
        return False


class _S3Lease(_Lease):
    def __init__(self, storage: Storage, uri: str, who: str):
        self.storage, self.uri, self.who = storage, uri, who
        self.token = uuid.uuid4().hex
        self.since = time.time()
        self.tag: str | None = None
        self.lost = False
        self.renewed_at = 0.0
        self.guard = threading.Lock()
        self.stop = threading.Event()
        self.renewer: threading.Thread | None = None

    def _stamp(self, released: bool = False) -> bytes:
        stamp = dataclasses.asdict(Holder(self.who, self.since, released, EXPIRES_SECONDS, self.token))
        # for readers of an earlier lake_assets, which judge a lease by its holder's clock
        stamp["expires_at"] = time.time() + EXPIRES_SECONDS
        return json.dumps(stamp).encode()

    def _stamped(self, released: bool = False) -> str | None:
        """Write this holder's stamp over its own: the new ETag, or None when another writer's
        stamp is there. A write that reached the store but whose answer was lost (a timeout)
        left this holder's stamp under an ETag it never saw; found by its token, it is still
        this holder's."""
        tag = self.storage.write_if_tag(self.uri, self._stamp(released), self.tag)
        if tag is None:
            found = self.storage.read_tagged(self.uri)
            holder = Holder.from_json(found.data) if found else None
            if (
                found is not None
                and holder is not None
                and holder.token == self.token
                and not holder.released
            ):
                tag = self.storage.write_if_tag(self.uri, self._stamp(released), found.tag)
        return tag

    def try_take(self) -> bool:
        found = self.storage.read_tagged(self.uri)
        if found is not None:
            holder = Holder.from_json(found.data)
            if (
                holder is not None
                and not holder.released
                and found.age_seconds <= holder.expires_after_seconds
            ):
                return False
        self.since, sent = time.time(), time.monotonic()
        self.tag = self.storage.write_if_tag(self.uri, self._stamp(), None if found is None else found.tag)
        if self.tag is None:
            return False  # another writer took it between the read and the write
        self.renewed_at = sent
        self.renewer = threading.Thread(target=self._renew, name=f"lease {self.uri}", daemon=True)
        self.renewer.start()
        return True

    def _renew(self) -> None:
        while not self.stop.wait(RENEW_SECONDS):
            with contextlib.suppress(OSError):  # a request that failed: tried again at the next one
                if not self._renewed():
                    return

    def _renewed(self) -> bool:
        """Renew the lease now; False (and lost for good) once another writer changed it."""
        with self.guard:
            if self.lost or self.tag is None:
                return False
            sent = time.monotonic()
            tag = self._stamped()
            if tag is None:
                self.lost = True
                return False
            self.tag, self.renewed_at = tag, sent
            return True

    def confirm(self) -> bool:
        try:
            return self._renewed()
        except OSError:
            # The store cannot say now. The lease it holds is no older than the time since the
            # last renewal that came back was sent; half the expiry is left for the commit.
            return not self.lost and time.monotonic() - self.renewed_at < EXPIRES_SECONDS / 2

    def waiting_on(self) -> tuple[str | None, str]:
        found = self.storage.read_tagged(self.uri)
        holder = Holder.from_json(found.data) if found else None
        if found is None or holder is None:
            return None, "another writer"
        return holder.who, holder.describe(
            time.time(), free_in=holder.expires_after_seconds - found.age_seconds
        )

    def release(self) -> bool:
        self.stop.set()
        if self.renewer is not None:
            self.renewer.join()
        with self.guard:
            if not self.lost and self.tag is not None:
                with contextlib.suppress(OSError):  # unreleased, it expires by itself
                    self.lost = self._stamped(released=True) is None
            self.tag = None  # let go: nothing renews or confirms it any more
        return self.lost
