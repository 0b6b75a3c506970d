"""URIs of the lake and landing areas, and the lake layout contract.

Every path that lake_assets builds from outside input (a partition key, a table name, a landed
file's name) goes through `safe_segment`, so a crafted name can never climb out of its folder.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import PurePosixPath
from urllib.parse import urlparse

from lake_assets.errors import ConfigError, InvalidValue, UnsafePathError

_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]*")  # whole (`fullmatch`): `$` passes a final newline
#: the characters of a name the lake and its catalog use as it is: a feed's name, a catalog
#: record's `where` and `what` (the datalake-common rule)
_NAME_CHARACTERS = "a-z0-9_-"
NAME = re.compile(f"[{_NAME_CHARACTERS}]+")
_NOT_NAME_CHARACTER = re.compile(f"[^{_NAME_CHARACTERS}]")


#: an hour partition's key: the hour, in UTC (`2024-01-31-05`)
HOUR_KEY_FORMAT = "%Y-%m-%d-%H"
_HOUR_KEY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}-[0-9]{2}")


def parse_hour_key(key: object) -> dt.datetime:
    """The hour an hour partition key names; InvalidValue for a key of another shape, or of
    this shape naming no hour (`2024-13-01-00`)."""
    if not isinstance(key, str) or not _HOUR_KEY.fullmatch(key):
        raise InvalidValue(f"hour partition key {key!r} must look like 2024-01-31-05")
    try:
        return dt.datetime.strptime(key, HOUR_KEY_FORMAT)
    except ValueError:
        raise InvalidValue(f"hour partition key {key!r} names no hour of the calendar") from None


def is_name(value: object) -> bool:
    """Whether `value` is a name (`NAME`): lower-case letters, digits, `_` and `-`."""
    return isinstance(value, str) and NAME.fullmatch(value) is not None


def as_name(text: str) -> str:
    """`text` made a name (`NAME`): lower case, any other character as `_`."""
    return _NOT_NAME_CHARACTER.sub("_", text.lower())


def identifier(*parts: str) -> str:
    """A Dagster name (op, pool, group, job, sensor) made of feed and table names: every
    character Dagster's names may not hold becomes `_` (a feed's `-`, a table's `/`)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", "__".join(parts))


def safe_segment(value: str, what: str = "path segment") -> str:
    """Return `value` if it can stand as one folder or file name, else raise UnsafePathError."""
    if not isinstance(value, str) or not _SEGMENT.fullmatch(value) or value in (".", "..") or ".." in value:
        raise UnsafePathError(f"{what} {value!r} is not a safe path segment")
    return value


def partition_folder(table_uri: str, column: str, value: str) -> str:
    """The folder of one Hive partition of a table (`<column>=<value>`), its name checked: a
    partition's value comes from a landed file's path or a run's partition key."""
    return f"{table_uri}/{safe_segment(f'{column}={value}', 'partition')}"


#: a bucket's name: S3's rules, with the capitals, '_' and length (up to 255) that buckets made
#: in us-east-1 before 2018 may have
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]")


