"""Decode time under CPU contention: the default backend's threading policies, quiet and beside a busy process.

    .venv/bin/python benchmarks/contention_bench.py        # ~5 minutes on 2 cores
    .venv/bin/python benchmarks/contention_bench.py --only OpenVINO
    .venv/bin/python benchmarks/contention_bench.py --only ExecuTorch,OpenVINO \
        --out benchmarks/results/contention_bench_pte.json

A client decodes beside whatever else the device runs. Here the real-size stateful ONNX artifact
(the `.pte` for ExecuTorch) decodes C = 2 and C = 25 frame calls over a stream that carries the
state, first on a quiet machine, then with another process spinning on one core (`while True:
pass`). Per runtime (the default, OpenVINO, ONNX Runtime, and ExecuTorch) and threading policy
(threads; for ONNX Runtime, whether idle worker threads spin; for OpenVINO, also without
codecstream's fused SnakeBeta, to compare in one run), in a fresh process each: median, p90, p99 and max per call, quiet
and contended, and the ratio of the contended p99 to the quiet median, which is what a jitter
buffer must absorb. Writes
benchmarks/results/contention_bench.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import artifact_bench  # the real-size artifacts, the machine record
import numpy as np
from bench_record import build_openvino_operations, decode_call_seconds, machine, versions, write_record

#: policy name -> (backend, threads, whether ONNX Runtime's idle threads spin; None: not ONNX Runtime)
POLICIES = {
    "ONNX Runtime, 2 threads, spinning (its default)": ("onnx", 2, True),
    "ONNX Runtime, 2 threads, no spinning (codecstream's setting)": ("onnx", 2, False),
    "ONNX Runtime, 1 thread": ("onnx", 1, False),
    "OpenVINO, 2 threads (auto's first choice)": ("openvino", 2, None),
    "OpenVINO, 2 threads, SnakeBeta unfused": ("openvino", 2, None),
    "OpenVINO, 1 thread": ("openvino", 1, None),
    "ExecuTorch .pte, 2 threads": ("pte", 2, None),
    "ExecuTorch .pte, 1 thread": ("pte", 1, None),
}
#: The artifact each backend decodes (artifact_bench's backend names).
ARTIFACTS = {"onnx": "onnx", "openvino": "onnx", "pte": "pte"}
#: Environment of a policy's worker beyond the driver's (artifact_bench's for the same backend).
POLICY_ENVIRONMENT = {"OpenVINO, 2 threads, SnakeBeta unfused": artifact_bench.BACKEND_ENVIRONMENT["openvino-unfused"]}
CALLS = {2: 60, 25: 12}


def log(message: str) -> None:
    print(f"[contention_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def timings(decoder, chunk: int, calls: int) -> dict:
    times = [seconds * 1000 for seconds in decode_call_seconds(decoder, chunk, calls, seed=5)]
    return {
        "calls": calls,
        "median_ms": round(float(np.median(times)), 2),
        "p90_ms": round(float(np.percentile(times, 90)), 2),
        "p99_ms": round(float(np.percentile(times, 99)), 2),
        "max_ms": round(max(times), 2),
    }


def worker(args: argparse.Namespace) -> None:
    from codecstream.client.runtimes import open_decoder
    from codecstream.client.runtimes.onnx_program import OnnxProgram

    backend, threads, spinning = POLICIES[args.worker]
    if spinning is not None:
        OnnxProgram.allow_spinning = spinning
    decoder = open_decoder(args.source, backend=backend, threads=threads)
    result: dict = {
        "policy": args.worker,
        "backend": backend,
        "threads": threads,
        "spinning": spinning,
        "description": decoder.description,
    }
    for phase in ("quiet", "contended"):
        busy = None
        if phase == "contended":
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(0.5)
        try:
            result[phase] = {str(chunk): timings(decoder, chunk, calls) for chunk, calls in CALLS.items()}
        finally:
            if busy:
                busy.kill()
                busy.wait()
    for chunk in CALLS:
        quiet, contended = result["quiet"][str(chunk)], result["contended"][str(chunk)]
        result.setdefault("contended_p99_over_quiet_median", {})[str(chunk)] = round(
            contended["p99_ms"] / quiet["median_ms"], 2
        )
    print("RESULT " + json.dumps(result), flush=True)


def add_gemm_fractions(row: dict, work: dict, speed: dict) -> None:
    """Beside each median: the FLOP rate it reaches as a fraction of the machine's fp32 GEMM rate."""
    peak = max(speed["gemm_fp32_gflops"], speed["gemm_fp32_numpy_gflops"])
    for phase in ("quiet", "contended"):
        for chunk, timing in row.get(phase, {}).items():
            timing["fraction_of_gemm_peak"] = round(work["flops"][chunk] / (timing["median_ms"] / 1000) / 1e9 / peak, 3)


