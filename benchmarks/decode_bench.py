"""Decoder cost and parity at real size on this machine: not a unit test, a measurement to record.

    .venv/bin/python benchmarks/decode_bench.py            # ~25 minutes on 2 quiet cores (modes + backends)
    .venv/bin/python benchmarks/decode_bench.py --quick    # a smoke run, a minute or two

Builds (once, under .cache/) a real-size random-weight speech_tokenizer/ directory (114.3 M
parameters, "mild" and "stressed" inits), then measures, each in its own process so that peak
RSS belongs to one mode:
  - full: one forward over the whole utterance (the ground truth), and vLLM-Omni's reference decoder
    on the same codes and weights when vllm_omni is importable (parity of the full decode);
  - stateful, windowed (conv-split) and windowed-plain at chunk sizes C: ms per chunk (median, p90),
    RTF (median chunk time / chunk audio duration), first-chunk latency of a fresh stream (after a
    warm-up stream, as a client that warms its decoder at start-up sees it), peak RSS, and SNR /
    max abs error of the streamed audio against the full decode;
  - the very first 2-frame chunk of a cold process (no warm-up) for the stateful decoder;
  - the backend axis (`--backends`, default all): the stateful decoder as each client runtime runs
    it (eager torch, .pt2, .pte, .onnx and the quantized artifacts), exported from a real-size
    checkpoint under .cache/artifact_bench/ when missing: load time, first 2-frame chunk, RTF per
    C, artifact size, peak RSS, parity. The worker is benchmarks/artifact_bench.py's, which runs
    this axis alone.
Writes benchmarks/results/decode_bench.json (machine, threads, versions, exact command) and
decode_bench.png (RTF per mode against C) and decode_bench_backends.png (RTF per backend
against C, first 2-frame chunk per backend). Progress goes to stderr as it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import artifact_bench  # the backend axis's worker, beside this script
import numpy as np
from bench_record import machine, peak_rss_mb, random_codes, versions, write_record
from codecstream.protocol.decoding import FRAME_SECONDS, SAMPLES_PER_FRAME
from codecstream.protocol.pcm import snr_db

REPO = Path(__file__).resolve().parents[1]
CHUNKS = (1, 2, 4, 8, 16, 25)
STREAM_MODES = ("stateful", "windowed", "windowed-plain")


def log(message: str) -> None:
    print(f"[decode_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parity(reference: np.ndarray, other: np.ndarray) -> dict:
    return {"snr_db": round(snr_db(reference, other), 2), "max_abs_error": float(np.max(np.abs(reference - other)))}


def cpu_pressure() -> float | None:
    """Share of the last 10 s in which runnable tasks waited for a CPU (other load on the machine)."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return float(first.split("avg10=")[1].split()[0])


def bench_codes(frames: int) -> np.ndarray:
    return random_codes(frames, 1234)


# -- workers: each runs in its own process and prints one JSON object on stdout ----------------------


