"""The 8-layer sliding-window transformer between the codebooks and the upsampling conv stack.

Each frame attends to itself and the `sliding_window - 1` frames before it, with RoPE on absolute
frame positions. `forward` runs a whole sequence; `step` runs a chunk of new frames against a
fixed-size cache of the last `sliding_window` keys/values per layer (stored after RoPE), and
builds its mask from the absolute position of the chunk, so a stream never has to be rebased.
"""

from __future__ import annotations

import torch
from codecstream.decoder.config import DecoderConfig
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int, initial: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), initial))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of shape (T, head_dim) for integer positions of shape (T,)."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    # cos/sin are float32; in a bf16 model they must not promote q and k (v stays bf16).
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def sliding_window_bias(query_positions: torch.Tensor, key_positions: torch.Tensor,
                        window: int) -> torch.Tensor:  # fmt: skip
    """Additive attention bias (Tq, Tk): 0 where 0 <= key position in (query - window, query], else -inf.

    Built from position tensors with comparisons only, so it traces into a static graph.
    """
    q = query_positions.unsqueeze(-1)
    k = key_positions.unsqueeze(0)
    allowed = (k <= q) & (k > q - window) & (k >= 0)
    return torch.where(allowed, 0.0, float("-inf"))


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)

    def project(self, x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """q (B, H, T, D) and k, v (B, Hkv, T, D) with RoPE applied to q and k."""
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.head_dim**-0.5 + bias
        out = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
        batch, _, length, _ = q.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))


class Mlp(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = Mlp(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)

    def _finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(attended)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        q, k, v = self.self_attn.project(self.input_layernorm(x), cos, sin)
        return self._finish(x, self.self_attn.attend(q, k, v, bias))

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
             key_cache: torch.Tensor,
             value_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        q, k, v = self.self_attn.project(self.input_layernorm(x), cos, sin)
        keys = torch.cat([key_cache, k], dim=2)
        values = torch.cat([value_cache, v], dim=2)
        out = self._finish(x, self.self_attn.attend(q, keys, values, bias))
        keep = key_cache.shape[2]
        return out, keys[:, :, keys.shape[2] - keep :], values[:, :, values.shape[2] - keep :]


class SlidingWindowTransformer(nn.Module):
    """input_proj (latent -> hidden), the layers, RMSNorm, output_proj (hidden -> latent); (B, T, C) in and out."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.window = config.sliding_window
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.layers = nn.ModuleList([TransformerLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.kv_shape = (config.num_key_value_heads, config.sliding_window, config.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        cos, sin = self.rotary(positions)
        bias = sliding_window_bias(positions, positions, self.window)
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, cos, sin, bias)
        return self.output_proj(self.norm(h))

    def step(self, x: torch.Tensor, position: torch.Tensor,
             caches: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
        """Run frames at absolute positions position, position+1, ...; caches alternate key, value per layer.

        Cache slot j of a layer holds the frame at absolute position `position - window + j`;
        slots for negative positions (stream start) are masked out.
        """
        length = x.shape[1]
        query_positions = position + torch.arange(length, device=x.device)
        key_positions = position - self.window + torch.arange(self.window + length, device=x.device)
        cos, sin = self.rotary(query_positions)
        bias = sliding_window_bias(query_positions, key_positions, self.window)
        h = self.input_proj(x)
        new_caches: list[torch.Tensor] = []
        for index, layer in enumerate(self.layers):
            h, keys, values = layer.step(h, cos, sin, bias, caches[2 * index], caches[2 * index + 1])
            new_caches.extend([keys, values])
        return self.output_proj(self.norm(h)), new_caches
