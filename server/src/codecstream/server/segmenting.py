"""Streamed text spoken by a source that takes whole texts only: cut into segments as it arrives,
each segment one request of the wrapped source, all of them one generation.

`SegmentingSource` wraps a CodeSource. A request without streamed text goes straight through, and
so does one with streamed text when the source grows requests (`grows_streamed_text`: the talker
engine, engine/growing_generation.py). Otherwise (the replay source, a talker engine started with
`--streamed-text segments`) streamed text becomes a `SegmentedGeneration`: clause and sentence
segments as separate requests of the wrapped source within one stream, in one seq and frame
space, the next one generated as soon as the current one is (generation runs ahead of real
time, so it is ready while the client still plays the current one), the client's decoder never
reset between them; every segment restarts the talker's prosody. The cutting rule is the
contract's (synthesis.proto, TextInput); its constants are ServerLimits'.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
import time
from collections.abc import AsyncIterator, Sequence

from codecstream.server.errors import GenerationFailed, Refusal, SourceUnavailable, TextInputExpired
from codecstream.server.limits import ServerLimits
from codecstream.server.request import SynthesisRequest
from codecstream.server.request_ids import segment_request_id
from codecstream.server.source import CodeSource, Event, Finished, FinishReason, Frames, Generation, SegmentEnd
from codecstream.server.text_input import StreamedText, speakable

#: A sentence ends at . ! ? … (closing quotes and brackets included) before a space, or at a CJK
#: full stop, exclamation or question mark anywhere.
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s)|[。！？]+[”’」』）]*")
#: A clause ends at , ; : before a space, or at a CJK comma, semicolon, colon or enumeration mark.
_CLAUSE_END = re.compile(r"[,;:]+(?=\s)|[，；：、]+")
_SPACE = re.compile(r"\s")


@dataclasses.dataclass(frozen=True)
class Segment:
    #: Characters [start, end) of the text received so far.
    start: int
    end: int


class TextSegmenter:
    """Where the next segment of a growing text starts, and the segments the rule completes."""

    def __init__(self, limits: ServerLimits) -> None:
        self._limits = limits
        self._cut = 0  # text before this offset belongs to segments already cut

    def pending(self, text: str) -> bool:
        """Whether text waits that no segment holds yet."""
        return bool(text[self._cut :].strip())

    def cut(self, text: str, flushes: Sequence[int] = ()) -> list[Segment]:
        """The segments complete in `text`: those ending at a sentence end, a long enough clause
        or the length limit, and at each of `flushes` (ascending offsets) even if the rule ends
        none there."""
        segments = []
        while True:
            end = self._next_end(text)
            later = bisect.bisect_right(flushes, self._cut)
            flush = flushes[later] if later < len(flushes) else None
            if flush is not None and (end is None or end > flush):
                end = flush
            if end is None:
                return segments
            segments += self._take(text, end)

    def _next_end(self, text: str) -> int | None:
        start = _first_char(text, self._cut)
        if start is None:
            return None
        limits = self._limits
        sentence = _SENTENCE_END.search(text, start)
        if sentence and sentence.end() - start <= limits.max_segment_chars:
            return sentence.end()
        clause_from = start + limits.min_clause_chars - 1
        clause = _CLAUSE_END.search(text, clause_from) if clause_from < len(text) else None
        if clause and clause.end() - start <= limits.max_segment_chars:
            return clause.end()
        limit = start + limits.max_segment_chars
        if len(text) > limit:  # the hard cut: the last space before the limit, or the limit itself
            spaces = [m.start() for m in _SPACE.finditer(text, start + 1, limit)]
            return spaces[-1] if spaces else limit
        return None

    def _take(self, text: str, end: int) -> list[Segment]:
        start = _first_char(text, self._cut, end)
        self._cut = end
        if start is None:
            return []
        while text[end - 1].isspace():
            end -= 1
        return [Segment(start, end)]


def _first_char(text: str, offset: int, end: int | None = None) -> int | None:
    """Offset of the first non-space character in text[offset:end], None if there is none."""
    for index in range(offset, len(text) if end is None else end):
        if not text[index].isspace():
            return index
    return None


class SegmentingSource(CodeSource):
    """`inner`, with streamed text spoken segment by segment (see the module docstring)."""

    def __init__(self, inner: CodeSource, limits: ServerLimits) -> None:
        self.inner = inner
        self._limits = limits

    @property
    def codec(self):
        return self.inner.codec

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    @property
    def offering(self):
        return self.inner.offering

    @property
    def grows_streamed_text(self) -> bool:
        return self.inner.grows_streamed_text

    @property
    def engine_slots(self) -> int | None:
        return self.inner.engine_slots

    @property
    def start_timeline(self):
        return self.inner.start_timeline

    async def open(self, request: SynthesisRequest, stream_id: str) -> Generation:
        if request.streamed_text is None:
            return await self.inner.open(request, stream_id)
        if self.inner.grows_streamed_text:
            return await self.inner.open_streamed(request, stream_id, self._limits)
        # The Header goes out at once; each segment is opened as its text is complete.
        return SegmentedGeneration(self.inner, request, request.streamed_text, stream_id, self._limits)

    async def start(self) -> None:
        await self.inner.start()

    async def check_health(self) -> None:
        await self.inner.check_health()

    async def live_requests(self) -> int:
        return await self.inner.live_requests()

    async def close(self) -> None:
        await self.inner.close()


class SegmentedGeneration(Generation):
    """The frames of every segment of a streamed text, in order, with SegmentEnd after each."""

    def __init__(
        self,
        source: CodeSource,
        request: SynthesisRequest,
        text: StreamedText,
        stream_id: str,
        limits: ServerLimits,
    ) -> None:
        super().__init__(request.max_frames)
        self._source = source
        self._request = request
        self._text = text
        self._stream_id = stream_id
        self._limits = limits
        self._segmenter = TextSegmenter(limits)
        self._ready: list[Segment] = []
        self._current: Generation | None = None
        self._aborted = False

    async def _next_segment(self) -> Segment | None:
        """The next segment to speak; None once the input ended and everything is spoken, or on abort."""
        text, limits = self._text, self._limits
        while not self._aborted:
            self._ready += self._segmenter.cut(text.text, text.flushes)
            # A segment with nothing to say (invisible characters only) is not spoken.
            self._ready = [s for s in self._ready if speakable(text.text[s.start : s.end])]
            if self._ready:
                return self._ready.pop(0)
            if text.ended:
                return None
            timeout, why = text.input_time_left()
            if timeout <= 0:
                raise TextInputExpired(why)
            if self._segmenter.pending(text.text):
                idle_s = text.last_text_at + limits.text_idle_s - time.monotonic()
                if idle_s <= 0:  # idle: speak the partial clause
                    self._ready += self._segmenter.cut(text.text, [len(text.text)])
                    continue
                timeout = min(timeout, idle_s)
            await text.changed(timeout)
        return None

    async def __aiter__(self) -> AsyncIterator[Event]:
        frames = 0
        index = 0
        while (segment := await self._next_segment()) is not None:
            remaining = self.max_frames - frames
            # A segment may not use up the stream's budget (a talker that never says EOS for it).
            cap = min(remaining, self._limits.segment_frame_cap(segment.end - segment.start))
            request = dataclasses.replace(
                self._request,
                text=self._text.text[segment.start : segment.end],
                max_frames=cap,
                streamed_text=None,
            )
            try:
                inner = await self._source.open(request, segment_request_id(self._stream_id, index))
            except Refusal as refusal:
                raise GenerationFailed(
                    f"segment {index} (characters {segment.start}-{segment.end}) refused: {refusal.message}"
                ) from None
            except SourceUnavailable as failure:
                raise GenerationFailed(str(failure)) from None
            self._current = inner
            if self._aborted:  # stopped while the segment was being opened
                await inner.abort()
            async for event in inner:
                if isinstance(event, Frames):
                    frames += len(event.codes)
                    yield Frames(event.codes, segment.start + event.text_start, segment.start + event.text_end)
                elif isinstance(event, Finished) and event.reason is FinishReason.ABORTED:
                    yield event
                    return
            self._current = None
            yield SegmentEnd()
            index += 1
        yield Finished(FinishReason.ABORTED if self._aborted else FinishReason.EOS)

    async def abort(self) -> None:
        self._aborted = True
        self._text.wake()
        if self._current is not None:
            await self._current.abort()
