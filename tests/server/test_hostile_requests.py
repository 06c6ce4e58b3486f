"""What a careless or hostile client sends gets a precise status that names the field and the limit,
echoes at most a short prefix of the input, and leaves the server serving (replay server, real sockets)."""

from __future__ import annotations

import logging
import threading

import grpc
import numpy as np
import pytest
from codecstream.client import Client, InvalidRequest
from codecstream.protocol import qwen3_tts_12hz_spec
from codecstream.server.limits import ServerLimits
from codecstream.server.request import ModelOffering, TaskType, VoiceInfo
from codecstream.server.request_parsing import parse_start
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import random_codes, reference_wav

#: Far above gRPC's 16 KB metadata limit of Python clients, far below the 4 MB message limit.
HUGE = 70_000
#: A status message that quotes client input only as a short prefix stays well below this.
SHORT_DETAILS = 400


@pytest.fixture
def clone_server(replay_server_factory):
    """A replay server that serves BASE (its recording has reference codes)."""
    return replay_server_factory(codes=random_codes(20), reference_codes=random_codes(4, seed=1))


def call(target: str, *messages: pb.SynthesizeRequest, metadata=(), timeout: float = 20):
    """Send exactly these messages; return (responses, error or None)."""
    responses = []
    with grpc.insecure_channel(target) as channel:
        stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
        try:
            for response in stub.Synthesize(iter(messages), metadata=metadata, timeout=timeout):
                responses.append(response)
        except grpc.RpcError as error:
            return responses, error
    return responses, None


def refusal(target: str, start: pb.Start, **kwargs) -> grpc.RpcError:
    responses, error = call(target, pb.SynthesizeRequest(start=start), **kwargs)
    assert error is not None, f"expected a refusal, got {[r.WhichOneof('kind') for r in responses]}"
    assert not responses, "a refusal comes before any Header"
    return error


def assert_serving(target: str) -> None:
    with grpc.insecure_channel(target) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    with Client(target) as client:
        assert list(client.stream_codes("Still serving."))


@pytest.mark.parametrize(
    ("start", "message"),
    [
        (pb.Start(text="Hi.", voice="v" * HUGE), f"voice is {HUGE} bytes, the limit is 64"),
        (pb.Start(text="Hi.", language="l" * HUGE), f"language is {HUGE} bytes, the limit is 64"),
        (pb.Start(text="Hi.", instructions="i" * 501), "instructions has 501 characters, the limit is 500"),
        (pb.Start(text="x" * HUGE), f"text has {HUGE} characters, the limit is 2000"),
        (
            pb.Start(text="Hi.", chunking=pb.ChunkingPolicy(ramp_frames=[4] * HUGE)),
            f"chunking: ramp_frames has {HUGE} entries, the limit is 64",
        ),
        (pb.Start(text="Hi.", voice="nobody" * 10), "unknown voice 'nobodynobody"),
    ],
)
def test_oversized_strings_are_refused_naming_the_field_and_the_limit_without_echoing_them(
    replay_server, start, message
):
    error = refusal(replay_server.target, start)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.details()
    assert len(error.details()) < SHORT_DETAILS
    assert_serving(replay_server.target)


def test_an_oversized_expected_codec_is_refused_as_a_mismatch_quoting_only_a_prefix(replay_server):
    codec = qwen3_tts_12hz_spec("sha256:" + "0" * 64)
    codec.codec_name = "n" * HUGE
    error = refusal(replay_server.target, pb.Start(text="Hi.", expected_codec=codec))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "codec_name: expected 'qwen3-tts-tokenizer-12hz', got 'nnnn" in error.details()
    assert len(error.details()) < SHORT_DETAILS


def test_a_message_over_the_transport_limit_is_refused_by_grpc_before_it_is_parsed(replay_server):
    error = refusal(replay_server.target, pb.Start(text="Hi.", instructions="i" * 3_900_000))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(ServerLimits().max_request_bytes(reference_audio=False)) in error.details()
    assert_serving(replay_server.target)


