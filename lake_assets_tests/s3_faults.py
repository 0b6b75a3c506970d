"""An S3 endpoint on 127.0.0.1 in front of the moto server that fails the reads of chosen
objects the way a real store's requests fail: a throttling answer (503 SlowDown), or a
connection closed before an object's bytes. Every other read passes through unchanged; it
serves reads only (GET and HEAD: listings are GETs), and refuses any other request.

A test points Spark's s3a connector at it for one bucket (`fs.s3a.bucket.<name>.endpoint`), so
the lake's own client and every other bucket keep talking to moto directly; or the lake's own
client (`LakeConfig.s3`'s endpoint) for a step that only reads the landing. A fault lasts until
`heal`, or for a number of requests (one that passes)."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from lake_assets.config import CollectionConfig, FeedConfig, LakeConfig, S3Config
from lake_assets.demo.flow_sample import write_flow_landing
from lake_assets.demo.grax_sample import write_grax_landing
from lake_assets.demo.unit_sample import write_unit_landing

if TYPE_CHECKING:
    from lake_assets_tests.conftest import MotoServer

THROTTLE, CUT = "throttle", "cut"
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>fault-1</RequestId></Error>"
)
#: headers not passed on: hop-by-hop ones (it answers with a length of its own), and those its
#: own answer carries already
_NOT_PASSED = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "proxy-connection",
    "te",
    "upgrade",
    "expect",
    "server",
    "date",
}


@dataclasses.dataclass
class _Faults:
    #: ("/bucket/key", HTTP method) -> THROTTLE or CUT
    of_request: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    #: ("/bucket/key", HTTP method) -> how many more requests get its fault (absent: until `heal`)
    remaining: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    #: (fault, HTTP method) -> how many requests it was delivered to
    delivered: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class FaultyS3:
    """`with FaultyS3(upstream).serving() as s3:`, then `s3.fail(bucket, key, THROTTLE)`; `s3.url`
    is the endpoint, `s3.heal()` lets every request through again."""

    def __init__(self, upstream_url: str):
        self.upstream = urllib.parse.urlsplit(upstream_url)
        self.url = ""  # set once it listens
        self.faults = _Faults()

    def fail(
        self, bucket: str, key: str, how: str, methods: tuple[str, ...] = ("GET",), times: int | None = None
    ) -> None:
        """Answer `methods` requests for the object with the fault `how` until `heal`, or only
        the next `times` requests of each method (a fault that passes)."""
        if how == CUT and "HEAD" in methods:
            raise ValueError("a HEAD's answer has no bytes to cut")
        with self.faults.lock:
            for method in methods:
                self.faults.of_request[(f"/{bucket}/{key}", method)] = how
                if times is None:
                    self.faults.remaining.pop((f"/{bucket}/{key}", method), None)
                else:
                    self.faults.remaining[(f"/{bucket}/{key}", method)] = times

    def heal(self) -> None:
        """Let every request through again."""
        with self.faults.lock:
            self.faults.of_request.clear()
            self.faults.remaining.clear()

    def delivered(self, how: str, method: str = "GET") -> int:
        """How many `method` requests got the fault `how`."""
        with self.faults.lock:
            return self.faults.delivered.get((how, method), 0)

    @contextlib.contextmanager
    def serving(self) -> Iterator[FaultyS3]:
        """Listen on a port of 127.0.0.1 the system picks. Connections the JVM keeps open are
        served by daemon threads until the process ends: they only ever pass reads through."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name="faulty-s3", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)


def _handler_for(s3: FaultyS3) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args) -> None:  # quiet: a test's output is its own
            pass

        def _fault(self) -> str | None:
            request = (urllib.parse.unquote(urllib.parse.urlsplit(self.path).path), self.command)
            with s3.faults.lock:
                fault = s3.faults.of_request.get(request)
                left = s3.faults.remaining.get(request)
                if left is not None:
                    if left <= 0:
                        return None
                    s3.faults.remaining[request] = left - 1
                return fault

        def _count(self, how: str) -> None:
            with s3.faults.lock:
                key = (how, self.command)
                s3.faults.delivered[key] = s3.faults.delivered.get(key, 0) + 1

        def _relay(self) -> None:
            fault = self._fault()
            if fault == THROTTLE:
                self._count(THROTTLE)
                self._answer(503, {"Content-Type": "application/xml"}, _SLOW_DOWN, length=len(_SLOW_DOWN))
                return
            upstream = http.client.HTTPConnection(s3.upstream.netloc, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_PASSED}
                upstream.request(self.command, self.path, headers=headers)
                answer = upstream.getresponse()
                content = answer.read()
                passed = {k: v for k, v in answer.getheaders() if k.lower() not in _NOT_PASSED}
            finally:
                upstream.close()
            if fault == CUT and content:
                self._count(CUT)
                self._cut(answer.status, passed, content)
            else:
                self._answer(answer.status, passed, content)

        def _refuse(self) -> None:
            self.send_error(501, "this endpoint serves reads only")

        def _answer(self, status: int, headers: dict, content: bytes, length: int | None = None) -> None:
            """Pass an answer on; a HEAD's gives the object's length (`headers`), with no bytes."""
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() != "content-length" or self.command == "HEAD":
                    self.send_header(name, value)
            if self.command != "HEAD" or length is not None:
                self.send_header("Content-Length", str(len(content) if length is None else length))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(content)

        def _cut(self, status: int, headers: dict, content: bytes) -> None:
            """The whole length promised, none of the bytes sent: the connection closes first."""
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True

        do_GET = do_HEAD = _relay
        do_PUT = do_POST = do_DELETE = _refuse

    return Handler


