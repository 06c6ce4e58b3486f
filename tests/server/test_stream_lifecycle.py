"""Whatever fails inside the server, every stream ends with exactly one End, nobody waits forever,
and shutdown always releases the source. Faults are injected into a replay source."""

from __future__ import annotations

import grpc
import pytest
from codecstream.client import Client, StreamEnded
from codecstream.server.errors import GenerationFailed
from codecstream.server.limits import RateLimiter
from codecstream.server.replay import ReplayGeneration, ReplaySource
from codecstream.server.source import Finished, FinishReason, Frames
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc

from tests.conftest import random_codes, sample


class AbortFailsGeneration(ReplayGeneration):
    async def abort(self) -> None:
        await super().abort()
        raise RuntimeError("abort exploded")


class AbortFailsSource(ReplaySource):
    """A source whose streams' abort() raises (it promises not to), and which records close()."""

    closed = False

    async def open(self, request, stream_id):
        stream = await super().open(request, stream_id)
        stream.__class__ = AbortFailsGeneration
        return stream

    async def close(self) -> None:
        type(self).closed = True


class FailingGeneration(ReplayGeneration):
    error: Exception = RuntimeError("a bug in the generator")

    async def _events(self):
        async for event in super()._events():
            yield event
            if isinstance(event, Frames):
                if self._owner.frames_before_failure == 0:
                    raise self.error
                self._owner.frames_before_failure -= 1


def failing_source(error: Exception, frames_before_failure: int = 3) -> type[ReplaySource]:
    class FailingSource(ReplaySource):
        async def open(self, request, stream_id):
            self.frames_before_failure = frames_before_failure
            stream = await super().open(request, stream_id)
            stream.__class__ = type("Failing", (FailingGeneration,), {"error": error})
            return stream

    return FailingSource


def test_a_cancel_ends_the_stream_even_when_aborting_the_generator_raises(replay_server_factory):
    server = replay_server_factory(codes=random_codes(400), fps=50.0, source_class=AbortFailsSource)
    with Client(server.target) as client:
        stream = client.stream_codes("Hi.")
        next(stream)
        end = stream.cancel()
    assert end.reason == pb.END_REASON_CANCELLED
    assert sample(server, "codecstream_errors_total", kind="abort") >= 1
    assert server.wait_until(lambda: not server.service.sessions)


def test_shutdown_releases_the_source_even_when_stopping_a_stream_fails(replay_server_factory):
    AbortFailsSource.closed = False
    server = replay_server_factory(codes=random_codes(4000), fps=50.0, source_class=AbortFailsSource)
    with Client(server.target) as client:
        stream = client.stream_codes("Hi.")
        next(stream)
        server.loop.run(server.server.stop(grace_s=0.1), timeout=20)
        with pytest.raises(StreamEnded, match="server shutting down"):
            list(stream)
    assert AbortFailsSource.closed


def test_a_bug_in_the_generator_ends_the_stream_with_one_line_and_no_traceback(replay_server_factory):
    server = replay_server_factory(codes=random_codes(60), source_class=failing_source(RuntimeError("boom\nmore")))
    with Client(server.target) as client:
        stream = client.stream_codes("Hi.", chunking=[1])
        with pytest.raises(StreamEnded) as caught:
            list(stream)
    end = caught.value.end
    assert end.reason == pb.END_REASON_ERROR and end.frames_generated == 4
    assert end.message.startswith("internal server error (logged with stream id ")
    assert "\n" not in end.message and "boom" not in end.message
    with Client(server.target) as client:
        assert next(iter(client.stream_codes("Hi.", chunking=[1]))).num_frames == 1


def test_a_generation_failure_reaches_the_client_as_its_one_line_message(replay_server_factory):
    server = replay_server_factory(
        codes=random_codes(60), source_class=failing_source(GenerationFailed("the engine failed the request"))
    )
    with Client(server.target) as client, pytest.raises(StreamEnded) as caught:
        list(client.stream_codes("Hi."))
    assert caught.value.end.message == "generation failed: the engine failed the request"


def test_the_rate_limiter_forgets_clients_idle_for_a_refill_period():
    now = [0.0]
    limiter = RateLimiter.per_minute(5, clock=lambda: now[0])
    for client in range(10_000):
        limiter.try_acquire(f"client-{client}")
    assert len(limiter) == 10_000
    now[0] = 61.0
    limiter.try_acquire("one more")
    assert len(limiter) == 1