def worker_full(args) -> dict:
    import torch
    from codecstream.decoder import decode_utterance, load_decoder

    model = load_decoder(args.checkpoint)
    codes = bench_codes(args.frames)
    decode_utterance(model, codes[:8])
    start = time.perf_counter()
    pcm = decode_utterance(model, codes)
    seconds = time.perf_counter() - start
    np.save(args.scratch / f"full-{args.init}.npy", pcm)
    result = {
        "frames": len(codes),
        "seconds": round(seconds, 3),
        "rtf": round(seconds / (len(codes) * FRAME_SECONDS), 4),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    try:
        reference = _reference_pcm(args.checkpoint, codes)
    except ImportError as err:
        result["reference"] = f"not measured: vllm_omni not importable ({err})"
    else:
        result["reference"] = {"implementation": f"vllm-omni {metadata.version('vllm-omni')} tokenizer_12hz"}
        result["reference"].update(parity(reference, pcm))
    del torch
    return result


def _reference_pcm(checkpoint: Path, codes: np.ndarray) -> np.ndarray:
    import torch
    from safetensors.torch import load_file
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import (
        configuration_qwen3_tts_tokenizer_v2 as configuration,
    )
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import modeling_qwen3_tts_tokenizer_v2 as modeling

    config = configuration.Qwen3TTSTokenizerV2Config.from_pretrained(str(checkpoint)).decoder_config
    model = modeling.Qwen3TTSTokenizerV2Decoder._from_config(config).eval()
    weights = load_file(str(checkpoint / "model.safetensors"))
    model.load_state_dict({name.removeprefix("decoder."): t for name, t in weights.items()}, strict=True)
    with torch.inference_mode():
        return model(torch.from_numpy(codes.astype(np.int64)).T.unsqueeze(0))[0, 0].numpy()


def worker_stream(args) -> dict:
    from codecstream.decoder import load_decoder, make_frame_decoder

    model = load_decoder(args.checkpoint)
    full = np.load(args.scratch / f"full-{args.init}.npy")
    codes = bench_codes(args.frames)
    decoder = make_frame_decoder(model, args.mode)
    cold = None
    if args.mode == "stateful":
        start = time.perf_counter()
        decoder.decode(codes[:2])
        cold = round((time.perf_counter() - start) * 1000, 1)
        decoder.reset()
    # Windowed decoders are timed with a full 72-frame window (primed, as mid-utterance); the
    # stateful decoder's cost does not depend on the position, so it streams from frame 0.
    context = 0 if args.mode == "stateful" else model.config.sliding_window
    results = {}
    for chunk in args.chunks:
        frames = min(len(codes) - context, max(chunk * args.min_calls, args.mode_frames))
        frames -= frames % chunk
        for warm in range(0, 4 * chunk, chunk):  # warm-up stream: shapes, allocator, caches
            decoder.decode(codes[warm : warm + chunk])
        decoder.reset()
        start = time.perf_counter()
        decoder.decode(codes[:chunk])
        first = time.perf_counter() - start
        decoder.reset()
        decoder.prime(codes[:context])
        times, pieces = [], []
        for begin in range(context, context + frames, chunk):
            start = time.perf_counter()
            pieces.append(decoder.decode(codes[begin : begin + chunk]))
            times.append(time.perf_counter() - start)
        decoder.reset()
        median = float(np.median(times))
        streamed = np.concatenate(pieces)
        decoded = frames * SAMPLES_PER_FRAME
        results[str(chunk)] = {
            "frames": frames,
            "calls": len(times),
            "ms_per_chunk_median": round(median * 1000, 2),
            "ms_per_chunk_p90": round(float(np.percentile(times, 90)) * 1000, 2),
            "ms_per_chunk_min": round(min(times) * 1000, 2),
            "rtf": round(median / (chunk * FRAME_SECONDS), 4),
            "rtf_best_call": round(min(times) / (chunk * FRAME_SECONDS), 4),
            "first_chunk_ms": round(first * 1000, 1),
            "cpu_pressure_avg10_after": cpu_pressure(),
            **{f"vs_full_{k}": v for k, v in parity(full[context * SAMPLES_PER_FRAME :][:decoded], streamed).items()},
        }
        log(f"  {args.init} {args.mode} C={chunk}: {results[str(chunk)]}")
    out = {
        "chunks": results,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "machine_speed_after": artifact_bench.machine_speed(),
    }
    if cold is not None:
        out["cold_process_first_2_frame_chunk_ms"] = cold
    return out


def worker_parity(args) -> dict:
    """Stateful parity over the whole utterance for a chunking (the last size repeats)."""
    from codecstream.decoder import StatefulDecoder, load_decoder

    model = load_decoder(args.checkpoint)
    full = np.load(args.scratch / f"full-{args.init}.npy")
    codes = bench_codes(args.frames)
    decoder = StatefulDecoder(model)
    sizes, pieces, begin = list(args.chunks), [], 0
    while begin < len(codes):
        size = sizes[min(len(pieces), len(sizes) - 1)]
        pieces.append(decoder.decode(codes[begin : begin + size]))
        begin += size
    return {"chunks": sizes, "frames": len(codes), **parity(full, np.concatenate(pieces))}


WORKERS = {"full": worker_full, "stream": worker_stream, "parity": worker_parity}


# -- driver -------------------------------------------------------------------------------------------


def ensure_checkpoint(cache: Path, init: str) -> Path:
    from codecstream.testing.random_speech_tokenizer import write_speech_tokenizer

    directory = cache / f"real-seed0-{init}"
    if not (directory / "model.safetensors").exists():
        log(f"writing a real-size random checkpoint ({init}) to {directory}")
        write_speech_tokenizer(directory, preset="real", seed=0, init=init)
    return directory


def run_worker(kind: str, base: list[str], **options) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, *base]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        command += [flag, *map(str, value)] if isinstance(value, (list, tuple)) else [flag, str(value)]
    completed = subprocess.run(command, stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for mode in STREAM_MODES:
        chunks = results["modes"].get(mode, {}).get("chunks", {})
        if chunks:
            sizes = sorted(int(c) for c in chunks)
            axis.plot(sizes, [chunks[str(c)]["rtf"] for c in sizes], marker="o", label=mode)
    full_rtf = results["modes"]["full"]["rtf"]
    axis.axhline(full_rtf, color="grey", linestyle=":", label=f"full utterance ({full_rtf:.2f})")
    axis.axhline(0.6, color="red", linestyle="--", label="target stateful RTF 0.6")
    axis.axhline(1.0, color="black", linewidth=0.8, label="real time")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xticks(CHUNKS, [str(c) for c in CHUNKS])
    axis.set_xlabel(f"chunk size C (frames of {FRAME_SECONDS * 1000:g} ms)")
    axis.set_ylabel("RTF (decode time / audio time)")
    axis.set_title(f"Qwen3-TTS 12 Hz decoder, real size, eager fp32, {results['threads']} threads\n"
                   f"{results['machine']['cpu_model']}", fontsize=9)  # fmt: skip
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def write_plots(results: dict, out: Path) -> None:
    if "full" in results["modes"]:
        plot(results, out.with_suffix(".png"))
    if results.get("backends"):
        artifact_bench.plot(results, out.with_name(out.stem + "_backends.png"))


def measure_backend(name: str, args) -> dict:
    """One client runtime in a fresh process, on artifacts exported once under .cache/artifact_bench/."""
    artifact_bench.CACHE.mkdir(parents=True, exist_ok=True)
    checkpoint = artifact_bench.ensure_checkpoint()
    reference = artifact_bench.ensure_reference(checkpoint)
    source, export_s = artifact_bench.ensure_artifact(checkpoint, name, max(args.chunks))
    row = artifact_bench.run_worker(name, source, reference, args)
    row["artifact_mb"] = artifact_bench.artifact_size_mb(source, name)
    row["cpu_pressure_avg10_after"] = cpu_pressure()
    row["machine_speed_after"] = artifact_bench.machine_speed()
    artifact_bench.add_floor_fractions(
        row, artifact_bench.work_per_call(checkpoint, tuple(args.chunks)), row["machine_speed_after"]
    )
    if export_s is not None:
        row["export_s"] = export_s
    return row


def drive(args) -> None:
    cache = REPO / ".cache" / "decode_bench"
    scratch = cache / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results = {
        "benchmark": "decode_bench",
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "threads": args.threads,
        "machine": machine(),
        "machine_speed_at_start": artifact_bench.machine_speed(),
        "versions": versions("torch", "numpy", "safetensors", "codecstream-decoder", "vllm-omni", "transformers"),
        "precision": "fp32, eager PyTorch",
        "checkpoint": "random weights, real size (114.3 M parameters), seed 0; codes uniform random, seed 1234",
        "notes": [
            f"RTF = median ms per chunk / (C x {FRAME_SECONDS * 1000:g} ms); first_chunk_ms = first decode of a "
            "fresh stream after one warm-up stream in the same process; cold_process_first_2_frame_chunk_ms has no "
            "warm-up.",
            "Windowed modes are timed mid-utterance (72 frames of context primed first); the stateful decoder "
            "streams from frame 0 (its cost does not depend on the position).",
            "Each mode runs in its own process; peak_rss_mb is that process's peak (model + derived tables + "
            "activations).",
            "cpu_pressure_avg10_after is /proc/pressure/cpu 'some avg10' (percent of time tasks waited for a CPU) "
            "right after a timing: other processes on this shared 2-core machine; high values mean inflated times.",
            "machine_speed* is fp32 GEMM GFLOP/s and memory read GB/s measured beside the timings: the host's other "
            "tenants slow these cores without showing in the load average; rtf_best_call uses the fastest call.",
            "vs_full_* compares the streamed audio with one full-utterance forward over the same frames; "
            "stateful_over_utterance decodes the whole utterance with the given chunking (last size repeats).",
            "backends: the stateful decoder through each client runtime (codecstream.client.runtimes.open_decoder), "
            "timed over a stream of calls that carries the state; rtf per C as above, first_chunk_2_frames_ms the "
            "median of 10 fresh streams' first 2-frame call, parity_snr_db against the fp32 full decode over "
            "100 frames streamed in the 2,4,8,16,25 ramp; "
            "median_cpu_ms counts all threads' CPU time per call (not inflated by other processes).",
        ],
        "modes": {},
        "parity": {},
        "complete": False,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        # After every step, so that a run cut short still leaves what it measured.
        results["wall_seconds"] = round(time.time() - started, 1)
        write_record(results, out)
        write_plots(results, out)

    def bases(init: str) -> list[str]:
        checkpoint = ensure_checkpoint(cache, init)
        return ["--checkpoint", str(checkpoint), "--scratch", str(scratch), "--init", init,
                "--threads", str(args.threads), "--frames", str(args.frames)]  # fmt: skip

    def parity_of(measured: dict) -> dict:
        return {
            c: {"frames": m["frames"], **{k.removeprefix("vs_full_"): v for k, v in m.items() if "vs_full_" in k}}
            for c, m in measured["chunks"].items()
        }

    def full_step(init: str) -> None:
        log(f"{init}: full-utterance decode of {args.frames} frames (+ the vLLM-Omni reference if importable)")
        full = run_worker("full", bases(init))
        log(f"{init}: full {full}")
        results["parity"].setdefault(init, {})["full_vs_reference"] = full.get("reference")
        if init == "mild":
            results["modes"]["full"] = {key: full[key] for key in ("frames", "seconds", "rtf", "peak_rss_mb")}

    def stream_step(init: str, mode: str, chunks: list[int]) -> None:
        frames = {"stateful": args.stateful_frames, "windowed": args.windowed_frames, "windowed-plain": 0}[mode]
        min_calls = args.plain_calls if mode == "windowed-plain" else args.min_calls
        log(f"{init}: {mode} at C={chunks}")
        measured = run_worker("stream", bases(init), mode=mode, chunks=chunks, mode_frames=frames,
                              min_calls=min_calls)  # fmt: skip
        if init == "mild":
            results["modes"][mode] = measured
        results["parity"][init][mode] = parity_of(measured)

    def utterance_step(init: str, chunkings: list[list[int]]) -> None:
        block = results["parity"][init].setdefault("stateful_over_utterance", [])
        for sizes in chunkings:
            measured = run_worker("parity", bases(init), chunks=sizes)
            block.append(measured)
            log(f"{init}: stateful over the utterance {measured}")

    def backend_step(name: str) -> None:
        log(f"backend {name}: exporting if needed, then measuring (load average {os.getloadavg()[0]:.2f})")
        row = measure_backend(name, args)
        results.setdefault("backends", []).append(row)
        log(f"backend {name}: {row}")

    # In order of importance, so that a run on a busy machine records the essentials first; the
    # stressed init is there for parity (the window's error), the mild one for timings too.
    ramps = [[1, 2, 4, 8, 16, 25], [2, 4, 8, 16, 25]]
    steps = [
        lambda: full_step("mild"),
        lambda: stream_step("mild", "stateful", list(args.chunks)),
        lambda: utterance_step("mild", ramps),
        lambda: full_step("stressed"),
        lambda: utterance_step("stressed", ramps[1:]),
        lambda: stream_step("stressed", "windowed", [max(args.chunks)]),
        lambda: stream_step("mild", "windowed", list(args.chunks)),
        lambda: stream_step("mild", "windowed-plain", list(args.chunks)),
    ]
    if "stressed" not in args.inits:
        steps = [steps[0], steps[1], steps[2], steps[6], steps[7]]
    steps += [lambda name=name: backend_step(name) for name in args.backends]
    for step in steps:
        step()
        save()
    results["complete"] = True
    save()
    log(f"wrote {out} and {out.with_suffix('.png')} in {results['wall_seconds']} s")


def remeasure(args) -> None:
    """Measure one streaming mode (mild init) or the backend axis again, replacing it in an existing record.

    For a run whose timings were disturbed by other load on the machine: the command is added
    to the file's `commands`, so the record says which numbers came from which run.
    """
    out = Path(args.out)
    if not out.is_file():
        sys.exit(f"decode_bench: {out} does not exist; --remeasure updates a record, run the full benchmark first")
    results = json.loads(out.read_text())
    if args.remeasure == "backends":
        remeasure_backends(args, results)
    else:
        remeasure_mode(args, results)
    results.setdefault("commands", [results["command"]]).append(
        " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
        + f"  # {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, load average {list(os.getloadavg())}"
    )
    write_record(results, out)
    write_plots(results, out)
    log(f"updated {out}")


def remeasure_backends(args, results: dict) -> None:
    rows = {row["backend"]: row for row in results.get("backends", [])}
    for name in args.backends:
        log(f"re-measuring backend {name} (load average {os.getloadavg()[0]:.2f})")
        rows[name] = measure_backend(name, args)
        log(f"backend {name}: {rows[name]}")
    results["backends"] = list(rows.values())


def remeasure_mode(args, results: dict) -> None:
    cache = REPO / ".cache" / "decode_bench"
    checkpoint = ensure_checkpoint(cache, "mild")
    base = ["--checkpoint", str(checkpoint), "--scratch", str(cache / "scratch"), "--init", "mild",
            "--threads", str(args.threads), "--frames", str(args.frames)]  # fmt: skip
    frames = {"stateful": args.stateful_frames, "windowed": args.windowed_frames, "windowed-plain": 0}[args.remeasure]
    min_calls = args.plain_calls if args.remeasure == "windowed-plain" else args.min_calls
    log(f"re-measuring {args.remeasure} at C={args.chunks}")
    measured = run_worker("stream", base, mode=args.remeasure, chunks=args.chunks, mode_frames=frames,
                          min_calls=min_calls)  # fmt: skip
    previous = results["modes"].get(args.remeasure, {"chunks": {}})
    previous["chunks"].update(measured["chunks"])
    previous["peak_rss_mb"] = max(previous.get("peak_rss_mb", 0), measured["peak_rss_mb"])
    previous["machine_speed_after"] = measured["machine_speed_after"]
    if "cold_process_first_2_frame_chunk_ms" in measured:
        previous["cold_process_first_2_frame_chunk_ms"] = measured["cold_process_first_2_frame_chunk_ms"]
    results["modes"][args.remeasure] = previous


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunks", type=int, nargs="+", default=list(CHUNKS))
    parser.add_argument("--inits", nargs="+", default=["mild", "stressed"], choices=["mild", "stressed"])
    parser.add_argument("--frames", type=int, default=600, help="utterance length for the parity measurements")
    parser.add_argument("--stateful-frames", type=int, default=48, help="at least this many frames per timing")
    parser.add_argument("--windowed-frames", type=int, default=48)
    parser.add_argument("--min-calls", type=int, default=24, help="at least this many chunks per timing")
    parser.add_argument("--plain-calls", type=int, default=6)
    parser.add_argument(
        "--backends",
        type=lambda text: [] if text == "none" else text.split(","),
        default=list(artifact_bench.BACKENDS),
        help="comma-separated client runtimes for the backend axis, or 'none' (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="a short run to check the script")
    parser.add_argument(
        "--remeasure",
        choices=[*STREAM_MODES, "backends"],
        help="time one mode (or the --backends) again into the existing --out file",
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "decode_bench.json"))
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--init", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--mode-frames", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = sorted(set(args.backends) - set(artifact_bench.BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(artifact_bench.BACKENDS)}")

    import torch

    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return
    if args.remeasure:
        remeasure(args)
        return
    if args.quick:
        args.frames, args.stateful_frames, args.windowed_frames, args.min_calls, args.plain_calls = 120, 8, 8, 4, 2
        args.chunks, args.inits, args.backends = [2, 8], ["mild"], ["eager"]
        args.out = str(REPO / ".cache" / "decode_bench" / "quick.json")
    drive(args)


if __name__ == "__main__":
    main()
