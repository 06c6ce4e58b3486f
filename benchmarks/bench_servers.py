"""`codecstream-server` in a process of its own, as an operator runs it, for the benchmarks.

server = ServerProcess(["--replay", "codes.npy", "--replay-fps", "12.5"])
server.target            # "127.0.0.1:PORT", once it serves
server.metrics()         # the Prometheus samples of its /metrics endpoint
server.cpu_seconds()     # user + system CPU it has used
server.close()

server_cpus, client_cpus = split_cores()   # the server on half the cores, its clients on the rest
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


def split_cores() -> tuple[set[int], set[int]]:
    """Half the cores (at least one) for the server, the rest for the clients; all for both on one core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return set(cores), set(cores)
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half:])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """The server with `args` (besides its port, port file, metrics port and log level), started and
    waited for: up to `ready_timeout_s` (an engine start takes tens of seconds here). Its output
    goes to `log` (a path) or nowhere; `cpus`: the cores it may run on."""

    def __init__(
        self,
        args: list[str],
        ready_timeout_s: float = 600.0,
        log: pathlib.Path | None = None,
        cpus: set[int] | None = None,
    ) -> None:
        self._folder = tempfile.TemporaryDirectory()
        port_file = pathlib.Path(self._folder.name) / "port"
        self.metrics_port = free_port()
        self._log = open(log, "w") if log else subprocess.DEVNULL
        started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "codecstream.server.cli", *args, "--port", "0", "--port-file", str(port_file),
             "--metrics-port", str(self.metrics_port), "--log-level", "WARNING"],
            stdout=self._log, stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            # Pinned (`cpus`), with every process it starts: clients on the other cores then take nothing from it.
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )  # fmt: skip
        while not (port_file.exists() and port_file.read_text()):
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode} while starting")
            if time.monotonic() - started > ready_timeout_s:
                self.close()
                raise RuntimeError(f"the server did not start within {ready_timeout_s:g} s")
            time.sleep(0.05)
        #: Seconds from the process's start until it served (an engine's start and warm-up).
        self.start_s = time.monotonic() - started
        self.target = f"127.0.0.1:{port_file.read_text()}"

    def metrics(self, prefixes: tuple[str, ...] = ("codecstream_",)) -> dict[str, float]:
        """Samples of its /metrics whose names start with one of `prefixes`, by full sample name."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        samples = {}
        for line in text.splitlines():
            if line.startswith(prefixes):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples

    def cpu_seconds(self) -> float:
        fields = pathlib.Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(120)
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        self._folder.cleanup()
