"""Where an engine start's seconds go, from the server's own log: one bar per start, one segment per phase.

A start of `codecstream-server --model` on a GPU runs, in order: the server process's imports and
text tokenizers, vLLM-Omni's orchestrator spawning the stage's engine process (its imports), the
model load, vLLM's torch.compile (or the AOT load of a cached one), its JIT kernel warm-up, CUDA
graph capture, vLLM-Omni's code-predictor warm-up and talker-MTP graphs, the rest of the engine's
init, the orchestrator's hand-shake, then codecstream's warm-up requests. Each phase is read from
the log line that ends it (vLLM's lines carry whole seconds, codecstream's milliseconds), so the
phases add up to the start. Run the server with its log kept, then:

    .venv/bin/python benchmarks/gpu_start_timeline.py --device "NVIDIA H100 80GB HBM3" \\
        --start "0.6b cold=logs/start1.log:150.5" --start "0.6b warm=logs/start2.log:76.8"

`LABEL=LOG:SECONDS`: SECONDS is the wall time from process start to serving as measured outside the
server (the lane's start_to_serving_s, or a shell's clock), which puts the process's start on the
log's time line. A log that holds several starts (an engine restart) is read at its first; add
`@N` after the path for the N-th (1-based).

Or let it run the three starts an operator meets, one server process after another, and read their logs:

    python3 benchmarks/gpu_start_timeline.py --device "NVIDIA H100 80GB HBM3" --run /tmp/ck17 --label 1.7b

cold: a new server with an empty engine cache (--engine-cache, emptied first; on a fresh host, its
first start); restart: that server's engine process killed, seconds from the kill to serving again;
warm: a new server with the cache the cold one filled. The servers' logs go to --log-dir.
Writes benchmarks/results/gpu_start_timeline.json and a PNG.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import shutil
import tempfile
import time

from bench_record import RESULTS, machine, write_record

_VLLM_TIME = re.compile(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) ")
_OWN_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
#: (phase it ends, the log line that ends it), in the order a start passes them.
MARKS = (
    ("server process: imports, tokenizers", "[AsyncOmni] Initializing with model"),
    ("engine process: spawn and imports", "Starting to load model"),
    ("model load", "Model loading took"),
    ("torch.compile (or its AOT load)", "torch.compile took"),
    ("profiling step, KV cache sizing (cold: first kernels compile)", "Available KV cache memory"),
    ("JIT kernel warm-up", "JIT kernel warmup finished"),
    ("CUDA graphs of the step", "Graph capturing finished"),
    ("code predictor: compile, talker-MTP graphs", "Captured talker_mtp graphs"),
    ("rest of the engine's init", "init engine (profile, create kv cache, warmup model)"),
    ("orchestrator hand-shake", "Orchestrator ready"),
    ("codecstream warm-up requests", "engine started in"),
)


def _time(line: str, year: int) -> datetime.datetime | None:
    own = _OWN_TIME.search(line)
    if own:
        return datetime.datetime.strptime(own[1], "%Y-%m-%d %H:%M:%S,%f")
    vllm = _VLLM_TIME.search(line)
    if vllm:
        return datetime.datetime.strptime(f"{year}-{vllm[1]}", "%Y-%m-%d %H:%M:%S")
    return None


def timeline(log_text: str, to_serving_s: float, nth: int = 1, year: int = 2026) -> dict[str, float]:
    """Seconds of each phase of the `nth` start in `log_text`; the first phase runs from the
    process's start (serving time minus `to_serving_s`)."""
    lines = log_text.splitlines()
    ends = [index for index, line in enumerate(lines) if "engine started in" in line]
    if len(ends) < nth:
        raise SystemExit(f"the log holds {len(ends)} engine starts, not {nth}")
    last = ends[nth - 1]
    first = ends[nth - 2] + 1 if nth > 1 else 0
    window = lines[first : last + 1]
    serving = _time(window[-1], year)
    previous = serving - datetime.timedelta(seconds=to_serving_s)
    phases = {}
    for phase, mark in MARKS:
        found = next((line for line in window if mark in line), None)
        at = _time(found, year) if found else None
        if at is None:
            continue
        phases[phase] = round(max(0.0, (at - previous).total_seconds()), 2)
        previous = max(previous, at)
    phases["reported as serving"] = round(max(0.0, to_serving_s - sum(phases.values())), 2)
    return phases


#: The longest a start or a restart may take before the run gives up (a cold 1.7B start took 387 s once).
START_TIMEOUT_S = 900.0


