"""Errors of a Spark Connect session judged as those of a classic one: a read's failure told by
the JVM's class, message and root cause, and a failed request to the store told from a damaged
file, whether or not the session shows the server's stack traces. The errors are built as
PySpark's Connect client builds them from its server's answer."""

from __future__ import annotations

import pyspark.sql.connect.proto as pb2
import pytest
from pyspark.errors.exceptions.connect import _convert_exception

from lake_assets.errors import first_line
from lake_assets.spark_errors import is_request_failure

FILE = "s3a://landing/unit/accounts/year=2024/month=03/day=01/hour=02/part-0.parquet"
SPARK_EXCEPTION = ["org.apache.spark.SparkException", "java.lang.Exception", "java.lang.Throwable"]
READ_FAILED = f"[FAILED_READ_FILE.NO_HINT] Encountered error while reading file {FILE}.  SQLSTATE: KD001"


def failed_read(cause_class: str, cause_message: str, *, shown: bool) -> Exception:
    """Spark's read failure with one cause, as the client raises it (`shown`: the session shows
    the server's stack trace in the error's text)."""
    errors = [
        pb2.FetchErrorDetailsResponse.Error(
            error_type_hierarchy=SPARK_EXCEPTION, message=READ_FAILED, cause_idx=1
        ),
        pb2.FetchErrorDetailsResponse.Error(
            error_type_hierarchy=[cause_class, "java.io.IOException", "java.lang.Exception"],
            message=cause_message,
        ),
    ]
    return _convert_exception(
        classes=SPARK_EXCEPTION,
        sql_state="KD001",
        error_class="FAILED_READ_FILE.NO_HINT",
        reason=None,
        root_error_idx=0,
        errors=errors,
        truncated_message="truncated",
        truncated_message_parameters={},
        truncated_stacktrace=None,
        display_server_stacktrace=shown,
    )


@pytest.mark.parametrize("shown", [True, False], ids=["trace-shown", "trace-not-shown"])
def test_a_read_failure_on_connect_names_its_root_cause_as_on_a_classic_session(shown):
    error = failed_read(
        "shaded.parquet.org.apache.thrift.protocol.TProtocolException",
        "don't know what type: 15",
        shown=shown,
    )
    assert first_line(error) == (
        f"org.apache.spark.SparkException: {READ_FAILED} "
        "(caused by shaded.parquet.org.apache.thrift.protocol.TProtocolException: don't know what type: 15)"
    )


@pytest.mark.parametrize("shown", [True, False], ids=["trace-shown", "trace-not-shown"])
def test_a_throttled_read_on_connect_is_a_failed_request_not_a_damaged_file(shown):
    """Taken for a damaged file, a good file would be set aside and its rows left out of a run
    that exits 0; a failed request fails the step, to be run again."""
    throttled = failed_read(
        "org.apache.hadoop.fs.s3a.AWSServiceThrottledException", f"read {FILE}: Slow Down; 503", shown=shown
    )
    assert is_request_failure(throttled)
    damaged = failed_read("org.apache.parquet.io.ParquetDecodingException", "Can not read value", shown=shown)
    assert not is_request_failure(damaged)


def test_a_connect_error_without_its_details_names_its_message_once():
    """When the client could not fetch an error's details it keeps the server's short trace,
    whose first line is the class with its message already."""
    short_trace = (
        f"org.apache.spark.SparkException: {READ_FAILED}\n\tat org.apache.spark.Reader.read(Reader.scala:1)\n"
        "Caused by: org.apache.parquet.io.ParquetDecodingException: Can not read value\n\tat x.y(Z.java:2)"
    )
    error = _convert_exception(
        classes=SPARK_EXCEPTION,
        sql_state="KD001",
        error_class="FAILED_READ_FILE.NO_HINT",
        reason=None,
        root_error_idx=None,
        errors=None,
        truncated_message=READ_FAILED,
        truncated_message_parameters={},
        truncated_stacktrace=short_trace,
        display_server_stacktrace=False,
    )
    assert first_line(error) == (
        f"org.apache.spark.SparkException: {READ_FAILED} "
        "(caused by org.apache.parquet.io.ParquetDecodingException: Can not read value)"
    )
