"""Frames into chunks: the chunk schedule applied to a generation's frames as they come.

Frames wait until the chunk the schedule asks for next is full; a chunk carries the span of text
its frames speak. A segment's end (a pause in a streamed text) lets the frames that wait go as a
chunk of their own and starts the schedule again at its small first chunk: after a pause, the next
audio should start soon.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
from codecstream.protocol.chunking import ChunkSchedule
from codecstream.server.source import Frames


@dataclasses.dataclass(frozen=True)
class ChunkFrames:
    """Frames taken for one chunk and the text they speak (Chunk.text_start/text_end/ends_text_span)."""

    codes: np.ndarray
    text_start: int
    text_end: int
    ends_text_span: bool


class _PendingFrames:
    """Frames generated but not yet in a chunk, with the text span of each run of them."""

    def __init__(self) -> None:
        self._runs: collections.deque[Frames] = collections.deque()
        self.count = 0

    def add(self, frames: Frames) -> None:
        self._runs.append(frames)
        self.count += len(frames.codes)

    def take(self, wanted: int, ends_text_span: bool = False) -> ChunkFrames:
        """The first `wanted` frames (all of them if fewer wait) and the span of text they speak;
        `ends_text_span`: the generation said the span ends here (a segment or the text is over)."""
        parts, start, end = [], None, 0
        while wanted and self._runs:
            run = self._runs.popleft()
            if len(run.codes) > wanted:
                self._runs.appendleft(Frames(run.codes[wanted:], run.text_start, run.text_end, run.ends_text_span))
                run = Frames(run.codes[:wanted], run.text_start, run.text_end)
            parts.append(run.codes)
            start = run.text_start if start is None else min(start, run.text_start)
            end = max(end, run.text_end)
            wanted -= len(run.codes)
            self.count -= len(run.codes)
            ends_text_span = ends_text_span or run.ends_text_span
        return ChunkFrames(np.concatenate(parts), start or 0, end, ends_text_span)


class ChunkCutter:
    """Cuts a generation's frames into chunks of `schedule`'s sizes."""

    def __init__(self, schedule: ChunkSchedule) -> None:
        self._schedule = schedule
        self._pending = _PendingFrames()
        self._restart()

    def _restart(self) -> None:
        self._sizes = iter(self._schedule)
        self._target = next(self._sizes)

    def add(self, frames: Frames) -> list[ChunkFrames]:
        """Take `frames`; the chunks they complete."""
        self._pending.add(frames)
        chunks = []
        while self._pending.count >= self._target:
            chunks.append(self._pending.take(self._target))
            self._target = next(self._sizes)
        return chunks

    def rest(self) -> ChunkFrames | None:
        """The frames that wait, as the last chunk of their text span (None if none wait)."""
        pending = self._pending
        return pending.take(pending.count, ends_text_span=True) if pending.count else None

    def segment_end(self) -> ChunkFrames | None:
        """A segment ended: the frames that wait as a chunk of their own, and the schedule from its start."""
        chunk = self.rest()
        self._restart()
        return chunk
