"""Keeps the code source serving: starts it, notices within `poll_s` when it fails, and restarts
it with a bounded backoff — or gives up, so that the process exits for a supervisor to act.

An engine dies when something inside its worker raises (vLLM-Omni then evicts the stage and every
later request fails), or when its process is killed. The service must not go on answering as if
it were fine: while the source is not serving, health says NOT_SERVING, running streams end with
End(ERROR) and new ones get UNAVAILABLE. A restart costs one engine start (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
from collections.abc import Awaitable, Callable

from codecstream.server.errors import SourceUnavailable, one_line
from codecstream.server.limits import check_ranges
from codecstream.server.metrics import Metrics
from codecstream.server.source import CodeSource

log = logging.getLogger(__name__)


class SourceState(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    FAILED = "failed"  # restarting
    GAVE_UP = "gave up"


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    #: Restart attempts in a row before giving up; 0: give up at the first failure.
    max_attempts: int = 5
    #: Wait before the first attempt; it doubles with each failed attempt, up to `max_delay_s`.
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    #: A source that served this long after a restart counts as recovered: its next failure
    #: starts the backoff over instead of continuing it (a request of death cannot loop fast).
    stable_after_s: float = 60.0

    def __post_init__(self) -> None:
        check_ranges(self, {"max_attempts": (">= 0", lambda value: value >= 0)})

    def delay(self, attempt: int) -> float:
        return min(self.max_delay_s, self.first_delay_s * 2 ** (attempt - 1))


class SourceSupervisor:
    def __init__(
        self,
        source: CodeSource,
        metrics: Metrics,
        on_change: Callable[[SourceState, str], Awaitable[None]],
        policy: RestartPolicy | None = None,
        poll_s: float = 0.2,
    ) -> None:
        self.source = source
        self.policy = policy or RestartPolicy()
        self._metrics = metrics
        self._on_change = on_change
        self._poll_s = poll_s
        self.state = SourceState.STARTING
        #: Set once the supervisor stops restarting: the process should exit.
        self.gave_up = asyncio.Event()
        self._watch: asyncio.Task | None = None
        self._failures_in_a_row = 0
        self._serving_since = 0.0

    async def start(self) -> None:
        """Start the source for the first time; a failure here is raised (a startup error)."""
        await self._set(SourceState.STARTING, "the engine is starting")
        await self.source.start()
        await self._serving()
        self._watch = asyncio.create_task(self._watch_health(), name="source-health")

    async def stop(self) -> None:
        """Stop watching and release the source (always, whatever state it is in)."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        try:
            await self.source.close()
        except Exception:
            log.exception("closing the code source failed")

    async def _serving(self) -> None:
        self._serving_since = asyncio.get_running_loop().time()
        for phase, seconds in self.source.start_timeline.items():
            self._metrics.engine_start.labels(phase=phase).set(seconds)
        self._metrics.engine_up.set(1)
        await self._set(SourceState.SERVING, "")

    async def _set(self, state: SourceState, reason: str) -> None:
        self.state = state
        if state is not SourceState.SERVING:
            self._metrics.engine_up.set(0)
        await self._on_change(state, reason)

    async def _watch_health(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                await self.source.check_health()
            except SourceUnavailable as failure:
                if not await self._recover(str(failure)):
                    return

    async def _recover(self, failure: str) -> bool:
        """Restart the source after `failure`; False once the policy gives up."""
        log.error("the engine failed: %s", failure)
        loop = asyncio.get_running_loop()
        if loop.time() - self._serving_since >= self.policy.stable_after_s:
            self._failures_in_a_row = 0
        while True:
            self._failures_in_a_row += 1
            attempt = self._failures_in_a_row
            if attempt > self.policy.max_attempts:
                await self._set(SourceState.GAVE_UP, f"the engine failed ({failure}) and was not restarted")
                log.error("giving up after %d restart attempts in a row", attempt - 1)
                self.gave_up.set()
                return False
            delay = self.policy.delay(attempt)
            await self._set(SourceState.FAILED, f"the engine failed ({failure}); restarting it")
            try:
                await self.source.close()
            except Exception:  # the engine failed: what is left of it may not close cleanly
                log.warning("closing the failed engine before restarting it failed", exc_info=True)
            log.info("restarting the engine in %.1f s (attempt %d of %d)", delay, attempt, self.policy.max_attempts)
            await asyncio.sleep(delay)
            try:
                await self.source.start()
            except Exception as error:
                failure = f"restart failed: {one_line(error, with_type=True)}"
                log.exception("restarting the engine failed")
                continue
            self._metrics.engine_restarts.inc()
            log.info("the engine is serving again")
            await self._serving()
            return True
