"""One error boundary: every error lake_assets raises on purpose is a LakeAssetsError, so a
caller can tell the project's refusals from a crash with one `except`."""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

import pytest

import lake_assets
from lake_assets.catalog.store import check_record
from lake_assets.errors import CatalogError, InvalidValue, LakeAssetsError
from lake_assets.feeds.flow_fragments import FragmentError, parse_fragment_name

PACKAGE = Path(lake_assets.__file__).parent
#: built-in errors raised on purpose for what they mean to Python itself: a method a format does
#: not offer, an invariant of the code (never of input), and a truncated stream inside the
#: inflater (it becomes a FragmentError where it is caught)
PYTHON_PROTOCOL = {"NotImplementedError", "AssertionError", "EOFError", "TypeError"}
#: what the frameworks take: a pydantic validator's error (one line of the ConfigError
#: `config.parse_config` raises) and a Dagster step's Failure
FRAMEWORK_ERRORS = {"PydanticCustomError", "Failure"}


def _is_ours(module, name: str) -> bool:
    """Whether `raise name(...)` in `module` raises a LakeAssetsError: a class that is one, or a
    function that builds one (by its return annotation); a framework's error counts too."""
    made = getattr(module, name, None) or getattr(builtins, name, None)
    if callable(made) and not isinstance(made, type):
        returned = made.__annotations__.get("return")
        if getattr(returned, "__name__", str(returned).rpartition(".")[2]) in FRAMEWORK_ERRORS:
            return True
        made = getattr(module, str(returned), None)
    return isinstance(made, type) and issubclass(made, LakeAssetsError)


def _raises() -> list[tuple[object, str, int, str]]:
    """(module, its name, line, raised name) of every `raise Name(...)` in the package."""
    found: list[tuple[object, str, int, str]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module_name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(
            ".__init__"
        )
        # the code location loads the feed configuration when imported: its errors are config's
        module = importlib.import_module(
            "lake_assets.errors" if module_name == "lake_assets.definitions" else module_name
        )
        found += [
            (module, module_name, node.lineno, node.exc.func.id)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Raise)
            and isinstance(node.exc, ast.Call)
            and isinstance(node.exc.func, ast.Name)
        ]
    return found


def test_every_error_raised_on_purpose_is_a_lake_assets_error():
    raised = _raises()
    assert len(raised) > 50  # the scan sees the package's raises
    outside = [
        f"{module_name}:{line} raises {name}"
        for module, module_name, line, name in raised
        if name not in PYTHON_PROTOCOL and not _is_ours(module, name)
    ]
    assert outside == []


@pytest.mark.parametrize("error", [FragmentError, CatalogError, InvalidValue])
def test_refusals_of_values_stay_value_errors(error):
    """Callers that check a value by catching ValueError keep working."""
    assert issubclass(error, LakeAssetsError) and issubclass(error, ValueError)


def test_a_bad_fragment_name_and_a_bad_catalog_record_are_lake_assets_errors():
    with pytest.raises(LakeAssetsError, match="expected 3"):
        parse_fragment_name("not-a-fragment-name")
    with pytest.raises(CatalogError, match="must be a dict"):
        check_record(["not", "a", "record"])


def test_bad_input_file_is_gone():
    """It was never raised: a bad file is quarantined with a reason, not raised."""
    assert not hasattr(importlib.import_module("lake_assets.errors"), "BadInputFile")


class _Thrown:
    """A JVM exception as py4j hands it over: its text and its cause."""

    def __init__(self, text: str, cause: _Thrown | None = None):
        self.text, self.cause = text, cause

    def toString(self) -> str:  # the JVM's name
        return self.text

    def getCause(self) -> _Thrown | None:  # the JVM's name
        return self.cause

    def equals(self, other: object) -> bool:
        return self is other


class _FromTheJvm(Exception):
    def __init__(self, thrown: _Thrown):
        super().__init__("An error occurred while calling o1098.save.\n: trace")
        self.java_exception = thrown


