"""Requests at the engine's limits, over gRPC to the real talker engine (CPU, tiny checkpoint): refused
before the Header when they cannot fit, and told the true frame budget when they can."""

from __future__ import annotations

import grpc
import pytest
from codecstream.client import Client
from codecstream.server.replay import ReplaySource
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc
from google.protobuf import json_format

from tests.conftest import random_codes

pytestmark = pytest.mark.engine

#: max_model_len of the CPU deploy YAML (server/src/codecstream/server/deploy/talker_only_cpu.yaml).
CONTEXT_TOKENS = 4096


def call(target: str, start: pb.Start):
    responses = []
    with grpc.insecure_channel(target) as channel:
        stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
        try:
            for response in stub.Synthesize(iter([pb.SynthesizeRequest(start=start)]), timeout=120):
                responses.append(response)
        except grpc.RpcError as error:
            return responses, error
    return responses, None


def test_a_prompt_longer_than_the_engine_context_is_refused_before_the_header(engine_server):
    # 2000 characters pass max_text_chars, but each emoji is four byte-level tokens.
    responses, error = call(engine_server.target, pb.Start(text="😀" * 2000, voice="ryan"))
    assert not responses
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"the engine's context holds {CONTEXT_TOKENS}, which leaves no room for audio" in error.details()
    assert "takes 8010 tokens" in error.details()
    assert engine_server.wait_for_no_live_requests() == 0


def test_a_prompt_near_the_context_limit_is_told_its_true_frame_budget_and_ends_there(engine_server):
    for seed in range(1, 7):
        responses, error = call(engine_server.target, pb.Start(text="😀" * 1019, voice="ryan", seed=seed))
        assert error is None, error
        header, end = responses[0].header, responses[-1].end
        assert 0 < header.max_frames < 40, "the context, not the 2048-frame server limit, bounds this stream"
        frames = sum(r.chunk.num_frames for r in responses if r.HasField("chunk"))
        if end.reason == pb.END_REASON_MAX_FRAMES:
            assert frames == end.frames_generated == header.max_frames
            return
        assert end.reason == pb.END_REASON_EOS and frames < header.max_frames
    pytest.fail("no seed reached the frame budget")


def test_sampling_the_engine_would_refuse_is_refused_by_the_server_and_the_engine_keeps_serving(engine_server):
    start = pb.Start(text="Hi.", voice="ryan", sampling=pb.SamplingParams(temperature=float("inf")))
    responses, error = call(engine_server.target, start)
    assert not responses and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    with Client(engine_server.target) as client:
        assert list(client.stream_codes("Hi.", voice="ryan", seed=1, max_frames=3))


def test_an_empty_voice_speaks_with_the_model_default_voice(engine_server):
    with Client(engine_server.target) as client:
        chunks = list(client.stream_codes("Hello there.", seed=3, max_frames=5))
        voices = client.voices()
    assert sum(chunk.num_frames for chunk in chunks) > 0
    assert voices[0].name == "serena"


def test_replay_of_a_checkpoint_describes_the_same_model_as_the_engine_serving_it(engine_server, tmp_path):
    from codecstream.protocol import save_codes_file

    codes_file = tmp_path / "codes.npy"
    save_codes_file(codes_file, random_codes(4))
    replay = ReplaySource.from_file(codes_file, checkpoint=engine_server.checkpoint)
    engine = engine_server.server.service.source
    assert replay.offering == engine.offering
    assert replay.codec == engine.codec
    with grpc.insecure_channel(engine_server.target) as channel:
        stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
        served = json_format.MessageToDict(stub.GetCodecInfo(pb.GetCodecInfoRequest(), timeout=10))
        voices = stub.ListVoices(pb.ListVoicesRequest(), timeout=10)
    assert served["languages"] == list(replay.offering.languages)
    assert voices.default_voice == replay.offering.default_voice
