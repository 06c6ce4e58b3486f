"""`codecstream-server --model` started as an operator starts it: its own process, its engine in a child
process that can be killed, its log in a file, its health and metrics read from outside
(codecstream.testing.server_process, with the lane's flags)."""

from __future__ import annotations

import pathlib

from codecstream.testing import server_process
from codecstream.testing.server_process import NOT_SERVING, SERVING, ServerFailed
from codecstream.testing.waiting import wait_for

__all__ = ["NOT_SERVING", "SERVING", "ServerFailed", "ServerProcess", "wait_for"]


class ServerProcess(server_process.ServerProcess):
    def __init__(self, checkpoint: pathlib.Path, deploy_config: pathlib.Path, log_path: pathlib.Path) -> None:
        args = [
            "--model", str(checkpoint), "--deploy-config", str(deploy_config),
            # The lane is one client that fills the engine's batch on purpose (64 streams at once).
            "--max-engine-requests-per-client", "0", "--max-streams-per-client", "0",
        ]  # fmt: skip
        super().__init__(args, log=log_path)
        self.log_path = log_path
        self.command = " ".join(self.command)
