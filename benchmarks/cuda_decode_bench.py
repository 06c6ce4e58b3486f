"""The client's torch runtime on a CUDA GPU, measured as a client gets it: latency per chunk, first chunks, parity.

    PYTHONPATH=protocol/src:decoder/src:client/src:testing/src \\
        python benchmarks/cuda_decode_bench.py --out benchmarks/results/cuda_decode_bench.json

On a real-size random-weight checkpoint built on the spot, one row per way of running the runtime:
  - `open_decoder(checkpoint, backend="torch")`, what a client gets: fp32 with TF32 off, the step
    replayed from CUDA graphs, warmed up (the default ramp's graphs captured). It is the first
    CUDA work of the process, so its load_s includes creating the CUDA context;
  - `EagerTorchDecoder(precision=...)` "tf32", "bf16" and "bf16-mixed", warmed up as open_decoder does;
  - `EagerTorchDecoder(cuda_graphs=False)`: the eager step in fp32, TF32 off, for comparison.
Per row: median, p90 and min per call at C in {1, 2, 4, 8, 16, 25} (a call returns float32 numpy on
the host, so each includes the copy back; the first call of each size is not timed: it may capture a
graph), RTF; the first stream after load, chunk by chunk along the default ramp (its first chunk is
the first 2-frame chunk of a fresh stream); load_s (open and warm-up, captures included); each
graph's capture time; peak GPU memory; parity SNR of that first stream's audio against the fp32
full-utterance decode on the CPU (the reference) and on this GPU with TF32 off.
Plus 4 streams of the default decoder decoding at once from threads against the same streams one
after another, and the cost of copying a stream's state into the graphs' buffers and back.
The script sets no torch flags of its own: the TF32 flags are recorded before and after the run.
Needs only torch, numpy, safetensors, grpcio and protobuf next to the repository's sources, so it
runs on a bare GPU machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import platform
import shlex
import sys
import tempfile
import threading
import time

import numpy as np
from bench_record import decode_call_seconds, random_codes, write_record
from codecstream.protocol.chunking import ChunkSchedule
from codecstream.protocol.decoding import FRAME_SECONDS
from codecstream.protocol.pcm import snr_db

CHUNKS = (1, 2, 4, 8, 16, 25)
PARITY_FRAMES = 200
STREAMS = 4
STREAM_FRAMES = 100
PRIMED_FRAMES = 100


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def per_chunk_size(decoder, calls: int) -> dict:
    """Latency per chunk size over a stream that carries its state."""
    result = {}
    for chunk in CHUNKS:
        times = decode_call_seconds(decoder, chunk, calls, seed=3)
        median = float(np.median(times))
        result[str(chunk)] = {
            "calls": calls,
            "median_ms": ms(median),
            "p90_ms": ms(float(np.percentile(times, 90))),
            "min_ms": ms(min(times)),
            "rtf": round(median / (chunk * FRAME_SECONDS), 5),
        }
    return result


def timed_stream(stream, all_codes: np.ndarray) -> tuple[np.ndarray, list[dict]]:
    """Decode along the default chunk ramp: the audio, and each chunk's size and time."""
    pieces, chunks, start = [], [], 0
    for size in ChunkSchedule().split(len(all_codes)):
        began = time.perf_counter()
        pieces.append(stream.decode(all_codes[start : start + size]))
        chunks.append({"frames": size, "ms": ms(time.perf_counter() - began)})
        start += size
    return np.concatenate(pieces), chunks


