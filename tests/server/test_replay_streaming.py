"""The gRPC service over a replayed codes file, on a real loopback socket: the stream contract."""

import numpy as np
from codecstream.client import Client
from codecstream.protocol import ChunkSchedule
from codecstream.v1 import synthesis_pb2 as pb

from tests.conftest import random_codes, reference_wav


def collect(stream) -> np.ndarray:
    return np.concatenate([chunk.codes for chunk in stream])


def test_stream_delivers_every_frame_in_order_then_end_eos(replay_server):
    codes = replay_server.source.recording.codes
    with Client(replay_server.target) as client:
        stream = client.stream_codes("Hello there.", voice="vivian")
        received = list(stream)
    np.testing.assert_array_equal(np.concatenate([c.codes for c in received]), codes)
    assert [c.seq for c in received] == list(range(len(received)))
    assert [c.num_frames for c in received] == ChunkSchedule().split(len(codes))
    assert stream.end.reason == pb.END_REASON_EOS
    assert stream.end.frames_generated == len(codes)
    assert stream.end.stats.chunks == len(received)


def test_header_carries_codec_spec_and_echoes_the_client_request_id(replay_server):
    with Client(replay_server.target) as client:
        stream = client.stream_codes("Hi.", client_request_id="turn-7")
        header = stream.open()
        list(stream)
    assert header.client_request_id == "turn-7"
    assert header.codec.num_codebooks == 16 and header.codec.codebook_size == 2048
    assert header.codec.sample_rate_hz == 24000 and header.codec.samples_per_frame == 1920
    assert header.codec.decoder_left_context_frames == 72
    assert header.codec.decoder_digest.startswith("sha256:")
    assert header.reference_frames == 0 and header.stream_id


def test_requested_chunking_is_followed(replay_server):
    with Client(replay_server.target) as client:
        sizes = [c.num_frames for c in client.stream_codes("Hi.", chunking=[1, 3, 10])]
    assert sizes == ChunkSchedule((1, 3, 10)).split(60)


def test_max_frames_ends_the_stream_with_max_frames(replay_server):
    with Client(replay_server.target) as client:
        stream = client.stream_codes("Hi.", max_frames=7)
        frames = collect(stream)
    assert len(frames) == 7
    assert stream.end.reason == pb.END_REASON_MAX_FRAMES


def test_voice_clone_header_carries_reference_codes(replay_server_factory):
    reference = random_codes(5, seed=3)
    server = replay_server_factory(reference_codes=reference)
    with Client(server.target) as client:
        stream = client.stream_codes("Hi.", task_type="Base", reference_audio=reference_wav(), reference_text="ref")
        stream.open()
        np.testing.assert_array_equal(stream.reference_codes, reference)
        list(stream)


def test_cancel_mid_stream_stops_within_one_chunk_and_releases_the_generator(replay_server_factory):
    server = replay_server_factory(codes=random_codes(400), fps=100.0)
    with Client(server.target) as client:
        stream = client.stream_codes("A long text.", chunking=[4])
        received = [next(stream) for _ in range(3)]
        end = stream.cancel(played_frames=9)
    assert end.reason == pb.END_REASON_CANCELLED
    assert end.stats.played_frames == 9
    # Frames the server produced after the cancel: at most one chunk in flight.
    assert end.frames_generated <= sum(c.num_frames for c in received) + 4 * 2
    assert server.wait_until(lambda: server.live_requests() == 0)
    assert server.wait_until(lambda: not server.service.sessions)


def test_client_disconnect_is_noticed_and_generation_stops(replay_server_factory):
    server = replay_server_factory(codes=random_codes(400), fps=100.0)
    with Client(server.target) as client:
        stream = client.stream_codes("A long text.", resumable=False)
        next(stream)
        assert server.live_requests() == 1
        stream.abandon()
        assert server.wait_until(lambda: server.live_requests() == 0)
    assert server.wait_until(lambda: not server.service.sessions)


def test_a_new_stream_can_follow_a_cancelled_one_at_once(replay_server_factory):
    server = replay_server_factory(codes=random_codes(200), fps=100.0)
    with Client(server.target) as client:
        first = client.stream_codes("One.")
        next(first)
        first.cancel()
        second = client.stream_codes("Two.", max_frames=10)
        assert len(collect(second)) == 10


def test_codec_info_and_voices(replay_server):
    with Client(replay_server.target) as client:
        info = client.codec_info()
        voices = client.voices()
    assert info.codec.codec_name == "qwen3-tts-tokenizer-12hz"
    assert info.max_frames == 2048 and info.max_text_chars == 2000
    assert list(info.default_chunking.ramp_frames) == [2, 4, 8]
    assert "vivian" in {v.name for v in voices}