def test_an_oversized_resume_stream_id_is_invalid_argument_not_a_metadata_overflow(replay_server):
    _, error = call(replay_server.target, pb.SynthesizeRequest(resume=pb.Resume(stream_id="s" * HUGE)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == f"resume.stream_id is {HUGE} bytes, the limit is 64"


def test_a_start_of_the_largest_sizes_the_limits_allow_passes_the_transport(clone_server):
    limits = ServerLimits()
    rate = 96_000
    # Stereo float32 at 96 kHz: as many seconds as fit the byte limit (about 10.9 s).
    seconds = (limits.max_reference_audio_bytes - 4096) / (rate * 2 * 4)
    assert limits.min_reference_audio_s <= seconds <= limits.max_reference_audio_s
    audio = reference_wav(samples=np.zeros((int(seconds * rate), 2), dtype=np.float32), rate=rate)
    assert len(audio) <= limits.max_reference_audio_bytes
    start = pb.Start(
        text="é" * limits.max_text_chars,
        task_type=pb.TASK_TYPE_BASE,
        reference_audio=pb.ReferenceAudio(audio=audio, transcript="é" * limits.max_reference_transcript_chars),
    )
    responses, error = call(clone_server.target, pb.SynthesizeRequest(start=start))
    assert error is None, error
    assert responses[0].HasField("header") and responses[-1].end.reason == pb.END_REASON_EOS


# WAV bytes make poor test ids: libsndfile stamps the time into a float file's PEAK chunk, so each
# process (each xdist worker) would name the cases differently.
UNUSABLE_REFERENCES = [
    (reference_wav(samples=np.zeros(1)), "lasts 0.000 s, shorter than the 1 s the speaker encoder needs"),
    (
        reference_wav(samples=np.zeros(1024), rate=24_000),
        "lasts 0.042 s, shorter than the 1 s the speaker encoder needs",
    ),
    (
        reference_wav(samples=np.full(24_000, np.nan), rate=24_000),
        "has a non-finite sample (NaN or infinity) at sample 0",
    ),
    (
        reference_wav(samples=np.r_[np.zeros(100), np.inf, np.zeros(24_000)], rate=24_000),
        "has a non-finite sample (NaN or infinity) at sample 100",
    ),
    (reference_wav(samples=np.zeros((24_000, 6)), rate=24_000), "has 6 channels; mono or stereo expected"),
    (reference_wav(samples=np.zeros(4_000), rate=4_000), "is sampled at 4000 Hz; 8000 to 192000 Hz accepted"),
    (reference_wav(seconds=31, rate=8_000), "lasts 31.0 s, longer than the 30 s allowed"),
    # A limit missed by one sample is reported as missed, not rounded onto the limit.
    (
        reference_wav(samples=np.zeros(23_999), rate=24_000),
        "lasts 0.999 s, shorter than the 1 s the speaker encoder needs",
    ),
    (reference_wav(samples=np.zeros(30 * 8_000 + 1), rate=8_000), "lasts 30.1 s, longer than the 30 s allowed"),
    (b"not audio at all", "is not a readable WAV, FLAC or OGG file (Format not recognised)"),
    (b"\0" * (8 * 1024 * 1024 + 1), "is 8388609 bytes, the limit is 8388608 bytes"),
]


@pytest.mark.parametrize(("audio", "message"), UNUSABLE_REFERENCES, ids=[m for _, m in UNUSABLE_REFERENCES])
def test_reference_audio_the_engine_cannot_use_is_refused_before_it_reaches_the_engine(clone_server, audio, message):
    start = pb.Start(
        text="Hi.", task_type=pb.TASK_TYPE_BASE, reference_audio=pb.ReferenceAudio(audio=audio, transcript="Ref.")
    )
    error = refusal(clone_server.target, start)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"reference_audio.audio {message}" in error.details()
    assert "BytesIO" not in error.details() and len(error.details()) < SHORT_DETAILS
    assert_serving(clone_server.target)


def test_an_oversized_reference_transcript_is_refused(clone_server):
    start = pb.Start(
        text="Hi.",
        task_type=pb.TASK_TYPE_BASE,
        reference_audio=pb.ReferenceAudio(audio=reference_wav(), transcript="t" * 1001),
    )
    assert (
        "reference_audio.transcript has 1001 characters, the limit is 1000"
        in refusal(clone_server.target, start).details()
    )


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        (pb.SamplingParams(temperature=float("inf")), r"sampling.temperature must be in [0.01, 2], got inf"),
        (pb.SamplingParams(temperature=float("nan")), r"sampling.temperature must be in [0.01, 2], got nan"),
        (pb.SamplingParams(temperature=3.0), r"sampling.temperature must be in [0.01, 2], got 3"),
        # vLLM would silently raise it to 0.01.
        (pb.SamplingParams(temperature=1e-30), r"sampling.temperature must be in [0.01, 2], got 1e-30"),
        (pb.SamplingParams(top_p=float("nan")), r"sampling.top_p must be in (0, 1], got nan"),
        (
            pb.SamplingParams(repetition_penalty=float("inf")),
            "sampling.repetition_penalty must be finite and > 0, got inf",
        ),
    ],
)
def test_sampling_values_the_engine_would_refuse_are_refused_before_the_header(replay_server, sampling, message):
    error = refusal(replay_server.target, pb.Start(text="Hi.", sampling=sampling))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.details()


