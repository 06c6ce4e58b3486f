"""Resume from the client's side, on flaky links: a stream that loses its connection reattaches and
plays exactly the audio an uninterrupted stream plays, whatever fails on the way back; what cannot
be resumed is said precisely. Real replay server, real sockets, a proxy that cuts and refuses."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from codecstream.client import AsyncClient, Client, StreamNotFound, Unavailable
from codecstream.client.runtimes import open_decoder
from codecstream.protocol import decoder_digest
from codecstream.server.app import Keepalive
from codecstream.server.limits import ServerLimits
from codecstream.v1 import synthesis_pb2 as pb

from tests.conftest import random_codes

FRAMES = 120


@pytest.fixture
def server(replay_server_factory, checkpoint):
    return replay_server_factory(
        codes=random_codes(FRAMES, seed=3), fps=150.0, decoder_digest=decoder_digest(checkpoint)
    )


def pcm(target: str, checkpoint, fault=None, **client_options) -> tuple[np.ndarray, object]:
    """Synthesize through `target`; call `fault()` after the third chunk; return the PCM and the stream."""
    decoder = open_decoder(checkpoint, backend="torch")
    samples = []
    with Client(target, **client_options) as client:
        stream = client.synthesize("A long text.", decoder=decoder, chunking=[4])
        for index, chunk in enumerate(stream):
            samples.append(chunk.samples)
            if index == 2 and fault is not None:
                fault()
    return np.concatenate(samples), stream


@pytest.mark.parametrize("failed_attempts", [1, 2])
def test_a_resume_whose_first_attempts_fail_plays_exactly_the_uninterrupted_audio(
    server, proxy_factory, checkpoint, failed_attempts
):
    uninterrupted, _ = pcm(server.target, checkpoint)
    proxy = proxy_factory(server.server.port)

    def cut_and_refuse_the_next_reconnects():
        proxy.reject(failed_attempts)
        proxy.cut()

    resumed, stream = pcm(proxy.target, checkpoint, cut_and_refuse_the_next_reconnects)
    assert proxy.rejected == failed_attempts
    assert stream.resumes == 1
    np.testing.assert_array_equal(resumed, uninterrupted)
    assert stream.end.reason == pb.END_REASON_EOS


def test_resume_keeps_trying_for_as_long_as_the_server_keeps_the_stream(server, proxy_factory, checkpoint):
    uninterrupted, _ = pcm(server.target, checkpoint)
    proxy = proxy_factory(server.server.port)

    def outage_of_two_seconds():
        proxy.reject_for(2.0)  # the server keeps a detached stream 5 s
        proxy.cut()

    resumed, stream = pcm(proxy.target, checkpoint, outage_of_two_seconds)
    assert proxy.rejected >= 2 and stream.resumes == 1
    np.testing.assert_array_equal(resumed, uninterrupted)


def test_a_stream_the_server_no_longer_holds_is_reported_as_not_found(replay_server_factory, proxy_factory, checkpoint):
    server = replay_server_factory(codes=random_codes(4000), fps=50.0, limits=ServerLimits(resume_window_s=0.3))
    proxy = proxy_factory(server.server.port)
    # The client keeps trying past the server's window, so it reaches the server after it let go.
    with Client(proxy.target, resume_timeout_s=5.0) as client:
        stream = client.stream_codes("A long text.")
        next(stream)
        proxy.reject_for(1.0)
        proxy.cut()
        with pytest.raises(StreamNotFound, match="no resumable stream"):
            for _ in stream:
                pass


def test_by_default_a_client_tries_to_reattach_for_the_window_its_server_announces(
    replay_server_factory, proxy_factory
):
    server = replay_server_factory(codes=random_codes(4000), fps=50.0, limits=ServerLimits(resume_window_s=0.3))
    proxy = proxy_factory(server.server.port)
    with Client(proxy.target) as client:
        stream = client.stream_codes("A long text.")
        next(stream)
        assert stream.header.resume_window_ms == 300
        proxy.reject_for(5.0)
        proxy.cut()
        with pytest.raises(Unavailable, match=r"could not resume stream \w+ within 0\.3 s"):
            for _ in stream:
                pass


def test_a_cancel_asked_for_while_reconnecting_reaches_the_server(replay_server_factory, proxy_factory):
    server = replay_server_factory(codes=random_codes(4000), fps=50.0)
    proxy = proxy_factory(server.server.port)

    async def run() -> pb.End:
        async with AsyncClient(proxy.target) as client:
            stream = client.stream_codes("A long text.")
            await anext(stream)
            proxy.reject_for(0.5)
            proxy.cut()
            reading = asyncio.ensure_future(anext(stream))
            async with asyncio.timeout(10):
                while not stream.resumes:  # until the stream is reconnecting
                    await asyncio.sleep(0.01)
            stream.request_cancel(played_frames=7)
            try:
                while True:
                    await reading
                    reading = asyncio.ensure_future(anext(stream))
            except StopAsyncIteration:
                return stream.end

    end = asyncio.run(run())
    assert end.reason == pb.END_REASON_CANCELLED
    assert end.stats.played_frames == 7


def test_a_half_open_connection_is_noticed_by_the_client_keepalive_and_resumed(replay_server_factory, proxy_factory):
    codes = random_codes(400)
    # The server lets clients ping every 0.5 s; both sides notice a dead peer within a second or two.
    keepalive = Keepalive(time_s=60, timeout_s=60, client_min_interval_s=0.5)
    server = replay_server_factory(codes=codes, fps=50.0, keepalive=keepalive)
    proxy = proxy_factory(server.server.port)
    received = []
    with Client(proxy.target, keepalive_s=1.0) as client:
        stream = client.stream_codes("A long text.", chunking=[5])
        received.append(next(stream).codes)
        proxy.freeze()  # packets stop, no FIN, no RST: only a ping can tell
        received += [chunk.codes for chunk in stream]
    assert stream.resumes == 1
    np.testing.assert_array_equal(np.concatenate(received), codes)
