"""The embedded session's settings reach the JVM PySpark starts, not only the config dict."""


def test_the_embedded_driver_collects_garbage_with_the_parallel_collector(spark):
    """`spark.driver.extraJavaOptions` only counts when PySpark's launcher starts the JVM with
    it; a session built after a JVM already exists would silently keep G1."""
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = sorted(bean.getName() for bean in beans)
    assert names == ["PS MarkSweep", "PS Scavenge"], names


def test_the_test_runs_own_driver_keeps_the_jdks_default_compilers(spark):
    """The quick-JIT option the suite gives the drivers it starts as processes must not reach
    the pytest process's own driver, which lives for the whole run (`jvm_options`)."""
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = [str(a) for a in runtime.getInputArguments()]
    assert not [a for a in arguments if "TieredStopAtLevel" in a], arguments


def test_column_functions_make_no_call_site_round_trips(spark):
    """PySpark decides once per process, from the live session, whether every Column function
    records its Python call site in the JVM; the lake's session says no."""
    from pyspark.errors.utils import is_debugging_enabled
    from pyspark.sql import functions as F

    F.col("any")  # the first Column function reads the setting
    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert is_debugging_enabled() is False


def test_the_access_keys_are_not_on_the_driver_jvms_command_line(spark, moto_server, s3_bucket):
    """Any local user can read a process's command line (`ps`); the s3a keys reach the driver
    after it starts, and s3a reads and writes with them."""
    import os

    from pyspark import SparkContext

    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    driver = SparkContext._gateway.proc.pid
    with open(f"/proc/{driver}/cmdline", "rb") as command:
        assert secret.encode() not in command.read()
    uri = f"s3a://{s3_bucket}/keys-probe"
    spark.range(3).write.mode("overwrite").parquet(uri)
    assert spark.read.parquet(uri).count() == 3


def test_temporary_keys_reach_every_read_and_write_with_their_token(spark, monkeypatch):
    """With a session token the keys go with `TemporaryAWSCredentialsProvider`; the settings a
    read or write hands its tasks (`newHadoopConf`: the SQL settings over the context's Hadoop
    configuration) must carry that provider, not the default set at launch (a provider given as
    a SQL setting would win over it, and S3 would refuse the key without its token)."""
    from lake_assets import spark as spark_settings

    conf = spark_settings.session_conf(use_s3=True)
    assert "fs.s3a.aws.credentials.provider" not in conf  # launch settings only: `spark.hadoop.` ones
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    before = {key: hadoop.get(key) for key in ("fs.s3a.aws.credentials.provider", "fs.s3a.session.token")}
    monkeypatch.setenv("AWS_SESSION_TOKEN", "a-session-token")
    try:
        spark_settings._give_s3a_its_keys(spark)
        handed = spark._jsparkSession.sessionState().newHadoopConf()
        assert handed.get("fs.s3a.aws.credentials.provider").startswith(
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        )
        assert handed.get("fs.s3a.session.token") == "a-session-token"
    finally:
        for key, value in before.items():
            hadoop.unset(key) if value is None else hadoop.set(key, value)


def test_temporary_keys_serve_a_first_read_of_many_files_at_once(spark, moto_server, s3_bucket, monkeypatch):
    """Spark checks a read's paths from a pool of threads; the first use of a bucket's
    connector then asks its credentials provider from many threads at once. The connector's
    `TemporaryAWSCredentialsProvider` answers "has no credentials" to all but the first of them
    (it marks itself ready before it is: HADOOP-18233, fixed after the connector the lake uses),
    which failed the first read of every landing on S3 with a session token."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from lake_assets import spark as spark_settings

    client = moto_server.client("s3")
    body = io.BytesIO()
    pq.write_table(pa.table({"n": [1]}), body)
    uris = []
    for index in range(120):
        client.put_object(Bucket=s3_bucket, Key=f"landing/part-{index:03}.parquet", Body=body.getvalue())
        uris.append(f"s3a://{s3_bucket}/landing/part-{index:03}.parquet")
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    before = {key: hadoop.get(key) for key in ("fs.s3a.aws.credentials.provider", "fs.s3a.session.token")}
    monkeypatch.setenv("AWS_SESSION_TOKEN", "a-session-token")
    try:
        spark_settings._give_s3a_its_keys(spark)
        assert spark.read.parquet(*uris).count() == 120
    finally:
        for key, value in before.items():
            hadoop.unset(key) if value is None else hadoop.set(key, value)
