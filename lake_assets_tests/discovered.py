"""Definitions as a deployment loads them after `lake-assets discover` pinned the landing."""

import dagster as dg

from lake_assets.config import LakeConfig
from lake_assets.discovery import discover
from lake_assets.orchestration.definitions import build_definitions


def discovered_definitions(config: LakeConfig) -> dg.Definitions:
    discover(config, config.storage())
    return build_definitions(config)
