import os
import re

import pydantic
import pytest
import yaml

from lake_assets.config import (
    MAX_CONFIG_BYTES,
    MAX_EXPANDED_NODES,
    NO_FEED,
    CollectionConfig,
    FeedConfig,
    LakeConfig,
    S3Config,
    check_landings,
    dump_config,
    load_config,
    parse_config,
)
from lake_assets.errors import ConfigError, UnsafePathError
from lake_assets.feeds.grax_v2 import split_table
from lake_assets.feeds.unit_cdc import UnitCdcFeedConfig
from lake_assets.jvm_classes import LOCAL_FILE_SYSTEM_CLASS
from lake_assets.paths import LakeLayout, join, normalise_root_uri, partition_folder, safe_segment
from lake_assets.spark import DRIVER_JAVA_OPTIONS_ENV, session_conf
from lake_assets.storage import Storage


def test_minimal_config_parses_and_round_trips(tmp_path):
    raw = {
        "lake": "file:///tmp/lake/",
        "feeds": [
            {"name": "unit", "format": "unit_cdc", "landing": "s3://bucket/unit", "tables": ["accounts"]}
        ],
    }
    config = parse_config(raw)
    assert config.lake == "file:///tmp/lake"
    assert config.feeds[0].landing == "s3a://bucket/unit"
    assert config.feeds[0].tables == ("accounts",)
    assert config.feeds[0].late_hours == 4 and config.feeds[0].sensor_interval_seconds == 30
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(config))
    assert load_config(path).feeds == config.feeds


GOOD_FEED = {"name": "good", "format": "unit_cdc", "landing": "/landing/good"}
URI = "file:///absolute/path, /absolute/path or s3a://bucket/prefix (without '..', '.' or empty segments)"
UNIT_KEYS = (
    "name, format, landing, tables, start, late_hours, sensor_interval_seconds, watch, allow_empty_landing"
)


def problems(raw) -> list[str]:
    """The lines of the ConfigError a configuration raises."""
    with pytest.raises(ConfigError) as raised:
        parse_config(raw)
    return str(raised.value).splitlines()


@pytest.mark.parametrize(
    "change, line",
    [
        (
            {"name": "Unit"},
            "feeds[1].name: expected a name of lower-case letters, digits, '_' and '-', 64 at most, got 'Unit'",
        ),
        (
            {"name": "u" * 65},  # a folder of every layer: a name past 255 bytes failed there, later
            "feeds[1].name: expected a name of lower-case letters, digits, '_' and '-', 64 at most, "
            f"got '{'u' * 65}'",
        ),
        ({"format": "csv"}, "feeds[1].format: expected one of unit_cdc, grax_v2, flow_journal, got 'csv'"),
        ({"format": None}, "feeds[1].format: required, one of unit_cdc, grax_v2, flow_journal"),
        ({"landing": None}, "feeds[1].landing: required"),
        ({"landing": "relative/path"}, "feeds[1].landing: expected " + URI + ", got 'relative/path'"),
        ({"landing": "file:///a/../etc"}, "feeds[1].landing: expected " + URI + ", got 'file:///a/../etc'"),
        (
            {"late_hours": True},
            "feeds[1].late_hours: expected an integer from 0 to 87,600 (ten years), got true",
        ),
        ({"late_hours": -1}, "feeds[1].late_hours: expected an integer from 0 to 87,600 (ten years), got -1"),
        (
            {"late_hours": "4"},
            "feeds[1].late_hours: expected an integer from 0 to 87,600 (ten years), got '4'",
        ),
        # further back than ten years, the landing sensor's look back passed the year 1 and
        # every tick of the feed's sensor failed
        (
            {"late_hours": 20_000_000},
            "feeds[1].late_hours: expected an integer from 0 to 87,600 (ten years), got 20000000",
        ),
        (
            {"sensor_interval_seconds": 86_401},
            "feeds[1].sensor_interval_seconds: expected an integer from 1 to 86,400 (a day), got 86401",
        ),
        (
            {"sensor_interval_seconds": 0},
            "feeds[1].sensor_interval_seconds: expected an integer from 1 to 86,400 (a day), got 0",
        ),
        (
            {"sensor_interval_seconds": 1.5},
            "feeds[1].sensor_interval_seconds: expected an integer from 1 to 86,400 (a day), got 1.5",
        ),
        ({"watch": "no"}, "feeds[1].watch: expected true or false, got 'no'"),
        ({"watch": 1}, "feeds[1].watch: expected true or false, got 1"),
        (
            {"tables": ["../etc"]},
            "feeds[1].tables[0]: expected a table name of lower-case letters, digits and '_', got '../etc'",
        ),
        ({"tables": "accounts"}, "feeds[1].tables: expected a list, got 'accounts'"),
        ({"tables": []}, "feeds[1].tables: expected a non-empty list, got []"),
        (
            {"tables": ["accounts", "cards", "accounts"]},
            "feeds[1].tables: 'accounts' is listed more than once",
        ),
        ({"colour": 1}, f"feeds[1].colour: unknown key; expected one of {UNIT_KEYS}"),
        (
            {"start": "2024-01-01"},
            "feeds[1].start: expected an hour like 2024-01-31-00 (year-month-day-hour, UTC), got '2024-01-01'",
        ),
        (
            {"start": "2024-02-30-00"},
            "feeds[1].start: expected an hour like 2024-01-31-00 (year-month-day-hour, UTC), got '2024-02-30-00'",
        ),
        (
            {"orgs": ["00Dx"]},
            'feeds[1].orgs: expected nothing: this key applies to grax_v2 feeds only, got ["00Dx"]',
        ),
        (
            {"collections": [{"name": "a/b", "key": ["/id"]}]},
            "feeds[1].collections: expected nothing: this key applies to flow_journal feeds only, "
            'got [{"name": "a/b", "key": ["/id"]}]',
        ),
    ],
)
def test_each_feed_mistake_is_one_line_naming_the_key_the_value_and_what_is_expected(change, line):
    """A key given as None is left out (missing)."""
    feed = {
        k: v
        for k, v in {"name": "unit", "format": "unit_cdc", "landing": "/x", **change}.items()
        if v is not None
    }
    assert problems({"lake": "/tmp/lake", "feeds": [GOOD_FEED, feed]}) == [line]


