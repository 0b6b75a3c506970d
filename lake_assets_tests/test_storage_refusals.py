"""Which failures to read a landed file set it aside (the store refuses its bytes until someone
acts) and which fail the step, to be run again (they may pass, or concern every request).

Pure: botocore's errors are built as S3 sends them; no server."""

from __future__ import annotations

import time

import botocore.exceptions
import pytest

from lake_assets.errors import StorageRequestError
from lake_assets.storage import _refuses_for_good


def _s3_failure(code: str, status: int) -> StorageRequestError:
    """What `Storage` raises for an S3 answer: the client's error as the cause."""
    answer = {"Error": {"Code": code, "Message": "…"}, "ResponseMetadata": {"HTTPStatusCode": status}}
    cause = botocore.exceptions.ClientError(answer, "GetObject")
    try:
        raise StorageRequestError(f"reading s3a://b/k: {cause}") from cause
    except StorageRequestError as error:
        return error


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("AccessDenied", 403),
        ("InvalidObjectState", 403),
        ("InvalidRequest", 400),
        ("KMS.DisabledException", 400),
    ],
)
def test_an_answer_about_the_object_refuses_it(code, status):
    assert _refuses_for_good(_s3_failure(code, status))


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("InternalError", 500),
        ("SlowDown", 503),
        ("RequestTimeout", 400),
        ("ExpiredToken", 400),
        ("InvalidAccessKeyId", 403),
        ("RequestTimeTooSkewed", 403),
    ],
)
def test_an_answer_that_may_pass_or_concerns_every_request_does_not(code, status):
    assert not _refuses_for_good(_s3_failure(code, status))


def test_a_local_permission_error_refuses_and_another_error_does_not():
    assert _refuses_for_good(PermissionError(13, "Permission denied"))
    assert not _refuses_for_good(OSError(5, "Input/output error"))
    assert not _refuses_for_good(
        botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    )


def test_each_request_tries_every_item_before_it_raises_the_first_failure():
    """A run writes its notes (and reads footers) with `each_request`; one failure must not leave
    the items queued behind it untried."""
    import threading

    from lake_assets.storage import PARALLEL_SMALL_REQUESTS, each_request

    tried: list[int] = []
    lock = threading.Lock()

    def request(item: int) -> int:
        with lock:
            tried.append(item)
        if item == 0:
            raise OSError("the first request failed")
        time.sleep(0.01)
        return item

    items = range(PARALLEL_SMALL_REQUESTS * 4)
    with pytest.raises(OSError, match="the first request failed"):
        each_request(request, items)
    assert sorted(tried) == list(items)
    assert each_request(lambda item: item * 2, range(40)) == [item * 2 for item in range(40)]


def _closed_loopback_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: the store out of reach."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("client", ["pyarrow", "boto3"])
def test_each_request_stops_asking_once_the_store_is_out_of_reach(client):
    """In an outage every request waits through its retries and timeouts: a run's thousand
    notes kept it waiting for each in turn before it failed. Once one request finds the store
    out of reach (from either client S3 is asked through), the requests not yet begun are not
    made, and that failure is raised."""
    import threading

    from lake_assets.config import S3Config
    from lake_assets.storage import PARALLEL_SMALL_REQUESTS, Storage, each_request

    storage = Storage(S3Config(endpoint_url=f"http://127.0.0.1:{_closed_loopback_port()}"))
    asked: list[str] = []
    lock = threading.Lock()

    def request(uri: str) -> object:
        with lock:
            asked.append(uri)
        return storage.exists(uri) if client == "pyarrow" else list(storage.walk_files(uri))

    uris = [f"s3a://bucket/notes/{n}.json" for n in range(PARALLEL_SMALL_REQUESTS * 20)]
    with pytest.raises(OSError, match=r"(?i)connect"):
        each_request(request, uris)
    assert len(asked) <= 2 * PARALLEL_SMALL_REQUESTS, len(asked)


@pytest.mark.parametrize(("code", "status"), [("AccessDenied", 403), ("NoSuchKey", 404), ("SlowDown", 503)])
def test_an_answer_from_the_store_is_not_the_store_out_of_reach(code, status):
    """A refusal of one request is an answer: the requests after it are still made."""
    from lake_assets.storage import store_out_of_reach

    assert not store_out_of_reach(_s3_failure(code, status))
    assert not store_out_of_reach(OSError("When reading key 'k': AWS Error ACCESS_DENIED during GetObject"))


def test_no_answer_is_found_behind_the_errors_raised_while_handling_it():
    """An error raised while handling a connection failure, without `from`, still tells of it."""
    from lake_assets.storage import store_out_of_reach

    try:
        try:
            raise botocore.exceptions.ConnectionClosedError(endpoint_url="http://127.0.0.1:9")
        except botocore.exceptions.BotoCoreError:
            raise StorageRequestError("reading s3a://b/k: the connection closed")  # noqa: B904
    except StorageRequestError as error:
        assert store_out_of_reach(error)


def test_an_error_raised_from_none_hides_the_failure_it_was_handling():
    """`raise ... from None` says the error handled is not the cause, as a traceback shows it."""
    from lake_assets.errors import InvalidValue
    from lake_assets.storage import store_out_of_reach

    try:
        try:
            raise botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:9")
        except botocore.exceptions.BotoCoreError:
            raise InvalidValue("a value no request could mend") from None
    except InvalidValue as error:
        assert not store_out_of_reach(error)
