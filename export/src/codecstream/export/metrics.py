"""PCM parity numbers: SNR, largest error as a float and in 16-bit steps, SNR per chunk. numpy only."""

from __future__ import annotations

import math

import numpy as np

PCM16_SCALE = 32767.0


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


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples as 16-bit PCM, rounded the way the client writes WAV files."""
    return (np.clip(samples, -1.0, 1.0) * PCM16_SCALE).round().astype(np.int16)


def max_abs_error(reference: np.ndarray, other: np.ndarray) -> float:
    if reference.size == 0:
        return 0.0
    return float(np.max(np.abs(reference.astype(np.float64) - other.astype(np.float64))))


def max_lsb_error(reference: np.ndarray, other: np.ndarray) -> int:
    """Largest difference between the two signals once both are 16-bit PCM, in LSB."""
    if reference.size == 0:
        return 0
    return int(np.max(np.abs(to_pcm16(reference).astype(np.int32) - to_pcm16(other).astype(np.int32))))


def chunk_snrs(reference: np.ndarray, other: np.ndarray, sizes: list[int], samples_per_frame: int) -> list[float]:
    """SNR of each chunk's samples; `sizes` are the chunk lengths in frames."""
    result, start = [], 0
    for size in sizes:
        end = start + size * samples_per_frame
        result.append(snr_db(reference[start:end], other[start:end]))
        start = end
    return result


def json_number(value: float) -> float | str:
    """JSON has no infinity: identical signals are written as "inf"."""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return round(value, 3)
