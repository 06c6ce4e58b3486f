"""Waiting for a condition instead of sleeping: a test or a benchmark that sleeps "long enough" is
slow where the condition comes early and flaky where it comes late."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class ConditionNotReached(AssertionError):
    """`wait_for`'s condition did not hold within its time."""


def eventually(predicate: Callable[[], object], timeout_s: float, step_s: float = 0.05) -> bool:
    """Whether `predicate()` holds within `timeout_s`, asked every `step_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(step_s)
    return True


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str = "condition", step_s: float = 0.05) -> float:
    """Seconds until `predicate()` held; ConditionNotReached naming `what` after `timeout_s`."""
    started = time.monotonic()
    if not eventually(predicate, timeout_s, step_s):
        raise ConditionNotReached(f"{what}: not reached within {timeout_s:g} s")
    return time.monotonic() - started


async def wait_for_async(
    predicate: Callable[[], object], timeout_s: float, what: str = "condition", step_s: float = 0.01
) -> float:
    """`wait_for` inside an event loop: the loop runs on between the asks."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise ConditionNotReached(f"{what}: not reached within {timeout_s:g} s")
        await asyncio.sleep(step_s)
    return time.monotonic() - started
