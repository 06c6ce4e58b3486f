"""Stateful streaming decoding: every frame is computed once, and the output equals the full decode.

`StatefulDecoderStep` is the exportable part: a pure function
`(codes (B, C, Q) int64, *state) -> (pcm (B, C * 1920), *new_state)` whose state is a flat tuple of
fixed-shape tensors (`state_names` / `state_shapes`). `StatefulDecoder` is the thin Python wrapper
that holds the state and implements `FrameDecoder`.
"""

from __future__ import annotations

import numpy as np
import torch
from codecstream.decoder.model import Qwen3TTSDecoder
from codecstream.decoder.torch_frame_decoder import TorchFrameDecoder
from torch import nn

POSITION = "position"


class StatefulDecoderStep(nn.Module):
    """One streaming step of the decoder, as a pure `forward(codes, *state) -> (pcm, *new_state)`.

    State, in order (batch dimension B first unless noted):
      - `position` (1,) int64: absolute index of the next frame (frames decoded or primed so far);
      - `pre_conv.history` (B, codebook_dim, 2): embeddings of the last 2 frames;
      - `pre_transformer.layers.{i}.key` / `.value` (B, kv_heads, sliding_window, head_dim): keys
        (after RoPE) and values of the last `sliding_window` frames, oldest first; slots before
        the stream start are masked by position;
      - each causal conv's `history` (B, channels, (k-1)*dilation): its last input samples;
      - each overlapping transposed conv's `carry` (B, channels, 1): its last input column.
    Everything else is constant, so an exported graph of `forward` needs nothing besides.
    """

    def __init__(self, model: Qwen3TTSDecoder) -> None:
        super().__init__()
        self.model = model
        front = model.front_state_shapes()
        conv = model.conv_state_shapes()
        self._front_count = len(front)
        self.state_names: tuple[str, ...] = (POSITION, *(name for name, _ in front + conv))
        self._shapes = [shape for _, shape in front + conv]

    def state_shapes(self, batch_size: int = 1) -> tuple[tuple[int, ...], ...]:
        return ((1,), *((batch_size, *shape) for shape in self._shapes))

    def initial_state(self, batch_size: int = 1) -> tuple[torch.Tensor, ...]:
        """The state of a fresh stream: position 0, zero histories, empty (masked) caches."""
        param = next(self.model.parameters())
        position = torch.zeros(1, dtype=torch.int64, device=param.device)
        return (
            position,
            *(torch.zeros(batch_size, *shape, dtype=param.dtype, device=param.device) for shape in self._shapes),
        )

    def forward(self, codes: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        position, front_states, conv_states = self._split(state)
        hidden, new_front = self.model.front_step(codes, position, front_states)
        pcm, new_conv = self.model.conv_step(hidden, conv_states)
        return (pcm, position + codes.shape[1], *new_front, *new_conv)

    def advance_context(self, codes: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Feed frames through the per-frame front only; the conv-stack state is passed through untouched.

        Used for priming: the conv stack only looks `model.conv_receptive_frames()` frames back, so
        context older than that needs no samples computed, as long as at least that many frames go
        through `forward` afterwards.
        """
        position, front_states, conv_states = self._split(state)
        _, new_front = self.model.front_step(codes, position, front_states)
        return (position + codes.shape[1], *new_front, *conv_states)

    def _split(self, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        if len(state) != len(self.state_names):
            raise ValueError(f"expected {len(self.state_names)} state tensors, got {len(state)}")
        rest = list(state[1:])
        return state[0], rest[: self._front_count], rest[self._front_count :]


class StatefulDecoder(TorchFrameDecoder):
    """Streaming `FrameDecoder` over `StatefulDecoderStep`; reproduces the full decode to float rounding."""

    def __init__(self, model: Qwen3TTSDecoder) -> None:
        super().__init__(model)
        self.step_module = StatefulDecoderStep(model).eval()
        self._prime_tail = model.conv_receptive_frames()
        self.state = self.step_module.initial_state()

    def reset(self) -> None:
        self.state = self.step_module.initial_state()

    @property
    def frames_seen(self) -> int:
        """Frames decoded or primed since the last reset."""
        return int(self.state[0])

    @torch.inference_mode()
    def decode_tensor(self, codes: np.ndarray | torch.Tensor) -> torch.Tensor:
        """(k, Q) or (1, k, Q) codes -> (k * samples_per_frame,) float32 tensor; advances the state."""
        codes = self.codes_tensor(codes)
        if codes.shape[1] == 0:
            return torch.zeros(0)
        pcm, *self.state = self.step_module(codes, *self.state)
        self.state = tuple(self.state)
        return pcm[0]

    @torch.inference_mode()
    def prime_tensor(self, codes: np.ndarray | torch.Tensor) -> None:
        codes = self.codes_tensor(codes)
        skip = codes.shape[1] - self._prime_tail
        if skip > 0:
            self.state = self.step_module.advance_context(codes[:, :skip], *self.state)
            codes = codes[:, skip:]
        if codes.shape[1]:
            _, *state = self.step_module(codes, *self.state)
            self.state = tuple(state)
