"""The two graphs an artifact holds, with their signatures: the stateful step and the masked window.

Both have one dynamic frame dimension (1..max_chunk_frames), so one file serves every chunk size.
Example inputs are taken at the largest size: ExecuTorch plans the memory of some tensors from the
example's sizes after XNNPACK lowering, and the largest example makes those plans upper bounds.

Stateful: `codes (1, C, 16) int64, *state -> pcm (1, C*1920) float32, *next_state`, the decoder
package's `StatefulDecoderStep` with its flat state made explicit inputs and outputs.

Windowed: `context_codes (1, K, 16), codes (1, C, 16), pad_frames (1,) -> pcm (1, C*1920)` with
K in [conv context, 72]. It equals the eager conv-split window decoder (`WindowedDecoder`), whose
branch on K (a short context at the stream start pushes every frame through the conv stack) does
not trace into one dynamic graph. Here the caller pads a short context in front to the conv
context and says how many frames are padding; the graph masks them: zero embeddings (what the
causal pre-conv's zero padding sees), no attention to or from them, and every conv-stack layer's
output zeroed over them (what each causal layer's zero padding sees, biases included).
"""

from __future__ import annotations

import dataclasses

import torch
from codecstream.decoder import Qwen3TTSDecoder, StatefulDecoderStep
from codecstream.decoder.layers import CausalTransposedConv1d, DecoderBlock, SnakeBeta
from codecstream.decoder.transformer import sliding_window_bias
from codecstream.protocol.manifest import TensorSpec, WindowSpec
from torch import nn


@dataclasses.dataclass
class Graph:
    """A module to export, its example inputs and dynamic shapes, and its manifest signature."""

    module: nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    dynamic_shapes: tuple
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    state: tuple[TensorSpec, ...] = ()
    window: WindowSpec | None = None

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [spec.name for spec in self.outputs]


class StatefulGraph(nn.Module):
    """`StatefulDecoderStep` with float32 PCM out whatever the weights' dtype."""

    def __init__(self, model: Qwen3TTSDecoder) -> None:
        super().__init__()
        self.step = StatefulDecoderStep(model)

    def forward(self, codes: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pcm, *next_state = self.step(codes, *state)
        return (pcm.float(), *next_state)


class WindowedGraph(nn.Module):
    """The conv-split 72-frame window with a masked, padded short context (module docstring)."""

    def __init__(self, model: Qwen3TTSDecoder) -> None:
        super().__init__()
        self.model = model
        self.window = model.config.sliding_window
        self.conv_context = model.conv_receptive_frames()

    def forward(self, context_codes: torch.Tensor, codes: torch.Tensor, pad_frames: torch.Tensor) -> torch.Tensor:
        model = self.model
        frames = torch.cat([context_codes, codes], dim=1)
        length, new = frames.shape[1], codes.shape[1]
        positions = torch.arange(length, device=frames.device) - pad_frames
        valid = positions >= 0
        embeddings = model.quantizer(frames) * valid.to(model.quantizer.table.dtype)
        hidden = self._transformer(model.pre_conv(embeddings).transpose(1, 2), positions)
        # Rows of padding attended only to themselves: finite, but not decoder output. Zeroed by a
        # product, not a where: XNNPACK takes the product into its graph.
        hidden = (hidden * valid.to(hidden.dtype)[None, :, None]).transpose(1, 2)
        skipped = length - new - self.conv_context  # context frames the conv stack never needs
        tail = hidden[:, :, skipped:]
        pcm = self._masked_conv_stack(tail, (pad_frames - skipped).clamp(min=0))
        return pcm[:, pcm.shape[1] - new * model.samples_per_frame :].float()

    def _transformer(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        transformer = self.model.pre_transformer
        cos, sin = transformer.rotary(positions)
        bias = sliding_window_bias(positions, positions, self.window)
        # A padding row (negative position) may see no key at all; letting it see itself keeps
        # its softmax finite. Its output is zeroed afterwards.
        bias = bias.masked_fill(positions.unsqueeze(-1) == positions.unsqueeze(0), 0.0)
        h = transformer.input_proj(x)
        for layer in transformer.layers:
            h = layer(h, cos, sin, bias)
        return transformer.output_proj(transformer.norm(h))

    def _masked_conv_stack(self, x: torch.Tensor, pad_frames: torch.Tensor) -> torch.Tensor:
        masks: dict[int, torch.Tensor] = {}
        rate = 1  # samples per frame at the current layer
        for _, layer in self.model.conv_layers():
            for sublayer in layer.block if isinstance(layer, DecoderBlock) else [layer]:
                x = sublayer(x)
                if isinstance(sublayer, CausalTransposedConv1d):
                    rate *= sublayer.stride
                if isinstance(sublayer, SnakeBeta):
                    continue  # SnakeBeta(0) == 0: zeros stay zeros
                if rate not in masks:
                    masks[rate] = (torch.arange(x.shape[-1], device=x.device) >= pad_frames * rate).to(x.dtype)
                x = x * masks[rate]
        return x.clamp(-1.0, 1.0).squeeze(1)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def stateful_graph(model: Qwen3TTSDecoder, max_chunk_frames: int) -> Graph:
    module = StatefulGraph(model).eval()
    step = module.step
    state = step.initial_state()
    samples = model.samples_per_frame
    quantizers = model.config.num_quantizers
    state_specs = tuple(
        TensorSpec(name, tuple(tensor.shape), _dtype_name(tensor.dtype))
        for name, tensor in zip(step.state_names, state, strict=True)
    )
    frames = torch.export.Dim("frames", min=1, max=max_chunk_frames)
    return Graph(
        module=module,
        example_inputs=(torch.zeros(1, max_chunk_frames, quantizers, dtype=torch.int64), *state),
        dynamic_shapes=({1: frames}, tuple(None for _ in state)),
        inputs=(TensorSpec("codes", (1, "frames", quantizers), "int64"), *state_specs),
        outputs=(
            TensorSpec("pcm", (1, f"frames*{samples}"), "float32"),
            *(dataclasses.replace(spec, name=f"next.{spec.name}") for spec in state_specs),
        ),
        state=state_specs,
    )


def windowed_graph(model: Qwen3TTSDecoder, max_chunk_frames: int) -> Graph:
    module = WindowedGraph(model).eval()
    window = WindowSpec(context_frames=model.config.sliding_window, min_context_frames=module.conv_context)
    quantizers = model.config.num_quantizers
    frames = torch.export.Dim("frames", min=1, max=max_chunk_frames)
    context = torch.export.Dim("context_frames", min=window.min_context_frames, max=window.context_frames)
    return Graph(
        module=module,
        example_inputs=(
            torch.zeros(1, window.context_frames, quantizers, dtype=torch.int64),
            torch.zeros(1, max_chunk_frames, quantizers, dtype=torch.int64),
            torch.zeros(1, dtype=torch.int64),
        ),
        dynamic_shapes=({1: context}, {1: frames}, None),
        inputs=(
            TensorSpec("context_codes", (1, "context_frames", quantizers), "int64"),
            TensorSpec("codes", (1, "frames", quantizers), "int64"),
            TensorSpec("pad_frames", (1,), "int64"),
        ),
        outputs=(TensorSpec("pcm", (1, f"frames*{model.samples_per_frame}"), "float32"),),
        window=window,
    )


def build_graph(model: Qwen3TTSDecoder, mode: str, max_chunk_frames: int) -> Graph:
    if mode == "stateful":
        return stateful_graph(model, max_chunk_frames)
    return windowed_graph(model, max_chunk_frames)
