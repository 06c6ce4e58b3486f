"""The code predictor's fused operations in plain torch: what runs off CUDA (the CPU engine), and
the reference the Triton kernels (triton_ops.py) are tested against.

Every operation takes and returns the tensors of one pass over a batch of B rows at one position;
the arithmetic follows vLLM-Omni's predictor (HF-compatible RMSNorm in float32, rotate-half RoPE,
Gumbel-max sampling over the top-k), computed for the one new position only.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: the statistics in float32, the weight applied in the input's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)); `x` is updated in place (the residual stream)."""
    if delta is not None:
        x.add_(delta)
    return x, rms_norm(x, weight, eps)


def qk_norm_rope_store(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    position: int,
) -> torch.Tensor:
    """Split the packed projection [B, (H + 2 KV) * D], RMS-normalize q and k per head, rotate both
    by `position` (cos, sin: [D] float32), store k and v at `position` of the caches [B, KV, P, D];
    return q [B, H, D]."""
    rows, kv_heads, _, head_dim = k_cache.shape
    heads = qkv.shape[1] // head_dim - 2 * kv_heads
    q = qkv[:, : heads * head_dim].reshape(rows, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].reshape(rows, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].reshape(rows, kv_heads, head_dim)
    q = _rotate(rms_norm(q, q_weight, eps), cos, sin)
    k = _rotate(rms_norm(k, k_weight, eps), cos, sin)
    k_cache[:, :, position].copy_(k)
    v_cache[:, :, position].copy_(v)
    return q


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int) -> torch.Tensor:
    """The new position's attention over positions 0..length-1 of the caches (causal by
    construction: nothing later is stored yet); [B, H, D] -> [B, H * D]."""
    rows, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    keys = k_cache[:, :, :length].repeat_interleave(group, dim=1)
    values = v_cache[:, :, :length].repeat_interleave(group, dim=1)
    scores = torch.einsum("bhd,bhpd->bhp", q.float(), keys.float()) * head_dim**-0.5
    weights = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhp,bhpd->bhd", weights, values.float())
    return out.to(q.dtype).reshape(rows, heads * head_dim)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def sample_and_embed(
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    inv_temperature: float,
    top_k: int,
    table: torch.Tensor | None,
    codes_out: torch.Tensor,
    embed_out: torch.Tensor | None,
) -> None:
    """Sample one code per row into `codes_out` [B] and, with a `table` [V, E], write its row to
    `embed_out` [B, E] (the next position's input). inv_temperature 0: greedy. Gumbel-max over
    the top-k scaled logits, with `uniforms` [B, V] in (0, 1) as the noise."""
    if inv_temperature > 0:
        scaled = logits.float() * inv_temperature
        if 0 < top_k < scaled.shape[-1]:
            threshold = scaled.topk(top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < threshold, float("-inf"))
        codes = (scaled - torch.log(-torch.log(uniforms))).argmax(dim=-1)
    else:
        codes = logits.float().argmax(dim=-1)
    codes_out.copy_(codes)
    if table is not None and embed_out is not None:
        torch.index_select(table, 0, codes, out=embed_out)


def frame_embedding(
    base: torch.Tensor, tables: torch.Tensor, codes: torch.Tensor, text: torch.Tensor, out: torch.Tensor
) -> None:
    """The talker's next input: `base` (codebook 0's embedding) + each codebook's embedding of its
    code (tables [G-1, V, H], codes [B, G-1]) + `text`, summed in float32, into `out` [B, H]."""
    groups = torch.arange(tables.shape[0], device=codes.device)
    gathered = tables[groups[None, :], codes]  # [B, G-1, H]
    total = base.float() + gathered.float().sum(dim=1) + text.float()
    out.copy_(total.to(out.dtype))
