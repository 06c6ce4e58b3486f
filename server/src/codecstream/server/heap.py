"""Giving freed heap back to the system after bursts of large, short-lived buffers.

A decoder download moves 1 MiB parts through threads (read, serialize) and gRPC's buffers; glibc
keeps what they freed in its arenas, where a flood of abandoned downloads left the server's
resident memory far above where it started (docs/performance.md, "Measurements behind the code").
`malloc_trim` returns the free pages of every arena. Elsewhere than glibc it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """Return the heap's free pages to the system (blocking: milliseconds); False where it cannot."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))
