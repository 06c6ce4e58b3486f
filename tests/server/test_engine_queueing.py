"""A stream that is already speaking is not starved by streams that arrive after it: its next
segment's engine request is scheduled ahead of theirs (the real talker engine, CPU, tiny checkpoint)."""

from __future__ import annotations

import asyncio
import time

import pytest
from codecstream.server.request import SynthesisRequest
from codecstream.server.segmenting import segment_request_id
from codecstream.server.source import Frames

pytestmark = pytest.mark.engine

#: max_num_seqs of the CPU deploy YAML: requests the engine runs at once; the rest wait in its queue.
ENGINE_SLOTS = 8
NEWCOMERS = 32


def test_a_speaking_stream_s_next_segment_goes_ahead_of_streams_that_arrived_after_it(talker_engine):
    source = talker_engine.source

    async def first_frame_at(request: SynthesisRequest, request_id: str) -> float:
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
        await asyncio.sleep(0)  # every newcomer is on its way to the engine first
        second_segment = SynthesisRequest(text="And the second sentence.", voice="ryan", seed=1, max_frames=40)
        continuation = await first_frame_at(second_segment, segment_request_id("speaking", 1))
        return list(await asyncio.gather(*newcomers)), continuation

    newcomers, continuation = talker_engine.run(scenario())
    ahead = sum(at < continuation for at in newcomers)
    # Only newcomers the engine took before the continuation reached it may go first: at most the
    # slots, plus those admitted in the same steps. FCFS let all of them go first.
    assert ahead <= 2 * ENGINE_SLOTS, f"{ahead} of {NEWCOMERS} later streams started before the speaking stream"
    assert talker_engine.wait_for_no_live_requests() == 0
