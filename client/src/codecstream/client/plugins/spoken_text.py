"""A turn's text as written and as spoken: text transforms applied on the client, and the words the
stream times mapped back to the text as written.

An application fixes pronunciation by rewriting the text before it is spoken ("Metformin" -> "met
for min", "$42.50" -> "forty two dollars fifty"). Done on the server, the words it timed would be
the rewritten ones and nothing could map them back; done here, the plugin knows both texts, so the
framework is told the words as written, timed where their spoken form is heard, and a barge-in's
heard text is a part of what was written (the approach pipecat-ai issue 4879 recommends over a
server-side dictionary).

Transforms see whole words, never a part of one: text is held back from the last white space on
until the next white space, a flush or the end of the input (the server holds an unfinished word
anyway, so this costs no time). The two texts are aligned by a character diff of each released
piece, word by word: words (and white space) a transform left alone map one to one, and what it
rewrote maps as one block, which counts as spoken only once all of its spoken form is (a cancel in
the middle of "met for min" has not heard "Metformin").
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
import inspect
import re
from collections.abc import Awaitable, Callable, Sequence

from codecstream.protocol.text_timing import WordTiming

#: Text as written in, text to speak out; may be async.
TextTransform = Callable[[str], str | Awaitable[str]]

_WORD = re.compile(r"\S+")  # a word as codecstream.protocol.text_timing splits words
_TOKEN = re.compile(r"\S+|\s+")


@dataclasses.dataclass(frozen=True)
class _Block:
    """Written characters [written_start, written_end) are spoken as [spoken_start, spoken_end);
    `same`: one to one (a transform left them alone), else rewritten as a whole."""

    written_start: int
    written_end: int
    spoken_start: int
    spoken_end: int
    same: bool


class SpokenText:
    """One stream's text: `push` the text as written and send what it returns; `written_words` turns
    the words the stream timed into the words as written. Without transforms both texts are one."""

    def __init__(self, transforms: Sequence[TextTransform] = ()) -> None:
        self._transforms = list(transforms)
        #: The text as written so far, the part held back (an unfinished word) included.
        self.written = ""
        #: The text sent to be spoken so far.
        self.spoken = ""
        #: Where the written text held back begins.
        self._released = 0
        self._blocks: list[_Block] = []
        self._block_ends: list[int] = []  # each block's spoken_end, for bisect
        #: Written words before this offset were handed out.
        self._reported = 0
        #: When the spoken words since the last written word handed out began.
        self._pending_start_s: float | None = None
        self._last_end_s = 0.0

    async def push(self, text: str, *, complete: bool = False) -> str:
        """Take `text` as written; return what to send to the server now (may be ""). Unless
        `complete` (a flush, a whole sentence, the end of the input), an unfinished last word is held
        back. A transform's exception propagates, and the text it failed on is dropped: neither
        spoken nor written (speaking it untransformed may not be safe)."""
        if not self._transforms:
            self.written += text
            self.spoken += text
            self._released = len(self.written)
            return text
        held = self.written[self._released :] + text
        cut = len(held) if complete else _after_last_space(held)
        release = held[:cut]
        if not release:
            self.written += text
            return ""
        try:
            spoken = await self._transform(release)
        except BaseException:
            self.written = self.written[: self._released] + held[cut:]
            raise
        self._align(release, spoken)
        self.written = self.written[: self._released] + held
        self._released += len(release)
        self.spoken += spoken
        return spoken

    async def flush(self) -> str:
        """Release what is held back (a flush or the end of the input); return what to send."""
        return await self.push("", complete=True)

    def written_offset(self, spoken_offset: int) -> int:
        """How far into the written text a listener who heard `spoken_offset` characters of the
        spoken text has heard: a rewritten block counts only once all of it was heard."""
        if not self._transforms:
            return spoken_offset
        index = bisect.bisect_right(self._block_ends, spoken_offset)
        reached = self._blocks[index - 1].written_end if index else 0
        if index < len(self._blocks):
            block = self._blocks[index]
            if block.same and block.spoken_start < spoken_offset:
                reached = block.written_start + spoken_offset - block.spoken_start
        return reached

    def written_words(self, spoken: list[WordTiming], heard_to: int | None = None) -> list[WordTiming]:
        """The written words that `spoken` (timed words of the spoken text, in order) complete, timed
        from the first spoken word since the last written word to the end of the one completing it
        (several completed at once share that time by their characters). `heard_to`: the spoken text
        was heard to this offset (the stream's End.text_offset_played); the written words it covers
        are handed out too, for a rewrite that left a word nothing spoken (an emoji dropped)."""
        if not self._transforms:
            return spoken
        words: list[WordTiming] = []
        for word in spoken:
            if self._pending_start_s is None:
                self._pending_start_s = word.start_s
            words += self._complete(self.written_offset(word.text_end), word.end_s)
            self._last_end_s = word.end_s
        if heard_to is not None:
            words += self._complete(self.written_offset(heard_to), self._last_end_s)
        return words

    def _complete(self, written_to: int, end_s: float) -> list[WordTiming]:
        found = []
        for match in _WORD.finditer(self.written, self._reported):
            if match.end() > written_to:
                break
            found.append(match)
        if not found:
            return []
        first_s = self._pending_start_s if self._pending_start_s is not None else end_s
        chars = sum(len(m.group()) for m in found)
        words, done, start_s = [], 0, first_s
        for match in found:
            done += len(match.group())
            word_end_s = end_s if done == chars else first_s + (end_s - first_s) * done / chars
            words.append(WordTiming(match.group(), match.start(), match.end(), start_s, word_end_s))
            start_s = word_end_s
        self._reported = found[-1].end()
        self._pending_start_s = None
        return words

    async def _transform(self, text: str) -> str:
        for transform in self._transforms:
            text = transform(text)
            if inspect.isawaitable(text):
                text = await text
        return text

    def _align(self, written: str, spoken: str) -> None:
        # Words and white space are diffed as wholes: a character diff matched "et", "for" and "min"
        # of "Metformin" inside "met for min", so a listener cut off after "for" had heard "Metfor".
        written_tokens, spoken_tokens = _TOKEN.findall(written), _TOKEN.findall(spoken)
        written_at = _offsets(written_tokens, self._released)
        spoken_at = _offsets(spoken_tokens, len(self.spoken))
        matcher = difflib.SequenceMatcher(None, written_tokens, spoken_tokens, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            block = _Block(written_at[i1], written_at[i2], spoken_at[j1], spoken_at[j2], tag == "equal")
            self._blocks.append(block)
            self._block_ends.append(block.spoken_end)


def _offsets(tokens: list[str], start: int) -> list[int]:
    """Where each token begins, from `start`, and where the last one ends."""
    offsets = [start]
    for token in tokens:
        offsets.append(offsets[-1] + len(token))
    return offsets


def _after_last_space(text: str) -> int:
    """The offset just after `text`'s last white space (0 if it has none)."""
    for index in range(len(text) - 1, -1, -1):
        if text[index].isspace():
            return index + 1
    return 0
