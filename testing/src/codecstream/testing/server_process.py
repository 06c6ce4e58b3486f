"""`codecstream-server` in a process of its own, as an operator runs it, for tests and benchmarks.

server = ServerProcess(["--replay", "codes.npy"])
server.wait_until_serving(60)     # seconds from the process's start until it served
server.target                     # "127.0.0.1:PORT"
server.health()                   # SERVING, NOT_SERVING (grpc.RpcError where nothing answers)
server.metric("codecstream_streams_active")
code = server.stop()              # SIGTERM, then SIGKILL; no child of it left
server.output(), server.errors()  # what it wrote to stdout and to stderr
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVER = [sys.executable, "-m", "codecstream.server.cli"]
#: In the title vLLM-Omni gives the stage's engine-core process (StageEngineCoreProc_stage0, with
#: vLLM's VLLM:: prefix where it sets one).
ENGINE_CORE = "EngineCore"


class ServerFailed(AssertionError):
    """The server exited or did not serve in time; the message ends with its output's tail."""


def free_port() -> int:
    """A loopback port nobody listens on now (whoever is given it binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """`codecstream-server ARGS --port PORT --port-file … --metrics-port …`, started at once; it serves
    once `wait_until_serving` returns (the CLI writes its port file only then: after an engine's start).

    `log`: one file for both of its streams (kept); without it stdout and stderr go to files of a
    folder of its own. `port`: 0 for any free one. `cpus`: the cores it and every process it starts
    may run on."""

    def __init__(
        self,
        args: Iterable[str],
        *,
        log: pathlib.Path | None = None,
        port: int = 0,
        cpus: set[int] | None = None,
    ) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="codecstream-server-")
        folder = pathlib.Path(self._folder.name)
        self.port_file = folder / "port"
        self.metrics_port = free_port()
        self.command = [
            *SERVER, *args, "--port", str(port), "--port-file", str(self.port_file),
            "--metrics-port", str(self.metrics_port),
        ]  # fmt: skip
        self.stdout_path = log or folder / "stdout"
        self.stderr_path = log or folder / "stderr"
        self._stdout = open(self.stdout_path, "w")
        self._stderr = subprocess.STDOUT if log else open(self.stderr_path, "w")
        self.started_at = time.monotonic()
        # The environment as it is: on a GPU host the stack comes from a target folder on PYTHONPATH.
        self.process = subprocess.Popen(
            self.command,
            stdout=self._stdout,
            stderr=self._stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        self.target = f"127.0.0.1:{port}" if port else ""
        #: Seconds from the process's start until it served (an engine's start and warm-up).
        self.start_s: float | None = None

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def wait_until_serving(self, timeout_s: float) -> float:
        """Seconds from the process's start until it served; ServerFailed if it exits first or
        does not serve within `timeout_s`."""
        while not (self.port_file.exists() and self.port_file.read_text()):
            if self.process.poll() is not None:
                raise ServerFailed(f"the server exited with status {self.process.returncode}\n{self.log_tail()}")
            if time.monotonic() - self.started_at > timeout_s:
                raise ServerFailed(f"the server did not serve within {timeout_s:g} s\n{self.log_tail()}")
            time.sleep(0.05)
        self.start_s = time.monotonic() - self.started_at
        self.target = f"127.0.0.1:{self.port_file.read_text().strip()}"
        return self.start_s

    def health(self, service: str = "", timeout_s: float = 5) -> int:
        """Its gRPC health status for `service` ("" for the server as a whole)."""
        with grpc.insecure_channel(self.target) as channel:
            request = health_pb2.HealthCheckRequest(service=service)
            return health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout_s).status

    def metrics_text(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()

    def metric(self, sample: str, **labels: str) -> float:
        """One sample of its metrics endpoint, e.g. metric("codecstream_frames_after_stop_bucket", le="1.0");
        0 for a sample not yet exported (a labelled counter before its first event)."""
        for family in text_string_to_metric_families(self.metrics_text()):
            for name, sample_labels, value, *_ in family.samples:
                if name == sample and sample_labels == labels:
                    return value
        return 0.0

    def metrics(self, prefixes: tuple[str, ...] = ("codecstream_",)) -> dict[str, float]:
        """Samples whose names start with one of `prefixes`, by the sample as exported
        (`name{label="value"}`)."""
        samples = {}
        for line in self.metrics_text().splitlines():
            if line.startswith(prefixes):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples

    def cpu_seconds(self) -> float:
        """User and system CPU its own process has used (not its children's)."""
        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system

    def engine_cores(self) -> list[psutil.Process]:
        """Its engine-core processes (vLLM's, found by their title)."""
        found = []
        for child in self.children():
            try:
                title = child.name() + " " + " ".join(child.cmdline())
            except psutil.NoSuchProcess:
                continue
            if ENGINE_CORE in title:
                found.append(child)
        return found

    def children(self) -> list[psutil.Process]:
        """Every process it started, theirs included (none once it exited)."""
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def output(self) -> str:
        """What it wrote to stdout so far (with `log`: both streams)."""
        if not self._stdout.closed:
            self._stdout.flush()
        return pathlib.Path(self.stdout_path).read_text(errors="replace")

    def errors(self) -> str:
        """What it wrote to stderr so far (with `log`: both streams)."""
        return self.output() if self.stderr_path == self.stdout_path else self.stderr_path.read_text(errors="replace")

    def log_tail(self, chars: int = 6000) -> str:
        return (self.output() if self.stderr_path == self.stdout_path else self.output() + self.errors())[-chars:]

    def stop(self, timeout_s: float = 120) -> int:
        """SIGTERM (a graceful shutdown), SIGKILL after `timeout_s`; then no child of it is left.
        Its exit status; what it wrote stays readable."""
        children = self.children()
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
        for stream in (self._stdout, self._stderr):
            if hasattr(stream, "close"):
                stream.close()
        return self.process.returncode

    def kill(self) -> int:
        """SIGKILL at once (a crash, or a teardown that need not be graceful), then as `stop`."""
        if self.process.poll() is None:
            self.process.kill()
        return self.stop()
