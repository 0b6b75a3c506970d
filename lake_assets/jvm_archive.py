"""The embedded driver's class-data archive: Spark's classes loaded, verified and laid out once,
at set-up, then mapped into every later driver JVM instead of being read from the jars again.

Every `lake-assets run`, every Dagster run worker and every test process starts a driver JVM,
and before its first query returns that JVM has loaded some ten thousand classes from Spark's
jars: on two cores, a large share of a short run. Mapped from the archive, the session starts
and the first query returns in about half the time (docs/profiling.md, "Figures behind the
code").

The JDK (17 and later) writes the classes a JVM loaded into such an archive when it exits
(`-XX:ArchiveClassesAtExit`). `build` runs the demo (all three feeds, a quarantined file) in a
JVM that does so; `./dev setup` calls it. An archive fits only the JVM and the Spark jars it was
made from, so its name carries both; without a fitting archive a driver starts as before.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lake_assets.errors import LakeAssetsError
from lake_assets.spark import DRIVER_JAVA_OPTIONS_ENV, EMBEDDED_JVM_OPTIONS, cache_dir


class ArchiveNotBuilt(LakeAssetsError):
    """The demo run that writes the archive, or the check of what it wrote, failed."""


def java_path() -> Path | None:
    """The java PySpark's launcher runs: JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).is_file() else None


def spark_jars_folder() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def archive_path() -> Path | None:
    """Where the archive for this JVM and these Spark jars lives (None without a java, or when
    the cache's path could not be given to the JVM).

    The JDK build (its executable's path and time) and the jars (their folder, names, sizes and
    times) name it: an upgrade of either looks for a new archive rather than mapping one that no
    longer fits. The JVM refuses an archive when a jar's time differs from the one it was made
    with, so a reinstall of the same pyspark (new file times) looks for a new one too.
    """
    java = java_path()
    if java is None:
        return None
    jars = spark_jars_folder()
    # The archive records the class path it was made with (the jars' folder): a virtualenv
    # elsewhere, with the same jars, is another class path. The name's first part says which
    # JVM and folder, so a new install's archive can replace the old one (`_remove_replaced`).
    where = hashlib.sha256(f"{java}:{jars.resolve()}".encode())
    made_from = hashlib.sha256(f"{java.stat().st_mtime_ns}".encode())
    for jar in sorted(jars.glob("*.jar")) if jars.is_dir() else ():
        stat = jar.stat()
        made_from.update(f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    name = f"spark-classes-{where.hexdigest()[:16]}-{made_from.hexdigest()[:16]}.jsa"
    archive = cache_dir() / "jvm" / name
    # Spark splits `spark.driver.extraJavaOptions` at white space: a path holding any (or a
    # quote) would break the driver's command line, so such a cache gets no archive.
    return None if any(c.isspace() or c in "\"'" for c in str(archive)) else archive


def driver_java_options() -> str:
    """The embedded driver's JVM options: the lake's, the archive's when one fits this JVM and
    these jars, and those the environment adds (`DRIVER_JAVA_OPTIONS_ENV`)."""
    archive = archive_path()
    options = [EMBEDDED_JVM_OPTIONS]
    if archive is not None and archive.is_file():
        options.append(f"-XX:SharedArchiveFile={archive}")
    options.append(os.environ.get(DRIVER_JAVA_OPTIONS_ENV, "").strip())
    return " ".join(o for o in options if o)


def build(log: Path | None = None) -> Path | None:
    """Write the archive for this JVM and these jars, unless there is one; returns its path
    (None without a java). The demo runs in a process of its own that writes the archive to a
    temporary name when its JVM exits; a second process must then start its driver with the
    archive required (`-Xshare:on`) before the archive takes its real name."""
    archive = archive_path()
    if archive is None or archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    log = log or archive.with_suffix(".log")
    partial = archive.with_name(f"{archive.stem}.{os.getpid()}.part")
    try:
        with tempfile.TemporaryDirectory(prefix="lake-assets-archive-") as scratch, open(log, "w") as out:
            _run_step(["--dump", str(partial), "--dir", scratch], out, "the demo run that writes it")
            _run_step(["--check", str(partial)], out, "a driver started with it")
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
    if archive_path() == archive:  # the jars did not change while it was made
        _remove_replaced(archive)
    return archive


def _remove_replaced(archive: Path) -> None:
    """Delete the archives (and their logs and failure marks) an earlier install of the same
    JVM and jars' folder left: no new driver maps them, and each is some 200 MB. Another
    build's `.part` file is left to it; a file that cannot be deleted stays (best effort)."""
    same_place = archive.name.rsplit("-", 1)[0] + "-"
    for old in archive.parent.glob(f"{same_place}*"):
        if old.suffix in (".jsa", ".log", ".failed") and old.stem != archive.stem:
            with contextlib.suppress(OSError):
                old.unlink()


def _run_step(args: list[str], out, what: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lake_assets.jvm_archive", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        # The demo's runs go to a throwaway instance, never to a deployment's DAGSTER_HOME.
        env={k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"},
        check=False,
    )
    if done.returncode != 0:
        raise ArchiveNotBuilt(f"the JVM class archive was not made: {what} failed (log: {out.name})")


def _dump(partial: Path, scratch: str) -> int:
    """Run the demo in a driver that writes its classes to `partial` when it exits, and wait
    for that JVM to exit."""
    from lake_assets.cli import main

    options = f"spark.driver.extraJavaOptions={EMBEDDED_JVM_OPTIONS} -XX:ArchiveClassesAtExit={partial}"
    code = main(["demo", "--dir", scratch, "--conf", options])
    _stop_driver()
    return code if partial.is_file() else 1


def _check(partial: Path) -> int:
    """Start a driver that must map the archive (`-Xshare:on` refuses to start otherwise) and
    run a query on it."""
    from lake_assets import spark

    required = f"{EMBEDDED_JVM_OPTIONS} -Xshare:on -XX:SharedArchiveFile={partial}"
    session = spark.build_session(spark.session_conf(extra={"spark.driver.extraJavaOptions": required}))
    rows = session.range(3).count()
    _stop_driver()
    return 0 if rows == 3 else 1


def _stop_driver() -> None:
    """Stop the session and wait for its JVM to exit: it writes an archive only then."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
    gateway = SparkContext._gateway
    process = getattr(gateway, "proc", None)
    if process is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()  # the gateway JVM exits when its stdin closes
        process.wait(timeout=600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lake_assets.jvm_archive", description=__doc__)
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--check", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump:
        return _dump(args.dump, args.dir)
    if args.check:
        return _check(args.check)
    archive = archive_path()
    if archive is None or archive.is_file():
        return 0
    failed = archive.with_suffix(".failed")
    if failed.is_file():  # tried before: not again on every set-up, each a demo run long
        return 0
    print(
        f"lake_assets: making the JVM class archive {archive} (runs the demo once: a few minutes)",
        file=sys.stderr,
    )
    try:
        build()
    except ArchiveNotBuilt as exc:
        # Drivers start without it, only slower: set-up goes on.
        failed.write_text(f"{exc}\n")
        print(
            f"lake_assets: {exc}; Spark drivers start without it (delete {failed} to try again)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
