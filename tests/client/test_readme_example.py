"""The README's Python example, run as written against a replay server: only the decoder path and the
server address are swapped for the test's own."""

from __future__ import annotations

import pathlib
import re
import wave

import numpy as np
from codecstream.client.runtimes import open_decoder
from codecstream.protocol import decoder_digest
from codecstream.testing.random_speech_tokenizer import write_speech_tokenizer

from tests.conftest import random_codes

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def readme_python_example() -> str:
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return block


def test_the_readme_example_writes_two_concurrent_streams_decoded_on_one_decoder(
    replay_server_factory, tmp_path, monkeypatch
):
    checkpoint = write_speech_tokenizer(tmp_path / "speech_tokenizer", preset="tiny", seed=0)
    codes = random_codes(40, seed=9)
    server = replay_server_factory(codes=codes, fps=200.0, decoder_digest=decoder_digest(checkpoint))
    source = readme_python_example()
    assert '"artifacts/decoder-onnx"' in source and '"127.0.0.1:50051"' in source
    source = source.replace('"artifacts/decoder-onnx"', repr(str(checkpoint))).replace(
        '"127.0.0.1:50051"', repr(server.target)
    )
    monkeypatch.chdir(tmp_path)
    exec(compile(source, str(README), "exec"), {"__name__": "readme"})

    expected = open_decoder(checkpoint).decode(codes)
    for name in ("hello.wav", "bye.wav"):
        with wave.open(str(tmp_path / name)) as wav:
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
        # Both streams got the same codes (replay): each file holds the whole utterance, decoded
        # with its own state from one shared decoder.
        assert len(pcm) == len(expected)
        np.testing.assert_allclose(pcm / 32767.0, expected, atol=2 / 32767 + 1e-4)
