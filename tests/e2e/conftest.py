"""The real gRPC server around the shared real talker engine, on a loopback port."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from codecstream.server.app import CodecStreamServer, ServerOptions


@dataclasses.dataclass
class EngineServer:
    target: str
    checkpoint: Path
    engine: object

    def wait_for_no_live_requests(self, timeout: float = 15.0) -> int:
        return self.engine.wait_for_no_live_requests(timeout)


@pytest.fixture(scope="session")
def engine_server(talker_engine):
    server = CodecStreamServer(talker_engine.source, ServerOptions(port=0, shutdown_grace_s=1.0))
    port = talker_engine.run(server.start())
    try:
        yield EngineServer(f"127.0.0.1:{port}", talker_engine.checkpoint, talker_engine)
    finally:
        talker_engine.run(server.server.stop(grace=1.0))
