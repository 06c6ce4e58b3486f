"""Full-utterance decoding, the ground truth every other mode is measured against.

As a `FrameDecoder` it re-decodes everything seen since `reset()` on every call and returns the
new tail, so its cost grows with the utterance: use it for parity, not for playback.
"""

from __future__ import annotations

import numpy as np
import torch
from codecstream.decoder.codes import codes_to_tensor
from codecstream.decoder.model import Qwen3TTSDecoder
from codecstream.decoder.torch_frame_decoder import TorchFrameDecoder


@torch.inference_mode()
def decode_utterance(model: Qwen3TTSDecoder, codes: np.ndarray | torch.Tensor) -> np.ndarray:
    """(T, Q) codes -> (T * 1920,) float32 PCM, one forward over the whole utterance."""
    tensor = codes_to_tensor(codes, model.config.num_quantizers, model.config.codebook_size)
    return model(tensor)[0].float().numpy()


class FullUtteranceDecoder(TorchFrameDecoder):
    def __init__(self, model: Qwen3TTSDecoder) -> None:
        super().__init__(model)
        self.reset()

    def reset(self) -> None:
        self._seen = torch.zeros(1, 0, self.model.config.num_quantizers, dtype=torch.int64)

    def _append(self, codes: np.ndarray | torch.Tensor) -> int:
        tensor = self.codes_tensor(codes)
        self._seen = torch.cat([self._seen, tensor], dim=1)
        return tensor.shape[1]

    @torch.inference_mode()
    def decode_tensor(self, codes: np.ndarray | torch.Tensor) -> torch.Tensor:
        new_frames = self._append(codes)
        if new_frames == 0:
            return torch.zeros(0)
        pcm = self.model(self._seen)[0]
        return pcm[pcm.shape[0] - new_frames * self.samples_per_frame :]

    def prime_tensor(self, codes: np.ndarray | torch.Tensor) -> None:
        self._append(codes)