def measure_row(name: str, open_row, parity_codes: np.ndarray, calls: int) -> tuple[object, dict, dict]:
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    began = time.perf_counter()
    decoder = open_row()
    load_s = time.perf_counter() - began
    at_load = sorted(decoder.capture_seconds)
    pcm, chunks = timed_stream(decoder.new_stream(), parity_codes)
    primed = decoder.new_stream()
    primed.prime(parity_codes[:PRIMED_FRAMES])
    audio = {"first_stream": pcm, "primed": timed_stream(primed, parity_codes[PRIMED_FRAMES:])[0]}
    row = {
        "row": name,
        "description": decoder.description,
        "precision": decoder.precision,
        "dtype": decoder.dtype,
        "load_s": round(load_s, 3),
        "first_chunk_ms": chunks[0]["ms"],
        "first_chunk_frames": chunks[0]["frames"],
        "first_stream_after_load": chunks,
        "chunks": per_chunk_size(decoder, calls),
        "graphs_captured_at_load": at_load,
        "graph_capture_ms": {str(size): ms(seconds) for size, seconds in sorted(decoder.capture_seconds.items())},
        "peak_gpu_memory_mb": round((torch.cuda.max_memory_allocated() - baseline) / 2**20, 1),
    }
    print(f"{name}: {json.dumps(row)}", flush=True)
    return decoder, row, audio


def concurrent_streams(decoder) -> dict:
    """STREAMS streams of one decoder, each chunk decoded by all of them at once from threads."""
    utterances = [random_codes(STREAM_FRAMES, 20 + index) for index in range(STREAMS)]
    began = time.perf_counter()
    sequential = [timed_stream(decoder.new_stream(), utterance)[0] for utterance in utterances]
    sequential_s = time.perf_counter() - began
    results: list[np.ndarray | None] = [None] * STREAMS
    in_step = threading.Barrier(STREAMS)
    sizes = ChunkSchedule().split(STREAM_FRAMES)

    def decode(index: int) -> None:
        stream, pieces, start = decoder.new_stream(), [], 0
        for size in sizes:
            in_step.wait(60)
            pieces.append(stream.decode(utterances[index][start : start + size]))
            start += size
        results[index] = np.concatenate(pieces)

    threads = [threading.Thread(target=decode, args=(index,)) for index in range(STREAMS)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    concurrent_s = time.perf_counter() - began
    return {
        "streams": STREAMS,
        "frames_per_stream": STREAM_FRAMES,
        "chunks": sizes,
        "pcm_equal_to_sequential": all(np.array_equal(a, b) for a, b in zip(results, sequential, strict=True)),
        "max_abs_difference": max(float(np.max(np.abs(a - b))) for a, b in zip(results, sequential, strict=True)),
        "sequential_s": round(sequential_s, 3),
        "concurrent_s": round(concurrent_s, 3),
    }


def state_copy_cost(model) -> dict:
    """What the graph runtime adds per call to move a stream's state in and out of the static buffers."""
    import torch
    from codecstream.client.runtimes.cuda_graphs import StreamState
    from codecstream.decoder import StatefulDecoderStep

    step = StatefulDecoderStep(model)
    with torch.inference_mode():
        own, static = StreamState(step), StreamState(step)
        times = []
        for _ in range(210):
            torch.cuda.synchronize()
            began = time.perf_counter()
            static.copy_(own)
            own.copy_(static)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - began)
    return {
        "state_mb": round(own.nbytes / 2**20, 2),
        "copy_in_and_out_median_ms": ms(float(np.median(times[10:]))),
        "note": "two device-to-device copies each way, timed with a synchronize on each side",
    }


def tf32_flags() -> dict:
    import torch

    if hasattr(torch.backends.cudnn, "conv"):
        return {
            "cuda.matmul.fp32_precision": torch.backends.cuda.matmul.fp32_precision,
            "cudnn.conv.fp32_precision": torch.backends.cudnn.conv.fp32_precision,
        }
    return {
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
    }


