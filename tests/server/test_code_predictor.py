"""codecstream's code predictor (engine/code_predictor/) against vLLM-Omni's: the same weights and
the same noise give the same codebooks 1-15, one new position per pass instead of the whole
sequence again; and its Triton kernels compute what its torch operations do (in Triton's
interpreter, which runs them on the CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch
from codecstream.server.engine.code_predictor import torch_ops
from codecstream.server.engine.code_predictor.runner import CodePredictorRunner

TALKER_HIDDEN = 96
ROWS = 6
VOCAB = 2048
#: codec EOS: codebook 0 of a row that ends its request, which carries no codes.
EOS = 2150


def vllm_omni_predictor(layers: int = 2) -> torch.nn.Module:
    """vLLM-Omni's code predictor (its Qwen3-TTS wrapper's class) with random weights, float32, and
    a projection from a talker of another width, as at the 1.7B shape."""
    from vllm_omni.model_executor.models.common.qwen3_code_predictor import (
        CodePredictorWrapper,
        CodePredictorWrapperConfig,
    )
    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSTalkerCodePredictorConfig

    torch.manual_seed(0)
    config = Qwen3TTSTalkerCodePredictorConfig(
        vocab_size=VOCAB, hidden_size=128, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, intermediate_size=256, rms_norm_eps=1e-6, rope_theta=1e6, num_code_groups=16,
    )  # fmt: skip
    engine = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=ROWS), model_config=None)
    module = CodePredictorWrapper(
        vllm_config=engine,
        cp_config=config,
        wrapper_config=CodePredictorWrapperConfig(use_projection=True, sampling_mode="per_call"),
        talker_hidden_size=TALKER_HIDDEN,
    )
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            # Norm weights near one, the rest spread wide enough that the samples depend on them.
            parameter.copy_(
                1 + 0.1 * torch.randn_like(parameter) if "norm" in name else 0.5 * torch.randn_like(parameter)
            )
    return module.eval()


@pytest.fixture(scope="module")
def predictor() -> torch.nn.Module:
    return vllm_omni_predictor()


def inputs(rows: int = ROWS, seed: int = 1) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    code0 = torch.randint(0, VOCAB, (rows,), generator=generator)
    code0[rows // 2] = EOS
    return {
        "code0": code0,
        "embedding": torch.randn(rows, TALKER_HIDDEN, generator=generator),
        "hidden": torch.randn(rows, TALKER_HIDDEN, generator=generator),
        "text": torch.randn(rows, TALKER_HIDDEN, generator=generator),
        "uniforms": torch.rand(rows, 15, VOCAB, generator=generator).clamp(1e-20, 1 - 1e-20),
    }


def theirs(module: torch.nn.Module, given: dict, inv_temperature: float) -> torch.Tensor:
    codes = module(
        layer0_code=given["code0"][:, None],
        layer0_embed=given["embedding"][:, None],
        last_talker_hidden=given["hidden"][:, None],
        do_sample=inv_temperature > 0,
        temperature=1 / inv_temperature if inv_temperature else 1.0,
        top_k=50,
        top_p=1.0,
        sample_uniforms=given["uniforms"],
    )
    invalid = (codes[:, :1] < 0) | (codes[:, :1] >= VOCAB)
    return torch.where(invalid.expand_as(codes), torch.zeros_like(codes), codes)


def ours(module: torch.nn.Module, given: dict, inv_temperature: float, ops=torch_ops):
    tables = torch.stack([embedding.weight for embedding in module.model.codec_embedding])
    runner = CodePredictorRunner(module, tables, max_rows=8, ops=ops)
    frame, codes = runner.predict(
        given["code0"], given["embedding"], given["hidden"], given["text"],
        uniforms=given["uniforms"], inv_temperature=inv_temperature, top_k=50,
    )  # fmt: skip
    return frame.clone(), codes.clone()


@pytest.mark.parametrize("inv_temperature", [1 / 0.9, 0.0], ids=["sampled", "greedy"])
def test_the_codebooks_are_vllm_omnis_for_the_same_weights_and_noise(predictor, inv_temperature):
    given = inputs()
    _, codes = ours(predictor, given, inv_temperature)
    assert torch.equal(codes, theirs(predictor, given, inv_temperature))
    assert not codes[ROWS // 2].any()  # the EOS row carries zeros
    assert len(set(codes[0, 1:].tolist())) > 5  # not a degenerate sample


def test_the_talkers_next_input_sums_every_codebooks_embedding_and_the_text(predictor):
    given = inputs()
    frame, codes = ours(predictor, given, 1 / 0.9)
    tables = torch.stack([embedding.weight for embedding in predictor.model.codec_embedding])
    expected = given["embedding"] + tables[torch.arange(15)[None, :], codes[:, 1:]].sum(dim=1) + given["text"]
    torch.testing.assert_close(frame, expected, rtol=1e-5, atol=1e-4)


def test_a_row_gives_the_same_codes_alone_and_in_a_batch(predictor):
    given = inputs()
    _, batch = ours(predictor, given, 1 / 0.9)
    for row in (0, ROWS - 1):
        alone = {name: tensor[row : row + 1] for name, tensor in given.items()}
        _, codes = ours(predictor, alone, 1 / 0.9)
        assert torch.equal(codes[0], batch[row])


def test_a_batch_larger_than_the_buffers_is_refused(predictor):
    given = inputs(rows=9)
    with pytest.raises(ValueError, match="a batch of 9 frames, the code predictor was built for 8"):
        ours(predictor, given, 1 / 0.9)


_KERNELS_AGAINST_TORCH = """
import torch
from codecstream.server.engine.code_predictor import torch_ops, triton_ops
from tests.server.test_code_predictor import inputs, ours, vllm_omni_predictor

