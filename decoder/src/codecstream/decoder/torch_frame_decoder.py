"""The shared numpy boundary of the eager decoders: check codes, call the torch method, hand back float32."""

from __future__ import annotations

import abc

import numpy as np
import torch
from codecstream.decoder.codes import codes_to_tensor
from codecstream.decoder.model import Qwen3TTSDecoder
from codecstream.protocol.decoding import FrameDecoder


class TorchFrameDecoder(FrameDecoder):
    """A `FrameDecoder` whose work is done by `decode_tensor` / `prime_tensor` on int64 (1, k, Q) codes.

    The torch methods are public too, for callers (the exporter, parity tools) that hold tensors.
    """

    def __init__(self, model: Qwen3TTSDecoder) -> None:
        self.model = model
        self.sample_rate = model.config.sample_rate
        self.samples_per_frame = model.samples_per_frame

    def codes_tensor(self, codes: np.ndarray | torch.Tensor) -> torch.Tensor:
        """(k, Q) or (1, k, Q) integer codes -> checked int64 tensor (1, k, Q)."""
        return codes_to_tensor(codes, self.model.config.num_quantizers, self.model.config.codebook_size)

    @abc.abstractmethod
    def decode_tensor(self, codes: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Decode k frames into a (k * samples_per_frame,) float32 tensor."""

    @abc.abstractmethod
    def prime_tensor(self, codes: np.ndarray | torch.Tensor) -> None:
        """Take k frames as context without producing samples."""

    def decode(self, codes: np.ndarray) -> np.ndarray:
        return self.decode_tensor(codes).float().numpy()

    def prime(self, codes: np.ndarray) -> None:
        self.prime_tensor(codes)
