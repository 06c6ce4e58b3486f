"""Bad input gets a precise gRPC status and message; limits are enforced."""

import asyncio

import grpc
import pytest
from codecstream.client import Client, CodecMismatch, InvalidRequest, ResourceExhausted, StreamEnded
from codecstream.protocol import qwen3_tts_12hz_spec
from codecstream.server.limits import ServerLimits
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc

from tests.conftest import random_codes


@pytest.mark.parametrize(
    ("text", "options", "message"),
    [
        ("   ", {}, "text is empty"),
        ("x" * 2001, {}, "text has 2001 characters, the limit is 2000"),
        ("Hi.", {"voice": "nobody"}, "unknown voice 'nobody'; this model has: serena, vivian, uncle_fu"),
        ("Hi.", {"language": "Klingon"}, "unknown language 'Klingon'; this model speaks: Auto, Chinese, English"),
        ("Hi.", {"language": "Sichuan_Dialect"}, "unknown language 'Sichuan_Dialect'"),
        ("Hi.", {"max_frames": 5000}, "max_frames 5000 exceeds the server limit 2048"),
        ("Hi.", {"task_type": "Base", "reference_audio": b"x"}, "task type BASE is not served by this model"),
        ("Hi.", {"task_type": "VoiceDesign"}, "VOICE_DESIGN needs instructions"),
        ("Hi.", {"reference_audio": b"x"}, "reference_audio is only used by task type BASE"),
        ("Hi.", {"temperature": 0.0}, r"sampling.temperature must be in \[0.01, 2\], got 0"),
        ("Hi.", {"top_p": 1.5}, r"sampling.top_p must be in \(0, 1\], got 1.5"),
        ("Hi.", {"client_request_id": "x" * 129}, "client_request_id is longer than 128 bytes"),
    ],
)
def test_invalid_start_is_refused_with_invalid_argument(replay_server, text, options, message):
    with Client(replay_server.target) as client:
        stream = client.stream_codes(text, **options)
        with pytest.raises(InvalidRequest, match=message) as caught:
            stream.open()
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_codec_mismatch_is_refused_with_failed_precondition(replay_server):
    wrong = qwen3_tts_12hz_spec("sha256:" + "1" * 64)
    with Client(replay_server.target) as client, pytest.raises(CodecMismatch, match="decoder_digest: expected"):
        client.stream_codes("Hi.", expected_codec=wrong).open()


def test_matching_expected_codec_is_accepted(replay_server):
    with Client(replay_server.target) as client:
        codec = client.codec_info().codec
        assert list(client.stream_codes("Hi.", expected_codec=codec))


def raw_call(target: str, *messages: pb.SynthesizeRequest) -> grpc.RpcError:
    """Send exactly these messages and return the error status the server ends the call with."""
    with grpc.insecure_channel(target) as channel:
        stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            for _ in stub.Synthesize(iter(messages), timeout=10):
                pass
    return caught.value


def test_stream_without_any_message_is_refused(replay_server):
    error = raw_call(replay_server.target)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "without a Start or Resume" in error.details()


def test_first_message_must_be_start_or_resume(replay_server):
    error = raw_call(replay_server.target, pb.SynthesizeRequest(cancel=pb.Cancel()))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "first message must be start or resume, got cancel" in error.details()


def test_unknown_task_type_value_is_refused(replay_server):
    error = raw_call(replay_server.target, pb.SynthesizeRequest(start=pb.Start(text="Hi.", task_type=99)))
    assert "unknown task type 99" in error.details()


def test_second_start_on_one_stream_is_a_protocol_violation(replay_server_factory):
    server = replay_server_factory(codes=random_codes(400), fps=50.0)
    start = pb.SynthesizeRequest(start=pb.Start(text="Hi."))
    error = raw_call(server.target, start, start)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "start after the first message" in error.details()
    assert server.wait_until(lambda: server.live_requests() == 0)


def test_resume_of_unknown_stream_is_not_found(replay_server):
    error = raw_call(replay_server.target, pb.SynthesizeRequest(resume=pb.Resume(stream_id="nope")))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_concurrent_stream_limit_gives_resource_exhausted(replay_server_factory):
    server = replay_server_factory(codes=random_codes(400), fps=20.0, limits=ServerLimits(max_concurrent_streams=2))
    with Client(server.target) as client:
        streams = [client.stream_codes("Hi.") for _ in range(2)]
        for stream in streams:
            stream.open()
        with pytest.raises(ResourceExhausted, match="limit of 2 concurrent streams"):
            client.stream_codes("Hi.").open()
        for stream in streams:
            stream.cancel()


def test_per_client_rate_limit_gives_resource_exhausted_with_retry_hint(replay_server_factory):
    server = replay_server_factory(codes=random_codes(4), limits=ServerLimits(streams_per_client_per_minute=2))
    with Client(server.target) as client:
        for _ in range(2):
            list(client.stream_codes("Hi."))
        with pytest.raises(ResourceExhausted, match=r"exceeded 2 streams per minute; retry in \d+\.\d s"):
            client.stream_codes("Hi.").open()


def test_graceful_shutdown_ends_running_streams_with_error_and_reason(replay_server_factory):
    server = replay_server_factory(codes=random_codes(2000), fps=12.5)
    with Client(server.target) as client:
        stream = client.stream_codes("A long text.")
        next(stream)
        stopping = asyncio.run_coroutine_threadsafe(server.server.stop(grace_s=0.2), server.loop.loop)
        with pytest.raises(StreamEnded, match="server shutting down"):
            for _ in stream:
                pass
        stopping.result(timeout=20)
    assert stream.end.reason == pb.END_REASON_ERROR
    assert server.live_requests() == 0
