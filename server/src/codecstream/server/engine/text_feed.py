"""Text fed into live talker requests: where the server, the scheduler and the talker meet.

A streamed-text request grows: it starts with the text ids committed so far, and the server
feeds the rest as it is committed (`IncrementalTokenizer`), then the end of the input. The
talker consumes one text row per decode step (vLLM-Omni's streaming-text mode: the first text
id in the prefill, the others from `trailing_text`, then `tts_eos`, then `tts_pad`). Feeding it
`tts_pad` before `tts_eos` is what makes the talker end early, so a request whose next row has
not arrived is not scheduled at all (`TextPacedScheduler`): it keeps its KV cache, its sampling
state and its place, costs no step, and resumes exactly where it paused.

All three meet in one process: the deploy YAMLs run the talker's stage on vLLM's uniproc
executor, so the scheduler, the worker and the model live in the stage's engine-core process
and this module's `TEXT_FEEDS` is one table for all of them. The server reaches it through
`collective_rpc` (worker_extension.py), which the engine core runs between two steps, on the
thread that steps: nothing here needs a lock. Frames stay independent of when text arrives,
because the talker sees the same rows in the same order at the same steps whatever the pauses.
"""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class TextFeed:
    """One growing request, as the engine sees it."""

    #: Text rows its decode steps may consume: ids after the first, and `tts_eos` once final.
    rows: int
    #: Ids fed but not yet appended to the talker's `trailing_text` (the talker takes them).
    pending: list[int]
    #: Whether the input is complete (`tts_eos` is, or is about to be, the last row).
    final: bool
    #: `tts_eos` is to be appended after the pending ids.
    eos_pending: bool
    #: The row index of `tts_eos` once final: the talker may sample codec EOS only after it.
    eos_row: int | None
    #: Counted by the engine, for tests and metrics: decode steps taken, the times the engine
    #: found the request without its next text row (at a schedule, or going idle for it), and the
    #: times it gave its slot to a waiting request (scheduler.py).
    decode_steps: int = 0
    held_schedules: int = 0
    parked: int = 0

    def eos_fed(self) -> bool:
        """Whether the talker has consumed `tts_eos` (decode step k consumes row k - 1)."""
        return self.eos_row is not None and self.decode_steps - 1 >= self.eos_row


class TextFeeds:
    """Every growing request of this engine, by the server's request id. A request without a
    feed is a whole-text request and is never held.

    Inside the engine a request's id is the server's with 8 random characters appended (vLLM's
    `{id}-{uuid:.8}`, for uniqueness); the scheduler and the talker look feeds up by that id."""

    def __init__(self) -> None:
        self._feeds: dict[str, TextFeed] = {}
        #: Set by the scheduler when it is created in this process: feeding text makes sense
        #: only where the scheduler that holds requests reads this same table.
        self.scheduler_attached = False
        #: Growing requests opened since the engine started.
        self.opened = 0
        #: The counts of requests the engine finished, until the server closes them (bounded:
        #: a server that never asks does not grow it).
        self._finished: collections.OrderedDict[str, dict[str, int]] = collections.OrderedDict()

    def open(self, request_id: str, text_ids: int, final: bool) -> None:
        """A request about to be added with `text_ids` ids in its prompt (at least one)."""
        if text_ids < 1:
            raise ValueError("a growing request starts with at least one text id")
        rows = text_ids - 1 + (1 if final else 0)
        self._feeds[request_id] = TextFeed(
            rows=rows, pending=[], final=final, eos_pending=final, eos_row=rows - 1 if final else None
        )
        self.opened += 1

    def feed(self, request_id: str, ids: list[int], final: bool) -> bool:
        """More ids for a request, and whether its input is now complete. False for a request
        that has no feed (finished, or never opened): its text has nowhere to go."""
        feed = self._feeds.get(request_id)
        if feed is None:
            return False
        if feed.final:
            raise ValueError(f"request {request_id}: text fed after its end of input")
        feed.pending += ids
        feed.rows += len(ids)
        if final:
            feed.final = feed.eos_pending = True
            feed.eos_row = feed.rows
            feed.rows += 1
        return True

    def get(self, engine_request_id: str) -> TextFeed | None:
        """The feed of a request, by its id inside the engine (or the server's own)."""
        if not self._feeds:
            return None
        feed = self._feeds.get(engine_request_id)
        if feed is None:
            feed = self._feeds.get(engine_request_id.rsplit("-", 1)[0])
        return feed

    def ready(self, engine_request_id: str, num_output_tokens: int) -> bool:
        """Whether the request's next step has its text row: the decode step after
        `num_output_tokens` sampled tokens consumes row `num_output_tokens - 1`."""
        feed = self.get(engine_request_id)
        return feed is None or feed.final or feed.rows >= num_output_tokens

    def finished(self, engine_request_id: str) -> None:
        """The engine freed the request: no more text can go to it; its counts stay for `close`."""
        request_id = engine_request_id if engine_request_id in self._feeds else engine_request_id.rsplit("-", 1)[0]
        feed = self._feeds.pop(request_id, None)
        if feed is not None:
            self._finished[request_id] = _counts(feed)
            while len(self._finished) > _FINISHED_KEPT:
                self._finished.popitem(last=False)

    def close(self, request_id: str) -> dict[str, int] | None:
        """Forget a request (finished, aborted, or never added); its counts, or None."""
        feed = self._feeds.pop(request_id, None)
        if feed is not None:
            return _counts(feed)
        return self._finished.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._feeds)


_FINISHED_KEPT = 1024


def _counts(feed: TextFeed) -> dict[str, int]:
    return {"decode_steps": feed.decode_steps, "held_schedules": feed.held_schedules, "parked": feed.parked}


#: The engine process's table (one talker stage per process).
TEXT_FEEDS = TextFeeds()
