"""The JIT option of the Spark JVMs the tests start as processes of their own.

Such a JVM (a `lake-assets run`, a Dagster run worker, the crash test's fold driver, a test
cluster's driver and executors, the Connect server) runs seconds of tiny queries and exits. The
JDK's optimising compiler (C2) spends more CPU on that code than its faster code gives back, and
the suite's two pytest processes already share two cores: with the quick compiler (C1) alone a
fold driver needs far less CPU and finishes sooner (docs/profiling.md, "Figures behind the code").

Not for the pytest process's own driver, which runs hundreds of tests' queries and gains from C2
(`conftest.spark`), nor for production drivers or the benchmarks, whose backfills' long loops
need it.

C1 alone gets the JDK's small code cache (48 MB): the Connect server, which compiles every
query of the runs it serves, filled it, and a full code cache stops its SparkContext ("Out of
space in CodeCache for adapters"). The cache is reserved at the size tiered compilation has.
"""

TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