def test_every_mistake_of_a_file_is_reported_one_per_line():
    raw = {
        "lake": "lake",
        "feeds": [GOOD_FEED, {**GOOD_FEED, "name": "b", "late_hours": True, "watch": "yes"}, "unit"],
        "spark": {"conf": {"spark.executor.memory": ["8g"]}},
        "catalog": {"store": "sqlite"},
        "colour": "blue",
    }
    assert problems(raw) == [
        "lake: expected " + URI + ", got 'lake'",
        "feeds[1].late_hours: expected an integer from 0 to 87,600 (ten years), got true",
        "feeds[1].watch: expected true or false, got 'yes'",
        "feeds[2]: expected a mapping (key: value), got 'unit'",
        "spark.conf['spark.executor.memory']: expected a text, number or true/false setting value, got [\"8g\"]",
        "catalog.store: expected parquet or dynamodb, got 'sqlite'",
        "colour: unknown key; expected one of lake, feeds, s3, spark, catalog, lease_wait_seconds",
    ]
    assert problems([GOOD_FEED]) == [
        'top level: expected a mapping (key: value), got [{"name": "good", '
        '"format": "unit_cdc", "landing": "/landing/good"}]'
    ]


def test_format_specific_mistakes_name_their_key():
    grax = {"name": "grax", "format": "grax_v2", "landing": "/g"}
    flow = {"name": "flow", "format": "flow_journal", "landing": "/f"}
    assert problems({"lake": "/lake", "feeds": [{**grax, "tables": ["account"], "orgs": ["00D-x"]}]}) == [
        "feeds[0].tables[0]: expected '<org id>/<object in lower case>', got 'account'",
        "feeds[0].orgs[0]: expected a Salesforce org id (letters and digits), got '00D-x'",
    ]
    assert problems({"lake": "/lake", "feeds": [{**grax, "orgs": ["00Dx", "00Dx"]}]}) == [
        "feeds[0].orgs: '00Dx' is listed more than once"
    ]
    for key, value in (("start", "2024-01-01-00"), ("late_hours", 4)):
        assert problems({"lake": "/lake", "feeds": [{**grax, key: value}]}) == [
            f"feeds[0].{key}: this key applies to hourly feeds (unit_cdc, flow_journal) only: "
            "GRAX's partitions are batches"
        ]
    assert problems({"lake": "/lake", "feeds": [flow]}) == ["feeds[0].collections: required"]
    assert problems(
        {"lake": "/lake", "feeds": [{**flow, "collections": [{"name": "a/b", "key": "/id"}]}]}
    ) == [
        "feeds[0].collections[0].key: expected a list, got '/id'",
    ]
    assert problems(
        {
            "lake": "/lake",
            "feeds": [
                {
                    **flow,
                    "collections": [
                        {"name": "acme/a-b", "key": ["/id"]},
                        {"name": "acme/a_b", "key": ["/id"], "partitions": {"region": []}},
                    ],
                }
            ],
        }
    ) == [
        "feeds[0].collections[1].partitions: expected a mapping of a partition field to a non-empty list of values, "
        'such as {region: [eu, us]}, got {"region": []}',
    ]
    assert problems(
        {
            "lake": "/lake",
            "feeds": [
                {
                    **flow,
                    "collections": [
                        {"name": "acme/a", "key": ["/id"], "partitions": {"region": "eu"}},
                    ],
                }
            ],
        }
    ) == [
        "feeds[0].collections[0].partitions: expected a mapping of a partition field to a non-empty list of values, "
        'such as {region: [eu, us]}, got {"region": "eu"}',
    ]
    assert problems(
        {
            "lake": "/lake",
            "feeds": [
                {
                    **flow,
                    "collections": [
                        {"name": "acme/a-b", "key": ["/id"]},
                        {"name": "acme/a_b", "key": ["/id"]},
                    ],
                }
            ],
        }
    ) == ["feeds[0].collections[1].name: collections acme/a-b and acme/a_b both become table acme_a_b"]
    assert problems({"lake": "/lake", "feeds": [GOOD_FEED, GOOD_FEED]}) == [
        "feeds[1].name: the feed name 'good' is already used by feeds[0]",
    ]
    # `unit-eu` and `unit_eu` would give two feeds one job, sensor and writer pool in Dagster
    assert problems(
        {
            "lake": "/lake",
            "feeds": [
                {**GOOD_FEED, "name": "unit-eu", "landing": "/landing/a"},
                {**GOOD_FEED, "name": "unit_eu", "landing": "/landing/b"},
            ],
        }
    ) == [
        "feeds[1].name: the feed name 'unit_eu' is already used by feeds[0] "
        "('unit-eu': Dagster names spell '-' as '_')",
    ]
    assert problems({"lake": "/lake", "catalog": {"store": "dynamodb", "table": "records"}}) == [
        "catalog.latest_table: required for a dynamodb catalog",
    ]


