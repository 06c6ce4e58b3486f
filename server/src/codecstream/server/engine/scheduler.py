"""The talker stage's scheduler: vLLM-Omni's AR scheduler, holding back growing requests whose
next text row has not arrived (text_feed.py says why and how), and queueing a stream's next
segment ahead of streams that arrived after it."""

from __future__ import annotations

import collections
from typing import Any

from codecstream.server.engine.text_feed import TEXT_FEEDS
from codecstream.server.request_ids import continues_a_stream
from vllm_omni.core.sched.omni_ar_scheduler import OmniARScheduler


class TextPacedScheduler(OmniARScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        TEXT_FEEDS.scheduler_attached = True

    def schedule(self, throttle_prefills: bool = False) -> Any:
        held = [request for request in self.running if not self._has_text(request)]
        if not held:
            return super().schedule(throttle_prefills)
        for request in held:
            TEXT_FEEDS.get(request.request_id).held_schedules += 1
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

    def _enqueue_waiting_request(self, request: Any) -> None:
        # A segmented stream is already speaking when its next segment arrives: queued at the
        # back, it would fall silent behind every stream that arrived meanwhile (13 s with 50
        # streams, issue 22). It goes ahead of every first request, behind earlier continuations.
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
        # Only held requests left: nothing to step until text (or an abort, or a new request)
        # arrives, and the engine core then waits on its input queue instead of spinning.
        if not super().has_requests():
            return False
        if self.finished_req_ids or len(self.running) != len(self.requests):
            return True
        if any(self._has_text(request) for request in self.running):
            return True
        for request in self.running:
            TEXT_FEEDS.get(request.request_id).held_schedules += 1
        return False

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        TEXT_FEEDS.finished(request.request_id)
        return super()._free_request(request, *args, **kwargs)

    @staticmethod
    def _has_text(request: Any) -> bool:
        return TEXT_FEEDS.ready(request.request_id, request.num_output_tokens)
