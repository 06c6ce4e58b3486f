"""A stream's clock starts when the server receives its Start: time to first frame, and every
microsecond field after it, count the engine's opening of the request (prompt, admission, prefill),
which is most of what a client waits for its first chunk."""

from __future__ import annotations

import asyncio
import time

from codecstream.client import Client
from codecstream.server.replay import ReplaySource

from tests.conftest import random_codes, sample

#: How long the source takes to open a request, as an engine's prefill does.
OPENING_S = 0.3


class SlowOpeningSource(ReplaySource):
    async def open(self, request, stream_id):
        await asyncio.sleep(OPENING_S)
        return await super().open(request, stream_id)


def test_time_to_first_frame_counts_the_requests_opening(replay_server_factory):
    server = replay_server_factory(codes=random_codes(40), fps=200.0, source_class=SlowOpeningSource)
    with Client(server.target) as client:
        called = time.time()
        stream = client.stream_codes("Hi.", max_frames=10)
        chunks = list(stream)
        header, end = stream.header, stream.end
    assert sum(chunk.num_frames for chunk in chunks) == 10
    started = header.started_at.ToNanoseconds() / 1e9
    # Stamped when the Start arrived, before the source opened the request (clocks of one host).
    assert called - 0.05 <= started <= called + OPENING_S / 2
    assert end.stats.time_to_first_frame_us >= OPENING_S * 1e6
    assert chunks[0].generated_at_us >= OPENING_S * 1e6
    assert sample(server, "codecstream_time_to_first_frame_seconds_sum") >= OPENING_S