@pytest.mark.parametrize(
    "lake, landing, line",
    [
        ("/data/x", "/data/x/", "feeds[0].landing: file:///data/x is the lake file:///data/x"),
        (
            "file:///data/landing/lake",
            "/data/landing",
            "feeds[0].landing: file:///data/landing holds the lake file:///data/landing/lake",
        ),
        (
            "/data",
            "file://localhost/data/./landing",
            "feeds[0].landing: file:///data/landing lies inside the lake file:///data",
        ),
        (
            "s3a://bucket/lake",
            "s3://bucket",
            "feeds[0].landing: s3a://bucket holds the lake s3a://bucket/lake",
        ),
        (
            "s3://bucket/lake/",
            "s3a://bucket/lake/unit",
            "feeds[0].landing: s3a://bucket/lake/unit lies inside the lake s3a://bucket/lake",
        ),
    ],
)
def test_a_lake_sharing_folders_with_a_landing_is_refused(lake, landing, line):
    [problem] = problems(
        {"lake": lake, "feeds": [{"name": "unit", "format": "unit_cdc", "landing": landing}]}
    )
    assert problem.startswith(line + ": the lake and a landing must not share folders"), problem


def test_neighbouring_folders_are_not_an_overlap():
    config = parse_config(
        {
            "lake": "s3a://bucket/lake",
            "feeds": [
                {"name": "unit", "format": "unit_cdc", "landing": "s3a://bucket/lake-landing"},
                {"name": "grax", "format": "grax_v2", "landing": "s3a://bucket-lake"},
            ],
        }
    )
    assert [f.landing for f in config.feeds] == ["s3a://bucket/lake-landing", "s3a://bucket-lake"]


ENVIRONMENT = "credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally AWS_SESSION_TOKEN)"


@pytest.mark.parametrize(
    "raw, path",
    [
        ({"lake": "s3a://AKIAEXAMPLE:wJalrXSECRET@bucket/lake"}, "lake"),
        (
            {
                "lake": "/lake",
                "feeds": [{**GOOD_FEED, "landing": "s3://AKIAEXAMPLE:wJalrXSECRET@vendor/unit"}],
            },
            "feeds[0].landing",
        ),
        (
            {"lake": "/lake", "s3": {"endpoint_url": "https://AKIAEXAMPLE:wJalrXSECRET@minio:9000"}},
            "s3.endpoint_url",
        ),
        ({"lake": "/lake", "s3": {"secret_access_key": "wJalrXSECRET"}}, "s3.secret_access_key"),
        ({"lake": "/lake", "s3": {"access_key_id": "AKIAEXAMPLE"}}, "s3.access_key_id"),
        (
            {"lake": "/lake", "spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": "wJalrXSECRET"}}},
            "spark.conf['spark.hadoop.fs.s3a.secret.key']",
        ),
        (
            {"lake": "/lake", "spark": {"conf": {"fs.s3a.access.key": "AKIAEXAMPLE"}}},
            "spark.conf['fs.s3a.access.key']",
        ),
        (
            {"lake": "/lake", "spark": {"conf": {"spark.hadoop.fs.s3a.session.token": "wJalrXSECRET"}}},
            "spark.conf['spark.hadoop.fs.s3a.session.token']",
        ),
        (
            {"lake": "/lake", "spark": {"conf": {"spark.ssl.keyStorePassword": "wJalrXSECRET"}}},
            "spark.conf['spark.ssl.keyStorePassword']",
        ),
        (
            {
                "lake": "/lake",
                "spark": {
                    "conf": {"spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": "wJalrXSECRET"}
                },
            },
            "spark.conf['spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net']",
        ),
        # S3's customer-supplied encryption key (SSE-C), under its current and its older name
        (
            {"lake": "/lake", "spark": {"conf": {"spark.hadoop.fs.s3a.encryption.key": "wJalrXSECRET"}}},
            "spark.conf['spark.hadoop.fs.s3a.encryption.key']",
        ),
        (
            {
                "lake": "/lake",
                "spark": {"conf": {"spark.hadoop.fs.s3a.server-side-encryption.key": "wJalrXSECRET"}},
            },
            "spark.conf['spark.hadoop.fs.s3a.server-side-encryption.key']",
        ),
        (
            {
                "lake": "/lake",
                "spark": {
                    "conf": {"spark.hadoop.fs.s3a.endpoint": "https://AKIAEXAMPLE:wJalrXSECRET@minio:9000"}
                },
            },
            "spark.conf['spark.hadoop.fs.s3a.endpoint']",
        ),
        (
            {"lake": "/lake", "spark": {"master": "spark://AKIAEXAMPLE:wJalrXSECRET@master:7077"}},
            "spark.master",
        ),
        (
            {"lake": "/lake", "spark": {"master": "k8s://https://AKIAEXAMPLE:wJalrXSECRET@api:6443"}},
            "spark.master",
        ),
        # AWS secret keys hold '/' and '+': the user's part ends at the '@', not at a '/'
        ({"lake": "s3a://AKIAEXAMPLE:wJalrX/K7MD+ENG/bPxRSECRET@bucket/lake"}, "lake"),
        # an S3 URL has no port: a secret that starts with digits and '/' is still a secret
        ({"lake": "s3a://AKIAEXAMPLE:2049/bPxRwJalrXSECRET@bucket/lake"}, "lake"),
        (
            {
                "lake": "/lake",
                "feeds": [{**GOOD_FEED, "landing": "s3a://AKIAEXAMPLE:wJalrX/SECRET@vendor/unit"}],
            },
            "feeds[0].landing",
        ),
        (
            {
                "lake": "/lake",
                "spark": {"conf": {"spark.hadoop.fs.s3a.endpoint": "http://AKIAEXAMPLE:a/wJalrXSECRET@m"}},
            },
            "spark.conf['spark.hadoop.fs.s3a.endpoint']",
        ),
        (  # a list of URLs, the one with credentials not first
            {
                "lake": "/lake",
                "spark": {
                    "conf": {"spark.jars.repositories": "https://repo,https://AKIAEXAMPLE:wJalrXSECRET@repo2"}
                },
            },
            "spark.conf['spark.jars.repositories']",
        ),
    ],
)
def test_credentials_in_the_file_are_refused_without_repeating_them(raw, path):
    [problem] = problems(raw)
    assert problem.startswith(f"{path}: ") and ENVIRONMENT in problem, problem
    assert "wJalrXSECRET" not in problem and "AKIAEXAMPLE" not in problem


