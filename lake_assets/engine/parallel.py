"""Independent Spark actions submitted together.

A fold ends with several writes that share nothing but their cached inputs, and a run's checks
are independent queries. Submitted one after another, each waits for the last one's slowest
task and for its own planning on the driver; a write of the open set is often a single task,
so on a small cluster most cores idle. Submitted from threads, Spark schedules their tasks side
by side (a cached partition is still computed once: the block manager makes a second reader
wait for the first).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")


def run_together(*actions: Callable[[], T]) -> list[T]:
    """Run each action in its own thread; return their results in order. Every action runs to
    its end even when another fails, then the first failure is raised: returning early would
    leave writes going on in the background while the caller cleans up or retries."""
    if len(actions) == 1:
        return [actions[0]()]
    with ThreadPoolExecutor(max_workers=len(actions), thread_name_prefix="spark-action") as pool:
        futures = [pool.submit(action) for action in actions]
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]
