"""The Dagster code location: definitions for the feed configuration in `LAKE_ASSETS_CONFIG`.

`dagster dev -w workspace.yaml` loads this module. Without `LAKE_ASSETS_CONFIG`, it uses
`./lake_assets.yaml`, else the demo's configuration (`.demo/lake_assets.yaml`, written by
`./dev demo`).

Loading reads the configuration and what `lake-assets discover` pinned in the lake; it never
lists a landing (`lake_assets.discovery`).
"""

from __future__ import annotations

import os
from pathlib import Path

from lake_assets.config import load_config
from lake_assets.errors import ConfigError
from lake_assets.orchestration.definitions import build_definitions

DEMO_CONFIG = Path(__file__).resolve().parent.parent / ".demo" / "lake_assets.yaml"


def config_path() -> Path:
    explicit = os.environ.get("LAKE_ASSETS_CONFIG")
    if explicit:
        return Path(explicit)
    for candidate in (Path("lake_assets.yaml"), DEMO_CONFIG):
        if candidate.is_file():
            return candidate
    raise ConfigError(
        "no feed configuration: set LAKE_ASSETS_CONFIG to a config file, create ./lake_assets.yaml, "
        "or run './dev demo' first to create the demo configuration"
    )


defs = build_definitions(load_config(config_path()))