SECRET = "wJalrXSECRET"


@pytest.mark.parametrize(
    "raw",
    [
        # a user or password holding ',' or ';' (RFC 3986 allows both)
        {"lake": "/lake", "s3": {"endpoint_url": f"http://user:{SECRET};x@minio:9000"}},
        {"lake": f"s3a://AKIAEXAMPLE:{SECRET},x@bucket/lake"},
        {"lake": "/lake", "spark": {"conf": {"spark.hadoop.fs.s3a.endpoint": f"http://u:{SECRET};x@m"}}},
        {"lake": "/lake", "spark": {"conf": {"spark.jars.repositories": f"https://u:{SECRET};x@repo"}}},
        {"lake": "/lake", "spark": {"master": f"spark://u;x:{SECRET}@master:7077"}},
        # a credential or a signature in a URL's query
        {"lake": "/lake", "s3": {"endpoint_url": f"https://minio/?X-Amz-Security-Token={SECRET}"}},
        {
            "lake": "/lake",
            "spark": {"conf": {"spark.hadoop.fs.s3a.endpoint": f"https://m/?a=1&sig={SECRET}"}},
        },
        {"lake": "/lake", "spark": {"master": f"spark://master:7077?token={SECRET}"}},
        # an AWS key id however spelt, and a Java property set inside quotes
        {"lake": "/lake", "spark": {"conf": {"spark.hadoop.fs.s3a.awsAccessKeyId": SECRET}}},
        {
            "lake": "/lake",
            "spark": {"conf": {"spark.driver.extraJavaOptions": f"-Daws.accessKeyId={SECRET}"}},
        },
        {
            "lake": "/lake",
            "spark": {"conf": {"spark.driver.extraJavaOptions": f'"-Daws.secretAccessKey={SECRET}"'}},
        },
        # a value of the wrong shape is not repeated when it holds a credential
        {"lake": "/lake", "s3": {"endpoint_url": f"HTTP://user:{SECRET}@minio"}},
        {"lake": "/lake", "s3": {"endpoint_url": f"ftp://user:{SECRET}@minio"}},
        {"lake": "/lake", "s3": {"endpoint_url": {"password": SECRET}}},
        {"lake": "/lake", "spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": [SECRET]}}},
        {"lake": "/lake", "spark": {"conf": {"spark.foo": {"password": SECRET}}}},
        {"lake": "/lake", "spark": {"remote": {"token": SECRET}}},
        {"lake": "/lake", "spark": {"remote": f"SC://connect:15002/;token={SECRET}"}},
        # where Spark runs is checked where it is given, not slipped in among the settings
        {"lake": "/lake", "spark": {"conf": {"spark.remote": f"sc://connect:15002/;token={SECRET}"}}},
        # a Connect parameter PySpark does not read is a header of every request
        {"lake": "/lake", "spark": {"remote": f"sc://connect:15002/;authorization=Bearer%20{SECRET}"}},
        {"lake": "/lake", "spark": {"remote": f"sc://connect:15002/;{SECRET}"}},
        # a token outside the `/;` parameters, where PySpark fails and repeats it
        {"lake": "/lake", "spark": {"remote": f"sc://connect:15002;token={SECRET}"}},
        {"lake": "/lake", "spark": {"remote": f"sc://connect:15002/?token={SECRET}"}},
        {"lake": "/lake", "spark": {"remote": f"sc://connect:15002#token={SECRET}"}},
        {"lake": "/lake", "spark": {"remote": f"sc://connect:15002/token={SECRET}"}},
        # a user and password with no scheme before them
        {"lake": "/lake", "s3": {"endpoint_url": f"AKIAEXAMPLE:{SECRET}@minio"}},
        {"lake": f"AKIAEXAMPLE:{SECRET}@bucket/lake"},
        # a credential among a JDBC URL's parameters
        {
            "lake": "/lake",
            "spark": {"conf": {"spark.sql.catalog.x.url": f"jdbc:sqlserver://h:1433;password={SECRET}"}},
        },
        {
            "lake": "/lake",
            "feeds": [
                {
                    "name": "f",
                    "format": "flow_journal",
                    "landing": "/landing/flow",
                    "collections": [
                        {"name": "a/b", "key": ["/id"], "partitions": {"region": {"token": SECRET}}}
                    ],
                }
            ],
        },
    ],
)
def test_no_problem_repeats_a_credential_the_file_holds(raw):
    """Each is refused, and no line of the error holds the credential: a user or password with
    ',' or ';', one in a URL's query, an AWS key id spelt in camel case, a Java property in
    quotes, a value whose shape is wrong, a Connect parameter sent as a header."""
    lines = problems(raw)
    assert lines and all(SECRET not in line for line in lines), lines


def test_spark_master_and_remote_are_refused_among_the_spark_settings():
    assert problems({"lake": "/lake", "spark": {"conf": {"spark.master": "local[4]"}}}) == [
        "spark.conf['spark.master']: where Spark runs is given as spark.master, not among its settings"
    ]
    for remote in (
        "sc://connect:15002/;use_ssl=true;user_id=etl",
        "sc://gw:443/;x-databricks-cluster-id=0123",
        "sc://[::1]:15002",
    ):
        assert parse_config({"lake": "/lake", "spark": {"remote": remote}}).spark.remote == remote


def test_a_spark_connect_token_is_refused_without_repeating_it():
    assert problems(
        {"lake": "/lake", "spark": {"remote": "sc://connect:15002/;user_id=etl;token=wJalrXSECRET"}}
    ) == [
        "spark.remote: a Spark Connect token comes from the environment (SPARK_CONNECT_AUTHENTICATE_TOKEN), "
        "never from the configuration file",
    ]
    assert parse_config(
        {"lake": "/lake", "spark": {"remote": "sc://connect:15002/;user_id=etl"}}
    ).spark.remote == ("sc://connect:15002/;user_id=etl")


