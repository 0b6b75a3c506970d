"""Independent Spark actions submitted together.

A fold ends with several writes that share nothing but their cached inputs, and a run's checks
are independent queries. Submitted one after another, each waits for the last one's slowest
task and for its own planning on the driver; a write of the open set is often a single task,
so on a small cluster most cores idle. Submitted from threads, Spark schedules their tasks side
by side (a cached partition is still computed once: the block manager makes a second reader
wait for the first).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pyspark.sql import SparkSession

T = TypeVar("T")


def _in_session(session: SparkSession | None, action: Callable[[], T]) -> Callable[[], T]:
    """The action, run with `session` active in its thread. A new thread starts with no active
    session in the JVM, and a query built there would be analysed with Spark's default settings
    instead of the session's (e.g. Parquet TIME columns would be refused)."""
    # The py4j handles of classic sessions; Connect keeps its session server-side.
    jvm_session = getattr(session, "_jsparkSession", None)
    jvm = getattr(session, "_jvm", None)
    if jvm_session is None or jvm is None:
        return action

    def run() -> T:
        jvm.SparkSession.setActiveSession(jvm_session)
        try:
            return action()
        finally:
            jvm.SparkSession.clearActiveSession()

    return run


def run_together(*actions: Callable[[], T], session: SparkSession | None = None) -> list[T]:
    """Run each action in its own thread, with `session` active there; return their results in
    order. Every action runs to its end even when another fails, then the first failure is
    raised: returning early would leave writes going on in the background while the caller
    cleans up or retries."""
    if len(actions) == 1:
        return [actions[0]()]
    with ThreadPoolExecutor(max_workers=len(actions), thread_name_prefix="spark-action") as pool:
        futures = [pool.submit(_in_session(session, action)) for action in actions]
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]
