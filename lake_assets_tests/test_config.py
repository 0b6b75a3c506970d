import pytest

from lake_assets.config import dump_config, load_config, parse_config
from lake_assets.errors import ConfigError, UnsafePathError
from lake_assets.paths import LakeLayout, join, normalise_root_uri, safe_segment
from lake_assets.spark import session_conf


def test_minimal_config_parses_and_round_trips(tmp_path):
    raw = {
        "lake": "file:///tmp/lake/",
        "feeds": [{"name": "unit", "format": "unit_cdc", "landing": "s3://bucket/unit", "tables": ["accounts"]}],
    }
    config = parse_config(raw)
    assert config.lake == "file:///tmp/lake"
    assert config.feeds[0].landing == "s3a://bucket/unit"
    assert config.feeds[0].tables == ("accounts",)
    assert config.feeds[0].late_hours == 4 and config.feeds[0].sensor_interval_seconds == 30
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(config))
    assert load_config(path).feeds == config.feeds


@pytest.mark.parametrize(
    "feed, message",
    [
        ({"name": "Unit", "format": "unit_cdc", "landing": "/x"}, "must match"),
        ({"name": "unit", "format": "csv", "landing": "/x"}, "format"),
        ({"name": "unit", "format": "unit_cdc"}, "'landing' is required"),
        ({"name": "unit", "format": "unit_cdc", "landing": "relative/path"}, "must be a file://"),
        ({"name": "unit", "format": "unit_cdc", "landing": "/x", "sensor_interval_seconds": 0}, "sensor_interval_seconds"),
        ({"name": "unit", "format": "unit_cdc", "landing": "/x", "watch": "no"}, "watch"),
        ({"name": "unit", "format": "unit_cdc", "landing": "/x", "tables": ["../etc"]}, "table"),
        ({"name": "unit", "format": "unit_cdc", "landing": "/x", "colour": 1}, "unknown keys"),
        ({"name": "unit", "format": "unit_cdc", "landing": "/x", "start": "2024-01-01"}, "start"),
    ],
)
def test_invalid_feeds_are_refused_with_the_reason(feed, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"lake": "/tmp/lake", "feeds": [feed]})


def test_credentials_are_refused_in_the_config_file():
    with pytest.raises(ConfigError, match="environment"):
        parse_config({"lake": "/tmp/lake", "feeds": [], "s3": {"access_key_id": "AKIA"}})


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("bad", ["..", ".", "../x", "a/b", "", ".hidden", "a\\b", "x..y", "a b"])
def test_unsafe_path_segments_are_refused(bad):
    with pytest.raises(UnsafePathError):
        safe_segment(bad)


def test_layout_builds_contract_paths():
    layout = LakeLayout("s3://bucket/prefix/")
    assert layout.table("history", "unit", "accounts") == "s3a://bucket/prefix/history/unit/accounts"
    assert layout.quarantine("unit", "accounts", "2024-01-01-05") == (
        "s3a://bucket/prefix/_quarantine/unit/accounts/2024-01-01-05"
    )
    with pytest.raises(UnsafePathError):
        join("file:///lake", "changes", "../../etc")
    assert normalise_root_uri("/abs/lake", "lake") == "file:///abs/lake"
    with pytest.raises(ConfigError):
        normalise_root_uri("file:///abs/../etc", "lake")


def test_flow_collections_need_keys_and_may_select_logical_partitions():
    from lake_assets.config import parse_config

    feed = {"name": "flow", "format": "flow_journal", "landing": "/x",
            "collections": [{"name": "acmeCo/orders", "key": ["/id"], "partitions": {"category": ["Anvils"]}}]}
    parsed = parse_config({"lake": "/lake", "feeds": [feed]}).feeds[0].collections[0]
    assert parsed.table == "acmeco_orders" and parsed.wants("category", "Anvils") and not parsed.wants("category", "Rockets")
    with pytest.raises(ConfigError, match="JSON pointers"):
        parse_config({"lake": "/lake", "feeds": [{**feed, "collections": [{"name": "a/b", "key": ["id"]}]}]})
    with pytest.raises(ConfigError, match="'collections' is required"):
        parse_config({"lake": "/lake", "feeds": [{k: v for k, v in feed.items() if k != "collections"}]})


def test_embedded_and_connect_sessions_get_the_lake_sql_settings():
    """A Spark Connect server keeps its own cluster settings, but the SQL settings the lake's
    reads and writes rely on (UTC, dynamic partition overwrite, partition values as text) are
    set for its session as for the embedded one."""
    local, connect = session_conf(), session_conf(remote="sc://127.0.0.1:15002")
    assert "spark.master" not in connect and connect["spark.remote"] == "sc://127.0.0.1:15002"
    for conf in (local, connect):
        assert conf["spark.sql.session.timeZone"] == "UTC"
        assert conf["spark.sql.sources.partitionOverwriteMode"] == "dynamic"
        assert conf["spark.sql.sources.partitionColumnTypeInference.enabled"] == "false"


def test_every_session_builds_columns_without_recording_python_call_sites():
    """PySpark's per-expression call-site capture is off for the embedded driver, a cluster's
    driver and a Connect client alike (it costs the Python side, whichever runs the tasks);
    a caller may turn it back on."""
    for conf in (session_conf(), session_conf(master="spark://10.0.0.5:7077"), session_conf(remote="sc://127.0.0.1:15002")):
        assert conf["spark.python.sql.dataFrameDebugging.enabled"] == "false"
    mine = session_conf(extra={"spark.python.sql.dataFrameDebugging.enabled": "true"})
    assert mine["spark.python.sql.dataFrameDebugging.enabled"] == "true"


def test_only_the_embedded_driver_gets_the_lake_jvm_options():
    """The embedded driver (which runs the tasks too) gets the parallel collector; a cluster's
    driver and a Connect server keep their operator's JVM options, and a caller's own setting
    wins over the lake's."""
    assert session_conf()["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    assert session_conf(master="local[4]")["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    assert "spark.driver.extraJavaOptions" not in session_conf(master="spark://10.0.0.5:7077")
    assert "spark.driver.extraJavaOptions" not in session_conf(remote="sc://127.0.0.1:15002")
    mine = session_conf(extra={"spark.driver.extraJavaOptions": "-XX:+UseZGC"})
    assert mine["spark.driver.extraJavaOptions"] == "-XX:+UseZGC"


def test_a_local_driver_plans_each_query_once_and_a_cluster_keeps_adaptive_execution():
    """Adaptive execution is off where the driver runs the tasks itself (its hourly folds are
    many small queries) and left on for a cluster; a caller may turn it back on."""
    assert session_conf()["spark.sql.adaptive.enabled"] == "false"
    assert session_conf(master="local[4]")["spark.sql.adaptive.enabled"] == "false"
    assert session_conf(master="spark://10.0.0.5:7077")["spark.sql.adaptive.enabled"] == "true"
    assert "spark.sql.adaptive.enabled" not in session_conf(remote="sc://127.0.0.1:15002")
    assert session_conf(extra={"spark.sql.adaptive.enabled": "true"})["spark.sql.adaptive.enabled"] == "true"
