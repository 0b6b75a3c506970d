"""What an error from Spark means for the lake: its error conditions (Spark's error classes),
and whether it is the store's request failing rather than the file (which is never a reason
to set a file aside). Asked of PySpark's errors, of the JVM's chain of causes where py4j keeps
it, and of the text a Spark Connect client or a task's error gives. No Dagster.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors import PySparkException

from lake_assets.errors import connect_server_chain

#: what a Spark action raises in this process: the JVM's errors as py4j passes them, and PySpark's
SPARK_ERRORS = (Py4JJavaError, PySparkException)
#: Spark's error condition for files whose column types its schema merging cannot reconcile
SCHEMAS_DISAGREE = "CANNOT_MERGE_SCHEMAS"


def error_conditions(error: BaseException) -> set[str]:
    """The error conditions (Spark's error classes) of an error from Spark and of the errors
    behind it. PySpark gives its own errors one (`getCondition`); an error of the JVM that
    PySpark does not convert (a `SparkException`, such as a failed schema merge) reaches Python
    as py4j's, and its JVM chain of causes is asked."""
    conditions = set()
    for seen in _python_chain(error):
        condition = seen.getCondition() if isinstance(seen, PySparkException) else None
        if condition:
            conditions.add(condition)
        if isinstance(seen, Py4JJavaError):
            conditions |= _jvm_conditions(seen.java_exception)
    return conditions


def _python_chain(error: BaseException) -> Iterator[BaseException]:
    """The error and the errors behind it (`__cause__`, else `__context__`), each once."""
    seen: BaseException | None = error
    visited = set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        yield seen
        seen = seen.__cause__ or seen.__context__


def _jvm_conditions(throwable) -> set[str]:
    conditions = set()
    while throwable is not None:
        try:
            condition = throwable.getCondition()  # a SparkThrowable's; other throwables have none
        except Py4JError:
            condition = None
        if condition:
            conditions.add(condition)
        throwable = throwable.getCause()
    return conditions


#: What Spark's file connectors raise when the request fails rather than the file: the
#: credentials, the network, the store's throttling, its 5xx or its redirect, the object changed
#: while it was read. Such a failure says nothing of the file and may pass: it is raised (the
#: step fails, to be retried), never a reason to set a file aside. (A file the store refuses for
#: good is found before Spark reads it: `Storage.refusal_to_read`.) Names of the connector the
#: lake ships (hadoop-aws 3.3, AWS SDK v1) and of newer ones a cluster may bring (SDK v2).
_REQUEST_FAILURES = frozenset(
    {
        "java.nio.file.AccessDeniedException",
        "org.apache.hadoop.fs.s3a.CredentialInitializationException",
        "org.apache.hadoop.fs.s3a.auth.NoAuthWithAWSException",
        "org.apache.hadoop.fs.s3a.AWSClientIOException",
        "org.apache.hadoop.fs.s3a.AWSNoResponseException",
        "org.apache.hadoop.fs.s3a.AWSServiceThrottledException",
        "org.apache.hadoop.fs.s3a.AWSStatus500Exception",
        "org.apache.hadoop.fs.s3a.AWSRedirectException",
        "org.apache.hadoop.fs.s3a.AWSApiCallTimeoutException",
        "org.apache.hadoop.fs.s3a.HttpChannelEOFException",
        "org.apache.hadoop.fs.s3a.RemoteFileChangedException",
        "org.apache.hadoop.net.ConnectTimeoutException",
        "com.amazonaws.SdkClientException",
        "software.amazon.awssdk.core.exception.SdkClientException",
        "software.amazon.awssdk.core.exception.ApiCallTimeoutException",
        "software.amazon.awssdk.core.exception.ApiCallAttemptTimeoutException",
        "java.net.SocketTimeoutException",
        "java.net.UnknownHostException",
    }
)
#: the HTTP client's failures (a connection closed before an answer's end, no answer, the pool
#: exhausted), under whatever package each AWS SDK shades it (`com.amazonaws.thirdparty.`, ...)
_HTTP_CLIENT_FAILURES = (
    *(
        f".apache.http.{name}"
        for name in (
            "ConnectionClosedException",
            "NoHttpResponseException",
            "TruncatedChunkException",
            "MalformedChunkCodingException",
            "conn.ConnectionPoolTimeoutException",
        )
    ),
    ".hc.core5.http.ConnectionClosedException",  # HttpClient 5's
)
#: families of network failures, matched with their subclasses (a refused connection, a reset,
#: no route to the host, a failed TLS handshake)
_REQUEST_FAILURE_FAMILIES = frozenset({"java.net.SocketException", "javax.net.ssl.SSLException"})
#: the JDK's members of those families, for an error known only by its text (a Spark Connect
#: client's, a task's), where no class hierarchy can be asked
_FAMILY_MEMBERS = frozenset(
    {
        "java.net.ConnectException",
        "java.net.NoRouteToHostException",
        "java.net.PortUnreachableException",
        "javax.net.ssl.SSLHandshakeException",
        "javax.net.ssl.SSLProtocolException",
        "javax.net.ssl.SSLPeerUnverifiedException",
        "javax.net.ssl.SSLKeyException",
    }
)
#: S3's 400 answers about the request's credentials or clock (S3A raises them as a bad request)
_REQUEST_FAILURE_CODES = ("ExpiredToken", "InvalidToken", "TokenRefreshRequired", "RequestTimeTooSkewed")
_BAD_REQUEST = "org.apache.hadoop.fs.s3a.AWSBadRequestException"
#: a class name where an error's text names its type: at a line's start, or after "Caused by: "
_NAMED_ERROR = re.compile(r"(?:^|Caused by: |\(|\s)([a-z][\w$]*(?:\.[\w$]+)+)(?::|$|\))", re.M)


def is_request_failure(error: BaseException) -> bool:
    """Whether an error from Spark comes from the store's request failing, not from the file
    (`_REQUEST_FAILURES`, `_HTTP_CLIENT_FAILURES`, `_REQUEST_FAILURE_FAMILIES`): asked of the
    JVM's chain of causes where PySpark keeps it, and of the class names the errors' text gives
    (a Spark Connect client, or a task's error the driver holds only as text)."""
    chain = [
        seen.java_exception if isinstance(seen, Py4JJavaError) else getattr(seen, "_origin", None)
        for seen in _python_chain(error)
    ]
    if any(_chain_has_request_failure(throwable) for throwable in chain if throwable is not None):
        return True
    # A Spark Connect error's text shows its server's chain of causes only as the session is
    # set to (`spark.sql.connect.serverStacktrace.enabled`); the chain is kept all the same.
    text = "\n".join(f"{seen}\n{connect_server_chain(seen)}" for seen in _python_chain(error))
    named = set(_NAMED_ERROR.findall(text))
    families = _REQUEST_FAILURE_FAMILIES | _FAMILY_MEMBERS
    return any(_is_request_failure_class(name) or name in families for name in named) or (
        _BAD_REQUEST in named and any(code in text for code in _REQUEST_FAILURE_CODES)
    )


def _is_request_failure_class(class_name: str) -> bool:
    """Whether a JVM class is one of `_REQUEST_FAILURES` or `_HTTP_CLIENT_FAILURES`."""
    return class_name in _REQUEST_FAILURES or class_name.endswith(_HTTP_CLIENT_FAILURES)


def _chain_has_request_failure(throwable) -> bool:
    """Whether a JVM throwable, or one of its causes, is a failed request's class
    (`_is_request_failure_class`), of a `_REQUEST_FAILURE_FAMILIES` family, or a bad request about
    the credentials or the clock."""
    while throwable is not None:
        try:
            kind = throwable.getClass()
            name, message = kind.getName(), str(throwable.getMessage())
            lineage = set()
            while kind is not None:
                lineage.add(kind.getName())
                kind = kind.getSuperclass()
            throwable = throwable.getCause()
        except Py4JError:
            return False
        if (
            _is_request_failure_class(name)
            or lineage & _REQUEST_FAILURE_FAMILIES
            or (name == _BAD_REQUEST and any(code in message for code in _REQUEST_FAILURE_CODES))
        ):
            return True
    return False
