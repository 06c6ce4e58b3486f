"""What quantizing the decoder's convolutions buys an int8 `.pte`, and what it costs in parity (issues 41, 52).

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

`--static` (issue 52) adds the remedy for convolutional codecs beside that dynamic record: static
int8, activation scales calibrated once (XNNPACK's symmetric config, per-channel weights) on
streamed codes other than the parity set's, every SnakeBeta and the first and last convolutions
(`STATIC_FP32`) kept fp32, the rewrite's statistics linears too; the same stage-by-stage parity
(`parity_static`), and the program with every stage quantized written as a `.pte` and timed
against the fp32 one, paired (the runtimes take turns call by call, as in pte_speed_ratio), on the
client's runtime (codecstream's C++ runtime where it builds).

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

#: The static recipe's fp32 layers besides every SnakeBeta: the first convolution (the codebooks'
#: sum entering the conv stack) and the last (the waveform's).
STATIC_FP32 = ("pre_conv", "decoder.6")
#: Calibration: a stream of codes other than the parity set's (seed 9), in the client's chunk sizes.
CALIBRATION_CHUNKS = (1, 2, 4, 8, 8, 8)
CALIBRATION_SEED = 52

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


def static_quantized(graph, stages: int, calibration):
    """The graph with static int8 in the first `stages` stages (but `STATIC_FP32`), calibrated on
    `calibration` streamed through it, and the transformer's linears dynamic int8; exported again
    for lowering."""
    import torch
    from codecstream.export.to_pte import buffers_as_persistent
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    graph = dataclasses.replace(graph, module=quantized_stages_module(graph, stages))
    static_stages = tuple(PREFIX + name + "." for name in STAGES[:stages] if name not in STATIC_FP32)

    # By each operation's weight: the stateful step calls the conv stack's `step` methods, which
    # leave no module path on those captured nodes for the quantizer's module filters. Only weighted
    # operations are annotated, so every elementwise one (SnakeBeta, the residual sums) stays fp32.
    def weight_path(node) -> str:
        weight = node.args[1] if len(node.args) > 1 else None
        return f"{weight.target}." if getattr(weight, "op", None) == "get_attr" else ""

    def chosen(node) -> bool:
        if node.op == "get_attr":
            return True  # a weight or bias: the operation using it decides
        path = weight_path(node)
        if node.target == torch.ops.aten.conv2d.default:
            return path.startswith(static_stages)
        # The transformer's learned projections, dynamic as exported; not the rewrite's own
        # linears (norm means, RoPE's rotation).
        return path.startswith(PREFIX + "pre_transformer.") and "mean_weight" not in path and "rotate" not in path

    quantizer = XNNPACKQuantizer()
    static = get_symmetric_quantization_config(is_per_channel=True)
    quantizer.set_operator_type(torch.ops.aten.conv2d.default, static)
    dynamic = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
    quantizer.set_operator_type(torch.ops.aten.linear.default, dynamic)
    quantizer.set_filter_function(chosen)
    flat = tuple(spec for group in graph.dynamic_shapes for spec in (group if isinstance(group, tuple) else (group,)))
    with buffers_as_persistent(graph.module):
        captured = torch.export.export(graph.module, graph.example_inputs, dynamic_shapes=graph.dynamic_shapes)
        prepared = prepare_pt2e(captured.module(), quantizer)
        decode_all(prepared, graph, calibration)
        converted = convert_pt2e(prepared)
        return graph, torch.export.export(converted, graph.example_inputs, dynamic_shapes=flat)


def paired_times(directories: dict, threads: int, rounds: int) -> dict:
    """Median ms per call of each program at each of TIMED_CHUNKS, the programs taking turns."""
    from codecstream.client.runtimes import open_decoder
    from pte_speed_ratio import interleaved

    decoders = {
        label: open_decoder(directory, backend="pte", threads=threads) for label, directory in directories.items()
    }
    record = {"runtime": next(iter(decoders.values())).description, "ms_per_call": {}, "over_fp32_paired": {}}
    for chunk in TIMED_CHUNKS:
        times = interleaved(decoders, chunk, rounds, fresh=False)
        for label, values in times.items():
            record["ms_per_call"].setdefault(label, {})[str(chunk)] = round(1e3 * float(np.median(values)), 1)
            ratios = [value / fp32 for value, fp32 in zip(values, times["fp32"], strict=True)]
            record["over_fp32_paired"].setdefault(label, {})[str(chunk)] = round(float(np.median(ratios)), 3)
    return record


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


def write_pte_dir(graph, exported, out: pathlib.Path, quantization: str | None = None) -> None:
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
    if quantization:
        entry["quantization"] = quantization
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    static = record.get("static")
    figure, axes = plt.subplots(1, 3 if static else 2, figsize=(19 if static else 13, 4.5))
    left, right = axes[0], axes[1]
    rows = record["parity"]
    left.plot(range(len(rows)), [row["snr_db"] for row in rows], marker="o", label="dynamic (issue 41)")
    if static:
        static_rows = static["parity"]
        left.plot(range(len(static_rows)), [row["snr_db"] for row in static_rows], marker="s",
                  label=f"static, calibrated; {', '.join(static['fp32_layers'])} fp32")  # fmt: skip
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
    if static:
        for index, (label, by_chunk) in enumerate(static["ms_per_call"].items()):
            ratio = static["over_fp32_paired"][label][str(TIMED_CHUNKS[-1])]
            axes[2].bar([i + index * width for i in range(len(TIMED_CHUNKS))], list(by_chunk.values()), width,
                        label=f"{label} ({ratio}x at C = {TIMED_CHUNKS[-1]})")  # fmt: skip
        axes[2].set_xticks([i + width for i in range(len(TIMED_CHUNKS))], [f"C = {c}" for c in TIMED_CHUNKS])
        axes[2].set_ylabel("ms per call (median, paired)")
        axes[2].set_title(f"{static['runtime'].split(' on ')[-1][:48]}")
        axes[2].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--static", action="store_true", help="the static int8 sweep and timing alone (issue 52)")
    parser.add_argument("--rounds", type=int, default=12, help="--static: paired rounds per chunk size")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "pte_int8_tradeoff.json")
    args = parser.parse_args()
    if args.static:
        return main_static(args)

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


def main_static(args) -> int:
    """Static int8 stage by stage, added to the record beside the dynamic sweep (kept as it was)."""
    import torch
    from codecstream.decoder import load_decoder
    from codecstream.export.graphs import build_graph

    record = json.loads(args.out.read_text()) if args.out.exists() else {"benchmark": "pte_int8_tradeoff"}
    calibration_codes = {"chunks": list(CALIBRATION_CHUNKS), "codes": f"uniform random, seed {CALIBRATION_SEED}"}
    static: dict = {"machine": machine(), "threads": args.threads, "fp32_layers": ["SnakeBeta", *STATIC_FP32],
                    "calibration": calibration_codes}  # fmt: skip
    checkpoint = ensure_checkpoint()
    graph = build_graph(load_decoder(checkpoint), "stateful", 25)
    generator = torch.Generator().manual_seed(9)
    chunks = [torch.randint(0, 2048, (1, c, 16), generator=generator) for c in CHUNKS]
    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    calibration = [torch.randint(0, 2048, (1, c, 16), generator=generator) for c in CALIBRATION_CHUNKS]
    reference = decode_all(graph.module, graph, chunks)
    static["parity"] = []
    for stages in range(len(STAGES) + 1):
        began = time.perf_counter()
        quantized_graph, exported = static_quantized(graph, stages, calibration)
        snr = snr_db(reference, decode_all(exported.module(), graph, chunks))
        label = STAGES[stages - 1] if stages else None
        static["parity"].append({"quantized_up_to": label, "snr_db": round(snr, 1)})
        print(f"[pte_int8_tradeoff] static, quantized up to {label}: {snr:.1f} dB "
              f"({time.perf_counter() - began:.0f} s)", flush=True)  # fmt: skip
    print("[pte_int8_tradeoff] writing the static int8 .pte (every stage) ...", flush=True)
    static_dir = CACHE / "artifacts" / "stateful-int8-static-pte"
    write_pte_dir(quantized_graph, exported, static_dir, "XNNPACK static int8: per-channel int8 weights, calibrated "
                  f"per-tensor activation scales; SnakeBeta, {', '.join(STATIC_FP32)} fp32")  # fmt: skip
    directories = {
        "fp32": ensure_artifact(checkpoint, "pte", 25)[0],
        "int8 dynamic (linears only, as exported)": ensure_artifact(checkpoint, "pte-int8", 25)[0],
        "int8 static (every stage)": static_dir,
    }
    static["size_mb"] = {label: round((d / "decoder.pte").stat().st_size / 1e6, 1) for label, d in directories.items()}
    static.update(paired_times(directories, args.threads, args.rounds))
    print(f"[pte_int8_tradeoff] static: {static['ms_per_call']} {static['over_fp32_paired']}", flush=True)
    static["versions"] = versions("torch", "executorch", "torchao")
    record["static"] = static
    write_record(record, args.out, plot)
    print(f"[pte_int8_tradeoff] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
