"""Random codec frames for tests and benchmarks: uniformly random codes, the same for the same seed."""

from __future__ import annotations

import numpy as np
from codecstream.protocol.decoding import CODEBOOK_SIZE, NUM_CODEBOOKS


def random_codes(frames: int, seed: int = 0) -> np.ndarray:
    """`frames` frames of uniformly random codes (int16, frames x 16), the same for the same seed."""
    return np.random.default_rng(seed).integers(0, CODEBOOK_SIZE, size=(frames, NUM_CODEBOOKS), dtype=np.int16)
