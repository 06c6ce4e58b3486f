"""One codecstream-server per GPU of this host, started and kept running for `codecstream-balancer --gpus`.

Replica `gpuN` sees device N alone (CUDA_VISIBLE_DEVICES=N) and serves gRPC on 127.0.0.1 at the
first port plus its index, its metrics on the first metrics port plus its index; every replica gets
the same server arguments, so they share the engine cache (the default folder, or the one
`--engine-cache` names) and a restart starts warm. The balancer's health poll takes a replica that
dies out of nginx's pool and back in once it serves again; this module only restarts the process,
on the same ports, after a backoff that grows while it keeps dying soon after its start.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

log = logging.getLogger("codecstream.balancer")

#: Flags the supervisor sets for each replica itself; an operator's value would collide.
OWNED_FLAGS = ("--host", "--port", "--metrics-port", "--port-file")
_DEVICE = re.compile(r"[0-9]{1,3}")
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
#: A replica that ran this long before it died is restarted after the first backoff again.
STABLE_S = 60.0


class ReplicaSpecError(Exception):
    """`--gpus` or the server arguments cannot be used as given; the message is one line."""


def parse_gpus(text: str) -> tuple[str, ...]:
    """`all` (the devices nvidia-smi lists) or device indexes `0,1,...`, each once."""
    if text == "all":
        return visible_gpus()
    devices = tuple(part.strip() for part in text.split(","))
    if not all(_DEVICE.fullmatch(device) for device in devices):
        raise ReplicaSpecError(f"--gpus {text[:80]!r}: expected 'all' or device indexes such as 0,1")
    if len(set(devices)) != len(devices):
        raise ReplicaSpecError(f"--gpus {text[:80]!r}: every device once")
    return devices


def visible_gpus() -> tuple[str, ...]:
    """The indexes of the GPUs nvidia-smi lists ("GPU 0: NVIDIA H100 ... (UUID: ...)")."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise ReplicaSpecError("--gpus all: nvidia-smi not found; name the devices instead (--gpus 0,1)")
    listing = subprocess.run([binary, "--list-gpus"], capture_output=True, text=True, timeout=30)
    devices = tuple(re.findall(r"^GPU ([0-9]+):", listing.stdout, flags=re.MULTILINE))
    if listing.returncode != 0 or not devices:
        raise ReplicaSpecError(f"--gpus all: nvidia-smi --list-gpus found no GPU (status {listing.returncode})")
    return devices


def find_server(name: str) -> str:
    """The codecstream-server program: `name` on PATH, else beside this interpreter (a virtual
    environment's bin/, which need not be on PATH)."""
    found = shutil.which(name) or shutil.which(name, path=str(pathlib.Path(sys.executable).parent))
    if found is None:
        raise ReplicaSpecError(f"{name!r} not found: install codecstream-server, or name it with --server")
    return found


def check_server_args(args: list[str]) -> list[str]:
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            raise ReplicaSpecError(
                f"server argument {flag}: the balancer sets {', '.join(OWNED_FLAGS)} for each replica itself"
            )
    return args


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    """One replica: its name, the device it sees and its ports."""

    name: str
    device: str
    port: int
    metrics_port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def replica_specs(devices: tuple[str, ...], first_port: int, first_metrics_port: int) -> tuple[ReplicaSpec, ...]:
    return tuple(
        ReplicaSpec(f"gpu{device}", device, first_port + index, first_metrics_port + index)
        for index, device in enumerate(devices)
    )


@dataclasses.dataclass
class ReplicaState:
    """A replica's process, when it started, when it restarts (once it exited), and the wait
    before the restart after that."""

    spec: ReplicaSpec
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    backoff_s: float = FIRST_BACKOFF_S
    restarts: int = 0


class ReplicaSupervisor:
    """Starts every replica, restarts one whose process exited (`check`, called on the balancer's
    poll), and stops them all. Each replica's output goes to `log_dir/NAME.log` (appended)."""

    def __init__(
        self, server: str, specs: tuple[ReplicaSpec, ...], server_args: list[str], log_dir: pathlib.Path
    ) -> None:
        self.server = server
        self.server_args = check_server_args(list(server_args))
        self.log_dir = log_dir
        self.replicas = {spec.name: ReplicaState(spec) for spec in specs}

    def command(self, spec: ReplicaSpec) -> list[str]:
        return [
            self.server, *self.server_args, "--host", "127.0.0.1", "--port", str(spec.port),
            "--metrics-port", str(spec.metrics_port),
        ]  # fmt: skip

    def start_all(self) -> None:
        for state in self.replicas.values():
            self._start(state)

    def _start(self, state: ReplicaState) -> None:
        spec = state.spec
        with open(self.log_dir / f"{spec.name}.log", "ab") as output:
            state.process = subprocess.Popen(
                self.command(spec),
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, "CUDA_VISIBLE_DEVICES": spec.device, "PYTHONUNBUFFERED": "1"},
                # A session of its own: a Ctrl-C at the balancer's terminal reaches the balancer,
                # which stops the replicas in order, and what a replica leaves behind can be found.
                start_new_session=True,
            )
        state.started_at = time.monotonic()
        state.restart_at = None
        log.info("replica %s: started (pid %d, device %s, %s)", spec.name, state.process.pid, spec.device, spec.address)

    def check(self) -> None:
        """Restart each replica whose process exited, once its backoff has passed."""
        now = time.monotonic()
        for state in self.replicas.values():
            if state.process is None or state.process.poll() is None:
                continue
            if state.restart_at is None:
                # What it started (vLLM's engine core) may outlive it, holding the GPU's memory
                # that its successor needs: its session goes with it.
                _kill_session(state.process)
                ran_s = now - state.started_at
                wait_s = FIRST_BACKOFF_S if ran_s >= STABLE_S else state.backoff_s
                state.restart_at = now + wait_s
                state.backoff_s = min(wait_s * 2, MAX_BACKOFF_S)
                log.warning(
                    "replica %s: exited with status %s after %.1f s; restarting in %.0f s (see %s)",
                    state.spec.name, state.process.returncode, ran_s, wait_s,
                    self.log_dir / f"{state.spec.name}.log",
                )  # fmt: skip
            elif now >= state.restart_at:
                state.restarts += 1
                self._start(state)

    def stop_all(self, timeout_s: float = 60.0) -> None:
        """SIGTERM to every replica (each drains as its flags say), SIGKILL to those still running
        after `timeout_s`."""
        running = [s.process for s in self.replicas.values() if s.process is not None and s.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            _kill_session(process)


def _kill_session(process: subprocess.Popen) -> None:
    """SIGKILL whatever is left of the session a replica leads (it was started as a session's leader)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
