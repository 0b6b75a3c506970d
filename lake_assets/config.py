"""The feed configuration file: where the lake is, which vendor feeds land where, and how to
reach S3, Spark and the catalog. The README ("Running it on your data") shows a whole file and
every key; tables, a feed's first partition and GRAX's orgs and objects are pinned by `lake-assets
discover` (`tables`, `orgs`, `objects` only narrow what it found), never by listing a landing at
load time.

The models are typed (pydantic): the options every feed has are `config_model.FeedConfig`, each
format's own model lives beside its feed module, and the `format` key picks one. A mistake is a
ConfigError with one line per mistake naming the key path, what was expected and the value given.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias, Union
from urllib.parse import unquote

import yaml
from pydantic import AfterValidator, Field, PlainValidator, PrivateAttr, ValidationError, model_validator

from lake_assets.config_model import (
    AWS_CREDENTIAL_VARIABLES,
    CREDENTIALS_COME_FROM_THE_ENVIRONMENT,
    DEFAULT_LEASE_WAIT_SECONDS,
    EndpointUrl,
    FeedConfig,
    LeaseWait,
    Model,
    RootUri,
    S3Config,
    Text,
    checked,
    expected,
    explain,
    looks_secret,
    may_hold_credential,
    refused,
    without_credentials_in_url,
)
from lake_assets.errors import ConfigError
from lake_assets.feeds import feed_config_models
from lake_assets.feeds.flow_journal import CollectionConfig
from lake_assets.paths import identifier, is_s3
from lake_assets.storage import FILE_ERRORS, Storage

__all__ = [
    "CatalogConfig",
    "CollectionConfig",
    "FeedConfig",
    "LakeConfig",
    "S3Config",
    "SparkConfig",
    "check_landings",
    "dump_config",
    "load_config",
    "parse_config",
    "resolved_config",
]

#: the largest configuration file read (a feed list is a few kilobytes)
MAX_CONFIG_BYTES = 1 << 20
#: the most YAML nodes a file may expand to through its aliases (a billion-laughs file expands
#: to ~10^9 from a few hundred bytes)
MAX_EXPANDED_NODES = 100_000

if TYPE_CHECKING:
    # Statically, every format's model is a FeedConfig (the union below is built at run time).
    AnyFeedConfig: TypeAlias = FeedConfig
else:
    # Union[...] of a runtime tuple: the `X | Y` spelling cannot take the formats as a sequence.
    AnyFeedConfig = Annotated[Union[feed_config_models()], Field(discriminator="format")]  # noqa: UP007


def _spark_setting(value: Any) -> str:
    """Spark settings are text; YAML numbers and booleans are written as Spark spells them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        text = without_credentials_in_url(str(value))
        if any(looks_secret(name) for name in _JAVA_PROPERTY.findall(text)):
            # `-Daws.secretAccessKey=…` in Java options: on a command line any local user can read
            raise refused(
                f"sets a Java property that looks like a credential; {CREDENTIALS_COME_FROM_THE_ENVIRONMENT}"
            )
        if may_hold_credential(text):  # `jdbc:sqlserver://h:1433;password=…`
            raise refused(
                f"sets something that looks like a credential; {CREDENTIALS_COME_FROM_THE_ENVIRONMENT}"
            )
        return text
    raise expected("a text, number or true/false setting value")


#: the names of the Java system properties a setting's value sets (`-Dname=value`)
_JAVA_PROPERTY = re.compile(r"(?:^|[\s\"'])-D([^=\s]+)=")


#: Spark settings that say where Spark runs: given as `spark.master` or `spark.remote`, where
#: they are checked (no credentials, one of the two), never among the other settings
_PLACE_SETTINGS = {"spark.master": "master", "spark.remote": "remote"}


