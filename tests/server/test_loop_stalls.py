"""The stall watchdog names what held the event loop: work in the loop, or a thread that was not running."""

from __future__ import annotations

import asyncio
import threading
import time

from codecstream.server.loop_stalls import LoopStallWatchdog

PERIOD_S = 0.05
#: The watchdog looks every threshold / 2 = 0.05 s. Beating on time for this long (six of its looks)
#: it must report nothing: this wait is the behaviour under test, not a wait for something to happen.
QUIET_S = 0.3
#: Then the loop beats on for four more of its looks (after the report, where there is one): a
#: stall is reported once, and nothing more is reported.
AFTER_REPORT_S = 0.2
#: A bound on waiting for the report, so a watchdog that never reports fails instead of hanging.
REPORT_TIMEOUT_S = 10.0


def spin_for(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


async def run_beside_watchdog(block, seconds: float) -> list:
    """A loop that beats like the server's, blocked once by `block(seconds)`; the stalls reported."""
    stalls = []
    reported = threading.Event()

    def on_stall(stall) -> None:
        stalls.append(stall)
        reported.set()

    watchdog = LoopStallWatchdog(PERIOD_S, threshold_s=0.1, on_stall=on_stall)

    async def beat() -> None:
        while True:
            await asyncio.sleep(PERIOD_S)
            watchdog.beat()

    watchdog.start()
    beating = asyncio.create_task(beat())
    try:
        await asyncio.sleep(QUIET_S)  # beats on time: nothing reported
        quiet = list(stalls)
        if block:
            block(seconds)
            # The watchdog reports once it sees the loop beat again (from its own thread).
            await asyncio.to_thread(reported.wait, REPORT_TIMEOUT_S)
        await asyncio.sleep(AFTER_REPORT_S)
    finally:
        beating.cancel()
        watchdog.stop()
    assert quiet == []
    return stalls


def test_work_in_the_loop_is_reported_as_running_with_the_function_that_did_it():
    stalls = asyncio.run(run_beside_watchdog(spin_for, 0.6))
    assert len(stalls) == 1, stalls
    stall = stalls[0]
    assert stall.cause == "running", stall
    assert 0.4 < stall.seconds < 0.9
    assert any("spin_for" in frame for frame in stall.stack), stall.stack
    assert "blocked by work in the loop" in stall.describe() and "spin_for" in stall.describe()


def test_a_loop_thread_that_was_not_on_the_cpu_is_reported_as_not_running():
    stalls = asyncio.run(run_beside_watchdog(sleep_for, 0.6))
    assert [stall.cause for stall in stalls] == ["not_running"], stalls
    assert stalls[0].cpu_seconds < 0.1 and any("sleep_for" in frame for frame in stalls[0].stack)


def test_a_loop_that_keeps_beating_reports_nothing():
    assert asyncio.run(run_beside_watchdog(None, 0)) == []