def test_a_java_property_that_looks_like_a_credential_is_refused_without_repeating_it():
    problem = problems(
        {
            "lake": "/lake",
            "spark": {"conf": {"spark.driver.extraJavaOptions": "-Xss4m -Daws.secretAccessKey=wJalrXSECRET"}},
        }
    )
    assert len(problem) == 1 and problem[0].startswith(
        "spark.conf['spark.driver.extraJavaOptions']: sets a Java property that looks like a credential; "
    )
    assert "wJalrXSECRET" not in problem[0]
    options = {"spark.driver.extraJavaOptions": "-Dlog4j.debug=true"}
    assert parse_config({"lake": "/lake", "spark": {"conf": options}}).spark.conf == options


def test_a_spark_master_and_a_spark_connect_remote_are_not_both_taken():
    assert problems({"lake": "/lake", "spark": {"master": "local[*]", "remote": "sc://connect:15002"}}) == [
        "spark.remote: give master (a driver of this process) or remote (Spark Connect), not both"
    ]


def test_urls_with_a_port_and_an_at_sign_after_it_are_not_taken_for_credentials():
    """`host:port` is not `user:password`, even with an '@' later in the path or query."""
    conf = {
        "spark.sql.catalog.meta.url": "jdbc:postgresql://db.example.com:5432/meta?user=admin@db",
        "spark.hadoop.fs.defaultFS": "hdfs://nn:8020/user/alice@REALM",
        "spark.jars.repositories": "https://npm.corp:4873/@scope/pkg,http://host:8080/?email=a@b.c",
        "spark.driver.extraJavaOptions": "-Dx=http://host:80/a|ops@corp.com",
        # JDBC's parameters follow the port after ';'; a list of URLs, one with an '@' in a name
        "spark.sql.catalog.mssql.url": "jdbc:sqlserver://db:1433;databaseName=x;user=svc@corp.com",
        "spark.jars.ivySettings": "https://host,ops@example.com",
        "spark.hadoop.fs.s3a.endpoint": "https://minio/?signature_version=s3v4",
    }
    assert parse_config({"lake": "s3a://bucket/lake@x", "spark": {"conf": conf}}).spark.conf == conf


def test_settings_that_only_name_a_credentials_mechanism_are_accepted():
    conf = {
        "spark.hadoop.fs.s3a.aws.credentials.provider": "com.amazonaws.auth.InstanceProfileCredentialsProvider",
        # settings about keys, not keys
        "spark.io.encryption.keySizeBits": 256,
        "spark.io.encryption.keygen.algorithm": "HmacSHA256",
        "spark.executor.cores": 4,
        "spark.sql.adaptive.enabled": True,
    }
    config = parse_config({"lake": "/lake", "spark": {"conf": conf}})
    assert config.spark.conf == {
        **conf,
        "spark.io.encryption.keySizeBits": "256",
        "spark.executor.cores": "4",
        "spark.sql.adaptive.enabled": "true",
    }


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_a_file_nested_too_deeply_is_a_clear_error(tmp_path):
    assert file_problem(tmp_path, "lake: /lake\nx: " + "[" * 5000 + "]" * 5000 + "\n") == (
        "c.yaml: nested too deeply to be a configuration"
    )


def test_the_cli_says_what_is_wrong_with_its_environment_and_its_demo_folder(tmp_path, monkeypatch, capsys):
    """A DAGSTER_HOME that is no folder, a log folder that cannot be made, and a demo folder no
    lake URI can name each end the command with one line, not a traceback."""
    from lake_assets.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(
        f"lake: {tmp_path / 'lake'}\nfeeds: [{{name: u, format: unit_cdc, landing: {tmp_path}/u}}]\n"
    )
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "no-such-home"))
    assert main(["status", "--config", str(config)]) == 1
    assert "lake-assets: error: DAGSTER_HOME: " in capsys.readouterr().err
    monkeypatch.delenv("DAGSTER_HOME")
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("LAKE_ASSETS_LOG_DIR", str(tmp_path / "a-file" / "logs"))
    assert main(["run", "--config", str(config)]) == 1
    assert "the log folder " in capsys.readouterr().err
    assert main(["demo", "--dir", str(tmp_path / "x#y")]) == 1
    assert "lake-assets: error: lake: expected " in capsys.readouterr().err


def file_problem(tmp_path, content: str | bytes) -> str:
    """The ConfigError a configuration file with this content raises, its path cut to `c.yaml`."""
    path = tmp_path / "c.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    return str(raised.value).replace(str(path), "c.yaml")


@pytest.mark.parametrize("feeds", ["feeds: []\n", ""])
def test_a_file_that_configures_no_feed_is_refused(tmp_path, feeds):
    """It would otherwise run as "nothing changed since the last run"."""
    problem = file_problem(tmp_path, f"lake: {tmp_path / 'lake'}\n{feeds}")
    assert problem == f"c.yaml: {NO_FEED}"
    # with another mistake, both are said at once
    problem = file_problem(tmp_path, f"lake: {tmp_path / 'lake'}\nlease_wait_seconds: soon\n{feeds}")
    assert problem.splitlines()[0].startswith("c.yaml: lease_wait_seconds: ")
    assert problem.splitlines()[1:] == [f"c.yaml: {NO_FEED}"]


def test_a_file_path_prefixes_each_line(tmp_path):
    assert file_problem(
        tmp_path,
        "lake: /lake\nfeeds:\n  - {name: good, format: unit_cdc, landing: /l}\n"
        "  - {name: unit, format: unit_cdc, landing: /x, late_hours: true}\n",
    ) == ("c.yaml: feeds[1].late_hours: expected an integer from 0 to 87,600 (ten years), got true")


