"""The stall watchdog names what held the event loop: work in the loop, or a thread that was not running."""

from __future__ import annotations

import asyncio
import time

from codecstream.server.loop_stalls import LoopStallWatchdog

PERIOD_S = 0.05


def spin_for(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


async def run_beside_watchdog(block, seconds: float) -> list:
    """A loop that beats like the server's, blocked once by `block(seconds)`; the stalls reported."""
    stalls = []
    watchdog = LoopStallWatchdog(PERIOD_S, threshold_s=0.1, on_stall=stalls.append)

    async def beat() -> None:
        while True:
            await asyncio.sleep(PERIOD_S)
            watchdog.beat()

    watchdog.start()
    beating = asyncio.create_task(beat())
    try:
        await asyncio.sleep(0.3)  # beats on time: nothing reported
        quiet = list(stalls)
        if block:
            block(seconds)
        await asyncio.sleep(0.3)  # the watchdog sees the beat again and reports
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
