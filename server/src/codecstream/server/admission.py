"""Who may open a stream now, and who may send another control message.

A Start that parsed is admitted against the server's concurrent-stream limit, then its client's
own: the streams it holds against `max_streams_per_client` and against its share of the engine's
request slots (`max_engine_requests_per_client`), its control-message budget (a client that overran
it opens nothing until the budget is whole again) and its streams per minute. A decoder download is
admitted against its client's share of downloads (`DownloadShare`). Each refuses with
RESOURCE_EXHAUSTED. A client is its checked token, or its peer address (auth.principal).
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Collection, Iterator

from codecstream.server.errors import Refusal
from codecstream.server.limits import RateLimiter, ServerLimits


class Admission:
    """Admits streams and control messages under one server's limits; `engine_slots` says how many
    requests the engine generates at once (None: no such bound, or not known yet)."""

    def __init__(
        self,
        limits: ServerLimits,
        engine_slots: Callable[[], int | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limits = limits
        self._engine_slots = engine_slots
        self._streams_per_minute = RateLimiter.per_minute(limits.streams_per_client_per_minute, clock)
        self._message_budget = RateLimiter(limits.control_messages_per_s, limits.control_message_burst, clock)
        #: Stream slots taken by opens still waiting on the reference audio or the engine, by client.
        self._opening: collections.Counter[str] = collections.Counter()

    @property
    def engine_share(self) -> int:
        """Streams one client may hold on the engine (ServerLimits.max_engine_requests_per_client); 0: any."""
        slots, share = self._engine_slots(), self._limits.max_engine_requests_per_client
        if not slots or share == 0:
            return 0
        return max(1, slots // 2) if share is None else share

    @property
    def streams_per_client(self) -> int:
        """The streams one client may hold: the tighter of the per-client limit and the engine share."""
        limits = [n for n in (self._limits.max_streams_per_client, self.engine_share) if n]
        return min(limits, default=0)

    @contextlib.contextmanager
    def admit(self, client: str, running: Collection[str]) -> Iterator[None]:
        """Hold a stream slot for `client` while its stream opens, or raise Refusal.

        `running` names the client of every stream that runs now. The slot is taken before the
        caller's first await, so concurrent opens cannot all pass a limit; once the stream runs,
        `running` counts it instead."""
        limits = self._limits
        if self._opening.total() + len(running) >= limits.max_concurrent_streams:
            raise Refusal(
                "RESOURCE_EXHAUSTED", f"server is at its limit of {limits.max_concurrent_streams} concurrent streams"
            )
        held = self._opening[client] + sum(1 for holder in running if holder == client)
        per_client = limits.max_streams_per_client
        if per_client and held >= per_client:
            raise Refusal(
                "RESOURCE_EXHAUSTED", f"client {client} holds {held} streams, the limit per client is {per_client}"
            )
        share = self.engine_share
        if share and held >= share:
            raise Refusal(
                "RESOURCE_EXHAUSTED",
                f"client {client} holds {held} streams, its share of the engine's {self._engine_slots()} "
                f"request slots (max_engine_requests_per_client)",
            )
        # A client that overran its message budget opens nothing until the budget is whole again: a
        # flood that reconnects as each call ends would otherwise open an engine request a call.
        barred_s = self._message_budget.overdrawn_s(client)
        if barred_s:
            raise Refusal(
                "RESOURCE_EXHAUSTED",
                f"client {client} sent {self._budget_overrun()}; it may start streams again in {barred_s:.1f} s",
            )
        wait_s = self._streams_per_minute.try_acquire(client)
        if wait_s:
            raise Refusal(
                "RESOURCE_EXHAUSTED",
                f"client {client} exceeded {limits.streams_per_client_per_minute} streams per minute; "
                f"retry in {wait_s:.1f} s",
            )
        with held_by(self._opening, client):
            yield

    def control_message(self, client: str) -> str | None:
        """Count one message after a call's first from `client`: the violation it is when it
        overruns the client's budget, else None."""
        return self._budget_overrun() if self._message_budget.try_acquire(client) else None

    def _budget_overrun(self) -> str:
        per_s, burst = self._limits.control_messages_per_s, self._limits.control_message_burst
        return f"more than {per_s:g} messages a second (after a burst of {burst})"


class DownloadShare:
    """Decoder downloads running or waiting for a download slot, by client: one client holds at
    most `per_client` of them at once (0: any)."""

    def __init__(self, per_client: int) -> None:
        self._per_client = per_client
        self._held: collections.Counter[str] = collections.Counter()

    @property
    def held(self) -> int:
        """Downloads held now, by every client together."""
        return self._held.total()

    @contextlib.contextmanager
    def hold(self, client: str) -> Iterator[None]:
        """Hold one of `client`'s downloads while the block runs, or raise Refusal."""
        if self._per_client and self._held[client] >= self._per_client:
            raise Refusal(
                "RESOURCE_EXHAUSTED",
                f"this client has {self._per_client} decoder downloads running (max_downloads_per_client); "
                "retry when one has finished",
            )
        with held_by(self._held, client):
            yield


@contextlib.contextmanager
def held_by(holds: collections.Counter[str], client: str) -> Iterator[None]:
    """Count one more hold of `client`'s in `holds` while the block runs; a client that holds
    nothing any more is forgotten (a server meets many clients once)."""
    holds[client] += 1
    try:
        yield
    finally:
        holds[client] -= 1
        if not holds[client]:
            del holds[client]
