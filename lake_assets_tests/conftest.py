"""Shared test parts: a moto S3/DynamoDB server on 127.0.0.1 and one SparkSession for the run.

Both are real: the session has Spark's s3a connector pointed at the moto server, so the same
session serves local-lake and S3 tests. When a part cannot start, the tests that need it fail
with the reason; nothing is skipped.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hypothesis import settings

from lake_assets.spark import DRIVER_JAVA_OPTIONS_ENV
from lake_assets_tests.jvm_options import TEST_JVM_OPTIONS
from lake_assets_tests.loopback import free_port

# The same examples on every run by default, so a run's result does not depend on its seed;
# `--hypothesis-profile explore` draws new ones (a failure found that way is kept in
# .hypothesis/ and replayed first by every later run on that machine).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("repeatable")

# Tests must never reach a real AWS account, whatever the developer's environment holds.
os.environ["AWS_ACCESS_KEY_ID"] = "lake-assets-test"
os.environ["AWS_SECRET_ACCESS_KEY"] = "lake-assets-test-secret"
os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
os.environ.pop("AWS_SESSION_TOKEN", None)
os.environ.pop("AWS_PROFILE", None)

# The quick JIT for the short-lived drivers the tests start as processes (`jvm_options` says
# why): set before any test starts one, and inherited by all of them. The `spark` fixture's own
# driver, in this process, leaves it out.
os.environ.setdefault(DRIVER_JAVA_OPTIONS_ENV, TEST_JVM_OPTIONS)


def pytest_collection_modifyitems(items):
    """`-m spark` / `-m "not spark"`: a test that asks for the SparkSession is a Spark test.

    Modules marked `minutes(n)` run first, longest first. pytest-xdist hands whole modules
    (`--dist loadfile`) to the workers in collection order (`--no-loadscope-reorder`: its
    default order is by how many tests a module holds), so a module of many minutes met last
    (the deployment tests hold seven) ran alone at the end while the other worker idled;
    started first, the short modules fill in around them."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
    items.sort(key=_minutes_first)


def _minutes_first(item) -> float:
    marker = item.get_closest_marker("minutes")
    return -float(marker.args[0]) if marker is not None else 0.0


# moto's request log would bury test output.
logging.getLogger("werkzeug").setLevel(logging.WARNING)


class MotoServer:
    def __init__(self):
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def client(self, service: str):
        import boto3

        return boto3.client(service, endpoint_url=self.url, region_name="us-east-1")

    def upload(self, bucket: str, local_root: Path, prefix: str) -> None:
        """Every file under `local_root` to `bucket`, under `prefix` and its path below the root."""
        client = self.client("s3")
        for path in local_root.rglob("*"):
            if path.is_file():
                client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local_root).as_posix()}")


@pytest.fixture(scope="session")
def moto_server():
    server = MotoServer().start()
    try:
        server.client("s3").list_buckets()
    except Exception as exc:  # noqa: BLE001 - the server thread failed to bind or serve
        server.stop()
        pytest.fail(f"moto server on 127.0.0.1:{server.port} did not answer: {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark(moto_server):
    """The test run's only SparkSession: local[2], s3a wired to the moto server.

    Dagster resources created later in the same process reuse it (getOrCreate).
    """
    from lake_assets import spark as spark_settings

    # This driver lives as long as the pytest process and runs hundreds of tests' queries: the
    # JDK's optimising compiler pays for itself here, so it keeps the JDK's default JIT (the
    # quick-compiler option is for the short-lived drivers the tests start as processes).
    with pytest.MonkeyPatch.context() as env:
        env.delenv(DRIVER_JAVA_OPTIONS_ENV, raising=False)
        conf = spark_settings.session_conf(use_s3=True, s3_endpoint_url=moto_server.url)
    session = spark_settings.build_session(conf)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def s3_bucket(moto_server, request):
    """A fresh bucket per test."""
    name = "lake-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    name = "".join(c for c in name if c.isalnum() or c == "-")
    moto_server.client("s3").create_bucket(Bucket=name)
    return name
