"""What a phone app sees of a `.pte` on ExecuTorch's C++ runtime, measured here (issue 52).

Two views of codecstream's C++ runtime (client/.../runtimes/pte_runtime) on the real-size stateful
artifacts (fp32, and int8 when given):
- the command-line runner, C++ alone, as an app would link it: load, the first 2-frame chunk of a
  fresh stream (the program's first execution), steady per-call medians at C = 1...25 along a stream
  that carries its state, peak resident memory (`codecstream-pte-runner --json`);
- the Python client in a process that never imports torch (`--client-python`, a venv holding only
  `./protocol './client[executorch]'`): ready, from the interpreter's spawn to an open decoder
  (`open_decoder(warm_up=False)`) and to the first 2-frame chunk decoded, and the process's peak RSS.
  The first start has an empty client cache, so it builds the library and runs the program's trial
  in a child process (pte_trial.py); the later starts find both, as a user's later starts do.

    .venv/bin/python benchmarks/pte_cpp_runtime.py --client-python /work/venv52-client/bin/python

The artifacts are artifact_bench's (built under .cache/artifact_bench/ when missing). Writes
benchmarks/results/pte_cpp_runtime.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
from artifact_bench import ensure_artifact, ensure_checkpoint
from bench_record import RESULTS, machine, versions, write_record

READY_RUNS = 5
_READY_SCRIPT = """
import sys, time
import numpy as np
from codecstream.client.runtimes import open_decoder
decoder = open_decoder(sys.argv[1], backend="pte", threads=int(sys.argv[2]), warm_up=False)
opened = time.time()
decoder.decode(np.ones((2, 16), np.int64))
decoded = time.time()
with open("/proc/self/status") as status:
    peak = next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:"))
print(opened, decoded, peak, decoder.description, "torch" in sys.modules)
"""


def runner_record(runner: pathlib.Path, artifact: pathlib.Path, threads: int, calls: int) -> dict:
    command = [str(runner), str(artifact / "decoder.pte"), "--threads", str(threads), "--calls", str(calls), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return {"command": shlex.join(command), **json.loads(done.stdout)}


def client_ready(python: str, artifact: pathlib.Path, threads: int) -> dict:
    """Fresh interpreters of `python`, the client cache empty before the first."""
    runs = []
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "CODECSTREAM_CACHE_DIR": cache, "PYTHONWARNINGS": "ignore"}
        env.pop("PYTHONPATH", None)  # the client's own install, not this checkout's sources
        for _ in range(READY_RUNS):
            spawned = time.time()
            done = subprocess.run(
                [python, "-c", _READY_SCRIPT, str(artifact), str(threads)], capture_output=True, text=True, env=env
            )
            if done.returncode != 0:
                raise SystemExit(f"the client process failed: {done.stderr[-2000:]}")
            opened, decoded, peak, *description, torch_loaded = done.stdout.split()
            runs.append(
                {
                    "open_s": round(float(opened) - spawned, 3),
                    "first_chunk_decoded_s": round(float(decoded) - spawned, 3),
                    "peak_rss_mb": round(float(peak), 1),
                    "torch_imported": torch_loaded == "True",
                }
            )
    later = runs[1:]
    measures = ("open_s", "first_chunk_decoded_s", "peak_rss_mb")
    return {
        "python": python,
        "description": " ".join(description),
        "runs": runs,
        "first_start": runs[0],
        "later_starts_median": {key: float(np.median([run[key] for run in later])) for key in measures},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--backends", default="pte,pte-int8", help="artifact_bench backends of the .pte files")
    parser.add_argument("--client-python", help="a torch-free client venv's interpreter, for the ready time")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "pte_cpp_runtime.json")
    args = parser.parse_args()
    from codecstream.client.runtimes.pte_library import pte_runtime

    build = pte_runtime()
    checkpoint = ensure_checkpoint()
    load_before = os.getloadavg()[0]
    record: dict = {
        "benchmark": "pte_cpp_runtime",
        "decoder": "real-size random weights (preset real, seed 0), stateful",
        "threads": args.threads,
        "machine": machine(),
        "versions": versions("executorch", "numpy"),
        "command": shlex.join(["python", *sys.argv]),
        "runner": {},
        "client_ready": {},
    }
    for backend in args.backends.split(","):
        artifact, _ = ensure_artifact(checkpoint, backend, max_chunk=25)
        record["runner"][backend] = runner_record(build.runner, artifact, args.threads, args.calls)
        print(f"[pte_cpp_runtime] runner {backend}: {record['runner'][backend]}", file=sys.stderr, flush=True)
        if args.client_python:
            record["client_ready"][backend] = client_ready(args.client_python, artifact, args.threads)
            print(f"[pte_cpp_runtime] client {backend}: {record['client_ready'][backend]}", file=sys.stderr)
    record["load_average_before_after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    write_record(record, args.out)
    print(f"[pte_cpp_runtime] wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
