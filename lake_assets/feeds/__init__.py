"""One module per vendor format; each provides a `FeedFormat` (see `base`)."""

from __future__ import annotations

from lake_assets.errors import ConfigError
from lake_assets.feeds.base import FeedFormat
from lake_assets.feeds.flow_journal import FlowJournalFormat
from lake_assets.feeds.grax_v2 import GraxV2Format
from lake_assets.feeds.unit_cdc import UnitCdcFormat

_FORMATS: dict[str, FeedFormat] = {f.name: f for f in (UnitCdcFormat(), GraxV2Format(), FlowJournalFormat())}


def format_for(feed) -> FeedFormat:
    """The format of a configured feed, as that feed configures it."""
    return get_format(feed.format).configured(feed)


def get_format(name: str) -> FeedFormat:
    try:
        return _FORMATS[name]
    except KeyError:
        raise ConfigError(f"unknown feed format {name!r}; known: {sorted(_FORMATS)}") from None
