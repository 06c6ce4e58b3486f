"""What quantizing the decoder's convolutions buys an int8 `.pte`, and what it costs in parity (issue 41).

The int8 `.pte` the exporter writes quantizes the linear layers only: ExecuTorch 1.4's XNNPACK
quantizer annotates 2-D convolutions alone, so every 1-D convolution stays fp32, and that artifact
runs at 0.90-0.94x the fp32 one's time (artifact_bench_pte.json). Captured as 2-D convolutions over a
signal of height 1 (`xnnpack_rewrites.delegable(convs_as_2d=True)`) they are quantized too: dynamic int8, the
activations quantized per call and per tensor. Here, on the real-size random decoder (stateful):

- parity (SNR against the fp32 eager decoder, 40 frames in chunks of 1-9) with the convolutions of
  the first k stages quantized, k = 0 (the exported int8 artifact) to all, the rest left 1-D and
  fp32. The quantized program runs in PyTorch (what XNNPACK runs, to rounding: the 2-D artifact's
  export check read 33.26 dB where this reads 33.2);
- per-call time at C = 2 and 8 frames of the fp32 `.pte`, the exported int8 one and the one with
  every convolution quantized, written and run as the client runs them (ExecuTorch, 2 threads).

    .venv/bin/python benchmarks/pte_int8_tradeoff.py        # ~15 min; check `uptime` first

Writes benchmarks/results/pte_int8_tradeoff.json and .png (parity per k, and the three times).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shutil
import time

import numpy as np
from artifact_bench import CACHE, ensure_artifact, ensure_checkpoint
from bench_record import RESULTS, decode_call_seconds, machine, versions, write_record
from codecstream.protocol.pcm import snr_db

#: The decoder's convolution stages, input to output: quantizing the first k of them is config k.
STAGES = ("pre_conv", "upsample", "decoder.0", "decoder.1", "decoder.2", "decoder.3", "decoder.4", "decoder.6")
#: Where the graph builder puts the decoder in the module it exports.
PREFIX = "step.model."
CHUNKS = (1, 2, 4, 8, 8, 8, 9)
TIMED_CHUNKS = (2, 8)


def quantized_stages_module(graph, stages: int):
    """The .pte's form of the graph with the convolutions of the first `stages` stages as 2-D ones
    (which the quantizer takes) and the others as 1-D ones (which it leaves fp32)."""
    from codecstream.decoder.layers import CausalConv1d, CausalTransposedConv1d
    from codecstream.export.xnnpack_rewrites import delegable

    module = delegable(graph.module, convs_as_2d=True)
    kept = tuple(PREFIX + stage for stage in STAGES[stages:])
    for name, child in module.named_modules():
        if not any(name == stage or name.startswith(stage + ".") for stage in kept):
            continue
        for layer in (CausalConv1d, CausalTransposedConv1d):
            if isinstance(child, layer):
                child.__class__ = layer
    return module


def quantized(graph, stages: int):
    from codecstream.export.to_pte import buffers_as_persistent, quantize_int8

    graph = dataclasses.replace(graph, module=quantized_stages_module(graph, stages))
    with buffers_as_persistent(graph.module):
        return graph, quantize_int8(graph)


def decode_all(module, graph, chunks) -> np.ndarray:
    """The decoder's output over `chunks`, one stream carrying its state, as one flat array."""
    import torch

    state, outputs = graph.example_inputs[1:], []
    with torch.no_grad():
        for codes in chunks:
            out, *state = module(codes, *state)
            outputs.append(out.flatten())
    return torch.cat(outputs).numpy()


def timed(directory: pathlib.Path, threads: int, calls: int) -> dict:
    from codecstream.client.runtimes import open_decoder

    decoder = open_decoder(directory, backend="pte", threads=threads)
    return {
        str(c): round(1e3 * float(np.median(decode_call_seconds(decoder, c, calls, seed=3))), 1) for c in TIMED_CHUNKS
    }