@pytest.mark.parametrize(
    ("sampling", "field", "sent"),
    [
        (pb.SamplingParams(temperature=0.01), "temperature", 0.01),
        (pb.SamplingParams(temperature=2.0), "temperature", 2.0),
        (pb.SamplingParams(temperature=0.7), "temperature", 0.7),
        (pb.SamplingParams(top_p=1.0), "top_p", 1.0),
        (pb.SamplingParams(top_p=0.95), "top_p", 0.95),
        (pb.SamplingParams(repetition_penalty=1.05), "repetition_penalty", 1.05),
    ],
)
def test_sampling_values_at_their_limits_are_taken_as_the_client_wrote_them(sampling, field, sent):
    """The fields are float32 on the wire: 0.01 arrives as 0.009999999776, which a float64 range check
    refused ("must be in [0.01, 2], got 0.01"); the engine gets the decimal the client wrote."""
    offering = ModelOffering(task_types=(TaskType.CUSTOM_VOICE,), voices=(VoiceInfo("ryan"),))
    parsed = parse_start(
        pb.Start(text="Hi.", sampling=sampling), offering, qwen3_tts_12hz_spec("sha256:0"), ServerLimits()
    )
    assert getattr(parsed.request.sampling, field) == sent


def test_a_sampling_value_just_outside_its_range_is_refused_as_the_client_wrote_it(replay_server):
    error = refusal(replay_server.target, pb.Start(text="Hi.", sampling=pb.SamplingParams(temperature=0.0099)))
    assert "sampling.temperature must be in [0.01, 2], got 0.0099" in error.details()


def test_codec_info_states_every_limit_the_server_enforces(replay_server, clone_server):
    limits = ServerLimits()
    with Client(replay_server.target) as client:
        info = client.codec_info()
    with Client(clone_server.target) as client:
        clone_info = client.codec_info()
    assert info.max_text_chars == 2000 and info.max_instructions_chars == 500
    assert info.max_reference_transcript_chars == 1000
    assert info.max_reference_audio_bytes == 8 * 1024 * 1024
    assert (info.min_reference_audio_ms, info.max_reference_audio_ms) == (1_000, 30_000)
    # A server that takes no reference audio refuses MB-sized messages in gRPC, before parsing them.
    assert info.max_request_bytes == limits.max_request_bytes(reference_audio=False) < 100_000
    assert clone_info.max_request_bytes == limits.max_request_bytes(reference_audio=True)
    assert clone_info.max_request_bytes > clone_info.max_reference_audio_bytes
    assert info.first_message_timeout_ms == 10_000 and info.stalled_client_timeout_ms == 30_000
    assert (info.text_input_timeout_ms, info.max_text_input_ms) == (60_000, 600_000)
    assert info.max_streams_per_client == 256
    assert (info.control_messages_per_s, info.control_message_burst) == (200, 4000)


