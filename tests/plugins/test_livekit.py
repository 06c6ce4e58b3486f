"""The LiveKit Agents TTS inside LiveKit's own TTS machinery (SynthesizeStream, ChunkedStream,
AudioEmitter), against a real codecstream server on loopback: audio frames flow, timed transcripts
arrive in order with the audio they describe, aclose() (LiveKit's interruption) cancels on the
server and reports what was played, errors that would fail again are not retried, options follow
LiveKit's conventions."""

from __future__ import annotations

import asyncio
import inspect
import re
import time

import pytest

pytest.importorskip("livekit.agents", reason="the livekit extra: pip install './client[livekit]'")

from codecstream.client.plugins.livekit import CodecstreamTTS
from codecstream.client.plugins.speech import OPTION_NAMES
from codecstream.client.runtimes import DecoderLoadError
from codecstream.protocol import decoder_digest
from livekit.agents import APIConnectOptions, APIError, APIStatusError, APITimeoutError, LanguageCode
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

from tests.conftest import (
    StalledOnceReplay,
    StalledReplay,
    StallingReplay,
    TextRecordingReplay,
    random_codes,
    sample,
)

REPLY = ["Hello", " there.", " The train", " leaves at", " nine."]
NO_RETRY_WAIT = APIConnectOptions(max_retry=3, retry_interval=0.1, timeout=10)


def words_in(frames) -> list:
    return [w for f in frames for w in f.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]


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
    words = words_in(frames)
    assert "".join(words) == "Hello there. The train leaves at nine."  # the text as written, spaces and all
    starts = [w.start_time for w in words]
    assert starts == sorted(starts) and all(w.end_time <= audio_s + 1e-6 for w in words)
    assert sample(server, "codecstream_streams_ended_total", reason="eos") == 1