def run_starts(checkpoint: pathlib.Path, label: str, log_dir: pathlib.Path, cache: pathlib.Path) -> list[str]:
    """A cold start, its engine killed and restarted, then a warm start: their --start specs."""
    import grpc
    from codecstream.testing.server_process import SERVING, ServerProcess
    from codecstream.testing.waiting import wait_for

    shutil.rmtree(cache, ignore_errors=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    arguments = ["--model", str(checkpoint), "--engine-cache", str(cache)]
    cold_log, warm_log = log_dir / f"start_{label}_cold.log", log_dir / f"start_{label}_warm.log"

    def serving(server: ServerProcess) -> bool:
        try:
            return server.health(timeout_s=1) == SERVING
        except grpc.RpcError:  # no answer while it restarts is as good as not serving
            return False

    with ServerProcess(arguments, log=cold_log) as server:
        cold_s = server.wait_until_serving(START_TIMEOUT_S)
        print(f"{label} cold: serving {cold_s:.1f} s after its start", flush=True)
        cores = server.engine_cores()
        if not cores:
            raise SystemExit("no engine process found to kill")
        for core in cores:
            core.kill()
        killed_at = time.monotonic()
        wait_for(lambda: not serving(server), 60, "not serving after the engine's kill")
        wait_for(lambda: serving(server), START_TIMEOUT_S, "serving again after the engine's kill")
        restart_s = time.monotonic() - killed_at
        print(f"{label} restart: serving again {restart_s:.1f} s after the kill", flush=True)
    with ServerProcess(arguments, log=warm_log) as server:
        warm_s = server.wait_until_serving(START_TIMEOUT_S)
        print(f"{label} warm: serving {warm_s:.1f} s after its start", flush=True)
    return [
        f"{label} cold={cold_log}:{cold_s:.1f}",
        f"{label} restart={cold_log}@2:{restart_s:.1f}",
        f"{label} warm={warm_log}:{warm_s:.1f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", action="append", default=[], metavar="LABEL=LOG[@N]:SECONDS")
    parser.add_argument("--run", type=pathlib.Path, metavar="CHECKPOINT", help="run cold, restart and warm starts")
    parser.add_argument("--label", default="", help="--run: the starts' label prefix (the checkpoint's shape)")
    parser.add_argument("--log-dir", type=pathlib.Path, help="--run: the servers' logs (default: a new temp folder)")
    parser.add_argument("--engine-cache", type=pathlib.Path, help="--run: the engine cache (emptied first)")
    parser.add_argument("--device", required=True, help="the GPU the starts ran on, in words")
    parser.add_argument("--note", default="", help="what differed between the starts")
    parser.add_argument("--out", default="gpu_start_timeline")
    args = parser.parse_args()
    if not args.start and not args.run:
        parser.error("give --start LABEL=LOG:SECONDS or --run CHECKPOINT")
    if args.run:
        cache = args.engine_cache or pathlib.Path(tempfile.mkdtemp(prefix="codecstream-engine-cache-"))
        log_dir = args.log_dir or pathlib.Path(tempfile.mkdtemp(prefix="gpu_start_timeline-"))
        print(f"the servers' logs: {log_dir}", flush=True)
        args.start += run_starts(args.run, args.label or args.run.name, log_dir, cache)
    starts = {}
    for spec in args.start:
        label, _, rest = spec.partition("=")
        path, _, seconds = rest.rpartition(":")
        path, _, nth = path.partition("@")
        with open(path) as log:
            starts[label] = {
                "to_serving_s": float(seconds),
                "phases_s": timeline(log.read(), float(seconds), int(nth or 1)),
            }
    record = {"benchmark": "gpu_start_timeline", "device": args.device, "note": args.note, "machine": machine()}
    record["starts"] = starts
    write_record(record, RESULTS / f"{args.out}.json", plot=lambda record, path: plot(starts, args.device, path))
    for label, start in starts.items():
        print(f"{label}: {start['to_serving_s']:.1f} s", json.dumps(start["phases_s"]))


def plot(starts: dict, device: str, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = [phase for phase, _ in MARKS] + ["reported as serving"]
    figure, axis = plt.subplots(figsize=(10, 1.2 + 0.6 * len(starts)))
    colors = plt.get_cmap("tab20").colors
    for row, start in enumerate(starts.values()):
        left = 0.0
        for index, phase in enumerate(phases):
            seconds = start["phases_s"].get(phase, 0.0)
            axis.barh(row, seconds, left=left, color=colors[index % len(colors)], label=phase if row == 0 else None)
            left += seconds
        axis.text(left + 2, row, f"{left:.0f} s", va="center")
    axis.set_yticks(range(len(starts)), list(starts))
    axis.invert_yaxis()
    axis.set_xlabel("seconds from process start to serving")
    axis.set_title(f"codecstream-server start on {device}, by phase")
    axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
