"""A tiny decoder checkpoint the plugins decode with, the server's metrics they are judged by, and a
Pipecat pipeline driven step by step."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from codecstream.testing.random_speech_tokenizer import write_speech_tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_speech_tokenizer(tmp_path_factory.mktemp("ckpt") / "speech_tokenizer", preset="tiny", seed=0)


def sample(server, name: str, **labels: str) -> float:
    """A value of the server's Prometheus registry (0 when never set)."""
    return server.server.metrics.registry.get_sample_value(name, labels) or 0.0


@dataclasses.dataclass(frozen=True)
class Pause:
    """A step of `run_script`: nothing is pushed for `seconds` (an LLM that stops writing for a while)."""

    seconds: float


@dataclasses.dataclass(frozen=True)
class Until:
    """A step of `run_script`: wait until a frame of `kind` has come out of the processor."""

    kind: type
    timeout_s: float = 20.0


async def run_script(processor, script: list, upstream: list | None = None) -> list:
    """Run `processor` inside a real Pipecat pipeline (Pipeline, PipelineWorker, WorkerRunner):
    push the script's frames downstream in order, waiting at each Until step for the frame it
    names, then end the pipeline; return every frame that came out of the processor downstream,
    in order (and put those it sent upstream, errors among them, into `upstream`). Pipecat's own
    run_test can only sleep between frames, which races the server."""
    from pipecat.frames.frames import EndFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.frame_processor import FrameDirection
    from pipecat.tests.utils import QueuedFrameProcessor
    from pipecat.workers.runner import WorkerRunner

    came_out: asyncio.Queue = asyncio.Queue()
    went_up: asyncio.Queue = asyncio.Queue()
    source = QueuedFrameProcessor(queue=went_up, queue_direction=FrameDirection.UPSTREAM)
    sink = QueuedFrameProcessor(queue=came_out, queue_direction=FrameDirection.DOWNSTREAM)
    pipeline = Pipeline([source, processor, sink])
    worker = PipelineWorker(pipeline, cancel_on_idle_timeout=False, params=PipelineParams())
    started = asyncio.Event()
    frames: list = []

    @worker.event_handler("on_pipeline_started")
    async def _on_started(worker, frame):
        started.set()

    async def drain_until(kind: type, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while not any(isinstance(frame, kind) for frame in frames):
                frames.append(await came_out.get())

    async def push() -> None:
        await asyncio.wait_for(started.wait(), timeout=5)
        for step in script:
            if isinstance(step, Until):
                await drain_until(step.kind, step.timeout_s)
            elif isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
            else:
                await worker.queue_frame(step)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), push())
    while not came_out.empty():
        frames.append(came_out.get_nowait())
    while upstream is not None and not went_up.empty():
        upstream.append(went_up.get_nowait())
    return [frame for frame in frames if not isinstance(frame, EndFrame)]
