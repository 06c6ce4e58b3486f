"""The Pipecat TTS service inside a real Pipecat pipeline (tests/plugins/conftest.run_script), against a real
codecstream server on loopback: audio frames flow between TTSStarted and TTSStopped, word
timestamps are in order, an interruption stops the audio and the server records the Cancel."""

from __future__ import annotations

import pytest

pytest.importorskip("pipecat", reason="the pipecat extra: pip install './client[pipecat]'")

from codecstream.client.plugins.pipecat import CodecstreamTTSService
from codecstream.protocol import decoder_digest
from pipecat.frames.frames import (
    ErrorFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.services.tts_service import TextAggregationMode

from tests.conftest import random_codes
from tests.plugins.conftest import Until, run_script, sample

REPLY = ["Hello", " there.", " The train", " leaves at", " nine."]


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", [TextAggregationMode.TOKEN, TextAggregationMode.SENTENCE])
async def test_an_llm_reply_streamed_token_by_token_comes_out_as_audio_with_word_timestamps(
    replay_server_factory, checkpoint, mode
):
    server = replay_server_factory(codes=random_codes(10), fps=100.0, decoder_digest=decoder_digest(checkpoint))
    tts = CodecstreamTTSService(server=server.target, decoder=checkpoint, text_aggregation_mode=mode)
    frames = [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in REPLY), LLMFullResponseEndFrame()]
    down = await run_script(tts, [*frames, Until(TTSStoppedFrame)])
    kinds = [type(f) for f in down]
    assert TTSStartedFrame in kinds and TTSStoppedFrame in kinds
    started, stopped = kinds.index(TTSStartedFrame), len(kinds) - 1 - kinds[::-1].index(TTSStoppedFrame)
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert audio and all(started < down.index(f) < stopped for f in audio)
    assert all(f.sample_rate == 24_000 and f.num_channels == 1 for f in audio)
    # Two segments ("Hello there." and "The train leaves at nine.") of 10 frames, 1920 samples each.
    assert sum(len(f.audio) for f in audio) == 2 * 10 * 1920 * 2
    words = [f for f in down if isinstance(f, TTSTextFrame)]
    assert [w.text for w in words] == "Hello there. The train leaves at nine.".split()
    times = [w.pts for w in words]
    assert times == sorted(times)
    assert sample(server, "codecstream_streams_ended_total", reason="eos") == 1


@pytest.mark.asyncio
async def test_an_interruption_stops_the_audio_and_the_server_records_the_cancel(replay_server_factory, checkpoint):
    server = replay_server_factory(codes=random_codes(200), fps=25.0, decoder_digest=decoder_digest(checkpoint))
    tts = CodecstreamTTSService(server=server.target, decoder=checkpoint)
    script = [
        LLMFullResponseStartFrame(),
        LLMTextFrame("A long answer that the user will interrupt."),
        LLMFullResponseEndFrame(),
        Until(TTSAudioRawFrame),  # the user interrupts once the answer is heard
        InterruptionFrame(),
    ]
    down = await run_script(tts, script)
    assert server.wait_until(lambda: sample(server, "codecstream_streams_ended_total", reason="cancelled") == 1)
    played = sample(server, "codecstream_played_frames_at_cancel_total")
    audio_frames = sum(len(f.audio) for f in down if isinstance(f, TTSAudioRawFrame)) // (1920 * 2)
    # The server heard how much audio Pipecat was given, and no more audio came after the cancel
    # than the one chunk already decoded (25 frames at most).
    assert 0 < played <= audio_frames <= played + 25
    assert audio_frames < 200


TOKENS = "Sure , I can help with that . The next train to the airport leaves at nine from platform four .".split()


async def refused_turn(tts) -> tuple[list, list]:
    up: list = []
    script = [LLMFullResponseStartFrame(), *(LLMTextFrame(f" {t}") for t in TOKENS), LLMFullResponseEndFrame()]
    down = await run_script(tts, [*script, Until(TTSStoppedFrame)], upstream=up)
    return down, up


def errors_in(down: list, up: list) -> list[str]:
    """codecstream's error frames (Pipecat adds its own note of a context that had no audio)."""
    return [f.error for f in (*down, *up) if isinstance(f, ErrorFrame) and f.error.startswith("codecstream: ")]


@pytest.mark.asyncio
async def test_a_refused_turn_is_one_request_one_error_and_one_stop_not_one_per_token(
    replay_server_factory, checkpoint
):
    server = replay_server_factory(codes=random_codes(10), decoder_digest=decoder_digest(checkpoint))
    down, up = await refused_turn(CodecstreamTTSService(server=server.target, decoder=checkpoint, voice="nobody"))
    assert sample(server, "codecstream_calls_total") == 1
    errors = errors_in(down, up)
    assert len(errors) == 1 and "unknown voice 'nobody'" in errors[0]
    assert sum(isinstance(f, TTSStoppedFrame) for f in down) == 1


@pytest.mark.asyncio
async def test_a_decoder_that_cannot_load_is_one_clear_error_and_the_turn_still_stops(replay_server_factory, tmp_path):
    server = replay_server_factory(codes=random_codes(10))
    tts = CodecstreamTTSService(server=server.target, decoder=tmp_path / "no-such-decoder")
    down, up = await refused_turn(tts)
    errors = errors_in(down, up)
    assert errors and all("no-such-decoder: no such directory" in error for error in errors), errors
    assert sum(isinstance(f, TTSStoppedFrame) for f in down) == 1
    assert sample(server, "codecstream_calls_total") == 0


@pytest.mark.asyncio
async def test_a_finished_turn_leaves_no_state_behind(replay_server_factory, checkpoint):
    server = replay_server_factory(codes=random_codes(10), fps=100.0, decoder_digest=decoder_digest(checkpoint))
    tts = CodecstreamTTSService(server=server.target, decoder=checkpoint)
    script = [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in REPLY), LLMFullResponseEndFrame()]
    await run_script(tts, [*script, Until(TTSStoppedFrame)])
    assert not (tts._streams or tts._readers or tts._frames_out or tts._refused)