def test_yaml_mistakes_are_one_line_with_the_place(tmp_path):
    assert file_problem(tmp_path, "lake: /lake\nfeeds: [\n") == (
        "c.yaml: not valid YAML: line 3, column 1: expected the node content, but found '<stream end>'"
    )
    assert file_problem(tmp_path, "lake: /lake\nlake: /other\n") == (
        "c.yaml: not valid YAML: line 2, column 1: the key 'lake' is given twice in one mapping"
    )
    # a key YAML reads as null, a number or a truth value was a TypeError's traceback
    assert file_problem(tmp_path, "lake: /lake\n~: 3\n") == (
        "c.yaml: not valid YAML: line 2, column 1: the key None is not text (quote it if it is meant as a name)"
    )
    assert file_problem(tmp_path, "lake: /lake\nspark: {conf: {on: x}}\n") == (
        "c.yaml: not valid YAML: line 2, column 16: the key True is not text (quote it if it is meant as a name)"
    )
    assert file_problem(tmp_path, b"lake: /l\xe4ke\n") == "c.yaml: not UTF-8 text (line 1)"
    assert file_problem(tmp_path, "!!python/object/apply:os.system [echo hi]\n").startswith(
        "c.yaml: not valid YAML: line 1, column 1: could not determine a constructor for the tag"
    )


def test_a_file_larger_than_the_bound_is_refused_unread(tmp_path):
    padding = "# padding\n" * (MAX_CONFIG_BYTES // 10)
    assert file_problem(tmp_path, "lake: /lake\n" + padding) == (
        f"c.yaml: larger than {MAX_CONFIG_BYTES} bytes; a configuration file is a few kilobytes"
    )


def test_an_alias_bomb_fails_fast_with_a_clear_message(tmp_path):
    """Nine levels of nine aliases: a few hundred bytes that expand to 9^9 values."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    assert file_problem(tmp_path, "\n".join(["lake: /lake", *lines, "feeds: *a9"]) + "\n") == (
        f"c.yaml: not valid YAML: aliases expand it past {MAX_EXPANDED_NODES} values (an alias bomb?)"
    )
    assert file_problem(tmp_path, "lake: /lake\nfeeds: &loop [*loop]\n") == (
        "c.yaml: not valid YAML: line 2: an alias refers to a node that holds it"
    )


def test_a_few_aliases_are_fine(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "lake: /lake\nfeeds:\n  - &unit {name: a, format: unit_cdc, landing: /a, late_hours: 8}\n"
        "  - {<<: *unit, name: b, landing: /b}\n"
    )
    assert [(f.name, f.late_hours) for f in load_config(path).feeds] == [("a", 8), ("b", 8)]


def test_a_landing_that_does_not_exist_is_an_error(tmp_path):
    (tmp_path / "here").mkdir()
    (tmp_path / "file").write_text("")
    config = parse_config(
        {
            "lake": str(tmp_path / "lake"),
            "feeds": [
                {"name": "here", "format": "unit_cdc", "landing": str(tmp_path / "here")},
                {"name": "gone", "format": "unit_cdc", "landing": str(tmp_path / "gone")},
                {"name": "file", "format": "unit_cdc", "landing": str(tmp_path / "file")},
            ],
        }
    )
    with pytest.raises(ConfigError) as raised:
        check_landings(config, Storage())
    assert str(raised.value).splitlines() == [
        f"feeds[1].landing: file://{tmp_path}/gone does not exist",
        f"feeds[2].landing: file://{tmp_path}/file is not a folder",
    ]


def test_configs_built_in_code_take_positional_values_and_pick_the_format_model():
    feed = FeedConfig("unit", "unit_cdc", "/landing/unit/", tables=("accounts",))
    assert isinstance(feed, UnitCdcFeedConfig) and feed.landing == "file:///landing/unit"
    assert feed.orgs is None and feed.collections is None  # other formats' options read as absent
    flow = FeedConfig("flow", "flow_journal", "/f", collections=(CollectionConfig("acmeCo/a", ("/id",)),))
    config = LakeConfig(lake="/lake", feeds=(feed, flow))
    assert parse_config(yaml.safe_load(dump_config(config))) == config
    assert config.with_lake("s3://bucket/lake/").lake == "s3a://bucket/lake"
    with pytest.raises(ConfigError, match="lake: expected " + re.escape(URI) + ", got 'lake'"):
        config.with_lake("lake")
    with pytest.raises(ConfigError, match="unknown feed format 'csv'"):
        FeedConfig("unit", "csv", "/x")


@pytest.mark.parametrize("bad", ["..", ".", "../x", "a/b", "", ".hidden", "a\\b", "x..y", "a b", "abc\n"])
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
    assert layout.change_log_partition("unit", "accounts", "hour", "2024-01-01-05") == (
        "s3a://bucket/prefix/changes/unit/accounts/hour=2024-01-01-05"
    )
    for partition in ("../../../current", "2024/../..", "x/y", "a b"):
        with pytest.raises(UnsafePathError, match="partition"):
            layout.change_log_partition("unit", "accounts", "hour", partition)
        with pytest.raises(UnsafePathError, match="partition"):
            partition_folder("file:///lake/changes/unit/accounts", "hour", partition)
    assert normalise_root_uri("/abs/lake", "lake") == "file:///abs/lake"
    with pytest.raises(ConfigError):
        normalise_root_uri("file:///abs/../etc", "lake")


@pytest.mark.parametrize("root", ["/lakes/team#1", "file:///lakes/team?1", "s3a://bucket/lakes/team#1"])
def test_a_root_holding_a_hash_or_question_mark_is_refused_not_cut_short(root):
    """Parsed as a URI, `/lakes/team#1` was `/lakes/team`: two lakes would have been one."""
    with pytest.raises(ConfigError, match="holds '#' or '\\?'"):
        normalise_root_uri(root, "lake")


def test_flow_collections_need_keys_and_may_select_logical_partitions():
    feed = {
        "name": "flow",
        "format": "flow_journal",
        "landing": "/x",
        "collections": [{"name": "acmeCo/orders", "key": ["/id"], "partitions": {"category": ["Anvils"]}}],
    }
    parsed = parse_config({"lake": "/lake", "feeds": [feed]}).feeds[0].collections[0]
    assert (
        parsed.table == "acmeco_orders"
        and parsed.wants("category", "Anvils")
        and not parsed.wants("category", "Rockets")
    )
    assert problems(
        {"lake": "/lake", "feeds": [{**feed, "collections": [{"name": "a/b", "key": ["id"]}]}]}
    ) == [
        "feeds[0].collections[0].key[0]: expected a JSON pointer such as /id, got 'id'",
    ]
    # in code, the partitions are pairs: a field given twice was the last one, without a word
    with pytest.raises(pydantic.ValidationError, match="a partition field is given twice"):
        CollectionConfig(name="a/b", key=("/id",), partitions=(("region", ("eu",)), ("region", ("us",))))
    twice = {"name": "a/b", "key": ["/id"], "partitions": {"region": ["eu", "eu"]}}
    assert problems({"lake": "/lake", "feeds": [{**feed, "collections": [twice]}]}) == [
        "feeds[0].collections[0].partitions: a partition field's list names a value twice"
    ]


@pytest.mark.parametrize("name", ["acmeCo/-x", "acmeCo/.hidden", "./orders", "acmeCo/x..y", "acmeCo//x"])
def test_a_flow_collection_name_no_folder_can_stand_for_is_refused(name):
    """Each segment of a collection's name is a folder the lake goes into: one that starts with
    `-` or `.` was accepted, then failed every look at the landing."""
    feed = {
        "name": "flow",
        "format": "flow_journal",
        "landing": "/x",
        "collections": [{"name": name, "key": ["/id"]}],
    }
    assert problems({"lake": "/lake", "feeds": [feed]}) == [
        f"feeds[0].collections[0].name: expected a collection name such as acmeCo/orders, got {name!r}"
    ]


def test_embedded_cluster_and_connect_sessions_get_every_lake_sql_setting():
    """One list of the settings the lake's files depend on (timestamp types, Parquet TIME and
    nanosecond columns, UTC, partition values as text) goes to every kind of session alike; a
    Connect session gets no JVM or cluster settings, which are its server's."""
    from lake_assets.spark import DRIVER_SETTINGS, LAKE_SQL_SETTINGS, local_shuffle_partitions

    local, cluster = session_conf(), session_conf(master="spark://10.0.0.5:7077")
    connect = session_conf(remote="sc://127.0.0.1:15002")
    assert "spark.master" not in connect and connect["spark.remote"] == "sc://127.0.0.1:15002"
    # a local driver sizes its shuffles to its cores; nothing else differs
    sized_locally = local_shuffle_partitions(local["spark.master"])
    for conf, own in ((local, sized_locally), (cluster, {}), (connect, {})):
        assert {key: conf[key] for key in LAKE_SQL_SETTINGS} == {**LAKE_SQL_SETTINGS, **own}
    assert LAKE_SQL_SETTINGS["spark.sql.parquet.outputTimestampType"] == "TIMESTAMP_MICROS"
    assert LAKE_SQL_SETTINGS["spark.sql.timeType.enabled"] == "true"
    assert not set(DRIVER_SETTINGS) & set(connect)