def test_an_empty_voice_gets_the_model_default_voice_which_list_voices_names(replay_server):
    with Client(replay_server.target) as client:
        voices = client.voices()
        assert list(client.stream_codes("Hi.", voice=""))
    default = client_default_voice(replay_server.target)
    assert default == "serena" == voices[0].name


def client_default_voice(target: str) -> str:
    with grpc.insecure_channel(target) as channel:
        return (
            synthesis_pb2_grpc.SynthesisServiceStub(channel).ListVoices(pb.ListVoicesRequest(), timeout=5).default_voice
        )


def raw_synthesize(target: str, *payloads: bytes) -> tuple[list[pb.SynthesizeResponse], grpc.RpcError | None]:
    """Send these bytes as SynthesizeRequest messages, unparsed (a client with its own encoder)."""
    responses = []
    with grpc.insecure_channel(target) as channel:
        method = channel.stream_stream(
            "/codecstream.v1.SynthesisService/Synthesize",
            request_serializer=lambda data: data,
            response_deserializer=pb.SynthesizeResponse.FromString,
        )
        try:
            for response in method(iter(payloads), timeout=20):
                responses.append(response)
        except grpc.RpcError as error:
            return responses, error
    return responses, None


def start_with_text_bytes(text: bytes) -> bytes:
    """A SynthesizeRequest{start: Start{text}} encoded by hand, so `text` can be invalid UTF-8."""
    start = b"\x0a" + bytes([len(text)]) + text
    return b"\x0a" + bytes([len(start)]) + start


def test_a_string_field_that_is_not_utf8_is_invalid_argument_not_unknown(replay_server):
    lone_surrogate = b"\xed\xa0\x80"  # what grpc-js sends for a lone UTF-16 surrogate
    responses, error = raw_synthesize(replay_server.target, start_with_text_bytes(b"Hi " + lone_surrogate))
    assert not responses and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "a message could not be parsed as codecstream.v1.SynthesizeRequest: start.text is not valid UTF-8"
    )
    assert_serving(replay_server.target)


@pytest.mark.parametrize(
    ("garbage", "why"),
    [
        (b"\xff\xff\xff", "the field at byte 0 is cut short"),
        (b"\x0a\x05ab", "the field at byte 0 is cut short"),
        (b"\x0f\x00", "the field at byte 0 has wire type 7, which protobuf does not have"),
        (b"\x0a\x03\x0a\x09a", "the field at byte 2 is cut short"),
    ],
)
def test_bytes_that_are_no_protobuf_are_refused_for_what_they_are_not_blamed_on_utf8(replay_server, garbage, why):
    responses, error = raw_synthesize(replay_server.target, garbage)
    assert not responses and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == f"a message could not be parsed as codecstream.v1.SynthesizeRequest: {why}"


