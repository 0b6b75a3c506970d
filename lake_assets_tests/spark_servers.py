"""Spark servers the scale-out tests start from pyspark's own distribution, on 127.0.0.1 only:
a standalone master with one worker (executors in their own JVMs and Python workers), and a
Spark Connect server. Each is stopped (its whole process group) when the test is done; one
that does not come up fails the test with the end of its log.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from pyspark.find_spark_home import _find_spark_home

from lake_assets import spark as spark_settings
from lake_assets_tests.loopback import free_port

START_TIMEOUT = 120


class ServerFailed(RuntimeError):
    pass


class _Process:
    """A server process in its own process group, its output in a log file."""

    def __init__(self, name: str, args: list[str], log_dir: Path, env: dict[str, str]):
        self.name, self.log = name, log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def tail(self, lines: int = 30) -> str:
        return (
            "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""
        )

    def check_running(self) -> None:
        if self.process.poll() is not None:
            raise ServerFailed(f"{self.name} exited with {self.process.returncode}:\n{self.tail()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def _spark_env(work: Path) -> dict[str, str]:
    """Every Spark daemon binds and advertises loopback, logs and works under `work`."""
    return {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_HOSTNAME": "localhost",
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_PID_DIR": str(work / "pids"),
        "SPARK_WORKER_DIR": str(work / "worker"),
        "SPARK_LOCAL_DIRS": str(work / "scratch"),
        "SPARK_CONF_DIR": str(work / "conf"),
    }


def _wait(what: str, ready, processes: list[_Process]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        for process in processes:
            process.check_running()
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise ServerFailed(
        f"{what} did not come up in {START_TIMEOUT} s:\n" + "\n".join(p.tail() for p in processes)
    )


class StandaloneCluster:
    """`spark-class ...Master` and one `...Worker` with 2 cores, on 127.0.0.1."""

    def __init__(self, work: Path, worker_memory: str = "3g"):
        self.work, self.worker_memory = work, worker_memory
        self.port, self.ui_port = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[_Process] = []

    def start(self) -> StandaloneCluster:
        spark_class = str(Path(_find_spark_home()) / "bin" / "spark-class")
        env = _spark_env(self.work)
        (self.work / "conf").mkdir(parents=True, exist_ok=True)
        try:
            self.processes.append(
                _Process(
                    "master",
                    [
                        spark_class,
                        "org.apache.spark.deploy.master.Master",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(self.port),
                        "--webui-port",
                        str(self.ui_port),
                    ],
                    self.work,
                    env,
                )
            )
            _wait("the standalone master", lambda: self._status() is not None, self.processes)
            self.processes.append(
                _Process(
                    "worker",
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        "2",
                        "--memory",
                        self.worker_memory,
                        "--webui-port",
                        str(free_port()),
                        "--work-dir",
                        str(self.work / "worker"),
                        self.master_url,
                    ],
                    self.work,
                    env,
                )
            )
            _wait(
                "a worker registered with the master",
                lambda: (self._status() or {}).get("aliveworkers", 0) >= 1,
                self.processes,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _status(self) -> dict | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
            return json.load(response)

    def spark_conf(self, python: str, jvm_options: str = "") -> dict[str, str]:
        """The lake's `spark.conf` for this cluster: executors run `python` (the project's
        environment), the driver is reachable on loopback, and the app takes the worker's cores;
        the driver and executors get `jvm_options`, if any."""
        conf = {
            "spark.pyspark.python": python,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "2g",
            "spark.cores.max": "2",
        }
        if jvm_options:
            conf["spark.driver.extraJavaOptions"] = conf["spark.executor.extraJavaOptions"] = jvm_options
        return conf

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


class ConnectServer:
    """`spark-submit --class ...SparkConnectServer` on 127.0.0.1 with a token of its own; s3a
    wired to `s3_endpoint` when given (a Connect server's s3a settings are its own), and `conf`
    on top."""

    def __init__(self, work: Path, s3_endpoint: str | None = None, conf: Mapping[str, str] | None = None):
        self.work, self.s3_endpoint, self.extra_conf = work, s3_endpoint, dict(conf or {})
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"sc://127.0.0.1:{self.port}"
        self.processes: list[_Process] = []

    def start(self, python: str, jvm_options: str = "") -> ConnectServer:
        spark_submit = str(Path(_find_spark_home()) / "bin" / "spark-submit")
        env = {
            **_spark_env(self.work),
            "SPARK_CONNECT_AUTHENTICATE_TOKEN": self.token,
            "PYSPARK_PYTHON": python,
        }
        (self.work / "conf").mkdir(parents=True, exist_ok=True)
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.memory": "2g",
            "spark.pyspark.python": python,
        }
        if jvm_options:
            conf["spark.driver.extraJavaOptions"] = jvm_options
        if self.s3_endpoint:
            conf.update(
                {
                    key: value
                    for key, value in spark_settings.session_conf(
                        use_s3=True, s3_endpoint_url=self.s3_endpoint
                    ).items()
                    if key.startswith("spark.hadoop.") or key == "spark.jars"
                }
            )
            # the server's own keys, from its environment (as an operator would give them)
            conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
                "com.amazonaws.auth.EnvironmentVariableCredentialsProvider"
            )
        conf.update(self.extra_conf)
        args = [
            spark_submit,
            "--master",
            "local[2]",
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name",
            "lake_assets test Connect server",
        ]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        self.processes.append(_Process("connect", args, self.work, env))
        try:
            _wait("the Spark Connect server", self._answers, self.processes)
        except BaseException:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=2):
            return True

    def stop(self) -> None:
        for process in self.processes:
            process.stop()
