"""The embedded driver's class-data archive (`jvm_archive`): named after the JVM and the Spark
jars it fits, used by every embedded driver once it exists, put in place only whole, and, as
`./dev setup` made it, mapped by a driver that refuses to start without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lake_assets import jvm_archive
from lake_assets.spark import DRIVER_JAVA_OPTIONS_ENV, session_conf


@pytest.fixture
def empty_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(DRIVER_JAVA_OPTIONS_ENV, raising=False)
    return tmp_path / "cache"


def test_an_embedded_driver_maps_the_archive_once_it_exists(empty_cache):
    archive = jvm_archive.archive_path()
    assert archive is not None and archive.is_relative_to(empty_cache)
    assert session_conf()["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    options = session_conf()["spark.driver.extraJavaOptions"].split()
    assert options == ["-XX:+UseParallelGC", f"-XX:SharedArchiveFile={archive}"]
    # A cluster's driver and a Connect server keep their operator's options.
    assert "spark.driver.extraJavaOptions" not in session_conf(master="spark://10.0.0.5:7077")


def test_options_from_the_environment_follow_the_lakes_own(empty_cache, monkeypatch):
    archive = jvm_archive.archive_path()
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    monkeypatch.setenv(DRIVER_JAVA_OPTIONS_ENV, " -XX:TieredStopAtLevel=1 -Xss4m ")
    assert session_conf()["spark.driver.extraJavaOptions"].split() == [
        "-XX:+UseParallelGC",
        f"-XX:SharedArchiveFile={archive}",
        "-XX:TieredStopAtLevel=1",
        "-Xss4m",
    ]
    assert "spark.driver.extraJavaOptions" not in session_conf(master="spark://10.0.0.5:7077")


def test_another_jvm_or_other_spark_jars_look_for_another_archive(empty_cache, monkeypatch, tmp_path):
    mine = jvm_archive.archive_path()
    other_java = tmp_path / "jdk" / "bin" / "java"
    other_java.parent.mkdir(parents=True)
    other_java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert jvm_archive.archive_path() not in (None, mine)
    monkeypatch.delenv("JAVA_HOME")
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "spark-core.jar").write_bytes(b"x")
    monkeypatch.setattr(jvm_archive, "spark_jars_folder", lambda: jars)
    these_jars = jvm_archive.archive_path()
    assert these_jars not in (None, mine)
    # Reinstalled: same names and sizes, new file times, which the JVM checks when it maps.
    os.utime(jars / "spark-core.jar", ns=(1_000_000_000, 1_000_000_000))
    assert jvm_archive.archive_path() not in (None, mine, these_jars)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert jvm_archive.archive_path() is None
    assert session_conf()["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"


def test_an_archive_whose_making_failed_is_never_put_in_place(empty_cache, monkeypatch):
    """A truncated archive would crash every driver that maps it: only an archive whose dump
    finished and that a driver started with takes the archive's name."""

    def dump_then_fail_the_check(args, out, what):
        if args[0] == "--dump":
            with open(args[1], "wb") as partial:
                partial.write(b"half an archive")
            return
        raise jvm_archive.ArchiveNotBuilt(f"the JVM class archive was not made: {what} failed")

    monkeypatch.setattr(jvm_archive, "_run_step", dump_then_fail_the_check)
    with pytest.raises(jvm_archive.ArchiveNotBuilt, match="a driver started with it"):
        jvm_archive.build()
    archive = jvm_archive.archive_path()
    assert archive is not None
    assert not archive.exists()
    assert [p.name for p in archive.parent.iterdir() if p.suffix != ".log"] == []
    assert session_conf()["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"


def test_a_new_install_s_archive_replaces_the_old_one_of_the_same_place(empty_cache, monkeypatch):
    """A reinstall of pyspark in the same virtualenv needs a new archive (the JVM checks the
    jars' times); the old one, some 200 MB, goes. Another virtualenv's archive stays, and so
    does the partial file of a build still running."""

    def dump_and_check(args, out, what):
        if args[0] == "--dump":
            Path(args[1]).write_bytes(b"an archive")

    monkeypatch.setattr(jvm_archive, "_run_step", dump_and_check)
    archive = jvm_archive.archive_path()
    assert archive is not None
    place, _ = archive.stem.rsplit("-", 1)
    archive.parent.mkdir(parents=True)
    replaced = [archive.parent / f"{place}-0ld1nsta{suffix}" for suffix in (".jsa", ".log", ".failed")]
    elsewhere = archive.parent / "spark-classes-e1sewher-0ld1nsta.jsa"
    building = archive.parent / f"{place}-0therbu1.4242.part"
    for path in [*replaced, elsewhere, building]:
        path.write_bytes(b"old")
    assert jvm_archive.build() == archive
    assert archive.read_bytes() == b"an archive"
    kept = [archive, archive.with_suffix(".log"), elsewhere, building]
    assert sorted(archive.parent.iterdir()) == sorted(kept)


def test_set_up_goes_on_without_an_archive_saying_why(empty_cache, monkeypatch, capsys):
    def failing_build():
        raise jvm_archive.ArchiveNotBuilt("the JVM class archive was not made: the demo run failed")

    def unexpected_build():
        raise AssertionError("a failed archive is not tried again on every set-up")

    monkeypatch.setattr(jvm_archive, "build", failing_build)
    archive = jvm_archive.archive_path()
    assert archive is not None
    archive.parent.mkdir(parents=True)
    assert jvm_archive.main([]) == 0
    said = capsys.readouterr().err
    assert "the demo run failed; Spark drivers start without it" in said
    assert str(archive.with_suffix(".failed")) in said
    monkeypatch.setattr(jvm_archive, "build", unexpected_build)
    assert jvm_archive.main([]) == 0


def test_the_archive_set_up_made_is_mapped_by_a_driver_that_requires_it():
    """`./dev setup` (which `./dev test` runs first) made the archive for this JVM and these
    jars; a driver started with `-Xshare:on` fails unless it maps it, and runs a query."""
    archive = jvm_archive.archive_path()
    assert archive is not None and archive.is_file(), (
        f"no JVM class archive at {archive}: './dev setup' makes it (log beside it)"
    )
    done = subprocess.run(
        [sys.executable, "-m", "lake_assets.jvm_archive", "--check", str(archive)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_cache_path_with_white_space_gets_no_archive_and_the_driver_still_starts(monkeypatch, tmp_path):
    """Spark splits the driver's JVM options at white space: an archive path holding a space
    would leave every driver unable to start, so there is no archive there."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "my cache"))
    monkeypatch.delenv(DRIVER_JAVA_OPTIONS_ENV, raising=False)
    assert jvm_archive.archive_path() is None
    assert session_conf()["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    assert jvm_archive.main([]) == 0
    assert not (tmp_path / "my cache").exists()
