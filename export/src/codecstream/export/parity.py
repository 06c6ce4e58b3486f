"""Decoder parity: the same codes through a decoder under test, streamed, and through the reference.

The reference is one full-utterance forward of the checkpoint's decoder (codecstream.decoder), the
ground truth every streaming mode approximates. The decoder under test gets the voice-clone
reference codes (if any) through `prime` and the codes in the chunk schedule, as a client would.
`ParityReport` is what the `parity` commands print, write as JSON and plot.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import numpy as np
from codecstream.export.metrics import chunk_snrs, json_number, max_abs_error, max_lsb_error
from codecstream.protocol.chunking import ChunkSchedule
from codecstream.protocol.decoding import FrameDecoder
from codecstream.protocol.pcm import snr_db


@dataclasses.dataclass
class ParityReport:
    reference: np.ndarray
    decoded: np.ndarray
    chunk_frames: list[int]
    samples_per_frame: int
    sample_rate: int
    threshold_db: float
    decode_seconds: list[float]
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    @functools.cached_property
    def snr_db(self) -> float:
        return snr_db(self.reference, self.decoded)

    @property
    def max_abs_error(self) -> float:
        return max_abs_error(self.reference, self.decoded)

    @property
    def max_lsb_error(self) -> int:
        return max_lsb_error(self.reference, self.decoded)

    @functools.cached_property
    def chunk_snr_db(self) -> list[float]:
        return chunk_snrs(self.reference, self.decoded, self.chunk_frames, self.samples_per_frame)

    @property
    def passed(self) -> bool:
        return self.snr_db >= self.threshold_db

    @property
    def audio_seconds(self) -> float:
        return len(self.reference) / self.sample_rate

    def to_json(self) -> dict[str, Any]:
        chunks, first = [], 0
        for index, (frames, snr, seconds) in enumerate(
            zip(self.chunk_frames, self.chunk_snr_db, self.decode_seconds, strict=True)
        ):
            span = slice(first * self.samples_per_frame, (first + frames) * self.samples_per_frame)
            chunks.append(
                {
                    "index": index,
                    "first_frame": first,
                    "frames": frames,
                    "snr_db": json_number(snr),
                    "max_abs_error": max_abs_error(self.reference[span], self.decoded[span]),
                    "decode_ms": round(seconds * 1000, 2),
                }
            )
            first += frames
        decode_total = sum(self.decode_seconds)
        return {
            **self.details,
            "threshold_db": self.threshold_db,
            "passed": self.passed,
            "snr_db": json_number(self.snr_db),
            "max_abs_error": self.max_abs_error,
            "max_lsb_error": self.max_lsb_error,
            "min_chunk_snr_db": json_number(min(self.chunk_snr_db, default=float("inf"))),
            "frames": sum(self.chunk_frames),
            "audio_seconds": round(self.audio_seconds, 3),
            "decode_seconds": round(decode_total, 4),
            "rtf": round(decode_total / self.audio_seconds, 4) if self.audio_seconds else None,
            "chunks": chunks,
        }

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"{verdict}: SNR {json_number(self.snr_db)} dB (threshold {self.threshold_db} dB), "
            f"max abs error {self.max_abs_error:.3g} ({self.max_lsb_error} LSB at 16 bit), "
            f"worst chunk {json_number(min(self.chunk_snr_db, default=float('inf')))} dB "
            f"over {len(self.chunk_frames)} chunks"
        )


def stream_through(
    decoder: FrameDecoder, codes: np.ndarray, schedule: ChunkSchedule, reference_codes: np.ndarray | None = None
) -> tuple[np.ndarray, list[int], list[float]]:
    """Reset, prime with `reference_codes`, decode `codes` in the schedule's chunks.

    Returns the samples, the chunk sizes and each chunk's decode time in seconds.
    """
    decoder.reset()
    if reference_codes is not None and len(reference_codes):
        decoder.prime(reference_codes)
    sizes = schedule.split(len(codes))
    pieces, seconds, start = [], [], 0
    for size in sizes:
        began = time.perf_counter()
        pieces.append(decoder.decode(codes[start : start + size]))
        seconds.append(time.perf_counter() - began)
        start += size
    samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    return samples, sizes, seconds


def reference_decode(model, codes: np.ndarray, reference_codes: np.ndarray | None = None) -> np.ndarray:
    """The full-utterance decode of reference codes + codes, without the reference codes' samples."""
    from codecstream.decoder import decode_utterance

    prefix = 0 if reference_codes is None else len(reference_codes)
    everything = codes if not prefix else np.concatenate([reference_codes, codes])
    return decode_utterance(model, everything)[prefix * model.samples_per_frame :]


def decoder_parity(
    decoder: FrameDecoder,
    model,
    codes: np.ndarray,
    schedule: ChunkSchedule,
    reference_codes: np.ndarray | None = None,
    threshold_db: float = 40.0,
) -> ParityReport:
    """Compare `decoder` streamed in `schedule` with `model`'s full-utterance decode of the same codes."""
    reference = reference_decode(model, codes, reference_codes)
    decoded, sizes, seconds = stream_through(decoder, codes, schedule, reference_codes)
    return ParityReport(
        reference=reference,
        decoded=decoded,
        chunk_frames=sizes,
        samples_per_frame=decoder.samples_per_frame,
        sample_rate=decoder.sample_rate,
        threshold_db=threshold_db,
        decode_seconds=seconds,
    )
