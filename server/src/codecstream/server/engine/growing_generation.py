"""Streamed text as one growing talker request: one prefill, one prosody, whatever the arrival.

The text is tokenized as it arrives (`IncrementalTokenizer`: the ids of the whole text, wherever it
was cut). The request starts once the start gate opens (`ServerLimits.start_gate_tokens` committed
tokens, a clause or sentence mark, a flush or the end of the input) with the ids committed so far
in its prompt, in the talker's streaming-text mode; every later id is fed into the live request
(engine/text_feed.py), and the end of the input last. The engine holds the request whenever its
next text token has not arrived, so its frames are those of the same request given the whole text
at once. Frame k is conditioned on text token k, so each frame names the characters of its token:
chunks and End.text_offset_played follow the talker's own schedule.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from typing import Any, Protocol

from codecstream.server.errors import GenerationFailed, TextInputExpired
from codecstream.server.limits import ServerLimits
from codecstream.server.request import SynthesisRequest
from codecstream.server.source import Event, Finished, FinishReason, Frames, Generation, SegmentEnd
from codecstream.server.text_input import StreamedText, speakable
from codecstream.server.text_tokens import IncrementalTokenizer

log = logging.getLogger(__name__)

#: A clause or sentence mark in committed text opens the start gate (Latin and CJK).
_CLAUSE_OR_SENTENCE = re.compile(r"[,;:.!?…，；：、。！？]")


class GrowingRequests(Protocol):
    """What a growing generation needs of its engine: the requests of the running talker
    (engine/talker_requests.TalkerRequests), not the source that made them."""

    #: The checkpoint's text tokenizer, for use on the event loop only.
    text_tokenizer: Any

    async def open_growing(
        self, request: SynthesisRequest, stream_id: str, text_ids: list[int], final: bool
    ) -> Generation: ...

    async def feed_growing(self, stream_id: str, text_ids: list[int], final: bool) -> None: ...

    async def close_growing(self, stream_id: str) -> dict[str, int] | None: ...


class GrowingTalkerGeneration(Generation):
    def __init__(
        self,
        requests: GrowingRequests,
        request: SynthesisRequest,
        stream_id: str,
        limits: ServerLimits,
        max_frames: int,
    ) -> None:
        super().__init__(max_frames)
        assert request.streamed_text is not None
        self._requests = requests
        self._request = request
        self._text: StreamedText = request.streamed_text
        self._stream_id = stream_id
        self._limits = limits
        self._tokens = IncrementalTokenizer(requests.text_tokenizer)
        self._pushed = 0  # characters of the received text given to the tokenizer
        self._flushed = 0  # characters flushed into the tokenizer
        self._fed = 0  # committed ids the engine has
        self._final_fed = False
        self._tokens_ended = False
        self._inner: Any | None = None  # the engine request's generation, once open
        self._aborted = False
        self._failure: GenerationFailed | None = None
        #: What the engine counted for the request once it ended: decode steps, schedules held.
        self.engine_counts: dict[str, int] | None = None

    # -- text ---------------------------------------------------------------------------------

    def _take_text(self) -> None:
        """Give the tokenizer what arrived since the last call (a flush or the end as well)."""
        text = self._text
        # Each flush applies where it came, not to text that arrived after it.
        for flush in text.flushes[bisect.bisect_right(text.flushes, self._flushed) :]:
            self._push_to(flush)
            if not (text.ended and flush == text.flushed_to):
                self._tokens.flush()
            self._flushed = flush
        self._push_to(len(text.text))
        if text.ended and not self._tokens_ended:
            self._tokens.end()
            self._tokens_ended = True

    def _push_to(self, offset: int) -> None:
        if offset > self._pushed:
            self._tokens.push(self._text.text[self._pushed : offset])
            self._pushed = offset

    async def _wait_for_text(self, holding_engine: bool = False) -> None:
        """Until more text arrives (or the stream is stopped); the input timeout applies, and while
        the engine holds the request for it, max_engine_wait_s (the slot is then not free for others)."""
        timeout, why = self._text.input_time_left(self._limits.max_engine_wait_s if holding_engine else None)
        if timeout <= 0:
            raise TextInputExpired(why)
        await self._text.changed(timeout)

    def _gate_open(self) -> bool:
        ids = self._tokens.ids
        if self._tokens_ended or (ids and self._text.flushed_to >= self._pushed):
            return True
        if len(ids) >= self._limits.start_gate_tokens:
            return True
        committed = self._tokens.normalize(self._text.text)[: self._tokens.ends[-1]] if ids else ""
        return bool(_CLAUSE_OR_SENTENCE.search(committed))

    def _char_offsets(self, first: int, last: int) -> tuple[int, int]:
        """Characters of the received text that tokens [first, last) speak (offsets in the raw text)."""
        ends = self._tokens.ends
        start = ends[first - 1] if first > 0 else 0
        end = ends[last - 1] if last > 0 else 0
        return self._raw_offset(start), self._raw_offset(end)

    def _raw_offset(self, normalized: int) -> int:
        raw = self._text.text
        if raw.isascii():  # normalizing ASCII changes no length
            return min(normalized, len(raw))
        # The shortest raw prefix whose normalized form covers `normalized` characters.
        low, high = 0, len(raw)
        while low < high:
            middle = (low + high) // 2
            if len(self._tokens.normalize(raw[:middle])) >= normalized:
                high = middle
            else:
                low = middle + 1
        return low

    # -- generation ---------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        while not self._aborted:
            self._take_text()
            if self._gate_open():
                break
            await self._wait_for_text()
        if self._aborted:
            yield Finished(FinishReason.ABORTED)
            return
        if not self._tokens.ids or (self._tokens_ended and not speakable(self._text.text)):
            # The input ended with nothing to say (white space or invisible characters only).
            yield Finished(FinishReason.EOS)
            return
        self._fed = len(self._tokens.ids)
        self._final_fed = self._tokens_ended
        inner = await self._requests.open_growing(self._request, self._stream_id, self._tokens.ids, self._final_fed)
        self._inner = inner
        feeder = asyncio.create_task(self._feed(inner))
        frames = 0
        try:
            if self._aborted:
                await inner.abort()
            async for event in inner:
                if isinstance(event, Finished):
                    if self._failure is not None:
                        raise self._failure
                    yield Finished(FinishReason.ABORTED if self._aborted else event.reason)
                    return
                assert isinstance(event, Frames)
                count = len(event.codes)
                for index in range(count):
                    # Frame k was conditioned on text token k; frames after the text on none.
                    token = min(frames + index, len(self._tokens.ids))
                    start, end = self._char_offsets(token, min(token + 1, len(self._tokens.ids)))
                    if token >= len(self._tokens.ids):
                        start = end = self._char_offsets(0, len(self._tokens.ids))[1]
                    yield Frames(event.codes[index : index + 1], start, end, ends_text_span=True)
                frames += count
                if not self._final_fed and frames >= len(self._tokens.ids) - 1 and self._fed == len(self._tokens.ids):
                    # The talker has read every token that arrived and waits: what it made goes out
                    # now. (A frame's codes come with the next step, so the frame of the last token
                    # read waits in the engine with it.)
                    yield SegmentEnd()
                if self._final_fed and frames >= self._frame_cap() and frames < self.max_frames:
                    # A talker that does not end the text (random weights): the text is spoken,
                    # as a segment at its cap is; the stream's own budget is the session's to end.
                    log.info(
                        "stream %s: no EOS within %d frames of the whole text; ended there", self._stream_id, frames
                    )
                    await inner.abort()
                    yield Finished(FinishReason.EOS)
                    return
        finally:
            feeder.cancel()
            with contextlib.suppress(BaseException):
                await feeder
            self.engine_counts = await self._requests.close_growing(self._stream_id)

    def _frame_cap(self) -> int:
        """Frames the whole text may take (ServerLimits.segment_frame_cap of all of it)."""
        return self._limits.segment_frame_cap(len(self._text.text))

    async def _feed(self, inner: Generation) -> None:
        """Feed every id committed after the request opened, and the end of the input, as they come."""
        try:
            while not self._final_fed and not self._aborted:
                self._take_text()
                new = self._tokens.ids[self._fed :]
                if new or self._tokens_ended:
                    await self._requests.feed_growing(self._stream_id, new, self._tokens_ended)
                    self._fed += len(new)
                    self._final_fed = self._tokens_ended
                    continue
                await self._wait_for_text(holding_engine=True)
        except asyncio.CancelledError:
            raise
        except GenerationFailed as failure:
            self._failure = failure
            await inner.abort()
        except Exception as error:  # an engine that cannot take the text fails the stream, not the server
            log.warning("stream %s: feeding text failed: %s", self._stream_id, error)
            self._failure = GenerationFailed(f"the engine could not take more text: {error}")
            await inner.abort()

    async def abort(self) -> None:
        self._aborted = True
        self._text.wake()
        if self._inner is not None:
            await self._inner.abort()
