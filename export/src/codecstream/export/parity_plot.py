"""The parity PNG: both waveforms, the error over time in 16-bit steps, and each chunk's SNR."""

from __future__ import annotations

import math
import pathlib

import numpy as np
from codecstream.export.parity import ParityReport
from codecstream.protocol.pcm import PCM16_SCALE


def plot_parity(report: ParityReport, path: pathlib.Path | str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rate = report.sample_rate
    time = np.arange(len(report.reference)) / rate
    error_lsb = np.abs(report.reference.astype(np.float64) - report.decoded.astype(np.float64)) * PCM16_SCALE
    boundaries = np.cumsum([0, *report.chunk_frames]) * report.samples_per_frame / rate

    figure, (waves, errors, chunks) = plt.subplots(3, 1, figsize=(12, 9), constrained_layout=True)
    figure.suptitle(f"{title}\n{report.summary()}", fontsize=10)

    waves.plot(time, report.reference, linewidth=0.6, label="reference (full-utterance decode)")
    waves.plot(time, report.decoded, linewidth=0.6, alpha=0.7, label="decoder under test (streamed)")
    waves.set(xlabel="time (s)", ylabel="sample", title="waveforms")
    waves.legend(loc="upper right", fontsize=8)

    errors.plot(time, np.maximum(error_lsb, 1e-3), linewidth=0.5, color="tab:red")
    errors.set_yscale("log")
    errors.axhline(1.0, color="gray", linestyle="--", linewidth=0.8, label="1 LSB (16-bit)")
    for boundary in boundaries[1:-1]:
        errors.axvline(boundary, color="lightgray", linewidth=0.5)
    errors.set(xlabel="time (s)", ylabel="|error| (16-bit LSB)", title="error over time (chunk boundaries in gray)")
    errors.legend(loc="upper right", fontsize=8)

    finite = [snr if math.isfinite(snr) else 200.0 for snr in report.chunk_snr_db]
    chunks.bar(
        range(len(finite)), finite, color=["tab:green" if s >= report.threshold_db else "tab:red" for s in finite]
    )
    chunks.axhline(
        report.threshold_db, color="black", linestyle="--", linewidth=0.8, label=f"threshold {report.threshold_db} dB"
    )
    chunks.set(xlabel="chunk", ylabel="SNR (dB)", title="SNR per chunk (identical chunks drawn at 200 dB)")
    chunks.legend(loc="lower right", fontsize=8)

    figure.savefig(path, dpi=110)
    plt.close(figure)
