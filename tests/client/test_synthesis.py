"""Client-side decoding of a stream: PCM parity, voice-clone priming, cancel/reset, resume, mismatch.

The server side is the real gRPC service replaying recorded codes (it announces the tiny
checkpoint's decoder digest); the decoder is the client's eager-torch runtime. The real-engine
end-to-end tests live in tests/e2e.
"""

import numpy as np
import pytest
from codecstream.client import Client, CodecMismatch
from codecstream.client.runtimes import open_decoder
from codecstream.decoder import decode_utterance, load_decoder
from codecstream.protocol import decoder_digest
from codecstream.protocol.pcm import snr_db

from tests.conftest import random_codes, reference_wav
from tests.tcp_proxy import CuttableProxy


@pytest.fixture(scope="module")
def reference_model(checkpoint):
    return load_decoder(checkpoint)


@pytest.fixture
def decoder(checkpoint):
    return open_decoder(checkpoint, backend="torch")


def pcm_of(stream) -> np.ndarray:
    return np.concatenate([chunk.samples for chunk in stream])


def test_streamed_pcm_resampled_chunk_by_chunk_equals_the_resampled_full_decode(
    replay_server_factory, checkpoint, reference_model, decoder
):
    soxr = pytest.importorskip("soxr")
    from codecstream.client.resample import StreamResampler

    codes = random_codes(60, seed=2)
    server = replay_server_factory(codes=codes, decoder_digest=decoder_digest(checkpoint))
    resampler = StreamResampler(16_000)
    with Client(server.target) as client:
        parts = [resampler(chunk.samples) for chunk in client.synthesize("Hello.", decoder=decoder)]
    pcm = np.concatenate([*parts, resampler(np.zeros(0, np.float32), last=True)])
    reference = soxr.resample(decode_utterance(reference_model, codes), 24_000, 16_000, quality="HQ")
    assert len(pcm) == len(reference) == 60 * 1280
    assert snr_db(reference, pcm) > 90  # the decoders' own parity: resampling chunk by chunk adds nothing


def test_streamed_pcm_has_1920_samples_per_frame_and_equals_the_full_decode(
    replay_server_factory, checkpoint, reference_model, decoder
):
    codes = random_codes(90, seed=1)
    server = replay_server_factory(codes=codes, decoder_digest=decoder_digest(checkpoint))
    with Client(server.target) as client:
        stream = client.synthesize("Hello.", decoder=decoder)
        pcm = pcm_of(stream)
    assert len(pcm) == 90 * 1920
    assert snr_db(decode_utterance(reference_model, codes), pcm) > 90
    assert stream.stats.frames == 90 and stream.stats.time_to_first_audio_s > 0
    assert 0 < stream.stats.wire_bytes_per_audio_second < 1500


def test_voice_clone_reference_codes_prime_the_decoder_and_are_not_played(
    replay_server_factory, checkpoint, reference_model, decoder
):
    reference, codes = random_codes(12, seed=2), random_codes(30, seed=3)
    server = replay_server_factory(codes=codes, reference_codes=reference, decoder_digest=decoder_digest(checkpoint))
    with Client(server.target) as client:
        pcm = pcm_of(client.synthesize("Hi.", decoder=decoder, task_type="Base", reference_audio=reference_wav()))
    assert len(pcm) == 30 * 1920
    expected = decode_utterance(reference_model, np.concatenate([reference, codes]))[12 * 1920 :]
    assert snr_db(expected, pcm) > 90


def test_cancel_stops_the_stream_and_the_next_stream_decodes_from_scratch(
    replay_server_factory, checkpoint, reference_model, decoder
):
    codes = random_codes(300, seed=4)
    server = replay_server_factory(codes=codes, fps=100.0, decoder_digest=decoder_digest(checkpoint))
    with Client(server.target) as client:
        first = client.synthesize("Long.", decoder=decoder, chunking=[4])
        heard = [next(first) for _ in range(2)]
        end = first.cancel(played_frames=heard[-1].first_frame + heard[-1].num_frames)
        assert end.reason == 2  # CANCELLED
        # The replay server makes frames at its own pace (100/s) while the client decodes what it took:
        # how many it made by the cancel depends on the host's load (16 quiet, 20 under CI's), not
        # on the cancel, which stops it long before its 300.
        assert 8 <= end.frames_generated < len(codes) // 2
        assert list(first) == []  # nothing more comes out of a cancelled stream
        second = pcm_of(client.synthesize("Again.", decoder=decoder, max_frames=20))
    assert snr_db(decode_utterance(reference_model, codes[:20]), second) > 90
    assert server.wait_until(lambda: server.live_requests() == 0)


def test_resume_after_a_cut_connection_gives_the_same_pcm_as_an_uninterrupted_stream(
    replay_server_factory, checkpoint, decoder
):
    codes = random_codes(120, seed=5)
    server = replay_server_factory(codes=codes, fps=120.0, decoder_digest=decoder_digest(checkpoint))
    with Client(server.target) as client:
        uninterrupted = pcm_of(client.synthesize("Hi.", decoder=decoder, chunking=[5]))
    proxy = CuttableProxy(server.server.port)
    try:
        with Client(proxy.target) as client:
            stream = client.synthesize("Hi.", decoder=decoder, chunking=[5])
            pieces = [next(stream).samples for _ in range(3)]
            proxy.cut()
            pieces += [chunk.samples for chunk in stream]
    finally:
        proxy.close()
    assert stream.resumes >= 1
    np.testing.assert_array_equal(np.concatenate(pieces), uninterrupted)


def test_a_server_for_other_decoder_weights_is_refused_before_any_audio(replay_server_factory, decoder):
    server = replay_server_factory(decoder_digest="sha256:" + "7" * 64)
    with Client(server.target) as client, pytest.raises(CodecMismatch, match="decoder_digest"):
        next(iter(client.synthesize("Hi.", decoder=decoder)))
