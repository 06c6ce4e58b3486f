"""VllmTalkerSource over the real vLLM-Omni engine (CPU, tiny random checkpoint): what a stream promises.

The random talker stops at codec EOS after ~40 frames on average (random_checkpoint.py), with a
seeded request always stopping at the same frame; tests that need a long or a short utterance look
for a seed that gives one, among a few.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from codecstream.protocol import decoder_digest
from codecstream.server.errors import Refusal
from codecstream.server.limits import ServerLimits
from codecstream.server.request import SynthesisRequest, TaskType
from codecstream.server.request_parsing import parse_start
from codecstream.server.source import Finished, FinishReason, Frames
from codecstream.v1 import synthesis_pb2 as pb

pytestmark = pytest.mark.engine

TEXT = "The quick brown fox jumps over the lazy dog."


def request(seed: int, max_frames: int, **fields) -> SynthesisRequest:
    return SynthesisRequest(text=TEXT, voice="ryan", language="English", seed=seed, max_frames=max_frames, **fields)


def first_seed_with(talker_engine, predicate, max_frames: int, name: str, seeds=range(1, 9)):
    for seed in seeds:
        collected = talker_engine.collect(request(seed, max_frames), f"{name}-{seed}")
        if predicate(collected):
            return collected
    pytest.fail(f"none of seeds {list(seeds)} gave a {name} stream")


def test_frames_leave_the_engine_one_decode_step_at_a_time(talker_engine):
    collected = first_seed_with(talker_engine, lambda c: len(c.codes) >= 12, 60, "long")
    assert [len(arrival.frames) for arrival in collected.arrivals] == [1] * len(collected.codes)
    times = [arrival.at for arrival in collected.arrivals]
    assert times == sorted(times)
    first, last = times[0] - collected.started_at, times[-1] - collected.started_at
    # The first frame comes after prefill and one step, the last after every step: not all at the end.
    assert first < last / 3, f"first frame after {first:.3f} s, last after {last:.3f} s"


def test_frames_are_int16_rows_of_16_codes_within_the_codebook(talker_engine):
    codes = talker_engine.collect(request(1, 60), "range").codes
    assert codes.dtype == np.int16 and codes.ndim == 2 and codes.shape[1] == 16 and len(codes) > 0
    assert codes.min() >= 0 and codes.max() < 2048
    # Codebook 0 is the talker's sampled token: 0 and the talker's tag ids (>= 2048) are masked out.
    assert codes[:, 0].min() >= 1


def test_codec_eos_finishes_the_generation_with_reason_eos_and_no_frame_for_it(talker_engine):
    collected = talker_engine.collect(request(2, 400), "eos")
    assert collected.finish_reason is FinishReason.EOS
    assert 0 < len(collected.codes) < 400
    assert collected.codes[-1].any(), "the EOS step must not add a placeholder frame"


def test_max_frames_finishes_the_generation_with_reason_length_after_exactly_that_many_frames(talker_engine):
    collected = first_seed_with(talker_engine, lambda c: c.finish_reason is FinishReason.LENGTH, 3, "max-frames")
    assert len(collected.codes) == 3


def test_a_seeded_request_generates_the_same_codes_again(talker_engine):
    first = talker_engine.collect(request(5, 30), "seeded-a").codes
    second = talker_engine.collect(request(5, 30), "seeded-b").codes
    np.testing.assert_array_equal(first, second)


def test_abort_mid_stream_finishes_it_with_reason_aborted_and_leaves_no_live_request(talker_engine):
    async def read_three_then_abort():
        generation = await talker_engine.source.open(request(3, 400), "abort")
        received, after_abort, last = 0, 0, None
        async for event in generation:
            last = event
            if isinstance(event, Frames):
                if received >= 3:
                    after_abort += len(event.codes)
                received += len(event.codes)
                if received >= 3 and not after_abort:
                    await generation.abort()
        return received, after_abort, last

    received, after_abort, last = talker_engine.run(read_three_then_abort())
    assert received >= 3 and last == Finished(FinishReason.ABORTED)
    assert after_abort <= 1, "at most the step in flight when abort() returned"
    assert talker_engine.wait_for_no_live_requests() == 0


def test_leaving_a_stream_early_aborts_its_engine_request(talker_engine):
    async def read_one_and_leave():
        stream = await talker_engine.source.open(request(3, 400), "leave")
        iterator = aiter(stream)
        await anext(iterator)
        await iterator.aclose()

    talker_engine.run(read_one_and_leave())
    assert talker_engine.wait_for_no_live_requests() == 0


def test_concurrent_streams_each_get_all_their_own_frames(talker_engine):
    async def two_at_once():
        async def read(seed: int, stream_id: str) -> np.ndarray:
            generation = await talker_engine.source.open(request(seed, 30), stream_id)
            return np.concatenate([event.codes async for event in generation if isinstance(event, Frames)])

        return await asyncio.gather(read(5, "together-a"), read(6, "together-b"))

    together_a, together_b = talker_engine.run(two_at_once())
    np.testing.assert_array_equal(together_a, talker_engine.collect(request(5, 30), "alone-a").codes)
    np.testing.assert_array_equal(together_b, talker_engine.collect(request(6, 30), "alone-b").codes)
    assert talker_engine.wait_for_no_live_requests() == 0


def checked(talker_engine, **start) -> SynthesisRequest:
    """What parse_start makes of a Start against this engine's checkpoint: the request the source trusts."""
    source = talker_engine.source
    return parse_start(pb.Start(text=TEXT, **start), source.offering, source.codec, ServerLimits()).request


