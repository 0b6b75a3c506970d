"""What a vendor format must tell the rest of lake_assets, and the shared hourly landing layout."""

from __future__ import annotations

import abc
import datetime as dt
import re

import pyarrow as pa
from pyspark.sql import Column, DataFrame

from lake_assets.engine.model import TableSpec
from lake_assets.storage import Entry, Storage

HOUR_KEY_FORMAT = "%Y-%m-%d-%H"


class FeedFormat(abc.ABC):
    """A vendor's landing layout and file format, mapped onto the normalised change model."""

    name: str
    #: the Hive column that partitions this feed's change log
    partition_column: str

    @abc.abstractmethod
    def discover_tables(self, storage: Storage, landing: str) -> list[str]:
        """Table names present in the landing area."""

    @abc.abstractmethod
    def table_spec(self, table: str) -> TableSpec:
        """Key columns and engine options for a table."""

    @abc.abstractmethod
    def partition_files(self, storage: Storage, landing: str, table: str, partition: str) -> list[Entry]:
        """The landed data files of one partition of one table."""

    @abc.abstractmethod
    def vet_schema(self, schema: pa.Schema) -> str | None:
        """Why a file with this Parquet schema cannot be used, or None when it can."""

    @abc.abstractmethod
    def normalise(self, raw: DataFrame, file_path: Column) -> DataFrame:
        """Map the vendor's rows onto the change model.

        Returns the change-model columns, the partition column and `__invalid`: NULL for a good
        row, else the reason the row (and so its file) cannot be used.
        """


# --- the year=/month=/day=/hour= landing layout (Unit; Hive-style hourly folders) ---------------

_HOURLY_LEVELS = (("year", 4), ("month", 2), ("day", 2), ("hour", 2))


def hour_key(moment: dt.datetime) -> str:
    return moment.strftime(HOUR_KEY_FORMAT)


def parse_hour_key(key: str) -> dt.datetime:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}-\d{2}", key or ""):
        raise ValueError(f"hour partition key {key!r} must look like 2024-01-31-05")
    return dt.datetime.strptime(key, HOUR_KEY_FORMAT)


def hour_folder(table_uri: str, key: str) -> str:
    moment = parse_hour_key(key)
    return (
        f"{table_uri}/year={moment.year:04d}/month={moment.month:02d}/"
        f"day={moment.day:02d}/hour={moment.hour:02d}"
    )


def _level_value(entry: Entry, level: str, width: int) -> int | None:
    match = re.fullmatch(rf"{level}=(\d{{1,{width}}})", entry.name)
    return int(match.group(1)) if entry.is_dir and match else None


def list_hour_folders(storage: Storage, table_uri: str, since: dt.datetime | None = None) -> list[str]:
    """Hour keys with a folder under `table_uri`, pruning whole years/months/days before `since`.

    The pruning is what keeps a sensor tick cheap: it lists only the branches that can hold
    hours at or after `since`, never the whole history.
    """
    found: list[str] = []

    def descend(uri: str, depth: int, prefix: tuple[int, ...]) -> None:
        level, width = _HOURLY_LEVELS[depth]
        for entry in storage.list(uri):
            value = _level_value(entry, level, width)
            if value is None:
                continue
            parts = prefix + (value,)
            if since is not None:
                floor = (since.year, since.month, since.day, since.hour)[: depth + 1]
                if parts < floor:
                    continue
            if depth == len(_HOURLY_LEVELS) - 1:
                try:
                    found.append(hour_key(dt.datetime(*parts)))
                except ValueError:
                    continue  # e.g. day=31 in a 30-day month: not an hour folder
            else:
                descend(entry.uri, depth + 1, parts)

    descend(table_uri, 0, ())
    return sorted(found)


def data_files(storage: Storage, folder_uri: str) -> list[Entry]:
    """Data files of a folder: hidden and marker files (`_SUCCESS`, `.crc`) are not data."""
    return [e for e in storage.list(folder_uri) if not e.is_dir and not e.name.startswith(("_", "."))]
