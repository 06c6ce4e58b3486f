"""Client decode speed per backend: eager torch, .pt2, .pte, .onnx and the quantized artifacts.

"openvino" runs the .onnx artifact as the client does, with codecstream's fused SnakeBeta;
"openvino-unfused" without it (CODECSTREAM_OPENVINO_OPS=0), to measure the gain in one run.

This is the backend axis of benchmarks/decode_bench.py (which runs it with the eager modes and
keeps it in decode_bench.json); run it alone when only the runtimes changed.

Real-size random weights (preset "real": it costs what the released decoder costs), stateful mode,
a fixed number of CPU threads, chunk sizes C in {1, 2, 4, 8, 16, 25}. Per backend, in a fresh
process each (so peak RSS is that backend's): load time, the first 2-frame chunk after loading
and after a reset, per-call latency for each C (median, p90 over a stream of calls that carries
the state, as a client would), RTF = median call time / audio time of the chunk, artifact size,
peak RSS, and parity (SNR against the fp32 full-utterance decode over 100 frames). Ready time:
five fresh processes, the first with the client's cache empty (OpenVINO compiles and keeps its
program there), the median of the other four (they import it).

    .venv/bin/python benchmarks/artifact_bench.py                      # everything, ~15-25 min
    .venv/bin/python benchmarks/artifact_bench.py --backends onnx,pte  # a subset

ExecuTorch's Python runtime imports torch, and this environment holds torch's CUDA build, whose
import loads the CUDA libraries; `--client-python` also times the .pte's ready time under a
client's own install, one with torch's CPU build (the record names the torch it found):

    python3.11 -m venv .cache/client-venv
    .cache/client-venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    .cache/client-venv/bin/pip install ./protocol ./decoder './client[executorch]'
    .venv/bin/python benchmarks/artifact_bench.py --backends pte,pte-int8 --client-python .cache/client-venv/bin/python

Artifacts and the checkpoint are built under .cache/bench/ (git-ignored) when missing. Results go
to benchmarks/results/artifact_bench.json and .png with the machine, versions, load average and
command line. The machine is shared: check `uptime` first and read the recorded load average.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from bench_record import (
    RESULTS,
    build_openvino_operations,
    machine,
    peak_rss_mb,
    random_codes,
    versions,
    write_record,
)
from codecstream.protocol.decoding import FRAME_SECONDS

ROOT = pathlib.Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "artifact_bench"
#: backend name -> (artifact format or "torch", dtype)
BACKENDS = {
    "eager": ("torch", "fp32"),
    "pt2": ("pt2", "fp32"),
    "pte": ("pte", "fp32"),
    "onnx": ("onnx", "fp32"),
    "openvino": ("onnx", "fp32"),
    "openvino-unfused": ("onnx", "fp32"),
    "onnx-int8": ("onnx", "int8"),
    "pte-int8": ("pte", "int8"),
    "pt2-bf16": ("pt2", "bf16"),
    "pt2-bf16-mixed": ("pt2", "bf16-mixed"),
}
#: The open_decoder backend of the names that are not their format's own runtime.
RUNTIMES = {"openvino": "openvino", "openvino-unfused": "openvino"}
#: Environment of a backend's processes beyond the driver's: OpenVINO without codecstream's fused
#: SnakeBeta, to measure what it gains in one run.
BACKEND_ENVIRONMENT = {"openvino-unfused": {"CODECSTREAM_OPENVINO_OPS": "0"}}
CHUNKS = (1, 2, 4, 8, 16, 25)
PARITY_FRAMES = 100
FIRST_STREAM_FRAMES = 40  # the default ramp and a few chunks of its last size
FRESH_STREAMS = 10


def runtime_of(backend: str) -> str:
    """The open_decoder backend that runs `backend`'s artifact (its format's runtime unless named)."""
    return RUNTIMES.get(backend, BACKENDS[backend][0])


def audio_seconds_per_call_budget(chunk: int) -> int:
    """Calls timed per chunk size: more for small chunks, enough for a median and a p90."""
    return max(6, min(30, 120 // chunk))


# -- worker: one backend in its own process ----------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    from codecstream.client.runtimes import open_decoder
    from codecstream.protocol.pcm import snr_db

    decoder = open_decoder(args.source, backend=runtime_of(args.worker), threads=args.threads, warm_up=False)
    load_s = time.perf_counter() - started
    result: dict = {
        "backend": args.worker,
        "description": decoder.description,
        "load_s": round(load_s, 3),
        # From the driver's spawn of this process (interpreter start and imports included) to a
        # decoder that can decode: what a client waits before its first chunk could be decoded.
        "ready_s": round(time.time() - args.spawned_at, 3),
    }

    began = time.perf_counter()
    decoder.decode(random_codes(2, 1))
    result["first_chunk_2_frames_cold_ms"] = round((time.perf_counter() - began) * 1000, 2)
    began = time.perf_counter()
    decoder.warm_up()  # what open_decoder does by default, after that one cold call
    result["warm_up"] = {"sizes": list(decoder.warm_up_sizes), "seconds": round(time.perf_counter() - began, 3)}
    result["first_stream_after_load"] = first_stream(decoder)
    # A fresh stream's first 2-frame chunk, the size the first-chunk targets name: the median of
    # several fresh streams, since one call moves by a few ms with the host.
    fresh = []
    for stream in range(FRESH_STREAMS):
        decoder.reset()
        began = time.perf_counter()
        decoder.decode(random_codes(2, 6 + stream))
        fresh.append(round((time.perf_counter() - began) * 1000, 2))
    result["first_chunk_2_frames_ms"] = float(np.median(fresh))
    result["first_chunk_2_frames_ms_runs"] = fresh

    per_chunk = {}
    for chunk in args.chunks:
        calls = audio_seconds_per_call_budget(chunk)
        stream = random_codes(chunk * (calls + 2), 3)
        decoder.reset()
        decoder.decode(stream[:chunk])  # warm-up call of this size
        times, cpu_times = [], []
        for index in range(1, calls + 1):
            began, cpu_began = time.perf_counter(), time.process_time()
            decoder.decode(stream[index * chunk : (index + 1) * chunk])
            times.append(time.perf_counter() - began)
            cpu_times.append(time.process_time() - cpu_began)
        median = float(np.median(times))
        per_chunk[str(chunk)] = {
            "calls": calls,
            "median_ms": round(median * 1000, 2),
            "p90_ms": round(float(np.percentile(times, 90)) * 1000, 2),
            "min_ms": round(min(times) * 1000, 2),
            "rtf": round(median / (chunk * FRAME_SECONDS), 4),
            "rtf_best_call": round(min(times) / (chunk * FRAME_SECONDS), 4),
            # CPU seconds of all the process's threads per call: unlike wall time, not inflated by
            # other processes on the shared cores (wall ~ cpu / threads when the cores are free).
            "median_cpu_ms": round(float(np.median(cpu_times)) * 1000, 2),
        }
    result["chunks"] = per_chunk

    reference = np.load(args.reference)
    decoder.reset()
    pieces, start = [], 0
    for size in _ramp(PARITY_FRAMES):
        pieces.append(decoder.decode(random_codes(PARITY_FRAMES, 9)[start : start + size]))
        start += size
    result["parity_snr_db"] = round(snr_db(reference, np.concatenate(pieces)), 2)
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    print("RESULT " + json.dumps(result), flush=True)


def first_stream(decoder) -> list[dict]:
    """The first stream after the warm-up, chunk by chunk along the default ramp: with every
    size warmed, each chunk costs what the steady medians say (no first-shape cost)."""
    decoder.reset()
    stream, start, chunks = random_codes(FIRST_STREAM_FRAMES, 4), 0, []
    for size in _ramp(FIRST_STREAM_FRAMES):
        began = time.perf_counter()
        decoder.decode(stream[start : start + size])
        chunks.append({"frames": size, "ms": round((time.perf_counter() - began) * 1000, 2)})
        start += size
    return chunks


def _ramp(frames: int) -> list[int]:
    from codecstream.protocol.chunking import ChunkSchedule

    return ChunkSchedule().split(frames)


# -- driver ------------------------------------------------------------------------------------------


def ensure_checkpoint() -> pathlib.Path:
    path = CACHE / "real-seed0"
    if not (path / "model.safetensors").exists():
        from codecstream.testing.random_speech_tokenizer import write_speech_tokenizer

        write_speech_tokenizer(path, preset="real", seed=0)
    return path


def decoder_source_digest() -> str:
    """sha256 of the decoder and exporter sources: what an exported artifact and the eager
    reference were computed by. A cached one made by other code is made again."""
    digest = hashlib.sha256()
    for package in ("decoder", "export"):
        for path in sorted((ROOT / package / "src").rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def ensure_exported(directory: pathlib.Path, export, settings: str = "") -> float | None:
    """`export()` into `directory` unless it holds an export by the current sources with the same
    `settings` (what else the export depends on, e.g. its largest chunk); seconds taken or None."""
    stamp = directory / "source.sha256"
    key = decoder_source_digest() + (f" {settings}" if settings else "")
    if (directory / "manifest.json").exists() and stamp.exists() and stamp.read_text() == key:
        return None
    shutil.rmtree(directory, ignore_errors=True)
    began = time.perf_counter()
    export()
    stamp.write_text(key)
    return round(time.perf_counter() - began, 1)


def ensure_reference(checkpoint: pathlib.Path) -> pathlib.Path:
    path = CACHE / f"reference-{PARITY_FRAMES}-{decoder_source_digest()[:12]}.npy"
    if not path.exists():
        from codecstream.decoder import decode_utterance, load_decoder

        np.save(path, decode_utterance(load_decoder(checkpoint), random_codes(PARITY_FRAMES, 9)))
    return path


def ensure_artifact(checkpoint: pathlib.Path, backend: str, max_chunk: int) -> tuple[pathlib.Path, float | None]:
    fmt, dtype = BACKENDS[backend]
    if fmt == "torch":
        return checkpoint, None
    directory = CACHE / "artifacts" / f"stateful-{dtype}-{fmt}"

    # A run with smaller chunks (--chunks 2,8) exports for them alone: an artifact whose largest
    # chunk is smaller than this run's would be fed the large chunks in pieces.
    def export() -> None:
        export_artifact(checkpoint, directory, fmt, dtype, max_chunk)

    return directory, ensure_exported(directory, export, settings=f"max_chunk_frames={max_chunk}")


def export_artifact(
    checkpoint: pathlib.Path, out: pathlib.Path, fmt: str, dtype: str = "fp32", max_chunk: int = 25
) -> None:
    """`codecstream export-decoder` of the stateful decoder, as a user runs it (its progress shows)."""
    command = [
        sys.executable,
        "-m",
        "codecstream.client.cli",
        "export-decoder",
        str(checkpoint),
        "--format",
        fmt,
        "--mode",
        "stateful",
        "--dtype",
        dtype,
        "--max-chunk-frames",
        str(max_chunk),
        "--out",
        str(out),
        "--min-check-db",
        "-1000",
    ]  # fmt: skip  (this measures parity itself: a wrong artifact is a finding)
    subprocess.run(command, check=True)


def artifact_size_mb(directory: pathlib.Path, backend: str) -> float | None:
    fmt, _ = BACKENDS[backend]
    if fmt == "torch":
        return None
    manifest = json.loads((directory / "manifest.json").read_text())
    return round(manifest["artifacts"][fmt]["size_bytes"] / 1e6, 1)


READY_RUNS = 5
_READY_SCRIPT = (
    "import sys, time\n"
    "from codecstream.client.runtimes import open_decoder\n"
    "open_decoder(sys.argv[1], backend=sys.argv[2], threads=int(sys.argv[3]), warm_up=False)\n"
    "print(time.time())\n"
)


def ready_seconds(backend: str, source: pathlib.Path, threads: int, python: str = sys.executable) -> list[float]:
    """Process start to a decoder that can decode, in fresh interpreters of `python` (the file in
    the page cache after the first): the import, the open and the integrity check, no warm-up. The
    client's cache starts empty, so the first run of a runtime that keeps its compiled program
    (OpenVINO) compiles and stores it, and the later runs import it, as a user's first and later
    starts."""
    runs = []
    with tempfile.TemporaryDirectory() as cache:
        if runtime_of(backend) == "openvino":
            build_openvino_operations(cache)  # an install has them; the decoder is what starts cold
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "CODECSTREAM_CACHE_DIR": cache,
               **BACKEND_ENVIRONMENT.get(backend, {})}  # fmt: skip
        for _ in range(READY_RUNS):
            spawned = time.time()
            done = subprocess.run(
                [python, "-c", _READY_SCRIPT, str(source), runtime_of(backend), str(threads)],
                capture_output=True, text=True, check=True, env=env,
            )  # fmt: skip
            runs.append(round(float(done.stdout.split()[-1]) - spawned, 3))
    return runs


def client_ready(backend: str, source: pathlib.Path, args: argparse.Namespace) -> dict:
    """Ready time under a client's own install (`--client-python`): the development environment
    holds torch's CUDA build, whose import loads the CUDA libraries, while a CPU client takes
    torch's CPU build (PyPI's wheel on macOS and aarch64; on x86-64 Linux, PyTorch's CPU index)."""
    torch_build = subprocess.run(
        [args.client_python, "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    runs = ready_seconds(backend, source, args.threads, python=args.client_python)
    return {"python": args.client_python, "torch": torch_build, "ready_s_runs": runs,
            "ready_s_median": float(np.median(runs[1:]))}  # fmt: skip


def run_worker(backend: str, source: pathlib.Path, reference: pathlib.Path, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        __file__,
        "--worker",
        backend,
        "--source",
        str(source),
        "--reference",
        str(reference),
        "--threads",
        str(args.threads),
        "--chunks",
        ",".join(map(str, args.chunks)),
        "--spawned-at",
        repr(time.time()),
    ]
    with tempfile.TemporaryDirectory() as cache:  # the worker compiles, as a first start does
        if runtime_of(backend) == "openvino":
            build_openvino_operations(cache)  # an install has them; the decoder is what starts cold
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONWARNINGS": "ignore",
               "CODECSTREAM_CACHE_DIR": cache, **BACKEND_ENVIRONMENT.get(backend, {})}  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return {"backend": backend, "error": (done.stderr or done.stdout)[-2000:]}
    return json.loads(lines[-1].removeprefix("RESULT "))


def machine_speed() -> dict:
    """This machine's speed right now: GEMM throughput (fp32 through torch and numpy, bf16 through
    torch) and memory read bandwidth, best of a few calls.

    The cores are shared with other tenants of the host, and decode times move with them (~1.5x
    between runs at the same load average); recording this next to each timing lets a reader tell
    a slower decoder from a slower machine, and how far a decoder is from the machine's floor.
    """
    import torch

    def best_seconds(call, repeats: int = 5) -> float:
        call()
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
        return min(times)

    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    a16, b16 = a.bfloat16(), b.bfloat16()
    big = torch.randn(64 * 1024 * 1024)
    flops = 2 * n**3
    return {
        "gemm_fp32_gflops": round(flops / best_seconds(lambda: a @ b) / 1e9, 1),
        "gemm_fp32_numpy_gflops": round(flops / best_seconds(lambda: a.numpy() @ b.numpy()) / 1e9, 1),
        "gemm_bf16_gflops": round(flops / best_seconds(lambda: a16 @ b16, repeats=2) / 1e9, 1),
        "memory_read_gb_per_s": round(big.numel() * 4 / best_seconds(big.sum) / 1e9, 1),
    }


@functools.cache
def work_per_call(checkpoint: pathlib.Path, chunks: tuple[int, ...]) -> dict:
    """Multiply-adds (as FLOPs) of one stateful step per chunk size, counted on the eager model, and
    the weight bytes a call reads at fp32: the two floors a call's time is compared with. Cached:
    decode_bench asks once per backend."""
    import torch
    from codecstream.decoder import StatefulDecoderStep, load_decoder
    from torch.utils.flop_counter import FlopCounterMode

    model = load_decoder(checkpoint)
    step = StatefulDecoderStep(model)
    state = step.initial_state()
    flops = {}
    with torch.inference_mode():
        for chunk in chunks:
            counter = FlopCounterMode(display=False)
            with counter:
                step(torch.zeros(1, chunk, 16, dtype=torch.int64), *state)
            flops[str(chunk)] = counter.get_total_flops()
    # The codebooks are gathered row by row, not read whole: they are not part of a call's reads.
    weights = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("quantizer."))
    return {"flops": flops, "fp32_weight_bytes": weights * 4}


