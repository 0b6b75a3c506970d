"""The embedded session's settings reach the JVM PySpark starts, not only the config dict."""


def test_the_embedded_driver_collects_garbage_with_the_parallel_collector(spark):
    """`spark.driver.extraJavaOptions` only counts when PySpark's launcher starts the JVM with
    it; a session built after a JVM already exists would silently keep G1."""
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = sorted(bean.getName() for bean in beans)
    assert names == ["PS MarkSweep", "PS Scavenge"], names
