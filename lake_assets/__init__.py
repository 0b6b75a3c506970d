"""lake_assets: vendor CDC files in object storage turned into change logs, current-state and
history tables, as a Dagster asset graph whose transforms run on Spark."""

__version__ = "0.1.0"
