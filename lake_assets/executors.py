"""What a session whose tasks run elsewhere (a cluster's executors, a Spark Connect server's)
needs from this process: the `lake_assets` package itself, and a Python that can import it.

Most of the lake's work is Spark SQL and runs in the JVM; the Flow reader's per-journal function
(`applyInArrow`) is Python and runs in the executors' Python workers. They import it from
`lake_assets`, with pyarrow, pydantic and cramjam beside it. `ship_package` sends this process's
copy of the package (so executors run the driver's code, whatever is installed there);
`check_executors` runs a small job that imports what the function needs and turns a missing
module into one error that says how to provide it (README, "Running on a Spark cluster").
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import io
import re
import sys
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import functions as F

import lake_assets
from lake_assets.errors import LakeAssetsError, first_line

#: what the executors' Python workers import: PySpark's Arrow functions need pyarrow and pandas;
#: the lake's function (the Flow reader's) is in flow_tasks, which brings pydantic and cramjam
EXECUTOR_IMPORTS = ("pyarrow", "pandas", "lake_assets.feeds.flow_tasks")

#: distributions the cluster provides (Spark's own Python) or the session ships (lake_assets)
_PROVIDED = {"pyspark", "py4j", "lake_assets", "lake-assets"}

#: tasks of the probe job on Spark Connect (a classic session takes its default parallelism:
#: a task per core reaches every executor)
_CONNECT_PROBE_TASKS = 4

#: the session setting that records which package a session was prepared with
_PREPARED = "spark.lake_assets.executors.prepared"

HOW_TO_PROVIDE = (
    "give the executors a Python with lake_assets's dependencies: set spark.pyspark.python to one "
    "(the same path on every worker), or build one with './dev pack-env' and ship it with spark.archives "
    "(README: Running on a Spark cluster)"
)


class ExecutorEnvironmentError(LakeAssetsError):
    """The executors' Python cannot import what the lake's Python functions need."""


def package_zip() -> Path:
    """This process's `lake_assets` as a zip, named by its content (a changed package is a new
    file, an unchanged one the same), in the temporary folder."""
    root = Path(lake_assets.__file__).parent
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            # a fixed timestamp: the same sources give the same bytes, hence the same name
            info = zipfile.ZipInfo(
                str(Path("lake_assets") / path.relative_to(root)), date_time=(1980, 1, 1, 0, 0, 0)
            )
            archive.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
    data = buffer.getvalue()
    target = Path(tempfile.gettempdir()) / f"lake_assets-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not target.exists():
        partial = target.with_suffix(".partial")
        partial.write_bytes(data)
        partial.replace(target)
    return target


def ship_package(session) -> None:
    """Add this process's `lake_assets` to the Python path of the session's executors."""
    path = str(package_zip())
    if _is_connect(session):  # the server hands it to its executors
        try:
            session.addArtifacts(path, pyfile=True)
        except Exception as error:  # the same content under the same name: already there
            if "already exists" not in str(error).lower():
                raise
        return
    if not any(added.endswith(Path(path).name) for added in session.sparkContext.listFiles):
        session.sparkContext.addPyFile(path)


def prepare_executors(session) -> None:
    """Ship the package and check the executors' Python, once per session and package: the
    session remembers (in a setting of its own) which package it was prepared with, so the runs
    after the first in one process skip both."""
    prepared = package_zip().name
    if session.conf.get(_PREPARED, None) == prepared:
        return
    ship_package(session)
    check_executors(session)
    session.conf.set(_PREPARED, prepared)


def _is_connect(session) -> bool:
    return type(session).__module__.startswith("pyspark.sql.connect")


def missing_imports(_: object) -> str:
    """Run on an executor: the modules of EXECUTOR_IMPORTS that cannot be imported there, and why."""
    missing = []
    for module in EXECUTOR_IMPORTS:
        try:
            importlib.import_module(module)
        except ImportError as error:
            missing.append(f"{error.name or module} ({error})")
    return "; ".join(missing)


def check_executors(session) -> None:
    """Import, on the executors, what the lake's Python functions need; raise one error naming
    what is missing and how to provide it."""
    # a plain (pickled) UDF: an Arrow one would need pyarrow in the worker before the probe runs
    probe = F.udf(missing_imports, "string", useArrow=False)
    tasks = _CONNECT_PROBE_TASKS if _is_connect(session) else session.sparkContext.defaultParallelism
    try:
        found = {row[0] for row in session.range(0, tasks, 1, tasks).select(probe("id")).distinct().collect()}
    except Exception as error:  # noqa: BLE001 - the worker could not even start the probe (no pyarrow, no lake_assets, ...)
        raise ExecutorEnvironmentError(
            f"the executors' Python cannot run the lake's functions: "
            f"{_missing_module(str(error))}; {HOW_TO_PROVIDE}"
        ) from None
    problems = sorted(problem for problem in found if problem)
    if problems:
        raise ExecutorEnvironmentError(f"the executors' Python cannot import {problems[0]}; {HOW_TO_PROVIDE}")


def _missing_module(message: str) -> str:
    """The missing module a worker's error names, else the error's first line."""
    named = re.search(r"No module named '([^']+)'", message)
    if named:
        return f"no module named {named.group(1)!r}"
    pyarrow = re.search(r"(PyArrow|pandas) >= \S+ must be installed", message)
    if pyarrow:
        return pyarrow.group(0)
    return first_line(message)


def requirements() -> list[str]:
    """Exact pins (this environment's versions) of the distributions the executors' Python
    needs: what EXECUTOR_IMPORTS load, less what the cluster or the session provides. What
    `./dev pack-env` installs into the environment it packs for spark.archives."""
    before = set(sys.modules)
    for module in EXECUTOR_IMPORTS:
        importlib.import_module(module)
    loaded = {name.split(".")[0] for name in set(sys.modules) - before} | {
        m.split(".")[0] for m in EXECUTOR_IMPORTS
    }
    owners = importlib.metadata.packages_distributions()
    wanted = {dist for name in loaded for dist in owners.get(name, [])} - _PROVIDED
    return sorted(f"{dist}=={importlib.metadata.version(dist)}" for dist in wanted)


if __name__ == "__main__":  # python -m lake_assets.executors: the requirements, one per line
    print("\n".join(requirements()))
