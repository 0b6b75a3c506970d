"""Which catalog store a lake's configuration names, opened: Parquet under `<lake>/catalog`
(the default) or DynamoDB tables (the datalake-common index layout). Shared by the Dagster
resource and the commands that read the catalog without Dagster."""

from __future__ import annotations

from lake_assets.catalog.dynamodb_store import DynamoCatalogStore
from lake_assets.catalog.parquet_store import ParquetCatalogStore
from lake_assets.catalog.store import CatalogStore
from lake_assets.config_model import DEFAULT_REGION
from lake_assets.errors import ConfigError
from lake_assets.storage import Storage


def open_store(
    kind: str,
    catalog_uri: str,
    storage: Storage,
    *,
    table: str | None = None,
    latest_table: str | None = None,
    endpoint_url: str | None = None,
    region: str = DEFAULT_REGION,
) -> CatalogStore:
    """The `kind` of store ("parquet" or "dynamodb"); a DynamoDB store's credentials come from
    the environment."""
    if kind == "dynamodb":
        if not table or not latest_table:
            raise ConfigError("catalog: the DynamoDB store needs `table` and `latest_table`")
        return DynamoCatalogStore(table, latest_table, endpoint_url=endpoint_url, region=region)
    return ParquetCatalogStore(catalog_uri, storage)
