"""A Pipecat processor driven step by step inside a real Pipecat pipeline (tests and benchmarks).

Pipecat's own `run_test` can only sleep between frames, which races a real server. `run_script`
pushes a script's frames downstream in order, waiting at each `Until` for the frame it names, at
each `Pause` for a while and at each `Call` for what it does (a server started mid-conversation),
and returns every frame the processor sent downstream with the monotonic time it came out. Needs
pipecat-ai (the client's [pipecat] extra).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable


@dataclasses.dataclass(frozen=True)
class Until:
    """A step: wait until a frame of `kind` has come out of the processor."""

    kind: type
    timeout_s: float = 20.0


@dataclasses.dataclass(frozen=True)
class Pause:
    """A step: nothing is pushed for `seconds` (an LLM that stops writing for a while)."""

    seconds: float


@dataclasses.dataclass(frozen=True)
class Call:
    """A step: await `function()` (a coroutine function, or one returning an awaitable)."""

    function: Callable[[], Awaitable[object]]


@dataclasses.dataclass(frozen=True)
class Pushed:
    """A step: note the monotonic time here, as `RunResult.marks[name]` (to time what follows it)."""

    name: str


@dataclasses.dataclass
class RunResult:
    #: Frames the processor sent downstream, in order, and the monotonic time each came out.
    frames: list
    times: list[float]
    #: Frames it sent upstream (errors among them).
    upstream: list
    #: Monotonic times of the script's Pushed steps, and of its start ("start").
    marks: dict[str, float]


async def run_script(processor, script: list, *, metrics: bool = False) -> RunResult:
    """Run `processor` in a Pipeline (PipelineWorker, WorkerRunner) between two queues: push the
    script's frames and steps in order, then end the pipeline. `metrics`: Pipecat's metrics on
    (PipelineParams.enable_metrics), so that the MetricsFrames come out among the frames."""
    from pipecat.frames.frames import EndFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.frame_processor import FrameDirection
    from pipecat.tests.utils import QueuedFrameProcessor
    from pipecat.workers.runner import WorkerRunner

    came_out: asyncio.Queue = asyncio.Queue()
    went_up: asyncio.Queue = asyncio.Queue()
    source = QueuedFrameProcessor(queue=went_up, queue_direction=FrameDirection.UPSTREAM)
    sink = QueuedFrameProcessor(queue=_Stamping(came_out), queue_direction=FrameDirection.DOWNSTREAM)
    pipeline = Pipeline([source, processor, sink])
    worker = PipelineWorker(pipeline, cancel_on_idle_timeout=False, params=PipelineParams(enable_metrics=metrics))
    started = asyncio.Event()
    result = RunResult([], [], [], {})

    @worker.event_handler("on_pipeline_started")
    async def _on_started(worker, frame):
        started.set()

    def take(item) -> None:
        frame, at = item
        result.frames.append(frame)
        result.times.append(at)

    async def drain_until(kind: type, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while not any(isinstance(frame, kind) for frame in result.frames):
                take(await came_out.get())

    async def push() -> None:
        try:
            await asyncio.wait_for(started.wait(), timeout=5)
            result.marks["start"] = time.monotonic()
            for step in script:
                if isinstance(step, Until):
                    await drain_until(step.kind, step.timeout_s)
                elif isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                elif isinstance(step, Call):
                    await step.function()
                elif isinstance(step, Pushed):
                    result.marks[step.name] = time.monotonic()
                else:
                    await worker.queue_frame(step)
        except BaseException:
            # A step that timed out fails the script: the pipeline is cancelled, or the run
            # would wait for an EndFrame that never comes (the test hung instead of failing).
            await runner.cancel(reason="the test script failed")
            raise
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), push())
    while not came_out.empty():
        take(came_out.get_nowait())
    while not went_up.empty():
        result.upstream.append(went_up.get_nowait())
    kept = [(f, t) for f, t in zip(result.frames, result.times, strict=True) if not isinstance(f, EndFrame)]
    result.frames, result.times = [f for f, _ in kept], [t for _, t in kept]
    return result


class _Stamping:
    """Looks like an asyncio.Queue to QueuedFrameProcessor; stamps each frame with its arrival time."""

    def __init__(self, queue: asyncio.Queue) -> None:
        self._queue = queue

    async def put(self, frame) -> None:
        await self._queue.put((frame, time.monotonic()))

    def put_nowait(self, frame) -> None:
        self._queue.put_nowait((frame, time.monotonic()))