def test_an_unparsable_message_after_the_header_ends_the_stream_with_end_error_then_invalid_argument(
    replay_server_factory,
):
    server = replay_server_factory(codes=random_codes(400), fps=50.0)
    good = pb.SynthesizeRequest(start=pb.Start(text="Hi.")).SerializeToString()
    responses, error = raw_synthesize(server.target, good, b"\x0a\x03\x0a\x01\xff")
    assert responses[0].HasField("header")
    assert responses[-1].end.reason == pb.END_REASON_ERROR
    assert "protocol violation: a message could not be parsed" in responses[-1].end.message
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_second_start_after_the_header_gets_end_error_then_invalid_argument(replay_server_factory):
    server = replay_server_factory(codes=random_codes(400), fps=50.0)
    start = pb.SynthesizeRequest(start=pb.Start(text="Hi."))
    responses, error = call(server.target, start, start)
    assert responses[0].HasField("header")
    kinds = [r.WhichOneof("kind") for r in responses]
    assert kinds.count("end") == 1 and kinds[-1] == "end", "End is always last, exactly once"
    assert responses[-1].end.reason == pb.END_REASON_ERROR
    violation = "start after the first message: only cancel, ack and text may follow"
    assert responses[-1].end.message == f"protocol violation: {violation}"
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == violation
    assert server.wait_until(lambda: server.live_requests() == 0)


def test_a_call_that_sends_no_first_message_is_closed_after_the_first_message_timeout(replay_server_factory):
    server = replay_server_factory(limits=ServerLimits(first_message_timeout_s=0.5))
    release = threading.Event()

    def nothing_yet():
        release.wait(20)
        yield from ()

    with grpc.insecure_channel(server.target) as channel:
        stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Synthesize(nothing_yet(), timeout=20))
        release.set()
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert caught.value.details() == "no Start or Resume within 0.5 s of opening the call"


def test_garbage_bytes_to_get_codec_info_are_invalid_argument(replay_server):
    with grpc.insecure_channel(replay_server.target) as channel:
        method = channel.unary_unary(
            "/codecstream.v1.SynthesisService/GetCodecInfo",
            request_serializer=lambda data: data,
            response_deserializer=pb.GetCodecInfoResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as caught:
            method(b"\x0a\x05\xff", timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_concurrent_voice_clone_opens_cannot_overrun_the_stream_limit(replay_server_factory):
    # Each open decodes a long reference in a thread before taking the engine: the slot must be
    # taken before that wait, or every concurrent open passes the check.
    server = replay_server_factory(
        codes=random_codes(2000),
        reference_codes=random_codes(4, seed=1),
        fps=25.0,
        limits=ServerLimits(max_concurrent_streams=1),
    )
    start = pb.Start(
        text="Hi.",
        task_type=pb.TASK_TYPE_BASE,
        reference_audio=pb.ReferenceAudio(audio=reference_wav(seconds=29, rate=48_000), transcript="Ref."),
    )
    outcomes: list[str] = []

    def open_one():
        with grpc.insecure_channel(server.target) as channel:
            responses = synthesis_pb2_grpc.SynthesisServiceStub(channel).Synthesize(
                iter([pb.SynthesizeRequest(start=start)]), timeout=60
            )
            try:
                outcomes.append(next(responses).WhichOneof("kind"))
            except grpc.RpcError as error:
                outcomes.append(error.code().name)
            responses.cancel()

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["RESOURCE_EXHAUSTED"] * 3 + ["header"]


def test_invalid_request_messages_never_carry_more_than_a_prefix_of_the_voice(replay_server):
    with Client(replay_server.target) as client, pytest.raises(InvalidRequest) as caught:
        client.stream_codes("Hi.", voice="x" * 60).open()
    assert "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'… (60 bytes)" in str(caught.value)


def test_no_log_line_carries_more_than_a_prefix_of_client_input(replay_server, caplog):
    caplog.set_level(logging.DEBUG)
    refusal(replay_server.target, pb.Start(text="Hi.", voice="v" * HUGE))
    refusal(replay_server.target, pb.Start(text="x" * HUGE))
    call(replay_server.target, pb.SynthesizeRequest(resume=pb.Resume(stream_id="s" * HUGE)))
    assert caplog.records, "the refusals are logged"
    assert max(len(record.getMessage()) for record in caplog.records) < SHORT_DETAILS
