"""Decoded 24 kHz PCM at another sample rate, chunk by chunk: `StreamResampler(16_000)`.

Voice pipelines often run at 16 kHz (telephony, many STT/VAD stacks). soxr's streaming resampler
keeps its filter state between chunks, so a stream resampled chunk by chunk equals the whole
stream resampled at once, and it is well kept and fast (a few hundredths of real time per
stream). Needs the `soxr` package (the plugins' extras install it).
"""

from __future__ import annotations

import numpy as np
from codecstream.protocol.decoding import SAMPLE_RATE_HZ

#: soxr's "high quality" preset: 20-bit precision, passband to 91% of Nyquist.
QUALITY = "HQ"


class StreamResampler:
    """One stream's resampler from the decoder's rate to `rate`; `None` as rate or an equal rate
    passes samples through."""

    def __init__(self, rate: int | None, source_rate: int = SAMPLE_RATE_HZ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"sample_rate must be a positive number of Hz, got {rate}")
        self.rate = rate or source_rate
        self._stream = None
        if self.rate != source_rate:
            import soxr  # the plugins' extras install it; a client at the decoder's rate never needs it

            self._stream = soxr.ResampleStream(source_rate, self.rate, 1, dtype="float32", quality=QUALITY)

    def __call__(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        """The resampled audio of the next chunk (float32); `last` flushes the filter's tail."""
        if self._stream is None:
            return samples
        return self._stream.resample_chunk(np.ascontiguousarray(samples, dtype=np.float32), last=last)
