"""What the voice-agent plugins share, free of any framework: the options every stream is started
with, and a stream's speech as a framework's player takes it.

`SpeechOptions` is the part of requests.StartOptions an agent sets (voice, language, style,
sampling); its language is the model's name, checked when the options are made. `Speech` turns a
stream's decoded chunks into `Handout`s, in the order a framework must take them: the words a
chunk's audio completes, then that audio as 16-bit PCM at the framework's rate. It notes when each
chunk was handed over (a PlayoutClock), from which a barge-in's played frames and a word's playout
time follow. Its words are those of the text as written: a `SpokenText` maps the words the stream timed
back through the plugin's text transforms. The text to speak goes to the stream through it, so that
a server that owes audio and stops sending any ends the iteration with SpeechStalled (stall.py). A
plugin keeps only its framework's glue: where the words and the audio go.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Generic, TypeVar

import numpy as np
from codecstream.client.languages import model_language
from codecstream.client.playout import PlayoutClock
from codecstream.client.plugins.spoken_text import SpokenText
from codecstream.client.plugins.stall import OwedAudio, SpeechStalled
from codecstream.client.requests import StartOptions
from codecstream.client.resample import StreamResampler
from codecstream.client.synthesis import AsyncAudioStream
from codecstream.protocol.pcm import to_pcm16
from codecstream.protocol.text_timing import WordTiming


@dataclasses.dataclass(frozen=True)
class SpeechOptions:
    """What a plugin starts each stream with (requests.StartOptions, the same names and types); ""
    and None leave the server's default. A language is stored as the model names it ("en-US" ->
    "English"); one the model does not speak is a ValueError here."""

    voice: str = ""
    language: str = ""
    instructions: str = ""
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "language", model_language(self.language))

    def start_options(self) -> StartOptions:
        return start_options(dataclasses.asdict(self))


#: The options a plugin exposes, in SpeechOptions' order.
OPTION_NAMES = tuple(field.name for field in dataclasses.fields(SpeechOptions))


def start_options(values: Mapping[str, Any]) -> StartOptions:
    """The plugin options among `values` that are set (neither None nor ""), as stream_text and
    synthesize take them; other keys are ignored (a framework's settings hold more)."""
    return {name: values[name] for name in OPTION_NAMES if values.get(name) not in (None, "")}


@dataclasses.dataclass(frozen=True)
class Handout:
    """One step of a stream's speech, to hand to the framework now: `words` first, then `audio`."""

    #: The words (as written) this audio completes (their times from the stream's first frame, not yet played out).
    words: list[WordTiming]
    #: 16-bit mono PCM at the framework's rate; may be empty (the resampler holds a few samples back).
    audio: bytes
    #: This is the stream's first chunk: a framework's time to first byte ends here.
    first: bool = False


StreamT = TypeVar("StreamT", bound=AsyncAudioStream)


class Speech(Generic[StreamT]):
    """One stream's speech on its way to a framework's player, which plays what it is handed in
    real time. Iterate it once, handing each Handout over as it comes; a streamed text's pieces go
    through `push_text`, `flush` and `end_input`. `stall_timeout_s`: how long the server may owe
    audio without sending any (stall.py); None: as long as it likes."""

    def __init__(
        self,
        stream: StreamT,
        sample_rate: int | None,
        text: SpokenText | None = None,
        clock: Callable[[], float] = time.monotonic,
        stall_timeout_s: float | None = None,
    ) -> None:
        self.stream = stream
        #: The stream's text as written and as spoken (the same without text transforms).
        self.text = text or SpokenText()
        #: When each chunk was handed over, by `clock`.
        self.playout = PlayoutClock()
        #: What the server owes of this stream, and since when (in real time: it bounds real waits).
        self.owed = OwedAudio(stall_timeout_s)
        if stream.text_complete:  # a whole text
            self.owed.text_sent(stream.text, ended=True)
        self._resampler = StreamResampler(sample_rate)
        self._clock = clock

    def push_text(self, spoken: str) -> None:
        """Send text to speak (a streamed text)."""
        self.stream.push_text(spoken)
        self.owed.text_sent(self.stream.text)

    def flush(self) -> None:
        """Speak what was sent now."""
        self.stream.flush()
        self.owed.text_sent(self.stream.text, flush=True)

    def end_input(self) -> None:
        """No more text: the stream ends once the rest is spoken."""
        self.stream.end_input()
        self.owed.text_sent(self.stream.text, ended=True)

    async def __aiter__(self) -> AsyncIterator[Handout]:
        first = True
        while True:
            try:
                chunk = await self.owed.bound(anext(self.stream))
            except StopAsyncIteration:
                break
            except SpeechStalled:
                # Dropped, not cancelled: a server that owes audio and sends none would not confirm a cancel either.
                self.stream.codes.abandon()
                raise
            self.owed.audio(chunk.text_end, chunk.ends_text_span)
            self.playout.handed(self._clock(), chunk.num_frames)
            yield Handout(self.text.written_words(self.stream.new_word_timings()), self._pcm16(chunk.samples), first)
            first = False
        # The words the stream's end completes (as far as it was heard), and the resampler's tail.
        words = self.text.written_words(self.stream.new_word_timings(), heard_to=self.stream.text_offset_played)
        tail = Handout(words, self._pcm16(np.zeros(0, dtype=np.float32), last=True))
        if tail.words or tail.audio:
            yield tail

    def played_frames(self) -> int:
        """Frames the listener has heard by now (what a cancel reports)."""
        return self.playout.played_frames(self._clock())

    def _pcm16(self, samples: np.ndarray, last: bool = False) -> bytes:
        return to_pcm16(self._resampler(samples, last=last)).tobytes()
