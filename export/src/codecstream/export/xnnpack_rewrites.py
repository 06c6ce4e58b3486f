"""The decoder as the `.pte` captures it: the same function, written in ops XNNPACK's delegate takes.

ExecuTorch runs what XNNPACK refuses on its portable kernels, and every refused op between two
delegated ones splits the graph into another XNNPACK partition, with a copy of each tensor that
crosses the boundary. ExecuTorch 1.4's XNNPACK partitioner refuses, among what the decoder uses:
  - a reshape whose shape holds a symbolic size (the chunk length) unless it is the one inferred
    dimension (-1), and so every reshape holding two (the attention scores: T and T + window);
  - a slice or an expand of a tensor with a dynamic dimension (rotate-half's halves, the GQA
    repeat, the im2col taps, the overlap-add blocks);
  - a mean over anything but the two innermost dims of a 4-D tensor (RMSNorm), LayerNorm, a
    concatenation of one tensor with itself (RoPE's angles).
`delegable(module)` is a copy of a graph module with the decoder's layers switched to forms made of
ops XNNPACK takes: convolutions as convolutions (not im2col or overlap-add GEMMs, whose weights are
views computed per call), attention in 3-D with heads as the batch, means as a linear layer with a
constant weight of 1/n, rotate-half as a linear layer with a constant signed permutation.
`infer_symbolic_reshapes` turns the one symbolic size of a reshape into -1.

The reference decoder is untouched: these forms compute the same function within float rounding
(the parity tests and the export check compare the artifact with the eager decoder).
"""

from __future__ import annotations

import copy

import torch
from codecstream.decoder.layers import CausalConv1d, CausalTransposedConv1d, ConvNeXtBlock
from codecstream.decoder.transformer import RMSNorm, RotaryEmbedding, TransformerLayer
from torch import nn
from torch.fx.passes.infra.pass_base import PassResult
from torch.nn import functional as F


def delegable(module: nn.Module, *, convs_as_2d: bool = False) -> nn.Module:
    """A copy of `module` whose decoder layers compute in ops XNNPACK delegates.

    `convs_as_2d`: every dense convolution (not the depthwise ones) captured as a 2-D convolution
    over a signal of height 1, for int8: ExecuTorch 1.4's XNNPACK quantizer annotates 2-D
    convolutions only, so a 1-D one stays fp32 (and the int8 .pte runs at about the fp32 one's time:
    docs/performance.md). Measured, not exported (benchmarks/pte_int8_tradeoff.py): the unsqueeze and squeeze
    around each such convolution stay outside XNNPACK, between partitions.
    """
    module = copy.deepcopy(module)
    for child in list(module.modules()):
        if isinstance(child, CausalConv1d):
            # XNNPACK's convolution is its own GEMM; the decoder's im2col and pointwise GEMMs
            # slice and view the signal and the weight per call, which XNNPACK refuses.
            child.im2col = child.pointwise = False
            if convs_as_2d and child.conv.groups == 1:
                child.__class__ = _Conv2dCausalConv1d
                child.register_buffer("weight_2d", child.conv.weight.detach().unsqueeze(2))
        elif isinstance(child, CausalTransposedConv1d) and not child.sub_pixel:
            child.sub_pixel = True
            child.register_buffer("phase_weight", torch.empty(0))
            child.register_buffer("phase_bias", torch.empty(0))
            child.refresh()
        elif isinstance(child, ConvNeXtBlock):
            child.norm = _LinearMeanLayerNorm(child.norm)
        elif isinstance(child, RMSNorm):
            child.__class__ = _LinearMeanRMSNorm
            child.register_buffer("mean_weight", _mean_weight(child.weight))
        elif isinstance(child, RotaryEmbedding):
            child.__class__ = _WholeAngleRotary
            child.register_buffer("angle_freq", torch.cat([child.inv_freq, child.inv_freq]))
        elif isinstance(child, TransformerLayer):
            child.__class__ = _HeadsAsBatchLayer
            child.rotate_half = _RotateHalf(child.self_attn.head_dim, child.input_layernorm.weight)
    if convs_as_2d:
        for child in module.modules():
            if isinstance(child, CausalTransposedConv1d):
                child.__class__ = _Conv2dSubPixel
                child.register_buffer("phase_weight_2d", child.phase_weight.unsqueeze(2))
    return module


def _drop_width(out: torch.Tensor) -> torch.Tensor:
    """(B, C, T, 1) -> (B, C, T) as a reshape with T inferred: XNNPACK has no squeeze."""
    return out.reshape(out.shape[0], out.shape[1], -1)


class _Conv2dCausalConv1d(CausalConv1d):
    """The causal convolution as a 2-D one over a signal of height 1."""

    weight_2d: torch.Tensor

    def _valid(self, padded: torch.Tensor) -> torch.Tensor:
        if padded.dtype != self.weight_2d.dtype:
            return self._valid(padded.to(self.weight_2d.dtype)).to(padded.dtype)
        out = F.conv2d(padded.unsqueeze(2), self.weight_2d, self.conv.bias, dilation=(1, self.dilation))
        return out.squeeze(2)


class _Conv2dSubPixel(CausalTransposedConv1d):
    """The sub-pixel form's phase convolution as a 2-D one over a signal of height 1."""

    phase_weight_2d: torch.Tensor

    def _sub_pixel(self, padded: torch.Tensor) -> torch.Tensor:
        out_channels, s = self.conv.out_channels, self.stride
        phases = F.conv2d(padded.unsqueeze(2), self.phase_weight_2d, self.phase_bias).squeeze(2)
        batch, length = padded.shape[0], padded.shape[-1] - self.carry_columns
        return phases.view(batch, out_channels, s, length).transpose(2, 3).reshape(batch, out_channels, length * s)


