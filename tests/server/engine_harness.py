"""One real vLLM-Omni talker engine on the CPU, on a tiny random checkpoint, for a whole test session.

An engine start costs tens of seconds here (docs/performance.md), so tests share one engine. It lives on an event
loop in a background thread (AsyncOmni binds its output handling to the loop that first calls
generate), and tests drive it through `run(coroutine)` with a bounded wait.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
from codecstream.protocol.decoding import NUM_CODEBOOKS
from codecstream.server.engine.talker_source import VllmTalkerSource
from codecstream.server.request import SynthesisRequest
from codecstream.server.source import Finished, FinishReason, Frames, Generation
from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint
from codecstream.testing.waiting import eventually

from tests.conftest import EventLoopThread

#: Long enough for any single test's requests on a loaded 2-core machine.
REQUEST_TIMEOUT_S = 120.0


@dataclasses.dataclass
class Arrival:
    frames: np.ndarray
    at: float


@dataclasses.dataclass
class Collected:
    arrivals: list[Arrival]
    generation: Generation
    #: The generation's last event; None if it ended without one.
    finished: Finished | None
    started_at: float

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.finished.reason if self.finished else None

    @property
    def codes(self) -> np.ndarray:
        if not self.arrivals:
            return np.zeros((0, NUM_CODEBOOKS), dtype=np.int16)
        return np.concatenate([arrival.frames for arrival in self.arrivals])


@dataclasses.dataclass
class TalkerEngine:
    source: VllmTalkerSource
    checkpoint: Path
    loop: EventLoopThread
    #: Closers run (last first) when the engine is stopped: what was built on it (its gRPC server).
    on_stop: list = dataclasses.field(default_factory=list)
    stopped: bool = False

    def run(self, coroutine, timeout: float = REQUEST_TIMEOUT_S):
        if self.stopped:
            raise RuntimeError("the shared talker engine was stopped after its last test (tests/conftest.py)")
        return self.loop.run(coroutine, timeout)

    def collect(self, request: SynthesisRequest, stream_id: str) -> Collected:
        """Open a generation and read it to its end, noting when each Frames event arrived."""

        async def read() -> Collected:
            started = time.monotonic()
            generation = await self.source.open(request, stream_id)
            arrivals, finished = [], None
            async for event in generation:
                if isinstance(event, Frames):
                    arrivals.append(Arrival(event.codes, time.monotonic()))
                elif isinstance(event, Finished):
                    finished = event
            return Collected(arrivals, generation, finished, started)

        return self.run(read())

    def live_requests(self) -> int:
        return self.run(self.source.live_requests())

    def wait_for_no_live_requests(self, timeout: float = 15.0) -> int:
        """The requests the engine still holds once none is left or after `timeout`."""
        eventually(lambda: self.live_requests() == 0, timeout, step_s=0.1)
        return self.live_requests()


def start_talker_engine(checkpoint_dir: Path, variant: str = "custom_voice") -> TalkerEngine:
    write_qwen3_tts_checkpoint(checkpoint_dir, preset="tiny", seed=0, variant=variant)
    loop = EventLoopThread()

    async def create() -> VllmTalkerSource:
        # Started on the loop's own thread: the engine's async side belongs to this loop.
        source = VllmTalkerSource(str(checkpoint_dir))
        await source.start()
        return source

    try:
        source = loop.run(create(), timeout=600)
    except BaseException:
        loop.close()
        raise
    return TalkerEngine(source, checkpoint_dir, loop)


def stop_talker_engine(engine: TalkerEngine) -> None:
    """Stop what runs on the engine, then the engine; safe to call again."""
    if engine.stopped:
        return
    try:
        while engine.on_stop:
            engine.on_stop.pop()()
        engine.run(engine.source.close(), timeout=60)
    finally:
        engine.stopped = True
        engine.loop.close()
