"""Voice clone (Base) on the real engine: the talker encodes the reference audio itself, and the
stream carries those reference codes (the client's decoder context) before any frame."""

from __future__ import annotations

import math

import numpy as np
import pytest
from codecstream.server.limits import ServerLimits
from codecstream.server.reference_audio import decode_reference_audio
from codecstream.server.request import SynthesisRequest, TaskType
from codecstream.server.source import Finished, FinishReason, Frames

from tests.conftest import reference_wav
from tests.server.engine_harness import start_talker_engine, stop_talker_engine

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def base_engine(tmp_path_factory):
    # Module scope: this second engine is gone before other modules' tests run.
    engine = start_talker_engine(tmp_path_factory.mktemp("qwen3-tts-tiny-base"), variant="base")
    try:
        yield engine
    finally:
        stop_talker_engine(engine)


def clone_request(reference_text: str, audio: bytes | None = None) -> SynthesisRequest:
    reference = decode_reference_audio(reference_wav(1.5, 16_000) if audio is None else audio, ServerLimits())
    return SynthesisRequest(
        text="Say this in the reference voice.",
        task_type=TaskType.BASE,
        language="English",
        reference=reference,
        reference_text=reference_text,
        seed=1,
        max_frames=20,
    )


def test_in_context_clone_carries_the_reference_codes_before_the_first_frame(base_engine):
    async def open_only():
        generation = await base_engine.source.open(clone_request("This is the reference."), "icl")
        reference = generation.reference_codes.copy()
        events = [event async for event in generation]
        return reference, np.concatenate([e.codes for e in events if isinstance(e, Frames)]), events[-1]

    reference, frames, last = base_engine.run(open_only())
    # 1.5 s of 16 kHz audio is 36000 samples at the encoder's 24 kHz: ceil(36000 / 1920) frames.
    assert reference.shape == (math.ceil(36_000 / 1_920), 16) and reference.dtype == np.int16
    assert reference.min() >= 0 and reference.max() < 2048
    assert len(frames) > 0 and frames[:, 0].min() >= 1
    assert last in (Finished(FinishReason.EOS), Finished(FinishReason.LENGTH))
    assert base_engine.wait_for_no_live_requests() == 0


def test_clone_without_a_transcript_uses_the_speaker_embedding_and_has_no_reference_codes(base_engine):
    collected = base_engine.collect(clone_request(""), "xvector")
    assert collected.generation.reference_codes.shape == (0, 16)
    assert len(collected.codes) > 0


def test_the_shortest_reference_the_server_accepts_is_one_the_engine_can_encode(base_engine):
    shortest = ServerLimits().min_reference_audio_s
    audio = reference_wav(samples=np.zeros(int(shortest * 24_000)), rate=24_000)
    collected = base_engine.collect(clone_request("Short.", audio), "shortest-reference")
    assert len(collected.codes) > 0
    base_engine.run(base_engine.source.check_health())


def test_a_base_checkpoint_offers_only_voice_clone(base_engine):
    assert base_engine.source.offering.task_types == (TaskType.BASE,)
    assert base_engine.source.offering.default_voice == ""


@pytest.fixture(scope="module")
def base_server(base_engine):
    """The gRPC server around the Base engine (closing it closes the engine: module scope)."""
    from codecstream.server.app import CodecStreamServer, ServerOptions

    server = CodecStreamServer(base_engine.source, ServerOptions(port=0, shutdown_grace_s=1.0))
    port = base_engine.run(server.start())
    try:
        yield f"127.0.0.1:{port}"
    finally:
        base_engine.run(server.stop(grace_s=1.0), timeout=120)


def test_a_base_server_refuses_a_preset_voice_before_the_engine(base_engine, base_server):
    from codecstream.client import Client, InvalidRequest

    with Client(base_server) as client, pytest.raises(InvalidRequest, match="task type CUSTOM_VOICE is not served"):
        client.stream_codes("Hi.", voice="ryan").open()
    assert base_engine.live_requests() == 0


@pytest.mark.parametrize(
    ("samples", "rate"),
    [(np.zeros(1), 16_000), (np.zeros(1024), 24_000), (np.full(24_000, np.nan), 24_000)],
    ids=["one-sample", "1024-samples-the-engine-dies-on", "all-nan"],
)
def test_reference_audio_that_would_kill_the_engine_is_refused_and_the_engine_keeps_serving(
    base_engine, base_server, samples, rate
):
    import grpc
    from codecstream.v1 import synthesis_pb2 as pb
    from codecstream.v1 import synthesis_pb2_grpc

    audio = reference_wav(samples=samples, rate=rate)
    start = pb.Start(
        text="Hi.", task_type=pb.TASK_TYPE_BASE, reference_audio=pb.ReferenceAudio(audio=audio, transcript="R.")
    )
    with grpc.insecure_channel(base_server) as channel:
        stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Synthesize(iter([pb.SynthesizeRequest(start=start)]), timeout=60))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("reference_audio.audio ")
    base_engine.run(base_engine.source.check_health())
    assert len(base_engine.collect(clone_request("After."), "after-refusal").codes) > 0
