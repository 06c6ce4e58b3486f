"""Streamed text is one growing talker request: its codes do not depend on when the text arrives.

On the tiny random talker with a fixed seed, a streamed text's codes are byte-identical to the same
text given whole before the first step (in the same streaming-text mode), however it arrives: at LLM
speeds, cut at random characters, with a pause mid-word. The engine itself counts one request per
stream, no step while a request waits for text, and the same steps as the whole text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import re
import time

import numpy as np
import pytest
from codecstream.protocol.decoding import NUM_CODEBOOKS
from codecstream.server.errors import GenerationFailed, TextInputExpired
from codecstream.server.limits import ServerLimits
from codecstream.server.request import SynthesisRequest
from codecstream.server.source import Finished, FinishReason, Frames, SegmentEnd
from codecstream.server.text_input import StreamedText

REPLY = "Sure, I can help with that. The next train to the airport leaves at nine, from platform four."
SEED = 11


def llm_tokens(text: str) -> list[str]:
    """LLM-like pieces: words with their leading space, punctuation on its own."""
    return re.findall(r" ?[\w']+| ?[^\w\s]", text)


def random_cuts(text: str, cuts: int, seed: int) -> list[str]:
    points = sorted(random.Random(seed).sample(range(1, len(text)), cuts))
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@dataclasses.dataclass
class Spoken:
    codes: np.ndarray
    #: (text_start, text_end) of every frame.
    spans: list[tuple[int, int]]
    finished: Finished | None
    #: What the engine counted: decode steps, schedules the request was held at.
    counts: dict[str, int]
    #: Seconds from the open to each frame.
    frame_times: list[float]
    #: Frames generated when the generation said "send what you have" (SegmentEnd).
    flushes: list[int]


async def speak(
    source, pieces: list[tuple], stream_id: str, seed: int = SEED, first_frame: asyncio.Event | None = None
) -> Spoken:
    """Stream `pieces` (text, seconds to wait after it, and optionally whether a flush follows it)
    into one generation, the last with end_of_input; read it to its end. `first_frame` is set when
    its first frame arrives."""
    text = StreamedText("", ServerLimits())
    request = SynthesisRequest(text="", voice="ryan", seed=seed, max_frames=600, streamed_text=text)
    generation = await source.open_streamed(request, stream_id, ServerLimits())

    async def write() -> None:
        for index, (piece, pause, *flush) in enumerate(pieces):
            text.push(piece, flush=bool(flush and flush[0]), end_of_input=index == len(pieces) - 1)
            if pause:
                await asyncio.sleep(pause)

    writer = asyncio.create_task(write())
    codes, spans, finished, times, flushes = [], [], None, [], []
    started = time.monotonic()
    async for event in generation:
        if isinstance(event, Frames):
            if first_frame is not None:
                first_frame.set()
            codes.append(event.codes)
            spans.append((event.text_start, event.text_end))
            times.append(time.monotonic() - started)
        elif isinstance(event, SegmentEnd):
            flushes.append(len(codes))
        elif isinstance(event, Finished):
            finished = event
    writer.cancel()
    codes = np.concatenate(codes) if codes else np.zeros((0, NUM_CODEBOOKS), np.int16)
    return Spoken(codes, spans, finished, generation.engine_counts, times, flushes)


@pytest.fixture(scope="module")
def whole(talker_engine):
    """The reply given whole before the first step: what every arrival must reproduce."""
    return talker_engine.run(speak(talker_engine.source, [(REPLY, 0.0)], "whole"))


def paced(rate_per_s: float) -> list[tuple[str, float]]:
    return [(token, 1.0 / rate_per_s) for token in llm_tokens(REPLY)]


ARRIVALS = {
    "100 tokens/s": paced(100),
    "15 tokens/s": paced(15),
    "3 tokens/s": paced(3),
    "20 random cuts": [(piece, 0.05) for piece in random_cuts(REPLY, 20, seed=5)],
    "2 s pause inside a word": [(REPLY[: REPLY.index("leaves") + 3], 2.0), (REPLY[REPLY.index("leaves") + 3 :], 0.0)],
}


def test_the_whole_reply_ends_at_eos_after_every_character_was_read(whole):
    assert whole.finished.reason is FinishReason.EOS
    # One text token per frame, and EOS only after the talker has read the end of the text.
    assert len(whole.codes) > len(llm_tokens(REPLY))
    assert whole.spans[-1] == (len(REPLY), len(REPLY))


@pytest.mark.parametrize("arrival", list(ARRIVALS), ids=list(ARRIVALS))
def test_streamed_codes_are_byte_identical_to_the_whole_text_however_it_arrives(talker_engine, whole, arrival):
    opened = talker_engine.run(talker_engine.source.growing_requests_opened())
    spoken = talker_engine.run(
        speak(talker_engine.source, ARRIVALS[arrival], "arrival-" + re.sub(r"\W+", "-", arrival))
    )
    assert spoken.finished.reason is FinishReason.EOS
    assert spoken.codes.shape == whole.codes.shape
    assert spoken.codes.tobytes() == whole.codes.tobytes()
    assert spoken.spans == whole.spans
    # Counted by the engine: one request for the whole stream, and exactly the whole text's steps.
    assert talker_engine.run(talker_engine.source.growing_requests_opened()) == opened + 1
    assert spoken.counts["decode_steps"] == whole.counts["decode_steps"]


def test_a_flush_commits_only_the_text_before_it_though_more_came_in_the_same_burst(talker_engine):
    # A flushed sentence and half a word after it arrive before the request reads them: the flush
    # used to apply to both, committing "assis" as a word. ("assistant" is one token of the test
    # checkpoints' tokenizer, so a word cut in two gives other tokens and other codes.)
    text = "Sure, I can help with that.\nassistant will see you now."
    cut = text.index("tant")
    whole = talker_engine.run(speak(talker_engine.source, [(text, 0.0)], "flush-whole"))
    spoken = talker_engine.run(
        speak(
            talker_engine.source,
            [(text[: text.index("\n")], 0.0, True), (text[text.index("\n") : cut], 0.3), (text[cut:], 0.0)],
            "flush-burst",
        )
    )
    assert spoken.finished.reason is FinishReason.EOS
    assert spoken.codes.tobytes() == whole.codes.tobytes()
    assert spoken.spans == whole.spans


#: Accents written decomposed (a letter, then a combining mark: NFC composes them), CJK and an emoji.
ACCENTED = "Cre\u0300me bru\u0302le\u0301e au cafe\u0301, s'il vous pla\u0131\u0302t. 你好，世界！ 🙂 Done."


def test_non_ascii_text_cut_between_a_letter_and_its_accent_gives_the_same_codes(talker_engine):
    source = talker_engine.source
    reference = talker_engine.run(speak(source, [(ACCENTED, 0.0)], "accented-whole"))
    marks = [index for index, char in enumerate(ACCENTED) if char in "\u0300\u0301\u0302"]
    cuts = sorted(set(marks) | set(random.Random(7).sample(range(1, len(ACCENTED)), 12)))
    pieces = [(ACCENTED[a:b], 0.05) for a, b in zip([0, *cuts], [*cuts, len(ACCENTED)], strict=True)]
    spoken = talker_engine.run(speak(source, pieces, "accented-cut"))
    assert spoken.codes.tobytes() == reference.codes.tobytes() and len(reference.codes) > 0
    # Spans are offsets into the text as received (decomposed), in order, ending at its end.
    assert spoken.spans == reference.spans
    assert [end for _, end in spoken.spans] == sorted(end for _, end in spoken.spans)
    assert spoken.spans[-1] == (len(ACCENTED), len(ACCENTED))


def test_a_request_waiting_for_text_is_held_without_a_step(talker_engine, whole):
    # Cut early: the talker reads the first 13 characters long before the 6 s are over, even beside
    # an export or another engine busy on the other core (a fresh clone exports while this runs).
    cut = REPLY.index("help") + 2
    pieces = [(REPLY[:cut], 6.0), (REPLY[cut:], 0.0)]
    spoken = talker_engine.run(speak(talker_engine.source, pieces, "held"))
    assert spoken.codes.tobytes() == whole.codes.tobytes()
    # The engine held it at schedules while the text was missing, and those cost no decode step.
    assert spoken.counts["held_schedules"] > 0
    assert spoken.counts["decode_steps"] == whole.counts["decode_steps"]
    # Frames stopped at the text it had: no frame is conditioned on text that had not arrived.
    before_pause = [span for span, at in zip(spoken.spans, spoken.frame_times, strict=True) if at < 1.5]
    assert before_pause and all(end <= cut for _, end in before_pause)
    # Where it waited, the frames made so far were let go as a chunk (none wait in a half chunk).
    assert spoken.flushes and whole.flushes == []
    assert spoken.spans[spoken.flushes[0] - 1][1] <= cut


def test_each_frame_names_the_characters_of_its_text_token(whole):
    ends = [end for _, end in whole.spans]
    assert ends == sorted(ends)
    # Frame k speaks token k: the spans tile the reply from its first character, in order.
    spoken = [(start, end) for start, end in whole.spans if end > start]
    assert spoken[0][0] == 0 and spoken[-1][1] == len(REPLY)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spoken))


@pytest.mark.parametrize("moment", ["while paused", "while generating"])
def test_a_cancel_ends_the_request_within_one_step(talker_engine, moment):
    source = talker_engine.source

    async def run() -> tuple[Finished, float]:
        text = StreamedText("", ServerLimits())
        request = SynthesisRequest(text="", voice="ryan", seed=SEED, max_frames=600, streamed_text=text)
        generation = await source.open_streamed(request, f"cancel-{moment}", ServerLimits())
        text.push(REPLY[:40] if moment == "while paused" else REPLY, flush=False, end_of_input=moment != "while paused")
        events = aiter(generation)
        frames, waiting = 0, False
        # While paused: until SegmentEnd, the talker read its 40 characters and waits for more.
        while frames < 8 or (moment == "while paused" and not waiting):
            event = await anext(events)
            frames += len(event.codes) if isinstance(event, Frames) else 0
            waiting = waiting or isinstance(event, SegmentEnd)
        asked = time.monotonic()
        await generation.abort()
        async for event in events:
            if isinstance(event, Finished):
                return event, time.monotonic() - asked
        raise AssertionError("no Finished after the abort")

    finished, seconds = talker_engine.run(run())
    assert finished.reason is FinishReason.ABORTED
    assert seconds < 5.0  # generous: one step of the tiny talker takes milliseconds
    assert talker_engine.wait_for_no_live_requests() == 0


def test_a_neighbouring_whole_text_request_is_byte_identical_to_a_quiet_server(talker_engine):
    source = talker_engine.source
    neighbour = SynthesisRequest(text="A quiet sentence beside a streamed reply.", voice="ryan", seed=3, max_frames=80)
    quiet = talker_engine.collect(neighbour, "neighbour-quiet").codes

    async def beside() -> np.ndarray:
        speaking = asyncio.Event()
        streamed = asyncio.create_task(speak(source, paced(15), "neighbour-stream", first_frame=speaking))
        await asyncio.wait_for(speaking.wait(), 60)  # the streamed reply is in the engine's batch
        generation = await source.open(neighbour, "neighbour-busy")
        codes = [event.codes async for event in generation if isinstance(event, Frames)]
        await streamed
        return np.concatenate(codes)

    assert talker_engine.run(beside()).tobytes() == quiet.tobytes()


@pytest.mark.parametrize("nothing", ["   ", "\u200b\u200d\u2060 "], ids=["spaces", "invisible"])
def test_a_text_with_nothing_to_say_ends_without_an_engine_step(talker_engine, nothing):
    spoken = talker_engine.run(speak(talker_engine.source, [(nothing, 0.0)], f"nothing-{len(nothing)}"))
    assert spoken.finished is not None and spoken.finished.reason is FinishReason.EOS
    assert len(spoken.codes) == 0


def test_a_request_the_engine_holds_for_text_gives_its_slot_back_after_max_engine_wait_s(talker_engine):
    """A growing request waiting for its next words keeps an engine slot. A client that sends one
    speakable character every text_input_timeout_s held its slot for max_text_input_s (600 s); past
    max_engine_wait_s the request ends, with a message that says why, and the engine holds nothing."""
    source, limits = talker_engine.source, ServerLimits(max_engine_wait_s=1.0)

    async def run():
        text = StreamedText("", limits)
        request = SynthesisRequest(text="", voice="ryan", seed=SEED, max_frames=600, streamed_text=text)
        generation = await source.open_streamed(request, "held-for-text", limits)
        text.push(REPLY[:40], flush=False, end_of_input=False)
        frames = 0
        try:
            async for event in generation:
                frames += len(event.codes) if isinstance(event, Frames) else 0
        except GenerationFailed as failure:
            return frames, failure
        return frames, None

    frames, failure = talker_engine.run(run())
    assert frames > 0  # it spoke what it had, then waited
    assert isinstance(failure, TextInputExpired)
    assert str(failure) == "text input expired: no text for 1 s while the engine held its request"
    assert talker_engine.wait_for_no_live_requests() == 0


#: max_num_seqs of the CPU deploy YAML: requests the engine runs at once.
ENGINE_SLOTS = 8


def test_streamed_texts_waiting_for_words_give_their_slots_to_a_newcomer_and_then_resume_exactly(talker_engine, whole):
    """Every engine slot held by a streamed text waiting for its next words. On main a newcomer
    waited for them to end (two tokens keeping eight texts alive with a word every 14 s: its first
    chunk after 54 s): they kept their slots while idle. Now the newcomer is served while they
    wait, and each, once its words come, speaks the codes it would have spoken unpaused."""
    source, limits = talker_engine.source, ServerLimits(max_engine_wait_s=300.0)
    cut = REPLY.index("help") + 2

    async def read(generation, waiting: asyncio.Event) -> tuple[np.ndarray, Finished | None]:
        codes, finished = [], None
        async for event in generation:
            if isinstance(event, Frames):
                codes.append(event.codes)
            elif isinstance(event, SegmentEnd):
                waiting.set()  # it has spoken what it had, and waits for more text
            elif isinstance(event, Finished):
                finished = event
        return np.concatenate(codes), finished

    async def scenario():
        texts, readers = [], []
        for index in range(ENGINE_SLOTS):
            text = StreamedText("", limits)
            text.push(REPLY[:cut], flush=False, end_of_input=False)
            request = SynthesisRequest(text="", voice="ryan", seed=SEED, max_frames=600, streamed_text=text)
            generation = await source.open_streamed(request, f"idle-holder-{index}", limits)
            waiting = asyncio.Event()
            texts.append(text)
            readers.append((asyncio.ensure_future(read(generation, waiting)), waiting, generation))
        for _, waiting, _ in readers:
            await asyncio.wait_for(waiting.wait(), 60)
        newcomer = await source.open(
            SynthesisRequest(text="A new stream.", voice="ryan", seed=3, max_frames=20), "newcomer"
        )
        newcomer_codes, newcomer_end = await asyncio.wait_for(read(newcomer, asyncio.Event()), 60)
        for text in texts:
            text.push(REPLY[cut:], flush=False, end_of_input=True)
        held = [await task for task, _, _ in readers]
        return newcomer_codes, newcomer_end, held, [generation.engine_counts for _, _, generation in readers]

    newcomer_codes, newcomer_end, held, counts = talker_engine.run(scenario())
    assert newcomer_end is not None and newcomer_end.reason in (FinishReason.EOS, FinishReason.LENGTH)
    assert len(newcomer_codes) > 0
    for codes, finished in held:
        assert finished.reason is FinishReason.EOS
        assert codes.tobytes() == whole.codes.tobytes()
    assert any(count["parked"] for count in counts)
    assert talker_engine.wait_for_no_live_requests() == 0