def add_floor_fractions(row: dict, work: dict, speed: dict) -> None:
    """Beside each chunk size's median: the GEMM rate it reaches as a fraction of the machine's best
    (bf16 rows against the bf16 rate), and its weight reads as a fraction of the read bandwidth."""
    _, dtype = BACKENDS[row["backend"]]
    if dtype.startswith("bf16"):
        peak = speed["gemm_bf16_gflops"]
    else:
        peak = max(speed["gemm_fp32_gflops"], speed["gemm_fp32_numpy_gflops"])
    # An artifact holds its weights as stored (bf16, int8 or fp32): its size is what a call reads.
    weight_bytes = row["artifact_mb"] * 1e6 if row.get("artifact_mb") else work["fp32_weight_bytes"]
    if "2" in work["flops"] and "first_chunk_2_frames_ms" in row:
        # The compute floor of a 2-frame call: its FLOPs at the machine's GEMM rate.
        floor_ms = work["flops"]["2"] / (peak * 1e9) * 1000
        row["first_chunk_2_frames_compute_floor_ms"] = round(floor_ms, 2)
        row["first_chunk_2_frames_over_floor"] = round(row["first_chunk_2_frames_ms"] / floor_ms, 3)
    for chunk, timing in row.get("chunks", {}).items():
        rate = work["flops"][chunk] / (timing["median_ms"] / 1000)
        timing["gflops"] = round(rate / 1e9, 1)
        timing["fraction_of_gemm_peak"] = round(rate / 1e9 / peak, 3)
        timing["fraction_of_read_bandwidth"] = round(
            weight_bytes / (timing["median_ms"] / 1000) / 1e9 / speed["memory_read_gb_per_s"], 3
        )


