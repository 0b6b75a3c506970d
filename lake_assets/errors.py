"""Errors raised by the pure layers; each says what was wrong and where."""


class LakeAssetsError(Exception):
    """Base class for every error lake_assets raises on purpose."""


def first_line(error: str | BaseException, limit: int | None = None) -> str:
    """An error's message as one line: its first line that is not blank (for an exception
    without a message, its type's name), cut at `limit` characters (py4j errors carry the
    JVM's whole stack). An error of the JVM (py4j's) is told by the JVM's own message and its
    first cause, not by py4j's "An error occurred while calling o1098.save", which names nothing
    and changes from run to run."""
    text = _jvm_message(error) or str(error)
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not line and isinstance(error, BaseException):
        line = type(error).__name__
    return line[:limit] if limit is not None else line


def _jvm_message(error: str | BaseException) -> str | None:
    """`<message>: <root cause>` of the JVM exception behind a py4j error, or None (not one, or
    the JVM is gone)."""
    thrown = getattr(error, "java_exception", None)
    if thrown is None:
        return None
    try:
        message, cause = thrown.toString(), thrown
        while cause.getCause() is not None:
            cause = cause.getCause()
        root = "" if cause.equals(thrown) else f" (caused by {cause.toString()})"
    except Exception:  # noqa: BLE001 - py4j raises its own errors, or any, once the gateway is gone
        return None
    line = next((line.strip() for line in message.splitlines() if line.strip()), "")
    return f"{line}{root}"


class ConfigError(LakeAssetsError):
    """The feed configuration is invalid."""


class UnsafePathError(LakeAssetsError):
    """A path segment built from external input (partition key, file name) is not safe."""


class StorageRequestError(LakeAssetsError, OSError):
    """A request to object storage failed in a client library that raises its own errors
    (boto3's): an OSError too, as every caller of `storage.Storage` expects pyarrow's to be."""


class InvalidValue(LakeAssetsError, ValueError):
    """A value (a name, key, URI, record or file's content) does not have the form it must have.
    A ValueError too, so code that checks a value by catching ValueError keeps working."""


class CatalogError(InvalidValue):
    """The file catalog refuses a record or query (index keys that disagree with the metadata,
    a range that ends before it starts), or its store is not set up as it needs."""


class DamagedLakeFile(LakeAssetsError):
    """A file lake_assets wrote into the lake (a table's Parquet, a JSON note of its state) does
    not read as what it was written as: it was damaged or changed outside a run. Unlike a landed
    file it cannot be set aside, so a run that needs it stops (only `current`, which the next fold
    rewrites whole without reading it, heals by itself)."""

    REBUILD = 'restore it, or rebuild the table (docs/lake-layout.md, "Rebuilding a table")'

    def __init__(self, uri: str, cause: str, problem: str = "cannot be read", remedy: str = REBUILD):
        super().__init__(
            f"the lake file {uri} {problem} ({cause}); lake_assets wrote it, so it was damaged "
            f"or changed outside a run: {remedy}"
        )
        self.uri = uri


class AnotherWriter(LakeAssetsError):
    """Something else wrote the table while this run did (one writer per table: a deployment's
    pools see to it, but not a second process started by hand), and took away what this run had
    made: the run stops before it changes the table."""


class SchemaClash(LakeAssetsError):
    """Two observations of a column have types that cannot be widened into one."""

    def __init__(self, message: str, table: str | None = None, column: str | None = None):
        super().__init__(message)
        self.table = table
        self.column = column