def write_pte_dir(graph, exported, out: pathlib.Path) -> None:
    """A .pte and a manifest the client opens, as the exporter writes them."""
    from codecstream.export.to_pte import write_pte

    shutil.rmtree(out, ignore_errors=True)
    reference = CACHE / "artifacts" / "stateful-int8-pte"
    out.mkdir(parents=True)
    write_pte(graph, exported, out / "decoder.pte", "int8")
    # The manifest of the exported int8 artifact describes the same graph (signature, chunking);
    # only the file's digest differs, which the client checks.
    from codecstream.protocol.manifest import file_sha256

    manifest = json.loads((reference / "manifest.json").read_text())
    entry = manifest["artifacts"]["pte"]
    entry["sha256"], entry["size_bytes"] = file_sha256(out / "decoder.pte"), (out / "decoder.pte").stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    rows = record["parity"]
    left.plot(range(len(rows)), [row["snr_db"] for row in rows], marker="o")
    left.axhline(record["parity_target_db"], color="gray", linestyle="--", label="target 60 dB")
    left.set_xticks(range(len(rows)), [row["quantized_up_to"] or "linears only" for row in rows], rotation=35)
    left.set_ylabel("SNR against fp32, dB")
    left.set_title("int8 .pte parity, convolutions quantized up to a stage")
    left.legend()
    times = record["ms_per_call"]
    width = 0.25
    for index, (label, by_chunk) in enumerate(times.items()):
        right.bar([i + index * width for i in range(len(TIMED_CHUNKS))], list(by_chunk.values()), width, label=label)
    right.set_xticks([i + width for i in range(len(TIMED_CHUNKS))], [f"C = {c}" for c in TIMED_CHUNKS])
    right.set_ylabel("ms per call (median)")
    right.set_title(f"ExecuTorch, {record['threads']} threads, {record['machine']['cpu']}")
    right.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "pte_int8_tradeoff.json")
    args = parser.parse_args()

    import torch
    from codecstream.decoder import load_decoder
    from codecstream.export.graphs import build_graph

    record = {"benchmark": "pte_int8_tradeoff", "machine": machine(), "threads": args.threads}
    checkpoint = ensure_checkpoint()
    graph = build_graph(load_decoder(checkpoint), "stateful", 25)
    generator = torch.Generator().manual_seed(9)
    chunks = [torch.randint(0, 2048, (1, c, 16), generator=generator) for c in CHUNKS]
    reference = decode_all(graph.module, graph, chunks)
    record["parity"], record["parity_target_db"] = [], 60.0
    for stages in range(len(STAGES) + 1):
        began = time.perf_counter()
        quantized_graph, exported = quantized(graph, stages)
        snr = snr_db(reference, decode_all(exported.module(), graph, chunks))
        label = STAGES[stages - 1] if stages else None
        record["parity"].append({"quantized_up_to": label, "snr_db": round(snr, 1)})
        print(f"[pte_int8_tradeoff] convolutions quantized up to {label}: {snr:.1f} dB "
              f"({time.perf_counter() - began:.0f} s)", flush=True)  # fmt: skip
    directories = {
        "fp32": ensure_artifact(checkpoint, "pte", 25)[0],
        "int8 (linears only, as exported)": ensure_artifact(checkpoint, "pte-int8", 25)[0],
    }
    print("[pte_int8_tradeoff] writing the .pte with every convolution quantized ...", flush=True)
    directories["int8, every convolution too"] = every_dir = CACHE / "artifacts" / "stateful-int8-convs-pte"
    write_pte_dir(quantized_graph, exported, every_dir)  # the loop's last: every stage quantized
    record["ms_per_call"] = {}
    for label, directory in directories.items():
        record["ms_per_call"][label] = timed(directory, args.threads, args.calls)
        print(f"[pte_int8_tradeoff] {label}: {record['ms_per_call'][label]} ms per call", flush=True)
    record["versions"] = versions("torch", "executorch", "torchao")
    write_record(record, args.out, plot)
    print(f"[pte_int8_tradeoff] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
