"""One voice-agent turn per plugin on the real talker engine (CPU, tiny checkpoint): the LLM's tokens
grow one talker request, and the words come back with the audio of their own tokens (every chunk
ends its text span), in order, the whole reply spoken."""

from __future__ import annotations

import asyncio
import itertools

import pytest

pytestmark = pytest.mark.engine

TOKENS = ["Sure", ",", " the", " next", " train", " leaves", " at", " nine", "."]
TEXT = "".join(TOKENS)


def ended(engine_server, reason: str) -> float:
    return engine_server.server.metrics.registry.get_sample_value("codecstream_streams_ended_total", {"reason": reason})


@pytest.mark.asyncio
async def test_a_pipecat_turn_on_the_engine_speaks_every_word_with_its_audio(engine_server):
    pytest.importorskip("pipecat")
    from codecstream.client.plugins.pipecat import CodecstreamTTSService
    from codecstream.testing.pipecat_pipeline import Until, run_script
    from pipecat.frames.frames import TTSAudioRawFrame, TTSStoppedFrame, TTSTextFrame

    from tests.plugins.test_pipecat import reply

    before = ended(engine_server, "eos") or 0.0
    tts = CodecstreamTTSService(
        server=engine_server.target,
        decoder=engine_server.checkpoint / "speech_tokenizer",
        settings=CodecstreamTTSService.Settings(voice="ryan", seed=11),
    )
    down = (await run_script(tts, [*reply(*TOKENS), Until(TTSStoppedFrame, timeout_s=120)])).frames
    audio = sum(len(f.audio) for f in down if isinstance(f, TTSAudioRawFrame))
    words = [f for f in down if isinstance(f, TTSTextFrame)]
    assert audio > 0 and audio % (1920 * 2) == 0
    assert [w.text for w in words] == TEXT.split()
    assert all(a.pts <= b.pts for a, b in itertools.pairwise(words))
    assert ended(engine_server, "eos") == before + 1


@pytest.mark.asyncio
async def test_a_livekit_turn_on_the_engine_times_every_word_inside_its_audio(engine_server):
    pytest.importorskip("livekit.agents")
    from codecstream.client.plugins.livekit import CodecstreamTTS
    from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

    before = ended(engine_server, "eos") or 0.0
    engine = CodecstreamTTS(
        server=engine_server.target, decoder=engine_server.checkpoint / "speech_tokenizer", voice="ryan", seed=11
    )
    async with engine.stream() as stream:
        for token in TOKENS:
            stream.push_text(token)
            await asyncio.sleep(0.05)  # an LLM writing 20 tokens/s
        stream.end_input()
        frames = [event.frame async for event in stream]
    await engine.aclose()
    audio_s, heard_by = 0.0, []
    for frame in frames:
        for word in frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []):
            heard_by.append((word, audio_s))
        audio_s += frame.duration
    words = [w for w, _ in heard_by]
    assert "".join(words) == TEXT
    assert all(a.end_time <= b.start_time + 1e-9 for a, b in itertools.pairwise(words))
    assert words[-1].end_time <= audio_s + 1e-6
    # Each word arrived on the first frame of the chunk that completes it: no later than its own end.
    assert all(audio_before <= word.end_time + 1e-6 for word, audio_before in heard_by)
    assert ended(engine_server, "eos") == before + 1


@pytest.mark.asyncio
async def test_an_llm_pause_mid_reply_is_not_a_stall_on_a_growing_request(engine_server):
    # The stall bound (plugins/stall.py) leaves one unspoken word out: the engine holds the frame of
    # the last token it read until the next one comes, so a reply paused after "train. It" (its "."
    # read, " It" not yet committed) owes no audio, however long the pause.
    pytest.importorskip("pipecat")
    from codecstream.client.plugins.pipecat import CodecstreamTTSService
    from codecstream.testing.pipecat_pipeline import Pause, Until, run_script
    from pipecat.frames.frames import (
        ErrorFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSStoppedFrame,
        TTSTextFrame,
    )

    tts = CodecstreamTTSService(
        server=engine_server.target,
        decoder=engine_server.checkpoint / "speech_tokenizer",
        settings=CodecstreamTTSService.Settings(voice="ryan", seed=11),
        # Above an 8-frame chunk's generation here (~1 s quiet; CI ran the engine beside exports on
        # both cores, and 3 s was once exceeded), well below the pause.
        stall_timeout_s=8.0,
    )
    first = [*(LLMTextFrame(t) for t in TOKENS[:5]), LLMTextFrame("."), LLMTextFrame(" It")]
    script = [LLMFullResponseStartFrame(), *first, Pause(14.0), LLMTextFrame(" leaves at nine.")]
    result = await run_script(tts, [*script, LLMFullResponseEndFrame(), Until(TTSStoppedFrame, timeout_s=120)])
    assert not [f.error for f in result.upstream if isinstance(f, ErrorFrame)]
    words = [f.text for f in result.frames if isinstance(f, TTSTextFrame)]
    assert words == "Sure, the next train. It leaves at nine.".split()
