"""Which layers may run in bf16: parity and speed of each precision recipe, stateful, real size, CPU.

    .venv/bin/python benchmarks/precision_bench.py          # ~5 min on a CPU with bf16 instructions

Recipes: fp32; plain bf16 (every weight, activation and state tensor); and
`codecstream.decoder.precision.mixed_precision` with bf16 weights and matrix products everywhere
but the modules it keeps in fp32 (none; decoder[2:]; decoder[3:], the default; the whole conv
stack, and others between). Per recipe: SNR against the fp32 full-utterance decode over 100 frames streamed in the
default ramp (the state carried, as a client decodes), and the eager step's median time at C = 2
and 25 after a warm-up call of each size, on `--threads` threads. The machine's fp32 and bf16
GEMM rates are recorded beside them: on a CPU without AVX-512 BF16 or AMX, torch's bf16 kernels
are reference loops and every bf16 recipe is slower than fp32 (this is recorded, not skipped).
Writes benchmarks/results/precision_bench.json and .png (SNR against time at C = 2).
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import sys
import time

import artifact_bench  # the real-size checkpoint, its reference decode, the machine record
import numpy as np
from bench_record import machine, random_codes, versions, write_record
from codecstream.protocol.chunking import ChunkSchedule
from codecstream.protocol.pcm import snr_db

#: name -> the modules kept fp32 (None: the fp32 model, "plain": everything bf16)
RECIPES = {
    "fp32": None,
    "bf16": "plain",
    "bf16-mixed-none-kept": (),
    "bf16-mixed-decoder2-kept": ("decoder.2", "decoder.3", "decoder.4", "decoder.5", "decoder.6"),
    "bf16-mixed-decoder3-kept-default": ("decoder.3", "decoder.4", "decoder.5", "decoder.6"),
    "bf16-mixed-decoder4-kept": ("decoder.4", "decoder.5", "decoder.6"),
    "bf16-mixed-output-kept": ("decoder.5", "decoder.6"),
    "bf16-mixed-conv-stack-kept": ("upsample", "decoder"),
}
TIMED_CHUNKS = (2, 25)


def log(message: str) -> None:
    print(f"[precision_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def recipe_model(torch, model, recipe):
    from codecstream.decoder.precision import mixed_precision

    if recipe is None:
        return model
    if recipe == "plain":
        return copy.deepcopy(model).to(torch.bfloat16)
    return mixed_precision(model, keep=recipe)


def measure(torch, model, codes: np.ndarray, reference: np.ndarray, calls: int) -> dict:
    from codecstream.decoder import StatefulDecoder

    decoder = StatefulDecoder(model)
    with torch.inference_mode():
        pieces, start = [], 0
        for size in ChunkSchedule().split(len(codes)):
            pieces.append(decoder.decode_tensor(codes[start : start + size]).float().numpy())
            start += size
        result = {"snr_db": round(snr_db(reference, np.concatenate(pieces)), 2)}
        for chunk in TIMED_CHUNKS:
            decoder.reset()
            decoder.decode_tensor(codes[:chunk])
            times = []
            for index in range(1, calls + 1):
                began = time.perf_counter()
                decoder.decode_tensor(codes[index * chunk % 50 : index * chunk % 50 + chunk])
                times.append(time.perf_counter() - began)
            result[f"c{chunk}_median_ms"] = round(float(np.median(times)) * 1000, 2)
    return result


def plot(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5), constrained_layout=True)
    for row in results["recipes"]:
        axis.scatter(row["c2_median_ms"], row["snr_db"], s=40)
        axis.annotate(row["recipe"], (row["c2_median_ms"], row["snr_db"]), fontsize=8, xytext=(4, 4),
                      textcoords="offset points")  # fmt: skip
    axis.axhline(50, color="gray", linestyle="--", linewidth=0.8, label="50 dB")
    title = f"precision recipes, real-size decoder, {results['machine']['cpu']}, {results['threads']} threads"
    axis.set(xlabel="ms per 2-frame call (eager, median)", ylabel="SNR vs fp32 full decode (dB)", title=title)
    axis.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=12, help="timed calls per chunk size")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated subset")
    parser.add_argument("--out", type=pathlib.Path, default=artifact_bench.RESULTS / "precision_bench.json")
    args = parser.parse_args()
    import torch
    from codecstream.decoder import load_decoder

    torch.set_num_threads(args.threads)
    artifact_bench.CACHE.mkdir(parents=True, exist_ok=True)
    checkpoint = artifact_bench.ensure_checkpoint()
    reference = np.load(artifact_bench.ensure_reference(checkpoint))
    codes = random_codes(artifact_bench.PARITY_FRAMES, 9)
    model = load_decoder(checkpoint)
    rates = artifact_bench.machine_speed()
    log(f"GEMM rates on {args.threads} threads: {rates}")
    rows = []
    for name in args.recipes.split(","):
        log(f"{name}: measuring")
        measured = measure(torch, recipe_model(torch, model, RECIPES[name]), codes, reference, args.calls)
        row = {"recipe": name, "fp32_modules": RECIPES[name], **measured}
        log(json.dumps(row))
        rows.append(row)
    results = {
        "benchmark": "precision_bench",
        "mode": "stateful, eager torch",
        "decoder": "real-size random weights (codecstream.testing.random_speech_tokenizer preset=real seed=0)",
        "parity": f"SNR against the fp32 full-utterance decode, {artifact_bench.PARITY_FRAMES} frames, default ramp",
        "threads": args.threads,
        "machine": machine(),
        "machine_speed": rates,
        "versions": versions("torch", "numpy"),
        "recipes": rows,
    }
    write_record(results, args.out, plot)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
