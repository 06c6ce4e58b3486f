"""The codec's frame and the one interface every decoder runtime implements: codes in, PCM out,
state kept inside.

The frame's numbers (codebooks, code space, sample rate, samples and seconds per frame) live here
once; the server, the client, the exporter and the test support import them.

Eager PyTorch, torch.export (.pt2), ExecuTorch (.pte) and ONNX Runtime decoders all look like this
to the client, so the client can pick whichever is installed.
"""

from __future__ import annotations

import abc

import numpy as np

#: Qwen3-TTS-Tokenizer-12Hz: a frame is 16 codes, one per codebook, each in [0, 2048), and decodes
#: to 1920 samples at 24 kHz.
SAMPLE_RATE_HZ = 24_000
SAMPLES_PER_FRAME = 1_920
NUM_CODEBOOKS = 16
CODEBOOK_SIZE = 2_048
#: Frames per second (12.5): the pace of real time.
FRAMES_PER_SECOND = SAMPLE_RATE_HZ / SAMPLES_PER_FRAME
#: Seconds of audio in one frame (80 ms).
FRAME_SECONDS = SAMPLES_PER_FRAME / SAMPLE_RATE_HZ


class FrameDecoder(abc.ABC):
    """Decodes a stream of code frames chunk by chunk.

    `decode` returns exactly `len(codes) * samples_per_frame` float32 samples in [-1, 1] for the
    frames it is given, conditioned on every frame given before (within the decoder's context).
    """

    sample_rate: int = SAMPLE_RATE_HZ
    samples_per_frame: int = SAMPLES_PER_FRAME

    @abc.abstractmethod
    def prime(self, codes: np.ndarray) -> None:
        """Feed frames as left context that produce no samples (voice-clone reference codes)."""

    @abc.abstractmethod
    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Decode `codes` of shape (k, 16), integer, into k * 1920 float32 samples."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget all context: the next `decode` starts a new utterance."""