def plot(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, (rtf_axis, first_axis) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    rows = [row for row in results["backends"] if "chunks" in row]
    for row in rows:
        sizes = sorted(int(c) for c in row["chunks"])
        rtf_axis.plot(sizes, [row["chunks"][str(c)]["rtf"] for c in sizes], marker="o", label=row["backend"])
    rtf_axis.axhline(0.20, color="gray", linestyle="--", linewidth=0.8, label="fp32 artifact target 0.20")
    rtf_axis.axhline(0.10, color="gray", linestyle=":", linewidth=0.8, label="quantized target 0.10")
    rtf_axis.set(
        xscale="log",
        yscale="log",
        xlabel="chunk size C (frames)",
        ylabel="RTF (median call / audio)",
        title=f"stateful decode, real-size decoder, {results['threads']} threads",
    )
    rtf_axis.set_xticks(list(CHUNKS), [str(c) for c in CHUNKS])
    rtf_axis.legend(fontsize=8)
    names = [row["backend"] for row in rows]
    first_axis.bar(names, [row["first_chunk_2_frames_ms"] for row in rows], color="tab:blue")
    floors = [
        row["first_chunk_2_frames_compute_floor_ms"] for row in rows if "first_chunk_2_frames_compute_floor_ms" in row
    ]
    if floors:
        first_axis.axhline(
            1.3 * floors[0], color="gray", linestyle="--", linewidth=0.8, label="target: 1.3x the compute floor"
        )
        first_axis.axhline(
            floors[0], color="black", linestyle=":", linewidth=0.8, label="compute floor (FLOPs / GEMM rate)"
        )
    first_axis.set(ylabel="ms", title=f"first 2-frame chunk of a fresh stream (median of {FRESH_STREAMS})")
    first_axis.tick_params(axis="x", rotation=30)
    first_axis.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help="comma-separated subset of " + ", ".join(BACKENDS)
    )
    parser.add_argument(
        "--chunks", default=",".join(map(str, CHUNKS)), type=lambda text: [int(c) for c in text.split(",")]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--client-python",
        help="for the .pte backends, also time ready under this interpreter, a client's install (a venv "
        "with torch's CPU build and codecstream-client[executorch]); recorded as ready_client",
    )
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "artifact_bench.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--source", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--reference", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--spawned-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    checkpoint = ensure_checkpoint()
    reference = ensure_reference(checkpoint)
    work = work_per_call(checkpoint, tuple(args.chunks))
    speed_before = machine_speed()
    print(f"[artifact_bench] machine speed: {speed_before}", file=sys.stderr, flush=True)
    load_before = os.getloadavg()
    rows = []
    for backend in args.backends.split(","):
        source, export_s = ensure_artifact(checkpoint, backend, max(args.chunks))
        print(
            f"[artifact_bench] {backend}: measuring (load average {os.getloadavg()[0]:.2f})",
            file=sys.stderr,
            flush=True,
        )
        row = run_worker(backend, source, reference, args)
        row["artifact_mb"] = artifact_size_mb(source, backend)
        if "error" not in row:
            row["ready_s_runs"] = ready_seconds(backend, source, args.threads)
            row["ready_s_median"] = float(np.median(row["ready_s_runs"][1:]))  # the starts after the first
            if args.client_python and runtime_of(backend) == "pte":
                row["ready_client"] = client_ready(backend, source, args)
        if export_s is not None:
            row["export_s"] = export_s
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    # One measurement of the GEMM rate has read half of another minutes apart on the same host:
    # the fractions are against the better of one taken before the backends and one after.
    speed_after = machine_speed()
    speed = {key: max(speed_before[key], speed_after[key]) for key in speed_before}
    for row in rows:
        if "error" not in row:
            add_floor_fractions(row, work, speed)
    results = {
        "benchmark": "artifact_bench",
        "mode": "stateful",
        "decoder": "real-size random weights (codecstream.testing.random_speech_tokenizer preset=real seed=0)",
        "threads": args.threads,
        "machine": machine(),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "machine_speed": speed,
        "machine_speed_before_after": [speed_before, speed_after],
        "work_per_call": work,
        "versions": versions(
            "torch", "executorch", "torchao", "onnx", "onnxscript", "onnxruntime", "openvino", "numpy"
        ),
        "command": shlex.join([sys.executable.replace(str(ROOT) + "/", ""), *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "backends": rows,
    }
    write_record(results, args.out, plot)
    print(f"[artifact_bench] wrote {args.out} and {args.out.with_suffix('.png')}", file=sys.stderr)


if __name__ == "__main__":
    main()