def test_a_voice_and_language_in_any_case_reach_the_engine_as_the_checkpoint_spells_them(talker_engine):
    canonical = checked(talker_engine, voice="Ryan", language="ENGLISH", seed=1, max_frames=2)
    assert (canonical.voice, canonical.language) == ("ryan", "English")
    assert len(talker_engine.collect(canonical, "case").codes) > 0


@pytest.mark.parametrize(
    ("start", "message"),
    [
        ({"voice": "nobody"}, "unknown voice 'nobody'; this model has: serena, vivian, uncle_fu, ryan"),
        ({"voice": "ryan", "language": "Klingon"}, "unknown language 'Klingon'; this model speaks: Auto, "),
        ({"task_type": pb.TASK_TYPE_BASE}, "task type BASE is not served by this model (it serves CUSTOM_VOICE)"),
        (
            {"task_type": pb.TASK_TYPE_VOICE_DESIGN, "instructions": "A calm voice."},
            "task type VOICE_DESIGN is not served by this model (it serves CUSTOM_VOICE)",
        ),
    ],
)
def test_requests_the_checkpoint_cannot_serve_are_refused_before_the_engine(talker_engine, start, message):
    with pytest.raises(Refusal) as refused:
        checked(talker_engine, **start)
    assert refused.value.status == "INVALID_ARGUMENT"
    assert message in refused.value.message


def test_an_empty_voice_is_the_checkpoint_default_voice(talker_engine):
    default = talker_engine.source.offering.default_voice
    assert default == "serena"  # the first spk_id of the released config, as vLLM-Omni's speech API picks it
    unnamed = checked(talker_engine, voice="", seed=4, max_frames=6)
    assert unnamed.voice == default
    named = checked(talker_engine, voice="Serena", seed=4, max_frames=6)
    alone = talker_engine.collect(unnamed, "default-voice")
    np.testing.assert_array_equal(alone.codes, talker_engine.collect(named, "named-default-voice").codes)


def test_the_source_describes_the_checkpoint_it_serves(talker_engine):
    source = talker_engine.source
    assert source.codec.decoder_digest == decoder_digest(talker_engine.checkpoint)
    assert source.codec.num_codebooks == 16 and source.codec.codebook_size == 2048
    assert source.offering.task_types == (TaskType.CUSTOM_VOICE,)
    assert "ryan" in [voice.name for voice in source.offering.voices]
    assert source.offering.languages[0] == "Auto" and "English" in source.offering.languages


def test_the_worker_records_a_profile_of_the_steps_it_runs_while_a_stream_decodes(talker_engine, tmp_path):
    """benchmarks/gpu_step_profile.py reads where a step's time goes from this trace."""
    import json

    trace = tmp_path / "trace.json"

    async def profile_while_decoding() -> int:
        generation = await talker_engine.source.open(request(seed=1, max_frames=400), "profiled")
        frames = 0

        async def read() -> None:
            nonlocal frames
            async for event in generation:
                frames += isinstance(event, Frames)

        reading = asyncio.create_task(read())
        try:
            await talker_engine.source.profile_steps(1.0, trace)
        finally:
            reading.cancel()
            await generation.abort()
        return frames

    assert talker_engine.run(profile_while_decoding()) > 0
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    # the decode step's own ops, recorded inside the worker (the engine core's process)
    assert {"aten::linear", "aten::embedding"} <= names
    assert talker_engine.wait_for_no_live_requests() == 0
