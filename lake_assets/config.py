"""The feed configuration file: where the lake is and which vendor feeds land where.

```yaml
lake: file:///abs/lake            # or s3a://bucket/prefix
feeds:
  - name: unit                    # [a-z0-9_-]+
    format: unit_cdc
    landing: file:///abs/landing/unit
    tables: [accounts]            # optional: discovered from the landing layout when omitted
    start: 2024-01-01-00          # optional: first hourly partition, discovered when omitted
    late_hours: 4                 # optional: how long an hour folder may still gain files
    sensor_interval_seconds: 30   # optional: how often the daemon looks for new files
    watch: true                   # optional: false = the landing sensor starts stopped (backfills only)
  - name: grax
    format: grax_v2
    landing: s3a://bucket          # holds parquet/v2/org=…/object=…/batch=…/ (or name parquet/v2)
    orgs: [00D5e000000demoEAA]     # optional: discovered when omitted
    objects: [Account, Contact]    # optional: discovered when omitted
  - name: flow
    format: flow_journal
    landing: s3a://bucket/prefix   # the storage prefix holding <collection>/…/pivot=…/utc_date=…/
    collections:                   # required: each collection and its key (JSON pointers)
      - {name: acmeCo/orders, key: [/id]}
      - {name: acmeCo/events, key: [/id], partitions: {region: [eu, us]}}  # read only these
```
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from lake_assets.errors import ConfigError
from lake_assets.paths import normalise_root_uri

NAME_PATTERN = re.compile(r"^[a-z0-9_-]+$")
TABLE_PATTERN = re.compile(r"^[a-z0-9_]+$")
KNOWN_FORMATS = ("unit_cdc", "grax_v2", "flow_journal")
GROUPED_FORMATS = ("grax_v2",)  # tables named <org>/<object>
ORG_PATTERN = re.compile(r"^[A-Za-z0-9]{1,64}$")
OBJECT_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")
COLLECTION_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
POINTER_PATTERN = re.compile(r"^(/[A-Za-z0-9_.-]+)+$")


@dataclasses.dataclass(frozen=True)
class CollectionConfig:
    """A Flow collection: its name (which is also its storage prefix) and its key pointers."""

    name: str
    key: tuple[str, ...]
    #: logical partitions to read, field -> accepted values; all when empty
    partitions: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def wants(self, field: str, value: str) -> bool:
        """Whether a logical partition folder `field=value` is selected."""
        selected = dict(self.partitions)
        return field not in selected or value in selected[field]

    @property
    def table(self) -> str:
        """The lake table: the name in lower case, anything but [a-z0-9_] as `_`."""
        return re.sub(r"[^a-z0-9_]", "_", self.name.lower())


@dataclasses.dataclass(frozen=True)
class FeedConfig:
    name: str
    format: str
    landing: str
    tables: tuple[str, ...] | None = None
    start: str | None = None
    late_hours: int = 4
    sensor_interval_seconds: int = 30
    watch: bool = True
    orgs: tuple[str, ...] | None = None
    objects: tuple[str, ...] | None = None
    collections: tuple[CollectionConfig, ...] | None = None


@dataclasses.dataclass(frozen=True)
class S3Config:
    """Where S3 lives; credentials come from the environment, never from this file."""

    endpoint_url: str | None = None
    region: str = "us-east-1"


@dataclasses.dataclass(frozen=True)
class SparkConfig:
    master: str | None = None
    remote: str | None = None
    conf: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CatalogConfig:
    """Where the file catalog lives: Parquet in the lake (default) or DynamoDB tables."""

    store: str = "parquet"
    table: str | None = None  # DynamoDB records table
    latest_table: str | None = None  # DynamoDB "latest" table
    endpoint_url: str | None = None  # DynamoDB endpoint (local or compatible services)


@dataclasses.dataclass(frozen=True)
class LakeConfig:
    lake: str
    feeds: tuple[FeedConfig, ...]
    s3: S3Config = S3Config()
    spark: SparkConfig = SparkConfig()
    source: str | None = None
    catalog: CatalogConfig = CatalogConfig()

    def feed(self, name: str) -> FeedConfig:
        for feed in self.feeds:
            if feed.name == name:
                return feed
        raise ConfigError(f"no feed named {name!r} (configured: {[f.name for f in self.feeds]})")

    def with_lake(self, lake: str) -> "LakeConfig":
        return dataclasses.replace(self, lake=normalise_root_uri(lake, "lake"))


def _require(mapping: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in mapping or mapping[key] in (None, ""):
        raise ConfigError(f"{where}: '{key}' is required")
    return mapping[key]


def parse_feed(raw: Mapping[str, Any], index: int) -> FeedConfig:
    where = f"feeds[{index}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    unknown = set(raw) - {f.name for f in dataclasses.fields(FeedConfig)}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    name = str(_require(raw, "name", where))
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"{where}: name {name!r} must match {NAME_PATTERN.pattern}")
    fmt = str(_require(raw, "format", where))
    if fmt not in KNOWN_FORMATS:
        raise ConfigError(f"{where} ({name}): format {fmt!r} is not one of {list(KNOWN_FORMATS)}")
    landing = normalise_root_uri(str(_require(raw, "landing", where)), f"{where}.landing")
    grouped = fmt in GROUPED_FORMATS
    tables = _names(raw, "tables", where, name, TABLE_PATTERN, grouped=grouped)
    orgs = _names(raw, "orgs", where, name, ORG_PATTERN)
    objects = _names(raw, "objects", where, name, OBJECT_PATTERN)
    if (orgs or objects) and not grouped:
        raise ConfigError(f"{where} ({name}): 'orgs' and 'objects' apply to the formats {list(GROUPED_FORMATS)} only")
    collections = _collections(raw.get("collections"), f"{where} ({name})")
    if (collections is None) != (fmt != "flow_journal"):
        raise ConfigError(f"{where} ({name}): 'collections' is required for flow_journal feeds and only for them")
    start = raw.get("start")
    if start is not None:
        start = str(start)
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}-\d{2}", start):
            raise ConfigError(f"{where} ({name}): start {start!r} must look like 2024-01-31-00")
    late_hours = raw.get("late_hours", 4)
    if not isinstance(late_hours, int) or late_hours < 0:
        raise ConfigError(f"{where} ({name}): late_hours must be a non-negative integer")
    interval = raw.get("sensor_interval_seconds", 30)
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        raise ConfigError(f"{where} ({name}): sensor_interval_seconds must be a positive integer")
    watch = raw.get("watch", True)
    if not isinstance(watch, bool):
        raise ConfigError(f"{where} ({name}): watch must be true or false")
    return FeedConfig(
        name=name, format=fmt, landing=landing, tables=tables, start=start, late_hours=late_hours,
        sensor_interval_seconds=interval, watch=watch, orgs=orgs, objects=objects, collections=collections,
    )


def _collections(raw: Any, where: str) -> tuple[CollectionConfig, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise ConfigError(f"{where}: 'collections' must be a non-empty list")
    out = []
    for item in raw:
        if not isinstance(item, Mapping) or not {"name", "key"} <= set(item) <= {"name", "key", "partitions"}:
            raise ConfigError(f"{where}: a collection takes 'name', 'key' and optionally 'partitions', got {item!r}")
        name, key = str(item["name"]), item["key"]
        if not COLLECTION_PATTERN.match(name) or ".." in name:
            raise ConfigError(f"{where}: collection {name!r} must match {COLLECTION_PATTERN.pattern}")
        if not isinstance(key, Sequence) or isinstance(key, str) or not key or not all(
            isinstance(k, str) and POINTER_PATTERN.match(k) for k in key
        ):
            raise ConfigError(f"{where}: collection {name!r}: key must be a list of JSON pointers like ['/id']")
        selection = item.get("partitions") or {}
        if not isinstance(selection, Mapping) or not all(
            re.fullmatch(r"[A-Za-z0-9_]+", str(f)) and isinstance(v, Sequence) and not isinstance(v, str) and v
            for f, v in selection.items()
        ):
            raise ConfigError(f"{where}: collection {name!r}: partitions must map a field to a list of values")
        partitions = tuple(sorted((str(f), tuple(str(v) for v in values)) for f, values in selection.items()))
        out.append(CollectionConfig(name=name, key=tuple(key), partitions=partitions))
    tables = [c.table for c in out]
    if len(set(tables)) != len(tables):
        raise ConfigError(f"{where}: collections map onto the same table name: {tables}")
    return tuple(out)


def _names(raw: Mapping[str, Any], key: str, where: str, feed: str, pattern: re.Pattern, grouped: bool = False):
    """An optional non-empty list of names, each matching `pattern` (`group/name` when grouped)."""
    values = raw.get(key)
    if values is None:
        return None
    if not isinstance(values, Sequence) or isinstance(values, str) or not values:
        raise ConfigError(f"{where} ({feed}): '{key}' must be a non-empty list")
    for value in values:
        parts = value.split("/", 1) if grouped and isinstance(value, str) else [value]
        if grouped and (len(parts) != 2 or not ORG_PATTERN.match(parts[0])):
            raise ConfigError(f"{where} ({feed}): {key[:-1]} {value!r} must look like '<org>/<object>'")
        if not all(isinstance(p, str) and pattern.match(p) for p in parts[-1:]):
            raise ConfigError(f"{where} ({feed}): {key[:-1]} {value!r} must match {pattern.pattern}")
    return tuple(values)


def parse_config(raw: Any, source: str | None = None) -> LakeConfig:
    where = source or "config"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    unknown = set(raw) - {"lake", "feeds", "s3", "spark", "catalog"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    lake = normalise_root_uri(str(_require(raw, "lake", where)), "lake")
    feeds_raw = raw.get("feeds") or []
    if not isinstance(feeds_raw, Sequence) or isinstance(feeds_raw, str):
        raise ConfigError(f"{where}: 'feeds' must be a list")
    feeds = tuple(parse_feed(f, i) for i, f in enumerate(feeds_raw))
    names = [f.name for f in feeds]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: feed names must be unique, got {names}")
    s3_raw = raw.get("s3") or {}
    if set(s3_raw) - {"endpoint_url", "region"}:
        raise ConfigError(
            f"{where}: s3 takes only endpoint_url and region; credentials come from the environment "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
        )
    spark_raw = raw.get("spark") or {}
    if set(spark_raw) - {"master", "remote", "conf"}:
        raise ConfigError(f"{where}: spark takes master, remote and conf")
    catalog_raw = raw.get("catalog") or {}
    if not isinstance(catalog_raw, Mapping) or set(catalog_raw) - {f.name for f in dataclasses.fields(CatalogConfig)}:
        raise ConfigError(f"{where}: catalog takes store, table, latest_table and endpoint_url")
    catalog = CatalogConfig(**{k: str(v) for k, v in catalog_raw.items()})
    if catalog.store not in ("parquet", "dynamodb"):
        raise ConfigError(f"{where}: catalog store {catalog.store!r} must be 'parquet' or 'dynamodb'")
    if catalog.store == "dynamodb" and not (catalog.table and catalog.latest_table):
        raise ConfigError(f"{where}: a dynamodb catalog needs 'table' and 'latest_table'")
    return LakeConfig(
        lake=lake,
        catalog=catalog,
        feeds=feeds,
        s3=S3Config(endpoint_url=s3_raw.get("endpoint_url"), region=s3_raw.get("region", "us-east-1")),
        spark=SparkConfig(
            master=spark_raw.get("master"),
            remote=spark_raw.get("remote"),
            conf={str(k): str(v) for k, v in (spark_raw.get("conf") or {}).items()},
        ),
        source=source,
    )


def load_config(path: str | os.PathLike[str]) -> LakeConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    with path.open() as handle:
        try:
            raw = yaml.safe_load(handle)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_config(raw, source=str(path))


def dump_config(config: LakeConfig) -> str:
    """YAML text for a config (used by the demo to write the config it runs)."""
    feeds = []
    for feed in config.feeds:
        entry: dict[str, Any] = {"name": feed.name, "format": feed.format, "landing": feed.landing}
        if feed.tables:
            entry["tables"] = list(feed.tables)
        if feed.start:
            entry["start"] = feed.start
        if feed.late_hours != 4:
            entry["late_hours"] = feed.late_hours
        if feed.sensor_interval_seconds != 30:
            entry["sensor_interval_seconds"] = feed.sensor_interval_seconds
        if not feed.watch:
            entry["watch"] = False
        for key in ("orgs", "objects"):
            if getattr(feed, key):
                entry[key] = list(getattr(feed, key))
        if feed.collections:
            entry["collections"] = [
                {"name": c.name, "key": list(c.key), **({"partitions": {f: list(v) for f, v in c.partitions}} if c.partitions else {})}
                for c in feed.collections
            ]
        feeds.append(entry)
    return yaml.safe_dump({"lake": config.lake, "feeds": feeds}, sort_keys=False)
