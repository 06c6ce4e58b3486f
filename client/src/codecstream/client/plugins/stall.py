"""The stall bound of a turn's speech: a server that owes audio and sends none ends the turn.

A voice agent must not stay silent because a server took its call and then stopped (an engine that
no longer steps, a process stopped): the turn ends with the framework's timeout error once the
server has owed audio for `timeout_s` without sending any. What the server owes follows from the
contract (synthesis.proto TextInput), as far as the client can tell it from the text it sent:

- the rest of the stream, once the input has ended (the whole text of `synthesize`);
- more of the span its last chunk spoke, when that chunk did not end it (`ends_text_span` false);
- the words of the text that it can speak and that no chunk has spoken yet, once there are two or
  more of them. Text it can speak is what the server speaks without waiting for more: up to a
  sentence end followed by white space, up to a flush. One word is left out: a growing request's
  talker keeps the frame of the last token it read until the next one comes (the server says so
  in engine/growing_generation.py), so a reply whose writer pauses after "Hello there." rightly
  has "there." unspoken.

So a pause of the LLM's, which leaves the server nothing to say, never ends a turn, and a server
that stalls does, whether before its first audio (the clock from the moment it had text to speak)
or between two chunks (from the later of the last chunk and that moment).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: A sentence end as synthesis.proto TextInput defines one, for the text the server was sent.
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s)|[。！？]+[”’」』）]*")


class SpeechStalled(TimeoutError):
    """The server owed audio for `timeout_s` and sent none (a TimeoutError, which frameworks
    classify as a connectivity failure)."""

    def __init__(self, timeout_s: float, audio_yet: bool) -> None:
        where = "more audio" if audio_yet else "audio"
        super().__init__(f"the server sent no {where} within {timeout_s:g} s of owing it")
        self.timeout_s = timeout_s


class OwedAudio:
    """What one stream's server owes, stepped by the text sent and the chunks received, and since
    when (by `clock`). `due()` is when the next chunk must have come; `timeout_s` None: never."""

    def __init__(self, timeout_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        #: The text sent so far (the spoken form), how far a flush made it speakable, its end.
        self._text = ""
        self._flushed_to = 0
        self._ended = False
        #: How far the chunks received spoke the text, whether the last one ended its span, when it came.
        self._spoken_to = 0
        self._span_open = False
        self._last_audio_at: float | None = None
        #: When the server began to owe audio it has not sent (None: it owes none).
        self._owed_since: float | None = None
        self._changed = asyncio.Event()

    def text_sent(self, text: str, *, flush: bool = False, ended: bool = False) -> None:
        """The stream's whole text sent so far (not a piece of it), after a flush or the input's end."""
        self._text = text
        if flush or ended:
            self._flushed_to = len(text)
        self._ended = self._ended or ended
        self._update()

    def audio(self, text_end: int, ends_text_span: bool) -> None:
        """A chunk came, speaking the text up to `text_end`."""
        self._spoken_to = max(self._spoken_to, text_end)
        self._span_open = not ends_text_span
        self._last_audio_at = self._clock()
        self._owed_since = None
        self._update()

    def owes(self) -> bool:
        if self._ended or self._span_open:
            return True
        sentence_end = 0
        for match in _SENTENCE_END.finditer(self._text, self._spoken_to):
            sentence_end = match.end()
        speakable = self._text[self._spoken_to : max(self._flushed_to, sentence_end)]
        return len(speakable.split()) >= 2

    def due(self) -> float | None:
        """When the next chunk must have come; None while the server owes nothing."""
        if self._owed_since is None or self.timeout_s is None:
            return None
        return self._owed_since + self.timeout_s

    async def bound(self, awaitable: Awaitable[T]) -> T:
        """`awaitable` (the stream's next chunk), unless the server owes audio past its due time:
        then it is cancelled and SpeechStalled raised."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                self._changed.clear()
                due = self.due()
                changed = asyncio.ensure_future(self._changed.wait())
                timeout = None if due is None else max(0.0, due - self._clock())
                try:
                    await asyncio.wait({task, changed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if task.done():
                    return task.result()
                if due is not None and self._clock() >= due:
                    raise SpeechStalled(due - self._owed_since, self._last_audio_at is not None)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _update(self) -> None:
        if not self.owes():
            self._owed_since = None
        elif self._owed_since is None:
            self._owed_since = self._clock()
        self._changed.set()