@pytest.mark.asyncio
async def test_the_words_of_a_sentence_still_being_spoken_arrive_with_its_audio(replay_server_factory, checkpoint):
    # Issue 21 item 2: timed words came only once the sentence's whole audio had been generated.
    server = replay_server_factory(codes=random_codes(200), fps=25.0, decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    stream = engine.stream()
    stream.push_text("The next train to the airport leaves at nine from platform four, and it is on time.")
    stream.end_input()
    audio_s, words = 0.0, []
    async for event in stream:
        audio_s += event.frame.duration
        words += words_in([event.frame])
        # Words ride on the first frame of the chunk whose audio completes them: read that chunk.
        if words and audio_s >= words[-1].end_time:
            break
    await stream.aclose()
    await engine.aclose()
    assert words[0].start_time == 0.0 and words[0].strip() == "The"
    assert audio_s < 4.0  # the first words came with the first seconds of an 8-second sentence


@pytest.mark.asyncio
async def test_closing_the_stream_mid_speech_cancels_it_and_reports_what_was_played(replay_server_factory, checkpoint):
    # Issue 21 item 3: the frames handed to LiveKit were reported as played.
    server = replay_server_factory(codes=random_codes(200), fps=50.0, decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    stream = engine.stream()
    stream.push_text("A long answer that the user will interrupt.")
    stream.end_input()
    began = time.monotonic()
    handed_s = 0.0
    async for event in stream:
        handed_s += event.frame.duration
        if time.monotonic() - began > 1.5:  # the server runs 4x faster than real time meanwhile
            break
    await stream.aclose()
    elapsed_frames = (time.monotonic() - began) / 0.08
    await engine.aclose()
    assert server.wait_until(lambda: sample(server, "codecstream_streams_ended_total", reason="cancelled") == 1)
    played = sample(server, "codecstream_played_frames_at_cancel_total")
    assert 0 < played <= elapsed_frames
    assert played < handed_s / 0.08


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
async def test_options_updated_at_run_time_apply_to_the_next_stream(replay_server_factory, checkpoint):
    # Issue 21 item 8: LiveKit had no update_options.
    server = replay_server_factory(codes=random_codes(10), decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint, voice="ryan")
    engine.update_options(voice="nobody", temperature=0.5)
    with pytest.raises(APIStatusError, match="unknown voice 'nobody'"):
        await engine.synthesize("Hello there.", conn_options=NO_RETRY_WAIT).collect()
    await engine.aclose()
    assert sample(server, "codecstream_calls_total") == 1  # refused once, not retried


@pytest.mark.asyncio
async def test_a_decoder_for_other_codes_fails_once_with_an_error_event_not_four_retries(
    replay_server_factory, checkpoint
):
    # Issue 21 item 11: a codec mismatch was retried 4 times over 6.6 s.
    server = replay_server_factory(codes=random_codes(10), decoder_digest="sha256:" + "1" * 64)
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    errors = []
    engine.on("error", errors.append)
    with pytest.raises(APIStatusError, match="does not match"):
        await engine.synthesize("Hello there.", conn_options=NO_RETRY_WAIT).collect()
    await engine.aclose()
    assert sample(server, "codecstream_calls_total") == 1
    assert len(errors) == 1 and not errors[0].recoverable


def test_every_codecstream_option_is_a_constructor_argument_that_reaches_the_stream_and_can_be_updated():
    arguments = dict(voice="ryan", language="en", instructions="calm", seed=0, temperature=0.7, top_p=0.9, top_k=50)
    assert set(arguments) == set(OPTION_NAMES)
    engine = CodecstreamTTS(server="127.0.0.1:1", **arguments)
    assert engine._opts.start_options() == {**arguments, "language": "English"}
    assert set(OPTION_NAMES) <= set(inspect.signature(engine.update_options).parameters)


def test_a_decoder_that_is_not_there_fails_at_construction(tmp_path):
    # Issue 21 item 11: it surfaced at the first utterance.
    with pytest.raises(DecoderLoadError, match="no-such-decoder: no such directory"):
        CodecstreamTTS(server="127.0.0.1:1", decoder=tmp_path / "no-such-decoder")


@pytest.mark.asyncio
async def test_a_server_that_offers_no_decoder_is_a_livekit_error_event_not_a_retry(replay_server_factory):
    # Issue 21 item 11: a decoder-load error was not LiveKit's API error type, so no error event fired.
    server = replay_server_factory(codes=random_codes(10))
    engine = CodecstreamTTS(server=server.target)  # decoder="auto": the server offers none
    errors = []
    engine.on("error", errors.append)
    with pytest.raises(APIError, match="offers no decoder artifact"):
        await engine.synthesize("Hello there.", conn_options=NO_RETRY_WAIT).collect()
    await engine.aclose()
    assert len(errors) == 1 and not errors[0].recoverable
    assert sample(server, "codecstream_calls_total") == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("rate", [16_000, 8_000])  # 8 kHz: what LiveKit's SIP (telephony) side encodes
async def test_a_16_or_8_khz_session_gets_its_rate_resampled_on_the_client(replay_server_factory, checkpoint, rate):
    server = replay_server_factory(codes=random_codes(12), decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint, sample_rate=rate)
    frame = await asyncio.wait_for(engine.synthesize("Hello there.").collect(), 30)
    await engine.aclose()
    assert frame.sample_rate == rate and engine.sample_rate == rate
    assert frame.samples_per_channel == 12 * rate * 8 // 100  # 80 ms a frame


@pytest.mark.asyncio
async def test_the_servers_voices_are_listed(replay_server_factory):
    server = replay_server_factory(codes=random_codes(10))
    engine = CodecstreamTTS(server=server.target)
    voices = await engine.list_voices()
    await engine.aclose()
    assert "ryan" in [v.name for v in voices]


@pytest.mark.asyncio
async def test_a_whole_text_is_synthesized_in_one_chunked_stream(replay_server_factory, checkpoint):
    server = replay_server_factory(codes=random_codes(12), fps=0.0, decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    frame = await asyncio.wait_for(engine.synthesize("Hello there.").collect(), 30)
    await engine.aclose()
    assert frame.samples_per_channel == 12 * 1920


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["synthesize", "stream"])
async def test_a_stream_not_started_within_conn_options_timeout_is_an_api_timeout(
    replay_server_factory, checkpoint, how
):
    # Issue 40 defect 5: conn_options.timeout was ignored, so a stalled server held a turn forever.
    server = replay_server_factory(
        codes=random_codes(12), decoder_digest=decoder_digest(checkpoint), source_class=StalledReplay
    )
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    errors = []
    engine.on("error", errors.append)
    options = APIConnectOptions(max_retry=0, retry_interval=0.1, timeout=0.5)
    began = time.monotonic()
    with pytest.raises(APITimeoutError, match=r"0\.5 s"):
        if how == "synthesize":
            await asyncio.wait_for(engine.synthesize("Hello there.", conn_options=options).collect(), 30)
        else:
            stream = engine.stream(conn_options=options)
            stream.push_text("Hello there.")
            stream.end_input()

            async def drain():
                async for _ in stream:
                    pass

            await asyncio.wait_for(drain(), 30)
    waited = time.monotonic() - began
    await engine.aclose()
    assert waited < 10  # the timeout, not the test's own 30 s guard
    assert len(errors) == 1 and errors[0].recoverable is False  # no retries left: max_retry=0


class SlowLoadingTTS(CodecstreamTTS):
    """The real decoder load, one second later (a cold cache or a first compile)."""

    async def _load_decoder(self, client):
        await asyncio.sleep(1.0)
        return await super()._load_decoder(client)


@pytest.mark.asyncio
async def test_a_first_turn_waiting_for_the_decoder_counts_the_wait_in_its_time_to_first_byte(
    replay_server_factory, checkpoint
):
    # Issue 40 defect 4: the text was taken only once the decoder had loaded, so LiveKit's TTFB (0.096 s)
    # left out the 3.3 s the first turn waited for it.
    server = replay_server_factory(codes=random_codes(10), fps=100.0, decoder_digest=decoder_digest(checkpoint))
    engine = SlowLoadingTTS(server=server.target, decoder=checkpoint)
    collected = []
    engine.on("metrics_collected", collected.append)
    async with engine.stream() as stream:
        stream.push_text("Hello there.")
        stream.end_input()
        async for _ in stream:
            pass
    await engine.aclose()
    assert len(collected) == 1 and collected[0].ttfb >= 1.0


@pytest.mark.asyncio
async def test_livekit_language_codes_are_sent_as_the_models_language_names(replay_server_factory, checkpoint):
    server = replay_server_factory(codes=random_codes(10), fps=100.0, decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint, language="en-US")
    assert engine._opts.language == "English"
    frame = await asyncio.wait_for(engine.synthesize("Hello there.").collect(), 30)
    assert frame.samples_per_channel == 10 * 1920  # the server took "English"
    engine.update_options(language=LanguageCode("pt_BR"))
    assert engine._opts.language == "Portuguese"
    with pytest.raises(ValueError, match="does not speak 'ar'"):
        engine.update_options(language="ar")
    assert engine._opts.language == "Portuguese"
    await engine.aclose()
    with pytest.raises(ValueError, match="does not speak 'xx'"):
        CodecstreamTTS(server=server.target, decoder=checkpoint, language="xx")


def say_it_right(text: str) -> str:
    """A pronunciation fix as an application writes one: the brand name as it is said."""
    return re.sub(r"\bMetformin\b", "met for min", text)


async def say_it_right_async(text: str) -> str:
    return say_it_right(text)


@pytest.mark.asyncio
@pytest.mark.parametrize("transform", [say_it_right, say_it_right_async])
async def test_text_transforms_change_what_is_spoken_and_the_transcript_keeps_the_text_as_written(
    replay_server_factory, checkpoint, transform
):
    # Issue 40 conventions: pronunciation fixes on the client, so the words keep their timing.
    server = replay_server_factory(
        codes=random_codes(10), fps=100.0, decoder_digest=decoder_digest(checkpoint), source_class=TextRecordingReplay
    )
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint, text_transforms=[transform])
    async with engine.stream() as stream:
        for token in ["Take", " Met", "formin", " twice", " a day."]:  # the name split over two tokens
            stream.push_text(token)
        stream.end_input()
        frames = [event.frame async for event in stream]
    await engine.aclose()
    assert server.source.texts() == ["Take met for min twice a day."]
    words = words_in(frames)
    assert "".join(words) == "Take Metformin twice a day."
    assert [w.start_time for w in words] == sorted(w.start_time for w in words)


@pytest.mark.asyncio
async def test_a_whole_text_is_spoken_transformed_and_its_transcript_is_the_text_as_written(
    replay_server_factory, checkpoint
):
    server = replay_server_factory(
        codes=random_codes(10), decoder_digest=decoder_digest(checkpoint), source_class=TextRecordingReplay
    )
    transforming = CodecstreamTTS(server=server.target, decoder=checkpoint, text_transforms=[say_it_right])
    written = words_in([event.frame async for event in transforming.synthesize("Take Metformin twice a day.")])
    plain = CodecstreamTTS(server=server.target, decoder=checkpoint)
    spoken = words_in([event.frame async for event in plain.synthesize("Take met for min twice a day.")])
    await transforming.aclose()
    await plain.aclose()
    assert server.source.texts() == ["Take met for min twice a day."] * 2
    assert "".join(written) == "Take Metformin twice a day."
    # Each word is timed where its spoken form is heard: "Metformin" from "met" to "min".
    times = [(w.start_time, w.end_time) for w in written]
    assert times[1] == (spoken[1].start_time, spoken[3].end_time)
    assert times[:1] + times[2:] == [(w.start_time, w.end_time) for w in spoken[:1] + spoken[4:]]


@pytest.mark.asyncio
async def test_a_failing_text_transform_fails_the_stream_without_retrying_it(replay_server_factory, checkpoint):
    def refuse(text: str) -> str:
        raise ValueError("no secrets")

    server = replay_server_factory(codes=random_codes(10), decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint, text_transforms=[refuse])
    errors = []
    engine.on("error", errors.append)
    with pytest.raises(APIError, match=r"text transform.*no secrets"):
        await asyncio.wait_for(engine.synthesize("The secret is out.", conn_options=NO_RETRY_WAIT).collect(), 30)
    await engine.aclose()
    assert len(errors) == 1 and errors[0].recoverable is False
    assert sample(server, "codecstream_calls_total") == 0


@pytest.mark.asyncio
async def test_a_failing_text_transform_fails_a_streamed_reply_at_once_without_retrying_it(
    replay_server_factory, checkpoint
):
    # Issue 54 defect 2: stream() lost the transform's exception; the turn waited for the server's 60 s
    # text timeout, then LiveKit retried it (130 s, four error events).
    def refuse(text: str) -> str:
        raise ValueError("no secrets")

    server = replay_server_factory(codes=random_codes(10), decoder_digest=decoder_digest(checkpoint))
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint, text_transforms=[refuse])
    errors = []
    engine.on("error", errors.append)
    stream = engine.stream(conn_options=NO_RETRY_WAIT)
    stream.push_text("The secret is out.")  # the input stays open: an LLM still writing

    async def drain():
        async for _ in stream:
            pass

    with pytest.raises(APIError, match=r"text transform.*no secrets"):
        await asyncio.wait_for(drain(), 30)  # well before the server's text timeout (60 s)
    await stream.aclose()
    await engine.aclose()
    assert len(errors) == 1 and errors[0].recoverable is False


