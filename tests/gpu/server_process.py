"""`codecstream-server --model` started as an operator starts it: its own process, its engine in a child
process that can be killed, its log in a file, its health and metrics read from outside."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
#: In the title vLLM-Omni gives the stage's engine-core process (StageEngineCoreProc_stage0, with
#: vLLM's VLLM:: prefix where it sets one).
ENGINE_CORE = "EngineCore"


class ServerFailed(AssertionError):
    """The server exited or did not serve in time; the message ends with its log's tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout_s: float, what: str, step_s: float = 0.05) -> float:
    """Seconds until `predicate()` held; AssertionError naming `what` after `timeout_s`."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not reached within {timeout_s:g} s")
        time.sleep(step_s)
    return time.monotonic() - started


class ServerProcess:
    def __init__(
        self, checkpoint: pathlib.Path, deploy_config: pathlib.Path, log_path: pathlib.Path, workdir: pathlib.Path
    ) -> None:
        self.log_path = log_path
        self.port_file = workdir / "port"
        self.metrics_port = free_port()
        command = [
            sys.executable, "-m", "codecstream.server.cli", "--model", str(checkpoint),
            "--deploy-config", str(deploy_config), "--port", "0", "--port-file", str(self.port_file),
            "--metrics-port", str(self.metrics_port),
            # The lane is one client that fills the engine's batch on purpose (64 streams at once).
            "--max-engine-requests-per-client", "0", "--max-streams-per-client", "0",
        ]  # fmt: skip
        self.command = " ".join(command)
        self._log = log_path.open("w")
        self.started_at = time.monotonic()
        # The environment as it is: on a GPU host the stack comes from a target folder on PYTHONPATH.
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.target = ""
        self.start_s = 0.0

    def wait_until_serving(self, timeout_s: float) -> float:
        """Seconds from the process start until it serves: the CLI writes the port file only then."""
        while not self.port_file.exists():
            if self.process.poll() is not None:
                raise ServerFailed(f"the server exited with status {self.process.returncode}\n{self.log_tail()}")
            if time.monotonic() - self.started_at > timeout_s:
                raise ServerFailed(f"the server did not serve within {timeout_s:g} s\n{self.log_tail()}")
            time.sleep(0.2)
        self.start_s = time.monotonic() - self.started_at
        self.target = f"127.0.0.1:{self.port_file.read_text().strip()}"
        return self.start_s

    def health(self) -> int:
        with grpc.insecure_channel(self.target) as channel:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status

    def metric(self, sample: str, **labels: str) -> float:
        """One sample of the metrics endpoint, e.g. metric("codecstream_frames_after_stop_bucket", le="1.0");
        0 for a sample not yet exported (a labelled counter before its first event)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            for name, sample_labels, value, *_ in family.samples:
                if name == sample and sample_labels == labels:
                    return value
        return 0.0

    def engine_cores(self) -> list[psutil.Process]:
        found = []
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                title = child.name() + " " + " ".join(child.cmdline())
            except psutil.NoSuchProcess:
                continue
            if ENGINE_CORE in title:
                found.append(child)
        return found

    def log_tail(self, chars: int = 6000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout_s: float = 120) -> int | None:
        """SIGTERM (a graceful shutdown), SIGKILL after `timeout_s`; then no child of it is left."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
        _, alive = psutil.wait_procs(children, timeout=30)
        for child in alive:
            child.kill()
        self._log.close()
        return self.process.returncode
