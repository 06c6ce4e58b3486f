"""The plugins' framework-free half (codecstream.client.plugins.speech): the options every stream is
started with are requests.StartOptions' own, checked when made; a stream's chunks reach a framework
as words, then the audio that completes them, as 16-bit PCM at the framework's rate; the frames
reported played are what real time allowed since the first hand-over."""

from __future__ import annotations

import dataclasses
import typing

import numpy as np
import pytest

pytest.importorskip("soxr", reason="the plugins' extras: pip install './client[pipecat]' or './client[livekit]'")

from codecstream.client.plugins.speech import OPTION_NAMES, Speech, SpeechOptions, start_options
from codecstream.client.requests import StartOptions
from codecstream.client.resample import StreamResampler
from codecstream.protocol.decoding import SAMPLE_RATE_HZ, SAMPLES_PER_FRAME
from codecstream.protocol.pcm import to_pcm16
from codecstream.protocol.text_timing import WordTiming

TEXT = "Hello there. The train leaves."


def word(start: int, end: int, start_s: float) -> WordTiming:
    return WordTiming(TEXT[start:end], start, end, start_s, start_s + 0.2)


class ScriptedStream:
    """A decoded stream played back from a script: its chunks, each with the words its audio
    completed, then the words its end completed."""

    def __init__(self, frames: list[int], words: list[list[WordTiming]], words_at_end: list[WordTiming]) -> None:
        phase = np.arange(sum(frames) * SAMPLES_PER_FRAME) * 2 * np.pi * 440 / SAMPLE_RATE_HZ
        tone = 0.5 * np.sin(phase).astype(np.float32)
        self.samples = np.split(tone, np.cumsum(frames)[:-1] * SAMPLES_PER_FRAME)
        self._script = list(zip(frames, self.samples, words, strict=True))
        self._pending: list[WordTiming] = []
        self._words_at_end = words_at_end
        self.text = TEXT
        self.text_complete = True
        self.text_offset_played = len(TEXT)

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self._script:
            self._pending, self._words_at_end = self._words_at_end, []
            raise StopAsyncIteration
        frames, samples, self._pending = self._script.pop(0)
        return _Chunk(frames, samples)

    def new_word_timings(self) -> list[WordTiming]:
        words, self._pending = self._pending, []
        return words


@dataclasses.dataclass
class _Chunk:
    num_frames: int
    samples: np.ndarray
    text_end: int = 0
    ends_text_span: bool = True


def scripted() -> ScriptedStream:
    hello, there, the = word(0, 5, 0.0), word(6, 12, 0.3), word(13, 16, 0.6)
    train, leaves = word(17, 22, 0.8), word(23, 30, 1.0)
    return ScriptedStream([1, 2, 4], [[hello], [], [there, the, train]], [leaves])


async def handouts(speech: Speech) -> list:
    return [handout async for handout in speech]


@pytest.mark.asyncio
async def test_each_chunk_s_words_come_before_its_audio_and_the_end_s_words_after_the_last():
    stream = scripted()
    out = await handouts(Speech(stream, 24_000))
    assert [[w.word for w in h.words] for h in out] == [["Hello"], [], ["there.", "The", "train"], ["leaves."]]
    assert [h.first for h in out] == [True, False, False, False]
    # At the decoder's rate the audio is the chunk's own samples, as 16-bit PCM; the end adds none.
    assert [h.audio for h in out[:3]] == [to_pcm16(samples).tobytes() for samples in stream.samples]
    assert out[3].audio == b""


@pytest.mark.asyncio
@pytest.mark.parametrize("rate", [16_000, 8_000])
async def test_at_another_rate_the_same_words_come_with_the_whole_stream_resampled(rate):
    at_24k, resampled = await handouts(Speech(scripted(), 24_000)), await handouts(Speech(scripted(), rate))
    assert [h.words for h in resampled] == [h.words for h in at_24k]
    pcm = b"".join(h.audio for h in resampled)
    assert len(pcm) == 7 * SAMPLES_PER_FRAME * rate // 24_000 * 2  # 7 frames of 80 ms, 16-bit
    # Chunk by chunk, the resampler's tail included, as the whole stream resampled at once.
    assert pcm == to_pcm16(StreamResampler(rate)(np.concatenate(scripted().samples), last=True)).tobytes()


@pytest.mark.asyncio
async def test_the_frames_played_are_what_real_time_allowed_since_the_first_hand_over_not_those_handed():
    # Chunks of 1, 2 and 4 frames handed at 10.0, 10.05 and 10.1 s; at 10.2 s real time has played
    # the first frame and 1.5 of the next two (0.2 s of 80 ms frames).
    clock = iter([10.0, 10.05, 10.1, 10.2])
    speech = Speech(scripted(), 24_000, clock=lambda: next(clock))
    await handouts(speech)
    assert speech.playout.handed_frames == 7
    assert speech.played_frames() == 2


def test_options_start_a_stream_with_what_was_set_and_the_language_as_the_model_names_it():
    options = SpeechOptions(voice="ryan", language="pt_BR", instructions="", seed=0, temperature=0.5)
    assert options.start_options() == {"voice": "ryan", "language": "Portuguese", "seed": 0, "temperature": 0.5}


def test_a_language_the_model_does_not_speak_is_refused_and_the_options_keep_the_last():
    options = SpeechOptions(language="en-US")
    with pytest.raises(ValueError, match=r"does not speak 'ar'; it speaks Chinese \(zh\)"):
        dataclasses.replace(options, language="ar")
    assert options.language == "English"
    with pytest.raises(ValueError, match="does not speak 'xx'"):
        SpeechOptions(language="xx")


def test_a_framework_s_settings_give_only_the_options_they_set():
    settings = {"model": None, "voice": "", "language": None, "top_k": 5, "speed": 1.2, "extra": {}}
    assert start_options(settings) == {"top_k": 5}


def test_every_plugin_option_is_a_start_option_of_the_same_type():
    # The plugins expose part of requests.StartOptions, not a second option set beside it.
    start_types = typing.get_type_hints(StartOptions)
    assert typing.get_type_hints(SpeechOptions) == {name: start_types[name] for name in OPTION_NAMES}
