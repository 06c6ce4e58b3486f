"""The text of a streaming_text stream as it arrives: Start.text, then every TextInput.

The session pushes each TextInput here (checked against the contract's rules); whatever speaks
the text (segmenting.py) reads it and waits for more. Nothing here knows how the text is spoken.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from codecstream.server.errors import TextInputViolation


def text_length_problem(chars: int, max_chars: int) -> str | None:
    """Why a text of `chars` characters is refused, or None: the one rule for Start.text and a
    streamed text's total."""
    if chars > max_chars:
        return f"text has {chars} characters, the limit is {max_chars}"
    return None


class StreamedText:
    """Text received so far, where it was flushed, and whether the input ended."""

    def __init__(self, first_piece: str, max_chars: int, clock=time.monotonic) -> None:
        self._max_chars = max_chars
        self._clock = clock
        self._changed = asyncio.Event()
        self.text = ""
        #: Text before this offset is to be spoken now, even a partial clause (flush, end_of_input).
        self.flushed_to = 0
        self.ended = False
        #: When text last arrived (the clock's time).
        self.last_text_at = clock()
        if first_piece:
            self.push(first_piece, flush=False, end_of_input=False)

    def push(self, text: str, flush: bool, end_of_input: bool) -> None:
        """Append one TextInput; raise TextInputViolation for one the contract forbids."""
        if self.ended:
            raise TextInputViolation("text after end_of_input")
        if not text and not (flush or end_of_input):
            raise TextInputViolation("a text input with empty text and neither flush nor end_of_input")
        problem = text_length_problem(len(self.text) + len(text), self._max_chars)
        if problem:
            raise TextInputViolation(problem)
        if text:
            self.text += text
            self.last_text_at = self._clock()
        if flush or end_of_input:
            self.flushed_to = len(self.text)
        self.ended = end_of_input
        self.wake()

    def wake(self) -> None:
        """Wake whoever waits in `changed` (new text, or a reader that must stop waiting)."""
        self._changed.set()

    async def changed(self, timeout_s: float) -> None:
        """Return after the next push or wake, or after `timeout_s`."""
        self._changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)
