"""One writer per table (`lake_assets.lease`), on a file system and on S3 (moto): a second
writer waits for the first and names it, a killed holder holds up nobody for long, and a
lease taken away from a holder that stopped renewing it fails that holder."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from lake_assets import lease
from lake_assets.config_model import S3Config
from lake_assets.engine.state import CommitPlan, TableState, commit
from lake_assets.paths import LakeLayout
from lake_assets.storage import Storage


@pytest.fixture(params=["file", "s3"])
def place(request, tmp_path) -> tuple[Storage, str]:
    """(storage, a lease's URI) on each kind of lake."""
    if request.param == "file":
        return Storage(), f"file://{tmp_path}/_leases/unit/accounts/lease.json"
    moto = request.getfixturevalue("moto_server")
    bucket = request.getfixturevalue("s3_bucket")
    return Storage(S3Config(endpoint_url=moto.url)), f"s3a://{bucket}/lake/_leases/unit/accounts/lease.json"


def test_a_second_writer_waits_for_the_first_names_it_and_gets_the_lease_once_it_is_let_go(place):
    storage, uri = place
    said: list[str] = []
    with lease.held(storage, uri, "run A", 0, said.append):
        with (
            pytest.raises(lease.TableBusy, match="the table is being written by run A"),
            lease.held(storage, uri, "run B", 0, said.append),
        ):
            pytest.fail("two writers held the table's lease at once")

        order: list[str] = []

        def second_writer():
            with lease.held(storage, uri, "run C", 30, said.append):
                order.append("C has it")

        waiting = threading.Thread(target=second_writer)
        waiting.start()
        time.sleep(2.5)
        order.append("A lets go")
    waiting.join(timeout=30)
    assert order == ["A lets go", "C has it"]
    assert any(line.startswith("waiting for the table's lease") and "run A" in line for line in said), said
    with lease.held(storage, uri, "run D", 0, said.append):
        pass


def test_a_holder_holding_its_lease_again_holds_it_on_until_its_outer_hold_ends(place):
    """A step holding its table's lease runs code that holds it too (its IO manager's store):
    the inner hold neither waits for the outer one nor lets go when it ends."""
    storage, uri = place
    with lease.held(storage, uri, "run A", 0, print):
        with lease.held(storage, uri, "run A", 0, print):
            pass
        with pytest.raises(lease.TableBusy, match="run A"), lease.held(storage, uri, "run B", 0, print):
            pytest.fail("the lease was let go when the inner hold ended")
    with lease.held(storage, uri, "run B", 0, print):
        pass


def test_a_lease_lost_while_an_inner_hold_ran_stops_its_caller(moto_server, s3_bucket, monkeypatch):
    """The changes step holds its lease around its IO manager's store: should the lease be taken
    while the store held it on, the step learns it as the store ends, before it notes what it
    stored, not at its own end."""
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/lake/_leases/unit/accounts/lease.json"
    monkeypatch.setattr(lease, "RENEW_SECONDS", 600.0)
    noted = []
    with pytest.raises(lease.LeaseLost), lease.held(storage, uri, "run A", 0, print):
        try:
            with lease.held(storage, uri, "run A", 0, print):
                _take_away(storage, uri, "run B")
            noted.append("the stored note")
        except lease.LeaseLost as lost:
            assert "is no longer run A's" in str(lost)
            raise
    assert noted == []


def test_an_s3_stamp_still_tells_earlier_readers_when_it_runs_out(moto_server, s3_bucket):
    """A reader of an earlier lake_assets judges a lease by `expires_at` (its holder's clock):
    a stamp without it read to that reader as nobody's, and it took a live lease."""
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/lake/_leases/unit/accounts/lease.json"
    with lease.held(storage, uri, "run A", 0, print):
        found = storage.read_tagged(uri)
        assert found is not None
        stamp = json.loads(found.data)
        assert stamp["who"] == "run A" and stamp["expires_at"] > time.time() + 60


def test_a_writer_that_fails_lets_go_of_the_lease(place):
    storage, uri = place
    with pytest.raises(RuntimeError, match="the step broke"), lease.held(storage, uri, "run A", 0, print):
        raise RuntimeError("the step broke")
    with lease.held(storage, uri, "run B", 0, print):
        pass


HOLDER = textwrap.dedent(
    """
    import sys, time
    from lake_assets import lease
    from lake_assets.config_model import S3Config
    from lake_assets.storage import Storage

    uri, endpoint, clock_behind = sys.argv[1], sys.argv[2] or None, float(sys.argv[3])
    lease.EXPIRES_SECONDS, lease.RENEW_SECONDS = 4.0, 1.0
    real_clock = time.time
    time.time = lambda: real_clock() - clock_behind  # this machine's clock, set wrong
    with lease.held(Storage(S3Config(endpoint_url=endpoint)), uri, "run K", 0, print):
        print("held", flush=True)
        time.sleep(600)
    """
)


def test_a_killed_holder_holds_up_the_next_writer_for_its_expiry_at_most(place, moto_server):
    """On a file system the system lets go of a dead process's lock at once; on S3 the lease
    runs out `EXPIRES_SECONDS` after its last renewal (here 4 s)."""
    storage, uri = place
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, uri, moto_server.url if uri.startswith("s3a") else "", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        time.sleep(5.0)  # on S3 its first stamp ran out at 4 s: held by its renewals since
        with pytest.raises(lease.TableBusy, match="run K"), lease.held(storage, uri, "run B", 0, print):
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        began = time.monotonic()
        with lease.held(storage, uri, "run B", 30, print):
            waited = time.monotonic() - began
        # S3 stamps whole seconds: the store may see the lease 4 s old up to 2 s late, and the
        # waiter looks once a second
        assert waited < (1.5 if uri.startswith("file") else 8.0), waited
    finally:
        holder.kill()


def test_a_lease_is_held_by_the_store_s_clock_not_by_the_clocks_of_its_writers(moto_server, s3_bucket):
    """A holder whose clock runs ten minutes behind still holds its S3 lease: whether a lease
    ran out is the store's to say (its `Date` against the lease's `Last-Modified`), so a
    second writer on a machine with another time does not take a live lease."""
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/lake/_leases/unit/accounts/lease.json"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, uri, moto_server.url, "600"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for _ in range(3):  # across its renewals (every second here) and beyond a first expiry
            with pytest.raises(lease.TableBusy, match="run K"), lease.held(storage, uri, "run B", 0, print):
                pytest.fail("a live lease was taken from a holder whose clock is behind")
            time.sleep(2.0)
        found = storage.read_tagged(uri)
        assert found is not None and 0 <= found.age_seconds <= 2, found
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_renewal_whose_answer_was_lost_keeps_the_lease(moto_server, s3_bucket, monkeypatch):
    """A renewal that reached the store but whose answer was lost (a timeout) left the holder's
    stamp under an ETag it never saw. The next renewal finds its own stamp there, by its token,
    and goes on holding the lease; it was taken for another writer's, and the lease let go.
    (A stamp's bytes are the same at every renewal, and moto's ETag is their MD5, as S3's is
    unless the bucket encrypts with KMS: each write here adds a count, so each ETag differs.)"""
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/lake/_leases/unit/accounts/lease.json"
    monkeypatch.setattr(lease, "RENEW_SECONDS", 0.3)
    stamp, stamps = lease._S3Lease._stamp, itertools.count()
    monkeypatch.setattr(
        lease._S3Lease,
        "_stamp",
        lambda self, released=False: stamp(self, released)[:-1] + f', "write": {next(stamps)}}}'.encode(),
    )
    writes = storage.write_if_tag
    calls = []

    def answer_lost_once(*args):
        calls.append(args)
        tag = writes(*args)
        if len(calls) == 2:  # the first renewal
            raise OSError("the answer timed out")
        return tag

    monkeypatch.setattr(storage, "write_if_tag", answer_lost_once)
    with lease.held(storage, uri, "run A", 0, print):
        time.sleep(1.5)
        lease.confirm_held()
        with pytest.raises(lease.TableBusy, match="run A"), lease.held(storage, uri, "run B", 0, print):
            pass
    assert len(calls) > 3


def test_a_holder_whose_lease_was_taken_while_it_ran_fails(moto_server, s3_bucket, monkeypatch):
    """A holder whose renewals fail for the whole expiry may find the lease taken: it cannot
    know what the other writer did meanwhile, so its step fails instead of passing as done."""
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/lake/_leases/unit/accounts/lease.json"
    monkeypatch.setattr(lease, "RENEW_SECONDS", 0.3)
    with (
        pytest.raises(lease.LeaseLost, match="was taken by another writer"),
        lease.held(storage, uri, "run A", 0, print),
    ):
        # as another writer would, once the lease ran out
        found = storage.read_tagged(uri)
        assert found is not None
        storage.write_if_tag(
            uri, lease.Holder("run B", time.time(), expires_after_seconds=60).to_json(), found.tag
        )
        time.sleep(1.5)
    with pytest.raises(lease.TableBusy, match="run B"), lease.held(storage, uri, "run C", 0, print):
        pass


def _take_away(storage: Storage, uri: str, who: str) -> None:
    """Take the lease at `uri` as another writer would once it ran out."""
    found = storage.read_tagged(uri)
    assert found is not None
    assert storage.write_if_tag(
        uri, lease.Holder(who, time.time(), expires_after_seconds=60).to_json(), found.tag
    )


def test_a_fold_whose_lease_was_taken_commits_nothing(moto_server, s3_bucket, monkeypatch):
    """A holder learns it lost its lease before its commit, not at its step's end: the commit
    renews the lease first and stops, with the table and its staging as they were."""
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    state = TableState(LakeLayout(f"s3a://{s3_bucket}/lake"), "unit", "accounts")
    uri = state.layout.lease("unit", "accounts")
    monkeypatch.setattr(lease, "RENEW_SECONDS", 600.0)  # its renewals would not notice in time
    plan = CommitPlan("fold-1")
    staged = f"{state.staging(plan.fold_id)}/part-0.parquet"
    storage.write_bytes(staged, b"rows")
    plan.stage_files([staged], f"{state.current}")
    with pytest.raises(lease.LeaseLost), lease.held(storage, uri, "run A", 0, print):
        lease.confirm_held()  # still its own: nothing to say
        _take_away(storage, uri, "run B")
        with pytest.raises(lease.LeaseLost, match="is no longer run A's"):
            commit(storage, state, plan)
    assert storage.exists(staged)
    assert not storage.exists(plan.adds[0][1])
    assert not storage.list(state.commits)


def test_a_lease_that_cannot_be_renewed_is_confirmed_only_while_it_cannot_have_run_out(
    moto_server, s3_bucket, monkeypatch
):
    """With the store out of reach the holder cannot renew: it may go on committing only while
    the lease it last renewed cannot have run out yet."""
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/lake/_leases/unit/accounts/lease.json"
    monkeypatch.setattr(lease, "RENEW_SECONDS", 600.0)
    monkeypatch.setattr(lease, "EXPIRES_SECONDS", 3.0)
    lease.confirm_held()  # outside a step that holds a lease: nothing to confirm
    with lease.held(storage, uri, "run A", 0, print):
        writes = storage.write_if_tag

        def out_of_reach(*args):
            raise OSError("the store cannot be reached")

        monkeypatch.setattr(storage, "write_if_tag", out_of_reach)
        lease.confirm_held()
        time.sleep(2.2)
        with pytest.raises(lease.LeaseLost, match="could not be renewed"):
            lease.confirm_held()
        monkeypatch.setattr(storage, "write_if_tag", writes)


def test_conditional_writes_refuse_a_changed_or_existing_object(moto_server, s3_bucket):
    storage = Storage(S3Config(endpoint_url=moto_server.url))
    uri = f"s3a://{s3_bucket}/lake/note.json"
    assert storage.read_tagged(uri) is None
    first = storage.write_if_tag(uri, b"1", None)
    assert first is not None
    assert storage.write_if_tag(uri, b"2", None) is None  # it exists now
    second = storage.write_if_tag(uri, b"2", first)
    found = storage.read_tagged(uri)
    assert second is not None and found is not None and (found.data, found.tag) == (b"2", second)
    assert storage.write_if_tag(uri, b"3", first) is None  # changed since `first`
    assert storage.read_bytes(uri) == b"2"
