"""A stream stopped before its generation started still ends: End is decided at once with the
stop's reason and no frames, and the generation opened for it is released (issue 39: on main a
stop in OPENED decided nothing, and the session stayed OPENED forever)."""

from __future__ import annotations

import asyncio

from codecstream.protocol import ChunkSchedule
from codecstream.protocol.codes_file import CodesFile
from codecstream.server.metrics import Metrics
from codecstream.server.replay import ReplaySource
from codecstream.server.request import SynthesisRequest
from codecstream.server.session import Phase, StreamSession
from codecstream.v1 import synthesis_pb2 as pb

from tests.conftest import random_codes


def test_a_stream_stopped_before_it_started_ends_with_the_stop_s_reason():
    async def scenario() -> tuple[StreamSession, int]:
        source = ReplaySource(CodesFile(random_codes(40)))
        request = SynthesisRequest(text="Hello there.", voice="ryan", max_frames=40)
        generation = await source.open(request, "stopped-early")
        session = StreamSession(
            "stopped-early",
            request,
            generation,
            ChunkSchedule(),
            client_request_id="",
            principal="tester",
            resume_window_s=0.0,
            retained_chunks=8,
            metrics=Metrics(),
        )
        assert session.phase is Phase.OPENED
        await asyncio.wait_for(session.stop(pb.END_REASON_CANCELLED, played_frames=0), 5)
        return session, await source.live_requests()

    session, live = asyncio.run(scenario())
    assert session.phase is Phase.ENDED
    assert session.end.reason == pb.END_REASON_CANCELLED
    assert session.end.frames_generated == 0 and session.end.text_offset_played == 0
    assert live == 0  # the generation was aborted, not left holding its slot
