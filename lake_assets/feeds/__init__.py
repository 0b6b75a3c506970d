"""One module per vendor format; each provides a `FeedFormat` (see `base`)."""

from __future__ import annotations

import functools

from lake_assets.errors import ConfigError
from lake_assets.feeds.base import FeedFormat


@functools.cache
def _formats() -> dict[str, FeedFormat]:
    # Imported on first use, not with the package: the formats build on the shared reader
    # (`lake_assets.ingest`), which imports `feeds.base`, so an eager import here made
    # `import lake_assets.ingest` fail when it came first.
    from lake_assets.feeds.flow_journal import FlowJournalFormat
    from lake_assets.feeds.grax_v2 import GraxV2Format
    from lake_assets.feeds.unit_cdc import UnitCdcFormat

    return {f.name: f for f in (UnitCdcFormat(), GraxV2Format(), FlowJournalFormat())}


def feed_config_models() -> tuple:
    """The configuration model of every format (a feed's `format` picks one)."""
    return tuple(type(f).config_model for f in _formats().values())


def format_for(feed) -> FeedFormat:
    """The format of a configured feed, as that feed configures it."""
    return get_format(feed.format).configured(feed)


def get_format(name: str | None) -> FeedFormat:
    formats = _formats()
    if name is None or name not in formats:
        raise ConfigError(f"unknown feed format {name!r}; known: {sorted(formats)}")
    return formats[name]
