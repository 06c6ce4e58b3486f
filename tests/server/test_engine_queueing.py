"""A stream that is already speaking is not starved by streams that arrive after it: its next
segment's engine request is scheduled ahead of theirs (the real talker engine, CPU, tiny checkpoint)."""

from __future__ import annotations

import asyncio
import time

import pytest
from codecstream.server.request import SynthesisRequest
from codecstream.server.request_ids import segment_request_id
from codecstream.server.source import FinishReason, Frames

pytestmark = pytest.mark.engine

#: max_num_seqs of the CPU deploy YAML: requests the engine runs at once; the rest wait in its queue.
ENGINE_SLOTS = 8
NEWCOMERS = 32


def test_a_speaking_stream_s_next_segment_goes_ahead_of_streams_that_arrived_after_it(talker_engine):
    source = talker_engine.source
    asked: list[str] = []

    async def first_frame_at(request: SynthesisRequest, request_id: str) -> float:
        asked.append(request_id)
        generation = await source.open(request, request_id)
        async for event in generation:
            if isinstance(event, Frames):
                at = time.monotonic()
                await generation.abort()
                return at
        return float("inf")

    async def scenario() -> tuple[list[float], float]:
        newcomers = [
            asyncio.ensure_future(
                first_frame_at(SynthesisRequest(text="A new stream.", voice="ryan", seed=i, max_frames=40), f"new{i}")
            )
            for i in range(NEWCOMERS)
        ]
        # Every newcomer on its way to the engine first: one thread makes the prompts in the order asked.
        while len(asked) < NEWCOMERS:
            await asyncio.sleep(0)
        second_segment = SynthesisRequest(text="And the second sentence.", voice="ryan", seed=1, max_frames=40)
        continuation = await first_frame_at(second_segment, segment_request_id("speaking", 1))
        return list(await asyncio.gather(*newcomers)), continuation

    newcomers, continuation = talker_engine.run(scenario())
    ahead = sum(at < continuation for at in newcomers)
    # Only newcomers the engine took before the continuation reached it may go first: at most the
    # slots, plus those admitted in the same steps. FCFS let all of them go first.
    assert ahead <= 2 * ENGINE_SLOTS, f"{ahead} of {NEWCOMERS} later streams started before the speaking stream"
    assert talker_engine.wait_for_no_live_requests() == 0


def test_requests_admitted_while_growing_requests_wait_for_text_never_overfill_the_batch(talker_engine):
    """Most slots held by streamed texts waiting for their next words, then more whole texts
    arrive than slots are left, then the held texts go on: the engine must run them all. A held request leaves
    `running` for a step; the scheduler used to admit newcomers into the slots it seemed to free,
    and vLLM's `len(running) <= max_num_seqs` assertion killed the engine (every stream ended
    End(ERROR), the server restarted the engine) once the held requests were scheduled again."""
    from codecstream.server.limits import ServerLimits
    from codecstream.server.source import Finished, SegmentEnd
    from codecstream.server.text_input import StreamedText

    source, limits = talker_engine.source, ServerLimits()

    async def read_to_end(generation, reached: asyncio.Event, kind: type = Frames) -> Finished | None:
        """Read `generation` to its end; `reached` is set at its first event of `kind` (or at its end)."""
        try:
            async for event in generation:
                if isinstance(event, kind):
                    reached.set()
                if isinstance(event, Finished):
                    return event
            return None
        finally:
            reached.set()

    async def scenario() -> list[Finished | None]:
        texts, held = [], []
        for i in range(ENGINE_SLOTS - 2):
            text = StreamedText("", limits)
            text.push("Hello there, and", flush=False, end_of_input=False)
            request = SynthesisRequest(text="", voice="ryan", seed=i, max_frames=200, streamed_text=text)
            generation = await source.open_streamed(request, f"held{i}", limits)
            # SegmentEnd: the talker has read every token that arrived and waits for more text.
            waiting = asyncio.Event()
            texts.append(text)
            held.append((asyncio.ensure_future(read_to_end(generation, waiting, SegmentEnd)), waiting))
        for _, waiting in held:
            await asyncio.wait_for(waiting.wait(), 60)  # they have spoken what they had and wait for text
        newcomers = [
            await source.open(SynthesisRequest(text="A new stream.", voice="ryan", seed=i, max_frames=30), f"late{i}")
            for i in range(4)
        ]
        started = asyncio.Event()
        newcomer_tasks = [asyncio.ensure_future(read_to_end(g, started)) for g in newcomers]
        await asyncio.wait_for(started.wait(), 60)
        for text in texts:
            text.push(" goodbye.", flush=False, end_of_input=True)
        return list(await asyncio.gather(*(task for task, _ in held), *newcomer_tasks))

    endings = talker_engine.run(scenario())
    assert all(end is not None and end.reason is not FinishReason.ABORTED for end in endings), endings
    talker_engine.run(source.check_health())
    assert talker_engine.wait_for_no_live_requests() == 0
