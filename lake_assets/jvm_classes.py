"""The lake's own JVM class: Hadoop's local file system, setting file modes without a process.

Hadoop's local file system sets the mode of every file and folder it creates. Without Hadoop's
native library, which PySpark does not ship, it does so by starting a `chmod` process each
time: a write of a week's hourly change log (169 folders) starts some 700 of them, and on two
cores they cost a large share of the write (docs/profiling.md, "Figures behind the code").
`java/NioPermissionsLocalFileSystem.java` sets the same modes through `java.nio`.

It is compiled once, with the JDK's `javac`, against the Hadoop classes PySpark ships, into a
jar in the lake's cache; the jar's name carries the source's and those classes' hashes, so an
upgrade of either compiles it again. Where there is no `javac` (a JRE alone) or the compile
fails, the lake writes through Hadoop's own local file system, as before: same files, slower.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import zipfile
from pathlib import Path

from lake_assets.jvm_archive import java_path, spark_jars_folder
from lake_assets.spark import cache_dir

#: the class `spark.hadoop.fs.file.impl` names when the jar is there
LOCAL_FILE_SYSTEM_CLASS = "lake_assets.hadoop.NioPermissionsLocalFileSystem"
SOURCE = Path(__file__).parent / "java" / "NioPermissionsLocalFileSystem.java"
#: the longest a compile may take before the lake goes on without it
COMPILE_SECONDS = 120


def local_file_system_jar() -> Path | None:
    """The jar holding `LOCAL_FILE_SYSTEM_CLASS`, compiled now if the cache has none (None
    without a `javac` or PySpark's Hadoop classes, when the compile failed, or when the cache's
    path could not be given to Spark)."""
    javac, hadoop = _javac(), _hadoop_classes()
    if javac is None or hadoop is None:
        return None
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(hadoop.name.encode())
    jar = cache_dir() / "classes" / f"lake-local-fs-{digest.hexdigest()[:16]}.jar"
    # `spark.jars` is a list split at commas, and a driver's command line at white space.
    if any(c.isspace() or c == "," for c in str(jar)):
        return None
    if jar.is_file():
        return jar
    try:
        _compile(javac, hadoop, jar)
    except (OSError, subprocess.SubprocessError):
        return None
    return jar


def _javac() -> Path | None:
    java = java_path()
    javac = java.parent / "javac" if java is not None else None
    return javac if javac is not None and javac.is_file() else None


def _hadoop_classes() -> Path | None:
    found = sorted(spark_jars_folder().glob("hadoop-client-api-*.jar"))
    return found[-1] if found else None


def _compile(javac: Path, hadoop: Path, jar: Path) -> None:
    """Compile `SOURCE` and write its classes into `jar`, whole or not at all: test processes
    may compile at once, and the last to finish replaces the others' identical jar."""
    jar.parent.mkdir(parents=True, exist_ok=True)
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
