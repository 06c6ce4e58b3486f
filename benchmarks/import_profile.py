"""Where a start's import seconds go: `python -X importtime` of what each of the server's two processes
imports before it can work, summed per top-level package, plus the time to a first CUDA tensor.

The start timeline (gpu_start_timeline.py) shows ~23 s of "server process: imports, tokenizers" and
~28 s of "engine process: spawn and imports" on an H100 host with warm caches; this names the packages
those seconds belong to. Each set is imported twice in fresh interpreters and the second is kept (the
first fills the page cache and writes any missing .pyc).

    python benchmarks/import_profile.py --out /tmp/import_profile.json
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import platform
import subprocess
import sys
import time

from bench_record import machine, write_record

#: What each process imports before its first useful work (talker_source._create_engine; the engine's
#: spawned stage process and the talker model it loads).
IMPORT_SETS = {
    "server process": [
        "grpc",
        "transformers",
        "vllm_omni",
        "vllm_omni.entrypoints.async_omni",
        "codecstream.server.app",
    ],
    "engine process": [
        "vllm_omni.engine.stage_engine_core_proc",
        "vllm.v1.engine.core",
        "vllm.v1.worker.gpu_model_runner",
        "codecstream.server.engine.talker_model",
    ],
}
CUDA_PROBE = (
    "import time; import torch; began = time.perf_counter(); torch.zeros(1, device='cuda'); "
    "torch.cuda.synchronize(); print(time.perf_counter() - began)"
)


def profile(modules: list[str]) -> dict:
    """Wall seconds of the imports and the seconds each top-level package's own modules took."""
    code = "; ".join(f"import {module}" for module in modules)
    for _ in range(2):
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True)
        wall_s = time.perf_counter() - began
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else "failed"}
    # Each module's own time (-X importtime's "self"), summed over the top-level package it belongs to:
    # cumulative times would credit torch's seconds to whichever package happened to import it first.
    per_package: collections.Counter[str] = collections.Counter()
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        self_us, _, name = line.removeprefix("import time:").split("|")
        if self_us.strip().isdigit():
            per_package[name.strip().split(".")[0]] += int(self_us) / 1e6
    return {
        "wall_s": round(wall_s, 2),
        "per_package_s": {name: round(seconds, 2) for name, seconds in per_package.most_common(25)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    record = {"benchmark": "import_profile", "machine": machine(), "python": platform.python_version()}
    record["imports"] = {process: profile(modules) for process, modules in IMPORT_SETS.items()}
    for process, found in record["imports"].items():
        print(process, json.dumps(found), flush=True)
    cuda = subprocess.run([sys.executable, "-c", CUDA_PROBE], capture_output=True, text=True)
    record["first_cuda_tensor_s"] = float(cuda.stdout.strip()) if cuda.returncode == 0 else None
    print("first CUDA tensor (s):", record["first_cuda_tensor_s"])
    write_record(record, args.out)


if __name__ == "__main__":
    main()
