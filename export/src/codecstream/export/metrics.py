"""PCM parity numbers: SNR, largest error as a float and in 16-bit steps, SNR per chunk. numpy only."""

from __future__ import annotations

import math

import numpy as np
from codecstream.protocol.pcm import snr_db, to_pcm16

__all__ = ["chunk_snrs", "json_number", "max_abs_error", "max_lsb_error"]


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
