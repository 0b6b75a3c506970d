"""Dagster resources: the lake and its object storage, the file catalog, and the PySpark session."""

from __future__ import annotations

from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import PrivateAttr

from lake_assets import spark as spark_settings
from lake_assets.catalog.opening import open_store
from lake_assets.catalog.store import CatalogStore
from lake_assets.config_model import DEFAULT_LEASE_WAIT_SECONDS, DEFAULT_REGION, S3Config
from lake_assets.paths import LakeLayout
from lake_assets.storage import FOOTER_PROBE, Storage

# Clients live in private attributes, made on first use: Dagster initialises a fresh copy of each
# resource for every run (and every sensor tick), so a client is built once per run and never
# shared between runs. (Dagster's `cached_method` would do the same, but it is not part of the
# public `dagster` API; this is the `PrivateAttr` state its resource guide describes.) Made on
# first use rather than in `setup_for_execution`, a run that needs no client builds none.


class LakeResource(dg.ConfigurableResource):
    """The lake root and object storage access for `file://` and `s3a://` URIs.

    Access keys are never part of this config: they come from the standard AWS environment
    variables when a client is created.
    """

    root: str
    s3_endpoint_url: str | None = None
    s3_region: str = DEFAULT_REGION
    #: how long a step waits for another writer of its table (`lake_assets.lease`)
    lease_wait_seconds: int = DEFAULT_LEASE_WAIT_SECONDS

    _storage: Storage | None = PrivateAttr(default=None)

    def get_storage(self) -> Storage:
        if self._storage is None:
            self._storage = Storage(S3Config(endpoint_url=self.s3_endpoint_url, region=self.s3_region))
        return self._storage

    def layout(self) -> LakeLayout:
        return LakeLayout(self.root)


class CatalogResource(dg.ConfigurableResource):
    """The file catalog: Parquet under `<lake>/catalog` by default, or DynamoDB tables (the
    datalake-common index layout). DynamoDB credentials come from the environment."""

    lake: LakeResource
    store: str = "parquet"
    table: str | None = None
    latest_table: str | None = None
    endpoint_url: str | None = None
    region: str = DEFAULT_REGION

    _store: CatalogStore | None = PrivateAttr(default=None)

    def get_store(self) -> CatalogStore:
        if self._store is None:
            self._store = self._open_store()
        return self._store

    def _open_store(self) -> CatalogStore:
        return open_store(
            self.store,
            self.lake.layout().catalog(),
            self.lake.get_storage(),
            table=self.table,
            latest_table=self.latest_table,
            endpoint_url=self.endpoint_url,
            region=self.region,
        )


class LakeSparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session, created on first use from the lake's Spark settings.

    `spark_config` holds the non-secret settings (shown in the UI); s3a access keys are added
    from the environment at session start and never appear in config or logs.

    Why the public `spark_session` and `spark_context` accessors are overridden: dagster-pyspark
    builds its session from `spark_config` alone, with a plain `SparkSession.builder`. The lake's
    session needs its own builder (`lake_assets.spark.build_session`): access keys read from the
    environment at start (never in config), the lake's settings applied to a Spark Connect
    session too, executors prepared on a cluster. Nothing private of the parent is used: the
    session lives in this class's own attribute.
    """

    _lake_session: Any = PrivateAttr(default=None)

    @property
    def spark_session(self) -> Any:
        """The session, built on first use by the lake's builder, and again when its driver has
        ended (a table's step that ran it out of memory fails; the steps after it get a new one)."""
        with spark_settings.DRIVER_LOCK:
            if self._lake_session is None or spark_settings.driver_ended(self._lake_session):
                FOOTER_PROBE.start()  # the run reads footers next: the probe imports pyarrow meanwhile
                self._lake_session = spark_settings.build_session(self.spark_config)
            return self._lake_session

    @property
    def spark_context(self) -> Any:
        """The lake session's context (the parent's would start a session of its own)."""
        return self.spark_session.sparkContext

    @classmethod
    def for_lake(
        cls,
        *,
        master: str | None,
        remote: str | None,
        extra: dict[str, str],
        use_s3: bool,
        s3_endpoint_url: str | None,
        s3_region: str,
    ) -> LakeSparkResource:
        conf: dict[str, Any] = spark_settings.session_conf(
            master=master,
            remote=remote,
            extra=extra,
            use_s3=use_s3,
            s3_endpoint_url=s3_endpoint_url,
            s3_region=s3_region,
        )
        return cls(spark_config=conf)