def test_a_loopback_connect_url_with_a_token_is_addressed_as_localhost(monkeypatch):
    """PySpark's client sends a token over plain gRPC only to `localhost`; to 127.0.0.1 it would
    try TLS and retry for ever."""
    from lake_assets.spark import connect_url

    monkeypatch.delenv("SPARK_CONNECT_AUTHENTICATE_TOKEN", raising=False)
    assert connect_url("sc://127.0.0.1:15002") == "sc://127.0.0.1:15002"
    monkeypatch.setenv("SPARK_CONNECT_AUTHENTICATE_TOKEN", "t0ken")
    assert connect_url("sc://127.0.0.1:15002") == "sc://localhost:15002"
    assert connect_url("sc://127.0.0.1:15002/;user_id=me") == "sc://localhost:15002/;user_id=me"
    assert connect_url("sc://127.0.0.1:15002/;use_ssl=true") == "sc://127.0.0.1:15002/;use_ssl=true"
    assert (
        connect_url("sc://connect.example.com:443/;use_ssl=true")
        == "sc://connect.example.com:443/;use_ssl=true"
    )


def test_a_connect_session_that_keeps_another_value_for_a_lake_setting_is_refused_naming_it():
    from lake_assets.spark import apply_sql_settings

    class Conf:
        def __init__(self):
            self.values = {"spark.sql.timeType.enabled": "false"}

        def set(self, key, value):
            if key == "spark.sql.timeType.enabled":
                raise RuntimeError("CANNOT_MODIFY_CONFIG")
            self.values[key] = value

        def get(self, key, default=None):
            return self.values.get(key, default)

    session = type("Session", (), {"conf": Conf()})()
    apply_sql_settings(session, {"spark.sql.session.timeZone": "UTC"})
    with pytest.raises(
        ConfigError,
        match=re.escape("spark.sql.timeType.enabled is 'false' on the server, the lake needs 'true'"),
    ):
        apply_sql_settings(
            session, {"spark.sql.session.timeZone": "UTC", "spark.sql.timeType.enabled": "true"}
        )