#: the connector's retries kept short (`bucket_read_through` sets the read's own limit; a Spark
#: Connect server started for a test takes these as they are): a fault that lasts fails a read in about a second (the
#: AWS SDK still waits a few hundred milliseconds before its retry of a throttled request)
FEW_RETRIES = {
    "attempts.maximum": "1",
    "retry.limit": "1",
    "retry.interval": "10",
    "retry.throttle.limit": "1",
    "retry.throttle.interval": "10",
}


@contextlib.contextmanager
def bucket_read_through(spark, bucket: str, endpoint: str, retries: int = 1) -> Iterator[None]:
    """Spark's s3a connector (the test session's) reads `bucket` from `endpoint`, with few
    retries (`retries` of a failed read); every other bucket as before. The bucket's connector
    must not exist yet (a bucket of its own per test), since s3a reads these settings when it
    opens a bucket."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    settings = {"endpoint": endpoint, **FEW_RETRIES, "retry.limit": str(retries)}
    for name, value in settings.items():
        hadoop.set(f"fs.s3a.bucket.{bucket}.{name}", value)
    try:
        yield
    finally:
        for name in settings:
            hadoop.unset(f"fs.s3a.bucket.{bucket}.{name}")


@dataclasses.dataclass(frozen=True)
class LandingOnS3:
    """A feed's small landing in a bucket, the key of a good file to fail, and a local lake."""

    feed: FeedConfig
    victim: str  #: the key of a good file of the landing, for a fault
    lake: Path

    @property
    def bucket(self) -> str:
        return urllib.parse.urlsplit(self.feed.landing).netloc

    def config(self, endpoint: str) -> LakeConfig:
        """The lake (a local folder) over the landing, the lake's own client at `endpoint`."""
        return LakeConfig(lake=f"file://{self.lake}", feeds=(self.feed,), s3=S3Config(endpoint_url=endpoint))

    def files_in_changes(self) -> set[str]:
        """The landed files the feed's change logs hold rows of."""
        files = [str(path) for path in (self.lake / "changes" / self.feed.name).rglob("*.parquet")]
        if not files:
            return set()
        query = f"SELECT DISTINCT _source_file FROM read_parquet({files}, union_by_name = true)"
        return {uri for (uri,) in duckdb.connect().execute(query).fetchall()}


def landing_on_s3(moto: MotoServer, bucket: str, root: Path, feed: str) -> LandingOnS3:
    """A small sample of `feed` (unit, grax or flow) under `landing/<feed>` in `bucket`, with a
    lake in `root`; its victim is the data file halfway through the sample's files (of Unit's
    `accounts`, of GRAX's `Account`, of any Flow journal)."""
    prefix = f"landing/{feed}"
    landing = f"s3a://{bucket}/{prefix}"
    if feed == "unit":
        folder = write_unit_landing(root / prefix, hours=2, tables=("accounts",)).landing_dir
        config = FeedConfig(name=feed, format="unit_cdc", landing=landing, tables=("accounts",))
        files = sorted(folder.rglob("*.parquet"))
    elif feed == "grax":
        folder = write_grax_landing(root / prefix, batches=4).landing_dir
        config = FeedConfig(name=feed, format="grax_v2", landing=landing, objects=("Account",))
        files = sorted(path for path in folder.rglob("*.parquet") if "object=Account" in path.as_posix())
    else:
        flow = write_flow_landing(root / prefix)
        folder = flow.landing_dir
        collections = tuple(
            CollectionConfig(name=name, key=tuple(key)) for name, key in flow.collections.items()
        )
        config = FeedConfig(name=feed, format="flow_journal", landing=landing, collections=collections)
        files = sorted(path for path in folder.rglob("*") if path.is_file() and not path.name.startswith("."))
    moto.upload(bucket, folder, prefix)
    victim = files[len(files) // 2].relative_to(folder).as_posix()
    return LandingOnS3(config, f"{prefix}/{victim}", root / "lake")
