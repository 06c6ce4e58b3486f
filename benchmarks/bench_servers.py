"""`codecstream-server` in a process of its own, as an operator runs it, for the benchmarks: the test
support's (codecstream.testing.server_process), waited for until it serves, at log level WARNING.

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

from codecstream.testing import server_process


def split_cores() -> tuple[set[int], set[int]]:
    """Half the cores (at least one) for the server, the rest for the clients; all for both on one core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return set(cores), set(cores)
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half:])


class ServerProcess(server_process.ServerProcess):
    """The server with `args` (besides its port, port file, metrics port and log level), started and
    waited for: up to `ready_timeout_s` (an engine start takes tens of seconds here). Its output
    goes to `log` (a path) or a file of its own; `cpus`: the cores it may run on."""

    def __init__(
        self,
        args: list[str],
        ready_timeout_s: float = 600.0,
        log: pathlib.Path | None = None,
        cpus: set[int] | None = None,
    ) -> None:
        super().__init__([*args, "--log-level", "WARNING"], log=log, cpus=cpus)
        try:
            self.wait_until_serving(ready_timeout_s)
        except server_process.ServerFailed:
            self.stop()
            raise

    def close(self) -> None:
        self.stop()