async def drained(stream) -> list:
    return [event async for event in stream]


@pytest.mark.asyncio
async def test_a_stalled_server_is_an_api_timeout_once_it_has_a_sentence_not_at_the_end_of_the_reply(
    replay_server_factory, checkpoint
):
    # Issue 54 defect 3: the first-audio bound started only at flush or end_input, so with an LLM still
    # writing the user waited for the whole reply, plus the timeout.
    server = replay_server_factory(
        codes=random_codes(12), decoder_digest=decoder_digest(checkpoint), source_class=StalledReplay
    )
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    errors = []
    engine.on("error", errors.append)
    stream = engine.stream(conn_options=APIConnectOptions(max_retry=0, retry_interval=0.1, timeout=0.5))
    stream.push_text("Hello there. The train")  # a sentence the server can speak; the LLM writes on
    with pytest.raises(APITimeoutError):
        await asyncio.wait_for(drained(stream), 30)
    await stream.aclose()
    await engine.aclose()
    assert len(errors) == 1


@pytest.mark.asyncio
async def test_a_stream_that_stalls_after_its_first_audio_ends_with_an_api_timeout_not_retried(
    replay_server_factory, checkpoint
):
    # Issue 54 defect 3: nothing bounded a stream that stalled once audio flowed.
    server = replay_server_factory(
        codes=random_codes(40), fps=100.0, decoder_digest=decoder_digest(checkpoint), source_class=StallingReplay
    )
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    errors = []
    engine.on("error", errors.append)
    stream = engine.stream(conn_options=APIConnectOptions(max_retry=3, retry_interval=0.1, timeout=0.5))
    stream.push_text("Hello there. The train leaves at nine.")
    stream.end_input()
    frames = []
    with pytest.raises(APITimeoutError):
        async with asyncio.timeout(30):
            async for event in stream:
                frames.append(event.frame)
    await stream.aclose()
    await engine.aclose()
    assert sum(f.samples_per_channel for f in frames) == StallingReplay.STALL_AFTER * 1920
    # Audio went out: LiveKit would speak the reply again from its start, so it is not retried.
    assert len(errors) == 1 and errors[0].recoverable is False
    assert sample(server, "codecstream_calls_total") == 1


@pytest.mark.asyncio
async def test_a_stream_retried_after_a_stalled_first_attempt_speaks_its_whole_text(replay_server_factory, checkpoint):
    # LiveKit replays the input into a new channel for a retry: each attempt reads the text from its
    # start, none of what the stalled attempt read is lost or sent twice.
    server = replay_server_factory(
        codes=random_codes(10), fps=100.0, decoder_digest=decoder_digest(checkpoint), source_class=StalledOnceReplay
    )
    engine = CodecstreamTTS(server=server.target, decoder=checkpoint)
    errors = []
    engine.on("error", errors.append)
    stream = engine.stream(conn_options=APIConnectOptions(max_retry=1, retry_interval=0.1, timeout=0.5))
    for token in REPLY:
        stream.push_text(token)
    stream.end_input()
    frames = [event.frame for event in await asyncio.wait_for(drained(stream), 30)]
    await stream.aclose()
    await engine.aclose()
    assert len(errors) == 1 and errors[0].recoverable is True  # the stalled attempt, retried
    assert "".join(words_in(frames)) == "Hello there. The train leaves at nine."
    assert sum(f.samples_per_channel for f in frames) == 2 * 10 * 1920
