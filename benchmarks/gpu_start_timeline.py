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
`@N` after the path for the N-th (1-based). Writes benchmarks/results/gpu_start_timeline.json and a PNG.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", action="append", required=True, metavar="LABEL=LOG[@N]:SECONDS")
    parser.add_argument("--device", required=True, help="the GPU the starts ran on, in words")
    parser.add_argument("--note", default="", help="what differed between the starts")
    parser.add_argument("--out", default="gpu_start_timeline")
    args = parser.parse_args()
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
