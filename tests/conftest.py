"""Fixtures shared by the whole suite: real servers on real loopback sockets."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from codecstream.protocol.codes_file import CodesFile
from codecstream.server.app import CodecStreamServer, ServerOptions
from codecstream.server.limits import ServerLimits
from codecstream.server.replay import UNKNOWN_DECODER_DIGEST, ReplaySource


def random_codes(frames: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, size=(frames, 16), dtype=np.int16)


class EventLoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclasses.dataclass
class RunningServer:
    server: CodecStreamServer
    source: ReplaySource
    loop: EventLoopThread
    target: str

    @property
    def service(self):
        return self.server.service

    def live_requests(self) -> int:
        return self.loop.run(self.source.live_requests())

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Poll a condition on the server side (bounded: tests never hang)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return predicate()


@pytest.fixture
def replay_server_factory() -> Iterator[Callable[..., RunningServer]]:
    """Start replay servers: factory(codes=..., reference_codes=..., fps=..., limits=..., **options)."""
    started: list[RunningServer] = []

    def start(
        codes: np.ndarray | None = None,
        reference_codes: np.ndarray | None = None,
        fps: float = 0.0,
        limits: ServerLimits | None = None,
        decoder_digest: str = UNKNOWN_DECODER_DIGEST,
        **options,
    ) -> RunningServer:
        codes = random_codes(60) if codes is None else codes
        recording = CodesFile(codes) if reference_codes is None else CodesFile(codes, reference_codes)
        source = ReplaySource(recording, frames_per_second=fps, decoder_digest_value=decoder_digest)
        loop = EventLoopThread()
        server = CodecStreamServer(
            source, ServerOptions(port=0, limits=limits or ServerLimits(), shutdown_grace_s=1.0, **options)
        )
        port = loop.run(server.start())
        running = RunningServer(server, source, loop, f"127.0.0.1:{port}")
        started.append(running)
        return running

    yield start
    for running in started:
        try:
            running.loop.run(running.server.stop(grace_s=0.5), timeout=20)
        finally:
            running.loop.close()


@pytest.fixture
def replay_server(replay_server_factory) -> RunningServer:
    """A replay server with 60 random frames, as fast as possible."""
    return replay_server_factory()


@pytest.fixture(scope="session")
def talker_engine(tmp_path_factory):
    """vLLM-Omni's talker on the CPU, serving a tiny random CustomVoice checkpoint; one per session
    (engine start-up takes 30-80 s here), shared by the server and end-to-end tests."""
    # Imported here: the engine stack (vLLM) is heavy and only these tests need it.
    from codecstream.server.source import SynthesisRequest

    from tests.server.engine_harness import start_talker_engine, stop_talker_engine

    engine = start_talker_engine(tmp_path_factory.mktemp("qwen3-tts-tiny-custom-voice"))
    try:
        # The first request pays one-off costs (tokenizer load, first kernels); keep them out of timings.
        engine.collect(SynthesisRequest(text="Warm up.", voice="ryan", seed=0, max_frames=2), "warm-up")
        yield engine
    finally:
        stop_talker_engine(engine)
