"""The lake's own JVM class: Hadoop's local file system, setting file modes without a process.

Hadoop's local file system sets the mode of every file and folder it creates. Without Hadoop's
native library, which PySpark does not ship, it does so by starting a `chmod` process each
time: a write of a week's hourly change log (169 folders) starts some 700 of them, and on two
cores they cost a large share of the write (docs/profiling.md, "Figures behind the code").
`java/NioPermissionsLocalFileSystem.java` sets the same modes through `java.nio`.

It is compiled once, with the JDK's `javac`, against the Hadoop classes PySpark ships, into a
jar in the lake's cache; the jar's name carries a hash of the source, the `javac` and those
classes' jar (name, size, time), so an upgrade of any compiles it again. A jar made for an
earlier source stays (a few KB): two installs sharing the cache would otherwise remove each
other's at every start and compile again. Where there is no `javac` (a JRE alone) or the
compile fails, the lake writes through Hadoop's own local file system, as before: same files,
slower. A cluster's executors keep Hadoop's own too: the jar is only in this machine's cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import subprocess
import tempfile
import zipfile
from pathlib import Path

from filelock import FileLock

from lake_assets.jvm_archive import java_path, spark_jars_folder
from lake_assets.spark import cache_dir

#: the class `spark.hadoop.fs.file.impl` names when the jar is there
LOCAL_FILE_SYSTEM_CLASS = "lake_assets.hadoop.NioPermissionsLocalFileSystem"
SOURCE = Path(__file__).parent / "java" / "NioPermissionsLocalFileSystem.java"
#: the longest a compile may take before the lake goes on without it
COMPILE_SECONDS = 60
_URI_SAFE_PATH = re.compile(r"[A-Za-z0-9/._+@=~-]+")
_log = logging.getLogger(__name__)


def local_file_system_jar() -> Path | None:
    """The jar holding `LOCAL_FILE_SYSTEM_CLASS`, compiled now if the cache has none (None
    without a `javac` or PySpark's Hadoop classes, when the cache's path could not be given to
    Spark, or when the compile failed: a source `javac` refuses is tried once, its error kept
    in a `.failed` file beside where the jar would be, deleted to try again). Any settings of
    an embedded driver ask for it (`spark.session_conf`), so the first compiles it, ~1 s."""
    javac, hadoop = _javac(), _hadoop_classes()
    if javac is None or hadoop is None:
        return None
    made_from = hashlib.sha256(SOURCE.read_bytes())
    built = hadoop.stat()
    made_from.update(f"{javac}:{hadoop.name}:{built.st_size}:{built.st_mtime_ns}".encode())
    jar = cache_dir() / "classes" / f"lake-local-fs-{made_from.hexdigest()[:16]}.jar"
    # Spark reads the jar as a `local:` URI in a comma-separated list: any other character
    # could end the path early or make the URI invalid, and the driver would not start.
    if not _URI_SAFE_PATH.fullmatch(str(jar)):
        return None
    if not jar.is_file() and not _compiled_once(javac, hadoop, jar):
        return None
    return jar


def _compiled_once(javac: Path, hadoop: Path, jar: Path) -> bool:
    """Compile `jar` unless it is there or its source is known not to compile; whether it is
    there now. Processes starting drivers at once (the tests' two) take turns: the one that
    waited finds the other's jar, or its `.failed` file, and does not compile again."""
    failed = jar.with_suffix(".failed")
    try:
        jar.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(jar.with_suffix(".lock"), timeout=COMPILE_SECONDS):
            if jar.is_file():
                return True
            if failed.is_file():  # the source did not compile: every later driver would fail alike
                return False
            try:
                _compile(javac, hadoop, jar)
            except subprocess.CalledProcessError as error:
                _remember_the_failure(failed, error)  # before the lock goes: no one compiles it again
                return False
    # a full disk, a compile that hung, or the lock not had in time (filelock's `Timeout` is an
    # OSError): tried again next time
    except (OSError, subprocess.SubprocessError) as error:
        _log.warning(
            f"{SOURCE.name} was not compiled ({error}): local files are written through Hadoop's own class"
        )
        return False
    return True


def _remember_the_failure(failed: Path, error: subprocess.CalledProcessError) -> None:
    said = error.stderr.decode(errors="replace") if isinstance(error.stderr, bytes) else ""
    with contextlib.suppress(OSError):
        failed.write_text(f"{error}\n{said}", encoding="utf-8")
    _log.warning(
        f"{SOURCE.name} did not compile (see {failed}): local files are written through Hadoop's own class"
    )


def _javac() -> Path | None:
    java = java_path()
    javac = java.parent / "javac" if java is not None else None
    return javac if javac is not None and javac.is_file() else None


def _hadoop_classes() -> Path | None:
    found = sorted(spark_jars_folder().glob("hadoop-client-api-*.jar"))
    return found[-1] if found else None


def _compile(javac: Path, hadoop: Path, jar: Path) -> None:
    """Compile `SOURCE` and write its classes into `jar`, whole or not at all: a reader never
    finds half a jar, whether the compile fails or the process dies in it."""
    with tempfile.TemporaryDirectory(dir=jar.parent) as work:
        classes = Path(work) / "classes"
        subprocess.run(
            [str(javac), "--release", "17", "-d", str(classes), "-cp", str(hadoop), str(SOURCE)],
            check=True,
            capture_output=True,
            timeout=COMPILE_SECONDS,
        )
        written = Path(work) / jar.name
        with zipfile.ZipFile(written, "w") as archive:
            for compiled in sorted(classes.rglob("*.class")):
                archive.write(compiled, compiled.relative_to(classes).as_posix())
        os.replace(written, jar)
