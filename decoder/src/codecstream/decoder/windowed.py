"""Windowed decoding: each chunk is decoded afresh with up to 72 frames of left context.

An approximation of the full decode (the stacked attention reaches ~568 frames back, the window
72), kept because it needs no state beyond the last codes. Two variants give the same output:
`plain` pushes the whole window through the conv stack; `conv_split` runs the transformer over
the window but the conv stack only over its receptive field plus the new frames, which is 4x
(C=25) to 8x (C=4) cheaper, because ~70% of the time is in the conv stack.
"""

from __future__ import annotations

import numpy as np
import torch
from codecstream.decoder.model import Qwen3TTSDecoder
from codecstream.decoder.torch_frame_decoder import TorchFrameDecoder
from torch import nn


class WindowedDecoderModule(nn.Module):
    """`forward(context_codes (B, K, Q), new_codes (B, C, Q)) -> pcm (B, C * 1920)` for the C new frames.

    With `conv_split` and K >= `conv_context_frames` the conv stack sees only the last
    `conv_context_frames` context frames; for a shorter K (stream start) it sees them all, which
    is the same computation. An exporter wanting one dynamic graph for conv_split should declare
    K in [conv_context_frames, window]; the plain variant accepts any K.
    """

    def __init__(self, model: Qwen3TTSDecoder, conv_split: bool) -> None:
        super().__init__()
        self.model = model
        self.conv_split = conv_split
        self.conv_context_frames = model.conv_receptive_frames()

    def forward(self, context_codes: torch.Tensor, new_codes: torch.Tensor) -> torch.Tensor:
        new_frames = new_codes.shape[1]
        hidden = self.model.front(torch.cat([context_codes, new_codes], dim=1))
        if self.conv_split and context_codes.shape[1] > self.conv_context_frames:
            hidden = hidden[:, :, hidden.shape[2] - self.conv_context_frames - new_frames :]
        pcm = self.model.conv_stack(hidden)
        return pcm[:, pcm.shape[1] - new_frames * self.model.samples_per_frame :]


class WindowedDecoder(TorchFrameDecoder):
    """`FrameDecoder` that keeps the last `context_frames` codes and decodes each chunk in a fresh window."""

    def __init__(self, model: Qwen3TTSDecoder, conv_split: bool = True, context_frames: int | None = None) -> None:
        super().__init__(model)
        self.module = WindowedDecoderModule(model, conv_split).eval()
        self.context_frames = model.config.sliding_window if context_frames is None else context_frames
        self._context = self._empty()

    def _empty(self) -> torch.Tensor:
        return torch.zeros(1, 0, self.model.config.num_quantizers, dtype=torch.int64)

    def _remember(self, codes: torch.Tensor) -> None:
        joined = torch.cat([self._context, codes], dim=1)
        self._context = joined[:, max(0, joined.shape[1] - self.context_frames) :]

    def reset(self) -> None:
        self._context = self._empty()

    @torch.inference_mode()
    def decode_tensor(self, codes: np.ndarray | torch.Tensor) -> torch.Tensor:
        codes = self.codes_tensor(codes)
        if codes.shape[1] == 0:
            return torch.zeros(0)
        pcm = self.module(self._context, codes)[0]
        self._remember(codes)
        return pcm

    def prime_tensor(self, codes: np.ndarray | torch.Tensor) -> None:
        self._remember(self.codes_tensor(codes))