torch.manual_seed(0)
bf16 = torch.bfloat16
rows, heads, kv_heads, dim, hidden = 3, 4, 2, 64, 128
x, delta = torch.randn(rows, hidden, dtype=bf16), torch.randn(rows, hidden, dtype=bf16)
weight = torch.randn(hidden, dtype=bf16)
for d in (delta, None):
    a, n = torch_ops.add_rms_norm(x.clone(), d, weight, 1e-6)
    b, m = triton_ops.add_rms_norm(x.clone(), d, weight, 1e-6)
    torch.testing.assert_close(a, b, rtol=0.02, atol=0.05)
    torch.testing.assert_close(n, m, rtol=0.02, atol=0.1)
angles = torch.outer(torch.arange(16).float(), 1 / 1e6 ** (torch.arange(0, dim, 2).float() / dim))
cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
caches = [torch.zeros(rows, kv_heads, 16, dim, dtype=bf16) for _ in range(4)]
qw, kw = torch.randn(dim, dtype=bf16), torch.randn(dim, dtype=bf16)
for position in range(6):
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, dtype=bf16)
    q1 = torch_ops.qk_norm_rope_store(qkv, qw, kw, 1e-6, cos[position], sin[position], caches[0], caches[1], position)
    q2 = triton_ops.qk_norm_rope_store(qkv, qw, kw, 1e-6, cos[position], sin[position], caches[2], caches[3], position)
    torch.testing.assert_close(q1, q2, rtol=0.02, atol=0.1)
torch.testing.assert_close(caches[0], caches[2], rtol=0.02, atol=0.1)
assert torch.equal(caches[1], caches[3])
expected = torch_ops.attention(q1, caches[0], caches[1], 6)
torch.testing.assert_close(expected, triton_ops.attention(q1, caches[0], caches[1], 6), rtol=0.02, atol=0.02)
gate_up = torch.randn(rows, 512, dtype=bf16)
torch.testing.assert_close(torch_ops.silu_mul(gate_up), triton_ops.silu_mul(gate_up), rtol=0.02, atol=0.05)
tables = torch.randn(15, 2048, 96, dtype=bf16)
codes = torch.randint(0, 2048, (rows, 16))
base, text = torch.randn(rows, 96, dtype=bf16), torch.randn(rows, 96, dtype=bf16)
frames = [torch.zeros(rows, 96, dtype=bf16) for _ in range(2)]
torch_ops.frame_embedding(base, tables, codes[:, 1:], text, frames[0])
triton_ops.frame_embedding(base, tables, codes[:, 1:], text, frames[1])
torch.testing.assert_close(frames[0], frames[1], rtol=0.02, atol=0.1)
# The whole predictor, float32: the same codes and next input from either set of operations.
module, given = vllm_omni_predictor(layers=1), inputs(rows=3)
for inv_temperature in (1 / 0.9, 0.0):
    frame_a, codes_a = ours(module, given, inv_temperature)
    frame_b, codes_b = ours(module, given, inv_temperature, triton_ops)
    assert torch.equal(codes_a, codes_b), (codes_a, codes_b)
    torch.testing.assert_close(frame_a, frame_b, rtol=1e-4, atol=1e-3)
print("kernels agree")
"""


def test_the_triton_kernels_compute_what_the_torch_operations_do():
    pytest.importorskip("triton")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _KERNELS_AGAINST_TORCH], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0 and "kernels agree" in done.stdout, done.stderr[-3000:]
