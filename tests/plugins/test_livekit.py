"""The LiveKit Agents TTS inside LiveKit's own TTS machinery (SynthesizeStream, ChunkedStream,
AudioEmitter), against a real codecstream server on loopback: audio frames flow, timed transcripts
are monotonic and inside the audio, aclose() (LiveKit's interruption) cancels on the server."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("livekit.agents", reason="the livekit extra: pip install './client[livekit]'")

from codecstream.client.plugins.livekit import CodecstreamTTS
from codecstream.protocol import decoder_digest
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

from tests.conftest import random_codes
from tests.plugins.conftest import sample

REPLY = ["Hello", " there.", " The train", " leaves at", " nine."]


def test_the_tts_declares_streaming_and_aligned_transcripts(checkpoint):
    capabilities = CodecstreamTTS(server="127.0.0.1:1", decoder=checkpoint).capabilities
    assert capabilities.streaming and capabilities.aligned_transcript


@pytest.mark.asyncio
async def test_text_pushed_as_the_llm_writes_it_comes_back_as_audio_with_timed_words(replay_server_factory, checkpoint):
    server = replay_server_factory(codes=random_codes(10), fps=100.0, decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    async with engine.stream() as stream:
        for token in REPLY:
            stream.push_text(token)
        stream.end_input()
        events = [event async for event in stream]
    await engine.aclose()
    frames = [event.frame for event in events]
    assert all(f.sample_rate == 24_000 and f.num_channels == 1 for f in frames)
    audio_s = sum(f.samples_per_channel for f in frames) / 24_000
    assert audio_s == pytest.approx(2 * 10 * 0.08)  # two segments of 10 frames
    assert events[-1].is_final
    words = [w for f in frames for w in f.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
    assert "".join(words).split() == "Hello there. The train leaves at nine.".split()
    starts = [w.start_time for w in words]
    assert starts == sorted(starts) and all(w.end_time <= audio_s + 1e-6 for w in words)
    assert sample(server, "codecstream_streams_ended_total", reason="eos") == 1


@pytest.mark.asyncio
async def test_a_streamed_reply_reports_livekit_metrics_with_its_time_to_first_byte(replay_server_factory, checkpoint):
    server = replay_server_factory(codes=random_codes(10), fps=100.0, decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    collected = []
    engine.on("metrics_collected", collected.append)
    async with engine.stream() as stream:
        for token in REPLY:
            stream.push_text(token)
        stream.end_input()
        audio_s = sum([event.frame.duration async for event in stream])
    await engine.aclose()
    # Issue 21 item 10: stream() never marked its start, so LiveKit emitted no metrics for it.
    assert len(collected) == 1
    metrics = collected[0]
    assert 0 < metrics.ttfb < metrics.duration
    assert metrics.characters_count == len("".join(REPLY))
    assert metrics.audio_duration == pytest.approx(audio_s)


@pytest.mark.asyncio
async def test_closing_the_stream_mid_speech_cancels_it_on_the_server(replay_server_factory, checkpoint):
    server = replay_server_factory(codes=random_codes(200), fps=25.0, decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    stream = engine.stream()
    stream.push_text("A long answer that the user will interrupt.")
    stream.end_input()
    received = 0
    async for event in stream:
        received += event.frame.samples_per_channel
        if received >= 24_000 // 2:  # half a second of audio heard
            break
    await stream.aclose()
    await engine.aclose()
    assert server.wait_until(lambda: sample(server, "codecstream_streams_ended_total", reason="cancelled") == 1)
    played = sample(server, "codecstream_played_frames_at_cancel_total")
    assert 0 < played < 200


@pytest.mark.asyncio
async def test_a_whole_text_is_synthesized_in_one_chunked_stream(replay_server_factory, checkpoint):
    server = replay_server_factory(codes=random_codes(12), fps=0.0, decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    frame = await asyncio.wait_for(engine.synthesize("Hello there.").collect(), 30)
    await engine.aclose()
    assert frame.samples_per_channel == 12 * 1920
