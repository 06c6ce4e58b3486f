"""The convolutional building blocks, each with a whole-signal `forward` and a streaming `step`.

`step(x, states)` takes this block's state tensors (a list, in `state_shapes` order) and returns
`(y, new_states)`. Every state is a fixed-size tensor sliced out of a concatenation, so a traced
`step` has shapes affine in the chunk length and no Python-side memory. Starting a stream from
zero histories reproduces `forward`'s zero left padding exactly.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# (name, shape without the batch dimension)
StateShape = tuple[str, tuple[int, ...]]


# oneDNN's conv1d is slow for wide layers and beats one im2col GEMM for narrow layers over long
# signals (docs/performance.md, "Measurements behind the code"). So convs from this width up run as
# a GEMM of the weight, as stored, against the k shifted copies of the input.
GEMM_MIN_CHANNELS = 512


def _matmul(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(Cout, Cin) @ (B, Cin, T) as a batched GEMM; a plain 2-D @ 3-D matmul folds the batch into
    the rows instead, which copies x transposed and returns a transposed (non-contiguous) result."""
    return torch.matmul(weight.unsqueeze(0), x)


class CausalConv1d(nn.Module):
    """Conv1d that sees only the past: left padding of (k-1)*d, output length = input length."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1,
                 groups: int = 1) -> None:  # fmt: skip
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.context = (kernel_size - 1) * dilation
        self.dilation = dilation
        self.pointwise = kernel_size == 1 and groups == 1
        self.im2col = kernel_size > 1 and groups == 1 and in_channels >= GEMM_MIN_CHANNELS

    def _valid(self, padded: torch.Tensor) -> torch.Tensor:
        """The 'valid' convolution of an already left-padded input: output length = input - context.

        Computes in the weights' dtype and returns the input's: a layer given bf16 weights in an
        fp32 model (`precision.mixed_precision`) keeps the activations and the state in fp32.
        """
        if padded.dtype != self.conv.weight.dtype:
            return self._valid(padded.to(self.conv.weight.dtype)).to(padded.dtype)
        if self.pointwise:
            return _matmul(self.conv.weight[:, :, 0], padded) + self.conv.bias.unsqueeze(-1)
        if self.im2col:
            out_channels, in_channels, kernel = self.conv.weight.shape
            length = padded.shape[-1] - self.context
            shifted = [padded[..., tap * self.dilation : tap * self.dilation + length] for tap in range(kernel)]
            columns = torch.stack(shifted, dim=2).reshape(padded.shape[0], in_channels * kernel, length)
            return _matmul(
                self.conv.weight.reshape(out_channels, in_channels * kernel), columns
            ) + self.conv.bias.unsqueeze(-1)
        return self.conv(padded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._valid(F.pad(x, (self.context, 0)))

    def state_shapes(self) -> list[StateShape]:
        if self.context == 0:
            return []
        return [("history", (self.conv.in_channels, self.context))]

    def step(self, x: torch.Tensor, states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if self.context == 0:
            return self._valid(x), []
        padded = torch.cat([states[0], x], dim=-1)
        return self._valid(padded), [padded[..., padded.shape[-1] - self.context :]]


class CausalTransposedConv1d(nn.Module):
    """ConvTranspose1d with stride s and kernel (n+1)*s, trimmed to exactly s outputs per input.

    Output sample t*s + j is the sum over taps m = 0..n of the input column t - m times the weight
    slice [:, :, m*s + j]. With n > 0 each input also writes into the next n inputs' outputs;
    streaming keeps the last n input columns (`carry`) and recomputes that overlap, which matches
    the whole-signal sum term for term. `forward` is the step from a zero carry.

    Wide inputs are one GEMM of the input against the weight as stored, (L, Cin) @ (Cin, Cout * k),
    followed by an overlap-add of the n+1 blocks of s taps: ConvTranspose1d takes a slow path on
    the CPU, and the GEMM the other way round, with the weight transposed, streams it slower. Narrow
    inputs over long signals are a sub-pixel convolution instead: an ordinary causal conv with
    n+1 taps and Cout * s output channels, one per output phase, then an interleave of the phases,
    which exported beats the overlap-add, whose strided slices and permute of the (L, Cout, k)
    blocks cost more than the GEMM; over the fewest inputs the overlap-add stays ahead. The
    measurements: docs/performance.md, "Measurements behind the code".
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        if kernel_size % stride:
            raise ValueError(f"kernel_size {kernel_size} must be a multiple of stride {stride}")
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.carry_columns = kernel_size // stride - 1
        self.sub_pixel = in_channels < GEMM_MIN_CHANNELS
        if self.sub_pixel:
            # The weight and bias rearranged for `_sub_pixel`, kept beside them so an exported graph
            # holds them as constants: ONNX Runtime's int8 quantizer needs a Conv's weight to be one,
            # and ExecuTorch's XNNPACK delegate takes a conv only with a constant weight and bias
            # (with the bias repeated per call, the six sub-pixel convs ran on ExecuTorch's portable
            # kernel, far slower than real time: docs/performance.md, "Measurements behind the code").
            self.register_buffer("phase_weight", torch.empty(0), persistent=False)
            self.register_buffer("phase_bias", torch.empty(0), persistent=False)
            self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute `phase_weight` and `phase_bias` from the weight and bias (after loading or casting them)."""
        if not self.sub_pixel:
            return
        in_channels, out_channels, _ = self.conv.weight.shape
        n, s = self.carry_columns, self.stride
        # Tap n - m of phase j reads input column t - m with weight slice [:, :, m*s + j].
        taps = self.conv.weight.view(in_channels, out_channels, n + 1, s).flip(2)
        self.phase_weight = taps.permute(1, 3, 0, 2).reshape(out_channels * s, in_channels, n + 1).contiguous()
        self.phase_bias = self.conv.bias.repeat_interleave(s).contiguous()

    def _overlap_add(self, padded: torch.Tensor) -> torch.Tensor:
        """Outputs for all but the first `carry_columns` columns of `padded` (B, Cin, n + L).

        Like `CausalConv1d._valid`, computes in the weights' dtype and returns the input's.
        """
        if padded.dtype != self.conv.weight.dtype:
            return self._overlap_add(padded.to(self.conv.weight.dtype)).to(padded.dtype)
        if self.sub_pixel:
            return self._sub_pixel(padded)
        in_channels, out_channels, kernel = self.conv.weight.shape
        batch, length = padded.shape[0], padded.shape[-1] - self.carry_columns
        blocks = torch.matmul(padded.transpose(1, 2), self.conv.weight.reshape(in_channels, out_channels * kernel))
        blocks = blocks.view(batch, padded.shape[-1], out_channels, kernel)
        n, s = self.carry_columns, self.stride
        out = blocks[:, n : n + length, :, :s]
        for j in range(1, n + 1):
            out = out + blocks[:, n - j : n - j + length, :, j * s : (j + 1) * s]
        out = out.permute(0, 2, 1, 3).reshape(batch, out_channels, length * s)
        return out + self.conv.bias.unsqueeze(-1)

    def _sub_pixel(self, padded: torch.Tensor) -> torch.Tensor:
        """`_overlap_add` as a conv with one output channel per (Cout, phase), then the interleave."""
        out_channels, s = self.conv.out_channels, self.stride
        phases = F.conv1d(padded, self.phase_weight, self.phase_bias)
        batch, length = padded.shape[0], padded.shape[-1] - self.carry_columns
        return phases.view(batch, out_channels, s, length).transpose(2, 3).reshape(batch, out_channels, length * s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._overlap_add(F.pad(x, (self.carry_columns, 0)))

    def state_shapes(self) -> list[StateShape]:
        if self.carry_columns == 0:
            return []
        return [("carry", (self.conv.in_channels, self.carry_columns))]

    def step(self, x: torch.Tensor, states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if self.carry_columns == 0:
            return self._overlap_add(x), []
        padded = torch.cat([states[0], x], dim=-1)
        return self._overlap_add(padded), [padded[..., padded.shape[-1] - self.carry_columns :]]


class SnakeBeta(nn.Module):
    """x + 1/(exp(beta) + 1e-9) * sin^2(exp(alpha) * x), per channel.

    The exponentials are precomputed into buffers by `refresh()` so that an exported graph holds
    constants instead of recomputing exp() every call.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self.register_buffer("exp_alpha", torch.ones(channels, 1), persistent=False)
        self.register_buffer("inv_beta", torch.ones(channels, 1), persistent=False)
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        self.exp_alpha.copy_(torch.exp(self.alpha).unsqueeze(-1))
        self.inv_beta.copy_((1.0 / (torch.exp(self.beta) + 1e-9)).unsqueeze(-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # sine * sine rather than .square(): exported, square becomes Pow, a slower pass in ONNX Runtime.
        sine = torch.sin(x * self.exp_alpha)
        return torch.addcmul(x, self.inv_beta, sine * sine)


class ConvNeXtBlock(nn.Module):
    """Depthwise causal conv k7, LayerNorm, 4x pointwise MLP with GELU, scaled by gamma, residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def _pointwise(self, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        h = self.pwconv2(self.act(self.pwconv1(self.norm(mixed.transpose(1, 2)))))
        return x + (self.gamma * h).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._pointwise(x, self.dwconv(x))

    def state_shapes(self) -> list[StateShape]:
        return [(f"dwconv.{name}", shape) for name, shape in self.dwconv.state_shapes()]

    def step(self, x: torch.Tensor, states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        mixed, new_states = self.dwconv.step(x, states)
        return self._pointwise(x, mixed), new_states


class ResidualUnit(nn.Module):
    """SnakeBeta, causal conv k7 with dilation d, SnakeBeta, conv k1, plus the input."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))

    def state_shapes(self) -> list[StateShape]:
        return [(f"conv1.{name}", shape) for name, shape in self.conv1.state_shapes()]

    def step(self, x: torch.Tensor, states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h, new_states = self.conv1.step(self.act1(x), states)
        return x + self.conv2(self.act2(h)), new_states


class DecoderBlock(nn.Module):
    """SnakeBeta, causal transposed conv (k=2r, s=r) halving the channels, residual units d=1,3,9."""

    def __init__(self, in_dim: int, out_dim: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(in_dim), CausalTransposedConv1d(in_dim, out_dim, 2 * rate, rate)]
            + [ResidualUnit(out_dim, dilation) for dilation in (1, 3, 9)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            x = layer(x)
        return x

    def state_shapes(self) -> list[StateShape]:
        return [
            (f"block.{index}.{name}", shape)
            for index, layer in enumerate(self.block)
            if not isinstance(layer, SnakeBeta)
            for name, shape in layer.state_shapes()
        ]

    def step(self, x: torch.Tensor, states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return step_sequence(list(self.block), x, states)


def step_sequence(layers: list[nn.Module], x: torch.Tensor,
                  states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
    """Step a chain of layers, handing each the slice of `states` its `state_shapes` declares."""
    new_states: list[torch.Tensor] = []
    offset = 0
    for layer in layers:
        if isinstance(layer, SnakeBeta):
            x = layer(x)
            continue
        count = len(layer.state_shapes())
        x, layer_states = layer.step(x, states[offset : offset + count])
        new_states.extend(layer_states)
        offset += count
    return x, new_states


def chain_state_shapes(named_layers: list[tuple[str, nn.Module]]) -> list[StateShape]:
    return [
        (f"{prefix}.{name}", shape)
        for prefix, layer in named_layers
        if not isinstance(layer, SnakeBeta)
        for name, shape in layer.state_shapes()
    ]
