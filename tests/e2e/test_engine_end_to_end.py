"""End to end on this machine: the real vLLM-Omni talker (CPU, tiny checkpoint) behind the real gRPC
server on a loopback socket, and the client decoding on the device."""

import subprocess
import sys
import wave

import numpy as np
import pytest
from codecstream.client import Client, CodecMismatch, InvalidRequest
from codecstream.client.runtimes import open_decoder
from codecstream.decoder import decode_utterance, load_decoder
from codecstream.protocol.pcm import snr_db
from codecstream.testing.random_speech_tokenizer import write_speech_tokenizer
from codecstream.v1 import synthesis_pb2 as pb

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def speech_tokenizer(engine_server):
    return engine_server.checkpoint / "speech_tokenizer"


def test_engine_speech_decodes_on_the_client_equal_to_the_reference_decode(engine_server, speech_tokenizer):
    decoder = open_decoder(speech_tokenizer, backend="torch")
    with Client(engine_server.target) as client:
        stream = client.synthesize("Hello from the talker.", decoder=decoder, voice="ryan", seed=1, max_frames=60)
        chunks = list(stream)
    codes = np.concatenate([c.codes for c in chunks])
    pcm = np.concatenate([c.samples for c in chunks])
    assert stream.end.reason in (pb.END_REASON_EOS, pb.END_REASON_MAX_FRAMES)
    assert len(codes) >= 2 and len(pcm) == len(codes) * 1920
    assert snr_db(decode_utterance(load_decoder(speech_tokenizer), codes), pcm) > 90
    # Chunks arrive as the engine steps, not all at the end.
    assert chunks[0].arrived_s < chunks[-1].arrived_s


def test_cancel_stops_the_engine_within_one_chunk_and_the_next_request_runs(engine_server, speech_tokenizer):
    decoder = open_decoder(speech_tokenizer, backend="torch")
    text = "A long sentence that will be interrupted."
    with Client(engine_server.target) as client:
        # A seeded request generates the same frames every time: find one that runs long uncut.
        lengths = {}
        for seed in range(2, 10):
            lengths[seed] = sum(
                c.num_frames for c in client.stream_codes(text, voice="ryan", seed=seed, max_frames=400)
            )
            if lengths[seed] >= 12:
                break
        seed, uncut = max(lengths.items(), key=lambda item: item[1])
        assert uncut >= 12, f"no seed among {lengths} gives a long utterance"
        stream = client.synthesize(text, decoder=decoder, voice="ryan", seed=seed, max_frames=400, chunking=[2])
        first = next(stream)
        end = stream.cancel(played_frames=first.num_frames)
        assert end.reason == pb.END_REASON_CANCELLED and end.stats.played_frames == first.num_frames
        assert end.frames_generated < uncut
        assert engine_server.wait_for_no_live_requests() == 0
        again = client.synthesize("Next turn.", decoder=decoder, voice="ryan", seed=3, max_frames=10)
        assert sum(c.num_frames for c in again) >= 1


def test_streamed_text_is_spoken_by_the_engine_as_one_growing_request(engine_server, speech_tokenizer):
    decoder = open_decoder(speech_tokenizer, backend="torch")
    with Client(engine_server.target) as client:
        info = client.codec_info()
        assert info.streamed_text_grows and info.start_gate_tokens == 4
        stream = client.stream_text("Hi", decoder=decoder, voice="ryan", seed=4)
        stream.push_text(" there.")
        stream.push_text(" Bye")
        stream.end_input()
        chunks = list(stream)
    # Each chunk names the text tokens its frames were conditioned on: in order, tiling the text.
    spans = [(c.text_start, c.text_end) for c in chunks if c.text_end > c.text_start]
    assert "".join(stream.text[a:b] for a, b in spans) == stream.text
    assert stream.end.reason == pb.END_REASON_EOS and stream.end.text_offset_played == len(stream.text)
    codes = np.concatenate([c.codes for c in chunks])
    pcm = np.concatenate([c.samples for c in chunks])
    # One decoder state for the whole stream: it equals one full decode of all its codes.
    assert snr_db(decode_utterance(load_decoder(speech_tokenizer), codes), pcm) > 90
    assert engine_server.wait_for_no_live_requests() == 0


def test_client_with_another_decoder_is_refused_before_generation(engine_server, tmp_path):
    other = open_decoder(write_speech_tokenizer(tmp_path / "other", preset="tiny", seed=99), backend="torch")
    with Client(engine_server.target) as client, pytest.raises(CodecMismatch, match="decoder_digest"):
        next(iter(client.synthesize("Hi.", decoder=other)))


def test_cli_say_writes_a_wav_of_frames_times_1920_samples(engine_server, speech_tokenizer, tmp_path):
    out = tmp_path / "say.wav"
    say = [sys.executable, "-m", "codecstream.client.cli", "say", "Hello there.", "--server", engine_server.target]
    # No --voice: the README form, which gets the model default voice.
    options = ["--seed", "4", "--max-frames", "40", "--out", str(out)]
    decoder = ["--decoder", str(speech_tokenizer), "--backend", "torch"]
    result = subprocess.run([*say, *options, *decoder], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == 24000 and wav.getnframes() % 1920 == 0 and wav.getnframes() > 0
    assert "first audio" in result.stderr


def test_cli_parity_e2e_passes_with_the_stateful_decoder(engine_server, speech_tokenizer, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "codecstream.client.cli", "parity", "e2e", "--server", engine_server.target,
         "--text", "Parity check.", "--voice", "ryan", "--seed", "5", "--max-frames", "40",
         "--decoder", str(speech_tokenizer), "--backend", "torch", "--checkpoint", str(speech_tokenizer),
         "--json", str(tmp_path / "e2e.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout


def test_client_disconnect_aborts_the_engine_request(engine_server):
    with Client(engine_server.target) as client:
        stream = client.stream_codes(
            "Talk for a while.", voice="ryan", seed=6, max_frames=400, resumable=False, chunking=[1]
        )
        next(stream)
        stream.abandon()
        assert engine_server.wait_for_no_live_requests() == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [({"voice": "nobody"}, "unknown voice 'nobody'"), ({"language": "Klingon"}, "unknown language 'Klingon'")],
)
def test_engine_server_refuses_unknown_voice_and_language(engine_server, options, message):
    with Client(engine_server.target) as client, pytest.raises(InvalidRequest, match=message):
        client.stream_codes("Hi.", **options).open()
