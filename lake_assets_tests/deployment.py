"""A real Dagster deployment for end-to-end tests.

`dagster-webserver` and `dagster-daemon` run as separate processes against a temporary
`DAGSTER_HOME` whose `dagster.yaml` is one of the project's own (`deploy/`), both bound to
127.0.0.1, loading the code location from `workspace.yaml` with `LAKE_ASSETS_CONFIG` pointing at
the test's feed configuration. Tests talk to it the way users do: GraphQL (dagster-graphql's
client) and a browser.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from dagster_graphql import DagsterGraphQLClient

from lake_assets_tests.loopback import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}

RUNS_QUERY = """
query Runs($limit: Int) {
  runsOrError(limit: $limit) {
    __typename
    ... on Runs { results { runId status startTime endTime allPools tags { key value } assetSelection { path } } }
    ... on PythonError { message }
  }
}
"""

MATERIALIZATIONS_QUERY = """
query Materializations($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) {
    __typename
    ... on Asset { assetMaterializations(limit: 1000) { partition runId timestamp } }
  }
}
"""


CHECKS_QUERY = """
query Checks($path: [String!]!, $check: String!) {
  assetCheckExecutions(assetKey: {path: $path}, checkName: $check, limit: 100) { status runId partition }
}
"""

FAILURES_QUERY = """
query Failures($runId: ID!) {
  logsForRun(runId: $runId) {
    __typename
    ... on EventConnection {
      events {
        __typename
        ... on ExecutionStepFailureEvent { stepKey error { message causes { message } } }
        ... on RunFailureEvent { message }
      }
    }
  }
}
"""


BACKFILL_QUERY = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { status }
    ... on PythonError { message }
  }
}
"""
BACKFILL_DONE = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def wait_for(condition: Callable[[], object], timeout: float, what: str, every: float = 2.0):
    """Poll until `condition()` is truthy; its value is returned. Fails naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def _processes() -> Iterator[tuple[int, str, int, int]]:
    """(pid, state, parent, process group) of every process, from /proc."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # After the command's closing parenthesis (a command may hold one): state, parent,
            # process group, ...
            state, parent, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # gone meanwhile
        yield int(stat.parent.name), state, int(parent), int(group)


def _children(pid: int) -> list[int]:
    return [child for child, _, parent, _ in _processes() if parent == pid]