def _spark_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise expected("a Spark setting name such as spark.executor.memory")
    if looks_secret(name):
        raise refused(f"looks like a credential; {CREDENTIALS_COME_FROM_THE_ENVIRONMENT}")
    if name.strip() in _PLACE_SETTINGS:
        raise refused(
            f"where Spark runs is given as spark.{_PLACE_SETTINGS[name.strip()]}, not among its settings"
        )
    return name


#: a Spark Connect URL as PySpark takes it: a host (an IPv6 address in brackets), maybe a
#: port, then `/;name=value` parameters
_CONNECT_URL = re.compile(
    r"sc://(\[[0-9A-Fa-f:.]+\]|[^\s/:;?#@\[\]]+)(:\d{1,5})?(/(;[^;=\s/?#]+=[^;\s?#]*)*)?"
)
#: a parameter PySpark does not read is sent as a header of every request: these carry a
#: credential there, beside the names that look like a credential's (`looks_secret`)
_CREDENTIAL_HEADER = re.compile(r"authori[sz]ation|cookie|bearer", re.IGNORECASE)
_CONNECT_CREDENTIALS_FROM_THE_ENVIRONMENT = (
    "a Spark Connect token comes from the environment (SPARK_CONNECT_AUTHENTICATE_TOKEN), "
    "never from the configuration file"
)


def _connect_url(value: Any) -> str:
    """A Spark Connect URL, `sc://host:port[/;param=value…]`, with no credential in it. It is
    looked for anywhere in the text (`;token=` with no `/` before it, `?token=`), and no error
    repeats the text: a parameter written without its `=` may be the token itself."""
    if not isinstance(value, str):
        raise expected("a Spark Connect URL such as sc://host:15002")
    address, _, parameters = value.partition("/;")
    pairs = [pair.partition("=") for pair in parameters.split(";") if pair]
    if (
        "@" in address
        or may_hold_credential(value)
        or any(_CREDENTIAL_HEADER.search(name) or looks_secret(name) for name, _, _ in pairs)
        or any(unquote(text).strip().lower().startswith(("bearer ", "basic ")) for _, _, text in pairs)
    ):
        raise refused(_CONNECT_CREDENTIALS_FROM_THE_ENVIRONMENT)
    if not _CONNECT_URL.fullmatch(value):
        raise refused("expected a Spark Connect URL such as sc://host:15002 (parameters as /;name=value)")
    return value


class SparkConfig(Model):
    master: Annotated[Text, AfterValidator(without_credentials_in_url)] | None = None
    remote: Annotated[str, PlainValidator(_connect_url)] | None = None
    conf: dict[
        Annotated[str, PlainValidator(_spark_name)], Annotated[str, PlainValidator(_spark_setting)]
    ] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_place_to_run(self) -> SparkConfig:
        if self.master is not None and self.remote is not None:
            raise refused(
                "give master (a driver of this process) or remote (Spark Connect), not both", at=("remote",)
            )
        return self


class CatalogConfig(Model):
    """Where the file catalog lives: Parquet in the lake (default) or DynamoDB tables."""

    store: Annotated[str, checked("parquet or dynamodb", lambda v: v in ("parquet", "dynamodb"))] = "parquet"
    table: Text | None = None  # DynamoDB records table
    latest_table: Text | None = None  # DynamoDB "latest" table
    endpoint_url: EndpointUrl | None = None  # DynamoDB endpoint (local or compatible services)

    @model_validator(mode="after")
    def _dynamodb_names_its_tables(self) -> CatalogConfig:
        for key in ("table", "latest_table"):
            if self.store == "dynamodb" and getattr(self, key) is None:
                raise refused("required for a dynamodb catalog", at=(key,))
        return self