def test_the_rate_limiter_still_limits_a_busy_client():
    now = [0.0]
    limiter = RateLimiter.per_minute(2, clock=lambda: now[0])
    assert limiter.try_acquire("a") == 0.0 and limiter.try_acquire("a") == 0.0
    assert limiter.try_acquire("a") == pytest.approx(30.0)
    now[0] = 30.0
    assert limiter.try_acquire("a") == 0.0


def test_a_client_that_ran_its_bucket_dry_is_overdrawn_until_the_bucket_is_full_again():
    now = [0.0]
    limiter = RateLimiter(per_s=10.0, burst=5, clock=lambda: now[0])
    for _ in range(4):
        assert limiter.try_acquire("a") == 0.0
    assert limiter.overdrawn_s("a") == 0.0, "spending, not overrunning, bars nothing"
    assert limiter.try_acquire("a") == 0.0 and limiter.try_acquire("a") == pytest.approx(0.1)
    assert limiter.overdrawn_s("a") == pytest.approx(0.5) and limiter.overdrawn_s("b") == 0.0
    now[0] = 0.3
    assert limiter.try_acquire("a") == 0.0, "the budget refills as before"
    assert limiter.overdrawn_s("a") == pytest.approx(0.3)
    now[0] = 0.6
    assert limiter.overdrawn_s("a") == 0.0
    assert limiter.try_acquire("a") == 0.0 and limiter.overdrawn_s("a") == 0.0


def test_a_stream_that_ended_before_its_client_reattached_delivers_its_end_on_resume(replay_server_factory):
    server = replay_server_factory(codes=random_codes(10), fps=50.0)
    channel = grpc.insecure_channel(server.target)
    stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
    responses = stub.Synthesize(iter([pb.SynthesizeRequest(start=pb.Start(text="Hi.", resumable=True))]), timeout=10)
    stream_id = next(responses).header.stream_id
    responses.cancel()
    channel.close()
    assert server.wait_until(lambda: all(s.finished for s in server.service.sessions.values()))
    with grpc.insecure_channel(server.target) as channel:
        stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
        resumed = list(stub.Synthesize(iter([pb.SynthesizeRequest(resume=pb.Resume(stream_id=stream_id))]), timeout=10))
    assert resumed[0].HasField("header") and resumed[-1].end.reason == pb.END_REASON_EOS
    assert sum(r.chunk.num_frames for r in resumed if r.HasField("chunk")) == 10


def finishing_source(last_event) -> type[ReplaySource]:
    """A source whose generations yield their recording's frames, then `last_event` (None: nothing)."""

    class Ending(ReplayGeneration):
        async def _events(self):
            async for event in super()._events():
                if isinstance(event, Frames):
                    yield event
            if last_event is not None:
                yield last_event

    class EndingSource(ReplaySource):
        async def open(self, request, stream_id):
            generation = await super().open(request, stream_id)
            generation.__class__ = Ending
            return generation

    return EndingSource


@pytest.mark.parametrize(
    ("last_event", "reason", "message"),
    [
        (Finished(FinishReason.EOS), pb.END_REASON_EOS, ""),
        # A length stop before Header.max_frames means the budget was wrong: not a false MAX_FRAMES.
        (
            Finished(FinishReason.LENGTH),
            pb.END_REASON_ERROR,
            "generation failed: the engine stopped at its length limit after 12 of 2048 frames",
        ),
        (
            Finished(FinishReason.ABORTED),
            pb.END_REASON_ERROR,
            "generation failed: the engine ended the request unasked",
        ),
        (None, pb.END_REASON_ERROR, "generation failed: the generator ended without saying why"),
    ],
    ids=["eos", "length-before-the-budget", "aborted-unasked", "no-reason"],
)
def test_the_session_turns_how_a_generation_finished_into_the_one_end(
    replay_server_factory, last_event, reason, message
):
    server = replay_server_factory(codes=random_codes(12), source_class=finishing_source(last_event))
    with Client(server.target) as client:
        stream = client.stream_codes("Hi.")
        try:
            frames = sum(chunk.num_frames for chunk in stream)
        except StreamEnded:
            frames = stream.end.frames_generated
    assert (stream.end.reason, stream.end.message) == (reason, message)
    assert frames == stream.end.frames_generated
    if last_event is not None:  # a generation that finished delivers every frame it made
        assert frames == 12


def test_max_frames_ends_at_exactly_the_budget_whatever_the_generator_has_left(replay_server_factory):
    server = replay_server_factory(codes=random_codes(50))
    with Client(server.target) as client:
        stream = client.stream_codes("Hi.", max_frames=7, chunking=[4])
        assert [chunk.num_frames for chunk in stream] == [4, 3]
    assert stream.end.reason == pb.END_REASON_MAX_FRAMES and stream.header.max_frames == 7