def parent_of(pid: int) -> int | None:
    return next((parent for child, _, parent, _ in _processes() if child == pid), None)


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, parents before children."""
    found, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def _running_process_groups() -> set[int]:
    """The process groups with a process that has not exited: a zombie (an orphan that no init
    reaps, as a container's first process may not) still counts for `killpg(group, 0)`."""
    return {group for _, state, _, group in _processes() if state not in ("Z", "X")}


def command_line(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class Deployment:
    """Webserver and daemon for one DAGSTER_HOME; the daemon can be stopped and started again."""

    def __init__(self, home: Path, lake_config: Path, instance_yaml: Path, env: dict[str, str] | None = None):
        self.home = home
        self.home.mkdir(parents=True, exist_ok=True)
        shutil.copy(instance_yaml, home / "dagster.yaml")
        self.port = free_port()
        self.env = {
            **os.environ,
            **(env or {}),
            "DAGSTER_HOME": str(home),
            "LAKE_ASSETS_CONFIG": str(lake_config),
        }
        self._groups: list[int] = []
        self.webserver: subprocess.Popen | None = None
        self.daemon: subprocess.Popen | None = None
        self.client = DagsterGraphQLClient("127.0.0.1", port_number=self.port, timeout=120)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.home / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._groups.append(process.pid)
        return process

    def start(self) -> Deployment:
        # The instance's storage is created once, first: a webserver, a daemon and their code
        # servers starting together on a fresh DAGSTER_HOME race to create SQLite's schema (seen
        # under load: "alembic_version has more than one head", and no code location loads).
        subprocess.run(
            [str(BIN / "dagster"), "instance", "migrate"],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        self.webserver = self._spawn(
            "webserver",
            [
                str(BIN / "dagster-webserver"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-w",
                str(ROOT / "workspace.yaml"),
            ],
        )
        self.start_daemon()
        wait_for(
            self._webserver_ready, 240, f"the webserver on {self.url} (log: {self.home / 'webserver.log'})"
        )
        return self

    def start_daemon(self) -> None:
        self.daemon = self._spawn(
            "daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(ROOT / "workspace.yaml")]
        )

    def stop_daemon(self) -> None:
        """Stop the daemon as an operator would (SIGTERM), leaving the runs it launched alone."""
        if self.daemon and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(60)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait(10)
        self.daemon = None

    def stop(self) -> None:
        """End everything this deployment started: webserver, daemons, their code servers and
        run workers (each daemon started a process group of its own)."""
        for group in self._groups:
            try:
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self._any_group_running():
            time.sleep(0.5)
        for group in self._groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _any_group_running(self) -> bool:
        for process in (self.webserver, self.daemon):
            if process is not None:
                process.poll()  # reaps our own children: no zombie left behind by the tests
        return not _running_process_groups().isdisjoint(self._groups)

    def _webserver_ready(self) -> bool:
        assert self.webserver is not None, "the webserver was started"
        if self.webserver.poll() is not None:
            raise AssertionError(f"the webserver exited: {(self.home / 'webserver.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/server_info", timeout=5) as reply:  # noqa: S310 - our http on loopback
                return reply.status == 200
        except OSError:
            return False

    # --- GraphQL ---------------------------------------------------------------------------
    def query(self, text: str, variables: dict | None = None) -> dict:
        # dagster-graphql's client has typed methods for runs; queries beyond them (backfills,
        # materialisations) go through the same client and transport.
        return self.client._execute(text, variables or {})

    def runs(self) -> list[dict]:
        result = self.query(RUNS_QUERY, {"limit": 500})["runsOrError"]
        assert result["__typename"] == "Runs", result
        for run in result["results"]:
            run["tags"] = {t["key"]: t["value"] for t in run["tags"]}
        return result["results"]

    def materialised_partitions(self, key: list[str]) -> list[dict]:
        result = self.query(MATERIALIZATIONS_QUERY, {"path": key})["assetOrError"]
        return result.get("assetMaterializations", []) if result["__typename"] == "Asset" else []

    def wait_for_backfill(self, backfill_id: str, timeout: float) -> str:
        """Wait until the backfill daemon has finished a backfill; returns its final status."""

        def status():
            found = self.query(BACKFILL_QUERY, {"id": backfill_id})["partitionBackfillOrError"]
            assert found["__typename"] == "PartitionBackfill", found
            return found["status"] if found["status"] in BACKFILL_DONE else None

        return wait_for(status, timeout, f"backfill {backfill_id}", every=3.0)

    def check_statuses(self, key: list[str], check: str) -> list[str]:
        """The statuses of an asset check's executions, as the asset's Checks tab lists them."""
        return [
            e["status"]
            for e in self.query(CHECKS_QUERY, {"path": key, "check": check})["assetCheckExecutions"]
        ]

    def failure_messages(self, run_id: str) -> list[str]:
        """What the UI shows for a failed run: its step failures' errors (each with the errors
        it was raised from) and the run failure."""
        events = self.query(FAILURES_QUERY, {"runId": run_id})["logsForRun"].get("events", [])
        return [
            "\n".join(
                [
                    error.get("message") or "",
                    *(cause.get("message") or "" for cause in error.get("causes") or []),
                ]
            )
            if (error := e.get("error"))
            else e.get("message") or ""
            for e in events
            if e["__typename"] in ("ExecutionStepFailureEvent", "RunFailureEvent")
        ]

    def wait_until_idle(self, timeout: float, settle: float = 20.0) -> list[dict]:
        """Wait until no run is queued or in progress, and none started for `settle` seconds
        (sensors and automation get their ticks in). Returns every run."""
        quiet_since = [None]

        def idle():
            runs = self.runs()
            busy = [r for r in runs if r["status"] not in FINISHED]
            if busy:
                quiet_since[0] = None
                return None
            signature = len(runs)
            if quiet_since[0] is None or quiet_since[0][0] != signature:
                quiet_since[0] = (signature, time.monotonic())
                return None
            return runs if time.monotonic() - quiet_since[0][1] >= settle else None

        return wait_for(idle, timeout, "every run to finish", every=3.0)

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}.log\n" + (self.home / f"{name}.log").read_text(errors="replace")[-4000:]
            for name in ("daemon", "webserver")
            if (self.home / f"{name}.log").exists()
        )


class PostgresServer:
    """A throwaway PostgreSQL server from the machine's binaries, on 127.0.0.1 only.

    PostgreSQL refuses to run as root; when the tests run as root, the server runs as the
    `postgres` system user (the Debian packages create it).
    """

    def __init__(self):
        # Not under pytest's temporary folders: those are private to the user running the tests.
        base = Path(tempfile.mkdtemp(prefix="lake-assets-pg-"))
        self.data = base / "pgdata"
        self.port = free_port()
        self.user = "lake"
        self.database = "dagster"
        run_as = {}
        if os.geteuid() == 0:
            import pwd

            pw = pwd.getpwnam("postgres")
            os.chown(base, pw.pw_uid, pw.pw_gid)
            run_as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        self._run_as = run_as
        self.base = base

    def _tool(self, name: str) -> str:
        found = shutil.which(name) or next(
            (str(p) for p in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None
        )
        if not found:
            raise AssertionError(f"PostgreSQL's {name} is not installed (Debian: apt-get install postgresql)")
        return found

    def _call(self, *args: str) -> None:
        result = subprocess.run(
            list(args),
            cwd=self.base,
            capture_output=True,
            text=True,
            timeout=120,
            **self._run_as,
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed: {result.stdout}{result.stderr}")

    def start(self) -> PostgresServer:
        self._call(self._tool("initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8")
        self._call(
            self._tool("pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.base / "postgres.log"),
            "-w",
            "start",
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k {self.base}",
        )
        self._call(
            self._tool("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, self.database
        )
        return self

    def env(self) -> dict[str, str]:
        """What deploy/dagster.yaml reads."""
        return {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": "",
            "DAGSTER_PG_DB": self.database,
        }

    def scalar(self, sql: str) -> str:
        result = subprocess.run(
            [
                self._tool("psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                self.user,
                "-d",
                self.database,
                "-At",
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    def stop(self) -> None:
        subprocess.run(
            [self._tool("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
            cwd=self.base,
            capture_output=True,
            timeout=60,
            **self._run_as,
            check=False,
        )
        shutil.rmtree(self.base, ignore_errors=True)
