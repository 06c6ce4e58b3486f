"""Where in the text the audio is: word timings and the heard offset, from the text spans chunks carry.

A chunk names the span of text the talker was conditioned on while generating its frames (a segment
of a streamed text, or the whole text). Within a span the characters are spread evenly over the
span's frames, so a word's time is an estimate from the talker's conditioning, not a forced
alignment. The server computes End.text_offset_played and the client its word timestamps with
the same functions, so both agree.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from codecstream.protocol.pcm import FRAME_SECONDS

_WORD = re.compile(r"\S+")


@dataclasses.dataclass(frozen=True)
class TextSpan:
    """Frames [first_frame, first_frame + frames) speak characters [text_start, text_end)."""

    first_frame: int
    frames: int
    text_start: int
    text_end: int


@dataclasses.dataclass(frozen=True)
class WordTiming:
    word: str
    #: Character offsets of the word in the text.
    text_start: int
    text_end: int
    #: Seconds from the first frame of the stream (frame 0 starts at 0 s).
    start_s: float
    end_s: float


def merge_spans(chunks: Iterable[tuple[int, int, int, int]]) -> list[TextSpan]:
    """Chunks as (first_frame, num_frames, text_start, text_end), in order, joined into one span
    per run of chunks with the same text."""
    spans: list[TextSpan] = []
    for first_frame, frames, text_start, text_end in chunks:
        last = spans[-1] if spans else None
        if last and (last.text_start, last.text_end) == (text_start, text_end):
            spans[-1] = dataclasses.replace(last, frames=last.frames + frames)
        else:
            spans.append(TextSpan(first_frame, frames, text_start, text_end))
    return spans


def word_timings(text: str, spans: Iterable[TextSpan]) -> list[WordTiming]:
    """Every word of every span, timed by spreading the span's characters over its frames."""
    timings = []
    for span in spans:
        length = max(1, span.text_end - span.text_start)
        seconds_per_char = span.frames * FRAME_SECONDS / length
        span_start_s = span.first_frame * FRAME_SECONDS
        for match in _WORD.finditer(text, span.text_start, span.text_end):
            timings.append(
                WordTiming(
                    word=match.group(),
                    text_start=match.start(),
                    text_end=match.end(),
                    start_s=span_start_s + (match.start() - span.text_start) * seconds_per_char,
                    end_s=span_start_s + (match.end() - span.text_start) * seconds_per_char,
                )
            )
    return timings


def text_offset_played(text: str, spans: Iterable[TextSpan], played_frames: int) -> int:
    """Characters heard after `played_frames` frames: every span played in full, then the whole
    words of the span being played that end within the frames played of it."""
    heard = 0
    played_s = played_frames * FRAME_SECONDS
    for span in spans:
        if span.first_frame + span.frames <= played_frames:
            heard = span.text_end
            continue
        for timing in word_timings(text, [span]):
            if timing.end_s <= played_s + 1e-9:
                heard = timing.text_end
        break
    return heard
