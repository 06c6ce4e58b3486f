"""PCM facts shared by the client, the exporter's parity tools, the tests and the benchmarks: how
float samples become 16-bit PCM, and how far one signal is from another. numpy only."""

from __future__ import annotations

import math

import numpy as np

#: Full scale of 16-bit PCM; a float sample of 1.0 is this.
PCM16_SCALE = 32767.0


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] as little-endian 16-bit PCM, clipped and rounded (what WAV files hold)."""
    return (np.clip(samples, -1.0, 1.0) * PCM16_SCALE).round().astype("<i2")


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    """10·log10(signal energy / error energy) of `other` against `reference`; inf when identical."""
    reference = reference.astype(np.float64)
    noise = float(np.sum((reference - other.astype(np.float64)) ** 2))
    signal = float(np.sum(reference**2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)
