"""The talker stage's scheduler: vLLM-Omni's AR scheduler, holding back growing requests whose
next text row has not arrived (text_feed.py says why and how), giving their slots to requests that
wait for one, and queueing a stream's next segment ahead of streams that arrived after it.

A held request keeps its slot while nobody waits for one. When requests wait and the batch is full,
held requests give way: they are *parked*, out of `running` but with their KV blocks, sampling state
and runner state kept, so an idle stream costs a newcomer one step, whoever holds it and however many
identities hold them. A parked request comes back, ahead of every waiting request, once its text
has arrived and a slot is free; it then resumes exactly where it paused (the same codes).

Two variants of one behaviour: on vLLM-Omni's synchronous AR scheduler, and on its asynchronous
one, which schedules step N+1 while step N runs on the GPU (the deploy YAML's `async_scheduling`
picks; `scheduler_for` is what the pipeline names). With a step in flight, a request has
sampled one token more than it shows (vLLM's output placeholder), and its next step reads the
text row after that one; such a request is never parked."""

from __future__ import annotations

import collections
from typing import Any

from codecstream.server.engine.repetition_penalty import DEVICE_PENALTIES
from codecstream.server.engine.text_feed import TEXT_FEEDS
from codecstream.server.request_ids import continues_a_stream
from vllm_omni.core.sched.omni_ar_scheduler import OmniARAsyncScheduler, OmniARScheduler


class _TextPacing:
    """The holding, the parking and the queueing, above either of vLLM-Omni's AR schedulers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        TEXT_FEEDS.scheduler_attached = True
        #: Held requests that gave their slot to a waiting request, in the order they did.
        self._parked: list[Any] = []

    def schedule(self, throttle_prefills: bool = False) -> Any:
        self._return_parked()
        held = [request for request in self.running if not self._has_text(request)]
        for request in held:
            TEXT_FEEDS.get(request.request_id).held_schedules += 1
        for request in self._parked:
            TEXT_FEEDS.get(request.request_id).held_schedules += 1
        held = self._park(held)
        if not held:
            return super().schedule(throttle_prefills)
        # A held request leaves `running` for this one step only: vLLM treats it as a running
        # request the token budget left out (its blocks, state and place stay), and it comes back
        # in its place, ahead of anything admitted meanwhile. It keeps its slot: admissions this
        # step see the batch less the held requests (else vLLM fills their slots, and its
        # `len(running) <= max_num_seqs` assertion kills the engine once they run again).
        before = self.running
        held_ids = {id(request) for request in held}
        self.running = [request for request in before if id(request) not in held_ids]
        slots = self.max_num_running_reqs
        self.max_num_running_reqs = max(0, slots - len(held))
        try:
            return super().schedule(throttle_prefills)
        finally:
            self.max_num_running_reqs = slots
            after = self.running
            kept = {id(request) for request in after}
            known = {id(request) for request in before}
            self.running = [request for request in before if id(request) in held_ids or id(request) in kept] + [
                request for request in after if id(request) not in known
            ]

    def _park(self, held: list[Any]) -> list[Any]:
        """Park as many held requests as the waiting requests need slots; the held ones left."""
        needed = len(self.waiting) + len(self.skipped_waiting) - (self.max_num_running_reqs - len(self.running))
        if needed <= 0:
            return held
        # A request with a step in flight has an output to take in first; it stays.
        parked = [request for request in held if not request.num_output_placeholders][:needed]
        parked_ids = {id(request) for request in parked}
        self.running = [request for request in self.running if id(request) not in parked_ids]
        self._parked += parked
        for request in parked:
            TEXT_FEEDS.get(request.request_id).parked += 1
        return [request for request in held if id(request) not in parked_ids]

    def _return_parked(self) -> None:
        """Parked requests whose text has arrived take free slots, before any waiting request."""
        self._parked = [request for request in self._parked if not request.is_finished()]
        for request in list(self._parked):
            if len(self.running) >= self.max_num_running_reqs:
                return
            if self._has_text(request):
                self._parked.remove(request)
                self.running.append(request)

    def _enqueue_waiting_request(self, request: Any) -> None:
        # A segmented stream is already speaking when its next segment arrives: queued at the
        # back, it would fall silent behind every stream that arrived meanwhile (seconds, with
        # tens of streams). It goes ahead of every first request, behind earlier continuations.
        if not continues_a_stream(request.request_id) or self._is_blocked_waiting_status(request.status):
            super()._enqueue_waiting_request(request)
            return
        if not isinstance(self.waiting, collections.deque):  # the priority policy orders by priority
            self.waiting.add_request(request)
            return
        ahead = next(
            (i for i, queued in enumerate(self.waiting) if not continues_a_stream(queued.request_id)), len(self.waiting)
        )
        self.waiting.insert(ahead, request)

    def has_requests(self) -> bool:
        # Only held or parked requests left: nothing to step until text (or an abort, or a new
        # request) arrives, and the engine core then waits on its input queue instead of spinning.
        # (vLLM counts parked requests nowhere: they are in neither `running` nor `waiting`.)
        if any(self._has_text(request) for request in self._parked):
            return True
        if not super().has_requests():
            return False
        if self.finished_req_ids or len(self.running) + len(self._parked) != len(self.requests):
            return True
        if any(self._has_text(request) for request in self.running):
            return True
        for request in (*self.running, *self._parked):
            TEXT_FEEDS.get(request.request_id).held_schedules += 1
        return False

    def add_request(self, request: Any) -> None:
        DEVICE_PENALTIES.admit(request.request_id, request.sampling_params)
        super().add_request(request)

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if request in self._parked:
            self._parked.remove(request)
        TEXT_FEEDS.finished(request.request_id)
        DEVICE_PENALTIES.release(request.request_id)
        return super()._free_request(request, *args, **kwargs)

    @staticmethod
    def _has_text(request: Any) -> bool:
        # Tokens sampled by the time this step runs: those returned, and the one a step still in
        # flight will return (always 0 on the synchronous scheduler).
        sampled = request.num_output_tokens + request.num_output_placeholders
        return TEXT_FEEDS.ready(request.request_id, sampled)


class TextPacedScheduler(_TextPacing, OmniARScheduler):
    pass


class TextPacedAsyncScheduler(_TextPacing, OmniARAsyncScheduler):
    pass


def scheduler_class(async_scheduling: bool) -> type:
    return TextPacedAsyncScheduler if async_scheduling else TextPacedScheduler


def scheduler_for(*, vllm_config: Any, **kwargs: Any) -> Any:
    """The talker stage's scheduler, as vLLM's engine core constructs one (the pipeline names this
    callable in place of a class: which variant is known only from the stage's own config)."""
    return scheduler_class(vllm_config.scheduler_config.async_scheduling)(vllm_config=vllm_config, **kwargs)
