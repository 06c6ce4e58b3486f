"""Stateful streaming decoding reproduces the full-utterance decode, whatever the chunking."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codecstream.decoder import StatefulDecoder, StatefulDecoderStep, decode_utterance
from codecstream.protocol.pcm import snr_db
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import random_codes

from .conftest import decode_in_chunks

FRAMES = 600  # far past the 72-frame window and the ~568-frame reach of the stacked attention
CHUNKINGS = {
    "1": [1],
    "2": [2],
    "4": [4],
    "8": [8],
    "25": [25],
    "ramp 2-4-8-16-25": [2, 4, 8, 16, 25],
    "ramp 1-3-7-13-31": [1, 3, 7, 13, 31],
}


@pytest.fixture(scope="module")
def long_utterance(tiny_models):
    codes = random_codes(FRAMES, seed=7)
    return codes, {init: decode_utterance(model, codes) for init, model in tiny_models.items()}


@pytest.mark.parametrize("init", ["mild", "stressed"])
@pytest.mark.parametrize("chunking", list(CHUNKINGS))
def test_stateful_decode_equals_the_full_decode_over_600_frames(init, chunking, tiny_models, long_utterance):
    codes, full = long_utterance
    streamed = decode_in_chunks(StatefulDecoder(tiny_models[init]), codes, CHUNKINGS[chunking])
    snr = snr_db(full[init], streamed)
    print(f"\n[{init}, chunks {chunking}] stateful vs full, {FRAMES} frames: SNR {snr:.1f} dB, "
          f"max abs error {np.max(np.abs(full[init] - streamed)):.2e}")  # fmt: skip
    assert streamed.shape == full[init].shape
    assert snr > 100


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=40))
def test_every_chunking_gives_the_same_stateful_output(sizes, tiny_models):
    model = tiny_models["stressed"]
    codes = random_codes(160, seed=5)
    one_call = StatefulDecoder(model).decode(codes)
    chunked = decode_in_chunks(StatefulDecoder(model), codes, sizes)
    assert chunked.shape == one_call.shape
    assert np.max(np.abs(chunked - one_call)) < 1e-5
    assert snr_db(one_call, chunked) > 100


def test_reset_mid_stream_then_a_new_utterance_equals_decoding_it_from_scratch(tiny_model):
    first, second = random_codes(90, seed=1), random_codes(80, seed=2)
    decoder = StatefulDecoder(tiny_model)
    decode_in_chunks(decoder, first, [3])
    decoder.reset()
    after_reset = decode_in_chunks(decoder, second, [4])
    from_scratch = decode_in_chunks(StatefulDecoder(tiny_model), second, [4])
    np.testing.assert_array_equal(after_reset, from_scratch)
    assert decoder.frames_seen == 80


def test_priming_gives_context_and_no_samples(tiny_models):
    model = tiny_models["stressed"]
    reference, utterance = random_codes(120, seed=3), random_codes(60, seed=4)
    full = decode_utterance(model, np.concatenate([reference, utterance]))[120 * 1920 :]
    decoder = StatefulDecoder(model)
    assert decoder.prime(reference) is None
    assert decoder.frames_seen == 120
    primed = decode_in_chunks(decoder, utterance, [2, 4, 8])
    assert snr_db(full, primed) > 100
    unprimed = StatefulDecoder(model).decode(utterance)
    assert snr_db(full, unprimed) < 60


def test_priming_skips_the_conv_stack_only_where_it_cannot_matter(tiny_models):
    """Priming runs the conv stack over just the last receptive-field frames; that must equal decoding them all."""
    model = tiny_models["stressed"]
    reference, utterance = random_codes(50, seed=8), random_codes(12, seed=9)
    primed = StatefulDecoder(model)
    primed.prime(reference)
    decoded = StatefulDecoder(model)
    decoded.decode(reference)
    for name, a, b in zip(primed.step_module.state_names, primed.state, decoded.state, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=name)
    assert np.max(np.abs(primed.decode(utterance) - decoded.decode(utterance))) < 1e-5


def test_empty_chunks_produce_no_samples_and_keep_the_state(tiny_model):
    decoder = StatefulDecoder(tiny_model)
    decoder.decode(random_codes(3))
    assert decoder.decode(np.zeros((0, 16), dtype=np.int16)).shape == (0,)
    decoder.prime(np.zeros((0, 16), dtype=np.int16))
    assert decoder.frames_seen == 3


def test_the_state_is_a_flat_tuple_of_named_fixed_shape_tensors(tiny_model):
    step = StatefulDecoderStep(tiny_model)
    state = step.initial_state()
    assert len(state) == len(step.state_names) == len(step.state_shapes())
    assert step.state_names[0] == "position" and state[0].dtype == torch.int64
    assert "pre_transformer.layers.1.key" in step.state_names
    assert "decoder.4.block.4.conv1.history" in step.state_names
    assert "decoder.1.block.1.carry" in step.state_names
    key = state[step.state_names.index("pre_transformer.layers.0.key")]
    assert tuple(key.shape) == (1, 1, 72, 16)  # (batch, kv heads, sliding window, head dim)
    for chunk in (1, 5):
        pcm, *new_state = step(torch.from_numpy(random_codes(chunk).astype(np.int64)).unsqueeze(0), *state)
        assert tuple(pcm.shape) == (1, chunk * 1920)
        assert [tuple(t.shape) for t in new_state] == [tuple(t.shape) for t in state]


def test_the_step_is_a_pure_function_of_codes_and_state(tiny_model):
    step = StatefulDecoderStep(tiny_model).eval()
    codes = torch.from_numpy(random_codes(4).astype(np.int64)).unsqueeze(0)
    state = step.initial_state()
    _, *state = step(codes, *state)
    snapshot = [t.clone() for t in state]
    with torch.inference_mode():
        first = step(codes, *state)
        second = step(codes, *state)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    for before, after in zip(snapshot, state, strict=True):
        assert torch.equal(before, after)


def test_the_step_exports_with_a_dynamic_chunk_length(tiny_model):
    step = StatefulDecoderStep(tiny_model).eval()
    state = step.initial_state()
    codes = torch.from_numpy(random_codes(4).astype(np.int64)).unsqueeze(0)
    frames = torch.export.Dim("frames", min=1, max=64)
    shapes = ({1: frames}, tuple(None for _ in state))  # forward(codes, *state): the state is one tuple
    exported = torch.export.export(step, (codes, *state), dynamic_shapes=shapes)
    eager = StatefulDecoder(tiny_model)
    exported_state = state
    for chunk in (2, 7, 1):
        piece = random_codes(chunk, seed=chunk)
        pcm, *exported_state = exported.module()(torch.from_numpy(piece.astype(np.int64)).unsqueeze(0), *exported_state)
        np.testing.assert_allclose(pcm[0].detach().numpy(), eager.decode(piece), rtol=0, atol=1e-5)
