"""Definitions as a deployment loads them after `lake-assets discover` pinned the landing."""

import dagster as dg

from lake_assets.config import LakeConfig
from lake_assets.discovery import discover
from lake_assets.orchestration.definitions import build_definitions
from lake_assets.runner import storage_for


def discovered_definitions(config: LakeConfig) -> dg.Definitions:
    discover(config, storage_for(config))
    return build_definitions(config)
