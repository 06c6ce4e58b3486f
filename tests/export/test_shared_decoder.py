"""One loaded decoder, many streams: each stream decodes with a state of its own over the same
weights and runtime, so concurrent streams decode exactly what they would one at a time."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from codecstream.client.decoders import shared_decoder
from codecstream.client.runtimes import open_decoder

from tests.conftest import random_codes

STREAMS = 4
RAMP = (2, 4, 8, 16, 10)


def chunks_of(codes: np.ndarray) -> list[np.ndarray]:
    pieces, start = [], 0
    for size in RAMP:
        pieces.append(codes[start : start + size])
        start += size
    return pieces


@pytest.fixture(params=["onnx-stateful", "onnx-windowed", "pte-stateful", "pt2-stateful", "torch-stateful"])
def loaded(request, artifacts, tiny_checkpoint):
    fmt, mode = request.param.split("-")
    if fmt == "torch":
        return open_decoder(tiny_checkpoint, backend="torch")
    return open_decoder(artifacts[(fmt, mode, "fp32")], backend=fmt)


def test_concurrent_streams_on_one_loaded_decoder_decode_what_sequential_streams_do(loaded):
    utterances = [random_codes(sum(RAMP), seed=seed) for seed in range(STREAMS)]
    sequential = []
    for codes in utterances:
        stream = loaded.new_stream()
        sequential.append(np.concatenate([stream.decode(chunk) for chunk in chunks_of(codes)]))

    results: list[np.ndarray | None] = [None] * STREAMS
    in_step = threading.Barrier(STREAMS)

    def decode(index: int) -> None:
        stream = loaded.new_stream()
        pieces = []
        for chunk in chunks_of(utterances[index]):
            in_step.wait(30)  # every stream decodes its next chunk at the same time
            pieces.append(stream.decode(chunk))
        results[index] = np.concatenate(pieces)

    threads = [threading.Thread(target=decode, args=(index,)) for index in range(STREAMS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for index in range(STREAMS):
        # Bit-identical on ONNX Runtime, .pt2 and eager torch; XNNPACK (ExecuTorch) rounds
        # differently from one calling thread to another, by under 1e-6 (1/30 of a 16-bit step).
        # A state shared between streams would be off by whole samples' worth.
        np.testing.assert_allclose(results[index], sequential[index], rtol=0, atol=1e-5)


def test_a_stream_of_a_shared_decoder_leaves_the_others_state_alone(loaded):
    codes = random_codes(sum(RAMP), seed=7)
    alone = loaded.new_stream()
    expected = np.concatenate([alone.decode(chunk) for chunk in chunks_of(codes)])
    first, second = loaded.new_stream(), loaded.new_stream()
    pieces = []
    for chunk in chunks_of(codes):
        pieces.append(first.decode(chunk))
        second.decode(chunk[::-1])  # another utterance, interleaved
        second.reset()
    np.testing.assert_array_equal(np.concatenate(pieces), expected)


def test_a_decoder_directory_is_opened_once_per_process_and_backend(artifacts):
    directory = artifacts[("onnx", "stateful", "fp32")]
    assert shared_decoder(directory, "onnx") is shared_decoder(str(directory), "onnx")
