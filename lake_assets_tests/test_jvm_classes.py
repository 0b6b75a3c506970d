"""The lake's own local file system class (`jvm_classes`): compiled once into the cache, named
by every driver without S3 with its jar, and creating files and folders with exactly the modes
Hadoop's own local file system gives them."""

from __future__ import annotations

import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lake_assets import jvm_classes
from lake_assets import spark as spark_settings
from lake_assets.spark import FILE_SYSTEM_SETTING, RAW_LOCAL_FILE_SYSTEM, session_conf


@pytest.fixture
def empty_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_class_is_compiled_once_into_the_cache_and_named_with_its_jar(empty_cache):
    jar = jvm_classes.local_file_system_jar()
    assert jar is not None and jar.is_relative_to(empty_cache) and jar.is_file()
    made = jar.stat().st_mtime_ns
    assert jvm_classes.local_file_system_jar() == jar and jar.stat().st_mtime_ns == made
    conf = session_conf()
    assert conf[FILE_SYSTEM_SETTING] == jvm_classes.LOCAL_FILE_SYSTEM_CLASS
    assert conf["spark.jars"] == f"local:{jar}"  # on the class path as the driver starts
    # a cluster's executors would not find the jar: they write through Hadoop's own
    cluster = session_conf(master="spark://10.0.0.5:7077")
    assert cluster[FILE_SYSTEM_SETTING] == RAW_LOCAL_FILE_SYSTEM and "spark.jars" not in cluster
    # files of the config's own that spark-submit looks up before any jar is loaded, or a
    # cluster master of its own: Hadoop's class; a file system of its own stands
    for extra in (
        {"spark.jars": "/opt/x.jar"},
        {"spark.files": "/opt/lookup.csv"},
        {"spark.jars.packages": "org.example:x:1.0"},
        {"spark.master": "spark://10.0.0.5:7077"},
    ):
        settled = session_conf(extra=extra)
        assert settled[FILE_SYSTEM_SETTING] == RAW_LOCAL_FILE_SYSTEM, extra
        assert settled.get("spark.jars") == extra.get("spark.jars"), extra
    own = session_conf(extra={"spark.jars": "/opt/x.jar", FILE_SYSTEM_SETTING: "my.FileSystem"})
    assert (own["spark.jars"], own[FILE_SYSTEM_SETTING]) == ("/opt/x.jar", "my.FileSystem")
    assert FILE_SYSTEM_SETTING not in session_conf(use_s3=True)  # s3a buffers through the checksummed one
    assert FILE_SYSTEM_SETTING not in session_conf(remote="sc://127.0.0.1:15002")  # the server's to choose


def test_drivers_started_at_once_compile_the_class_once(empty_cache, monkeypatch):
    compiles = []
    compile_now = jvm_classes._compile

    def slow_compile(*args):
        compiles.append(args)
        time.sleep(0.5)  # every other driver looks for the jar meanwhile
        compile_now(*args)

    monkeypatch.setattr(jvm_classes, "_compile", slow_compile)
    with ThreadPoolExecutor(3) as pool:
        jars = list(pool.map(lambda _: jvm_classes.local_file_system_jar(), range(3)))
    assert len(compiles) == 1
    assert jars[0] is not None and jars[0].is_file() and jars == [jars[0]] * 3


def test_without_a_javac_the_lake_writes_through_hadoops_raw_local_file_system(empty_cache, monkeypatch):
    monkeypatch.setattr(jvm_classes, "_javac", lambda: None)
    assert jvm_classes.local_file_system_jar() is None
    conf = session_conf()
    assert conf[FILE_SYSTEM_SETTING] == RAW_LOCAL_FILE_SYSTEM and "spark.jars" not in conf


