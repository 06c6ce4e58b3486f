"""Full-utterance decode == vLLM-Omni 0.30's tokenizer_12hz decoder on the same codes and weights.

The reference is imported from the installed vllm_omni package (the development .venv) and run
through its own `forward(codes)` without caches, its exact full-utterance path. It loads our
random checkpoint with strict=True, which also proves the parameter names are the official ones.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codecstream.decoder import decode_utterance
from codecstream.protocol.pcm import snr_db
from safetensors.torch import load_file

from tests.conftest import random_codes

modeling = pytest.importorskip(
    "vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2",
    reason="the reference decoder comes from vllm-omni 0.30 (scripts/setup-dev-env installs it)",
)
configuration = pytest.importorskip(
    "vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2"
)


def reference_decoder(directory):
    config = configuration.Qwen3TTSTokenizerV2Config.from_pretrained(str(directory)).decoder_config
    model = modeling.Qwen3TTSTokenizerV2Decoder._from_config(config).eval()
    weights = load_file(str(directory / "model.safetensors"))
    model.load_state_dict({name.removeprefix("decoder."): t for name, t in weights.items()}, strict=True)
    return model


@torch.inference_mode()
def reference_pcm(model, codes: np.ndarray) -> np.ndarray:
    return model(torch.from_numpy(codes.astype(np.int64)).T.unsqueeze(0))[0, 0].numpy()


@pytest.mark.parametrize("init", ["mild", "stressed"])
def test_full_decode_matches_the_reference_to_float_rounding(init, tiny_checkpoints, tiny_models):
    codes = random_codes(300, seed=11)
    expected = reference_pcm(reference_decoder(tiny_checkpoints[init]), codes)
    actual = decode_utterance(tiny_models[init], codes)
    snr = snr_db(expected, actual)
    print(f"\n[{init}] full vs vLLM-Omni reference, 300 frames: SNR {snr:.1f} dB, "
          f"max abs error {np.max(np.abs(expected - actual)):.2e}")  # fmt: skip
    assert actual.shape == expected.shape == (300 * 1920,)
    assert snr > 100