def test_every_classic_session_builds_columns_without_recording_python_call_sites():
    """PySpark's per-expression call-site capture is off for the embedded driver and a cluster's
    driver alike (it costs the Python side, whichever runs the tasks); a caller may turn it back
    on. A Connect server does not know the setting (it is PySpark's classic sessions')."""
    for conf in (session_conf(), session_conf(master="spark://10.0.0.5:7077")):
        assert conf["spark.python.sql.dataFrameDebugging.enabled"] == "false"
    assert "spark.python.sql.dataFrameDebugging.enabled" not in session_conf(remote="sc://127.0.0.1:15002")
    mine = session_conf(extra={"spark.python.sql.dataFrameDebugging.enabled": "true"})
    assert mine["spark.python.sql.dataFrameDebugging.enabled"] == "true"


def test_only_the_embedded_driver_gets_the_lake_jvm_options(monkeypatch, tmp_path):
    """The embedded driver (which runs the tasks too) gets the parallel collector; a cluster's
    driver and a Connect server keep their operator's JVM options, and a caller's own setting
    wins over the lake's. (No class archive in this cache: `test_jvm_archive` adds one.)"""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(DRIVER_JAVA_OPTIONS_ENV, raising=False)  # the suite sets it
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


def test_a_driver_without_s3_writes_local_files_without_hadoop_checksum_files():
    impl = "spark.hadoop.fs.file.impl"
    # the embedded driver's own subclass of it (`test_jvm_classes.py`), a cluster's Hadoop's
    assert session_conf()[impl] in {LOCAL_FILE_SYSTEM_CLASS, "org.apache.hadoop.fs.RawLocalFileSystem"}
    assert session_conf(master="spark://10.0.0.5:7077")[impl] == "org.apache.hadoop.fs.RawLocalFileSystem"
    assert impl not in session_conf(use_s3=True)  # s3a buffers through the checksummed one
    assert impl not in session_conf(remote="sc://127.0.0.1:15002")  # the server's to choose


def test_a_local_driver_shuffles_into_one_partition_per_core():
    partitions = "spark.sql.shuffle.partitions"
    assert session_conf()[partitions] == "2"  # the embedded default, local[2]
    assert session_conf(master="local[3]")[partitions] == "3"
    assert session_conf(master="local[5,2]")[partitions] == "5"  # with a retry count
    assert session_conf(master="local[6, 2]")[partitions] == "6"
    assert session_conf(master="local")[partitions] == "1"
    assert session_conf(master="local[*]")[partitions] == str(len(os.sched_getaffinity(0)))
    # a cluster, a multi-process local cluster and Spark Connect keep the lake's setting
    for other in (
        session_conf(master="spark://10.0.0.5:7077"),
        session_conf(master="local-cluster[2,1,1024]"),
        session_conf(remote="sc://127.0.0.1:15002"),
    ):
        assert other[partitions] == "4"
    assert session_conf(extra={partitions: "8"})[partitions] == "8"


@pytest.mark.s3
def test_an_s3_landing_needs_its_bucket_but_not_yet_any_file(moto_server, s3_bucket):
    """S3 has no folders: an empty prefix is a landing nothing has arrived in yet; a bucket that
    does not exist is a mistake."""
    config = LakeConfig(
        lake="/lake",
        s3={"endpoint_url": moto_server.url},
        feeds=(
            FeedConfig("empty", "unit_cdc", f"s3a://{s3_bucket}/nothing/yet"),
            FeedConfig("typo", "unit_cdc", f"s3a://{s3_bucket}-typo/unit"),
        ),
    )
    with pytest.raises(ConfigError) as raised:
        check_landings(config, Storage(S3Config(endpoint_url=moto_server.url)))
    assert str(raised.value) == f"feeds[1].landing: s3a://{s3_bucket}-typo does not exist"


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("s3a://vendor:443/unit", "a bucket's name is 3 to 255"),  # pyarrow's own error was a traceback
        ("s3a://ab/unit", "a bucket's name is 3 to 255"),
        ("/tmp/la\x00ke", "holds a control character"),  # the system cuts the path at the NUL
        ("/tmp/lake\nINFO forged log line", "holds a control character"),
    ],
)
def test_a_root_no_store_can_name_is_refused_where_it_is_given(uri, words):
    [problem] = problems({"lake": "/lake", "feeds": [{**GOOD_FEED, "landing": uri}]})
    assert problem == f"feeds[0].landing: expected {URI}, got {uri!r}"
    with pytest.raises(ConfigError, match=words):
        normalise_root_uri(uri, "landing")


@pytest.mark.parametrize(
    "table",
    [
        "00Dx/account",
        "00Dx/1account",
        "00Dx/Account",
        "00Dx/" + "a" * 81,
        "00D-x/account",
        "00Dx/",
        "00Dx/acc/ount",
    ],
)
def test_a_grax_table_is_accepted_by_the_configuration_as_by_the_feed(table):
    """The configuration checks a GRAX table by the feed's own rule (`grax_v2.is_table`), so a
    table it accepts never fails when the feed splits it into org and object folders."""
    try:
        split_table(table)
        the_feed_accepts = True
    except ValueError:
        the_feed_accepts = False
    feed = {"name": "grax", "format": "grax_v2", "landing": "/g", "tables": [table]}
    try:
        parse_config({"lake": "/lake", "feeds": [feed]})
        the_configuration_accepts = True
    except ConfigError:
        the_configuration_accepts = False
    assert the_configuration_accepts == the_feed_accepts


@pytest.mark.parametrize(
    "root", ["s3a://land/unit/.", "s3a://land/unit/./x", "s3a://land/unit//x", "s3://land/../x"]
)
def test_an_s3_root_with_an_empty_dot_or_dot_dot_segment_is_refused(root):
    """An S3 prefix is literal: `unit/.` is not `unit`, and holds nothing, so a landing so
    spelt passed `config check` and every run found nothing landed, exit 0."""
    with pytest.raises(ConfigError, match=re.escape("must not hold an empty, '.' or '..' segment")):
        normalise_root_uri(root, "landing")
    assert normalise_root_uri("s3a://land/unit/", "landing") == "s3a://land/unit"
