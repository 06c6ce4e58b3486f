"""The whole decoder network, with the official `decoder.*` parameter names (prefix stripped).

codes (B, T, 16) -> quantizer (B, 512, T) -> pre_conv k3 -> sliding-window transformer ->
two x2 upsamplers (transposed conv k2 s2 + ConvNeXt) -> conv k7 to decoder_dim -> four
DecoderBlocks (x8, x5, x4, x3) -> SnakeBeta -> conv k7 to 1 channel -> clamp: (B, T * 1920).

The split into `front` (quantizer, pre_conv, transformer: per frame) and `conv_stack` (everything
after: per sample) is the seam the windowed and streaming decoders cut along.
"""

from __future__ import annotations

import math

import torch
from codecstream.decoder.config import DecoderConfig
from codecstream.decoder.layers import (
    CausalConv1d,
    CausalTransposedConv1d,
    ConvNeXtBlock,
    DecoderBlock,
    ResidualUnit,
    SnakeBeta,
    StateShape,
    chain_state_shapes,
    step_sequence,
)
from codecstream.decoder.quantizer import SplitQuantizer
from codecstream.decoder.transformer import SlidingWindowTransformer
from torch import nn


class Qwen3TTSDecoder(nn.Module):
    """Qwen3-TTS-Tokenizer-12Hz decoder. Build with random weights, or load with `load_decoder`."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.quantizer = SplitQuantizer(config)
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, kernel_size=3)
        self.pre_transformer = SlidingWindowTransformer(config)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [
                    CausalTransposedConv1d(config.latent_dim, config.latent_dim, factor, factor),
                    ConvNeXtBlock(config.latent_dim),
                ]
            )
            for factor in config.upsampling_ratios
        )
        rates = config.upsample_rates
        self.decoder = nn.ModuleList(
            [CausalConv1d(config.latent_dim, config.decoder_dim, kernel_size=7)]
            + [
                DecoderBlock(config.decoder_dim // 2**i, config.decoder_dim // 2 ** (i + 1), rate)
                for i, rate in enumerate(rates)
            ]
            + [SnakeBeta(config.output_channels), CausalConv1d(config.output_channels, 1, kernel_size=7)]
        )
        self.samples_per_frame = config.samples_per_frame

    @torch.no_grad()
    def refresh_derived(self) -> None:
        """Recompute the tables derived from parameters (codebooks, SnakeBeta exponentials, the
        sub-pixel transposed convs' rearranged weights)."""
        self.quantizer.refresh()
        for module in self.modules():
            if isinstance(module, (SnakeBeta, CausalTransposedConv1d)):
                module.refresh()

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # type: ignore[override]
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self.refresh_derived()
        return result

    def conv_layers(self) -> list[tuple[str, nn.Module]]:
        """The conv stack after the transformer, in order, with official name prefixes."""
        named: list[tuple[str, nn.Module]] = []
        for i, pair in enumerate(self.upsample):
            named += [(f"upsample.{i}.0", pair[0]), (f"upsample.{i}.1", pair[1])]
        named += [(f"decoder.{i}", layer) for i, layer in enumerate(self.decoder)]
        return named

    # -- whole-signal paths ------------------------------------------------------------------------

    def front(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, T, Q) codes -> (B, latent_dim, T) transformer output, positions 0..T-1."""
        h = self.pre_conv(self.quantizer(codes)).transpose(1, 2)
        return self.pre_transformer(h).transpose(1, 2)

    def conv_stack(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, latent_dim, T) -> (B, T * samples_per_frame) PCM in [-1, 1], from zero conv histories."""
        for _, layer in self.conv_layers():
            hidden = layer(hidden)
        return hidden.clamp(-1.0, 1.0).squeeze(1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Full-utterance decode: (B, T, Q) integer codes -> (B, T * samples_per_frame) float PCM."""
        return self.conv_stack(self.front(codes))

    # -- streaming paths ---------------------------------------------------------------------------

    def front_state_shapes(self) -> list[StateShape]:
        shapes = [(f"pre_conv.{name}", shape) for name, shape in self.pre_conv.state_shapes()]
        for i in range(len(self.pre_transformer.layers)):
            shapes.append((f"pre_transformer.layers.{i}.key", self.pre_transformer.kv_shape))
            shapes.append((f"pre_transformer.layers.{i}.value", self.pre_transformer.kv_shape))
        return shapes

    def conv_state_shapes(self) -> list[StateShape]:
        return chain_state_shapes(self.conv_layers())

    def front_step(self, codes: torch.Tensor, position: torch.Tensor,
                   states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
        """Like `front` for frames at absolute `position`..., given `front_state_shapes` states."""
        pre_conv_count = len(self.pre_conv.state_shapes())
        h, pre_conv_states = self.pre_conv.step(self.quantizer(codes), states[:pre_conv_count])
        h, caches = self.pre_transformer.step(h.transpose(1, 2), position, states[pre_conv_count:])
        return h.transpose(1, 2), pre_conv_states + caches

    def conv_step(self, hidden: torch.Tensor,
                  states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
        """Like `conv_stack` continuing from `conv_state_shapes` states."""
        pcm, new_states = step_sequence([layer for _, layer in self.conv_layers()], hidden, states)
        return pcm.clamp(-1.0, 1.0).squeeze(1), new_states

    def conv_receptive_frames(self) -> int:
        """How many frames before frame n the conv stack's output for frame n (or its state after n) can see.

        Walks the stack from the output back to the transformer output, in samples at each rate,
        rounding up; also counts each layer's state span so that restarting the conv stack from
        arbitrary state that many frames early reproduces both output and state.
        """
        reach = 0
        for _, layer in reversed(self.conv_layers()):
            reach = _reach_before(layer, reach)
        return reach


def _reach_before(layer: nn.Module, reach: int) -> int:
    """Samples of look-back at a layer's input needed for `reach` samples of look-back at its output."""
    if isinstance(layer, CausalConv1d):
        return reach + layer.context
    if isinstance(layer, CausalTransposedConv1d):
        return math.ceil(reach / layer.stride) + layer.carry_columns
    if isinstance(layer, ConvNeXtBlock):
        return reach + layer.dwconv.context
    if isinstance(layer, DecoderBlock):
        for inner in reversed(list(layer.block)):
            reach = _reach_before(inner, reach)
        return reach
    if isinstance(layer, ResidualUnit):
        return reach + layer.conv1.context
    return reach
