"""When a server owes audio (codecstream.client.plugins.stall): from the moment it has two or more
words it can speak that no chunk spoke, for as long as a span is unfinished, and always once the
input has ended; never while it waits for more text. A stream's next chunk is bounded by then
plus the timeout."""

from __future__ import annotations

import asyncio

import pytest
from codecstream.client.plugins.stall import OwedAudio, SpeechStalled


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def owed(timeout_s: float | None = 5.0) -> tuple[OwedAudio, Clock]:
    clock = Clock()
    return OwedAudio(timeout_s, clock), clock


def test_text_that_is_not_yet_speakable_owes_nothing():
    audio, _ = owed()
    audio.text_sent("Hello there, how are")  # no sentence end, no flush: the server may wait for more
    assert not audio.owes() and audio.due() is None


def test_a_sentence_end_makes_the_text_before_it_owed_from_that_moment():
    audio, clock = owed()
    audio.text_sent("Hello there")
    clock.now = 103.0
    audio.text_sent("Hello there. The")
    assert audio.owes() and audio.due() == 108.0


def test_one_word_left_unspoken_is_not_owed_a_talker_keeps_the_last_token_s_frame():
    audio, _ = owed()
    audio.text_sent("Hello there. How", flush=True)
    audio.audio(text_end=len("Hello there. "), ends_text_span=True)  # "How" is the last token read
    assert not audio.owes()
    audio.text_sent("Hello there. How are you? I")  # two words and a sentence end beyond the audio
    assert audio.owes()


def test_the_end_of_the_input_owes_the_rest_and_an_unfinished_span_owes_its_next_chunk():
    audio, clock = owed()
    audio.text_sent("Hi", ended=True)
    assert audio.owes()
    clock.now = 101.0
    audio.audio(text_end=2, ends_text_span=False)
    assert audio.due() == 106.0  # the next chunk, from the last one
    fresh, _ = owed()
    fresh.audio(text_end=0, ends_text_span=False)
    assert fresh.owes()


def test_a_timeout_of_none_never_ends_a_stream():
    audio, _ = owed(None)
    audio.text_sent("Hello there.", ended=True)
    assert audio.owes() and audio.due() is None


@pytest.mark.asyncio
async def test_the_next_chunk_that_does_not_come_by_its_due_time_is_a_stall_and_one_that_does_is_returned():
    audio = OwedAudio(0.05)
    assert await audio.bound(asyncio.sleep(0.2, "chunk")) == "chunk"  # nothing owed: no bound
    audio.text_sent("Hello there.", ended=True)
    assert await audio.bound(asyncio.sleep(0, "chunk")) == "chunk"
    waiting = asyncio.Event()
    with pytest.raises(SpeechStalled, match=r"no audio within 0\.05 s") as stalled:
        await audio.bound(waiting.wait())
    assert isinstance(stalled.value, TimeoutError)


@pytest.mark.asyncio
async def test_text_that_becomes_speakable_while_the_chunk_is_awaited_starts_the_clock():
    audio = OwedAudio(0.05)
    waiting = asyncio.Event()
    bounded = asyncio.ensure_future(audio.bound(waiting.wait()))
    await asyncio.sleep(0.1)  # nothing owed yet: still waiting
    assert not bounded.done()
    audio.text_sent("Hello there. The")
    with pytest.raises(SpeechStalled):
        await asyncio.wait_for(bounded, 5)
