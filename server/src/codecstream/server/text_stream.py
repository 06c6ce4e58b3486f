"""Streamed text (Start.streaming_text + TextInput): cut into segments as it arrives, each segment one
engine request, all of them one stream of frames.

vLLM-Omni 0.30 cannot grow one talker request while it runs (docs/server.md, "Streaming text"), so
this is the fallback the contract allows: clause and sentence segments as separate engine requests
within one stream, in one seq and frame space, the next one generated as soon as the current one
is (generation runs ahead of real time, so it is ready while the client still plays the current
one), the client's decoder never reset between them. The cutting rule is the contract's
(synthesis.proto, TextInput); its constants are ServerLimits'.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import re
import time
from collections.abc import AsyncIterator

import numpy as np
from codecstream.protocol.decoding import NUM_CODEBOOKS
from codecstream.server.limits import ServerLimits
from codecstream.server.source import (
    CodeSource,
    CodeStream,
    GenerationFailed,
    RequestRejected,
    SourceUnavailable,
    StopReason,
    SynthesisRequest,
)

#: A sentence ends at . ! ? … (closing quotes and brackets included) before a space, or at a CJK
#: full stop, exclamation or question mark anywhere.
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s)|[。！？]+[”’」』）]*")
#: A clause ends at , ; : before a space, or at a CJK comma, semicolon, colon or enumeration mark.
_CLAUSE_END = re.compile(r"[,;:]+(?=\s)|[，；：、]+")
_SPACE = re.compile(r"\s")
#: Marks the end of a segment in the frames a SegmentedCodeStream yields (see session.py).
SEGMENT_BOUNDARY = np.zeros((0, NUM_CODEBOOKS), dtype=np.int16)


class TextInputViolation(Exception):
    """A TextInput the contract forbids; the message names the rule (never the client's text)."""


@dataclasses.dataclass(frozen=True)
class Segment:
    #: Characters [start, end) of the text received so far.
    start: int
    end: int


class TextSegmenter:
    """The text received so far and where its next segment starts; cuts segments by the rule."""

    def __init__(self, limits: ServerLimits) -> None:
        self.text = ""
        self._limits = limits
        self._cut = 0  # text before this offset belongs to segments already cut

    def append(self, piece: str) -> None:
        self.text += piece

    @property
    def pending(self) -> bool:
        """Whether text waits that no segment holds yet."""
        return bool(self.text[self._cut :].strip())

    def cut_ready(self) -> list[Segment]:
        """Segments that end at a sentence end, a long enough clause, or the length limit."""
        segments = []
        while (end := self._next_end()) is not None:
            segments += self._take(end)
        return segments

    def cut_all(self) -> list[Segment]:
        """Everything pending as segments (flush, end of input, idle): first those the rule cuts,
        then the rest as one."""
        return self.cut_ready() + self._take(len(self.text))

    def _next_end(self) -> int | None:
        start = self._first_char(self._cut)
        if start is None:
            return None
        sentence = _SENTENCE_END.search(self.text, start)
        if sentence and sentence.end() - start <= self._limits.max_segment_chars:
            return sentence.end()
        clause_from = start + self._limits.min_clause_chars - 1
        clause = _CLAUSE_END.search(self.text, clause_from) if clause_from < len(self.text) else None
        if clause and clause.end() - start <= self._limits.max_segment_chars:
            return clause.end()
        limit = start + self._limits.max_segment_chars
        if len(self.text) > limit:
            spaces = [m.start() for m in _SPACE.finditer(self.text, start + 1, limit)]
            return spaces[-1] if spaces else limit
        return None

    def _take(self, end: int) -> list[Segment]:
        start = self._first_char(self._cut, end)
        self._cut = end
        if start is None:
            return []
        while self.text[end - 1].isspace():
            end -= 1
        return [Segment(start, end)]

    def _first_char(self, offset: int, end: int | None = None) -> int | None:
        """Offset of the first non-space character in text[offset:end], None if there is none."""
        for index in range(offset, len(self.text) if end is None else end):
            if not self.text[index].isspace():
                return index
        return None


class SegmentedCodeStream(CodeStream):
    """Frames of every segment of a streamed text, in order, with SEGMENT_BOUNDARY after each
    segment; `push()` brings text as TextInput delivers it."""

    def __init__(self, source: CodeSource, request: SynthesisRequest, stream_id: str, limits: ServerLimits) -> None:
        self.max_frames = request.max_frames
        self._source = source
        self._request = request
        self._stream_id = stream_id
        self._limits = limits
        self._segmenter = TextSegmenter(limits)
        self._ready: collections.deque[Segment] = collections.deque()
        self._changed = asyncio.Event()
        self._input_ended = False
        self._last_text_at = time.monotonic()
        self._current: CodeStream | None = None
        self._current_segment: Segment | None = None
        self._aborted = False
        self._frames = 0
        if request.text:
            self.push(request.text, flush=False, end_of_input=False)

    @property
    def text(self) -> str:
        """The text received so far."""
        return self._segmenter.text

    def text_span(self) -> tuple[int, int] | None:
        segment = self._current_segment
        return (segment.start, segment.end) if segment else None

    def push(self, text: str, flush: bool, end_of_input: bool) -> None:
        """Append a TextInput; raise TextInputViolation for one the contract forbids."""
        if self._input_ended:
            raise TextInputViolation("text after end_of_input")
        if not text and not (flush or end_of_input):
            raise TextInputViolation("a text input with empty text and neither flush nor end_of_input")
        total = len(self._segmenter.text) + len(text)
        if total > self._limits.max_text_chars:
            raise TextInputViolation(f"the text totals {total} characters, the limit is {self._limits.max_text_chars}")
        self._segmenter.append(text)
        self._last_text_at = time.monotonic()
        self._ready.extend(self._segmenter.cut_all() if flush or end_of_input else self._segmenter.cut_ready())
        self._input_ended = end_of_input
        self._changed.set()

    async def _next_segment(self) -> Segment | None:
        """The next segment to speak; None once the input ended and everything is spoken."""
        while not self._aborted:
            if self._ready:
                return self._ready.popleft()
            if self._input_ended:
                return None
            now = time.monotonic()
            if self._segmenter.pending:
                timeout = self._last_text_at + self._limits.text_idle_s - now
                if timeout <= 0:
                    self._ready.extend(self._segmenter.cut_all())
                    continue
            else:
                timeout = self._last_text_at + self._limits.text_input_timeout_s - now
                if timeout <= 0:
                    raise GenerationFailed(f"no text for {self._limits.text_input_timeout_s:g} s and no end_of_input")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return None

    async def __aiter__(self) -> AsyncIterator[np.ndarray]:
        index = 0
        while (segment := await self._next_segment()) is not None:
            remaining = self.max_frames - self._frames
            if remaining <= 0:
                self.stop_reason = StopReason.MAX_FRAMES
                return
            cap = self._limits.segment_frame_cap(segment.end - segment.start)
            request = dataclasses.replace(
                self._request, text=self.text[segment.start : segment.end], max_frames=min(remaining, cap)
            )
            try:
                stream = await self._source.open(request, f"{self._stream_id}.{index}")
            except RequestRejected as rejection:
                raise GenerationFailed(
                    f"segment {index} (characters {segment.start}-{segment.end}) refused: {rejection.message}"
                ) from None
            except SourceUnavailable as failure:
                raise GenerationFailed(str(failure)) from None
            self._current, self._current_segment = stream, segment
            if self._aborted:  # stopped while the segment was being opened
                await stream.abort()
                return
            async for frames in stream:
                self._frames += len(frames)
                yield frames
            self._current = None
            if stream.stop_reason is StopReason.MAX_FRAMES and cap >= remaining:
                self.stop_reason = StopReason.MAX_FRAMES  # the stream's budget, not the segment's
                return
            yield SEGMENT_BOUNDARY
            index += 1
        self.stop_reason = StopReason.EOS

    async def abort(self) -> None:
        self._aborted = True
        self._changed.set()
        current = self._current
        if current is not None:
            await current.abort()
            self.frames_after_abort += current.frames_after_abort
