"""Where in the text the audio is: word timings and the heard offset, from the text spans chunks carry.

A chunk names the span of text the talker was conditioned on while generating its frames: in a
growing streamed text the tokens its own frames read (the span ends with the chunk), in segments
the segment, otherwise the whole text (chunks share the span until the one that ends it). A
span's characters are spread evenly over its frames, so a word's time is an estimate from the
talker's conditioning, not a forced alignment. While a span is still being spoken its length in
frames is not known yet: it is taken as the larger of the frames so far and a typical speaking
rate (`expected_frames`), so that words can be released with the audio they describe instead of
a segment later. Words released once are never moved: the rest of a span is spread over what is
left of it.

`WordClock` is fed every chunk in order and returns the words whose audio has arrived. The server
feeds it the chunks it sends and answers End.text_offset_played from it, the client feeds it the
chunks it receives, so both release the same words at the same chunks and agree on what was heard.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata

from codecstream.protocol.decoding import FRAME_SECONDS, FRAMES_PER_SECOND

_WORD = re.compile(r"\S+")
#: Typical speaking rates, as frames per character: alphabetic scripts about 14 characters per
#: second, CJK about 4 (the rates of conversational speech; an estimate for spans still being
#: spoken, replaced by the span's real length once it ends).
FRAMES_PER_CHAR = FRAMES_PER_SECOND / 14
FRAMES_PER_CJK_CHAR = FRAMES_PER_SECOND / 4
#: Slack when comparing frame positions computed in floating point.
_EPSILON = 1e-6


def _is_cjk(char: str) -> bool:
    return unicodedata.east_asian_width(char) in ("W", "F") and char.isalpha()


def expected_frames(text: str) -> float:
    """Frames a speaker typically takes for `text` (FRAMES_PER_CHAR, FRAMES_PER_CJK_CHAR)."""
    cjk = sum(1 for char in text if _is_cjk(char))
    return cjk * FRAMES_PER_CJK_CHAR + (len(text) - cjk) * FRAMES_PER_CHAR


@dataclasses.dataclass(frozen=True)
class WordTiming:
    word: str
    #: Character offsets of the word in the text.
    text_start: int
    text_end: int
    #: Seconds from the first frame of the stream (frame 0 starts at 0 s).
    start_s: float
    end_s: float


@dataclasses.dataclass
class _Span:
    """Frames [first_frame, first_frame + frames) speak characters [text_start, text_end);
    characters before `timed_char` are timed and end at frame `timed_frame`."""

    first_frame: int
    frames: int
    text_start: int
    text_end: int
    ended: bool
    timed_char: int
    timed_frame: float

    @property
    def last_frame(self) -> int:
        return self.first_frame + self.frames

    def frame_of(self, char: int, text: str) -> float:
        """Where character offset `char` (at or after `timed_char`) falls, in frames."""
        end = self.last_frame
        if not self.ended:  # still being spoken: at least as long as its untimed text takes
            end = max(end, self.timed_frame + expected_frames(text[self.timed_char : self.text_end]))
        chars = self.text_end - self.timed_char
        if chars <= 0:
            return max(self.timed_frame, end) if char > self.timed_char else self.timed_frame
        return self.timed_frame + (char - self.timed_char) * (end - self.timed_frame) / chars


class WordClock:
    """Word timings released as a stream's chunks arrive: `add` every chunk in order and get the
    words whose audio (their last character) has arrived with it, in text order; `end` once the
    stream is over; `heard` for the characters heard after some frames were played."""

    def __init__(self) -> None:
        self._spans: list[_Span] = []
        self._frames = 0
        self._next_char = 0  # words that start before this offset were released
        #: Every word released so far, in order.
        self.words: list[WordTiming] = []

    def add(
        self,
        text: str,
        first_frame: int,
        num_frames: int,
        text_start: int,
        text_end: int,
        ends_span: bool,
        text_complete: bool = False,
    ) -> list[WordTiming]:
        """A chunk of `num_frames` frames speaking characters [text_start, text_end) of `text` (the
        text received so far); `ends_span`: no later chunk speaks more of that span;
        `text_complete`: no text follows `text` (else its last word may still go on)."""
        last = self._spans[-1] if self._spans else None
        if last is not None and not last.ended and (last.text_start, last.text_end) == (text_start, text_end):
            last.frames += num_frames
            last.ended = ends_span
        else:
            if last is not None:
                last.ended = True  # a chunk with other text follows it
            span = _Span(first_frame, num_frames, text_start, text_end, ends_span, text_start, float(first_frame))
            self._spans.append(span)
        self._frames = first_frame + num_frames
        return self._release(text, text_complete)

    def end(self, text: str) -> list[WordTiming]:
        """The stream is over: every span is complete; the words not yet released."""
        for span in self._spans:
            span.ended = True
        return self._release(text, text_complete=True)

    def heard(self, played_frames: int) -> int:
        """Characters of the text heard after `played_frames` frames: up to the end of the last
        released word that ends within them."""
        played_s = played_frames * FRAME_SECONDS + _EPSILON
        heard = 0
        for word in self.words:
            if word.end_s > played_s:
                break
            heard = word.text_end
        return heard

    def _release(self, text: str, text_complete: bool) -> list[WordTiming]:
        released = []
        for match in _WORD.finditer(text, self._next_char):
            start, end = match.span()
            if end == len(text) and not text_complete:
                break  # the word may go on in text not received yet
            first = self._span_holding(start, at_end=False)
            last = self._span_holding(end, at_end=True)
            if first is None or last is None:
                break  # not spoken yet
            start_frame = first.frame_of(start, text)
            end_frame = last.frame_of(end, text)
            if end_frame > self._frames + _EPSILON:
                break  # its audio has not all arrived
            for span in self._spans:
                if span is last:
                    span.timed_char, span.timed_frame = end, end_frame
                    break
                span.timed_char, span.timed_frame = span.text_end, float(span.last_frame)
            word = WordTiming(match.group(), start, end, start_frame * FRAME_SECONDS, end_frame * FRAME_SECONDS)
            released.append(word)
            self._next_char = end
        self.words += released
        return released

    def _span_holding(self, char: int, at_end: bool) -> _Span | None:
        """The span whose text holds the character before (`at_end`) or at offset `char`."""
        for span in self._spans:
            if span.text_start < char <= span.text_end if at_end else span.text_start <= char < span.text_end:
                return span
        return None
