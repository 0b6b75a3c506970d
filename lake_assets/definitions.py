"""The Dagster code location: definitions for the feed configuration in `LAKE_ASSETS_CONFIG`.

`dagster dev -w workspace.yaml` loads this module and finds `code_location`, a `@dg.definitions`
loader: without `LAKE_ASSETS_CONFIG`, it uses `./lake_assets.yaml`, else the demo's
configuration (`.demo/lake_assets.yaml`, written by `./dev demo`). Importing the module reads
nothing; Dagster calls the loader.

Loading reads the configuration and what `lake-assets discover` pinned in the lake; it never
lists a landing (`lake_assets.discovery`).
"""

from lake_assets.orchestration.definitions import code_location

__all__ = ["code_location"]
