"""Where a decode call's time goes on the .onnx runtimes: each runtime's own per-operator profile.

    .venv/bin/python benchmarks/decoder_profile.py                     # ONNX Runtime, C = 1, 2, 8; ~1 minute
    .venv/bin/python benchmarks/decoder_profile.py --backend openvino  # OpenVINO
    .venv/bin/python benchmarks/decoder_profile.py --chunks 2,25

The real-size stateful fp32 ONNX artifact (random weights, built under .cache/artifact_bench/ like
artifact_bench's) runs set up as the client runs it (OnnxProgram: all graph optimizations, no
spinning, 2 intra-op threads; or OpenVinoProgram's compile settings) with the runtime's profiler
on (ONNX Runtime's profiler; OpenVINO's per-node performance counters). After warm-up calls, each kernel's
time is summed per call and grouped three ways: by operator type; by kind (matrix products, that
is Conv, MatMul and their fused forms; element-wise arithmetic; data movement such as Concat,
Slice and Transpose); and the costliest nodes with their input shapes (which say the layer).
The matrix products' FLOPs (counted on the eager model) over their summed time give the rate
the GEMM kernels reach, beside the machine's fp32 GEMM rate measured just before and after each
chunk size's calls (the host's speed drifts): the gap between that rate and the whole call's is
what the other kinds cost. Call times come from an unprofiled session run alongside (the
profiler itself adds time per operator).

Writes benchmarks/results/decoder_profile.json (decoder_profile_openvino.json) and .png.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import pathlib
import shlex
import sys
import tempfile
import time

import artifact_bench
import numpy as np
from bench_record import RESULTS, machine, random_codes, versions, write_record

# Operator names of both runtimes: ONNX Runtime's, then OpenVINO's CPU plugin's ("Subgraph" is
# its JIT-compiled fusion of element-wise operators).
MATRIX_PRODUCTS = {"Conv", "FusedConv", "MatMul", "FusedMatMul", "Gemm", "NchwcConv",
                   "Convolution", "FullyConnected", "Deconvolution"}  # fmt: skip
ELEMENT_WISE = {"Sin", "Cos", "Mul", "Add", "Sub", "Div", "Pow", "Neg", "Sqrt", "Reciprocal", "Erf", "Clip", "Where",
                "Softmax", "LayerNormalization", "SimplifiedLayerNormalization", "ReduceMean", "QuickGelu", "Sigmoid",
                "Tanh", "Max", "Min", "Equal", "Less", "Greater", "And", "Not", "Cast",
                "Multiply", "Subtract", "Divide", "Power", "PowerStatic", "Eltwise", "Subgraph", "RMS", "Convert",
                "Select", "Maximum", "Minimum", "Clamp", "Exp", "Reduce", "SnakeBeta"}  # fmt: skip
DATA_MOVEMENT = {"Concat", "Slice", "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Split", "Pad", "Gather",
                 "Expand", "Tile", "Identity", "Flatten", "ReorderInput", "ReorderOutput",
                 "Reorder", "VariadicSplit", "StridedSlice", "Broadcast", "ScatterUpdate"}  # fmt: skip
KINDS = ("matrix products", "element-wise", "data movement", "other")
WARM_UP_CALLS = 2


def kind_of(op: str) -> str:
    if op in MATRIX_PRODUCTS:
        return "matrix products"
    if op in ELEMENT_WISE:
        return "element-wise"
    if op in DATA_MOVEMENT:
        return "data movement"
    return "other"


def _session(path: pathlib.Path, threads: int, profiled: bool):
    import onnxruntime as ort
    from codecstream.client.runtimes.onnx_program import OnnxProgram

    options = OnnxProgram.session_options(threads)
    if profiled:
        options.enable_profiling = True
        options.profile_file_prefix = str(pathlib.Path(tempfile.gettempdir()) / f"decoder_profile_{os.getpid()}")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _stream_calls(runners: dict, manifest: dict, chunk: int, calls: int, after_call=None) -> list:
    """Calls of `chunk` frames along one stream per runner (name -> feed dict -> outputs),
    alternating between them; the wall seconds of the "plain" runner's calls after the warm-up.
    `after_call(index)` runs after each call of the "profiled" runner."""
    zeros = {
        spec["name"]: np.zeros([d if isinstance(d, int) else 1 for d in spec["shape"]], dtype=spec["dtype"])
        for spec in manifest["inputs"]
    }
    feeds = {name: dict(zeros) for name in runners}
    state_outputs = [spec["name"] for spec in manifest["outputs"][1:]]
    stream = random_codes(chunk * (calls + WARM_UP_CALLS), 5).astype(np.int64)
    wall = []
    for index in range(calls + WARM_UP_CALLS):
        for name, run in runners.items():
            feeds[name]["codes"] = stream[None, index * chunk : (index + 1) * chunk]
            began = time.perf_counter()
            outputs = run(feeds[name])
            if index >= WARM_UP_CALLS and name == "plain":
                wall.append(time.perf_counter() - began)
            if name == "profiled" and after_call:
                after_call(index)
            for output, value in zip(state_outputs, outputs[1:], strict=True):
                feeds[name][output.removeprefix("next.")] = value
    return wall


def profile_chunk(path: pathlib.Path, manifest: dict, chunk: int, calls: int, threads: int) -> tuple[list, list]:
    """ONNX Runtime: (per-call wall seconds, kernels after the warm-up as (node, op, seconds,
    input shapes)) for `calls` calls of `chunk` frames.

    The profiler adds time per operator (about 900 of them), so the wall times come from a second,
    unprofiled session whose calls alternate with the profiled one's over the same stream.
    """
    sessions = {"plain": _session(path, threads, False), "profiled": _session(path, threads, True)}
    runners = {name: functools.partial(session.run, None) for name, session in sessions.items()}
    wall = _stream_calls(runners, manifest, chunk, calls)
    trace = pathlib.Path(sessions["profiled"].end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    runs = sorted(event["ts"] for event in events if event.get("name") == "model_run")
    after_warm_up = runs[WARM_UP_CALLS]
    kernels = [
        (
            event["name"].removesuffix("_kernel_time"),
            event["args"]["op_name"],
            event["dur"] / 1e6,
            [next(iter(shape.values())) for shape in event["args"].get("input_type_shape", [])],
        )
        for event in events
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= after_warm_up
    ]
    return wall, kernels


def profile_chunk_openvino(path: pathlib.Path, manifest: dict, chunk: int, calls: int, threads: int):
    """OpenVINO: the same, from its per-node performance counters (compiled as the client's
    OpenVinoProgram, plus PERF_COUNT in the profiled copy); a node's shapes are not reported,
    its kernel kind is (exec_type) and stands in their place."""
    from codecstream.client.runtimes.openvino_fusion import FUSED_NAME_PREFIX
    from codecstream.client.runtimes.openvino_program import OpenVinoProgram, compile_decoder

    config = OpenVinoProgram.compile_config(threads)
    requests = {
        name: compile_decoder(path, {**config, "PERF_COUNT": profiled}).create_infer_request()
        for name, profiled in (("plain", False), ("profiled", True))
    }
    kernels = []

    def collect(index: int) -> None:
        if index >= WARM_UP_CALLS:  # the counters are the last call's
            for node in requests["profiled"].profiling_info:
                seconds = node.real_time.total_seconds()
                # The fused SnakeBeta runs as a "Reference" node (OpenVINO's type for any extension's operation).
                op = "SnakeBeta" if node.node_name.startswith(FUSED_NAME_PREFIX) else node.node_type
                if seconds > 0:
                    kernels.append((node.node_name, op, seconds, [node.exec_type]))

    runners = {name: (lambda feed, r=request: list(r.infer(feed).values())) for name, request in requests.items()}
    wall = _stream_calls(runners, manifest, chunk, calls, collect)
    return wall, kernels


def gemm_rate() -> float:
    """The machine's fp32 GEMM rate now (GFLOP/s, the better of torch and numpy): it drifts with
    the host's other tenants, so it is taken beside each chunk size's calls."""
    speed = artifact_bench.machine_speed()
    return max(speed["gemm_fp32_gflops"], speed["gemm_fp32_numpy_gflops"])


def summarize(wall: list, kernels: list, calls: int, flops: int, peak_gflops: float) -> dict:
    per_op, per_kind, per_node = collections.Counter(), collections.Counter(), collections.Counter()
    nodes, shapes = collections.Counter(), {}
    for node, op, seconds, node_shapes in kernels:
        seconds /= calls
        per_op[op] += seconds
        per_kind[kind_of(op)] += seconds
        nodes[op] += 1
        per_node[(node, op)] += seconds
        shapes[(node, op)] = node_shapes
    kernel_s = sum(per_op.values())
    median = float(np.median(wall))
    products_s = per_kind["matrix products"]
    return {
        "median_call_ms": round(median * 1000, 2),
        "kernel_ms_per_call": round(kernel_s * 1000, 2),
        "gflops": round(flops / median / 1e9, 1),
        "fraction_of_gemm_peak": round(flops / median / 1e9 / peak_gflops, 3),
        # Nearly every FLOP is in a matrix product: their rate over their own time.
        "matrix_products_gflops": round(flops / products_s / 1e9, 1),
        "matrix_products_fraction_of_gemm_peak": round(flops / products_s / 1e9 / peak_gflops, 3),
        "by_kind_ms": {kind: round(per_kind[kind] * 1000, 2) for kind in KINDS},
        "by_kind_share": {kind: round(per_kind[kind] / kernel_s, 3) for kind in KINDS},
        "by_op": {
            op: {"ms": round(seconds * 1000, 2), "share": round(seconds / kernel_s, 3), "nodes": nodes[op] // calls}
            for op, seconds in per_op.most_common()
        },
        # The exporter's node names say little; the input shapes say which layer (channels, samples).
        "top_nodes": [
            {"node": node, "op": op, "input_shapes": shapes[(node, op)], "ms": round(seconds * 1000, 2)}
            for (node, op), seconds in per_node.most_common(15)
        ],
    }


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    chunks = list(record["chunks"])
    figure, (kind_axis, op_axis) = plt.subplots(1, 2, figsize=(14, 5), constrained_layout=True)
    left = np.zeros(len(chunks))
    colors = {"matrix products": "tab:blue", "element-wise": "tab:orange", "data movement": "tab:green",
              "other": "tab:gray"}  # fmt: skip
    for kind in KINDS:
        per_frame = np.array([record["chunks"][c]["by_kind_ms"][kind] / int(c) for c in chunks])
        kind_axis.barh(chunks, per_frame, left=left, color=colors[kind], label=kind)
        left += per_frame
    for row, chunk in enumerate(chunks):
        result = record["chunks"][chunk]
        kind_axis.text(left[row], row, f"  {result['fraction_of_gemm_peak']:.0%} of the GEMM rate "
                       f"(products alone {result['matrix_products_fraction_of_gemm_peak']:.0%})",
                       va="center", fontsize=8)  # fmt: skip
    kind_axis.set(xlabel="kernel ms per frame", ylabel="chunk C (frames)",
                  title=f"decode call by kind, {record['runtime']}, {record['threads']} threads")  # fmt: skip
    kind_axis.set_xlim(0, left.max() * 1.6)
    kind_axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(KINDS))
    largest = chunks[-1]
    ops = list(record["chunks"][largest]["by_op"].items())[:12]
    op_axis.barh([op for op, _ in ops][::-1], [row["share"] for _, row in ops][::-1],
                 color=[colors[kind_of(op)] for op, _ in ops][::-1])  # fmt: skip
    op_axis.set(xlabel="share of kernel time", title=f"operators at C = {largest}")
    figure.savefig(path, dpi=110)
    plt.close(figure)


PROFILERS = {"onnx": profile_chunk, "openvino": profile_chunk_openvino}
RUNTIME_NAMES = {"onnx": "ONNX Runtime", "openvino": "OpenVINO"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", default="1,2,8", type=lambda text: [int(c) for c in text.split(",")])
    parser.add_argument("--calls", type=int, default=8, help="profiled calls per chunk size, after the warm-up")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", choices=tuple(PROFILERS), default="onnx", help="the runtime of the .onnx file")
    parser.add_argument("--out", type=pathlib.Path, help="default: benchmarks/results/decoder_profile[_openvino].json")
    args = parser.parse_args()
    out = args.out or RESULTS / (
        "decoder_profile.json" if args.backend == "onnx" else f"decoder_profile_{args.backend}.json"
    )
    artifact_bench.CACHE.mkdir(parents=True, exist_ok=True)
    checkpoint = artifact_bench.ensure_checkpoint()
    directory, _ = artifact_bench.ensure_artifact(checkpoint, "onnx", 25)
    manifest = json.loads((directory / "manifest.json").read_text())
    path = directory / manifest["artifacts"]["onnx"]["file"]
    work = artifact_bench.work_per_call(checkpoint, tuple(args.chunks))
    speed = artifact_bench.machine_speed()
    print(f"[decoder_profile] machine speed: {speed}", file=sys.stderr, flush=True)
    load_before = os.getloadavg()[0]
    chunks = {}
    for chunk in args.chunks:
        before = gemm_rate()
        wall, kernels = PROFILERS[args.backend](path, manifest, chunk, args.calls, args.threads)
        rates = (before, gemm_rate())
        peak = sum(rates) / 2
        chunks[str(chunk)] = summarize(wall, kernels, args.calls, work["flops"][str(chunk)], peak)
        result = chunks[str(chunk)]
        result["gemm_fp32_gflops_before_after"] = [round(rate, 1) for rate in rates]
        print(f"[decoder_profile] C={chunk}: {result['median_call_ms']} ms, {result['fraction_of_gemm_peak']:.0%} "
              f"of the GEMM rate; by kind {result['by_kind_share']}", file=sys.stderr, flush=True)  # fmt: skip
    record = {
        "benchmark": "decoder_profile",
        "artifact": "stateful fp32 ONNX, real-size random weights (artifact_bench's checkpoint), chunks up to 25",
        "backend": args.backend,
        "runtime": RUNTIME_NAMES[args.backend],
        "threads": args.threads,
        "machine": machine(),
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "machine_speed": speed,
        "versions": versions("onnxruntime", "openvino", "onnx", "torch", "numpy"),
        "command": shlex.join([sys.executable.replace(str(artifact_bench.ROOT) + "/", ""), *sys.argv]),
        "calls_per_chunk": args.calls,
        "chunks": chunks,
    }
    write_record(record, out, plot)
    print(f"[decoder_profile] wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)


if __name__ == "__main__":
    main()