class LakeConfig(Model):
    lake: RootUri
    feeds: tuple[AnyFeedConfig, ...] = ()
    s3: S3Config = S3Config()
    spark: SparkConfig = SparkConfig()
    catalog: CatalogConfig = CatalogConfig()
    #: how long a run waits for another writer of a table (a run started by hand beside the
    #: daemon's) to finish with it (`lease`)
    lease_wait_seconds: LeaseWait = DEFAULT_LEASE_WAIT_SECONDS
    #: the file it was read from, if any
    _source: str | None = PrivateAttr(None)

    @property
    def source(self) -> str | None:
        return self._source

    @model_validator(mode="after")
    def _feeds_have_their_own_names_and_landings(self) -> LakeConfig:
        seen: dict[str, int] = {}
        for index, feed in enumerate(self.feeds):
            # Dagster's names (jobs, sensors, pools) spell a feed's `-` as `_`
            as_dagster_name = identifier(feed.name)
            if as_dagster_name in seen:
                taken = self.feeds[seen[as_dagster_name]].name
                alike = "" if taken == feed.name else f" ({taken!r}: Dagster names spell '-' as '_')"
                raise refused(
                    f"the feed name {feed.name!r} is already used by feeds[{seen[as_dagster_name]}]{alike}",
                    at=("feeds", index, "name"),
                )
            seen[as_dagster_name] = index
            for sibling in self.feeds[:index]:
                clash = (
                    feed.clash_with_sibling(sibling)
                    if (sibling.format, sibling.landing) == (feed.format, feed.landing)
                    else None
                )
                if clash:
                    reason, at = clash
                    raise refused(
                        f"{reason} (one of the two is feed {sibling.name!r}'s, over the same landing)",
                        at=("feeds", index, *at),
                    )
            overlap = _overlap(self.lake, feed.landing)
            if overlap:
                raise refused(
                    f"{feed.landing} {overlap} the lake {self.lake}: the lake and a landing must not "
                    "share folders (the lake would read its own files, or a landing its writes)",
                    at=("feeds", index, "landing"),
                )
        return self

    def storage(self) -> Storage:
        """The landings' and the lake's storage, with the S3 endpoint and region configured."""
        return Storage(self.s3)

    def feed(self, name: str) -> FeedConfig:
        for feed in self.feeds:
            if feed.name == name:
                return feed
        raise ConfigError(f"no feed named {name!r} (configured: {[f.name for f in self.feeds]})")

    def replace(self, **changes: Any) -> LakeConfig:
        """This configuration with some keys changed, checked as a whole again."""
        try:
            changed = LakeConfig(
                **{**{name: getattr(self, name) for name in type(self).model_fields}, **changes}
            )
        except ValidationError as exc:
            raise ConfigError("\n".join(explain(exc, LakeConfig))) from None
        changed._source = self._source
        return changed

    def with_lake(self, lake: str) -> LakeConfig:
        return self.replace(lake=lake)


def _overlap(lake: str, landing: str) -> str | None:
    """How a landing and the lake share folders (both normalised URIs), or None."""
    if lake == landing:
        return "is"
    if lake.startswith(landing.rstrip("/") + "/"):
        return "holds"
    if landing.startswith(lake.rstrip("/") + "/"):
        return "lies inside"
    return None


#: the line for a configuration file that names no feed: accepted, it would run as "nothing
#: changed since the last run" and load an empty code location
NO_FEED = 'feeds: none configured, so nothing would be read; add one (README, "Running it on your data")'


def parse_config(raw: Any, source: str | None = None, *, feeds_required: bool = False) -> LakeConfig:
    """A configuration from parsed YAML; every mistake is a line of the ConfigError. A file that
    configures no feed is one such mistake (`feeds_required`)."""
    problems: list[str] = []
    config = None
    try:
        config = LakeConfig.model_validate(raw)
    except ValidationError as exc:
        problems = explain(exc, LakeConfig)
    if feeds_required and isinstance(raw, dict) and not (config.feeds if config else raw.get("feeds")):
        problems.append(NO_FEED)
    if problems or config is None:
        raise ConfigError("\n".join(f"{source}: {line}" if source else line for line in problems))
    config._source = source
    return config


