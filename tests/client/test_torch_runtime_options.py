"""The torch runtime's options: a reduced precision needs a CUDA device, the CPU decodes in fp32
exactly as the decoder package does, and the TF32 flags the runtime sets for its own work are put
back as the process had them. (CUDA graphs need a GPU: benchmarks/cuda_decode_bench.py checks them.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codecstream.client.runtimes import DecoderLoadError, open_decoder
from codecstream.client.runtimes.cuda_graphs import float32_precision
from codecstream.client.runtimes.torch_eager import EagerTorchDecoder
from codecstream.decoder import StatefulDecoder, load_decoder
from codecstream.protocol import decoder_digest

from tests.conftest import random_codes


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("precision", ["tf32", "bf16", "bf16-mixed"])
def test_a_reduced_precision_without_a_cuda_device_is_refused_by_name(checkpoint, no_cuda, precision):
    with pytest.raises(DecoderLoadError, match=f"precision '{precision}' needs a CUDA device"):
        EagerTorchDecoder(checkpoint, None, precision=precision)
    with pytest.raises(DecoderLoadError, match=f"precision '{precision}' needs a CUDA device"):
        open_decoder(checkpoint, backend="torch", precision=precision)


def test_an_unknown_precision_is_refused_with_the_choices(checkpoint):
    with pytest.raises(DecoderLoadError, match="unknown precision 'fp16', expected one of fp32, tf32, bf16"):
        EagerTorchDecoder(checkpoint, None, precision="fp16")


def test_on_the_cpu_the_default_decodes_eagerly_in_fp32_as_the_decoder_package_does(checkpoint, no_cuda):
    decoder = EagerTorchDecoder(checkpoint, None)
    assert (decoder.dtype, decoder.precision, decoder.capture_seconds) == ("fp32", "fp32", {})
    assert "fp32 eager torch" in decoder.description and "on cpu" in decoder.description
    codes = random_codes(30, seed=3)
    reference = StatefulDecoder(load_decoder(checkpoint))
    decoder.prime(codes[:5])
    reference.prime(codes[:5])
    for chunk in (codes[5:7], codes[7:15], codes[15:]):
        np.testing.assert_array_equal(decoder.decode(chunk), reference.decode(chunk))


def test_streams_of_one_decoder_on_the_cpu_keep_their_own_state(checkpoint, no_cuda):
    decoder = EagerTorchDecoder(checkpoint, None)
    codes = random_codes(12, seed=4)
    chunks = (codes[:4], codes[4:])
    alone = decoder.new_stream()
    expected = [alone.decode(chunk) for chunk in chunks]
    first, second = decoder.new_stream(), decoder.new_stream()
    for chunk, wanted in zip(chunks, expected, strict=True):
        np.testing.assert_array_equal(first.decode(chunk), wanted)
        second.decode(chunk[::-1])  # another utterance, interleaved


def tf32_flags() -> tuple[str, str]:
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision


@pytest.mark.parametrize(("tf32", "inside"), [(False, ("ieee", "ieee")), (True, ("tf32", "tf32"))])
def test_float32_precision_holds_for_its_block_and_then_restores_the_process_flags(tf32, inside):
    before = tf32_flags()
    legacy = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with float32_precision(tf32):
        assert tf32_flags() == inside
    assert tf32_flags() == before
    # torch raises on reading the legacy flags after a mix of the two APIs: they must still read.
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == legacy


def test_the_description_names_the_digest_it_shows_as_the_decoder_digest_not_a_file_s_sha256(checkpoint):
    # Issue 53: an artifact's export line showed its file's sha256 and its decoder's description
    # the weights digest, both as a bare "sha256:…".
    digest = decoder_digest(checkpoint)
    assert f"(decoder digest {digest[:19]}…)" in open_decoder(checkpoint, backend="torch").description
