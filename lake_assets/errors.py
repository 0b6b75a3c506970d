"""Errors raised by the pure layers; each says what was wrong and where."""

import re


class LakeAssetsError(Exception):
    """Base class for every error lake_assets raises on purpose."""


def first_line(error: str | BaseException, limit: int | None = None) -> str:
    """An error's message as one line: its first line that is not blank (for an exception
    without a message, its type's name), cut at `limit` characters (py4j errors carry the
    JVM's whole stack). An error of the JVM (py4j's) is told by the JVM's own message and its
    root cause, not by py4j's "An error occurred while calling o1098.save", which names nothing
    and changes from run to run; so is a Spark Connect error standing for one, whose text names
    no cause. Cut to `limit`, the root cause keeps its half."""
    jvm = _jvm_message(error) or _connect_message(error) or _py4j_text_message(error)
    if jvm is not None:
        message, root = jvm
        if root is None:
            return _cut(message, limit)
        if limit is not None:  # the root cause keeps up to half, the message the rest
            room = limit - len(" (caused by )")
            message = _cut(message, max(0, room - min(len(root), limit // 2)))
            root = _cut(root, max(0, room - len(message)))
        return _cut(f"{message} (caused by {root})", limit)
    text = str(error)
    line = _grpc_status(text) or _first_of(text)
    if not line and isinstance(error, BaseException):
        line = type(error).__name__
    return _cut(line, limit)


#: how gRPC (Spark Connect's client) words a failed call: its first line names nothing, the
#: status and the server's details come on the lines after it
_GRPC_FAILURE = re.compile(
    r"<_(?:Inactive)?RpcError of RPC that terminated with:\s*status = StatusCode\.(\w+)\s*details = \"([^\"]*)\""
)

#: what to do about a Spark Connect status, where the status alone does not say
_GRPC_HINTS = {
    "UNAUTHENTICATED": "the server wants its token: set SPARK_CONNECT_AUTHENTICATE_TOKEN",
    "UNAVAILABLE": "is the Spark Connect server running, at the address configured?",
}


def _grpc_status(text: str) -> str | None:
    """A failed Spark Connect call as one line: what came before gRPC's wording, then the
    server's details, its status and what to do; None for any other error."""
    found = _GRPC_FAILURE.search(text)
    if found is None:
        return None
    status, details = found.groups()
    hint = f"; {_GRPC_HINTS[status]}" if status in _GRPC_HINTS else ""
    return f"{_first_of(text[: found.start()])} Spark Connect: {details} ({status}{hint})".strip()


def _first_of(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _cut(text: str, limit: int | None) -> str:
    return text[:limit] if limit is not None else text


#: causes followed at most down a JVM exception's chain (a chain can loop)
_MAX_CAUSES = 16


def _jvm_message(error: str | BaseException) -> tuple[str, str | None] | None:
    """(the first line of the JVM exception behind a py4j error, its root cause's when it has
    one), or None (not one, or the JVM is gone)."""
    try:
        thrown = getattr(error, "java_exception", None)
        if thrown is None:
            return None
        message, cause = thrown.toString(), thrown
        for _ in range(_MAX_CAUSES):
            deeper = cause.getCause()
            if deeper is None or deeper.equals(cause):
                break
            cause = deeper
        root = None if cause.equals(thrown) else cause.toString()
    except Exception:  # noqa: BLE001 - py4j raises its own errors, or any, once the gateway is gone
        return None
    return _first_of(message), None if root is None else _first_of(root)


#: the Spark Connect errors that stand for what a classic session leaves as a py4j error: a JVM
#: exception PySpark has no class of its own for
_CONNECT_JVM_ERRORS = frozenset({"SparkException", "UnknownException"})
_CONNECT_ERRORS_MODULE = "pyspark.errors.exceptions.connect"
_CAUSED_BY = "Caused by: "


def connect_server_chain(error: BaseException) -> str:
    """The chain of JVM errors a Spark Connect server sent with `error`: the class, then a
    `Caused by: <class>: <message>` line for each cause, among their frames. The client keeps
    it whether or not the error's text shows it (`spark.sql.connect.serverStacktrace.enabled`);
    "" for any other error."""
    if not type(error).__module__.startswith(_CONNECT_ERRORS_MODULE):
        return ""
    chain = getattr(error, "getStackTrace", lambda: None)()
    return chain if isinstance(chain, str) else ""


def _connect_message(error: str | BaseException) -> tuple[str, str | None] | None:
    """`_jvm_message` of a Spark Connect error standing for a JVM one (the JVM's class and
    message, and its root cause's), from the chain its server sent; None for any other."""
    if not isinstance(error, BaseException) or type(error).__name__ not in _CONNECT_JVM_ERRORS:
        return None
    chain = connect_server_chain(error).splitlines()
    message = _first_of(str(error))  # the server's message; the chain follows it when shown
    if not chain or not chain[0].strip() or not message:
        return None
    # The chain starts with the class alone, or, when the client could not fetch the error's
    # details and kept the server's short trace, with the class and its message.
    head = chain[0].strip()
    top = head if ": " in head else f"{head}: {message}"
    return _first_of(top), _root_cause(chain)


def _root_cause(trace: list[str]) -> str | None:
    """The last `Caused by:` of a JVM trace's lines: the root cause (an indented one is a
    suppressed error's, and is passed over), or None."""
    causes = [line.removeprefix(_CAUSED_BY) for line in trace if line.startswith(_CAUSED_BY)]
    return _first_of(causes[-1]) if causes else None


#: py4j's own first line of a JVM error, which names only the call: an object's method
#: (`o638.count`) or a class's static one (`z:org.apache.spark.api.python.PythonRDD.runJob`)
_PY4J_CALL = re.compile(r"An error occurred while calling (?:z:)?[\w.$]+\.\s*$")
#: py4j puts the JVM's stack trace after it, each of its lines as Java prints them
_PY4J_TRACE = ": "


def _py4j_text_message(error: str | BaseException) -> tuple[str, str | None] | None:
    """`_jvm_message` of a py4j error kept only as text (a Dagster step's recorded failure):
    the JVM exception's line, right after py4j's, and its trace's root cause. None for any
    other text."""
    if isinstance(error, BaseException):
        return None
    lines = [line for line in error.splitlines() if line.strip()]
    call = next((at for at, line in enumerate(lines) if _PY4J_CALL.search(line)), None)
    if call is None or call + 1 == len(lines) or not lines[call + 1].startswith(_PY4J_TRACE):
        return None
    thrown = lines[call + 1].removeprefix(_PY4J_TRACE).strip()
    return (thrown, _root_cause(lines[call + 2 :])) if thrown else None


class ConfigError(LakeAssetsError):
    """The feed configuration is invalid."""


class UnsafePathError(LakeAssetsError):
    """A path segment built from external input (partition key, file name) is not safe."""


class StorageRequestError(LakeAssetsError, OSError):
    """A request to object storage failed in a client library that raises its own errors
    (boto3's): an OSError too, as every caller of `storage.Storage` expects pyarrow's to be."""


class NotAFile(LakeAssetsError, OSError):
    """A local path to copy that is no regular file (a named pipe, a device): reading it would
    wait for ever or never end. An OSError, as every caller of `Storage` handles."""


class LinkLoop(LakeAssetsError, OSError):
    """A local folder asked to be listed is a symbolic link to a folder that holds it (`errno`
    ELOOP, as a link to itself raises): listed through, it would hold the same folders again,
    one level deeper each time."""


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
        self.cause = cause


class AnotherWriter(LakeAssetsError):
    """Something else wrote the table while this run did (one writer per table: a deployment's
    pools see to it, but not a second process started by hand), and took away what this run had
    made: the run stops before it changes the table."""


class LandingEmptied(LakeAssetsError):
    """A run would empty partitions of a table because none of the files the lake read from them
    is listed any more, nor a file it read elsewhere (`processed.refusal_for_a_blank_landing`): an
    unmounted share or a mistyped prefix lists like that too, and the run refuses until told the
    removal is meant."""


class LandingChanged(LakeAssetsError):
    """A landed file the run catalogued went before the run read it, or was written again while
    the run used what it read (found before the run records what it stored or folded, or when
    the fold's checks fail): the run stops rather than record a partition done without the
    file's rows, or with another version's."""


class StoreUnreachable(LakeAssetsError):
    """A step's Spark work failed on a request to the store (throttled, timed out, a connection
    lost), not on the data: the step fails before it records its partitions done and sets no
    landed file aside, so that a run once the store answers does the work again."""


class SchemaClash(LakeAssetsError):
    """Two observations of a column have types that cannot be widened into one."""

    def __init__(self, message: str, table: str | None = None, column: str | None = None):
        super().__init__(message)
        self.table = table
        self.column = column
