"""Every decoding mode keeps the FrameDecoder promise: k frames in, k * 1920 float32 samples in [-1, 1] out."""

from __future__ import annotations

import numpy as np
import pytest
from codecstream.decoder import (
    DECODING_MODES,
    CodesError,
    FullUtteranceDecoder,
    decode_utterance,
    load_decoder,
    make_frame_decoder,
)
from codecstream.protocol.decoding import FrameDecoder

from tests.conftest import random_codes


@pytest.mark.parametrize("mode", DECODING_MODES)
def test_each_mode_returns_float32_samples_for_exactly_the_frames_given(mode, tiny_model):
    decoder = make_frame_decoder(tiny_model, mode)
    assert isinstance(decoder, FrameDecoder)
    assert decoder.sample_rate == 24_000 and decoder.samples_per_frame == 1920
    for frames in (1, 3):
        pcm = decoder.decode(random_codes(frames, seed=frames))
        assert pcm.dtype == np.float32 and pcm.shape == (frames * 1920,)
        assert float(np.max(np.abs(pcm))) <= 1.0


@pytest.mark.parametrize("mode", DECODING_MODES)
def test_each_mode_refuses_bad_codes_with_a_message_naming_the_value(mode, tiny_model):
    decoder = make_frame_decoder(tiny_model, mode)
    codes = random_codes(4)
    codes[2, 5] = 2051
    with pytest.raises(CodesError, match="frame 2 codebook 5 has 2051, codebook size is 2048"):
        decoder.decode(codes)
    with pytest.raises(CodesError, match=r"shape \(frames, 16\)"):
        decoder.decode(np.zeros((2, 15), dtype=np.int16))
    with pytest.raises(CodesError, match="integers"):
        decoder.decode(np.zeros((2, 16), dtype=np.float32))


def test_the_full_decoder_returns_the_tail_of_one_full_decode(tiny_model):
    codes = random_codes(30, seed=4)
    decoder = FullUtteranceDecoder(tiny_model)
    decoder.prime(codes[:10])
    tail = np.concatenate([decoder.decode(codes[10:17]), decoder.decode(codes[17:])])
    np.testing.assert_allclose(tail, decode_utterance(tiny_model, codes)[10 * 1920 :], rtol=0, atol=1e-5)


def test_the_decoder_is_strictly_causal(tiny_model):
    codes = random_codes(40, seed=12)
    changed = codes.copy()
    changed[25] = (changed[25] + 1) % 2048
    before, after = decode_utterance(tiny_model, codes), decode_utterance(tiny_model, changed)
    np.testing.assert_array_equal(before[: 25 * 1920], after[: 25 * 1920])
    assert not np.array_equal(before[25 * 1920 : 26 * 1920], after[25 * 1920 : 26 * 1920])


def test_make_frame_decoder_wraps_a_loaded_checkpoint_in_the_requested_mode(tiny_checkpoints):
    model = load_decoder(tiny_checkpoints["mild"])
    assert make_frame_decoder(model, mode="windowed").decode(random_codes(2)).shape == (3840,)
    with pytest.raises(ValueError, match="unknown decoding mode 'fast'"):
        make_frame_decoder(model, mode="fast")
