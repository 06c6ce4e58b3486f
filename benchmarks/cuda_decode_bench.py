"""The stateful decoder on a CUDA GPU: per-chunk latency, RTF and parity, eager torch fp32 and bf16.

    python benchmarks/cuda_decode_bench.py --out benchmarks/results/cuda_decode_bench.json

Runs the client's eager torch runtime (`open_decoder(checkpoint, backend="torch")`, which decodes
on the GPU when torch sees one) on a real-size random-weight checkpoint built on the spot, at chunk
sizes C in {1, 2, 4, 8, 16, 25}: median and p90 per call (the call returns float32 numpy on the
host, so each includes the copy back), RTF, the first 2-frame chunk of a fresh stream, peak GPU
memory; plus a bf16 copy of the model through the decoder package directly. Parity: SNR of the
streamed audio against the fp32 full-utterance decode on the same GPU with TF32 off.
Needs only torch, numpy, safetensors, grpcio and protobuf next to the repository's sources
(PYTHONPATH=protocol/src:decoder/src:client/src), so it runs on a bare GPU machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import platform
import shlex
import sys
import tempfile
import time

import numpy as np
from codecstream.protocol.pcm import snr_db

CHUNKS = (1, 2, 4, 8, 16, 25)
FRAME_SECONDS = 0.08
PARITY_FRAMES = 200


def codes(frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, size=(frames, 16), dtype=np.int16)


def measure(decode, reset, calls_for) -> dict:
    """Latency per chunk size over a stream that carries the state; first 2-frame chunk after a reset."""
    reset()
    decode(codes(2, 1))  # warm-up: CUDA context, kernels, allocator
    reset()
    began = time.perf_counter()
    decode(codes(2, 2))
    result = {"first_chunk_2_frames_ms": round((time.perf_counter() - began) * 1000, 3), "chunks": {}}
    for chunk in CHUNKS:
        calls = calls_for(chunk)
        stream = codes(chunk * (calls + 2), 3)
        reset()
        decode(stream[:chunk])
        times = []
        for index in range(1, calls + 1):
            began = time.perf_counter()
            decode(stream[index * chunk : (index + 1) * chunk])
            times.append(time.perf_counter() - began)
        median = float(np.median(times))
        result["chunks"][str(chunk)] = {
            "calls": calls,
            "median_ms": round(median * 1000, 3),
            "p90_ms": round(float(np.percentile(times, 90)) * 1000, 3),
            "rtf": round(median / (chunk * FRAME_SECONDS), 5),
        }
    return result


def streamed(decode, reset, all_codes: np.ndarray) -> np.ndarray:
    from codecstream.protocol.chunking import ChunkSchedule

    reset()
    pieces, start = [], 0
    for size in ChunkSchedule().split(len(all_codes)):
        pieces.append(decode(all_codes[start : start + size]))
        start += size
    return np.concatenate(pieces)


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


def peak_memory_mb(cuda: bool) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--calls", type=int, default=50, help="timed calls per chunk size")
    parser.add_argument("--preset", default="real", help="checkpoint preset (tiny: a quick smoke run)")
    args = parser.parse_args()

    import torch
    from codecstream.client.runtimes import open_decoder
    from codecstream.decoder import StatefulDecoder, load_decoder
    from codecstream.decoder.random_checkpoint import write_speech_tokenizer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    checkpoint = write_speech_tokenizer(pathlib.Path(tempfile.mkdtemp()) / args.preset, preset=args.preset, seed=0)
    began = time.perf_counter()
    decoder = open_decoder(checkpoint, backend="torch")
    load_s = time.perf_counter() - began
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    parity_codes = codes(PARITY_FRAMES, 9)
    with torch.inference_mode():
        model = load_decoder(checkpoint).to(device)
        reference = model(torch.from_numpy(parity_codes.astype(np.int64))[None].to(device))[0].float().cpu().numpy()

    rows = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    fp32 = measure(decoder.decode, decoder.reset, lambda chunk: args.calls)
    fp32.update(
        backend="eager torch fp32 (open_decoder, backend='torch')",
        description=decoder.description,
        load_s=round(load_s, 3),
        peak_gpu_memory_mb=peak_memory_mb(cuda),
        parity_snr_db=round(snr_db(reference, streamed(decoder.decode, decoder.reset, parity_codes)), 2),
    )
    rows.append(fp32)

    bf16_model = copy.deepcopy(model).to(torch.bfloat16)

    class OnDevice(StatefulDecoder):
        def codes_tensor(self, values):
            return super().codes_tensor(values).to(device)

    bf16 = OnDevice(bf16_model)

    def bf16_decode(values):
        return bf16.decode_tensor(values).float().cpu().numpy()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    row = measure(bf16_decode, bf16.reset, lambda chunk: args.calls)
    row.update(
        backend="eager torch bf16 (codecstream.decoder StatefulDecoder, bf16 copy)",
        peak_gpu_memory_mb=peak_memory_mb(cuda),
        parity_snr_db=round(snr_db(reference, streamed(bf16_decode, bf16.reset, parity_codes)), 2),
    )
    rows.append(row)

    gpu = torch.cuda.get_device_properties(0) if cuda else None
    results = {
        "benchmark": "cuda_decode_bench",
        "mode": "stateful",
        "decoder": f"random weights (codecstream.decoder.random_checkpoint preset={args.preset} seed=0)",
        "machine": {
            "gpu": gpu.name if gpu else None,
            "gpu_memory_gb": round(gpu.total_memory / 1e9, 1) if gpu else None,
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()},
        "parity_reference": f"fp32 full-utterance decode on the same GPU, TF32 off, {PARITY_FRAMES} frames, "
        "chunks 2-4-8-16-25",
        "onnxruntime_cuda": onnxruntime_note(),
        "command": shlex.join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "backends": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