def _mean_weight(like: torch.Tensor) -> torch.Tensor:
    """(1, n) of 1/n: a linear layer with it is the mean over the last dimension."""
    return torch.full((1, like.shape[-1]), 1.0 / like.shape[-1], dtype=like.dtype)


class _RotateHalf(nn.Module):
    """RoPE's cat([-x[..., half:], x[..., :half]], -1) as a linear layer: each row of its weight one
    +-1, so the product is exact."""

    def __init__(self, head_dim: int, like: torch.Tensor) -> None:
        super().__init__()
        half = head_dim // 2
        weight = torch.zeros(head_dim, head_dim, dtype=like.dtype)
        rows = torch.arange(half)
        weight[rows, rows + half] = -1.0
        weight[rows + half, rows] = 1.0
        self.register_buffer("weight", weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class _LinearMeanRMSNorm(RMSNorm):
    mean_weight: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = F.linear(x.float().pow(2), self.mean_weight)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class _LinearMeanLayerNorm(nn.Module):
    """nn.LayerNorm over the last dimension, its two means as linear layers."""

    def __init__(self, norm: nn.LayerNorm) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps
        self.register_buffer("mean_weight", _mean_weight(norm.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centered = x - F.linear(x, self.mean_weight)
        variance = F.linear(centered * centered, self.mean_weight)
        return centered * torch.rsqrt(variance + self.eps) * self.weight + self.bias


class _WholeAngleRotary(RotaryEmbedding):
    """The angles as one product with the frequencies already repeated: RoPE's concatenation of the
    angles with themselves would split the graph between the product and cos/sin."""

    angle_freq: torch.Tensor

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float().unsqueeze(-1) * self.angle_freq
        return angles.cos(), angles.sin()


class _HeadsAsBatchLayer(TransformerLayer):
    """Attention on (heads, T, head_dim) tensors of a batch of one, with bmm: the 4-D matmul's
    decomposition reshapes the scores with two symbolic sizes. GQA groups a key/value head's
    query heads as rows instead of repeating keys and values (an expand)."""

    rotate_half: _RotateHalf

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x * cos.to(x.dtype) + self.rotate_half(x) * sin.to(x.dtype)

    def _attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
                   key_cache: torch.Tensor | None,
                   value_cache: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        attn = self.self_attn
        heads, kv_heads, head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        groups = heads // kv_heads
        h = self.input_layernorm(x)
        # (1, T, H*D) -> (T, Hkv, groups, D) -> (Hkv, groups, T, D) -> (Hkv, groups*T, D)
        q = self._rotate(attn.q_proj(h).view(-1, kv_heads, groups, head_dim).permute(1, 2, 0, 3), cos, sin)
        q = q.reshape(kv_heads, -1, head_dim)
        k = self._rotate(attn.k_proj(h).view(-1, kv_heads, head_dim).transpose(0, 1), cos, sin)
        v = attn.v_proj(h).view(-1, kv_heads, head_dim).transpose(0, 1)
        if key_cache is not None:
            window = key_cache.shape[2]
            k = torch.cat([key_cache.view(kv_heads, window, head_dim), k], dim=1)
            v = torch.cat([value_cache.view(kv_heads, window, head_dim), v], dim=1)
        if groups > 1:
            bias = torch.cat([bias] * groups, dim=0)
        scores = torch.bmm(q, k.transpose(1, 2)) * head_dim**-0.5 + bias
        out = torch.bmm(F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
        # (Hkv, groups*T, D) -> (Hkv, groups, T, D) -> (T, Hkv, groups, D) -> (1, T, H*D)
        out = out.view(kv_heads, groups, -1, head_dim).permute(2, 0, 1, 3).reshape(1, -1, heads * head_dim)
        return attn.o_proj(out), k, v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        attended, _, _ = self._attention(x, cos, sin, bias, None, None)
        return self._finish(x, attended)

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
             key_cache: torch.Tensor,
             value_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        attended, keys, values = self._attention(x, cos, sin, bias, key_cache, value_cache)
        keep = key_cache.shape[2]
        length = keys.shape[1]
        return (
            self._finish(x, attended),
            keys[:, length - keep :].unsqueeze(0),
            values[:, length - keep :].unsqueeze(0),
        )


#: The rewrite's own linear layers, which int8 quantization leaves in fp32: they compute statistics
#: (a norm's means) and RoPE's rotation, not learned projections, and cost next to nothing.
UNQUANTIZED = (_LinearMeanRMSNorm, _LinearMeanLayerNorm, _RotateHalf)


def infer_symbolic_reshapes(graph_module: torch.fx.GraphModule) -> PassResult:
    """Each reshape (edge `view_copy`) whose shape holds exactly one symbolic size gets -1 there:
    the same shape, inferred from the input's size, which XNNPACK takes."""
    view = torch.ops.aten.view_copy.default
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "_op", node.target) != view:
            continue
        shape = list(node.args[1])
        symbolic = [index for index, size in enumerate(shape) if not isinstance(size, int)]
        if len(symbolic) == 1:
            shape[symbolic[0]] = -1
            node.args = (node.args[0], shape, *node.args[2:])
    graph_module.graph.eliminate_dead_code()
    graph_module.recompile()
    return PassResult(graph_module, True)
