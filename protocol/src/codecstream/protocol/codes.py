"""Codes on the wire: int16 little-endian, frame-major, `num_frames x num_codebooks` values."""

from __future__ import annotations

import numpy as np
from codecstream.protocol.decoding import CODEBOOK_SIZE, NUM_CODEBOOKS
from codecstream.protocol.errors import CodesError

WIRE_DTYPE = np.dtype("<i2")
BYTES_PER_CODE = WIRE_DTYPE.itemsize


def validate_codes(codes: np.ndarray, num_codebooks: int = NUM_CODEBOOKS, codebook_size: int = CODEBOOK_SIZE) -> None:
    """Raise CodesError unless `codes` is an integer array of shape (n, num_codebooks) in [0, codebook_size)."""
    if not isinstance(codes, np.ndarray):
        raise CodesError(f"codes must be a numpy array, got {type(codes).__name__}")
    if codes.dtype.kind not in "iu":
        raise CodesError(f"codes must be integers, got dtype {codes.dtype}")
    if codes.ndim != 2 or codes.shape[1] != num_codebooks:
        raise CodesError(f"codes must have shape (frames, {num_codebooks}), got {codes.shape}")
    if codes.size == 0:
        return
    bad = (codes < 0) | (codes >= codebook_size)
    if bad.any():
        frame, book = (int(i) for i in np.argwhere(bad)[0])
        raise CodesError(
            f"codes out of range: frame {frame} codebook {book} has {int(codes[frame, book])}, "
            f"codebook size is {codebook_size}"
        )


def pack_codes(codes: np.ndarray, num_codebooks: int = NUM_CODEBOOKS, codebook_size: int = CODEBOOK_SIZE) -> bytes:
    """Serialize validated codes of shape (n, num_codebooks) to the wire layout."""
    validate_codes(codes, num_codebooks, codebook_size)
    return np.ascontiguousarray(codes, dtype=WIRE_DTYPE).tobytes()


def unpack_codes(
    data: bytes,
    num_frames: int,
    num_codebooks: int = NUM_CODEBOOKS,
    codebook_size: int = CODEBOOK_SIZE,
) -> np.ndarray:
    """Parse wire bytes into an int16 array of shape (num_frames, num_codebooks), validated."""
    if num_frames < 0:
        raise CodesError(f"frame count must be >= 0, got {num_frames}")
    expected = num_frames * num_codebooks * BYTES_PER_CODE
    if len(data) != expected:
        raise CodesError(
            f"codes byte length {len(data)} does not match {num_frames} frames x {num_codebooks} codebooks "
            f"x {BYTES_PER_CODE} bytes = {expected}"
        )
    codes = np.frombuffer(data, dtype=WIRE_DTYPE).reshape(num_frames, num_codebooks).astype(np.int16)
    validate_codes(codes, num_codebooks, codebook_size)
    return codes
