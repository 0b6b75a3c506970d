"""The catalog in DynamoDB, the original datalake index: `DynamoCatalogStore`.

The rules it keeps (what a put replaces, what each query returns, what a retirement takes out)
are `lake_assets.catalog.store`'s; this module only writes them as conditional DynamoDB requests
and reads records back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

from lake_assets.catalog.metadata import time_index_key
from lake_assets.catalog.store import CatalogStore, best_for_latest, what_where_key
from lake_assets.config_model import DEFAULT_REGION
from lake_assets.errors import CatalogError
from lake_assets.storage import PARALLEL_SMALL_REQUESTS


def _to_dynamo(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _to_dynamo(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_dynamo(v) for v in value]
    return value


def _from_dynamo(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _from_dynamo(v) for k, v in value.items()}
    if isinstance(value, (list, set, frozenset)):
        return [_from_dynamo(v) for v in value]
    return value


class DynamoCatalogStore(CatalogStore):
    """The original datalake index in DynamoDB.

    * records table `table`: HASH `time_index_key`, RANGE `range_key`; global secondary index
      `work-id-index`: HASH `work_id_index_key`, RANGE `range_key`, projection ALL;
    * latest table `latest_table`: HASH `what_where_key` = f"{what}:{where}", the latest record.

    Writes are conditional, so the rules of `CatalogStore` hold with concurrent writers: a
    record replaces one with the same key only if its create_time is at least as great; the
    latest item is replaced only by a record with a later start (or the same start and a
    create_time at least as great). Credentials come from boto3's default chain only.
    """

    WORK_ID_INDEX = "work-id-index"

    def __init__(
        self,
        table: str,
        latest_table: str,
        *,
        endpoint_url: str | None = None,
        region: str = DEFAULT_REGION,
        page_size: int | None = None,
        write_threads: int = 8,
    ):
        import boto3
        import botocore.config
        from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

        self.table = table
        self.latest_table = latest_table
        self.page_size = page_size  # Query page size (None: DynamoDB's own 1 MB pages)
        self.write_threads = max(1, write_threads)
        self.client = boto3.client(
            "dynamodb",
            endpoint_url=endpoint_url,
            region_name=region,
            # one connection for each query `each_request` makes at once (botocore keeps 10)
            config=botocore.config.Config(max_pool_connections=PARALLEL_SMALL_REQUESTS),
        )
        self._ser = TypeSerializer()
        self._de = TypeDeserializer()

    def __repr__(self) -> str:
        return f"DynamoCatalogStore(table={self.table!r}, latest_table={self.latest_table!r})"

    def _item(self, record: dict) -> dict:
        return {k: self._ser.serialize(_to_dynamo(v)) for k, v in record.items()}

    def _latest_item(self, what: str, where: str, record: dict) -> dict:
        """The latest table's item holding `record` for what:where."""
        return self._item({**record, "what_where_key": what_where_key(what, where)})

    @staticmethod
    def _latest_item_key(what: str, where: str) -> dict:
        return {"what_where_key": {"S": what_where_key(what, where)}}

    def _record(self, item: dict) -> dict:
        record = {k: _from_dynamo(self._de.deserialize(v)) for k, v in item.items()}
        record.pop("what_where_key", None)
        return record

    def create_tables(self) -> None:
        """Create both tables if absent (PAY_PER_REQUEST) and wait until they are usable."""
        errors = self.client.exceptions
        try:
            self.client.create_table(
                TableName=self.table,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[
                    {"AttributeName": "time_index_key", "AttributeType": "S"},
                    {"AttributeName": "range_key", "AttributeType": "S"},
                    {"AttributeName": "work_id_index_key", "AttributeType": "S"},
                ],
                KeySchema=[
                    {"AttributeName": "time_index_key", "KeyType": "HASH"},
                    {"AttributeName": "range_key", "KeyType": "RANGE"},
                ],
                GlobalSecondaryIndexes=[
                    {
                        "IndexName": self.WORK_ID_INDEX,
                        "KeySchema": [
                            {"AttributeName": "work_id_index_key", "KeyType": "HASH"},
                            {"AttributeName": "range_key", "KeyType": "RANGE"},
                        ],
                        "Projection": {"ProjectionType": "ALL"},
                    }
                ],
            )
        except errors.ResourceInUseException:
            pass
        try:
            self.client.create_table(
                TableName=self.latest_table,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": "what_where_key", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "what_where_key", "KeyType": "HASH"}],
            )
        except errors.ResourceInUseException:
            pass
        waiter = self.client.get_waiter("table_exists")
        for name in (self.table, self.latest_table):
            waiter.wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
        described = self.client.describe_table(TableName=self.table)["Table"]
        indexes = {i["IndexName"] for i in described.get("GlobalSecondaryIndexes", [])}
        if self.WORK_ID_INDEX not in indexes:
            raise CatalogError(f"table {self.table!r} exists without the {self.WORK_ID_INDEX!r} index")

    def _each(self, write: Callable[[dict], None], records: list[dict]) -> None:
        """`write` each record, on `write_threads` threads: the keys are distinct after
        CatalogStore's rules, so the writes are independent."""
        if len(records) > 1:
            with ThreadPoolExecutor(max_workers=min(self.write_threads, len(records))) as pool:
                list(pool.map(write, records))  # list(): re-raise the first error
        else:
            for record in records:
                write(record)

    def _put(self, records: list[dict], latest: dict[tuple[str, str], dict]) -> None:
        failed = self.client.exceptions.ConditionalCheckFailedException

        def put_record(record: dict) -> None:
            try:
                self.client.put_item(
                    TableName=self.table,
                    Item=self._item(record),
                    ConditionExpression="attribute_not_exists(#tk) OR #ct <= :ct",
                    ExpressionAttributeNames={"#tk": "time_index_key", "#ct": "create_time"},
                    ExpressionAttributeValues={":ct": {"N": str(record["create_time"])}},
                )
            except failed:
                pass  # a record with a later create_time holds the key

        self._each(put_record, records)
        for (what, where), record in latest.items():
            item = self._latest_item(what, where, record)
            try:
                self.client.put_item(
                    TableName=self.latest_table,
                    Item=item,
                    ConditionExpression=(
                        "attribute_not_exists(#wk) OR #m.#s < :s OR (#m.#s = :s AND #ct <= :ct)"
                    ),
                    ExpressionAttributeNames={
                        "#wk": "what_where_key",
                        "#m": "metadata",
                        "#s": "start",
                        "#ct": "create_time",
                    },
                    ExpressionAttributeValues={
                        ":s": {"N": str(record["metadata"]["start"])},
                        ":ct": {"N": str(record["create_time"])},
                    },
                )
            except failed:
                pass  # a later file is already the latest

    def _retire(self, retirements: list[dict]) -> None:
        failed = self.client.exceptions.ConditionalCheckFailedException

        def delete(retirement: dict) -> None:
            try:
                self.client.delete_item(
                    TableName=self.table,
                    Key={k: {"S": retirement[k]} for k in ("time_index_key", "range_key")},
                    ConditionExpression="#ct <= :ct",
                    ExpressionAttributeNames={"#ct": "create_time"},
                    ExpressionAttributeValues={":ct": {"N": str(retirement["create_time"])}},
                )
            except failed:
                pass  # absent, or put again after the retirement

        self._each(delete, retirements)

    def _latest_remaining(self, what: str, where: str) -> dict | None:
        # The records table has no index by what:where alone: a scan, on this rare path only.
        pages = self.client.get_paginator("scan").paginate(
            TableName=self.table,
            FilterExpression="#m.#w = :what AND begins_with(#r, :where)",
            ExpressionAttributeNames={"#m": "metadata", "#w": "what", "#r": "range_key"},
            ExpressionAttributeValues={":what": {"S": what}, ":where": {"S": f"{where}:"}},
            ConsistentRead=True,
        )
        records = (self._record(item) for page in pages for item in page.get("Items", []))
        return best_for_latest(records)

    def _replace_latest(self, what: str, where: str, retired: dict, best: dict | None) -> None:
        still_retired = {
            "ConditionExpression": "#m.#id = :id AND #ct = :ct",
            "ExpressionAttributeNames": {"#m": "metadata", "#id": "id", "#ct": "create_time"},
            "ExpressionAttributeValues": {
                ":id": {"S": retired["metadata"]["id"]},
                ":ct": {"N": str(retired["create_time"])},
            },
        }
        try:
            if best is None:
                self.client.delete_item(
                    TableName=self.latest_table, Key=self._latest_item_key(what, where), **still_retired
                )
            else:
                self.client.put_item(
                    TableName=self.latest_table, Item=self._latest_item(what, where, best), **still_retired
                )
        except self.client.exceptions.ConditionalCheckFailedException:
            pass  # a file put meanwhile is the latest now

    def _query(self, hash_name: str, hash_value: str, where: str | None, **extra) -> Iterator[dict]:
        condition = "#h = :h"
        names = {"#h": hash_name}
        values = {":h": {"S": hash_value}}
        if where is not None:
            condition += " AND begins_with(#r, :r)"
            names["#r"] = "range_key"
            values[":r"] = {"S": f"{where}:"}
        pages = self.client.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            PaginationConfig={"PageSize": self.page_size} if self.page_size else {},
            **extra,
        )
        for page in pages:
            for item in page.get("Items", []):
                yield self._record(item)

    def _time_bucket(self, bucket: str, what: str, where: str | None) -> Iterable[dict]:
        return self._query("time_index_key", time_index_key(bucket, what), where, ConsistentRead=True)

    def _work_id(self, work_id_index_key: str, where: str | None) -> Iterable[dict]:
        return self._query("work_id_index_key", work_id_index_key, where, IndexName=self.WORK_ID_INDEX)

    def _latest(self, what: str, where: str) -> dict | None:
        answer = self.client.get_item(
            TableName=self.latest_table,
            Key=self._latest_item_key(what, where),
            ConsistentRead=True,
        )
        item = answer.get("Item")
        return self._record(item) if item else None
