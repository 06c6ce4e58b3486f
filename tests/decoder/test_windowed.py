"""72-frame windowed decoding: an approximation of the full decode, measured; conv-split == plain."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codecstream.decoder import WindowedDecoder, WindowedDecoderModule, decode_utterance
from codecstream.protocol.pcm import snr_db

from tests.conftest import random_codes

from .conftest import decode_in_chunks


@pytest.mark.parametrize("init", ["mild", "stressed"])
def test_windowed_decode_stays_above_40_db_of_the_full_decode(init, tiny_models):
    codes = random_codes(300, seed=21)
    full = decode_utterance(tiny_models[init], codes)
    windowed = decode_in_chunks(WindowedDecoder(tiny_models[init]), codes, [2, 4, 8, 16, 25])
    snr = snr_db(full, windowed)
    print(f"\n[{init}] windowed (72-frame context, conv-split) vs full, 300 frames: SNR {snr:.1f} dB, "
          f"max abs error {np.max(np.abs(full - windowed)):.2e}")  # fmt: skip
    assert windowed.shape == full.shape
    assert snr > 40


@pytest.mark.parametrize("chunk", [1, 4, 25])
def test_conv_split_gives_the_same_samples_as_the_plain_window(chunk, tiny_models):
    model = tiny_models["stressed"]
    context, codes = random_codes(80, seed=chunk), random_codes(3 * chunk, seed=chunk + 1)
    outputs = []
    for conv_split in (False, True):
        decoder = WindowedDecoder(model, conv_split=conv_split)
        decoder.prime(context)
        outputs.append(decode_in_chunks(decoder, codes, [chunk]))
    plain, split = outputs
    assert np.max(np.abs(plain - split)) < 1e-5


def test_within_the_first_window_the_windowed_decode_is_the_full_decode(tiny_model):
    codes = random_codes(40, seed=2)
    full = decode_utterance(tiny_model, codes)
    windowed = decode_in_chunks(WindowedDecoder(tiny_model), codes, [1, 2, 4, 8])
    assert snr_db(full, windowed) > 100


def test_priming_fills_the_window_without_producing_samples(tiny_model):
    reference, utterance = random_codes(40, seed=3), random_codes(10, seed=4)
    full = decode_utterance(tiny_model, np.concatenate([reference, utterance]))[40 * 1920 :]
    decoder = WindowedDecoder(tiny_model)
    assert decoder.prime(reference) is None
    assert snr_db(full, decoder.decode(utterance)) > 100


def test_reset_forgets_the_window(tiny_model):
    decoder = WindowedDecoder(tiny_model)
    decoder.decode(random_codes(30, seed=5))
    decoder.reset()
    codes = random_codes(6, seed=6)
    np.testing.assert_array_equal(decoder.decode(codes), WindowedDecoder(tiny_model).decode(codes))


def test_the_window_module_returns_exactly_the_new_frames(tiny_model):
    module = WindowedDecoderModule(tiny_model, conv_split=True)
    context = torch.from_numpy(random_codes(72).astype(np.int64)).unsqueeze(0)
    for new_frames in (1, 3):
        new = torch.from_numpy(random_codes(new_frames, seed=9).astype(np.int64)).unsqueeze(0)
        with torch.inference_mode():
            assert tuple(module(context, new).shape) == (1, new_frames * 1920)
    assert module.conv_context_frames == tiny_model.conv_receptive_frames() == 10