@pytest.mark.parametrize("folder", ["my cache", "a,b", "a#b", "100%", "a[1]"])
def test_a_cache_path_spark_could_not_take_gets_no_jar(monkeypatch, tmp_path, folder):
    """The jar is given as a `local:` URI in a comma-separated list: a path that would end
    early or not parse would stop the driver."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / folder))
    assert jvm_classes.local_file_system_jar() is None
    assert session_conf()[FILE_SYSTEM_SETTING] == RAW_LOCAL_FILE_SYSTEM
    assert not (tmp_path / folder).exists()


def test_a_jar_gone_from_the_cache_before_the_driver_starts_leaves_hadoops_class(empty_cache):
    settings = session_conf()
    Path(settings["spark.jars"].removeprefix("local:")).unlink()
    spark_settings._unless_its_jar_is_gone(settings)
    assert settings[FILE_SYSTEM_SETTING] == RAW_LOCAL_FILE_SYSTEM and "spark.jars" not in settings


def test_a_compile_that_fails_leaves_no_jar_and_the_raw_file_system(empty_cache, monkeypatch, tmp_path):
    broken = tmp_path / "Broken.java"
    broken.write_text("class Broken {")
    monkeypatch.setattr(jvm_classes, "SOURCE", broken)
    assert jvm_classes.local_file_system_jar() is None
    assert not list(empty_cache.rglob("*.jar"))
    [failed] = empty_cache.rglob("*.failed")  # why, kept; later drivers do not compile again
    assert "Broken.java" in failed.read_text()
    monkeypatch.setattr(jvm_classes, "_compile", lambda *_: pytest.fail("compiled again"))
    assert session_conf()[FILE_SYSTEM_SETTING] == RAW_LOCAL_FILE_SYSTEM


@pytest.fixture(scope="module")
def lake_file_system_class(spark):
    """The compiled class, loaded from its jar into the test run's JVM once (py4j keeps the
    methods of a class by its name: a second loading would be called through the first's)."""
    jvm = spark._jvm
    jar = jvm_classes.local_file_system_jar()
    assert jar is not None
    loader = jvm.java.net.URLClassLoader(
        _java_array(spark, jvm.java.net.URL, [jvm.java.io.File(str(jar)).toURI().toURL()]),
        spark._jsc.getClass().getClassLoader(),
    )
    return loader.loadClass(jvm_classes.LOCAL_FILE_SYSTEM_CLASS)


@pytest.mark.parametrize("umask", ["022", "027", "077"])
def test_files_and_folders_get_the_modes_hadoops_own_file_system_gives(
    spark, lake_file_system_class, tmp_path, umask
):
    """Written through both classes under one umask: every file and folder has the same mode."""
    jvm = spark._jvm
    conf = jvm.org.apache.hadoop.conf.Configuration(False)
    conf.set("fs.permissions.umask-mode", umask)
    ours = lake_file_system_class.getDeclaredConstructor(
        _java_array(spark, jvm.java.lang.Class, [])
    ).newInstance(_java_array(spark, jvm.java.lang.Object, []))
    hadoops = jvm.org.apache.hadoop.fs.RawLocalFileSystem()
    modes = {}
    for name, fs in (("ours", ours), ("hadoop's", hadoops)):
        fs.initialize(jvm.java.net.URI("file:///"), conf)
        root = tmp_path / name
        hadoop_path = jvm.org.apache.hadoop.fs.Path
        fs.mkdirs(hadoop_path(f"file://{root}/hour=01/nested"))
        fs.create(hadoop_path(f"file://{root}/hour=01/part-0.parquet"), True).close()
        fs.mkdirs(hadoop_path(f"file://{root}/shared"))
        for folder, mode in (("hour=01/nested", 0o750), ("shared", 0o1777)):  # a sticky bit too
            fs.setPermission(
                hadoop_path(f"file://{root}/{folder}"),
                jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(mode),
            )
        modes[name] = {
            str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in sorted(root.rglob("*"))
        }
    assert modes["ours"] == modes["hadoop's"]
    assert set(modes["ours"]) == {"hour=01", "hour=01/nested", "hour=01/part-0.parquet", "shared"}
    assert (modes["ours"]["hour=01/nested"], modes["ours"]["shared"]) == (0o750, 0o1777)
    assert modes["ours"]["hour=01/part-0.parquet"] == 0o666 & ~int(umask, 8)


def _java_array(spark, kind, items: list):
    array = spark.sparkContext._gateway.new_array(kind, len(items))
    for i, item in enumerate(items):
        array[i] = item
    return array
