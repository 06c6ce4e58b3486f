"""The code predictor's fused operations as Triton kernels (CUDA): torch_ops.py's arithmetic, one
launch each where torch takes five to fifteen, so a whole pass is ~50 launches (the matmuls stay
cuBLAS's). Each kernel works on one row, or one row's head, per program; the shapes are the
predictor's (hidden 1024, 16 heads, 8 KV heads of 128, 16 positions, 2048 codes) but nothing here
assumes them. tests/server/test_code_predictor.py checks every kernel against torch_ops.py (in
Triton's interpreter where there is no GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, delta_ptr, weight_ptr, out_ptr, stride_x, stride_delta, stride_out, n, eps,
    HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + row * stride_delta + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + delta.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(x_ptr + row * stride_x + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    inverse = tl.rsqrt(tl.sum(x32 * x32, axis=0) / n + eps)
    normed = (x32 * inverse).to(x_ptr.dtype.element_ty)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    out = weight.to(tl.float32) * normed.to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, n = x.shape
    out = torch.empty_like(x)
    _add_rms_norm_kernel[(rows,)](
        x, x if delta is None else delta, weight, out, x.stride(0), 0 if delta is None else delta.stride(0),
        out.stride(0), n, eps, HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(n),
    )  # fmt: skip
    return x, out


@triton.jit
def _head_norm_rope(x1, x2, w1, w2, cos1, sin1, cos2, sin2, HALF: tl.constexpr, eps):
    """RMS-normalize one head given as its two halves (float32 statistics, the weight applied in
    the input dtype) and rotate it (rotate-half RoPE)."""
    dtype = x1.dtype
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    inverse = tl.rsqrt((tl.sum(a * a, axis=0) + tl.sum(b * b, axis=0)) / (2 * HALF) + eps)
    a = (w1.to(tl.float32) * (a * inverse).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    b = (w2.to(tl.float32) * (b * inverse).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    return (a * cos1 - b * sin1).to(dtype), (b * cos2 + a * sin2).to(dtype)


@triton.jit
def _qk_norm_rope_store_kernel(
    qkv_ptr, q_weight_ptr, k_weight_ptr, cos_ptr, sin_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
    stride_qkv, stride_q_row, stride_q_head,
    stride_k_row, stride_k_head, stride_k_pos, stride_v_row, stride_v_head, stride_v_pos,
    position, eps, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    head = tl.program_id(1)  # 0..HEADS-1: q; then KV_HEADS k heads; then KV_HEADS v heads
    lower = tl.arange(0, HALF)
    upper = lower + HALF
    base = qkv_ptr + row * stride_qkv + head * 2 * HALF
    x1 = tl.load(base + lower)
    x2 = tl.load(base + upper)
    if head < HEADS + KV_HEADS:
        cos1, cos2 = tl.load(cos_ptr + lower), tl.load(cos_ptr + upper)
        sin1, sin2 = tl.load(sin_ptr + lower), tl.load(sin_ptr + upper)
        if head < HEADS:
            w1, w2 = tl.load(q_weight_ptr + lower), tl.load(q_weight_ptr + upper)
            r1, r2 = _head_norm_rope(x1, x2, w1, w2, cos1, sin1, cos2, sin2, HALF, eps)
            out = q_out_ptr + row * stride_q_row + head * stride_q_head
        else:
            w1, w2 = tl.load(k_weight_ptr + lower), tl.load(k_weight_ptr + upper)
            r1, r2 = _head_norm_rope(x1, x2, w1, w2, cos1, sin1, cos2, sin2, HALF, eps)
            out = k_cache_ptr + row * stride_k_row + (head - HEADS) * stride_k_head + position * stride_k_pos
        tl.store(out + lower, r1)
        tl.store(out + upper, r2)
    else:
        out = v_cache_ptr + row * stride_v_row + (head - HEADS - KV_HEADS) * stride_v_head + position * stride_v_pos
        tl.store(out + lower, x1)
        tl.store(out + upper, x2)


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
    rows, kv_heads, _, head_dim = k_cache.shape
    heads = qkv.shape[1] // head_dim - 2 * kv_heads
    q = torch.empty(rows, heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    _qk_norm_rope_store_kernel[(rows, heads + 2 * kv_heads)](
        qkv, q_weight, k_weight, cos, sin, q, k_cache, v_cache,
        qkv.stride(0), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        position, eps, HEADS=heads, KV_HEADS=kv_heads, HALF=head_dim // 2,
    )  # fmt: skip
    return q


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, stride_q_row, stride_q_head,
    stride_k_row, stride_k_head, stride_k_pos, stride_v_row, stride_v_head, stride_v_pos, stride_out,
    length, scale, GROUP: tl.constexpr, POSITIONS: tl.constexpr, DIM: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    dims = tl.arange(0, DIM)
    positions = tl.arange(0, POSITIONS)
    valid = positions < length
    q = tl.load(q_ptr + row * stride_q_row + head * stride_q_head + dims).to(tl.float32)
    k_base = k_ptr + row * stride_k_row + kv_head * stride_k_head
    keys = tl.load(k_base + positions[:, None] * stride_k_pos + dims[None, :], mask=valid[:, None], other=0.0)
    scores = tl.sum(keys.to(tl.float32) * q[None, :], axis=1) * scale
    scores = tl.where(valid, scores, float("-inf"))
    weights = tl.exp(scores - tl.max(scores, axis=0))
    weights = weights / tl.sum(weights, axis=0)
    v_base = v_ptr + row * stride_v_row + kv_head * stride_v_head
    values = tl.load(v_base + positions[:, None] * stride_v_pos + dims[None, :], mask=valid[:, None], other=0.0)
    out = tl.sum(values.to(tl.float32) * weights[:, None], axis=0)
    tl.store(out_ptr + row * stride_out + head * DIM + dims, out.to(out_ptr.dtype.element_ty))


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int) -> torch.Tensor:
    rows, heads, head_dim = q.shape
    kv_heads, positions = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty(rows, heads * head_dim, device=q.device, dtype=q.dtype)
    _attention_kernel[(rows, heads)](
        q, k_cache, v_cache, out, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), length, head_dim**-0.5,
        GROUP=heads // kv_heads, POSITIONS=triton.next_power_of_2(positions), DIM=head_dim,
    )  # fmt: skip
    return out


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, stride_in, stride_out, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * stride_in + n + cols, mask=mask, other=0.0)
    # torch: silu in the input dtype (computed in float32, rounded), then the product rounded.
    g = gate.to(tl.float32)
    activated = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (activated * up.to(tl.float32)).to(gate.dtype), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    rows, width = gate_up.shape
    n = width // 2
    out = torch.empty(rows, n, device=gate_up.device, dtype=gate_up.dtype)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](gate_up, out, gate_up.stride(0), out.stride(0), n, BLOCK=block)
    return out


@triton.jit
def _sample_and_embed_kernel(
    logits_ptr, threshold_ptr, uniforms_ptr, table_ptr, codes_ptr, embed_ptr,
    stride_logits, stride_uniforms, stride_codes, stride_embed, vocab, width, inv_temperature,
    SAMPLE: tl.constexpr, EMBED: tl.constexpr, VOCAB: tl.constexpr, WIDTH: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    ids = tl.arange(0, VOCAB)
    in_vocab = ids < vocab
    logits = tl.load(logits_ptr + row * stride_logits + ids, mask=in_vocab, other=float("-inf")).to(tl.float32)
    if SAMPLE:
        scaled = logits * inv_temperature
        threshold = tl.load(threshold_ptr + row)
        u = tl.load(uniforms_ptr + row * stride_uniforms + ids, mask=in_vocab, other=0.5)
        noisy = scaled - tl.log(-tl.log(u))
        scores = tl.where(in_vocab & (scaled >= threshold), noisy, float("-inf"))
    else:
        scores = logits
    code = tl.argmax(scores, axis=0)
    tl.store(codes_ptr + row * stride_codes, code.to(tl.int64))
    if EMBED:
        cols = tl.arange(0, WIDTH)
        mask = cols < width
        embedding = tl.load(table_ptr + code.to(tl.int64) * width + cols, mask=mask, other=0.0)
        tl.store(embed_ptr + row * stride_embed + cols, embedding, mask=mask)


def sample_and_embed(
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    inv_temperature: float,
    top_k: int,
    table: torch.Tensor | None,
    codes_out: torch.Tensor,
    embed_out: torch.Tensor | None,
) -> None:
    rows, vocab = logits.shape
    sample = inv_temperature > 0
    if sample and 0 < top_k < vocab:
        # The k-th largest scaled logit: cuBLAS-free, one launch, and what the kernel keeps at or above.
        threshold = (logits.float() * inv_temperature).topk(top_k, dim=-1).values[:, -1].contiguous()
    else:
        threshold = torch.full((rows,), float("-inf"), device=logits.device)
    embed = table is not None and embed_out is not None
    width = table.shape[1] if embed else 1
    _sample_and_embed_kernel[(rows,)](
        logits, threshold, uniforms, table if embed else logits, codes_out, embed_out if embed else logits,
        logits.stride(0), uniforms.stride(0), codes_out.stride(0), embed_out.stride(0) if embed else 0,
        vocab, width, inv_temperature,
        SAMPLE=sample, EMBED=embed, VOCAB=triton.next_power_of_2(vocab), WIDTH=triton.next_power_of_2(width),
    )  # fmt: skip


@triton.jit
def _frame_embedding_kernel(
    base_ptr, tables_ptr, codes_ptr, text_ptr, out_ptr,
    stride_base, stride_codes, stride_text, stride_out, vocab, width,
    GROUPS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    total = tl.load(base_ptr + row * stride_base + cols, mask=mask, other=0.0).to(tl.float32)
    total += tl.load(text_ptr + row * stride_text + cols, mask=mask, other=0.0).to(tl.float32)
    for group in tl.static_range(GROUPS):
        code = tl.load(codes_ptr + row * stride_codes + group)
        row_start = (group * vocab + code) * width
        total += tl.load(tables_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, total.to(out_ptr.dtype.element_ty), mask=mask)


def frame_embedding(
    base: torch.Tensor, tables: torch.Tensor, codes: torch.Tensor, text: torch.Tensor, out: torch.Tensor
) -> None:
    rows, width = out.shape
    groups, vocab, _ = tables.shape
    block = 512
    _frame_embedding_kernel[(rows, triton.cdiv(width, block))](
        base, tables, codes, text, out, base.stride(0), codes.stride(0), text.stride(0), out.stride(0), vocab, width,
        GROUPS=groups, BLOCK=block,
    )  # fmt: skip