def plot(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(1, len(CALLS), figsize=(12, 4.5), constrained_layout=True)
    rows = [row for row in results["policies"] if "quiet" in row]
    for axis, chunk in zip(axes, CALLS, strict=True):
        names = [row["policy"] for row in rows]
        x = np.arange(len(names))
        quiet = [row["quiet"][str(chunk)]["median_ms"] for row in rows]
        p99 = [row["contended"][str(chunk)]["p99_ms"] for row in rows]
        axis.bar(x - 0.2, quiet, 0.4, label="quiet median")
        axis.bar(x + 0.2, p99, 0.4, label="p99 beside a busy process")
        axis.plot(x, [2 * q for q in quiet], "k_", markersize=30, label="2x quiet median")
        axis.set_xticks(x, [name.replace(" (", "\n(") for name in names], fontsize=8)
        axis.set(ylabel="ms per call", title=f"C = {chunk} frames, {results['machine']['cpu']}")
        axis.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=artifact_bench.RESULTS / "contention_bench.json")
    parser.add_argument(
        "--only", default="", help='the policies whose name holds one of these comma-separated texts, e.g. "OpenVINO"'
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--source", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    artifact_bench.CACHE.mkdir(parents=True, exist_ok=True)
    build_openvino_operations()  # the workers open OpenVINO's decoder fused from their first call
    checkpoint = artifact_bench.ensure_checkpoint()
    wanted = [text.strip().lower() for text in args.only.split(",")]
    policies = [name for name in POLICIES if any(text in name.lower() for text in wanted)]
    sources = {
        artifact: artifact_bench.ensure_artifact(checkpoint, artifact, 25)[0]
        for artifact in sorted({ARTIFACTS[POLICIES[name][0]] for name in policies})
    }
    work = artifact_bench.work_per_call(checkpoint, tuple(CALLS))
    speed = artifact_bench.machine_speed()
    log(f"machine speed: {speed}")
    load_before = os.getloadavg()
    rows = []
    for policy in policies:
        log(f"{policy}: measuring (load average {os.getloadavg()[0]:.2f})")
        source = sources[ARTIFACTS[POLICIES[policy][0]]]
        command = [sys.executable, __file__, "--worker", policy, "--source", str(source)]
        env = {**os.environ, "PYTHONWARNINGS": "ignore", **POLICY_ENVIRONMENT.get(policy, {})}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        row = (
            json.loads(lines[-1].removeprefix("RESULT ")) if lines else {"policy": policy, "error": done.stderr[-2000:]}
        )
        add_gemm_fractions(row, work, speed)
        log(json.dumps(row.get("contended_p99_over_quiet_median", row)))
        rows.append(row)
    results = {
        "benchmark": "contention_bench",
        "decoder": "real-size random weights, stateful fp32 ONNX artifact (ExecuTorch: the fp32 .pte)",
        "contention": "one other process spinning on one core (`while True: pass`)",
        "machine": machine(),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "versions": versions("torch", "onnxruntime", "openvino", "executorch", "numpy"),
        "machine_speed": speed,
        "work_per_call": work,
        "policies": rows,
    }
    write_record(results, args.out, plot)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