class _ConfigLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice in one mapping (the second would win silently)."""

    def construct_mapping(self, node, deep=False):
        seen = []
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):  # `~:`, `1:`, `on:` (a YAML 1.1 true): every key is a name
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} is not text (quote it if it is meant as a name)",
                    key_node.start_mark,
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.append(key)
        return super().construct_mapping(node, deep=deep)


def _expanded_nodes(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many nodes `node` stands for once every alias is expanded (an alias shares its
    anchor's node: counted at each use, computed once)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise yaml.YAMLError(f"line {node.start_mark.line + 1}: an alias refers to a node that holds it")
    open_nodes.add(id(node))
    children = (
        node.value
        if isinstance(node, yaml.SequenceNode)
        else ([part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else [])
    )
    total = 1
    for child in children:
        total += _expanded_nodes(child, sizes, open_nodes)
        if total > MAX_EXPANDED_NODES:
            raise yaml.YAMLError(f"aliases expand it past {MAX_EXPANDED_NODES} values (an alias bomb?)")
    open_nodes.discard(id(node))
    sizes[id(node)] = total
    return total


def read_yaml(text: str) -> Any:
    """Parse YAML safely: no Python objects, no duplicate keys, aliases bounded."""
    loader = _ConfigLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_nodes(node, {}, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_config(path: str | os.PathLike[str]) -> LakeConfig:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder; give the YAML file in it")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    with path.open("rb") as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{path}: larger than {MAX_CONFIG_BYTES} bytes; a configuration file is a few kilobytes"
        )
    try:
        raw = read_yaml(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}: not UTF-8 text (line {line})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_one_line(exc)}") from None
    except RecursionError:  # the parser descends once per level: `[[[[…]]]]` a few hundred deep
        raise ConfigError(f"{path}: nested too deeply to be a configuration") from None
    return parse_config(raw, source=str(path), feeds_required=True)


def _one_line(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(problem.split())


def dump_config(config: LakeConfig) -> str:
    """YAML text for a config, defaults left out (the demo and tests write the config they run)."""
    return yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True), sort_keys=False)


def resolved_config(config: LakeConfig, environ: Mapping[str, str] | None = None) -> str:
    """YAML text for a config with every default filled in, and where S3 credentials come from
    (the environment), their values redacted."""
    environ = os.environ if environ is None else environ
    resolved = config.model_dump(mode="json", exclude_none=True)
    uses_s3 = is_s3(config.lake) or any(is_s3(f.landing) for f in config.feeds)
    credentials = {
        name: ("set (redacted)" if environ.get(name) else "not set") for name in AWS_CREDENTIAL_VARIABLES
    }
    resolved["s3"]["credentials_from_environment"] = (
        credentials if uses_s3 else "not used (no s3a:// location)"
    )
    return yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True)


def check_landings(config: LakeConfig, storage) -> None:
    """Refuse landings that do not exist (a typo is an error, not "nothing landed"). A local
    landing must be a folder; on S3, which has no folders, its bucket must exist. Needs the
    storage (and, for S3, the network), so it is checked where the feeds are read, not on load."""
    problems = []
    for index, feed in enumerate(config.feeds):
        where = feed.landing
        if is_s3(where):
            where = "s3a://" + where[len("s3a://") :].split("/", 1)[0]
        try:
            found = storage.exists(where)
        except FILE_ERRORS as exc:
            problems.append(f"feeds[{index}].landing: {where} cannot be read: {' '.join(str(exc).split())}")
            continue
        if not found:
            problems.append(f"feeds[{index}].landing: {where} does not exist")
        elif not is_s3(where) and not Path(where[len("file://") :]).is_dir():
            problems.append(f"feeds[{index}].landing: {where} is not a folder")
    if problems:
        source = config.source
        raise ConfigError("\n".join(f"{source}: {line}" if source else line for line in problems))