def onnxruntime_note() -> str:
    """Why ONNX Runtime's CUDA provider is or is not part of this run."""
    try:
        import onnxruntime
    except ImportError:
        return "not measured: onnxruntime is not installed here"
    providers = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return (
            f"not measured: onnxruntime {onnxruntime.__version__} here offers {providers} only (the CPU build); "
            "onnxruntime-gpu was not available on this machine"
        )
    return f"available ({providers}) but not measured by this script"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--calls", type=int, default=50, help="timed calls per chunk size")
    parser.add_argument("--preset", default="real", help="checkpoint preset (tiny: a quick smoke run)")
    args = parser.parse_args()

    import torch
    from codecstream.client.runtimes import open_decoder
    from codecstream.client.runtimes.torch_eager import EagerTorchDecoder
    from codecstream.decoder import decode_utterance, load_decoder
    from codecstream.testing.random_speech_tokenizer import write_speech_tokenizer

    flags_before = tf32_flags()
    checkpoint = write_speech_tokenizer(pathlib.Path(tempfile.mkdtemp()) / args.preset, preset=args.preset, seed=0)
    parity_codes = random_codes(PARITY_FRAMES, 9)
    began = time.perf_counter()
    reference = decode_utterance(load_decoder(checkpoint), parity_codes)
    cpu_reference_s = time.perf_counter() - began

    def warmed(**options):
        def open_row():
            decoder = EagerTorchDecoder(checkpoint, None, **options)
            decoder.warm_up()  # as open_decoder does
            return decoder

        return open_row

    rows, audio = [], []
    openers = [
        ("open_decoder(backend='torch'): fp32 TF32 off, graphs", lambda: open_decoder(checkpoint, backend="torch")),
        ("precision='tf32', CUDA graphs", warmed(precision="tf32")),
        ("precision='bf16', CUDA graphs", warmed(precision="bf16")),
        ("precision='bf16-mixed', CUDA graphs", warmed(precision="bf16-mixed")),
        ("cuda_graphs=False: eager fp32, TF32 off", warmed(cuda_graphs=False)),
    ]
    for index, (name, open_row) in enumerate(openers):
        decoder, row, pcm = measure_row(name, open_row, parity_codes, args.calls)
        if index == 0:
            concurrent = concurrent_streams(decoder)
            print(f"concurrent: {json.dumps(concurrent)}", flush=True)
        rows.append(row)
        audio.append(pcm)
        del decoder  # its graphs and weights, before the next row's peak memory is measured

    from codecstream.client.runtimes.cuda_graphs import float32_precision

    gpu_model = load_decoder(checkpoint).to("cuda")
    state_copy = state_copy_cost(gpu_model)
    with float32_precision(tf32=False), torch.inference_mode():
        gpu_codes = torch.from_numpy(parity_codes.astype(np.int64))[None].to("cuda")
        gpu_reference = gpu_model(gpu_codes)[0].float().cpu().numpy()
    tail = len(reference) // PARITY_FRAMES * PRIMED_FRAMES
    for row, pcm in zip(rows, audio, strict=True):
        row["parity_snr_db_vs_cpu_fp32"] = round(snr_db(reference, pcm["first_stream"]), 2)
        row["parity_snr_db_vs_gpu_fp32"] = round(snr_db(gpu_reference, pcm["first_stream"]), 2)
        # A stream primed with the first frames, then decoding the rest: priming stays eager.
        row["primed_parity_snr_db_vs_cpu_fp32"] = round(snr_db(reference[tail:], pcm["primed"]), 2)

    gpu = torch.cuda.get_device_properties(0)
    results = {
        "benchmark": "cuda_decode_bench",
        "mode": "stateful",
        "decoder": f"random weights (codecstream.testing.random_speech_tokenizer preset={args.preset} seed=0)",
        "machine": {
            "gpu": gpu.name,
            "gpu_memory_gb": round(gpu.total_memory / 1e9, 1),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "numpy": np.__version__,
        },
        "parity_reference": f"fp32 full-utterance decode on the CPU ({torch.get_num_threads()} threads, "
        f"{cpu_reference_s:.1f} s), {PARITY_FRAMES} frames; each row streams them along the default ramp "
        f"{ChunkSchedule().split(PARITY_FRAMES)} as the first stream after load; primed parity: a stream "
        f"primed with the first {PRIMED_FRAMES} frames decodes the rest",
        "gpu_reference_snr_db_vs_cpu": round(snr_db(reference, gpu_reference), 2),
        "tf32_flags": {"before": flags_before, "after": tf32_flags()},
        "onnxruntime_cuda": onnxruntime_note(),
        "command": shlex.join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": rows,
        "concurrent_streams": concurrent,
        "state_copy": state_copy,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_record(results, args.out)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