def normalise_root_uri(uri: str, what: str) -> str:
    """Accept `file:///abs`, an absolute local path, `s3a://bucket/prefix` or `s3://…`.

    Returns `file:///abs/path` or `s3a://bucket/prefix` without a trailing slash.
    """
    uri = uri.strip()
    if any(ord(character) < 0x20 or ord(character) == 0x7F for character in uri):
        # a NUL ends the path at the system's door; a line break splits every log line naming it
        raise ConfigError(f"{what}: {uri!r} holds a control character (a NUL, a line break)")
    if "#" in uri or "?" in uri:
        # A URI parser (and Hadoop's Path) takes what follows for a fragment or a query: the
        # lake would quietly be another folder, and two roots that differ there one lake.
        raise ConfigError(f"{what}: {uri!r} holds '#' or '?', which a URI reads as the end of the path")
    if uri.startswith("/"):
        uri = "file://" + uri
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"{what}: {uri!r} must be file:///absolute/path")
        path = str(PurePosixPath(parsed.path))
        if not path.startswith("/") or ".." in PurePosixPath(path).parts:
            raise ConfigError(f"{what}: {uri!r} must be an absolute path without '..'")
        return "file://" + path.rstrip("/") if path != "/" else "file:///"
    if parsed.scheme in ("s3", "s3a"):
        if not parsed.netloc:
            raise ConfigError(f"{what}: {uri!r} has no bucket")
        if not _BUCKET.fullmatch(parsed.netloc):
            raise ConfigError(
                f"{what}: {uri!r}: a bucket's name is 3 to 255 letters, digits, '.', '-' or '_' "
                "(no port, no user)"
            )
        prefix = parsed.path.strip("/")
        # An S3 prefix is literal: `unit/.` and `unit//x` are other prefixes than `unit` and
        # `unit/x`, which hold nothing, so a run would find nothing landed and say no more.
        if prefix and any(segment in ("", ".", "..") for segment in prefix.split("/")):
            raise ConfigError(f"{what}: {uri!r} must not hold an empty, '.' or '..' segment")
        return f"s3a://{parsed.netloc}" + (f"/{prefix}" if prefix else "")
    raise ConfigError(f"{what}: {uri!r} must be a file:// or s3a:// URI (or an absolute path)")


def join(root: str, *segments: str) -> str:
    """Join validated segments onto a root URI."""
    parts = [safe_segment(s) for s in segments]
    return "/".join([root.rstrip("/"), *parts])


def table_segments(table: str) -> list[str]:
    """A table name is one segment (`accounts`) or, for feeds that group tables, two
    (`<org>/<object>`); each is validated, and holds no `.` (no feed's table has one, and the
    files beside a feed's table folders, `tables.json`, are named with one)."""
    parts = table.split("/") if isinstance(table, str) else []
    if not 1 <= len(parts) <= 2:
        raise UnsafePathError(f"table {table!r} must be 'name' or 'group/name'")
    if "." in table:
        raise UnsafePathError(f"table {table!r} has a '.', which no table name has")
    return [safe_segment(p, "table") for p in parts]


def is_s3(uri: str) -> bool:
    return uri.startswith(("s3a://", "s3://"))


class LakeLayout:
    """The lake layout contract (docs/lake-layout.md): other engines read these paths with globs."""

    LAYERS = ("changes", "current", "history")

    def __init__(self, root: str):
        self.root = normalise_root_uri(root, "lake")

    def table(self, layer: str, feed: str, table: str) -> str:
        if layer not in self.LAYERS:
            raise InvalidValue(f"unknown layer {layer!r}")
        return join(self.root, layer, feed, *table_segments(table))

    def change_log_partition(self, feed: str, table: str, column: str, partition: str) -> str:
        """The folder of one partition of a table's change log (`<column>=<partition>`)."""
        return partition_folder(self.table("changes", feed, table), column, partition)

    def quarantine(self, feed: str, table: str, partition: str | None = None) -> str:
        """A table's quarantine, or that of one of its partitions."""
        return join(
            self.root, "_quarantine", feed, *table_segments(table), *([partition] if partition else [])
        )

    def staging(self, feed: str, table: str, token: str | None = None) -> str:
        """Scratch space outside every table's folder: globs over a table never see it."""
        return join(self.root, "_staging", feed, *table_segments(table), *([token] if token else []))

    def state(self, feed: str, table: str) -> str:
        """The engine's bookkeeping for a table (not a table: `_` hides it from readers)."""
        return join(self.root, "_state", feed, *table_segments(table))

    def lease(self, feed: str, table: str) -> str:
        """The file whose holder alone may write the table (`lease`): outside the table's state,
        which rebuilding it removes while holding it."""
        return join(self.root, "_leases", feed, *table_segments(table), "lease.json")

    def pins(self, feed: str) -> str:
        """The tables and first hour discovery pinned for a feed (`discovery`): beside its tables'
        state, named so no table folder can take it (a table name has no `.`)."""
        return join(self.root, "_state", feed, "tables.json")

    def catalog(self) -> str:
        return join(self.root, "catalog")
