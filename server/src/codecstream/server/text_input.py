"""The text of a streaming_text stream as it arrives: Start.text, then every TextInput.

The session pushes each TextInput here (checked against the contract's rules); whatever speaks
the text (segmenting.py) reads it and waits for more. Nothing here knows how the text is spoken.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import unicodedata

from codecstream.server.errors import TextInputViolation
from codecstream.server.limits import ServerLimits


def text_length_problem(chars: int, max_chars: int) -> str | None:
    """Why a text of `chars` characters is refused, or None: the one rule for Start.text and a
    streamed text's total."""
    if chars > max_chars:
        return f"text has {chars} characters, the limit is {max_chars}"
    return None


def speakable(text: str) -> bool:
    """Whether `text` holds anything to say: a character that is neither white space nor an
    invisible format character (zero-width space, joiners, direction marks)."""
    return any(not c.isspace() and unicodedata.category(c) != "Cf" for c in text)


class StreamedText:
    """Text received so far, where it was flushed, and whether the input ended.

    The input expires (the stream ends with End(ERROR)) after the limits' text_input_timeout_s
    without speakable text, or max_text_input_s after it opened without end_of_input: white space,
    flushes and invisible characters renew nothing, so a client cannot hold a stream for free."""

    def __init__(self, first_piece: str, limits: ServerLimits, clock=time.monotonic) -> None:
        self._max_chars = limits.max_text_chars
        self._input_timeout_s = limits.text_input_timeout_s
        self._max_input_s = limits.max_text_input_s
        self._clock = clock
        self._changed = asyncio.Event()
        self.text = ""
        #: Every offset a flush or end_of_input marked, ascending: text before each is to be spoken
        #: now, even a partial clause, and a segment ends there. All are kept (not only the last):
        #: the next text may arrive before the speaker looks.
        self.flushes: list[int] = []
        self.ended = False
        self.opened_at = clock()
        #: When speakable text last arrived (the clock's time).
        self.last_text_at = self.opened_at
        if first_piece:
            self.push(first_piece, flush=False, end_of_input=False)

    def push(self, text: str, flush: bool, end_of_input: bool) -> None:
        """Append one TextInput; raise TextInputViolation for one the contract forbids."""
        if self.ended:
            if text:
                raise TextInputViolation("text after end_of_input")
            return  # a repeated end_of_input (or flush) says nothing new
        if not text and not (flush or end_of_input):
            raise TextInputViolation("a text input with empty text and neither flush nor end_of_input")
        problem = text_length_problem(len(self.text) + len(text), self._max_chars)
        if problem:
            raise TextInputViolation(problem)
        self.text += text
        if speakable(text):
            self.last_text_at = self._clock()
        if (flush or end_of_input) and self.flushed_to < len(self.text):
            self.flushes.append(len(self.text))
        self.ended = end_of_input
        self.wake()

    @property
    def flushed_to(self) -> int:
        """Text before this offset is to be spoken now (the last flush or the end of the input)."""
        return self.flushes[-1] if self.flushes else 0

    def input_time_left(self, engine_wait_s: float | None = None) -> tuple[float, str]:
        """Seconds until the input expires unless speakable text (or its end) arrives, and why it
        would expire. `engine_wait_s`: the engine holds a request for this text, which may wait
        that long for more (ServerLimits.max_engine_wait_s)."""
        now = self._clock()
        quiet_left = self.last_text_at + self._input_timeout_s - now
        life_left = self.opened_at + self._max_input_s - now
        held_left = self.last_text_at + engine_wait_s - now if engine_wait_s is not None else quiet_left
        if life_left < min(quiet_left, held_left):
            return life_left, f"text input expired: it did not end within {self._max_input_s:g} s"
        if held_left < quiet_left:
            return held_left, f"text input expired: no text for {engine_wait_s:g} s while the engine held its request"
        return quiet_left, f"text input expired: no text for {self._input_timeout_s:g} s and no end_of_input"

    def wake(self) -> None:
        """Wake whoever waits in `changed` (new text, or a reader that must stop waiting)."""
        self._changed.set()

    async def changed(self, timeout_s: float) -> None:
        """Return after the next push or wake, or after `timeout_s`."""
        self._changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)