def test_a_jvm_error_is_told_by_its_message_and_root_cause_never_by_py4js_call_number():
    from lake_assets.errors import first_line

    root = _Thrown("java.io.IOException: FAILED_TO_UNCOMPRESS(5)\n\tat ...")
    thrown = _Thrown(
        "SparkException: [FAILED_READ_FILE] reading file:///l/x.parquet\nmore", _Thrown("mid", root)
    )
    assert first_line(_FromTheJvm(thrown)) == (
        "SparkException: [FAILED_READ_FILE] reading file:///l/x.parquet "
        "(caused by java.io.IOException: FAILED_TO_UNCOMPRESS(5))"
    )
    cut = first_line(_FromTheJvm(thrown), limit=100)
    assert (
        len(cut) <= 100
        and cut.startswith("SparkException: [FAILED_READ_FILE]")
        and cut.endswith("(caused by java.io.IOException: FAILED_TO_UNCOMPRESS(5))")
    )
    long_root = first_line(_FromTheJvm(_Thrown("M" * 37, _Thrown("R" * 51))), limit=100)
    assert len(long_root) <= 100 and long_root.endswith("R)")
    alone = _Thrown("SparkException: no cause")
    assert first_line(_FromTheJvm(alone)) == "SparkException: no cause"
    looping = _Thrown("SparkException: top")
    looping.cause = _Thrown("java.lang.Error: inner", looping)
    assert first_line(_FromTheJvm(looping)).startswith("SparkException: top")  # and ends


def test_a_jvm_error_kept_as_text_is_told_by_its_message_and_root_cause():
    """A Dagster step records its error as text: py4j's call line, then the JVM's trace. The
    failure line names the JVM's exception and its root cause (the last unindented `Caused by`:
    an indented one is a suppressed error's), never py4j's call number."""
    from lake_assets.errors import first_line

    recorded = (
        "py4j.protocol.Py4JJavaError: An error occurred while calling o638.count.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: reading s3a://b/x.parquet\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2)\n"
        "Caused by: org.apache.hadoop.fs.s3a.AWSServiceThrottledException: read s3a://b/x.parquet: 503\n"
        "\tat org.apache.hadoop.fs.s3a.S3AUtils.translateException(S3AUtils.java:1)\n"
        "\tSuppressed: java.io.IOException: close\n"
        "\t\tCaused by: java.lang.IllegalStateException: not the root\n"
        "Caused by: com.amazonaws.services.s3.model.AmazonS3Exception: Please reduce your request rate.\n"
        "\t... 42 more\n"
    )
    assert first_line(recorded) == (
        "org.apache.spark.SparkException: Job aborted due to stage failure: reading s3a://b/x.parquet "
        "(caused by com.amazonaws.services.s3.model.AmazonS3Exception: Please reduce your request rate.)"
    )
    assert first_line(recorded.split("\nCaused by")[0]) == (
        "org.apache.spark.SparkException: Job aborted due to stage failure: reading s3a://b/x.parquet"
    )
    static = recorded.replace(
        "calling o638.count.", "calling z:org.apache.spark.api.python.PythonRDD.runJob."
    )
    assert first_line(static) == first_line(recorded)
    # other text that merely mentions a call is told by its own first line
    assert (
        first_line("An error occurred while calling o1.save.") == "An error occurred while calling o1.save."
    )
    assert first_line("ValueError: bad\n: not a trace") == "ValueError: bad"


def test_a_jvm_error_whose_jvm_is_gone_is_told_by_its_own_text():
    from lake_assets.errors import first_line

    class Gone(_Thrown):
        def toString(self) -> str:  # the JVM's name
            raise ConnectionError("the gateway is gone")

    assert first_line(_FromTheJvm(Gone("x"))) == "An error occurred while calling o1098.save."


def test_a_step_failing_because_the_driver_jvm_is_gone_says_so():
    """A step whose Spark driver was killed fails on PySpark's gateway: 'Connection refused'
    alone reads like the store's fault, so the line names the driver; the same error raised
    elsewhere (not in py4j) is told as it is."""
    from dagster._core.execution.plan.objects import StepFailureData
    from dagster._utils.error import SerializableErrorInfo

    from lake_assets.orchestration.execution import _reason

    def failure(cls_name: str, frame: str) -> StepFailureData:
        error = SerializableErrorInfo(f"{cls_name}: [Errno 111] Connection refused\n", [frame], cls_name)
        return StepFailureData(error=error, user_failure_data=None)

    in_py4j = '  File "/venv/lib/python3.11/site-packages/py4j/clientserver.py", line 506, in send_command\n'
    assert _reason(failure("ConnectionRefusedError", in_py4j)).startswith("the Spark driver's JVM is gone")
    assert "Connection refused" in _reason(failure("ConnectionRefusedError", in_py4j))
    for killed_during_a_call in ("ConnectionResetError", "BrokenPipeError"):
        assert _reason(failure(killed_during_a_call, in_py4j)).startswith("the Spark driver's JVM is gone")
    elsewhere = '  File "/venv/lib/python3.11/site-packages/urllib3/connection.py", line 1, in connect\n'
    assert _reason(failure("ConnectionRefusedError", elsewhere)) == (
        "ConnectionRefusedError: [Errno 111] Connection refused"
    )
